/* gcs.c — gs:// locations: Google Cloud Storage's JSON API, its credentials (gcs.h). */
#include "gcs.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#define PREFIX_LEN 5 /* "gs://" */
#define DEFAULT_ENDPOINT "https://storage.googleapis.com"
#define DEFAULT_TOKEN_URI "https://oauth2.googleapis.com/token"
#define SCOPE "https://www.googleapis.com/auth/devstorage.read_only"
#define MAX_KEY_FILE (64u << 10)
#define MAX_METADATA (1u << 20)  /* an object's metadata */
#define REFRESH_MARGIN_S 300     /* a token is asked again this long before it expires */
#define ABSENT_S 900             /* a metadata server that did not answer, not asked again */
#define NO_EXPIRY_S 900          /* a token without expires_in: kept this long */

int gcs_is_url(const char *loc)
{
    return strncmp(loc, "gs://", PREFIX_LEN) == 0;
}

int gcs_parse(const char *loc, gcs_ref *r, ck_error *err)
{
    const char *b = loc + PREFIX_LEN;
    size_t blen = strcspn(b, "/");
    *r = (gcs_ref){0};
    if (!gcs_is_url(loc))
        return ck_fail(err, loc, "not a gs:// location");
    if (blen < 3 || blen >= sizeof r->bucket ||
        strspn(b, "abcdefghijklmnopqrstuvwxyz0123456789._-") < blen)
        return ck_fail(err, loc, "a bucket name is 3 to 222 characters of a-z, 0-9, '.', '_', "
                       "'-'");
    memcpy(r->bucket, b, blen);
    const char *o = b[blen] ? b + blen + 1 : b + blen;
    if (strlen(o) >= sizeof r->object)
        return ck_fail(err, loc, "an object name is at most 1024 bytes");
    if (ck_bad_segments(o, strlen(o)) || strpbrk(o, "?#"))
        return ck_fail(err, loc, "an object name has no empty, '.' or '..' segments, no '?' "
                       "or '#'");
    snprintf(r->object, sizeof r->object, "%s", o);
    return 0;
}

int gcs_endpoint(char *out, size_t cap)
{
    const char *emu = getenv("STORAGE_EMULATOR_HOST"), *ep = getenv("CKPTFS_GCS_ENDPOINT");
    int emulated = emu && *emu;
    const char *v = emulated ? emu : ep && *ep ? ep : DEFAULT_ENDPOINT;
    snprintf(out, cap, "%s%s", strstr(v, "://") ? "" : "http://", v);
    size_t n = strlen(out);
    while (n && out[n - 1] == '/')
        out[--n] = 0;
    return emulated;
}

/* The JSON API's URL of r's bucket's objects ("{endpoint}/storage/v1/b/BUCKET/o") into out. */
static int objects_url(const gcs_ref *r, char *out, size_t cap, size_t *at)
{
    char ep[2048];
    gcs_endpoint(ep, sizeof ep);
    int n = snprintf(out, cap, "%s/storage/v1/b/%s/o", ep, r->bucket);
    *at = n > 0 ? (size_t)n : 0;
    return n > 0 && (size_t)n < cap ? 0 : -1;
}

/* --- credentials ------------------------------------------------------------------------- */

/* libcrypto's functions a JWT needs, looked up at the first one (as libcurl is at the first URL):
 * a program that never signs a service account's token never maps the library. */
static struct {
    void *so;
    int (*encode_block)(unsigned char *, const unsigned char *, int);
    BIO *(*bio_new_mem_buf)(const void *, int);
    int (*bio_free)(BIO *);
    EVP_PKEY *(*read_private_key)(BIO *, EVP_PKEY **, pem_password_cb *, void *);
    int (*key_base_id)(const EVP_PKEY *);
    void (*key_free)(EVP_PKEY *);
    EVP_MD_CTX *(*md_ctx_new)(void);
    void (*md_ctx_free)(EVP_MD_CTX *);
    const EVP_MD *(*sha256)(void);
    int (*sign_init)(EVP_MD_CTX *, EVP_PKEY_CTX **, const EVP_MD *, ENGINE *, EVP_PKEY *);
    int (*sign)(EVP_MD_CTX *, unsigned char *, size_t *, const unsigned char *, size_t);
} crypto;
static pthread_once_t crypto_once = PTHREAD_ONCE_INIT;

