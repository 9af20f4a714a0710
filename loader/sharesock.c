/* sharesock.c — the Unix socket under warm attach (sharesock.h). */
#include "sharesock.h"
#include "share.h"

#include <errno.h>
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

/* Both ends wait at most SHARE_WAIT_S for the other. */
void share_set_timeouts(int fd)
{
    struct timeval tv = {.tv_sec = SHARE_WAIT_S};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
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

int64_t share_wait_ms(void)
{
    const char *v = getenv("CKLOAD_SHARE_WAIT");
    char *end;
    long n = v ? strtol(v, &end, 10) : 0;
    return (v && *v && !*end && n >= 1 && n <= 3600 ? n : SHARE_WAIT_S) * (int64_t)1000;
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
