/* The load plan (plan.h) over packs built byte by byte by the helpers: which tensors,
 * which blobs, where in the block, the tensors of each blob, the stored sums, and the errors;
 * and over other sources, whose plan must be the plan of their virtual pack (synth.h). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "../../base/bytes.h"
#include "../../loader/plan.h"
#include "../../checkpoint/synth.h"
#include "helpers.h"

TestSuite(plan, .fini = tmp_cleanup);

/* a F32[4] (blob 0), b.empty F32[0] (blob 1, empty), c U8[300] (blob 2), d.tied F32[4] (blob
 * 0 again), e a value, f I16[3] (blob 3). */
static unsigned char data_a[16], data_c[300], data_f[6];

static const char *sample_pack(uint64_t *data_offset, pk_blob blobs[4])
{
    fill_bytes(data_a, sizeof data_a, 1);
    fill_bytes(data_c, sizeof data_c, 2);
    fill_bytes(data_f, sizeof data_f, 3);
    blobs[0] = (pk_blob){.data = data_a, .length = 16};
    blobs[1] = (pk_blob){.length = 0};
    blobs[2] = (pk_blob){.data = data_c, .length = 300};
    blobs[3] = (pk_blob){.data = data_f, .length = 6};
    pk_place(blobs, 4);
    bytebuf ix = {0};
    pk_counts(&ix, 6, 4, 1, 0);
    pk_meta(&ix, "ckptfs.source_format", "safetensors");
    pk_blobs(&ix, blobs, 4);
    pk_tensor(&ix, "a", CK_F32, 1, (int64_t[]){4}, 0);
    pk_tensor(&ix, "b.empty", CK_F32, 1, (int64_t[]){0}, 1);
    pk_tensor(&ix, "c", CK_U8, 1, (int64_t[]){300}, 2);
    pk_tensor(&ix, "d.tied", CK_F32, 2, (int64_t[]){2, 2}, 0);
    pk_value(&ix, "e", CK_VAL_INT, "7", 1);
    pk_tensor(&ix, "f", CK_I16, 1, (int64_t[]){3}, 3);
    *data_offset = (64 + ix.len + 4095) / 4096 * 4096;
    const char *path = pk_file(&ix, blobs, 4);
    free(ix.p);
    return path;
}

static ck_plan *plan_ok(const ck_index *ix, const char *only)
{
    ck_plan *p = NULL;
    ck_error err = {""};
    cr_assert_eq(ck_plan_make(ix, only, NULL, &p, &err), 0, "%s", err.msg);
    cr_assert_not_null(p);
    return p;
}

static void plan_fails(const ck_index *ix, const char *only, const char *what)
{
    ck_plan *p = (ck_plan *)&p;
    ck_error err = {""};
    cr_assert_eq(ck_plan_make(ix, only, NULL, &p, &err), CK_PLAN_REFUSED); /* the caller's */
    cr_assert_null(p);
    assert_error(&err, ix->files[0].path, what);
}

/* The tensors of blob b, as the plan lists them. */
static void assert_blob_tensors(const ck_plan *p, size_t b, const uint32_t *want, uint32_t n)
{
    cr_assert_eq(p->blobs[b].count, n, "blob %zu has %u tensors", b, p->blobs[b].count);
    for (uint32_t k = 0; k < n; k++)
        cr_assert_eq(p->blob_tensors[p->blobs[b].first + k], want[k], "blob %zu tensor %u", b, k);
}

/* Each planned blob's file bytes are its first tensor's bytes, read straight from the file. */
static void assert_bytes(const ck_index *ix, const ck_plan *p, const unsigned char *const *want)
{
    for (size_t b = 0; b < p->nblobs; b++) {
        unsigned char got[300];
        cr_assert_leq(p->blobs[b].len, sizeof got);
        cr_assert_eq(ck_pread(ix->files[p->blobs[b].file].fd, got, p->blobs[b].len,
                              p->blobs[b].file_off), 0);
        cr_assert_eq(memcmp(got, want[b], p->blobs[b].len), 0, "blob %zu", b);
    }
}

