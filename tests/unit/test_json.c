/* pack/json.h: integers into JSON text exactly, and back only where a double is exact. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "../../pack/json.h"

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
