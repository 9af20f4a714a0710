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
 * entry. CRCs are not checked (torch may write 0). The archive and its names are only data.
 */
#ifndef CK_ZIP_H
#define CK_ZIP_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

#define ZIP_MAX_ENTRIES 10000000u

typedef struct zip_entry {
    const char *name;      /* NUL-terminated (names holding a NUL byte are rejected) */
    uint32_t name_len;
    uint16_t method;       /* 0 stored, 8 deflate, ... */
    uint16_t flags;        /* general purpose bit flags */
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

/* Reads the directory of the archive open at fd (file_size bytes; path is for messages). On
 * failure returns -1 with err set and *z empty. */
int zip_read_directory(int fd, uint64_t file_size, const char *path, zip_archive *z,
                       ck_error *err);

/* The entry called name (len bytes), or NULL. O(1): the names are hashed on the side, so
 * finding every storage of a large checkpoint stays fast (sorting them cost more than reading
 * the directory). */
const zip_entry *zip_find(const zip_archive *z, const char *name, size_t len);

void zip_free(zip_archive *z);

#endif