Test(plan, every_tensor)
{
    uint64_t data_offset;
    pk_blob blobs[4];
    ck_index *ix = open_ok(sample_pack(&data_offset, blobs));
    ck_plan *p = plan_ok(ix, NULL);
    /* The tensors in pack order, without the value. */
    static const char *const names[] = {"a", "b.empty", "c", "d.tied", "f"};
    static const uint32_t blob[] = {0, CK_PLAN_NONE, 1, 0, 2};
    cr_assert_eq(p->ntensors, 5);
    for (size_t t = 0; t < 5; t++) {
        cr_assert_str_eq(p->tensors[t].entry->name, names[t]);
        cr_assert_eq(p->tensors[t].blob, blob[t], "%s", names[t]);
    }
    /* The blobs with bytes, in file order, packed at 256-byte boundaries. */
    cr_assert_eq(p->nblobs, 3);
    static const uint32_t pack_blob[] = {0, 2, 3};
    static const uint64_t dest[] = {0, 256, 768};
    static const char *const first[] = {"a", "c", "f"};
    for (size_t b = 0; b < 3; b++) {
        const ck_plan_blob *pb = &p->blobs[b];
        cr_assert_eq(pb->pack_blob, pack_blob[b]);
        cr_assert_eq(pb->file, 0);
        cr_assert_eq(pb->file_off, data_offset + blobs[pack_blob[b]].offset);
        cr_assert_eq(pb->len, blobs[pack_blob[b]].length);
        cr_assert_eq(pb->dest_off, dest[b]);
        cr_assert_str_eq(pb->name, first[b]);
    }
    cr_assert_eq(p->block_size, 768 + 6);
    /* Tied tensors share their blob; the empty one is in none. */
    assert_blob_tensors(p, 0, (uint32_t[]){0, 3}, 2);
    assert_blob_tensors(p, 1, (uint32_t[]){2}, 1);
    assert_blob_tensors(p, 2, (uint32_t[]){4}, 1);
    assert_bytes(ix, p, (const unsigned char *[]){data_a, data_c, data_f});
    ck_plan_free(p);
    ck_index_free(ix);
}

Test(plan, only_a_prefix_or_a_glob)
{
    uint64_t data_offset;
    pk_blob blobs[4];
    ck_index *ix = open_ok(sample_pack(&data_offset, blobs));
    /* One tensor: its blob alone, at the start of the block, still the pack's blob 2. */
    ck_plan *p = plan_ok(ix, "c");
    cr_assert_eq(p->ntensors, 1);
    cr_assert_str_eq(p->tensors[0].entry->name, "c");
    cr_assert_eq(p->tensors[0].blob, 0);
    cr_assert_eq(p->nblobs, 1);
    cr_assert_eq(p->blobs[0].pack_blob, 2);
    cr_assert_eq(p->blobs[0].file_off, data_offset + 256);
    cr_assert_eq(p->blobs[0].dest_off, 0);
    cr_assert_eq(p->block_size, 300);
    assert_blob_tensors(p, 0, (uint32_t[]){0}, 1);
    ck_plan_free(p);
    /* The second of two tied tensors: its blob is named after it. */
    p = plan_ok(ix, "d*");
    cr_assert_eq(p->ntensors, 1);
    cr_assert_eq(p->nblobs, 1);
    cr_assert_eq(p->blobs[0].pack_blob, 0);
    cr_assert_str_eq(p->blobs[0].name, "d.tied");
    cr_assert_eq(p->block_size, 16);
    assert_bytes(ix, p, (const unsigned char *[]){data_a});
    ck_plan_free(p);
    /* A prefix matches at a '.': "b" selects b.empty, which needs no blob. */
    p = plan_ok(ix, "b");
    cr_assert_eq(p->ntensors, 1);
    cr_assert_eq(p->tensors[0].blob, CK_PLAN_NONE);
    cr_assert_eq(p->nblobs, 0);
    cr_assert_eq(p->block_size, 0);
    ck_plan_free(p);
    /* Two blobs apart in the file sit side by side in the block. */
    p = plan_ok(ix, "[cf]");
    cr_assert_eq(p->nblobs, 2);
    cr_assert_eq(p->blobs[1].pack_blob, 3);
    cr_assert_eq(p->blobs[1].dest_off, 512);
    cr_assert_eq(p->block_size, 518);
    assert_bytes(ix, p, (const unsigned char *[]){data_c, data_f});
    ck_plan_free(p);
    ck_index_free(ix);
}

