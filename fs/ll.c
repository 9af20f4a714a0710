#include "ll.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <syslog.h>
#include <sys/mman.h>

#include "../base/bytes.h"

static ck_mount *mount_of(fuse_req_t req)
{
    return fuse_req_userdata(req);
}

static ck_fs *fs_of(fuse_req_t req)
{
    return &mount_of(req)->fs;
}

void ck_ll_log(const char *line)
{
    fuse_log(FUSE_LOG_ERR, "%s\n", line);
}

static int log_stderr; /* ck_ll_log_start's to_stderr */

/* A line to stderr when it is still someone's to read, and to syslog when stderr is not, or
 * when it is an error (a detached daemon's reader may not be watching). fuse_log_level is
 * syslog's priority, level for level. */
static void log_both(enum fuse_log_level level, const char *fmt, va_list ap)
{
    if (log_stderr) {
        va_list again;
        va_copy(again, ap);
        vfprintf(stderr, fmt, again);
        va_end(again);
    }
    if (!log_stderr || level <= FUSE_LOG_ERR)
        vsyslog((int)level, fmt, ap);
}

void ck_ll_log_start(int to_stderr)
{
    log_stderr = to_stderr;
    openlog("ckptfs", LOG_PID, LOG_DAEMON);
    fuse_set_log_func(log_both);
}

/* How long the kernel may keep ino's attributes: none for a file that changes (its size). */
static double attr_timeout(fuse_req_t req, fuse_ino_t ino)
{
    return ck_fs_is_volatile(fs_of(req), ino) ? 0 : mount_of(req)->timeout;
}

static void ll_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    struct fuse_entry_param e = {.entry_timeout = mount_of(req)->timeout};
    int rc = ck_fs_lookup(fs_of(req), parent, name, &e.attr);
    if (rc && rc != -ENOENT)
        return (void)fuse_reply_err(req, -rc);
    if (rc == 0) { /* else ino 0: the kernel caches the miss as well */
        e.ino = e.attr.st_ino;
        e.generation = 1;
        e.attr_timeout = attr_timeout(req, e.ino);
    }
    fuse_reply_entry(req, &e);
}

static void ll_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)fi;
    struct stat st;
    int rc = ck_fs_getattr(fs_of(req), ino, &st);
    if (rc)
        return (void)fuse_reply_err(req, -rc);
    fuse_reply_attr(req, &st, attr_timeout(req, ino));
}

static void ll_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    int rc = ck_fs_opendir(fs_of(req), ino);
    if (rc)
        return (void)fuse_reply_err(req, -rc);
    fi->cache_readdir = 1;
    fi->keep_cache = 1;
    fuse_reply_open(req, fi);
}

static void ll_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                       struct fuse_file_info *fi)
{
    (void)fi;
    ck_dirent d;
    int rc = ck_fs_readdir(fs_of(req), ino, off, &d);
    char *buf = rc >= 0 ? malloc(size) : NULL;
    if (rc < 0 || !buf)
        return (void)fuse_reply_err(req, rc < 0 ? -rc : ENOMEM);
    size_t used = 0;
    for (; rc > 0; rc = ck_fs_readdir(fs_of(req), ino, d.next, &d)) {
        struct stat st = {.st_ino = d.ino, .st_mode = d.type};
        size_t n = fuse_add_direntry(req, buf + used, size - used, d.name, &st, d.next);
        if (n > size - used)
            break;
        used += n;
    }
    fuse_reply_buf(req, buf, used);
    free(buf);
}

static void ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    int rc = ck_fs_open(fs_of(req), ino, fi->flags);
    if (rc)
        return (void)fuse_reply_err(req, -rc);
    /* The bytes never change while mounted, but for a volatile file's: read afresh, whatever
     * the size the kernel last saw. */
    int fresh = ck_fs_is_volatile(fs_of(req), ino);
    fi->keep_cache = !fresh;
    fi->direct_io = mount_of(req)->direct_io || fresh;
    fuse_reply_open(req, fi);
}

enum { HUGE_PAGE = 2 << 20 };

/* This thread's read buffer, at least size bytes (ck_fs_buffer, arg the mount): asked for only
 * by a read whose bytes are copied. In whole huge pages: the reply's writev pins the buffer's
 * pages, and a 1 MiB reply then pins one page, not 256 small ones. */
static char *read_buffer(void *arg, size_t size)
{
    ck_mount *m = arg;
    size_t *b = pthread_getspecific(m->read_buf);
    if (!b || *b < size) {
        free(b);
        size_t cap = (size_t)ck_align_up(sizeof(size_t) + size, HUGE_PAGE);
        void *p = NULL;
        if (posix_memalign(&p, HUGE_PAGE, cap) == 0)
            madvise(p, cap, MADV_HUGEPAGE); /* a hint: small pages work too */
        b = p;
        pthread_setspecific(m->read_buf, b);
        if (!b)
            return NULL;
        *b = cap - sizeof(size_t);
    }
    return (char *)(b + 1);
}

