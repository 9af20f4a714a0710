/* fuzz_plan.c — a load plan (ck_plan_make) of a pack, for every tensor and for a selection.
 *
 * The input is one selector byte, then a pack (its index checksum fixed up, as for
 * fuzz_packfile). A pack the reader accepts is planned twice: with no `only`, and with one the
 * selector derives from an entry's name (0: none; odd: the name up to its first '.', a prefix;
 * even: the name with its last byte turned into '*', a glob). Every plan must keep the promises
 * of plan.h against the index and the layout: blobs inside the data region and in file order,
 * each tensor's blob holding exactly its bytes, block places aligned and apart, and the tensors
 * of each blob listed once, under it; and again with blobs keeping their file phase (a modulus of
 * 512 to 4096 bytes, from the selector byte). */
#include "../base/names.h"
#include "../formats/packfile.h"
#include "../loader/plan.h"
#include "../checkpoint/synth.h"
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>

static void check_blobs(const ck_index *ix, const pack_layout *pl, const ck_plan *p)
{
    uint64_t dest_end = 0, file_end = pl->header.data_offset;
    for (size_t b = 0; b < p->nblobs; b++) {
        const ck_plan_blob *pb = &p->blobs[b];
        FUZZ_REQUIRE(pb->file == pl->file && pb->pack_blob < pl->nblobs);
        FUZZ_REQUIRE(b == 0 || pb->pack_blob > p->blobs[b - 1].pack_blob);
        FUZZ_REQUIRE(pb->file_off == pl->blobs[pb->pack_blob].offset);
        FUZZ_REQUIRE(pb->len == pl->blobs[pb->pack_blob].length && pb->len > 0);
        FUZZ_REQUIRE(pb->file_off >= file_end);
        FUZZ_REQUIRE(pb->file_off + pb->len <= pl->header.checksum_offset);
        FUZZ_REQUIRE(pl->header.checksum_offset <= ix->files[pb->file].size);
        FUZZ_REQUIRE(pb->dest_off % CK_PLAN_ALIGN == 0 && pb->dest_off >= dest_end);
        FUZZ_REQUIRE(pb->dest_off - dest_end < CK_PLAN_ALIGN);
        file_end = pb->file_off + pb->len;
        dest_end = pb->dest_off + pb->len;
        FUZZ_REQUIRE(pb->count > 0);
        FUZZ_REQUIRE(b == 0 || pb->first == p->blobs[b - 1].first + p->blobs[b - 1].count);
        FUZZ_REQUIRE(pb->name == p->tensors[p->blob_tensors[pb->first]].entry->name);
        for (uint32_t k = 0; k < pb->count; k++) {
            uint32_t t = p->blob_tensors[pb->first + k];
            FUZZ_REQUIRE(t < p->ntensors && p->tensors[t].blob == b);
            FUZZ_REQUIRE(k == 0 || t > p->blob_tensors[pb->first + k - 1]);
        }
    }
    FUZZ_REQUIRE(p->block_size == dest_end);
}

static void check_plan(const ck_index *ix, const pack_layout *pl, const ck_plan *p,
                       const char *only)
{
    size_t listed = 0;
    const ck_entry *prev = NULL;
    for (size_t t = 0; t < p->ntensors; t++) {
        const ck_plan_tensor *pt = &p->tensors[t];
        const ck_entry *e = pt->entry;
        size_t i = (size_t)(e - ix->entries);
        FUZZ_REQUIRE(i >= pl->first_entry && i - pl->first_entry < pl->nentries);
        FUZZ_REQUIRE(prev == NULL || e > prev);
        FUZZ_REQUIRE(e->kind == CK_TENSOR && ck_name_selected(e->name, e->name_len, only));
        prev = e;
        if (e->nbytes == 0) {
            FUZZ_REQUIRE(pt->blob == CK_PLAN_NONE);
            continue;
        }
        /* The blob covers exactly the tensor's bytes, where the index says they are. */
        FUZZ_REQUIRE(pt->blob < p->nblobs);
        const ck_plan_blob *pb = &p->blobs[pt->blob];
        FUZZ_REQUIRE(pb->file == e->ext.file && pb->file_off == e->ext.offset);
        FUZZ_REQUIRE(pb->len == e->nbytes);
        FUZZ_REQUIRE(pb->pack_blob == pl->entry_blob[i - pl->first_entry]);
        listed++;
    }
    /* Every selected tensor is planned. */
    size_t want = 0;
    for (uint32_t k = 0; k < pl->nentries; k++) {
        const ck_entry *e = &ix->entries[pl->first_entry + k];
        want += e->kind == CK_TENSOR && ck_name_selected(e->name, e->name_len, only);
    }
    FUZZ_REQUIRE(want == p->ntensors);
    size_t counted = 0;
    for (size_t b = 0; b < p->nblobs; b++)
        counted += p->blobs[b].count;
    FUZZ_REQUIRE(counted == listed);
    check_blobs(ix, pl, p);
}

