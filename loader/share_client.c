/* share_client.c — warm attach's client up to the mapping (share_client.h): whom it trusts, the
 * keeper's message read within one deadline, parsed, and checked against what was asked. */
#include "share_client.h"
#include "share.h"
#include "sharesock.h"
#include "../base/location.h" /* ck_location_shown: a source named as a URL */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

share_ask share_ask_make(int cuda_device, const char *source, long gid)
{
    unsigned wait_s = share_wait_s("CKLOAD_ATTACH_WAIT");
    return (share_ask){.cuda_device = cuda_device, .source = source, .gid = gid < 0 ? -1 : gid,
                       .wait_s = wait_s, .deadline = share_deadline(wait_s)};
}

int share_client_connect(const char *path, const share_ask *ask, char *err, size_t errlen)
{
    struct sockaddr_un a;
    if (share_socket_address(path, &a, err, errlen) != 0)
        return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && share_connect_by(fd, &a, &ask->deadline) == 0)
        return fd;
    int code = errno;
    if (code == ETIMEDOUT)
        snprintf(err, errlen, "%s: the server did not take the connection within %u seconds",
                 path, ask->wait_s);
    else
        snprintf(err, errlen, "%s: no server is serving there (%s)", path, strerror(code));
    if (fd >= 0)
        close(fd);
    return share_fail(code == ETIMEDOUT ? EIO : code == EACCES ? EACCES : ENOENT);
}

/* Whether the keeper is one this process may take a table from: the process that listens on
 * the socket, as the kernel saw it then, runs as this uid, as root, or in the group asked. A
 * table is code in all but name (it says where this process's tensors are): another user
 * serving on the path given must not be believed. */
static int trusted(int fd, const char *path, const share_ask *ask, char *err, size_t errlen)
{
    struct ucred who;
    int is = share_peer_is(fd, geteuid(), ask->gid, &who);
    if (is < 0) {
        snprintf(err, errlen, "%s: cannot tell who serves there (SO_PEERCRED: %s)", path,
                 strerror(errno));
        return share_fail(EACCES);
    }
    if (is || who.uid == 0)
        return 0;
    char group[48] = "";
    if (ask->gid >= 0)
        snprintf(group, sizeof group, ", and is not in group %ld", ask->gid);
    snprintf(err, errlen, "%s: the server there runs as uid %u, neither this process's uid (%u) "
             "nor root%s: not trusted", path, (unsigned)who.uid, (unsigned)geteuid(), group);
    return share_fail(EACCES);
}

/* The keeper's whole message into *msg (*len bytes), by the deadline. 0, or -1 with err set. */
static int read_message(int fd, const char *path, const share_ask *ask, unsigned char **msg,
                        size_t *len, char *err, size_t errlen)
{
    unsigned char h[SHARE_HEADER];
    ck_error e = {{0}};
    uint64_t n = 0;
    size_t got = 0, more = 0;
    if (share_recv_by(fd, h, sizeof h, &ask->deadline, &got) == 0 &&
        (n = share_message_length(h, path, &e)) == 0) {
        snprintf(err, errlen, "%s", e.msg);
        return share_fail(EIO);
    }
    unsigned char *m = n ? malloc(n) : NULL;
    if (n && !m) {
        snprintf(err, errlen, "%s: out of memory", path);
        return share_fail(ENOMEM);
    }
    if (!n || share_recv_by(fd, m + sizeof h, n - sizeof h, &ask->deadline, &more) != 0) {
        if (errno == ETIMEDOUT)
            snprintf(err, errlen, "%s: the server's answer was not whole within %u seconds "
                     "(%zu bytes came)", path, ask->wait_s, got + more);
        else
            snprintf(err, errlen, "%s: the server %s", path, errno == 0
                     ? "closed the connection before its answer was whole" : strerror(errno));
        free(m);
        return share_fail(EIO);
    }
    memcpy(m, h, sizeof h);
    *msg = m;
    *len = n;
    return 0;
}

/* Whether the table may be attached as asked: the device, and the source the caller expects. */
static int acceptable(const share_table *t, const char *path, int cuda_device,
                      const char *source, char *err, size_t errlen)
{
    if (cuda_device >= 0 && cuda_device != t->ordinal) {
        snprintf(err, errlen, "%s: the served block is on cuda:%d, not cuda:%d", path,
                 t->ordinal, cuda_device);
        return share_fail(EINVAL);
    }
    if (!source)
        return 0;
    char *abs = realpath(source, NULL), shown[CK_SHOWN_MAX];
    long changed = abs && strcmp(abs, t->source) == 0 ? share_files_changed(t->files, t->nfiles)
                                                      : -2;
    if (changed == -2) /* source as given may be a URL: shown without its secrets */
        snprintf(err, errlen, "%s: changed source: it serves %s, not %s", path, t->source,
                 abs ? abs : ck_location_shown(source, shown, sizeof shown));
    else if (changed >= 0)
        snprintf(err, errlen, "%s: changed source: %s is no longer the file the server loaded",
                 path, t->files[changed].path);
    free(abs);
    return changed == -1 ? 0 : share_fail(EIO);
}

/* The message parsed and checked: 0 with *t the table, or -1 with err and errno set. */
static int take_reply(const unsigned char *msg, size_t len, const char *path,
                      const share_ask *ask, share_table *t, char *err, size_t errlen)
{
    share_reply r;
    ck_error e = {{0}};
    if (share_parse(msg, len, path, &r, &e) != 0) {
        snprintf(err, errlen, "%s", e.msg);
        return share_fail(EIO);
    }
    if (r.refused) {
        ck_fail(&e, path, "refused by the server: %s", r.text);
        snprintf(err, errlen, "%s", e.msg);
        return share_fail(r.code);
    }
    if (acceptable(&r.table, path, ask->cuda_device, ask->source, err, errlen) != 0) {
        int code = errno;
        share_table_free(&r.table);
        return share_fail(code);
    }
    *t = r.table;
    return 0;
}

int share_client_receive(int fd, const char *path, const share_ask *ask, share_table *t,
                         char *err, size_t errlen)
{
    *t = (share_table){0};
    unsigned char *msg = NULL;
    size_t len = 0;
    if (trusted(fd, path, ask, err, errlen) != 0 ||
        read_message(fd, path, ask, &msg, &len, err, errlen) != 0)
        return -1;
    int rc = take_reply(msg, len, path, ask, t, err, errlen);
    int code = errno;
    free(msg);
    if (rc != 0)
        ck_one_line(err); /* acceptable() quotes the keeper's paths */
    return rc ? share_fail(code) : 0;
}

int share_client_fits(const share_table *t, size_t room, const char *path, char *err,
                      size_t errlen)
{
    if (t->block_size <= room)
        return 0;
    snprintf(err, errlen, "%s: the server's table claims a block of %llu bytes, more than its "
             "mapping holds (%zu bytes)", path, (unsigned long long)t->block_size, room);
    return share_fail(EIO);
}
