/* pickle_text.h — the text arguments of protocol-0 opcodes (INT, LONG, FLOAT, STRING, UNICODE,
 * and the decimal memo indices of GET and PUT), decoded as Python's pickle decodes them; and
 * the other way, Python's repr() of a float, which names and shows pickled floats.
 *
 * Contract: each function reads one argument line s[0..n), without its newline, and touches
 * nothing else: no VM, no allocation. The caller gives the room for the output and turns a
 * failure into its message (those that fail with a string return the phrase that completes
 * "STRING argument ..." or "UNICODE: string ..."; NULL means success). Escapes give bytes:
 * UNICODE's are UTF-8 by construction, STRING's are a Python 2 str, which the caller checks as
 * UTF-8 like any other.
 */
#ifndef CK_PICKLE_TEXT_H
#define CK_PICKLE_TEXT_H

#include <stddef.h>
#include <stdint.h>

/* An optionally signed decimal integer filling s[0..n): 0; -1 when it is not one; -2 when it
 * does not fit in 64 bits. */
int pk_text_int(const unsigned char *s, size_t n, int64_t *out);

/* A float as strtod reads it, filling s[0..n): 0; -1 when n is 0 or 128 or more; -2 when it
 * is not a float. */
int pk_text_float(const unsigned char *s, size_t n, double *out);

/* STRING: a quoted Python 2 str literal, escapes as codecs.escape_decode reads them. out has
 * room for n bytes; *olen gets the length. */
const char *pk_text_string(const unsigned char *s, size_t n, unsigned char *out, size_t *olen);

/* UNICODE: raw-unicode-escape, i.e. bytes are Latin-1 code points except \uXXXX and
 * \UXXXXXXXX, written out as UTF-8. Each input byte gives at most 2 bytes of output, so out
 * has room for 2n; *olen gets the length. */
const char *pk_text_unicode(const unsigned char *s, size_t n, unsigned char *out, size_t *olen);

/* Room for any pk_float_repr text and its NUL ("-1.2345678901234567e-308" is the longest). */
#define PK_FLOAT_REPR_MAX 32

/* Python's repr() (and str()) of d into out, NUL-terminated; returns the length. The shortest
 * digits that read back as d (the nearest to d among those), in fixed notation when the
 * decimal exponent is in [-4, 16) with ".0" after an integral value, else as 1.5e-07 or
 * 1e+16; "inf", "-inf", "nan", "-0.0". */
size_t pk_float_repr(double d, char out[PK_FLOAT_REPR_MAX]);

#endif
