/* The common index: sizes, dtype names, lookups, and ck_entry_read for every layout, checked
 * byte for byte against what the test gathers itself. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

TestSuite(nbytes);
TestSuite(dtype);
TestSuite(find, .fini = tmp_cleanup);
TestSuite(add_entry, .fini = tmp_cleanup);
TestSuite(read_contiguous, .fini = tmp_cleanup);
TestSuite(read_strided, .fini = tmp_cleanup);
TestSuite(read_other, .fini = tmp_cleanup);
TestSuite(each_file);

/* --- ck_tensor_nbytes ------------------------------------------------------------------ */

static int nbytes_of(unsigned rank, const int64_t *shape, enum ck_dtype dt, uint64_t *n)
{
    *n = 12345;
    return ck_tensor_nbytes(rank, shape, dt, n);
}

Test(nbytes, products)
{
    uint64_t n;
    cr_assert_eq(nbytes_of(2, (int64_t[]){2, 3}, CK_F32, &n), 0);
    cr_assert_eq(n, 2 * 3 * 4);
    cr_assert_eq(nbytes_of(3, (int64_t[]){5, 1, 7}, CK_C64, &n), 0);
    cr_assert_eq(n, 5 * 7 * 8);
    cr_assert_eq(nbytes_of(1, (int64_t[]){1000}, CK_BF16, &n), 0);
    cr_assert_eq(n, 2000);
}

Test(nbytes, rank_zero_is_one_element)
{
    uint64_t n;
    cr_assert_eq(nbytes_of(0, NULL, CK_F64, &n), 0);
    cr_assert_eq(n, 8);
    cr_assert_eq(nbytes_of(0, NULL, CK_BOOL, &n), 0);
    cr_assert_eq(n, 1);
}

Test(nbytes, zero_dim)
{
    uint64_t n;
    cr_assert_eq(nbytes_of(3, (int64_t[]){4, 0, 9}, CK_I64, &n), 0);
    cr_assert_eq(n, 0);
    cr_assert_eq(nbytes_of(1, (int64_t[]){0}, CK_F4, &n), 0);
    cr_assert_eq(n, 0);
}

Test(nbytes, negative_dim)
{
    uint64_t n;
    cr_assert_eq(nbytes_of(1, (int64_t[]){-1}, CK_U8, &n), -1);
    cr_assert_eq(nbytes_of(2, (int64_t[]){3, -2}, CK_U8, &n), -1);
    cr_assert_eq(nbytes_of(2, (int64_t[]){0, INT64_MIN}, CK_U8, &n), -1);
}

Test(nbytes, overflow)
{
    uint64_t n;
    int64_t d32 = (int64_t)1 << 32;
    cr_assert_eq(nbytes_of(2, (int64_t[]){d32, d32}, CK_U8, &n), -1);          /* 2^64 elements */
    cr_assert_eq(nbytes_of(1, (int64_t[]){(int64_t)1 << 62}, CK_F32, &n), -1); /* 2^67 bits */
    cr_assert_eq(nbytes_of(2, (int64_t[]){INT64_MAX, 3}, CK_U8, &n), -1);
    /* The largest that fits: 2^60 elements of 8 bytes would be 2^63 bytes. */
    cr_assert_eq(nbytes_of(1, (int64_t[]){(int64_t)1 << 57}, CK_I64, &n), 0);
    cr_assert_eq(n, (uint64_t)1 << 60);
}

Test(nbytes, sub_byte)
{
    uint64_t n;
    cr_assert_eq(nbytes_of(1, (int64_t[]){3}, CK_F4, &n), -1); /* 12 bits */
    cr_assert_eq(nbytes_of(0, NULL, CK_F4, &n), -1);           /* 4 bits */
    cr_assert_eq(nbytes_of(2, (int64_t[]){3, 2}, CK_F4, &n), 0);
    cr_assert_eq(n, 3 * 2 * 4 / 8);
    cr_assert_eq(nbytes_of(1, (int64_t[]){2}, CK_F6_E2M3, &n), -1); /* 12 bits */
    cr_assert_eq(nbytes_of(1, (int64_t[]){6}, CK_F6_E3M2, &n), -1); /* 36 bits */
    cr_assert_eq(nbytes_of(1, (int64_t[]){4}, CK_F6_E3M2, &n), 0);
    cr_assert_eq(n, 4 * 6 / 8);
    cr_assert_eq(nbytes_of(2, (int64_t[]){2, 8}, CK_F6_E2M3, &n), 0);
    cr_assert_eq(n, 2 * 8 * 6 / 8);
}

