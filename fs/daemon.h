/* daemon.h — the command and its daemon: the command waits until the daemon says the mount is
 * ready, and exits with the daemon's verdict.
 *
 * Contract: ck_daemon_fork is called once, before the checkpoint is parsed; ck_daemon_ready once
 * the mount answers.
 */
#ifndef CK_DAEMON_H
#define CK_DAEMON_H

int ck_daemon_fork(int *ready);
int ck_stderr_is_file(void);
int ck_daemon_ready(int ready, int keep_stderr);

#endif
