#include "watch.h"
#include "mountinfo.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#define WATCH_NAME "ckptfs-watch"

/* The mount ID of the top mount at mountpoint when it is a ckptfs mount, else -1. */
static long top_mount_id(const char *mountpoint)
{
    ck_mount_at at;
    return ck_mount_top(CK_MOUNTINFO, mountpoint, &at) == 1 &&
                   strcmp(at.fstype, "fuse.ckptfs") == 0
               ? at.id
               : -1;
}

/* A byte from the other end of the socket fd: 1, or 0 when that end is closed. */
static int recv_byte(int fd)
{
    char c;
    ssize_t n;
    while ((n = recv(fd, &c, 1, 0)) < 0 && errno == EINTR)
        ;
    return n > 0;
}

static void send_byte(int fd)
{
    /* no SIGPIPE when the other end is gone: that end's absence is what the caller learns */
    (void)!send(fd, "", 1, MSG_NOSIGNAL);
}

/* The watcher: no descriptor but its socket (moved to 3 or above) and /dev/null, "/" as its
 * directory, its own session; named so that `ps`, pgrep and pkill tell it from the daemon
 * (the argument block args .. args + args_len is rewritten, as `ps` shows it), and says so
 * (a byte) before it waits for the daemon's. */
static _Noreturn void watch(int fd, const char *mountpoint, char *args, size_t args_len)
{
    int keep = fcntl(fd, F_DUPFD_CLOEXEC, 3), null = open("/dev/null", O_RDWR);
    if (keep < 0 || null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0)
        _exit(1);
    close_range(3, (unsigned)keep - 1, 0);
    close_range((unsigned)keep + 1, ~0u, 0);
    (void)setsid();
    if (chdir("/") != 0)
        _exit(1); /* "/" always exists: failing here means a broken namespace */
    prctl(PR_SET_NAME, WATCH_NAME);
    if (args_len) {
        memset(args, 0, args_len);
        snprintf(args, args_len, WATCH_NAME);
    }
    send_byte(keep);

    if (!recv_byte(keep))
        _exit(0); /* never armed: nothing was mounted */
    long id = top_mount_id(mountpoint);
    while (recv_byte(keep))
        ;
    if (id >= 0 && top_mount_id(mountpoint) == id &&
        umount2(mountpoint, MNT_DETACH | UMOUNT_NOFOLLOW) != 0 && errno == EPERM)
        /* mounted for us by fusermount3 (libfuse's fallback): it may take it down again */
        execlp("fusermount3", "fusermount3", "-u", "-z", "--", mountpoint, (char *)NULL);
    _exit(0);
}

int ck_watch_start(const char *mountpoint, char *args, size_t args_len)
{
    int p[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[1]);
        watch(p[0], mountpoint, args, args_len);
    }
    close(p[0]);
    if (pid < 0) {
        close(p[1]);
        return -1;
    }
    return p[1];
}

void ck_watch_arm(int fd)
{
    /* A watcher already gone (killed) cannot be armed: the mount then stays when the daemon
     * ends, as without auto_unmount. Its first byte (it has its name) is long sent by now:
     * waiting for it keeps `ckptfs` from returning while a process still named as the daemon
     * runs (pgrep would find two). */
    send_byte(fd);
    (void)recv_byte(fd);
}
