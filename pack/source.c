/* source.c — the local source files (source.h), and ck_open: what kind of checkpoint a location
 * holds, decided by content alone. */
#include "gguf.h"
#include "http.h"
#include "hub.h"
#include "index.h"
#include "npy.h"
#include "packfile.h"
#include "safetensors.h"
#include "torch.h"
#include "zip.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A zip is an .npz when its first member is an .npy file (np.savez writes nothing else), and a
 * PyTorch checkpoint when its first record lies in a folder (torch.save's "archive/..."); any
 * other is named for what it holds. */
static int read_zip(ck_index *ix, uint32_t id, const unsigned char *head, size_t n,
                    ck_error *err)
{
    size_t len;
    const char *first = zip_first_name(head, n, &len);
    if (npz_probe(head, n)) {
        ix->format = "npz";
        return npz_read_file(ix, id, err);
    }
    if (!first || memchr(first, '/', len)) {
        ix->format = "pytorch-zip";
        return pt_read_zip(ix, id, err);
    }
    return ck_fail(err, ix->files[id].path, "a zip archive, but neither an .npz (its first "
                   "member '%.*s' is not an .npy file) nor a PyTorch checkpoint (whose records "
                   "lie in one folder)", (int)(len < 200 ? len : 200), first);
}

/* --- source files ------------------------------------------------------------------------ */

int ck_source_is_url(const char *loc)
{
    return http_is_url(loc) || hub_is_url(loc);
}

/* Where loc's userinfo lies: [*from, *from + *len), the part of its authority (between "://" and
 * the first '/', '?' or '#', RFC 3986) before the last '@'; *len is 0 when there is none. */
static void userinfo(const char *loc, size_t *from, size_t *len)
{
    *from = *len = 0;
    if (!http_is_url(loc)) /* hf:// has none: its '@' names a revision */
        return;
    *from = (size_t)(strstr(loc, "://") - loc) + 3;
    size_t auth = *from + strcspn(loc + *from, "/?#");
    for (size_t i = *from; i < auth; i++)
        if (loc[i] == '@')
            *len = i + 1 - *from;
}

char *ck_source_shown(const char *loc, char *buf, size_t cap)
{
    size_t from, len, end = ck_source_is_url(loc) ? strcspn(loc, "?#") : strlen(loc);
    userinfo(loc, &from, &len);
    snprintf(buf, cap, "%.*s%.*s", (int)from, loc, (int)(end - from - len), loc + from + len);
    return buf;
}

int ck_source_hide_args(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        char shown[CK_SHOWN_MAX];
        size_t n = strlen(argv[i]);
        if (!ck_source_is_url(argv[i]) ||
            strlen(ck_source_shown(argv[i], shown, sizeof shown)) == n)
            continue;
        char *copy = strdup(argv[i]);
        if (!copy)
            return -1;
        /* The kernel shows the argument block itself: the secret goes from there. */
        memset(argv[i], 0, n);
        memcpy(argv[i], shown, strlen(shown));
        argv[i] = copy;
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

int ck_source_open(const char *loc, const char *what, ck_file *f, ck_error *err)
{
    if (http_is_url(loc))
        return http_open(loc, what, f, err);
    /* O_NONBLOCK: opening a FIFO must not wait for a writer. */
    int fd = open(loc, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
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
    /* In a URL, '?', '#' and '%' would change what the name means. */
    if (!ck_source_plain_name(name) || (http_is_url(loc) && name[strcspn(name, "?#%")]))
        return ck_fail(err, loc, "'%s' does not name a file in this directory", name), NULL;
    /* A URL's directory ends at its path's last '/', before any query. */
    size_t end = http_is_url(loc) ? strcspn(loc, "?#") : strlen(loc);
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

ssize_t ck_file_hold(const ck_file *f, size_t len, uint64_t off, const void **ptr, void **token)
{
    /* A local file's bytes are in the page cache, which only a copy reaches. */
    return f->ops ? f->ops->hold(f, len, off, ptr, token) : -ENOTSUP;
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

int ck_file_still(const ck_file *f)
{
    struct stat st;
    return f->ops ? f->ops->same(f) : fstat(f->fd, &st) == 0 && ck_file_unchanged(f, &st);
}

void ck_file_stats(const ck_file *f, uint64_t *requests, uint64_t *bytes)
{
    *requests = *bytes = 0;
    if (f->ops)
        f->ops->stats(f, requests, bytes);
}

/* --- ck_open ----------------------------------------------------------------------------- */

static int open_file(const char *source, ck_index **out, ck_error *err)
{
    /* Enough for every probe: a zip's first member name included. */
    unsigned char head[NPY_PROBE_BYTES > PT_PROBE_BYTES ? NPY_PROBE_BYTES : PT_PROBE_BYTES];
    ck_index *ix = ck_index_new(NULL);
    if (!ix)
        return ck_fail(err, source, "out of memory");
    int id = ck_index_add_source(ix, source, NULL, err);
    if (id < 0)
        goto fail;
    const ck_file *f = &ix->files[id];
    size_t n = f->size < sizeof head ? (size_t)f->size : sizeof head;
    int rc = ck_file_read(f, head, n, 0);
    if (rc) {
        ck_fail(err, source, "cannot read: %s", strerror(-rc));
        goto fail;
    }
    if (n == 0) {
        ck_fail(err, source, "empty file");
        goto fail;
    }
    /* Content decides, never the file name. */
    int rc_read;
    if (pack_probe(head, n)) {
        ix->format = "pack";
        rc_read = pack_read_file(ix, (uint32_t)id, err);
    } else if (st_probe(head, n)) {
        ix->format = "safetensors";
        rc_read = st_read_file(ix, (uint32_t)id, err);
    } else if (npy_probe(head, n)) {
        ix->format = "npy";
        rc_read = npy_read_file(ix, (uint32_t)id, err);
    } else if (gguf_probe(head, n)) {
        ix->format = "gguf";
        rc_read = gguf_read_file(ix, (uint32_t)id, err);
    } else if (zip_probe(head, n)) {
        rc_read = read_zip(ix, (uint32_t)id, head, n, err);
    } else if (pt_probe_legacy(head, n)) {
        ix->format = "pytorch-legacy";
        rc_read = pt_read_legacy(ix, (uint32_t)id, err);
    } else if (st_index_probe(head, n)) { /* a shard set's index file: the shards beside it */
        ck_index_free(ix);
        return st_open_index(source, out, err);
    } else {
        char hex[3 * sizeof head + 1] = "";
        for (size_t i = 0, k = 0; i < n && i < 8; i++)
            k += (size_t)snprintf(hex + k, sizeof hex - k, "%s%02x", i ? " " : "", head[i]);
        ck_fail(err, source, "not a checkpoint format ckptfs knows (first bytes %s)", hex);
        goto fail;
    }
    if (rc_read != 0)
        goto fail;
    *out = ix;
    return 0;
fail:
    ck_index_free(ix);
    return -1;
}

/* A place in a source file: where a tensor begins or ends. */
typedef struct bound {
    uint32_t file;
    uint64_t at;
} bound;

static int by_place(const void *a, const void *b)
{
    const bound *x = a, *y = b;
    return x->file != y->file ? (x->file > y->file) - (x->file < y->file)
                              : (x->at > y->at) - (x->at < y->at);
}

/* Hands every remote file of ix where its tensors begin and end (ck_file_hint): a strided
 * tensor's first element only, its span being no extent. Without memory, no hint: reads go on
 * unhinted. */
static void hint_bounds(ck_index *ix)
{
    int remote = 0;
    for (uint32_t i = 0; i < ix->nfiles; i++)
        remote |= !ck_file_is_local(&ix->files[i]);
    if (!remote)
        return;
    bound *v = malloc(2 * ix->nentries * sizeof *v + 1);
    uint64_t *at = malloc(2 * ix->nentries * sizeof *at + 1);
    size_t n = 0;
    for (size_t i = 0; v && at && i < ix->nentries; i++) {
        const ck_entry *e = &ix->entries[i];
        if (e->kind != CK_TENSOR || ck_file_is_local(&ix->files[e->ext.file]))
            continue;
        v[n++] = (bound){e->ext.file, e->ext.offset};
        if (e->layout != CK_STRIDED)
            v[n++] = (bound){e->ext.file, e->ext.offset + e->ext.length};
    }
    if (n > 1) /* n is 0 without memory */
        qsort(v, n, sizeof *v, by_place);
    for (size_t i = 0, k; i < n; i = k) {
        size_t m = 0;
        for (k = i; k < n && v[k].file == v[i].file; k++)
            if (m == 0 || at[m - 1] != v[k].at)
                at[m++] = v[k].at;
        ck_file_hint(&ix->files[v[i].file], at, m);
    }
    free(at);
    free(v);
}

/* What ck_open opens, before the hints. */
static int open_any(const char *source, ck_index **out, ck_error *err)
{
    *out = NULL;
    if (hub_is_url(source))
        return hub_open(source, out, err);
    struct stat st;
    if (!http_is_url(source) && stat(source, &st) == 0 && S_ISDIR(st.st_mode))
        /* The one place a directory's kind is decided: GGUF splits, else safetensors shards. */
        return gguf_dir_probe(source) ? gguf_open_dir(source, out, err)
                                      : st_open_dir(source, out, err);
    return open_file(source, out, err);
}

int ck_open(const char *source, ck_index **out, ck_error *err)
{
    int rc = open_any(source, out, err);
    if (rc == 0)
        hint_bounds(*out);
    return rc;
}
