/* The pack reader (docs/PACK.md): packs built byte by byte by the helpers, every refusal rule
 * of the format and every message of the reader, truncation, and corrupted indexes whose
 * checksum was fixed up (they must fail cleanly or load consistently). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../checkpoint/open.h"
#include "../../formats/packfile.h"
#include "../../base/names.h"
#include "../../checkpoint/synth.h"
#include "helpers.h"

/* valgrind.h is only a header; without it the test cannot be under valgrind anyway. */
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

TestSuite(pack_codec);
TestSuite(pack_ok, .fini = tmp_cleanup);
TestSuite(pack_header, .fini = tmp_cleanup);
TestSuite(pack_file, .fini = tmp_cleanup);
TestSuite(pack_index, .fini = tmp_cleanup);
TestSuite(pack_meta, .fini = tmp_cleanup);
TestSuite(pack_blob, .fini = tmp_cleanup);
TestSuite(pack_entry, .fini = tmp_cleanup);
TestSuite(pack_cut, .fini = tmp_cleanup);
TestSuite(pack_fuzz, .fini = tmp_cleanup);

typedef unsigned long long ull;

/* --- the sample: one of everything ---------------------------------------------------- */

typedef struct tensor_spec {
    const char *name;
    enum ck_dtype dt;
    unsigned rank;
    int64_t dims[3];
    uint64_t blob;
} tensor_spec;

typedef struct value_spec {
    const char *name;
    enum ck_value_type type;
    const char *text;
    size_t len;
} value_spec;

static const tensor_spec sample_tensors[] = {
    {"a.weight", CK_F32, 2, {2, 3}, 0},
    {"b.bf16", CK_BF16, 1, {4}, 1},
    {"c.scalar", CK_U8, 0, {0}, 2},
    {"d.empty", CK_F32, 2, {0, 5}, 3},
    {"d.empty2", CK_I8, 1, {0}, 3},          /* empty tensors share one empty blob */
    {"e.f4", CK_F4, 2, {5, 2}, 4},           /* 40 bits, right where the empty blob is */
    {"embed.weight", CK_F16, 2, {3, 4}, 5},  /* tied: one blob, two names */
    {"f.f6", CK_F6_E2M3, 1, {4}, 6},         /* 24 bits */
    {"g.c128", CK_C128, 1, {2}, 7},
    {"h.big", CK_I16, 1, {300}, 8},          /* crosses a 256-byte boundary */
    {"i.bool", CK_BOOL, 3, {1, 1, 3}, 9},
    {"k.fnuz", CK_F8_E5M2FNUZ, 1, {7}, 10},
    {"lm_head.weight", CK_F16, 2, {3, 4}, 5},
};
#define SAMPLE_TENSORS (sizeof sample_tensors / sizeof *sample_tensors)
#define SAMPLE_BLOBS 11

static const value_spec sample_values[] = { /* after the tensors, in natural name order */
    {"v.bool", CK_VAL_BOOL, "True\n", 5},
    {"v.bytes", CK_VAL_BYTES, "\x00\xff\x01", 3}, /* raw: NUL and non-UTF-8 are fine */
    {"v.empty", CK_VAL_STR, "", 0},
    {"v.float", CK_VAL_FLOAT, "0.5\n", 4},
    {"v.global", CK_VAL_GLOBAL, "torch.float32", 13},
    {"v.int", CK_VAL_INT, "-42\n", 4},
    {"v.none", CK_VAL_NONE, "None\n", 5},
    {"v.str", CK_VAL_STR, "h\xc3\xa9llo\n", 7},
};
#define SAMPLE_VALUES (sizeof sample_values / sizeof *sample_values)

static const char *const sample_meta[][2] = {
    {"ckptfs.source_format", "pytorch-zip"},
    {"note", "h\xc3\xa9llo w\xc3\xb6rld"},
    {"", ""},
};
#define SAMPLE_META (sizeof sample_meta / sizeof *sample_meta)

static unsigned char sample_data[SAMPLE_BLOBS][600];

static uint64_t spec_nbytes(const tensor_spec *t)
{
    uint64_t n = 0;
    cr_assert_eq(ck_tensor_nbytes(t->rank, t->dims, t->dt, &n), 0);
    return n;
}

/* The sample's blobs (filled in and placed) and its index. */
static void sample(bytebuf *ix, pk_blob blobs[SAMPLE_BLOBS])
{
    for (size_t b = 0; b < SAMPLE_BLOBS; b++) {
        fill_bytes(sample_data[b], sizeof sample_data[b], (uint32_t)b);
        blobs[b] = (pk_blob){.data = sample_data[b]};
    }
    for (size_t i = 0; i < SAMPLE_TENSORS; i++)
        blobs[sample_tensors[i].blob].length = spec_nbytes(&sample_tensors[i]);
    pk_place(blobs, SAMPLE_BLOBS);
    pk_counts(ix, SAMPLE_TENSORS + SAMPLE_VALUES, SAMPLE_BLOBS, SAMPLE_META, 0);
    for (size_t m = 0; m < SAMPLE_META; m++)
        pk_meta(ix, sample_meta[m][0], sample_meta[m][1]);
    pk_blobs(ix, blobs, SAMPLE_BLOBS);
    for (size_t i = 0; i < SAMPLE_TENSORS; i++) {
        const tensor_spec *t = &sample_tensors[i];
        pk_tensor(ix, t->name, t->dt, t->rank, t->dims, t->blob);
    }
    for (size_t i = 0; i < SAMPLE_VALUES; i++) {
        const value_spec *v = &sample_values[i];
        pk_value(ix, v->name, v->type, v->text, v->len);
    }
}

/* The sample as a whole file in memory. */
static unsigned char *sample_bytes(size_t *len, size_t *index_len)
{
    bytebuf ix = {0};
    pk_blob blobs[SAMPLE_BLOBS];
    sample(&ix, blobs);
    unsigned char *b = pk_bytes(&ix, blobs, SAMPLE_BLOBS, len);
    if (index_len)
        *index_len = ix.len;
    free(ix.p);
    return b;
}

/* The smallest useful pack: "w", F32 [n], its bytes in blob 0. */
static void one_tensor(bytebuf *ix, pk_blob *blob, int64_t n)
{
    *blob = (pk_blob){.data = NULL, .offset = 0, .length = 4 * (uint64_t)n};
    pk_counts(ix, 1, 1, 0, 0);
    pk_blobs(ix, blob, 1);
    pk_tensor(ix, "w", CK_F32, 1, (int64_t[]){n}, 0);
}

static unsigned char *one_tensor_bytes(size_t *len)
{
    bytebuf ix = {0};
    pk_blob blob;
    one_tensor(&ix, &blob, 1);
    unsigned char *b = pk_bytes(&ix, &blob, 1, len);
    free(ix.p);
    return b;
}

/* A pack of this index and blobs must be refused, saying what. Frees the index. */
static void refused(bytebuf *ix, const pk_blob *blobs, size_t n, const char *what)
{
    const char *path = pk_file(ix, blobs, n);
    free(ix->p);
    *ix = (bytebuf){0};
    assert_open_fails(path, what);
}

/* An index with no blobs and no metadata whose entries the caller writes; refused(). */
static void no_blobs(bytebuf *ix, uint64_t nentries)
{
    pk_counts(ix, nentries, 0, 0, 0);
}

/* File offset of the next byte an index builder writes. */
static ull here(const bytebuf *ix)
{
    return 64 + (ull)ix->len;
}

static int by_entry_name(const void *a, const void *b)
{
    return strcmp((*(const ck_entry *const *)a)->name, (*(const ck_entry *const *)b)->name);
}

/* The layout pack_layout_of hands out, against the bytes b of the pack and the index's entries:
 * the header as stored, blobs where FORMAT.md puts them, numbered by first use, each tensor's
 * blob holding exactly its bytes, and the entries in natural order. */
static void assert_layout(const ck_index *ix, const unsigned char *b, size_t len)
{
    const pack_layout *pl = pack_layout_of(ix, 0);
    cr_assert_not_null(pl);
    pack_header h;
    pack_header_decode(b, &h);
    cr_assert_eq(memcmp(&pl->header, &h, sizeof h), 0);
    cr_assert_eq(pl->file, 0);
    cr_assert_eq(pl->first_entry, 0);
    cr_assert_eq(pl->nentries, ix->nentries);
    cr_assert_eq(pl->nblobs, get_le64(b + 64 + 8));
    cr_assert_eq(len, h.checksum_offset + 8 * (uint64_t)pl->nblobs + 8);
    uint64_t end = h.data_offset;
    for (uint32_t k = 0; k < pl->nblobs; k++) {
        cr_assert_eq(pl->blobs[k].offset, h.data_offset + (end - h.data_offset + 255) / 256 * 256);
        end = pl->blobs[k].offset + pl->blobs[k].length;
        cr_assert_lt(pl->blob_entry[k], pl->nentries);
        cr_assert_eq(pl->entry_blob[pl->blob_entry[k]], k);
        for (uint32_t i = 0; i < pl->blob_entry[k]; i++)
            cr_assert_neq(pl->entry_blob[i], k, "blob %u named by entry %u, before its first", k, i);
    }
    cr_assert_eq(h.data_length, (end - h.data_offset + 4095) / 4096 * 4096);
    for (size_t i = 0; i < ix->nentries; i++) {
        const ck_entry *e = &ix->entries[i];
        if (i > 0)
            cr_assert_lt(ck_natural_cmp(e[-1].name, e[-1].name_len, e->name, e->name_len), 0);
        if (e->kind == CK_VALUE) {
            cr_assert_eq(pl->entry_blob[i], UINT32_MAX);
            continue;
        }
        cr_assert_lt(pl->entry_blob[i], pl->nblobs);
        const pack_blob *blob = &pl->blobs[pl->entry_blob[i]];
        cr_assert_eq(blob->offset, e->ext.offset);
        cr_assert_eq(blob->length, e->nbytes);
    }
}

