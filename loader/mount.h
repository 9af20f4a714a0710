/* mount.h — what a load reads, given the path it was asked for (libckload's core, ckload.c,
 * asks; nothing here is exported).
 *
 * Contract:
 *  - A path outside any ckptfs mount is opened as it is (ck_open): a pack or any other source.
 *  - A path inside a ckptfs mount (a FUSE file system whose root has the xattr
 *    user.ckptfs.sources, views/mountinfo.h: every mount, of a local or a remote source) stands
 *    for tensors: the root and .ckptfs/checkpoint.pack for all of them, a directory for the
 *    tensors under it, a tensor file for that tensor, found with the mount's own tree code
 *    (views/tree.c) over the index opened here, so nothing re-derives the escaping. The
 *    mount's other files (.ckptfs/index.json, checkpoint.safetensors) are opened as they are,
 *    through the mount.
 *  - The bypass: the sources the mount names are opened here, with the caller's own
 *    credentials, and used only when every file is the one the mount parsed (device, inode,
 *    size, mtime to the nanosecond): nothing is gained in privilege, and a source replaced or
 *    changed since mounting is never read as if it were the old one. When the sources cannot be
 *    opened (not visible here, not readable by this user) or are not the same files, when the
 *    source is remote (a URL: never opened here, where the mount's credentials are not), or when
 *    CKLOAD_BYPASS=0, the load reads the mount's .ckptfs/checkpoint.pack instead, with the same
 *    selection (the mount checks its sources on every read, so that path fails rather than
 *    serve changed bytes).
 *  - Errors are one line "FILE: what is wrong" in err (errlen bytes).
 */
#ifndef CKL_MOUNT_H
#define CKL_MOUNT_H

#include <stddef.h>

#include "../index/index.h"

typedef struct mount_source {
    ck_index *ix;           /* what the load reads */
    unsigned char *keep;    /* per entry of ix: 1 to load it; NULL: every entry */
    const char *read_path;  /* "bypass" or "mount" for a path inside a mount; NULL otherwise */
} mount_source;

/* What path stands for, into *out. 0, or the error's class (ckload.h: ENOENT, EACCES or EIO)
 * with err set and nothing held. */
int mount_source_open(const char *path, mount_source *out, char *err, size_t errlen);

void mount_source_close(mount_source *s);

#endif
