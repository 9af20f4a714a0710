/* http.h — a source file over HTTP(S) (source.h's remote ops): the request layer
 * (http_request.h) below the block cache (blockcache.h), and the remote context they share.
 *
 * Contract:
 *  - An http_remote is what every remote file opened through it shares: the configuration, one
 *    block cache of cache_mem bytes, the disk cache (cache_dir, else CKPTFS_CACHE_DIR; cache_max,
 *    else CKPTFS_CACHE_MAX; opened on the first URL, keyed by the URL without its secrets, the
 *    validator and the size; an object without a validator is not cached on disk) and where
 *    tokens come from. The entry points make one (ckptfs, a ckpt command, ck_open for a
 *    location it opens alone) and free it after every file opened through it is closed. Two
 *    remotes share nothing.
 *  - http_open reads the object's first HTTP_HEAD_BYTES once (its headers: a safetensors mount
 *    costs one request) and serves reads within them from memory; every other read goes
 *    through the block cache, whose fetches are the request layer's ranged GETs pinned to the
 *    validator seen at open. A read of a changed object gives -EIO, and ck_file_unchanged is 0
 *    from then on. A read never returns part of what was asked.
 *  - http_open fails when the disk cache's directory exists and is not a directory, or
 *    CKPTFS_CACHE_MAX is not a size.
 */
#ifndef CK_HTTP_H
#define CK_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "blockcache.h"
#include "../base/error.h"
#include "http_request.h"
#include "source.h"

#define HTTP_HEAD_BYTES (256u << 10)
#define HTTP_MAX_DOCUMENT (64u << 20) /* http_get's largest body */

typedef struct http_config {
    const char *cacert;    /* a PEM file of CA certificates, or NULL: the system store */
    uint64_t cache_mem;    /* bytes of block cache; 0: BC_MEM_DEFAULT */
    const char *cache_dir; /* the disk cache's directory (diskcache.h), or NULL: none */
    uint64_t cache_max;    /* its bound; 0: DC_MAX_DEFAULT */
    void (*log)(const char *line); /* where the disk cache reports; NULL: stderr */
    http_auth_fn authorize;        /* how a request is authorised; NULL: never */
    http_explain_fn explain;       /* what an error reply says; NULL: its status alone */
    int anonymous;                 /* sign nothing (ckptfs -o anonymous, ckpt --no-sign-request;
                                    * also CKPTFS_NO_SIGN_REQUEST=1): a public bucket; what the
                                    * opener reads to choose authorize (schemes.h) */
} http_config;

typedef struct http_remote http_remote;

/* A remote context configured by c (copied). NULL when memory runs out. */
http_remote *http_remote_new(const http_config *c);
void http_remote_free(http_remote *r);

/* How r's requests are made (its CA certificates and tokens): for http_get. */
const http_client *http_remote_client(const http_remote *r);

/* Opens loc through r into *f (see the contract): an http(s) URL, or an object location of a
 * scheme (schemes.h: s3://), read at the URL its row names and named by loc, so that every
 * message about it (its own and a sibling's: ck_source_sibling keeps the scheme) says
 * s3://BUCKET/KEY. what names the file in a
 * failure ("shard"), or NULL. 0, or -1 with err set. */
int http_open(http_remote *r, const char *loc, const char *what, ck_file *f, ck_error *err);

/* An object of size bytes named name, each range read through fetch(ctx, ...) instead of HTTP:
 * r's block cache and, keyed by name and etag (a strong validator, or NULL: not cached), its
 * disk cache, exactly as for a URL (no head bytes). What the cache's unit tests drive
 * in-process, with a fake transport that counts, fails or delays. 0, or -1 with err set. */
int http_open_fetch(http_remote *r, const char *name, uint64_t size, const char *etag,
                    bc_fetch_fn fetch, void *ctx, ck_file *f, ck_error *err);

#endif
