/* packfile.c — the pack reader: header and index only, every rule of FORMAT.md checked. */
#include "packfile.h"
#include "../base/bytes.h"
#include "../base/cursor.h"
#include "../base/names.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* The least each record can take in the index, for sizing counts before trusting them:
 * a metadata pair is two u32 lengths; a blob two u64s; an entry its u32 name length and four
 * bytes of kind, type, rank and reserved, then at least a u32 text length (a value) or a u64
 * blob (a tensor). */
#define COUNTS_SIZE 24u
#define MIN_META 8u
#define MIN_BLOB 16u
#define MIN_ENTRY 12u
#define NAME_SHOWN 96u /* bytes of a name quoted in a message */

typedef unsigned long long ull; /* what %llu prints */

int pack_read_trailer(const ck_index *ix, uint32_t file, uint32_t nblobs, uint64_t *stored)
{
    const ck_file *f = &ix->files[file];
    size_t n = 8 * (size_t)nblobs + 8;
    if (f->size < n)
        return -EIO;
    unsigned char *t = malloc(n);
    int rc = t ? ck_file_read(f, t, n, f->size - n) : -ENOMEM;
    if (rc == 0 && XXH3_64bits(t, n - 8) != get_le64(t + n - 8))
        rc = -EBADMSG;
    for (uint32_t b = 0; rc == 0 && b < nblobs; b++)
        stored[b] = get_le64(t + 8 * (size_t)b);
    free(t);
    return rc;
}

int pack_probe(const unsigned char *head, size_t n)
{
    return n >= 8 && memcmp(head, PACK_MAGIC, 8) == 0;
}

void pack_header_encode(const pack_header *h, unsigned char out[PACK_HEADER_SIZE])
{
    memcpy(out, PACK_MAGIC, 8);
    put_le32(out + 8, h->version);
    put_le32(out + 12, h->flags);
    put_le64(out + 16, h->index_offset);
    put_le64(out + 24, h->index_length);
    put_le64(out + 32, h->data_offset);
    put_le64(out + 40, h->data_length);
    put_le64(out + 48, h->checksum_offset);
    put_le64(out + 56, h->index_xxh3);
}

void pack_header_decode(const unsigned char in[PACK_HEADER_SIZE], pack_header *h)
{
    h->version = get_le32(in + 8);
    h->flags = get_le32(in + 12);
    h->index_offset = get_le64(in + 16);
    h->index_length = get_le64(in + 24);
    h->data_offset = get_le64(in + 32);
    h->data_length = get_le64(in + 40);
    h->checksum_offset = get_le64(in + 48);
    h->index_xxh3 = get_le64(in + 56);
}

/* --- the header ------------------------------------------------------------------------- */

/* Every rule of the header table, in field order. The index checksum needs the index: it is
 * checked once that is read. */
