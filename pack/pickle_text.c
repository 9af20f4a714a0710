/* pickle_text.c — protocol 0's text arguments (see pickle_text.h). */
#include "pickle_text.h"

#include <stdlib.h>
#include <string.h>

#include "utf8.h"

#define FLOAT_TEXT_MAX 128 /* characters of a FLOAT argument, NUL included */

int pk_text_int(const unsigned char *s, size_t n, int64_t *out)
{
    size_t i = 0;
    int neg = 0;
    if (i < n && (s[i] == '-' || s[i] == '+'))
        neg = s[i++] == '-';
    if (i == n)
        return -1;
    uint64_t u = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    int big = 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        unsigned d = s[i] - '0';
        if (u > (lim - d) / 10)
            big = 1;
        else
            u = u * 10 + d;
    }
    if (big)
        return -2;
    *out = neg ? (int64_t)(0 - u) : (int64_t)u;
    return 0;
}

int pk_text_float(const unsigned char *s, size_t n, double *out)
{
    char buf[FLOAT_TEXT_MAX];
    if (n == 0 || n >= sizeof buf)
        return -1;
    memcpy(buf, s, n);
    buf[n] = 0;
    char *end;
    *out = strtod(buf, &end);
    return end == buf + n ? 0 : -2;
}

static int hexval(unsigned c)
{
    return c >= '0' && c <= '9' ? (int)(c - '0')
           : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (int)((c | 0x20) - 'a' + 10) : -1;
}

static int simple_escape(unsigned c)
{
    switch (c) {
    case '\\': case '\'': case '"': return (int)c;
    case 'a': return '\a';
    case 'b': return '\b';
    case 'f': return '\f';
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case 'v': return '\v';
    default: return -1;
    }
}

const char *pk_text_string(const unsigned char *s, size_t n, unsigned char *out, size_t *olen)
{
    if (n < 2 || s[0] != s[n - 1] || (s[0] != '\'' && s[0] != '"'))
        return "is not quoted";
    s++, n -= 2;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        unsigned c = s[i++];
        if (c != '\\') {
            out[o++] = (unsigned char)c;
            continue;
        }
        if (i == n)
            return "holds a trailing backslash";
        c = s[i++];
        int simple = simple_escape(c);
        if (simple >= 0) {
            out[o++] = (unsigned char)simple;
        } else if (c >= '0' && c <= '7') {
            unsigned x = c - '0';
            for (int k = 0; k < 2 && i < n && s[i] >= '0' && s[i] <= '7'; k++)
                x = x * 8 + (s[i++] - '0');
            out[o++] = (unsigned char)x;
        } else if (c == 'x') {
            int h1 = i < n ? hexval(s[i]) : -1, h2 = i + 1 < n ? hexval(s[i + 1]) : -1;
            if (h1 < 0 || h2 < 0)
                return "holds an invalid \\x escape";
            out[o++] = (unsigned char)(h1 << 4 | h2), i += 2;
        } else if (c != '\n') { /* an unknown escape stays as written */
            out[o++] = '\\';
            out[o++] = (unsigned char)c;
        }
    }
    *olen = o;
    return NULL;
}

const char *pk_text_unicode(const unsigned char *s, size_t n, unsigned char *out, size_t *olen)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        unsigned c = s[i++];
        if (c != '\\' || i == n || (s[i] != 'u' && s[i] != 'U')) {
            o += ck_utf8_put(out + o, c);
            if (c == '\\' && i < n) /* a backslash escapes the next one: both are literal */
                o += ck_utf8_put(out + o, s[i++]);
            continue;
        }
        size_t digits = s[i++] == 'u' ? 4 : 8;
        unsigned long cp = 0;
        for (size_t j = 0; j < digits; j++) {
            int h = i < n ? hexval(s[i++]) : -1;
            if (h < 0)
                return "holds a truncated \\u or \\U escape";
            cp = cp << 4 | (unsigned)h;
        }
        if (cp > 0x10FFFF)
            return "holds a \\U escape beyond U+10FFFF";
        o += ck_utf8_put(out + o, cp);
    }
    *olen = o;
    return NULL;
}
