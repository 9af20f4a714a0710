/* watch.h — auto_unmount without fusermount3: a small process that outlives the daemon and
 * detaches the daemon's mount when the daemon ends, however it ends (exit, crash, kill -9).
 *
 * Contract: ck_watch_start forks the watcher; call it early, while the process is small, and
 * only where this process may unmount what it mounts (it has the right to mount(2) itself,
 * so libfuse mounts without fusermount3). It returns this end of a socket to the watcher
 * (close-on-exec), or -1. The watcher names itself ckptfs-watch, in its comm and in the
 * argument block args .. args + args_len (main's argv strings: what `ps` and pgrep show).
 * ck_watch_arm(fd) says the mount at mountpoint now exists; the watcher records which mount
 * that is (its mount ID); it returns once the watcher has its name. When fd closes (the kernel
 * closes it when the daemon ends, however it ends), an armed watcher detaches the mount at
 * mountpoint if the top mount there is still the one it recorded and the daemon did not say
 * it unmounted it itself (ck_watch_disarm: mount IDs are reused), and exits; an unarmed one
 * just exits. The watcher holds no other
 * descriptor, no directory, and no terminal's signals (its own session).
 */
#ifndef CK_WATCH_H
#define CK_WATCH_H

#include <stddef.h>

int ck_watch_start(const char *mountpoint, char *args, size_t args_len);
void ck_watch_arm(int fd);
/* Says the daemon has unmounted its mount itself (a clean end: a signal, fusermount3 -u):
 * the watcher then leaves the mountpoint alone, whatever is mounted there by then. */
void ck_watch_disarm(int fd);

/* Follows this process's mount namespace: once no other process is in it (this process's
 * children aside: the watchers), sends this process SIGTERM, whose handler unmounts and ends
 * it (fuse_set_signal_handlers), releasing the source. A namespace made for one job
 * (`unshare -m sh -c 'ckptfs SRC MNT && ...'`) then takes its mount and daemon with it,
 * instead of keeping both alive, out of everyone's reach, for good. A thread that waits on
 * one process of the namespace at a time (a pidfd; it looks for another when that one ends),
 * so it costs nothing while PID 1 or a shell is there. Not started (-1) when /proc is another
 * PID namespace's, or the mount at mountpoint propagates to peers (shared: others may be
 * reading it). A process whose namespace may not be read (another user's) counts as in it.
 * 0 when started. */
int ck_watch_namespace(const char *mountpoint);

#endif
