/* plan.c — a load's plan: from a pack's checked layout, or from the virtual pack's grouping of
 * any other source (see plan.h). */
#include "plan.h"
#include "../base/bytes.h"
#include "../base/dtype.h"
#include "../base/names.h"
#include "../formats/packfile.h"
#include "slice.h"
#include "../checkpoint/synth.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The pack a plan is made of: an index of exactly one pack file. */
static const pack_layout *pack_of(const ck_index *ix)
{
    return ix->nfiles == 1 ? pack_layout_of(ix, 0) : NULL;
}

void ck_plan_free(ck_plan *p)
{
    if (!p)
        return;
    for (size_t t = 0; p->tensors && t < p->ntensors; t++)
        if (p->tensors[t].sliced) /* its entry is the plan's view (plan_view) */
            free((void *)(uintptr_t)p->tensors[t].entry);
    free(p->tensors);
    free(p->blobs);
    free(p->blob_tensors);
    free(p);
}

/* What add_tensor needs beside the plan: the index, the slicing (NULL: every tensor whole), the
 * picks so far, where errors go and whether the error is a slice rule refused. */
typedef struct ck_plan_ctx {
    const ck_index *ix;
    const ck_slicing *slicing;
    uint32_t *picked, *picked_part; /* per pack blob (add_tensor) */
    ck_error *err;
    int refused;                    /* CK_PLAN_REFUSED, not -1 */
} ck_plan_ctx;

static int selected(const ck_index *ix, const ck_entry *e, const char *only,
                    const unsigned char *keep)
{
    return e->kind == CK_TENSOR && ck_name_selected(e->name, e->name_len, only) &&
           (!keep || keep[e - ix->entries]);
}

/* A sliced tensor's view (slice.h), owned by the plan: freed with it. */
typedef struct plan_view {
    ck_entry e; /* first: the plan's tensor points at it */
    int64_t dims[];
} plan_view;

/* Whether blob bl holds exactly the bytes of view v: the same extent, or the same gather. */
static int same_view(const ck_plan_blob *bl, const ck_entry *v)
{
    const ck_entry *g = bl->gather;
    return bl->file == v->ext.file && bl->file_off == v->ext.offset && bl->len == v->nbytes &&
           !g == (v->layout == CK_CONTIGUOUS) &&
           (!g || (g->rank == v->rank &&
                   memcmp(g->shape, v->shape, 2 * (size_t)v->rank * sizeof *v->shape) == 0));
}

/* Tensor e's part for the plan's slicing, or e itself when it is whole. NULL with err set when
 * it cannot be sliced or memory runs out. */
static const ck_entry *view_of(ck_plan_ctx *c, const ck_entry *e, int *sliced)
{
    int dim = ck_slice_dim(c->slicing, e->name, e->name_len);
    *sliced = dim >= 0;
    if (dim < 0)
        return e;
    plan_view *v = malloc(sizeof *v + 2 * (size_t)(e->rank ? e->rank : 1) * sizeof *v->dims);
    if (!v)
        return ck_fail(c->err, ck_index_source(c->ix), "out of memory"), NULL;
    if (ck_slice_entry(c->ix, e, dim, c->slicing, &v->e, v->dims, c->err) != 0) {
        free(v);
        c->refused = 1;
        return NULL;
    }
    return &v->e;
}

/* Tensor e, whose bytes are pack blob b (src says where they come from), joins the plan; the
 * blob joins at its first tensor, so blobs come in the order their first selected tensor does.
 * picked maps a pack blob to its plan blob + 1, and a sliced tensor's part to the last plan
 * blob made of a part of b (tied tensors cut alike share it). Each blob's count is its number
 * of tensors. 0, or -1 with err set (a slice refused: c->refused; out of memory). */
