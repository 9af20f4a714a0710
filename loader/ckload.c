/* ckload.c — the loader's core: a checkpoint's blobs (a pack's, or any source's laid out as its
 * virtual pack), read by a few threads, into one destination block that a backend (backend.h:
 * CPU or CUDA) owns and fills. Which files are read O_DIRECT is direct.h's; the blobs that land
 * in place so are read through io_uring by ringload.h on one of the threads. Setting a load up
 * before its readers start, and freeing it, is ckload_setup.h's. */
#include "ckload.h"
#include "loadview.h"
#include "pool.h"
#include "ckload_setup.h"

#include "../index/index.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

static void set_error(ckl_load *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error(ckl_load *l, const char *fmt, ...)
{
    pthread_mutex_lock(&l->lock);
    if (!l->err[0]) {
        int n = snprintf(l->err, l->errcap, "%s: ", l->path);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(l->err + n, l->errcap - (size_t)n, fmt, ap);
        va_end(ap);
    }
    pthread_cond_broadcast(&l->cond);
    pthread_mutex_unlock(&l->lock);
}

/* Fails a call of the API: errno says the error's class (ckload.h). */
static int fail_as(int code)
{
    errno = code;
    return -1;
}

static int failed(ckl_load *l)
{
    pthread_mutex_lock(&l->lock);
    int f = l->err[0] != 0;
    pthread_mutex_unlock(&l->lock);
    return f;
}

/* Blob b of load ctx is in place: its waiters wake, its tensors are ready. The backends call it
 * through reader_setup.on_landed. */
static void blob_landed(void *ctx, size_t b)
{
    ckl_load *l = ctx;
    pthread_mutex_lock(&l->lock);
    atomic_store(&l->landed[b], 1);
    pthread_cond_broadcast(&l->cond);
    pthread_mutex_unlock(&l->lock);
    const ck_plan_blob *pb = &l->plan->blobs[b];
    for (uint32_t k = 0; l->opt.on_ready && k < pb->count; k++)
        l->opt.on_ready(l->opt.ctx, l->plan->blob_tensors[pb->first + k]);
}

/* Bytes [at, at+n) of a strided blob, gathered into buf element by element (ck_entry_read,
 * through the page cache): bounded by the chunk, whatever the tensor's size. 0, or -errno. */
static int gather_chunk(ckl_load *l, const ck_plan_blob *bl, uint64_t at, size_t n,
                        unsigned char *buf)
{
    ssize_t got = ck_entry_read(l->ix, bl->gather, buf, n, at);
    return got < 0 ? (int)got : (size_t)got == n ? 0 : -EIO;
}

static void read_failed(ckl_load *l, const ck_plan_blob *bl, uint64_t off, int rc)
{
    const char *fault = bl->gather ? ck_entry_fault(bl->gather) : NULL;
    set_error(l, "cannot read tensor '%s' (byte %llu): %s", bl->name, (unsigned long long)off,
              fault ? fault : strerror(-rc));
}

/* Reads blob bytes [at, at+n) into buf and returns where they are, or NULL (error set). With
 * O_DIRECT the read covers the enclosing whole blocks (direct_pread: buf has DIRECT_SLACK bytes
 * to spare), and the bytes start inside buf. Verify hashes them in order. */
static const unsigned char *read_chunk(ckl_load *l, const ck_plan_blob *bl, uint64_t at,
                                       size_t n, unsigned char *buf, XXH3_state_t *st)
{
    uint64_t off = bl->file_off + at, start = off;
    int rc;
    if (bl->gather) {
        rc = gather_chunk(l, bl, at, n, buf);
    } else if (direct_reads(&l->direct, bl)) {
        start = direct_start(off);
        rc = direct_pread(l->direct.fds[bl->file], buf, off, n);
    } else {
        rc = ck_file_pread(l->ix, bl->file, buf, n, start);
    }
    if (rc) {
        read_failed(l, bl, off, rc);
        return NULL;
    }
    const unsigned char *p = buf + (off - start);
    if (st)
        XXH3_64bits_update(st, p, n);
    atomic_fetch_add(&l->done_bytes, n);
    return p;
}

/* After blob b's last byte: with verify, a pack's blob against its stored checksum (st hashed
 * it); with verify for any other source, and always when bypassing a mount, the file against
 * what it was when opened (and, for the bypass, when mounted). */
static int check_sum(ckl_load *l, size_t b, XXH3_state_t *st)
{
    const ck_plan_blob *bl = &l->plan->blobs[b];
    if (st && bl->pack_blob != CK_PLAN_NONE && XXH3_64bits_digest(st) != l->stored_sums[b]) {
        set_error(l, "tensor '%s': checksum mismatch (data at byte %llu)", bl->name,
                  (unsigned long long)bl->file_off);
        return -1;
    }
    int part = l->opt.verify && bl->pack_blob == CK_PLAN_NONE; /* no checksum of its own */
    /* A gathered blob's bytes come from its entry's files (a DCP tensor's chunks: files of
     * their own), any other's from its file. */
    uint32_t changed = bl->file;
    if ((l->check_files || part) &&
        (bl->gather ? !ck_entry_unchanged(l->ix, bl->gather, 0, bl->len, &changed)
                    : !ck_file_unchanged(&l->ix->files[bl->file]))) {
        set_error(l, "tensor '%s': %s changed while it was read", bl->name,
                  l->ix->files[changed].path);
        return -1;
    }
    return 0;
}

/* Blob b's tied tensors that the caller placed elsewhere than the blob: its bytes copied to
 * each (ckl_options.dest), in order after its puts. 0, or -1 with why set. */
static int copy_to_ties(ckl_load *l, reader *r, size_t b, char *why, size_t len)
{
    const ck_plan_blob *bl = &l->plan->blobs[b];
    for (uint32_t k = 0; l->tensor_at && k < bl->count; k++) {
        uint32_t t = l->plan->blob_tensors[bl->first + k];
        unsigned char *at = l->tensor_at[t];
        if (at && at != l->blob_at[b] &&
            l->be->copy(r, at, l->blob_at[b], l->plan->tensors[t].entry->nbytes, why, len) != 0)
            return -1;
    }
    return 0;
}

/* Blob b's bytes are all in: checked (check_sum), copied to its ties placed elsewhere, then
 * handed to the backend, which says when it has landed. */
static void finish_blob(ckl_load *l, reader *r, size_t b, XXH3_state_t *st)
{
    char why[256];
    if (check_sum(l, b, st) == 0 && (copy_to_ties(l, r, b, why, sizeof why) != 0 ||
                                     l->be->landed(r, b, why, sizeof why) != 0))
        set_error(l, "tensor '%s': %s", l->plan->blobs[b].name, why);
}


/* Blob b, chunk by chunk: read where the backend says (the block itself, or a staging buffer),
 * then handed to it, or read straight into the block where in_place allows; it has landed once
 * the backend says all its chunks are in. */
static void load_blob(ckl_load *l, reader *r, size_t b, XXH3_state_t *st)
{
    const ck_plan_blob *bl = &l->plan->blobs[b];
    int direct_here = in_place(l, bl);
    char why[256];
    for (uint64_t at = 0, n; at < bl->len; at += n) {
        n = direct_chunk(bl->file_off + at, bl->len - at, l->opt.buffer_size, direct_here);
        unsigned char *dst = blob_at(l, bl) + at;
        if (failed(l))
            return;
        if (direct_here && direct_whole(bl->file_off + at, n)) {
            if (!read_chunk(l, bl, at, n, dst, st)) /* exactly [dst, dst + n): aligned */
                return;
            continue;
        }
        unsigned char *buf = l->be->stage(r, dst, n, why, sizeof why);
        const unsigned char *p = buf ? read_chunk(l, bl, at, n, buf, st) : NULL;
        if (buf && !p)
            return; /* read_chunk said why */
        if (!buf || l->be->put(r, dst, p, n, why, sizeof why) != 0) {
            set_error(l, "tensor '%s': %s", bl->name, why);
            return;
        }
    }
    finish_blob(l, r, b, st);
}

/* on_ready for the tensors with no bytes, once per load, from whichever reader starts first. */
static void announce_empty_tensors(ckl_load *l)
{
    if (!l->opt.on_ready || atomic_exchange(&l->readers.empties_announced, 1))
        return;
    for (size_t i = 0; i < l->plan->ntensors; i++)
        if (l->plan->tensors[i].blob == CK_PLAN_NONE)
            l->opt.on_ready(l->opt.ctx, i);
}

/* --- the ring's thread: the blobs read in place, many reads in flight (ringload.h) ---------- */


/* What the ring's hooks need: the load, and the ring thread's reader and checksum state. */
typedef struct ring_thread {
    ckl_load *l;
    reader *r;
    XXH3_state_t *st;
} ring_thread;

static int ring_stopped(void *ctx)
{
    return failed(((ring_thread *)ctx)->l);
}

static void ring_failed(void *ctx, size_t b, uint64_t at, int rc)
{
    ckl_load *l = ((ring_thread *)ctx)->l;
    const ck_plan_blob *bl = &l->plan->blobs[b];
    read_failed(l, bl, bl->file_off + at, rc);
}

/* Blob b's bytes are all in. With verify its checksum is taken from the block: its chunks came
 * in any order. */
static void ring_read(void *ctx, size_t b)
{
    ring_thread *t = ctx;
    const ck_plan_blob *bl = &t->l->plan->blobs[b];
    if (t->st) {
        XXH3_64bits_reset(t->st);
        XXH3_64bits_update(t->st, blob_at(t->l, bl), bl->len);
    }
    finish_blob(t->l, t->r, b, t->st);
}

/* The ring thread's part: every blob ring_reads that this process reads, then nothing in flight
 * once it returns. */
static void ring_blobs(ckl_load *l, reader *r, XXH3_state_t *st)
{
    ring_thread t = {.l = l, .r = r, .st = st};
    ringload_hooks h = {.ctx = &t, .stopped = ring_stopped, .failed = ring_failed,
                        .read = ring_read, .done_bytes = &l->done_bytes};
    int rc = ringload_run(l->ring, &h);
    if (rc)
        set_error(l, "io_uring: %s", strerror(-rc));
}


/* A reader thread is done. The last one closes the sources before it says so: a caller that
 * waited for the load finds them closed (a mount it read can be unmounted). */
static void reader_done(ckl_load *l)
{
    pthread_mutex_lock(&l->lock);
    int last = l->readers.running == 1;
    pthread_mutex_unlock(&l->lock);
    if (last) /* only readers count themselves down: no other can finish meanwhile */
        load_close_sources(l);
    pthread_mutex_lock(&l->lock);
    l->readers.running--;
    pthread_cond_broadcast(&l->cond);
    pthread_mutex_unlock(&l->lock);
}

/* A reader thread: the ring's (the first to start, when there is a ring), or one that takes the
 * blobs in turn and reads those not the ring's. */
static void *worker(void *arg)
{
    ckl_load *l = arg;
    announce_empty_tensors(l);
    int ringer = l->ring && !atomic_exchange(&l->readers.ring_taken, 1);
    int hash = l->opt.verify && l->plan->stored_sums;
    XXH3_state_t *st = hash ? XXH3_createState() : NULL;
    if (hash && !st)
        set_error(l, "out of memory");
    reader_setup s = {.on_landed = blob_landed, .ctx = l, .pool = l->pool,
                      .buffers = l->opt.buffers, .buffer_size = l->opt.buffer_size + DIRECT_SLACK,
                      .ordinal = l->ordinal, .direct = l->direct.any && !ringer};
    char why[256];
    reader *r = l->be->open(&s, why, sizeof why);
    if (!r)
        set_error(l, "%s", why);
    size_t nblobs = l->plan->nblobs;
    if (r && ringer)
        ring_blobs(l, r, st);
    for (size_t b; r && !ringer && (b = atomic_fetch_add(&l->readers.next_blob, 1)) < nblobs
                   && !failed(l);) {
        /* Another rank's blob is put by the caller (ckl_blob_put); the ring reads its own. */
        if (!reads(l, b) || ring_reads(l, &l->plan->blobs[b]))
            continue;
        if (st)
            XXH3_64bits_reset(st);
        load_blob(l, r, b, st);
    }
    if (r)
        l->be->close(r);
    XXH3_freeState(st);
    reader_done(l);
    return NULL;
}


/* The load's reader threads (load_readers): as many as load_count_readers, or the ones that
 * started before one could not (the load fails, and they stop). */
static void start_readers(ckl_load *l)
{
    load_readers *rs = &l->readers;
    unsigned nt = load_count_readers(l);
    rs->running = nt;
    for (unsigned i = 0; i < nt; i++) {
        if (pthread_create(&rs->threads[i], NULL, worker, l) != 0) {
            set_error(l, "cannot start reader thread %u", i);
            pthread_mutex_lock(&l->lock);
            rs->running -= nt - i;
            pthread_mutex_unlock(&l->lock);
            break;
        }
        rs->nthreads++;
    }
}

int ckl_load_start(const char *path, const ckl_options *o, ckl_load **out, char *err,
                   size_t errlen)
{
    *out = NULL;
    ckl_load *l = load_new(path, err, errlen);
    if (!l)
        return fail_as(ENOMEM);
    int code = load_prepare(l, path, o, err, errlen);
    if (code != 0) {
        load_free(l);
        return fail_as(code);
    }
    start_readers(l);
    *out = l;
    return 0;
}

ckl_pool *ckl_pool_new(void)
{
    return pool_new();
}

void ckl_pool_free(ckl_pool *p)
{
    pool_free(p);
}

/* --- what the loader's other modules see (loadview.h) ---------------------------------------- */

void load_view_of(const ckl_load *l, load_view *v)
{
    *v = (load_view){.block = l->block, .block_size = block_size(l), .device = l->device,
                     .ordinal = l->ordinal, .plan = l->plan, .ix = l->ix, .path = l->path};
}

int load_adopt(const load_adopted *a, ckl_load **out, char *err, size_t errlen)
{
    *out = NULL;
    ckl_load *l = load_new(a->shown, err, errlen);
    size_t nb = a->plan->nblobs ? a->plan->nblobs : 1;
    if (l) {
        l->landed = calloc(nb, sizeof *l->landed);
        l->blob_at = calloc(nb, sizeof *l->blob_at);
    }
    if (!l || !l->landed || !l->blob_at) {
        if (l) {
            snprintf(err, errlen, "%s: out of memory", l->path);
            load_free(l);
        }
        return fail_as(ENOMEM);
    }
    ckl_default_options(&l->opt);
    l->device = CKL_CUDA;
    l->ordinal = a->ordinal;
    l->be = backend_cuda;
    l->block = a->block;
    l->plan = a->plan;
    l->tensors = a->tensors;
    l->src.read_path = "attach";
    for (size_t b = 0; b < a->plan->nblobs; b++) {
        l->blob_at[b] = l->block + a->plan->blobs[b].dest_off;
        atomic_init(&l->landed[b], 1);
    }
    for (size_t i = 0; i < a->plan->ntensors; i++) {
        uint32_t b = a->plan->tensors[i].blob;
        l->tensors[i].data = b == CK_PLAN_NONE ? l->block : l->blob_at[b];
    }
    l->drop = a->drop;
    l->drop_ctx = a->ctx;
    *out = l;
    return 0;
}

/* --- using a load ---------------------------------------------------------------------------- */

size_t ckl_count(const ckl_load *l)
{
    return l->plan->ntensors;
}

const ckl_tensor *ckl_get(const ckl_load *l, size_t i)
{
    return i < l->plan->ntensors ? &l->tensors[i] : NULL;
}

long ckl_find(const ckl_load *l, const char *name)
{
    for (size_t i = 0; i < l->plan->ntensors; i++)
        if (strcmp(l->tensors[i].name, name) == 0)
            return (long)i;
    return -1;
}

int ckl_device_of(const ckl_load *l)
{
    return l->device;
}

int ckl_cuda_ordinal(const ckl_load *l)
{
    return l->ordinal;
}

uint64_t ckl_total_bytes(const ckl_load *l)
{
    uint64_t n = 0;
    for (size_t b = 0; b < l->plan->nblobs; b++)
        n += l->plan->blobs[b].len;
    return n;
}

uint64_t ckl_source_identity(const ckl_load *l)
{
    return l->identity;
}

const char *ckl_read_path(const ckl_load *l)
{
    return l->src.read_path ? l->src.read_path : l->plan->stored_sums ? "pack" : "source";
}

uint64_t ckl_done_bytes(const ckl_load *l)
{
    return atomic_load(&((ckl_load *)l)->done_bytes);
}

/* Waits until blob_or_all has landed (SIZE_MAX: until the readers are done) or the load fails;
 * after a failure nothing counts as ready. 0, -1 (the error in err, errno EIO), or 1 once
 * deadline (if not NULL, CLOCK_REALTIME) has passed. */
static int wait_until(ckl_load *l, size_t blob_or_all, const struct timespec *deadline,
                      char *err, size_t errlen)
{
    int timed_out = 0;
    pthread_mutex_lock(&l->lock);
    for (;;) {
        if (l->err[0])
            break;
        if (blob_or_all == SIZE_MAX ? l->readers.running == 0
                                    : atomic_load(&l->landed[blob_or_all]) != 0)
            break;
        if (l->readers.running == 0 && blob_or_all != SIZE_MAX && reads(l, blob_or_all)) {
            /* readers gone, blob never came */
            snprintf(l->err, l->errcap, "%s: the load stopped early", l->path);
            break;
        }
        if (!deadline)
            pthread_cond_wait(&l->cond, &l->lock);
        else if (pthread_cond_timedwait(&l->cond, &l->lock, deadline) == ETIMEDOUT) {
            timed_out = 1;
            break;
        }
    }
    int rc = l->err[0] ? -1 : timed_out;
    if (rc < 0 && err)
        snprintf(err, errlen, "%s", l->err);
    pthread_mutex_unlock(&l->lock);
    return rc < 0 ? fail_as(EIO) : rc;
}

int ckl_wait(ckl_load *l, size_t i, char *err, size_t errlen)
{
    if (i >= l->plan->ntensors) {
        snprintf(err, errlen, "%s: no tensor %zu", l->path, i);
        return fail_as(EINVAL);
    }
    uint32_t b = l->plan->tensors[i].blob;
    if (b == CK_PLAN_NONE) /* empty: nothing to wait for, unless all failed */
        return failed(l) ? wait_until(l, SIZE_MAX, NULL, err, errlen) : 0;
    return wait_until(l, b, NULL, err, errlen);
}

size_t ckl_blob_count(const ckl_load *l)
{
    return l->plan->nblobs;
}

int ckl_blob(const ckl_load *l, size_t b, void **data, uint64_t *nbytes, int *owner,
             int *sliced)
{
    if (b >= l->plan->nblobs)
        return -1;
    const ck_plan_blob *bl = &l->plan->blobs[b];
    *data = blob_at(l, bl);
    *nbytes = bl->len;
    *owner = bl->owner == CK_PLAN_EVERY ? -1 : (int)bl->owner;
    *sliced = bl->sliced;
    return 0;
}

int ckl_blob_wait(ckl_load *l, size_t b, char *err, size_t errlen)
{
    if (b >= l->plan->nblobs) {
        snprintf(err, errlen, "%s: no blob %zu", l->path, b);
        return fail_as(EINVAL);
    }
    return wait_until(l, b, NULL, err, errlen);
}

int ckl_blob_put(ckl_load *l, size_t b, char *err, size_t errlen)
{
    if (b >= l->plan->nblobs || reads(l, b) || atomic_load(&l->landed[b])) {
        snprintf(err, errlen, "%s: blob %zu is not the caller's to put", l->path, b);
        return fail_as(EINVAL);
    }
    if (failed(l))
        return wait_until(l, b, NULL, err, errlen); /* says the load's error */
    blob_landed(l, b);
    return 0;
}

void ckl_fail(ckl_load *l, const char *msg)
{
    pthread_mutex_lock(&l->lock);
    if (!l->err[0])
        snprintf(l->err, l->errcap, "%s", msg);
    pthread_cond_broadcast(&l->cond);
    pthread_mutex_unlock(&l->lock);
}

int ckl_wait_all_for(ckl_load *l, unsigned ms, char *err, size_t errlen)
{
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += ms / 1000;
    deadline.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    const struct timespec *d = ms ? &deadline : NULL;
    int rc = wait_until(l, SIZE_MAX, d, err, errlen);
    /* The readers have returned, but a backend may still have landings queued (CUDA: the host
     * functions behind the last copies). */
    for (size_t b = 0; rc == 0 && b < l->plan->nblobs; b++)
        rc = wait_until(l, b, d, err, errlen);
    return rc;
}

int ckl_wait_all(ckl_load *l, char *err, size_t errlen)
{
    return ckl_wait_all_for(l, 0, err, errlen);
}

void ckl_retain(ckl_load *l)
{
    atomic_fetch_add(&l->refs, 1);
}

void ckl_release(ckl_load *l)
{
    if (!l || atomic_fetch_sub(&l->refs, 1) != 1)
        return;
    set_error(l, "released"); /* stops readers that are still going */
    for (unsigned i = 0; i < l->readers.nthreads; i++)
        pthread_join(l->readers.threads[i], NULL);
    load_free(l); /* the backend frees the block once nothing is copying into it */
}
