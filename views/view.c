/* view.c — the text of the mount's own files (see view.h).
 *
 * index.json is written straight into one growing buffer rather than built as a cJSON tree and
 * printed: for a checkpoint of many small tensors the tree costs more than everything else the
 * mount does (BENCHMARKS.md, the rounds of mount latency). The text is the one
 * cJSON_PrintUnformatted gave: the same members in the same order, strings escaped the same way.
 */
#include "view.h"
#include "../base/text.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* s (a NUL-terminated string of UTF-8: the index's names and paths are) as a JSON string. */
static void put_cstring(ck_textbuf *j, const char *s)
{
    ck_textbuf_put_string(j, s, strlen(s), 0);
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
        n += ck_text_uint(v < 0 ? -(uint64_t)v : (uint64_t)v, text + n);
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
static void put_name_path(ck_textbuf *j, const ck_index *ix, const ck_tree *t, size_t i)
{
    CK_TEXTBUF_LIT(j, "\"name\":");
    size_t at = j->len;
    ck_textbuf_put_string(j, ix->entries[i].name, ix->entries[i].name_len, 0);
    size_t n = j->len - at;
    CK_TEXTBUF_LIT(j, ",\"path\":");
    char *to;
    if (t->nodes[t->entry_node[i]].plain && (to = ck_textbuf_room(j, n))) {
        memcpy(to, j->s + at, n); /* after room: it may have moved the text */
        dots_to_slashes(to, n);
        j->len += n;
        return;
    }
    char path[4096];
    size_t plen = ck_tree_path(t, t->entry_node[i], path, sizeof path);
    if (plen < sizeof path) {
        ck_textbuf_put_string(j, path, plen, 0);
        return;
    }
    char *p = malloc(plen + 1); /* deeper than PATH_MAX: build it in full */
    if (!p) {
        j->oom = 1;
        return;
    }
    ck_tree_path(t, t->entry_node[i], p, plen + 1);
    ck_textbuf_put_string(j, p, plen, 0);
    free(p);
}

static void put_tensor(ck_textbuf *j, const ck_index *ix, const ck_tree *t,
                       const uint32_t *alias_of, size_t i, int with_locations)
{
    const ck_entry *e = &ix->entries[i];
    CK_TEXTBUF_LIT(j, "{");
    put_name_path(j, ix, t, i);
    CK_TEXTBUF_LIT(j, ",\"dtype\":");
    put_cstring(j, ck_dtype_name(e->dtype));
    CK_TEXTBUF_LIT(j, ",\"shape\":");
    char *shape = ck_textbuf_room(j, 2 + CK_MAX_RANK * 21 + 1);
    if (shape)
        j->len += ck_view_shape_json(e, shape, 2 + CK_MAX_RANK * 21 + 1);
    CK_TEXTBUF_LIT(j, ",\"nbytes\":");
    ck_textbuf_put_uint(j, e->nbytes);
    if (alias_of && alias_of[i] != UINT32_MAX) {
        const ck_entry *owner = &ix->entries[alias_of[i]];
        CK_TEXTBUF_LIT(j, ",\"alias_of\":");
        ck_textbuf_put_string(j, owner->name, owner->name_len, 0);
    }
    if (with_locations) {
        CK_TEXTBUF_LIT(j, ",\"file\":");
        put_cstring(j, ix->files[e->ext.file].path);
        CK_TEXTBUF_LIT(j, ",\"offset\":");
        if (e->layout == CK_CONTIGUOUS)
            ck_textbuf_put_uint(j, e->ext.offset);
        else
            CK_TEXTBUF_LIT(j, "null");
    }
    CK_TEXTBUF_LIT(j, "}");
}

static void put_value(ck_textbuf *j, const ck_index *ix, const ck_tree *t, size_t i)
{
    CK_TEXTBUF_LIT(j, "{");
    put_name_path(j, ix, t, i);
    CK_TEXTBUF_LIT(j, ",\"type\":");
    put_cstring(j, ck_value_type_name(ix->entries[i].dtype));
    CK_TEXTBUF_LIT(j, "}");
}

/* The entries of one kind, in index order, as the members of a JSON array. */
static void put_entries(ck_textbuf *j, const ck_index *ix, const ck_tree *t,
                        const uint32_t *alias_of, uint8_t kind, int with_locations)
{
    int first = 1;
    for (size_t i = 0; i < ix->nentries && !j->oom; i++) {
        if (ix->entries[i].kind != kind)
            continue;
        if (!first)
            CK_TEXTBUF_LIT(j, ",");
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

int ck_view_index_json(const ck_index *ix, const ck_tree *t, const uint32_t *alias_of,
                       int with_locations, ck_text *out)
{
    ck_textbuf j = {0};
    *out = (ck_text){0};
    if (!ck_textbuf_room(&j, expected_size(ix)))
        return -1;
    CK_TEXTBUF_LIT(&j, "{\"format\":");
    put_cstring(&j, ix->format);
    CK_TEXTBUF_LIT(&j, ",\"metadata\":{");
    for (size_t i = 0; i < ix->nmeta; i++) {
        if (i)
            CK_TEXTBUF_LIT(&j, ",");
        put_cstring(&j, ix->meta[i].key);
        CK_TEXTBUF_LIT(&j, ":");
        if (ix->meta[i].json)
            ck_textbuf_put_held(&j, ix->meta[i].value, strlen(ix->meta[i].value));
        else
            put_cstring(&j, ix->meta[i].value);
    }
    CK_TEXTBUF_LIT(&j, "},\"tensors\":[");
    put_entries(&j, ix, t, alias_of, CK_TENSOR, with_locations);
    CK_TEXTBUF_LIT(&j, "]");
    if (has_values(ix)) {
        CK_TEXTBUF_LIT(&j, ",\"values\":[");
        put_entries(&j, ix, t, NULL, CK_VALUE, with_locations);
        CK_TEXTBUF_LIT(&j, "]");
    }
    if (ix->nomitted) {
        CK_TEXTBUF_LIT(&j, ",\"omitted\":[");
        for (size_t i = 0; i < ix->nomitted; i++) {
            if (i)
                CK_TEXTBUF_LIT(&j, ",");
            CK_TEXTBUF_LIT(&j, "{\"name\":");
            put_cstring(&j, ix->omitted[i].name);
            CK_TEXTBUF_LIT(&j, ",\"reason\":");
            put_cstring(&j, ix->omitted[i].reason);
            CK_TEXTBUF_LIT(&j, "}");
        }
        CK_TEXTBUF_LIT(&j, "]");
    }
    CK_TEXTBUF_LIT(&j, "}");
    return ck_textbuf_finish(&j, out);
}