static int add_tensor(ck_plan *p, const ck_entry *e, uint32_t b, ck_plan_blob src,
                      ck_plan_ctx *c)
{
    int sliced;
    const ck_entry *v = view_of(c, e, &sliced);
    if (!v)
        return -1;
    if (!sliced && c->slicing && c->slicing->parts_only)
        return 0;
    uint32_t blob = CK_PLAN_NONE, *picked = sliced ? &c->picked_part[b] : &c->picked[b];
    p->tensors[p->ntensors++] =
        (ck_plan_tensor){.entry = v, .whole = e, .blob = blob, .sliced = sliced};
    if (v->nbytes == 0)
        return 0;
    if (sliced && (!*picked || !same_view(&p->blobs[*picked - 1], v))) {
        src = (ck_plan_blob){.file_off = v->ext.offset, .len = v->nbytes, .file = v->ext.file,
                             .gather = v->layout != CK_CONTIGUOUS ? v : NULL, .sliced = 1};
        *picked = 0;
    }
    if (!*picked) {
        src.pack_blob = sliced ? CK_PLAN_NONE : b;
        src.name = e->name;
        src.owner = CK_PLAN_EVERY;
        p->blobs[p->nblobs] = src;
        *picked = (uint32_t)++p->nblobs;
    }
    blob = *picked - 1;
    p->blobs[blob].count++;
    p->tensors[p->ntensors - 1].blob = blob;
    return 0;
}

/* A pack: its blobs as its layout says, in file order (the pack numbers its blobs by first use
 * and lays them out by number). */
static int pick_pack(ck_plan *p, const pack_layout *pl, const char *only,
                     const unsigned char *keep, ck_plan_ctx *c)
{
    for (uint32_t k = 0; k < pl->nentries; k++) {
        const ck_entry *e = &c->ix->entries[pl->first_entry + k];
        if (!selected(c->ix, e, only, keep))
            continue;
        const pack_blob *pb = &pl->blobs[pl->entry_blob[k]];
        if (add_tensor(p, e, pl->entry_blob[k],
                       (ck_plan_blob){.file_off = pb->offset, .len = pb->length,
                                      .file = pl->file},
                       c) != 0)
            return -1;
    }
    return 0;
}

/* Any other source: the virtual pack's grouping (synth.h); a blob's bytes are one extent of a
 * source file, or a strided tensor gathered through ck_entry_read. */
static int pick_groups(ck_plan *p, const ck_pack_groups *g, ck_plan_ctx *c)
{
    const ck_index *ix = c->ix;
    for (uint32_t k = 0; k < g->ntensors; k++) {
        const ck_entry *s = &ix->entries[g->blob_entry[g->blob_of[k]]];
        if (add_tensor(p, &ix->entries[g->tensors[k]], g->blob_of[k],
                       (ck_plan_blob){.file_off = s->ext.offset, .len = s->nbytes,
                                      .file = s->ext.file,
                                      .gather = s->layout != CK_CONTIGUOUS ? s : NULL},
                       c) != 0)
            return -1;
    }
    return 0;
}

/* Each blob's slice of blob_tensors, from the counts add_tensor made (group() fills them). */
static void slice(ck_plan *p)
{
    uint32_t first = 0;
    for (size_t b = 0; b < p->nblobs; b++) {
        ck_plan_blob *pb = &p->blobs[b];
        pb->first = first;
        first += pb->count;
        pb->count = 0; /* counted again as group() fills the slice */
    }
}

/* The largest element of blob pb's tensors, in bytes (1 for the types stored in blocks of
 * several elements: sub-byte floats, ggml's quantized blocks): the alignment its address needs
 * for each of them to be aligned to its own element. */
static uint64_t element_align(const ck_plan *p, const ck_plan_blob *pb)
{
    uint64_t a = 1;
    for (uint32_t k = 0; k < pb->count; k++) {
        enum ck_dtype dt = p->tensors[p->blob_tensors[pb->first + k]].entry->dtype;
        uint64_t bytes = ck_dtype_block_elems(dt) == 1 ? ck_dtype_block_bytes(dt) : 1;
        a = bytes > a ? bytes : a;
    }
    return a;
}

