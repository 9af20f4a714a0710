/* daemon.h — the command and the daemon that serves its mount: the command waits until the
 * daemon says the mount is ready, and exits with the daemon's verdict, so that `ckptfs ... &&
 * ls MOUNTPOINT` works and a refusal is the command's exit status and message.
 *
 * Contract: ck_daemon_fork is called once, while the process is still small (before SOURCE is
 * parsed); it returns only in the daemon. The daemon calls ck_daemon_ready once the mount
 * answers; if it ends before, the command exits with its exit status (1 for none), after the
 * daemon has printed why.
 */
#ifndef CK_DAEMON_H
#define CK_DAEMON_H

/* Forks the daemon and returns in it with *ready the pipe to tell the command it may end; the
 * command itself waits there and exits: 0 once the daemon is ready, else the daemon's status.
 * -1 when the fork fails (in the command, which then goes on as itself). */
int ck_daemon_fork(int *ready);

/* Whether stderr is a file (`2>>ckptfs.log`), where the daemon may go on writing. */
int ck_stderr_is_file(void);

/* Detaches the daemon (its own session, "/" as its directory, /dev/null as stdin, stdout and
 * stderr, unless keep_stderr) and lets the waiting command end (ready: ck_daemon_fork's).
 * 0, or -1 with errno set. */
int ck_daemon_ready(int ready, int keep_stderr);

#endif
