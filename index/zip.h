/* zip.h — the central directory of a zip archive (PKZIP APPNOTE 6.3), as torch.save writes it.
 *
 * Contract: only the end-of-central-directory record(s) and the central directory are trusted
 * for the list of entries, never the order of local headers. ZIP64 (the end-of-central-directory
 * 64 record and its locator, zip64 extra fields) is supported. An entry's data offset is its
 * local header offset + 30 + the LOCAL header's name and extra lengths (torch pads with an extra
 * field the central directory does not have), so zip_read_directory reads each local header once:
 * headers at most a page apart in one read (a checkpoint of small tensors needs a few reads, not
 * one per tensor), never the tensor data between headers further apart.
 * Every count, size and offset is checked against the file size; a lie is an error naming the
 * entry. A stored entry's CRC is not checked (torch may write 0); a deflated entry's is, by the
 * one pass zip_inflate_index makes over it. The archive and its names are only data.
 */
#ifndef CK_ZIP_H
#define CK_ZIP_H

#include <stddef.h>
#include <stdint.h>

#include "../base/error.h"
#include "../sources/source.h" /* ck_file: the archive, read through ck_file_read */

#define ZIP_MAX_ENTRIES 10000000u

typedef struct zip_entry {
    const char *name;      /* NUL-terminated (names holding a NUL byte are rejected) */
    uint32_t name_len;
    uint16_t method;       /* 0 stored, 8 deflate, ... */
    uint16_t flags;        /* general purpose bit flags */
    uint32_t crc;          /* CRC-32 of the uncompressed bytes, as the central directory says */
    uint64_t data_offset;  /* first byte of the entry's (possibly compressed) data */
    uint64_t size;         /* uncompressed bytes */
    uint64_t csize;        /* bytes in the archive */
} zip_entry;

typedef struct zip_archive {
    zip_entry *entries;    /* in central directory order */
    size_t nentries;
    char *names;           /* storage for every name */
    uint32_t *slots;       /* entry indices by a seeded hash of their names (ZIP_NO_SLOT:
                            * empty); duplicate names are rejected */
    size_t nslots;         /* a power of two, over 4/3 of nentries */
    uint64_t seed;
} zip_archive;

#define ZIP_NO_SLOT UINT32_MAX

/* True when head (the first n bytes of a file) can start a zip archive ("PK\3\4"). */
int zip_probe(const unsigned char *head, size_t n);

/* The name of the first local header in head (the first n bytes of a file), *len bytes, not
 * NUL-terminated; NULL when head does not start a zip archive or ends before the name does.
 * Only a hint for telling kinds of archive apart: zip_read_directory is what is trusted. */
const char *zip_first_name(const unsigned char *head, size_t n, size_t *len);

/* Reads the directory of the archive f (file_size bytes; path is for messages). On
 * failure returns -1 with err set and *z empty. */
int zip_read_directory(const ck_file *f, uint64_t file_size, const char *path, zip_archive *z,
                       ck_error *err);

/* The entry called name (len bytes), or NULL. O(1): the names are hashed on the side, so
 * finding every storage of a large checkpoint stays fast (sorting them would cost more than
 * reading the directory). */
const zip_entry *zip_find(const zip_archive *z, const char *name, size_t len);

void zip_free(zip_archive *z);

/* --- deflated entries: random access through seek points --------------------------------- *
 *
 * A deflate stream can only be decoded from its start, unless the decoder's state at a block
 * boundary is kept: the bit position in the compressed bytes and the last 32 KiB of output (the
 * window back-references may reach). zip_inflate_index makes one pass over an entry's stream
 * and keeps such a seek point at the first block boundary past every `span` bytes of output
 * (and one at the start), the way zlib's examples/zran.c does; zip_inflate_read then decodes a
 * range from the last seek point at or before it. So a read costs at most one span (plus the
 * rest of one deflate block) of decoding before its first byte, and the points cost 32 KiB per
 * span of output: ZIP_SEEK_SPAN = 1 MiB gives 32 MiB of windows per GiB of output.
 *
 * The pass checks the stream entirely: it must decode without error to exactly the size the
 * central directory declares, end exactly at the entry's compressed size, and match its CRC-32.
 * Its output is never kept (beyond the first head_cap bytes the caller asks for). An entry that
 * declares more output than deflate can produce from its compressed size (ZIP_MAX_RATIO to 1)
 * is refused before any decoding, so the pass's time and the points' memory are bounded by the
 * compressed size: no zip bomb can make it run away. */
#define ZIP_SEEK_SPAN (1u << 20)
#define ZIP_WINDOW 32768u
#define ZIP_MAX_RATIO 1032u /* deflate's limit: a 258-byte match costs at least 2 bits */

typedef struct zip_point {
    uint64_t out;                 /* output bytes before this point */
    uint64_t in;                  /* compressed bytes consumed, partly when bits != 0 */
    const unsigned char *window;  /* the ZIP_WINDOW bytes before `out`; NULL at the start */
    uint8_t bits;                 /* bits of byte in-1 still unread */
} zip_point;

typedef struct zip_inflated {
    uint64_t data_offset, csize, size; /* the entry's compressed bytes, its output size */
    uint64_t skip;                     /* the caller's: output bytes before what it serves */
    zip_point *points;                 /* by increasing out; points[0] is the start */
    size_t npoints;
} zip_inflated;

/* Memory for the seek points, living as long as they are used (an index's arena). */
typedef void *(*zip_alloc_fn)(void *ctx, size_t n);

/* The seek points of deflated entry e (method 8) of the archive f, every `span` output
 * bytes, into *zi (memory from alloc), and the first min(head_cap, e->size) output bytes into
 * head. On failure returns -1 with err naming the entry and what is wrong. */
int zip_inflate_index(const ck_file *f, const zip_entry *e, uint64_t span, unsigned char *head,
                      size_t head_cap, zip_alloc_fn alloc, void *ctx, zip_inflated *zi,
                      const char *path, ck_error *err);

/* Output bytes [off, off+len) of the entry zi describes, into buf (off + len <= zi->size).
 * 0, or -errno: -EIO when the stream no longer decodes as the pass saw it (a changed file). */
int zip_inflate_read(const ck_file *f, const zip_inflated *zi, void *buf, size_t len, uint64_t off);

/* Output bytes [off, zi->size) of the same entry, decoded in one pass and handed to put in
 * order, ZIP_SEEK_SPAN bytes at a time at most: for a caller that keeps all of it (a copy of
 * its own), which zip_inflate_read piece by piece would decode again from each seek point.
 * 0, put's answer where it is not 0, or -errno as zip_inflate_read. */
typedef int (*zip_put_fn)(void *ctx, const void *buf, size_t len);
int zip_inflate_each(const ck_file *f, const zip_inflated *zi, uint64_t off, zip_put_fn put,
                     void *ctx);

#endif
