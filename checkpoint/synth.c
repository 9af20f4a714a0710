/* synth.c — the pack and safetensors files synthesized from an index (see synth.h). */
#include "synth.h"
#include "../base/bytes.h"
#include "../base/names.h"
#include "../base/text.h"
#include "../formats/packfile.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

enum seg_kind { SEG_BYTES, SEG_ZERO, SEG_ENTRY, SEG_CHECKSUMS };

typedef struct seg {
    uint64_t off, len;       /* where in the file */
    const unsigned char *bytes; /* SEG_BYTES */
    uint32_t entry;          /* SEG_ENTRY: index entry */
    uint32_t blob;           /* SEG_ENTRY of a pack: its blob */
    uint8_t kind;
} seg;

struct ck_synth {
    const ck_index *ix;
    seg *segs;
    size_t nsegs, cap_segs;
    uint64_t size;
    ck_text head;            /* header and index, or the safetensors header: lends the
                              * index's long texts (a GGUF key's JSON) rather than copy them */
    const ck_meta *extra;    /* safetensors only, while it is built: metadata to add */
    size_t nextra;
    /* pack only */
    uint32_t nblobs;
    uint32_t *blob_entry;    /* the entry that supplies each blob's bytes */
    unsigned char *trailer;  /* 8 × nblobs + 8 bytes, once every checksum is known */
    pthread_mutex_t lock;
};

enum { IO_CHUNK = 1 << 20 };

static int add_seg(ck_synth *sy, seg s)
{
    if (s.len == 0)
        return 0;
    if (sy->nsegs == sy->cap_segs) {
        size_t cap = sy->cap_segs ? 2 * sy->cap_segs : 64;
        seg *p = realloc(sy->segs, cap * sizeof *p);
        if (!p)
            return -1;
        sy->segs = p;
        sy->cap_segs = cap;
    }
    s.off = sy->size;
    sy->segs[sy->nsegs++] = s;
    sy->size += s.len;
    return 0;
}

/* The head's pieces as segments, its own bytes and what it lends alike. */
static int add_head(ck_synth *sy)
{
    int rc = 0;
    for (size_t k = 0; k < sy->head.npieces && rc == 0; k++)
        rc = add_seg(sy, (seg){.kind = SEG_BYTES, .len = sy->head.piece[k].len,
                               .bytes = (const unsigned char *)sy->head.piece[k].s});
    return rc;
}

static ck_synth *synth_new(const ck_index *ix)
{
    ck_synth *sy = calloc(1, sizeof *sy);
    if (sy) {
        sy->ix = ix;
        pthread_mutex_init(&sy->lock, NULL);
    }
    return sy;
}

/* A synthesized file of ix's entries in order (which it frees), laid out by build; fails only
 * when memory runs out. */
static int synth_build(const ck_index *ix, uint32_t *order, uint32_t n,
                       int (*build)(ck_synth *, const uint32_t *, uint32_t), ck_synth **out,
                       ck_error *err)
{
    ck_synth *sy = synth_new(ix);
    int rc = sy ? build(sy, order, n) : -1;
    free(order);
    if (rc != 0) {
        ck_synth_free(sy);
        return ck_fail(err, ck_index_source(ix), "out of memory");
    }
    *out = sy;
    return 0;
}

void ck_synth_free(ck_synth *sy)
{
    if (!sy)
        return;
    pthread_mutex_destroy(&sy->lock);
    free(sy->segs);
    ck_text_free(&sy->head);
    free(sy->blob_entry);
    free(sy->trailer);
    free(sy);
}

uint64_t ck_synth_size(const ck_synth *sy)
{
    return sy->size;
}

static int by_natural_name(const void *x, const void *y, void *ixp)
{
    const ck_index *ix = ixp;
    const ck_entry *a = &ix->entries[*(const uint32_t *)x], *b = &ix->entries[*(const uint32_t *)y];
    return ck_natural_cmp(a->name, a->name_len, b->name, b->name_len);
}


/* The selected entries (by only, and by keep unless it is NULL) in natural order; NULL with err
 * set on failure. */
