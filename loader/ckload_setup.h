/* ckload_setup.h — a load's fields (struct ckl_load), and how a load is set up before its
 * readers start (ckload_setup.c): what the loader's core (ckload.c) and its setup share, and
 * nothing else includes.
 *
 * Contract:
 *  - load_new: a load of path with nothing in it yet (one allocation: the load, its path as
 *    messages show it, room for its error), one reference. NULL with err set when memory runs
 *    out.
 *  - load_prepare: everything a load needs before its readers start, from the caller's options
 *    o: the source, the device, the plan, the block, the ring, each tensor's address and room for
 *    the reader threads (load_count_readers of them). 0, or the error's class (ckload.h) with err
 *    set; then the caller frees the load (load_free).
 *  - load_free: frees whatever the load holds (its block through its backend, or an
 *    attachment's drop); its readers must be done.
 *  - load_close_sources: closes the source files and O_DIRECT descriptors, once nothing will
 *    read them again.
 *  - The inline helpers answer for a load once it is prepared: whose blob b is, where a blob's
 *    bytes go, whether its O_DIRECT reads land in place, whether the ring reads it, how large
 *    its block is.
 */
#ifndef CKL_CKLOAD_SETUP_H
#define CKL_CKLOAD_SETUP_H

#include "ckload.h"
#include "backend.h"
#include "direct.h"
#include "mount.h"
#include "plan.h"
#include "ringload.h"

#include <pthread.h>
#include <stdatomic.h>

/* --- the load ---------------------------------------------------------------------------- */

/* The load's reader threads, its thread pool: ckl_load_start starts nthreads of the load's
 * threads (room for load_count_readers), each takes the blobs in turn (next_blob), the first
 * to start becomes the ring's (ring_taken) when there is a ring, and the first of all says the
 * empty tensors are ready. running counts those not yet done, under the load's lock; the last
 * release joins them. */
typedef struct load_readers {
    pthread_t *threads;
    unsigned nthreads;       /* started */
    unsigned running;        /* not yet done (under the load's lock) */
    atomic_size_t next_blob;
    atomic_int ring_taken;   /* a reader thread has become the ring's */
    atomic_int empties_announced; /* empty tensors are ready at once: the first reader says so */
} load_readers;

struct ckl_load {
    /* its lifetime, and what it shows */
    atomic_int refs;
    char *path;              /* as shown in messages (ck_location_shown); in the same allocation,
                              * as is err */
    void (*drop)(void *ctx); /* an attachment (load_adopt): unmaps its block, not be->free */
    void *drop_ctx;
    /* the source and the options */
    ck_index *ix;            /* src.ix */
    mount_source src;        /* what path stands for: the index, the selection (mount.h) */
    int check_files;         /* check each source file is unchanged once a blob is read */
    uint64_t identity;       /* ckl_source_identity, taken while the files are open */
    ckl_options opt;
    /* the device, the block and where each blob and tensor goes in it */
    int device, ordinal;
    const backend *be;       /* the device's: owns the block and moves bytes into it */
    ckl_pool *pool;
    int own_pool;
    unsigned char *block;    /* host or device, plan->block_size bytes (at least 1) */
    ck_plan *plan;           /* which tensors and blobs, and where they go (plan.h) */
    unsigned char **blob_at; /* per plan blob: where its bytes go (its place in the block, or
                              * the caller's memory: ckl_options.dest) */
    void **tensor_at;        /* per plan tensor: the caller's address for it, or NULL */
    uint64_t *stored_sums;   /* per plan blob, from a pack's trailer; only with verify */
    ckl_tensor *tensors;     /* per plan tensor */
    /* how the bytes are read */
    direct_files direct;     /* which source files are read O_DIRECT (direct.h) */
    ringload *ring;          /* reads the blobs that land in place O_DIRECT (ring_reads); NULL:
                              * the reader threads read every blob */
    load_readers readers;
    /* progress, readiness and the first error: landed, running and err change under lock, and
     * each change wakes cond's waiters */
    atomic_int *landed;      /* per plan blob: in place */
    atomic_uint_least64_t done_bytes;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    char *err;               /* the first error; empty while all is well */
    size_t errcap;           /* room for the path and ERR_ROOM more */
};

ckl_load *load_new(const char *path, char *err, size_t errlen);
int load_prepare(ckl_load *l, const char *path, const ckl_options *o, char *err,
                 size_t errlen);
void load_free(ckl_load *l);
void load_close_sources(ckl_load *l);
unsigned load_count_readers(const ckl_load *l);

/* Whether this process reads blob b itself (ckl_options.read; plan.h ck_plan_share). */
static inline int reads(const ckl_load *l, size_t b)
{
    uint32_t owner = l->plan->blobs[b].owner;
    return owner == CK_PLAN_EVERY || owner == l->opt.rank;
}

/* Where blob bl's bytes go. */
static inline unsigned char *blob_at(const ckl_load *l, const ck_plan_blob *bl)
{
    return l->blob_at[bl - l->plan->blobs];
}

/* Whether blob bl's O_DIRECT reads land in the block itself: the block is host memory and bl's
 * place in it has its bytes' phase in the file (every blob of a whole pack; any other blob that
 * ck_plan_keep_phase kept in phase). */
static inline int in_place(const ckl_load *l, const ck_plan_blob *bl)
{
    return l->be->in_place && direct_in_place(&l->direct, bl, blob_at(l, bl));
}

/* Whether blob bl is the ring's to read: it lands in place O_DIRECT. */
static inline int ring_reads(const ckl_load *l, const ck_plan_blob *bl)
{
    return l->ring && in_place(l, bl);
}

/* The block's size: at least one byte, so that a load of empty tensors has an address. */
static inline size_t block_size(const ckl_load *l)
{
    return l->plan->block_size ? (size_t)l->plan->block_size : 1;
}

#endif
