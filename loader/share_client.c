/* share_client.c — warm attach's client (share.h): connects to a server, checks its table and
 * maps the block as a load of its own. */
#include "share.h"
#include "backend.h"
#include "loadview.h"
#include "sharemsg.h"
#include "sharesock.h"
#include "../base/location.h" /* ck_location_shown: a source named as a URL */

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define SECONDS_(n) #n
#define SECONDS(n) SECONDS_(n)

/* What an attached load keeps until its last release: the mapping and the connection. */
typedef struct attachment {
    const backend *be;
    int fd, ordinal;
    void *block;
    char *strings;           /* the table's names and shapes, which its tensors point into */
    int64_t *dims;
} attachment;

static void detach(void *ctx)
{
    attachment *a = ctx;
    a->be->detach(a->ordinal, a->block);
    close(a->fd);
    free(a->strings);
    free(a->dims);
    free(a);
}

static int connect_to(const char *path, char *err, size_t errlen)
{
    struct sockaddr_un a;
    if (share_socket_address(path, &a, err, errlen) != 0)
        return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        share_set_timeouts(fd);
        return fd;
    }
    int code = errno;
    snprintf(err, errlen, "%s: no server is serving there (%s)", path, strerror(code));
    if (fd >= 0)
        close(fd);
    return share_fail(code == EACCES ? EACCES : ENOENT);
}

/* The server's whole message into *msg (*len bytes). 0, or -1 with err set. */
static int read_message(int fd, const char *path, unsigned char **msg, size_t *len, char *err,
                        size_t errlen)
{
    unsigned char h[SHARE_HEADER];
    ck_error e = {{0}};
    uint64_t n = 0;
    if (share_recv_all(fd, h, sizeof h) == 0 && (n = share_message_length(h, path, &e)) == 0) {
        snprintf(err, errlen, "%s", e.msg);
        return share_fail(EIO);
    }
    unsigned char *m = n ? malloc(n) : NULL;
    if (n && !m) {
        snprintf(err, errlen, "%s: out of memory", path);
        return share_fail(ENOMEM);
    }
    if (!n || share_recv_all(fd, m + sizeof h, n - sizeof h) != 0) {
        snprintf(err, errlen, "%s: the server %s", path,
                 errno == 0 ? "closed the connection before its answer was whole"
                 : errno == EAGAIN ? "sent nothing for " SECONDS(SHARE_WAIT_S) " seconds"
                                   : strerror(errno));
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

/* The table mapped and made a load: 0, or -1 with err set (the table is the caller's still). */
static int adopt(share_table *t, int fd, const char *path, ckl_load **out, char *err,
                 size_t errlen)
{
    char why[256];
    attachment *a = calloc(1, sizeof *a);
    if (!a) {
        snprintf(err, errlen, "%s: out of memory", path);
        return share_fail(ENOMEM);
    }
    *a = (attachment){.be = backend_cuda, .fd = fd, .ordinal = t->ordinal};
    if (!(a->block = a->be->attach(t->ordinal, t->handle, sizeof t->handle, why, sizeof why))) {
        snprintf(err, errlen, "%s: %s", path, why);
        free(a);
        return share_fail(ENODEV);
    }
    load_adopted ad = {.shown = path, .ordinal = t->ordinal, .block = a->block,
                       .plan = t->plan, .tensors = t->tensors, .drop = detach, .ctx = a};
    if (load_adopt(&ad, out, err, errlen) != 0) {
        a->be->detach(a->ordinal, a->block);
        free(a);
        return -1;
    }
    a->strings = t->strings;
    a->dims = t->dims;
    free(t->files);
    *t = (share_table){0}; /* the load has the rest */
    return 0;
}

int ckl_attach(const char *socket_path, int cuda_device, const char *source, ckl_load **out,
               char *err, size_t errlen)
{
    *out = NULL;
    if (!backend_cuda) {
        snprintf(err, errlen, "%s: this libckload was built without CUDA", socket_path);
        return share_fail(ENODEV);
    }
    unsigned char *msg = NULL;
    size_t len = 0;
    int fd = connect_to(socket_path, err, errlen);
    if (fd < 0 || read_message(fd, socket_path, &msg, &len, err, errlen) != 0) {
        int code = errno;
        if (fd >= 0)
            close(fd);
        return share_fail(code);
    }
    share_reply r;
    ck_error e = {{0}};
    int rc = share_parse(msg, len, socket_path, &r, &e);
    free(msg);
    if (rc != 0) {
        snprintf(err, errlen, "%s", e.msg);
        rc = EIO;
    } else if (r.refused) {
        snprintf(err, errlen, "%s: refused by the server: %s", socket_path, r.text);
        rc = r.code;
    } else if (acceptable(&r.table, socket_path, cuda_device, source, err, errlen) != 0 ||
               adopt(&r.table, fd, socket_path, out, err, errlen) != 0) {
        rc = errno;
        share_table_free(&r.table);
    }
    if (rc != 0) {
        close(fd);
        return share_fail(rc);
    }
    return 0;
}