/* --- dtype names ------------------------------------------------------------------------ */

/* The safetensors spec's names and widths, in ck_dtype order. */
static const struct {
    const char *name;
    unsigned bits;
} spec[] = {
    {"BOOL", 8},    {"U8", 8},      {"I8", 8},       {"F8_E5M2", 8}, {"F8_E4M3", 8},
    {"F8_E8M0", 8}, {"I16", 16},    {"U16", 16},     {"F16", 16},    {"BF16", 16},
    {"I32", 32},    {"U32", 32},    {"F32", 32},     {"I64", 64},    {"U64", 64},
    {"F64", 64},    {"C64", 64},    {"F4", 4},       {"F6_E2M3", 6}, {"F6_E3M2", 6},
    /* torch's, beyond the spec */
    {"C128", 128},  {"C32", 32},    {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8},
    /* ggml's block types: no width per element (test_gguf.c checks their blocks) */
    {"Q4_0", 0},    {"Q4_1", 0},    {"Q5_0", 0},     {"Q5_1", 0},    {"Q8_0", 0},
    {"Q8_1", 0},    {"Q2_K", 0},    {"Q3_K", 0},     {"Q4_K", 0},    {"Q5_K", 0},
    {"Q6_K", 0},    {"Q8_K", 0},    {"IQ2_XXS", 0},  {"IQ2_XS", 0},  {"IQ3_XXS", 0},
    {"IQ1_S", 0},   {"IQ4_NL", 0},  {"IQ3_S", 0},    {"IQ2_S", 0},   {"IQ4_XS", 0},
    {"IQ1_M", 0},   {"TQ1_0", 0},   {"TQ2_0", 0},    {"MXFP4", 0},   {"NVFP4", 0},
    {"Q1_0", 0},
};

Test(dtype, names_and_bits)
{
    cr_assert_eq(sizeof spec / sizeof *spec, CK_DTYPE_COUNT);
    for (int d = 0; d < CK_DTYPE_COUNT; d++) {
        cr_assert_str_eq(ck_dtype_name((enum ck_dtype)d), spec[d].name);
        cr_assert_eq(ck_dtype_bits((enum ck_dtype)d), spec[d].bits, "%s", spec[d].name);
    }
    cr_assert_eq(CK_F4, 17);
    cr_assert_eq(CK_C64, 16);
}

Test(dtype, round_trip)
{
    for (int d = 0; d < CK_DTYPE_COUNT; d++) {
        const char *name = ck_dtype_name((enum ck_dtype)d);
        cr_assert_eq(ck_dtype_from_name(name, strlen(name)), d, "%s", name);
    }
}

Test(dtype, from_name_uses_the_length)
{
    cr_assert_eq(ck_dtype_from_name("F16xyz", 3), CK_F16);
    cr_assert_eq(ck_dtype_from_name("F8_E4M3FN", 7), CK_F8_E4M3);
    cr_assert_eq(ck_dtype_from_name("F32", 2), -1);
    cr_assert_eq(ck_dtype_from_name("F8_E4M3FN", 9), -1);
}

