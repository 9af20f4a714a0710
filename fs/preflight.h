/* preflight.h — what is checked before the mount is made: that MOUNTPOINT can take it, and
 * that the mount would not hide its own sources, so that what would otherwise fail late, in
 * libfuse's words, or leave a mount nobody can use or unmount, is refused early, in ours.
 *
 * Contract: a check answers 0 (go on), or -1 after one line `ckptfs: WHAT: what is wrong` on
 * stderr; none changes anything. ck_preflight_mountpoint is made before anything is forked or
 * parsed, ck_preflight_sources once SOURCE is.
 */
#ifndef CK_PREFLIGHT_H
#define CK_PREFLIGHT_H

#include "core.h"
#include "options.h"

/* MOUNTPOINT mnt: a directory, not inside a ckptfs mount, nor one itself unless nonempty, on a
 * machine where FUSE is usable (its device, and fusermount3 for a user other than root); or
 * "/dev/fd/N", an open /dev/fuse that a privileged helper mounted and passed down (libfuse >=
 * 3.3), whose mount is another's (*by_fd set: nothing else is checked). *real gets its
 * canonical path (malloc'ed; mnt itself for /dev/fd/N), also when a later check refuses. */
int ck_preflight_mountpoint(const char *mnt, int nonempty, char **real, int *by_fd);

/* Refuses a mountpoint (real: canonical) that holds one of fs's local source files. */
int ck_preflight_sources(const ck_fs *fs, const char *mnt, const char *real);

/* Whether the mount is made with auto_unmount: a daemon that dies (kill -9, a crash) takes its
 * mount with it instead of leaving "Transport endpoint is not connected" behind. The default,
 * unless asked otherwise (noauto_unmount: mount.fuse.ckptfs's, fstab's mounts being the
 * administrator's), the mountpoint is another's (by_fd), or nobody can do the watching: root's
 * own watcher (watch.h), else fusermount3 (libfuse's), when it is not there (a container
 * without it). Then only when asked. */
int ck_wants_auto_unmount(const struct ck_opts *o, int by_fd);

#endif