/* Everything FORMAT.md promises about a loaded pack, checked on ix against its bytes b. */
static void assert_consistent(const ck_index *ix, const unsigned char *b, size_t len)
{
    uint64_t data_offset = get_le64(b + 32), data_length = get_le64(b + 40);
    const ck_entry **sorted = malloc((ix->nentries + 1) * sizeof *sorted);
    cr_assert_not_null(sorted);
    for (size_t i = 0; i < ix->nentries; i++) {
        const ck_entry *e = &ix->entries[i];
        sorted[i] = e;
        cr_assert_eq(strlen(e->name), e->name_len);
        cr_assert_eq(ck_utf8_invalid_at((const unsigned char *)e->name, e->name_len),
                     e->name_len);
        cr_assert(e->name_len > 0 || ix->nentries == 1);
        cr_assert_eq(e->layout, CK_CONTIGUOUS);
        if (e->kind == CK_VALUE) {
            cr_assert_lt(e->dtype, CK_VAL_TYPE_COUNT);
            cr_assert_eq(e->rank, 0);
            continue;
        }
        cr_assert_eq(e->kind, CK_TENSOR);
        cr_assert_lt(e->dtype, CK_DTYPE_COUNT);
        cr_assert_leq(e->rank, CK_MAX_RANK);
        uint64_t n;
        cr_assert_eq(ck_tensor_nbytes(e->rank, e->shape, e->dtype, &n), 0);
        cr_assert_eq(n, e->nbytes);
        cr_assert_eq(e->ext.length, e->nbytes);
        cr_assert_eq(e->ext.file, 0);
        cr_assert_geq(e->ext.offset, data_offset);
        cr_assert_eq((e->ext.offset - data_offset) % 256, 0);
        cr_assert_leq(e->ext.offset + e->ext.length, data_offset + data_length);
        cr_assert_leq(data_offset + data_length, len);
        unsigned char *got = malloc(e->nbytes + 1);
        cr_assert_not_null(got);
        cr_assert_eq(ck_entry_read(ix, e, got, e->nbytes, 0), (ssize_t)e->nbytes);
        cr_assert_eq(memcmp(got, b + e->ext.offset, e->nbytes), 0);
        free(got);
    }
    assert_layout(ix, b, len);
    qsort(sorted, ix->nentries, sizeof *sorted, by_entry_name);
    for (size_t i = 1; i < ix->nentries; i++)
        cr_assert(strcmp(sorted[i - 1]->name, sorted[i]->name) != 0, "duplicate '%s'",
                  sorted[i]->name);
    for (size_t m = 0; m < ix->nmeta; m++) {
        cr_assert_eq(ck_utf8_invalid_at((const unsigned char *)ix->meta[m].key,
                                        strlen(ix->meta[m].key)), strlen(ix->meta[m].key));
        cr_assert_eq(ck_utf8_invalid_at((const unsigned char *)ix->meta[m].value,
                                        strlen(ix->meta[m].value)), strlen(ix->meta[m].value));
    }
    free(sorted);
}

/* --- header encoding ------------------------------------------------------------------- */

Test(pack_codec, encode_matches_the_format)
{
    size_t len;
    unsigned char *b = one_tensor_bytes(&len);
    pack_header h;
    pack_header_decode(b, &h);
    cr_assert_eq(h.version, 1);
    cr_assert_eq(h.flags, 0);
    cr_assert_eq(h.index_offset, 64);
    cr_assert_eq(h.index_length, get_le64(b + 24));
    cr_assert_eq(h.data_offset, 4096);
    cr_assert_eq(h.data_length, 4096);
    cr_assert_eq(h.checksum_offset, 8192);
    cr_assert_eq(h.index_xxh3, get_le64(b + 56));
    unsigned char out[PACK_HEADER_SIZE];
    pack_header_encode(&h, out);
    cr_assert_eq(memcmp(out, b, PACK_HEADER_SIZE), 0);
    free(b);
}

Test(pack_codec, every_byte_in_its_place)
{
    pack_header h = {.version = 0x04030201, .flags = 0x08070605,
                     .index_offset = 0x1817161514131211ull, .index_length = 0x2827262524232221ull,
                     .data_offset = 0x3837363534333231ull, .data_length = 0x4847464544434241ull,
                     .checksum_offset = 0x5857565554535251ull,
                     .index_xxh3 = 0x6867666564636261ull};
    unsigned char out[PACK_HEADER_SIZE];
    memset(out, 0xee, sizeof out);
    pack_header_encode(&h, out);
    cr_assert_eq(memcmp(out, "CKPTPACK", 8), 0);
    for (unsigned i = 8; i < 64; i++) {
        unsigned field = i < 16 ? (i - 8) / 4 : 2 + (i - 16) / 8;
        unsigned byte = i < 16 ? (i - 8) % 4 : (i - 16) % 8;
        unsigned want = i < 16 ? (field + 0) * 4 + byte + 1 : 0x11 + (field - 2) * 0x10 + byte;
        cr_assert_eq(out[i], want, "byte %u is 0x%02x, not 0x%02x", i, out[i], want);
    }
    pack_header back;
    pack_header_decode(out, &back);
    cr_assert_eq(memcmp(&back, &h, sizeof h), 0);
}

Test(pack_codec, probe)
{
    cr_assert(pack_probe((const unsigned char *)"CKPTPACK", 8));
    cr_assert(pack_probe((const unsigned char *)"CKPTPACK\x01\x00", 10));
    cr_assert_not(pack_probe((const unsigned char *)"CKPTPAC", 7));
    cr_assert_not(pack_probe((const unsigned char *)"CKPTPACX", 8));
    cr_assert_not(pack_probe((const unsigned char *)"ckptpack", 8));
    cr_assert_not(pack_probe((const unsigned char *)"", 0));
}

/* --- packs that load -------------------------------------------------------------------- */

Test(pack_ok, sample)
{
    size_t len, index_len;
    unsigned char *b = sample_bytes(&len, &index_len);
    const char *path = tmp_file(b, len);
    ck_index *ix = open_ok(path);
    cr_assert_str_eq(ix->format, "pack");
    cr_assert_eq(ix->nfiles, 1);
    cr_assert_eq(ix->nentries, SAMPLE_TENSORS + SAMPLE_VALUES);
    uint64_t data_offset = get_le64(b + 32);
    cr_assert_eq(data_offset, 4096);
    for (size_t i = 0; i < SAMPLE_TENSORS; i++) {
        const tensor_spec *t = &sample_tensors[i];
        const ck_entry *e = &ix->entries[i];
        cr_assert_str_eq(e->name, t->name);
        cr_assert_eq(e->name_len, strlen(t->name));
        cr_assert_eq(e->kind, CK_TENSOR);
        cr_assert_eq(e->layout, CK_CONTIGUOUS);
        cr_assert_eq(e->dtype, t->dt, "%s", t->name);
        cr_assert_eq(e->rank, t->rank, "%s", t->name);
        for (unsigned d = 0; d < t->rank; d++)
            cr_assert_eq(e->shape[d], t->dims[d], "%s dim %u", t->name, d);
        uint64_t n = spec_nbytes(t);
        cr_assert_eq(e->nbytes, n, "%s", t->name);
        cr_assert_eq(e->ext.length, n);
        cr_assert_eq(e->ext.file, 0);
        cr_assert_eq(e->ext.offset % 256, 0);
        cr_assert_eq(memcmp(b + e->ext.offset, sample_data[t->blob], n), 0);
        unsigned char got[600];
        cr_assert_eq(ck_entry_read(ix, e, got, sizeof got, 0), (ssize_t)n, "%s", t->name);
        cr_assert_eq(memcmp(got, sample_data[t->blob], n), 0, "%s", t->name);
        if (n > 3) { /* a read from the middle */
            memset(got, 0, sizeof got);
            cr_assert_eq(ck_entry_read(ix, e, got, 2, n - 3), 2);
            cr_assert_eq(memcmp(got, sample_data[t->blob] + n - 3, 2), 0);
        }
        cr_assert_eq(ck_entry_read(ix, e, got, sizeof got, n), 0);
    }
    /* The tied pair reads the same bytes from the same place. */
    const ck_entry *embed = ck_index_find(ix, "embed.weight");
    cr_assert_eq(embed->ext.offset, ck_index_find(ix, "lm_head.weight")->ext.offset);
    /* Blob placement: 256-aligned, in order. */
    cr_assert_eq(ck_index_find(ix, "a.weight")->ext.offset, 4096);
    cr_assert_eq(ck_index_find(ix, "b.bf16")->ext.offset, 4096 + 256);
    cr_assert_eq(ck_index_find(ix, "d.empty")->ext.offset,
                 ck_index_find(ix, "e.f4")->ext.offset);
    for (size_t i = 0; i < SAMPLE_VALUES; i++) {
        const value_spec *v = &sample_values[i];
        const ck_entry *e = &ix->entries[SAMPLE_TENSORS + i];
        cr_assert_str_eq(e->name, v->name);
        cr_assert_eq(e->kind, CK_VALUE);
        cr_assert_eq(e->dtype, v->type);
        cr_assert_eq(e->rank, 0);
        cr_assert_eq(e->nbytes, v->len);
        cr_assert_eq(memcmp(e->text, v->text, v->len), 0);
        char got[32];
        cr_assert_eq(ck_entry_read(ix, e, got, sizeof got, 0), (ssize_t)v->len);
        cr_assert_eq(memcmp(got, v->text, v->len), 0);
    }
    /* The layout is what the index holds, blob for blob and entry for entry. */
    const pack_layout *pl = pack_layout_of(ix, 0);
    cr_assert_not_null(pl);
    cr_assert_eq(pl->nblobs, SAMPLE_BLOBS);
    cr_assert_eq(pl->header.index_length, index_len);
    cr_assert_eq(pl->header.data_length, get_le64(b + 40));
    bytebuf again = {0};
    pk_blob placed[SAMPLE_BLOBS];
    sample(&again, placed);
    free(again.p);
    for (size_t k = 0; k < SAMPLE_BLOBS; k++) {
        cr_assert_eq(pl->blobs[k].offset, data_offset + placed[k].offset, "blob %zu", k);
        cr_assert_eq(pl->blobs[k].length, placed[k].length, "blob %zu", k);
    }
    for (size_t i = 0; i < SAMPLE_TENSORS; i++)
        cr_assert_eq(pl->entry_blob[i], sample_tensors[i].blob, "%s", sample_tensors[i].name);
    for (size_t i = 0; i < SAMPLE_VALUES; i++)
        cr_assert_eq(pl->entry_blob[SAMPLE_TENSORS + i], UINT32_MAX);
    cr_assert_eq(pl->blob_entry[3], 3);  /* d.empty, then d.empty2 */
    cr_assert_eq(pl->blob_entry[5], 6);  /* embed.weight, then lm_head.weight */
    cr_assert_eq(pl->blob_entry[10], 11);
    cr_assert_eq(ix->nmeta, SAMPLE_META);
    for (size_t m = 0; m < SAMPLE_META; m++) {
        cr_assert_str_eq(ix->meta[m].key, sample_meta[m][0]);
        cr_assert_str_eq(ix->meta[m].value, sample_meta[m][1]);
    }
    assert_consistent(ix, b, len);
    ck_index_free(ix);
    free(b);
}

