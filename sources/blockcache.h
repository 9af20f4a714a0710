/* blockcache.h — the block cache of remote objects: pages, readahead, holds, large reads.
 *
 * Contract:
 *  - A bc_cache is an object: whoever makes one (http.h's remote context, a test) passes it to
 *    every object it opens, and frees it after they are closed. Nothing is shared between two
 *    caches; nothing is process-global.
 *  - An object's bytes come from the fetch function it is opened with (a ranged GET, a test's
 *    fake): [off, off+len) into buf, all of them, tried at most `tries` times (0: as the
 *    transport is configured), 0 or -errno. The cache never names a transport.
 *  - The cache is bounded by its mem bytes (it counts block buffers, full or not): BC_BLOCK-byte
 *    aligned blocks, each filled in BC_PAGE pages. A read whose pages are neither held nor
 *    coming, away from where the reads so far ended (random), fetches the pages from it to
 *    BC_FLOOR bytes on, no further than the end of the tensor it lies in (the boundaries
 *    bc_hint was given; without them, the floor). Sequential reads (beginning within a block of
 *    where the reads so far ended) open a readahead window, from BC_FLOOR, doubled by a read
 *    that misses or first needs pages fetched ahead, up to BC_MAX_WINDOW, in whole blocks once
 *    it spans one; a random read closes it. A readahead fetch is asked once (tries 1): if it
 *    fails, the read that needs its pages asks again, with retries, and no readahead starts
 *    until a fetch works again. A read of BC_BLOCK bytes or more skips the cache: it is split
 *    into up to BC_PARALLEL fetches straight into the caller's buffer.
 *  - With a disk cache (given to bc_new) and a key (given to bc_open), blocks on disk stay whole
 *    BC_BLOCK blocks with their checksum (diskcache.h). A fetch of a run of pages first looks
 *    its block up there: when present, only the run's pages are filled from the file (a
 *    checksum mismatch is a miss, fetched instead). The fetch that makes a block whole stores
 *    it, the block pinned while it is written. A random miss fetches only its pages, not its
 *    whole block (why: BENCHMARKS.md, "Random reads, second round"); sequential reads fetch
 *    whole blocks from their first miss on, so that a stream stores what it reads; a large read
 *    goes block by block, each whole from disk or fetched whole.
 *  - bc_hold lends a read in place, a block at a time, once the pages it covers are held: the
 *    block is pinned, never evicted nor its buffer reused, until bc_release. Pinned blocks may
 *    take the cache past mem by the blocks of the holds in progress. A whole block that a read
 *    has passed (reached its last byte), neither pinned nor loading, gives its buffer to a new
 *    block before the cache grows.
 *  - Every function is safe to call from many threads at once, on one object or several.
 */
#ifndef CK_BLOCKCACHE_H
#define CK_BLOCKCACHE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "diskcache.h"

#define BC_BLOCK (4u << 20)
#define BC_PAGE (64u << 10)          /* a block's unit of fill */
#define BC_FLOOR (256u << 10)        /* a random miss's fetch, at least */
#define BC_MAX_WINDOW (16u * BC_BLOCK)
#define BC_PARALLEL 8u               /* fetches of one large read at once */
#define BC_MEM_DEFAULT (256ull << 20)

typedef struct bc_cache bc_cache;
typedef struct bc_object bc_object;

/* How an object's bytes are fetched (see the contract). */
typedef int (*bc_fetch_fn)(void *ctx, unsigned char *buf, size_t len, uint64_t off,
                           unsigned tries);

/* A cache of mem bytes (0: BC_MEM_DEFAULT), storing whole blocks in disk (or NULL: none; not
 * taken). NULL when memory runs out. */
bc_cache *bc_new(uint64_t mem, diskcache *disk);

/* Frees c; every object opened in it is closed first. */
void bc_free(bc_cache *c);

/* An object of size bytes in c, fetched through fetch(ctx, ...); stored on disk under key
 * (copied; NULL: never on disk). Reads are sequential from `next` on (what the opener read
 * already). NULL when memory runs out. */
bc_object *bc_open(bc_cache *c, uint64_t size, uint64_t next, const dc_key *key,
                   bc_fetch_fn fetch, void *ctx);

/* Waits for o's fetches and stores still running, then drops its blocks and frees it. */
void bc_close(bc_object *o);

/* Reads exactly [off, off+len) (within the object; len > 0). 0, or -errno. */
int bc_read(bc_object *o, void *buf, size_t len, uint64_t off);

/* Lends the first bytes of [off, off+len) (len > 0), up to the end of the block holding off:
 * *ptr, their count returned, until bc_release(o, *token). -errno when they cannot be read. */
ssize_t bc_hold(bc_object *o, size_t len, uint64_t off, const void **ptr, void **token);
void bc_release(bc_object *o, void *token);

/* Where o's tensors begin and end: n offsets, sorted, distinct (copied); without memory,
 * reads go on without them. */
void bc_hint(bc_object *o, const uint64_t *bounds, size_t n);

/* The readahead window after a read: doubled (from BC_FLOOR, up to BC_MAX_WINDOW) when the read
 * began where the last one ended, else 0. */
uint64_t bc_next_window(uint64_t window, int sequential);

#endif
