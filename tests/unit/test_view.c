/* What the mount's own files say: .ckptfs/index.json (parsed back with cJSON) and the shape
 * xattr's JSON. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "../../views/view.h"

TestSuite(index_json, .fini = tmp_cleanup);
TestSuite(shape_json, .fini = tmp_cleanup);

static const ck_tree_vfile vfiles[] = {{"index.json", CK_NODE_MEMFILE}};

/* A text's pieces, read whole (ck_text_read), NUL-terminated; *len bytes. */
static char *flat(const ck_text *v, size_t *len)
{
    char *s = malloc(v->len + 1);
    cr_assert_not_null(s);
    *len = ck_text_read(v, 0, s, v->len + 1);
    cr_assert_eq(*len, v->len);
    s[*len] = 0;
    return s;
}

/* ck_view_index_json's text for ix, checked to be JSON of *len bytes; its parse. */
static cJSON *index_json(const ck_index *ix, int with_locations, const char **text)
{
    ck_tree *t = tree_ok(ix, ".ckptfs", vfiles, 1);
    size_t len = 0;
    ck_text v;
    cr_assert_eq(ck_view_index_json(ix, t, NULL, with_locations, &v), 0);
    char *s = flat(&v, &len);
    ck_text_free(&v);
    cr_assert_eq(len, strlen(s));
    *text = strf("%s", s);
    free(s);
    ck_tree_free(t);
    cJSON *root = cJSON_Parse(*text);
    cr_assert_not_null(root, "not JSON: %s", *text);
    cr_assert(cJSON_IsObject(root));
    return root;
}

static const cJSON *member(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    cr_assert_not_null(v, "no \"%s\"", key);
    return v;
}

static void expect_string(const cJSON *o, const char *key, const char *want)
{
    const cJSON *v = member(o, key);
    cr_assert(cJSON_IsString(v), "\"%s\" is not a string", key);
    cr_assert_str_eq(v->valuestring, want, "\"%s\"", key);
}

static void expect_number(const cJSON *o, const char *key, double want)
{
    const cJSON *v = member(o, key);
    cr_assert(cJSON_IsNumber(v), "\"%s\" is not a number", key);
    cr_assert_eq(v->valuedouble, want, "\"%s\" is %.17g, not %.17g", key, v->valuedouble, want);
}

static void expect_shape(const cJSON *o, unsigned rank, const double *dims)
{
    const cJSON *shape = member(o, "shape");
    cr_assert(cJSON_IsArray(shape));
    cr_assert_eq(cJSON_GetArraySize(shape), (int)rank);
    for (unsigned d = 0; d < rank; d++) {
        const cJSON *x = cJSON_GetArrayItem(shape, (int)d);
        cr_assert(cJSON_IsNumber(x));
        cr_assert_eq(x->valuedouble, dims[d], "shape[%u]", d);
    }
}

/* An index over 40 bytes with three tensors and two metadata entries. */
static ck_index *sample(void)
{
    unsigned char data[40];
    fill_bytes(data, sizeof data, 20);
    ck_index *ix = index_over(data, sizeof data);
    add_contig(ix, "model.w", CK_F32, 2, (int64_t[]){2, 3}, 0, 2 * 3 * 4);
    add_contig(ix, "model.b", CK_BF16, 1, (int64_t[]){3}, 24, 3 * 2);
    add_contig(ix, "s", CK_F64, 0, NULL, 30, 8);
    ck_error err = {""};
    cr_assert_eq(ck_index_add_meta(ix, "format", "pt", &err), 0);
    cr_assert_eq(ck_index_add_meta(ix, "quote \"q\"", "line\nbreak \xc3\xa9", &err), 0);
    return ix;
}

