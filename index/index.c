#include "index.h"
#include "../sources/http.h" /* http_remote_free: an index's own remote */
#include "../base/names.h"
#include "zip.h" /* zip_inflate_read */

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

void *ck_index_alloc(ck_index *ix, size_t n)
{
    return ck_arena_alloc(&ix->arena, n);
}

char *ck_index_strndup(ck_index *ix, const char *s, size_t n)
{
    char *p = ck_index_alloc(ix, n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

ck_index *ck_index_new(const char *format)
{
    ck_index *ix = calloc(1, sizeof *ix);
    if (ix)
        ix->format = format;
    return ix;
}

void ck_index_free(ck_index *ix)
{
    if (!ix)
        return;
    for (uint32_t i = 0; i < ix->nfiles; i++)
        ck_source_close(&ix->files[i]);
    for (size_t i = 0; i < ix->nentries; i++)
        if (ix->entries[i].kind == CK_TENSOR && ix->entries[i].layout == CK_DEFLATED &&
            ix->entries[i].deflated)
            zip_inflate_close(ix->entries[i].deflated);
    if (ix->own_remote) /* after its files */
        http_remote_free(ix->remote);
    free(ix->files);
    free(ix->entries);
    free(ix->meta);
    free(ix->omitted);
    ck_arena_free(ix->arena);
    free(ix);
}

void ck_index_close_files(ck_index *ix)
{
    for (uint32_t i = 0; i < ix->nfiles; i++) {
        ck_file *f = &ix->files[i];
        const ck_file *origin = ck_file_origin(f);
        if (origin && origin != f) { /* closed, it is checked as a local file: as its origin */
            f->dev = origin->dev, f->ino = origin->ino;
            f->size = origin->size, f->mtime = origin->mtime;
        }
        if (f->ops) { /* a remote file's path is its connection's: kept in the arena */
            size_t n = strlen(f->path) + 1;
            char *kept = ck_arena_alloc(&ix->arena, n);
            f->path = kept ? memcpy(kept, f->path, n) : "(closed)";
        }
        ck_source_close(f);
    }
}

const char *ck_index_source(const ck_index *ix)
{
    return ix->nfiles ? ix->files[0].path : "?";
}

/* Grows *v (of *cap elements of size sz) so that it holds at least need. */
static int grow(void **v, size_t *cap, size_t need, size_t sz)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap * 2 : 16;
    while (n < need)
        n *= 2;
    void *p = realloc(*v, n * sz);
    if (!p)
        return -1;
    *v = p;
    *cap = n;
    return 0;
}

/* Appends *f (opened: the index owns it now, and closes it on failure). The id, or -1. */
static int add_opened(ck_index *ix, ck_file *f, ck_error *err)
{
    void *v = ix->files;
    const char *copy = NULL;
    if (grow(&v, &ix->cap_files, (size_t)ix->nfiles + 1, sizeof(ck_file)) == 0) {
        ix->files = v;
        copy = ck_index_strndup(ix, f->path, strlen(f->path));
    }
    if (!copy) {
        int rc = ck_fail(err, f->path, "out of memory");
        ck_source_close(f);
        return rc;
    }
    ix->files[ix->nfiles] = *f;
    ix->files[ix->nfiles].path = copy;
    return (int)ix->nfiles++;
}

int ck_index_add_file(ck_index *ix, const char *path, int fd, ck_error *err)
{
    ck_file f;
    if (ck_source_adopt(path, fd, &f, err) != 0)
        return -1;
    return add_opened(ix, &f, err);
}

int ck_index_add_source(ck_index *ix, const char *loc, const char *what, ck_error *err)
{
    ck_file f;
    if (ck_source_open(ix->remote, loc, what, &f, err) != 0)
        return -1;
    /* f.path may be loc itself or the remote state's: add_opened copies it first. */
    return add_opened(ix, &f, err);
}

int ck_index_add_opened(ck_index *ix, ck_file *f, ck_error *err)
{
    return add_opened(ix, f, err);
}

ck_entry *ck_index_add_entry(ck_index *ix, const char *name, size_t name_len, uint8_t layout,
                             unsigned rank, const int64_t *shape, ck_error *err)
{
    /* Readers refuse a large rank themselves, saying where in the file; this guards every
     * array sized by CK_MAX_RANK whoever the caller. */
    if (rank > CK_MAX_RANK)
        return ck_fail(err, ck_index_source(ix), "tensor '%.*s': rank %u exceeds %d",
                       (int)(name_len < sizeof err->msg ? name_len : sizeof err->msg), name,
                       rank, CK_MAX_RANK), NULL;
    if (name_len > UINT32_MAX)
        return ck_fail(err, ck_index_source(ix), "an entry name of %zu bytes exceeds %u",
                       name_len, UINT32_MAX), NULL;
    void *v = ix->entries;
    if (grow(&v, &ix->cap_entries, ix->nentries + 1, sizeof(ck_entry)) != 0)
        return ck_fail(err, ck_index_source(ix), "out of memory"), NULL;
    ix->entries = v;
    size_t ndims = layout == CK_STRIDED || layout == CK_CHUNKED ? 2 * (size_t)rank : rank;
    int64_t *dims = ndims ? ck_index_alloc(ix, ndims * sizeof *dims) : NULL;
    char *nm = ck_index_strndup(ix, name, name_len);
    if ((ndims && !dims) || !nm)
        return ck_fail(err, ck_index_source(ix), "out of memory"), NULL;
    if (ndims)
        memcpy(dims, shape, ndims * sizeof *dims);
    ck_entry *e = &ix->entries[ix->nentries++];
    *e = (ck_entry){.name = nm, .shape = dims, .name_len = (uint32_t)name_len,
                    .kind = CK_TENSOR, .layout = layout, .rank = (uint8_t)rank};
    return e;
}

ck_entry *ck_index_add_value_held(ck_index *ix, const char *name, size_t name_len,
                                  enum ck_value_type type, const char *text, size_t len,
                                  ck_error *err)
{
    ck_entry *e = ck_index_add_entry(ix, name, name_len, CK_CONTIGUOUS, 0, NULL, err);
    if (!e)
        return NULL;
    e->kind = CK_VALUE;
    e->dtype = (uint8_t)type;
    e->text = text;
    e->nbytes = len;
    return e;
}

ck_entry *ck_index_add_value(ck_index *ix, const char *name, size_t name_len,
                             enum ck_value_type type, const char *text, size_t len,
                             ck_error *err)
{
    char *copy = ck_index_strndup(ix, text, len);
    if (!copy)
        return ck_fail(err, ck_index_source(ix), "out of memory"), NULL;
    return ck_index_add_value_held(ix, name, name_len, type, copy, len, err);
}

const char *ck_value_type_name(enum ck_value_type t)
{
    static const char *const names[CK_VAL_TYPE_COUNT] = {"None", "bool", "int", "float",
                                                         "str", "bytes", "global"};
    return (unsigned)t < CK_VAL_TYPE_COUNT ? names[t] : "?";
}

int ck_index_add_meta(ck_index *ix, const char *key, const char *value, ck_error *err)
{
    void *v = ix->meta;
    if (grow(&v, &ix->cap_meta, ix->nmeta + 1, sizeof(ck_meta)) != 0)
        return ck_fail(err, ck_index_source(ix), "out of memory");
    ix->meta = v;
    ck_meta *m = &ix->meta[ix->nmeta];
    m->key = ck_index_strndup(ix, key, strlen(key));
    m->value = ck_index_strndup(ix, value, strlen(value));
    m->json = 0;
    if (!m->key || !m->value)
        return ck_fail(err, ck_index_source(ix), "out of memory");
    ix->nmeta++;
    return 0;
}

int ck_index_add_omission(ck_index *ix, const char *name, size_t name_len, const char *reason,
                          ck_error *err)
{
    void *v = ix->omitted;
    if (grow(&v, &ix->cap_omitted, ix->nomitted + 1, sizeof(ck_omission)) != 0)
        return ck_fail(err, ck_index_source(ix), "out of memory");
    ix->omitted = v;
    ck_omission *o = &ix->omitted[ix->nomitted];
    o->name = ck_index_strndup(ix, name, name_len);
    o->reason = ck_index_strndup(ix, reason, strlen(reason));
    if (!o->name || !o->reason)
        return ck_fail(err, ck_index_source(ix), "out of memory");
    ix->nomitted++;
    return 0;
}

int ck_index_unique_meta(ck_index *ix, ck_error *err)
{
    const char **keys = malloc((ix->nmeta ? ix->nmeta : 1) * sizeof *keys);
    for (size_t i = 0; keys && i < ix->nmeta; i++)
        keys[i] = ix->meta[i].key;
    unsigned char *later = keys ? ck_names_repeated(keys, ix->nmeta) : NULL;
    size_t n = 0;
    for (size_t i = 0; later && i < ix->nmeta; i++)
        if (!later[i])
            ix->meta[n++] = ix->meta[i];
    if (later)
        ix->nmeta = n;
    int ok = later != NULL;
    free(later);
    free(keys);
    return ok ? 0 : ck_fail(err, ck_index_source(ix), "out of memory");
}

const ck_entry *ck_index_find(const ck_index *ix, const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; i < ix->nentries; i++)
        if (ix->entries[i].name_len == n && memcmp(ix->entries[i].name, name, n) == 0)
            return &ix->entries[i];
    return NULL;
}

