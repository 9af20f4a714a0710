/* preflight.h — the checks made before SOURCE is parsed and the mount made: each refuses, with
 * one line `ckptfs: WHAT: what is wrong`, what would otherwise fail later in libfuse's words, or
 * leave a mount nobody can use or unmount.
 *
 * Contract: each check answers 0 (go on) or -1 after printing its line to stderr; none changes
 * anything.
 */
#ifndef CK_PREFLIGHT_H
#define CK_PREFLIGHT_H

#include "core.h"

/* The fd N of a mountpoint "/dev/fd/N", or -1 for an ordinary path. */
int ck_mountpoint_fd(const char *mnt);
/* Whether fusermount3 is on PATH. */
int ck_have_fusermount(void);

int ck_check_fuse_device(void);
int ck_check_fusermount(void);
int ck_check_not_mounted(const char *mnt, const char *real);
int ck_check_not_inside(const char *mnt, const char *real);
int ck_check_sources_outside(const ck_fs *fs, const char *mnt, const char *real);
int ck_check_mountpoint(const char *mnt);

#endif