Test(plan, errors)
{
    uint64_t data_offset;
    pk_blob blobs[4];
    ck_index *ix = open_ok(sample_pack(&data_offset, blobs));
    plan_fails(ix, "zzz", "--only 'zzz' selects nothing");
    plan_fails(ix, "e", "--only 'e' selects nothing"); /* a value is not loaded */
    ck_index_free(ix);
    /* Any source is planned; only a pack has checksums to tell. */
    ix = open_ok(st_file("{}", NULL, 0));
    ck_plan *p = plan_ok(ix, NULL);
    cr_assert_eq(p->ntensors, 0);
    cr_assert_eq(p->stored_sums, 0);
    ck_error err = {""};
    cr_assert_eq(ck_plan_sums(ix, p, (uint64_t[1]){0}, &err), -1);
    assert_error(&err, ix->files[0].path, "not a pack (it is safetensors)");
    ck_plan_free(p);
    plan_fails(ix, "zzz", "--only 'zzz' selects nothing");
    ck_index_free(ix);
}

Test(plan, empty_pack)
{
    bytebuf b = {0};
    pk_counts(&b, 0, 0, 0, 0);
    ck_index *ix = open_ok(pk_file(&b, NULL, 0));
    free(b.p);
    ck_plan *p = plan_ok(ix, NULL);
    cr_assert_eq(p->ntensors, 0);
    cr_assert_eq(p->nblobs, 0);
    cr_assert_eq(p->block_size, 0);
    ck_plan_free(p);
    ck_index_free(ix);
}

Test(plan, stored_sums)
{
    uint64_t data_offset;
    pk_blob blobs[4];
    const char *path = sample_pack(&data_offset, blobs);
    ck_index *ix = open_ok(path);
    ck_plan *p = plan_ok(ix, "[cf]");
    uint64_t sums[2];
    ck_error err = {""};
    cr_assert_eq(ck_plan_sums(ix, p, sums, &err), 0, "%s", err.msg);
    cr_assert_eq(sums[0], XXH3_64bits(data_c, sizeof data_c));
    cr_assert_eq(sums[1], XXH3_64bits(data_f, sizeof data_f));
    ck_plan_free(p);
    ck_index_free(ix);
    /* A changed byte in the trailer: its own sum no longer matches. */
    size_t len;
    unsigned char *bytes = read_whole(path, &len);
    bytes[len - 9] ^= 1;
    tmp_rewrite(path, bytes, len);
    free(bytes);
    ix = open_ok(path);
    p = plan_ok(ix, NULL);
    cr_assert_eq(ck_plan_sums(ix, p, (uint64_t[3]){0}, &err), -1);
    assert_error(&err, path, "the checksum table is corrupt");
    ck_plan_free(p);
    ck_index_free(ix);
}

/* Blob b's bytes as the plan says to read them: gathered through its entry, or from its file. */
static unsigned char *blob_bytes(const ck_index *ix, const ck_plan_blob *b)
{
    unsigned char *got = malloc(b->len ? b->len : 1);
    if (b->gather)
        cr_assert_eq(ck_entry_read(ix, b->gather, got, b->len, 0), (ssize_t)b->len);
    else
        cr_assert_eq(ck_file_pread(ix, b->file, got, b->len, b->file_off), 0);
    return got;
}

/* ix's virtual pack of the tensors `only` selects, written to a file: its path. */
static const char *virtual_pack(const ck_index *ix, const char *only)
{
    ck_synth *sy;
    ck_error err = {""};
    cr_assert_eq(ck_synth_pack(ix, only, &sy, &err), 0, "%s", err.msg);
    const char *packed = tmp_file("", 0);
    FILE *f = fopen(packed, "wb");
    cr_assert_eq(ck_synth_write(sy, fileno(f), NULL, NULL), 0);
    fclose(f);
    ck_synth_free(sy);
    return packed;
}

/* The plan of src and the plan of its virtual pack written to a file (ck_synth_pack), both
 * with `only`: the same tensors in the same order, the same blobs (tied tensors sharing one) in
 * the same places of the block, with the same bytes. */
