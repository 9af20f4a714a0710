/* zip.c — the central directory of a zip archive (PKZIP APPNOTE 6.3); see zip.h.
 *
 * Order of work: find the end-of-central-directory record (and the ZIP64 one it may point to),
 * read the whole central directory in one pread, parse every header, then fetch the local
 * headers (30 bytes each) in a few large reads for the data offsets, then hash the names. Every
 * number the archive gives is checked against the bytes that are really there before it is used.
 * Deflated entries (last section) are decoded on request only: one checking pass that keeps seek
 * points, then reads from the nearest point.
 */
#include "zip.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <zlib.h>

#include "../base/bytes.h"
#include "../base/cursor.h"
#include "../sources/source.h" /* ck_pread */
#include "../base/seed.h"

#define SIG_LOCAL 0x04034b50u   /* local file header */
#define SIG_CENTRAL 0x02014b50u /* central directory header */
#define SIG_END 0x06054b50u     /* end of central directory record */
#define SIG_END64 0x06064b50u   /* zip64 end of central directory record */
#define SIG_LOC64 0x07064b50u   /* zip64 end of central directory locator */

enum {
    LOCAL_LEN = 30,
    CENTRAL_LEN = 46,
    CENTRAL_MAX = CENTRAL_LEN + 3 * 0xFFFF, /* with the longest name, extra field and comment */
    END_LEN = 22,
    END64_LEN = 56, /* up to and including the central directory offset */
    LOC64_LEN = 20,
    MAX_COMMENT = 65535,
    END_PROBE = 512, /* the tail searched first for the end record */
    EXTRA_ZIP64 = 0x0001,
    FLAG_ENCRYPTED = 0x0001,
    NAME_SHOWN = 200, /* at most this many bytes of an entry name go into a message */
};

typedef unsigned long long ull;

/* An entry's name as a message quotes it: "%.*s" with these two arguments. */
#define SHOWN(e) (int)((e)->name_len < NAME_SHOWN ? (e)->name_len : NAME_SHOWN), (e)->name

int zip_probe(const unsigned char *head, size_t n)
{
    /* A checkpoint always holds entries, so an empty archive ("PK\5\6" first) is not one. */
    return n >= 4 && get_le32(head) == SIG_LOCAL;
}

const char *zip_first_name(const unsigned char *head, size_t n, size_t *len)
{
    if (!zip_probe(head, n) || n < LOCAL_LEN)
        return NULL;
    *len = get_le16(head + 26);
    return n - LOCAL_LEN >= *len ? (const char *)head + LOCAL_LEN : NULL;
}

/* --- the end of the archive ------------------------------------------------------------ */

/* Where the central directory is, as the end record(s) say. */
typedef struct zip_end {
    uint64_t count;     /* entries */
    uint64_t cd_offset; /* first byte of the central directory */
    uint64_t cd_size;   /* its bytes */
    uint64_t limit;     /* the central directory must end by here: the first end record */
} zip_end;

/* The last end-of-central-directory record in tail[0..n) whose comment length reaches exactly
 * its end: its index, or n; *liar the last record whose comment length is wrong, or n. */
static size_t last_end_record(const unsigned char *tail, size_t n, size_t *liar)
{
    *liar = n;
    for (size_t i = n - END_LEN + 1; i-- > 0;) {
        if (get_le32(tail + i) != SIG_END)
            continue;
        if (i + END_LEN + get_le16(tail + i + 20) == n)
            return i;
        if (*liar == n)
            *liar = i;
    }
    return n;
}

/* Finds the end-of-central-directory record: its offset in *at, its 22 bytes in rec. It ends
 * the file but for its comment (up to 65535 bytes), so the search is over the last 65557 bytes,
 * backwards, and a record only counts when its comment length reaches exactly the end of the
 * file: a comment may itself hold "PK\5\6". Archives rarely have a comment (torch.save's
 * never do), so the last END_PROBE bytes are searched first: a record found there is the one
 * the whole search finds (the last), and many small archives in one file (a DCP checkpoint's
 * chunks) are not each read 64 KiB deep. */
static int find_end(const ck_file *f, uint64_t file_size, const char *path, uint64_t *at,
                    unsigned char rec[END_LEN], ck_error *err)
{
    if (file_size < END_LEN)
        return ck_fail(err, path, "file is %llu bytes, too short for a zip archive (needs %d)",
                       (ull)file_size, END_LEN);
    size_t deepest = file_size < END_LEN + MAX_COMMENT ? (size_t)file_size
                                                        : END_LEN + MAX_COMMENT;
    unsigned char *tail = malloc(deepest);
    if (!tail)
        return ck_fail(err, path, "out of memory");
    size_t n = deepest < END_PROBE ? deepest : END_PROBE, found, liar;
    int rc;
    for (;;) {
        rc = ck_file_read(f, tail, n, file_size - n);
        if (rc) {
            free(tail);
            return ck_fail(err, path, "cannot read the last %zu bytes: %s", n, strerror(-rc));
        }
        found = last_end_record(tail, n, &liar);
        if (found < n || n == deepest)
            break;
        n = deepest;
    }
    uint64_t base = file_size - n;
    if (found < n) {
        *at = base + found;
        memcpy(rec, tail + found, END_LEN);
        rc = 0;
    } else if (liar < n) {
        rc = ck_fail(err, path, "end-of-central-directory record says its comment is %u bytes, "
                     "but %zu bytes follow it: truncated, or data after the archive (offset "
                     "%llu)", get_le16(tail + liar + 20), n - liar - END_LEN,
                     (ull)(base + liar));
    } else {
        rc = ck_fail(err, path, "no end-of-central-directory record in the last %zu bytes: not "
                     "a zip archive, or truncated", n);
    }
    free(tail);
    return rc;
}