static uint32_t *ordered_entries(const ck_index *ix, const char *only, const unsigned char *keep,
                                 int tensors_only, uint32_t *count, ck_error *err)
{
    const char *src = ck_index_source(ix);
    uint32_t *order = malloc((ix->nentries ? ix->nentries : 1) * sizeof *order), n = 0;
    if (!order)
        return ck_fail(err, src, "out of memory"), NULL;
    for (size_t i = 0; i < ix->nentries; i++)
        if (ck_name_selected(ix->entries[i].name, ix->entries[i].name_len, only) &&
            (!tensors_only || ix->entries[i].kind == CK_TENSOR) && (!keep || keep[i]))
            order[n++] = (uint32_t)i;
    if (n == 0 && only) {
        free(order);
        return ck_fail(err, src, "--only '%s' selects nothing", only), NULL;
    }
    qsort_r(order, n, sizeof *order, by_natural_name, (void *)ix);
    for (uint32_t k = 1; k < n; k++) {
        const ck_entry *a = &ix->entries[order[k - 1]], *b = &ix->entries[order[k]];
        if (a->name_len == b->name_len && memcmp(a->name, b->name, a->name_len) == 0) {
            free(order);
            return ck_fail(err, src, "two entries are named '%s'", a->name), NULL;
        }
    }
    *count = n;
    return order;
}

/* --- blobs: tensors with the same source bytes share one ------------------------------------ */

/* Orders tensors by where their bytes come from; equal means the same bytes: all empty
 * tensors; contiguous ones with one source range; strided ones with one gather; chunked ones
 * with the same chunks and box. */
static int by_source(const void *x, const void *y, void *ixp)
{
    const ck_index *ix = ixp;
    const ck_entry *a = &ix->entries[*(const uint32_t *)x], *b = &ix->entries[*(const uint32_t *)y];
#define CMP(f) if (a->f != b->f) return a->f < b->f ? -1 : 1
    CMP(nbytes);
    if (a->nbytes == 0)
        return 0;
    CMP(layout);
    if (a->layout == CK_CHUNKED && a->chunks != b->chunks) /* the same pieces, or none alike */
        return (uintptr_t)a->chunks < (uintptr_t)b->chunks ? -1 : 1;
    CMP(ext.file);
    CMP(ext.offset);
    if (a->layout == CK_CONTIGUOUS)
        return 0;
    CMP(rank);
    if (ck_dtype_bits(a->dtype) != ck_dtype_bits(b->dtype))
        return ck_dtype_bits(a->dtype) < ck_dtype_bits(b->dtype) ? -1 : 1;
#undef CMP
    return memcmp(a->shape, b->shape, 2 * (size_t)a->rank * sizeof *a->shape);
}

/* blob_of[k] for the k-th ordered tensor; blobs are numbered by first appearance in `order`,
 * and (*blob_entry)[b] is the entry that supplies blob b's bytes (*nblobs of them): of the
 * tensors that share them, the first in the source's own order (a state_dict's is the module's
 * registration order: the input embedding before the output head that is tied to it). That
 * entry owns the bytes; the others are its aliases (ck_synth_aliases), which a conversion drops
 * as transformers' save_pretrained does. */
static int assign_blobs(const ck_index *ix, const uint32_t *order, uint32_t n, uint32_t *blob_of,
                        uint32_t **blob_entry, uint32_t *nblobs)
{
    size_t m = n ? n : 1;
    uint32_t *ents = malloc(m * sizeof *ents);  /* the tensors, sorted by source */
    uint32_t *group = malloc((ix->nentries ? ix->nentries : 1) * sizeof *group); /* entry -> group */
    uint32_t *blob = malloc(m * sizeof *blob);  /* group (its first place in ents) -> blob */
    *blob_entry = malloc(m * sizeof **blob_entry);
    *nblobs = 0;
    int rc = ents && group && blob && *blob_entry ? 0 : -1;
    if (rc == 0) {
        memcpy(ents, order, n * sizeof *ents);
        qsort_r(ents, n, sizeof *ents, by_source, (void *)ix);
        for (uint32_t a = 0, b; a < n; a = b) {
            uint32_t first = ents[a];
            for (b = a + 1; b < n && by_source(&ents[a], &ents[b], (void *)ix) == 0; b++)
                first = ents[b] < first ? ents[b] : first;
            for (uint32_t k = a; k < b; k++)
                group[ents[k]] = a;
            blob[a] = UINT32_MAX;
            ents[a] = first; /* the group's owner, kept where the group starts */
        }
        for (uint32_t k = 0; k < n; k++) {
            uint32_t g = group[order[k]];
            if (blob[g] == UINT32_MAX) {
                blob[g] = *nblobs;
                (*blob_entry)[(*nblobs)++] = ents[g];
            }
            blob_of[k] = blob[g];
        }
    }
    free(ents);
    free(group);
    free(blob);
    return rc;
}

