#include "json.h"
#include "utf8.h"

#include <stdio.h>
#include <string.h>

#define MAX_EXACT_DOUBLE 9007199254740992.0 /* 2^53: above it a double no longer counts by one */

cJSON *ck_json_uint(uint64_t v)
{
    char s[24];
    snprintf(s, sizeof s, "%llu", (unsigned long long)v);
    return cJSON_CreateRaw(s);
}

int ck_json_count(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v))
        return -1;
    double d = v->valuedouble;
    if (!(d >= 0 && d < MAX_EXACT_DOUBLE) || d != (double)(uint64_t)d) /* NaN fails the first */
        return -1;
    *out = (uint64_t)d;
    return 0;
}

/* Whether any of the 8 bytes in w is below 0x20, '"' or '\\' (a byte that needs an escape).
 * The usual bit tricks: a zero byte of w - 0x01.., where w's byte had no high bit. */
static int word_has_special(uint64_t w)
{
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
    return ((((w - ones * 0x20) & ~w) | ((q - ones) & ~q) | ((b - ones) & ~b)) & highs) != 0;
}

/* The end of the run of bytes from i that need no escape: eight at a time, then one. */
static size_t plain_run(const char *s, size_t i, size_t n)
{
    /* 1 for the bytes that need an escape. */
    static const unsigned char special[256] = {
        1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, /* 0x00-0x1f */
        1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, ['"'] = 1, ['\\'] = 1,
    };
    uint64_t w;
    while (n - i >= sizeof w && (memcpy(&w, s + i, sizeof w), !word_has_special(w)))
        i += sizeof w;
    while (i < n && !special[(unsigned char)s[i]])
        i++;
    return i;
}

/* A plain run [i, end) through put, each byte that breaks UTF-8 as U+FFFD. */
static void put_checked(ck_json_put put, void *ctx, const char *s, size_t i, size_t end)
{
    while (i < end) {
        size_t ok = i + ck_utf8_invalid_at((const unsigned char *)s + i, end - i);
        put(ctx, s + i, ok - i);
        if (ok < end) {
            put(ctx, "\\ufffd", 6);
            ok++;
        }
        i = ok;
    }
}

void ck_json_string(ck_json_put put, void *ctx, const char *s, size_t n, int how)
{
    static const char hex[] = "0123456789abcdef";
    put(ctx, "\"", 1);
    for (size_t i = 0; i < n;) {
        size_t run = plain_run(s, i, n);
        if (how & CK_JSON_UTF8)
            put(ctx, s + i, run - i);
        else
            put_checked(put, ctx, s, i, run);
        if (run == n)
            break;
        unsigned char c = (unsigned char)s[run];
        const char *named = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : !(how & CK_JSON_NAMED) ? NULL
                          : c == '\b' ? "\\b" : c == '\f' ? "\\f" : c == '\n' ? "\\n"
                          : c == '\r' ? "\\r" : c == '\t' ? "\\t" : NULL;
        if (named) {
            put(ctx, named, 2);
        } else {
            char u[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            put(ctx, u, sizeof u);
        }
        i = run + 1;
    }
    put(ctx, "\"", 1);
}