/* Whether blob pb keeps its file offset's phase modulo phase[file] (ck_plan_keep_phase). */
static int keeps_phase(const ck_plan *p, const ck_plan_blob *pb, const uint32_t *phase)
{
    uint64_t m = phase ? phase[pb->file] : 0;
    return m && !pb->gather && pb->len >= CK_PLAN_PHASE_MIN * m &&
           pb->file_off % element_align(p, pb) == 0;
}

/* Each blob after the one before: at the next CK_PLAN_ALIGN boundary, or, where it keeps its
 * phase, at the first place with its file offset's phase (m a power of two); a blob that goes
 * elsewhere takes no room. */
static void place(ck_plan *p, const uint32_t *phase)
{
    p->block_size = 0;
    for (size_t b = 0; b < p->nblobs; b++) {
        ck_plan_blob *pb = &p->blobs[b];
        uint64_t end = p->block_size;
        if (pb->elsewhere) {
            pb->dest_off = 0;
            continue;
        }
        pb->dest_off = keeps_phase(p, pb, phase)
                           ? end + ((pb->file_off - end) & (phase[pb->file] - 1))
                           : ck_align_up(end, CK_PLAN_ALIGN);
        p->block_size = pb->dest_off + pb->len;
    }
}

static void group(ck_plan *p)
{
    for (size_t t = 0; t < p->ntensors; t++) {
        uint32_t b = p->tensors[t].blob;
        if (b != CK_PLAN_NONE) {
            ck_plan_blob *pb = &p->blobs[b];
            p->blob_tensors[pb->first + pb->count++] = (uint32_t)t;
        }
    }
}

/* A plan with room for nt tensors and nb blobs, or NULL. */
static ck_plan *plan_new(size_t nt, size_t nb)
{
    ck_plan *p = calloc(1, sizeof *p);
    if (p) {
        p->tensors = malloc((nt ? nt : 1) * sizeof *p->tensors);
        p->blobs = calloc(nb ? nb : 1, sizeof *p->blobs);
        p->blob_tensors = malloc((nt ? nt : 1) * sizeof *p->blob_tensors);
    }
    if (p && (!p->tensors || !p->blobs || !p->blob_tensors)) {
        ck_plan_free(p);
        p = NULL;
    }
    return p;
}

/* The plan's picks so far (add_tensor), per pack blob, with nb of them: zeroed. NULL when
 * memory runs out. */
static uint32_t *picks_new(size_t nb)
{
    return calloc(2 * (nb + 1), sizeof(uint32_t));
}

/* The blobs a plan of nt tensors from nb pack blobs may need: never more than its tensors (a
 * blob needs one); a sliced tensor may need a blob of its own, beside its whole tied twin's. */
static size_t blob_room(const ck_plan_ctx *c, size_t nt, size_t nb)
{
    return c->slicing || nt < nb ? nt : nb;
}

static int plan_pack(const pack_layout *pl, const char *only, const unsigned char *keep,
                     ck_plan **out, ck_plan_ctx *c)
{
    const ck_index *ix = c->ix;
    size_t nt = 0;
    for (uint32_t k = 0; k < pl->nentries; k++)
        nt += (size_t)selected(ix, &ix->entries[pl->first_entry + k], only, keep);
    ck_plan *p = plan_new(nt, blob_room(c, nt, pl->nblobs));
    c->picked = picks_new(pl->nblobs);
    c->picked_part = c->picked ? c->picked + pl->nblobs + 1 : NULL;
    int rc = p && c->picked ? 0 : ck_fail(c->err, ck_index_source(ix), "out of memory");
    if (rc == 0) {
        p->stored_sums = 1;
        rc = pick_pack(p, pl, only, keep, c);
    }
    free(c->picked);
    if (rc != 0) {
        ck_plan_free(p);
        return -1;
    }
    *out = p;
    return 0;
}