uint32_t *ck_synth_aliases(const ck_index *ix, ck_error *err)
{
    /* The blobs of every tensor, in index order: only each blob's owner is asked, which no
     * order changes, so the natural sort of the names (a mount's first work) is not needed */
    size_t m = ix->nentries ? ix->nentries : 1;
    uint32_t *alias_of = malloc(m * sizeof *alias_of), *tensors = calloc(m, sizeof *tensors);
    uint32_t *blob_of = malloc(m * sizeof *blob_of), *blob_entry = NULL, n = 0, nblobs;
    int rc = alias_of && tensors && blob_of ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < ix->nentries; i++) {
        alias_of[i] = UINT32_MAX;
        if (ix->entries[i].kind == CK_TENSOR)
            tensors[n++] = (uint32_t)i;
    }
    if (rc == 0)
        rc = assign_blobs(ix, tensors, n, blob_of, &blob_entry, &nblobs);
    for (uint32_t k = 0; rc == 0 && k < n; k++) {
        uint32_t e = tensors[k], owner = blob_entry[blob_of[k]];
        const ck_entry *a = &ix->entries[owner], *b = &ix->entries[e];
        if (e != owner && a->nbytes && a->dtype == b->dtype && ck_same_shape(a, b))
            alias_of[e] = owner;
    }
    free(tensors);
    free(blob_of);
    free(blob_entry);
    if (rc == 0)
        return alias_of;
    free(alias_of);
    return ck_fail(err, ck_index_source(ix), "out of memory"), NULL;
}

void ck_pack_groups_free(ck_pack_groups *g)
{
    free(g->tensors);
    free(g->blob_of);
    free(g->blob_entry);
    *g = (ck_pack_groups){0};
}

int ck_synth_groups(const ck_index *ix, const char *only, const unsigned char *keep,
                    ck_pack_groups *out, ck_error *err)
{
    *out = (ck_pack_groups){0};
    out->tensors = ordered_entries(ix, only, keep, 1, &out->ntensors, err);
    if (!out->tensors)
        return -1;
    out->blob_of = malloc((out->ntensors ? out->ntensors : 1) * sizeof *out->blob_of);
    if (!out->blob_of || assign_blobs(ix, out->tensors, out->ntensors, out->blob_of,
                                      &out->blob_entry, &out->nblobs) != 0) {
        ck_pack_groups_free(out);
        return ck_fail(err, ck_index_source(ix), "out of memory");
    }
    return 0;
}

/* --- the pack's header and index ------------------------------------------------------------ */

/* The index's fields, little-endian; every string the index's own (or a literal), so that it
 * outlives the pack and a long one (a GGUF key's JSON, a value's text) is lent, not copied. */
static void enc_u8(ck_textbuf *b, uint8_t v)
{
    ck_textbuf_put(b, (const char *)&v, 1);
}

static void enc_u32(ck_textbuf *b, uint32_t v)
{
    unsigned char c[4];
    put_le32(c, v);
    ck_textbuf_put(b, (const char *)c, 4);
}

static void enc_u64(ck_textbuf *b, uint64_t v)
{
    unsigned char c[8];
    put_le64(c, v);
    ck_textbuf_put(b, (const char *)c, 8);
}

static void enc_str(ck_textbuf *b, const char *s, size_t n)
{
    enc_u32(b, (uint32_t)n);
    ck_textbuf_put_held(b, s, n);
}

/* The metadata a pack carries: the source format first, unless the source (a pack) already
 * says what it came from, then the source's own. */
static int has_source_format(const ck_index *ix)
{
    return ix->nmeta && strcmp(ix->meta[0].key, "ckptfs.source_format") == 0;
}

static void encode_index(ck_textbuf *e, const ck_synth *sy, const uint32_t *order, uint32_t n,
                         const uint32_t *blob_of, const uint64_t *blob_off)
{
    const ck_index *ix = sy->ix;
    int own = !has_source_format(ix);
    enc_u64(e, n);
    enc_u64(e, sy->nblobs);
    enc_u32(e, (uint32_t)(ix->nmeta + (size_t)own));
    enc_u32(e, 0);
    if (own) {
        enc_str(e, "ckptfs.source_format", strlen("ckptfs.source_format"));
        enc_str(e, ix->format, strlen(ix->format));
    }
    for (size_t i = 0; i < ix->nmeta; i++) {
        enc_str(e, ix->meta[i].key, strlen(ix->meta[i].key));
        enc_str(e, ix->meta[i].value, strlen(ix->meta[i].value));
    }
    for (uint32_t b = 0; b < sy->nblobs; b++) {
        enc_u64(e, blob_off[b]);
        enc_u64(e, ix->entries[sy->blob_entry[b]].nbytes);
    }
    for (uint32_t k = 0, t = 0; k < n; k++) {
        const ck_entry *x = &ix->entries[order[k]];
        enc_str(e, x->name, x->name_len);
        enc_u8(e, x->kind == CK_TENSOR ? 0 : 1);
        enc_u8(e, x->dtype);
        enc_u8(e, x->kind == CK_TENSOR ? x->rank : 0);
        enc_u8(e, 0);
        if (x->kind == CK_TENSOR) {
            for (unsigned d = 0; d < x->rank; d++)
                enc_u64(e, (uint64_t)x->shape[d]);
            enc_u64(e, blob_of[t++]);
        } else {
            enc_str(e, x->text, (size_t)x->nbytes);
        }
    }
}