#define LIBCRYPTO "libcrypto.so.3"

static void load_crypto(void)
{
    void *so = dlopen(LIBCRYPTO, RTLD_NOW | RTLD_LOCAL);
    if (!so)
        return;
#define SYM(field, name) (*(void **)&crypto.field = dlsym(so, name))
    int ok = SYM(encode_block, "EVP_EncodeBlock") && SYM(bio_new_mem_buf, "BIO_new_mem_buf") &&
             SYM(bio_free, "BIO_free") && SYM(read_private_key, "PEM_read_bio_PrivateKey") &&
             SYM(key_base_id, "EVP_PKEY_get_base_id") && SYM(key_free, "EVP_PKEY_free") &&
             SYM(md_ctx_new, "EVP_MD_CTX_new") && SYM(md_ctx_free, "EVP_MD_CTX_free") &&
             SYM(sha256, "EVP_sha256") && SYM(sign_init, "EVP_DigestSignInit") &&
             SYM(sign, "EVP_DigestSign");
#undef SYM
    if (ok)
        crypto.so = so;
    else
        dlclose(so);
}

/* [p, p+n) in base64url without padding (RFC 7515), malloc'ed, or NULL. */
static char *base64url(const unsigned char *p, size_t n)
{
    char *out = malloc(4 * ((n + 2) / 3) + 1);
    if (!out)
        return NULL;
    int len = crypto.encode_block((unsigned char *)out, p, (int)n);
    for (char *c = out; c < out + len; c++)
        *c = *c == '+' ? '-' : *c == '/' ? '_' : *c;
    while (len && out[len - 1] == '=')
        len--;
    out[len] = 0;
    return out;
}

/* The JSON of obj (deleted) in base64url, malloc'ed, or NULL. */
static char *json_part(cJSON *obj)
{
    char *text = obj ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    char *out = text ? base64url((const unsigned char *)text, strlen(text)) : NULL;
    free(text);
    return out;
}

/* The RS256 signature of data (n bytes) with the PEM key, base64url (malloc'ed), or NULL. */
static char *rs256(const char *pem, const char *data, size_t n)
{
    BIO *b = crypto.bio_new_mem_buf(pem, -1);
    EVP_PKEY *k = b ? crypto.read_private_key(b, NULL, NULL, NULL) : NULL;
    EVP_MD_CTX *m = crypto.md_ctx_new();
    unsigned char *sig = NULL;
    size_t len = 0;
    int ok = k && m && crypto.key_base_id(k) == EVP_PKEY_RSA &&
             crypto.sign_init(m, NULL, crypto.sha256(), NULL, k) == 1 &&
             crypto.sign(m, NULL, &len, (const unsigned char *)data, n) == 1 &&
             (sig = malloc(len)) &&
             crypto.sign(m, sig, &len, (const unsigned char *)data, n) == 1;
    char *out = ok ? base64url(sig, len) : NULL;
    free(sig);
    crypto.md_ctx_free(m);
    crypto.key_free(k);
    crypto.bio_free(b);
    return out;
}

char *gcs_jwt(const char *iss, const char *kid, const char *key_pem, const char *aud,
              const char *scope, time_t now, ck_error *err)
{
    pthread_once(&crypto_once, load_crypto);
    if (!crypto.so)
        return ck_fail(err, "service account key", "cannot load " LIBCRYPTO " (Debian: libssl3), "
                       "which signs its token request"), NULL;
    cJSON *h = cJSON_CreateObject(), *c = cJSON_CreateObject();
    cJSON_AddStringToObject(h, "alg", "RS256");
    cJSON_AddStringToObject(h, "typ", "JWT");
    if (kid && *kid)
        cJSON_AddStringToObject(h, "kid", kid);
    cJSON_AddStringToObject(c, "iss", iss);
    cJSON_AddStringToObject(c, "scope", scope);
    cJSON_AddStringToObject(c, "aud", aud);
    cJSON_AddNumberToObject(c, "iat", (double)now);
    cJSON_AddNumberToObject(c, "exp", (double)now + 3600);
    char *head = json_part(h), *claims = json_part(c), *signing = NULL, *sig = NULL, *jwt = NULL;
    if (head && claims && asprintf(&signing, "%s.%s", head, claims) < 0)
        signing = NULL;
    if (signing && !(sig = rs256(key_pem, signing, strlen(signing))))
        ck_fail(err, "service account key", "its private_key is no RSA key in PEM that "
                "OpenSSL reads");
    else if (!sig || asprintf(&jwt, "%s.%s", signing, sig) < 0)
        jwt = NULL, ck_fail(err, "service account key", "out of memory");
    free(head);
    free(claims);
    free(signing);
    free(sig);
    return jwt;
}