static int check_header(const unsigned char *raw, const pack_header *h, const char *path,
                        ck_error *err)
{
    if (memcmp(raw, PACK_MAGIC, 8) != 0) {
        char hex[3 * 8] = "";
        for (size_t i = 0, k = 0; i < 8; i++)
            k += (size_t)snprintf(hex + k, sizeof hex - k, "%s%02x", i ? " " : "", raw[i]);
        return ck_fail(err, path, "pack header: magic is %s, not \"%s\" (bytes 0-7)", hex,
                       PACK_MAGIC);
    }
    if (h->version != PACK_VERSION)
        return ck_fail(err, path, "pack header: version %u, only version %u is known (bytes "
                       "8-11)", h->version, PACK_VERSION);
    if (h->flags != 0)
        return ck_fail(err, path, "pack header: flags 0x%x, but no flag is defined (bytes "
                       "12-15)", h->flags);
    if (h->index_offset != PACK_HEADER_SIZE)
        return ck_fail(err, path, "pack header: index_offset %llu, must be %u (bytes 16-23)",
                       (ull)h->index_offset, PACK_HEADER_SIZE);
    if (h->index_length > PACK_MAX_INDEX)
        return ck_fail(err, path, "pack header: index_length %llu exceeds the limit of %u "
                       "(bytes 24-31)", (ull)h->index_length, PACK_MAX_INDEX);
    /* Both are bounded now: no overflow below. */
    uint64_t index_end = h->index_offset + h->index_length;
    uint64_t data_start = ck_align_up(index_end, PACK_REGION_ALIGN);
    if (index_end > h->data_offset)
        return ck_fail(err, path, "pack header: the index [%llu, %llu) runs past data_offset "
                       "%llu (bytes 24-31)", (ull)h->index_offset, (ull)index_end,
                       (ull)h->data_offset);
    if (h->data_offset % PACK_REGION_ALIGN)
        return ck_fail(err, path, "pack header: data_offset %llu is not a multiple of %u "
                       "(bytes 32-39)", (ull)h->data_offset, PACK_REGION_ALIGN);
    if (h->data_offset != data_start)
        return ck_fail(err, path, "pack header: data_offset %llu, but the index ends at byte "
                       "%llu, so the data must start at %llu (bytes 32-39)",
                       (ull)h->data_offset, (ull)index_end, (ull)data_start);
    if (h->data_length % PACK_REGION_ALIGN)
        return ck_fail(err, path, "pack header: data_length %llu is not a multiple of %u "
                       "(bytes 40-47)", (ull)h->data_length, PACK_REGION_ALIGN);
    uint64_t data_end;
    if (__builtin_add_overflow(h->data_offset, h->data_length, &data_end))
        return ck_fail(err, path, "pack header: data_offset %llu + data_length %llu overflows "
                       "(bytes 40-47)", (ull)h->data_offset, (ull)h->data_length);
    if (h->checksum_offset != data_end)
        return ck_fail(err, path, "pack header: checksum_offset %llu, but data_offset + "
                       "data_length is %llu (bytes 48-55)", (ull)h->checksum_offset,
                       (ull)data_end);
    return 0;
}

/* --- the index -------------------------------------------------------------------------- */

typedef struct pack_reader {
    ck_index *ix;
    uint32_t file;
    const char *path;
    const pack_header *h;
    ck_cursor c;             /* over the index, h->index_length bytes at file offset base */
    uint64_t nentries, nblobs;
    pack_layout *layout;     /* what the index says, filled in as it is checked */
    pack_blob *blobs;        /* layout->blobs */
    uint32_t *entry_blob, *blob_entry;
    uint64_t table_at;       /* index offset of the blob table */
    uint32_t named;          /* blobs named by a tensor so far: they are blobs 0..named-1 */
    const unsigned char *prev_name; /* the entry before, for the order; and its name's length */
    uint32_t prev_len;
    uint64_t prev_at;        /* file offset of that entry */
    ck_error *err;
} pack_reader;

/* File offset of index byte i. */
static ull file_at(const pack_reader *r, uint64_t i)
{
    return (ull)(r->c.base + i);
}

/* Fails unless n more index bytes are left for what (a field of whom). */
static int need(pack_reader *r, uint64_t n, const char *whom, const char *what)
{
    if (n <= ck_cursor_left(&r->c))
        return 0;
    return ck_fail(r->err, r->path, "%s: the index ends at byte %llu, inside %s (%llu bytes at "
                   "byte %llu)", whom, file_at(r, r->c.len), what, (ull)n,
                   file_at(r, r->c.pos));
}

/* A field need() has made room for. */
static uint32_t take_u32(pack_reader *r)
{
    uint32_t v = 0;
    ck_take_u32(&r->c, &v);
    return v;
}

static uint64_t take_u64(pack_reader *r)
{
    uint64_t v = 0;
    ck_take_u64(&r->c, &v);
    return v;
}

