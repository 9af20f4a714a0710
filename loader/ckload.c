/* ckload.c — the loader's core: a checkpoint's blobs (a pack's, or any source's laid out as its
 * virtual pack), read by a few threads, into one destination block that a backend (backend.h:
 * CPU or CUDA) owns and fills. Which files are read O_DIRECT is direct.h's; the blobs that land
 * in place so are read through io_uring by ringload.h on one of the threads. */
#include "ckload.h"
#include "backend.h"
#include "direct.h"
#include "loadview.h"
#include "mount.h"
#include "ringload.h"

#include "../index/index.h"
#include "../base/bytes.h"
#include "../base/names.h"
#include "plan.h"
#include "slice.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

/* The readers and chunk size a load picks where its caller left them 0 (choose_readers): the
 * usual ones, those for a host load mostly read through the O_DIRECT bounce, and those of a
 * load staged through pinned buffers (CUDA: BENCHMARKS.md, "the GPU proof"). */
enum { DEFAULT_THREADS = 4, DEFAULT_STAGES = 2, BOUNCED_THREADS = 8,
       STAGED_THREADS = 8 };
#define DEFAULT_BUFFER ((size_t)16 << 20)
#define BOUNCED_BUFFER ((size_t)4 << 20)
#define STAGED_BUFFER ((size_t)4 << 20)
/* An error message, with its NUL, fits in the path's length and this (ckload.h). */
enum { ERR_ROOM = 512 };

/* --- the load ---------------------------------------------------------------------------- */

struct ckl_load {
    atomic_int refs;
    char *path;              /* as shown in messages (ck_location_shown); in the same allocation,
                              * as is err */
    ck_index *ix;            /* src.ix */
    mount_source src;        /* what path stands for: the index, the selection (mount.h) */
    int check_files;         /* check each source file is unchanged once a blob is read */
    uint64_t identity;       /* ckl_source_identity, taken while the files are open */
    ckl_options opt;
    int device, ordinal;
    const backend *be;       /* the device's: owns the block and moves bytes into it */
    ckl_pool *pool;
    int own_pool;
    unsigned char *block;    /* host or device, plan->block_size bytes (at least 1) */
    ck_plan *plan;           /* which tensors and blobs, and where they go (plan.h) */
    unsigned char **blob_at; /* per plan blob: where its bytes go (its place in the block, or
                              * the caller's memory: ckl_options.dest) */
    void **tensor_at;        /* per plan tensor: the caller's address for it, or NULL */
    atomic_int *landed;      /* per plan blob: in place */
    uint64_t *stored_sums;   /* per plan blob, from a pack's trailer; only with verify */
    ckl_tensor *tensors;     /* per plan tensor */
    direct_files direct;     /* which source files are read O_DIRECT (direct.h) */
    ringload *ring;          /* reads the blobs that land in place O_DIRECT (ring_reads); NULL:
                              * the reader threads read every blob */
    atomic_int ring_taken;   /* a reader thread has become the ring's */
    pthread_t *threads;
    unsigned nthreads;
    atomic_size_t next_blob;
    atomic_int empties_announced; /* empty tensors are ready at once: the first reader says so */
    atomic_uint_least64_t done_bytes;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    unsigned running;
    int joined;
    char *err;               /* the first error; empty while all is well */
    size_t errcap;           /* room for the path and ERR_ROOM more */
    void (*drop)(void *ctx); /* an attachment (load_adopt): unmaps its block, not be->free */
    void *drop_ctx;
};

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

/* The options a message may name, and how each caller spells them (ckl_options.spelling), with
 * what comes between the name and its value. */
enum option { OPT_ONLY, OPT_THREADS, OPT_BUFFERS, OPT_BUFFER_SIZE, OPT_WORLD_SIZE };
static const char *const spellings[][2] = {
    [OPT_ONLY] = {"--only ", "only="},
    [OPT_THREADS] = {"--threads ", "threads="},
    [OPT_BUFFERS] = {"--buffers ", "buffers="},
    [OPT_BUFFER_SIZE] = {"--buffer-size ", "buffer_size="},
    [OPT_WORLD_SIZE] = {"--world-size ", "world_size="},
};

