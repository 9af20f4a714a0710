/* share_attach.c — warm attach's ckl_attach (share.h): the exchange of share_client.h, then the
 * block mapped, checked against what the driver says it mapped, and made a load of this
 * process's. */
#include "share.h"
#include "backend.h"
#include "loadview.h"
#include "share_client.h"
#include "sharesock.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

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

/* The block mapped, the table checked against the mapping: the attachment, or NULL with err
 * and errno set. */
static attachment *map_block(const share_table *t, int fd, const char *path, char *err,
                             size_t errlen)
{
    char why[256];
    size_t room = 0;
    attachment *a = calloc(1, sizeof *a);
    if (!a) {
        snprintf(err, errlen, "%s: out of memory", path);
        share_fail(ENOMEM);
        return NULL;
    }
    *a = (attachment){.be = backend_cuda, .fd = fd, .ordinal = t->ordinal};
    a->block = a->be->attach(t->ordinal, t->handle, sizeof t->handle, &room, why, sizeof why);
    if (!a->block) {
        snprintf(err, errlen, "%s: %s", path, why);
        share_fail(ENODEV);
    } else if (share_client_fits(t, room, path, err, errlen) != 0) {
        a->be->detach(a->ordinal, a->block);
        a->block = NULL;
    }
    if (a->block)
        return a;
    int code = errno;
    free(a);
    share_fail(code);
    return NULL;
}

/* The table mapped and made a load: 0, or -1 with err set (the table is the caller's still). */
static int adopt(share_table *t, int fd, const char *path, ckl_load **out, char *err,
                 size_t errlen)
{
    attachment *a = map_block(t, fd, path, err, errlen);
    if (!a)
        return -1;
    load_adopted ad = {.shown = path, .ordinal = t->ordinal, .block = a->block,
                       .plan = t->plan, .tensors = t->tensors, .drop = detach, .ctx = a};
    if (load_adopt(&ad, out, err, errlen) != 0) {
        int code = errno;
        a->be->detach(a->ordinal, a->block);
        free(a);
        return share_fail(code);
    }
    a->strings = t->strings;
    a->dims = t->dims;
    free(t->files);
    *t = (share_table){0}; /* the load has the rest */
    return 0;
}

int ckl_attach(const char *socket_path, int cuda_device, const char *source, long gid,
               ckl_load **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!backend_cuda) {
        snprintf(err, errlen, "%s: this libckload was built without CUDA", socket_path);
        return share_fail(ENODEV);
    }
    share_ask ask = share_ask_make(cuda_device, source, gid);
    share_table t;
    int fd = share_client_connect(socket_path, &ask, err, errlen);
    if (fd < 0)
        return -1;
    if (share_client_receive(fd, socket_path, &ask, &t, err, errlen) != 0 ||
        adopt(&t, fd, socket_path, out, err, errlen) != 0) {
        int code = errno;
        share_table_free(&t);
        close(fd);
        return share_fail(code);
    }
    return 0;
}
