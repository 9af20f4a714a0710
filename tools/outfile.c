/* outfile.c — atomic outputs of ckpt commands (see outfile.h). */
#include "outfile.h"
#include "../base/location.h" /* an output named as a URL: refused, shown without secrets */
#include "../base/size.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

/* A temp output is named OUT + TMP_MARK + our pid + "-XXXXXX": a later run can tell one whose
 * writer died (SIGKILL, a crash, a power cut) from one being written, and remove it. */
#define TMP_MARK ".ckpt-tmp-"

/* Makes sure path's directory entry is on disk. */
static int sync_dir_of(const char *path)
{
    char *copy = strdup(path);
    int fd = copy ? open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    int rc = fd >= 0 && fsync(fd) == 0 ? 0 : -1;
    if (fd >= 0)
        close(fd);
    free(copy);
    return rc;
}

/* The writing of one file: its bytes are sent to the disk as they come (writeback started every
 * WRITEBACK_STEP bytes), so that the disk writes while the rest is still being read and the
 * final fsync has little left to wait for, not the whole write after the copy. */
enum { WRITEBACK_STEP = 64 << 20 };

typedef struct writing {
    int fd;
    uint64_t started;        /* writeback asked for [0, started) */
    ck_progress progress;    /* the caller's */
    void *ctx;
} writing;

static int write_tick(void *ctx, uint64_t done, uint64_t total)
{
    writing *w = ctx;
    if (done - w->started >= WRITEBACK_STEP) {
        /* Only a hint: where it fails, the fsync at the end writes it all. */
        sync_file_range(w->fd, (off_t)w->started, (off_t)(done - w->started),
                        SYNC_FILE_RANGE_WRITE);
        w->started = done;
    }
    return w->progress(w->ctx, done, total);
}

/* Fills the new file fd with sy (or with bytes p when sy is NULL), makes it 0644, fsyncs and
 * closes it. 0 or -errno. */
static int fill(int fd, ck_synth *sy, const void *p, size_t n, ck_progress progress, void *ctx)
{
    int rc = 0;
    writing w = {.fd = fd, .progress = progress, .ctx = ctx};
    if (sy)
        rc = ck_synth_write(sy, fd, write_tick, &w);
    else if ((errno = 0, write(fd, p, n)) != (ssize_t)n) /* a small file: one write, or it failed */
        rc = errno ? -errno : -EIO;
    if (rc == 0 && (fchmod(fd, 0644) != 0 || fsync(fd) != 0))
        rc = -errno;
    if (close(fd) != 0 && rc == 0)
        rc = -errno;
    return rc;
}

static void report(const char *out, int rc)
{
    fprintf(stderr, "ckpt: %s: %s\n", out,
            rc == -ECANCELED ? "interrupted; nothing written"
            : rc == -EIO     ? "a source read failed (changed or truncated?); nothing written"
                             : strerror(-rc));
}

/* Removes the files in the directory dirfd (only files are ever put in ours), and closes it. */
static void remove_files_in(int dirfd)
{
    DIR *dir = fdopendir(dirfd);
    for (struct dirent *e; dir && (e = readdir(dir));)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            unlinkat(dirfd, e->d_name, 0);
    if (dir)
        closedir(dir);
    else
        close(dirfd);
}

/* Whether name is a temp output of out's (base: out's last component) whose writer is gone:
 * no process has its pid any more. */