/* XXH3-64 of t's bytes from `from` on, into *sum: 0, or -1 without memory. */
static int text_xxh3(const ck_text *t, uint64_t from, uint64_t *sum)
{
    XXH3_state_t *st = XXH3_createState();
    if (!st)
        return -1;
    XXH3_64bits_reset(st);
    for (size_t k = 0; k < t->npieces; k++) {
        const ck_text_piece *p = &t->piece[k];
        uint64_t skip = from > p->at ? from - p->at : 0;
        if (skip < p->len)
            XXH3_64bits_update(st, p->s + skip, p->len - skip);
    }
    *sum = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return 0;
}

/* Header, index and every segment of the pack of the entries in `order`. */
static int build_pack(ck_synth *sy, const uint32_t *order, uint32_t n)
{
    const ck_index *ix = sy->ix;
    uint32_t *tensors = malloc((n ? n : 1) * sizeof *tensors), *blob_of = NULL, nt = 0;
    uint64_t *blob_off = NULL;
    int rc = -1;
    if (!tensors)
        return -1;
    for (uint32_t k = 0; k < n; k++)
        if (ix->entries[order[k]].kind == CK_TENSOR)
            tensors[nt++] = order[k];
    blob_of = malloc((nt ? nt : 1) * sizeof *blob_of);
    if (!blob_of || assign_blobs(ix, tensors, nt, blob_of, &sy->blob_entry, &sy->nblobs) != 0)
        goto out;
    blob_off = malloc((sy->nblobs ? sy->nblobs : 1) * sizeof *blob_off);
    if (!blob_off)
        goto out;
    uint64_t at = 0;
    for (uint32_t b = 0; b < sy->nblobs; b++) {
        blob_off[b] = ck_align_up(at, PACK_BLOB_ALIGN);
        at = blob_off[b] + ix->entries[sy->blob_entry[b]].nbytes;
    }
    uint64_t data_len = ck_align_up(at, PACK_REGION_ALIGN), sum;
    static const char no_header[PACK_HEADER_SIZE]; /* filled in once the index is known */
    ck_textbuf e = {0};
    ck_textbuf_put(&e, no_header, PACK_HEADER_SIZE);
    encode_index(&e, sy, order, n, blob_of, blob_off);
    uint64_t index_len = ck_textbuf_size(&e) - PACK_HEADER_SIZE;
    if (ck_textbuf_finish(&e, &sy->head) != 0 || text_xxh3(&sy->head, PACK_HEADER_SIZE, &sum))
        goto out;
    pack_header h = {.version = PACK_VERSION, .index_offset = PACK_HEADER_SIZE,
                     .index_length = index_len,
                     .data_offset = ck_align_up(PACK_HEADER_SIZE + index_len, PACK_REGION_ALIGN),
                     .data_length = data_len, .index_xxh3 = sum};
    h.checksum_offset = h.data_offset + h.data_length;
    pack_header_encode(&h, (unsigned char *)sy->head.own); /* its first bytes: its own */
    rc = add_head(sy);
    rc |= add_seg(sy, (seg){.kind = SEG_ZERO, .len = h.data_offset - sy->size});
    for (uint32_t b = 0; b < sy->nblobs && rc == 0; b++) {
        rc |= add_seg(sy, (seg){.kind = SEG_ZERO, .len = h.data_offset + blob_off[b] - sy->size});
        rc |= add_seg(sy, (seg){.kind = SEG_ENTRY, .entry = sy->blob_entry[b], .blob = b,
                               .len = ix->entries[sy->blob_entry[b]].nbytes});
    }
    rc |= add_seg(sy, (seg){.kind = SEG_ZERO, .len = h.checksum_offset - sy->size});
    rc |= add_seg(sy, (seg){.kind = SEG_CHECKSUMS, .len = 8 * (uint64_t)sy->nblobs + 8});
out:
    free(tensors);
    free(blob_of);
    free(blob_off);
    return rc;
}

