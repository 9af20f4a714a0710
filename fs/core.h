/* core.h — the filesystem a mount serves, apart from FUSE: every operation over the tree and
 * the index answers a result or -errno, and fs/ll.c only turns those answers into replies.
 * No FUSE here: tests/unit/test_core.c runs every operation without a mount.
 *
 * Contract:
 *  - Inode N is tree node N-1 (the root is CK_ROOT_INO); an inode never handed out answers
 *    -ENOENT. Nothing changes after ck_fs_init, so every answer may be cached for as long as
 *    the mount lives. Every operation is safe on many threads at once.
 *  - The view is only as good as its source files: open and read compare them with what was
 *    recorded when they were parsed, and fail rather than serve bytes the index no longer
 *    describes (a modified or truncated file gives -EIO, a replaced or removed one -ESTALE;
 *    open answers -ESTALE for either).
 *  - The mount's own files (.ckptfs/index.json, and the synthesized checkpoint.pack and
 *    checkpoint.safetensors) are made the first time anyone looks at them, once, whatever the
 *    threads (index.json may be made ahead, in the background: ck_fs_prepare). If one cannot
 *    be made, every lookup, stat, open and read of it answers -EIO, never a short or empty
 *    file, and the reason goes to the log once, as the line `ckpt pack` would print
 *    ("ckptfs: SOURCE: what is wrong").
 *  - .ckptfs/status is one line of text, made afresh on every use (its size too: an adapter
 *    must not let the kernel cache its attributes or pages, ck_fs_is_volatile): "ok" while
 *    every source file is the one mounted, else why reads fail ("source changed: PATH (what
 *    differs); remount to read it"). The first change any check finds (an open, a read, the
 *    status itself) also goes to the log, once per mount.
 *  - With npy set (`-o npy`), every tensor file NAME is also served as NAME.npy beside it: the
 *    NumPy header npy_header_make writes (formats/npy.h), made again on each use (it is a few
 *    hundred bytes of text), then the tensor's bytes. Its inode is the tensor's plus the node
 *    count; it has the tensor's xattrs. A tensor whose file name is over 251 bytes has none
 *    (NAME.npy would pass NAME_MAX). No tree node's name holds a '.' outside .ckptfs, so no
 *    NAME.npy is ever another file's name.
 */
#ifndef CK_CORE_H
#define CK_CORE_H

#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "../views/mountinfo.h"
#include "../views/tree.h"
#include "../views/view.h" /* ck_text: index.json */
#include "../checkpoint/synth.h"

enum { CK_VFILE_INDEX_JSON, CK_VFILE_PACK, CK_VFILE_SAFETENSORS, CK_VFILE_STATUS, CK_VFILE_COUNT };
#define CK_ROOT_INO 1
extern const ck_tree_vfile ck_vfiles[CK_VFILE_COUNT];

/* Where the core's one-line messages go (no newline at the end). */
typedef void (*ck_fs_log)(const char *line);

typedef struct ck_fs {
    const ck_index *ix;
    const ck_tree *tree;
    struct {
        ck_text text;          /* CK_NODE_MEMFILE: its bytes */
        ck_synth *synth;       /* CK_NODE_SYNTH: its layout */
        int made;              /* made on first use (under vfile_lock) */
        int failed;            /* could not be made (and was logged) */
    } vfile[CK_VFILE_COUNT];
    pthread_mutex_t vfile_lock;
    int change_told;           /* a changed source was logged (once per mount; vfile_lock) */
    pthread_t prepare;         /* ck_fs_prepare's thread, joined by ck_fs_free */
    int preparing;             /* it was started */
    uid_t uid;
    gid_t gid;
    struct timespec mtime;     /* directories, values and the mount's files: the source's */
    char **src_path;           /* ix->files[i] as an absolute path: the daemon runs in "/" */
    char *sources;             /* the root's user.ckptfs.sources (ck_fs_publish_sources) */
    size_t sources_len;
    ck_fs_log log;
    int npy;                   /* serve NAME.npy views (set before serving) */
    uint32_t *alias_of;        /* per entry: the entry whose storage it shares (ck_synth_aliases) */
} ck_fs;

/* Makes the view of ix (which it takes over, and frees on failure too): tree and absolute
 * source paths; the mount's own files wait for their first use. Every file is owned by
 * uid:gid; log receives messages (NULL: none).
 * 0, or -1 with err set (out of memory, two entries with one path). */
int ck_fs_init(ck_fs *fs, ck_index *ix, uid_t uid, gid_t gid, ck_fs_log log, ck_error *err);
/* Starts making index.json on a thread of its own, so that a reader right after the mount
 * (the usual first thing a loader does) finds it made, or being made, rather than waits for all
 * of it: it takes the time the mount itself and the command's exit take anyway, on the other
 * core. Its text is the same, made once, whoever asks first; a failure is logged and answered as
 * on first use. Nothing happens if no thread can be started (it is then made on first use). */
void ck_fs_prepare(ck_fs *fs);
/* Publishes SOURCE (as mounted) and each source file's identity on the root, as the xattr
 * CK_SOURCES_XATTR (mountinfo.h), so that a loader can read the sources itself rather than
 * through FUSE; for a URL, the URL without its secrets and no file: a loader reads that mount
 * through its pack, but still knows it for a mount. 0, or -1 with err set. */
