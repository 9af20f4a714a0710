/* The GGUF reader: files built byte by byte from the GGUF spec (ggml's docs/gguf.md), every rule
 * it enforces through ck_open, and what it builds for files that follow them. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "../../formats/gguf.h"
#include "../../checkpoint/open.h"
#include "helpers.h"

TestSuite(gguf_ok, .fini = tmp_cleanup);
TestSuite(gguf_header, .fini = tmp_cleanup);
TestSuite(gguf_kv, .fini = tmp_cleanup);
TestSuite(gguf_tensor, .fini = tmp_cleanup);
TestSuite(gguf_dtype, .fini = tmp_cleanup);

/* GGUF value types and ggml tensor types, by the spec's numbers. */
enum { U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 };
enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_K = 12, T_BF16 = 30 };

static void g_header(bytebuf *b, uint32_t version, uint64_t ntensors, uint64_t nkv)
{
    buf_put(b, "GGUF", 4);
    buf_u32(b, version);
    buf_u64(b, ntensors);
    buf_u64(b, nkv);
}

static void g_str(bytebuf *b, const char *s)
{
    buf_u64(b, strlen(s));
    buf_put(b, s, strlen(s));
}

static void g_kv_u32(bytebuf *b, const char *key, uint32_t v)
{
    g_str(b, key);
    buf_u32(b, U32);
    buf_u32(b, v);
}

static void g_kv_str(bytebuf *b, const char *key, const char *v)
{
    g_str(b, key);
    buf_u32(b, STR);
    g_str(b, v);
}

static void g_tensor(bytebuf *b, const char *name, uint32_t ndims, const int64_t *ne,
                     uint32_t type, uint64_t offset)
{
    g_str(b, name);
    buf_u32(b, ndims);
    for (uint32_t d = 0; d < ndims; d++)
        buf_u64(b, (uint64_t)ne[d]);
    buf_u32(b, type);
    buf_u64(b, offset);
}

/* Pads to align and appends data_len pseudo-random bytes; the file's path. */
static const char *g_file(bytebuf *b, size_t align, size_t data_len)
{
    while (b->len % align)
        buf_u8(b, 0);
    unsigned char *data = malloc(data_len + 1);
    fill_bytes(data, data_len, 7);
    buf_put(b, data, data_len);
    free(data);
    const char *path = tmp_file(b->p, b->len);
    free(b->p);
    return path;
}

/* A file with one F32 tensor 'w' of ne {3, 2} after the given keys (nkv of them, in kv). */
static const char *one_tensor(const bytebuf *kv, uint64_t nkv, size_t align)
{
    bytebuf b = {0};
    g_header(&b, 3, 1, nkv);
    if (kv)
        buf_put(&b, kv->p, kv->len);
    g_tensor(&b, "w", 2, (int64_t[]){3, 2}, T_F32, 0);
    return g_file(&b, align, 24);
}

static void refused_kv(bytebuf *kv, uint64_t nkv, const char *what)
{
    const char *path = one_tensor(kv, nkv, 32);
    free(kv->p);
    assert_open_fails(path, what);
}

/* --- accepted files ---------------------------------------------------------------------- */

Test(gguf_ok, tensors_shapes_offsets)
{
    bytebuf b = {0};
    g_header(&b, 3, 3, 1);
    g_kv_str(&b, "general.architecture", "llama");
    g_tensor(&b, "blk.0.attn_q.weight", 2, (int64_t[]){3, 2}, T_F32, 0);
    g_tensor(&b, "q", 2, (int64_t[]){64, 2}, T_Q4_0, 32);
    g_tensor(&b, "s", 0, NULL, T_F16, 32 + 96);
    size_t data = (b.len + 31) / 32 * 32;
    const char *path = g_file(&b, 32, 32 + 96 + 2);
    ck_index *ix = open_ok(path);
    cr_assert_str_eq(ix->format, "gguf");
    cr_assert_eq(ix->nentries, 4); /* three tensors, one value */
    const ck_entry *w = ck_index_find(ix, "blk.0.attn_q.weight");
    cr_assert_eq(w->rank, 2);
    cr_assert_eq(w->shape[0], 2);
    cr_assert_eq(w->shape[1], 3);
    cr_assert_eq(w->dtype, CK_F32);
    cr_assert_eq(w->nbytes, 24);
    cr_assert_eq(w->ext.offset, data);
    const ck_entry *q = ck_index_find(ix, "q");
    cr_assert_eq(q->dtype, CK_Q4_0);
    cr_assert_eq(q->nbytes, 2 * 2 * 18); /* two rows of two 32-element blocks */
    cr_assert_eq(q->ext.offset, data + 32);
    cr_assert_eq(q->shape[0], 2);
    cr_assert_eq(q->shape[1], 64);
    const ck_entry *s = ck_index_find(ix, "s");
    cr_assert_eq(s->rank, 0);
    cr_assert_eq(s->nbytes, 2);
    const ck_entry *v = ck_index_find(ix, "__metadata__.general.architecture");
    cr_assert_eq(v->kind, CK_VALUE);
    cr_assert_eq(v->dtype, CK_VAL_STR);
    cr_assert_eq(v->nbytes, 6);
    cr_assert(memcmp(v->text, "llama\n", 6) == 0);
    cr_assert_eq(ix->nmeta, 1);
    cr_assert(ix->meta[0].json);
    cr_assert_str_eq(ix->meta[0].value, "{\"type\":\"STRING\",\"value\":\"llama\"\n}");
    ck_index_free(ix);
}