static void ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi)
{
    (void)fi;
    ck_fs *fs = fs_of(req); /* req is gone once replied to */
    ck_pieces p;
    ssize_t n = ck_fs_read(fs, ino, size, off, read_buffer, mount_of(req), &p);
    if (n < 0)
        return (void)fuse_reply_err(req, (int)-n);
    fuse_reply_iov(req, p.iov, (int)p.n); /* which copies the bytes into the kernel */
    ck_fs_read_release(fs, ino, &p);
}

/* getxattr and listxattr: a length when asked for it (size 0), else the bytes. */
static void reply_xattr(fuse_req_t req, ssize_t n, const char *buf, size_t size)
{
    if (n < 0)
        fuse_reply_err(req, (int)-n);
    else if (size == 0)
        fuse_reply_xattr(req, (size_t)n);
    else
        fuse_reply_buf(req, buf, (size_t)n);
}

static void ll_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
    char *buf = size ? malloc(size) : NULL;
    if (size && !buf)
        return (void)fuse_reply_err(req, ENOMEM);
    reply_xattr(req, ck_fs_getxattr(fs_of(req), ino, name, buf, size), buf, size);
    free(buf);
}

static void ll_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
    char *buf = size ? malloc(size) : NULL;
    if (size && !buf)
        return (void)fuse_reply_err(req, ENOMEM);
    reply_xattr(req, ck_fs_listxattr(fs_of(req), ino, buf, size), buf, size);
    free(buf);
}

static void ll_statfs(fuse_req_t req, fuse_ino_t ino)
{
    (void)ino;
    struct statvfs sv;
    ck_fs_statfs(fs_of(req), &sv);
    fuse_reply_statfs(req, &sv);
}

/* Everything that would change the tree: the view is read-only by design. */
static void ll_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                       struct fuse_file_info *fi)
{
    (void)ino, (void)attr, (void)to_set, (void)fi;
    fuse_reply_err(req, EROFS);
}
static void ll_mknod(fuse_req_t req, fuse_ino_t p, const char *n, mode_t m, dev_t d)
{
    (void)p, (void)n, (void)m, (void)d;
    fuse_reply_err(req, EROFS);
}
static void ll_mkdir(fuse_req_t req, fuse_ino_t p, const char *n, mode_t m)
{
    (void)p, (void)n, (void)m;
    fuse_reply_err(req, EROFS);
}
static void ll_unlink(fuse_req_t req, fuse_ino_t p, const char *n)
{
    (void)p, (void)n;
    fuse_reply_err(req, EROFS);
}
static void ll_symlink(fuse_req_t req, const char *l, fuse_ino_t p, const char *n)
{
    (void)l, (void)p, (void)n;
    fuse_reply_err(req, EROFS);
}
static void ll_rename(fuse_req_t req, fuse_ino_t p, const char *n, fuse_ino_t np,
                      const char *nn, unsigned int f)
{
    (void)p, (void)n, (void)np, (void)nn, (void)f;
    fuse_reply_err(req, EROFS);
}
static void ll_link(fuse_req_t req, fuse_ino_t i, fuse_ino_t np, const char *nn)
{
    (void)i, (void)np, (void)nn;
    fuse_reply_err(req, EROFS);
}
static void ll_write(fuse_req_t req, fuse_ino_t i, const char *b, size_t s, off_t o,
                     struct fuse_file_info *fi)
{
    (void)i, (void)b, (void)s, (void)o, (void)fi;
    fuse_reply_err(req, EROFS);
}
static void ll_create(fuse_req_t req, fuse_ino_t p, const char *n, mode_t m,
                      struct fuse_file_info *fi)
{
    (void)p, (void)n, (void)m, (void)fi;
    fuse_reply_err(req, EROFS);
}
static void ll_setxattr(fuse_req_t req, fuse_ino_t i, const char *n, const char *v, size_t s,
                        int f)
{
    (void)i, (void)n, (void)v, (void)s, (void)f;
    fuse_reply_err(req, EROFS);
}
static void ll_removexattr(fuse_req_t req, fuse_ino_t i, const char *n)
{
    (void)i, (void)n;
    fuse_reply_err(req, EROFS);
}

const struct fuse_lowlevel_ops ck_ll_ops = {
    .lookup = ll_lookup,
    .getattr = ll_getattr,
    .opendir = ll_opendir,
    .readdir = ll_readdir,
    .open = ll_open,
    .read = ll_read,
    .getxattr = ll_getxattr,
    .listxattr = ll_listxattr,
    .statfs = ll_statfs,
    .setattr = ll_setattr,
    .mknod = ll_mknod,
    .mkdir = ll_mkdir,
    .unlink = ll_unlink,
    .rmdir = ll_unlink,
    .symlink = ll_symlink,
    .rename = ll_rename,
    .link = ll_link,
    .write = ll_write,
    .create = ll_create,
    .setxattr = ll_setxattr,
    .removexattr = ll_removexattr,
};
