#include "utf8.h"

long ck_utf8_next(const unsigned char *s, size_t n, size_t *i, unsigned flags)
{
    unsigned c = s[*i];
    size_t k;                    /* continuation bytes */
    unsigned lo = 0x80, hi = 0xBF; /* the range of the first one, narrowed where forms overlap */
    long cp;
    if (c < 0x80) {
        ++*i;
        return c;
    } else if (c >= 0xC2 && c <= 0xDF) { /* 0xC0, 0xC1 would only start overlong forms */
        k = 1, cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        k = 2, cp = c & 0x0F;
        if (c == 0xE0)
            lo = 0xA0; /* below: overlong */
        if (c == 0xED && !(flags & CK_UTF8_SURROGATES))
            hi = 0x9F; /* above: U+D800-U+DFFF */
    } else if (c >= 0xF0 && c <= 0xF4) {
        k = 3, cp = c & 0x07;
        if (c == 0xF0)
            lo = 0x90; /* below: overlong */
        if (c == 0xF4)
            hi = 0x8F; /* above: past U+10FFFF */
    } else {
        return -1;
    }
    if (n - *i <= k)
        return -1;
    for (size_t j = 1; j <= k; j++) {
        unsigned b = s[*i + j];
        if (b < (j == 1 ? lo : 0x80) || b > (j == 1 ? hi : 0xBF))
            return -1;
        cp = cp << 6 | (b & 0x3F);
    }
    *i += k + 1;
    return cp;
}

size_t ck_utf8_invalid_at(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n && ck_utf8_next(s, n, &i, 0) >= 0)
        ;
    return i;
}

size_t ck_utf8_put(unsigned char *out, unsigned long cp)
{
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | cp >> 6);
        out[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | cp >> 12);
        out[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | cp >> 18);
    out[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}