/* A u32 length and that many bytes; *s points into the index. */
static int take_string(pack_reader *r, const char *whom, const char *what,
                       const unsigned char **s, uint32_t *len)
{
    uint64_t n = 0;
    int rc = ck_take_str(&r->c, 4, UINT32_MAX, s, &n);
    *len = (uint32_t)n;
    if (rc == 0)
        return 0;
    char field[64];
    snprintf(field, sizeof field, rc == CK_STR_NO_LENGTH ? "the %s length" : "the %s", what);
    return need(r, rc == CK_STR_NO_LENGTH ? 4 : n, whom, field);
}

/* Names and metadata are UTF-8 without NUL: the common index hands them out as C strings,
 * which a NUL would cut short. */
static int check_text(pack_reader *r, const unsigned char *s, uint32_t len, const char *whom,
                      const char *what)
{
    ull at = file_at(r, (uint64_t)(s - r->c.p));
    const unsigned char *nul = memchr(s, 0, len);
    if (nul)
        return ck_fail(r->err, r->path, "%s: the %s holds a NUL byte (byte %llu)", whom, what,
                       at + (ull)(nul - s));
    size_t bad = ck_utf8_invalid_at(s, len);
    if (bad < len)
        return ck_fail(r->err, r->path, "%s: the %s is not valid UTF-8 (byte %llu)", whom, what,
                       at + (ull)bad);
    return 0;
}

/* How many bytes of a (valid UTF-8) name to quote: at most NAME_SHOWN, cut between
 * characters. */
static int shown(const unsigned char *name, uint32_t len)
{
    if (len <= NAME_SHOWN)
        return (int)len;
    uint32_t n = NAME_SHOWN;
    while (n > 0 && (name[n] & 0xC0) == 0x80)
        n--;
    return (int)n;
}

static int read_meta(pack_reader *r, uint32_t nmeta)
{
    for (uint32_t i = 0; i < nmeta; i++) {
        char whom[48];
        snprintf(whom, sizeof whom, "pack metadata %u", i);
        const unsigned char *key, *value;
        uint32_t klen, vlen;
        if (take_string(r, whom, "key", &key, &klen) || check_text(r, key, klen, whom, "key") ||
            take_string(r, whom, "value", &value, &vlen) ||
            check_text(r, value, vlen, whom, "value"))
            return -1;
        /* ck_index_add_meta takes C strings; the index holds none. */
        char *kv = malloc((size_t)klen + vlen + 2);
        if (!kv)
            return ck_fail(r->err, r->path, "out of memory");
        memcpy(kv, key, klen);
        kv[klen] = 0;
        memcpy(kv + klen + 1, value, vlen);
        kv[(size_t)klen + 1 + vlen] = 0;
        int rc = ck_index_add_meta(r->ix, kv, kv + klen + 1, r->err);
        free(kv);
        if (rc)
            return -1;
    }
    return 0;
}

/* The blob table. Its layout is fixed by the blobs' lengths: each blob at the first multiple
 * of 256 at or after the end of the one before (the first at 0), the region ending at the next
 * multiple of 4096 after the last. Checking the exact places, not only order and overlap, is
 * what lets a reader use the table as it stands. */