int ck_tensor_nbytes(unsigned rank, const int64_t *shape, enum ck_dtype dt, uint64_t *nbytes)
{
    uint64_t count = 1;
    for (unsigned i = 0; i < rank; i++) {
        if (shape[i] < 0 || __builtin_mul_overflow(count, (uint64_t)shape[i], &count))
            return -1;
    }
    return ck_dtype_nbytes(dt, count, nbytes);
}

int ck_strides_row_major(unsigned rank, const int64_t *shape)
{
    uint64_t expect = 1;
    for (unsigned d = rank; d-- > 0;) {
        if (shape[d] != 1 && (uint64_t)shape[rank + d] != expect)
            return 0;
        expect *= (uint64_t)shape[d];
    }
    return 1;
}

int ck_strided_last(unsigned rank, const int64_t *shape, uint64_t offset, uint64_t *last)
{
    uint64_t at = offset;
    for (unsigned d = 0; d < rank; d++) {
        uint64_t span = (uint64_t)(shape[d] - 1), step = (uint64_t)shape[rank + d];
        if (step && span > (UINT64_MAX - at) / step)
            return -1;
        at += span * step;
    }
    *last = at;
    return 0;
}

int ck_file_pread(const ck_index *ix, uint32_t file, void *buf, size_t len, uint64_t off)
{
    return ck_file_read(&ix->files[file], buf, len, off);
}

