/* ll.h — the FUSE lowlevel handlers over one immutable view (index + tree + virtual files).
 * Contract: inode N is tree node N-1 (the root is FUSE_ROOT_ID); nothing changes after mount,
 * so every reply may be cached by the kernel for as long as it likes; every handler that would
 * modify answers EROFS. Handlers are safe to run on many threads at once.
 * The view is only as good as its source files: open and read compare them with what was
 * recorded when they were parsed, and fail rather than serve bytes the index no longer
 * describes (a modified or truncated file gives EIO, a replaced or removed one ESTALE).
 */
#ifndef CK_LL_H
#define CK_LL_H

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>
#include <pthread.h>

#include "tree.h"
#include "../pack/synth.h"

enum { CK_VFILE_INDEX_JSON, CK_VFILE_PACK, CK_VFILE_SAFETENSORS, CK_VFILE_COUNT };
#define CK_VDIR ".ckptfs"
extern const char *const ck_vfile_names[CK_VFILE_COUNT];

typedef struct ck_fs {
    const ck_index *ix;
    const ck_tree *tree;
    char *vdata[CK_VFILE_COUNT];   /* index.json, built at mount */
    size_t vlen[CK_VFILE_COUNT];
    ck_synth *synth[CK_VFILE_COUNT]; /* checkpoint.pack / .safetensors, built on first use */
    int synth_failed[CK_VFILE_COUNT];
    pthread_mutex_t synth_lock;
    uid_t uid;
    gid_t gid;
    int direct_io;
    double timeout;             /* seconds the kernel may cache entries and attributes */
    struct timespec mtime;      /* directories and virtual files: the source's */
    pthread_key_t read_buf;     /* each worker thread's read buffer */
    char **src_path;            /* ix->files[i] as an absolute path: the daemon runs in "/" */
} ck_fs;

/* 0 while source file `file` is still the one parsed at mount (same inode at the same path,
 * same size and mtime); else -EIO (its contents changed) or -ESTALE (the path now names
 * another file, or none). One fstat and one stat. */
int ck_fs_source_check(const ck_fs *fs, uint32_t file);

extern const struct fuse_lowlevel_ops ck_ll_ops;

#endif