static int multi_disk(const char *path, const char *record, ull at, ck_error *err)
{
    return ck_fail(err, path, "%s says the archive spans several disks; multi-disk (split) "
                   "archives are not supported (offset %llu)", record, at);
}

/* Reads the zip64 end-of-central-directory record that the locator (loc, at offset loc_at)
 * points to, and takes the counts, size and offset from it. The 32-bit fields of the plain
 * record (rec) must either say 0xFFFF(FFFF), "see zip64", or agree with it. */
static int read_end64(const ck_file *f, const unsigned char *loc, uint64_t loc_at,
                      const unsigned char *rec, uint64_t rec_at, const char *path,
                      zip_end *end, ck_error *err)
{
    uint64_t at = get_le64(loc + 8);
    /* Writers put 1 in the locator's disk total; some put 0. */
    if (get_le32(loc + 4) != 0 || get_le32(loc + 16) > 1)
        return multi_disk(path, "zip64 end-of-central-directory locator", loc_at, err);
    if (at > loc_at || loc_at - at < END64_LEN)
        return ck_fail(err, path, "zip64 end-of-central-directory locator points to offset "
                       "%llu, but the %d-byte record must lie before the locator at offset "
                       "%llu", (ull)at, END64_LEN, (ull)loc_at);
    unsigned char r[END64_LEN];
    int rc = ck_file_read(f, r, sizeof r, at);
    if (rc)
        return ck_fail(err, path, "cannot read the zip64 end-of-central-directory record: %s "
                       "(offset %llu)", strerror(-rc), (ull)at);
    if (get_le32(r) != SIG_END64)
        return ck_fail(err, path, "no zip64 end-of-central-directory record where the locator "
                       "at offset %llu points (offset %llu)", (ull)loc_at, (ull)at);
    /* The record size counts the bytes after its own 12; extensible data may follow. */
    uint64_t rsize = get_le64(r + 4);
    if (rsize < END64_LEN - 12 || rsize > loc_at - at - 12)
        return ck_fail(err, path, "zip64 end-of-central-directory record says it is %llu bytes "
                       "after its first 12; it needs %d and has %llu before the locator "
                       "(offset %llu)", (ull)rsize, END64_LEN - 12, (ull)(loc_at - at - 12),
                       (ull)at);
    if (get_le32(r + 16) != 0 || get_le32(r + 20) != 0)
        return multi_disk(path, "zip64 end-of-central-directory record", at, err);
    uint64_t on_disk = get_le64(r + 24);
    end->count = get_le64(r + 32);
    end->cd_size = get_le64(r + 40);
    end->cd_offset = get_le64(r + 48);
    end->limit = at;
    if (on_disk != end->count)
        return ck_fail(err, path, "zip64 end-of-central-directory record counts %llu entries "
                       "on this disk but %llu in all (offset %llu)", (ull)on_disk,
                       (ull)end->count, (ull)at);
    if ((get_le16(rec + 8) != 0xFFFF && get_le16(rec + 8) != end->count) ||
        (get_le16(rec + 10) != 0xFFFF && get_le16(rec + 10) != end->count) ||
        (get_le32(rec + 12) != 0xFFFFFFFF && get_le32(rec + 12) != end->cd_size) ||
        (get_le32(rec + 16) != 0xFFFFFFFF && get_le32(rec + 16) != end->cd_offset))
        return ck_fail(err, path, "end-of-central-directory record (%u entries, central "
                       "directory of %u bytes at offset %u) disagrees with the zip64 record "
                       "(%llu entries, %llu bytes at offset %llu) (offset %llu)",
                       get_le16(rec + 10), get_le32(rec + 12), get_le32(rec + 16), (ull)end->count,
                       (ull)end->cd_size, (ull)end->cd_offset, (ull)rec_at);
    return 0;
}

