/* plan.c — a load's plan: from a pack's checked layout, or from the virtual pack's grouping of
 * any other source (see plan.h). */
#include "plan.h"
#include "bytes.h"
#include "dtype.h"
#include "packfile.h"
#include "synth.h"

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
    free(p->tensors);
    free(p->blobs);
    free(p->blob_tensors);
    free(p);
}

static int selected(const ck_index *ix, const ck_entry *e, const char *only,
                    const unsigned char *keep)
{
    return e->kind == CK_TENSOR && ck_name_selected(e->name, e->name_len, only) &&
           (!keep || keep[e - ix->entries]);
}

/* Tensor e, whose bytes are pack blob b (src says where they come from), joins the plan; the
 * blob joins at its first tensor, so blobs come in the order their first selected tensor does.
 * picked maps a pack blob to its plan blob + 1. Each blob's count is its number of tensors. */
static void add_tensor(ck_plan *p, const ck_entry *e, uint32_t b, ck_plan_blob src,
                       uint32_t *picked)
{
    uint32_t blob = CK_PLAN_NONE;
    if (e->nbytes > 0) {
        if (!picked[b]) {
            src.pack_blob = b;
            src.name = e->name;
            p->blobs[p->nblobs] = src;
            picked[b] = (uint32_t)++p->nblobs;
        }
        blob = picked[b] - 1;
        p->blobs[blob].count++;
    }
    p->tensors[p->ntensors++] = (ck_plan_tensor){.entry = e, .blob = blob};
}

/* A pack: its blobs as its layout says, in file order (the pack numbers its blobs by first use
 * and lays them out by number). */
static void pick_pack(ck_plan *p, const ck_index *ix, const pack_layout *pl, const char *only,
                      const unsigned char *keep, uint32_t *picked)
{
    for (uint32_t k = 0; k < pl->nentries; k++) {
        const ck_entry *e = &ix->entries[pl->first_entry + k];
        if (!selected(ix, e, only, keep))
            continue;
        const pack_blob *pb = &pl->blobs[pl->entry_blob[k]];
        add_tensor(p, e, pl->entry_blob[k],
                   (ck_plan_blob){.file_off = pb->offset, .len = pb->length, .file = pl->file},
                   picked);
    }
}

/* Any other source: the virtual pack's grouping (synth.h); a blob's bytes are one extent of a
 * source file, or a strided tensor gathered through ck_entry_read. */
static void pick_groups(ck_plan *p, const ck_index *ix, const ck_pack_groups *g,
                        uint32_t *picked)
{
    for (uint32_t k = 0; k < g->ntensors; k++) {
        const ck_entry *s = &ix->entries[g->blob_entry[g->blob_of[k]]];
        add_tensor(p, &ix->entries[g->tensors[k]], g->blob_of[k],
                   (ck_plan_blob){.file_off = s->ext.offset, .len = s->nbytes, .file = s->ext.file,
                                  .gather = s->layout != CK_CONTIGUOUS ? s : NULL},
                   picked);
    }
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
 * phase, at the first place with its file offset's phase (m a power of two). */
static void place(ck_plan *p, const uint32_t *phase)
{
    p->block_size = 0;
    for (size_t b = 0; b < p->nblobs; b++) {
        ck_plan_blob *pb = &p->blobs[b];
        uint64_t end = p->block_size;
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

static int plan_pack(const ck_index *ix, const pack_layout *pl, const char *only,
                     const unsigned char *keep, ck_plan **out, ck_error *err)
{
    size_t nt = 0;
    for (uint32_t k = 0; k < pl->nentries; k++)
        nt += (size_t)selected(ix, &ix->entries[pl->first_entry + k], only, keep);
    if (nt == 0 && only)
        return ck_fail(err, ck_index_source(ix), "--only '%s' selects nothing", only);
    /* A blob needs a tensor: never more blobs than tensors. */
    ck_plan *p = plan_new(nt, nt < pl->nblobs ? nt : pl->nblobs);
    uint32_t *picked = calloc((size_t)pl->nblobs + 1, sizeof *picked);
    if (!p || !picked) {
        free(picked);
        ck_plan_free(p);
        return ck_fail(err, ck_index_source(ix), "out of memory");
    }
    p->stored_sums = 1;
    pick_pack(p, ix, pl, only, keep, picked);
    free(picked);
    *out = p;
    return 0;
}

static int plan_source(const ck_index *ix, const char *only, const unsigned char *keep,
                       ck_plan **out, ck_error *err)
{
    ck_pack_groups g;
    if (ck_synth_groups(ix, only, keep, &g, err) != 0)
        return -1;
    ck_plan *p = plan_new(g.ntensors, g.nblobs);
    uint32_t *picked = calloc((size_t)g.nblobs + 1, sizeof *picked);
    if (p && picked)
        pick_groups(p, ix, &g, picked);
    free(picked);
    ck_pack_groups_free(&g);
    if (!p || !picked) {
        ck_plan_free(p);
        return ck_fail(err, ck_index_source(ix), "out of memory");
    }
    *out = p;
    return 0;
}

int ck_plan_make(const ck_index *ix, const char *only, const unsigned char *keep, ck_plan **out,
                 ck_error *err)
{
    *out = NULL;
    const pack_layout *pl = pack_of(ix);
    if ((pl ? plan_pack(ix, pl, only, keep, out, err) : plan_source(ix, only, keep, out, err)) != 0)
        return -1;
    slice(*out);
    group(*out);
    place(*out, NULL);
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
        sums[b] = all[p->blobs[b].pack_blob];
    free(all);
    if (rc == -EBADMSG)
        return ck_fail(err, ck_index_source(ix), "the checksum table is corrupt");
    if (rc == -ENOMEM)
        return ck_fail(err, ck_index_source(ix), "out of memory");
    if (rc)
        return ck_fail(err, ck_index_source(ix), "cannot read the checksum table: %s", strerror(-rc));
    return 0;
}