int ck_same_shape(const ck_entry *a, const ck_entry *b)
{
    /* A scalar's shape may be NULL, which memcmp may not be given even for 0 bytes. */
    return a->rank == b->rank &&
           (!a->rank || memcmp(a->shape, b->shape, a->rank * sizeof *a->shape) == 0);
}

/* Strided tensors. The elements a request covers are gathered in batches: each element's source
 * offset is computed, the batch is sorted by offset, and elements that lie close together in the
 * source are fetched with one pread of the span between them (at most GATHER_SPAN bytes, gaps
 * of at most GATHER_GAP), then scattered into place. A transposed matrix thus costs one pread
 * per run of adjacent source elements, not one per element, nor a re-read of the whole storage
 * per output row. Trailing dimensions that are contiguous in the source (a row of a column
 * slice, slice.h) are walked as one unit of up to GATHER_UNIT bytes, not element by element.
 * Memory stays O(GATHER_BATCH + GATHER_SPAN) whatever the tensor size. */
enum { GATHER_ITEMS = 16384, GATHER_SPAN = 256 * 1024, GATHER_GAP = 4096,
       GATHER_UNIT = 64 * 1024, GATHER_BATCH = 4 << 20 };

typedef struct gather_item {
    uint64_t src;  /* byte offset in the source file */
    uint32_t dst;  /* unit index within the batch */
} gather_item;

/* How a strided entry is walked: rank dims of units of `unit` bytes, step[d] bytes apart. */
typedef struct gather_walk {
    unsigned rank;
    uint64_t unit, base;
    uint64_t dims[CK_MAX_RANK], step[CK_MAX_RANK];
} gather_walk;