char *gcs_token_reply(const char *body, size_t len, long *expires_in)
{
    cJSON *root = cJSON_ParseWithLength(body, len);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "access_token");
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "expires_in");
    char *tok = cJSON_IsString(t) && t->valuestring[0] ? strdup(t->valuestring) : NULL;
    *expires_in = cJSON_IsNumber(e) && e->valuedouble > 0 && e->valuedouble < 1e7
                      ? (long)e->valuedouble : 0;
    if (cJSON_IsString(t))
        memset(t->valuestring, 0, strlen(t->valuestring));
    cJSON_Delete(root);
    return tok;
}

/* s with every byte but RFC 3986's unreserved ones as %XX, appended to *form. */
static int form_append(char **form, const char *name, const char *s)
{
    char enc[16384];
    size_t at = 0;
    if (ck_url_encode(s, 0, enc, sizeof enc, &at) != 0)
        return -1;
    size_t have = *form ? strlen(*form) : 0;
    char *grown = realloc(*form, have + strlen(name) + at + 3);
    if (!grown)
        return -1;
    sprintf(grown + have, "%s%s=%s", have ? "&" : "", name, enc);
    memset(enc, 0, at);
    *form = grown;
    return 0;
}

/* A string member of a key file's JSON, or NULL. */
static const char *member(const cJSON *root, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    return cJSON_IsString(v) && v->valuestring[0] ? v->valuestring : NULL;
}

/* The token request a key file's JSON asks for: the token URI (*uri) and the form to POST
 * there. 0, or -1 with why set. */
static int key_request(const cJSON *key, const char **uri, char **form, char *why, size_t cap)
{
    const char *type = member(key, "type");
    *uri = member(key, "token_uri") ? member(key, "token_uri") : DEFAULT_TOKEN_URI;
    if (type && strcmp(type, "service_account") == 0) {
        const char *email = member(key, "client_email"), *pem = member(key, "private_key");
        ck_error e;
        char *jwt = email && pem ? gcs_jwt(email, member(key, "private_key_id"), pem, *uri,
                                           SCOPE, time(NULL), &e)
                                 : NULL;
        if (!jwt)
            return snprintf(why, cap, "%.500s", email && pem ? e.msg : "a service_account key "
                            "without client_email or private_key"), -1;
        int rc = form_append(form, "grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer")
                 || form_append(form, "assertion", jwt);
        memset(jwt, 0, strlen(jwt));
        free(jwt);
        return rc ? (snprintf(why, cap, "out of memory"), -1) : 0;
    }
    if (type && strcmp(type, "authorized_user") == 0) {
        const char *id = member(key, "client_id"), *secret = member(key, "client_secret"),
                   *refresh = member(key, "refresh_token");
        if (!id || !secret || !refresh)
            return snprintf(why, cap, "an authorized_user without client_id, client_secret "
                            "or refresh_token"), -1;
        return form_append(form, "grant_type", "refresh_token") ||
                       form_append(form, "client_id", id) ||
                       form_append(form, "client_secret", secret) ||
                       form_append(form, "refresh_token", refresh)
                   ? (snprintf(why, cap, "out of memory"), -1) : 0;
    }
    return snprintf(why, cap, "a key file of type '%.40s', not service_account or "
                    "authorized_user", type ? type : ""), -1;
}

/* The whole of a small file (malloc'ed, NUL-terminated), or NULL. */
static char *read_small(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = f ? malloc(MAX_KEY_FILE + 1) : NULL;
    *len = buf ? fread(buf, 1, MAX_KEY_FILE + 1, f) : 0;
    if (f)
        fclose(f);
    if (buf && *len > MAX_KEY_FILE) {
        memset(buf, 0, *len);
        free(buf);
        return NULL;
    }
    if (buf)
        buf[*len] = 0;
    return buf;
}

