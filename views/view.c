/* view.c — the text of the mount's own files (see view.h).
 *
 * index.json is written straight into one growing buffer rather than built as a cJSON tree and
 * printed: for a checkpoint of many small tensors the tree costs more than everything else the
 * mount does (BENCHMARKS.md, "Issue 13: mount latency"). The text is the one
 * cJSON_PrintUnformatted gave: the same members in the same order, strings escaped the same way.
 */
#include "view.h"
#include "../base/json.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- text ------------------------------------------------------------------------------- */

/* A text that grows as it is written; oom is set once memory runs out, after which every write
 * is dropped, so a writer checks only at the end. */
typedef struct jtext {
    char *s;
    size_t len, cap;
    int oom;
    struct lent { /* text lent to the writer (put_lent), in order: where it goes in s, what */
        size_t pos;
        const char *s;
        size_t len;
    } *lent;
    size_t nlent, cap_lent;
    size_t lent_len; /* their bytes */
} jtext;

/* room's slow path: grows s to hold n more bytes, or sets oom. Out of line, so that room, the
 * check that index.json's writes make tens of thousands of times, stays a compare. */
__attribute__((noinline)) static char *grow(jtext *j, size_t n)
{
    if (j->oom)
        return NULL;
    size_t cap = j->cap ? j->cap : 4096;
    while (cap - j->len < n && cap <= SIZE_MAX / 2)
        cap *= 2;
    char *p = cap - j->len >= n ? realloc(j->s, cap) : NULL;
    if (!p) {
        j->oom = 1;
        return NULL;
    }
    j->s = p;
    j->cap = cap;
    return j->s + j->len;
}

/* Room for n more bytes at s + len, or NULL (and oom). */
static inline char *room(jtext *j, size_t n)
{
    return !j->oom && j->cap - j->len >= n ? j->s + j->len : grow(j, n);
}

static inline void put(jtext *j, const char *s, size_t n)
{
    char *p = room(j, n);
    if (p) {
        memcpy(p, s, n);
        j->len += n;
    }
}

#define PUT_LIT(j, lit) put(j, lit, sizeof lit - 1)

/* Texts from this long on are lent to the text, not copied into it: a GGUF key's JSON can be
 * ~100 MB, held once by the index; a shorter one is cheaper copied than pointed to. */
enum { LEND_MIN = 4096 };

/* s (n bytes, which outlive the text) at the end of the text: copied when short, else lent. */
static void put_lent(jtext *j, const char *s, size_t n)
{
    if (n < LEND_MIN || j->oom) {
        put(j, s, n);
        return;
    }
    if (j->nlent == j->cap_lent) {
        size_t cap = j->cap_lent ? 2 * j->cap_lent : 8;
        struct lent *p = realloc(j->lent, cap * sizeof *p);
        if (!p) {
            j->oom = 1;
            return;
        }
        j->lent = p;
        j->cap_lent = cap;
    }
    j->lent[j->nlent++] = (struct lent){.pos = j->len, .s = s, .len = n};
    j->lent_len += n;
}

/* v in decimal into out (20 bytes at least), ending at out + the returned length. */
static size_t uint_text(uint64_t v, char *out)
{
    char tmp[20];
    size_t n = 0;
    do
        tmp[sizeof tmp - ++n] = (char)('0' + v % 10);
    while (v /= 10);
    memcpy(out, tmp + sizeof tmp - n, n);
    return n;
}

static void put_uint(jtext *j, uint64_t v)
{
    char buf[20];
    put(j, buf, uint_text(v, buf));
}

static void put_text(void *j, const char *s, size_t n)
{
    put(j, s, n);
}

/* s (n bytes of UTF-8: the index's names and paths are) as a JSON string, escaped as cJSON
 * escapes. */
static void put_string(jtext *j, const char *s, size_t n)
{
    ck_json_string(put_text, j, s, n, CK_JSON_UTF8 | CK_JSON_NAMED);
}

static void put_cstring(jtext *j, const char *s)
{
    put_string(j, s, strlen(s));
}

/* --- shapes ----------------------------------------------------------------------------- */

size_t ck_view_shape_json(const ck_entry *e, char *buf, size_t cap)
{
    char text[2 + CK_MAX_RANK * 21]; /* brackets; each dim a sign, 19 digits and a comma */
    size_t n = 0;
    text[n++] = '[';
    for (unsigned d = 0; d < e->rank; d++) {
        if (d)
            text[n++] = ',';
        int64_t v = e->shape[d];
        if (v < 0)
            text[n++] = '-';
        n += uint_text(v < 0 ? -(uint64_t)v : (uint64_t)v, text + n);
    }
    text[n++] = ']';
    /* Like snprintf: a short buffer holds a NUL-terminated prefix. */
    if (cap) {
        size_t kept = n < cap ? n : cap - 1;
        memcpy(buf, text, kept);
        buf[kept] = 0;
    }
    return n;
}