int ck_synth_pack(const ck_index *ix, const char *only, ck_synth **out, ck_error *err)
{
    const char *src = ck_index_source(ix);
    uint32_t n;
    *out = NULL;
    uint32_t *order = ordered_entries(ix, only, NULL, 0, &n, err);
    if (!order)
        return -1;
    /* FORMAT.md allows the empty name only for a pack's one entry, and the reader enforces it:
     * refusing here keeps us from writing a pack that we would then refuse to open. The empty
     * name sorts first. */
    if (n > 1 && ix->entries[order[0]].name_len == 0) {
        free(order);
        return ck_fail(err, src, "an entry has the empty name beside %u others; a pack allows "
                       "the empty name only for its one entry", n - 1);
    }
    return synth_build(ix, order, n, build_pack, out, err);
}

/* --- checksums ---------------------------------------------------------------------------- */

/* Hashes blob b by reading its entry in bounded chunks. */
static int hash_blob(const ck_synth *sy, uint32_t b, unsigned char *buf, uint64_t *sum)
{
    const ck_entry *e = &sy->ix->entries[sy->blob_entry[b]];
    XXH3_state_t *st = XXH3_createState();
    if (!st)
        return -ENOMEM;
    XXH3_64bits_reset(st);
    int rc = 0;
    for (uint64_t off = 0; off < e->nbytes && rc == 0;) {
        ssize_t got = ck_entry_read(sy->ix, e, buf, IO_CHUNK, off);
        if (got <= 0)
            rc = got < 0 ? (int)got : -EIO;
        else {
            XXH3_64bits_update(st, buf, (size_t)got);
            off += (uint64_t)got;
        }
    }
    *sum = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return rc;
}

/* The trailer from every blob's checksum: the sums, then the sum of the sums. */
static int set_trailer(ck_synth *sy, const uint64_t *sums)
{
    unsigned char *t = malloc(8 * (size_t)sy->nblobs + 8);
    if (!t)
        return -ENOMEM;
    for (uint32_t b = 0; b < sy->nblobs; b++)
        put_le64(t + 8 * (size_t)b, sums[b]);
    put_le64(t + 8 * (size_t)sy->nblobs, XXH3_64bits(t, 8 * (size_t)sy->nblobs));
    sy->trailer = t;
    return 0;
}

/* Every blob's XXH3-64, from the data: one pass. 0, or -errno. */
static int blob_checksums(const ck_synth *sy, uint64_t *sums)
{
    unsigned char *buf = malloc(IO_CHUNK);
    int rc = buf ? 0 : -ENOMEM;
    for (uint32_t b = 0; b < sy->nblobs && rc == 0; b++)
        rc = hash_blob(sy, b, buf, &sums[b]);
    free(buf);
    return rc;
}

/* Computes the trailer on first use: one pass over the data, under the lock, once. */
static int ensure_trailer(ck_synth *sy)
{
    pthread_mutex_lock(&sy->lock);
    int rc = 0;
    if (!sy->trailer) {
        uint64_t *sums = malloc((sy->nblobs ? sy->nblobs : 1) * sizeof *sums);
        rc = sums ? blob_checksums(sy, sums) : -ENOMEM;
        if (rc == 0)
            rc = set_trailer(sy, sums);
        free(sums);
    }
    pthread_mutex_unlock(&sy->lock);
    return rc;
}

/* --- reading and writing ------------------------------------------------------------------ */