static int read_blobs(pack_reader *r)
{
    uint64_t end = 0, empty = UINT64_MAX; /* the last blob's end; the empty blob, if any */
    /* The counts were sized with 8 bytes a metadata pair: longer strings may have left less. */
    if (need(r, MIN_BLOB * r->nblobs, "pack index", "the blob table"))
        return -1;
    r->table_at = r->c.pos;
    for (uint64_t i = 0; i < r->nblobs; i++) {
        ull at = file_at(r, r->c.pos);
        uint64_t off = take_u64(r), len = take_u64(r);
        /* end lies inside the region, whose end fits in 64 bits and is a multiple of 4096. */
        uint64_t want = ck_align_up(end, PACK_BLOB_ALIGN);
        if (off != want && i == 0)
            return ck_fail(r->err, r->path, "pack blob 0: offset %llu, but the first blob "
                           "starts at 0 (byte %llu)", (ull)off, at);
        if (off != want)
            return ck_fail(r->err, r->path, "pack blob %llu: offset %llu, but blob %llu ends "
                           "at %llu, so this one starts at %llu, the next multiple of %u "
                           "(byte %llu)", (ull)i, (ull)off, (ull)(i - 1), (ull)end, (ull)want,
                           PACK_BLOB_ALIGN, at);
        if (__builtin_add_overflow(off, len, &end))
            return ck_fail(r->err, r->path, "pack blob %llu: offset %llu + length %llu "
                           "overflows (byte %llu)", (ull)i, (ull)off, (ull)len, at);
        if (end > r->h->data_length)
            return ck_fail(r->err, r->path, "pack blob %llu: [%llu, %llu) lies outside the "
                           "%llu-byte data region (byte %llu)", (ull)i, (ull)off, (ull)end,
                           (ull)r->h->data_length, at);
        if (len == 0 && empty != UINT64_MAX)
            return ck_fail(r->err, r->path, "pack blob %llu: a second empty blob, after blob "
                           "%llu: all empty tensors share one (byte %llu)", (ull)i, (ull)empty,
                           at);
        if (len == 0)
            empty = i;
        r->blobs[i] = (pack_blob){.offset = r->h->data_offset + off, .length = len};
    }
    uint64_t want = ck_align_up(end, PACK_REGION_ALIGN);
    if (r->h->data_length != want)
        return ck_fail(r->err, r->path, "pack header: data_length %llu, but the last blob ends "
                       "at %llu, so the data region is %llu bytes (bytes 40-47)",
                       (ull)r->h->data_length, (ull)end, (ull)want);
    return 0;
}

/* Blob numbers are the order of first use: the k-th blob a tensor names for the first time is
 * blob k. So the table's order, the data's order and the index's order are one. */
static int name_blob(pack_reader *r, const char *whom, uint64_t blob, uint64_t entry,
                     uint64_t blob_at)
{
    if (blob > r->named)
        return ck_fail(r->err, r->path, "%s: names blob %llu before any entry names blob %u: "
                       "blobs are numbered in the order their first tensor appears (byte %llu)",
                       whom, (ull)blob, r->named, file_at(r, blob_at));
    if (blob == r->named)
        r->blob_entry[r->named++] = (uint32_t)entry;
    r->entry_blob[entry] = (uint32_t)blob;
    return 0;
}

static int read_tensor(pack_reader *r, const char *whom, uint64_t entry, uint8_t dtype,
                       uint8_t rank, const unsigned char *name, uint32_t name_len,
                       uint64_t type_at)
{
    if (dtype >= CK_DTYPE_COUNT)
        return ck_fail(r->err, r->path, "%s: unknown dtype code %u (byte %llu)", whom, dtype,
                       file_at(r, type_at));
    if (rank > CK_MAX_RANK)
        return ck_fail(r->err, r->path, "%s: rank %u exceeds %d (byte %llu)", whom, rank,
                       CK_MAX_RANK, file_at(r, type_at + 1));
    if (need(r, 8 * (uint64_t)rank + 8, whom, "the dims and blob"))
        return -1;
    uint64_t dims_at = r->c.pos;
    int64_t dims[CK_MAX_RANK];
    for (unsigned d = 0; d < rank; d++) {
        uint64_t v = take_u64(r);
        dims[d] = (int64_t)v;
        if (dims[d] < 0)
            return ck_fail(r->err, r->path, "%s: dim %u is negative (%lld) (byte %llu)", whom,
                           d, (long long)dims[d], file_at(r, r->c.pos - 8));
    }
    uint64_t blob_at = r->c.pos, blob = take_u64(r), nbytes;
    const char *dt = ck_dtype_name((enum ck_dtype)dtype);
    if (ck_tensor_nbytes(rank, dims, (enum ck_dtype)dtype, &nbytes))
        return ck_fail(r->err, r->path, "%s: shape × %s overflows or is not a whole number of "
                       "bytes (byte %llu)", whom, dt, file_at(r, dims_at));
    if (blob >= r->nblobs)
        return ck_fail(r->err, r->path, "%s: blob %llu does not exist, the index has %llu "
                       "(byte %llu)", whom, (ull)blob, (ull)r->nblobs, file_at(r, blob_at));
    const pack_blob *b = &r->blobs[blob];
    if (nbytes != b->length)
        return ck_fail(r->err, r->path, "%s: shape × %s needs %llu bytes, but blob %llu holds "
                       "%llu (byte %llu)", whom, dt, (ull)nbytes, (ull)blob, (ull)b->length,
                       file_at(r, blob_at));
    if (name_blob(r, whom, blob, entry, blob_at))
        return -1;
    ck_entry *e = ck_index_add_entry(r->ix, (const char *)name, name_len, CK_CONTIGUOUS, rank,
                                     dims, r->err);
    if (!e)
        return -1;
    e->dtype = dtype;
    e->nbytes = b->length;
    e->ext = (ck_extent){.offset = b->offset, .length = b->length, .file = r->file};
    return 0;
}