static const char *spelled(const ckl_load *l, enum option opt)
{
    return spellings[opt][l->opt.spelling == CKL_SPELL_PARAMS];
}

/* "PATH: out of memory" into err; ENOMEM. */
static int out_of_memory(const ckl_load *l, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s: out of memory", l->path);
    return ENOMEM;
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

/* Whether this process reads blob b itself (ckl_options.read; plan.h ck_plan_share). */
static int reads(const ckl_load *l, size_t b)
{
    uint32_t owner = l->plan->blobs[b].owner;
    return owner == CK_PLAN_EVERY || owner == l->opt.rank;
}

/* Where blob bl's bytes go. */
static unsigned char *blob_at(const ckl_load *l, const ck_plan_blob *bl)
{
    return l->blob_at[bl - l->plan->blobs];
}

/* Whether blob bl's O_DIRECT reads land in the block itself: the block is host memory and bl's
 * place in it has its bytes' phase in the file (every blob of a whole pack; any other blob that
 * ck_plan_keep_phase kept in phase). */
static int in_place(const ckl_load *l, const ck_plan_blob *bl)
{
    return l->be->in_place && direct_in_place(&l->direct, bl, blob_at(l, bl));
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
    if (!l->opt.on_ready || atomic_exchange(&l->empties_announced, 1))
        return;
    for (size_t i = 0; i < l->plan->ntensors; i++)
        if (l->plan->tensors[i].blob == CK_PLAN_NONE)
            l->opt.on_ready(l->opt.ctx, i);
}

/* --- the ring's thread: the blobs read in place, many reads in flight (ringload.h) ---------- */

/* Whether blob bl is the ring's to read: it lands in place O_DIRECT. */
static int ring_reads(const ckl_load *l, const ck_plan_blob *bl)
{
    return l->ring && in_place(l, bl);
}

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

/* The ring, for a host load with blobs that land in place O_DIRECT, unless CKLOAD_URING=0. Where
 * the kernel refuses io_uring (uring.h) there is none and the reader threads read every blob, as
 * with CKLOAD_URING=0; CKLOAD_URING=1 makes that an error instead. 0, or the error's class with
 * err set. */
static int open_ring(ckl_load *l, char *err, size_t errlen)
{
    const char *want = getenv("CKLOAD_URING");
    size_t nblobs = l->plan->nblobs, in = 0, n = 0;
    for (size_t b = 0; b < nblobs; b++)
        in += in_place(l, &l->plan->blobs[b]);
    if ((want && strcmp(want, "0") == 0) || !in)
        return 0;
    ringload_blob *list = malloc(in * sizeof *list);
    if (!list)
        return out_of_memory(l, err, errlen);
    for (size_t b = 0; b < nblobs; b++) {
        const ck_plan_blob *bl = &l->plan->blobs[b];
        if (reads(l, b) && in_place(l, bl))
            list[n++] = (ringload_blob){.id = b, .fd = l->direct.fds[bl->file],
                                        .off = bl->file_off, .len = bl->len,
                                        .dst = blob_at(l, bl)};
    }
    int rc;
    l->ring = ringload_new(list, n, l->opt.buffer_size, &rc);
    free(list);
    if (l->ring)
        return 0;
    if (rc == 0)
        return out_of_memory(l, err, errlen);
    if (!want || strcmp(want, "1") != 0)
        return 0;
    snprintf(err, errlen, "%s: cannot set up io_uring (CKLOAD_URING=1): %s", l->path,
             strerror(-rc));
    return EIO;
}

/* The source files and O_DIRECT descriptors, closed once nothing will read them again. */
static void close_sources(ckl_load *l)
{
    direct_close(&l->direct);
    ck_index_close_files(l->ix);
}

/* A reader thread is done. The last one closes the sources before it says so: a caller that
 * waited for the load finds them closed (a mount it read can be unmounted). */
static void reader_done(ckl_load *l)
{
    pthread_mutex_lock(&l->lock);
    int last = l->running == 1;
    pthread_mutex_unlock(&l->lock);
    if (last) /* only readers count themselves down: no other can finish meanwhile */
        close_sources(l);
    pthread_mutex_lock(&l->lock);
    l->running--;
    pthread_cond_broadcast(&l->cond);
    pthread_mutex_unlock(&l->lock);
}

/* A reader thread: the ring's (the first to start, when there is a ring), or one that takes the
 * blobs in turn and reads those not the ring's. */
static void *worker(void *arg)
{
    ckl_load *l = arg;
    announce_empty_tensors(l);
    int ringer = l->ring && !atomic_exchange(&l->ring_taken, 1);
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
    for (size_t b; r && !ringer && (b = atomic_fetch_add(&l->next_blob, 1)) < nblobs &&
                   !failed(l);) {
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

/* --- setting a load up --------------------------------------------------------------------- */

int ckl_cuda_built(void)
{
    return backend_cuda != NULL;
}

int ckl_cuda_available(void)
{
    char why[8];
    return backend_cuda && backend_cuda->check(0, why, sizeof why) == 0;
}

int ckl_selected(const char *only, const char *name)
{
    return ck_name_selected(name, strlen(name), only);
}

void ckl_default_options(ckl_options *o)
{
    memset(o, 0, sizeof *o);
    o->device = CKL_AUTO; /* threads and buffer_size stay 0: chosen per load (choose_readers) */
    o->buffers = DEFAULT_STAGES;
}

/* Tensor entry x as ckl_get shows it, its data not yet set. */
static ckl_tensor tensor_of(const ck_entry *x)
{
    return (ckl_tensor){.name = x->name, .dtype = ck_dtype_name(x->dtype), .shape = x->shape,
                        .nbytes = x->nbytes, .rank = x->rank, .dtype_code = x->dtype};
}

/* The plan of the entries only and keep select (plan.h), cut as cut says, with this process's
 * share. 0, or the error's class (ckload.h: EINVAL where only or a slice rule is refused) with e
 * set. */
static int make_plan(ckl_load *l, const char *only, const unsigned char *keep,
                     const ck_slicing *cut, ck_error *e)
{
    enum ck_plan_read share = l->opt.read == CKL_READ_PARTS ? CK_READ_ALL
                                                             : (enum ck_plan_read)l->opt.read;
    ck_plan_free(l->plan);
    l->plan = NULL;
    int rc = ck_plan_make_sliced(l->ix, only, keep, cut, &l->plan, e);
    if (rc != 0)
        return rc == CK_PLAN_REFUSED ? EINVAL : EIO;
    if (ck_plan_share(l->plan, share, cut->world) != 0)
        return ck_fail(e, l->path, "out of memory"), ENOMEM;
    return 0;
}

/* A tensor the caller placed, for placed_apart: its bytes [at, at + n), its blob. */
typedef struct {
    uintptr_t at;
    uint64_t n;
    uint32_t blob;
    size_t tensor;
} placement;

static int placement_cmp(const void *a, const void *b)
{
    const placement *x = a, *y = b;
    if (x->at != y->at)
        return x->at < y->at ? -1 : 1;
    return x->n < y->n ? -1 : x->n > y->n;
}

/* Whether the tensors the caller placed (tensor_at) lie apart, else e names two that overlap:
 * their blobs are read by different threads, so shared bytes would end as a mix of both. Tied
 * tensors of one blob placed at one address are the same bytes (copy_to_ties skips them). Sorted
 * by address, each tensor is checked against the one reaching farthest before it: O(n log n). */
static int placed_apart(ckl_load *l, ck_error *e)
{
    const ck_plan *p = l->plan;
    placement *v = malloc((p->ntensors ? p->ntensors : 1) * sizeof *v);
    if (!v)
        return ck_fail(e, l->path, "out of memory"), ENOMEM;
    size_t n = 0;
    for (size_t i = 0; i < p->ntensors; i++)
        if (l->tensor_at[i] && p->tensors[i].entry->nbytes)
            v[n++] = (placement){(uintptr_t)l->tensor_at[i], p->tensors[i].entry->nbytes,
                                 p->tensors[i].blob, i};
    qsort(v, n, sizeof *v, placement_cmp);
    int rc = 0;
    for (size_t i = 1, far = 0; rc == 0 && i < n; i++) {
        const placement *a = &v[far], *b = &v[i];
        size_t first = a->tensor < b->tensor ? a->tensor : b->tensor; /* named in pack order */
        if (b->at - a->at < a->n && !(b->at == a->at && b->n == a->n && b->blob == a->blob))
            rc = (ck_fail(e, l->path, "tensors '%.200s' and '%.200s' are placed in "
                          "overlapping memory (their bytes would be a mix of both's)",
                          p->tensors[first].entry->name,
                          p->tensors[a->tensor + b->tensor - first].entry->name),
                  EINVAL);
        if (b->at + b->n > a->at + a->n)
            far = i;
    }
    free(v);
    return rc;
}

/* With ckl_options.dest: where each planned tensor goes. The tensors it skips are left out (the
 * plan is made again of the others alone: keep, only already applied, so that skipping every
 * tensor leaves an empty load whether only was given or not); the others' addresses go to
 * tensor_at. 0, or the error's class with e set (ECANCELED: the caller refused). */
static int ask_dests(ckl_load *l, const ck_slicing *cut, ck_error *e)
{
    const ck_index *ix = l->ix;
    size_t ne = ix->nentries ? ix->nentries : 1;
    void **at = calloc(ne, sizeof *at); /* per index entry */
    unsigned char *keep = calloc(ne, 1);  /* the planned tensors not skipped */
    int rc = at && keep ? 0 : (ck_fail(e, l->path, "out of memory"), ENOMEM), skipped = 0;
    for (size_t i = 0; rc == 0 && i < l->plan->ntensors; i++) {
        const ck_plan_tensor *pt = &l->plan->tensors[i];
        ckl_tensor t = tensor_of(pt->entry);
        size_t k = (size_t)(pt->whole - ix->entries);
        void *where = NULL;
        int d = l->opt.dest(l->opt.ctx, &t, &where);
        keep[k] = d != CKL_DEST_SKIP;
        skipped |= d == CKL_DEST_SKIP;
        if (d == CKL_DEST_AT && where)
            at[k] = where;
        else if (d != CKL_DEST_BLOCK && d != CKL_DEST_AT && d != CKL_DEST_SKIP)
            rc = (ck_fail(e, l->path, "tensor '%s': refused by the caller", t.name), ECANCELED);
    }
    if (rc == 0 && l->opt.dest(l->opt.ctx, NULL, NULL) != CKL_DEST_BLOCK)
        rc = (ck_fail(e, l->path, "the load was refused by its caller"), ECANCELED);
    if (rc == 0 && skipped)
        rc = make_plan(l, NULL, keep, cut, e);
    size_t nt = rc == 0 ? l->plan->ntensors : 0;
    if (rc == 0 && !(l->tensor_at = calloc(nt ? nt : 1, sizeof *l->tensor_at)))
        rc = (ck_fail(e, l->path, "out of memory"), ENOMEM);
    for (size_t i = 0; rc == 0 && i < nt; i++)
        l->tensor_at[i] = at[l->plan->tensors[i].whole - ix->entries];
    if (rc == 0)
        rc = placed_apart(l, e);
    free(at);
    free(keep);
    return rc;
}

/* Each blob with a tensor the caller placed (tensor_at) goes to the first such tensor's address
 * (tensors come in pack order), taking no room in the block. */
static void place_elsewhere(ckl_load *l)
{
    const ck_plan *p = l->plan;
    for (size_t i = 0; l->tensor_at && i < p->ntensors; i++) {
        uint32_t b = p->tensors[i].blob;
        if (b != CK_PLAN_NONE && l->tensor_at[i] && !l->blob_at[b]) {
            l->blob_at[b] = l->tensor_at[i];
            p->blobs[b].elsewhere = 1;
        }
    }
    if (l->tensor_at)
        ck_plan_keep_phase(l->plan, NULL); /* placed again: those blobs take no room */
}

/* The plan (plan.h: a pack's layout as its reader checked it, or any other source's as its
 * virtual pack), where the caller wants its tensors (ask_dests), each tensor's view of the
 * block-to-be, per-blob readiness, and with verify a pack's stored checksums. 0, or the error's
 * class (ckload.h) with err set. */
static int plan(ckl_load *l, char *err, size_t errlen)
{
    ck_error e;
    unsigned world = l->opt.world_size ? l->opt.world_size : 1;
    if (l->opt.rank >= world || (unsigned)l->opt.read > CKL_READ_PARTS) {
        snprintf(err, errlen, "%s: rank %u of world_size %u, read %d: no such share", l->path,
                 l->opt.rank, world, l->opt.read);
        return EINVAL;
    }
    /* Checked here rather than by the plan, so that the message names the option as the caller
     * spells it. */
    if (l->opt.only && !ck_plan_selects(l->ix, l->opt.only, l->src.keep)) {
        snprintf(err, errlen, "%s: %s'%s' selects nothing", l->path, spelled(l, OPT_ONLY),
                 l->opt.only);
        return EINVAL;
    }
    /* ckl_slice is ck_slice_rule's public twin: the same two fields, copied across. */
    ck_slice_rule *rules = calloc(l->opt.nslices + 1, sizeof *rules);
    for (size_t i = 0; rules && i < l->opt.nslices; i++)
        rules[i] = (ck_slice_rule){.glob = l->opt.slices[i].glob, .dim = l->opt.slices[i].dim};
    ck_slicing cut = {.rules = rules, .nrules = l->opt.nslices, .rank = l->opt.rank,
                      .world = world, .parts_only = l->opt.read == CKL_READ_PARTS};
    int rc = rules ? make_plan(l, l->opt.only, l->src.keep, &cut, &e)
                   : (ck_fail(&e, l->path, "out of memory"), ENOMEM);
    if (rc == 0 && l->opt.dest)
        rc = ask_dests(l, &cut, &e);
    free(rules);
    if (rc != 0) {
        snprintf(err, errlen, "%s", e.msg);
        return rc;
    }
    const ck_plan *p = l->plan;
    l->tensors = calloc(p->ntensors ? p->ntensors : 1, sizeof *l->tensors);
    l->landed = calloc(p->nblobs ? p->nblobs : 1, sizeof *l->landed);
    l->blob_at = calloc(p->nblobs ? p->nblobs : 1, sizeof *l->blob_at);
    int sums = l->opt.verify && p->stored_sums;
    l->check_files = (l->opt.verify && !p->stored_sums) ||
                     (l->src.read_path && strcmp(l->src.read_path, "bypass") == 0);
    l->stored_sums = sums ? calloc(p->nblobs ? p->nblobs : 1, sizeof *l->stored_sums) : NULL;
    if (!l->tensors || !l->landed || !l->blob_at || (sums && !l->stored_sums))
        return out_of_memory(l, err, errlen);
    for (size_t i = 0; i < p->ntensors; i++)
        l->tensors[i] = tensor_of(p->tensors[i].entry);
    place_elsewhere(l);
    if (sums && ck_plan_sums(l->ix, p, l->stored_sums, &e) != 0) {
        snprintf(err, errlen, "%s", e.msg);
        return EIO;
    }
    return 0;
}

/* The block's size: at least one byte, so that a load of empty tensors has an address. */
static size_t block_size(const ckl_load *l)
{
    return l->plan->block_size ? (size_t)l->plan->block_size : 1;
}

static int alloc_block(ckl_load *l, char *err, size_t errlen)
{
    char why[256];
    l->block = l->be->alloc(l->ordinal, block_size(l), why, sizeof why);
    if (!l->block) {
        snprintf(err, errlen, "%s: %s", l->path, why);
        return -1;
    }
    return 0;
}

static void free_load(ckl_load *l)
{
    if (l->drop)
        l->drop(l->drop_ctx);
    else if (l->block)
        l->be->free(l->block, block_size(l));
    if (l->own_pool)
        ckl_pool_free(l->pool);
    if (l->ix)
        close_sources(l);
    direct_free(&l->direct);
    ringload_free(l->ring);
    mount_source_close(&l->src);
    ck_plan_free(l->plan);
    free(l->landed);
    free(l->blob_at);
    free(l->tensor_at);
    free(l->stored_sums);
    free(l->tensors);
    free(l->threads);
    pthread_mutex_destroy(&l->lock);
    pthread_cond_destroy(&l->cond);
    free(l);
}

/* The reader threads and chunk size, where the caller left them 0. Where most of a cold host
 * load cannot land in place (tensors shorter than CK_PLAN_PHASE_MIN pages or out of line with
 * their elements in the file: ck_plan_keep_phase), each chunk is read O_DIRECT into its
 * thread's bounce, then copied, and a thread's next read waits for its copy: more threads with
 * smaller chunks keep the disk busy while others copy (BENCHMARKS.md, "cold sources through
 * 2 MiB bounce pages"). Whole pages read in place (a pack, most sources) keep the usual
 * 4 x 16 MiB. A staged load (CUDA) is bound by its pinned copies, not the disk: more, smaller
 * chunks keep more copies in flight (BENCHMARKS.md, "the GPU proof"). */
static void choose_readers(ckl_load *l)
{
    const ck_plan *p = l->plan;
    if (!l->be->in_place) {
        if (!l->opt.threads)
            l->opt.threads = STAGED_THREADS;
        if (!l->opt.buffer_size)
            l->opt.buffer_size = STAGED_BUFFER;
        return;
    }
    uint64_t bounced = 0, total = 0;
    for (size_t b = 0; b < p->nblobs; b++) {
        const ck_plan_blob *bl = &p->blobs[b];
        total += bl->len;
        if (l->be->in_place && direct_reads(&l->direct, bl) && !in_place(l, bl))
            bounced += bl->len;
    }
    int most = total && bounced > total / 2;
    if (!l->opt.threads)
        l->opt.threads = most ? BOUNCED_THREADS : DEFAULT_THREADS;
    if (!l->opt.buffer_size)
        l->opt.buffer_size = most ? BOUNCED_BUFFER : DEFAULT_BUFFER;
}

/* The reader threads: the ring's, and up to opt.threads more for the blobs that are not the
 * ring's; at least one, even with no bytes to read: it announces the empty tensors. */
static unsigned count_readers(const ckl_load *l)
{
    size_t rest = 0;
    for (size_t b = 0; b < l->plan->nblobs; b++)
        rest += !ring_reads(l, &l->plan->blobs[b]);
    unsigned n = (l->opt.threads < rest ? l->opt.threads : (unsigned)rest) + (l->ring != NULL);
    return n ? n : 1;
}

/* Which device, and so which backend: CUDA when asked for (and there), or when auto finds one. */
static int pick_device(ckl_load *l, char *err, size_t errlen)
{
    l->ordinal = l->opt.cuda_device;
    l->device = l->opt.device == CKL_AUTO ? (ckl_cuda_available() ? CKL_CUDA : CKL_CPU)
                                          : l->opt.device == CKL_CUDA ? CKL_CUDA : CKL_CPU;
    l->be = l->device == CKL_CUDA ? backend_cuda : &backend_cpu;
    char why[256] = "this libckload was built without CUDA";
    if (l->be && l->be->check(l->ordinal, why, sizeof why) == 0)
        return 0;
    snprintf(err, errlen, "%s: %s", l->path, why);
    return -1;
}

/* Whether every slice rule's dim is -1 (whole) or a dimension a tensor may have; else err says
 * which is not. A dim below -1 read as whole, one past CK_MAX_RANK as no dimension. */
static int slice_dims_valid(const ckl_load *l, char *err, size_t errlen)
{
    _Static_assert(CKL_MAX_SLICE_DIM == CK_MAX_RANK - 1, "a slice's dim is one of a tensor's");
    for (size_t i = 0; i < l->opt.nslices; i++) {
        const ckl_slice *r = &l->opt.slices[i];
        if (r->dim < -1 || r->dim > CKL_MAX_SLICE_DIM) {
            snprintf(err, errlen, "%s: slice rule '%s': dim %d is not -1 (whole) or a dimension "
                     "from 0 to %d", l->path, r->glob ? r->glob : "", r->dim, CKL_MAX_SLICE_DIM);
            return 0;
        }
    }
    return 1;
}

/* Whether the load's numbers are within their bounds (ckload.h); else err says which is not,
 * naming the option. Checked before anything is sized by them: unchecked, a buffer size near
 * 2^64 would wrap the gather's arithmetic, a thread count start that many threads, and a world
 * of 2^32 - 1 ranks make the balanced share's search take minutes per blob. */
static int options_valid(const ckl_load *l, char *err, size_t errlen)
{
    const ckl_options *o = &l->opt;
    if (o->device != CKL_CPU && o->device != CKL_CUDA && o->device != CKL_AUTO)
        snprintf(err, errlen, "%s: device %d: not CPU, CUDA or auto (enum ckl_device)", l->path,
                 o->device);
    else if (o->world_size > CKL_MAX_WORLD_SIZE)
        snprintf(err, errlen, "%s: %s%u: more than %u ranks", l->path,
                 spelled(l, OPT_WORLD_SIZE), o->world_size, CKL_MAX_WORLD_SIZE);
    else if (!slice_dims_valid(l, err, errlen))
        return 0;
    else if (o->threads > CKL_MAX_THREADS)
        snprintf(err, errlen, "%s: %s%u: more than %u reader threads", l->path,
                 spelled(l, OPT_THREADS), o->threads, CKL_MAX_THREADS);
    else if (o->buffers > CKL_MAX_BUFFERS)
        snprintf(err, errlen, "%s: %s%u: more than %u staging buffers per thread", l->path,
                 spelled(l, OPT_BUFFERS), o->buffers, CKL_MAX_BUFFERS);
    else if (o->buffer_size &&
             (o->buffer_size < CKL_MIN_BUFFER_SIZE || o->buffer_size > CKL_MAX_BUFFER_SIZE))
        snprintf(err, errlen, "%s: %s%zu: not within %u to %llu bytes", l->path,
                 spelled(l, OPT_BUFFER_SIZE), o->buffer_size, CKL_MIN_BUFFER_SIZE,
                 CKL_MAX_BUFFER_SIZE);
    else
        return 1;
    return 0;
}

/* ckl_source_identity of the files ix opened: each one's name and what ck_file_unchanged
 * compares (device, inode, size, mtime; a remote file's size and Last-Modified). */
static uint64_t source_identity(const ck_index *ix)
{
    uint64_t h = 0;
    for (uint32_t f = 0; f < ix->nfiles; f++) {
        const ck_file *cf = &ix->files[f];
        uint64_t id[5] = {(uint64_t)cf->dev, (uint64_t)cf->ino, cf->size,
                          (uint64_t)cf->mtime.tv_sec, (uint64_t)cf->mtime.tv_nsec};
        h = XXH3_64bits_withSeed(cf->path, strlen(cf->path) + 1, h);
        h = XXH3_64bits_withSeed(id, sizeof id, h);
    }
    return h ? h : 1;
}

/* Everything a load needs before its readers start: the source, the device, the plan, the block,
 * the ring and each tensor's address. 0, or the error's class (ckload.h) with err set. */
static int prepare(ckl_load *l, const char *path, char *err, size_t errlen)
{
    if (!options_valid(l, err, errlen))
        return EINVAL;
    int code = mount_source_open(path, &l->src, err, errlen);
    if (code != 0)
        return code;
    l->ix = l->src.ix;
    l->identity = source_identity(l->ix);
    if (!l->pool)
        return out_of_memory(l, err, errlen);
    if (pick_device(l, err, errlen) != 0)
        return ENODEV;
    if ((code = plan(l, err, errlen)) != 0)
        return code;
    if (direct_open(&l->direct, l->ix, l->plan) != 0)
        return out_of_memory(l, err, errlen);
    /* Blobs placed so that O_DIRECT reads land in place (a safetensors or .pt source's tensors
     * are at any offset in their files, a pack's already in phase). */
    if (l->direct.any && l->be->in_place)
        ck_plan_keep_phase(l->plan, l->direct.phase);
    if (alloc_block(l, err, errlen) != 0)
        return ENOMEM;
    for (size_t b = 0; b < l->plan->nblobs; b++)
        if (!l->plan->blobs[b].elsewhere)
            l->blob_at[b] = l->block + l->plan->blobs[b].dest_off;
    choose_readers(l);
    if ((code = open_ring(l, err, errlen)) != 0)
        return code;
    const ck_plan *p = l->plan;
    for (size_t i = 0; i < p->ntensors; i++) {
        uint32_t b = p->tensors[i].blob;
        void *mine = l->tensor_at ? l->tensor_at[i] : NULL;
        l->tensors[i].data = mine ? mine : b == CK_PLAN_NONE ? l->block : l->blob_at[b];
    }
    l->threads = calloc(count_readers(l), sizeof *l->threads);
    return l->threads ? 0 : out_of_memory(l, err, errlen);
}

/* A load of path with nothing in it yet: one allocation, the load, its path, then room for its
 * error message. NULL with err set when memory runs out. */
static ckl_load *new_load(const char *path, char *err, size_t errlen)
{
    size_t plen = strlen(path) + 1, errcap = plen - 1 + ERR_ROOM;
    ckl_load *l = calloc(1, sizeof *l + plen + errcap);
    if (!l) {
        size_t n = strlen(ck_location_shown(path, err, errlen));
        snprintf(err + n, errlen - n, ": out of memory");
        return NULL;
    }
    l->path = ck_location_shown(path, (char *)(l + 1), plen); /* for messages: no secrets */
    l->err = l->path + plen;
    l->errcap = errcap;
    atomic_init(&l->refs, 1);
    pthread_mutex_init(&l->lock, NULL);
    pthread_cond_init(&l->cond, NULL);
    return l;
}

int ckl_load_start(const char *path, const ckl_options *o, ckl_load **out, char *err,
                   size_t errlen)
{
    *out = NULL;
    ckl_load *l = new_load(path, err, errlen);
    if (!l)
        return fail_as(ENOMEM);
    l->opt = *o;
    if (!l->opt.buffers)
        l->opt.buffers = DEFAULT_STAGES;
    l->pool = o->pool ? o->pool : ckl_pool_new();
    l->own_pool = !o->pool;
    int code = prepare(l, path, err, errlen);
    if (code != 0) {
        free_load(l);
        return fail_as(code);
    }
    unsigned nt = count_readers(l);
    l->running = nt;
    for (unsigned i = 0; i < nt; i++) {
        if (pthread_create(&l->threads[i], NULL, worker, l) != 0) {
            set_error(l, "cannot start reader thread %u", i);
            pthread_mutex_lock(&l->lock);
            l->running -= nt - i;
            pthread_mutex_unlock(&l->lock);
            break;
        }
        l->nthreads++;
    }
    *out = l;
    return 0;
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
    ckl_load *l = new_load(a->shown, err, errlen);
    size_t nb = a->plan->nblobs ? a->plan->nblobs : 1;
    if (l) {
        l->landed = calloc(nb, sizeof *l->landed);
        l->blob_at = calloc(nb, sizeof *l->blob_at);
    }
    if (!l || !l->landed || !l->blob_at) {
        if (l) {
            snprintf(err, errlen, "%s: out of memory", l->path);
            free_load(l);
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
        if (blob_or_all == SIZE_MAX ? l->running == 0
                                    : atomic_load(&l->landed[blob_or_all]) != 0)
            break;
        if (l->running == 0 && blob_or_all != SIZE_MAX && reads(l, blob_or_all)) {
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
    for (unsigned i = 0; i < l->nthreads; i++)
        pthread_join(l->threads[i], NULL);
    free_load(l); /* the backend frees the block once nothing is copying into it */
}