/* Reads the end record(s) and checks that the central directory they describe can be there. */
static int read_end(const ck_file *f, uint64_t file_size, const char *path, zip_end *end,
                    ck_error *err)
{
    unsigned char rec[END_LEN] = {0}, loc[LOC64_LEN];
    uint64_t at = 0;
    if (find_end(f, file_size, path, &at, rec, err))
        return -1;
    if (get_le16(rec + 4) != 0 || get_le16(rec + 6) != 0)
        return multi_disk(path, "end-of-central-directory record", at, err);
    int has_loc = 0;
    if (at >= LOC64_LEN) {
        int rc = ck_file_read(f, loc, sizeof loc, at - LOC64_LEN);
        if (rc)
            return ck_fail(err, path, "cannot read before the end-of-central-directory record: "
                           "%s (offset %llu)", strerror(-rc), (ull)(at - LOC64_LEN));
        has_loc = get_le32(loc) == SIG_LOC64;
    }
    if (has_loc) {
        if (read_end64(f, loc, at - LOC64_LEN, rec, at, path, end, err))
            return -1;
    } else {
        /* 0xFFFF entries may be the true count (Python writes up to 65535 entries without
         * zip64); a size or offset of 0xFFFFFFFF with no zip64 record cannot be trusted. */
        if (get_le32(rec + 12) == 0xFFFFFFFF || get_le32(rec + 16) == 0xFFFFFFFF)
            return ck_fail(err, path, "end-of-central-directory record defers to a zip64 record, "
                           "but no zip64 end-of-central-directory locator precedes it (offset "
                           "%llu)", (ull)at);
        if (get_le16(rec + 8) != get_le16(rec + 10))
            return ck_fail(err, path, "end-of-central-directory record counts %u entries on "
                           "this disk but %u in all (offset %llu)", get_le16(rec + 8),
                           get_le16(rec + 10), (ull)at);
        end->count = get_le16(rec + 10);
        end->cd_size = get_le32(rec + 12);
        end->cd_offset = get_le32(rec + 16);
        end->limit = at;
    }
    if (end->count > ZIP_MAX_ENTRIES)
        return ck_fail(err, path, "archive claims %llu entries, more than the limit of %u "
                       "(offset %llu)", (ull)end->count, ZIP_MAX_ENTRIES, (ull)end->limit);
    if (end->cd_offset > end->limit || end->cd_size > end->limit - end->cd_offset)
        return ck_fail(err, path, "central directory (%llu bytes at offset %llu) runs past the "
                       "end record at offset %llu", (ull)end->cd_size, (ull)end->cd_offset,
                       (ull)end->limit);
    if (end->cd_size / CENTRAL_LEN < end->count)
        return ck_fail(err, path, "central directory of %llu bytes is too small for %llu "
                       "entries of at least %d bytes each (offset %llu)", (ull)end->cd_size,
                       (ull)end->count, CENTRAL_LEN, (ull)end->cd_offset);
    /* It is read whole into memory: a size the headers could never fill is a lie, not a
     * reason to allocate gigabytes. (count <= ZIP_MAX_ENTRIES: the product fits.) */
    if (end->cd_size > end->count * CENTRAL_MAX || end->cd_size > SIZE_MAX / 2)
        return ck_fail(err, path, "central directory of %llu bytes is too large for %llu "
                       "entries of at most %d bytes each (offset %llu)", (ull)end->cd_size,
                       (ull)end->count, CENTRAL_MAX, (ull)end->cd_offset);
    return 0;
}

/* --- the central directory ------------------------------------------------------------- */

/* The 64-bit values in a zip64 extra field (x): one for each of the 32-bit fields that reads
 * 0xFFFFFFFF (0xFFFF for the disk), in this order, and nothing for the others. Bytes past
 * those are ignored, as Python's zipfile does. */
static int apply_zip64(ck_cursor *x, uint64_t *size, uint64_t *csize, uint64_t *local,
                       uint32_t *disk)
{
    uint64_t *field[3] = {size, csize, local};
    for (int i = 0; i < 3; i++)
        if (*field[i] == 0xFFFFFFFF && ck_take_u64(x, field[i]))
            return -1;
    return *disk == 0xFFFF ? ck_take_u32(x, disk) : 0;
}

/* How many bytes a zip64 extra field must hold for these 32-bit fields. */
static unsigned zip64_need(uint64_t size, uint64_t csize, uint64_t local, uint32_t disk)
{
    return 8 * ((size == 0xFFFFFFFF) + (csize == 0xFFFFFFFF) + (local == 0xFFFFFFFF)) +
           4 * (disk == 0xFFFF);
}

/* Parses the central directory header at the cursor c over cd (entry i), leaving the local
 * header offset in e->data_offset until the local header is read, and moves the name down to
 * cd + *names (the caller points e->name there once the buffer has shrunk to the names): each
 * header is at least 46 bytes and each name takes its length + 1, so names packed from the
 * start of the buffer never overtake the header being read. */
static int parse_central(unsigned char *cd, ck_cursor *c, size_t *names, size_t i, zip_entry *e,
                         const char *path, ck_error *err)
{
    size_t left = ck_cursor_left(c);
    ull at = (ull)ck_cursor_at(c);
    const unsigned char *h = ck_take(c, CENTRAL_LEN);
    if (!h)
        return ck_fail(err, path, "central directory entry %zu is truncated: %zu bytes left of "
                       "the %d it needs (offset %llu)", i, left, CENTRAL_LEN, at);
    if (get_le32(h) != SIG_CENTRAL)
        return ck_fail(err, path, "central directory entry %zu has signature 0x%08x, not "
                       "0x%08x (offset %llu)", i, get_le32(h), SIG_CENTRAL, at);
    size_t nlen = get_le16(h + 28), xlen = get_le16(h + 30), clen = get_le16(h + 32);
    const unsigned char *n;
    ck_cursor x;
    if (!(n = ck_take(c, nlen)) || ck_take_cursor(c, xlen, &x) || !ck_take(c, clen))
        return ck_fail(err, path, "central directory entry %zu: name, extra field and comment "
                       "(%zu + %zu + %zu bytes) run past the end of the central directory "
                       "(offset %llu)", i, nlen, xlen, clen, at);
    const char *name = (const char *)n;
    int shown = (int)(nlen < NAME_SHOWN ? nlen : NAME_SHOWN);
    if (memchr(name, 0, nlen))
        return ck_fail(err, path, "central directory entry %zu: name '%.*s' holds a NUL byte "
                       "(offset %llu)", i, shown, name, at);
    uint16_t flags = get_le16(h + 8);
    if (flags & FLAG_ENCRYPTED)
        return ck_fail(err, path, "entry '%.*s' is encrypted, which is not supported (central "
                       "directory entry %zu at offset %llu)", shown, name, i, at);
    uint64_t csize = get_le32(h + 20), size = get_le32(h + 24), local = get_le32(h + 42);
    uint32_t disk = get_le16(h + 34);
    /* Extra fields: 2-byte id, 2-byte length, data. Fewer than 4 bytes left over are
     * ignored, as Python's zipfile and Go's archive/zip do. */
    int zip64_seen = 0;
    for (const unsigned char *f; (f = ck_take(&x, 4));) {
        size_t id = get_le16(f), len = get_le16(f + 2);
        ck_cursor data;
        if (ck_take_cursor(&x, len, &data))
            return ck_fail(err, path, "entry '%.*s': extra field 0x%04zx of %zu bytes runs %zu "
                           "bytes past the end of its header (central directory entry %zu at "
                           "offset %llu)", shown, name, id, len, len - ck_cursor_left(&x), i,
                           at);
        if (id == EXTRA_ZIP64) {
            if (zip64_seen++)
                return ck_fail(err, path, "entry '%.*s' has two zip64 extra fields (central "
                               "directory entry %zu at offset %llu)", shown, name, i, at);
            unsigned need = zip64_need(size, csize, local, disk);
            if (apply_zip64(&data, &size, &csize, &local, &disk))
                return ck_fail(err, path, "entry '%.*s': zip64 extra field is %zu bytes, the "
                               "fields it replaces need %u (central directory entry %zu at "
                               "offset %llu)", shown, name, len, need, i, at);
        }
    }
    if (disk != 0)
        return ck_fail(err, path, "entry '%.*s' starts on disk %u; multi-disk (split) archives "
                       "are not supported (central directory entry %zu at offset %llu)", shown,
                       name, (unsigned)disk, i, at);
    uint16_t method = get_le16(h + 10);
    if (method == 0 && size != csize)
        return ck_fail(err, path, "entry '%.*s' is stored (not compressed) but its sizes "
                       "differ: %llu bytes, %llu in the archive (central directory entry %zu at "
                       "offset %llu)", shown, name, (ull)size, (ull)csize, i, at);
    *e = (zip_entry){.name_len = (uint32_t)nlen, .method = method, .flags = flags,
                     .crc = get_le32(h + 16), .data_offset = local, .size = size, .csize = csize};
    memmove(cd + *names, name, nlen);
    cd[*names + nlen] = 0;
    *names += nlen + 1;
    return 0;
}

