#include "watch.h"

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

/* path as /proc/self/mountinfo writes it: space, tab, newline and backslash as \ooo. */
static int escaped_path(const char *path, char *out, size_t cap)
{
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
        if (cap - n < 5)
            return -1;
        if (strchr(" \t\n\\", *p))
            n += (size_t)snprintf(out + n, cap - n, "\\%03o", *p);
        else
            out[n++] = (char)*p;
    }
    out[n] = '\0';
    return 0;
}

/* The mount ID of the top mount at the escaped path (the last one listed there) when it is a
 * ckptfs mount, else -1. One pass over the table, a line at a time. */
static long top_mount_id(const char *escaped)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return -1;
    char *line = NULL;
    size_t cap = 0;
    long id = -1;
    while (getline(&line, &cap, f) > 0) {
        /* ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER */
        char *save = NULL, *mid = strtok_r(line, " ", &save);
        for (int i = 0; i < 3 && mid; i++)
            (void)strtok_r(NULL, " ", &save);
        char *point = mid ? strtok_r(NULL, " ", &save) : NULL;
        if (!point || strcmp(point, escaped) != 0)
            continue;
        char *tail = strstr(save, " - ");
        id = tail && strncmp(tail + 3, "fuse.ckptfs ", 12) == 0 ? strtol(mid, NULL, 10) : -1;
    }
    free(line);
    fclose(f);
    return id;
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
    char escaped[4 * PATH_MAX + 1];
    int keep = fcntl(fd, F_DUPFD_CLOEXEC, 3), null = open("/dev/null", O_RDWR);
    if (keep < 0 || null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0 ||
        escaped_path(mountpoint, escaped, sizeof escaped) != 0)
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
    long id = top_mount_id(escaped);
    while (recv_byte(keep))
        ;
    if (id >= 0 && top_mount_id(escaped) == id &&
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
