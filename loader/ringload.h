/* ringload.h — the io_uring read loop of a host load: the blobs whose O_DIRECT reads land in
 * place, read by one thread with many reads in flight (uring.h), while a helper thread faults
 * their destinations in ahead of the reads.
 *
 * Contract:
 *  - ringload_new sets the loop up for blobs[0 .. n) (copied), cut in chunks of at most `chunk`
 *    bytes (direct_chunk, in place), or returns NULL: with 0 in *refused when memory runs out,
 *    with -errno where io_uring cannot be set up (uring.h: the kernel refuses it), after which
 *    the caller reads those blobs another way.
 *  - ringload_run reads each blob in order, on the calling thread: the whole
 *    DIRECT_ALIGN blocks of a blob straight into dst, its partial first and last blocks into a
 *    bounce block of the ring's and copied out. It reports through the hooks, on the calling
 *    thread: a chunk's bytes once they are in (done_bytes), a read that failed (failed: the
 *    byte of the blob it began at, -errno), and a blob all of whose bytes are in (read), unless
 *    one of its reads failed or the load has stopped by then. It queues nothing more once stopped() says so, and returns
 *    only once no read is in flight: 0, or -errno when the ring itself failed.
 *  - A blob's dst is host memory in phase with its bytes in the file for the file's O_DIRECT
 *    reads (direct_in_place), and stays valid until ringload_run returns.
 */
#ifndef CKL_RINGLOAD_H
#define CKL_RINGLOAD_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ringload ringload;

typedef struct ringload_blob {
    size_t id;            /* the caller's name for it, in its hooks */
    int fd;               /* its file's O_DIRECT descriptor */
    uint64_t off, len;    /* its bytes in the file */
    unsigned char *dst;   /* where they go */
} ringload_blob;

typedef struct ringload_hooks {
    void *ctx;
    int (*stopped)(void *ctx);
    void (*failed)(void *ctx, size_t id, uint64_t at, int rc);
    void (*read)(void *ctx, size_t id);
    atomic_uint_least64_t *done_bytes;
} ringload_hooks;

ringload *ringload_new(const ringload_blob *blobs, size_t n, size_t chunk, int *refused);
int ringload_run(ringload *rl, const ringload_hooks *h);
void ringload_free(ringload *rl);

#endif
