/* http.c — remote source files over HTTP(S) through libcurl, loaded on first use (http.h). */
#include "http.h"
#include "diskcache.h"
#include "location.h"
#include "size.h" /* parse_size: CKPTFS_CACHE_MAX */

#include <curl/curl.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* --- the pieces --------------------------------------------------------------------------- */

int http_is_url(const char *loc)
{
    return ck_location_scheme(loc) == CK_SCHEME_HTTP;
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

/* The origin of url: its scheme, host (lowercased) and port, as "scheme://host:port". */
static void origin(const char *url, char *out, size_t cap)
{
    int https = strncasecmp(url, "https://", 8) == 0;
    const char *h = strstr(url, "://");
    h = h ? h + 3 : url;
    size_t n = strcspn(h, "/?#");
    const char *at = memchr(h, '@', n); /* userinfo is not the host */
    while (at) {
        n -= (size_t)(at + 1 - h);
        h = at + 1;
        at = memchr(h, '@', n);
    }
    const char *colon = NULL;
    if (n && h[0] == '[') { /* an IPv6 literal: its port follows the ']' */
        const char *close = memchr(h, ']', n);
        colon = close && (size_t)(close - h) + 1 < n && close[1] == ':' ? close + 1 : NULL;
    } else {
        colon = memchr(h, ':', n);
    }
    size_t hostlen = colon ? (size_t)(colon - h) : n;
    const char *port = colon ? colon + 1 : https ? "443" : "80";
    size_t portlen = colon ? n - hostlen - 1 : strlen(port);
    int k = snprintf(out, cap, "%s://%.*s:%.*s", https ? "https" : "http", (int)hostlen, h,
                     (int)portlen, port);
    for (int i = 0; i < k && (size_t)i < cap; i++)
        out[i] = (char)(out[i] >= 'A' && out[i] <= 'Z' ? out[i] + 32 : out[i]);
}

int http_same_origin(const char *a, const char *b)
{
    char oa[512], ob[512];
    origin(a, oa, sizeof oa);
    origin(b, ob, sizeof ob);
    return strcmp(oa, ob) == 0;
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

uint64_t http_next_window(uint64_t window, int sequential)
{
    if (!sequential)
        return 0;
    if (window < HTTP_FLOOR)
        return HTTP_FLOOR;
    return window * 2 > HTTP_MAX_WINDOW ? HTTP_MAX_WINDOW : window * 2;
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
} cu;
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

static http_config config;
static char *config_cacert, *config_cache_dir;
static _Atomic(http_token_fn) token_source;

void http_set_token_source(http_token_fn fn)
{
    atomic_store(&token_source, fn);
}

void http_configure(const http_config *c)
{
    free(config_cacert);
    free(config_cache_dir);
    config_cacert = c->cacert ? strdup(c->cacert) : NULL;
    config_cache_dir = c->cache_dir ? strdup(c->cache_dir) : NULL;
    config = *c;
    config.cacert = config_cacert;
    config.cache_dir = config_cache_dir;
}

/* The disk cache, opened on the first URL (options win over the environment): NULL when there
 * is none; disk_err holds why http_open refuses when the configuration is wrong. */
static diskcache *disk;
static ck_error disk_err;
static pthread_once_t disk_once = PTHREAD_ONCE_INIT;

static void open_disk(void)
{
    const char *dir = config.cache_dir ? config.cache_dir : getenv("CKPTFS_CACHE_DIR");
    const char *max_env = getenv("CKPTFS_CACHE_MAX");
    uint64_t max = config.cache_max;
    if (!dir || !*dir)
        return;
    if (!max && max_env && *max_env && !(max = parse_size(max_env, 0))) {
        ck_fail(&disk_err, "CKPTFS_CACHE_MAX", "'%s' is not a size (e.g. 512M, 10G)", max_env);
        return;
    }
    disk = dc_open(dir, max, config.log, &disk_err);
}

static void load_curl(void)
{
    void *so = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!so)
        return;
#define SYM(field, name) (*(void **)&cu.field = dlsym(so, name))
    int ok = SYM(easy_init, "curl_easy_init") && SYM(easy_setopt, "curl_easy_setopt") &&
             SYM(easy_perform, "curl_easy_perform") && SYM(easy_getinfo, "curl_easy_getinfo") &&
             SYM(easy_cleanup, "curl_easy_cleanup") && SYM(easy_reset, "curl_easy_reset") &&
             SYM(slist_append, "curl_slist_append") &&
             SYM(slist_free_all, "curl_slist_free_all") &&
             SYM(easy_strerror, "curl_easy_strerror") && SYM(global_init, "curl_global_init");
#undef SYM
    if (ok && cu.global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK)
        cu.so = so;
    else
        dlclose(so);
}

static int have_curl(const char *url, ck_error *err)
{
    pthread_once(&cu_once, load_curl);
    return cu.so ? 0 : ck_fail(err, url, "cannot load libcurl.so.4 (Debian: libcurl4)");
}

/* --- one request -------------------------------------------------------------------------- */

enum { MAX_HEADER_BYTES = 64 << 10, MAX_DISCARD = 64 << 10, HUGE_PAGE = 2 << 20,
       RECV_BUFFER = 128 << 10 };

typedef struct http_obj http_obj;

/* What one response said, and where its body went. */
typedef struct reply {
    long status;
    char etag[256], range[128], retry_after[64];
    size_t header_bytes;
    unsigned char *dst; /* the body of a 2xx goes here, at most cap bytes */
    size_t cap, got;
    char **grow;        /* http_get: a growing buffer instead (cap is its limit) */
    size_t discarded;
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
    return len;
}

static size_t on_body(char *b, size_t size, size_t n, void *ctx)
{
    reply *r = ctx;
    size_t len = size * n;
    if (r->status < 200 || r->status > 299) { /* an error page or a redirect's: bounded */
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

/* Performs one request on h for url, with headers hs; the reply in *r. */
static CURLcode perform(CURL *h, const char *url, struct curl_slist *hs, reply *r, double left)
{
    cu.easy_reset(h);
    cu.easy_setopt(h, CURLOPT_URL, url);
    cu.easy_setopt(h, CURLOPT_HTTPHEADER, hs);
    cu.easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L); /* followed here, without Authorization */
    cu.easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    cu.easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    cu.easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    cu.easy_setopt(h, CURLOPT_HEADERDATA, r);
    cu.easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    cu.easy_setopt(h, CURLOPT_WRITEDATA, r);
    cu.easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    cu.easy_setopt(h, CURLOPT_TIMEOUT_MS, left > 1 ? (long)(left * 1000) : 1000L);
    cu.easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L); /* a stalled body: abort, retry */
    cu.easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 10L);
    cu.easy_setopt(h, CURLOPT_FILETIME, 1L);
    cu.easy_setopt(h, CURLOPT_USERAGENT, "ckptfs");
    /* Receives of up to RECV_BUFFER bytes, not libcurl's 16 KiB: fewer recv calls and write
     * callbacks per block cut the daemon's CPU time in a sequential read by a fifth (1.10 to
     * 0.90 s per GiB; 512 KiB: 0.85 s, but per handle kept, 8 per object). */
    cu.easy_setopt(h, CURLOPT_BUFFERSIZE, (long)RECV_BUFFER);
    const char *ca = config.cacert ? config.cacert : getenv("CKPTFS_CACERT"); /* options win */
    if (ca && *ca)
        cu.easy_setopt(h, CURLOPT_CAINFO, ca);
    return cu.easy_perform(h);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* --- remote objects --------------------------------------------------------------------- */

struct http_obj {
    char *url;                /* as given: what a redirect target expires back to */
    char shown[1024];         /* url as shown in messages (ck_location_shown) */
    char *where;              /* the last redirect's target, tried first (lock) */
    char etag[256];           /* strong, "" when the server gave none */
    char since[64];           /* If-Unmodified-Since's date when there is no strong ETag */
    uint64_t size;
    unsigned char *head;      /* bytes [0, head_len) from the open */
    size_t head_len;
    pthread_mutex_t lock;     /* where, idle */
    pthread_cond_t idle_cv;
    CURL *idle[2 * HTTP_CONNECTIONS];
    unsigned nidle, busy;     /* handles kept; handles lent out */
    uint64_t window, next;    /* readahead: the window; where the last read ended (cache lock) */
    uint64_t from;            /* where the last read began (cache lock) */
    uint64_t *bounds;         /* where tensors begin and end, sorted (http_hint; cache lock) */
    size_t nbounds;
    atomic_uint_fast64_t requests, bytes;
    atomic_int changed;
    atomic_int failing;       /* the last block fetched failed: no readahead until one works */
    dc_key key;               /* in the disk cache, when keyed */
    int keyed;
    /* How the cache's blocks and the large reads get their bytes: ranged GETs (http_fetch), or
     * the transport http_open_fetch was given. */
    http_fetch_fn fetch;
    void *fetch_ctx;
};

static CURL *take_handle(http_obj *o)
{
    pthread_mutex_lock(&o->lock);
    while (o->busy >= HTTP_CONNECTIONS)
        pthread_cond_wait(&o->idle_cv, &o->lock);
    o->busy++;
    CURL *h = o->nidle ? o->idle[--o->nidle] : NULL;
    pthread_mutex_unlock(&o->lock);
    return h ? h : cu.easy_init();
}

static void give_handle(http_obj *o, CURL *h)
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
    http_obj *o;
    const char *url;          /* the object's URL */
    uint64_t first, last;     /* the range; last < first: the whole document */
    int opening;              /* no validator yet: learn it */
    unsigned tries;           /* attempts at most; 0: HTTP_TRIES or CKPTFS_HTTP_TRIES */
    reply r;
    char msg[256];            /* why it failed */
    int err;                  /* -errno when it failed */
} request;

