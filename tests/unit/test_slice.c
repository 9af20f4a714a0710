/* Slices (slice.h): torch.chunk's parts, the views of contiguous and strided entries and
 * the bytes ck_entry_read gives of them (against a gather written here, element by element),
 * the refusals, the rules; and the plan of parts (ck_plan_make_sliced) and its shares. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "../../checkpoint/open.h"
#include "../../loader/plan.h"
#include "../../loader/slice.h"
#include "helpers.h"

TestSuite(slice, .fini = tmp_cleanup);

/* torch.chunk(n, world) sizes, as torch 1.13 gives them (fewer parts when they run out). */
Test(slice, parts_as_torch_chunk)
{
    static const struct {
        int64_t n;
        unsigned world;
        int64_t len[4];
    } cases[] = {{5, 4, {2, 2, 1, 0}}, {6, 4, {2, 2, 2, 0}}, {7, 3, {3, 3, 1}},
                 {0, 3, {0, 0, 0}},    {8, 2, {4, 4}},       {1, 4, {1, 0, 0, 0}}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int64_t at = 0;
        for (unsigned r = 0; r < cases[c].world; r++) {
            int64_t start, len;
            ck_slice_part(cases[c].n, r, cases[c].world, &start, &len);
            cr_assert_eq(len, cases[c].len[r], "n %lld rank %u", (long long)cases[c].n, r);
            cr_assert_eq(start, at);
            at += len;
        }
        cr_assert_eq(at, cases[c].n);
    }
}

Test(slice, first_rule_wins)
{
    ck_slice_rule r[] = {{"*.norm", -1}, {"layers.*", 1}, {"embed", 0}};
    ck_slicing s = {.rules = r, .nrules = 3, .rank = 0, .world = 2};
    cr_assert_eq(ck_slice_dim(&s, "layers.0.norm", 13), -1);
    cr_assert_eq(ck_slice_dim(&s, "layers.0.w", 10), 1);
    cr_assert_eq(ck_slice_dim(&s, "embed", 5), 0);
    cr_assert_eq(ck_slice_dim(&s, "embed.w", 7), 0); /* a prefix, as --only */
    cr_assert_eq(ck_slice_dim(&s, "head", 4), -1);
    cr_assert_eq(ck_slice_dim(NULL, "head", 4), -1);
}

/* Element idx (row-major) of a rank-r tensor with dims and strides, written out here. */
static uint64_t offset_of(unsigned rank, const int64_t *dims, const int64_t *strides, uint64_t i)
{
    uint64_t at = 0;
    for (unsigned d = rank; d-- > 0;) {
        at += (i % (uint64_t)dims[d]) * (uint64_t)strides[d];
        i /= (uint64_t)dims[d];
    }
    return at;
}

/* A safetensors file of one F32 tensor "w" of shape dims (rank 3) after 12 bytes of padding. */
static ck_index *cube(const int64_t dims[3], float **data)
{
    size_t n = (size_t)(dims[0] * dims[1] * dims[2]);
    *data = malloc(n * sizeof **data + 12);
    for (size_t i = 0; i < n + 3; i++)
        (*data)[i] = (float)i * 0.5f;
    const char *h = strf("{%s,%s}", st_tensor("pad", "F32", "[3]", 0, 12),
                         st_tensor("w", "F32", strf("[%lld,%lld,%lld]", (long long)dims[0],
                                                    (long long)dims[1], (long long)dims[2]),
                                   12, 12 + n * 4));
    ck_index *ix = NULL;
    ck_error err = {""};
    cr_assert_eq(ck_open(st_file(h, *data, n * 4 + 12), &ix, &err), 0, "%s", err.msg);
    return ix;
}

/* e's part `rank` of world along dim into *v (its dims in vd), which must succeed. */
static void slice_ok(const ck_index *ix, const ck_entry *e, int dim, unsigned rank,
                     unsigned world, ck_entry *v, int64_t *vd)
{
    ck_slicing s = {.rank = rank, .world = world};
    ck_error err = {""};
    cr_assert_eq(ck_slice_entry(ix, e, dim, &s, v, vd, &err), 0, "%s", err.msg);
}

/* Every part of w along every dim, for several world sizes, read through ck_entry_read: each
 * element is the one torch.chunk's part has there. */