Test(pack_ok, empty_pack)
{
    bytebuf ix = {0};
    pk_counts(&ix, 0, 0, 0, 0);
    size_t len;
    unsigned char *b = pk_bytes(&ix, NULL, 0, &len);
    cr_assert_eq(len, 4096 + 8);
    ck_index *cx = open_ok(tmp_file(b, len));
    cr_assert_eq(cx->nentries, 0);
    cr_assert_eq(cx->nmeta, 0);
    ck_index_free(cx);
    free(b);
    free(ix.p);
}

Test(pack_ok, only_an_empty_tensor_and_no_data_region)
{
    bytebuf ix = {0};
    pk_blob blob = {.length = 0};
    pk_counts(&ix, 1, 1, 0, 0);
    pk_blobs(&ix, &blob, 1);
    pk_tensor(&ix, "nothing", CK_F64, 2, (int64_t[]){7, 0}, 0);
    size_t len;
    unsigned char *b = pk_bytes(&ix, &blob, 1, &len);
    cr_assert_eq(get_le64(b + 40), 0);
    ck_index *cx = open_ok(tmp_file(b, len));
    cr_assert_eq(cx->nentries, 1);
    cr_assert_eq(cx->entries[0].nbytes, 0);
    cr_assert_eq(cx->entries[0].shape[0], 7);
    char got[4];
    cr_assert_eq(ck_entry_read(cx, &cx->entries[0], got, sizeof got, 0), 0);
    ck_index_free(cx);
    free(b);
    free(ix.p);
}

Test(pack_ok, empty_blob_at_the_end_of_the_region)
{
    bytebuf ix = {0};
    pk_blob blobs[2] = {{.length = 4096}, {.length = 0}};
    pk_place(blobs, 2);
    cr_assert_eq(blobs[1].offset, 4096);
    pk_counts(&ix, 2, 2, 0, 0);
    pk_blobs(&ix, blobs, 2);
    pk_tensor(&ix, "a", CK_U8, 1, (int64_t[]){4096}, 0);
    pk_tensor(&ix, "b", CK_U8, 1, (int64_t[]){0}, 1);
    const char *path = pk_file(&ix, blobs, 2);
    free(ix.p);
    ck_index *cx = open_ok(path);
    cr_assert_eq(cx->entries[1].ext.offset, 4096 + 4096);
    ck_index_free(cx);
}

Test(pack_ok, lone_entry_may_have_the_empty_name)
{
    bytebuf ix = {0};
    pk_blob blob;
    blob = (pk_blob){.length = 8};
    pk_counts(&ix, 1, 1, 0, 0);
    pk_blobs(&ix, &blob, 1);
    pk_tensor(&ix, "", CK_I64, 0, NULL, 0);
    const char *path = pk_file(&ix, &blob, 1);
    free(ix.p);
    ck_index *cx = open_ok(path);
    cr_assert_str_eq(cx->entries[0].name, "");
    cr_assert_eq(cx->entries[0].rank, 0);
    cr_assert_eq(cx->entries[0].nbytes, 8);
    ck_index_free(cx);

    ix = (bytebuf){0};
    no_blobs(&ix, 1);
    pk_value(&ix, "", CK_VAL_INT, "7\n", 2);
    path = pk_file(&ix, NULL, 0);
    free(ix.p);
    cx = open_ok(path);
    cr_assert_str_eq(cx->entries[0].name, "");
    cr_assert_eq(cx->entries[0].kind, CK_VALUE);
    ck_index_free(cx);
}

Test(pack_ok, natural_name_order)
{
    /* Digit runs compare as numbers; for equal numbers, fewer leading zeros come first. */
    static const char *const names[] = {"a", "layers.2", "layers.02", "layers.10",
                                        "layers.10.w", "layers.10a", "x"};
    enum { N = sizeof names / sizeof *names };
    bytebuf ix = {0};
    no_blobs(&ix, N);
    for (size_t i = 0; i < N; i++)
        pk_value(&ix, names[i], CK_VAL_INT, "1", 1);
    const char *path = pk_file(&ix, NULL, 0);
    free(ix.p);
    ck_index *cx = open_ok(path);
    for (size_t i = 0; i < N; i++)
        cr_assert_str_eq(cx->entries[i].name, names[i]);
    ck_index_free(cx);
}

Test(pack_ok, rank_64_and_utf8_names)
{
    int64_t dims[64];
    for (int d = 0; d < 64; d++)
        dims[d] = 1;
    dims[63] = 3;
    bytebuf ix = {0};
    pk_blob blob = {.length = 6};
    pk_counts(&ix, 2, 1, 0, 0);
    pk_blobs(&ix, &blob, 1);
    pk_tensor(&ix, "x", CK_U8, 1, (int64_t[]){6}, 0); /* shares the blob, another dtype */
    pk_tensor(&ix, "\xe5\xb1\x82.\xf0\x9f\x98\x80", CK_I16, 64, dims, 0);
    const char *path = pk_file(&ix, &blob, 1);
    free(ix.p);
    ck_index *cx = open_ok(path);
    cr_assert_str_eq(cx->entries[1].name, "\xe5\xb1\x82.\xf0\x9f\x98\x80");
    cr_assert_eq(cx->entries[1].rank, 64);
    cr_assert_eq(cx->entries[1].shape[63], 3);
    cr_assert_eq(cx->entries[1].ext.offset, cx->entries[0].ext.offset);
    ck_index_free(cx);
}

Test(pack_ok, index_that_ends_exactly_at_the_data)
{
    /* 64 + index = 4096: data_offset is the index's end itself. */
    bytebuf ix = {0};
    no_blobs(&ix, 1);
    size_t text = 4096 - 64 - 24 - (4 + 1 + 4 + 4);
    char *t = malloc(text);
    memset(t, 'x', text);
    pk_value(&ix, "v", CK_VAL_STR, t, text);
    free(t);
    cr_assert_eq(ix.len, 4096 - 64);
    size_t len;
    unsigned char *b = pk_bytes(&ix, NULL, 0, &len);
    cr_assert_eq(get_le64(b + 32), 4096);
    ck_index *cx = open_ok(tmp_file(b, len));
    cr_assert_eq(cx->entries[0].nbytes, text);
    ck_index_free(cx);
    free(b);
    free(ix.p);
}

Test(pack_ok, data_padding_and_trailer_are_not_read)
{
    /* Garbage in the padding, the data and the trailer changes nothing at open. */
    size_t len, index_len;
    unsigned char *b = sample_bytes(&len, &index_len);
    for (size_t i = 64 + index_len; i < len; i++)
        b[i] ^= 0xa5;
    ck_index *ix = open_ok(tmp_file(b, len));
    cr_assert_eq(ix->nentries, SAMPLE_TENSORS + SAMPLE_VALUES);
    ck_index_free(ix);
    free(b);
}

/* Bytes this process has read with read(2) and pread(2) so far, not counting its own reads of
 * /proc/self/io: their length grows with the digits of the counts, so it is counted, not
 * estimated from one sample. */
