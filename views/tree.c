#include "tree.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "../base/seed.h"

enum { HASH_CUT = 236 }; /* bytes kept from an over-long component, before "%~" + 16 hex */

static int needs_escape(unsigned char c)
{
    return c == '%' || c == '/' || c < 0x20 || c == 0x7f;
}

#define ONES 0x0101010101010101ull
#define HIGHS (ONES * 0x80)

/* Whether any of the eight bytes in w needs an escape (needs_escape): a byte below 0x20, or one
 * equal to '%', '/' or 0x7f, found eight at a time, as the names of a checkpoint are long and
 * nearly never hold one. */
static int word_needs_escape(uint64_t w)
{
    uint64_t pct = w ^ (ONES * '%'), slash = w ^ (ONES * '/'), del = w ^ (ONES * 0x7f);
    return ((((w - ONES * 0x20) & ~w) | ((pct - ONES) & ~pct) | ((slash - ONES) & ~slash) |
             ((del - ONES) & ~del)) & HIGHS) != 0;
}

/* The bytes of s[0..len) with their escapes, "%XX" counting 3. */
static size_t escaped_len(const char *s, size_t len)
{
    size_t i = 0;
    uint64_t w;
    while (len - i >= sizeof w && (memcpy(&w, s + i, sizeof w), !word_needs_escape(w)))
        i += sizeof w;
    size_t full = i;
    for (; i < len; i++)
        full += needs_escape((unsigned char)s[i]) ? 3 : 1;
    return full;
}

/* ck_escape_component, with the hashed form taken for escaped forms over limit bytes; *same
 * says whether out is s as it is. */
static size_t escape(const char *s, size_t len, char *out, size_t limit, int *same)
{
    static const char hex[] = "0123456789ABCDEF";
    *same = 0;
    if (len == 0) {
        memcpy(out, "%", 2);
        return 1;
    }
    size_t full = escaped_len(s, len);
    if (full == len && len <= limit) { /* nothing to escape or cut: most components */
        memcpy(out, s, len);
        out[len] = 0;
        *same = 1;
        return len;
    }
    size_t max = full <= limit ? limit : HASH_CUT, n = 0;
    /* Copy whole units only (an escape, or a character with its UTF-8 continuation bytes), so a
     * cut never splits one. */
    for (size_t i = 0; i < len;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = 1;
        while (!needs_escape(c) && i + k < len && ((unsigned char)s[i + k] & 0xC0) == 0x80)
            k++;
        size_t w = needs_escape(c) ? 3 : k;
        if (n + w > max)
            break;
        if (needs_escape(c)) {
            out[n++] = '%';
            out[n++] = hex[c >> 4];
            out[n++] = hex[c & 15];
        } else {
            memcpy(out + n, s + i, k);
            n += k;
        }
        i += k;
    }
    if (full > limit)
        n += (size_t)snprintf(out + n, CK_NAME_MAX + 1 - n, "%%~%016llx",
                              (unsigned long long)XXH3_64bits(s, len));
    out[n] = 0;
    return n;
}

size_t ck_escape_component(const char *s, size_t len, char *out)
{
    int same;
    return escape(s, len, out, CK_NAME_MAX, &same);
}

/* Seeded at random, as the zip's and the pickle VM's tables are: a checkpoint cannot be made of
 * names that all land in one run of slots and so make its mount quadratic. */
static uint64_t slot_hash(const ck_tree *t, uint32_t parent, const char *name, size_t len)
{
    return XXH3_64bits_withSeed(name, len, t->seed ^ parent);
}

/* The slot of (parent, name): the one that holds its node, or the empty one where it goes. */
static size_t find_slot(const ck_tree *t, uint32_t parent, const char *name, size_t len)
{
    size_t mask = t->nslots - 1;
    for (size_t i = slot_hash(t, parent, name, len) & mask;; i = (i + 1) & mask) {
        uint32_t id = t->slots[i];
        if (id == CK_NO_NODE)
            return i;
        const ck_node *nd = &t->nodes[id];
        if (nd->parent == parent && nd->name_len == len && memcmp(nd->name, name, len) == 0)
            return i;
    }
}

