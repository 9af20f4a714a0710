/* uring.h — a read engine over io_uring (liburing): many reads in flight, queued and reaped by
 * one thread, for the loader's cold O_DIRECT host reads (ckload.c).
 *
 * Contract:
 *  - ring_new sets up a ring of `depth` slots, or returns NULL with -errno in *err where the
 *    kernel refuses io_uring (ENOSYS on old kernels, EPERM under a seccomp profile such as
 *    Docker's default or with kernel.io_uring_disabled): the caller then reads another way. It
 *    is not an error of the load.
 *  - One thread owns a ring: ring_slot gives a free slot (reaping completions while all are in
 *    flight), ring_read starts one read in it. A slot is the caller's to describe its read (its
 *    own per-slot array), and free again once its completion has been handed to `done`.
 *  - A read of `len` bytes at `off` into buf succeeds once it has its first `need` bytes (an
 *    O_DIRECT read past the end of a file stops there); short reads are continued, EINTR and
 *    EAGAIN retried. done(ctx, slot, rc) runs on the owning thread, from ring_slot or
 *    ring_drain, with rc 0 or -errno (-EIO: the file ended before `need`).
 *  - ring_drain waits until nothing is in flight; ring_free (after a drain: nothing may still
 *    write into the caller's buffers) tears the ring down.
 *  - Functions that can fail return -errno: then the ring is unusable but for ring_drain and
 *    ring_free.
 */
#ifndef CKL_URING_H
#define CKL_URING_H

#include <stddef.h>
#include <stdint.h>

typedef struct ring ring;
typedef void ring_done_fn(void *ctx, unsigned slot, int rc);

ring *ring_new(unsigned depth, ring_done_fn *done, void *ctx, int *err);
/* A free slot into *slot. 0, or -errno. */
int ring_slot(ring *r, unsigned *slot);
/* Starts the read of [off, off+len) into buf in slot (from ring_slot). 0, or -errno. */
int ring_read(ring *r, unsigned slot, int fd, void *buf, size_t len, uint64_t off, size_t need);
/* Waits for every read in flight (their done calls included). 0, or -errno. */
int ring_drain(ring *r);
void ring_free(ring *r);

#endif
