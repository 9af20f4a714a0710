/* http_request.c — ranged GETs of remote objects through libcurl, loaded on first use
 * (http_request.h). */
#include "http_request.h"
#include "../base/location.h"

#include <curl/curl.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* --- the pieces --------------------------------------------------------------------------- */

int http_is_url(const char *loc)
{
    return ck_location_is_http(loc);
}

/* A decimal number of at most 19 digits at *p, advancing; -1 when there is none. */
static int decimal(const char **p, uint64_t *v)
{
    const char *s = *p;
    uint64_t x = 0;
    int n = 0;
    for (; *s >= '0' && *s <= '9'; s++, n++) {
        if (n == 19)
            return -1;
        x = x * 10 + (uint64_t)(*s - '0');
    }
    *p = s;
    *v = x;
    return n ? 0 : -1;
}

int http_content_range(const char *v, uint64_t *first, uint64_t *last, uint64_t *total)
{
    if (strncmp(v, "bytes ", 6) != 0)
        return 0;
    const char *p = v + 6;
    int star = *p == '*';
    if (star)
        p++;
    else if (decimal(&p, first) || *p++ != '-' || decimal(&p, last))
        return 0;
    if (*p++ != '/' || decimal(&p, total) || *p)
        return 0;
    if (star)
        return 2;
    return *first <= *last && *last < *total ? 1 : 0;
}

int http_range_answers(const char *content_range, uint64_t first, uint64_t last, uint64_t size,
                       uint64_t *total)
{
    uint64_t a, b;
    if (!content_range || http_content_range(content_range, &a, &b, total) != 1 || a != first)
        return 0;
    if (size)
        return *total == size && b == last;
    return b == (last < *total - 1 ? last : *total - 1);
}

