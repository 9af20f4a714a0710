/* plan.c — a load's plan from the pack's checked layout (see plan.h). */
#include "plan.h"
#include "bytes.h"
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

static int selected(const ck_entry *e, const char *only)
{
    return e->kind == CK_TENSOR && ck_name_selected(e->name, e->name_len, only);
}

/* Tensors in pack order; blobs in the order their first selected tensor comes, which is file
 * order, since the pack numbers its blobs by first use and lays them out by number. picked maps
 * a pack blob to its plan blob + 1. Each blob's count is its number of tensors. */
static void pick(ck_plan *p, const ck_index *ix, const pack_layout *pl, const char *only,
                 uint32_t *picked)
{
    for (uint32_t k = 0; k < pl->nentries; k++) {
        const ck_entry *e = &ix->entries[pl->first_entry + k];
        if (!selected(e, only))
            continue;
        uint32_t b = pl->entry_blob[k], blob = CK_PLAN_NONE;
        if (e->nbytes > 0) {
            if (!picked[b]) {
                const pack_blob *pb = &pl->blobs[b];
                p->blobs[p->nblobs] = (ck_plan_blob){.file_off = pb->offset, .len = pb->length,
                                                     .file = pl->file, .pack_blob = b,
                                                     .name = e->name};
                picked[b] = (uint32_t)++p->nblobs;
            }
            blob = picked[b] - 1;
            p->blobs[blob].count++;
        }
        p->tensors[p->ntensors++] = (ck_plan_tensor){.entry = e, .blob = blob};
    }
}

/* Each blob at the next CK_PLAN_ALIGN boundary of the block, and its slice of blob_tensors. */
static void place(ck_plan *p)
{
    uint32_t first = 0;
    for (size_t b = 0; b < p->nblobs; b++) {
        ck_plan_blob *pb = &p->blobs[b];
        pb->dest_off = ck_align_up(p->block_size, CK_PLAN_ALIGN);
        p->block_size = pb->dest_off + pb->len;
        pb->first = first;
        first += pb->count;
        pb->count = 0; /* counted again as group() fills the slice */
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

int ck_plan_make(const ck_index *ix, const char *only, ck_plan **out, ck_error *err)
{
    *out = NULL;
    const pack_layout *pl = pack_of(ix);
    if (!pl)
        return ck_fail(err, ck_index_source(ix), "not a pack (it is %s)", ix->format);
    size_t nt = 0;
    for (uint32_t k = 0; k < pl->nentries; k++)
        nt += (size_t)selected(&ix->entries[pl->first_entry + k], only);
    if (nt == 0 && only)
        return ck_fail(err, ck_index_source(ix), "--only '%s' selects nothing", only);
    /* A blob needs a tensor: never more blobs than tensors. */
    size_t nb = nt < pl->nblobs ? nt : pl->nblobs;
    ck_plan *p = calloc(1, sizeof *p);
    uint32_t *picked = calloc((size_t)pl->nblobs + 1, sizeof *picked);
    if (p) {
        p->tensors = malloc((nt ? nt : 1) * sizeof *p->tensors);
        p->blobs = calloc(nb ? nb : 1, sizeof *p->blobs);
        p->blob_tensors = malloc((nt ? nt : 1) * sizeof *p->blob_tensors);
    }
    if (!p || !picked || !p->tensors || !p->blobs || !p->blob_tensors) {
        free(picked);
        ck_plan_free(p);
        return ck_fail(err, ck_index_source(ix), "out of memory");
    }
    pick(p, ix, pl, only, picked);
    free(picked);
    place(p);
    group(p);
    *out = p;
    return 0;
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