static int stale_temp(const char *name, const char *base)
{
    size_t blen = strlen(base), mlen = strlen(TMP_MARK);
    if (strncmp(name, base, blen) != 0 || strncmp(name + blen, TMP_MARK, mlen) != 0)
        return 0;
    const char *digits = name + blen + mlen;
    char *end;
    long pid = strtol(digits, &end, 10);
    if (end == digits || *digits < '1' || *digits > '9' || *end != '-' || strlen(end + 1) != 6 ||
        pid > INT32_MAX)
        return 0;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* Removes what earlier runs writing out left beside it when they died before cleaning up. */
static void sweep_stale_temps(const char *out)
{
    char *dcopy = strdup(out), *bcopy = strdup(out);
    DIR *dir = dcopy && bcopy ? opendir(dirname(dcopy)) : NULL;
    const char *base = bcopy ? basename(bcopy) : NULL;
    for (struct dirent *e; dir && (e = readdir(dir));) {
        if (!stale_temp(e->d_name, base))
            continue;
        int fd = openat(dirfd(dir), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0) { /* a directory output's */
            remove_files_in(fd);
            unlinkat(dirfd(dir), e->d_name, AT_REMOVEDIR);
        } else {
            unlinkat(dirfd(dir), e->d_name, 0);
        }
    }
    if (dir)
        closedir(dir);
    free(dcopy);
    free(bcopy);
}

/* Whether out is named as a URL (ck_location_is_url), which no output is: said on one line, the
 * URL shown without its secrets, before any message that would name out as it is. */
static int url_refused(const char *out)
{
    char shown[CK_SHOWN_MAX];
    if (!ck_location_is_url(out))
        return 0;
    fprintf(stderr, "ckpt: %s: an output is a local path, not a URL\n",
            ck_location_shown(out, shown, sizeof shown));
    return 1;
}

/* Says, on one line, why out cannot be written where it is: the first of its parent directories
 * that does not exist, or one that is no directory. -1, or 0 when its directory is there. */
static int parents_missing(const char *out)
{
    char *dir = strdup(out);
    struct stat st;
    if (!dir)
        return fprintf(stderr, "ckpt: out of memory\n"), -1;
    char *parent = dirname(dir); /* within dir's bytes */
    int rc = 0;
    if (stat(parent, &st) != 0 || !S_ISDIR(st.st_mode)) {
        /* the shallowest one missing: say that one, so that `mkdir -p` is plainly the fix */
        for (char *c = parent + (*parent == '/'); rc == 0; c++) {
            char keep = *c;
            if (keep != '/' && keep != '\0')
                continue;
            *c = '\0';
            if (stat(parent, &st) != 0 || !S_ISDIR(st.st_mode)) {
                int absent = errno == ENOENT;
                fprintf(stderr, "ckpt: %s: cannot create it: %s %s", out, parent,
                        absent ? "does not exist" : "is not a directory");
                *c = keep;
                fprintf(stderr, absent ? " (mkdir -p %s first)\n" : "\n", parent);
                rc = -1;
            }
            *c = keep;
            if (!keep)
                break;
        }
    }
    free(dir);
    return rc;
}

char *ck_out_file_path(const char *out, const char *name)
{
    struct stat st;
    char *path = NULL;
    size_t n = strlen(out);
    if (url_refused(out))
        return NULL;
    if (stat(out, &st) == 0 && S_ISDIR(st.st_mode)) { /* into it, as cp puts a file */
        if (asprintf(&path, "%s%s%s", out, n && out[n - 1] == '/' ? "" : "/", name) < 0)
            path = NULL;
    } else if (n && out[n - 1] == '/') { /* a directory meant, which is not there */
        fprintf(stderr, "ckpt: %s: no such directory (mkdir -p it first, or name a file)\n", out);
        return NULL;
    } else {
        path = strdup(out);
    }
    if (!path)
        fprintf(stderr, "ckpt: out of memory\n");
    if (path && parents_missing(path) != 0) {
        free(path);
        return NULL;
    }
    return path;
}

/* Whether the directory out holds anything, and whether all of it is plain files (what --force
 * may remove): 0 empty, 1 files only, 2 something else too; -1 when it cannot be read. */
static int dir_contents(const char *out)
{
    DIR *dir = opendir(out);
    if (!dir)
        return -1;
    int what = 0;
    for (struct dirent *e; (e = readdir(dir));) {
        struct stat st;
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        int file = fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                   S_ISREG(st.st_mode);
        what = file && what < 2 ? 1 : 2;
    }
    closedir(dir);
    return what;
}

/* Whether a directory output may go to out: it does not exist, or is an empty directory, or
 * force lets a directory of files or a file be replaced. 0, or -1 after saying why. */
static int dir_output_allowed(const char *out, int force)
{
    struct stat st;
    if (lstat(out, &st) != 0)
        return errno == ENOENT ? parents_missing(out)
                               : (fprintf(stderr, "ckpt: %s: %s\n", out, strerror(errno)), -1);
    if (!S_ISDIR(st.st_mode)) {
        if (force && S_ISREG(st.st_mode))
            return 0;
        fprintf(stderr, "ckpt: %s: exists and is not a directory%s\n", out,
                S_ISREG(st.st_mode) ? " (--force replaces it)" : "");
        return -1;
    }
    int what = dir_contents(out);
    if (what == 0 || (what == 1 && force))
        return 0;
    if (what < 0)
        fprintf(stderr, "ckpt: %s: cannot read it: %s\n", out, strerror(errno));
    else if (what == 1)
        fprintf(stderr, "ckpt: %s: a directory that is not empty; remove it, or pass --force to "
                "replace it\n", out);
    else
        fprintf(stderr, "ckpt: %s: a directory that holds more than files; --force replaces "
                "only a directory of files: remove it yourself\n", out);
    return -1;
}

/* Whether path names the file (dev, ino). */
static int is_file(const char *path, dev_t dev, ino_t ino)
{
    struct stat st;
    return stat(path, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
}

int ck_out_spares_sources(const char *out, int dir, const ck_index *ix)
{
    struct stat st;
    if (stat(out, &st) != 0) /* nothing there yet: nothing to replace */
        return 0;
    for (uint32_t i = 0; i < ix->nfiles; i++) {
        const ck_file *f = &ix->files[i];
        if (f->ops) /* remote */
            continue;
        if (f->dev == st.st_dev && f->ino == st.st_ino) {
            fprintf(stderr, "ckpt: '%s' and '%s' are the same file\n", f->path, out);
            return -1;
        }
        char *copy = dir && S_ISDIR(st.st_mode) ? strdup(f->path) : NULL;
        int inside = copy && is_file(dirname(copy), st.st_dev, st.st_ino);
        free(copy);
        if (inside) {
            fprintf(stderr, "ckpt: %s: holds '%s', a file of the source, which the output would "
                    "replace\n", out, f->path);
            return -1;
        }
    }
    return 0;
}

/* The temp name of out ("...XXXXXX" for mkostemp or mkdtemp), or NULL (said). */
static char *temp_name(const char *out)
{
    char *tmp = NULL;
    sweep_stale_temps(out);
    if (asprintf(&tmp, "%s" TMP_MARK "%ld-XXXXXX", out, (long)getpid()) < 0) {
        fprintf(stderr, "ckpt: out of memory\n");
        return NULL;
    }
    return tmp;
}

int ck_out_say_default(void)
{
    return isatty(STDERR_FILENO) ? CK_OUT_SAY : 0;
}

/* The summary of a written output (CK_OUT_SAY). */
static void say_written(const char *out, uint64_t bytes, const ck_bar *bar)
{
    char size[32];
    double s = ck_bar_seconds(bar);
    ck_size_human(bytes, size, sizeof size);
    if (s < 0.05) /* too short for a rate that means anything */
        fprintf(stderr, "ckpt: %s: written, %s\n", out, size);
    else
        fprintf(stderr, "ckpt: %s: written, %s in %.1f s (%.0f MiB/s)\n", out, size, s,
                (double)bytes / s / 1048576.0);
}

int ck_out_file(ck_synth *sy, const char *out, const char *label, int flags)
{
    char *tmp = !url_refused(out) && parents_missing(out) == 0 ? temp_name(out) : NULL;
    if (!tmp)
        return -1;
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "ckpt: %s: cannot create: %s\n", out, strerror(errno));
        free(tmp);
        return -1;
    }
    ck_bar bar;
    ck_bar_start(&bar, label);
    int rc = fill(fd, sy, NULL, 0, ck_progress_tick, &bar);
    ck_bar_end(&bar);
    if (rc == 0 && rename(tmp, out) != 0)
        rc = -errno;
    if (rc != 0) {
        unlink(tmp);
        report(out, rc);
    } else if (sync_dir_of(out) != 0) {
        fprintf(stderr, "ckpt: %s: cannot sync its directory: %s\n", out, strerror(errno));
        rc = -1;
    } else if (flags & CK_OUT_SAY) {
        say_written(out, ck_synth_size(sy), &bar);
    }
    free(tmp);
    return rc ? -1 : 0;
}