double http_retry_after(const char *v, double now)
{
    const char *p = v;
    uint64_t s;
    if (decimal(&p, &s) == 0 && *p == 0)
        return (double)s;
    struct tm tm = {0};
    const char *end = strptime(v, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    if (!end || *end)
        return -1;
    double at = (double)timegm(&tm) - now;
    return at > 0 ? at : 0;
}

double http_backoff(unsigned attempt, double retry_after, double r)
{
    if (retry_after >= 0)
        return retry_after;
    double d = 0.25 * (double)(1u << ((attempt > 6 ? 6 : attempt ? attempt : 1) - 1));
    return (d > 8 ? 8 : d) * (0.5 + r / 2);
}

/* --- libcurl, loaded on first use ------------------------------------------------------------ */

static struct {
    void *so;
    CURL *(*easy_init)(void);
    CURLcode (*easy_setopt)(CURL *, CURLoption, ...);
    CURLcode (*easy_perform)(CURL *);
    CURLcode (*easy_getinfo)(CURL *, CURLINFO, ...);
    void (*easy_cleanup)(CURL *);
    void (*easy_reset)(CURL *);
    struct curl_slist *(*slist_append)(struct curl_slist *, const char *);
    void (*slist_free_all)(struct curl_slist *);
    const char *(*easy_strerror)(CURLcode);
    CURLcode (*global_init)(long);
    CURLU *(*url)(void);
    CURLUcode (*url_set)(CURLU *, CURLUPart, const char *, unsigned);
    CURLUcode (*url_get)(CURLU *, CURLUPart, char **, unsigned);
    void (*url_cleanup)(CURLU *);
    void (*free)(void *);
    const char *tried; /* the file dlopen was given: the system's soname or CKPTFS_LIBCURL's */
} cu;
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

/* CKPTFS_LIBCURL names a library that is libcurl or brings it (the wheel's libckcurl.so, whose
 * own dependency is the libcurl it ships): dlsym through it finds libcurl's functions. */
static void load_curl(void)
{
    const char *own = getenv("CKPTFS_LIBCURL");
    cu.tried = own && *own ? own : "libcurl.so.4";
    void *so = dlopen(cu.tried, RTLD_NOW | RTLD_LOCAL);
    if (!so)
        return;
#define SYM(field, name) (*(void **)&cu.field = dlsym(so, name))
    int ok = SYM(easy_init, "curl_easy_init") && SYM(easy_setopt, "curl_easy_setopt") &&
             SYM(easy_perform, "curl_easy_perform") && SYM(easy_getinfo, "curl_easy_getinfo") &&
             SYM(easy_cleanup, "curl_easy_cleanup") && SYM(easy_reset, "curl_easy_reset") &&
             SYM(slist_append, "curl_slist_append") &&
             SYM(slist_free_all, "curl_slist_free_all") &&
             SYM(easy_strerror, "curl_easy_strerror") && SYM(global_init, "curl_global_init") &&
             SYM(url, "curl_url") && SYM(url_set, "curl_url_set") &&
             SYM(url_get, "curl_url_get") && SYM(url_cleanup, "curl_url_cleanup") &&
             SYM(free, "curl_free");
#undef SYM
    if (ok && cu.global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK)
        cu.so = so;
    else
        dlclose(so);
}

static int have_curl(const char *url, ck_error *err)
{
    pthread_once(&cu_once, load_curl);
    if (cu.so)
        return 0;
    return ck_fail(err, url, "cannot load %s (%s)", cu.tried,
                   strcmp(cu.tried, "libcurl.so.4") ? "CKPTFS_LIBCURL" : "Debian: libcurl4");
}


/* --- URLs as libcurl reads them ------------------------------------------------------------- */

/* A part of u into out (cap bytes): 1 when u has it and it fits, 0 when absent, -1 else. */
static int url_part(CURLU *u, CURLUPart what, unsigned flags, char *out, size_t cap)
{
    char *v = NULL;
    CURLUcode c = cu.url_get(u, what, &v, flags);
    int rc = c == CURLUE_OK && v && strlen(v) < cap ? 1
             : c == CURLUE_NO_USER || c == CURLUE_NO_PASSWORD || c == CURLUE_NO_OPTIONS ? 0 : -1;
    if (rc == 1)
        strcpy(out, v);
    cu.free(v);
    return rc;
}

int http_url_parse(const char *url, http_url *out)
{
    *out = (http_url){0};
    pthread_once(&cu_once, load_curl);
    CURLU *u = cu.so ? cu.url() : NULL;
    char port[16], scratch[1024];
    int ok = u && cu.url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
             url_part(u, CURLUPART_SCHEME, 0, out->scheme, sizeof out->scheme) == 1 &&
             url_part(u, CURLUPART_HOST, 0, out->host, sizeof out->host) == 1 &&
             url_part(u, CURLUPART_PORT, CURLU_DEFAULT_PORT, port, sizeof port) == 1 &&
             (strcmp(out->scheme, "http") == 0 || strcmp(out->scheme, "https") == 0);
    for (CURLUPart p = CURLUPART_USER; ok && p <= CURLUPART_OPTIONS; p++) {
        int has = url_part(u, p, 0, scratch, sizeof scratch);
        ok = has >= 0;
        out->userinfo |= has == 1;
    }
    if (u)
        cu.url_cleanup(u);
    if (!ok)
        return *out = (http_url){0}, -1;
    out->port = (unsigned)strtoul(port, NULL, 10);
    size_t n = strlen(out->host);
    if (n > 1 && out->host[0] == '[' && out->host[n - 1] == ']') { /* an IPv6 literal */
        memmove(out->host, out->host + 1, n - 2);
        out->host[n - 2] = 0;
    }
    for (char *c = out->host; *c; c++)
        *c = (char)(*c >= 'A' && *c <= 'Z' ? *c + 32 : *c);
    return 0;
}

int http_same_origin(const char *a, const char *b)
{
    http_url ua, ub;
    return http_url_parse(a, &ua) == 0 && http_url_parse(b, &ub) == 0 &&
           strcmp(ua.scheme, ub.scheme) == 0 && strcmp(ua.host, ub.host) == 0 &&
           ua.port == ub.port;
}

/* --- one request -------------------------------------------------------------------------- */

enum { MAX_HEADER_BYTES = 64 << 10, MAX_DISCARD = 64 << 10, RECV_BUFFER = 128 << 10 };

/* What one response said, and where its body went. */
typedef struct reply {
    long status;
    char etag[256], range[128], retry_after[64], encoding[64];
    size_t header_bytes;
    unsigned char *dst; /* the body of a 2xx goes here, at most cap bytes */
    size_t cap, got;
    char **grow;        /* http_get: a growing buffer instead (cap is its limit) */
    size_t discarded;
    char error_body[1024]; /* the start of an error reply's body (a scheme's error document) */
    int overflow;       /* the body was longer than asked: aborted */
    long filetime;      /* Last-Modified (seconds since the epoch), -1 when absent */
} reply;

static void header_value(char *dst, size_t cap, const char *v, size_t n)
{
    while (n && (*v == ' ' || *v == '\t'))
        v++, n--;
    while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' '))
        n--;
    snprintf(dst, cap, "%.*s", (int)n, v);
}