int ck_fs_publish_sources(ck_fs *fs, const char *source, ck_error *err);

/* Frees everything, the index included, once ck_fs_prepare's thread is done. A zeroed ck_fs is
 * fine. */
void ck_fs_free(ck_fs *fs);

/* Whether ino's contents or size may change while mounted (.ckptfs/status): its attributes
 * and pages must not be cached. */
int ck_fs_is_volatile(const ck_fs *fs, uint64_t ino);

/* The attributes of an inode. -ENOENT, -EIO (one of the mount's own files that cannot be
 * made). */
int ck_fs_getattr(ck_fs *fs, uint64_t ino, struct stat *st);
/* The child name of directory parent, and its attributes. -ENOENT (no such child), -ENOTDIR,
 * -EIO as getattr. */
int ck_fs_lookup(ck_fs *fs, uint64_t parent, const char *name, struct stat *st);
/* 0 when ino is a directory; -ENOENT, -ENOTDIR. */
int ck_fs_opendir(const ck_fs *fs, uint64_t ino);

/* One directory entry: offsets are 0 for ".", 1 for "..", 2 + k for the k-th child in
 * bytewise order; next is the offset of the entry after it. */
typedef struct ck_dirent {
    const char *name;
    uint64_t ino;
    mode_t type;               /* S_IFDIR or S_IFREG */
    off_t next;
    char made[CK_NAME_MAX + 1]; /* name points here when it is made: a NAME.npy view */
} ck_dirent;
/* The entry at off (a negative off is 0) of directory ino: 1, 0 past the last, or -ENOENT,
 * -ENOTDIR. With npy, offset 2 + 2k is the k-th child and 2 + 2k + 1 its NAME.npy view (an
 * offset whose view does not exist answers the next entry). */
int ck_fs_readdir(const ck_fs *fs, uint64_t ino, off_t off, ck_dirent *d);

/* Whether ino may be opened with open(2) flags: 0, or -ENOENT, -EISDIR, -EROFS (for writing
 * or truncating), -EIO (one of the mount's own files that cannot be made), -ESTALE (a source
 * file changed: every one is checked, as a changed source makes the whole view suspect;
 * .ckptfs/status, which says so, opens all the same). */
int ck_fs_open(ck_fs *fs, uint64_t ino, int flags);
/* Where a read's bytes go when they are copied rather than lent: a buffer of at least size
 * bytes that stays the caller's (a thread's own, reused from read to read), or NULL when memory
 * runs out. */
typedef char *(*ck_fs_buffer)(void *arg, size_t size);
/* One read's bytes: n pieces, in order. The first `lent` are lent by the source, each held by
 * its token until ck_fs_read_release; the others are the mount's own bytes or the caller's
 * buffer. */
#define CK_PIECES_MAX 4
typedef struct ck_pieces {
    unsigned n, lent;
    struct iovec iov[CK_PIECES_MAX];
    void *token[CK_PIECES_MAX];
} ck_pieces;
/* Up to size bytes of file ino at off: the count (0 at or past the end), its bytes in p's
 * pieces, held until ck_fs_read_release(fs, ino, p); or -ENOENT, -EINVAL (off < 0), -EISDIR,
 * -EIO, -ESTALE (the sources are checked after reading), -ENOMEM (no buffer), with nothing
 * held. One call decides, by what the file is and never by a read that fails, whether the
 * bytes are lent in place (a reply straight from them needs neither a buffer nor the copy into
 * it) or copied once into the buffer buffer(arg, ...) gives: lent where they are in memory to
 * lend, a file the mount holds (index.json) or a contiguous tensor's range that its source
 * lends (index.h ck_entry_lends: a remote file's cached blocks); a read that needs more
 * pieces than CK_PIECES_MAX has its rest copied. Every other file is copied. */
ssize_t ck_fs_read(ck_fs *fs, uint64_t ino, size_t size, off_t off, ck_fs_buffer buffer,
                   void *arg, ck_pieces *p);
void ck_fs_read_release(ck_fs *fs, uint64_t ino, ck_pieces *p);

/* The attribute name of ino, as getxattr(2) answers: its length, copied into buf when size is
 * not 0; -ERANGE when size is too small, -ENODATA when ino has no such attribute, -ENOENT.
 * A tensor has user.ckptfs.name, .dtype and .shape (JSON), a value .name and .type, the root
 * user.ckptfs.sources once published. */
ssize_t ck_fs_getxattr(const ck_fs *fs, uint64_t ino, const char *name, char *buf, size_t size);
/* The attribute names of ino, each NUL-terminated, as listxattr(2) answers (same rules). */
ssize_t ck_fs_listxattr(const ck_fs *fs, uint64_t ino, char *buf, size_t size);

/* Blocks of 4096 bytes for the entries and index.json (made now if it was not; counting the
 * synthesized files would build them), one file per node, read-only. */
void ck_fs_statfs(ck_fs *fs, struct statvfs *sv);

#endif
