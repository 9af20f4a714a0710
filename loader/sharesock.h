/* sharesock.h — the Unix socket under warm attach (share.h): its address, and the sends and
 * receives both ends make, each bounded by SHARE_WAIT_S (a stalled peer never hangs the other).
 *
 * Contract:
 *  - share_socket_address fills *a for path, or is -1 (EINVAL) with err "PATH: not a socket path".
 *  - share_send_all / share_recv_all move all n bytes or return -1 with errno (0 when the peer
 *    closed first, EAGAIN when it stalled past the socket's timeouts); EINTR is retried.
 */
#ifndef CKL_SHARESOCK_H
#define CKL_SHARESOCK_H

#include <errno.h>
#include <stddef.h>
#include <sys/un.h>

/* -1 with errno set to code: the error returns of the keeper and the client. */
static inline int share_fail(int code)
{
    errno = code;
    return -1;
}

int share_socket_address(const char *path, struct sockaddr_un *a, char *err, size_t errlen);
void share_set_timeouts(int fd);
int share_send_all(int fd, const unsigned char *p, size_t n);
int share_recv_all(int fd, unsigned char *p, size_t n);

#endif