/* Every value type's JSON and value file text: the value file is the metadata's own bytes
 * from the value on, up to the closing brace (a newline before it). */
Test(gguf_ok, every_value_type)
{
    static const struct {
        uint32_t type;
        unsigned char bytes[8];
        unsigned size;
        const char *json;
    } cases[] = {
        {U8, {0xff}, 1, "255"},
        {I8, {0x80}, 1, "-128"},
        {U16, {0xff, 0xff}, 2, "65535"},
        {I16, {0x00, 0x80}, 2, "-32768"},
        {U32, {0xff, 0xff, 0xff, 0xff}, 4, "4294967295"},
        {I32, {0, 0, 0, 0x80}, 4, "-2147483648"},
        {F32, {0xcd, 0xcc, 0xcc, 0x3d}, 4, "0.100000001"},
        {F32, {0, 0, 0xc0, 0x7f}, 4, "\"NaN\""},
        {F32, {0, 0, 0x80, 0xff}, 4, "\"-Infinity\""},
        {BOOL, {1}, 1, "true"},
        {BOOL, {0}, 1, "false"},
        {U64, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 8, "18446744073709551615"},
        {I64, {0, 0, 0, 0, 0, 0, 0, 0x80}, 8, "-9223372036854775808"},
        {F64, {0x55, 0x55, 0x55, 0x55, 0x55, 0x55, 0xd5, 0x3f}, 8, "0.33333333333333331"},
    };
    static const char *const names[] = {"UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32",
                                        "FLOAT32", "BOOL", "STRING", "ARRAY", "UINT64", "INT64",
                                        "FLOAT64"};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        bytebuf kv = {0};
        g_str(&kv, "k");
        buf_u32(&kv, cases[i].type);
        buf_put(&kv, cases[i].bytes, cases[i].size);
        const char *path = one_tensor(&kv, 1, 32);
        free(kv.p);
        ck_index *ix = open_ok(path);
        cr_assert_str_eq(ix->meta[0].value, strf("{\"type\":\"%s\",\"value\":%s\n}",
                                                 names[cases[i].type], cases[i].json));
        const ck_entry *v = ck_index_find(ix, "__metadata__.k");
        cr_assert_eq(v->nbytes, strlen(cases[i].json) + 1);
        cr_assert(memcmp(v->text, cases[i].json, v->nbytes - 1) == 0, "case %zu", i);
        ck_index_free(ix);
    }
}

Test(gguf_ok, arrays_and_escapes)
{
    bytebuf kv = {0};
    g_str(&kv, "tokens");
    buf_u32(&kv, ARR);
    buf_u32(&kv, STR);
    buf_u64(&kv, 3);
    g_str(&kv, "a\"b\\");
    g_str(&kv, "\n\x01");
    g_str(&kv, "\xff" "x"); /* not UTF-8: U+FFFD in JSON */
    g_str(&kv, "ints");
    buf_u32(&kv, ARR);
    buf_u32(&kv, I16);
    buf_u64(&kv, 2);
    buf_u8(&kv, 0xff), buf_u8(&kv, 0xff), buf_u8(&kv, 7), buf_u8(&kv, 0);
    const char *path = one_tensor(&kv, 2, 32);
    free(kv.p);
    ck_index *ix = open_ok(path);
    cr_assert_str_eq(ix->meta[0].value, "{\"type\":\"ARRAY\",\"item_type\":\"STRING\",\"value\":"
                                        "[\"a\\\"b\\\\\",\"\\u000a\\u0001\",\"\\ufffdx\"]\n}");
    cr_assert_str_eq(ix->meta[1].value, "{\"type\":\"ARRAY\",\"item_type\":\"INT16\",\"value\":"
                                        "[-1,7]\n}");
    const ck_entry *v = ck_index_find(ix, "__metadata__.ints");
    cr_assert_eq(v->nbytes, 7);
    cr_assert(memcmp(v->text, "[-1,7]\n", 7) == 0);
    ck_index_free(ix);
}