static size_t on_header(char *b, size_t size, size_t n, void *ctx)
{
    reply *r = ctx;
    size_t len = size * n;
    r->header_bytes += len;
    if (r->header_bytes > MAX_HEADER_BYTES)
        return 0; /* endless headers: abort */
    if (len > 5 && strncmp(b, "HTTP/", 5) == 0) { /* a new response (after a 1xx) */
        const char *sp = memchr(b, ' ', len);
        *r = (reply){.dst = r->dst, .cap = r->cap, .grow = r->grow,
                     .header_bytes = r->header_bytes,
                     .status = sp ? strtol(sp + 1, NULL, 10) : 0};
        return len;
    }
    const char *colon = memchr(b, ':', len);
    if (!colon)
        return len;
    size_t k = (size_t)(colon - b), rest = len - k - 1;
    if (k == 4 && strncasecmp(b, "etag", 4) == 0)
        header_value(r->etag, sizeof r->etag, colon + 1, rest);
    else if (k == 13 && strncasecmp(b, "content-range", 13) == 0)
        header_value(r->range, sizeof r->range, colon + 1, rest);
    else if (k == 11 && strncasecmp(b, "retry-after", 11) == 0)
        header_value(r->retry_after, sizeof r->retry_after, colon + 1, rest);
    else if (k == 16 && strncasecmp(b, "content-encoding", 16) == 0)
        header_value(r->encoding, sizeof r->encoding, colon + 1, rest);
    return len;
}

static size_t on_body(char *b, size_t size, size_t n, void *ctx)
{
    reply *r = ctx;
    size_t len = size * n;
    if (r->status < 200 || r->status > 299) { /* an error page or a redirect's: bounded */
        size_t have = strlen(r->error_body), room = sizeof r->error_body - 1 - have;
        memcpy(r->error_body + have, b, len < room ? len : room);
        r->error_body[have + (len < room ? len : room)] = 0;
        r->discarded += len;
        return r->discarded > MAX_DISCARD ? 0 : len;
    }
    if (len > r->cap - r->got) {
        r->overflow = 1;
        return 0;
    }
    if (r->grow) {
        char *p = realloc(*r->grow, r->got + len + 1);
        if (!p)
            return 0;
        *r->grow = p;
        memcpy(p + r->got, b, len);
    } else {
        memcpy(r->dst + r->got, b, len);
    }
    r->got += len;
    return len;
}

/* How an attempt ended. */
enum outcome { DONE, RETRY, FAIL };

/* An error reply's status for a message: "403", or with what the client's explain makes of its
 * body "403 (AccessDenied)". */
static void error_status(const http_client *c, const reply *r, char *out, size_t cap)
{
    char said[128];
    if (c->explain && c->explain(r->error_body, said, sizeof said))
        snprintf(out, cap, "%ld (%s)", r->status, said);
    else
        snprintf(out, cap, "%ld", r->status);
}

/* Performs one request on h for url (a POST of form when not NULL), with headers hs, signed
 * with sig when not NULL; the reply in *r. */
