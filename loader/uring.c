/* uring.c — the io_uring read engine (uring.h): a ring, its slots, and the reads in them carried
 * through short reads and retries until each has what it needs. */
#include "uring.h"

#include <errno.h>
#include <liburing.h>
#include <stdlib.h>

/* The most one read asks for (an entry's length is 32 bits): a multiple of every O_DIRECT
 * alignment, so that the rest of a longer read stays aligned. */
#define MAX_READ (1u << 30)

struct uring {
    struct io_uring io;
    uring_done_fn *done;
    void *ctx;
    struct op {
        int fd;
        unsigned char *buf;
        size_t len, need, got; /* got: bytes read so far, from buf and off */
        uint64_t off;
    } *ops;                   /* per slot */
    unsigned *free;           /* a stack of free slots */
    unsigned nfree, depth;
};

uring *uring_new(unsigned depth, uring_done_fn *done, void *ctx, int *err)
{
    uring *r = calloc(1, sizeof *r);
    if (r) {
        r->ops = calloc(depth, sizeof *r->ops);
        r->free = calloc(depth, sizeof *r->free);
    }
    if (!r || !r->ops || !r->free) {
        *err = -ENOMEM;
    } else if ((*err = io_uring_queue_init(depth, &r->io, 0)) == 0) {
        r->done = done, r->ctx = ctx, r->depth = depth;
        for (unsigned i = 0; i < depth; i++)
            r->free[r->nfree++] = depth - 1 - i;
        return r;
    }
    if (r)
        free(r->ops), free(r->free);
    free(r);
    return NULL;
}

/* Queues the rest of slot s's read (from op->got on) and submits it. 0, or -errno. */
static int submit(uring *r, unsigned s)
{
    struct op *op = &r->ops[s];
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->io);
    if (!sqe) /* cannot happen: no more reads are in flight than the ring has entries */
        return -EBUSY;
    size_t n = op->len - op->got; /* the kernel reads at most 2 GiB less a page at once anyway */
    io_uring_prep_read(sqe, op->fd, op->buf + op->got, n < MAX_READ ? (unsigned)n : MAX_READ,
                       op->off + op->got);
    io_uring_sqe_set_data64(sqe, s);
    int rc;
    while ((rc = io_uring_submit(&r->io)) == -EINTR || rc == -EAGAIN)
        ;
    return rc < 0 ? rc : 0;
}

/* One completion: its read goes on (short, or retried) or is over, and then done hears of it
 * and its slot is free. 0, or -errno when a read cannot be continued. */
static int reap(uring *r, struct io_uring_cqe *cqe)
{
    unsigned s = (unsigned)io_uring_cqe_get_data64(cqe);
    int res = cqe->res;
    io_uring_cqe_seen(&r->io, cqe);
    struct op *op = &r->ops[s];
    if (res == -EINTR || res == -EAGAIN || (res > 0 && op->got + (size_t)res < op->need)) {
        op->got += res > 0 ? (size_t)res : 0;
        int rc = submit(r, s);
        if (rc == 0)
            return 0;
        res = rc;
    }
    r->free[r->nfree++] = s;
    r->done(r->ctx, s, res < 0 ? res : res == 0 && op->got < op->need ? -EIO : 0);
    return 0;
}

/* Waits for one completion, then takes every one that is there. 0, or -errno. */
static int reap_some(uring *r)
{
    struct io_uring_cqe *cqe;
    int rc;
    while ((rc = io_uring_wait_cqe(&r->io, &cqe)) == -EINTR)
        ;
    while (rc == 0 && io_uring_peek_cqe(&r->io, &cqe) == 0)
        rc = reap(r, cqe);
    return rc;
}

int uring_slot(uring *r, unsigned *slot)
{
    int rc = 0;
    while (rc == 0 && r->nfree == 0)
        rc = reap_some(r);
    if (rc == 0)
        *slot = r->free[--r->nfree];
    return rc;
}

int uring_read(uring *r, unsigned slot, int fd, void *buf, size_t len, uint64_t off,
               size_t need)
{
    r->ops[slot] = (struct op){.fd = fd, .buf = buf, .len = len, .need = need, .off = off};
    int rc = submit(r, slot);
    if (rc)
        r->free[r->nfree++] = slot; /* never in flight: uring_drain must not wait for it */
    return rc;
}

int uring_drain(uring *r)
{
    int rc = 0;
    while (rc == 0 && r->nfree < r->depth)
        rc = reap_some(r);
    return rc;
}

void uring_free(uring *r)
{
    if (!r)
        return;
    io_uring_queue_exit(&r->io);
    free(r->ops);
    free(r->free);
    free(r);
}
