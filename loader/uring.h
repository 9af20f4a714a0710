/* uring.h — a read engine over io_uring (liburing): many reads in flight, queued and reaped by
 * one thread, for the loader's cold O_DIRECT host reads (ckload.c).
 *
 * Contract:
 *  - uring_new sets up a ring of `depth` slots, or returns NULL with -errno in *err where the
 *    kernel refuses io_uring (ENOSYS on old kernels, EPERM under a seccomp profile such as
 *    Docker's default or with kernel.io_uring_disabled): the caller then reads another way. It
 *    is not an error of the load.
 *  - One thread owns a ring: uring_slot gives a free slot (reaping completions while all are in
 *    flight), uring_read starts one read in it. A slot is the caller's to describe its read (its
 *    own per-slot array), and free again once its completion has been handed to `done`.
 *  - A read of `len` bytes at `off` into buf succeeds once it has its first `need` bytes (an
 *    O_DIRECT read past the end of a file stops there); short reads are continued, EINTR and
 *    EAGAIN retried. done(ctx, slot, rc) runs on the owning thread, from uring_slot or
 *    uring_drain, with rc 0 or -errno (-EIO: the file ended before `need`).
 *  - uring_drain waits until nothing is in flight; uring_free (after a drain: nothing may still
 *    write into the caller's buffers) tears the ring down.
 *  - Functions that can fail return -errno: then the ring is unusable but for uring_drain and
 *    uring_free.
 */
#ifndef CKL_URING_H
#define CKL_URING_H

#include <stddef.h>
#include <stdint.h>

typedef struct uring uring;
typedef void uring_done_fn(void *ctx, unsigned slot, int rc);

uring *uring_new(unsigned depth, uring_done_fn *done, void *ctx, int *err);
/* A free slot into *slot. 0, or -errno. */
int uring_slot(uring *r, unsigned *slot);
/* Starts the read of [off, off+len) into buf in slot (from uring_slot). 0, or -errno. */
int uring_read(uring *r, unsigned slot, int fd, void *buf, size_t len, uint64_t off,
               size_t need);
/* Waits for every read in flight (their done calls included). 0, or -errno. */
int uring_drain(uring *r);
void uring_free(uring *r);

#endif