/* Parses all end->count headers of the central directory cd, which must hold nothing else. */
static int parse_directory(unsigned char *cd, const zip_end *end, zip_archive *z,
                           const char *path, ck_error *err)
{
    ck_cursor c = ck_cursor_make(cd, (size_t)end->cd_size, end->cd_offset);
    size_t names = 0;
    for (size_t i = 0; i < z->nentries; i++)
        if (parse_central(cd, &c, &names, i, &z->entries[i], path, err))
            return -1;
    if (ck_cursor_left(&c))
        return ck_fail(err, path, "central directory holds %llu bytes after its %zu entries: "
                       "the end record's count or size is wrong (offset %llu)",
                       (ull)ck_cursor_left(&c), z->nentries, (ull)ck_cursor_at(&c));
    return 0;
}

/* --- local headers --------------------------------------------------------------------- */

/* Local headers lying at most LOCAL_GAP bytes apart are fetched together, in reads of at most
 * LOCAL_WINDOW bytes: a checkpoint of many small tensors has its headers a few dozen bytes
 * apart, and one pread each would cost more than the rest of reading the directory. A gap of a
 * page or less costs a read no more than the page it shares with a header would; the tensor
 * data between headers further apart is never read. */
enum { LOCAL_GAP = 4096, LOCAL_WINDOW = 64 << 10 };

/* The fields of a local header that read_local checks and uses. */
typedef struct local_head {
    uint32_t sig;
    uint16_t name_len, extra_len;
    uint8_t got;         /* 0: not fetched in a batch; read_local reads it alone */
} local_head;

static local_head decode_local(const unsigned char *h)
{
    return (local_head){.sig = get_le32(h), .name_len = get_le16(h + 26),
                        .extra_len = get_le16(h + 28), .got = 1};
}

/* Whether entry e's local header can be read at all: it must lie before the central directory
 * (read_local says so when it does not). */
static int local_in_bounds(const zip_entry *e, const zip_end *end)
{
    return e->data_offset <= end->cd_offset && end->cd_offset - e->data_offset >= LOCAL_LEN;
}

static int by_local(const void *x, const void *y, void *ctx)
{
    uint64_t a = ((const zip_entry *)ctx)[*(const uint32_t *)x].data_offset;
    uint64_t b = ((const zip_entry *)ctx)[*(const uint32_t *)y].data_offset;
    return (a > b) - (a < b);
}

/* Fetches the local headers of the entries in order[0..n) (indices sorted by local header
 * offset) in as few reads as LOCAL_GAP and LOCAL_WINDOW allow, into head[]. A batch whose read
 * fails is left unfetched: read_local then reads its headers one by one and reports the first
 * failure with its own entry and offset, as if there had been no batching. */
static void fetch_locals(const ck_file *f, const zip_entry *entries, const uint32_t *order,
                         size_t n, local_head *head, unsigned char *buf)
{
    for (size_t first = 0, last; first < n; first = last + 1) {
        uint64_t start = entries[order[first]].data_offset, stop = start + LOCAL_LEN;
        for (last = first; last + 1 < n; last++) {
            uint64_t next = entries[order[last + 1]].data_offset;
            if ((next > stop && next - stop > LOCAL_GAP) ||
                next + LOCAL_LEN - start > LOCAL_WINDOW)
                break;
            if (next + LOCAL_LEN > stop)
                stop = next + LOCAL_LEN;
        }
        if (ck_file_read(f, buf, (size_t)(stop - start), start) != 0)
            continue;
        for (size_t k = first; k <= last; k++)
            head[order[k]] = decode_local(buf + (entries[order[k]].data_offset - start));
    }
}