static CURLcode perform(CURL *h, const char *url, const char *method, const char *form,
                        struct curl_slist *hs, reply *r, double left, const char *cacert,
                        const http_sigv4 *sig)
{
    cu.easy_reset(h);
    cu.easy_setopt(h, CURLOPT_URL, url);
    if (method)
        cu.easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    if (form) {
        cu.easy_setopt(h, CURLOPT_POSTFIELDS, form);
        cu.easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(form));
    }
    cu.easy_setopt(h, CURLOPT_HTTPHEADER, hs);
    cu.easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L); /* followed here, without Authorization */
    cu.easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    cu.easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    cu.easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    cu.easy_setopt(h, CURLOPT_HEADERDATA, r);
    cu.easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    cu.easy_setopt(h, CURLOPT_WRITEDATA, r);
    cu.easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, left > 1 && left < 10 ? (long)(left * 1000)
                                                  : left <= 1 ? 1000L : 10000L);
    cu.easy_setopt(h, CURLOPT_TIMEOUT_MS, left > 1 ? (long)(left * 1000) : 1000L);
    cu.easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L); /* a stalled body: abort, retry */
    cu.easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 10L);
    cu.easy_setopt(h, CURLOPT_FILETIME, 1L);
    cu.easy_setopt(h, CURLOPT_USERAGENT, "ckptfs");
    /* Receives of up to RECV_BUFFER bytes, not libcurl's 16 KiB: fewer recv calls and write
     * callbacks per block, less of the daemon's CPU in a sequential read; a larger buffer gains
     * little and is kept per handle, 8 per object (BENCHMARKS.md, "Sequential, second round"). */
    cu.easy_setopt(h, CURLOPT_BUFFERSIZE, (long)RECV_BUFFER);
    const char *ca = cacert ? cacert : getenv("CKPTFS_CACERT"); /* options win */
    if (ca && *ca)
        cu.easy_setopt(h, CURLOPT_CAINFO, ca);
    char provider[96];
    if (sig) { /* libcurl computes the signature: nothing here hand-writes SigV4 */
        snprintf(provider, sizeof provider, "aws:amz:%s:s3", sig->region);
        cu.easy_setopt(h, CURLOPT_AWS_SIGV4, provider);
        cu.easy_setopt(h, CURLOPT_USERNAME, sig->access_key);
        cu.easy_setopt(h, CURLOPT_PASSWORD, sig->secret_key);
    }
    return cu.easy_perform(h);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* --- remote objects --------------------------------------------------------------------- */

struct http_target {
    char *url;                /* as given: what a redirect target expires back to */
    char shown[CK_SHOWN_MAX]; /* its location as shown in messages (ck_location_shown) */
    char *where;              /* the last redirect's target, tried first (lock) */
    char etag[256];           /* strong, "" when the server gave none */
    char since[64];           /* If-Unmodified-Since's date when there is no strong ETag */
    uint64_t size;
    time_t mtime;             /* Last-Modified, 0 when absent */
    http_client client;
    pthread_mutex_t lock;     /* where, idle */
    pthread_cond_t idle_cv;
    CURL *idle[2 * HTTP_CONNECTIONS];
    unsigned nidle, busy;     /* handles kept; handles lent out */
    atomic_uint_fast64_t requests, bytes;
    atomic_int changed;
};

static CURL *take_handle(http_target *o)
{
    pthread_mutex_lock(&o->lock);
    while (o->busy >= HTTP_CONNECTIONS)
        pthread_cond_wait(&o->idle_cv, &o->lock);
    o->busy++;
    CURL *h = o->nidle ? o->idle[--o->nidle] : NULL;
    pthread_mutex_unlock(&o->lock);
    return h ? h : cu.easy_init();
}

static void give_handle(http_target *o, CURL *h)
{
    pthread_mutex_lock(&o->lock);
    o->busy--;
    if (h && o->nidle < sizeof o->idle / sizeof *o->idle)
        o->idle[o->nidle++] = h, h = NULL;
    pthread_cond_signal(&o->idle_cv);
    pthread_mutex_unlock(&o->lock);
    if (h)
        cu.easy_cleanup(h);
}