static enum outcome fail(request *q, int e, const char *fmt, const char *arg)
{
    snprintf(q->msg, sizeof q->msg, fmt, arg);
    q->err = e;
    return FAIL;
}

/* The headers of a request of q to url: range, validator, and the token only for its origin. */
static struct curl_slist *headers(const request *q, const char *url)
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
    http_token_fn token_for = atomic_load(&token_source);
    char *auth = token_for && http_same_origin(url, q->url) ? token_for(q->url) : NULL;
    if (auth) {
        char *a = NULL;
        if (asprintf(&a, "Authorization: Bearer %s", auth) >= 0) {
            hs = cu.slist_append(hs, a);
            memset(a, 0, strlen(a));
            free(a);
        }
        memset(auth, 0, strlen(auth));
        free(auth);
    }
    hs = cu.slist_append(hs, "Accept-Encoding: identity");
    return hs;
}

/* Checks a 2xx reply of q against what was asked. */
static enum outcome check_body(request *q)
{
    reply *r = &q->r;
    http_obj *o = q->o;
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
    http_obj *o = q->o;
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
        struct curl_slist *hs = headers(q, url);
        q->r = (reply){.dst = q->r.dst, .cap = q->r.cap, .grow = q->r.grow};
        CURLcode c = perform(h, url, hs, &q->r, left);
        cu.slist_free_all(hs);
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
            char s[24];
            snprintf(s, sizeof s, "%ld", st);
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
            char s[24];
            snprintf(s, sizeof s, "%ld", st);
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
    double budget = env_unsigned("CKPTFS_HTTP_BUDGET", (unsigned)HTTP_BUDGET_S);
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

/* Reads [off, off+len) of the object ctx straight into buf, one request (tried at most tries
 * times; 0: as configured): the transport of a URL. */
static int http_fetch(void *ctx, unsigned char *buf, size_t len, uint64_t off, unsigned tries)
{
    http_obj *o = ctx;
    request q = {.o = o, .url = o->url, .first = off, .last = off + len - 1, .tries = tries,
                 .r = {.dst = buf, .cap = len}};
    return run(&q);
}

/* [off, off+len) of o into buf through its transport. */
static int get_range(http_obj *o, unsigned char *buf, size_t len, uint64_t off, unsigned tries)
{
    return o->fetch(o->fetch_ctx, buf, len, off, tries);
}

/* --- the block cache ----------------------------------------------------------------------- */

/* A block is filled in pages: a random read fetches only the pages around what it asks (within
 * its tensor), a sequential one whole blocks. One 4 MiB buffer per block, as before, keeps the
 * cache's accounting (cache_mem counts buffers) and its keys (object, block index) as they were;
 * a block of few valid pages holds the rest of its buffer unused, the price of not keeping a
 * second structure for small ranges. */
#define PAGES (HTTP_BLOCK / HTTP_PAGE)
_Static_assert(PAGES == 64, "a block's pages are the bits of a uint64_t");

typedef struct block {
    http_obj *o;
    uint64_t at;          /* a multiple of HTTP_BLOCK */
    unsigned char *data;
    size_t len;
    uint64_t used;        /* LRU stamp */
    uint64_t valid;       /* pages holding the object's bytes */
    uint64_t loading;     /* pages a fetch is writing: the block is not evicted */
    uint64_t ahead;       /* pages fetched as readahead that no read has needed yet */
    uint64_t failed;      /* pages whose fetch failed: the read that needs them takes err */
    int err;
    unsigned pins;        /* readers copying out of it without the lock, holds (op_hold), or
                           * its store to the disk cache: not evicted, its buffer not reused */
    int passed;           /* a read reached the last byte of the whole block: streamed through,
                           * likely done with */
    int on_disk;          /* in the disk cache (pages came from there, or it was stored) */
} block;

/* Every block's buffer holds HTTP_BLOCK bytes; bytes counts them all, in use or spare. Spare
 * buffers are reused rather than freed while the cache is within its limit: the daemon's memory
 * then stays at what the limit allows, not at what a fragmented heap grows to. */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t done;
    block *v;
    size_t n, cap;
    uint64_t bytes, clock;
    unsigned char *spare;     /* a list, linked through each buffer's first bytes */
} cache = {.lock = PTHREAD_MUTEX_INITIALIZER, .done = PTHREAD_COND_INITIALIZER};

