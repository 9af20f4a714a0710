/* ringload.c — the io_uring read loop of a host load (ringload.h). */
#include "ringload.h"
#include "backend.h"
#include "direct.h"
#include "uring.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* The ring's reads in flight unless CKLOAD_URING_DEPTH says, and how much of the destinations
 * the helper faults in at a time (BENCHMARKS.md, "cold reads through io_uring"). */
enum { RING_DEPTH = 32 };
#define FAULT_STEP ((size_t)32 << 20)

struct ringload {
    uring *io;
    ringload_blob *blobs;
    size_t nblobs, chunk;
    const ringload_hooks *h; /* while ringload_run runs */
    unsigned char *bounce;   /* a DIRECT_ALIGN block per slot */
    struct ring_chunk {
        size_t blob;         /* in blobs */
        uint64_t at;         /* in the blob */
        size_t n;
        unsigned char *copy; /* NULL: read in place; else where the bytes at bounce + skip go */
        size_t skip;
    } *chunks;               /* per slot */
    uint32_t *pending;       /* per blob: reads in flight, and 1 while more are being queued */
};

/* One reference to blob i's reads dropped: after the last, unless the load stopped, it is read.
 */
static void blob_dropped(ringload *rl, size_t i)
{
    if (--rl->pending[i] || rl->h->stopped(rl->h->ctx))
        return;
    rl->h->read(rl->h->ctx, rl->blobs[i].id);
}

static void chunk_done(void *ctx, unsigned slot, int rc)
{
    ringload *rl = ctx;
    const struct ring_chunk *c = &rl->chunks[slot];
    if (rc) { /* its reference is never dropped: a blob with a failed read is never read */
        rl->h->failed(rl->h->ctx, rl->blobs[c->blob].id, c->at, rc);
        return;
    }
    if (c->copy)
        memcpy(c->copy, rl->bounce + (size_t)slot * DIRECT_ALIGN + c->skip, c->n);
    atomic_fetch_add(rl->h->done_bytes, c->n);
    blob_dropped(rl, c->blob);
}

/* Queues blob i's reads, chunk by chunk. 0, or -errno when the ring fails (a read that fails is
 * chunk_done's). */
static int queue_blob(ringload *rl, size_t i)
{
    const ringload_blob *bl = &rl->blobs[i];
    int rc = 0;
    rl->pending[i] = 1;
    for (uint64_t at = 0, n; rc == 0 && at < bl->len && !rl->h->stopped(rl->h->ctx); at += n) {
        uint64_t off = bl->off + at, start = direct_start(off);
        n = direct_chunk(off, bl->len - at, rl->chunk, 1);
        int whole = direct_whole(off, n);
        unsigned slot;
        if ((rc = uring_slot(rl->io, &slot)) != 0)
            break;
        rl->chunks[slot] = (struct ring_chunk){.blob = i, .at = at, .n = n,
                                               .copy = whole ? NULL : bl->dst + at,
                                               .skip = off - start};
        unsigned char *buf = whole ? bl->dst + at : rl->bounce + (size_t)slot * DIRECT_ALIGN;
        rl->pending[i]++;
        rc = uring_read(rl->io, slot, bl->fd, buf, whole ? n : DIRECT_ALIGN, start,
                        (size_t)(off + n - start));
        if (rc)
            rl->pending[i]--;
    }
    blob_dropped(rl, i);
    return rc;
}

/* Faults the blobs' destinations in, in order, FAULT_STEP at a time, until done or stopped. An
 * O_DIRECT read faults its destination's fresh pages in the thread that submits it, one after
 * another: this thread, on a core of its own, keeps them ahead of the ring's reads. Where the
 * kernel cannot populate (before Linux 5.14) it stops, and the reads fault the pages. */
static void *fault_ahead(void *arg)
{
    const ringload *rl = arg;
    for (size_t i = 0; i < rl->nblobs; i++) {
        const ringload_blob *bl = &rl->blobs[i];
        for (uint64_t at = 0; at < bl->len; at += FAULT_STEP) {
            uint64_t n = bl->len - at < FAULT_STEP ? bl->len - at : FAULT_STEP;
            if (rl->h->stopped(rl->h->ctx) || backend_cpu_populate(bl->dst + at, (size_t)n) != 0)
                return NULL;
        }
    }
    return NULL;
}

int ringload_run(ringload *rl, const ringload_hooks *h)
{
    rl->h = h;
    pthread_t faulter; /* none if it cannot start: the ring's reads fault the pages then */
    int faulting = pthread_create(&faulter, NULL, fault_ahead, rl) == 0;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < rl->nblobs && !h->stopped(h->ctx); i++)
        rc = queue_blob(rl, i);
    int drained = uring_drain(rl->io);
    if (faulting)
        pthread_join(faulter, NULL);
    return rc ? rc : drained;
}

/* The ring's reads in flight: RING_DEPTH unless CKLOAD_URING_DEPTH says (for measuring). */
static unsigned ring_depth(void)
{
    const char *v = getenv("CKLOAD_URING_DEPTH");
    long d = v ? strtol(v, NULL, 10) : 0;
    return d > 0 && d <= 4096 ? (unsigned)d : RING_DEPTH;
}

void ringload_free(ringload *rl)
{
    if (!rl)
        return;
    uring_free(rl->io);
    free(rl->blobs);
    free(rl->chunks);
    free(rl->pending);
    free(rl->bounce);
    free(rl);
}

ringload *ringload_new(const ringload_blob *blobs, size_t n, size_t chunk, int *refused)
{
    unsigned depth = ring_depth();
    ringload *rl = calloc(1, sizeof *rl);
    if (!rl || !(rl->blobs = malloc((n ? n : 1) * sizeof *rl->blobs)) ||
        !(rl->chunks = calloc(depth, sizeof *rl->chunks)) ||
        !(rl->pending = calloc(n ? n : 1, sizeof *rl->pending)) ||
        !(rl->bounce = aligned_alloc(DIRECT_ALIGN, (size_t)depth * DIRECT_ALIGN))) {
        ringload_free(rl);
        *refused = 0;
        return NULL;
    }
    if (n)
        memcpy(rl->blobs, blobs, n * sizeof *blobs);
    rl->nblobs = n, rl->chunk = chunk;
    if ((rl->io = uring_new(depth, chunk_done, rl, refused)) == NULL) {
        ringload_free(rl);
        return NULL;
    }
    return rl;
}
