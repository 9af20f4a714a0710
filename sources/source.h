/* source.h — where a checkpoint's bytes come from: a local file or a remote object (HTTP(S)).
 *
 * Contract:
 *  - A ck_file is one source file, opened once; every reader reads it through ck_file_read, and
 *    never knows whether the bytes come from a descriptor or the network.
 *  - ck_file_read returns exactly len bytes, or -errno: never a short count. A file that ends
 *    first, or a remote object that no longer answers as it did at open (its validator changed,
 *    a response that is not exactly the range asked for), gives -EIO.
 *  - ck_file_unchanged says whether the file is still what was opened: a local file by its
 *    open descriptor (device, inode, size, mtime: ck_file_matches); a remote one by its size and
 *    validator (ETag or Last-Modified) captured at open, which every later request is pinned to.
 *  - A remote file has no descriptor (fd is -1): whoever reads it uses ck_file_read only, never
 *    pread, O_DIRECT, mmap or fadvise on it (ck_file_is_local tells them apart).
 *  - A source is named by a location: a path, an http:// or https:// URL, an s3:// object (read
 *    at its API URL, named by its s3:// location: s3.h), or (through hub.h) hf://. Files a
 *    checkpoint names beside it (shards, splits) are opened by
 *    ck_source_sibling: only a plain file name is accepted, resolved in the source's own
 *    directory (a URL's directory for a URL), never a path the checkpoint chose.
 *  - A location is shown only as location.h says (ck_location_shown).
 *  - ck_file_hold lends the bytes at off in place, without a copy, where the source keeps them
 *    in memory (a remote file's cached blocks): the same bytes and checks as ck_file_read, held
 *    until ck_file_release, one piece (a block) at a time. Whether a file can is a property of
 *    the file, ck_file_lends, asked before (a local file cannot: its bytes are in the page
 *    cache, which only a copy reaches), never learnt from a hold that fails.
 *  - Functions taking a const ck_file are safe to call from many threads at once.
 *  - Where a file's tensors begin and end is the index's: ck_open hands it to the file
 *    (ck_file_hint), and a remote file sizes its requests by it.
 *  - An index holds one descriptor per local source file for its life (a DCP checkpoint: one a
 *    rank's file, 1,100 and more for a large job). A local open that finds the process out of
 *    descriptors (EMFILE) raises the soft limit of open files to the hard one (ck_nofile_raise)
 *    and tries once more: only a process that would otherwise fail is changed, by what it may
 *    do itself. ckptfs and ckpt raise it at start, as servers do (their sockets, outputs and
 *    caches need descriptors too).
 */
#ifndef CK_SOURCE_H
#define CK_SOURCE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "../base/error.h"
#include "../base/location.h"

typedef struct ck_file ck_file;

/* How a remote file is read: http.c implements it. */
typedef struct ck_source_ops {
    int (*pread)(const ck_file *f, void *buf, size_t len, uint64_t off); /* 0 or -errno */
    int (*same)(const ck_file *f);                                        /* 1: unchanged */
    void (*close)(ck_file *f);
    /* Requests made and bytes received so far. */
    void (*stats)(const ck_file *f, uint64_t *requests, uint64_t *bytes);
    /* Where the file's tensors begin and end (see ck_file_hint). */
    void (*hint)(ck_file *f, const uint64_t *bounds, size_t n);
    /* Lending in place (see ck_file_hold); NULL, both: the bytes cannot be lent. */
    ssize_t (*hold)(const ck_file *f, size_t len, uint64_t off, const void **ptr, void **token);
    void (*release)(const ck_file *f, void *token);
    /* The local file whose bytes these are made from (see ck_file_origin); NULL, or no such
     * function: none (a remote object). */
    const ck_file *(*origin)(const ck_file *f);
} ck_source_ops;

struct ck_file {
    const char *path;        /* the location as opened, for messages (a URL without its query) */
    int fd;                  /* -1 for a remote file */
    uint64_t size;
    struct timespec mtime;   /* local: st_mtim; remote: Last-Modified where the server says */
    dev_t dev;               /* local only */
    ino_t ino;               /* local only */
    const ck_source_ops *ops; /* NULL for a local file */
    void *remote;             /* the ops' state */
};

/* Opens loc (a path of a regular file, or an http(s) URL, opened through remote: http.h; a URL
 * fails when remote is NULL) into *f. On failure -1 with err set ("LOC: cannot open WHAT:
 * why"; what may be NULL). Defined in http.c, above both kinds. */
struct http_remote;
int ck_source_open(struct http_remote *remote, const char *loc, const char *what, ck_file *f,
                   ck_error *err);