static uint64_t cache_limit(void)
{
    return config.cache_mem ? config.cache_mem : HTTP_CACHE_MEM_DEFAULT;
}

/* The pages of a block that bytes [from, to) of it touch (from < to <= HTTP_BLOCK). */
static uint64_t pages_of(uint64_t from, uint64_t to)
{
    uint64_t a = from / HTTP_PAGE, b = (to - 1) / HTTP_PAGE;
    return (b == PAGES - 1 ? ~0ull : (1ull << (b + 1)) - 1) & ~((1ull << a) - 1);
}

static block *find_block(const http_obj *o, uint64_t at)
{
    for (size_t i = 0; i < cache.n; i++)
        if (cache.v[i].o == o && cache.v[i].at == at)
            return &cache.v[i];
    return NULL;
}

/* A buffer no block uses: spare, or freed when the cache is over its limit. */
static void release(unsigned char *data)
{
    if (cache.bytes > cache_limit()) {
        munmap(data, HTTP_BLOCK);
        cache.bytes -= HTTP_BLOCK;
        return;
    }
    memcpy(data, &cache.spare, sizeof cache.spare);
    cache.spare = data;
}

static void drop_block(size_t i)
{
    release(cache.v[i].data);
    cache.v[i] = cache.v[--cache.n];
}

/* Drops the least recently used block that no fetch writes and was last used before stamp
 * keep (what the read in progress uses stays), of those passed when `passed`; 0 when there is
 * none. */
static int evict_lru(uint64_t keep, int passed)
{
    size_t lru = SIZE_MAX;
    for (size_t i = 0; i < cache.n; i++)
        if (!cache.v[i].loading && !cache.v[i].pins && cache.v[i].used < keep &&
            (!passed || cache.v[i].passed) &&
            (lru == SIZE_MAX || cache.v[i].used < cache.v[lru].used))
            lru = i;
    if (lru != SIZE_MAX)
        drop_block(lru);
    return lru != SIZE_MAX;
}

/* A new block buffer, counted: HTTP_BLOCK bytes mapped on their own, aligned to and advised
 * into huge pages (a hint). A block's first fill then faults twice, not 1,024 times: page faults
 * were a tenth of the daemon's time in a sequential read while the cache grows to its limit
 * (perf). Mapped, not malloc'ed: an aligned malloc leaves fragments in the heap that grew the
 * daemon's RSS past cache_mem + 32 MiB under a small cache. */
