/* text.h — a text in pieces: bytes of its own and, between them, texts lent to it.
 *
 * Contract: a GGUF key's typed JSON can be hundreds of megabytes, held once by the index; the texts
 * made from the index (index.json, the headers of the virtual safetensors and pack) lend it rather
 * than copy it, as a copy would double what holds them. A ck_textbuf grows as it is written; a text
 * put with ck_textbuf_put_held (memory that outlives the text) is pointed to from CK_TEXT_LEND_MIN
 * bytes on, copied when shorter. Out of memory is noted once (oom), after which every write is
 * dropped, so a writer checks only at the end (ck_textbuf_finish). A finished ck_text is valid as
 * long as what was lent to it; its own bytes may be changed in place (a header filled in).
 */
#ifndef CK_TEXT_H
#define CK_TEXT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>

typedef struct ck_text_piece {
    const char *s;
    size_t len;
    uint64_t at; /* where it starts in the text */
} ck_text_piece;

typedef struct ck_text {
    char *own;            /* the text's own bytes (malloc'ed), which pieces point into */
    ck_text_piece *piece; /* in order, none empty */
    size_t npieces;
    uint64_t len;         /* the text's bytes */
} ck_text;

typedef struct ck_textbuf {
    char *s; /* own bytes */
    size_t len, cap;
    int oom;
    struct ck_text_lent { /* texts lent (ck_textbuf_put_held), in order: where in s, what */
        size_t pos;
        const char *s;
        size_t len;
    } *lent;
    size_t nlent, cap_lent;
    uint64_t lent_len; /* their bytes */
} ck_textbuf;

/* Texts from this long on are lent, not copied: a shorter one is cheaper copied than pointed to. */
enum { CK_TEXT_LEND_MIN = 4096 };

/* room's slow path: grows b to hold n more bytes, or sets oom and returns NULL. */
char *ck_textbuf_grow(ck_textbuf *b, size_t n);

/* Room for n more own bytes at b->s + b->len (the writer adds them to len), or NULL (and oom).
 * Inline: index.json's writes ask it tens of thousands of times, and it stays a compare. */
static inline char *ck_textbuf_room(ck_textbuf *b, size_t n)
{
    return !b->oom && b->cap - b->len >= n ? b->s + b->len : ck_textbuf_grow(b, n);
}

static inline void ck_textbuf_put(ck_textbuf *b, const char *s, size_t n)
{
    char *p = ck_textbuf_room(b, n);
    if (p) {
        memcpy(p, s, n);
        b->len += n;
    }
}

#define CK_TEXTBUF_LIT(b, lit) ck_textbuf_put(b, lit, sizeof lit - 1)

/* s (n bytes, which outlive the text) at the end: lent when long, else copied. */
void ck_textbuf_put_held(ck_textbuf *b, const char *s, size_t n);

/* v in decimal. */
void ck_textbuf_put_uint(ck_textbuf *b, uint64_t v);

/* v in decimal into out (20 bytes at least): its length. */
size_t ck_text_uint(uint64_t v, char *out);

/* s (n bytes of UTF-8) as a JSON string, escaped as cJSON escapes (ck_json_string). held: s
 * outlives the text, and its long runs that need no escape are lent (a GGUF key's JSON as a
 * safetensors metadata string: a bool array's needs none). */
void ck_textbuf_put_string(ck_textbuf *b, const char *s, size_t n, int held);

/* The bytes written so far, own and lent. */
static inline uint64_t ck_textbuf_size(const ck_textbuf *b)
{
    return b->len + b->lent_len;
}

/* b's text into out (b is spent either way): 0, or -1 when memory ran out (out empty). */
int ck_textbuf_finish(ck_textbuf *b, ck_text *out);

/* t's bytes [off, off + size) as at most max pieces (iov, *n of them): the bytes they hold,
 * fewer where the range ends past the text or needs more pieces than max. */
size_t ck_text_lend(const ck_text *t, uint64_t off, size_t size, struct iovec *iov, unsigned max,
                    unsigned *n);
/* The same bytes copied into buf: how many (fewer only past the end). */
size_t ck_text_read(const ck_text *t, uint64_t off, void *buf, size_t size);
/* All of t to f: 0, or -1 when a write failed. */
int ck_text_write(const ck_text *t, FILE *f);
void ck_text_free(ck_text *t);

#endif
