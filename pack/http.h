/* http.h — a source file over HTTP(S): range requests through libcurl (source.h's remote ops).
 *
 * Contract:
 *  - http_open makes one ranged GET of the object's first HTTP_HEAD_BYTES (the headers of most
 *    checkpoints: a safetensors mount costs one request) and keeps those bytes; the response
 *    gives the size (Content-Range) and the validator (a strong ETag, else Last-Modified).
 *  - Every later request is pinned to that validator (If-Match, else If-Unmodified-Since) and
 *    checked: status 206, a Content-Range of exactly the bytes asked and the size seen at open,
 *    a body of exactly that length, the same ETag. Anything else fails the read with -EIO, and
 *    a changed object (412, another ETag or size) marks the file changed for good:
 *    ck_file_unchanged is 0 from then on. A read never returns part of what was asked.
 *  - Connection errors, timeouts, 429 and 5xx are retried with exponential backoff and jitter
 *    (Retry-After honoured), at most HTTP_TRIES attempts within HTTP_BUDGET_S seconds
 *    (CKPTFS_HTTP_TRIES, CKPTFS_HTTP_BUDGET override both), then -EIO.
 *  - Redirects (http and https only, at most HTTP_MAX_REDIRECTS) are followed here, not by
 *    libcurl: the Authorization header (the Hub token, hub.h) goes only to the origin of the URL
 *    it is for, never to another host a redirect names. The token is never put in a message.
 *  - TLS is verified against the system store, or the file of CA certificates that
 *    http_configure names (or CKPTFS_CACERT). Nothing turns verification off.
 *  - Reads go through a block cache shared by every open object and bounded by cache_mem (it
 *    counts block buffers, full or not): HTTP_BLOCK-byte aligned blocks, each filled in
 *    HTTP_PAGE pages, fetched on parallel connections (at most HTTP_CONNECTIONS per object). A
 *    read whose pages are neither held nor coming, away from where the reads so far ended
 *    (random), fetches the pages from it to HTTP_FLOOR bytes on, no further than the end of the
 *    tensor it lies in (the boundaries http_hint was given; without them, the floor). Sequential
 *    reads (beginning within a block of where the reads so far ended) open a readahead window,
 *    from HTTP_FLOOR, doubled by a read that misses or first needs pages fetched ahead, up to
 *    HTTP_MAX_WINDOW, in whole blocks once it spans one; a random read closes it. A readahead
 *    request is asked once, not retried: if it fails, the read that needs its pages asks again,
 *    with retries. A read of HTTP_BLOCK bytes or more skips the cache: it is split into
 *    parallel range requests straight into the caller's buffer.
 *  - With a disk cache (http_config's cache_dir, else CKPTFS_CACHE_DIR; cache_max, else
 *    CKPTFS_CACHE_MAX), opened on the first URL, blocks on disk stay whole HTTP_BLOCK blocks
 *    with their checksum (diskcache.h: keyed by the URL without its secrets, the validator and
 *    the size). A fetch of a run of pages first looks its block up there: when present, only
 *    the run's pages are filled from the file (the whole file is read, the rest through a small
 *    buffer, and its checksum checked: a mismatch is a miss and the run is fetched from the
 *    server, overwriting what was copied: those pages are no one else's until valid). The
 *    fetch that makes a block whole (all its pages valid) stores it, the block pinned while it
 *    is written, so that neither eviction nor a close takes its buffer. A random miss fetches
 *    only its pages from the network, as without a disk cache, not its whole block so that it
 *    could be stored (why: BENCHMARKS.md, "Random reads, second round"). Sequential reads
 *    fetch whole blocks from their first miss on (not only once the window spans one), and
 *    the loader reads whole blocks, so both store what they read; a block read at random is
 *    stored once its pages have all been read. A read of HTTP_BLOCK bytes or more then goes
 *    block by block on the parallel connections, each block whole from disk or fetched whole
 *    (the ends of the read through a buffer), so that the next load finds them. An object
 *    without a validator is not cached on disk. A cached block is served without asking the
 *    server, as one in memory is. http_open fails when the directory exists and is not a
 *    directory, or CKPTFS_CACHE_MAX is not a size.
 *  - A read may be lent in place (ck_file_hold) rather than copied, a block at a time, once the
 *    pages it covers are held (fetched as a copying read's are): the block is pinned, never
 *    evicted nor its buffer reused, until ck_file_release. Pinned blocks may take the cache past
 *    cache_mem by the blocks of the holds in progress (FUSE's threads). A whole block that a
 *    read has passed (reached its last byte), neither pinned nor loading, gives its buffer to a
 *    new block before the cache grows. Holds and the disk cache's stores pin alike, so a block
 *    being written to disk may be lent, and one lent may be stored.
 *  - libcurl is loaded (dlopen) on the first URL, so a local source never pays for it.
 */