static void assert_planned_as_its_pack(const char *src, const char *only, size_t want_gathered)
{
    ck_index *ix = open_ok(src);
    ck_index *px = open_ok(virtual_pack(ix, only));
    ck_plan *p = plan_ok(ix, only), *q = plan_ok(px, only);
    cr_assert_eq(p->stored_sums, 0);
    cr_assert_eq(q->stored_sums, 1);
    cr_assert_eq(p->ntensors, q->ntensors);
    for (size_t t = 0; t < p->ntensors; t++) {
        cr_assert_str_eq(p->tensors[t].entry->name, q->tensors[t].entry->name);
        cr_assert_eq(p->tensors[t].blob, q->tensors[t].blob, "%s", p->tensors[t].entry->name);
    }
    cr_assert_eq(p->nblobs, q->nblobs);
    cr_assert_eq(p->block_size, q->block_size);
    size_t gathered = 0;
    for (size_t b = 0; b < p->nblobs; b++) {
        const ck_plan_blob *x = &p->blobs[b], *y = &q->blobs[b];
        cr_assert_eq(x->len, y->len);
        cr_assert_eq(x->dest_off, y->dest_off);
        cr_assert_eq(x->pack_blob, y->pack_blob);
        cr_assert_eq(x->count, y->count);
        cr_assert_eq(memcmp(&p->blob_tensors[x->first], &q->blob_tensors[y->first],
                            x->count * sizeof *p->blob_tensors), 0);
        unsigned char *a = blob_bytes(ix, x), *c = blob_bytes(px, y);
        cr_assert_eq(memcmp(a, c, x->len), 0, "blob %zu (%s)", b, x->name);
        free(a);
        free(c);
        gathered += x->gather != NULL;
    }
    cr_assert_eq(gathered, want_gathered);
    ck_plan_free(p);
    ck_plan_free(q);
    ck_index_free(px);
    ck_index_free(ix);
}

/* A PyTorch zip with a transposed and a sliced tensor (gathered), tied tensors (one blob),
 * an empty one, a value, and names whose natural order is not their byte order. */
static const char *torch_sample(void)
{
    const char *path = tmp_path_in(tmp_dir(), "m.pt");
    run_python("import sys, torch\n"
               "a = torch.arange(24, dtype=torch.float32).reshape(4, 6)\n"
               "torch.save({'w.t': a.t(), 'w.slice': a[:, 1:3], 'tied.0': a, 'tied.1': a,\n"
               "            'layers.10.x': torch.ones(3, dtype=torch.int16),\n"
               "            'layers.2.x': torch.zeros(5, dtype=torch.bfloat16),\n"
               "            'empty': torch.empty(0), 'step': 7}, sys.argv[1])\n",
               path, NULL);
    return path;
}

Test(plan, torch_source_is_planned_as_its_virtual_pack)
{
    const char *src = torch_sample();
    assert_planned_as_its_pack(src, NULL, 2);
    assert_planned_as_its_pack(src, "layers", 0);
    assert_planned_as_its_pack(src, "w.*", 2);
}

Test(plan, safetensors_source_is_planned_as_its_virtual_pack)
{
    unsigned char data[64];
    fill_bytes(data, sizeof data, 4);
    const char *src = st_file(strf("{%s,%s,%s}", st_tensor("b", "F32", "[4]", 0, 16),
                                   st_tensor("a.10", "U8", "[40]", 16, 56),
                                   st_tensor("a.2", "I16", "[4]", 56, 64)),
                              data, sizeof data);
    assert_planned_as_its_pack(src, NULL, 0);
    assert_planned_as_its_pack(src, "a", 0);
    ck_index *ix = open_ok(src);
    ck_plan *p = plan_ok(ix, NULL);
    cr_assert_str_eq(p->tensors[0].entry->name, "a.2");
    cr_assert_eq(p->blobs[0].file_off, ix->entries[2].ext.offset);
    ck_plan_free(p);
    ck_index_free(ix);
}

/* keep (one flag per entry: a mount's subtree) selects as well as only, for a pack and for any
 * other source alike. */