/* Fetches every readable local header in batches (see fetch_locals). order has room for one
 * index per entry and is only scratch here. Returns -1 when memory runs out. */
static int fetch_all_locals(const ck_file *f, const zip_archive *z, const zip_end *end,
                            uint32_t *order, local_head *head)
{
    size_t n = 0;
    int sorted = 1;
    for (size_t i = 0; i < z->nentries; i++) {
        if (!local_in_bounds(&z->entries[i], end))
            continue;
        sorted &= n == 0 || z->entries[order[n - 1]].data_offset <= z->entries[i].data_offset;
        order[n++] = (uint32_t)i;
    }
    if (!sorted) /* torch writes its records in order; another writer may not */
        qsort_r(order, n, sizeof *order, by_local, z->entries);
    unsigned char *buf = malloc(LOCAL_WINDOW);
    if (!buf)
        return -1;
    fetch_locals(f, z->entries, order, n, head, buf);
    free(buf);
    return 0;
}

/* Turns e->data_offset from the local header offset into the data offset: the local header's
 * own name and extra lengths count (torch pads its local extra field for alignment, which the
 * central directory does not repeat). The data must end by the central directory. h is the
 * header as fetched in a batch, or not fetched (then it is read here). */
static int read_local(const ck_file *f, const zip_end *end, size_t i, zip_entry *e, local_head h,
                      const char *path, ck_error *err)
{
    uint64_t local = e->data_offset, cd = end->cd_offset;
    if (!local_in_bounds(e, end))
        return ck_fail(err, path, "entry '%.*s': local header at offset %llu does not lie "
                       "before the central directory at offset %llu (central directory entry "
                       "%zu)", SHOWN(e), (ull)local, (ull)cd, i);
    if (!h.got) {
        unsigned char raw[LOCAL_LEN];
        int rc = ck_file_read(f, raw, sizeof raw, local);
        if (rc)
            return ck_fail(err, path, "entry '%.*s': cannot read the local header: %s (offset "
                           "%llu)", SHOWN(e), strerror(-rc), (ull)local);
        h = decode_local(raw);
    }
    if (h.sig != SIG_LOCAL)
        return ck_fail(err, path, "entry '%.*s': local header has signature 0x%08x, not 0x%08x "
                       "(offset %llu)", SHOWN(e), h.sig, SIG_LOCAL, (ull)local);
    if (h.name_len != e->name_len)
        return ck_fail(err, path, "entry '%.*s': local header names %u bytes, the central "
                       "directory %u (offset %llu)", SHOWN(e), h.name_len, e->name_len,
                       (ull)local);
    uint64_t data = local + LOCAL_LEN + h.name_len + h.extra_len;
    if (data > cd || e->csize > cd - data)
        return ck_fail(err, path, "entry '%.*s': data (%llu bytes at offset %llu) runs past the "
                       "central directory at offset %llu (local header at offset %llu)",
                       SHOWN(e), (ull)e->csize, (ull)data, (ull)cd, (ull)local);
    e->data_offset = data;
    return 0;
}

/* Every entry's data offset from its local header, checked in central directory order (the
 * first bad entry is the one reported, however the headers were fetched). */
static int read_locals(const ck_file *f, const zip_end *end, zip_archive *z, const char *path,
                       ck_error *err)
{
    local_head *head = calloc(z->nentries ? z->nentries : 1, sizeof *head);
    /* The slots are free until the names are hashed: they hold the fetch order meanwhile. */
    if (!head || fetch_all_locals(f, z, end, z->slots, head) != 0) {
        free(head);
        return ck_fail(err, path, "out of memory for the local headers of %zu entries",
                       z->nentries);
    }
    int rc = 0;
    for (size_t i = 0; i < z->nentries && rc == 0; i++)
        rc = read_local(f, end, i, &z->entries[i], head[i], path, err);
    free(head);
    return rc;
}

/* --- names ----------------------------------------------------------------------------- */

static uint32_t *name_slot(const zip_archive *z, const char *name, size_t len)
{
    size_t mask = z->nslots - 1;
    for (size_t i = XXH3_64bits_withSeed(name, len, z->seed) & mask;; i = (i + 1) & mask) {
        uint32_t k = z->slots[i];
        if (k == ZIP_NO_SLOT ||
            (z->entries[k].name_len == len && memcmp(z->entries[k].name, name, len) == 0))
            return &z->slots[i];
    }
}

static int hash_names(zip_archive *z, const char *path, ck_error *err)
{
    memset(z->slots, 0xff, z->nslots * sizeof *z->slots);
    for (size_t i = 0; i < z->nentries; i++) {
        const zip_entry *e = &z->entries[i];
        uint32_t *slot = name_slot(z, e->name, e->name_len);
        if (*slot != ZIP_NO_SLOT)
            return ck_fail(err, path, "duplicate entry name '%.*s' (central directory entries "
                           "%u and %zu)", SHOWN(e), *slot, i);
        *slot = (uint32_t)i;
    }
    return 0;
}

const zip_entry *zip_find(const zip_archive *z, const char *name, size_t len)
{
    if (z->nentries == 0)
        return NULL;
    uint32_t k = *name_slot(z, name, len);
    return k == ZIP_NO_SLOT ? NULL : &z->entries[k];
}

/* --- the whole ------------------------------------------------------------------------- */

