/* sharesock.c — the Unix socket under warm attach (sharesock.h). */
#include "sharesock.h"
#include "share.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

int share_socket_address(const char *path, struct sockaddr_un *a, char *err, size_t errlen)
{
    *a = (struct sockaddr_un){.sun_family = AF_UNIX};
    if (!*path || strlen(path) >= sizeof a->sun_path) {
        snprintf(err, errlen, "%s: not a socket path (1 to %zu bytes)", path,
                 sizeof a->sun_path - 1);
        return share_fail(EINVAL);
    }
    memcpy(a->sun_path, path, strlen(path));
    return 0;
}

int share_send_all(int fd, const unsigned char *p, size_t n)
{
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

unsigned share_wait_s(const char *var)
{
    const char *v = getenv(var);
    char *end;
    long n = v ? strtol(v, &end, 10) : 0;
    return v && *v && !*end && n >= 1 && n <= 3600 ? (unsigned)n : SHARE_WAIT_S;
}

/* $TMPDIR/ckload-UID made if missing, and refused unless it is a directory of this user's
 * that no one else may enter: 0, or -1 with err. */
static int own_dir(const char *dir, char *err, size_t errlen)
{
    struct stat st;
    if ((mkdir(dir, 0700) != 0 && errno != EEXIST) || lstat(dir, &st) != 0) {
        int code = errno;
        snprintf(err, errlen, "%s: cannot make the socket's directory: %s", dir,
                 strerror(code));
        return share_fail(code == EACCES ? EACCES : EIO);
    }
    if (S_ISDIR(st.st_mode) && st.st_uid == geteuid() && !(st.st_mode & 077))
        return 0;
    snprintf(err, errlen, "%s: not a directory of uid %u's alone (mode 0700): no socket goes "
             "there (set XDG_RUNTIME_DIR, or give a socket path)", dir, (unsigned)geteuid());
    return share_fail(EACCES);
}

int ckl_default_socket(char *buf, size_t len, char *err, size_t errlen)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR"), *tmp = getenv("TMPDIR");
    char dir[4096];
    int n = xdg && *xdg == '/'
                ? snprintf(dir, sizeof dir, "%s", xdg)
                : snprintf(dir, sizeof dir, "%s/ckload-%u", tmp && *tmp == '/' ? tmp : "/tmp",
                           (unsigned)geteuid());
    if (n < 0 || (size_t)n >= sizeof dir || (size_t)snprintf(buf, len, "%s/ckload.sock", dir)
                                                >= len) {
        snprintf(err, errlen, "%s/ckload.sock: not a socket path (too long)", dir);
        return share_fail(EINVAL);
    }
    return xdg && *xdg == '/' ? 0 : own_dir(dir, err, errlen);
}

/* Whether group g is among the peer's supplementary groups (as many as it has). */
static int in_peer_groups(int fd, gid_t g)
{
    gid_t some[64], *groups = some;
    socklen_t len = sizeof some;
    int rc = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len);
    if (rc != 0 && errno == ERANGE && (groups = malloc(len)) != NULL)
        rc = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len);
    int found = 0;
    for (size_t k = 0; rc == 0 && k < len / sizeof *groups; k++)
        found |= groups[k] == g;
    if (groups != some)
        free(groups);
    return found;
}

int share_peer_is(int fd, uid_t uid, long gid, struct ucred *who)
{
    socklen_t n = sizeof *who;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, who, &n) != 0)
        return -1;
    return who->uid == uid ||
           (gid >= 0 && (who->gid == (gid_t)gid || in_peer_groups(fd, (gid_t)gid)));
}

struct timespec share_deadline(unsigned secs)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += secs;
    return t;
}

/* Milliseconds until deadline, 0 once it passed. */
static long ms_left(const struct timespec *deadline)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long long ms = (long long)(deadline->tv_sec - now.tv_sec) * 1000 +
                   (deadline->tv_nsec - now.tv_nsec) / 1000000;
    return ms > 0 ? (long)ms : 0;
}

/* A Unix socket's connect waits while the server's backlog is full, for SO_SNDTIMEO at most
 * (then EAGAIN): the time left is that timeout, set again after each interruption. */
int share_connect_by(int fd, const struct sockaddr_un *a, const struct timespec *deadline)
{
    for (;;) {
        long ms = ms_left(deadline);
        struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = ms % 1000 * 1000};
        if (ms == 0)
            return share_fail(ETIMEDOUT);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(fd, (const struct sockaddr *)a, sizeof *a) == 0)
            return 0;
        if (errno == EAGAIN)
            return share_fail(ETIMEDOUT);
        if (errno != EINTR)
            return -1;
    }
}

int share_recv_by(int fd, unsigned char *p, size_t n, const struct timespec *deadline,
                  size_t *got)
{
    *got = 0;
    while (*got < n) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int ready = poll(&pf, 1, (int)ms_left(deadline));
        if (ready == 0)
            return share_fail(ETIMEDOUT);
        ssize_t k = ready < 0 ? -1 : recv(fd, p + *got, n - *got, MSG_DONTWAIT);
        if (k < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (k <= 0)
            return share_fail(k == 0 ? 0 : errno);
        *got += (size_t)k;
    }
    return 0;
}