Test(plan, keep_selects_entries)
{
    uint64_t data_offset;
    pk_blob blobs[4];
    ck_index *ix = open_ok(sample_pack(&data_offset, blobs));
    unsigned char keep[6] = {0};
    keep[ck_index_find(ix, "d.tied") - ix->entries] = 1;
    keep[ck_index_find(ix, "f") - ix->entries] = 1;
    keep[ck_index_find(ix, "e") - ix->entries] = 1; /* a value: never loaded */
    ck_plan *p = NULL;
    ck_error err = {""};
    cr_assert_eq(ck_plan_make(ix, NULL, keep, &p, &err), 0, "%s", err.msg);
    cr_assert_eq(p->ntensors, 2);
    cr_assert_str_eq(p->tensors[0].entry->name, "d.tied");
    cr_assert_str_eq(p->tensors[1].entry->name, "f");
    assert_bytes(ix, p, (const unsigned char *[]){data_a, data_f});
    ck_plan_free(p);
    cr_assert_eq(ck_plan_make(ix, "f", keep, &p, &err), 0, "%s", err.msg);
    cr_assert_eq(p->ntensors, 1);
    ck_plan_free(p);
    ck_index_free(ix);
    ix = open_ok(torch_sample());
    unsigned char *k2 = calloc(ix->nentries, 1);
    k2[ck_index_find(ix, "w.t") - ix->entries] = 1;
    cr_assert_eq(ck_plan_make(ix, NULL, k2, &p, &err), 0, "%s", err.msg);
    cr_assert_eq(p->ntensors, 1);
    cr_assert_not_null(p->blobs[0].gather);
    ck_plan_free(p);
    cr_assert_eq(ck_plan_make(ix, "layers", k2, &p, &err), CK_PLAN_REFUSED);
    assert_error(&err, ix->files[0].path, "--only 'layers' selects nothing");
    free(k2);
    ck_index_free(ix);
}

/* Blob b of p is in phase: its place in the block has its file offset's phase modulo m. */
static int in_phase(const ck_plan *p, size_t b, uint64_t m)
{
    return (p->blobs[b].dest_off - p->blobs[b].file_off) % m == 0;
}

/* ck_plan_keep_phase: blobs long enough and at element-aligned file offsets take their file
 * offset's phase, the others stay on 256-byte boundaries; order, blobs and tensors unchanged,
 * no two blobs overlap, each moved blob's padding under the modulus. */
Test(plan, keep_phase_for_in_place_direct_reads)
{
    enum { M = 512 };
    static unsigned char data[8 + 8192 + 8194 + 4096 + 2048];
    fill_bytes(data, sizeof data, 5);
    /* a: 8 bytes (short); b: F32, 8 KiB at data offset 8; c: U8, 8 KiB at 8200 (any offset
     * suits it); d: F32, 4 KiB = 8 x M at 16394; e: I16, 2 KiB at 20490 (shorter than 8 x M).
     * The header is padded so that the data starts 2 bytes past a multiple of 4: b's F32s are
     * then out of line in the file, d's in line. */
    const char *h = strf("{%s,%s,%s,%s,%s}", st_tensor("a", "U8", "[8]", 0, 8),
                         st_tensor("b", "F32", "[2048]", 8, 8200),
                         st_tensor("c", "U8", "[8194]", 8200, 16394),
                         st_tensor("d", "F32", "[1024]", 16394, 20490),
                         st_tensor("e", "I16", "[1024]", 20490, 22538));
    const char *src = st_file(strf("%s%*s", h, (int)((14 - (8 + strlen(h)) % 8) % 8), ""), data,
                              sizeof data);
    ck_index *ix = open_ok(src);
    ck_plan *p = plan_ok(ix, NULL), *q = plan_ok(ix, NULL);
    cr_assert_eq(p->nblobs, 5);
    cr_assert_eq(p->blobs[0].file_off % 4, 2); /* a, at data offset 0 */
    uint32_t phase[1] = {M};
    ck_plan_keep_phase(p, phase);
    int keeps[5] = {0, 0, 1, 1, 0};
    uint64_t end = 0;
    for (size_t b = 0; b < p->nblobs; b++) {
        const ck_plan_blob *x = &p->blobs[b], *y = &q->blobs[b];
        cr_assert_eq(x->file_off, y->file_off);
        cr_assert_eq(x->len, y->len);
        cr_assert_eq(x->first, y->first);
        cr_assert_eq(x->count, y->count);
        cr_assert_geq(x->dest_off, end, "blob %zu overlaps the one before", b);
        if (keeps[b]) {
            cr_assert(in_phase(p, b, M), "blob %zu (%s) out of phase", b, x->name);
            cr_assert_lt(x->dest_off - end, M);
        } else {
            cr_assert_eq(x->dest_off, ck_align_up(end, CK_PLAN_ALIGN), "blob %zu", b);
        }
        end = x->dest_off + x->len;
    }
    cr_assert_eq(p->block_size, end);
    /* No phase: the places ck_plan_make gave. */
    ck_plan_keep_phase(p, (uint32_t[]){0});
    for (size_t b = 0; b < p->nblobs; b++)
        cr_assert_eq(p->blobs[b].dest_off, q->blobs[b].dest_off);
    cr_assert_eq(p->block_size, q->block_size);
    ck_plan_free(p);
    ck_plan_free(q);
    ck_index_free(ix);
}