Test(gguf_ok, alignment_key)
{
    bytebuf kv = {0};
    g_kv_u32(&kv, "general.alignment", 64);
    bytebuf b = {0};
    g_header(&b, 2, 2, 1);
    buf_put(&b, kv.p, kv.len);
    free(kv.p);
    g_tensor(&b, "a", 1, (int64_t[]){3}, T_F32, 0);
    g_tensor(&b, "b", 1, (int64_t[]){1}, T_F32, 64);
    size_t data = (b.len + 63) / 64 * 64;
    ck_index *ix = open_ok(g_file(&b, 64, 68));
    cr_assert_eq(ck_index_find(ix, "b")->ext.offset, data + 64);
    ck_index_free(ix);
}

/* --- the header -------------------------------------------------------------------------- */

Test(gguf_header, byte_swapped)
{
    bytebuf b = {0};
    buf_put(&b, "GGUF", 4);
    buf_put(&b, "\0\0\0\3", 4);
    buf_put(&b, "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 16);
    assert_open_fails(g_file(&b, 1, 0), "byte-swapped (big-endian) GGUF file");
}

Test(gguf_header, versions)
{
    for (uint32_t v = 0; v < 6; v++) {
        if (v == 2 || v == 3)
            continue;
        bytebuf b = {0};
        g_header(&b, v, 0, 0);
        assert_open_fails(g_file(&b, 1, 0), strf("GGUF version %u; versions 2 and 3", v));
    }
}

Test(gguf_header, truncated)
{
    assert_open_fails(tmp_file("GGUF\3\0\0\0", 8), "the GGUF header runs past the end");
}

Test(gguf_header, counts_that_cannot_fit)
{
    bytebuf b = {0};
    g_header(&b, 3, 1000, 0);
    assert_open_fails(g_file(&b, 1, 0), "header counts 1000 tensors and 0 keys, more than");
}

/* --- keys and values --------------------------------------------------------------------- */

Test(gguf_kv, empty_key)
{
    bytebuf kv = {0};
    g_kv_u32(&kv, "", 1);
    refused_kv(&kv, 1, "key 0 is empty (byte 24)");
}

Test(gguf_kv, duplicate_key)
{
    bytebuf kv = {0};
    g_kv_u32(&kv, "a", 1);
    g_kv_u32(&kv, "a", 2);
    refused_kv(&kv, 2, "duplicate key 'a'");
}

Test(gguf_kv, key_not_utf8)
{
    bytebuf kv = {0};
    g_kv_u32(&kv, "a\xc0", 1);
    refused_kv(&kv, 1, "key 0 is not valid UTF-8");
}

/* Key 'k' of type `type` followed by the fields given (a u32 item type for an array, a u64
 * count or length, a bool's byte), each one lying in its own way. */
Test(gguf_kv, values_that_lie)
{
    enum { NONE = -1 };
    static const struct {
        uint32_t type;
        int64_t item;   /* an array's item type, or NONE */
        uint64_t count; /* an array's count or a string's length */
        int has_count;
        const char *what;
    } cases[] = {
        {13, NONE, 0, 0, "key 'k': unknown value type 13 (byte 33)"},
        {ARR, ARR, 0, 0, "an array of arrays"},
        {STR, NONE, GGUF_MAX_STRING + 1ull, 1, "length 67108865 exceeds the limit of 67108864"},
        {STR, NONE, 1000, 1, "key 'k' runs past the end of the file"},
        {ARR, U64, 1u << 20, 1, "array of 1048576 UINT64 items runs past the end of the file"},
        {ARR, U8, UINT64_MAX, 1, "exceeds the limit of 67108864"},
        {BOOL, NONE, 2, 0, "key 'k': boolean byte is 2, not 0 or 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        bytebuf kv = {0};
        g_str(&kv, "k");
        buf_u32(&kv, cases[i].type);
        if (cases[i].item != NONE)
            buf_u32(&kv, (uint32_t)cases[i].item);
        if (cases[i].has_count)
            buf_u64(&kv, cases[i].count);
        if (cases[i].type == BOOL)
            buf_u8(&kv, (uint8_t)cases[i].count);
        refused_kv(&kv, 1, cases[i].what);
    }
}

Test(gguf_kv, alignment_not_power_of_two)
{
    static const uint32_t bad[] = {0, 3, 48, 1u << 21};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        bytebuf kv = {0};
        g_kv_u32(&kv, "general.alignment", bad[i]);
        refused_kv(&kv, 1, strf("general.alignment %u is not a power of two", bad[i]));
    }
}

Test(gguf_kv, alignment_of_the_wrong_type)
{
    bytebuf kv = {0};
    g_str(&kv, "general.alignment");
    buf_u32(&kv, U64);
    buf_u64(&kv, 32);
    refused_kv(&kv, 1, "key 'general.alignment' is a UINT64, not a UINT32");
}

/* --- tensor infos ------------------------------------------------------------------------ */

/* A file with one tensor info as given and data_len bytes of data. */
static void refused_tensor(const char *name, uint32_t ndims, const int64_t *ne, uint32_t type,
                           uint64_t offset, size_t data_len, const char *what)
{
    bytebuf b = {0};
    g_header(&b, 3, 1, 0);
    g_tensor(&b, name, ndims, ne, type, offset);
    assert_open_fails(g_file(&b, 32, data_len), what);
}

Test(gguf_tensor, name_too_long)
{
    char name[65];
    memset(name, 'a', 64);
    name[64] = 0;
    refused_tensor(name, 1, (int64_t[]){1}, T_F32, 0, 4, "name is 64 bytes, ggml's limit is 63");
}

Test(gguf_tensor, name_in_the_metadata_directory)
{
    refused_tensor("__metadata__.x", 1, (int64_t[]){1}, T_F32, 0, 4,
                   "tensor '__metadata__.x': names under '__metadata__' are the metadata's");
}

Test(gguf_tensor, duplicate_names)
{
    bytebuf b = {0};
    g_header(&b, 3, 2, 0);
    g_tensor(&b, "a", 1, (int64_t[]){1}, T_F32, 0);
    g_tensor(&b, "a", 1, (int64_t[]){1}, T_F32, 32);
    assert_open_fails(g_file(&b, 32, 36), "duplicate tensor name 'a'");
}

Test(gguf_tensor, too_many_dims)
{
    refused_tensor("t", 5, (int64_t[]){1, 1, 1, 1, 1}, T_F32, 0, 4,
                   "tensor 't': 5 dimensions, more than ggml's 4");
}

Test(gguf_tensor, negative_dim)
{
    refused_tensor("t", 2, (int64_t[]){1, -1}, T_F32, 0, 4, "tensor 't': ne[1] = -1 is negative");
}

Test(gguf_tensor, element_count_overflows)
{
    refused_tensor("t", 2, (int64_t[]){1ll << 32, 1ll << 31}, T_F32, 0, 4,
                   "ne[1] = 2147483648 makes the element count overflow int64");
}

Test(gguf_tensor, unknown_types)
{
    static const uint32_t bad[] = {4, 5, 31, 36, 38, 42, 1000};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        refused_tensor("t", 1, (int64_t[]){256}, bad[i], 0, 1024,
                       strf("tensor 't': unknown ggml type %u", bad[i]));
}

Test(gguf_tensor, rows_not_whole_blocks)
{
    refused_tensor("t", 2, (int64_t[]){48, 2}, T_Q4_0, 0, 64,
                   "tensor 't': Q4_0 rows of 48 elements are not whole blocks of 32");
    refused_tensor("t", 1, (int64_t[]){128}, T_Q4_K, 0, 144,
                   "Q4_K rows of 128 elements are not whole blocks of 256");
}

Test(gguf_tensor, offset_not_where_ggml_puts_it)
{
    refused_tensor("t", 1, (int64_t[]){1}, T_F32, 32, 64,
                   "tensor 't': data offset 32, expected 0");
    bytebuf b = {0};
    g_header(&b, 3, 2, 0);
    g_tensor(&b, "a", 1, (int64_t[]){1}, T_F32, 0);
    g_tensor(&b, "b", 1, (int64_t[]){1}, T_F32, 4); /* not aligned */
    assert_open_fails(g_file(&b, 32, 36), "tensor 'b': data offset 4, expected 32");
}

Test(gguf_tensor, past_the_end)
{
    refused_tensor("t", 2, (int64_t[]){4, 4}, T_F32, 0, 63,
                   "tensor 't': bytes [0, +64) of the data region run past the end of the file");
}

Test(gguf_tensor, data_start_past_the_end)
{
    bytebuf b = {0};
    g_header(&b, 3, 1, 0);
    g_tensor(&b, "t", 1, (int64_t[]){0}, T_F32, 0);
    const char *path = tmp_file(b.p, b.len); /* no padding to the data region */
    free(b.p);
    assert_open_fails(path, "past the end of the file");
}

Test(gguf_tensor, bf16_and_empty)
{
    bytebuf b = {0};
    g_header(&b, 3, 2, 0);
    g_tensor(&b, "e", 2, (int64_t[]){0, 5}, T_F32, 0);
    g_tensor(&b, "b", 1, (int64_t[]){3}, T_BF16, 0);
    ck_index *ix = open_ok(g_file(&b, 32, 6));
    cr_assert_eq(ck_index_find(ix, "e")->nbytes, 0);
    cr_assert_eq(ck_index_find(ix, "e")->shape[0], 5);
    cr_assert_eq(ck_index_find(ix, "b")->dtype, CK_BF16);
    ck_index_free(ix);
}

/* --- the dtype table's blocks, as ggml-common.h lays them out ------------------------------ */

Test(gguf_dtype, ggml_blocks)
{
    static const struct {
        const char *name;
        unsigned elems, bytes;
    } ggml[] = {
        {"Q4_0", 32, 2 + 16},           {"Q4_1", 32, 4 + 16},
        {"Q5_0", 32, 2 + 4 + 16},       {"Q5_1", 32, 4 + 4 + 16},
        {"Q8_0", 32, 2 + 32},           {"Q8_1", 32, 4 + 32},
        {"Q2_K", 256, 16 + 64 + 4},     {"Q3_K", 256, 32 + 64 + 12 + 2},
        {"Q4_K", 256, 4 + 12 + 128},    {"Q5_K", 256, 4 + 12 + 32 + 128},
        {"Q6_K", 256, 128 + 64 + 16 + 2}, {"Q8_K", 256, 4 + 256 + 32},
        {"IQ2_XXS", 256, 2 + 64},       {"IQ2_XS", 256, 2 + 64 + 8},
        {"IQ3_XXS", 256, 2 + 96},       {"IQ1_S", 256, 2 + 32 + 16},
        {"IQ4_NL", 32, 2 + 16},         {"IQ3_S", 256, 2 + 64 + 8 + 32 + 4},
        {"IQ2_S", 256, 2 + 64 + 8 + 8}, {"IQ4_XS", 256, 2 + 2 + 4 + 128},
        {"IQ1_M", 256, 32 + 16 + 8},    {"TQ1_0", 256, 48 + 4 + 2},
        {"TQ2_0", 256, 64 + 2},         {"MXFP4", 32, 1 + 16},
        {"NVFP4", 64, 4 + 32},          {"Q1_0", 128, 2 + 16},
    };
    for (size_t i = 0; i < sizeof ggml / sizeof *ggml; i++) {
        int dt = ck_dtype_from_name(ggml[i].name, strlen(ggml[i].name));
        cr_assert_eq(dt, CK_Q4_0 + (int)i, "%s", ggml[i].name);
        cr_assert_eq(ck_dtype_block_elems(dt), ggml[i].elems, "%s", ggml[i].name);
        cr_assert_eq(ck_dtype_block_bytes(dt), ggml[i].bytes, "%s", ggml[i].name);
        cr_assert_eq(ck_dtype_bits(dt), 0);
        uint64_t n;
        cr_assert_eq(ck_dtype_nbytes(dt, 3ull * ggml[i].elems, &n), 0);
        cr_assert_eq(n, 3ull * ggml[i].bytes);
        cr_assert_eq(ck_dtype_nbytes(dt, ggml[i].elems + 1ull, &n), -1);
    }
    cr_assert_eq(CK_Q1_0 + 1, CK_DTYPE_COUNT);
    uint64_t n;
    cr_assert_eq(ck_dtype_nbytes(CK_Q8_K, (UINT64_MAX / 256) * 256, &n), -1); /* overflows */
    cr_assert_eq(ck_dtype_nbytes(CK_DTYPE_COUNT, 1, &n), -1);
}

/* --- split sets -------------------------------------------------------------------------- */

TestSuite(gguf_split, .fini = tmp_cleanup);

/* Split no of count in dir, named as gguf-split names them, holding one F32 tensor 't<no>' of 4
 * elements; the first split also says it has total tensors in all. */
static const char *g_split(const char *dir, const char *prefix, unsigned no, unsigned count,
                           int32_t total)
{
    bytebuf b = {0};
    g_header(&b, 3, 1, no == 0 ? 3 : 2);
    g_str(&b, "split.no");
    buf_u32(&b, U16);
    buf_u8(&b, (uint8_t)no), buf_u8(&b, 0);
    g_str(&b, "split.count");
    buf_u32(&b, U16);
    buf_u8(&b, (uint8_t)count), buf_u8(&b, 0);
    if (no == 0) {
        g_str(&b, "split.tensors.count");
        buf_u32(&b, I32);
        buf_u32(&b, (uint32_t)total);
    }
    g_tensor(&b, strf("t%u", no), 1, (int64_t[]){4}, T_F32, 0);
    while (b.len % 32)
        buf_u8(&b, 0);
    buf_put(&b, "0123456789abcdef", 16);
    const char *path = tmp_file_in(dir, strf("%s-%05u-of-%05u.gguf", prefix, no + 1, count),
                                   b.p, b.len);
    free(b.p);
    return path;
}

Test(gguf_split, first_file_and_directory)
{
    const char *dir = tmp_dir();
    const char *first = g_split(dir, "m", 0, 3, 3);
    const char *second = g_split(dir, "m", 1, 3, 0);
    g_split(dir, "m", 2, 3, 0);
    const char *sources[] = {first, dir};
    for (size_t k = 0; k < 2; k++) {
        ck_index *ix = open_ok(sources[k]);
        cr_assert_str_eq(ix->format, "gguf-split");
        cr_assert_eq(ix->nfiles, 3);
        const ck_entry *t1 = ck_index_find(ix, "t1");
        cr_assert_str_eq(ix->files[t1->ext.file].path, k ? strf("%s/m-00002-of-00003.gguf", dir)
                                                          : second);
        cr_assert_not_null(ck_index_find(ix, "__metadata__.split.tensors.count"));
        cr_assert_eq(ix->nmeta, 3); /* the first split's keys; the later ones' are checked */
        ck_index_free(ix);
    }
}

Test(gguf_split, tensor_count_disagrees)
{
    const char *dir = tmp_dir();
    const char *first = g_split(dir, "m", 0, 2, 5);
    g_split(dir, "m", 1, 2, 0);
    assert_open_fails(first, "split.tensors.count is 5, but the 2 splits hold 2 tensors");
}

Test(gguf_split, missing_split)
{
    const char *dir = tmp_dir();
    const char *first = g_split(dir, "m", 0, 3, 3);
    g_split(dir, "m", 2, 3, 0);
    ck_index *ix = NULL;
    ck_error err = {{0}};
    cr_assert_eq(ck_open(first, &ix, &err), -1);
    assert_error(&err, strf("%s/m-00002-of-00003.gguf", dir), "cannot open split 2 of 3");
}

Test(gguf_split, later_split_alone)
{
    const char *dir = tmp_dir();
    g_split(dir, "m", 0, 2, 2);
    assert_open_fails(g_split(dir, "m", 1, 2, 0),
                      "is split 2 of 2: open the first split or the directory");
}

Test(gguf_split, foreign_file_in_the_directory)
{
    const char *dir = tmp_dir();
    g_split(dir, "m", 0, 2, 2);
    g_split(dir, "m", 1, 2, 0);
    g_split(dir, "other", 1, 2, 0);
    ck_index *ix = NULL;
    ck_error err = {{0}};
    cr_assert_eq(ck_open(dir, &ix, &err), -1);
    assert_error(&err, dir, "'other-00002-of-00002.gguf' is not part of the split set of "
                            "'m-00001-of-00002.gguf'");
}