/* The plan again with blobs kept in their file phase modulo m (ck_plan_keep_phase): blobs in
 * order and apart, each in phase (padded by less than m) or on the next 256-byte boundary; a
 * whole pack's blobs where they were. */
static void check_kept_phase(ck_plan *p, uint32_t m, int whole)
{
    uint64_t *was = malloc((p->nblobs ? p->nblobs : 1) * sizeof *was);
    FUZZ_REQUIRE(was != NULL);
    for (size_t b = 0; b < p->nblobs; b++)
        was[b] = p->blobs[b].dest_off;
    ck_plan_keep_phase(p, &m);
    uint64_t end = 0;
    for (size_t b = 0; b < p->nblobs; b++) {
        const ck_plan_blob *pb = &p->blobs[b];
        FUZZ_REQUIRE(pb->dest_off >= end);
        int kept = (pb->dest_off - pb->file_off) % m == 0 && pb->dest_off - end < m &&
                   pb->len >= CK_PLAN_PHASE_MIN * m;
        FUZZ_REQUIRE(kept || (pb->dest_off % CK_PLAN_ALIGN == 0 &&
                              pb->dest_off - end < CK_PLAN_ALIGN));
        FUZZ_REQUIRE(!whole || pb->dest_off == was[b]);
        end = pb->dest_off + pb->len;
    }
    FUZZ_REQUIRE(p->block_size == end);
    free(was);
}

static void plan_and_check(const ck_index *ix, const char *only, uint32_t m)
{
    const pack_layout *pl = pack_layout_of(ix, 0);
    ck_plan *p = NULL;
    ck_error err = {{0}};
    int rc = ck_plan_make(ix, only, NULL, &p, &err);
    fuzz_check(rc, NULL, &err);
    FUZZ_REQUIRE((rc == 0) == (p != NULL));
    if (!p)
        return;
    check_plan(ix, pl, p, only);
    check_kept_phase(p, m, only == NULL);
    uint64_t *sums = malloc((p->nblobs ? p->nblobs : 1) * sizeof *sums);
    FUZZ_REQUIRE(sums != NULL);
    fuzz_check(ck_plan_sums(ix, p, sums, &err), NULL, &err);
    free(sums);
    ck_plan_free(p);
}

/* The `only` the selector byte picks from ix's names, into buf; NULL for none. */
static const char *pick_only(const ck_index *ix, uint8_t sel, char *buf, size_t cap)
{
    if (sel == 0 || ix->nentries == 0)
        return NULL;
    const ck_entry *e = &ix->entries[(sel >> 1) % ix->nentries];
    size_t n = e->name_len < cap - 1 ? e->name_len : cap - 1;
    memcpy(buf, e->name, n);
    buf[n] = 0;
    if (sel & 1) {
        char *dot = strchr(buf, '.');
        if (dot)
            *dot = 0;
    } else if (n > 0) {
        buf[n - 1] = '*';
    }
    return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    uint8_t *copy = malloc(size - 1 ? size - 1 : 1);
    FUZZ_REQUIRE(copy != NULL);
    memcpy(copy, data + 1, size - 1);
    fuzz_fix_pack_xxh3(copy, size - 1);
    ck_error err = {{0}};
    ck_index *ix = fuzz_index(copy, size - 1);
    int rc = pack_read_file(ix, 0, &err);
    fuzz_check(rc, ix, &err);
    FUZZ_REQUIRE((rc == 0) == (pack_layout_of(ix, 0) != NULL));
    if (rc == 0) {
        char only[256];
        ix->format = "pack";
        uint32_t m = 512u << (data[0] % 4); /* 512 to 4096: what statx says of disks */
        plan_and_check(ix, NULL, m);
        plan_and_check(ix, pick_only(ix, data[0], only, sizeof only), m);
    }
    ck_index_free(ix);
    free(copy);
    return 0;
}