Test(slice, parts_read_as_chunks)
{
    const int64_t dims[3] = {5, 3, 4}, strides[3] = {12, 4, 1};
    float *data;
    ck_index *ix = cube(dims, &data);
    const ck_entry *w = ck_index_find(ix, "w");
    for (int dim = 0; dim < 3; dim++)
        for (unsigned world = 1; world <= 4; world++)
            for (unsigned r = 0; r < world; r++) {
                ck_entry v;
                int64_t vd[2 * CK_MAX_RANK];
                slice_ok(ix, w, dim, r, world, &v, vd);
                int64_t start, len;
                ck_slice_part(dims[dim], r, world, &start, &len);
                int64_t pd[3] = {dims[0], dims[1], dims[2]};
                pd[dim] = len;
                cr_assert(memcmp(v.shape, pd, sizeof pd) == 0);
                cr_assert_eq(v.layout, dim == 0 ? CK_CONTIGUOUS : CK_STRIDED);
                uint64_t n = (uint64_t)(pd[0] * pd[1] * pd[2]);
                cr_assert_eq(v.nbytes, n * 4);
                float got[60];
                cr_assert_eq(ck_entry_read(ix, &v, got, sizeof got, 0), (ssize_t)(n * 4));
                for (uint64_t i = 0; i < n; i++) {
                    uint64_t at = offset_of(3, pd, strides, i) + (uint64_t)(start * strides[dim]);
                    cr_assert_eq(got[i], data[3 + at], "dim %d rank %u/%u element %llu", dim, r,
                                 world, (unsigned long long)i);
                }
            }
    ck_index_free(ix);
    free(data);
}

/* A strided entry (a transposed view, as a .pt stores it) sliced: strides compose. */
Test(slice, strided_views_compose)
{
    const int64_t dims[3] = {1, 4, 6};
    float *data;
    ck_index *ix = cube(dims, &data);
    ck_entry t = *ck_index_find(ix, "w"); /* as the 6 x 4 transpose of its 4 x 6 */
    int64_t td[4] = {6, 4, 1, 6};
    t.layout = CK_STRIDED;
    t.rank = 2;
    t.shape = td;
    for (int dim = 0; dim < 2; dim++) {
        ck_entry v;
        int64_t vd[2 * CK_MAX_RANK];
        slice_ok(ix, &t, dim, 1, 2, &v, vd);
        float got[12];
        cr_assert_eq(ck_entry_read(ix, &v, got, sizeof got, 0), 48);
        for (int i = 0; i < 12; i++) { /* element (row, col) of the part is t[row', col'] */
            int row = dim == 0 ? 3 + i / 4 : i / 2, col = dim == 0 ? i % 4 : 2 + i % 2;
            cr_assert_eq(got[i], data[3 + row * 1 + col * 6], "dim %d element %d", dim, i);
        }
    }
    ck_index_free(ix);
    free(data);
}

/* Leading dims of 1 keep a cut along a later dim contiguous: one byte range. */
Test(slice, leading_ones_stay_contiguous)
{
    const int64_t dims[3] = {1, 1, 8};
    float *data;
    ck_index *ix = cube(dims, &data);
    ck_entry v;
    int64_t vd[2 * CK_MAX_RANK];
    slice_ok(ix, ck_index_find(ix, "w"), 2, 1, 2, &v, vd);
    cr_assert_eq(v.layout, CK_CONTIGUOUS);
    cr_assert_eq(v.ext.offset, ck_index_find(ix, "w")->ext.offset + 16);
    cr_assert_eq(v.nbytes, 16);
    ck_index_free(ix);
    free(data);
}

static void refused(const ck_entry *e, int dim, unsigned rank, unsigned world, const char *why)
{
    ck_index *ix = ck_index_new("test");
    ck_slicing s = {.rank = rank, .world = world};
    ck_entry v;
    int64_t vd[2 * CK_MAX_RANK];
    ck_error err = {""};
    cr_assert_eq(ck_slice_entry(ix, e, dim, &s, &v, vd, &err), -1);
    cr_assert(strstr(err.msg, why), "%s", err.msg);
    ck_index_free(ix);
}

static void cut_ok(const ck_entry *e, int dim, unsigned rank, unsigned world, uint64_t off,
                   uint64_t nbytes)
{
    ck_index *ix = ck_index_new("test");
    ck_entry v;
    int64_t vd[2 * CK_MAX_RANK];
    slice_ok(ix, e, dim, rank, world, &v, vd);
    cr_assert_eq(v.ext.offset, e->ext.offset + off);
    cr_assert_eq(v.nbytes, nbytes);
    ck_index_free(ix);
}

