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
 * checking pass its reads make over it (below). The archive and its names are only data.
 */
#ifndef CK_ZIP_H
#define CK_ZIP_H

#include <pthread.h>
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
 * window back-references may reach): a seek point, the way zlib's examples/zran.c keeps them.
 * An entry's points are made by one checking pass over its stream that runs only as far as its
 * reads need: zip_inflate_open decodes nothing, so opening an archive costs its directory and
 * what its caller reads (an .npy header), whatever its members inflate to. A read past where the
 * pass has got continues it from its last point (handing the read its bytes on the way); a read
 * before that decodes again from the last point at or before it. A point is kept at the first
 * block boundary past `span` output bytes and ZIP_POINT_IN compressed bytes since the last one,
 * so a read costs at most one span of decoding, or the output of ZIP_POINT_IN compressed bytes,
 * plus the rest of a deflate block, before its first byte; and the points' windows (ZIP_WINDOW
 * bytes each) never hold more than 8 times the entry's compressed size (the span alone would
 * allow 32 times, at ZIP_MAX_RATIO): ZIP_SEEK_SPAN = 1 MiB gives 32 MiB of windows per GiB of
 * output where the data compresses up to 256 to 1, less where it compresses more.
 *
 * The pass checks the stream: it must decode without error to exactly the size the central
 * directory declares, end exactly at the entry's compressed size, and match its CRC-32. A stream
 * found wrong fails that read and every later read of the entry (-EIO), and zip_inflate_fault
 * says what was wrong; a read before the pass got to the fault was served the stream's output
 * as it decoded (as a stored entry's bytes are served with no CRC check). An entry that declares
 * more output than deflate can produce from its compressed size (ZIP_MAX_RATIO to 1) is refused
 * at open, so neither the pass's time nor the points' memory can run away: no zip bomb. */
#define ZIP_SEEK_SPAN (1u << 20)
#define ZIP_WINDOW 32768u
#define ZIP_POINT_IN (ZIP_WINDOW / 8)
#define ZIP_MAX_RATIO 1032u /* deflate's limit: a 258-byte match costs at least 2 bits */

typedef struct zip_point {
    uint64_t out;                 /* output bytes before this point */
    uint64_t in;                  /* compressed bytes consumed, partly when bits != 0 */
    const unsigned char *window;  /* the ZIP_WINDOW bytes before `out`; NULL at the start */
    uint32_t crc;                 /* CRC-32 of the output before `out` */
    uint8_t bits;                 /* bits of byte in-1 still unread */
} zip_point;

typedef struct zip_inflated {
    uint64_t data_offset, csize, size; /* the entry's compressed bytes, its output size */
    uint32_t crc;                      /* the central directory's CRC-32 of the output */
    uint64_t skip;                     /* the caller's: output bytes before what it serves */
    /* The pass, private to zip.c: reads from many threads extend it, under lock. */
    pthread_mutex_t lock;
    uint64_t span;
    zip_point *points;                 /* by increasing out; points[0] is the start */
    size_t npoints, cap;
    uint64_t reached;                  /* output bytes the pass has decoded without fault */
    int done;                          /* the pass has checked the whole stream */
    const char *fault;                 /* what the pass found wrong; NULL while nothing */
} zip_inflated;

/* Readies *zi to decode deflated entry e (method 8), with a seek point every `span` output
 * bytes at most: decodes nothing. 0 (zip_inflate_close then), or -1 with err naming the entry
 * when it declares more output than deflate can make of its compressed size. */
int zip_inflate_open(const zip_entry *e, uint64_t span, zip_inflated *zi, const char *path,
                     ck_error *err);

/* Releases zi's points (a second close, or one of a zi never opened, zeroed, is harmless). */
void zip_inflate_close(zip_inflated *zi);

/* Output bytes [off, off+len) of the entry zi describes, into buf (off + len <= zi->size).
 * 0, or -errno: -EIO when the stream is wrong (zip_inflate_fault), or no longer decodes as the
 * pass saw it (a changed file). Safe from many threads at once. */
int zip_inflate_read(const ck_file *f, zip_inflated *zi, void *buf, size_t len, uint64_t off);

/* Output bytes [off, zi->size) of the same entry, decoded in one pass and handed to put in
 * order, ZIP_SEEK_SPAN bytes at a time at most: for a caller that keeps all of it (a copy of
 * its own), which zip_inflate_read piece by piece would decode again from each seek point.
 * 0, put's answer where it is not 0, or -errno as zip_inflate_read. */
typedef int (*zip_put_fn)(void *ctx, const void *buf, size_t len);
int zip_inflate_each(const ck_file *f, zip_inflated *zi, uint64_t off, zip_put_fn put,
                     void *ctx);

/* What the pass found wrong with the entry's stream (a phrase: "its deflate stream is
 * corrupt"), or NULL while it has found nothing. */
const char *zip_inflate_fault(zip_inflated *zi);

#endif