static size_t find_seg(const ck_synth *sy, uint64_t off)
{
    size_t lo = 0, hi = sy->nsegs;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (sy->segs[mid].off <= off)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Copies n bytes of segment s starting at its byte `at`; 0 or -errno. */
static int read_seg(ck_synth *sy, const seg *s, unsigned char *buf, size_t n, uint64_t at)
{
    switch (s->kind) {
    case SEG_BYTES:
        memcpy(buf, s->bytes + at, n);
        return 0;
    case SEG_ZERO:
        memset(buf, 0, n);
        return 0;
    case SEG_CHECKSUMS: {
        int rc = ensure_trailer(sy);
        if (rc == 0)
            memcpy(buf, sy->trailer + at, n);
        return rc;
    }
    default: {
        ssize_t got = ck_entry_read(sy->ix, &sy->ix->entries[s->entry], buf, n, at);
        return got == (ssize_t)n ? 0 : got < 0 ? (int)got : -EIO;
    }
    }
}

ssize_t ck_synth_read(ck_synth *sy, void *buf, size_t len, uint64_t off)
{
    if (off >= sy->size)
        return 0;
    if (len > sy->size - off)
        len = (size_t)(sy->size - off);
    unsigned char *p = buf;
    size_t done = 0;
    for (size_t i = find_seg(sy, off); done < len; i++) {
        const seg *s = &sy->segs[i];
        uint64_t at = off + done - s->off;
        size_t n = s->len - at < len - done ? (size_t)(s->len - at) : len - done;
        int rc = read_seg(sy, s, p + done, n, at);
        if (rc)
            return rc;
        done += n;
    }
    return (ssize_t)done;
}

/* fn and its ctx, asked of each file once in a run: a run of one file's tensors names it once. */
typedef struct each_source {
    int (*fn)(void *ctx, uint32_t file);
    void *ctx;
    uint32_t last; /* the file just named */
} each_source;

static int each_source_once(void *ctx, uint32_t file)
{
    each_source *a = ctx;
    if (file == a->last)
        return 0;
    a->last = file;
    return a->fn(a->ctx, file);
}

int ck_synth_each_source(const ck_synth *sy, uint64_t off, size_t len,
                         int (*fn)(void *ctx, uint32_t file), void *ctx)
{
    if (off >= sy->size)
        return 0;
    uint64_t end = len > sy->size - off ? sy->size : off + len;
    each_source a = {.fn = fn, .ctx = ctx, .last = UINT32_MAX};
    int rc = 0;
    for (size_t i = find_seg(sy, off); rc == 0 && i < sy->nsegs && sy->segs[i].off < end; i++) {
        const seg *s = &sy->segs[i];
        if (s->kind == SEG_ENTRY) { /* the files of the entry's bytes the range holds */
            uint64_t from = off > s->off ? off - s->off : 0;
            uint64_t to = end - s->off < s->len ? end - s->off : s->len;
            rc = ck_entry_each_file(&sy->ix->entries[s->entry], from, to - from,
                                    each_source_once, &a);
        } else if (s->kind != SEG_ZERO) {
            for (uint32_t f = 0; rc == 0 && f < sy->ix->nfiles; f++)
                rc = fn(ctx, f);
            a.last = UINT32_MAX;
        }
    }
    return rc;
}

/* Copies the rest of a contiguous tensor's bytes (from *at) in the kernel with copy_file_range:
 * no pass through user space, and a reflink where the filesystem has them. 0 when done; 1 when
 * the kernel cannot copy between these files (the caller reads and writes the rest); -errno,
 * -EIO when the source is shorter than its index says, -ECANCELED when progress says stop. */
static int copy_entry(const ck_synth *sy, const seg *s, int fd, uint64_t *at, uint64_t *done,
                      ck_progress progress, void *ctx)
{
    enum { COPY_CHUNK = 8 << 20 }; /* between progress calls */
    const ck_entry *e = &sy->ix->entries[s->entry];
    if (e->kind != CK_TENSOR || e->layout != CK_CONTIGUOUS)
        return 1;
    while (*at < s->len) {
        loff_t in = (loff_t)(e->ext.offset + *at);
        size_t n = s->len - *at < COPY_CHUNK ? (size_t)(s->len - *at) : COPY_CHUNK;
        ssize_t w = copy_file_range(sy->ix->files[e->ext.file].fd, &in, fd, NULL, n, 0);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS ||
                      errno == EOPNOTSUPP || errno == EBADF))
            return 1;
        if (w <= 0)
            return w < 0 ? -errno : -EIO;
        *at += (uint64_t)w;
        *done += (uint64_t)w;
        if (progress && progress(ctx, *done, sy->size))
            return -ECANCELED;
    }
    return 0;
}