Test(slice, refusals_and_blocks)
{
    int64_t d2[2] = {3, 64};
    ck_entry q = {.name = "q", .name_len = 1, .shape = d2, .rank = 2, .dtype = CK_Q4_0,
                  .nbytes = 3 * 2 * 18};
    refused(&q, 2, 0, 2, "has 2 dimensions: no dimension 2 to slice");
    refused(&q, 1, 0, 2, "which a strided slice would split");
    cut_ok(&q, 0, 1, 2, 2 * 36, 36); /* rows of two 18-byte blocks: 2 rows, then 1 */
    int64_t d1[2] = {1, 64};
    q.shape = d1;
    cut_ok(&q, 1, 1, 2, 18, 18);     /* one row: a whole block each */
    refused(&q, 1, 1, 4, "which this cut would split"); /* 16 elements: half a block */
    int64_t f4d[2] = {4, 3};
    ck_entry f4 = {.name = "f", .name_len = 1, .shape = f4d, .rank = 2, .dtype = CK_F4,
                   .nbytes = 6};
    cut_ok(&f4, 0, 1, 2, 3, 3);
    refused(&f4, 0, 1, 4, "which this cut would split"); /* 3 F4 elements: a byte and a half */
    ck_entry z = {.name = "z", .name_len = 1, .shape = d2, .rank = 2, .dtype = CK_F32,
                  .layout = CK_DEFLATED};
    refused(&z, 0, 0, 2, "is compressed (a deflated .npz entry)");
    ck_entry val = {.name = "v", .name_len = 1, .kind = CK_VALUE};
    refused(&val, 0, 0, 2, "is a value, not a tensor");
}

/* A plan of parts: a tensor cut gets a blob of its own, with no stored checksum (tied twins cut
 * alike sharing one: test_slices.py); the shares of whole blobs stay under 1/N + one. */
Test(slice, plan_of_parts_and_shares)
{
    float data[64];
    fill_bytes(data, sizeof data, 5);
    const char *h = strf("{%s,%s,%s,%s}", st_tensor("a", "F32", "[4,4]", 0, 64),
                         st_tensor("b", "F32", "[4,4]", 64, 128),
                         st_tensor("c", "F32", "[4,4]", 128, 192),
                         st_tensor("d", "F32", "[8,2]", 192, 256));
    ck_index *ix = NULL;
    ck_error err = {""};
    cr_assert_eq(ck_open(st_file(h, data, sizeof data), &ix, &err), 0, "%s", err.msg);
    ck_slice_rule r[] = {{"a", 1}, {"b", 1}};
    ck_slicing s = {.rules = r, .nrules = 2, .rank = 1, .world = 2};
    ck_plan *p = NULL;
    cr_assert_eq(ck_plan_make_sliced(ix, NULL, NULL, &s, &p, &err), 0, "%s", err.msg);
    cr_assert_eq(p->ntensors, 4);
    cr_assert_eq(p->nblobs, 4);
    const ck_plan_blob *part = &p->blobs[p->tensors[0].blob];
    cr_assert(part->sliced && part->gather && part->pack_blob == CK_PLAN_NONE);
    cr_assert_eq(part->len, 32);
    cr_assert_eq(part->file_off, ck_index_find(ix, "a")->ext.offset + 8);
    cr_assert_eq(p->tensors[0].entry->shape[1], 2);
    cr_assert_not(p->blobs[p->tensors[2].blob].sliced);
    cr_assert_eq(ck_plan_share(p, CK_READ_BALANCED, 2), 0);
    uint64_t load[2] = {0, 0};
    for (size_t b = 0; b < p->nblobs; b++) {
        if (p->blobs[b].sliced) {
            cr_assert_eq(p->blobs[b].owner, CK_PLAN_EVERY);
            continue;
        }
        cr_assert_lt(p->blobs[b].owner, 2);
        load[p->blobs[b].owner] += p->blobs[b].len;
    }
    cr_assert(load[0] == 64 && load[1] == 64);
    cr_assert_eq(ck_plan_share(p, CK_READ_RANK0, 2), 0);
    for (size_t b = 0; b < p->nblobs; b++)
        cr_assert_eq(p->blobs[b].owner, 0);
    ck_plan_free(p);
    ck_slice_rule bad[] = {{"d", 2}};
    s.rules = bad;
    s.nrules = 1;
    cr_assert_eq(ck_plan_make_sliced(ix, NULL, NULL, &s, &p, &err), CK_PLAN_REFUSED);
    cr_assert(strstr(err.msg, "tensor 'd' has 2 dimensions: no dimension 2"), "%s", err.msg);
    cr_assert_null(p);
    ck_index_free(ix);
}