static int by_src(const void *a, const void *b)
{
    uint64_t x = ((const gather_item *)a)->src, y = ((const gather_item *)b)->src;
    return (x > y) - (x < y);
}

/* e's walk for elements of esize bytes: trailing dims folded into the unit while each is
 * laid out right after the one before in the source and the unit stays within GATHER_UNIT. */
static void walk_of(const ck_entry *e, uint64_t esize, gather_walk *w)
{
    unsigned r = e->rank;
    w->unit = esize;
    w->base = e->ext.offset;
    while (r > 0 && (uint64_t)e->shape[e->rank + r - 1] * esize == w->unit &&
           (uint64_t)e->shape[r - 1] * w->unit <= GATHER_UNIT)
        w->unit *= (uint64_t)e->shape[--r];
    w->rank = r;
    for (unsigned d = 0; d < r; d++) {
        w->dims[d] = (uint64_t)e->shape[d];
        w->step[d] = (uint64_t)e->shape[e->rank + d] * esize;
    }
}

/* Source byte offset of unit i (row-major index). */
static uint64_t unit_offset(const gather_walk *w, uint64_t i)
{
    uint64_t at = w->base;
    for (unsigned d = w->rank; d-- > 0;) {
        at += (i % w->dims[d]) * w->step[d];
        i /= w->dims[d];
    }
    return at;
}

/* Fills items with the source offsets of units first .. first+n-1, walking the multi-index
 * instead of dividing for every unit. */
static void batch_offsets(const gather_walk *w, uint64_t first, size_t n, gather_item *items)
{
    uint64_t idx[CK_MAX_RANK], rest = first;
    for (unsigned d = w->rank; d-- > 0;) {
        idx[d] = rest % w->dims[d];
        rest /= w->dims[d];
    }
    uint64_t at = unit_offset(w, first);
    for (size_t k = 0; k < n; k++) {
        items[k] = (gather_item){.src = at, .dst = (uint32_t)k};
        for (unsigned d = w->rank; d-- > 0;) { /* next index, carrying like an odometer */
            if (++idx[d] < w->dims[d]) {
                at += w->step[d];
                break;
            }
            at -= (idx[d] - 1) * w->step[d];
            idx[d] = 0;
        }
    }
}

/* Reads the batch's units into out (n × esize bytes), coalescing nearby source units. */
static int gather_batch(const ck_file *f, gather_item *items, size_t n, uint64_t esize,
                        unsigned char *out, unsigned char *scratch)
{
    qsort(items, n, sizeof *items, by_src);
    for (size_t a = 0; a < n;) {
        size_t b = a + 1;
        while (b < n && items[b].src - items[a].src + esize <= GATHER_SPAN &&
               items[b].src - items[b - 1].src <= GATHER_GAP + esize)
            b++;
        size_t span = (size_t)(items[b - 1].src - items[a].src + esize);
        int rc = ck_file_read(f, scratch, span, items[a].src);
        if (rc)
            return rc;
        for (size_t k = a; k < b; k++)
            memcpy(out + (size_t)items[k].dst * esize, scratch + (items[k].src - items[a].src),
                   (size_t)esize);
        a = b;
    }
    return 0;
}

static int read_strided(const ck_index *ix, const ck_entry *e, unsigned char *buf, size_t len,
                        uint64_t off)
{
    uint64_t esize;
    const ck_file *f = &ix->files[e->ext.file];
    /* Sub-byte elements and blocks have no strided form. */
    if (ck_dtype_nbytes(e->dtype, 1, &esize))
        return -EIO;
    gather_walk w;
    walk_of(e, esize, &w);
    esize = w.unit;
    size_t most = GATHER_BATCH / esize < GATHER_ITEMS ? GATHER_BATCH / esize : GATHER_ITEMS;
    gather_item *items = malloc(most * sizeof *items);
    unsigned char *scratch = malloc(GATHER_SPAN > most * esize ? GATHER_SPAN : most * esize);
    unsigned char *part = scratch; /* a partial unit at either end goes through scratch */
    int rc = items && scratch ? 0 : -ENOMEM;
    uint64_t i = off / esize, end = off + len;
    while (rc == 0 && i * esize < end) {
        uint64_t lo = i * esize;
        if (lo < off || lo + esize > end) { /* only part of unit i is asked for */
            rc = ck_file_read(f, part, (size_t)esize, unit_offset(&w, i));
            uint64_t from = lo < off ? off - lo : 0, to = lo + esize > end ? end - lo : esize;
            if (rc == 0)
                memcpy(buf + (lo + from - off), part + from, (size_t)(to - from));
            i++;
            continue;
        }
        uint64_t whole = (end - lo) / esize;
        size_t n = whole < most ? (size_t)whole : most;
        batch_offsets(&w, i, n, items);
        rc = gather_batch(f, items, n, esize, buf + (lo - off), scratch);
        i += n;
    }
    free(items);
    free(scratch);
    return rc;
}

