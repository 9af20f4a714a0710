/* packfile.h — reading the ckptfs pack format (pack/FORMAT.md).
 *
 * Contract: pack_read_file validates the header and the whole index against every rule of
 * FORMAT.md ("What a reader must refuse"), including the index checksum, and appends one entry
 * per index entry (tensors as one contiguous extent each, values with their text) plus the
 * metadata. It reads the header and the index only, never the data or the checksum trailer.
 */
#ifndef CK_PACKFILE_H
#define CK_PACKFILE_H

#include "index.h"

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

/* True when head (the first n bytes of a file) starts with the pack magic. */
int pack_probe(const unsigned char *head, size_t n);

/* Parses file `file` of ix (already added) and appends its entries and metadata. */
int pack_read_file(ck_index *ix, uint32_t file, ck_error *err);

/* The checksum trailer of pack file `file` of ix, as stored: its nblobs blob sums into stored
 * (nblobs entries), after checking the trailer's own sum. 0, -EBADMSG when that sum does not
 * match, or another -errno. ix's file size was validated at open, so the trailer is in it. */
int pack_read_trailer(const ck_index *ix, uint32_t file, uint32_t nblobs, uint64_t *stored);

/* Encodes / decodes the 64-byte header (no validation in decode). */
void pack_header_encode(const pack_header *h, unsigned char out[PACK_HEADER_SIZE]);
void pack_header_decode(const unsigned char in[PACK_HEADER_SIZE], pack_header *h);

#endif
