/* source.c — source files (source.h): local ones here, remote ones through their ops
 * (http.c, which also opens a location of either kind: ck_source_open). */
#include "source.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

int ck_pread_min(int fd, void *buf, size_t len, uint64_t off, size_t need)
{
    unsigned char *p = buf;
    size_t got = 0;
    while (got < need) {
        ssize_t n = pread(fd, p + got, len - got, (off_t)(off + got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? -errno : -EIO;
        got += (size_t)n;
    }
    return 0;
}

int ck_pread(int fd, void *buf, size_t len, uint64_t off)
{
    return ck_pread_min(fd, buf, len, off, len);
}

int ck_write_all(int fd, const void *buf, size_t len)
{
    const unsigned char *p = buf;
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? -errno : -EIO;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int ck_source_adopt(const char *path, int fd, ck_file *f, ck_error *err)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return ck_fail(err, path, "cannot stat: %s", strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ck_fail(err, path, "not a regular file");
    }
    *f = (ck_file){.path = path, .fd = fd, .size = (uint64_t)st.st_size, .mtime = st.st_mtim,
                   .dev = st.st_dev, .ino = st.st_ino};
    return 0;
}

int ck_nofile_raise(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max)
        return 0;
    rl.rlim_cur = rl.rlim_max;
    return setrlimit(RLIMIT_NOFILE, &rl) == 0;
}

static int open_local(const char *loc)
{
    /* O_NONBLOCK: opening a FIFO must not wait for a writer. */
    return open(loc, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
}

int ck_source_open_local(const char *loc, const char *what, ck_file *f, ck_error *err)
{
    int fd = open_local(loc);
    /* Out of descriptors under a soft limit below the hard one (1,024 by default, a DCP job of
     * more ranks has more files): the process may raise it itself, and would fail if not. */
    if (fd < 0 && errno == EMFILE && ck_nofile_raise())
        fd = open_local(loc);
    if (fd < 0 && errno == EMFILE) {
        struct rlimit rl;
        int e = errno;
        unsigned long long most = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.rlim_cur : 0;
        return ck_fail(err, loc, "cannot open%s%s: %s (RLIMIT_NOFILE allows %llu: raise its "
                       "hard limit, e.g. ulimit -Hn, or LimitNOFILE= of a service)",
                       what ? " " : "", what ? what : "", strerror(e), most);
    }
    if (fd < 0)
        return ck_fail(err, loc, "cannot open%s%s: %s", what ? " " : "", what ? what : "",
                       strerror(errno));
    return ck_source_adopt(loc, fd, f, err);
}

void ck_source_close(ck_file *f)
{
    if (f->ops)
        f->ops->close(f);
    else if (f->fd >= 0)
        close(f->fd);
    f->fd = -1;
    f->ops = NULL; /* closed: again is harmless */
}

int ck_source_plain_name(const char *name)
{
    int plain = *name && strcmp(name, ".") && strcmp(name, "..") && !strchr(name, '/');
    for (const char *c = name; plain && *c; c++)
        plain = (unsigned char)*c >= 0x20 && *c != 0x7f;
    return plain;
}

char *ck_source_sibling(const char *loc, const char *name, ck_error *err)
{
    /* In a URL (an s3:// one too, read at its API URL), '?', '#' and '%' would change what the
     * name means. */
    int url = ck_location_is_url(loc);
    if (!ck_source_plain_name(name) || (url && name[strcspn(name, "?#%")]))
        return ck_fail(err, loc, "'%s' does not name a file in this directory", name), NULL;
    /* A URL's directory ends at its path's last '/', before any query. */
    size_t end = url ? strcspn(loc, "?#") : strlen(loc);
    size_t dir = end;
    while (dir > 0 && loc[dir - 1] != '/')
        dir--;
    char *out = NULL;
    if (asprintf(&out, "%.*s%s%s", (int)dir, loc, dir ? "" : "./", name) < 0)
        return ck_fail(err, loc, "out of memory"), NULL;
    return out;
}

int ck_file_read(const ck_file *f, void *buf, size_t len, uint64_t off)
{
    return f->ops ? f->ops->pread(f, buf, len, off) : ck_pread(f->fd, buf, len, off);
}

int ck_file_lends(const ck_file *f)
{
    return f->ops && f->ops->hold;
}

ssize_t ck_file_hold(const ck_file *f, size_t len, uint64_t off, const void **ptr, void **token)
{
    return f->ops->hold(f, len, off, ptr, token);
}

void ck_file_release(const ck_file *f, void *token)
{
    f->ops->release(f, token);
}

void ck_file_hint(ck_file *f, const uint64_t *bounds, size_t n)
{
    if (f->ops)
        f->ops->hint(f, bounds, n);
}

int ck_file_is_local(const ck_file *f)
{
    return !f->ops;
}

const ck_file *ck_file_origin(const ck_file *f)
{
    return !f->ops ? f : f->ops->origin ? f->ops->origin(f) : NULL;
}

int ck_file_matches(const ck_file *f, const struct stat *st)
{
    return st->st_dev == f->dev && st->st_ino == f->ino && (uint64_t)st->st_size == f->size &&
           st->st_mtim.tv_sec == f->mtime.tv_sec && st->st_mtim.tv_nsec == f->mtime.tv_nsec;
}

int ck_file_unchanged(const ck_file *f)
{
    struct stat st;
    return f->ops ? f->ops->same(f) : fstat(f->fd, &st) == 0 && ck_file_matches(f, &st);
}

void ck_file_stats(const ck_file *f, uint64_t *requests, uint64_t *bytes)
{
    *requests = *bytes = 0;
    if (f->ops)
        f->ops->stats(f, requests, bytes);
}

/* --- windows ------------------------------------------------------------------------------ */

static int window_pread(const ck_file *f, void *buf, size_t len, uint64_t off)
{
    const ck_window *w = f->remote;
    if (off > f->size || len > f->size - off)
        return -EIO;
    return ck_file_read(w->parent, buf, len, w->base + off);
}

static int window_same(const ck_file *f)
{
    return ck_file_unchanged(((const ck_window *)f->remote)->parent);
}

static const ck_source_ops window_ops = {.pread = window_pread, .same = window_same};

void ck_window_init(ck_window *w, const ck_file *parent, uint64_t base, uint64_t size)
{
    *w = (ck_window){.file = {.path = parent->path, .fd = -1, .size = size,
                              .mtime = parent->mtime, .ops = &window_ops, .remote = w},
                     .parent = parent, .base = base};
}