/* len cut to what entry e has from off on (and to SSIZE_MAX): the count a read answers. */
static size_t entry_span(const ck_entry *e, size_t len, uint64_t off)
{
    if (off >= e->nbytes)
        return 0;
    if (len > e->nbytes - off)
        len = (size_t)(e->nbytes - off);
    return len > SSIZE_MAX ? SSIZE_MAX : len;
}

int ck_entry_lends(const ck_index *ix, const ck_entry *e)
{
    return e->kind == CK_TENSOR && e->layout == CK_CONTIGUOUS &&
           ck_file_lends(&ix->files[e->ext.file]);
}

ssize_t ck_entry_hold(const ck_index *ix, const ck_entry *e, size_t len, uint64_t off,
                      const void **ptr, void **token)
{
    len = entry_span(e, len, off);
    if (len == 0)
        return 0;
    return ck_file_hold(&ix->files[e->ext.file], len, e->ext.offset + off, ptr, token);
}

void ck_entry_release(const ck_index *ix, const ck_entry *e, void *token)
{
    ck_file_release(&ix->files[e->ext.file], token);
}

/* The bytes of one scalar of dt, whose order CK_SWAPPED reverses: a complex number is two. */
static unsigned swap_unit(enum ck_dtype dt)
{
    return dt == CK_C64 ? 4 : dt == CK_C128 ? 8 : ck_dtype_bits(dt) / 8;
}

/* [off, off+len) of a CK_SWAPPED entry: the whole scalars it touches read through a bounded
 * buffer, each reversed, and the range copied out. */
static int read_swapped(const ck_index *ix, const ck_entry *e, unsigned char *buf, size_t len,
                        uint64_t off)
{
    enum { CHUNK = 64 << 10 }; /* a multiple of every unit */
    unsigned u = swap_unit(e->dtype);
    unsigned char tmp[CHUNK];
    while (len) {
        uint64_t at = off / u * u, end = off + len;
        uint64_t stop = at + CHUNK < end ? at + CHUNK : (end + u - 1) / u * u;
        int rc = ck_file_pread(ix, e->ext.file, tmp, (size_t)(stop - at), e->ext.offset + at);
        if (rc)
            return rc;
        for (uint64_t s = 0; s < stop - at; s += u)
            for (unsigned i = 0; i < u / 2; i++) {
                unsigned char c = tmp[s + i];
                tmp[s + i] = tmp[s + u - 1 - i];
                tmp[s + u - 1 - i] = c;
            }
        size_t n = (size_t)((stop < end ? stop : end) - off);
        memcpy(buf, tmp + (off - at), n);
        buf += n, off += n, len -= n;
    }
    return 0;
}

/* The cell of x among m ascending edges (the k with edge[k] <= x < edge[k+1]), by binary
 * search; m when x lies outside them. */