static unsigned char *new_buffer(void)
{
    size_t span = HTTP_BLOCK + HUGE_PAGE;
    unsigned char *m =
        mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    size_t lead = (size_t)(-(uintptr_t)m & (HUGE_PAGE - 1));
    if (lead)
        munmap(m, lead);
    munmap(m + lead + HTTP_BLOCK, span - lead - HTTP_BLOCK);
    madvise(m + lead, HTTP_BLOCK, MADV_HUGEPAGE);
    cache.bytes += HTTP_BLOCK;
    return m + lead;
}

/* A buffer for a block: a spare, a block's that reads have passed, a new one within the limit,
 * the least recently used block's; past the limit only for a read that needs it (not optional:
 * readahead is). NULL when none. A passed block's buffer comes before a new one: a sequential
 * read does not come back for bytes the kernel's page cache now holds, and fresh memory is dear
 * (zeroing the new huge pages was a third of the daemon's time in a sequential read, perf, while
 * the cache grew to its limit); the cache then stays near the readahead window's size. */
static unsigned char *take_buffer(int optional, uint64_t keep)
{
    for (;;) {
        if (cache.spare) {
            unsigned char *d = cache.spare;
            memcpy(&cache.spare, d, sizeof cache.spare);
            return d;
        }
        int fits = cache.bytes + HTTP_BLOCK <= cache_limit();
        if (evict_lru(keep, 1) || (!fits && evict_lru(keep, 0)))
            continue;
        if (!fits && optional)
            return NULL;
        return new_buffer();
    }
}

/* The length of o's block at `at`: HTTP_BLOCK but for the last. */
static size_t block_len(const http_obj *o, uint64_t at)
{
    return (size_t)(o->size - at < HTTP_BLOCK ? o->size - at : HTTP_BLOCK);
}

/* o's block at `at`, cached or new (no page valid yet); NULL when there is no room for it
 * (optional: readahead) or no memory. Blocks used since stamp keep are not evicted for it.
 * Under the lock. */
static block *get_block(http_obj *o, uint64_t at, int optional, uint64_t keep)
{
    block *had = find_block(o, at);
    if (had)
        return had;
    size_t len = block_len(o, at);
    if (cache.n == cache.cap) {
        size_t cap = cache.cap ? 2 * cache.cap : 64;
        block *v = realloc(cache.v, cap * sizeof *v);
        if (!v)
            return NULL;
        cache.v = v;
        cache.cap = cap;
    }
    unsigned char *data = take_buffer(optional, keep);
    if (!data)
        return NULL;
    block *b = &cache.v[cache.n++];
    *b = (block){.o = o, .at = at, .data = data, .len = len, .used = ++cache.clock};
    return b;
}

/* Block `at` of o (len bytes) into data: from the disk cache when it has it, else fetched (tried
 * at most tries times; 0: as configured) and stored there. */
static int fetch_block(http_obj *o, unsigned char *data, size_t len, uint64_t at, unsigned tries)
{
    int cached = disk && o->keyed;
    if (cached && dc_get(disk, &o->key, at / HTTP_BLOCK, data, len, 0, len) == 0)
        return 0;
    int rc = get_range(o, data, len, at, tries);
    if (rc == 0 && cached)
        dc_put(disk, &o->key, at / HTTP_BLOCK, data, len);
    return rc;
}

typedef struct fetch {
    http_obj *o;
    uint64_t at;          /* the block */
    uint64_t pages;       /* a run of its pages */
    size_t from, len;     /* their bytes in the block */
    unsigned char *data;
    int ahead;
} fetch;

/* Unpins the block whose buffer is data (under the cache lock). Blocks move in the array (it is
 * realloc'ed, dropped blocks are swapped out), but a pinned block keeps its buffer. */
static void unpin_block(const unsigned char *data)
{
    for (size_t i = 0; i < cache.n; i++)
        if (cache.v[i].data == data) {
            cache.v[i].pins--;
            return;
        }
}

/* Writes b, whole now, to the disk cache. Pinned meanwhile, so that neither eviction nor
 * free_obj takes its buffer; its pages are all valid, so no fetch writes them. Under the cache
 * lock, which it drops while writing. */
static void store_block(block *b)
{
    const dc_key *key = &b->o->key;
    uint64_t index = b->at / HTTP_BLOCK;
    const unsigned char *data = b->data;
    size_t len = b->len;
    b->on_disk = 1;
    b->pins++;
    pthread_mutex_unlock(&cache.lock);
    dc_put(disk, key, index, data, len);
    pthread_mutex_lock(&cache.lock);
    unpin_block(data);
    pthread_cond_broadcast(&cache.done); /* free_obj may wait for it */
}

/* Fetches f's pages: from the disk cache when it holds their block (only those bytes are
 * written: the block's other pages may be another fetch's), else from the server; the fetch
 * that makes a block whole stores it there, unless its pages came from there. */
static void *fetch_main(void *arg)
{
    fetch *f = arg;
    http_obj *o = f->o;
    int cached = disk && o->keyed;
    int from_disk = cached && dc_get(disk, &o->key, f->at / HTTP_BLOCK, f->data,
                                     block_len(o, f->at), f->from, f->len) == 0;
    int rc = from_disk ? 0
                       : get_range(o, f->data + f->from, f->len, f->at + f->from,
                                   f->ahead ? 1 : 0);
    if (!from_disk)
        atomic_store(&o->failing, rc != 0);
    pthread_mutex_lock(&cache.lock);
    block *b = find_block(o, f->at); /* loading: never evicted meanwhile */
    b->loading &= ~f->pages;
    int completes = 0;
    if (rc == 0) {
        uint64_t whole = pages_of(0, b->len);
        completes = b->valid != whole && (b->valid | f->pages) == whole;
        b->valid |= f->pages;
        b->on_disk |= from_disk;
    } else {
        b->ahead &= ~f->pages;
        if (!f->ahead) { /* a reader waits for them: it takes the failure */
            b->failed |= f->pages;
            b->err = rc;
        }
    }
    pthread_cond_broadcast(&cache.done);
    if (completes && cached && !b->on_disk)
        store_block(b);
    pthread_mutex_unlock(&cache.lock);
    free(f);
    return (void *)(intptr_t)rc;
}