/* A request of o (or of a bare url when o is NULL: http_get). */
typedef struct request {
    const http_client *client;
    http_target *o;
    const char *url;          /* the object's URL */
    const char *method;       /* NULL: GET (or POST with form) */
    const char *form;         /* a POST's urlencoded body, or NULL */
    const char *const *extra; /* more headers, NULL-terminated, or NULL */
    double budget_s;          /* 0: CKPTFS_HTTP_BUDGET or HTTP_BUDGET_S */
    uint64_t first, last;     /* the range; last < first: the whole document */
    int opening;              /* no validator yet: learn it */
    unsigned tries;           /* attempts at most; 0: HTTP_TRIES or CKPTFS_HTTP_TRIES */
    int no_redirects;         /* a 3xx fails (credential endpoints) */
    reply r;
    char msg[sizeof(ck_error) + 192]; /* why it failed (a credential endpoint's message inside) */
    int err;                  /* -errno when it failed */
} request;

static enum outcome fail(request *q, int e, const char *fmt, const char *arg)
{
    snprintf(q->msg, sizeof q->msg, fmt, arg);
    q->err = e;
    return FAIL;
}

/* SHA-256 of no bytes: the payload of every request made here (GETs). */
#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

/* Frees a request's headers, wiping them first: they may hold a token. */
static void wipe_headers(struct curl_slist *hs)
{
    for (struct curl_slist *l = hs; l; l = l->next)
        memset(l->data, 0, strlen(l->data));
    cu.slist_free_all(hs);
}

/* The headers of a request of q to url: range, validator, and auth's (given only for its
 * origin: a bearer token, or a SigV4 signature's session token). */
static struct curl_slist *headers(const request *q, const char *url, const http_auth *auth)
{
    char line[512];
    struct curl_slist *hs = NULL;
    if (q->last >= q->first) {
        snprintf(line, sizeof line, "Range: bytes=%llu-%llu", (unsigned long long)q->first,
                 (unsigned long long)q->last);
        hs = cu.slist_append(hs, line);
    }
    if (q->o && !q->opening && q->o->etag[0]) {
        snprintf(line, sizeof line, "If-Match: %s", q->o->etag);
        hs = cu.slist_append(hs, line);
    } else if (q->o && !q->opening && q->o->since[0]) {
        snprintf(line, sizeof line, "If-Unmodified-Since: %s", q->o->since);
        hs = cu.slist_append(hs, line);
    }
    const http_sigv4 *sig = auth->sigv4 ? &auth->sig : NULL;
    if (auth->bearer) {
        char *a = NULL;
        if (asprintf(&a, "Authorization: Bearer %s", auth->bearer) >= 0) {
            hs = cu.slist_append(hs, a);
            memset(a, 0, strlen(a));
            free(a);
        }
    }
    if (sig) /* S3 wants the payload's hash signed, which libcurl 7.88 does not add itself */
        hs = cu.slist_append(hs, "x-amz-content-sha256: " EMPTY_SHA256);
    if (sig && sig->session_token[0]) {
        char *t = NULL;
        if (asprintf(&t, "x-amz-security-token: %s", sig->session_token) >= 0) {
            hs = cu.slist_append(hs, t);
            memset(t, 0, strlen(t));
            free(t);
        }
    }
    for (const char *const *x = q->extra; x && *x && http_same_origin(url, q->url); x++)
        hs = cu.slist_append(hs, *x); /* the caller's credentials too: its origin's alone */
    hs = cu.slist_append(hs, "Accept-Encoding: identity");
    return hs;
}

/* Wipes and frees what authorised a request. */
static void wipe_auth(http_auth *a)
{
    if (a->bearer) {
        memset(a->bearer, 0, strlen(a->bearer));
        free(a->bearer);
    }
    memset(a, 0, sizeof *a);
}

/* Whether every header line is one line: a token or key with CR or LF in it would add
 * headers of its own choosing. */
static int one_line_each(const struct curl_slist *hs)
{
    for (const struct curl_slist *l = hs; l; l = l->next)
        if (strpbrk(l->data, "\r\n"))
            return 0;
    return 1;
}