Test(dtype, unknown_names)
{
    static const char *const bad[] = {"", "f32", "F128", "FLOAT", "bf16", "U1", "F6"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert_eq(ck_dtype_from_name(bad[i], strlen(bad[i])), -1, "'%s'", bad[i]);
}

Test(dtype, out_of_range)
{
    cr_assert_str_eq(ck_dtype_name(CK_DTYPE_COUNT), "?");
    cr_assert_eq(ck_dtype_bits(CK_DTYPE_COUNT), 0);
    cr_assert_str_eq(ck_dtype_name((enum ck_dtype)255), "?");
}

/* --- ck_index_find ---------------------------------------------------------------------- */

Test(find, exact_names_only)
{
    static const char *const names[] = {"a", "ab", "a.b", "", "\xc3\xa9"};
    ck_index *ix = index_of_names(names, 5);
    for (size_t i = 0; i < 5; i++)
        cr_assert_eq(ck_index_find(ix, names[i]), &ix->entries[i], "'%s'", names[i]);
    cr_assert_null(ck_index_find(ix, "abc"));
    cr_assert_null(ck_index_find(ix, "A"));
    cr_assert_null(ck_index_find(ix, "a."));
    cr_assert_null(ck_index_find(ix, "\xc3"));
    ck_index_free(ix);
}

Test(find, empty_index)
{
    ck_index *ix = ck_index_new("x");
    cr_assert_null(ck_index_find(ix, "a"));
    cr_assert_null(ck_index_find(ix, ""));
    ck_index_free(ix);
}

/* --- adding entries --------------------------------------------------------------------- */

/* No reader passes a rank past the limit (each refuses it first, saying where); a caller that
 * does is told so, not that memory ran out. */
Test(add_entry, rank_past_the_limit)
{
    ck_index *ix = index_over("x", 1);
    int64_t dims[CK_MAX_RANK + 6];
    for (size_t d = 0; d < CK_MAX_RANK + 6; d++)
        dims[d] = 1;
    ck_error err = {""};
    cr_assert_null(ck_index_add_entry(ix, "deep", 4, CK_CONTIGUOUS, CK_MAX_RANK + 6, dims, &err));
    cr_assert_str_eq(err.msg, strf("%s: tensor 'deep': rank 70 exceeds 64", ix->files[0].path));
    cr_assert_eq(ix->nentries, 0);
    ck_entry *e = ck_index_add_entry(ix, "deep", 4, CK_CONTIGUOUS, CK_MAX_RANK, dims, &err);
    cr_assert_not_null(e, "%s", err.msg);
    cr_assert_eq(e->rank, CK_MAX_RANK);
    ck_index_free(ix);
}

Test(add_entry, messages_name_the_first_file)
{
    ck_index *ix = ck_index_new("x");
    cr_assert_str_eq(ck_index_source(ix), "?");
    ck_index_free(ix);
    ix = index_over("x", 1);
    cr_assert_str_eq(ck_index_source(ix), ix->files[0].path);
    ck_index_free(ix);
}

/* --- reading ---------------------------------------------------------------------------- */

/* One read, checked: the count is what remains of the entry (0 at or past the end), the bytes
 * are expect's, and nothing past the count is touched. */
static void check_read(const ck_index *ix, const ck_entry *e, const unsigned char *expect,
                       size_t n, uint64_t off, size_t len)
{
    unsigned char *buf = malloc(len + 1);
    cr_assert_not_null(buf);
    memset(buf, 0xA5, len + 1);
    size_t want = off >= n ? 0 : (len < n - off ? len : (size_t)(n - off));
    ssize_t got = ck_entry_read(ix, e, buf, len, off);
    cr_assert_eq(got, (ssize_t)want, "read(off %llu, len %zu) of %zu bytes gave %zd",
                 (unsigned long long)off, len, n, got);
    cr_assert(want == 0 || memcmp(buf, expect + off, want) == 0,
              "read(off %llu, len %zu) gave the wrong bytes", (unsigned long long)off, len);
    size_t i = want;
    while (i <= len && buf[i] == 0xA5)
        i++;
    cr_assert_gt(i, len, "read(off %llu, len %zu) wrote byte %zu", (unsigned long long)off, len, i);
    free(buf);
}

/* Every offset and length, for small entries. */
static void check_every_read(const ck_index *ix, const ck_entry *e, const unsigned char *expect,
                             size_t n)
{
    for (uint64_t off = 0; off <= n + 1; off++)
        for (size_t len = 0; len <= n + 2 - off; len++)
            check_read(ix, e, expect, n, off, len);
}

/* Chosen offsets and lengths, for entries too large for every one. */
static void check_some_reads(const ck_index *ix, const ck_entry *e, const unsigned char *expect,
                             size_t n)
{
    const uint64_t offs[] = {0, 1, 2, 3, 4, 5, 7, 4095, 4096, 65537, 262143, 262144, 262145,
                             n / 2 + 1, n - 9, n - 1, n, n + 1, n + 1000000};
    const size_t lens[] = {1, 2, 3, 5, 8, 4096, 65537, 262144, 262151, 300001, n};
    for (size_t i = 0; i < sizeof offs / sizeof *offs; i++)
        for (size_t j = 0; j < sizeof lens / sizeof *lens; j++)
            check_read(ix, e, expect, n, offs[i], lens[j]);
}

Test(read_contiguous, every_offset_and_length)
{
    unsigned char file[200];
    fill_bytes(file, sizeof file, 3);
    ck_index *ix = index_over(file, sizeof file);
    const ck_entry *e = add_contig(ix, "t", CK_U8, 1, (int64_t[]){57}, 13, 57);
    check_every_read(ix, e, file + 13, 57);
    ck_index_free(ix);
}

Test(read_contiguous, past_the_end_is_zero)
{
    unsigned char file[16];
    fill_bytes(file, sizeof file, 4);
    ck_index *ix = index_over(file, sizeof file);
    const ck_entry *e = add_contig(ix, "t", CK_U8, 1, (int64_t[]){8}, 8, 8);
    char c;
    cr_assert_eq(ck_entry_read(ix, e, &c, 1, 8), 0);
    cr_assert_eq(ck_entry_read(ix, e, &c, 1, 9), 0);
    cr_assert_eq(ck_entry_read(ix, e, &c, 1, UINT64_MAX), 0);
    cr_assert_eq(ck_entry_read(ix, e, &c, 0, 0), 0);
    ck_index_free(ix);
}

Test(read_contiguous, short_file_is_eio)
{
    unsigned char file[60];
    fill_bytes(file, sizeof file, 5);
    ck_index *ix = index_over(file, sizeof file);
    const ck_entry *e = add_contig(ix, "t", CK_U8, 1, (int64_t[]){100}, 10, 100);
    unsigned char buf[100];
    cr_assert_eq(ck_entry_read(ix, e, buf, 100, 0), -EIO);
    cr_assert_eq(ck_entry_read(ix, e, buf, 10, 45), -EIO);
    cr_assert_eq(ck_entry_read(ix, e, buf, 1, 50), -EIO);
    cr_assert_eq(ck_entry_read(ix, e, buf, 50, 0), 50); /* wholly inside the file */
    cr_assert_arr_eq(buf, file + 10, 50);
    ck_index_free(ix);
}

Test(read_contiguous, from_the_second_file)
{
    unsigned char a[16], b[40];
    fill_bytes(a, sizeof a, 7);
    fill_bytes(b, sizeof b, 8);
    ck_index *ix = index_over(a, sizeof a);
    const char *pb = tmp_file(b, sizeof b);
    ck_error err = {""};
    cr_assert_eq(ck_index_add_file(ix, pb, open(pb, O_RDONLY), &err), 1, "%s", err.msg);
    ck_entry *e = add_contig(ix, "t", CK_U8, 1, (int64_t[]){30}, 5, 30);
    e->ext.file = 1;
    check_every_read(ix, e, b + 5, 30);
    ck_index_free(ix);
}

/* A strided entry: element (i0, i1, ...) of the tensor is element first + sum(i_d * strides[d])
 * of file 0. */
static const ck_entry *add_strided(ck_index *ix, enum ck_dtype dt, unsigned rank,
                                   const int64_t *dims, const int64_t *strides, uint64_t first)
{
    int64_t both[2 * CK_MAX_RANK];
    for (unsigned d = 0; d < rank; d++) {
        both[d] = dims[d];
        both[rank + d] = strides[d];
    }
    ck_error err = {""};
    ck_entry *e = ck_index_add_entry(ix, "s", 1, CK_STRIDED, rank, both, &err);
    cr_assert_not_null(e, "%s", err.msg);
    uint64_t count = 1;
    for (unsigned d = 0; d < rank; d++)
        count *= (uint64_t)dims[d];
    unsigned esize = ck_dtype_bits(dt) / 8;
    e->dtype = (uint8_t)dt;
    e->nbytes = count * esize;
    e->ext = (ck_extent){.offset = first * esize, .length = 0, .file = 0};
    return e;
}

/* The same tensor, gathered by the test one element at a time in row-major order. */
static unsigned char *gather(const unsigned char *file, unsigned esize, unsigned rank,
                             const int64_t *dims, const int64_t *strides, uint64_t first,
                             size_t *len)
{
    size_t count = 1;
    for (unsigned d = 0; d < rank; d++)
        count *= (size_t)dims[d];
    unsigned char *out = malloc(count * esize + 1);
    cr_assert_not_null(out);
    for (size_t i = 0; i < count; i++) {
        size_t rest = i;
        int64_t at = (int64_t)first;
        for (unsigned d = rank; d-- > 0;) {
            at += (int64_t)(rest % (size_t)dims[d]) * strides[d];
            rest /= (size_t)dims[d];
        }
        memcpy(out + i * esize, file + (size_t)at * esize, esize);
    }
    *len = count * esize;
    return out;
}

/* A strided tensor over a file of file_len pseudo-random bytes, read every way (exhaustively
 * when small) and compared with the gather. */
static void check_strided(size_t file_len, enum ck_dtype dt, unsigned rank, const int64_t *dims,
                          const int64_t *strides, uint64_t first)
{
    unsigned char *file = malloc(file_len);
    cr_assert_not_null(file);
    fill_bytes(file, file_len, (uint32_t)file_len);
    ck_index *ix = index_over(file, file_len);
    const ck_entry *e = add_strided(ix, dt, rank, dims, strides, first);
    size_t n;
    unsigned char *expect = gather(file, ck_dtype_bits(dt) / 8, rank, dims, strides, first, &n);
    cr_assert_eq(e->nbytes, n);
    if (n <= 200)
        check_every_read(ix, e, expect, n);
    else
        check_some_reads(ix, e, expect, n);
    check_read(ix, e, expect, n, 0, n);
    free(expect);
    free(file);
    ck_index_free(ix);
}

Test(read_strided, transposed_2d)
{
    /* storage [3][5] of F32, shown as its transpose [5][3] */
    check_strided(3 * 5 * 4, CK_F32, 2, (int64_t[]){5, 3}, (int64_t[]){1, 5}, 0);
}

Test(read_strided, transposed_2d_two_byte_elements_with_offset)
{
    check_strided(200, CK_BF16, 2, (int64_t[]){4, 6}, (int64_t[]){1, 4}, 17);
}

Test(read_strided, permuted_3d)
{
    /* storage [4][3][2] (strides 6, 2, 1) shown as [2][3][4] with strides (1, 2, 6) */
    check_strided(24 * 2, CK_F16, 3, (int64_t[]){2, 3, 4}, (int64_t[]){1, 2, 6}, 0);
}

Test(read_strided, permuted_3d_eight_byte_elements)
{
    check_strided(24 * 8 + 8, CK_F64, 3, (int64_t[]){4, 2, 3}, (int64_t[]){1, 12, 4}, 1);
}

Test(read_strided, one_byte_elements)
{
    check_strided(64, CK_U8, 3, (int64_t[]){3, 2, 4}, (int64_t[]){1, 3, 6}, 5);
}

Test(read_strided, unit_stride_rows)
{
    /* every other row of a [6][7] matrix */
    check_strided(6 * 7 * 4, CK_I32, 2, (int64_t[]){3, 7}, (int64_t[]){14, 1}, 0);
}

Test(read_strided, negative_strides)
{
    /* [4][5] I16 read backwards in both dims, from the last element */
    check_strided(20 * 2, CK_I16, 2, (int64_t[]){4, 5}, (int64_t[]){-5, -1}, 19);
    check_strided(20 * 4, CK_U32, 2, (int64_t[]){5, 4}, (int64_t[]){-1, 5}, 4);
}

Test(read_strided, broadcast_zero_strides)
{
    check_strided(32, CK_F32, 2, (int64_t[]){3, 4}, (int64_t[]){0, 1}, 1);
    check_strided(32, CK_F16, 2, (int64_t[]){4, 3}, (int64_t[]){1, 0}, 2);
}

Test(read_strided, size_one_dims)
{
    check_strided(40, CK_F32, 3, (int64_t[]){1, 5, 1}, (int64_t[]){7, 2, 3}, 0);
}

Test(read_strided, rank_zero)
{
    check_strided(64, CK_F64, 0, NULL, NULL, 3);
}

Test(read_strided, zero_elements)
{
    unsigned char file[16] = {0};
    ck_index *ix = index_over(file, sizeof file);
    const ck_entry *e = add_strided(ix, CK_F32, 2, (int64_t[]){3, 0}, (int64_t[]){1, 3}, 0);
    char c;
    cr_assert_eq(ck_entry_read(ix, e, &c, 1, 0), 0);
    ck_index_free(ix);
}

Test(read_strided, long_rows_larger_than_scratch)
{
    /* [2][70000] F16 taking every other element: each row spans 280000 bytes, more than the
     * 256 KiB the reader gathers at once, and the tensor is larger than that too. */
    check_strided(2 * 140000 * 2, CK_F16, 2, (int64_t[]){2, 70000}, (int64_t[]){140000, 2}, 0);
}

Test(read_strided, stride_wider_than_scratch)
{
    /* elements 280000 bytes apart: one read each */
    check_strided(4 * (3 * 70000 + 2 + 1), CK_F32, 2, (int64_t[]){3, 4}, (int64_t[]){1, 70000}, 0);
}

Test(read_strided, larger_transpose)
{
    /* storage [40][96] F32 as [96][40] */
    check_strided(40 * 96 * 4, CK_F32, 2, (int64_t[]){96, 40}, (int64_t[]){1, 96}, 0);
}

Test(read_strided, short_file_is_eio)
{
    unsigned char file[40];
    fill_bytes(file, sizeof file, 10);
    ck_index *ix = index_over(file, sizeof file);
    /* [3][4] F32, element (i, j) at storage element i + 3j: the file holds storage elements 0-9,
     * so elements (1, 3) and (2, 3), the tensor's 8th and 12th, lie past its end. */
    const ck_entry *e = add_strided(ix, CK_F32, 2, (int64_t[]){3, 4}, (int64_t[]){1, 3}, 0);
    unsigned char buf[48];
    cr_assert_eq(ck_entry_read(ix, e, buf, 48, 0), -EIO);
    cr_assert_eq(ck_entry_read(ix, e, buf, 1, 7 * 4 + 1), -EIO);
    cr_assert_eq(ck_entry_read(ix, e, buf, 40, 8), -EIO);
    cr_assert_eq(ck_entry_read(ix, e, buf, 4, 11 * 4), -EIO);
    cr_assert_eq(ck_entry_read(ix, e, buf, 28, 0), 28); /* elements 0-6 are all in the file */
    for (int k = 0; k < 7; k++)
        cr_assert_arr_eq(buf + 4 * k, file + 4 * (k / 4 + 3 * (k % 4)), 4, "element %d", k);
    cr_assert_eq(ck_entry_read(ix, e, buf, 3, 1), 3);
    cr_assert_arr_eq(buf, file + 1, 3);
    ck_index_free(ix);
}

/* --- other entries ---------------------------------------------------------------------- */

Test(read_other, value_entries)
{
    ck_index *ix = ck_index_new("x");
    ck_error err = {""};
    ck_entry *e = ck_index_add_entry(ix, "v", 1, CK_CONTIGUOUS, 0, NULL, &err);
    cr_assert_not_null(e);
    const char *text = "{\"k\": [1, 2, 3]}";
    e->kind = CK_VALUE;
    e->text = ck_index_strndup(ix, text, strlen(text));
    e->nbytes = strlen(text);
    check_every_read(ix, e, (const unsigned char *)text, strlen(text));
    ck_index_free(ix);
}

Test(read_other, unknown_layout_is_eio)
{
    unsigned char file[8] = {0};
    ck_index *ix = index_over(file, sizeof file);
    ck_entry *e = add_contig(ix, "t", CK_U8, 1, (int64_t[]){8}, 0, 8);
    e->layout = 7;
    cr_assert_eq(ck_entry_read(ix, e, file, 8, 0), -EIO);
    ck_index_free(ix);
}

Test(read_other, pread_exact)
{
    unsigned char file[10];
    fill_bytes(file, sizeof file, 11);
    ck_index *ix = index_over(file, sizeof file);
    unsigned char buf[10];
    cr_assert_eq(ck_pread(ix->files[0].fd, buf, 6, 4), 0);
    cr_assert_arr_eq(buf, file + 4, 6);
    cr_assert_eq(ck_pread(ix->files[0].fd, buf, 7, 4), -EIO);
    cr_assert_eq(ck_pread(-1, buf, 1, 0), -EBADF);
    ck_index_free(ix);
}

/* --- ck_entry_each_file: the files a range of an entry is read from ------------------------ */

/* A 4x6 F32 tensor in a 2x2 grid of chunks, each in a file of its own: rows 0-1 in files 1
 * (columns 0-2) and 2 (3-5), rows 2-3 in files 3 and 4; the entry is the box of dims[0..2)
 * from start[0..2). */
static const int64_t grid_v[4][4] = {{0, 0, 2, 3}, {0, 3, 2, 3}, {2, 0, 2, 3}, {2, 3, 2, 3}};
static const int64_t grid_dims[2] = {4, 6};
static const int64_t grid_edges[6] = {0, 2, 4, 0, 3, 6};
static const uint32_t grid_nedges[2] = {3, 3};

static ck_entry grid_entry(int64_t *shape, ck_chunk *c, ck_chunks *cs, int64_t rows,
                           int64_t first_row)
{
    for (uint32_t i = 0; i < 4; i++)
        c[i] = (ck_chunk){.offsets = grid_v[i], .sizes = grid_v[i] + 2,
                          .ext = {.offset = 0, .length = 24, .file = i + 1}};
    *cs = (ck_chunks){.dims = grid_dims, .chunk = c, .n = 4, .edges = grid_edges,
                      .nedges = grid_nedges};
    shape[0] = rows, shape[1] = 6, shape[2] = first_row, shape[3] = 0;
    return (ck_entry){.name = "t", .shape = shape, .chunks = cs, .nbytes = (uint64_t)rows * 24,
                      .kind = CK_TENSOR, .layout = CK_CHUNKED, .dtype = CK_F32, .rank = 2};
}

/* Records each file named, as a bit. */
static int note_file(void *ctx, uint32_t file)
{
    *(unsigned *)ctx |= 1u << file;
    return 0;
}

static unsigned files_of(const ck_entry *e, uint64_t first_elem, uint64_t elems)
{
    unsigned seen = 0;
    cr_assert_eq(ck_entry_each_file(e, 4 * first_elem, 4 * elems, note_file, &seen), 0);
    return seen;
}

#define F(n) (1u << (n))

Test(each_file, chunks_the_range_meets)
{
    int64_t shape[4];
    ck_chunk c[4];
    ck_chunks cs;
    ck_entry e = grid_entry(shape, c, &cs, 4, 0);
    cr_assert_eq(files_of(&e, 0, 3), F(1));               /* row 0, columns 0-2 */
    cr_assert_eq(files_of(&e, 0, 6), F(1) | F(2));        /* row 0 */
    cr_assert_eq(files_of(&e, 4, 1), F(2));               /* row 0, column 4 */
    cr_assert_eq(files_of(&e, 6, 12), F(1) | F(2) | F(3) | F(4)); /* rows 1-2 */
    cr_assert_eq(files_of(&e, 12, 12), F(3) | F(4));      /* rows 2-3 */
    cr_assert_eq(files_of(&e, 20, 1), F(3));              /* row 3, column 2 */
    cr_assert_eq(files_of(&e, 0, 24), F(1) | F(2) | F(3) | F(4));
    cr_assert_eq(files_of(&e, 23, 100), F(4));            /* cut to the entry */
    cr_assert_eq(files_of(&e, 24, 1), 0);                 /* past the end: none */
    cr_assert_eq(files_of(&e, 3, 0), 0);                  /* empty: none */
    unsigned seen = 0; /* part of one element: the element's chunk */
    cr_assert_eq(ck_entry_each_file(&e, 4 * 9 + 1, 2, note_file, &seen), 0);
    cr_assert_eq(seen, F(2));
}

Test(each_file, a_box_of_the_tensor)
{
    int64_t shape[4];
    ck_chunk c[4];
    ck_chunks cs;
    ck_entry e = grid_entry(shape, c, &cs, 2, 2); /* rows 2-3 of the whole */
    cr_assert_eq(files_of(&e, 0, 6), F(3) | F(4));
    cr_assert_eq(files_of(&e, 0, 2), F(3));
}

/* Stops at the first non-zero answer and returns it. */
static int refuse_file_3(void *ctx, uint32_t file)
{
    ++*(unsigned *)ctx;
    return file == 3 ? -EIO : 0;
}

Test(each_file, stops_at_the_first_answer)
{
    int64_t shape[4];
    ck_chunk c[4];
    ck_chunks cs;
    ck_entry e = grid_entry(shape, c, &cs, 4, 0);
    unsigned asked = 0;
    cr_assert_eq(ck_entry_each_file(&e, 0, e.nbytes, refuse_file_3, &asked), -EIO);
    cr_assert_eq(asked, 3);
}

Test(each_file, other_layouts_name_their_extent_file)
{
    int64_t shape[1] = {8};
    ck_entry e = {.name = "t", .shape = shape, .ext = {.offset = 0, .length = 32, .file = 5},
                  .nbytes = 32, .kind = CK_TENSOR, .layout = CK_CONTIGUOUS, .dtype = CK_F32,
                  .rank = 1};
    cr_assert_eq(files_of(&e, 2, 3), F(5));
    e.layout = CK_STRIDED;
    cr_assert_eq(files_of(&e, 0, 8), F(5));
    cr_assert_eq(files_of(&e, 8, 1), 0);
}

/* A chunked tensor [4][6] of U8 in a 2x2 grid of [2][3] chunks, two of them stored transposed
 * (a view DCP saved as it was, strides (1, 2)): every read gathers them by their strides,
 * runs of part of a row included. */
Test(read_other, chunked_with_strided_chunks)
{
    unsigned char file[64], want[24];
    fill_bytes(file, sizeof file, 9);
    ck_index *ix = index_over(file, sizeof file);
    static const int64_t box[4][4] = {{0, 0, 2, 3}, {0, 3, 2, 3}, {2, 0, 2, 3}, {2, 3, 2, 3}};
    static const int64_t transposed[2] = {1, 2};
    static const uint64_t at[4] = {0, 10, 20, 40};
    ck_chunk chunk[4];
    for (int k = 0; k < 4; k++) {
        int strided = k % 2 == 1;
        chunk[k] = (ck_chunk){.offsets = box[k], .sizes = box[k] + 2,
                              .strides = strided ? transposed : NULL,
                              .ext = {.offset = at[k], .length = 6}};
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 3; j++)
                want[(box[k][0] + i) * 6 + box[k][1] + j] =
                    file[at[k] + (strided ? (uint64_t)(i + 2 * j) : (uint64_t)(3 * i + j))];
    }
    ck_chunks cs = {.dims = (int64_t[]){4, 6}, .chunk = chunk, .n = 4,
                    .edges = (int64_t[]){0, 2, 4, 0, 3, 6}, .nedges = (uint32_t[]){3, 3}};
    ck_error err = {""};
    ck_entry *e = ck_index_add_entry(ix, "t", 1, CK_CHUNKED, 2, (int64_t[]){4, 6, 0, 0}, &err);
    cr_assert_not_null(e, "%s", err.msg);
    e->dtype = CK_U8;
    e->nbytes = 24;
    e->chunks = &cs;
    check_every_read(ix, e, want, 24);
    ck_index_free(ix);
}