/* Removes the temp directory and what is in it. */
static void remove_dir(ck_out_dir *d)
{
    remove_files_in(d->dirfd);
    rmdir(d->tmp);
    free(d->tmp);
    d->tmp = NULL;
}

void ck_out_dir_abort(ck_out_dir *d)
{
    ck_bar_end(&d->bar);
    remove_dir(d);
}

static int fail_dir(ck_out_dir *d, int rc)
{
    ck_out_dir_abort(d);
    report(d->out, rc);
    return -1;
}

int ck_out_dir_begin(ck_out_dir *d, const char *out, uint64_t total, const char *label,
                     int flags)
{
    *d = (ck_out_dir){.out = out, .total = total, .dirfd = -1, .flags = flags};
    if (url_refused(out) || dir_output_allowed(out, flags & CK_OUT_FORCE) != 0 ||
        !(d->tmp = temp_name(out)))
        return -1;
    /* Its mode set through the descriptor: a name in OUT's directory may be swapped (for a
     * link to a file a chmod would then change) by whoever else may write there. */
    if (!mkdtemp(d->tmp) ||
        (d->dirfd = open(d->tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
        fchmod(d->dirfd, 0755) != 0) {
        fprintf(stderr, "ckpt: %s: cannot create: %s\n", out, strerror(errno));
        if (d->dirfd >= 0)
            close(d->dirfd);
        d->dirfd = -1;
        rmdir(d->tmp);
        free(d->tmp);
        return -1;
    }
    ck_bar_start(&d->bar, label);
    return 0;
}

/* The bar counts the bytes of every file of the directory. */
static int dir_tick(void *ctx, uint64_t done, uint64_t total)
{
    ck_out_dir *d = ctx;
    (void)total;
    return ck_progress_tick(&d->bar, d->done + done, d->total);
}

static int add(ck_out_dir *d, const char *name, ck_synth *sy, const void *p, size_t n)
{
    int fd = openat(d->dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    int rc = fd < 0 ? -errno : fill(fd, sy, p, n, dir_tick, d);
    if (rc != 0)
        return fail_dir(d, rc);
    d->done += sy ? ck_synth_size(sy) : n;
    return 0;
}

int ck_out_dir_add(ck_out_dir *d, const char *name, ck_synth *sy)
{
    return add(d, name, sy, NULL, 0);
}

int ck_out_dir_add_bytes(ck_out_dir *d, const char *name, const void *p, size_t n)
{
    return add(d, name, NULL, p, n);
}

/* Puts the temp directory at d->out over what is there (--force): that moved aside under a
 * temp name first, removed once ours is in place (a directory of files, or a file). */
static int replace(ck_out_dir *d)
{
    char *aside = NULL;
    if (asprintf(&aside, "%s" TMP_MARK "%ld-oldout", d->out, (long)getpid()) < 0)
        return -ENOMEM;
    int rc = rename(d->out, aside) == 0 ? 0 : -errno;
    if (rc == 0 && rename(d->tmp, d->out) != 0) {
        rc = -errno;
        rename(aside, d->out); /* put it back */
    }
    int fd = rc == 0 ? open(aside, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
    if (fd >= 0) {
        remove_files_in(fd);
        rmdir(aside);
    } else if (rc == 0) {
        unlink(aside);
    }
    free(aside);
    return rc;
}

int ck_out_dir_commit(ck_out_dir *d)
{
    if (fsync(d->dirfd) != 0)
        return fail_dir(d, -errno);
    if (rename(d->tmp, d->out) != 0) {
        int rc = (d->flags & CK_OUT_FORCE) && (errno == ENOTEMPTY || errno == EEXIST || errno == ENOTDIR)
                     ? replace(d) : -errno;
        if (rc != 0)
            return fail_dir(d, rc);
    }
    ck_bar_end(&d->bar);
    close(d->dirfd);
    free(d->tmp);
    if (sync_dir_of(d->out) != 0) {
        fprintf(stderr, "ckpt: %s: cannot sync its directory: %s\n", d->out, strerror(errno));
        return -1;
    }
    if (d->flags & CK_OUT_SAY)
        say_written(d->out, d->done, &d->bar);
    return 0;
}