/* Starts fetching pages (a run) of block b; ahead: readahead, asked once. On a thread of its
 * own, or, when mine is given and still empty, left there for the caller to run (fetch_main,
 * without the lock): the read that waits for it anyway spares a thread's start and wake-up.
 * Under the cache lock. */
static int start_fetch(block *b, uint64_t pages, int ahead, fetch **mine)
{
    fetch *f = malloc(sizeof *f);
    pthread_t t;
    size_t first = (size_t)__builtin_ctzll(pages), end = PAGES - (size_t)__builtin_clzll(pages);
    size_t from = first * HTTP_PAGE, to = end * HTTP_PAGE < b->len ? end * HTTP_PAGE : b->len;
    if (f) {
        *f = (fetch){.o = b->o, .at = b->at, .pages = pages, .from = from, .len = to - from,
                     .data = b->data, .ahead = ahead};
        b->loading |= pages;
        if (mine && !*mine) {
            *mine = f;
            return 0;
        }
        if (pthread_create(&t, NULL, fetch_main, f) == 0) {
            pthread_detach(t);
            return 0;
        }
        b->loading &= ~pages;
    }
    free(f);
    return -ENOMEM;
}

/* Fetches the pages of b in mask that are neither held nor coming, a request per run (one of
 * those the read needs may be left in *mine: start_fetch). A run holding none of the pages the
 * read needs is readahead (asked once); with mark, the pages beyond need are marked ahead: the
 * read that first needs them widens the window. */
static int fill(block *b, uint64_t mask, uint64_t need, int mark, fetch **mine)
{
    uint64_t missing = mask & ~b->valid & ~b->loading;
    while (missing) {
        uint64_t run = missing & ~(missing + (missing & -missing)); /* the lowest run of bits */
        int ahead = !(run & need);
        int rc = start_fetch(b, run, ahead, ahead ? NULL : mine);
        if (rc)
            return ahead ? 0 : rc;
        if (mark)
            b->ahead |= run & ~need;
        missing &= ~run;
    }
    return 0;
}

/* Whether fetches of o are still running, or its blocks being stored (under the cache lock). */
static int busy(const http_obj *o)
{
    for (size_t i = 0; i < cache.n; i++)
        if (cache.v[i].o == o && (cache.v[i].loading || cache.v[i].pins))
            return 1;
    return 0;
}

/* Where the tensor holding byte off ends: the first boundary after it (http_hint), else the
 * object's end. */