uint32_t ck_tree_lookup(const ck_tree *t, uint32_t parent, const char *name, size_t len)
{
    return t->slots[find_slot(t, parent, name, len)];
}

/* Adds a node in the empty slot that find_slot gave for it; nodes and slots were sized for the
 * worst case. name is the node's own when it is already NUL-terminated where it lives as long
 * as the tree (a tensor's last piece, unescaped, in the index), else a copy. */
static uint32_t add_node_at(ck_tree *t, size_t slot, uint32_t parent, const char *name,
                            size_t len, int own, uint8_t kind, uint32_t id, int plain)
{
    char *copy = own ? NULL : ck_arena_alloc(&t->arena, len + 1);
    if (!own && !copy)
        return CK_NO_NODE;
    if (copy) {
        memcpy(copy, name, len);
        copy[len] = 0;
    }
    uint32_t at = t->nnodes++;
    t->nodes[at] = (ck_node){.name = copy ? copy : name, .name_len = (uint32_t)len,
                             .parent = parent, .kind = kind, .id = id,
                             .plain = (uint8_t)(plain && t->nodes[parent].plain)};
    t->slots[slot] = at;
    return at;
}

/* Adds a node (the caller checked it is absent), its name copied. */
static uint32_t add_node(ck_tree *t, uint32_t parent, const char *name, size_t len,
                         uint8_t kind, uint32_t id)
{
    return add_node_at(t, find_slot(t, parent, name, len), parent, name, len, 0, kind, id, 0);
}

/* The directories of the name before, by depth: a module's entries come together (a layer's
 * tensors), so a name shares its first directories with the one before, and those need no
 * escaping or lookup. Deeper directories than DIRS_CACHED are looked up every time. */
enum { DIRS_CACHED = 32 };

typedef struct dir_cache {
    const char *name;            /* the name before (NULL at first) */
    size_t len;
    unsigned depth;              /* its directories in dir[0 .. depth) */
    uint32_t dir[DIRS_CACHED];   /* dir[k]: the directory of its first k + 1 pieces */
    size_t end[DIRS_CACHED];     /* end[k]: where the '.' after piece k is in it */
} dir_cache;

