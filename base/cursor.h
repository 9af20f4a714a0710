/* cursor.h — the one bounded cursor the binary readers take their fields through.
 * Contract: a cursor walks len bytes at p, which lie at offset base of their file; every take
 * either returns the next bytes and moves past them, or fails and leaves the cursor where it
 * was, so that it never stands past the end and the caller's message can say where the field
 * starts (ck_cursor_at). Takes say nothing themselves: each reader words its own refusal.
 * Everything is inline: the GGUF, pack and pickle readers run these on the mount's start path.
 */
#ifndef CK_CURSOR_H
#define CK_CURSOR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "bytes.h"

typedef struct ck_cursor {
    const unsigned char *p;
    size_t len, pos;     /* the bytes at p; the next one to take */
    uint64_t base;       /* the file offset of p[0], for messages */
} ck_cursor;

/* A cursor over len bytes at p (NULL only when len is 0) lying at file offset base. */
static inline ck_cursor ck_cursor_make(const unsigned char *p, size_t len, uint64_t base)
{
    /* A take of 0 bytes returns a pointer, never NULL, even where there are no bytes. */
    return (ck_cursor){.p = p ? p : (const unsigned char *)"", .len = len, .base = base};
}

static inline size_t ck_cursor_left(const ck_cursor *c)
{
    return c->len - c->pos;
}

/* The bytes left, ck_cursor_left of them, without taking them. */
static inline const unsigned char *ck_cursor_rest(const ck_cursor *c)
{
    return c->p + c->pos;
}

/* The file offset of the next byte. */
static inline uint64_t ck_cursor_at(const ck_cursor *c)
{
    return c->base + c->pos;
}

/* The next n bytes, or NULL when fewer are left. pos <= len always, so len - pos cannot
 * wrap, and n is never added to anything. */
static inline const unsigned char *ck_take(ck_cursor *c, uint64_t n)
{
    if (n > c->len - c->pos)
        return NULL;
    const unsigned char *s = c->p + c->pos;
    c->pos += (size_t)n;
    return s;
}

/* The next n bytes as a cursor of their own (at their own file offset): a record whose
 * fields must not be read past its end. 0, or -1 when fewer are left. */
static inline int ck_take_cursor(ck_cursor *c, uint64_t n, ck_cursor *sub)
{
    uint64_t at = ck_cursor_at(c);
    const unsigned char *s = ck_take(c, n);
    if (!s)
        return -1;
    *sub = ck_cursor_make(s, (size_t)n, at);
    return 0;
}

/* The bytes before the next `end` byte (*n of them), taken with it; NULL when none is left. */
static inline const unsigned char *ck_take_until(ck_cursor *c, unsigned char end, size_t *n)
{
    const unsigned char *s = c->p + c->pos, *e = memchr(s, end, c->len - c->pos);
    if (!e)
        return NULL;
    *n = (size_t)(e - s);
    c->pos += *n + 1;
    return s;
}

/* The next byte, without taking it; -1 at the end. */
static inline int ck_peek(const ck_cursor *c)
{
    return c->pos < c->len ? c->p[c->pos] : -1;
}

/* An n-byte little-endian unsigned integer, n 1, 2, 4 or 8 (a constant where it is inlined,
 * so the choice folds away). 0, or -1 when fewer than n bytes are left. */
static inline int ck_take_le(ck_cursor *c, unsigned n, uint64_t *v)
{
    const unsigned char *s = ck_take(c, n);
    if (!s)
        return -1;
    *v = n == 1 ? s[0] : n == 2 ? get_le16(s) : n == 4 ? get_le32(s) : get_le64(s);
    return 0;
}

/* The same for each width: the value's own type. */
static inline int ck_take_u8(ck_cursor *c, uint8_t *v)
{
    uint64_t x = 0;
    int rc = ck_take_le(c, 1, &x);
    *v = rc ? *v : (uint8_t)x;
    return rc;
}

static inline int ck_take_u32(ck_cursor *c, uint32_t *v)
{
    uint64_t x = 0;
    int rc = ck_take_le(c, 4, &x);
    *v = rc ? *v : (uint32_t)x;
    return rc;
}

static inline int ck_take_u64(ck_cursor *c, uint64_t *v)
{
    return ck_take_le(c, 8, v);
}

/* How a length-prefixed string failed, so that each reader can say which part it was. */
enum ck_str_fail {
    CK_STR_NO_LENGTH = 1, /* the length runs past the end: the cursor has not moved */
    CK_STR_TOO_LONG,      /* the length exceeds max: the cursor stands after it, *len set */
    CK_STR_NO_BYTES,      /* the bytes run past the end: likewise */
};

/* A string: a little-endian length of lenbytes bytes (1, 2, 4 or 8), at most max, then that
 * many bytes, at *s. 0, or an enum ck_str_fail. */
static inline int ck_take_str(ck_cursor *c, unsigned lenbytes, uint64_t max,
                              const unsigned char **s, uint64_t *len)
{
    if (ck_take_le(c, lenbytes, len))
        return CK_STR_NO_LENGTH;
    if (*len > max)
        return CK_STR_TOO_LONG;
    *s = ck_take(c, *len);
    return *s ? 0 : CK_STR_NO_BYTES;
}

#endif
