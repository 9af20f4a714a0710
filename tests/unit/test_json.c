/* base/json.h: integers into JSON text exactly, and back only where a double is exact. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/json.h"

TestSuite(json);

static char *printed(uint64_t v)
{
    cJSON *n = ck_json_uint(v);
    cr_assert_not_null(n);
    char *s = cJSON_PrintUnformatted(n);
    cJSON_Delete(n);
    return s;
}

Test(json, uint_is_exact_decimal)
{
    static const struct { uint64_t v; const char *text; } cases[] = {
        {0, "0"}, {9007199254740993ull, "9007199254740993"},
        {UINT64_MAX, "18446744073709551615"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *s = printed(cases[i].v);
        cr_assert_str_eq(s, cases[i].text);
        free(s);
    }
}

/* Parses text and reads it as a count: 0 with *out set, or -1. */
static int count_of(const char *text, uint64_t *out)
{
    cJSON *v = cJSON_Parse(text);
    cr_assert_not_null(v, "%s", text);
    int rc = ck_json_count(v, out);
    cJSON_Delete(v);
    return rc;
}

Test(json, count_only_below_2_to_the_53)
{
    uint64_t n = 0;
    cr_assert_eq(count_of("0", &n), 0);
    cr_assert_eq(n, 0);
    cr_assert_eq(count_of("9007199254740991", &n), 0);
    cr_assert_eq(n, 9007199254740991ull);
    static const char *const bad[] = {"9007199254740992", "1e300", "-1", "2.5", "\"3\"",
                                      "null", "[1]"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert_eq(count_of(bad[i], &n), -1, "%s", bad[i]);
}

/* A growing buffer for ck_json_string. */
typedef struct text {
    char s[4096];
    size_t n;
} text;

static void put_into(void *ctx, const char *s, size_t n)
{
    text *t = ctx;
    cr_assert_leq(t->n + n, sizeof t->s);
    memcpy(t->s + t->n, s, n);
    t->n += n;
}

/* Every byte string of UTF-8 escapes as cJSON escapes it (cJSON_PrintUnformatted, the
 * independent reference), whatever its control bytes, quotes and backslashes. */
Test(json, string_escapes_as_cjson_does)
{
    srand(24);
    for (int round = 0; round < 2000; round++) {
        char s[64];
        size_t n = (size_t)(rand() % 40);
        for (size_t i = 0; i < n; i++) {
            static const char pick[] = "ab\"\\/\n\t\r\b\f\x01\x1f\x7f ~";
            s[i] = rand() % 3 ? pick[rand() % (sizeof pick - 1)] : (char)(0x20 + rand() % 95);
        }
        s[n] = 0;
        text t = {.n = 0};
        ck_json_string(put_into, &t, s, n, CK_JSON_UTF8 | CK_JSON_NAMED);
        cJSON *ref = cJSON_CreateString(s);
        char *want = cJSON_PrintUnformatted(ref);
        cr_assert_eq(t.n, strlen(want), "round %d", round);
        cr_assert(memcmp(t.s, want, t.n) == 0, "round %d: %.*s against %s", round, (int)t.n,
                  t.s, want);
        free(want);
        cJSON_Delete(ref);
    }
}

/* Unvouched text: each byte that breaks UTF-8 is U+FFFD, control bytes all \u00XX; what cJSON
 * parses back is the text with those replacements. */
Test(json, string_replaces_what_is_not_utf8)
{
    static const char s[] = "a\xff" "b\xc3\xa9\n\xe2\x82" "\"";
    text t = {.n = 0};
    ck_json_string(put_into, &t, s, sizeof s - 1, 0);
    cr_assert_eq(t.n, strlen("\"a\\ufffdb\xc3\xa9\\u000a\\ufffd\\ufffd\\\"\""));
    cr_assert(memcmp(t.s, "\"a\\ufffdb\xc3\xa9\\u000a\\ufffd\\ufffd\\\"\"", t.n) == 0,
              "%.*s", (int)t.n, t.s);
    t.s[t.n] = 0;
    cJSON *back = cJSON_Parse(t.s);
    cr_assert_str_eq(cJSON_GetStringValue(back),
                     "a\xef\xbf\xbd" "b\xc3\xa9\n\xef\xbf\xbd\xef\xbf\xbd\"");
    cJSON_Delete(back);
}

/* ck_json_end agrees with cJSON on where a value ends, and no cut of a text reads past the cut. */
Test(json, end_is_where_cjson_stops)
{
    static const char *texts[] = {
        "true,", "-12.5e3]", "\"a\\\"]\\\\\" ,", "[1,\"]\",{\"k\":[2,{}]},[]] x",
        "{\"type\":\"ARRAY\",\"value\":[\"}\",\"\\\\\"]\n}, 1", "null }", "[ 1 , 2 ]",
    };
    for (size_t k = 0; k < sizeof texts / sizeof *texts; k++) {
        const char *s = texts[k], *stop;
        size_t n = strlen(s);
        cJSON *v = cJSON_ParseWithOpts(s, &stop, 0);
        cr_assert_not_null(v, "%s", s);
        cJSON_Delete(v);
        cr_assert_eq(ck_json_end(s, n, 0), (size_t)(stop - s), "%s", s);
        for (size_t cut = 0; cut <= n; cut++) {
            char *part = malloc(cut ? cut : 1); /* no NUL after it: ASan sees a read past */
            memcpy(part, s, cut);
            cr_assert_leq(ck_json_end(part, cut, 0), cut);
            size_t from, to;
            if (ck_json_member(part, cut, 0, "value", &from, &to) == 0)
                cr_assert(from <= to && to <= cut);
            free(part);
        }
    }
}

Test(json, member_of_a_typed_value)
{
    const char *s = " {\"type\":\"ARRAY\", \"item_type\":\"value\",\"value\" : [true,\"\\\"value\\\"\"]\n}";
    size_t from, to;
    cr_assert_eq(ck_json_member(s, strlen(s), 0, "value", &from, &to), 0);
    cr_assert_eq(to - from, strlen("[true,\"\\\"value\\\"\"]"));
    cr_assert_eq(memcmp(s + from, "[true,", 6), 0);
    cr_assert_eq(ck_json_member(s, strlen(s), 0, "valu", &from, &to), -1);
    cr_assert_eq(ck_json_member("[1]", 3, 0, "value", &from, &to), -1);
}
