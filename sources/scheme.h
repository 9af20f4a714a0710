/* scheme.h — what a remote scheme is: one row of the table in schemes.c.
 *
 * Contract:
 *  - A row says, for the locations of one scheme (hf://, s3://, ...): whether a location is
 *    one of them (is); the URL an object location is read at (object_url); what a location
 *    names, one object or a directory's listing (locate); how a request to a URL on the
 *    scheme's endpoint is authorised (authorize: a bearer token or a SigV4 signature); and
 *    what an error reply means in the scheme's own words (explain). Any of the last four may
 *    be NULL: the location is read as its own URL, is one object, goes unauthorised, or an
 *    error is its status alone.
 *  - authorize is asked by the transport for the URL a request was made for, and only when
 *    the URL it goes to has that URL's origin (never a redirect's); it authorises only URLs on
 *    its own endpoint's origin, and puts no secret in out->error.
 *  - A listing (locate of a directory) is bounded by the scheme (its pages, keys and bytes);
 *    which of its files are the checkpoint is checkpoint/choose.h's rule, never a scheme's.
 */
#ifndef CK_SCHEME_H
#define CK_SCHEME_H

#include <stddef.h>

#include "../base/error.h"
#include "http_request.h"

/* What a location names: one object (dir 0: url), or a directory (a repository, a bucket's
 * prefix: dir 1): its files' names, each resolved beside url (which ends in '/'). url is what
 * messages show and siblings are resolved against: a location of the scheme itself
 * (s3://B/K) where the scheme has object_url, else the URL read. */
typedef struct ck_located {
    char *url;
    char **names; /* malloc'ed, n of them */
    size_t n;
    int dir;
} ck_located;

void ck_located_free(ck_located *t);

/* What a listing gathered, page by page (a scheme's bounds on keys and name bytes checked by
 * its parser as each name arrives). */
typedef struct ck_listing {
    char **names;      /* directly under the prefix, the prefix cut off (malloc'ed) */
    size_t n, cap;
    size_t keys;       /* every object listed so far */
    size_t name_bytes; /* of names */
} ck_listing;

void ck_listing_free(ck_listing *l);

/* Keeps name (malloc'ed; l takes it) in l: 0, or -1 when memory runs out (name not taken). */
int ck_listing_add(ck_listing *l, char *name);

/* How a scheme lists a prefix, page by page (ck_list). */
typedef struct ck_pager {
    unsigned max_pages;         /* pages at most */
    size_t max_page, max_total; /* bytes of one page, of every page */
    const void *ctx;            /* the scheme's: its parsed location */
    /* The URL of the page after the one that gave token (NULL: the first) into url (cap
     * bytes): 0, or -1 when it does not fit. */
    int (*page_url)(const void *ctx, const char *token, char *url, size_t cap);
    /* The page's names added to l, and the next page's token (*token, malloc'ed, or NULL at
     * the last). 0, or -1 with err set, said of loc. */
    int (*parse)(const void *ctx, const char *body, size_t len, ck_listing *l, char **token,
                 const char *loc, ck_error *err);
} ck_pager;

/* Every name p's pages list, through c, into t's names, within p's bounds; a failure said of
 * loc (the location as the user gave it), never of the API's URL. 0, or -1 with err set and t
 * released (ck_located_free). */
int ck_list(const http_client *c, const char *loc, const ck_pager *p, ck_located *t,
            ck_error *err);

typedef struct ck_scheme {
    const char *name; /* "s3": what messages call it */
    int (*is)(const char *loc);
    /* The URL (malloc'ed) an object location is read at, asked through c; NULL with err set. */
    char *(*object_url)(const http_client *c, const char *loc, ck_error *err);
    /* What loc names, into *t (ck_located_free releases it). 0, or -1 with err set, *t empty. */
    int (*locate)(const http_client *c, const char *loc, ck_located *t, ck_error *err);
    /* http_auth_fn's contract (http_request.h). */
    int (*authorize)(const char *url, http_auth *out);
    /* Whether an anonymous remote (http_config's anonymous) sends this scheme no credential:
     * a public bucket's. */
    int anonymous_unsigned;
    /* http_explain_fn's contract (http_request.h). */
    int (*explain)(const char *body, char *out, size_t cap);
} ck_scheme;

/* Whether a key or object name (len bytes) has a segment that is "", "." or ".." before its
 * end (a prefix's trailing '/' is no empty segment): names that would resolve elsewhere. */
int ck_bad_segments(const char *key, size_t len);

/* s with every byte but RFC 3986's unreserved ones (and '/' when keep_slash) as %XX, appended
 * to out at *at (cap bytes); 0, or -1 when it does not fit. */
int ck_url_encode(const char *s, int keep_slash, char *out, size_t cap, size_t *at);

#endif