/* --- index.json ------------------------------------------------------------------------- */

/* Each '.' of s[0..n) made a '/', eight bytes at a time: '.' ^ '/' is 1, and a byte of
 * x = w ^ "........" is zero exactly where a '.' is, which ~(((x & 0x7f..) + 0x7f..) | x) marks
 * with its high bit (no carry crosses a byte). */
static void dots_to_slashes(char *s, size_t n)
{
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    size_t i = 0;
    for (uint64_t w; n - i >= sizeof w; i += sizeof w) {
        memcpy(&w, s + i, sizeof w);
        uint64_t x = w ^ (ones * '.');
        w ^= (~(((x & ~highs) + ~highs) | x) & highs) >> 7;
        memcpy(s + i, &w, sizeof w);
    }
    for (; i < n; i++)
        s[i] = s[i] == '.' ? '/' : s[i];
}

/* "name":...,"path":... of entry i: what tensors and values both start with. A path that is
 * the name with each '.' a '/' (the tree says so: ck_node.plain) is the name's JSON text with
 * the same change, as neither character is escaped in JSON: copied, not walked up the tree
 * and escaped again. */
static void put_name_path(jtext *j, const ck_index *ix, const ck_tree *t, size_t i)
{
    PUT_LIT(j, "\"name\":");
    size_t at = j->len;
    put_string(j, ix->entries[i].name, ix->entries[i].name_len);
    size_t n = j->len - at;
    PUT_LIT(j, ",\"path\":");
    char *to;
    if (t->nodes[t->entry_node[i]].plain && (to = room(j, n))) {
        memcpy(to, j->s + at, n); /* after room: it may have moved the text */
        dots_to_slashes(to, n);
        j->len += n;
        return;
    }
    char path[4096];
    size_t plen = ck_tree_path(t, t->entry_node[i], path, sizeof path);
    if (plen < sizeof path) {
        put_string(j, path, plen);
        return;
    }
    char *p = malloc(plen + 1); /* deeper than PATH_MAX: build it in full */
    if (!p) {
        j->oom = 1;
        return;
    }
    ck_tree_path(t, t->entry_node[i], p, plen + 1);
    put_string(j, p, plen);
    free(p);
}

static void put_tensor(jtext *j, const ck_index *ix, const ck_tree *t, const uint32_t *alias_of,
                       size_t i, int with_locations)
{
    const ck_entry *e = &ix->entries[i];
    PUT_LIT(j, "{");
    put_name_path(j, ix, t, i);
    PUT_LIT(j, ",\"dtype\":");
    put_cstring(j, ck_dtype_name(e->dtype));
    PUT_LIT(j, ",\"shape\":");
    char *shape = room(j, 2 + CK_MAX_RANK * 21 + 1);
    if (shape)
        j->len += ck_view_shape_json(e, shape, 2 + CK_MAX_RANK * 21 + 1);
    PUT_LIT(j, ",\"nbytes\":");
    put_uint(j, e->nbytes);
    if (alias_of && alias_of[i] != UINT32_MAX) {
        const ck_entry *owner = &ix->entries[alias_of[i]];
        PUT_LIT(j, ",\"alias_of\":");
        put_string(j, owner->name, owner->name_len);
    }
    if (with_locations) {
        PUT_LIT(j, ",\"file\":");
        put_cstring(j, ix->files[e->ext.file].path);
        PUT_LIT(j, ",\"offset\":");
        if (e->layout == CK_CONTIGUOUS)
            put_uint(j, e->ext.offset);
        else
            PUT_LIT(j, "null");
    }
    PUT_LIT(j, "}");
}

static void put_value(jtext *j, const ck_index *ix, const ck_tree *t, size_t i)
{
    PUT_LIT(j, "{");
    put_name_path(j, ix, t, i);
    PUT_LIT(j, ",\"type\":");
    put_cstring(j, ck_value_type_name(ix->entries[i].dtype));
    PUT_LIT(j, "}");
}

/* The entries of one kind, in index order, as the members of a JSON array. */
static void put_entries(jtext *j, const ck_index *ix, const ck_tree *t,
                        const uint32_t *alias_of, uint8_t kind, int with_locations)
{
    int first = 1;
    for (size_t i = 0; i < ix->nentries && !j->oom; i++) {
        if (ix->entries[i].kind != kind)
            continue;
        if (!first)
            PUT_LIT(j, ",");
        first = 0;
        if (kind == CK_TENSOR)
            put_tensor(j, ix, t, alias_of, i, with_locations);
        else
            put_value(j, ix, t, i);
    }
}

static int has_values(const ck_index *ix)
{
    for (size_t i = 0; i < ix->nentries; i++)
        if (ix->entries[i].kind != CK_TENSOR)
            return 1;
    return 0;
}