static uint64_t tensor_end(const http_obj *o, uint64_t off)
{
    size_t lo = 0, hi = o->nbounds;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (o->bounds[mid] <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < o->nbounds ? o->bounds[lo] : o->size;
}

/* Notes a read of [off, off+len) of o, and starts fetching the pages it needs and those its
 * readahead window covers (under the cache lock; blocks used since stamp keep are not evicted
 * for it; one fetch may be left in *mine: start_fetch). A read that finds its pages neither held
 * nor coming, at a place the reads so far did not lead to (random), fetches at least HTTP_FLOOR
 * bytes from it, within its tensor; a sequential one widens the readahead window when it misses
 * or first needs pages fetched ahead, and keeps the window's blocks coming, whole. */
static int start_reads(http_obj *o, size_t len, uint64_t off, uint64_t keep, fetch **mine)
{
    uint64_t end = off + len, first = off / HTTP_BLOCK * HTTP_BLOCK;
    /* A later piece of a read lent a block at a time (op_hold) was noted with the first: a
     * random read across two blocks must not look sequential for its second. */
    if (off > o->from && end == o->next)
        return 0;
    /* Sequential within a block: the kernel's reads of one stream reach several threads of the
     * daemon, and arrive a little out of order. */
    int seq = off <= o->next + HTTP_BLOCK && off + HTTP_BLOCK >= o->next;
    o->next = seq && end < o->next ? o->next : end;
    o->from = off;
    int missed = 0, fresh = 0;
    for (uint64_t at = first; at < end; at += HTTP_BLOCK) {
        block *b = find_block(o, at);
        uint64_t to = end - at < HTTP_BLOCK ? end - at : HTTP_BLOCK;
        uint64_t need = pages_of(off > at ? off - at : 0, to);
        missed |= !b || (need & ~b->valid & ~b->loading) != 0;
        fresh |= b && (need & b->ahead) != 0;
        if (b)
            b->ahead &= ~need;
    }
    o->window = !seq ? 0 : missed || fresh ? http_next_window(o->window, 1) : o->window;
    uint64_t want = end;
    if (!seq && missed) {
        uint64_t floor = off + HTTP_FLOOR, stop = tensor_end(o, off);
        want = floor < stop ? floor : stop;
        want = want > end ? want : end;
    } else if (!atomic_load(&o->failing) && o->window) {
        want = end + o->window;
        /* A long stream: whole blocks, the fewest requests; with a disk cache, any stream: a
         * block is stored only whole, and a reader that goes on is likely to read it all. */
        if (o->window >= HTTP_BLOCK || (disk && o->keyed))
            want = (want + HTTP_BLOCK - 1) / HTTP_BLOCK * HTTP_BLOCK;
    }
    want = want < o->size ? want : o->size;
    int rc = 0;
    for (uint64_t at = first; at < want && rc == 0; at += HTTP_BLOCK) {
        int beyond = at >= end; /* readahead only */
        block *b = get_block(o, at, beyond, keep);
        if (!b)
            return beyond ? 0 : -ENOMEM;
        if (at < end)
            b->used = ++cache.clock;
        uint64_t from = off > at ? off - at : 0, to = want - at < b->len ? want - at : b->len;
        uint64_t need = end > at ? pages_of(from, end - at < b->len ? end - at : b->len) : 0;
        rc = fill(b, pages_of(from, to), need, seq, mine);
    }
    return rc;
}

/* Runs the fetch start_reads left to the read (under the cache lock, dropped meanwhile): its
 * pages are loading, so nothing evicts their block. */
static void run_mine(fetch *mine)
{
    if (!mine)
        return;
    pthread_mutex_unlock(&cache.lock);
    fetch_main(mine);
    pthread_mutex_lock(&cache.lock);
}

/* Waits (under the cache lock) until the pages of o's block at `at` that [off, end) covers are
 * held, fetching again those that failed or were dropped for room, and pins the block: it stays
 * in the cache, its data in place, until unpin_block. 0, or -errno (a failure is taken: the
 * next read asks again). */
static int pin_pages(http_obj *o, uint64_t at, uint64_t off, uint64_t end, uint64_t keep,
                     block **out)
{
    uint64_t from = off > at ? off - at : 0;
    for (;;) {
        block *b = get_block(o, at, 0, keep);
        if (!b)
            return -ENOMEM;
        uint64_t to = end - at < b->len ? end - at : b->len;
        uint64_t need = pages_of(from, to);
        if (need & b->failed) {
            b->failed = 0;
            return b->err;
        }
        if (need & ~b->valid) { /* coming (or dropped for room: asked again) */
            int rc = fill(b, need, need, 0, NULL);
            if (rc)
                return rc;
            if (need & ~b->valid & b->loading)
                pthread_cond_wait(&cache.done, &cache.lock);
            continue;
        }
        b->used = ++cache.clock;
        b->pins++;
        /* Passed: a read reached the last byte of a whole block (a stream's; a random read's
         * pages rarely make one whole). */
        b->passed |= to == b->len && b->valid == pages_of(0, b->len);
        *out = b;
        return 0;
    }
}

/* Copies [off, off+len) out of the cache, a block at a time, waiting for its pages. Under the
 * cache lock, which it drops while copying. */
static int copy_out(http_obj *o, unsigned char *buf, size_t len, uint64_t off, uint64_t keep)
{
    uint64_t end = off + len;
    for (uint64_t at = off / HTTP_BLOCK * HTTP_BLOCK; at < end; at += HTTP_BLOCK) {
        block *b;
        int rc = pin_pages(o, at, off, end, keep, &b);
        if (rc)
            return rc;
        uint64_t from = off > at ? off - at : 0;
        uint64_t to = end - at < b->len ? end - at : b->len;
        /* The copy runs unlocked, the block pinned: the other readers' copies and the fetches'
         * completions do not queue behind it. */
        const unsigned char *data = b->data;
        pthread_mutex_unlock(&cache.lock);
        memcpy(buf + (at + from - off), data + from, (size_t)(to - from));
        pthread_mutex_lock(&cache.lock);
        unpin_block(data);
    }
    return 0;
}

/* Reads [off, off+len) (within one or two blocks) through the cache. */
static int read_cached(http_obj *o, unsigned char *buf, size_t len, uint64_t off)
{
    pthread_mutex_lock(&cache.lock);
    uint64_t keep = cache.clock + 1; /* what this read touches stays until it has copied */
    fetch *mine = NULL;
    int rc = start_reads(o, len, off, keep, &mine);
    run_mine(mine);
    if (rc == 0)
        rc = copy_out(o, buf, len, off, keep);
    pthread_mutex_unlock(&cache.lock);
    return rc ? rc : atomic_load(&o->changed) ? -EIO : 0;
}

typedef struct part {
    http_obj *o;
    unsigned char *buf;
    size_t len;
    uint64_t off;
    int rc;
} part;

static void *part_main(void *arg)
{
    part *p = arg;
    p->rc = get_range(p->o, p->buf, p->len, p->off, 0);
    return NULL;
}

/* A large read with a disk cache: the blocks it touches, taken in turn by up to
 * HTTP_CONNECTIONS threads, each block whole (fetch_block); a block the read covers only in
 * part goes through a buffer of the thread's. */
typedef struct blocks {
    http_obj *o;
    unsigned char *buf;
    size_t len;
    uint64_t off, last;       /* last: the index of the last block */
    atomic_uint_fast64_t next; /* the index of the next block to take */
    atomic_int rc;
} blocks;

static int copy_block(blocks *j, uint64_t i, unsigned char **bounce)
{
    uint64_t at = i * HTTP_BLOCK, end = j->off + j->len;
    size_t blen = block_len(j->o, at);
    uint64_t from = at > j->off ? at : j->off, to = at + blen < end ? at + blen : end;
    if (from == at && to == at + blen)
        return fetch_block(j->o, j->buf + (at - j->off), blen, at, 0);
    if (!*bounce && !(*bounce = malloc(HTTP_BLOCK)))
        return -ENOMEM;
    int rc = fetch_block(j->o, *bounce, blen, at, 0);
    if (rc == 0)
        memcpy(j->buf + (from - j->off), *bounce + (from - at), (size_t)(to - from));
    return rc;
}

static void *blocks_main(void *arg)
{
    blocks *j = arg;
    unsigned char *bounce = NULL;
    for (uint64_t i; !atomic_load(&j->rc) && (i = atomic_fetch_add(&j->next, 1)) <= j->last;) {
        int rc = copy_block(j, i, &bounce);
        if (rc)
            atomic_compare_exchange_strong(&j->rc, &(int){0}, rc);
    }
    free(bounce);
    return NULL;
}

static int read_blocks(http_obj *o, unsigned char *buf, size_t len, uint64_t off)
{
    blocks j = {.o = o, .buf = buf, .len = len, .off = off, .last = (off + len - 1) / HTTP_BLOCK};
    atomic_init(&j.next, off / HTTP_BLOCK);
    atomic_init(&j.rc, 0);
    uint64_t count = j.last - off / HTTP_BLOCK + 1;
    size_t n = count < HTTP_CONNECTIONS ? (size_t)count : HTTP_CONNECTIONS;
    pthread_t t[HTTP_CONNECTIONS];
    size_t started = 0;
    while (started + 1 < n && pthread_create(&t[started], NULL, blocks_main, &j) == 0)
        started++;
    blocks_main(&j);
    for (size_t i = 0; i < started; i++)
        pthread_join(t[i], NULL);
    return atomic_load(&j.rc);
}

/* A large read, in up to HTTP_CONNECTIONS parallel requests of at least HTTP_BLOCK bytes. */
static int read_direct(http_obj *o, unsigned char *buf, size_t len, uint64_t off)
{
    if (disk && o->keyed)
        return read_blocks(o, buf, len, off);
    size_t n = len / HTTP_BLOCK < HTTP_CONNECTIONS ? len / HTTP_BLOCK : HTTP_CONNECTIONS;
    size_t each = (len + n - 1) / n;
    part parts[HTTP_CONNECTIONS];
    pthread_t t[HTTP_CONNECTIONS];
    int started[HTTP_CONNECTIONS] = {0}, rc = 0;
    for (size_t i = 0; i < n; i++) {
        size_t at = i * each, k = len - at < each ? len - at : each;
        parts[i] = (part){.o = o, .buf = buf + at, .len = k, .off = off + at};
        started[i] = i + 1 < n && pthread_create(&t[i], NULL, part_main, &parts[i]) == 0;
        if (!started[i])
            part_main(&parts[i]);
    }
    for (size_t i = 0; i < n; i++) {
        if (started[i])
            pthread_join(t[i], NULL);
        rc = rc ? rc : parts[i].rc;
    }
    return rc;
}

/* --- the ops ------------------------------------------------------------------------------ */

/* Whether [off, off+len) cannot be read from o: it changed, or the range passes its end. */
static int unreadable(const http_obj *o, size_t len, uint64_t off)
{
    return atomic_load(&o->changed) || off > o->size || len > o->size - off;
}

static int op_pread(const ck_file *f, void *buf, size_t len, uint64_t off)
{
    http_obj *o = f->remote;
    if (len == 0) /* nothing to read, anywhere */
        return atomic_load(&o->changed) ? -EIO : 0;
    if (unreadable(o, len, off))
        return -EIO;
    if (off + len <= o->head_len) {
        memcpy(buf, o->head + off, len);
        return 0;
    }
    return len >= HTTP_BLOCK ? read_direct(o, buf, len, off) : read_cached(o, buf, len, off);
}

/* Lends [off, off+len) up to the end of the cached block that holds off, once the pages it
 * covers are held (fetched as a copying read's are): the block stays pinned (never evicted, its
 * buffer never reused) until op_release. The head's bytes are lent as they are. The whole read
 * is noted (readahead, the fetches of the pages it needs in every block) with its first piece. */
static ssize_t op_hold(const ck_file *f, size_t len, uint64_t off, const void **ptr,
                       void **token)
{
    http_obj *o = f->remote;
    if (unreadable(o, len, off))
        return -EIO;
    *token = NULL;
    if (off + len <= o->head_len) {
        *ptr = o->head + off;
        return (ssize_t)len;
    }
    pthread_mutex_lock(&cache.lock);
    uint64_t keep = cache.clock + 1; /* what this read touches stays until it is held */
    fetch *mine = NULL;
    int rc = start_reads(o, len, off, keep, &mine);
    run_mine(mine);
    uint64_t at = off / HTTP_BLOCK * HTTP_BLOCK;
    if (len > at + HTTP_BLOCK - off)
        len = (size_t)(at + HTTP_BLOCK - off);
    block *b = NULL;
    if (rc == 0)
        rc = pin_pages(o, at, off, off + len, keep, &b);
    if (rc == 0 && atomic_load(&o->changed)) {
        unpin_block(b->data);
        rc = -EIO;
    }
    if (rc == 0) {
        *ptr = b->data + (off - at);
        *token = b->data;
    }
    pthread_mutex_unlock(&cache.lock);
    return rc ? rc : (ssize_t)len;
}

static void op_release(const ck_file *f, void *token)
{
    (void)f;
    if (!token) /* the head */
        return;
    pthread_mutex_lock(&cache.lock);
    unpin_block(token);
    pthread_mutex_unlock(&cache.lock);
}

static int op_same(const ck_file *f)
{
    const http_obj *o = f->remote;
    return !atomic_load(&o->changed);
}

static void op_stats(const ck_file *f, uint64_t *requests, uint64_t *bytes)
{
    http_obj *o = f->remote;
    *requests = atomic_load(&o->requests);
    *bytes = atomic_load(&o->bytes);
}

/* Takes a copy of the boundaries (sorted); without memory, reads go on without them. */
static void op_hint(ck_file *f, const uint64_t *bounds, size_t n)
{
    http_obj *o = f->remote;
    uint64_t *copy = n ? malloc(n * sizeof *copy) : NULL;
    if (copy)
        memcpy(copy, bounds, n * sizeof *copy);
    pthread_mutex_lock(&cache.lock);
    free(o->bounds);
    o->bounds = copy;
    o->nbounds = copy ? n : 0;
    pthread_mutex_unlock(&cache.lock);
}

static void free_obj(http_obj *o)
{
    pthread_mutex_lock(&cache.lock);
    while (busy(o)) /* readahead still running, or a store: they use o's blocks */
        pthread_cond_wait(&cache.done, &cache.lock);
    for (size_t i = cache.n; i-- > 0;)
        if (cache.v[i].o == o)
            drop_block(i);
    pthread_mutex_unlock(&cache.lock);
    for (unsigned i = 0; i < o->nidle; i++)
        cu.easy_cleanup(o->idle[i]);
    pthread_mutex_destroy(&o->lock);
    pthread_cond_destroy(&o->idle_cv);
    free(o->where);
    free(o->bounds);
    free(o->url);
    free(o->head);
    free(o);
}

static void op_close(ck_file *f)
{
    free_obj(f->remote);
    f->remote = NULL;
}

static const ck_source_ops http_ops = {
    .pread = op_pread, .same = op_same, .close = op_close, .stats = op_stats, .hint = op_hint,
    .hold = op_hold, .release = op_release,
};

int ck_source_open(const char *loc, const char *what, ck_file *f, ck_error *err)
{
    return http_is_url(loc) ? http_open(loc, what, f, err)
                            : ck_source_open_local(loc, what, f, err);
}

/* The disk cache opened (once), or why not: -1 with err set. */
static int disk_ready(ck_error *err)
{
    pthread_once(&disk_once, open_disk);
    if (!disk_err.msg[0])
        return 0;
    *err = disk_err;
    return -1;
}

/* A new object at url (shown as shown) whose ranges come from transport(ctx, ...), ctx NULL
 * for the object itself; NULL when memory runs out. */
static http_obj *new_obj(const char *url, const char *shown, http_fetch_fn transport, void *ctx)
{
    http_obj *o = calloc(1, sizeof *o);
    if (!o || !(o->url = strdup(url))) {
        free(o);
        return NULL;
    }
    snprintf(o->shown, sizeof o->shown, "%s", shown);
    pthread_mutex_init(&o->lock, NULL);
    pthread_cond_init(&o->idle_cv, NULL);
    o->fetch = transport;
    o->fetch_ctx = ctx ? ctx : o;
    return o;
}

int http_open(const char *url, const char *what, ck_file *f, ck_error *err)
{
    char shown[1024];
    ck_location_shown(url, shown, sizeof shown);
    if (have_curl(shown, err) || disk_ready(err))
        return -1;
    http_obj *o = new_obj(url, shown, http_fetch, NULL);
    if (o && !(o->head = malloc(HTTP_HEAD_BYTES))) {
        free_obj(o);
        o = NULL;
    }
    if (!o)
        return ck_fail(err, shown, "out of memory");
    request q = {.o = o, .url = url, .first = 0, .last = HTTP_HEAD_BYTES - 1, .opening = 1,
                 .r = {.dst = o->head, .cap = HTTP_HEAD_BYTES}};
    if (run(&q) != 0) {
        free_obj(o);
        return ck_fail(err, shown, "cannot open%s%s: %s", what ? " " : "", what ? what : "",
                       q.msg);
    }
    o->head_len = q.r.got;
    /* A weak ETag never matches If-Match (RFC 9110 compares strongly): Last-Modified then. */
    if (q.r.etag[0] && strncmp(q.r.etag, "W/", 2) != 0)
        snprintf(o->etag, sizeof o->etag, "%s", q.r.etag);
    long ft = q.r.filetime;
    if (ft >= 0 && !o->etag[0]) {
        struct tm tm;
        time_t t = (time_t)ft;
        strftime(o->since, sizeof o->since, "%a, %d %b %Y %H:%M:%S GMT", gmtime_r(&t, &tm));
    }
    o->keyed = dc_key_of(url, o->etag, o->since, o->size, &o->key) == 0;
    o->window = 0;
    o->next = o->head_len;
    *f = (ck_file){.path = o->shown, .fd = -1, .size = o->size,
                   .mtime = {.tv_sec = ft >= 0 ? (time_t)ft : 0}, .ops = &http_ops,
                   .remote = o};
    return 0;
}

int http_open_fetch(const char *name, uint64_t size, const char *etag, http_fetch_fn transport,
                    void *ctx, ck_file *f, ck_error *err)
{
    if (disk_ready(err))
        return -1;
    http_obj *o = new_obj(name, name, transport, ctx);
    if (!o)
        return ck_fail(err, name, "out of memory");
    o->size = size;
    o->keyed = etag && dc_key_of(name, etag, "", size, &o->key) == 0;
    *f = (ck_file){.path = o->shown, .fd = -1, .size = size, .ops = &http_ops, .remote = o};
    return 0;
}

int http_get(const char *url, size_t max, char **body, size_t *len, ck_error *err)
{
    char shown[1024];
    ck_location_shown(url, shown, sizeof shown);
    *body = NULL;
    if (have_curl(shown, err))
        return -1;
    request q = {.url = url, .first = 1, .last = 0, .r = {.grow = body, .cap = max}};
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
