/* diskcache.h — a directory of a remote object's blocks, kept across mounts and processes
 * (`ckptfs -o cache_dir=DIR,cache_max=SIZE`, CKPTFS_CACHE_DIR and CKPTFS_CACHE_MAX elsewhere).
 * No FUSE, no curl: it stores and finds blocks; http.c decides what is a block and fetches.
 *
 * Contract:
 *  - Key: an object is known by its URL as shown (ck_location_shown: without userinfo, query and
 *    fragment: a presigned URL's signature changes on every presign, and is a secret), the
 *    validator captured at open (a strong ETag, else Last-Modified) and its size. An object
 *    without a validator has no key: it is never cached on disk (nothing would say a block is
 *    still the object's). The key's text is hashed (XXH3-128) and never stored: a file name in
 *    DIR is that hash and the block's index in hex, never anything the server chose, and no
 *    secret of the URL reaches DIR.
 *  - A file is a DC_HEADER-byte header (magic, the key's hash, block index, length, XXH3-128 of
 *    the bytes) and the block's bytes. What is read from DIR is untrusted: a file of the wrong
 *    size, another key or index, or bytes whose checksum differs is a miss, and is removed;
 *    dc_get never returns wrong bytes (a file cut short by a crash is one of these). A read of
 *    part of a block (a run of http.c's pages) still reads and checks the whole file.
 *  - Concurrency: any number of threads and processes (mounts, ckpt, ckload) may share DIR. A
 *    block is written to a temporary file in DIR and renamed into place: a reader sees a whole
 *    file or none. Reads take no lock. Eviction unlinks, which never disturbs a reader that has
 *    the file open. Two writers of one block both write the same bytes; the last rename wins.
 *  - Bound: the files in DIR are kept within max bytes (DC_MAX_DEFAULT when 0). Each process
 *    keeps an estimate (a scan of DIR at open, plus what it writes); a write that would pass max
 *    first scans DIR and unlinks the least recently used files (by mtime: a hit touches its
 *    file) down to max - max/8, so a scan (one readdir and a stat per file) happens at most once
 *    per max/8 bytes written; this process's writes in progress count, and a block that does
 *    not fit beside them is not stored. A process also rescans every max/8 bytes it writes, to
 *    learn what others wrote: with several writers at once DIR may pass max by up to max/8 per
 *    writer.
 *    Only files named as this module names them are counted or removed (and its temporary
 *    files left by a crash, after an hour); anything else in DIR is left alone.
 *  - Failures of the disk never fail a caller: dc_get misses, dc_put does nothing. The first
 *    failure to write (ENOSPC, EACCES, EROFS, ...) is reported once, through the log function,
 *    as "DIR: disk cache: cannot write a block (why): blocks come from the network"; later
 *    ones are silent.
 *  - dc_open creates DIR (mode 0700; its parent must exist) when it is missing. It fails only
 *    when DIR exists and is not a directory; a DIR it cannot create or open, or that is not
 *    private (another user's, or writable by group or others: the checksums catch damage, not
 *    someone who writes well-formed files), is reported once and the cache is off (dc_open
 *    returns NULL with err unset: err->msg[0] == 0).
 */
#ifndef CK_DISKCACHE_H
#define CK_DISKCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "../base/error.h"

#define DC_MAX_DEFAULT (10ull << 30)
#define DC_HEADER 64u
#define DC_NAME_MAX 52u /* 32 hex digits, '-', 16 hex digits, NUL (and room) */

typedef struct dc_key {
    unsigned char hash[16];
} dc_key;

typedef struct diskcache diskcache;

/* Writes one line (no newline) where the program reports: its stderr or its log. */
typedef void (*dc_log)(const char *line);

/* The key of the object at url with validator etag (strong, "" when none) or else
 * last_modified ("" when none) and size. 0, or -1 when it has no validator: not cached. */
int dc_key_of(const char *url, const char *etag, const char *last_modified, uint64_t size,
              dc_key *k);

/* The name of block `index` of key k in DIR, into out (DC_NAME_MAX bytes). */
void dc_name(const dc_key *k, uint64_t index, char *out);

/* The header of block `index` of k holding data[0, len), into h. */
void dc_header(unsigned char h[DC_HEADER], const dc_key *k, uint64_t index, const void *data,
               size_t len);

/* Whether h is the header of block `index` of k, len bytes long, and data[0, len) its bytes. */
int dc_check(const unsigned char h[DC_HEADER], const dc_key *k, uint64_t index,
             const void *data, size_t len);

/* The cache in dir bounded by max bytes (0: DC_MAX_DEFAULT), reporting through log (NULL: the
 * program's stderr). NULL when it is off: with err set when dir is not a directory, else
 * err->msg empty (see the contract). */
diskcache *dc_open(const char *dir, uint64_t max, dc_log log, ck_error *err);

/* Bytes [from, from+n) of block `index` of k (len bytes long) into block[from, from+n); the
 * rest of block is not written (another thread may be filling it). The whole file is read and
 * its checksum checked, streaming: the bytes outside the range pass through a small buffer, so
 * a range costs no block-sized temporary. 0, or -1 on a miss (block[from, from+n) is then
 * undefined: the caller fetches those bytes anew). */
int dc_get(diskcache *c, const dc_key *k, uint64_t index, unsigned char *block, size_t len,
           size_t from, size_t n);

/* Stores block `index` of k (data[0, len)); what fails is reported once and forgotten. */
void dc_put(diskcache *c, const dc_key *k, uint64_t index, const void *data, size_t len);

void dc_close(diskcache *c);

#endif
