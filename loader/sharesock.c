/* sharesock.c — the Unix socket under warm attach (sharesock.h). */
#include "sharesock.h"
#include "share.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

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

/* Both ends wait at most SHARE_WAIT_S for the other. */
void share_set_timeouts(int fd)
{
    struct timeval tv = {.tv_sec = SHARE_WAIT_S};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
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

/* 0, or -1 with errno (0 at end of stream). */
int share_recv_all(int fd, unsigned char *p, size_t n)
{
    while (n) {
        ssize_t k = recv(fd, p, n, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            errno = k == 0 ? 0 : errno;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}