/* How many of their first n bytes a and b share: eight bytes at a time, then one. */
static size_t common_prefix(const char *a, const char *b, size_t n)
{
    size_t i = 0;
    uint64_t x, y;
    while (n - i >= sizeof x && (memcpy(&x, a + i, sizeof x), memcpy(&y, b + i, sizeof y), x == y))
        i += sizeof x;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* The directory that holds name's last piece (after its last '.'), created as needed. */
static uint32_t make_dirs(ck_tree *t, const char *name, size_t len, dir_cache *c)
{
    size_t same = common_prefix(name, c->name, len < c->len ? len : c->len);
    unsigned k = 0; /* the pieces, with their '.', that both names begin with */
    while (k < c->depth && c->end[k] < same)
        k++;
    uint32_t dir = k ? c->dir[k - 1] : 0;
    size_t start = k ? c->end[k - 1] + 1 : 0;
    char esc[CK_NAME_MAX + 1];
    for (size_t i = start; i < len; i++) {
        if (name[i] != '.')
            continue;
        int as_is;
        size_t n = escape(name + start, i - start, esc, CK_NAME_MAX, &as_is);
        size_t slot = find_slot(t, dir, esc, n);
        uint32_t id = t->slots[slot];
        if (id == CK_NO_NODE &&
            (id = add_node_at(t, slot, dir, esc, n, 0, CK_NODE_DIR, 0, as_is)) == CK_NO_NODE)
            return CK_NO_NODE;
        dir = id;
        start = i + 1;
        if (k < DIRS_CACHED) {
            c->dir[k] = dir;
            c->end[k++] = i;
        }
    }
    c->name = name;
    c->len = len;
    c->depth = k;
    return dir;
}

static int node_cmp(const ck_tree *t, uint32_t a, uint32_t b)
{
    const ck_node *x = &t->nodes[a], *y = &t->nodes[b];
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = memcmp(x->name, y->name, n);
    return c ? c : (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

static int by_node_name(const void *a, const void *b, void *tree)
{
    return node_cmp(tree, *(const uint32_t *)a, *(const uint32_t *)b);
}

/* Most directories hold a few children (a layer's modules, a module's weight and bias): those
 * are sorted in place by insertion, which costs less than a call of qsort_r, whose merge sort
 * is kept for the rest. */
enum { INSERTION_MAX = 16 };

static void sort_dir(ck_tree *t, uint32_t *c, uint32_t n)
{
    if (n > INSERTION_MAX)
        return qsort_r(c, n, sizeof *c, by_node_name, t);
    for (uint32_t i = 1; i < n; i++) {
        uint32_t x = c[i], j = i;
        for (; j > 0 && node_cmp(t, c[j - 1], x) > 0; j--)
            c[j] = c[j - 1];
        c[j] = x;
    }
}

static int sort_children(ck_tree *t)
{
    uint32_t n = t->nnodes;
    t->children = malloc((n ? n : 1) * sizeof *t->children);
    if (!t->children)
        return -1;
    for (uint32_t i = 0; i < n; i++)
        t->nodes[i].nchild = 0;
    for (uint32_t i = 1; i < n; i++)
        t->nodes[t->nodes[i].parent].nchild++;
    uint32_t at = 0;
    for (uint32_t i = 0; i < n; i++) {
        t->nodes[i].child0 = at;
        at += t->nodes[i].nchild;
        t->nodes[i].nchild = 0;
    }
    for (uint32_t i = 1; i < n; i++) {
        ck_node *p = &t->nodes[t->nodes[i].parent];
        t->children[p->child0 + p->nchild++] = i;
    }
    for (uint32_t i = 0; i < n; i++)
        if (t->nodes[i].nchild > 1)
            sort_dir(t, t->children + t->nodes[i].child0, t->nodes[i].nchild);
    return 0;
}

void ck_tree_free(ck_tree *t)
{
    if (!t)
        return;
    free(t->nodes);
    free(t->children);
    free(t->entry_node);
    free(t->slots);
    ck_arena_free(t->arena);
    free(t);
}

static int add_virtual(ck_tree *t, const char *vdir, const ck_tree_vfile *vfiles,
                       unsigned nvirtual)
{
    uint32_t dir = add_node(t, 0, vdir, strlen(vdir), CK_NODE_DIR, 0);
    for (unsigned k = 0; dir != CK_NO_NODE && k < nvirtual; k++)
        if (add_node(t, dir, vfiles[k].name, strlen(vfiles[k].name), vfiles[k].kind, k) ==
            CK_NO_NODE)
            return -1;
    return dir == CK_NO_NODE ? -1 : 0;
}

/* Files go in after every directory exists, so a file that meets a directory of its own name
 * is always the one renamed, whatever the order of the entries. */
static int add_files(ck_tree *t, const ck_index *ix, const char *src, ck_error *err)
{
    char esc[CK_NAME_MAX + 2];
    for (size_t i = 0; i < ix->nentries; i++) {
        const ck_entry *e = &ix->entries[i];
        /* ck_tree_build left the entry's directory in entry_node[i]; its last piece follows
         * the last '.'. */
        uint32_t dir = t->entry_node[i];
        const char *dot = memrchr(e->name, '.', e->name_len);
        size_t start = dot ? (size_t)(dot - e->name) + 1 : 0, n;
        /* Unescaped, the piece is the name's NUL-terminated end: the node names it there. */
        int own;
        n = escape(e->name + start, e->name_len - start, esc, CK_NAME_MAX, &own);
        size_t slot = find_slot(t, dir, esc, n);
        uint32_t other = t->slots[slot];
        if (other != CK_NO_NODE && t->nodes[other].kind == CK_NODE_DIR) {
            if (n == CK_NAME_MAX) /* no room for the '%': the hashed form leaves some */
                n = escape(e->name + start, e->name_len - start, esc, CK_NAME_MAX - 1, &own);
            esc[n++] = '%';
            esc[n] = 0;
            own = 0;
            slot = find_slot(t, dir, esc, n);
            other = t->slots[slot];
        }
        if (other != CK_NO_NODE) /* a file: directories were all renamed above */
            return ck_fail(err, src, "tensors '%s' and '%s' map to one path",
                           ix->entries[t->nodes[other].id].name, e->name);
        t->entry_node[i] = add_node_at(t, slot, dir, own ? e->name + start : esc, n, own,
                                       e->kind == CK_TENSOR ? CK_NODE_TENSOR : CK_NODE_VALUE,
                                       (uint32_t)i, own);
        if (t->entry_node[i] == CK_NO_NODE)
            return ck_fail(err, src, "out of memory");
    }
    return 0;
}

/* The '.'s in s[0..n), eight bytes at a time: a byte of x = w ^ "........" is zero exactly where
 * a '.' is, and ((x & 0x7f) + 0x7f) | x has its high bit set exactly where x is not zero (no
 * carry crosses a byte). */
static size_t count_dots(const char *s, size_t n)
{
    size_t dots = 0, i = 0;
    uint64_t w;
    for (; n - i >= sizeof w; i += sizeof w) {
        memcpy(&w, s + i, sizeof w);
        uint64_t x = w ^ (ONES * '.');
        uint64_t at = ~(((x & ~HIGHS) + ~HIGHS) | x) & HIGHS;
        dots += (size_t)(((at >> 7) * ONES) >> 56); /* the eight 0-or-1 bytes, summed */
    }
    for (; i < n; i++)
        dots += s[i] == '.';
    return dots;
}

int ck_tree_build(const ck_index *ix, const char *vdir, const ck_tree_vfile *vfiles,
                  unsigned nvirtual, ck_tree **out, ck_error *err)
{
    const char *src = ck_index_source(ix);
    *out = NULL;
    /* Worst case: every piece of every name is a node of its own, plus a directory for each. */
    size_t bound = 2 + nvirtual;
    for (size_t i = 0; i < ix->nentries; i++)
        bound += 1 + count_dots(ix->entries[i].name, ix->entries[i].name_len);
    if (bound >= CK_NO_NODE / 2)
        return ck_fail(err, src, "too many tensors for one tree (%zu nodes)", bound);
    ck_tree *t = calloc(1, sizeof *t);
    size_t nslots = 16;
    while (nslots < 2 * bound)
        nslots *= 2;
    if (t) {
        t->nodes = malloc(bound * sizeof *t->nodes);
        t->slots = malloc(nslots * sizeof *t->slots);
        t->entry_node = malloc((ix->nentries ? ix->nentries : 1) * sizeof *t->entry_node);
        t->nslots = nslots;
        t->seed = ck_hash_seed();
    }
    if (!t || !t->nodes || !t->slots || !t->entry_node) {
        ck_tree_free(t);
        return ck_fail(err, src, "out of memory");
    }
    memset(t->slots, 0xff, nslots * sizeof *t->slots);
    t->nodes[0] = (ck_node){.name = "", .parent = 0, .kind = CK_NODE_DIR, .plain = 1};
    t->nnodes = 1;
    int rc = (vdir && add_virtual(t, vdir, vfiles, nvirtual)) ? ck_fail(err, src, "out of memory") : 0;
    dir_cache dirs = {0};
    for (size_t i = 0; i < ix->nentries && rc == 0; i++) {
        t->entry_node[i] = make_dirs(t, ix->entries[i].name, ix->entries[i].name_len, &dirs);
        if (t->entry_node[i] == CK_NO_NODE)
            rc = ck_fail(err, src, "out of memory");
    }
    if (rc == 0)
        rc = add_files(t, ix, src, err);
    if (rc == 0 && sort_children(t))
        rc = ck_fail(err, src, "out of memory");
    if (rc) {
        ck_tree_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

size_t ck_tree_path(const ck_tree *t, uint32_t node, char *buf, size_t cap)
{
    size_t len = 0;
    for (uint32_t n = node; n != 0; n = t->nodes[n].parent)
        len += t->nodes[n].name_len + (t->nodes[n].parent != 0);
    if (len < cap) {
        size_t at = len;
        buf[at] = 0;
        for (uint32_t n = node; n != 0; n = t->nodes[n].parent) {
            at -= t->nodes[n].name_len;
            memcpy(buf + at, t->nodes[n].name, t->nodes[n].name_len);
            if (t->nodes[n].parent != 0)
                buf[--at] = '/';
        }
    } else if (cap) {
        buf[0] = 0;
    }
    return len;
}