Test(index_json, format_metadata_and_tensors)
{
    ck_index *ix = sample();
    const char *text;
    cJSON *root = index_json(ix, 0, &text);
    expect_string(root, "format", "test");
    const cJSON *meta = member(root, "metadata");
    cr_assert(cJSON_IsObject(meta));
    cr_assert_eq(cJSON_GetArraySize(meta), 2);
    expect_string(meta, "format", "pt");
    expect_string(meta, "quote \"q\"", "line\nbreak \xc3\xa9");
    const cJSON *list = member(root, "tensors");
    cr_assert(cJSON_IsArray(list));
    cr_assert_eq(cJSON_GetArraySize(list), 3);

    const cJSON *w = cJSON_GetArrayItem(list, 0), *b = cJSON_GetArrayItem(list, 1),
                *s = cJSON_GetArrayItem(list, 2);
    expect_string(w, "name", "model.w");
    expect_string(w, "path", "model/w");
    expect_string(w, "dtype", "F32");
    expect_shape(w, 2, (double[]){2, 3});
    expect_number(w, "nbytes", 2 * 3 * 4);
    expect_string(b, "name", "model.b");
    expect_string(b, "path", "model/b");
    expect_string(b, "dtype", "BF16");
    expect_shape(b, 1, (double[]){3});
    expect_number(b, "nbytes", 3 * 2);
    expect_string(s, "name", "s");
    expect_string(s, "path", "s");
    expect_string(s, "dtype", "F64");
    expect_shape(s, 0, NULL);
    expect_number(s, "nbytes", 8);
    cr_assert_null(cJSON_GetObjectItemCaseSensitive(w, "file"));
    cr_assert_null(cJSON_GetObjectItemCaseSensitive(w, "offset"));
    cJSON_Delete(root);
    ck_index_free(ix);
}

Test(index_json, paths_follow_the_tree)
{
    unsigned char data[4] = {0};
    ck_index *ix = index_over(data, sizeof data);
    add_contig(ix, "a", CK_U8, 0, NULL, 0, 1);
    add_contig(ix, "a.b", CK_U8, 0, NULL, 1, 1);
    add_contig(ix, "../x", CK_U8, 0, NULL, 2, 1);
    add_contig(ix, "c\x01", CK_U8, 0, NULL, 3, 1);
    const char *text;
    cJSON *root = index_json(ix, 0, &text);
    const cJSON *list = member(root, "tensors");
    static const char *const paths[] = {"a%", "a/b", "%/%/%2Fx", "c%01"};
    for (int i = 0; i < 4; i++) {
        expect_string(cJSON_GetArrayItem(list, i), "name", ix->entries[i].name);
        expect_string(cJSON_GetArrayItem(list, i), "path", paths[i]);
    }
    cJSON_Delete(root);
    ck_index_free(ix);
}

Test(index_json, with_locations)
{
    ck_index *ix = sample();
    /* A strided tensor has no single offset. */
    ck_error err = {""};
    ck_entry *st = ck_index_add_entry(ix, "str", 3, CK_STRIDED, 1, (int64_t[]){2, 3}, &err);
    cr_assert_not_null(st);
    st->dtype = CK_U8;
    st->nbytes = 2;
    st->ext = (ck_extent){.offset = 5, .file = 0};

    const char *text;
    cJSON *root = index_json(ix, 1, &text);
    const cJSON *list = member(root, "tensors");
    cr_assert_eq(cJSON_GetArraySize(list), 4);
    static const double offsets[] = {0, 24, 30};
    for (int i = 0; i < 3; i++) {
        expect_string(cJSON_GetArrayItem(list, i), "file", ix->files[0].path);
        expect_number(cJSON_GetArrayItem(list, i), "offset", offsets[i]);
    }
    expect_string(cJSON_GetArrayItem(list, 3), "file", ix->files[0].path);
    cr_assert(cJSON_IsNull(member(cJSON_GetArrayItem(list, 3), "offset")));
    cJSON_Delete(root);
    ck_index_free(ix);
}

