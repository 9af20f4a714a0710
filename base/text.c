/* text.c — a text in pieces (see text.h). */
#include "text.h"
#include "json.h"

#include <stdlib.h>

/* Out of line, so that ck_textbuf_room stays a compare where it is inlined. */
__attribute__((noinline)) char *ck_textbuf_grow(ck_textbuf *b, size_t n)
{
    if (b->oom)
        return NULL;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap - b->len < n && cap <= SIZE_MAX / 2)
        cap *= 2;
    char *p = cap - b->len >= n ? realloc(b->s, cap) : NULL;
    if (!p) {
        b->oom = 1;
        return NULL;
    }
    b->s = p;
    b->cap = cap;
    return b->s + b->len;
}

void ck_textbuf_put_held(ck_textbuf *b, const char *s, size_t n)
{
    if (n < CK_TEXT_LEND_MIN || b->oom) {
        ck_textbuf_put(b, s, n);
        return;
    }
    if (b->nlent == b->cap_lent) {
        size_t cap = b->cap_lent ? 2 * b->cap_lent : 8;
        struct ck_text_lent *p = realloc(b->lent, cap * sizeof *p);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->lent = p;
        b->cap_lent = cap;
    }
    b->lent[b->nlent++] = (struct ck_text_lent){.pos = b->len, .s = s, .len = n};
    b->lent_len += n;
}

size_t ck_text_uint(uint64_t v, char *out)
{
    char tmp[20];
    size_t n = 0;
    do
        tmp[sizeof tmp - ++n] = (char)('0' + v % 10);
    while (v /= 10);
    memcpy(out, tmp + sizeof tmp - n, n);
    return n;
}

void ck_textbuf_put_uint(ck_textbuf *b, uint64_t v)
{
    char buf[20];
    ck_textbuf_put(b, buf, ck_text_uint(v, buf));
}

static void put_copied(void *b, const char *s, size_t n)
{
    ck_textbuf_put(b, s, n);
}

/* ck_json_string's long puts are runs of its own input (an escape is a few bytes of its own):
 * when that input is held, they can be lent. */
static void put_held(void *b, const char *s, size_t n)
{
    ck_textbuf_put_held(b, s, n);
}

void ck_textbuf_put_string(ck_textbuf *b, const char *s, size_t n, int held)
{
    ck_json_string(held ? put_held : put_copied, b, s, n, CK_JSON_UTF8 | CK_JSON_NAMED);
}

int ck_textbuf_finish(ck_textbuf *b, ck_text *out)
{
    char *end = ck_textbuf_room(b, 1);
    ck_text_piece *piece = end ? malloc((2 * b->nlent + 1) * sizeof *piece) : NULL;
    *out = (ck_text){0};
    if (!piece) {
        free(b->s);
        free(b->lent);
        return -1;
    }
    *end = 0;
    size_t n = 0, own = 0;
    uint64_t at = 0;
    for (size_t k = 0; k <= b->nlent; k++) {
        size_t upto = k < b->nlent ? b->lent[k].pos : b->len;
        if (upto > own) {
            piece[n++] = (ck_text_piece){.s = b->s + own, .len = upto - own, .at = at};
            at += upto - own;
            own = upto;
        }
        if (k < b->nlent) {
            piece[n++] = (ck_text_piece){.s = b->lent[k].s, .len = b->lent[k].len, .at = at};
            at += b->lent[k].len;
        }
    }
    free(b->lent);
    *out = (ck_text){.own = b->s, .piece = piece, .npieces = n, .len = at};
    return 0;
}

/* The piece that holds byte off (< t->len): the last that starts at or before it. */
static size_t piece_at(const ck_text *t, uint64_t off)
{
    size_t lo = 0, hi = t->npieces;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->piece[mid].at <= off)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

size_t ck_text_lend(const ck_text *t, uint64_t off, size_t size, struct iovec *iov, unsigned max,
                    unsigned *n)
{
    size_t got = 0;
    *n = 0;
    if (off >= t->len || size == 0)
        return 0;
    for (size_t k = piece_at(t, off); k < t->npieces && got < size && *n < max; k++) {
        size_t from = (size_t)(off + got - t->piece[k].at), take = t->piece[k].len - from;
        take = take < size - got ? take : size - got;
        iov[(*n)++] = (struct iovec){.iov_base = (void *)(t->piece[k].s + from), .iov_len = take};
        got += take;
    }
    return got;
}

size_t ck_text_read(const ck_text *t, uint64_t off, void *buf, size_t size)
{
    size_t got = 0;
    while (got < size) {
        struct iovec iov[8];
        unsigned n;
        size_t k = ck_text_lend(t, off + got, size - got, iov, 8, &n);
        if (k == 0)
            break;
        for (unsigned i = 0; i < n; i++) {
            memcpy((char *)buf + got, iov[i].iov_base, iov[i].iov_len);
            got += iov[i].iov_len;
        }
    }
    return got;
}

int ck_text_write(const ck_text *t, FILE *f)
{
    for (size_t k = 0; k < t->npieces; k++)
        if (fwrite(t->piece[k].s, 1, t->piece[k].len, f) != t->piece[k].len)
            return -1;
    return 0;
}

void ck_text_free(ck_text *t)
{
    free(t->own);
    free(t->piece);
    *t = (ck_text){0};
}
