/* utf8.h — the one UTF-8 decoder and encoder: every check of UTF-8 is asked here.
 *
 * Contract: well-formed means Unicode's table 3-7: no overlong form, nothing past U+10FFFF, no
 * sequence cut short by the end of the input, and no encoded surrogate (U+D800-U+DFFF) unless
 * the caller passes CK_UTF8_SURROGATES (Python pickles str with 'surrogatepass', and torch.load
 * reads them back the same way). Errors are reported at the first byte of the sequence that
 * breaks, which is where Python's decoder reports them (UnicodeDecodeError.start).
 */
#ifndef CK_UTF8_H
#define CK_UTF8_H

#include <stddef.h>

enum { CK_UTF8_SURROGATES = 1 };

/* The code point at s[*i] (*i < n), advancing *i past it; -1, with *i unchanged, when the bytes
 * there are not well-formed. flags: 0 or CK_UTF8_SURROGATES. */
long ck_utf8_next(const unsigned char *s, size_t n, size_t *i, unsigned flags);

/* Offset of the first byte of s (n bytes) that breaks UTF-8 (no surrogates allowed), or n when
 * all of it is valid. */
size_t ck_utf8_invalid_at(const unsigned char *s, size_t n);

/* Writes code point cp (at most U+10FFFF; surrogates are encoded like any other) to out, which
 * has room for 4 bytes; the number of bytes written. */
size_t ck_utf8_put(unsigned char *out, unsigned long cp);

#endif
