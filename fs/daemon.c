#include "daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Forking before the checkpoint is parsed rather than after (as fuse_daemonize would): the
 * daemon then owns every page it touches, instead of copying each on first write, and the
 * command exits with nothing to tear down. */
int ck_daemon_fork(int *ready)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        close(p[0]);
        *ready = p[1];
        return 0;
    }
    close(p[1]);
    char ok;
    ssize_t n;
    while ((n = read(p[0], &ok, 1)) < 0 && errno == EINTR)
        ;
    if (n == 1)
        _exit(0);
    int st; /* the daemon ended without being ready: its status is ours */
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    _exit(WIFEXITED(st) && WEXITSTATUS(st) ? WEXITSTATUS(st) : 1);
}

/* A terminal, a pipe or a socket is the command's, and a reader of a pipe waits for its end. */
int ck_stderr_is_file(void)
{
    struct stat st;
    return fstat(2, &st) == 0 && S_ISREG(st.st_mode);
}

int ck_daemon_ready(int ready, int keep_stderr)
{
    int null = open("/dev/null", O_RDWR);
    int rc = setsid() < 0 || chdir("/") != 0 || null < 0 || dup2(null, 0) < 0 ||
             dup2(null, 1) < 0 || (!keep_stderr && dup2(null, 2) < 0);
    if (null > 2)
        close(null);
    if (rc)
        return -1;
    rc = write(ready, "", 1) == 1 ? 0 : -1;
    close(ready);
    return rc;
}