int ck_synth_write(ck_synth *sy, int fd, ck_progress progress, void *ctx)
{
    enum { CHUNK = 256 << 10 }; /* stays in L2 between the read and the write */
    unsigned char *buf = malloc(CHUNK);
    uint64_t *sums = calloc(sy->nblobs ? sy->nblobs : 1, sizeof *sums);
    XXH3_state_t *st = XXH3_createState();
    int rc = buf && sums && st ? 0 : -ENOMEM;
    uint64_t done = 0;
    for (uint32_t b = 0; sums && b < sy->nblobs; b++) /* a zero-length blob has no segment */
        sums[b] = XXH3_64bits(NULL, 0);
    for (size_t i = 0; i < sy->nsegs && rc == 0; i++) {
        const seg *s = &sy->segs[i];
        if (s->kind == SEG_CHECKSUMS) { /* every blob has passed: the sums are complete */
            pthread_mutex_lock(&sy->lock);
            if (!sy->trailer)
                rc = set_trailer(sy, sums);
            pthread_mutex_unlock(&sy->lock);
        }
        int blob = s->kind == SEG_ENTRY && sy->blob_entry;
        uint64_t at = 0;
        if (blob)
            XXH3_64bits_reset(st);
        else if (s->kind == SEG_ENTRY && (rc = copy_entry(sy, s, fd, &at, &done, progress, ctx)) > 0)
            rc = 0; /* the kernel cannot: read and write what is left */
        while (at < s->len && rc == 0) {
            size_t n = s->len - at < CHUNK ? (size_t)(s->len - at) : CHUNK;
            rc = read_seg(sy, s, buf, n, at);
            if (rc == 0 && blob)
                XXH3_64bits_update(st, buf, n);
            if (rc == 0)
                rc = ck_write_all(fd, buf, n);
            at += n;
            done += n;
            if (rc == 0 && progress && progress(ctx, done, sy->size))
                rc = -ECANCELED;
        }
        if (blob && rc == 0)
            sums[s->blob] = XXH3_64bits_digest(st);
    }
    /* A source written to meanwhile (a new mtime) may have given old and new bytes mixed. */
    for (uint32_t f = 0; rc == 0 && f < sy->ix->nfiles; f++)
        if (!ck_file_unchanged(&sy->ix->files[f]))
            rc = -EIO;
    free(buf);
    free(sums);
    XXH3_freeState(st);
    return rc;
}

/* --- the safetensors view ----------------------------------------------------------------- */

/* The safetensors header is written as cJSON_PrintUnformatted would print it (the same members,
 * in the same order, escaped the same way), straight into a text that lends the index's long
 * metadata values, rather than as a tree that copies them. */

static void put_cstring(ck_textbuf *b, const char *s, int held)
{
    ck_textbuf_put_string(b, s, strlen(s), held);
}

/* "name":{"dtype":...,"shape":[...],"data_offsets":[begin,end]} */
static void put_tensor_desc(ck_textbuf *b, const ck_entry *e, uint64_t begin)
{
    ck_textbuf_put_string(b, e->name, e->name_len, 0);
    CK_TEXTBUF_LIT(b, ":{\"dtype\":");
    put_cstring(b, ck_dtype_name(e->dtype), 0);
    CK_TEXTBUF_LIT(b, ",\"shape\":[");
    for (unsigned d = 0; d < e->rank; d++) {
        if (d)
            CK_TEXTBUF_LIT(b, ",");
        ck_textbuf_put_uint(b, (uint64_t)e->shape[d]);
    }
    CK_TEXTBUF_LIT(b, "],\"data_offsets\":[");
    ck_textbuf_put_uint(b, begin);
    CK_TEXTBUF_LIT(b, ",");
    ck_textbuf_put_uint(b, begin + e->nbytes);
    CK_TEXTBUF_LIT(b, "]}");
}

/* ix's metadata, then extra's, as the members of __metadata__, each key once (its first): a
 * search of the sorted keys, not of the members per key (a million GGUF keys). First,
 * "format": "pt" when neither has a "format": transformers loads a safetensors file only with
 * a format it knows (pt, tf, flax, mlx), the Hub's converter writes pt, and the tensors are as
 * torch reads them. ix's values are lent (they outlive the file), extra's copied. 0, or -1
 * without memory. */
static int put_metadata(ck_textbuf *b, const ck_index *ix, const ck_meta *extra, size_t nextra)
{
    size_t n = ix->nmeta + nextra;
    const char **keys = malloc((n ? n : 1) * sizeof *keys);
    int has_format = 0, first = 1;
    for (size_t i = 0; keys && i < n; i++) {
        keys[i] = i < ix->nmeta ? ix->meta[i].key : extra[i - ix->nmeta].key;
        has_format |= strcmp(keys[i], "format") == 0;
    }
    if (keys && !has_format) {
        CK_TEXTBUF_LIT(b, "\"format\":\"pt\"");
        first = 0;
    }
    unsigned char *later = keys ? ck_names_repeated(keys, n) : NULL;
    for (size_t i = 0; later && i < n; i++) {
        const ck_meta *m = i < ix->nmeta ? &ix->meta[i] : &extra[i - ix->nmeta];
        if (later[i])
            continue;
        if (!first)
            CK_TEXTBUF_LIT(b, ",");
        first = 0;
        put_cstring(b, m->key, 0);
        CK_TEXTBUF_LIT(b, ":");
        put_cstring(b, m->value, i < ix->nmeta);
    }
    int ok = later != NULL;
    free(later);
    free(keys);
    return ok ? 0 : -1;
}