/* A whole pack's blobs are in phase where ck_plan_make put them: keeping the phase moves none
 * (the pack of the source above, whose blobs are long enough to keep it). */
Test(plan, keep_phase_moves_no_blob_of_a_whole_pack)
{
    static unsigned char data[3 * 8192 + 5];
    fill_bytes(data, sizeof data, 6);
    const char *src = st_file(strf("{%s,%s,%s}", st_tensor("a", "U8", "[8197]", 0, 8197),
                                   st_tensor("b", "U8", "[8192]", 8197, 16389),
                                   st_tensor("c", "I16", "[4096]", 16389, 24581)),
                              data, 24581);
    ck_index *sx = open_ok(src), *ix = open_ok(virtual_pack(sx, NULL));
    ck_plan *r = plan_ok(ix, NULL);
    for (uint32_t m = 512; m <= 4096; m *= 2) {
        ck_plan *p = plan_ok(ix, NULL);
        ck_plan_keep_phase(p, &m);
        for (size_t b = 0; b < r->nblobs; b++) {
            cr_assert(in_phase(r, b, 4096));
            cr_assert_eq(p->blobs[b].dest_off, r->blobs[b].dest_off);
        }
        cr_assert_eq(p->block_size, r->block_size);
        ck_plan_free(p);
    }
    ck_plan_free(r);
    ck_index_free(ix);
    ck_index_free(sx);
}

/* A blob marked elsewhere (its bytes go to the loader's caller's memory) takes no room: the
 * others are placed as if it were not there, and whole plans' tensors know their whole entry. */
Test(plan, a_blob_elsewhere_takes_no_room)
{
    static unsigned char data[3000];
    fill_bytes(data, sizeof data, 7);
    const char *src = st_file(strf("{%s,%s,%s}", st_tensor("a", "U8", "[1000]", 0, 1000),
                                   st_tensor("b", "U8", "[1000]", 1000, 2000),
                                   st_tensor("c", "U8", "[1000]", 2000, 3000)),
                              data, sizeof data);
    ck_index *ix = open_ok(src);
    ck_plan *p = plan_ok(ix, NULL);
    cr_assert_eq(p->nblobs, 3);
    for (size_t t = 0; t < p->ntensors; t++)
        cr_assert_eq(p->tensors[t].whole, p->tensors[t].entry);
    p->blobs[0].elsewhere = 1;
    ck_plan_keep_phase(p, NULL);
    cr_assert_eq(p->blobs[0].dest_off, 0);
    cr_assert_eq(p->blobs[1].dest_off, 0);
    cr_assert_eq(p->blobs[2].dest_off, ck_align_up(1000, CK_PLAN_ALIGN));
    cr_assert_eq(p->block_size, p->blobs[2].dest_off + 1000);
    p->blobs[1].elsewhere = p->blobs[2].elsewhere = 1;
    ck_plan_keep_phase(p, NULL);
    cr_assert_eq(p->block_size, 0);
    ck_plan_free(p);
    ck_index_free(ix);
}