/* Checks a 2xx reply of q against what was asked. */
static enum outcome check_body(request *q)
{
    reply *r = &q->r;
    http_target *o = q->o;
    /* Asked for identity: an encoded body is not the object's bytes, whatever its length. */
    if (r->encoding[0] && strcasecmp(r->encoding, "identity") != 0)
        return fail(q, -EIO, "the body is encoded (Content-Encoding: %s), not the object's "
                    "bytes", r->encoding);
    if (q->last < q->first) /* a whole document */
        return r->status == 200 ? DONE : fail(q, -EIO, "HTTP %s, not 200", "2xx");
    if (r->status != 206)
        return fail(q, -EIO, "%s", "the server ignores range requests (status 200, not 206)");
    uint64_t total;
    if (!http_range_answers(r->range, q->first, q->last, q->opening ? 0 : o->size, &total)) {
        if (!q->opening && http_content_range(r->range, &(uint64_t){0}, &(uint64_t){0}, &total) &&
            total != o->size)
            atomic_store(&o->changed, 1);
        return fail(q, -EIO, "Content-Range '%s' does not answer the range asked", r->range);
    }
    if (!q->opening && o->etag[0] && strcmp(r->etag, o->etag) != 0) {
        atomic_store(&o->changed, 1);
        return fail(q, -EIO, "%s", "the object changed (another ETag)");
    }
    uint64_t want = (total - 1 < q->last ? total - 1 : q->last) - q->first + 1;
    if (r->got != want)
        return fail(q, -EIO, "%s", "the body is shorter than its Content-Range");
    if (q->opening)
        o->size = total;
    return DONE;
}

/* One attempt of q, redirects followed. */
static enum outcome attempt(request *q, CURL *h, double left)
{
    http_target *o = q->o;
    char *cached = NULL;
    if (o) {
        pthread_mutex_lock(&o->lock);
        cached = o->where ? strdup(o->where) : NULL;
        pthread_mutex_unlock(&o->lock);
    }
    char *url = cached ? cached : strdup(q->url);
    enum outcome out = FAIL;
    for (unsigned hop = 0; url; hop++) {
        if (hop > HTTP_MAX_REDIRECTS) {
            out = fail(q, -EIO, "more than %s redirects", "10");
            break;
        }
        http_auth auth = {0};
        int how = q->client->authorize && http_same_origin(url, q->url)
                      ? q->client->authorize(q->url, &auth) : 0;
        if (how < 0) {
            out = fail(q, -EACCES, "%s", auth.error);
            wipe_auth(&auth);
            break;
        }
        struct curl_slist *hs = headers(q, url, &auth);
        if (!one_line_each(hs) ||
            (auth.sigv4 && strpbrk(auth.sig.access_key, "\r\n"))) { /* libcurl writes it in one */
            wipe_headers(hs);
            wipe_auth(&auth);
            out = fail(q, -EACCES, "%s", "a token or key holds a line break");
            break;
        }
        q->r = (reply){.dst = q->r.dst, .cap = q->r.cap, .grow = q->r.grow};
        CURLcode c = perform(h, url, q->method, q->form, hs, &q->r, left, q->client->cacert,
                             auth.sigv4 ? &auth.sig : NULL);
        wipe_headers(hs);
        wipe_auth(&auth);
        cu.easy_getinfo(h, CURLINFO_FILETIME, &q->r.filetime);
        if (o) {
            atomic_fetch_add(&o->requests, 1);
            atomic_fetch_add(&o->bytes, q->r.got);
        }
        long st = q->r.status;
        if (c != CURLE_OK && q->r.overflow) {
            out = fail(q, -EIO, "%s", "the body is longer than asked");
        } else if (c != CURLE_OK) {
            out = c == CURLE_SSL_CACERT_BADFILE || c == CURLE_PEER_FAILED_VERIFICATION ||
                          c == CURLE_SSL_CERTPROBLEM || c == CURLE_UNSUPPORTED_PROTOCOL ||
                          c == CURLE_URL_MALFORMAT || c == CURLE_WRITE_ERROR
                      ? fail(q, -EIO, "%s", cu.easy_strerror(c))
                      : (fail(q, -EIO, "%s", cu.easy_strerror(c)), RETRY);
        } else if (st >= 300 && st < 400 && st != 304 && q->no_redirects) {
            char s[160];
            error_status(q->client, &q->r, s, sizeof s);
            out = fail(q, -EIO, "HTTP %s: a redirect, which a credential request never follows",
                       s);
        } else if (st >= 300 && st < 400 && st != 304) {
            char *next = NULL;
            cu.easy_getinfo(h, CURLINFO_REDIRECT_URL, &next);
            if (!next || !http_is_url(next)) {
                out = fail(q, -EIO, "%s", "a redirect to nowhere, or not to http(s)");
                break;
            }
            free(url);
            url = strdup(next);
            continue;
        } else if (st == 412) {
            if (o)
                atomic_store(&o->changed, 1);
            out = fail(q, -EIO, "%s", "the object changed (412 Precondition Failed)");
        } else if (st == 416 && q->opening && q->r.range[0] == 'b') {
            uint64_t a, b, total;
            out = http_content_range(q->r.range, &a, &b, &total) == 2 && total == 0
                      ? (o->size = 0, DONE)
                      : fail(q, -EIO, "%s", "416 Range Not Satisfiable");
        } else if (st == 429 || st >= 500) {
            char s[160];
            error_status(q->client, &q->r, s, sizeof s);
            fail(q, -EIO, "HTTP %s", s);
            out = RETRY;
        } else if (cached && st >= 400) { /* the redirect's target expired: from the start */
            free(url);
            url = strdup(q->url);
            cached = NULL;
            hop = 0;
            continue;
        } else if (st >= 200 && st < 300) {
            out = check_body(q);
        } else {
            char s[160];
            error_status(q->client, &q->r, s, sizeof s);
            out = fail(q, st == 404 || st == 410 ? -ENOENT : st == 401 || st == 403 ? -EACCES
                                                                                 : -EIO,
                       "HTTP %s", s);
        }
        if (out == DONE && o && hop > 0) { /* later requests go straight there */
            pthread_mutex_lock(&o->lock);
            free(o->where);
            o->where = url;
            url = NULL;
            pthread_mutex_unlock(&o->lock);
        }
        break;
    }
    if (!url && out == FAIL && !q->err)
        out = fail(q, -ENOMEM, "%s", "out of memory");
    free(url);
    return out;
}