/* A token from the key file at path: 1 (*tok, *expires_in), or -1 with why set. */
static int from_key_file(const char *path, char **tok, long *expires_in, char *why, size_t cap)
{
    size_t len;
    char *text = read_small(path, &len), *form = NULL, *body = NULL;
    if (!text)
        return snprintf(why, cap, "%.800s: cannot read the key file (or over 64 KiB)", path), -1;
    cJSON *key = cJSON_ParseWithLength(text, len);
    memset(text, 0, len);
    free(text);
    const char *uri = NULL;
    char what[512];
    int rc = key ? key_request(key, &uri, &form, what, sizeof what)
                 : (snprintf(what, sizeof what, "not JSON"), -1);
    ck_error e;
    http_doc_request post = {.form = form, .no_redirects = 1};
    if (rc == 0 && http_request_doc(&(http_client){0}, uri, &post, GCS_MAX_TOKEN_REPLY, &body,
                                    &len, &e) != 0) {
        snprintf(what, sizeof what, "%.500s", e.msg);
        rc = -1;
    }
    if (rc == 0 && !(*tok = gcs_token_reply(body, len, expires_in))) {
        snprintf(what, sizeof what, "the token endpoint's answer has no access_token");
        rc = -1;
    }
    if (rc)
        snprintf(why, cap, "%.800s: no token from the key file: %s", path, what);
    if (form)
        memset(form, 0, strlen(form));
    if (body)
        memset(body, 0, len);
    free(form);
    free(body);
    cJSON_Delete(key);
    return rc ? -1 : 1;
}

/* A token from the metadata server at host: 1, 0 when nothing answers, -1 (why set). */
static int from_metadata(const char *host, char **tok, long *expires_in, char *why, size_t cap)
{
    char url[1024], *body = NULL;
    size_t len = 0;
    ck_error e;
    snprintf(url, sizeof url, "http://%.900s/computeMetadata/v1/instance/service-accounts/default/"
             "token", host);
    const char *flavor[] = {"Metadata-Flavor: Google", NULL};
    http_doc_request get = {.headers = flavor, .tries = 1, .budget_s = 1, .no_redirects = 1};
    if (http_request_doc(&(http_client){0}, url, &get, GCS_MAX_TOKEN_REPLY, &body, &len, &e))
        return 0; /* not on Google Cloud: no credentials from here */
    *tok = gcs_token_reply(body, len, expires_in);
    memset(body, 0, len);
    free(body);
    if (!*tok)
        return snprintf(why, cap, "the metadata server's answer has no access_token"), -1;
    return 1;
}

/* Where credentials come from (gcs.h's order) into source: "file:PATH" or "metadata:HOST". */
static void credential_source(char *source, size_t cap)
{
    const char *gac = getenv("GOOGLE_APPLICATION_CREDENTIALS");
    const char *cfg = getenv("CLOUDSDK_CONFIG"), *home = getenv("HOME");
    const char *md = getenv("GCE_METADATA_HOST");
    char adc[4096] = "";
    struct stat st;
    if (cfg && *cfg)
        snprintf(adc, sizeof adc, "%s/application_default_credentials.json", cfg);
    else if (home && *home)
        snprintf(adc, sizeof adc, "%s/.config/gcloud/application_default_credentials.json",
                 home);
    if (gac && *gac)
        snprintf(source, cap, "file:%s", gac);
    else if (adc[0] && stat(adc, &st) == 0)
        snprintf(source, cap, "file:%s", adc);
    else
        snprintf(source, cap, "metadata:%s", md && *md ? md : "169.254.169.254");
}

static pthread_mutex_t cached_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char source[4200];
    char *token;    /* NULL: none (absent until expires) */
    time_t expires;
} cached;