static uint32_t edge_cell(const int64_t *edge, uint32_t m, int64_t x)
{
    if (m < 2 || x < edge[0] || x >= edge[m - 1])
        return m;
    uint32_t lo = 0, hi = m - 1;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (edge[mid] <= x)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* The chunk holding the element at coordinates g of the whole tensor (every element has one:
 * the chunks tile it): its cell, found by a binary search of the edges in each dim. */
static const ck_chunk *chunk_at(const ck_chunks *cs, unsigned rank, const int64_t *g)
{
    const int64_t *edge = cs->edges;
    uint64_t cell = 0;
    for (unsigned d = 0; d < rank; d++) {
        uint32_t m = cs->nedges[d], k = edge_cell(edge, m, g[d]);
        if (k >= m)
            return NULL;
        cell = cell * (m - 1) + k;
        edge += m;
    }
    return cell < cs->n ? &cs->chunk[cell] : NULL;
}

/* Bytes [off, off+len) of chunk c's row-major elements, which lie strided in its file: read as
 * the CK_STRIDED entry of its sizes and strides would be. */
static int read_strided_chunk(const ck_index *ix, const ck_entry *e, const ck_chunk *c,
                              unsigned char *buf, size_t len, uint64_t off)
{
    int64_t shape[2 * CK_MAX_RANK];
    memcpy(shape, c->sizes, e->rank * sizeof *shape);
    memcpy(shape + e->rank, c->strides, e->rank * sizeof *shape);
    ck_entry piece = {.shape = shape, .ext = c->ext, .kind = CK_TENSOR, .layout = CK_STRIDED,
                      .dtype = e->dtype, .rank = e->rank};
    return read_strided(ix, &piece, buf, len, off);
}

/* The coordinates in the whole tensor, into g, of element elem (row-major) of a chunked
 * entry's box. */
static void chunked_coords(const ck_entry *e, uint64_t elem, int64_t *g)
{
    const int64_t *dims = e->shape, *start = e->shape + e->rank;
    for (unsigned d = e->rank; d-- > 0;) {
        g[d] = start[d] + (int64_t)(elem % (uint64_t)dims[d]);
        elem /= (uint64_t)dims[d];
    }
}

/* Bytes [off, off+len) of a chunked entry: from each chunk, the longest run that lies in one
 * piece of both it and the entry's box (a row, or rows where the chunk spans the box's width),
 * read straight into buf. */
static int read_chunked(const ck_index *ix, const ck_entry *e, unsigned char *buf, size_t len,
                        uint64_t off)
{
    unsigned rank = e->rank;
    const int64_t *dims = e->shape, *start = e->shape + rank;
    uint64_t esize;
    ck_dtype_nbytes(e->dtype, 1, &esize);
    while (len) {
        int64_t g[CK_MAX_RANK], idx[CK_MAX_RANK];
        chunked_coords(e, off / esize, g);
        for (unsigned d = 0; d < rank; d++)
            idx[d] = g[d] - start[d];
        const ck_chunk *c = chunk_at(e->chunks, rank, g);
        if (!c)
            return -EIO;
        /* run: elements from g on, in one piece of both the box and the chunk */
        uint64_t run = 1, local = 0, cstride = 1;
        int whole = 1; /* the dims after d are whole in both: the run may grow through d */
        for (unsigned d = rank; d-- > 0;) {
            int64_t box_end = start[d] + dims[d], ch_end = c->offsets[d] + c->sizes[d];
            if (whole)
                run *= (uint64_t)((box_end < ch_end ? box_end : ch_end) - g[d]);
            whole &= idx[d] == 0 && c->offsets[d] == start[d] && c->sizes[d] == dims[d];
            local += (uint64_t)(g[d] - c->offsets[d]) * cstride;
            cstride *= (uint64_t)c->sizes[d];
        }
        uint64_t skip = off % esize, n = run * esize - skip;
        size_t k = n < len ? (size_t)n : len;
        int rc = c->strides ? read_strided_chunk(ix, e, c, buf, k, local * esize + skip)
                            : ck_file_pread(ix, c->ext.file, buf, k,
                                            c->ext.offset + local * esize + skip);
        if (rc)
            return rc;
        buf += k, off += k, len -= k;
    }
    return 0;
}

/* ck_entry_each_file of a chunked entry's bytes [off, off+len) (not empty, inside it). Their
 * elements lie in the box from the first's coordinates to the last's where they agree, over
 * the range between them at the first dim where they differ, and whole in every dim after it:
 * the files of the chunks in the cells that box meets, visited cell by cell (a read costs the
 * chunks it meets, not the tensor's). */
static int chunked_each_file(const ck_entry *e, uint64_t off, uint64_t len,
                             int (*fn)(void *ctx, uint32_t file), void *ctx)
{
    unsigned rank = e->rank;
    const ck_chunks *cs = e->chunks;
    const int64_t *dims = e->shape, *start = e->shape + rank, *edge = cs->edges;
    uint64_t esize;
    ck_dtype_nbytes(e->dtype, 1, &esize);
    int64_t lo[CK_MAX_RANK], hi[CK_MAX_RANK]; /* inclusive */
    uint32_t clo[CK_MAX_RANK], chi[CK_MAX_RANK], cell[CK_MAX_RANK];
    chunked_coords(e, off / esize, lo);
    chunked_coords(e, (off + len - 1) / esize, hi);
    for (unsigned d = 0, apart = 0; d < rank; d++) {
        if (apart) {
            lo[d] = start[d];
            hi[d] = start[d] + dims[d] - 1;
        }
        apart |= lo[d] != hi[d];
        uint32_t m = cs->nedges[d];
        clo[d] = cell[d] = edge_cell(edge, m, lo[d]);
        chi[d] = edge_cell(edge, m, hi[d]);
        if (clo[d] >= m || chi[d] >= m)
            return -EIO;
        edge += m;
    }
    uint32_t last = UINT32_MAX;
    for (;;) {
        uint64_t at = 0;
        for (unsigned d = 0; d < rank; d++)
            at = at * (cs->nedges[d] - 1) + cell[d];
        if (at >= cs->n)
            return -EIO;
        uint32_t file = cs->chunk[at].ext.file;
        int rc = file != last ? fn(ctx, last = file) : 0;
        if (rc)
            return rc;
        unsigned d = rank; /* the next cell of the box, last dim fastest */
        while (d-- > 0 && cell[d] == chi[d])
            cell[d] = clo[d];
        if (d >= rank)
            return 0;
        cell[d]++;
    }
}

int ck_entry_each_file(const ck_entry *e, uint64_t off, uint64_t len,
                       int (*fn)(void *ctx, uint32_t file), void *ctx)
{
    if (off >= e->nbytes || len == 0)
        return 0;
    if (len > e->nbytes - off)
        len = e->nbytes - off;
    return e->kind == CK_TENSOR && e->layout == CK_CHUNKED
               ? chunked_each_file(e, off, len, fn, ctx)
               : fn(ctx, e->ext.file);
}

typedef struct changed_ask {
    const ck_index *ix;
    uint32_t *changed;
} changed_ask;

/* ck_entry_unchanged's question of one file: 1 when it changed (its index to *changed). */
static int file_changed(void *ctx, uint32_t file)
{
    const changed_ask *a = ctx;
    if (ck_file_unchanged(&a->ix->files[file]))
        return 0;
    *a->changed = file;
    return 1;
}

int ck_entry_unchanged(const ck_index *ix, const ck_entry *e, uint64_t off, uint64_t len,
                       uint32_t *changed)
{
    changed_ask a = {.ix = ix, .changed = changed};
    return !ck_entry_each_file(e, off, len, file_changed, &a);
}

const char *ck_entry_fault(const ck_entry *e)
{
    return e->kind == CK_TENSOR && e->layout == CK_DEFLATED ? zip_inflate_fault(e->deflated)
                                                            : NULL;
}

ssize_t ck_entry_read(const ck_index *ix, const ck_entry *e, void *buf, size_t len, uint64_t off)
{
    len = entry_span(e, len, off);
    if (len == 0)
        return 0;
    int rc = 0;
    switch (e->kind == CK_VALUE ? 255 : e->layout) {
    case 255:
        memcpy(buf, e->text + off, len);
        return (ssize_t)len;
    case CK_CONTIGUOUS:
        rc = ck_file_pread(ix, e->ext.file, buf, len, e->ext.offset + off);
        break;
    case CK_STRIDED:
        rc = read_strided(ix, e, buf, len, off);
        break;
    case CK_DEFLATED:
        rc = zip_inflate_read(&ix->files[e->ext.file], e->deflated, buf, len,
                              e->deflated->skip + off);
        break;
    case CK_SWAPPED:
        rc = read_swapped(ix, e, buf, len, off);
        break;
    case CK_CHUNKED:
        rc = read_chunked(ix, e, buf, len, off);
        break;
    default:
        return -EIO;
    }
    return rc ? rc : (ssize_t)len;
}
