#include "watch.h"
#include "../views/mountinfo.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
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
    int unmounted = 0; /* the daemon took its mount down itself (ck_watch_disarm) */
    while (recv_byte(keep))
        unmounted = 1;
    /* A mount ID is reused as soon as it is free: after a clean unmount, the mount there may
     * already be the next ckptfs's under the same ID, which is not ours to detach. */
    if (!unmounted && id >= 0 && top_mount_id(mountpoint) == id &&
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

void ck_watch_disarm(int fd)
{
    send_byte(fd);
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

/* --- following the mount namespace --------------------------------------------------------- */

/* Whether process pid is in the mount namespace that holds the mount ID id: its table lists
 * that very mount (a namespace's copy of a mount has an ID of its own). The table is readable
 * by every user, where the namespace's link, /proc/PID/ns/mnt, is not; a process gone, or a
 * zombie (no namespace left), has none. */
static int in_namespace(const char *pid, long id)
{
    char path[sizeof "/proc//mountinfo" + NAME_MAX];
    snprintf(path, sizeof path, "/proc/%s/mountinfo", pid);
    return ck_mount_listed(path, id) == 1;
}

/* The parent of process pid, or -1. */
static pid_t parent_of(const char *pid)
{
    char path[sizeof "/proc//stat" + NAME_MAX], buf[512];
    snprintf(path, sizeof path, "/proc/%s/stat", pid);
    FILE *f = fopen(path, "re");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    char *end = strrchr(buf, ')'); /* after the name, which may hold anything */
    int ppid;
    return end && sscanf(end + 1, " %*c %d", &ppid) == 1 ? (pid_t)ppid : -1;
}

/* A process other than this one and its children (ckptfs-watch, fusermount3) in the mount
 * namespace that holds mount id: the first in /proc's order, the oldest, likely to stay (a
 * shell rather than its commands); 0 when there is none; -1 when /proc cannot be read. */
static pid_t ns_witness(long id)
{
    DIR *d = opendir("/proc");
    if (!d)
        return -1;
    pid_t self = getpid(), found = 0;
    for (struct dirent *e; !found && (e = readdir(d));) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (!*end && pid != self && in_namespace(e->d_name, id) && parent_of(e->d_name) != self)
            found = (pid_t)pid;
    }
    closedir(d);
    return found;
}

/* Waits for process pid to end: on a pidfd (Linux 5.3), else by looking again every
 * NS_POLL_S seconds. */
enum { NS_POLL_S = 2 };
static void wait_end(pid_t pid)
{
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd < 0) {
        if (errno != ESRCH)
            sleep(NS_POLL_S);
        return;
    }
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (poll(&p, 1, -1) < 0 && errno == EINTR)
        ;
    close(fd);
}

/* The follower's thread: one witness at a time, until none is left. */
static void *follow(void *arg)
{
    long id = (long)(intptr_t)arg;
    pid_t w;
    while ((w = ns_witness(id)) > 0)
        wait_end(w);
    if (w == 0)
        kill(getpid(), SIGTERM);
    return NULL;
}

int ck_watch_namespace(const char *mountpoint)
{
    char self[32];
    ssize_t n = readlink("/proc/self", self, sizeof self - 1);
    ck_mount_at at;
    struct stat init;
    /* Not when /proc is another PID namespace's (its pids would not be ours) or hides other
     * users' processes (hidepid: PID 1 unseen), nor when the mount propagates to peers
     * (shared: other namespaces may be reading it). */
    if (n <= 0 || (self[n] = '\0', strtol(self, NULL, 10) != getpid()) ||
        stat("/proc/1", &init) != 0 || ck_mount_top(CK_MOUNTINFO, mountpoint, &at) != 1 ||
        at.shared)
        return -1;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the thread's: signals are the main thread's */
    pthread_t t;
    int rc = pthread_create(&t, NULL, follow, (void *)(intptr_t)at.id);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc == 0)
        pthread_detach(t);
    return rc == 0 ? 0 : -1;
}