/* The token for requests now, through the cache: 1 (*bearer, malloc'ed), 0 (none), -1. */
static int token(char **bearer, char *why, size_t cap)
{
    char source[sizeof cached.source];
    credential_source(source, sizeof source);
    time_t now = time(NULL);
    int rc = 1;
    pthread_mutex_lock(&cached_lock); /* one fetch, however many threads need a token */
    if (strcmp(cached.source, source) != 0 || now >= cached.expires - REFRESH_MARGIN_S) {
        char *tok = NULL;
        long expires_in = 0;
        rc = strncmp(source, "file:", 5) == 0
                 ? from_key_file(source + 5, &tok, &expires_in, why, cap)
                 : from_metadata(source + 9, &tok, &expires_in, why, cap);
        if (cached.token) {
            memset(cached.token, 0, strlen(cached.token));
            free(cached.token);
        }
        cached.token = rc == 1 ? tok : NULL;
        cached.source[0] = 0;
        if (rc >= 0) { /* none is remembered too: the metadata server asked again later */
            snprintf(cached.source, sizeof cached.source, "%s", source);
            cached.expires = rc == 0 ? now + ABSENT_S + REFRESH_MARGIN_S
                                     : now + (expires_in ? expires_in : NO_EXPIRY_S);
        }
    }
    if (rc == 1 && !cached.token)
        rc = 0;
    if (rc == 1 && !(*bearer = strdup(cached.token)))
        rc = (snprintf(why, cap, "out of memory"), -1);
    pthread_mutex_unlock(&cached_lock);
    return rc;
}

static int authorize(const char *url, http_auth *out)
{
    char ep[2048];
    if (gcs_endpoint(ep, sizeof ep) || !http_same_origin(url, ep))
        return 0; /* an emulator's, or not ours */
    return token(&out->bearer, out->error, sizeof out->error);
}

/* --- objects ------------------------------------------------------------------------------ */

/* The object's metadata URL into out ("{objects}/ENCODED"). */
static int metadata_url(const gcs_ref *r, char *out, size_t cap)
{
    size_t at;
    return objects_url(r, out, cap, &at) == 0 && at + 1 < cap
               ? (out[at++] = '/', out[at] = 0, ck_url_encode(r->object, 0, out, cap, &at))
               : -1;
}

/* The media URL of an object location, pinned to the generation its metadata reports. */
static char *object_url(const http_client *c, const char *loc, ck_error *err)
{
    gcs_ref r;
    char url[8192], *body = NULL, *media = NULL;
    size_t len = 0, n;
    if (gcs_parse(loc, &r, err))
        return NULL;
    if (!r.object[0] || r.object[strlen(r.object) - 1] == '/') {
        ck_fail(err, loc, "a prefix, not an object");
        return NULL;
    }
    if (metadata_url(&r, url, sizeof url) != 0) {
        ck_fail(err, loc, "the object's URL is too long");
        return NULL;
    }
    if (http_get(c, url, MAX_METADATA, &body, &len, err) != 0) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", ck_error_detail(err, url));
        ck_fail(err, loc, "cannot open: %s", why);
        return NULL;
    }
    cJSON *root = cJSON_ParseWithLength(body, len);
    free(body);
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(root, "generation");
    const char *gen = cJSON_IsString(g) ? g->valuestring : "";
    if (!(n = strlen(gen)) || n > 20 || strspn(gen, "0123456789") != n)
        ck_fail(err, loc, "the object's metadata has no generation of digits");
    else if (asprintf(&media, "%s?alt=media&ifGenerationMatch=%s", url, gen) < 0)
        media = NULL, ck_fail(err, loc, "out of memory");
    cJSON_Delete(root);
    return media;
}

/* --- listings ---------------------------------------------------------------------------- */

/* name directly under prefix (plen bytes), the prefix cut off, kept in l: 0, 1 when it is not
 * directly under it (skipped), -1 with err set. */
static int keep(ck_listing *l, const char *name, size_t plen, const char *what, ck_error *err)
{
    size_t nlen = strlen(name);
    if (nlen == plen || strchr(name + plen, '/'))
        return 1;
    if ((l->name_bytes += nlen - plen + 1) > GCS_MAX_NAME_BYTES)
        return ck_fail(err, what, "lists more than %u MiB of object names",
                       GCS_MAX_NAME_BYTES >> 20);
    char *kept = strdup(name + plen);
    if (!kept || ck_listing_add(l, kept) != 0) {
        free(kept);
        return ck_fail(err, what, "out of memory");
    }
    return 0;
}