static int plan_source(const char *only, const unsigned char *keep, ck_plan **out,
                       ck_plan_ctx *c)
{
    ck_pack_groups g;
    if (ck_synth_groups(c->ix, only, keep, &g, c->err) != 0)
        return -1;
    ck_plan *p = plan_new(g.ntensors, blob_room(c, g.ntensors, g.nblobs));
    c->picked = picks_new(g.nblobs);
    c->picked_part = c->picked ? c->picked + g.nblobs + 1 : NULL;
    int rc = p && c->picked ? pick_groups(p, &g, c)
                            : ck_fail(c->err, ck_index_source(c->ix), "out of memory");
    free(c->picked);
    ck_pack_groups_free(&g);
    if (rc != 0) {
        ck_plan_free(p);
        return -1;
    }
    *out = p;
    return 0;
}

int ck_plan_selects(const ck_index *ix, const char *only, const unsigned char *keep)
{
    for (size_t i = 0; i < ix->nentries; i++)
        if (selected(ix, &ix->entries[i], only, keep))
            return 1;
    return 0;
}

int ck_plan_make_sliced(const ck_index *ix, const char *only, const unsigned char *keep,
                        const ck_slicing *slicing, ck_plan **out, ck_error *err)
{
    *out = NULL;
    if (only && !ck_plan_selects(ix, only, keep))
        return ck_fail(err, ck_index_source(ix), "--only '%s' selects nothing", only),
               CK_PLAN_REFUSED;
    ck_plan_ctx c = {.ix = ix,
                     .slicing = slicing && (slicing->nrules || slicing->parts_only) ? slicing
                                                                                   : NULL,
                     .err = err};
    const pack_layout *pl = pack_of(ix);
    if ((pl ? plan_pack(pl, only, keep, out, &c) : plan_source(only, keep, out, &c)) != 0)
        return c.refused ? CK_PLAN_REFUSED : -1;
    slice(*out);
    group(*out);
    place(*out, NULL);
    return 0;
}

int ck_plan_make(const ck_index *ix, const char *only, const unsigned char *keep, ck_plan **out,
                 ck_error *err)
{
    return ck_plan_make_sliced(ix, only, keep, NULL, out, err);
}

int ck_plan_share(ck_plan *p, enum ck_plan_read read, unsigned world)
{
    uint64_t *load = read == CK_READ_BALANCED ? calloc(world ? world : 1, sizeof *load) : NULL;
    if (read == CK_READ_BALANCED && !load)
        return -1;
    for (size_t b = 0; b < p->nblobs; b++) {
        ck_plan_blob *bl = &p->blobs[b];
        if (read == CK_READ_ALL || (read == CK_READ_BALANCED && bl->sliced)) {
            bl->owner = CK_PLAN_EVERY; /* each rank reads its own part */
        } else if (read == CK_READ_RANK0) {
            bl->owner = 0;
        } else { /* the rank that has read least so far: each ends under 1/world + one blob */
            unsigned least = 0;
            for (unsigned r = 1; r < world; r++)
                least = load[r] < load[least] ? r : least;
            bl->owner = least;
            load[least] += bl->len;
        }
    }
    free(load);
    return 0;
}

void ck_plan_keep_phase(ck_plan *p, const uint32_t *phase)
{
    place(p, phase);
}

int ck_plan_sums(const ck_index *ix, const ck_plan *p, uint64_t *sums, ck_error *err)
{
    const pack_layout *pl = pack_of(ix);
    if (!pl)
        return ck_fail(err, ck_index_source(ix), "not a pack (it is %s)", ix->format);
    uint64_t *all = malloc(((size_t)pl->nblobs + 1) * sizeof *all);
    int rc = all ? pack_read_trailer(ix, pl->file, pl->nblobs, all) : -ENOMEM;
    for (size_t b = 0; rc == 0 && b < p->nblobs; b++)
        sums[b] = p->blobs[b].pack_blob == CK_PLAN_NONE ? 0 : all[p->blobs[b].pack_blob];
    free(all);
    if (rc == -EBADMSG)
        return ck_fail(err, ck_index_source(ix), "the checksum table is corrupt");
    if (rc == -ENOMEM)
        return ck_fail(err, ck_index_source(ix), "out of memory");
    if (rc)
        return ck_fail(err, ck_index_source(ix), "cannot read the checksum table: %s", strerror(-rc));
    return 0;
}