int zip_read_directory(const ck_file *f, uint64_t file_size, const char *path, zip_archive *z,
                       ck_error *err)
{
    *z = (zip_archive){0};
    zip_end end = {0};
    if (read_end(f, file_size, path, &end, err))
        return -1;
    /* read_end bounded count by ZIP_MAX_ENTRIES and cd_size by the file size. */
    size_t n = (size_t)end.count;
    unsigned char *cd = malloc(end.cd_size ? (size_t)end.cd_size : 1);
    z->entries = malloc((n ? n : 1) * sizeof *z->entries);
    z->nslots = 4;
    while (z->nslots < n + n / 3 + 1) /* n <= ZIP_MAX_ENTRIES: no overflow */
        z->nslots *= 2;
    z->slots = malloc(z->nslots * sizeof *z->slots);
    z->seed = ck_hash_seed();
    z->nentries = n;
    if (!cd || !z->entries || !z->slots) {
        ck_fail(err, path, "out of memory for a central directory of %llu bytes and %zu "
                "entries", (ull)end.cd_size, n);
        goto fail;
    }
    int rc = ck_file_read(f, cd, (size_t)end.cd_size, end.cd_offset);
    if (rc) {
        ck_fail(err, path, "cannot read the central directory: %s (offset %llu)", strerror(-rc),
                (ull)end.cd_offset);
        goto fail;
    }
    if (parse_directory(cd, &end, z, path, err))
        goto fail;
    /* The names alone stay, packed at the start of the buffer in entry order. */
    size_t used = 0;
    for (size_t i = 0; i < n; i++)
        used += z->entries[i].name_len + 1;
    unsigned char *shrunk = realloc(cd, used ? used : 1);
    z->names = (char *)(shrunk ? shrunk : cd);
    cd = NULL;
    for (size_t i = 0, at = 0; i < n; i++) {
        z->entries[i].name = z->names + at;
        at += z->entries[i].name_len + 1;
    }
    if (read_locals(f, &end, z, path, err))
        goto fail;
    if (hash_names(z, path, err))
        goto fail;
    return 0;
fail:
    free(cd);
    zip_free(z);
    return -1;
}

void zip_free(zip_archive *z)
{
    free(z->entries);
    free(z->names);
    free(z->slots);
    *z = (zip_archive){0};
}

/* --- deflated entries ------------------------------------------------------------------ */

enum { IN_CHUNK = 64 << 10 }; /* compressed bytes per pread */

/* The compressed input of one entry, fed to a z_stream in IN_CHUNK preads, never past the
 * entry's compressed size. */
typedef struct zin {
    const ck_file *f;
    const zip_inflated *zi;
    uint64_t next;         /* compressed bytes of the entry read so far */
    unsigned char buf[IN_CHUNK];
} zin;

/* Refills s from in when it has run dry. 0; 1 when it has and the entry's bytes are all
 * consumed; -errno. */
static int feed(z_stream *s, zin *in)
{
    if (s->avail_in)
        return 0;
    uint64_t left = in->zi->csize - in->next;
    if (left == 0)
        return 1;
    size_t n = left < IN_CHUNK ? (size_t)left : IN_CHUNK;
    int rc = ck_file_read(in->f, in->buf, n, in->zi->data_offset + in->next);
    if (rc)
        return rc;
    in->next += n;
    s->next_in = in->buf;
    s->avail_in = (uInt)n;
    return 0;
}

int zip_inflate_open(const zip_entry *e, uint64_t span, zip_inflated *zi, const char *path,
                     ck_error *err)
{
    *zi = (zip_inflated){0};
    uint64_t most;
    if (!__builtin_mul_overflow(e->csize, (uint64_t)ZIP_MAX_RATIO, &most) && e->size > most)
        return ck_fail(err, path, "entry '%s' declares %llu bytes from %llu compressed, more "
                       "than deflate can produce (%u to 1): a zip bomb, or a lie (offset %llu)",
                       e->name, (ull)e->size, (ull)e->csize, ZIP_MAX_RATIO,
                       (ull)e->data_offset);
    zip_point *start = calloc(1, sizeof *start);
    if (!start)
        return ck_fail(err, path, "entry '%s': out of memory to inflate it", e->name);
    *zi = (zip_inflated){.data_offset = e->data_offset, .csize = e->csize, .size = e->size,
                         .crc = e->crc, .span = span ? span : 1, .points = start, .npoints = 1,
                         .cap = 1};
    pthread_mutex_init(&zi->lock, NULL);
    return 0;
}

void zip_inflate_close(zip_inflated *zi)
{
    if (!zi->points)
        return;
    for (size_t i = 0; i < zi->npoints; i++)
        free((void *)zi->points[i].window);
    free(zi->points);
    pthread_mutex_destroy(&zi->lock);
    *zi = (zip_inflated){0};
}

const char *zip_inflate_fault(zip_inflated *zi)
{
    pthread_mutex_lock(&zi->lock);
    const char *fault = zi->fault;
    pthread_mutex_unlock(&zi->lock);
    return fault;
}

/* The last seek point at or before output offset off. Under zi->lock. */
static const zip_point *point_before(const zip_inflated *zi, uint64_t off)
{
    size_t lo = 0, hi = zi->npoints; /* points[0].out == 0 <= off */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (zi->points[mid].out <= off)
            lo = mid;
        else
            hi = mid;
    }
    return &zi->points[lo];
}

/* A decoder of the entry zi describes, started at a seek point. In place: zlib's state points
 * back at s. */
typedef struct zip_cursor {
    z_stream s;
    zin *in;
    unsigned char *scratch; /* ZIP_WINDOW bytes: what is thrown away, or the pass's ring */
} zip_cursor;

static void cursor_close(zip_cursor *c)
{
    inflateEnd(&c->s);
    free(c->in);
    free(c->scratch);
}