Test(index_json, large_integers_exact)
{
    ck_index *ix = index_over("x", 1);
    uint64_t d40 = (uint64_t)1 << 40, d62 = (uint64_t)1 << 62, off = ((uint64_t)1 << 60) + 7;
    add_contig(ix, "big", CK_F32, 2, (int64_t[]){(int64_t)d40, 3}, 0, d40 * 3 * 4);
    add_contig(ix, "huge", CK_U8, 2, (int64_t[]){(int64_t)d62 + 1, 1}, off, d62 + 1);
    const char *text;
    cJSON *root = index_json(ix, 1, &text);
    const cJSON *list = member(root, "tensors");
    /* Below 2^53 a parse is exact; above it only the text can tell. */
    expect_shape(cJSON_GetArrayItem(list, 0), 2, (double[]){(double)d40, 3});
    expect_number(cJSON_GetArrayItem(list, 0), "nbytes", (double)(d40 * 3 * 4));
    const char *want[] = {
        strf("\"shape\":[%llu,3]", (unsigned long long)d40),
        strf("\"nbytes\":%llu", (unsigned long long)(d40 * 3 * 4)),
        strf("\"shape\":[%llu,1]", (unsigned long long)(d62 + 1)),
        strf("\"nbytes\":%llu", (unsigned long long)(d62 + 1)),
        strf("\"offset\":%llu", (unsigned long long)off),
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_assert_not_null(strstr(text, want[i]), "'%s' not in %s", want[i], text);
    cr_assert_null(strstr(text, "e+"), "exponent in %s", text);
    cJSON_Delete(root);
    ck_index_free(ix);
}

Test(index_json, values_are_listed_apart_from_tensors)
{
    ck_index *ix = sample();
    ck_error err = {""};
    cr_assert_not_null(ck_index_add_value(ix, "epoch", 5, CK_VAL_INT, "7\n", 2, &err));
    const char *text;
    cJSON *root = index_json(ix, 1, &text);
    cr_assert_eq(cJSON_GetArraySize(member(root, "tensors")), 3);
    const cJSON *values = member(root, "values");
    cr_assert_eq(cJSON_GetArraySize(values), 1);
    const cJSON *v = cJSON_GetArrayItem(values, 0);
    expect_string(v, "name", "epoch");
    expect_string(v, "path", "epoch");
    expect_string(v, "type", "int");
    cJSON_Delete(root);
    ck_index_free(ix);
}

Test(index_json, no_values_member_without_values)
{
    ck_index *ix = sample();
    const char *text;
    cJSON *root = index_json(ix, 0, &text);
    cr_assert_null(cJSON_GetObjectItemCaseSensitive(root, "values"));
    cJSON_Delete(root);
    ck_index_free(ix);
}

Test(index_json, empty_index)
{
    ck_index *ix = ck_index_new("safetensors");
    const char *text;
    cJSON *root = index_json(ix, 0, &text);
    expect_string(root, "format", "safetensors");
    cr_assert_eq(cJSON_GetArraySize(member(root, "metadata")), 0);
    cr_assert_eq(cJSON_GetArraySize(member(root, "tensors")), 0);
    cJSON_Delete(root);
    ck_index_free(ix);
}

Test(index_json, every_byte_a_name_may_hold_reads_back)
{
    /* Names are UTF-8 without NUL: every other control byte, quotes, backslashes, DEL and
     * multibyte characters must come back from a JSON parser as they went in. */
    char name[128];
    size_t n = 0;
    for (int c = 1; c < 0x20; c++)
        name[n++] = (char)c;
    memcpy(name + n, "\"\\/\x7f\xc3\xa9\xe2\x98\x83", 10);
    name[n + 10] = 0;
    unsigned char data[1] = {0};
    ck_index *ix = index_over(data, sizeof data);
    add_contig(ix, name, CK_U8, 0, NULL, 0, 1);
    ck_error err = {""};
    cr_assert_eq(ck_index_add_meta(ix, name, name, &err), 0);
    const char *text;
    cJSON *root = index_json(ix, 1, &text);
    expect_string(member(root, "metadata"), name, name);
    const cJSON *t = cJSON_GetArrayItem(member(root, "tensors"), 0);
    expect_string(t, "name", name);
    cr_assert_null(strpbrk(text, "\x01\x1f\n\t"), "raw control bytes in %s", text);
    cJSON_Delete(root);
    ck_index_free(ix);
}

/* --- ck_view_shape_json ----------------------------------------------------------------- */

/* An entry of this shape, in an index of its own (freed by the caller). */
static const ck_entry *shaped(ck_index **ix, unsigned rank, const int64_t *dims)
{
    *ix = ck_index_new("x");
    ck_error err = {""};
    ck_entry *e = ck_index_add_entry(*ix, "t", 1, CK_CONTIGUOUS, rank, dims, &err);
    cr_assert_not_null(e);
    return e;
}

/* The shape's JSON with every buffer size: the full length back each time, and as much of the
 * text as fits, NUL-terminated, like snprintf; nothing written past cap. */
static void expect_shape_json(unsigned rank, const int64_t *dims, const char *want)
{
    ck_index *ix;
    const ck_entry *e = shaped(&ix, rank, dims);
    size_t full = strlen(want);
    char buf[128];
    cr_assert_lt(full + 8, sizeof buf);
    for (size_t cap = 0; cap <= full + 2; cap++) {
        memset(buf, 'Z', sizeof buf);
        cr_assert_eq(ck_view_shape_json(e, buf, cap), full, "cap %zu", cap);
        if (cap > 0) {
            size_t kept = full < cap - 1 ? full : cap - 1;
            cr_assert_eq(strlen(buf), kept, "cap %zu: '%s'", cap, buf);
            cr_assert(memcmp(buf, want, kept) == 0, "cap %zu: '%s' is not a prefix of '%s'", cap,
                      buf, want);
        }
        for (size_t i = cap; i < sizeof buf; i++)
            cr_assert_eq(buf[i], 'Z', "cap %zu: byte %zu written", cap, i);
    }
    ck_index_free(ix);
}

Test(shape_json, rank_zero)
{
    expect_shape_json(0, NULL, "[]");
}

Test(shape_json, dims)
{
    expect_shape_json(1, (int64_t[]){7}, "[7]");
    expect_shape_json(2, (int64_t[]){2, 3}, "[2,3]");
    expect_shape_json(3, (int64_t[]){0, 123456, 1}, "[0,123456,1]");
}

Test(shape_json, large_dims)
{
    int64_t d40 = (int64_t)1 << 40;
    expect_shape_json(2, (int64_t[]){d40, INT64_MAX},
                      strf("[%lld,%lld]", (long long)d40, (long long)INT64_MAX));
}

/* A long JSON metadata value (a GGUF key's array) is lent to index.json, not copied: its piece
 * points at the index's own text, and reads across the pieces' edges give the same bytes. */
Test(index_json, long_json_metadata_is_lent_not_copied)
{
    ck_index *ix = ck_index_new("gguf");
    ck_error err;
    size_t n = 3000;
    char *value = malloc(2 * n + 2);
    size_t at = 0;
    value[at++] = '[';
    for (size_t k = 0; k < n; k++)
        at += (size_t)sprintf(value + at, "%s%zu", k ? "," : "", k % 10);
    value[at++] = ']';
    value[at] = 0;
    cr_assert_eq(ck_index_add_meta(ix, "test.array", value, &err), 0);
    ix->meta[0].json = 1;
    cr_assert_eq(ck_index_add_meta(ix, "test.short", "[1]", &err), 0);
    ix->meta[1].json = 1;
    free(value);
    ck_tree *t = tree_ok(ix, ".ckptfs", vfiles, 1);
    ck_text v;
    cr_assert_eq(ck_view_index_json(ix, t, NULL, 0, &v), 0);
    cr_assert_eq(v.npieces, 3);
    cr_assert_eq(v.piece[1].s, ix->meta[0].value, "the index's text, not a copy");
    size_t len;
    char *whole = flat(&v, &len);
    cr_assert_str_eq(whole, strf("{\"format\":\"gguf\",\"metadata\":{\"test.array\":%s,"
                                 "\"test.short\":[1]},\"tensors\":[]}", ix->meta[0].value));
    char buf[64];
    for (uint64_t off = 0; off <= len; off += 7) {
        size_t got = ck_text_read(&v, off, buf, sizeof buf);
        size_t want = len - off < sizeof buf ? len - off : sizeof buf;
        cr_assert_eq(got, want, "at %llu", (unsigned long long)off);
        cr_assert_arr_eq(buf, whole + off, got, "at %llu", (unsigned long long)off);
        struct iovec iov[1];
        unsigned pieces;
        size_t lent = ck_text_lend(&v, off, sizeof buf, iov, 1, &pieces);
        cr_assert_leq(lent, want);
        cr_assert_arr_eq(iov[0].iov_base, whole + off, lent);
    }
    free(whole);
    ck_text_free(&v);
    ck_tree_free(t);
    ck_index_free(ix);
}
