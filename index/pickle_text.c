/* pickle_text.c — protocol 0's text arguments (see pickle_text.h). */
#include "pickle_text.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/utf8.h"

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

/* --- Python's repr() of a float -------------------------------------------------------- */

/* The double that m x 10^q reads as (strtod rounds correctly, as Python's float() does). */
static double decimal_value(uint64_t m, int q)
{
    char t[48];
    snprintf(t, sizeof t, "%llue%d", (unsigned long long)m, q);
    return strtod(t, NULL);
}

/* The shortest m x 10^q that reads back as d (finite, > 0), and of those the nearest to d, as
 * Python's repr (David Gay's dtoa, mode 0) finds it. For each number of digits p, printf's
 * correctly rounded p digits are the nearest p-digit decimal; when it does not read back, the
 * one p-digit neighbour on d's other side still may, because d's rounding interval is wider
 * above a power of two than below it. 17 digits always read back. */
static void shortest_digits(double d, uint64_t *m, int *q)
{
    for (int p = 1;; p++) {
        char buf[40];
        snprintf(buf, sizeof buf, "%.*e", p - 1, d); /* "d.ddde-XX" */
        uint64_t c = 0;
        const char *s = buf;
        for (; *s != 'e'; s++)
            if (*s != '.')
                c = c * 10 + (uint64_t)(*s - '0');
        *q = atoi(s + 1) - (p - 1);
        double got = decimal_value(c, *q);
        *m = c;
        if (got == d || p == 17)
            return;
        *m = got < d ? c + 1 : c - 1;
        if (decimal_value(*m, *q) == d)
            return;
    }
}

size_t pk_float_repr(double d, char out[PK_FLOAT_REPR_MAX])
{
    if (isnan(d))
        return (size_t)snprintf(out, PK_FLOAT_REPR_MAX, "nan");
    if (isinf(d))
        return (size_t)snprintf(out, PK_FLOAT_REPR_MAX, d < 0 ? "-inf" : "inf");
    size_t n = 0;
    if (signbit(d))
        out[n++] = '-';
    if (d == 0)
        return n + (size_t)snprintf(out + n, PK_FLOAT_REPR_MAX - n, "0.0");
    uint64_t m;
    int q;
    shortest_digits(fabs(d), &m, &q);
    while (m % 10 == 0) {
        m /= 10;
        q++;
    }
    char digits[24];
    int nd = snprintf(digits, sizeof digits, "%llu", (unsigned long long)m);
    int exp10 = nd + q - 1; /* of the first digit */
    if (exp10 < -4 || exp10 >= 16) {
        out[n++] = digits[0];
        if (nd > 1)
            n += (size_t)snprintf(out + n, PK_FLOAT_REPR_MAX - n, ".%s", digits + 1);
        return n + (size_t)snprintf(out + n, PK_FLOAT_REPR_MAX - n, "e%c%02d",
                                    exp10 < 0 ? '-' : '+', abs(exp10));
    }
    int whole = exp10 + 1; /* digits before the point: 0 or fewer for 0.000ddd */
    if (whole <= 0) {
        n += (size_t)snprintf(out + n, PK_FLOAT_REPR_MAX - n, "0.");
        memset(out + n, '0', (size_t)-whole);
        n += (size_t)-whole;
        return n + (size_t)snprintf(out + n, PK_FLOAT_REPR_MAX - n, "%s", digits);
    }
    if (whole >= nd) { /* integral: ddd000.0 */
        n += (size_t)snprintf(out + n, PK_FLOAT_REPR_MAX - n, "%s", digits);
        memset(out + n, '0', (size_t)(whole - nd));
        n += (size_t)(whole - nd);
        return n + (size_t)snprintf(out + n, PK_FLOAT_REPR_MAX - n, ".0");
    }
    return n + (size_t)snprintf(out + n, PK_FLOAT_REPR_MAX - n, "%.*s.%s", whole, digits,
                                digits + whole);
}
