/* The safetensors reader: every rule of the spec it enforces, through ck_open on real files, and
 * what it builds for files that follow them. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../formats/safetensors.h"
#include "helpers.h"

TestSuite(st_file, .fini = tmp_cleanup);
TestSuite(st_header, .fini = tmp_cleanup);
TestSuite(st_tensor, .fini = tmp_cleanup);
TestSuite(st_tiling, .fini = tmp_cleanup);
TestSuite(st_ok, .fini = tmp_cleanup);

/* A file with this header and data_len zero bytes after it must be refused, saying what. */
static void refused(const char *header, size_t data_len, const char *what)
{
    unsigned char *zeros = calloc(1, data_len + 1);
    cr_assert_not_null(zeros);
    const char *path = st_file(header, zeros, data_len);
    free(zeros);
    assert_open_fails(path, what);
}

/* Where text first occurs in header, as a header byte offset. */
static size_t at(const char *header, const char *text)
{
    const char *p = strstr(header, text);
    cr_assert_not_null(p, "'%s' is not in '%s'", text, header);
    return (size_t)(p - header);
}

/* --- the file around the header ------------------------------------------------------ */

Test(st_file, header_length_past_eof)
{
    assert_open_fails(st_file_hlen(1000, "{}", 2),
                      strf("header length %d runs past the end of the file (%d bytes)", 1000, 8 + 2));
}

Test(st_file, header_length_one_past_eof)
{
    assert_open_fails(st_file_hlen(3, "{}", 2), "header length 3 runs past the end of the file");
}

Test(st_file, header_length_exactly_to_eof)
{
    ck_index *ix = open_ok(st_file_hlen(2, "{}", 2));
    cr_assert_eq(ix->nentries, 0);
    ck_index_free(ix);
}

Test(st_file, header_length_over_limit)
{
    assert_open_fails(st_file_hlen(100000001, "{}", 2),
                      "header length 100000001 exceeds the limit of 100000000");
}

Test(st_file, header_length_at_limit_is_only_past_eof)
{
    assert_open_fails(st_file_hlen(100000000, "{}", 2),
                      "header length 100000000 runs past the end of the file");
}

Test(st_file, header_length_all_ones)
{
    assert_open_fails(st_file_hlen(UINT64_MAX, "{}", 2),
                      strf("header length %llu exceeds the limit", (unsigned long long)UINT64_MAX));
}

Test(st_file, header_length_zero)
{
    assert_open_fails(st_file_hlen(0, "{}", 2), "header does not start with '{' (header byte 0)");
}

Test(st_file, too_short_for_length_field)
{
    ck_index *ix = index_over("{}{}{", 5);
    ck_error err = {""};
    cr_assert_eq(st_read_file(ix, 0, &err), -1);
    assert_error(&err, ix->files[0].path, "file is 5 bytes, too short for a safetensors header");
    ck_index_free(ix);
}

/* The file shrinks between the index's fstat and the read: a read error, not garbage. */
static void shrunk(size_t to, const char *what)
{
    size_t len;
    unsigned char *b = st_bytes("{}  ", NULL, 0, &len);
    ck_index *ix = index_over(b, len);
    free(b);
    cr_assert_eq(truncate(ix->files[0].path, (off_t)to), 0);
    ck_error err = {""};
    cr_assert_eq(st_read_file(ix, 0, &err), -1);
    assert_error(&err, ix->files[0].path, strf("%s: %s", what, strerror(EIO)));
    ck_index_free(ix);
}

Test(st_file, length_field_unreadable)
{
    shrunk(4, "cannot read header length");
}

Test(st_file, header_unreadable)
{
    shrunk(10, "cannot read header");
}

/* --- the header as JSON ------------------------------------------------------------- */

Test(st_header, not_utf8)
{
    static const char *const bad[] = {
        "\xff",             /* never valid */
        "\x80",             /* a lone continuation byte */
        "\xc0\x80",         /* overlong NUL */
        "\xc1\xbf",         /* overlong */
        "\xe0\x80\x80",     /* overlong 3-byte */
        "\xed\xa0\x80",     /* surrogate U+D800 */
        "\xf0\x80\x80\x80", /* overlong 4-byte */
        "\xf4\x90\x80\x80", /* past U+10FFFF */
        "\xf5\x80\x80\x80", /* past U+10FFFF */
        "\xc3\"",           /* a 2-byte sequence cut short */
        "\xe4\xb8\"",       /* a 3-byte sequence cut short */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *header = strf("{\"%s\":1}", bad[i]);
        refused(header, 0, strf("header is not valid UTF-8 (header byte %zu)", at(header, bad[i])));
    }
}