/* Positions a new decoder at point p (a copy: the points may move): the partial byte's bits
 * primed, the window as dictionary. 0 (cursor_close then), or -errno with nothing held. */
static int cursor_open(zip_cursor *c, const ck_file *f, const zip_inflated *zi,
                       const zip_point *p)
{
    *c = (zip_cursor){.in = malloc(sizeof *c->in), .scratch = malloc(ZIP_WINDOW)};
    if (!c->in || !c->scratch || inflateInit2(&c->s, -15) != Z_OK) {
        free(c->in);
        free(c->scratch);
        return -ENOMEM;
    }
    *c->in = (zin){.f = f, .zi = zi, .next = p->in - (p->bits ? 1 : 0)};
    int rc = 0;
    if (p->bits) {
        unsigned char b;
        rc = ck_file_read(f, &b, 1, zi->data_offset + c->in->next);
        c->in->next++;
        if (rc == 0 && inflatePrime(&c->s, p->bits, b >> (8 - p->bits)) != Z_OK)
            rc = -EIO;
    }
    if (rc == 0 && p->window && inflateSetDictionary(&c->s, p->window, ZIP_WINDOW) != Z_OK)
        rc = -EIO;
    if (rc)
        cursor_close(c);
    return rc;
}

/* Decodes len bytes into out (NULL: thrown away, through scratch). 0 or -errno. */
static int inflate_into(z_stream *s, zin *in, unsigned char *out, uint64_t len,
                        unsigned char *scratch)
{
    while (len) {
        int dry = feed(s, in);
        if (dry < 0)
            return dry;
        uInt n = len < UINT_MAX ? (uInt)len : UINT_MAX;
        if (!out && n > ZIP_WINDOW)
            n = ZIP_WINDOW;
        s->next_out = out ? out : scratch;
        s->avail_out = n;
        int ret = inflate(s, Z_NO_FLUSH);
        uInt made = n - s->avail_out;
        if (ret != Z_OK && !(ret == Z_STREAM_END && made == len))
            return -EIO; /* corrupt, ended early, or cut short: not the stream the pass saw */
        len -= made;
        if (out)
            out += made;
    }
    return 0;
}

/* Where a decode hands its output: the bytes at output offsets [from, to), to put, in order. */
typedef struct zip_sink {
    uint64_t from, to;
    zip_put_fn put;
    void *ctx;
} zip_sink;

/* The part of out[0..n) (output offsets at..at+n) that k wants, handed to it. */
static int give(const zip_sink *k, const unsigned char *out, size_t n, uint64_t at)
{
    uint64_t lo = at > k->from ? at : k->from, hi = at + n < k->to ? at + n : k->to;
    return lo < hi ? k->put(k->ctx, out + (lo - at), (size_t)(hi - lo)) : 0;
}

/* The pass finds the stream wrong: every read of the entry fails from now on. */
static int fault(zip_inflated *zi, const char *what)
{
    zi->fault = what;
    return -EIO;
}

/* A seek point at the pass's position: ring holds the last ZIP_WINDOW bytes of output, the
 * oldest at ring[ZIP_WINDOW - avail_out]. 0, or -ENOMEM. */
static int add_point(zip_inflated *zi, const z_stream *s, uint64_t in, uint64_t out,
                     uint32_t crc, const unsigned char *ring)
{
    if (zi->npoints == zi->cap) {
        zip_point *more = realloc(zi->points, 2 * zi->cap * sizeof *more);
        if (!more)
            return -ENOMEM;
        zi->points = more;
        zi->cap *= 2;
    }
    unsigned char *w = malloc(ZIP_WINDOW);
    if (!w)
        return -ENOMEM;
    size_t old = s->avail_out, young = ZIP_WINDOW - old;
    memcpy(w, ring + young, old);
    memcpy(w + old, ring, young);
    zi->points[zi->npoints++] = (zip_point){.out = out, .in = in, .window = w, .crc = crc,
                                            .bits = (uint8_t)(s->data_type & 7)};
    return 0;
}

/* Whether inflate(Z_BLOCK) stopped at the end of a block that is not the stream's last: the
 * only places a seek point can be (zlib.h, inflate: data_type bits 7 and 6). */
static int at_block_end(const z_stream *s)
{
    return (s->data_type & 128) && !(s->data_type & 64);
}

/* The stream has ended after out bytes of output, in compressed bytes, of CRC-32 crc: the
 * pass's last checks. */
static int check_end(zip_inflated *zi, uint64_t out, uint64_t in, uint32_t crc)
{
    if (out != zi->size)
        return fault(zi, "its deflate stream ends before the size the central directory "
                     "declares");
    if (in != zi->csize)
        return fault(zi, "its deflate stream ends before its compressed bytes do");
    if (crc != zi->crc)
        return fault(zi, "the CRC-32 of its inflated bytes is not the central directory's");
    return 0;
}

/* One step of the pass: inflate(Z_BLOCK) on c, its output in the ring. Z_OK or Z_STREAM_END
 * with *made bytes made from *used compressed ones, else -errno (a fault set). */