/* About what index.json of ix takes, so that the text is not copied as it grows (each copy
 * touches fresh pages, which cost more than writing the text): a name appears twice, as
 * name and path, and the rest of an entry is a hundred bytes or so. Space not written is not
 * touched, so costs nothing. */
static size_t expected_size(const ck_index *ix)
{
    size_t n = 4096;
    for (size_t i = 0; i < ix->nentries; i++)
        n += 2 * (size_t)ix->entries[i].name_len + 128 + 8 * ix->entries[i].rank;
    return n;
}

/* The text j wrote as out's pieces: its own bytes and, between them, what was lent to it. */
static int finish(jtext *j, ck_view_text *out)
{
    char *end = room(j, 1);
    ck_view_piece *piece = end ? malloc((2 * j->nlent + 1) * sizeof *piece) : NULL;
    if (!piece) {
        free(j->s);
        free(j->lent);
        return -1;
    }
    *end = 0;
    size_t n = 0, own = 0, at = 0;
    for (size_t k = 0; k <= j->nlent; k++) {
        size_t upto = k < j->nlent ? j->lent[k].pos : j->len;
        if (upto > own) {
            piece[n++] = (ck_view_piece){.s = j->s + own, .len = upto - own, .at = at};
            at += upto - own;
            own = upto;
        }
        if (k < j->nlent) {
            piece[n++] = (ck_view_piece){.s = j->lent[k].s, .len = j->lent[k].len, .at = at};
            at += j->lent[k].len;
        }
    }
    free(j->lent);
    *out = (ck_view_text){.own = j->s, .piece = piece, .npieces = n, .len = at};
    return 0;
}

/* The piece that holds byte off (< t->len): the last that starts at or before it. */
static size_t piece_at(const ck_view_text *t, uint64_t off)
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

size_t ck_view_text_lend(const ck_view_text *t, uint64_t off, size_t size, struct iovec *iov,
                         unsigned max, unsigned *n)
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

size_t ck_view_text_read(const ck_view_text *t, uint64_t off, void *buf, size_t size)
{
    size_t got = 0;
    while (got < size) {
        struct iovec iov[8];
        unsigned n;
        size_t k = ck_view_text_lend(t, off + got, size - got, iov, 8, &n);
        if (k == 0)
            break;
        for (unsigned i = 0; i < n; i++) {
            memcpy((char *)buf + got, iov[i].iov_base, iov[i].iov_len);
            got += iov[i].iov_len;
        }
    }
    return got;
}

int ck_view_text_write(const ck_view_text *t, FILE *f)
{
    for (size_t k = 0; k < t->npieces; k++)
        if (fwrite(t->piece[k].s, 1, t->piece[k].len, f) != t->piece[k].len)
            return -1;
    return 0;
}

void ck_view_text_free(ck_view_text *t)
{
    free(t->own);
    free(t->piece);
    *t = (ck_view_text){0};
}

int ck_view_index_json(const ck_index *ix, const ck_tree *t, const uint32_t *alias_of,
                       int with_locations, ck_view_text *out)
{
    jtext j = {0};
    *out = (ck_view_text){0};
    if (!room(&j, expected_size(ix)))
        return -1;
    PUT_LIT(&j, "{\"format\":");
    put_cstring(&j, ix->format);
    PUT_LIT(&j, ",\"metadata\":{");
    for (size_t i = 0; i < ix->nmeta; i++) {
        if (i)
            PUT_LIT(&j, ",");
        put_cstring(&j, ix->meta[i].key);
        PUT_LIT(&j, ":");
        if (ix->meta[i].json)
            put_lent(&j, ix->meta[i].value, strlen(ix->meta[i].value));
        else
            put_cstring(&j, ix->meta[i].value);
    }
    PUT_LIT(&j, "},\"tensors\":[");
    put_entries(&j, ix, t, alias_of, CK_TENSOR, with_locations);
    PUT_LIT(&j, "]");
    if (has_values(ix)) {
        PUT_LIT(&j, ",\"values\":[");
        put_entries(&j, ix, t, NULL, CK_VALUE, with_locations);
        PUT_LIT(&j, "]");
    }
    if (ix->nomitted) {
        PUT_LIT(&j, ",\"omitted\":[");
        for (size_t i = 0; i < ix->nomitted; i++) {
            if (i)
                PUT_LIT(&j, ",");
            PUT_LIT(&j, "{\"name\":");
            put_cstring(&j, ix->omitted[i].name);
            PUT_LIT(&j, ",\"reason\":");
            put_cstring(&j, ix->omitted[i].reason);
            PUT_LIT(&j, "}");
        }
        PUT_LIT(&j, "]");
    }
    PUT_LIT(&j, "}");
    return finish(&j, out);
}