Test(st_header, not_utf8_at_the_very_end)
{
    const char *header = "{}  \xe2\x82";
    refused(header, 0, strf("header is not valid UTF-8 (header byte %zu)", strlen(header) - 2));
}

Test(st_header, not_json)
{
    static const char *const bad[] = {"{\"a\":}", "{\"a\"", "{", "{\"a\":[1,]}", "{'a':1}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        refused(bad[i], 0, "header is not valid JSON");
}

Test(st_header, not_an_object)
{
    ck_index *ix = index_over("", 0);
    static const char *const bad[] = {"[]", " {}", "\"x\"", "1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ck_error err = {""};
        cr_assert_eq(st_parse_header(ix, 0, bad[i], strlen(bad[i]), 8, 0, &err), -1);
        assert_error(&err, ix->files[0].path, "header does not start with '{' (header byte 0)");
    }
    cr_assert_eq(ix->nentries, 0);
    ck_index_free(ix);
}

Test(st_header, bytes_after_the_json)
{
    static const char *const bad[] = {"{}x", "{} x", "{}{}", "{}\n]", "{}\t,"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        size_t pos = 2 + strspn(bad[i] + 2, " \t\n"); /* after "{}" and any white space */
        refused(bad[i], 0, strf("unexpected bytes after the header JSON (header byte %zu)", pos));
    }
}

Test(st_header, nul_byte_after_the_json)
{
    assert_open_fails(st_file_hlen(3, "{}\0", 3), "header holds control byte 0x00 (header byte 2)");
}

Test(st_header, escaped_nul_in_name)
{
    const char *header = strf("{%s}", st_tensor("a\\u0000b", "U8", "[1]", 0, 1));
    refused(header, 1, strf("header string contains \\u0000 (header byte %zu)", at(header, "\\u")));
}

Test(st_header, escaped_nul_in_metadata)
{
    const char *header = "{\"__metadata__\":{\"k\":\"v\\u0000\"}}";
    refused(header, 0, strf("header string contains \\u0000 (header byte %zu)", at(header, "\\u")));
}

Test(st_header, escaped_nul_in_dtype)
{
    const char *header = strf("{%s}", st_tensor("a", "U8\\u0000", "[1]", 0, 1));
    refused(header, 1, strf("header string contains \\u0000 (header byte %zu)", at(header, "\\u")));
}

Test(st_header, raw_control_byte_in_name)
{
    const char *header = strf("{%s}", st_tensor("a\x1f" "b", "U8", "[1]", 0, 1));
    refused(header, 1, strf("header holds control byte 0x1f (header byte %zu)",
                            at(header, "\x1f")));
    /* in a string, even the bytes that are white space outside one */
    const char *tab = strf("{%s}", st_tensor("a\tb", "U8", "[1]", 0, 1));
    refused(tab, 1, strf("header holds control byte 0x09 (header byte %zu)", at(tab, "\t")));
}

Test(st_header, raw_nul_in_name)
{
    /* JSON forbids it; cJSON would take the name to end there, so "a\0b" would become "a". */
    static const char bytes[] = "{\"a\0b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}x";
    size_t hlen = sizeof bytes - 2; /* all but the data byte x and the C string's NUL */
    assert_open_fails(st_file_hlen(hlen, bytes, hlen + 1),
                      "header holds control byte 0x00 (header byte 3)");
}

Test(st_header, control_bytes_as_white_space)
{
    /* cJSON would skip them as white space; JSON allows only space, tab, LF and CR. */
    static const char bytes[] = "{\"a\":{\"dtype\":\"U8\",\"shape\":[1\0],\"data_offsets\":[0,1]}}x";
    size_t hlen = sizeof bytes - 2;
    assert_open_fails(st_file_hlen(hlen, bytes, hlen + 1),
                      strf("header holds control byte 0x00 (header byte %zu)", at(bytes, "1") + 1));
    refused("{\x01}", 0, "header holds control byte 0x01 (header byte 1)");
    refused("{}\x0b", 0, "header holds control byte 0x0b (header byte 2)");
}

Test(st_header, non_integer_numbers)
{
    static const char *const bad[] = {"1.5", "1e3", "1E3", "2.0", "1e+0", "1e-0", "-0.5"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *header = strf("{%s}", st_tensor("a", "U8", strf("[%s]", bad[i]), 0, 1));
        refused(header, 1, strf("number %s is not an integer (header byte %zu)", bad[i],
                                at(header, bad[i])));
    }
}

Test(st_header, non_integer_offset)
{
    const char *header = "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1.0]}}";
    refused(header, 1, strf("number 1.0 is not an integer (header byte %zu)", at(header, "1.0")));
}

Test(st_header, metadata_not_an_object)
{
    static const char *const bad[] = {"\"x\"", "[]", "1"}; /* null: no metadata (MLX) */
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        refused(strf("{\"__metadata__\":%s}", bad[i]), 0, "__metadata__ is not an object");
}

Test(st_header, metadata_value_not_a_string)
{
    static const char *const bad[] = {"1", "null", "true", "{}", "[\"x\"]"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        refused(strf("{\"__metadata__\":{\"ok\":\"x\",\"k%zu\":%s}}", i, bad[i]), 0,
                strf("__metadata__ value of 'k%zu' is not a string", i));
}

Test(st_header, duplicate_metadata)
{
    refused("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate \"__metadata__\"");
}

/* --- one tensor's description --------------------------------------------------------- */

Test(st_tensor, description_not_an_object)
{
    static const char *const bad[] = {"1", "[]", "\"x\"", "null"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        refused(strf("{\"a\":%s}", bad[i]), 0, "tensor 'a': description is not an object");
}

Test(st_tensor, dtype_missing_or_not_a_string)
{
    refused("{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
            "tensor 'a': missing or non-string \"dtype\"");
    refused("{\"a\":{\"dtype\":8,\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
            "tensor 'a': missing or non-string \"dtype\"");
}

Test(st_tensor, unknown_dtype)
{
    /* The last three are ckptfs names for torch dtypes, not the spec's. */
    static const char *const bad[] = {"F128", "f32", "",    "F8_E4M3FN", "FLOAT",
                                      "F3",   "F322", "C128", "C32",      "F8_E4M3FNUZ"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        refused(strf("{%s}", st_tensor("a", bad[i], "[1]", 0, 1)), 1,
                strf("tensor 'a': unknown dtype '%s'", bad[i]));
}

Test(st_tensor, shape_missing_or_not_an_array)
{
    refused("{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1,
            "tensor 'a': missing or non-array \"shape\"");
    refused(strf("{%s}", st_tensor("a", "U8", "1", 0, 1)), 1, "tensor 'a': missing or non-array \"shape\"");
    refused(strf("{%s}", st_tensor("a", "U8", "{}", 0, 1)), 1, "tensor 'a': missing or non-array \"shape\"");
}

/* "[1,1,...,1]" of rank ones. */
static const char *ones(int rank)
{
    char *s = calloc(1, 2 * (size_t)rank + 3);
    cr_assert_not_null(s);
    strcat(s, "[");
    for (int i = 0; i < rank; i++)
        strcat(s, i ? ",1" : "1");
    strcat(s, "]");
    const char *r = strf("%s", s);
    free(s);
    return r;
}

Test(st_tensor, rank_over_64)
{
    refused(strf("{%s}", st_tensor("a", "U8", ones(CK_MAX_RANK + 1), 0, 1)), 1,
            strf("tensor 'a': rank %d exceeds %d", CK_MAX_RANK + 1, CK_MAX_RANK));
}

Test(st_tensor, rank_64_accepted)
{
    ck_index *ix = open_ok(st_file(strf("{%s}", st_tensor("a", "U8", ones(64), 0, 1)), "x", 1));
    cr_assert_eq(ix->nentries, 1);
    cr_assert_eq(ix->entries[0].rank, 64);
    ck_index_free(ix);
}

Test(st_tensor, negative_or_non_numeric_dims)
{
    static const char *const shapes[] = {"[-1]", "[2,-3]", "[\"2\"]", "[null]", "[true]", "[[1]]"};
    static const int bad_dim[] = {0, 1, 0, 0, 0, 0};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        refused(strf("{%s}", st_tensor("a", "U8", shapes[i], 0, 1)), 1,
                strf("tensor 'a': shape[%d] is not a non-negative integer below 2^53", bad_dim[i]));
}

Test(st_tensor, huge_dims)
{
    unsigned long long two53 = 1ull << 53;
    static const char *const huge[] = {"100000000000000000000", "9007199254740993",
                                       "123456789012345678901234567890"};
    refused(strf("{%s}", st_tensor("a", "U8", strf("[%llu]", two53), 0, 1)), 1,
            "tensor 'a': shape[0] is not a non-negative integer below 2^53");
    for (size_t i = 0; i < sizeof huge / sizeof *huge; i++)
        refused(strf("{%s}", st_tensor("a", "U8", strf("[1,%s]", huge[i]), 0, 1)), 1,
                "tensor 'a': shape[1] is not a non-negative integer below 2^53");
}

Test(st_tensor, largest_dim_is_accepted_as_a_dim)
{
    /* 2^53 - 1 passes the shape check; the file then simply lacks the data. */
    unsigned long long big = (1ull << 53) - 1;
    refused(strf("{%s}", st_tensor("a", "U8", strf("[%llu]", big), 0, big)), 1,
            strf("tensor 'a' ends at data byte %llu, past the end of file", big));
}

Test(st_tensor, shape_product_overflows)
{
    unsigned long long d32 = 1ull << 32, d26 = 1ull << 26;
    refused(strf("{%s}", st_tensor("a", "U8", strf("[%llu,%llu]", d32, d32), 0, 1)), 1,
            "tensor 'a': shape × U8 overflows or is not a whole number of bytes");
    refused(strf("{%s}", st_tensor("a", "F32", strf("[%llu,%llu,%llu]", d26, d26, d26), 0, 1)), 1,
            "tensor 'a': shape × F32 overflows");
    /* 2^61 elements fit in 64 bits; their 2^64 bytes do not */
    refused(strf("{%s}", st_tensor("a", "F64", strf("[%llu,%llu]", 1ull << 52, 1ull << 9), 0, 1)), 1,
            "tensor 'a': shape × F64 overflows");
}

Test(st_tensor, sub_byte_odd_count)
{
    refused(strf("{%s}", st_tensor("a", "F4", "[3]", 0, 2)), 2,
            "tensor 'a': shape × F4 overflows or is not a whole number of bytes");
    refused(strf("{%s}", st_tensor("a", "F4", "[]", 0, 1)), 1, "tensor 'a': shape × F4 overflows");
    refused(strf("{%s}", st_tensor("a", "F6_E2M3", "[2]", 0, 2)), 2,
            "tensor 'a': shape × F6_E2M3 overflows");
    refused(strf("{%s}", st_tensor("a", "F6_E3M2", "[3,1]", 0, 3)), 3,
            "tensor 'a': shape × F6_E3M2 overflows");
}

Test(st_tensor, extent_differs_from_shape_times_dtype)
{
    refused(strf("{%s}", st_tensor("a", "F32", "[2]", 0, 4)), 4,
            strf("tensor 'a': data_offsets [0, 4] hold 4 bytes, shape × F32 needs %d", 2 * 4));
    refused(strf("{%s}", st_tensor("a", "BF16", "[3,2]", 0, 13)), 13,
            strf("tensor 'a': data_offsets [0, 13] hold 13 bytes, shape × BF16 needs %d", 3 * 2 * 2));
    refused(strf("{%s}", st_tensor("a", "F4", "[4]", 0, 4)), 4,
            strf("hold 4 bytes, shape × F4 needs %d", 4 * 4 / 8));
}

Test(st_tensor, offsets_not_two_integers)
{
    static const char *const bad[] = {
        "", ",\"data_offsets\":[0]", ",\"data_offsets\":[0,1,2]", ",\"data_offsets\":[-1,0]",
        ",\"data_offsets\":[\"0\",1]", ",\"data_offsets\":{}", ",\"data_offsets\":[0,null]",
        ",\"data_offsets\":[0,9007199254740992]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        refused(strf("{\"a\":{\"dtype\":\"U8\",\"shape\":[0]%s}}", bad[i]), 0,
                "tensor 'a': \"data_offsets\" is not two non-negative integers below 2^53");
}

Test(st_tensor, offsets_end_before_begin)
{
    refused(strf("{%s}", st_tensor("a", "U8", "[4]", 8, 4)), 8,
            "tensor 'a': data_offsets [8, 4] end before they begin");
}

/* --- how the tensors tile the data region ---------------------------------------------- */

Test(st_tiling, offsets_not_starting_at_zero)
{
    refused(strf("{%s}", st_tensor("a", "U8", "[4]", 4, 8)), 8,
            "hole in the data region: bytes [0, 4) belong to no tensor (before tensor 'a')");
}

Test(st_tiling, hole_between_tensors)
{
    refused(strf("{%s,%s}", st_tensor("a", "U8", "[4]", 0, 4), st_tensor("b", "U8", "[4]", 6, 10)), 10,
            "hole in the data region: bytes [4, 6) belong to no tensor (before tensor 'b')");
}

Test(st_tiling, overlap)
{
    refused(strf("{%s,%s}", st_tensor("b", "U8", "[4]", 2, 6), st_tensor("a", "U8", "[4]", 0, 4)), 6,
            "tensor 'b' [2, 6] overlaps tensor 'a'");
}

Test(st_tiling, empty_tensor_inside_another)
{
    refused(strf("{%s,%s}", st_tensor("a", "U8", "[4]", 0, 4), st_tensor("e", "U8", "[0]", 2, 2)), 4,
            "tensor 'e' [2, 2] overlaps tensor 'a'");
}

Test(st_tiling, same_extent_twice)
{
    refused(strf("{%s,%s}", st_tensor("a", "U8", "[4]", 0, 4), st_tensor("b", "U8", "[4]", 0, 4)), 4,
            "[0, 4] overlaps tensor '");
}

Test(st_tiling, data_past_eof)
{
    refused(strf("{%s}", st_tensor("a", "U8", "[8]", 0, 8)), 4,
            "tensor 'a' ends at data byte 8, past the end of file (data region is 4 bytes)");
}

Test(st_tiling, data_not_reaching_eof)
{
    refused(strf("{%s}", st_tensor("a", "U8", "[4]", 0, 4)), 6,
            strf("%d trailing bytes after the last tensor (data region is %d bytes, tensors end "
                 "at %d)", 6 - 4, 6, 4));
}

Test(st_tiling, data_without_tensors)
{
    refused("{}", 3, "3 trailing bytes after the last tensor");
}

Test(st_tiling, duplicate_names)
{
    refused(strf("{%s,%s}", st_tensor("a", "U8", "[1]", 0, 1), st_tensor("a", "U8", "[1]", 1, 2)), 2,
            "duplicate tensor name 'a'");
}

/* --- files that follow the rules ------------------------------------------------------ */

/* Every dtype, as the spec names it, with its width in bits. */
static const struct {
    const char *name;
    unsigned bits;
} all_dtypes[] = {
    {"BOOL", 8},    {"U8", 8},      {"I8", 8},       {"F8_E5M2", 8}, {"F8_E4M3", 8},
    {"F8_E8M0", 8}, {"I16", 16},    {"U16", 16},     {"F16", 16},    {"BF16", 16},
    {"I32", 32},    {"U32", 32},    {"F32", 32},     {"I64", 64},    {"U64", 64},
    {"F64", 64},    {"C64", 64},    {"F4", 4},       {"F6_E2M3", 6}, {"F6_E3M2", 6},
};
enum { NDTYPES = sizeof all_dtypes / sizeof *all_dtypes };

Test(st_ok, every_dtype)
{
    /* One [2,4] tensor of each dtype, one after the other. */
    const char *header = "{";
    uint64_t begin[NDTYPES], size[NDTYPES], total = 0;
    for (size_t i = 0; i < NDTYPES; i++) {
        size[i] = 2 * 4 * all_dtypes[i].bits / 8;
        begin[i] = total;
        total += size[i];
        header = strf("%s%s%s", header, i ? "," : "",
                      st_tensor(strf("t%zu", i), all_dtypes[i].name, "[2,4]", begin[i], begin[i] + size[i]));
    }
    header = strf("%s}", header);
    unsigned char data[1024];
    cr_assert_leq(total, sizeof data);
    fill_bytes(data, total, 1);
    ck_index *ix = open_ok(st_file(header, data, total));
    cr_assert_str_eq(ix->format, "safetensors");
    cr_assert_eq(ix->nentries, NDTYPES);
    for (size_t i = 0; i < NDTYPES; i++) {
        const ck_entry *e = &ix->entries[i];
        cr_assert_str_eq(e->name, strf("t%zu", i));
        cr_assert_str_eq(ck_dtype_name(e->dtype), all_dtypes[i].name);
        cr_assert_eq(e->rank, 2);
        cr_assert(e->shape[0] == 2 && e->shape[1] == 4);
        cr_assert_eq(e->nbytes, size[i], "%s: nbytes %llu", all_dtypes[i].name,
                     (unsigned long long)e->nbytes);
        cr_assert_eq(e->ext.offset, 8 + strlen(header) + begin[i]);
        unsigned char got[64];
        cr_assert_eq(ck_entry_read(ix, e, got, sizeof got, 0), (ssize_t)size[i]);
        cr_assert_arr_eq(got, data + begin[i], size[i]);
    }
    ck_index_free(ix);
}

Test(st_ok, sub_byte_whole_bytes)
{
    const char *header = strf("{%s,%s}", st_tensor("f4", "F4", "[3,2]", 0, 3), st_tensor("f6", "F6_E3M2", "[4]", 3, 6));
    ck_index *ix = open_ok(st_file(header, "abcdef", 6));
    cr_assert_eq(ix->nentries, 2);
    cr_assert_eq(ix->entries[0].nbytes, 3 * 2 * 4 / 8);
    cr_assert_eq(ix->entries[1].nbytes, 4 * 6 / 8);
    ck_index_free(ix);
}

Test(st_ok, rank_zero)
{
    double v = 2.5;
    ck_index *ix = open_ok(st_file(strf("{%s}", st_tensor("s", "F64", "[]", 0, 8)), &v, sizeof v));
    cr_assert_eq(ix->nentries, 1);
    const ck_entry *e = &ix->entries[0];
    cr_assert_eq(e->rank, 0);
    cr_assert_eq(e->nbytes, 8);
    double got = 0;
    cr_assert_eq(ck_entry_read(ix, e, &got, sizeof got, 0), 8);
    cr_assert_eq(got, 2.5);
    ck_index_free(ix);
}

Test(st_ok, empty_tensors)
{
    const char *header = strf("{%s,%s,%s,%s}", st_tensor("z0", "F32", "[0]", 0, 0),
                              st_tensor("a", "U8", "[4]", 0, 4), st_tensor("z1", "F32", "[2,0,3]", 4, 4),
                              st_tensor("z2", "F4", "[0]", 4, 4));
    ck_index *ix = open_ok(st_file(header, "wxyz", 4));
    cr_assert_eq(ix->nentries, 4);
    static const char *const empty[] = {"z0", "z1", "z2"};
    for (size_t i = 0; i < 3; i++) {
        const ck_entry *e = ck_index_find(ix, empty[i]);
        cr_assert_not_null(e, "%s", empty[i]);
        cr_assert_eq(e->nbytes, 0);
        char c;
        cr_assert_eq(ck_entry_read(ix, e, &c, 1, 0), 0);
    }
    cr_assert_eq(ck_index_find(ix, "z1")->rank, 3);
    cr_assert_eq(ck_index_find(ix, "z1")->shape[1], 0);
    ck_index_free(ix);
}

Test(st_ok, only_empty_tensors_and_no_data)
{
    ck_index *ix = open_ok(st_file(strf("{%s}", st_tensor("e", "I64", "[0,5]", 0, 0)), NULL, 0));
    cr_assert_eq(ix->nentries, 1);
    cr_assert_eq(ix->entries[0].nbytes, 0);
    ck_index_free(ix);
}

Test(st_ok, empty_header)
{
    ck_index *ix = open_ok(st_file("{}", NULL, 0));
    cr_assert_eq(ix->nentries, 0);
    cr_assert_eq(ix->nmeta, 0);
    cr_assert_str_eq(ix->format, "safetensors");
    ck_index_free(ix);
}

Test(st_ok, metadata_lands_in_meta)
{
    const char *header = strf("{%s,\"__metadata__\":{\"format\":\"pt\",\"note\":\"a \\\"q\\\" \xc3\xa9\"},%s}",
                              st_tensor("a", "U8", "[1]", 0, 1), st_tensor("b", "U8", "[1]", 1, 2));
    ck_index *ix = open_ok(st_file(header, "ab", 2));
    cr_assert_eq(ix->nentries, 2);
    cr_assert_eq(ix->nmeta, 2);
    cr_assert_str_eq(ix->meta[0].key, "format");
    cr_assert_str_eq(ix->meta[0].value, "pt");
    cr_assert_str_eq(ix->meta[1].key, "note");
    cr_assert_str_eq(ix->meta[1].value, "a \"q\" \xc3\xa9");
    cr_assert_null(ck_index_find(ix, "__metadata__"));
    ck_index_free(ix);
}

Test(st_ok, entries_in_offset_order)
{
    const char *header = strf("{%s,%s,%s}", st_tensor("c", "U8", "[3]", 2, 5), st_tensor("a", "U8", "[4]", 5, 9),
                              st_tensor("b", "U8", "[2]", 0, 2));
    unsigned char data[9];
    fill_bytes(data, sizeof data, 2);
    ck_index *ix = open_ok(st_file(header, data, sizeof data));
    cr_assert_eq(ix->nentries, 3);
    static const char *const order[] = {"b", "c", "a"};
    static const uint64_t begin[] = {0, 2, 5};
    for (size_t i = 0; i < 3; i++) {
        cr_assert_str_eq(ix->entries[i].name, order[i]);
        cr_assert_eq(ix->entries[i].ext.offset, 8 + strlen(header) + begin[i]);
        cr_assert_eq(ix->entries[i].ext.file, 0);
        cr_assert_eq(ix->entries[i].layout, CK_CONTIGUOUS);
    }
    ck_index_free(ix);
}

Test(st_ok, trailing_spaces_in_header)
{
    /* The reference writer pads the header with spaces to a multiple of 8 bytes. */
    const char *header = strf("{%s}", st_tensor("a", "U16", "[2]", 0, 4));
    while (strlen(header) % 8)
        header = strf("%s ", header);
    header = strf("%s        ", header);
    ck_index *ix = open_ok(st_file(header, "abcd", 4));
    cr_assert_eq(ix->nentries, 1);
    cr_assert_eq(ix->entries[0].ext.offset, 8 + strlen(header));
    ck_index_free(ix);
    ix = open_ok(st_file("{} \t\r\n", NULL, 0));
    ck_index_free(ix);
}

Test(st_ok, file_recorded)
{
    const char *path = st_file(strf("{%s}", st_tensor("a", "U8", "[3]", 0, 3)), "abc", 3);
    ck_index *ix = open_ok(path);
    cr_assert_eq(ix->nfiles, 1);
    cr_assert_str_eq(ix->files[0].path, path);
    cr_assert_eq(ix->files[0].size, 8 + strlen(strf("{%s}", st_tensor("a", "U8", "[3]", 0, 3))) + 3);
    ck_index_free(ix);
}

Test(st_ok, utf8_and_escaped_names)
{
    static const char *const names[] = {"\xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f\x98\x80",
                                        "\xf4\x8f\xbf\xbf", "\xed\x9f\xbf", "\xee\x80\x80"};
    const char *header = "{";
    for (size_t i = 0; i < 6; i++)
        header = strf("%s%s,", header, st_tensor(names[i], "U8", "[0]", 0, 0));
    header = strf("%s%s,%s}", header, st_tensor("a\\u0001b", "U8", "[0]", 0, 0),
                  st_tensor("back\\\\u0000slash", "U8", "[0]", 0, 0));
    ck_index *ix = open_ok(st_file(header, NULL, 0));
    cr_assert_eq(ix->nentries, 8);
    for (size_t i = 0; i < 6; i++)
        cr_assert_not_null(ck_index_find(ix, names[i]), "name %zu", i);
    cr_assert_not_null(ck_index_find(ix, "a\x01" "b"));
    cr_assert_not_null(ck_index_find(ix, "back\\u0000slash"));
    ck_index_free(ix);
}

Test(st_ok, parse_header_places_data_at_data_start)
{
    ck_index *ix = index_over("", 0);
    const char *json = strf("{%s,%s}", st_tensor("b", "U8", "[1]", 3, 4), st_tensor("a", "U8", "[3]", 0, 3));
    ck_error err = {""};
    cr_assert_eq(st_parse_header(ix, 0, json, strlen(json), 1000, 4, &err), 0, "%s", err.msg);
    cr_assert_eq(ix->nentries, 2);
    cr_assert_str_eq(ix->entries[0].name, "a");
    cr_assert_eq(ix->entries[0].ext.offset, 1000);
    cr_assert_eq(ix->entries[1].ext.offset, 1003);
    ck_index_free(ix);
}