static int read_value(pack_reader *r, const char *whom, uint64_t entry, uint8_t type,
                      uint8_t rank, const unsigned char *name, uint32_t name_len,
                      uint64_t type_at)
{
    if (type >= CK_VAL_TYPE_COUNT)
        return ck_fail(r->err, r->path, "%s: unknown value code %u (byte %llu)", whom, type,
                       file_at(r, type_at));
    if (rank != 0)
        return ck_fail(r->err, r->path, "%s: a value has rank 0, not %u (byte %llu)", whom,
                       rank, file_at(r, type_at + 1));
    const unsigned char *text;
    uint32_t len;
    /* The text is any bytes: a bytes value's are raw. */
    if (take_string(r, whom, "text", &text, &len))
        return -1;
    r->entry_blob[entry] = UINT32_MAX;
    return ck_index_add_value(r->ix, (const char *)name, name_len, (enum ck_value_type)type,
                              (const char *)text, len, r->err) ? 0 : -1;
}

/* Entries are in strictly increasing natural name order (ck_natural_cmp, which says 0 only for
 * equal names): so names are unique, and a duplicate is always the entry right after. */
static int check_order(pack_reader *r, const char *whom, uint64_t i, const unsigned char *name,
                       uint32_t len, uint64_t at)
{
    if (i == 0)
        return 0;
    int c = ck_natural_cmp((const char *)r->prev_name, r->prev_len, (const char *)name, len);
    int cut = shown(name, len), prev_cut = shown(r->prev_name, r->prev_len);
    if (c == 0)
        return ck_fail(r->err, r->path, "pack entry %llu: duplicate name '%.*s%s', as entry "
                       "%llu (bytes %llu and %llu)", (ull)i, cut, (const char *)name,
                       (uint32_t)cut < len ? "..." : "", (ull)(i - 1), (ull)at,
                       (ull)r->prev_at);
    if (c > 0)
        return ck_fail(r->err, r->path, "%s: sorts before entry %llu ('%.*s%s'): entries are "
                       "in natural name order (byte %llu)", whom,
                       (ull)(i - 1), prev_cut, (const char *)r->prev_name,
                       (uint32_t)prev_cut < r->prev_len ? "..." : "", (ull)at);
    return 0;
}