int gcs_parse_listing(const char *json, size_t len, const char *prefix, ck_listing *l,
                      char **token, const char *what, ck_error *err)
{
    size_t plen = strlen(prefix);
    *token = NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    while (root && end < json + len && strchr(" \t\r\n", *end) && *end)
        end++;
    if (root && end != json + len) { /* a page is one JSON value, and nothing after it */
        cJSON_Delete(root);
        root = NULL;
    }
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(root, "kind");
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(root, "items");
    const cJSON *next = cJSON_GetObjectItemCaseSensitive(root, "nextPageToken");
    int rc = cJSON_IsString(kind) && strcmp(kind->valuestring, "storage#objects") == 0 &&
                     (!items || cJSON_IsArray(items))
                 ? 0 : ck_fail(err, what, "the answer is no objects.list page");
    for (const cJSON *e = items ? items->child : NULL; rc == 0 && e; e = e->next) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        if (++l->keys > GCS_MAX_KEYS)
            rc = ck_fail(err, what, "lists more than %u objects", GCS_MAX_KEYS);
        else if (!cJSON_IsString(name) || strncmp(name->valuestring, prefix, plen) != 0)
            rc = ck_fail(err, what, "a listed object has no name under the prefix");
        else
            rc = keep(l, name->valuestring, plen, what, err) < 0 ? -1 : 0;
    }
    if (rc == 0 && next && (!cJSON_IsString(next) || !next->valuestring[0]))
        rc = ck_fail(err, what, "a nextPageToken that is no string");
    if (rc == 0 && next && !(*token = strdup(next->valuestring)))
        rc = ck_fail(err, what, "out of memory");
    cJSON_Delete(root);
    return rc;
}

/* The URL of an objects.list page of the prefix ctx (a gcs_ref) names (ck_pager's page_url). */
static int page_url(const void *ctx, const char *token, char *url, size_t cap)
{
    const gcs_ref *r = ctx;
    size_t at;
    int fits = objects_url(r, url, cap, &at) == 0 &&
               snprintf(url + at, cap - at, "?delimiter=%%2F&prefix=") > 0;
    at = strlen(url);
    fits = fits && ck_url_encode(r->object, 0, url, cap, &at) == 0;
    if (fits && token) {
        fits = snprintf(url + at, cap - at, "&pageToken=") > 0;
        at = strlen(url);
        fits = fits && ck_url_encode(token, 0, url, cap, &at) == 0;
    }
    return fits ? 0 : -1;
}

static int parse_page(const void *ctx, const char *body, size_t len, ck_listing *l,
                      char **token, const char *loc, ck_error *err)
{
    return gcs_parse_listing(body, len, ((const gcs_ref *)ctx)->object, l, token, loc, err);
}

static int locate(const http_client *c, const char *loc, ck_located *t, ck_error *err)
{
    gcs_ref r;
    *t = (ck_located){0};
    if (gcs_parse(loc, &r, err))
        return -1;
    size_t olen = strlen(r.object);
    t->dir = !olen || r.object[olen - 1] == '/';
    /* The target names gs://BUCKET/OBJECT, so that a file beside it is a gs:// location too,
     * read at its own generation. */
    if (asprintf(&t->url, "gs://%s/%s", r.bucket, r.object) < 0) {
        t->url = NULL;
        return ck_fail(err, loc, "out of memory");
    }
    if (!t->dir)
        return 0;
    ck_pager pager = {.max_pages = GCS_MAX_PAGES, .max_page = GCS_MAX_LISTING,
                      .max_total = GCS_MAX_LISTING_TOTAL, .ctx = &r, .page_url = page_url,
                      .parse = parse_page};
    return ck_list(c, loc, &pager, t, err);
}

/* A JSON API error's reason ("notFound", "forbidden"), its characters checked. */
static int explain(const char *body, char *out, size_t cap)
{
    cJSON *root = cJSON_Parse(body);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "error");
    const cJSON *errors = cJSON_GetObjectItemCaseSensitive(e, "errors");
    const cJSON *reason = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(errors, 0),
                                                           "reason");
    const char *v = cJSON_IsString(reason) ? reason->valuestring : "";
    size_t n = strlen(v);
    int ok = n && n < 64 &&
             strspn(v, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789") == n;
    if (ok)
        snprintf(out, cap, "%s", v);
    cJSON_Delete(root);
    return ok;
}

const ck_scheme gcs_scheme = {.name = "gs", .is = gcs_is_url, .object_url = object_url,
                              .locate = locate, .authorize = authorize,
                              .anonymous_unsigned = 1, .explain = explain};