static int pass_step(zip_inflated *zi, zip_cursor *c, size_t *made, uint64_t *used)
{
    int dry = feed(&c->s, c->in); /* dry: no input left, but inflate may hold some output */
    if (dry < 0)
        return dry;
    if (c->s.avail_out == 0) {
        c->s.next_out = c->scratch;
        c->s.avail_out = ZIP_WINDOW;
    }
    uInt avail_in = c->s.avail_in, avail_out = c->s.avail_out;
    int ret = inflate(&c->s, Z_BLOCK);
    if (ret == Z_BUF_ERROR && dry)
        return fault(zi, "its deflate stream is truncated");
    if (ret == Z_MEM_ERROR)
        return -ENOMEM;
    if (ret != Z_OK && ret != Z_STREAM_END) /* Z_BUF_ERROR with input: no progress */
        return fault(zi, "its deflate stream is corrupt");
    *made = avail_out - c->s.avail_out;
    *used = avail_in - c->s.avail_in;
    return ret;
}

/* The pass, from its last point on, until it has decoded `end` output bytes (and, when end is
 * the entry's size, checked the stream's end), its output handed to k (NULL: to none) on the
 * way. 0, or -errno (-EIO with zi->fault set where the stream is wrong). Under zi->lock. */
static int pass_to(const ck_file *f, zip_inflated *zi, uint64_t end, const zip_sink *k)
{
    zip_point p = zi->points[zi->npoints - 1];
    zip_cursor c;
    int rc = cursor_open(&c, f, zi, &p);
    if (rc)
        return rc;
    /* The ring starts as the point's window, so that a point made within ZIP_WINDOW bytes of
     * it still gets the ZIP_WINDOW bytes before it. */
    if (p.window)
        memcpy(c.scratch, p.window, ZIP_WINDOW);
    else
        memset(c.scratch, 0, ZIP_WINDOW);
    c.s.next_out = c.scratch;
    c.s.avail_out = ZIP_WINDOW;
    uint64_t in = p.in, out = p.out, last_in = p.in, last_out = p.out;
    uint32_t crc = p.crc;
    int ret = Z_OK;
    while (rc == 0 && ret != Z_STREAM_END && (out < end || end == zi->size)) {
        size_t made = 0;
        uint64_t used = 0;
        unsigned char *from = c.s.avail_out ? c.s.next_out : c.scratch;
        ret = pass_step(zi, &c, &made, &used);
        if (ret < 0) {
            rc = ret;
            break;
        }
        in += used;
        if (made > zi->size - out) {
            rc = fault(zi, "its deflate stream inflates past the size the central directory "
                       "declares");
            break;
        }
        crc = (uint32_t)crc32(crc, from, (uInt)made);
        rc = k ? give(k, from, made, out) : 0;
        out += made;
        if (rc == 0 && ret != Z_STREAM_END && at_block_end(&c.s) && out - last_out >= zi->span &&
            in - last_in >= ZIP_POINT_IN) {
            rc = add_point(zi, &c.s, in, out, crc, c.scratch);
            last_in = in, last_out = out;
        }
    }
    if (rc == 0 && ret == Z_STREAM_END && (rc = check_end(zi, out, in, crc)) == 0)
        zi->done = 1;
    if (rc == 0 && out > zi->reached)
        zi->reached = out;
    cursor_close(&c);
    return rc;
}

/* Output [k->from, k->to) decoded again from point p (a copy). */
static int decode_from(const ck_file *f, const zip_inflated *zi, const zip_point *p,
                       const zip_sink *k)
{
    uint64_t left = k->to - k->from;
    size_t cap = left < ZIP_SEEK_SPAN ? (size_t)left : ZIP_SEEK_SPAN;
    unsigned char *piece = malloc(cap);
    zip_cursor c;
    int rc = piece ? cursor_open(&c, f, zi, p) : -ENOMEM;
    if (rc == 0) {
        rc = inflate_into(&c.s, c.in, NULL, k->from - p->out, c.scratch);
        while (rc == 0 && left) {
            size_t n = left < cap ? (size_t)left : cap;
            rc = inflate_into(&c.s, c.in, piece, n, c.scratch);
            if (rc == 0)
                rc = k->put(k->ctx, piece, n);
            left -= n;
        }
        cursor_close(&c);
    }
    free(piece);
    return rc;
}

/* Hands output [k->from, k->to) to k: the pass runs first where it has not got that far (and
 * hands the bytes over itself when its last point is at or before them); what it has passed
 * is decoded again from the point before k->from. */
static int inflate_range(const ck_file *f, zip_inflated *zi, const zip_sink *k)
{
    pthread_mutex_lock(&zi->lock);
    int rc = zi->fault ? -EIO : 0, served = 0;
    if (rc == 0 && !zi->done && (zi->reached < k->to || k->to == zi->size)) {
        served = zi->points[zi->npoints - 1].out <= k->from;
        rc = pass_to(f, zi, k->to, served ? k : NULL);
    }
    zip_point p = *point_before(zi, k->from);
    pthread_mutex_unlock(&zi->lock);
    return rc || served ? rc : decode_from(f, zi, &p, k);
}

static int put_copy(void *at, const void *buf, size_t len)
{
    memcpy(*(unsigned char **)at, buf, len);
    *(unsigned char **)at += len;
    return 0;
}

int zip_inflate_read(const ck_file *f, zip_inflated *zi, void *buf, size_t len, uint64_t off)
{
    if (off > zi->size || len > zi->size - off)
        return -EIO;
    if (len == 0)
        return 0;
    unsigned char *at = buf;
    zip_sink k = {.from = off, .to = off + len, .put = put_copy, .ctx = &at};
    return inflate_range(f, zi, &k);
}

int zip_inflate_each(const ck_file *f, zip_inflated *zi, uint64_t off, zip_put_fn put,
                     void *ctx)
{
    if (off > zi->size)
        return -EIO;
    zip_sink k = {.from = off, .to = zi->size, .put = put, .ctx = ctx};
    return inflate_range(f, zi, &k);
}