/* ck_source_open of a path: a local file. */
int ck_source_open_local(const char *loc, const char *what, ck_file *f, ck_error *err);

/* A local file already open as fd (taken: closed on failure) into *f, which names it path: what
 * ck_source_open does once it has the descriptor. 0, or -1 with err set (cannot stat, not a
 * regular file). */
int ck_source_adopt(const char *path, int fd, ck_file *f, ck_error *err);

/* Raises this process's soft limit of open files (RLIMIT_NOFILE) to its hard limit. 1 when it
 * was raised, 0 when it already was there or cannot be. */
int ck_nofile_raise(void);

/* Releases what ck_source_open took (the descriptor or the connection state). */
void ck_source_close(ck_file *f);

/* Whether name is a plain file name: not empty, ".", or "..", no '/' or control character. */
int ck_source_plain_name(const char *name);

/* The location of file `name` beside loc (in its directory), malloc'ed; NULL with err set when
 * name is not a plain file name (empty, ".", "..", holding '/' or a control character) or
 * memory runs out. */
char *ck_source_sibling(const char *loc, const char *name, ck_error *err);

/* Reads exactly len bytes at off. 0, or -errno; a file that ends first gives -EIO. */
int ck_file_read(const ck_file *f, void *buf, size_t len, uint64_t off);

/* Whether f's bytes can be lent in place (ck_file_hold): a remote file's, not a local file's. */
int ck_file_lends(const ck_file *f);
/* Lends the first of the len (> 0) bytes at off of a file that lends (ck_file_lends) in place,
 * as many as one piece of the source holds (a remote file's block; a read of the rest asks
 * again): *ptr points at the count it returns (> 0) of them, exactly what ck_file_read would
 * copy, until ck_file_release(f, *token), which every successful hold needs (before f is
 * closed). -errno as ck_file_read. */
ssize_t ck_file_hold(const ck_file *f, size_t len, uint64_t off, const void **ptr, void **token);
void ck_file_release(const ck_file *f, void *token);

/* A window onto a file: the size bytes of parent at base, read as a file of their own, through
 * ck_file_read only (a read past its size is -EIO; ck_file_unchanged asks the parent). What
 * parses an archive laid inside another file (a DCP chunk: torch.save archives end to end)
 * reads it through one; the parent must outlive it, and closing it is not needed. */
typedef struct ck_window {
    ck_file file;
    const ck_file *parent;
    uint64_t base;
} ck_window;

void ck_window_init(ck_window *w, const ck_file *parent, uint64_t base, uint64_t size);

/* Whether f is a local file, with a descriptor that pread, O_DIRECT and mmap may use. */
int ck_file_is_local(const ck_file *f);

/* The local file f's bytes come from, whose identity (device, inode, size, mtime) and path are
 * f's as far as any check by path goes: f itself for a local file; the archive's for a file a
 * reader made of another's bytes (an .npz member's inflated copy, npy.c); NULL for a remote
 * object (and a window, only ever read while its parent is parsed). What the mount checks a
 * source's path against. */
const ck_file *ck_file_origin(const ck_file *f);

/* Whether f is still the file that was opened (see the contract): the one test of it. */
int ck_file_unchanged(const ck_file *f);

/* Whether st (an fstat or stat) describes f as it was when opened: same device and inode, size
 * and modification time. What ck_file_unchanged asks of a local file's descriptor, and what the
 * mount asks of a source's path and the loader of its own descriptor. */
struct stat;
int ck_file_matches(const ck_file *f, const struct stat *st);

/* Reads exactly len bytes of fd at off. 0, or -errno; a file that ends first gives -EIO. */
int ck_pread(int fd, void *buf, size_t len, uint64_t off);

/* Reads at least need (<= len) of the len bytes of fd at off, asking for all len each time
 * (an O_DIRECT read of an aligned range may stop at the end of the file once it has them).
 * 0, or -errno; a file that ends before need gives -EIO. */
int ck_pread_min(int fd, void *buf, size_t len, uint64_t off, size_t need);

/* Writes all len bytes of buf to fd (short writes and EINTR retried). 0, or -errno; a write
 * that makes no progress gives -EIO. */
int ck_write_all(int fd, const void *buf, size_t len);

/* Tells a remote f where its tensors begin and end: n offsets, sorted, distinct (copied), so that
 * a random read's fetch stops at its tensor's end. ck_open gives them once the index is built;
 * a local file takes no hint. */
void ck_file_hint(ck_file *f, const uint64_t *bounds, size_t n);

/* Requests made and bytes received for f (0 and 0 for a local file). */
void ck_file_stats(const ck_file *f, uint64_t *requests, uint64_t *bytes);

#endif
