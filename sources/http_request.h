/* http_request.h — ranged GETs of one remote object over HTTP(S), through libcurl.
 *
 * Contract:
 *  - http_target_open makes one ranged GET of the object's first bytes (the headers of most
 *    checkpoints: a safetensors mount costs one request) and hands them back; the response
 *    gives the size (Content-Range) and the validator (a strong ETag, else Last-Modified).
 *  - Every later request (http_target_fetch) is pinned to that validator (If-Match, else
 *    If-Unmodified-Since) and checked: status 206, a Content-Range of exactly the bytes asked
 *    and the size seen at open, a body of exactly that length, the same ETag. Anything else
 *    fails the fetch with -EIO, and a changed object (412, another ETag or size) marks the
 *    target changed for good. A fetch never returns part of what was asked.
 *  - Connection errors, timeouts, 429 and 5xx are retried with exponential backoff and jitter
 *    (Retry-After honoured), at most HTTP_TRIES attempts within HTTP_BUDGET_S seconds
 *    (CKPTFS_HTTP_TRIES, CKPTFS_HTTP_BUDGET override both), then -EIO. At most
 *    HTTP_CONNECTIONS requests of one target are in flight; their connections are kept.
 *  - Redirects (http and https only, at most HTTP_MAX_REDIRECTS) are followed here, not by
 *    libcurl: every credential (the client's authorize: a bearer token, a SigV4 signature and
 *    session token; the caller's own headers of http_request_doc) goes only to the origin of
 *    the URL it is for, never to another origin a redirect names; origins are compared as
 *    libcurl parses URLs (http_url_parse), never as strings. A request with no_redirects
 *    follows none. A header line holding CR or LF is never sent (the request fails). A token
 *    or key is never put in a message.
 *  - An error reply's body is read up to MAX_DISCARD bytes; what the client's explain makes of
 *    it (an S3 error document's <Code>...) is put in the failure's message.
 *  - TLS is verified against the system store, or the client's cacert (else CKPTFS_CACERT).
 *    Nothing turns verification off.
 *  - libcurl is loaded (dlopen, once per process, never unloaded) on the first request, so a
 *    local source never pays for it.
 */
#ifndef CK_HTTP_REQUEST_H
#define CK_HTTP_REQUEST_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "diskcache.h"
#include "../base/error.h"

#define HTTP_CONNECTIONS 8u
#define HTTP_TRIES 4u
#define HTTP_BUDGET_S 60.0
#define HTTP_MAX_REDIRECTS 10u

/* What a request to an S3 API is signed with: AWS Signature Version 4, computed by libcurl
 * itself (CURLOPT_AWS_SIGV4, service s3), with a session token for temporary credentials. */
typedef struct http_sigv4 {
    char access_key[256];
    char secret_key[256];
    char session_token[4096]; /* "" for long-term keys */
    char region[64];
    char error[sizeof(ck_error) + 128]; /* why, when credentials could not be had */
} http_sigv4;

/* What authorises a request: a bearer token ("Authorization: Bearer"), or a SigV4 signature. */
typedef struct http_auth {
    char *bearer; /* malloc'ed, or NULL */
    int sigv4;    /* 1: signed with sig */
    http_sigv4 sig;
    char error[sizeof(ck_error) + 128]; /* why, when the hook returns -1 */
} http_auth;

/* Where a request finds its authorisation: fn(url, out) fills *out (zeroed by the caller) and
 * returns 1 when requests to url are authorised, 0 when they go without, -1 when credentials
 * should be there and could not be had (out->error says why, without a secret: the request
 * fails with it). The transport knows no credential and no scheme: the opener hands it the
 * schemes' table (schemes.h). It asks only for the URL a request was made for, only when the
 * request goes to that URL's origin (never a redirect's), and wipes *out after use. */
typedef int (*http_auth_fn)(const char *url, http_auth *out);

/* What an error reply's body (NUL-terminated, its first bytes) says in a scheme's own words,
 * into out (cap bytes: "AccessDenied", "SignatureDoesNotMatch: check the secret key..."): 1,
 * or 0 when it says nothing the hook knows. The body comes from the server: out is checked. */
typedef int (*http_explain_fn)(const char *body, char *out, size_t cap);

/* How requests are made: each may be NULL (the system store; no credential; statuses alone).
 * Borrowed. */
typedef struct http_client {
    const char *cacert;      /* a PEM file of CA certificates */
    http_auth_fn authorize;
    http_explain_fn explain;
} http_client;

typedef struct http_target http_target;

