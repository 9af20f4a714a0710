#include "json.h"
#include "names.h"
#include "utf8.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

/* A byte JSON forbids here: any control byte in a string; outside, all but tab, LF and CR. */
static int is_control(unsigned char c, int in_string)
{
    return c < 0x20 && (in_string || (c != '\t' && c != '\n' && c != '\r'));
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* The rules of ck_json_parse that cJSON does not keep, checked on the text: cJSON returns
 * doubles, which cannot tell 2 from 2.0, so integer spelling is checked here; so are \u0000 and
 * raw control bytes. */
static int scan_text(const char *s, size_t n, const char *what, const char *path, ck_error *err)
{
    for (size_t i = 0; i < n; i++) {
        if (is_control((unsigned char)s[i], 0))
            return ck_fail(err, path, "%s holds control byte 0x%02x (%s byte %zu)", what,
                           (unsigned char)s[i], what, i);
        if (s[i] == '"') {
            for (i++; i < n && s[i] != '"'; i++) {
                if (is_control((unsigned char)s[i], 1))
                    return ck_fail(err, path, "%s holds control byte 0x%02x (%s byte %zu)", what,
                                   (unsigned char)s[i], what, i);
                if (s[i] != '\\')
                    continue;
                if (i + 5 < n && memcmp(s + i + 1, "u0000", 5) == 0)
                    return ck_fail(err, path, "%s string contains \\u0000 (%s byte %zu)", what,
                                   what, i);
                i++;
            }
        } else if (s[i] == '-' || (s[i] >= '0' && s[i] <= '9')) {
            size_t start = i;
            int integral = 1;
            for (; i < n && (is_digit(s[i]) || (s[i] && strchr("-+.eE", s[i]))); i++)
                integral &= is_digit(s[i]) || s[i] == '-';
            if (!integral)
                return ck_fail(err, path, "number %.*s is not an integer (%s byte %zu)",
                               (int)(i - start > 32 ? 32 : i - start), s + start, what, start);
            i--;
        }
    }
    return 0;
}

cJSON *ck_json_parse(const char *s, size_t n, const char *what, const char *path, ck_error *err)
{
    if (scan_text(s, n, what, path, err))
        return NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(s, n, &end, 0);
    if (!root) {
        ck_fail(err, path, "%s is not valid JSON (%s byte %zu)", what, what,
                end ? (size_t)(end - s) : (size_t)0);
        return NULL;
    }
    for (; end < s + n; end++)
        if (!strchr(" \t\r\n", *end) || *end == 0) {
            cJSON_Delete(root);
            ck_fail(err, path, "unexpected bytes after the %s JSON (%s byte %zu)", what, what,
                    (size_t)(end - s));
            return NULL;
        }
    return root;
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

size_t ck_json_space(const char *s, size_t n, size_t i)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
        i++;
    return i;
}

size_t ck_json_end(const char *s, size_t n, size_t i)
{
    size_t depth = 0;
    for (; i < n; i++) {
        char c = s[i];
        if (c == '"') {
            for (i++; i < n && s[i] != '"'; i++)
                i += s[i] == '\\'; /* an escape: the byte after it is no quote */
            if (depth == 0)
                return i < n ? i + 1 : n;
        } else if (c == '[' || c == '{') {
            depth++;
        } else if (c == ']' || c == '}') {
            if (depth == 0) /* a number or a word just ended */
                return i;
            if (--depth == 0)
                return i + 1;
        } else if (depth == 0 && (c == ',' || c == ':' || ck_json_space(s, n, i) > i)) {
            return i;
        }
    }
    return n;
}

int ck_json_member(const char *s, size_t n, size_t i, const char *key, size_t *from, size_t *to)
{
    size_t klen = strlen(key);
    i = ck_json_space(s, n, i);
    if (i >= n || s[i] != '{')
        return -1;
    for (i = ck_json_space(s, n, i + 1); i < n && s[i] == '"';) {
        size_t kend = ck_json_end(s, n, i), colon = ck_json_space(s, n, kend);
        if (colon >= n || s[colon] != ':')
            break;
        size_t v = ck_json_space(s, n, colon + 1), vend = ck_json_end(s, n, v);
        if (kend - i == klen + 2 && memcmp(s + i + 1, key, klen) == 0) {
            *from = v, *to = vend;
            return 0;
        }
        i = ck_json_space(s, n, vend);
        if (i >= n || s[i] != ',')
            break;
        i = ck_json_space(s, n, i + 1);
    }
    return -1;
}

int ck_json_members_of(const cJSON *obj, int values, ck_json_members *m)
{
    m->n = 0;
    for (const cJSON *v = obj->child; v; v = v->next)
        m->n++;
    m->node = malloc((m->n ? m->n : 1) * sizeof *m->node);
    m->text = malloc((m->n ? m->n : 1) * sizeof *m->text);
    if (!m->node || !m->text) {
        free(m->node), free(m->text);
        return -1;
    }
    size_t i = 0;
    for (const cJSON *v = obj->child; v; v = v->next, i++) {
        m->node[i] = v;
        m->text[i] = !values ? v->string : cJSON_IsString(v) ? v->valuestring : NULL;
    }
    return 0;
}

void ck_json_members_free(ck_json_members *m)
{
    free(m->node);
    free(m->text);
}

size_t *ck_json_winners(const ck_json_members *m)
{
    size_t *order = ck_names_grouped(m->text, m->n);
    size_t *won = order ? malloc((m->n ? m->n : 1) * sizeof *won) : NULL;
    for (size_t s = 0, e; won && s < m->n; s = e) {
        for (e = s + 1; e < m->n && strcmp(m->text[order[s]], m->text[order[e]]) == 0; e++)
            won[order[e]] = SIZE_MAX;
        won[order[s]] = order[e - 1];
    }
    free(order);
    return won;
}