#ifndef CK_HTTP_H
#define CK_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "source.h"

#define HTTP_HEAD_BYTES (256u << 10)
#define HTTP_BLOCK (4u << 20)
#define HTTP_MAX_WINDOW (16u * HTTP_BLOCK)
#define HTTP_PAGE (64u << 10)   /* a block's unit of fill */
#define HTTP_FLOOR (256u << 10)   /* a random miss's fetch, at least */
#define HTTP_CONNECTIONS 8u
#define HTTP_TRIES 4u
#define HTTP_BUDGET_S 60.0
#define HTTP_MAX_REDIRECTS 10u
#define HTTP_CACHE_MEM_DEFAULT (256ull << 20)
#define HTTP_MAX_DOCUMENT (64u << 20) /* http_get's largest body */

typedef struct http_config {
    const char *cacert; /* a PEM file of CA certificates, or NULL: the system store */
    uint64_t cache_mem; /* bytes of block cache; 0: HTTP_CACHE_MEM_DEFAULT */
    const char *cache_dir; /* the disk cache's directory (diskcache.h), or NULL: none */
    uint64_t cache_max;    /* its bound; 0: DC_MAX_DEFAULT */
    void (*log)(const char *line); /* where the disk cache reports; NULL: stderr */
} http_config;

/* Sets the configuration for every later open (copied). Call before the first open. */
void http_configure(const http_config *c);

/* Where a request finds its bearer token: fn(url) returns the token for url (malloc'ed; wiped
 * and freed after use), or NULL for none; with no source set, no request carries one. The
 * transport knows no credential: the opener hands it the Hub's (open.c: hub_token_for). */
typedef char *(*http_token_fn)(const char *url);
void http_set_token_source(http_token_fn fn);

/* Whether loc is an http:// or https:// URL. */
int http_is_url(const char *loc);

/* Opens url into *f (see the contract); what names the file in a failure ("shard"), or NULL. */
int http_open(const char *url, const char *what, ck_file *f, ck_error *err);

/* How a remote object's bytes are fetched: [off, off+len) into buf, all of them, tried at most
 * tries times (0: as configured). 0, or -errno. */
typedef int (*http_fetch_fn)(void *ctx, unsigned char *buf, size_t len, uint64_t off,
                             unsigned tries);

/* An object of size bytes named name, each range read through transport(ctx, ...) instead of
 * HTTP: the block cache, its pages, readahead, holds, the split of large reads and, keyed by
 * name and etag (a strong validator, or NULL: not cached), the disk cache, exactly as for a URL
 * (no head bytes). What the cache's unit tests drive in-process, with a fake transport that
 * counts, fails or delays. 0, or -1 with err set. */
int http_open_fetch(const char *name, uint64_t size, const char *etag, http_fetch_fn transport,
                    void *ctx, ck_file *f, ck_error *err);

/* The whole of a small document (status 200, at most max bytes; the Hub's API answers), into
 * *body (malloc'ed, NUL-terminated, *len bytes). 0, or -1 with err set. */
int http_get(const char *url, size_t max, char **body, size_t *len, ck_error *err);

/* --- the pieces, for tests ---------------------------------------------------------------- */

/* A Content-Range value: "bytes FIRST-LAST/TOTAL" (1), "bytes * /TOTAL" without the space (2:
 * first and last unset), anything else 0. Exactly those, with decimal numbers, FIRST <= LAST <
 * TOTAL. */
int http_content_range(const char *v, uint64_t *first, uint64_t *last, uint64_t *total);

/* Whether a response's Content-Range answers a request for [first, last] of an object of size
 * bytes: exactly those bytes when size is known (nonzero), else (at open) a range from first
 * that ends at last or at the end of the object. */
int http_range_answers(const char *content_range, uint64_t first, uint64_t last, uint64_t size,
                       uint64_t *total);

/* Whether URLs a and b have the same origin: scheme, host (case-insensitive) and port (the
 * scheme's default when absent). Userinfo is no part of a host. */
int http_same_origin(const char *a, const char *b);

/* A Retry-After value in seconds (a delay in seconds or an HTTP date against now), or -1. */
double http_retry_after(const char *v, double now);

/* Seconds to wait before attempt `attempt` (1 = the first retry): 0.25 * 2^(attempt-1), at most
 * 8, times a jitter factor in [0.5, 1) from r in [0, 1); retry_after (>= 0) instead when the
 * server asked. */
double http_backoff(unsigned attempt, double retry_after, double r);

/* The readahead window after a read: doubled (from HTTP_FLOOR, up to HTTP_MAX_WINDOW) when the
 * read began where the last one ended, else 0. */
uint64_t http_next_window(uint64_t window, int sequential);

#endif