static int read_entry(pack_reader *r, uint64_t i)
{
    char whom[64 + 4 * NAME_SHOWN];
    snprintf(whom, sizeof whom, "pack entry %llu", (ull)i);
    uint64_t start = r->c.pos;
    const unsigned char *name;
    uint32_t name_len;
    if (take_string(r, whom, "name", &name, &name_len) ||
        check_text(r, name, name_len, whom, "name"))
        return -1;
    /* The one entry of a checkpoint that is a single object has the empty name. */
    if (name_len == 0 && r->nentries != 1)
        return ck_fail(r->err, r->path, "%s: empty name, allowed only for the one entry of a "
                       "pack with one entry (byte %llu)", whom, file_at(r, start));
    int cut = shown(name, name_len);
    snprintf(whom, sizeof whom, "pack entry %llu ('%.*s%s')", (ull)i, cut, (const char *)name,
             (uint32_t)cut < name_len ? "..." : "");
    if (check_order(r, whom, i, name, name_len, file_at(r, start)))
        return -1;
    r->prev_name = name;
    r->prev_len = name_len;
    r->prev_at = file_at(r, start);
    uint64_t kind_at = r->c.pos;
    const unsigned char *k = ck_take(&r->c, 4);
    if (!k)
        return need(r, 4, whom, "the kind, type, rank and reserved bytes");
    if (k[3] != 0)
        return ck_fail(r->err, r->path, "%s: reserved byte is 0x%02x, not 0 (byte %llu)", whom,
                       k[3], file_at(r, kind_at + 3));
    switch (k[0]) {
    case CK_TENSOR:
        return read_tensor(r, whom, i, k[1], k[2], name, name_len, kind_at + 1);
    case CK_VALUE:
        return read_value(r, whom, i, k[1], k[2], name, name_len, kind_at + 1);
    default:
        return ck_fail(r->err, r->path, "%s: unknown kind %u (byte %llu)", whom, k[0],
                       file_at(r, kind_at));
    }
}

/* The counts, sized against the index before anything is allocated for them. */
static int read_counts(pack_reader *r, uint32_t *nmeta)
{
    if (need(r, COUNTS_SIZE, "pack index", "the counts"))
        return -1;
    r->nentries = take_u64(r);
    r->nblobs = take_u64(r);
    *nmeta = take_u32(r);
    uint32_t reserved = take_u32(r);
    if (reserved != 0)
        return ck_fail(r->err, r->path, "pack index: reserved field is 0x%x, not 0 (byte %llu)",
                       reserved, file_at(r, 20));
    /* Each count alone first, so that the sum cannot overflow. */
    uint64_t room = r->c.len - COUNTS_SIZE;
    if (r->nentries > room / MIN_ENTRY || r->nblobs > room / MIN_BLOB ||
        *nmeta > room / MIN_META ||
        MIN_ENTRY * r->nentries + MIN_BLOB * r->nblobs + MIN_META * (uint64_t)*nmeta > room)
        return ck_fail(r->err, r->path, "pack index: %llu entries, %llu blobs and %u metadata "
                       "pairs need more than the %llu bytes after the counts (at least %u, %u "
                       "and %u bytes each) (byte %llu)", (ull)r->nentries, (ull)r->nblobs,
                       *nmeta, (ull)room, MIN_ENTRY, MIN_BLOB, MIN_META, file_at(r, 0));
    return 0;
}

/* The layout and its arrays, in the index's arena: they live as long as the index. The counts
 * are bounded by the index size (at most 2^30 bytes), so they fit in 32 bits. */
static int alloc_layout(pack_reader *r)
{
    size_t head = ck_align_up(sizeof *r->layout, 16), blobs = sizeof *r->blobs * r->nblobs;
    size_t n = head + blobs + 4 * (size_t)r->nentries + 4 * (size_t)r->nblobs;
    unsigned char *m = ck_index_alloc(r->ix, n);
    if (!m)
        return ck_fail(r->err, r->path, "out of memory");
    r->layout = (pack_layout *)m;
    r->blobs = (pack_blob *)(m + head);
    r->entry_blob = (uint32_t *)(m + head + blobs);
    r->blob_entry = r->entry_blob + r->nentries;
    *r->layout = (pack_layout){.header = *r->h, .file = r->file,
                               .nblobs = (uint32_t)r->nblobs,
                               .nentries = (uint32_t)r->nentries,
                               .first_entry = r->ix->nentries, .blobs = r->blobs,
                               .entry_blob = r->entry_blob, .blob_entry = r->blob_entry};
    return 0;
}