/* The names of the tensors whose dtype the spec lacks (keep[k] 0 for them, else 1), as the JSON
 * array that __metadata__ "ckptfs.omitted" holds as a string, into *out: 0, or -1 without
 * memory. */
static int omitted_list(const ck_index *ix, const uint32_t *order, uint32_t n, uint8_t *keep,
                        ck_text *out)
{
    ck_textbuf b = {0};
    CK_TEXTBUF_LIT(&b, "[");
    for (uint32_t k = 0, any = 0; k < n; k++) {
        const ck_entry *e = &ix->entries[order[k]];
        keep[k] = e->dtype < CK_ST_DTYPE_COUNT;
        if (keep[k])
            continue;
        if (any++)
            CK_TEXTBUF_LIT(&b, ",");
        ck_textbuf_put_string(&b, e->name, e->name_len, 0);
    }
    CK_TEXTBUF_LIT(&b, "]");
    return ck_textbuf_finish(&b, out);
}

/* The header into sy->head: its length (8 bytes), the JSON, the spec's padding (spaces) to a
 * multiple of 8; tensors whose dtype the spec lacks are named in ckptfs.omitted instead. 0, or
 * -1 without memory. */
static int st_header(ck_synth *sy, const uint32_t *order, uint32_t n, uint8_t *keep)
{
    const ck_index *ix = sy->ix;
    static const char no_length[8]; /* filled in once the JSON is written */
    ck_text omitted;
    if (omitted_list(ix, order, n, keep, &omitted) != 0)
        return -1;
    ck_textbuf b = {0};
    ck_textbuf_put(&b, no_length, sizeof no_length);
    CK_TEXTBUF_LIT(&b, "{\"__metadata__\":{");
    int rc = put_metadata(&b, ix, sy->extra, sy->nextra);
    if (omitted.len > 2) {
        CK_TEXTBUF_LIT(&b, ",\"ckptfs.omitted\":");
        ck_textbuf_put_string(&b, omitted.own, (size_t)omitted.len, 0);
    }
    ck_text_free(&omitted);
    CK_TEXTBUF_LIT(&b, "}");
    uint64_t at = 0;
    for (uint32_t k = 0; k < n; k++) {
        const ck_entry *e = &ix->entries[order[k]];
        if (!keep[k])
            continue;
        CK_TEXTBUF_LIT(&b, ",");
        put_tensor_desc(&b, e, at);
        at += e->nbytes;
    }
    CK_TEXTBUF_LIT(&b, "}");
    uint64_t len = ck_textbuf_size(&b) - sizeof no_length, padded = ck_align_up(len, 8);
    ck_textbuf_put(&b, "        ", (size_t)(padded - len));
    if (ck_textbuf_finish(&b, &sy->head) != 0 || rc != 0)
        return -1;
    put_le64((unsigned char *)sy->head.own, padded); /* its first bytes: its own */
    return 0;
}

static int build_safetensors(ck_synth *sy, const uint32_t *order, uint32_t n)
{
    uint8_t *keep = malloc(n ? n : 1);
    int rc = keep ? st_header(sy, order, n, keep) : -1;
    if (rc == 0)
        rc = add_head(sy);
    for (uint32_t k = 0; k < n && rc == 0; k++)
        if (keep[k])
            rc = add_seg(sy, (seg){.kind = SEG_ENTRY, .entry = order[k],
                                  .len = sy->ix->entries[order[k]].nbytes});
    free(keep);
    return rc;
}

int ck_synth_safetensors(const ck_index *ix, ck_synth **out, ck_error *err)
{
    uint32_t n;
    *out = NULL;
    uint32_t *order = ordered_entries(ix, NULL, NULL, 1, &n, err);
    if (!order)
        return -1;
    int rc = ck_synth_safetensors_of(ix, order, n, NULL, 0, out, err);
    free(order);
    return rc;
}

int ck_synth_safetensors_of(const ck_index *ix, const uint32_t *entries, uint32_t n,
                            const ck_meta *extra, size_t nextra, ck_synth **out, ck_error *err)
{
    ck_synth *sy = synth_new(ix);
    *out = NULL;
    if (!sy)
        return ck_fail(err, ck_index_source(ix), "out of memory");
    sy->extra = extra, sy->nextra = nextra;
    int rc = build_safetensors(sy, entries, n);
    sy->extra = NULL, sy->nextra = 0; /* the caller's: not kept past the build */
    if (rc != 0) {
        ck_synth_free(sy);
        return ck_fail(err, ck_index_source(ix), "out of memory");
    }
    *out = sy;
    return 0;
}