static unsigned env_unsigned(const char *name, unsigned dflt)
{
    const char *v = getenv(name);
    return v && *v ? (unsigned)strtoul(v, NULL, 10) : dflt;
}

/* q, retried on connection errors, timeouts, 429 and 5xx within the bounds. 0 or q->err. */
static int run(request *q)
{
    unsigned tries = q->tries ? q->tries : env_unsigned("CKPTFS_HTTP_TRIES", HTTP_TRIES);
    double budget = q->budget_s ? q->budget_s
                                : env_unsigned("CKPTFS_HTTP_BUDGET", (unsigned)HTTP_BUDGET_S);
    double start = now_s();
    CURL *h = q->o ? take_handle(q->o) : cu.easy_init();
    if (!h) {
        if (q->o)
            give_handle(q->o, NULL);
        return fail(q, -ENOMEM, "%s", "out of memory"), q->err;
    }
    unsigned k = 0;
    for (;;) {
        q->err = 0;
        enum outcome out = attempt(q, h, budget - (now_s() - start));
        if (out == DONE)
            break;
        double wait = http_backoff(++k, q->r.retry_after[0]
                                            ? http_retry_after(q->r.retry_after, (double)time(NULL))
                                            : -1,
                                   (double)rand() / ((double)RAND_MAX + 1));
        if (out == FAIL || k >= tries || now_s() - start + wait >= budget)
            break;
        usleep((useconds_t)(wait * 1e6));
    }
    if (q->o)
        give_handle(q->o, h);
    else
        cu.easy_cleanup(h);
    return q->err;
}

int http_target_fetch(void *ctx, unsigned char *buf, size_t len, uint64_t off, unsigned tries)
{
    http_target *o = ctx;
    request q = {.client = &o->client, .o = o, .url = o->url, .first = off,
                 .last = off + len - 1, .tries = tries, .r = {.dst = buf, .cap = len}};
    return run(&q);
}

/* --- targets ------------------------------------------------------------------------------ */