static int parse_index(pack_reader *r, uint64_t file_size)
{
    uint32_t nmeta;
    if (read_counts(r, &nmeta))
        return -1;
    /* nblobs is bounded by the index size, and checksum_offset by the file size. */
    uint64_t want = r->h->checksum_offset + 8 * r->nblobs + 8;
    if (file_size != want)
        return ck_fail(r->err, r->path, "file is %llu bytes, but its checksum trailer (8 × "
                       "%llu blobs + 8 bytes at byte %llu) ends at byte %llu", (ull)file_size,
                       (ull)r->nblobs, (ull)r->h->checksum_offset, (ull)want);
    if (alloc_layout(r) || read_meta(r, nmeta) || read_blobs(r))
        return -1;
    for (uint64_t i = 0; i < r->nentries; i++)
        if (read_entry(r, i))
            return -1;
    if (ck_cursor_left(&r->c))
        return ck_fail(r->err, r->path, "pack index: %llu bytes left over after the last entry "
                       "(byte %llu)", (ull)ck_cursor_left(&r->c), file_at(r, r->c.pos));
    /* Named in order, so the first unused blob is the one after the last named. */
    if (r->named < r->nblobs)
        return ck_fail(r->err, r->path, "pack blob %u: no tensor names it (byte %llu)",
                       r->named, file_at(r, r->table_at + MIN_BLOB * (uint64_t)r->named));
    return 0;
}

int pack_read_file(ck_index *ix, uint32_t file, ck_error *err)
{
    const ck_file *f = &ix->files[file];
    unsigned char raw[PACK_HEADER_SIZE];
    pack_header h;
    if (f->size < PACK_HEADER_SIZE)
        return ck_fail(err, f->path, "file is %llu bytes, too short for a pack header (needs "
                       "%u)", (ull)f->size, PACK_HEADER_SIZE);
    int rc = ck_file_read(f, raw, sizeof raw, 0);
    if (rc)
        return ck_fail(err, f->path, "cannot read the pack header: %s", strerror(-rc));
    pack_header_decode(raw, &h);
    if (check_header(raw, &h, f->path, err))
        return -1;
    /* The exact size needs nblobs from the index; the trailer's last 8 bytes need no count,
     * and a cut file is named as such before its index is judged. */
    if (f->size < h.checksum_offset || f->size - h.checksum_offset < 8)
        return ck_fail(err, f->path, "file is %llu bytes, too short for a pack whose checksums "
                       "start at byte %llu (header bytes 48-55)", (ull)f->size,
                       (ull)h.checksum_offset);
    unsigned char *index = malloc(h.index_length ? (size_t)h.index_length : 1);
    if (!index)
        return ck_fail(err, f->path, "out of memory for a %llu-byte pack index",
                       (ull)h.index_length);
    rc = ck_file_read(f, index, (size_t)h.index_length, h.index_offset);
    pack_reader r = {.ix = ix, .file = file, .path = f->path, .h = &h,
                     .c = ck_cursor_make(index, (size_t)h.index_length, h.index_offset),
                     .err = err};
    if (rc) {
        rc = ck_fail(err, f->path, "cannot read the pack index: %s", strerror(-rc));
    } else {
        uint64_t sum = XXH3_64bits(index, (size_t)h.index_length);
        if (sum != h.index_xxh3)
            rc = ck_fail(err, f->path, "pack index: XXH3 is %016llx, the header says %016llx "
                         "(bytes 56-63)", (ull)sum, (ull)h.index_xxh3);
        else
            rc = parse_index(&r, f->size);
    }
    free(index);
    if (rc == 0) {
        ix->pack = r.layout;
        ix->pack_file = file;
    }
    return rc;
}

const pack_layout *pack_layout_of(const ck_index *ix, uint32_t file)
{
    return ix->pack && file == ix->pack_file ? ix->pack : NULL;
}
