/* outfile.c — atomic outputs of ckpt commands (see outfile.h). */
#include "outfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
 * final fsync has little left to wait for: a 2 GiB conversion took the copy's time plus the
 * whole write's before. */
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

int ck_out_file(ck_synth *sy, const char *out, const char *label)
{
    char *tmp = NULL;
    if (asprintf(&tmp, "%s.tmp-XXXXXX", out) < 0) {
        fprintf(stderr, "ckpt: out of memory\n");
        return -1;
    }
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
    }
    free(tmp);
    return rc ? -1 : 0;
}

/* Removes the temp directory and what is in it (only files are ever put there). */
static void remove_dir(ck_out_dir *d)
{
    DIR *dir = fdopendir(d->dirfd);
    for (struct dirent *e; dir && (e = readdir(dir));)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            unlinkat(d->dirfd, e->d_name, 0);
    if (dir)
        closedir(dir);
    else
        close(d->dirfd);
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

int ck_out_dir_begin(ck_out_dir *d, const char *out, uint64_t total, const char *label)
{
    *d = (ck_out_dir){.out = out, .total = total, .dirfd = -1};
    if (asprintf(&d->tmp, "%s.tmp-XXXXXX", out) < 0) {
        fprintf(stderr, "ckpt: out of memory\n");
        return -1;
    }
    if (!mkdtemp(d->tmp) || chmod(d->tmp, 0755) != 0 ||
        (d->dirfd = open(d->tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        fprintf(stderr, "ckpt: %s: cannot create: %s\n", out, strerror(errno));
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

int ck_out_dir_commit(ck_out_dir *d)
{
    if (fsync(d->dirfd) != 0 || rename(d->tmp, d->out) != 0)
        return fail_dir(d, -errno);
    ck_bar_end(&d->bar);
    close(d->dirfd);
    free(d->tmp);
    if (sync_dir_of(d->out) != 0) {
        fprintf(stderr, "ckpt: %s: cannot sync its directory: %s\n", d->out, strerror(errno));
        return -1;
    }
    return 0;
}
