/* ckload_setup.c — setting a load up (ckload_setup.h): the options checked, the source opened,
 * the device picked, the plan made and the caller's placements asked for, the block allocated,
 * the readers and the ring chosen; and a load's allocation and release. */
#include "ckload_setup.h"
#include "pool.h"

#include "../index/index.h"
#include "../base/names.h"
#include "slice.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
void load_close_sources(ckl_load *l)
{
    direct_close(&l->direct);
    ck_index_close_files(l->ix);
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

void load_free(ckl_load *l)
{
    if (l->drop)
        l->drop(l->drop_ctx);
    else if (l->block)
        l->be->free(l->block, block_size(l));
    if (l->own_pool)
        pool_free(l->pool);
    if (l->ix)
        load_close_sources(l);
    direct_free(&l->direct);
    ringload_free(l->ring);
    mount_source_close(&l->src);
    ck_plan_free(l->plan);
    free(l->landed);
    free(l->blob_at);
    free(l->tensor_at);
    free(l->stored_sums);
    free(l->tensors);
    free(l->readers.threads);
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
unsigned load_count_readers(const ckl_load *l)
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
int load_prepare(ckl_load *l, const char *path, const ckl_options *o, char *err,
                 size_t errlen)
{
    l->opt = *o;
    if (!l->opt.buffers)
        l->opt.buffers = DEFAULT_STAGES;
    l->pool = o->pool ? o->pool : pool_new();
    l->own_pool = !o->pool;
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
    l->readers.threads = calloc(load_count_readers(l), sizeof *l->readers.threads);
    return l->readers.threads ? 0 : out_of_memory(l, err, errlen);
}

/* A load of path with nothing in it yet: one allocation, the load, its path, then room for its
 * error message. NULL with err set when memory runs out. */
ckl_load *load_new(const char *path, char *err, size_t errlen)
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
