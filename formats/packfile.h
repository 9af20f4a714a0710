/* packfile.h — reading the ckptfs pack format (docs/PACK.md).
 *
 * Contract: pack_read_file validates the header and the whole index against every rule of
 * FORMAT.md ("What a reader must refuse"), including the index checksum, and appends one entry
 * per index entry (tensors as one contiguous extent each, values with their text) plus the
 * metadata. It reads the header and the index only, never the data or the checksum trailer.
 * It also keeps the pack's layout, as the file holds it, for the life of the index
 * (pack_layout_of): whoever needs a blob's place or number asks it there, and never rebuilds
 * it with the writer (synth.h), which would only say where a pack *should* put its bytes.
 */
#ifndef CK_PACKFILE_H
#define CK_PACKFILE_H

#include "../index/index.h"

#define PACK_MAGIC "CKPTPACK"
#define PACK_VERSION 1u
#define PACK_HEADER_SIZE 64u
#define PACK_BLOB_ALIGN 256u
#define PACK_REGION_ALIGN 4096u
#define PACK_MAX_INDEX (1u << 30) /* an index may not be bigger */

/* The fixed header, decoded. */
typedef struct pack_header {
    uint32_t version, flags;
    uint64_t index_offset, index_length, data_offset, data_length, checksum_offset, index_xxh3;
} pack_header;

/* A blob: where its bytes lie in the file. */
typedef struct pack_blob {
    uint64_t offset; /* file offset of its first byte: data_offset + its offset in the index */
    uint64_t length;
} pack_blob;

/* A pack's layout, checked at open: the blobs in file order (which is their number, and their
 * place in the checksum trailer), and which blob each entry names. Entries are counted as the
 * pack counts them ("pack entry k"): pack entry k is ix->entries[first_entry + k], and
 * first_entry is 0 unless pack_read_file appended to an index that held entries already. */
typedef struct pack_layout {
    pack_header header;         /* decoded and checked */
    uint32_t file;              /* the pack's file id in the index */
    uint32_t nblobs, nentries;
    size_t first_entry;
    const pack_blob *blobs;     /* nblobs, each at the first multiple of 256 after the last */
    const uint32_t *entry_blob; /* nentries: pack entry k's blob, UINT32_MAX for a value */
    const uint32_t *blob_entry; /* nblobs: the pack entry that names blob b first */
} pack_layout;

/* True when head (the first n bytes of a file) starts with the pack magic. */
int pack_probe(const unsigned char *head, size_t n);

/* Parses file `file` of ix (already added) and appends its entries and metadata. */
int pack_read_file(ck_index *ix, uint32_t file, ck_error *err);

/* The layout of pack file `file` of ix, owned by ix; NULL when that file is not a pack that
 * pack_read_file has read whole (another format, or a failed read). */
const pack_layout *pack_layout_of(const ck_index *ix, uint32_t file);

/* The checksum trailer of pack file `file` of ix, as stored: its nblobs blob sums into stored
 * (nblobs entries), after checking the trailer's own sum. 0, -EBADMSG when that sum does not
 * match, or another -errno. ix's file size was validated at open, so the trailer is in it. */
int pack_read_trailer(const ck_index *ix, uint32_t file, uint32_t nblobs, uint64_t *stored);

/* Encodes / decodes the 64-byte header (no validation in decode). */
void pack_header_encode(const pack_header *h, unsigned char out[PACK_HEADER_SIZE]);
void pack_header_decode(const unsigned char in[PACK_HEADER_SIZE], pack_header *h);

#endif
