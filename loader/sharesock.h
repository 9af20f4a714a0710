/* sharesock.h — the Unix socket under warm attach (share.h): its address, where it goes by
 * default, who is at the other end, and how long an exchange may take.
 *
 * Contract:
 *  - share_socket_address fills *a for path, or is -1 (EINVAL) with err "PATH: not a socket path".
 *  - share_send_all moves all n bytes or returns -1 with errno; EINTR is retried (a keeper of
 *    the tests' and fuzzers' writes through it; the server itself never blocks on a send).
 *  - share_wait_s(VAR): the whole time one exchange may take, in seconds: SHARE_WAIT_S, or what
 *    the environment variable VAR says (an integer from 1 to 3600). The keeper reads
 *    CKLOAD_SHARE_WAIT (its patience with a client), the client CKLOAD_ATTACH_WAIT (its patience
 *    with a keeper): one rule, two processes each configured on its own.
 *  - A deadline is a time on CLOCK_MONOTONIC (share_deadline): share_connect_by and
 *    share_recv_by end by it however the peer behaves (ETIMEDOUT), a byte a second or none:
 *    the bound is on the whole exchange, not on each wait.
 *  - share_peer_is reads the peer's credentials from the kernel (SO_PEERCRED: as they were when
 *    it connected, or listened: a server's), never from anything the peer sends.
 *  - ckl_default_socket (ckload.h): $XDG_RUNTIME_DIR/ckload.sock where that is an absolute
 *    path, else $TMPDIR/ckload-UID/ckload.sock (TMPDIR absolute, else /tmp): the directory made
 *    0700 if missing, and refused (EACCES) unless it is a directory of this uid's with no
 *    group or other bits.
 */
#ifndef CKL_SHARESOCK_H
#define CKL_SHARESOCK_H

#include <errno.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>

/* -1 with errno set to code: the error returns of the keeper and the client. */
static inline int share_fail(int code)
{
    errno = code;
    return -1;
}

int share_socket_address(const char *path, struct sockaddr_un *a, char *err, size_t errlen);
int share_send_all(int fd, const unsigned char *p, size_t n);
unsigned share_wait_s(const char *var);

/* The peer on fd (its SO_PEERCRED) into *who; 1 when it runs as uid or is in group gid (its
 * primary group, or one of SO_PEERGROUPS; gid -1: none), else 0; -1 with errno when the kernel
 * does not say. */
int share_peer_is(int fd, uid_t uid, long gid, struct ucred *who);

/* secs seconds from now, on CLOCK_MONOTONIC. */
struct timespec share_deadline(unsigned secs);
/* connect(fd, a) by deadline: 0, or -1 with errno (ETIMEDOUT: the server took no connection). */
int share_connect_by(int fd, const struct sockaddr_un *a, const struct timespec *deadline);
/* All n bytes into p by deadline: 0, or -1 with errno (0 when the peer closed first, ETIMEDOUT
 * at the deadline); *got counts the bytes received either way. */
int share_recv_by(int fd, unsigned char *p, size_t n, const struct timespec *deadline,
                  size_t *got);

#endif