/* Opens url (what names it in a failure, e.g. "shard", or NULL): its first cap bytes or fewer,
 * the whole object when smaller, into head (*got of them). named is the location the object is
 * known by: url itself, or the s3:// location url is the API's URL of; it is what every message
 * about the object shows (as location.h shows it). NULL with err set ("NAMED: cannot open WHAT:
 * why"). */
http_target *http_target_open(const http_client *c, const char *url, const char *named,
                              const char *what, unsigned char *head, size_t cap, size_t *got,
                              ck_error *err);
void http_target_close(http_target *t);

/* [off, off+len) of target t into buf, one request tried at most tries times (0: as
 * configured). 0, or -errno. The block cache's fetch function (blockcache.h). */
int http_target_fetch(void *t, unsigned char *buf, size_t len, uint64_t off, unsigned tries);

uint64_t http_target_size(const http_target *t);
/* Last-Modified, or 0 when the server gave none. */
time_t http_target_mtime(const http_target *t);
/* The object's location (named at open) as shown in messages (location.h). */
const char *http_target_shown(const http_target *t);
/* Whether the object changed since the open (see the contract). */
int http_target_changed(const http_target *t);
/* Its disk-cache key (URL without secrets, validator, size): 0, or -1 when it has no
 * validator and must not be cached. */
int http_target_key(const http_target *t, dc_key *key);
/* Requests made and bytes received so far. */
void http_target_stats(const http_target *t, uint64_t *requests, uint64_t *bytes);

/* The whole of a small document (status 200, at most max bytes; the Hub's API answers), into
 * *body (malloc'ed, NUL-terminated, *len bytes). 0, or -1 with err set. */
int http_get(const http_client *c, const char *url, size_t max, char **body, size_t *len,
             ck_error *err);
/* How http_request_doc asks: the credential endpoints' ways (s3.c, gcs.c). */
typedef struct http_doc_request {
    const char *method;         /* NULL: GET (POST with form); "PUT": without a body */
    const char *form;           /* a POST's application/x-www-form-urlencoded body, or NULL */
    const char *const *headers; /* "Name: value" lines, NULL-terminated, or NULL */
    unsigned tries;             /* 0: as configured (HTTP_TRIES) */
    double budget_s;            /* 0: as configured (HTTP_BUDGET_S); also bounds the connect */
    int no_redirects;           /* a 3xx fails: credential endpoints, as the AWS SDKs */
} http_doc_request;

/* http_get as how says. The transport's copies of the headers are wiped after use. */
int http_request_doc(const http_client *c, const char *url, const http_doc_request *how,
                     size_t max, char **body, size_t *len, ck_error *err);

/* --- the pieces, for tests ---------------------------------------------------------------- */

/* Whether loc is an http:// or https:// URL. */
int http_is_url(const char *loc);

/* A Content-Range value: "bytes FIRST-LAST/TOTAL" (1), "bytes * /TOTAL" without the space (2:
 * first and last unset), anything else 0. Exactly those, with decimal numbers, FIRST <= LAST <
 * TOTAL. */
int http_content_range(const char *v, uint64_t *first, uint64_t *last, uint64_t *total);

/* Whether a response's Content-Range answers a request for [first, last] of an object of size
 * bytes: exactly those bytes when size is known (nonzero), else (at open) a range from first
 * that ends at last or at the end of the object. */
int http_range_answers(const char *content_range, uint64_t first, uint64_t last, uint64_t size,
                       uint64_t *total);

/* A URL as libcurl reads it, the parser its requests go through (a host is never decided from
 * the string here): scheme ("http" or "https"), host (lowercased; an IPv6 literal without its
 * brackets), port (the scheme's default when absent), and whether it holds userinfo
 * ("user:password@" or any part of it). 0, or -1 when it is no http(s) URL libcurl takes (or
 * libcurl cannot be loaded). */
typedef struct http_url {
    char scheme[8];
    char host[256];
    unsigned port;
    int userinfo;
} http_url;

int http_url_parse(const char *url, http_url *out);

/* Whether URLs a and b have the same origin as libcurl reads them (http_url_parse): scheme,
 * host and port. Userinfo is no part of a host; a URL it cannot parse has no origin. */
int http_same_origin(const char *a, const char *b);

/* A Retry-After value in seconds (a delay in seconds or an HTTP date against now), or -1. */
double http_retry_after(const char *v, double now);

/* Seconds to wait before attempt `attempt` (1 = the first retry): 0.25 * 2^(attempt-1), at most
 * 8, times a jitter factor in [0.5, 1) from r in [0, 1); retry_after (>= 0) instead when the
 * server asked. */
double http_backoff(unsigned attempt, double retry_after, double r);

#endif
