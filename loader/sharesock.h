/* sharesock.h — the Unix socket under warm attach (share.h): its address, where it goes by
 * default, and the receives a client makes, bounded (a stalled peer never hangs the other).
 *
 * Contract:
 *  - share_socket_address fills *a for path, or is -1 (EINVAL) with err "PATH: not a socket path".
 *  - share_recv_all moves all n bytes or returns -1 with errno (0 when the peer closed first,
 *    EAGAIN when it stalled past the socket's timeouts); EINTR is retried.
 *  - share_wait_ms: the whole time one exchange (a table or a refusal, sent or received) may
 *    take: SHARE_WAIT_S, or CKLOAD_SHARE_WAIT seconds (1 to 3600) where that is set, so that
 *    tests need not wait the default out.
 *  - ckl_default_socket (ckload.h): $XDG_RUNTIME_DIR/ckload.sock where that is an absolute
 *    path, else $TMPDIR/ckload-UID/ckload.sock (TMPDIR absolute, else /tmp): the directory made
 *    0700 if missing, and refused (EACCES) unless it is a directory of this uid's with no
 *    group or other bits.
 */
#ifndef CKL_SHARESOCK_H
#define CKL_SHARESOCK_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/un.h>

/* -1 with errno set to code: the error returns of the keeper and the client. */
static inline int share_fail(int code)
{
    errno = code;
    return -1;
}

int share_socket_address(const char *path, struct sockaddr_un *a, char *err, size_t errlen);
void share_set_timeouts(int fd);
int share_recv_all(int fd, unsigned char *p, size_t n);
int64_t share_wait_ms(void);

#endif