static unsigned long long bytes_read(void)
{
    static unsigned long long own; /* bytes read from /proc/self/io by earlier calls */
    int fd = open("/proc/self/io", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    char text[1024];
    size_t len = 0;
    for (ssize_t n; len < sizeof text - 1 && (n = read(fd, text + len, sizeof text - 1 - len)) > 0;)
        len += (size_t)n;
    close(fd);
    text[len] = 0;
    const char *at = strstr(text, "rchar: ");
    unsigned long long n = at ? strtoull(at + 7, NULL, 10) - own : 0;
    own += len;
    return n;
}

Test(pack_ok, reads_only_the_header_and_the_index)
{
    if (access("/proc/self/io", R_OK) != 0)
        cr_skip_test("no /proc/self/io here");
    if (RUNNING_ON_VALGRIND) /* valgrind's own reads in this process count in rchar */
        cr_skip_test("under valgrind");
    bytebuf ix = {0};
    pk_blob blob;
    one_tensor(&ix, &blob, 1 << 18); /* 1 MiB of data */
    size_t len;
    unsigned char *b = pk_bytes(&ix, &blob, 1, &len);
    ck_index *cx = index_over(b, len);
    ck_error err = {""};
    unsigned long long before = bytes_read();
    cr_assert_eq(pack_read_file(cx, 0, &err), 0, "%s", err.msg);
    unsigned long long got = bytes_read() - before;
    cr_assert_eq(got, 64 + ix.len, "read %llu bytes, the header and index are %llu", got,
                 64 + (ull)ix.len);
    ck_index_free(cx);
    free(b);
    free(ix.p);
}

Test(pack_ok, pack_read_file_appends)
{
    /* Called directly on an index that already holds entries, it appends after them. */
    size_t len;
    unsigned char *b = one_tensor_bytes(&len);
    ck_index *ix = index_over(b, len);
    add_contig(ix, "before", CK_U8, 0, NULL, 0, 1);
    ck_error err = {""};
    cr_assert_eq(pack_read_file(ix, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(ix->nentries, 2);
    cr_assert_str_eq(ix->entries[1].name, "w");
    cr_assert_eq(ix->entries[1].ext.offset, 4096);
    /* The layout counts the pack's own entries: its entry 0 is the index's entry 1. */
    const pack_layout *pl = pack_layout_of(ix, 0);
    cr_assert_not_null(pl);
    cr_assert_eq(pl->first_entry, 1);
    cr_assert_eq(pl->nentries, 1);
    cr_assert_eq(pl->entry_blob[0], 0);
    cr_assert_eq(pl->blob_entry[0], 0);
    cr_assert_eq(pl->blobs[0].offset, 4096);
    cr_assert_eq(pl->blobs[0].length, 4);
    cr_assert_null(pack_layout_of(ix, 1));
    ck_index_free(ix);
    free(b);
}

Test(pack_ok, no_layout_without_a_pack)
{
    /* Another format has none; nor has a pack whose reading failed. */
    ck_index *ix = open_ok(st_file("{}", NULL, 0));
    cr_assert_null(pack_layout_of(ix, 0));
    ck_index_free(ix);
    size_t len;
    unsigned char *b = one_tensor_bytes(&len);
    b[64 + 24] ^= 1; /* the blob offset, with the index checksum fixed: refused */
    pk_fix_xxh3(b);
    ix = index_over(b, len);
    ck_error err = {""};
    cr_assert_eq(pack_read_file(ix, 0, &err), -1);
    cr_assert_null(pack_layout_of(ix, 0));
    ck_index_free(ix);
    free(b);
}

/* --- the header ---------------------------------------------------------------------------- */

/* The one-tensor pack with the header's bytes [off, off+width) set to v must be refused. */
static void header_refused(size_t off, int width, uint64_t v, const char *what)
{
    size_t len;
    unsigned char *b = one_tensor_bytes(&len);
    if (width == 4)
        put_le32(b + off, (uint32_t)v);
    else
        put_le64(b + off, v);
    const char *path = tmp_file(b, len);
    free(b);
    assert_open_fails(path, what);
}

Test(pack_header, too_short_for_a_header)
{
    size_t len;
    unsigned char *b = one_tensor_bytes(&len);
    for (size_t n = 0; n < 64; n++) {
        ck_index *ix = index_over(b, n);
        ck_error err = {""};
        cr_assert_eq(pack_read_file(ix, 0, &err), -1);
        assert_error(&err, ix->files[0].path,
                     strf("file is %zu bytes, too short for a pack header (needs 64)", n));
        ck_index_free(ix);
        /* Through ck_open: once the magic is there, the same. */
        const char *path = tmp_file(b, n);
        assert_open_fails(path, n == 0  ? "empty file"
                                : n < 8 ? "not a checkpoint format ckptfs knows"
                                        : strf("file is %zu bytes, too short for a pack header",
                                               n));
    }
    free(b);
}

Test(pack_header, wrong_magic)
{
    size_t len;
    unsigned char *b = one_tensor_bytes(&len);
    b[7] = 'J';
    ck_index *ix = index_over(b, len);
    ck_error err = {""};
    cr_assert_eq(pack_read_file(ix, 0, &err), -1);
    assert_error(&err, ix->files[0].path,
                 "pack header: magic is 43 4b 50 54 50 41 43 4a, not \"CKPTPACK\" (bytes 0-7)");
    ck_index_free(ix);
    assert_open_fails(tmp_file(b, len), "not a checkpoint format ckptfs knows (first bytes 43 4b");
    free(b);
}

Test(pack_header, version)
{
    header_refused(8, 4, 0, "pack header: version 0, only version 1 is known (bytes 8-11)");
    header_refused(8, 4, 2, "pack header: version 2, only version 1 is known (bytes 8-11)");
    header_refused(8, 4, UINT32_MAX, "pack header: version 4294967295, only version 1");
}

Test(pack_header, flags)
{
    header_refused(12, 4, 1, "pack header: flags 0x1, but no flag is defined (bytes 12-15)");
    header_refused(12, 4, 0x80000000u, "pack header: flags 0x80000000, but no flag is defined");
}

Test(pack_header, index_offset)
{
    static const uint64_t bad[] = {0, 63, 65, 128, 4096, UINT64_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        header_refused(16, 8, bad[i], strf("pack header: index_offset %llu, must be 64 (bytes "
                                           "16-23)", (ull)bad[i]));
}

Test(pack_header, index_length_over_the_limit)
{
    header_refused(24, 8, (1ull << 30) + 1, "pack header: index_length 1073741825 exceeds the "
                   "limit of 1073741824 (bytes 24-31)");
    header_refused(24, 8, UINT64_MAX, "index_length 18446744073709551615 exceeds the limit");
}

Test(pack_header, index_runs_past_data_offset)
{
    /* At the limit the length is only too long for data_offset: nothing is allocated. */
    header_refused(24, 8, 1ull << 30, "pack header: the index [64, 1073741888) runs past "
                   "data_offset 4096 (bytes 24-31)");
    header_refused(24, 8, 4096 - 63, "the index [64, 4097) runs past data_offset 4096");
    size_t len;
    unsigned char *b = one_tensor_bytes(&len);
    ull index_end = 64 + get_le64(b + 24);
    free(b);
    header_refused(32, 8, 0, strf("the index [64, %llu) runs past data_offset 0", index_end));
}

Test(pack_header, data_offset)
{
    size_t len;
    unsigned char *b = one_tensor_bytes(&len);
    ull index_end = 64 + get_le64(b + 24);
    free(b);
    header_refused(32, 8, 4095, "pack header: data_offset 4095 is not a multiple of 4096 "
                   "(bytes 32-39)");
    header_refused(32, 8, 4097, "data_offset 4097 is not a multiple of 4096");
    header_refused(32, 8, 8192, strf("pack header: data_offset 8192, but the index ends at "
                                     "byte %llu, so the data must start at 4096 (bytes 32-39)",
                                     index_end));
}

Test(pack_header, data_length)
{
    header_refused(40, 8, 1, "pack header: data_length 1 is not a multiple of 4096 (bytes "
                   "40-47)");
    header_refused(40, 8, 4096 + 256, "data_length 4352 is not a multiple of 4096");
    header_refused(40, 8, UINT64_MAX - 4095, "pack header: data_offset 4096 + data_length "
                   "18446744073709547520 overflows (bytes 40-47)");
}

Test(pack_header, checksum_offset)
{
    static const uint64_t bad[] = {0, 4096, 8191, 8193, 12288, UINT64_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        header_refused(48, 8, bad[i], strf("pack header: checksum_offset %llu, but data_offset "
                                           "+ data_length is 8192 (bytes 48-55)",
                                           (ull)bad[i]));
}

Test(pack_header, index_checksum)
{
    size_t len;
    unsigned char *b = one_tensor_bytes(&len);
    uint64_t sum = get_le64(b + 56);
    free(b);
    header_refused(56, 8, sum ^ 1, strf("pack index: XXH3 is %016llx, the header says %016llx "
                                        "(bytes 56-63)", (ull)sum, (ull)(sum ^ 1)));
    header_refused(56, 8, 0, "pack index: XXH3 is");
}

Test(pack_header, index_byte_changed)
{
    size_t len, index_len;
    unsigned char *b = sample_bytes(&len, &index_len);
    for (size_t i = 64; i < 64 + index_len; i += 7) {
        b[i] ^= 0x10;
        assert_open_fails(tmp_file(b, len), "pack index: XXH3 is");
        b[i] ^= 0x10;
    }
    free(b);
}

/* --- the file's size and reads ------------------------------------------------------------ */

Test(pack_file, one_byte_short_or_long)
{
    size_t len;
    unsigned char *b = one_tensor_bytes(&len);
    cr_assert_eq(len, 8192 + 16);
    b = realloc(b, len + 1);
    b[len] = 0;
    assert_open_fails(tmp_file(b, len + 1), "file is 8209 bytes, but its checksum trailer (8 × 1 "
                      "blobs + 8 bytes at byte 8192) ends at byte 8208");
    assert_open_fails(tmp_file(b, len - 1), "file is 8207 bytes, but its checksum trailer");
    assert_open_fails(tmp_file(b, 8192 + 8), "file is 8200 bytes, but its checksum trailer");
    assert_open_fails(tmp_file(b, 8192 + 7),
                      "file is 8199 bytes, too short for a pack whose checksums start at byte "
                      "8192 (header bytes 48-55)");
    assert_open_fails(tmp_file(b, 64), "file is 64 bytes, too short for a pack whose checksums");
    free(b);
}

Test(pack_file, trailer_sized_for_other_blob_counts)
{
    /* The trailer of a 3-blob pack behind the index of a 1-blob pack. */
    bytebuf ix = {0};
    pk_blob blob;
    one_tensor(&ix, &blob, 1);
    pk_blob three[3] = {blob, {.offset = 256}, {.offset = 512}};
    const char *path = pk_file(&ix, three, 3);
    free(ix.p);
    assert_open_fails(path, "file is 8224 bytes, but its checksum trailer (8 × 1 blobs + 8 bytes "
                      "at byte 8192) ends at byte 8208");
}

Test(pack_file, huge_index_in_a_small_file)
{
    /* A header that promises a 1 GiB index: the file's size refutes it before any allocation. */
    size_t len;
    unsigned char *b = one_tensor_bytes(&len);
    put_le64(b + 24, (1ull << 30) - 64);
    put_le64(b + 32, 1ull << 30);
    put_le64(b + 40, 0);
    put_le64(b + 48, 1ull << 30);
    assert_open_fails(tmp_file(b, len), strf("file is %zu bytes, too short for a pack whose "
                                             "checksums start at byte 1073741824", len));
    free(b);
}

/* The file shrinks between the index's fstat and the read: a read error, not garbage. */
static void shrunk(size_t to, const char *what)
{
    size_t len;
    unsigned char *b = one_tensor_bytes(&len);
    ck_index *ix = index_over(b, len);
    free(b);
    cr_assert_eq(truncate(ix->files[0].path, (off_t)to), 0);
    ck_error err = {""};
    cr_assert_eq(pack_read_file(ix, 0, &err), -1);
    assert_error(&err, ix->files[0].path, strf("%s: %s", what, strerror(EIO)));
    ck_index_free(ix);
}

Test(pack_file, header_unreadable)
{
    shrunk(10, "cannot read the pack header");
}

Test(pack_file, index_unreadable)
{
    shrunk(80, "cannot read the pack index");
}

/* --- the index's counts ---------------------------------------------------------------- */

/* A pack whose index is the counts and then `rest` zero bytes. */
static void counts_refused(uint64_t nentries, uint64_t nblobs, uint32_t nmeta,
                           uint32_t reserved, size_t rest, const char *what)
{
    bytebuf ix = {0};
    pk_counts(&ix, nentries, nblobs, nmeta, reserved);
    for (size_t i = 0; i < rest; i++)
        buf_u8(&ix, 0);
    refused(&ix, NULL, 0, what);
}

Test(pack_index, shorter_than_the_counts)
{
    for (size_t n = 0; n < 24; n++) {
        bytebuf ix = {0};
        pk_counts(&ix, 0, 0, 0, 0);
        ix.len = n;
        refused(&ix, NULL, 0, strf("pack index: the index ends at byte %zu, inside the counts "
                                   "(24 bytes at byte 64)", 64 + n));
    }
}

Test(pack_index, reserved_count_field)
{
    counts_refused(0, 0, 0, 1, 0, "pack index: reserved field is 0x1, not 0 (byte 84)");
    counts_refused(0, 0, 0, 0xdeadbeef, 0, "reserved field is 0xdeadbeef, not 0 (byte 84)");
}

Test(pack_index, counts_larger_than_the_index)
{
    counts_refused(1, 0, 0, 0, 11, "pack index: 1 entries, 0 blobs and 0 metadata pairs need "
                   "more than the 11 bytes after the counts (at least 12, 16 and 8 bytes each) "
                   "(byte 64)");
    counts_refused(0, 1, 0, 0, 15, "0 entries, 1 blobs and 0 metadata pairs need more than the "
                   "15 bytes");
    counts_refused(0, 0, 1, 0, 7, "0 entries, 0 blobs and 1 metadata pairs need more than the 7 "
                   "bytes");
    /* Each fits alone, not all together. */
    counts_refused(1, 1, 1, 0, 35, "1 entries, 1 blobs and 1 metadata pairs need more than the "
                   "35 bytes");
    counts_refused(UINT64_MAX, 0, 0, 0, 100, "18446744073709551615 entries");
    counts_refused(0, UINT64_MAX, 0, 0, 100, "0 entries, 18446744073709551615 blobs");
    counts_refused(0, 1ull << 60, 0, 0, 100, "0 entries, 1152921504606846976 blobs");
    counts_refused(0, 0, UINT32_MAX, 0, 100, "4294967295 metadata pairs");
    counts_refused(UINT64_MAX / 12 + 1, UINT64_MAX / 16 + 1, UINT32_MAX, 0, 100,
                   "need more than the 100 bytes");
}

Test(pack_index, bytes_left_over)
{
    for (size_t extra = 1; extra < 20; extra += 6) {
        bytebuf ix = {0};
        pk_blob blob;
        one_tensor(&ix, &blob, 2);
        ull at = here(&ix);
        for (size_t i = 0; i < extra; i++)
            buf_u8(&ix, 0);
        refused(&ix, &blob, 1, strf("pack index: %zu bytes left over after the last entry "
                                    "(byte %llu)", extra, at));
    }
    bytebuf ix = {0};
    pk_counts(&ix, 0, 0, 0, 0);
    buf_u8(&ix, 0);
    refused(&ix, NULL, 0, "pack index: 1 bytes left over after the last entry (byte 88)");
}

/* --- metadata ------------------------------------------------------------------------------- */

Test(pack_meta, order_and_repeats_kept)
{
    bytebuf ix = {0};
    pk_counts(&ix, 0, 0, 4, 0);
    pk_meta(&ix, "ckptfs.source_format", "pack");
    pk_meta(&ix, "z", "1");
    pk_meta(&ix, "a", "2");
    pk_meta(&ix, "ckptfs.source_format", "safetensors");
    const char *path = pk_file(&ix, NULL, 0);
    free(ix.p);
    ck_index *cx = open_ok(path);
    cr_assert_eq(cx->nmeta, 4);
    cr_assert_str_eq(cx->meta[0].key, "ckptfs.source_format");
    cr_assert_str_eq(cx->meta[0].value, "pack");
    cr_assert_str_eq(cx->meta[1].key, "z");
    cr_assert_str_eq(cx->meta[2].key, "a");
    cr_assert_str_eq(cx->meta[3].value, "safetensors");
    ck_index_free(cx);
}

Test(pack_meta, ends_early)
{
    bytebuf ix = {0};
    pk_counts(&ix, 0, 0, 1, 0);
    pk_str(&ix, "abcdefgh", 4);
    refused(&ix, NULL, 0, "pack metadata 0: the index ends at byte 96, inside the value length "
            "(4 bytes at byte 96)");

    pk_counts(&ix, 0, 0, 1, 0);
    buf_u32(&ix, 9);
    buf_put(&ix, "abcd", 4);
    refused(&ix, NULL, 0, "pack metadata 0: the index ends at byte 96, inside the key (9 bytes "
            "at byte 92)");

    pk_counts(&ix, 0, 0, 2, 0);
    pk_meta(&ix, "k", "v");
    buf_u32(&ix, 0);
    buf_u32(&ix, 0xffffffffu);
    refused(&ix, NULL, 0, "pack metadata 1: the index ends at byte 106, inside the value "
            "(4294967295 bytes at byte 106)");
}

Test(pack_meta, bad_strings)
{
    static const struct {
        const char *key, *value;
        uint32_t klen, vlen;
        const char *what;
        ull at;
    } cases[] = {
        {"a\0b", "v", 3, 1, "the key holds a NUL byte", 92 + 1},
        {"ab", "v\0", 2, 2, "the value holds a NUL byte", 92 + 2 + 4 + 1},
        {"a\xff", "v", 2, 1, "the key is not valid UTF-8", 92 + 1},
        /* overlong, a surrogate, past U+10FFFF, cut short */
        {"k", "\xc0\x80", 1, 2, "the value is not valid UTF-8", 92 + 1 + 4},
        {"k", "x\xed\xa0\x80", 1, 4, "the value is not valid UTF-8", 92 + 1 + 4 + 1},
        {"k\xf4\x90\x80\x80", "", 5, 0, "the key is not valid UTF-8", 92 + 1},
        {"k\xe2\x82", "", 3, 0, "the key is not valid UTF-8", 92 + 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        bytebuf ix = {0};
        pk_counts(&ix, 0, 0, 1, 0);
        pk_str(&ix, cases[i].key, cases[i].klen);
        pk_str(&ix, cases[i].value, cases[i].vlen);
        refused(&ix, NULL, 0, strf("pack metadata 0: %s (byte %llu)", cases[i].what,
                                   cases[i].at));
    }
}

Test(pack_meta, long_strings_leave_no_room_for_the_blob_table)
{
    /* The counts fit at 8 bytes a pair; a 20-byte key eats the blob table's room. */
    bytebuf ix = {0};
    pk_blob blob = {.length = 4};
    pk_counts(&ix, 0, 1, 1, 0);
    pk_meta(&ix, "twenty-byte-key-here", "");
    cr_assert_eq(ix.len, 24 + 28);
    refused(&ix, &blob, 1, "pack index: the index ends at byte 116, inside the blob table (16 "
            "bytes at byte 116)");
}

/* --- blobs ------------------------------------------------------------------------------------ */

/* An index of these blobs, each named by one U8 tensor of its length. */
static void blobs_refused(const pk_blob *blobs, size_t n, const pk_blob *data, size_t ndata,
                          const char *what)
{
    bytebuf ix = {0};
    pk_counts(&ix, n, n, 0, 0);
    pk_blobs(&ix, blobs, n);
    for (size_t i = 0; i < n; i++)
        pk_tensor(&ix, strf("t%zu", i), CK_U8, 1, (int64_t[]){(int64_t)blobs[i].length}, i);
    refused(&ix, data, ndata, what);
}

Test(pack_blob, misplaced)
{
    /* Each blob starts at the first multiple of 256 at or after the end of the one before, the
     * first at 0: no gap, no extra padding, no overlap, no other order. */
    pk_blob a[] = {{.offset = 128, .length = 4}};
    blobs_refused(a, 1, a, 1, "pack blob 0: offset 128, but the first blob starts at 0 "
                  "(byte 88)");
    pk_blob b[] = {{.offset = 256, .length = 4}};
    blobs_refused(b, 1, b, 1, "pack blob 0: offset 256, but the first blob starts at 0");
    pk_blob gap[] = {{.offset = 0, .length = 4}, {.offset = 512, .length = 4}};
    blobs_refused(gap, 2, gap, 2, "pack blob 1: offset 512, but blob 0 ends at 4, so this one "
                  "starts at 256, the next multiple of 256 (byte 104)");
    pk_blob odd[] = {{.offset = 0, .length = 4}, {.offset = 257, .length = 4}};
    blobs_refused(odd, 2, odd, 2, "pack blob 1: offset 257, but blob 0 ends at 4, so this one "
                  "starts at 256");
    pk_blob overlap[] = {{.offset = 0, .length = 300}, {.offset = 256, .length = 4}};
    blobs_refused(overlap, 2, overlap, 2, "pack blob 1: offset 256, but blob 0 ends at 300, so "
                  "this one starts at 512");
    pk_blob reversed[] = {{.offset = 256, .length = 4}, {.offset = 0, .length = 4}};
    blobs_refused(reversed, 2, reversed, 2, "pack blob 0: offset 256, but the first blob "
                  "starts at 0");
    /* An empty blob has its place too: right after the one before, not on top of it. */
    pk_blob empty[] = {{.offset = 0, .length = 4}, {.offset = 0, .length = 0}};
    blobs_refused(empty, 2, empty, 2, "pack blob 1: offset 0, but blob 0 ends at 4, so this "
                  "one starts at 256");
}

Test(pack_blob, offset_plus_length_overflows)
{
    pk_blob b[] = {{.offset = 0, .length = 4}, {.offset = 256, .length = UINT64_MAX - 255}};
    pk_blob data[] = {{.length = 4}, {.offset = 256}};
    blobs_refused(b, 2, data, 2, "pack blob 1: offset 256 + length 18446744073709551360 "
                  "overflows (byte 104)");
}

Test(pack_blob, outside_the_data_region)
{
    pk_blob data[] = {{.length = 4096}};
    pk_blob b[] = {{.offset = 0, .length = 4097}};
    blobs_refused(b, 1, data, 1, "pack blob 0: [0, 4097) lies outside the 4096-byte data region "
                  "(byte 88)");
    pk_blob c[] = {{.offset = 0, .length = 4096}, {.offset = 4096, .length = 1}};
    blobs_refused(c, 2, (pk_blob[]){{.length = 4096}, {.offset = 4096}}, 2, "pack blob 1: "
                  "[4096, 4097) lies outside the 4096-byte data region");
    pk_blob e[] = {{.offset = 0, .length = 1}};
    blobs_refused(e, 1, (pk_blob[]){{.length = 0}}, 1, "pack blob 0: [0, 1) lies outside the "
                  "0-byte data region");
}

Test(pack_blob, data_region_longer_than_its_blobs)
{
    /* The region ends at the first multiple of 4096 at or after the last blob's end. */
    pk_blob b[] = {{.offset = 0, .length = 4}};
    blobs_refused(b, 1, (pk_blob[]){{.length = 4097}}, 1, "pack header: data_length 8192, but "
                  "the last blob ends at 4, so the data region is 4096 bytes (bytes 40-47)");
    pk_blob e[] = {{.offset = 0, .length = 0}};
    blobs_refused(e, 1, (pk_blob[]){{.length = 1}}, 1, "pack header: data_length 4096, but the "
                  "last blob ends at 0, so the data region is 0 bytes");
}

Test(pack_blob, one_empty_blob_for_all_empty_tensors)
{
    bytebuf ix = {0};
    pk_blob b[] = {{.length = 0}, {.length = 0}, {.length = 8}}; /* all at offset 0 */
    pk_counts(&ix, 3, 3, 0, 0);
    pk_blobs(&ix, b, 3);
    pk_tensor(&ix, "a", CK_U8, 1, (int64_t[]){0}, 0);
    pk_tensor(&ix, "b", CK_F32, 2, (int64_t[]){0, 3}, 1);
    pk_tensor(&ix, "c", CK_F64, 0, NULL, 2);
    refused(&ix, b, 3, "pack blob 1: a second empty blob, after blob 0: all empty tensors share "
            "one (byte 104)");
}

Test(pack_blob, numbered_in_the_order_of_their_first_tensor)
{
    /* Two F32 [2048] whose entries name their blobs swapped: every size and checksum agrees,
     * but blob 1 is named first. A reader that trusted the numbers would put a's bytes where
     * b's are expected; a writer that rebuilt the layout would put them both in one place. */
    static float one[2048], two[2048];
    for (int i = 0; i < 2048; i++)
        one[i] = 1, two[i] = 2;
    bytebuf ix = {0};
    pk_blob b[] = {{.data = one, .length = 8192}, {.data = two, .length = 8192}};
    pk_place(b, 2);
    pk_counts(&ix, 2, 2, 0, 0);
    pk_blobs(&ix, b, 2);
    ull at = here(&ix) + 4 + 1 + 4 + 8;
    pk_tensor(&ix, "a", CK_F32, 1, (int64_t[]){2048}, 1);
    pk_tensor(&ix, "b", CK_F32, 1, (int64_t[]){2048}, 0);
    refused(&ix, b, 2, strf("pack entry 0 ('a'): names blob 1 before any entry names blob 0: "
                            "blobs are numbered in the order their first tensor appears (byte "
                            "%llu)", at));
    /* Further on: the third blob named before the second. */
    pk_blob c[] = {{.length = 1}, {.length = 1}, {.length = 1}};
    pk_place(c, 3);
    pk_counts(&ix, 3, 3, 0, 0);
    pk_blobs(&ix, c, 3);
    pk_tensor(&ix, "a", CK_U8, 0, NULL, 0);
    pk_tensor(&ix, "b", CK_U8, 0, NULL, 2);
    pk_tensor(&ix, "c", CK_U8, 0, NULL, 1);
    refused(&ix, c, 3, "pack entry 1 ('b'): names blob 2 before any entry names blob 1");
    /* A blob named again later (a tied tensor) is fine. */
    pk_counts(&ix, 3, 2, 0, 0);
    pk_blobs(&ix, c, 2);
    pk_tensor(&ix, "a", CK_U8, 0, NULL, 0);
    pk_tensor(&ix, "b", CK_U8, 0, NULL, 1);
    pk_tensor(&ix, "c", CK_U8, 0, NULL, 0);
    const char *path = pk_file(&ix, c, 2);
    free(ix.p);
    ck_index *cx = open_ok(path);
    cr_assert_eq(cx->entries[2].ext.offset, cx->entries[0].ext.offset);
    ck_index_free(cx);
}

Test(pack_blob, unused)
{
    bytebuf ix = {0};
    pk_blob b[3] = {{.length = 4}, {.length = 8}, {.length = 4}};
    pk_place(b, 3);
    pk_counts(&ix, 2, 3, 0, 0);
    pk_blobs(&ix, b, 3);
    pk_tensor(&ix, "a", CK_F32, 0, NULL, 0);
    pk_tensor(&ix, "c", CK_F32, 1, (int64_t[]){2}, 1);
    refused(&ix, b, 3, "pack blob 2: no tensor names it (byte 120)");

    /* A value does not count as naming one. */
    pk_counts(&ix, 1, 1, 0, 0);
    pk_blobs(&ix, b, 1);
    pk_value(&ix, "v", CK_VAL_NONE, "None", 4);
    refused(&ix, b, 1, "pack blob 0: no tensor names it (byte 88)");
}

/* --- entries -------------------------------------------------------------------------------- */

Test(pack_entry, name_ends_early)
{
    bytebuf ix = {0};
    no_blobs(&ix, 1);
    buf_u32(&ix, 100);
    buf_put(&ix, "abcdefgh", 8);
    refused(&ix, NULL, 0, "pack entry 0: the index ends at byte 100, inside the name (100 bytes "
            "at byte 92)");
}

Test(pack_entry, kind_ends_early)
{
    bytebuf ix = {0};
    no_blobs(&ix, 1);
    pk_str(&ix, "abcdefgh", 8);
    refused(&ix, NULL, 0, "pack entry 0 ('abcdefgh'): the index ends at byte 100, inside the "
            "kind, type, rank and reserved bytes (4 bytes at byte 100)");
}

Test(pack_entry, dims_end_early)
{
    bytebuf ix = {0};
    pk_blob blob = {.length = 4};
    pk_counts(&ix, 1, 1, 0, 0);
    pk_blobs(&ix, &blob, 1);
    ull at = here(&ix) + 4 + 1 + 4;
    pk_head(&ix, "w", 1, 0, CK_F32, 2, 0);
    buf_u64(&ix, 1);
    buf_u64(&ix, 1);
    refused(&ix, &blob, 1, strf("pack entry 0 ('w'): the index ends at byte %llu, inside the dims "
                                "and blob (24 bytes at byte %llu)", at + 16, at));
}

Test(pack_entry, text_ends_early)
{
    bytebuf ix = {0};
    no_blobs(&ix, 1);
    pk_head(&ix, "v", 1, 1, CK_VAL_STR, 0, 0);
    buf_put(&ix, "xyz", 3);
    refused(&ix, NULL, 0, "pack entry 0 ('v'): the index ends at byte 100, inside the text length "
            "(4 bytes at byte 97)");
    no_blobs(&ix, 1);
    pk_head(&ix, "v", 1, 1, CK_VAL_STR, 0, 0);
    pk_str(&ix, "xyz", 3);
    ix.len--;
    refused(&ix, NULL, 0, "pack entry 0 ('v'): the index ends at byte 103, inside the text (3 "
            "bytes at byte 101)");
}

Test(pack_entry, bad_names)
{
    static const struct {
        const char *name;
        size_t len;
        const char *what;
        size_t at;
    } cases[] = {
        {"a\0b", 3, "the name holds a NUL byte", 1},
        {"\0", 1, "the name holds a NUL byte", 0},
        {"ab\x80", 3, "the name is not valid UTF-8", 2},
        {"\xc1\xbf", 2, "the name is not valid UTF-8", 0},
        {"x\xe0\x80\x80", 4, "the name is not valid UTF-8", 1},
        {"\xed\xbf\xbf", 3, "the name is not valid UTF-8", 0},
        {"\xf8\x88\x80\x80\x80", 5, "the name is not valid UTF-8", 0},
        {"ok\xf0\x9f\x98", 5, "the name is not valid UTF-8", 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        bytebuf ix = {0};
        no_blobs(&ix, 1);
        ull at = here(&ix) + 4 + cases[i].at;
        pk_head(&ix, cases[i].name, cases[i].len, 1, CK_VAL_NONE, 0, 0);
        pk_str(&ix, "None", 4);
        refused(&ix, NULL, 0, strf("pack entry 0: %s (byte %llu)", cases[i].what, at));
    }
}

Test(pack_entry, empty_name_among_others)
{
    bytebuf ix = {0};
    no_blobs(&ix, 2);
    pk_value(&ix, "a", CK_VAL_NONE, "None", 4);
    ull at = here(&ix);
    pk_value(&ix, "", CK_VAL_NONE, "None", 4);
    refused(&ix, NULL, 0, strf("pack entry 1: empty name, allowed only for the one entry of a "
                               "pack with one entry (byte %llu)", at));
}

Test(pack_entry, reserved_byte)
{
    bytebuf ix = {0};
    no_blobs(&ix, 1);
    ull at = here(&ix) + 4 + 1 + 3;
    pk_head(&ix, "v", 1, 1, CK_VAL_NONE, 0, 1);
    pk_str(&ix, "None", 4);
    refused(&ix, NULL, 0, strf("pack entry 0 ('v'): reserved byte is 0x01, not 0 (byte %llu)",
                               at));
    no_blobs(&ix, 1);
    pk_head(&ix, "v", 1, 0, CK_U8, 0, 0x80);
    buf_u64(&ix, 0);
    refused(&ix, NULL, 0, "pack entry 0 ('v'): reserved byte is 0x80, not 0");
}

Test(pack_entry, unknown_kind)
{
    for (unsigned kind = 2; kind < 256; kind += 253) {
        bytebuf ix = {0};
        no_blobs(&ix, 1);
        ull at = here(&ix) + 4 + 1;
        pk_head(&ix, "v", 1, (uint8_t)kind, 0, 0, 0);
        buf_u64(&ix, 0);
        refused(&ix, NULL, 0, strf("pack entry 0 ('v'): unknown kind %u (byte %llu)", kind, at));
    }
}

Test(pack_entry, unknown_dtype)
{
    for (unsigned dt = CK_DTYPE_COUNT; dt < 256; dt += 231) {
        bytebuf ix = {0};
        no_blobs(&ix, 1);
        ull at = here(&ix) + 4 + 1 + 1;
        pk_head(&ix, "t", 1, 0, (uint8_t)dt, 0, 0);
        buf_u64(&ix, 0);
        refused(&ix, NULL, 0, strf("pack entry 0 ('t'): unknown dtype code %u (byte %llu)", dt,
                                   at));
    }
}

Test(pack_entry, every_dtype_code_is_known)
{
    for (unsigned dt = 0; dt < CK_DTYPE_COUNT; dt++) {
        bytebuf ix = {0};
        /* 8 blocks (8 elements of a one-element-block type) */
        pk_blob blob = {.length = 8 * ck_dtype_block_bytes(dt)};
        pk_counts(&ix, 1, 1, 0, 0);
        pk_blobs(&ix, &blob, 1);
        pk_tensor(&ix, "t", dt, 1, (int64_t[]){8 * ck_dtype_block_elems(dt)}, 0);
        const char *path = pk_file(&ix, &blob, 1);
        free(ix.p);
        ck_index *cx = open_ok(path);
        cr_assert_eq(cx->entries[0].dtype, dt);
        cr_assert_eq(cx->entries[0].nbytes, 8 * ck_dtype_block_bytes(dt));
        ck_index_free(cx);
    }
}

Test(pack_entry, rank_over_64)
{
    for (unsigned rank = 65; rank < 256; rank += 190) {
        bytebuf ix = {0};
        no_blobs(&ix, 1);
        ull at = here(&ix) + 4 + 3 + 2; /* the rank byte */
        pk_head(&ix, "a.b", 3, 0, CK_F32, (uint8_t)rank, 0);
        for (unsigned d = 0; d <= rank; d++)
            buf_u64(&ix, 1);
        refused(&ix, NULL, 0, strf("pack entry 0 ('a.b'): rank %u exceeds 64 (byte %llu)", rank,
                                   at));
    }
}

Test(pack_entry, negative_dim)
{
    bytebuf ix = {0};
    pk_blob blob = {.length = 0};
    pk_counts(&ix, 1, 1, 0, 0);
    pk_blobs(&ix, &blob, 1);
    ull at = here(&ix) + 4 + 1 + 4 + 8;
    pk_tensor(&ix, "w", CK_F32, 3, (int64_t[]){0, -3, 2}, 0);
    refused(&ix, &blob, 1, strf("pack entry 0 ('w'): dim 1 is negative (-3) (byte %llu)", at));
    pk_counts(&ix, 1, 1, 0, 0);
    pk_blobs(&ix, &blob, 1);
    pk_tensor(&ix, "w", CK_F32, 1, (int64_t[]){INT64_MIN}, 0);
    refused(&ix, &blob, 1, "dim 0 is negative (-9223372036854775808)");
}

Test(pack_entry, size_overflows)
{
    bytebuf ix = {0};
    pk_blob blob = {.length = 0};
    pk_counts(&ix, 1, 1, 0, 0);
    pk_blobs(&ix, &blob, 1);
    ull at = here(&ix) + 4 + 1 + 4;
    pk_tensor(&ix, "w", CK_F32, 2, (int64_t[]){1ll << 32, 1ll << 32}, 0);
    refused(&ix, &blob, 1, strf("pack entry 0 ('w'): shape × F32 overflows or is not a whole "
                                "number of bytes (byte %llu)", at));
    pk_counts(&ix, 1, 1, 0, 0);
    pk_blobs(&ix, &blob, 1);
    pk_tensor(&ix, "w", CK_F64, 1, (int64_t[]){INT64_MAX}, 0);
    refused(&ix, &blob, 1, "shape × F64 overflows");
    /* Three 4-bit elements are not a whole number of bytes. */
    blob.length = 2;
    pk_counts(&ix, 1, 1, 0, 0);
    pk_blobs(&ix, &blob, 1);
    pk_tensor(&ix, "q", CK_F4, 1, (int64_t[]){3}, 0);
    refused(&ix, &blob, 1, "pack entry 0 ('q'): shape × F4 overflows or is not a whole number");
}

Test(pack_entry, blob_does_not_exist)
{
    bytebuf ix = {0};
    pk_blob blob = {.length = 4};
    pk_counts(&ix, 1, 1, 0, 0);
    pk_blobs(&ix, &blob, 1);
    ull at = here(&ix) + 4 + 1 + 4 + 8;
    pk_tensor(&ix, "w", CK_F32, 1, (int64_t[]){1}, 1);
    refused(&ix, &blob, 1, strf("pack entry 0 ('w'): blob 1 does not exist, the index has 1 "
                                "(byte %llu)", at));
    no_blobs(&ix, 1);
    pk_tensor(&ix, "w", CK_F32, 0, NULL, UINT64_MAX);
    refused(&ix, NULL, 0, "blob 18446744073709551615 does not exist, the index has 0");
}

Test(pack_entry, size_is_not_the_blob_length)
{
    bytebuf ix = {0};
    pk_blob blob = {.length = 4};
    pk_counts(&ix, 1, 1, 0, 0);
    pk_blobs(&ix, &blob, 1);
    ull at = here(&ix) + 4 + 1 + 4 + 8;
    pk_tensor(&ix, "w", CK_F32, 1, (int64_t[]){2}, 0);
    refused(&ix, &blob, 1, strf("pack entry 0 ('w'): shape × F32 needs 8 bytes, but blob 0 "
                                "holds 4 (byte %llu)", at));
    /* Tied tensors must agree with the blob too. */
    pk_counts(&ix, 2, 1, 0, 0);
    pk_blobs(&ix, &blob, 1);
    pk_tensor(&ix, "a", CK_F32, 1, (int64_t[]){1}, 0);
    pk_tensor(&ix, "b", CK_F16, 1, (int64_t[]){1}, 0);
    refused(&ix, &blob, 1, "pack entry 1 ('b'): shape × F16 needs 2 bytes, but blob 0 holds 4");
}

Test(pack_entry, unknown_value_code)
{
    for (unsigned t = CK_VAL_TYPE_COUNT; t < 256; t += 248) {
        bytebuf ix = {0};
        no_blobs(&ix, 1);
        ull at = here(&ix) + 4 + 1 + 1;
        pk_head(&ix, "v", 1, 1, (uint8_t)t, 0, 0);
        pk_str(&ix, "x", 1);
        refused(&ix, NULL, 0, strf("pack entry 0 ('v'): unknown value code %u (byte %llu)", t,
                                   at));
    }
}

Test(pack_entry, value_with_a_rank)
{
    bytebuf ix = {0};
    no_blobs(&ix, 1);
    ull at = here(&ix) + 4 + 1 + 2;
    pk_head(&ix, "v", 1, 1, CK_VAL_INT, 1, 0);
    pk_str(&ix, "1", 1);
    refused(&ix, NULL, 0, strf("pack entry 0 ('v'): a value has rank 0, not 1 (byte %llu)", at));
}

Test(pack_entry, duplicate_names)
{
    /* In natural order a repeated name is always right after the first. */
    bytebuf ix = {0};
    no_blobs(&ix, 3);
    pk_value(&ix, "w", CK_VAL_NONE, "None", 4);
    ull a = here(&ix);
    pk_value(&ix, "x", CK_VAL_NONE, "None", 4);
    ull c = here(&ix);
    pk_value(&ix, "x", CK_VAL_INT, "1", 1);
    refused(&ix, NULL, 0, strf("pack entry 2: duplicate name 'x', as entry 1 (bytes %llu and "
                               "%llu)", c, a));
    /* A tensor and a value, and a name that is a prefix of another (not a duplicate). */
    pk_blob blob = {.length = 1};
    pk_counts(&ix, 3, 1, 0, 0);
    pk_blobs(&ix, &blob, 1);
    pk_tensor(&ix, "a", CK_U8, 0, NULL, 0);
    pk_value(&ix, "ab", CK_VAL_NONE, "None", 4);
    pk_tensor(&ix, "ab", CK_U8, 0, NULL, 0);
    refused(&ix, &blob, 1, "pack entry 2: duplicate name 'ab', as entry 1");
    /* Further apart, the index is out of order. */
    no_blobs(&ix, 3);
    pk_value(&ix, "x", CK_VAL_NONE, "None", 4);
    pk_value(&ix, "y", CK_VAL_NONE, "None", 4);
    pk_value(&ix, "x", CK_VAL_INT, "1", 1);
    refused(&ix, NULL, 0, "pack entry 2 ('x'): sorts before entry 1 ('y')");
}

Test(pack_entry, out_of_natural_order)
{
    static const char *const pairs[][2] = {
        {"layers.10", "layers.2"}, /* numbers, not characters */
        {"layers.02", "layers.2"}, /* equal numbers: fewer leading zeros first */
        {"b", "a"},
        {"a.b", "a"},              /* a prefix first */
        {"a\xc3\xa9", "az"},       /* bytes, unsigned */
    };
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
        bytebuf ix = {0};
        no_blobs(&ix, 2);
        pk_value(&ix, pairs[i][0], CK_VAL_NONE, "None", 4);
        ull at = here(&ix);
        pk_value(&ix, pairs[i][1], CK_VAL_NONE, "None", 4);
        refused(&ix, NULL, 0, strf("pack entry 1 ('%s'): sorts before entry 0 ('%s'): entries "
                                   "are in natural name order (byte %llu)", pairs[i][1],
                                   pairs[i][0], at));
    }
}

Test(pack_entry, duplicate_among_many)
{
    enum { N = 5000 };
    bytebuf ix = {0};
    no_blobs(&ix, N);
    for (unsigned i = 0; i < N; i++)
        pk_value(&ix, strf("layers.%u.w", i == 4321 ? 4320 : i), CK_VAL_NONE, "", 0);
    refused(&ix, NULL, 0, "pack entry 4321: duplicate name 'layers.4320.w', as entry 4320");
    /* Without the repeat all of them load. */
    no_blobs(&ix, N);
    for (unsigned i = 0; i < N; i++)
        pk_value(&ix, strf("layers.%u.w", i), CK_VAL_NONE, "", 0);
    const char *path = pk_file(&ix, NULL, 0);
    free(ix.p);
    ck_index *cx = open_ok(path);
    cr_assert_eq(cx->nentries, N);
    ck_index_free(cx);
}

Test(pack_entry, long_names_are_cut_in_messages)
{
    /* 95 ASCII bytes, then a 2-byte character across the 96-byte cut. */
    char name[200];
    memset(name, 'n', 95);
    memcpy(name + 95, "\xc3\xa9tail", 7);
    name[102] = 0;
    bytebuf ix = {0};
    no_blobs(&ix, 1);
    pk_head(&ix, name, strlen(name), 0, CK_F32, 70, 0);
    refused(&ix, NULL, 0, strf("pack entry 0 ('%.95s...'): rank 70 exceeds 64", name));
    no_blobs(&ix, 2);
    pk_value(&ix, name, CK_VAL_NONE, "", 0);
    pk_value(&ix, name, CK_VAL_NONE, "", 0);
    refused(&ix, NULL, 0, strf("pack entry 1: duplicate name '%.95s...', as entry 0", name));
}

/* --- truncation ------------------------------------------------------------------------------ */

Test(pack_cut, file_cut_anywhere)
{
    size_t len, index_len;
    unsigned char *b = sample_bytes(&len, &index_len);
    uint64_t trailer = get_le64(b + 48);
    const char *path = tmp_file(b, 0);
    for (size_t n = 0; n < len; n += n < 64 + index_len + 64 || n + 300 > len ? 1 : 61) {
        tmp_rewrite(path, b, n);
        assert_open_fails(path, n == 0                   ? "empty file"
                                : n < 8                  ? "not a checkpoint format"
                                : n < 64                 ? "too short for a pack header"
                                : n < trailer + 8        ? "too short for a pack whose checksums"
                                                         : "but its checksum trailer");
    }
    free(b);
}

Test(pack_cut, index_cut_anywhere)
{
    /* The index cut short with a header that agrees: the index itself ends early. */
    bytebuf ix = {0};
    pk_blob blobs[SAMPLE_BLOBS];
    sample(&ix, blobs);
    size_t full = ix.len;
    const char *path = tmp_file("", 0);
    for (size_t n = 0; n < full; n++) {
        ix.len = n;
        size_t len;
        unsigned char *b = pk_bytes(&ix, blobs, SAMPLE_BLOBS, &len);
        tmp_rewrite(path, b, len);
        free(b);
        ck_index *out = NULL;
        ck_error err = {""};
        cr_assert_eq(ck_open(path, &out, &err), -1, "index cut to %zu bytes was accepted", n);
        cr_assert_null(out);
        assert_error(&err, path, n < 24 ? "inside the counts" : "");
        cr_assert(strstr(err.msg, "the index ends at byte") ||
                      strstr(err.msg, "need more than the"),
                  "index cut to %zu bytes: %s", n, err.msg);
    }
    free(ix.p);
}

/* --- corruption with a correct checksum ----------------------------------------------------- */

Test(pack_fuzz, corrupted_index_fails_cleanly_or_loads_consistently)
{
    size_t len, index_len;
    unsigned char *orig = sample_bytes(&len, &index_len);
    unsigned char *b = malloc(len);
    cr_assert_not_null(b);
    const char *path = tmp_file("", 0);
    uint32_t seed = 12345;
    unsigned loaded = 0, failed = 0;
    static const unsigned char values[] = {0, 1, 2, 0x7f, 0x80, 0xfe, 0xff, 24, 64, 65};
    for (unsigned iter = 0; iter < 3000; iter++) {
        memcpy(b, orig, len);
        unsigned char rnd[16];
        fill_bytes(rnd, sizeof rnd, seed++);
        unsigned nflips = 1 + rnd[0] % 4;
        for (unsigned k = 0; k < nflips; k++) {
            size_t at = 64 + ((size_t)rnd[1 + 3 * k] << 8 | rnd[2 + 3 * k]) % index_len;
            unsigned char v = rnd[3 + 3 * k];
            b[at] = v & 1 ? values[(v >> 1) % sizeof values] : (unsigned char)(b[at] ^ v);
        }
        pk_fix_xxh3(b);
        tmp_rewrite(path, b, len);
        ck_index *ix = NULL;
        ck_error err = {""};
        if (ck_open(path, &ix, &err) == 0) {
            assert_consistent(ix, b, len);
            ck_index_free(ix);
            loaded++;
        } else {
            cr_assert_null(ix);
            assert_error(&err, path, "");
            failed++;
        }
    }
    cr_assert_gt(failed, 0);
    cr_assert_gt(loaded, 0); /* some corruption (a dim swapped, text changed) stays valid */
    free(b);
    free(orig);
}