void http_target_close(http_target *o)
{
    if (!o)
        return;
    for (unsigned i = 0; i < o->nidle; i++)
        cu.easy_cleanup(o->idle[i]);
    pthread_mutex_destroy(&o->lock);
    pthread_cond_destroy(&o->idle_cv);
    free(o->where);
    free(o->url);
    free(o);
}

/* A new target at url (shown as shown); NULL when memory runs out. */
static http_target *new_target(const http_client *c, const char *url, const char *shown)
{
    http_target *o = calloc(1, sizeof *o);
    if (!o || !(o->url = strdup(url))) {
        free(o);
        return NULL;
    }
    snprintf(o->shown, sizeof o->shown, "%s", shown);
    o->client = *c;
    pthread_mutex_init(&o->lock, NULL);
    pthread_cond_init(&o->idle_cv, NULL);
    return o;
}

http_target *http_target_open(const http_client *c, const char *url, const char *named,
                              const char *what, unsigned char *head, size_t cap, size_t *got,
                              ck_error *err)
{
    char shown[CK_SHOWN_MAX];
    ck_location_shown(named, shown, sizeof shown);
    if (have_curl(shown, err))
        return NULL;
    http_target *o = new_target(c, url, shown);
    if (!o)
        return ck_fail(err, shown, "out of memory"), NULL;
    request q = {.client = c, .o = o, .url = url, .first = 0, .last = cap - 1, .opening = 1,
                 .r = {.dst = head, .cap = cap}};
    if (run(&q) != 0) {
        http_target_close(o);
        ck_fail(err, shown, "cannot open%s%s: %s", what ? " " : "", what ? what : "", q.msg);
        return NULL;
    }
    *got = q.r.got;
    /* A weak ETag never matches If-Match (RFC 9110 compares strongly): Last-Modified then. */
    if (q.r.etag[0] && strncmp(q.r.etag, "W/", 2) != 0)
        snprintf(o->etag, sizeof o->etag, "%s", q.r.etag);
    long ft = q.r.filetime;
    o->mtime = ft >= 0 ? (time_t)ft : 0;
    if (ft >= 0 && !o->etag[0]) {
        struct tm tm;
        time_t t = (time_t)ft;
        strftime(o->since, sizeof o->since, "%a, %d %b %Y %H:%M:%S GMT", gmtime_r(&t, &tm));
    }
    return o;
}

uint64_t http_target_size(const http_target *t)
{
    return t->size;
}

time_t http_target_mtime(const http_target *t)
{
    return t->mtime;
}

const char *http_target_shown(const http_target *t)
{
    return t->shown;
}

int http_target_changed(const http_target *t)
{
    return atomic_load(&t->changed);
}

int http_target_key(const http_target *t, dc_key *key)
{
    return dc_key_of(t->url, t->etag, t->since, t->size, key);
}

void http_target_stats(const http_target *t, uint64_t *requests, uint64_t *bytes)
{
    *requests = atomic_load(&t->requests);
    *bytes = atomic_load(&t->bytes);
}

int http_get(const http_client *c, const char *url, size_t max, char **body, size_t *len,
             ck_error *err)
{
    return http_request_doc(c, url, &(http_doc_request){0}, max, body, len, err);
}

int http_request_doc(const http_client *c, const char *url, const http_doc_request *how,
                     size_t max, char **body, size_t *len, ck_error *err)
{
    char shown[1024];
    ck_location_shown(url, shown, sizeof shown);
    *body = NULL;
    if (have_curl(shown, err))
        return -1;
    request q = {.client = c, .url = url, .method = how->method, .form = how->form,
                 .extra = how->headers,
                 .tries = how->tries, .budget_s = how->budget_s, .first = 1, .last = 0,
                 .no_redirects = how->no_redirects,
                 .r = {.grow = body, .cap = max}};
    if (run(&q) != 0) {
        free(*body);
        *body = NULL;
        return ck_fail(err, shown, "%s", q.msg);
    }
    if (!*body && !(*body = malloc(1)))
        return ck_fail(err, shown, "out of memory");
    (*body)[q.r.got] = 0;
    *len = q.r.got;
    return 0;
}
