/* s3.c — s3:// sources (s3.h). */
#include "s3.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#define S3_MAX_INI (1u << 20)     /* a shared credentials or config file */
#define S3_MAX_CREDENTIALS (64u << 10) /* a credential endpoint's answer */
#define REFRESH_MARGIN_S 300            /* temporary credentials are renewed this early */

#define PREFIX_LEN 5 /* "s3://" */

int s3_is_url(const char *loc)
{
    return strncmp(loc, "s3://", PREFIX_LEN) == 0;
}

int s3_parse(const char *loc, s3_ref *r, ck_error *err)
{
    const char *b = loc + PREFIX_LEN;
    size_t blen = strcspn(b, "/");
    const char *key = b[blen] == '/' ? b + blen + 1 : b + blen;
    *r = (s3_ref){0};
    if (!s3_is_url(loc))
        return ck_fail(err, loc, "not an s3:// location");
    if (blen < 3 || blen > 63 || strspn(b, "abcdefghijklmnopqrstuvwxyz0123456789.-") < blen)
        return ck_fail(err, loc, "the bucket name must be 3 to 63 of a-z, 0-9, '.' and '-'");
    if (strlen(key) >= sizeof r->key || ck_bad_segments(key, strlen(key)) || strchr(key, '?') ||
        strchr(key, '#'))
        return ck_fail(err, loc, "the key must have no empty, '.' or '..' segments, '?' or '#', "
                       "and be under %zu bytes", sizeof r->key);
    memcpy(r->bucket, b, blen);
    strcpy(r->key, key);
    return 0;
}

/* --- configuration: the environment and the shared files ------------------------------------ */

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* A shared file's path: $var, else ~/.aws/name; 0, or -1 when neither is known. */
static int shared_file(const char *var, const char *name, char *out, size_t cap)
{
    const char *v = env(var), *home = env("HOME");
    int n = v ? snprintf(out, cap, "%s", v)
              : home ? snprintf(out, cap, "%s/.aws/%s", home, name) : -1;
    return n > 0 && (size_t)n < cap ? 0 : -1;
}

/* The whole of a small text file (malloc'ed, NUL-terminated), or NULL. */
static char *read_small(const char *path)
{
    FILE *f = fopen(path, "re");
    char *text = f ? malloc(S3_MAX_INI + 1) : NULL;
    size_t n = text ? fread(text, 1, S3_MAX_INI + 1, f) : 0;
    if (f)
        fclose(f);
    if (!text || n > S3_MAX_INI) { /* too big to be what the SDKs write */
        free(text);
        return NULL;
    }
    text[n] = 0;
    return text;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && strchr(" \t\r", s[n - 1]))
        s[--n] = 0;
    return s;
}

int s3_ini_find(char *text, const char *section, const char *key, char *out, size_t cap)
{
    char *save = NULL;
    int in = 0, found = 0;
    for (char *line = strtok_r(text, "\n", &save); line && !found;
         line = strtok_r(NULL, "\n", &save)) {
        char *l = trim(line), *eq;
        size_t n = strlen(l);
        if (l[0] == '[' && n > 1 && l[n - 1] == ']') {
            l[n - 1] = 0;
            in = strcmp(trim(l + 1), section) == 0;
        } else if (in && (eq = strchr(l, '=')) && l[0] != '#' && l[0] != ';') {
            *eq = 0;
            if (strcmp(trim(l), key) == 0 && strlen(trim(eq + 1)) < cap) {
                strcpy(out, trim(eq + 1));
                found = 1;
            }
        }
    }
    return found;
}

/* The value of key in section of the INI file at path, into out (cap bytes): 1 when found. */
static int ini_value(const char *path, const char *section, const char *key, char *out,
                     size_t cap)
{
    char *text = read_small(path);
    size_t n = text ? strlen(text) : 0;
    int found = text && s3_ini_find(text, section, key, out, cap);
    if (text)
        memset(text, 0, n); /* it held secrets */
    free(text);
    return found;
}

/* A setting of the profile in the config file ("[profile NAME]", "[default]"). */
static int config_value(const char *key, char *out, size_t cap)
{
    char path[4096], section[300];
    const char *profile = env("AWS_PROFILE") ? env("AWS_PROFILE") : "default";
    if (strcmp(profile, "default") == 0)
        snprintf(section, sizeof section, "default");
    else
        snprintf(section, sizeof section, "profile %s", profile);
    return shared_file("AWS_CONFIG_FILE", "config", path, sizeof path) == 0 &&
           ini_value(path, section, key, out, cap);
}

static void region_of(char *out, size_t cap)
{
    const char *v = env("AWS_REGION") ? env("AWS_REGION") : env("AWS_DEFAULT_REGION");
    if (v && strlen(v) < cap && strspn(v, "abcdefghijklmnopqrstuvwxyz0123456789-") == strlen(v))
        snprintf(out, cap, "%s", v);
    else if (!config_value("region", out, cap) ||
             strspn(out, "abcdefghijklmnopqrstuvwxyz0123456789-") != strlen(out) || !out[0])
        snprintf(out, cap, "us-east-1");
}

/* The S3-compatible endpoint the environment names, without a trailing '/', or "" for AWS. */
static void custom_endpoint(char *out, size_t cap)
{
    const char *v = env("AWS_ENDPOINT_URL_S3") ? env("AWS_ENDPOINT_URL_S3")
                                                : env("AWS_ENDPOINT_URL");
    snprintf(out, cap, "%s", v && http_is_url(v) ? v : "");
    size_t n = strlen(out);
    while (n && out[n - 1] == '/')
        out[--n] = 0;
}

static int next_element(const char **at, const char *end, const char *tag, const char **text,
                        size_t *len);

/* --- temporary credentials from an endpoint (web identity through STS, a container's) ------- */

/* Credentials an endpoint gave, kept until REFRESH_MARGIN_S before they expire: every request of
 * every S3 object in the process shares them, as the AWS SDKs' default chain does, rather than
 * asking the endpoint once per range read. `source` names where they came from, so that another
 * configuration (another role, another endpoint) never gets them. */
static pthread_mutex_t cached_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char source[4096];
    http_sigv4 creds;
    time_t expires;
    int absent; /* the source was asked and had none (instance metadata off EC2) */
} cached;

/* An ISO 8601 UTC time as AWS writes it ("2026-11-27T09:00:00Z", fractions allowed), or 0. */
static time_t aws_time(const char *s)
{
    struct tm tm = {0};
    const char *end = s ? strptime(s, "%Y-%m-%dT%H:%M:%S", &tm) : NULL;
    return end && (*end == 'Z' || *end == '.') ? timegm(&tm) : 0;
}

/* A small file's text, trimmed (a token), into a malloc'ed string, or NULL. */
static char *token_file(const char *path)
{
    char *text = path ? read_small(path) : NULL;
    if (text)
        memmove(text, trim(text), strlen(trim(text)) + 1);
    size_t n = text ? strlen(text) : 0;
    while (n && text[n - 1] == '\n')
        text[--n] = 0;
    return text;
}

/* Whether host (as http_url_parse gives it) is an address a container's credentials may come
 * from over plain http, as the AWS SDKs allow: an IP literal on the loopback (127.0.0.0/8,
 * ::1), ECS's 169.254.170.2, EKS Pod Identity's 169.254.170.23 and fd00:ec2::23; or
 * "localhost", which libcurl resolves to the loopback itself, asking no DNS (7.78 and later).
 * Never a name that merely begins like one ("127.example.com"). */
static int container_host(const char *host)
{
    unsigned char a[16];
    static const unsigned char ecs[4] = {169, 254, 170, 2}, eks[4] = {169, 254, 170, 23},
                               eks6[16] = {0xfd, 0x00, 0x0e, 0xc2, [15] = 0x23},
                               lo6[16] = {[15] = 1};
    if (strcmp(host, "localhost") == 0)
        return 1;
    if (inet_pton(AF_INET, host, a) == 1)
        return a[0] == 127 || memcmp(a, ecs, 4) == 0 || memcmp(a, eks, 4) == 0;
    return inet_pton(AF_INET6, host, a) == 1 &&
           (memcmp(a, lo6, 16) == 0 || memcmp(a, eks6, 16) == 0);
}

int s3_container_url_allowed(const char *url, char *why, size_t cap)
{
    http_url u;
    const char *no = http_url_parse(url, &u) != 0 ? "is no http(s) URL"
                     : u.userinfo ? "holds userinfo ('@')"
                     : strcmp(u.scheme, "https") != 0 && !container_host(u.host)
                         ? "is not https, and not on the loopback or ECS's or EKS's address"
                         : NULL;
    if (no)
        snprintf(why, cap, "the container credentials URL %s", no);
    return !no;
}

int s3_json_credentials(const char *body, size_t len, http_sigv4 *out, time_t *expires)
{
    cJSON *doc = cJSON_ParseWithLength(body, len);
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(doc, "AccessKeyId"),
                *secret = cJSON_GetObjectItemCaseSensitive(doc, "SecretAccessKey"),
                *tok = cJSON_GetObjectItemCaseSensitive(doc, "Token"),
                *exp = cJSON_GetObjectItemCaseSensitive(doc, "Expiration");
    int ok = cJSON_IsString(id) && cJSON_IsString(secret) &&
             strlen(id->valuestring) < sizeof out->access_key &&
             strlen(secret->valuestring) < sizeof out->secret_key &&
             (!cJSON_IsString(tok) || strlen(tok->valuestring) < sizeof out->session_token);
    if (ok) {
        strcpy(out->access_key, id->valuestring);
        strcpy(out->secret_key, secret->valuestring);
        strcpy(out->session_token, cJSON_IsString(tok) ? tok->valuestring : "");
        *expires = cJSON_IsString(exp) ? aws_time(exp->valuestring) : 0;
    }
    cJSON_Delete(doc);
    return ok;
}

/* A container's credentials (ECS, EKS Pod Identity): GET of AWS_CONTAINER_CREDENTIALS_FULL_URI
 * (else 169.254.170.2 + AWS_CONTAINER_CREDENTIALS_RELATIVE_URI) with the authorization token
 * of AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE (else AWS_CONTAINER_AUTHORIZATION_TOKEN); JSON
 * AccessKeyId, SecretAccessKey, Token, Expiration. 1, 0 when not configured, -1 (error set). */
static int from_container(http_sigv4 *out, time_t *expires, char *source, size_t cap, int fetch)
{
    const char *full = env("AWS_CONTAINER_CREDENTIALS_FULL_URI");
    const char *rel = env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
    if (!full && !rel)
        return 0;
    snprintf(source, cap, "%s%s", full ? "" : "http://169.254.170.2", full ? full : rel);
    if (!fetch)
        return 1;
    if (!full && rel[0] != '/') /* else ":@HOST/" would name another host */
        return snprintf(out->error, sizeof out->error, "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI "
                        "does not begin with '/'"), -1;
    if (!s3_container_url_allowed(source, out->error, sizeof out->error))
        return -1;
    char *token = env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")
                      ? token_file(env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"))
                      : env("AWS_CONTAINER_AUTHORIZATION_TOKEN")
                            ? strdup(env("AWS_CONTAINER_AUTHORIZATION_TOKEN")) : NULL;
    char *auth = NULL, *body = NULL;
    const char *headers[2] = {NULL, NULL};
    if (token && asprintf(&auth, "Authorization: %s", token) > 0)
        headers[0] = auth;
    size_t len;
    ck_error err;
    http_doc_request get = {.headers = headers, .no_redirects = 1};
    int rc = http_request_doc(&(http_client){0}, source, &get, S3_MAX_CREDENTIALS, &body, &len,
                              &err);
    int ok = rc == 0 && s3_json_credentials(body, len, out, expires);
    if (!ok)
        snprintf(out->error, sizeof out->error, "no credentials from the container endpoint: %s",
                 rc ? err.msg : "its answer has no AccessKeyId and SecretAccessKey");
    if (body)
        memset(body, 0, len);
    free(body);
    if (auth)
        memset(auth, 0, strlen(auth));
    free(auth);
    if (token)
        memset(token, 0, strlen(token));
    free(token);
    return ok ? 1 : -1;
}

/* The text of <tag> in xml (len bytes) into out (cap bytes): 1, or 0 when absent or too long. */
static int element_text(const char *xml, size_t len, const char *tag, char *out, size_t cap)
{
    const char *at = xml, *text;
    size_t n;
    if (!next_element(&at, xml + len, tag, &text, &n) || n >= cap || memchr(text, 0, n))
        return 0;
    memcpy(out, text, n);
    out[n] = 0;
    return 1;
}

int s3_sts_credentials(const char *xml, size_t len, http_sigv4 *out, time_t *expires)
{
    char expiration[64];
    if (!element_text(xml, len, "AccessKeyId", out->access_key, sizeof out->access_key) ||
        !element_text(xml, len, "SecretAccessKey", out->secret_key, sizeof out->secret_key) ||
        !element_text(xml, len, "SessionToken", out->session_token, sizeof out->session_token))
        return 0;
    *expires = element_text(xml, len, "Expiration", expiration, sizeof expiration)
                   ? aws_time(expiration) : 0;
    return 1;
}

/* EKS's IAM roles for service accounts: the token of AWS_WEB_IDENTITY_TOKEN_FILE exchanged for
 * AWS_ROLE_ARN's credentials by STS AssumeRoleWithWebIdentity (an unsigned request to
 * AWS_ENDPOINT_URL_STS, else https://sts.REGION.amazonaws.com). 1, 0 when not configured, -1. */
static int from_web_identity(http_sigv4 *out, time_t *expires, char *source, size_t cap,
                             int fetch)
{
    const char *file = env("AWS_WEB_IDENTITY_TOKEN_FILE"), *role = env("AWS_ROLE_ARN");
    if (!file || !role)
        return 0;
    char sts[2048], url[16384], session[64];
    const char *endpoint = env("AWS_ENDPOINT_URL_STS");
    if (endpoint && http_is_url(endpoint))
        snprintf(sts, sizeof sts, "%s", endpoint);
    else
        snprintf(sts, sizeof sts, "https://sts.%s.amazonaws.com", out->region);
    size_t n = strlen(sts);
    while (n && sts[n - 1] == '/')
        sts[--n] = 0;
    snprintf(session, sizeof session, "%s",
             env("AWS_ROLE_SESSION_NAME") ? env("AWS_ROLE_SESSION_NAME") : "ckptfs");
    snprintf(source, cap, "%s %s %s", sts, role, file);
    if (!fetch)
        return 1;
    char *token = token_file(file), *body = NULL;
    size_t at = 0, len;
    int fits = token && snprintf(url, sizeof url, "%s/?Action=AssumeRoleWithWebIdentity"
                                 "&DurationSeconds=3600&RoleArn=", sts) > 0;
    at = strlen(url);
    fits = fits && ck_url_encode(role, 0, url, sizeof url, &at) == 0 &&
           snprintf(url + at, sizeof url - at, "&RoleSessionName=") > 0 &&
           (at = strlen(url), ck_url_encode(session, 0, url, sizeof url, &at) == 0) &&
           snprintf(url + at, sizeof url - at, "&Version=2011-06-15&WebIdentityToken=") > 0 &&
           (at = strlen(url), ck_url_encode(token, 0, url, sizeof url, &at) == 0);
    ck_error err;
    http_doc_request get = {.no_redirects = 1};
    int rc = fits ? http_request_doc(&(http_client){0}, url, &get, S3_MAX_CREDENTIALS, &body,
                                     &len, &err) : -1;
    int ok = rc == 0 && s3_sts_credentials(body, len, out, expires);
    if (!ok)
        snprintf(out->error, sizeof out->error, "no credentials from STS for %s: %s", role,
                 !token ? "cannot read AWS_WEB_IDENTITY_TOKEN_FILE"
                 : rc ? (fits ? err.msg : "the token is too long")
                      : "its answer has no AccessKeyId, SecretAccessKey and SessionToken");
    memset(url, 0, sizeof url);
    if (body)
        memset(body, 0, len);
    free(body);
    if (token)
        memset(token, 0, strlen(token));
    free(token);
    return ok ? 1 : -1;
}

/* EC2 instance metadata, IMDSv2: a session token first (PUT /latest/api/token), then the role
 * (GET /latest/meta-data/iam/security-credentials/) and its credentials (JSON, as the
 * container endpoint's), each asked once with a 1 s budget: off EC2 nothing answers, and the
 * chain ends unsigned without waiting long. AWS_EC2_METADATA_SERVICE_ENDPOINT moves it,
 * AWS_EC2_METADATA_DISABLED=true turns it off. 1, 0 (off, or nothing answers), -1. */
static int from_instance_metadata(http_sigv4 *out, time_t *expires, char *source, size_t cap,
                                  int fetch)
{
    const char *off = env("AWS_EC2_METADATA_DISABLED"), *ep =
        env("AWS_EC2_METADATA_SERVICE_ENDPOINT") ? env("AWS_EC2_METADATA_SERVICE_ENDPOINT")
                                                 : "http://169.254.169.254";
    if ((off && strcasecmp(off, "true") == 0) || !http_is_url(ep))
        return 0;
    snprintf(source, cap, "%s", ep);
    size_t n = strlen(source);
    while (n && source[n - 1] == '/')
        source[--n] = 0;
    if (!fetch)
        return 1;
    char url[4096], role[256] = "", *token = NULL, *body = NULL, *auth = NULL;
    size_t len = 0;
    ck_error err;
    const char *ttl[] = {"X-aws-ec2-metadata-token-ttl-seconds: 21600", NULL};
    http_doc_request put = {.method = "PUT", .headers = ttl, .tries = 1, .budget_s = 1,
                            .no_redirects = 1};
    snprintf(url, sizeof url, "%s/latest/api/token", source);
    if (http_request_doc(&(http_client){0}, url, &put, 4096, &token, &len, &err) != 0)
        return 0; /* not on EC2 (or IMDS off there): no credentials from here */
    int rc = -1;
    err.msg[0] = 0;
    if (asprintf(&auth, "X-aws-ec2-metadata-token: %s", trim(token)) > 0) {
        const char *with[] = {auth, NULL};
        http_doc_request get = {.headers = with, .tries = 1, .budget_s = 1, .no_redirects = 1};
        snprintf(url, sizeof url, "%s/latest/meta-data/iam/security-credentials/", source);
        if (http_request_doc(&(http_client){0}, url, &get, 4096, &body, &len, &err) == 0) {
            snprintf(role, sizeof role, "%.*s", (int)strcspn(body, "\r\n"), body);
            free(body);
            body = NULL;
            int named = role[0] && strspn(role, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                "0123456789+=,.@_-") == strlen(role);
            snprintf(url, sizeof url, "%s/latest/meta-data/iam/security-credentials/%s", source,
                     role);
            rc = named && http_request_doc(&(http_client){0}, url, &get, S3_MAX_CREDENTIALS,
                                           &body, &len, &err) == 0 &&
                         s3_json_credentials(body, len, out, expires) ? 1 : -1;
        }
        memset(auth, 0, strlen(auth));
    }
    if (rc < 0)
        snprintf(out->error, sizeof out->error, "no credentials from the instance metadata%s%s%s%s",
                 role[0] ? " for role " : "", role, err.msg[0] ? ": " : "", err.msg);
    if (body)
        memset(body, 0, len);
    free(body);
    memset(token, 0, strlen(token));
    free(token);
    free(auth);
    return rc;
}

typedef int (*provider_fn)(http_sigv4 *out, time_t *expires, char *source, size_t cap,
                           int fetch);

/* Credentials from provider, through the cache (above): 1, 0 (not configured), -1 (error set).
 * Credentials without an expiration are asked again after NO_EXPIRY_S. */
static int from_endpoint(provider_fn provider, http_sigv4 *out)
{
    enum { NO_EXPIRY_S = 900 };
    char source[sizeof cached.source] = "";
    if (!provider(out, NULL, source, sizeof source, 0))
        return 0;
    http_sigv4 got = *out; /* the region */
    time_t expires = 0, now = time(NULL);
    int rc = 1;
    pthread_mutex_lock(&cached_lock); /* one fetch, however many threads need credentials */
    if (strcmp(cached.source, source) != 0 || now >= cached.expires - REFRESH_MARGIN_S) {
        rc = provider(&got, &expires, source, sizeof source, 1);
        if (rc >= 0) { /* none is remembered too: asked again only after NO_EXPIRY_S */
            snprintf(cached.source, sizeof cached.source, "%s", source);
            cached.creds = got;
            cached.expires = rc && expires ? expires : now + NO_EXPIRY_S;
            cached.absent = rc == 0;
        }
    } else if (cached.absent) {
        rc = 0;
    }
    if (rc == 1) {
        memcpy(out->access_key, cached.creds.access_key, sizeof out->access_key);
        memcpy(out->secret_key, cached.creds.secret_key, sizeof out->secret_key);
        memcpy(out->session_token, cached.creds.session_token, sizeof out->session_token);
    }
    pthread_mutex_unlock(&cached_lock);
    if (rc < 0)
        snprintf(out->error, sizeof out->error, "%s", got.error);
    memset(&got, 0, sizeof got);
    return rc;
}

/* The credentials, in the SDKs' order (s3.h); 1 when found, 0 when none, -1 (error set). */
static int credentials(http_sigv4 *out)
{
    const char *id = env("AWS_ACCESS_KEY_ID"), *secret = env("AWS_SECRET_ACCESS_KEY");
    if (id && secret) {
        snprintf(out->access_key, sizeof out->access_key, "%s", id);
        snprintf(out->secret_key, sizeof out->secret_key, "%s", secret);
        snprintf(out->session_token, sizeof out->session_token, "%s",
                 env("AWS_SESSION_TOKEN") ? env("AWS_SESSION_TOKEN") : "");
        return 1;
    }
    int rc = from_endpoint(from_web_identity, out);
    if (rc != 0)
        return rc;
    char path[4096];
    const char *profile = env("AWS_PROFILE") ? env("AWS_PROFILE") : "default";
    if (shared_file("AWS_SHARED_CREDENTIALS_FILE", "credentials", path, sizeof path) == 0 &&
        ini_value(path, profile, "aws_access_key_id", out->access_key, sizeof out->access_key) &&
        ini_value(path, profile, "aws_secret_access_key", out->secret_key,
                  sizeof out->secret_key)) {
        if (!ini_value(path, profile, "aws_session_token", out->session_token,
                       sizeof out->session_token))
            out->session_token[0] = 0;
        return 1;
    }
    if (config_value("aws_access_key_id", out->access_key, sizeof out->access_key) &&
        config_value("aws_secret_access_key", out->secret_key, sizeof out->secret_key)) {
        if (!config_value("aws_session_token", out->session_token, sizeof out->session_token))
            out->session_token[0] = 0;
        return 1;
    }
    int rc_container = from_endpoint(from_container, out);
    return rc_container != 0 ? rc_container : from_endpoint(from_instance_metadata, out);
}

/* --- URLs -------------------------------------------------------------------------------------- */

/* The URL of the bucket's root ("https://B.s3.R.amazonaws.com/", "{endpoint}/B/") into out. */
static int bucket_url(const char *bucket, char *out, size_t cap)
{
    char endpoint[2048], region[64];
    custom_endpoint(endpoint, sizeof endpoint);
    region_of(region, sizeof region);
    int n = endpoint[0] ? snprintf(out, cap, "%s/%s/", endpoint, bucket)
            : strchr(bucket, '.') ? snprintf(out, cap, "https://s3.%s.amazonaws.com/%s/", region,
                                             bucket)
                                  : snprintf(out, cap, "https://%s.s3.%s.amazonaws.com/", bucket,
                                             region);
    return n > 0 && (size_t)n < cap ? 0 : -1;
}

char *s3_object_url(const char *bucket, const char *key)
{
    char url[8192];
    size_t at;
    if (bucket_url(bucket, url, sizeof url) != 0)
        return NULL;
    at = strlen(url);
    return ck_url_encode(key, 1, url, sizeof url, &at) == 0 ? strdup(url) : NULL;
}

/* Whether host (len bytes) is one of AWS's S3 hosts for region: s3.R.amazonaws.com or
 * B.s3.R.amazonaws.com. */
static int aws_s3_host(const char *host, size_t len, const char *region)
{
    char suffix[128];
    int n = snprintf(suffix, sizeof suffix, "s3.%s.amazonaws.com", region);
    size_t s = (size_t)n;
    return n > 0 && len >= s && strncasecmp(host + len - s, suffix, s) == 0 &&
           (len == s || host[len - s - 1] == '.');
}

int s3_sign_for(const char *url, http_sigv4 *out)
{
    char endpoint[2048];
    http_url u;
    *out = (http_sigv4){0};
    custom_endpoint(endpoint, sizeof endpoint);
    region_of(out->region, sizeof out->region);
    int ours = endpoint[0] ? http_same_origin(url, endpoint)
                           : http_url_parse(url, &u) == 0 && strcmp(u.scheme, "https") == 0 &&
                                 aws_s3_host(u.host, strlen(u.host), out->region);
    int rc = ours ? credentials(out) : 0;
    if (rc < 0) {
        char why[sizeof out->error];
        memcpy(why, out->error, sizeof why);
        memset(out, 0, sizeof *out);
        memcpy(out->error, why, sizeof why);
        return -1;
    }
    if (rc == 0)
        memset(out, 0, sizeof *out);
    return rc;
}

/* --- listings ---------------------------------------------------------------------------- */

/* The first pat (n bytes, n > 0) in [s, end), or NULL: memchr to each candidate, so a search
 * reads only up to what it finds. (memmem would do, but ASan's memmem checks the whole rest of
 * the page on each call, which made a page's parse quadratic under the sanitizer.) The pattern
 * is a tag of a few bytes: linear in what is searched. */
static const char *find(const char *s, const char *end, const char *pat, size_t n)
{
    while ((size_t)(end - s) >= n) {
        const char *c = memchr(s, pat[0], (size_t)(end - s) - n + 1);
        if (!c || memcmp(c, pat, n) == 0)
            return c;
        s = c + 1;
    }
    return NULL;
}

/* The text between <tag> and </tag> in [*at, end) (its bytes at *text, *len), *at moved past
 * it; 0 when there is none. The searches never pass end: an element's inner search stays
 * inside it, and the whole parse stays linear in the page. */
static int next_element(const char **at, const char *end, const char *tag, const char **text,
                        size_t *len)
{
    char open[64], close[64];
    size_t no = (size_t)snprintf(open, sizeof open, "<%s>", tag),
           nc = (size_t)snprintf(close, sizeof close, "</%s>", tag);
    const char *a = *at < end ? find(*at, end, open, no) : NULL;
    const char *b = a ? find(a + no, end, close, nc) : NULL;
    if (!b)
        return 0;
    *text = a + no;
    *len = (size_t)(b - *text);
    *at = b + nc;
    return 1;
}

/* A character reference's value at s (after "&#", before end: decimal, or hex after 'x') and
 * its length through the ';' in *used; 0 when it is none (or 0x80 and above: not plain). */
static unsigned char_ref(const char *s, const char *end, size_t *used)
{
    int hex = s < end && *s == 'x';
    unsigned v = 0;
    size_t i = (size_t)hex, digits = 0;
    for (; s + i < end && digits < 8; i++, digits++) {
        int d = s[i] >= '0' && s[i] <= '9' ? s[i] - '0'
                : hex && s[i] >= 'a' && s[i] <= 'f' ? s[i] - 'a' + 10
                : hex && s[i] >= 'A' && s[i] <= 'F' ? s[i] - 'A' + 10 : -1;
        if (d < 0)
            break;
        v = v * (hex ? 16u : 10u) + (unsigned)d;
    }
    if (!digits || s + i >= end || s[i] != ';' || v == 0 || v >= 0x80)
        return 0;
    *used = i + 1;
    return v;
}

/* XML's five entities and character references below 0x80 decoded from text (len bytes): a
 * malloc'ed string, or NULL (out of memory, or a reference it cannot decode). */
static char *xml_text(const char *text, size_t len)
{
    static const struct { const char *ent; char c; } ents[] = {
        {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
    const char *end = text + len;
    char *out = malloc(len + 1);
    size_t k = 0;
    for (size_t i = 0; out && i < len;) {
        if (text[i] == 0) { /* no XML text holds one */
            free(out);
            return NULL;
        }
        if (text[i] != '&') {
            out[k++] = text[i++];
            continue;
        }
        size_t e = 0, used = 0;
        while (e < 5 && (len - i < strlen(ents[e].ent) ||
                         memcmp(text + i, ents[e].ent, strlen(ents[e].ent)) != 0))
            e++;
        unsigned v = e == 5 && len - i > 2 && text[i + 1] == '#'
                         ? char_ref(text + i + 2, end, &used) : 0;
        if (e < 5) {
            out[k++] = ents[e].c;
            i += strlen(ents[e].ent);
        } else if (v) {
            out[k++] = (char)v;
            i += 2 + used;
        } else {
            free(out);
            return NULL;
        }
    }
    if (out)
        out[k] = 0;
    return out;
}

int s3_parse_listing(const char *xml, size_t xlen, const char *prefix, ck_listing *l,
                     char **token, const char *what, ck_error *err)
{
    const char *at = xml, *end = xml + xlen, *text, *key;
    size_t len, klen, plen = strlen(prefix);
    *token = NULL;
    if (!memmem(xml, xlen, "<ListBucketResult", 17))
        return ck_fail(err, what, "the answer is no ListObjectsV2 result");
    while (next_element(&at, end, "Contents", &text, &len)) {
        const char *inner = text;
        if (++l->keys > S3_MAX_KEYS) /* counted as they arrive: refused before memory grows */
            return ck_fail(err, what, "lists more than %u objects", S3_MAX_KEYS);
        char *name = next_element(&inner, text + len, "Key", &key, &klen)
                         ? xml_text(key, klen) : NULL;
        if (!name)
            return ck_fail(err, what, "a listed object has no key it can read");
        size_t nlen = strlen(name);
        if (strncmp(name, prefix, plen) != 0 || nlen == plen ||
            strchr(name + plen, '/')) { /* not directly under the prefix: not ours */
            free(name);
            continue;
        }
        memmove(name, name + plen, nlen - plen + 1);
        l->name_bytes += nlen - plen + 1;
        if (l->name_bytes > S3_MAX_NAME_BYTES) {
            free(name);
            return ck_fail(err, what, "lists more than %u MiB of object names",
                           S3_MAX_NAME_BYTES >> 20);
        }
        if (ck_listing_add(l, name) != 0) {
            free(name);
            return ck_fail(err, what, "out of memory");
        }
    }
    const char *tail = xml;
    if (next_element(&tail, end, "IsTruncated", &text, &len) && len == 4 &&
        memcmp(text, "true", 4) == 0) {
        tail = xml;
        if (!next_element(&tail, end, "NextContinuationToken", &text, &len) ||
            !(*token = xml_text(text, len)) || !**token)
            return free(*token), *token = NULL,
                   ck_fail(err, what, "a truncated listing without a continuation token");
    }
    return 0;
}

/* The URL of a ListObjectsV2 page of the prefix ctx (an s3_ref) names (ck_pager's page_url):
 * the query in SigV4's canonical form (names sorted, values encoded), as libcurl signs it as
 * written. */
static int page_url(const void *ctx, const char *token, char *url, size_t cap)
{
    const s3_ref *r = ctx;
    size_t at;
    if (bucket_url(r->bucket, url, cap) != 0)
        return -1;
    at = strlen(url);
    int fits = snprintf(url + at, cap - at, "?%s", token ? "continuation-token=" : "") > 0;
    at = strlen(url);
    fits = fits && (!token || ck_url_encode(token, 0, url, cap, &at) == 0) &&
           snprintf(url + at, cap - at, "%sdelimiter=%%2F&list-type=2&prefix=",
                    token ? "&" : "") > 0;
    at = strlen(url);
    return fits && ck_url_encode(r->key, 0, url, cap, &at) == 0 ? 0 : -1;
}

static int parse_page(const void *ctx, const char *body, size_t len, ck_listing *l,
                      char **token, const char *loc, ck_error *err)
{
    return s3_parse_listing(body, len, ((const s3_ref *)ctx)->key, l, token, loc, err);
}

/* The s3:// location of key in bucket, malloc'ed, or NULL: what the target names, so that a
 * file beside it (a shard, a rank's .distcp) is an s3:// location too, and shown as one. */
static char *object_location(const char *bucket, const char *key)
{
    char *out = NULL;
    return asprintf(&out, "s3://%s/%s", bucket, key) < 0 ? NULL : out;
}

int s3_locate(const http_client *c, const char *loc, ck_located *t, ck_error *err)
{
    s3_ref r;
    *t = (ck_located){0};
    if (s3_parse(loc, &r, err))
        return -1;
    size_t klen = strlen(r.key);
    t->dir = !klen || r.key[klen - 1] == '/';
    t->url = object_location(r.bucket, r.key);
    if (!t->url)
        return ck_fail(err, loc, "out of memory");
    if (!t->dir) /* one object */
        return 0;
    ck_pager pager = {.max_pages = S3_MAX_PAGES, .max_page = S3_MAX_LISTING,
                      .max_total = S3_MAX_LISTING_TOTAL, .ctx = &r, .page_url = page_url,
                      .parse = parse_page};
    return ck_list(c, loc, &pager, t, err);
}

/* The API URL an s3:// object location is read at. */
static char *object_url(const http_client *c, const char *loc, ck_error *err)
{
    (void)c;
    s3_ref r;
    if (s3_parse(loc, &r, err))
        return NULL;
    char *url = s3_object_url(r.bucket, r.key);
    if (!url)
        ck_fail(err, loc, "out of memory");
    return url;
}

static int authorize(const char *url, http_auth *out)
{
    int rc = s3_sign_for(url, &out->sig);
    out->sigv4 = rc == 1;
    if (rc < 0)
        snprintf(out->error, sizeof out->error, "%s", out->sig.error);
    return rc;
}

/* What to check after an S3 error code a user can fix (what follows "check "); NULL for the
 * others. */
static const char *error_cause(const char *code, size_t n)
{
    static const struct { const char *code, *cause; } causes[] = {
        {"SignatureDoesNotMatch", "the secret key, the region and this machine's clock"},
        {"RequestTimeTooSkewed", "this machine's clock"},
        {"AuthorizationHeaderMalformed", "the region (AWS_REGION): it is not the bucket's"},
        {"InvalidAccessKeyId", "the access key: this endpoint has no such key"},
        {"ExpiredToken", "the credentials: their session token has expired"}};
    for (size_t i = 0; i < sizeof causes / sizeof *causes; i++)
        if (strlen(causes[i].code) == n && strncmp(causes[i].code, code, n) == 0)
            return causes[i].cause;
    return NULL;
}

/* An S3 error document's <Code> (its characters checked), and what fixes it where that is
 * likely ("SignatureDoesNotMatch: check the secret key, ..."). */
static int explain(const char *body, char *out, size_t cap)
{
    const char *code = strstr(body, "<Code>");
    if (!code)
        return 0;
    code += 6;
    size_t n = strspn(code, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.");
    if (!n || n >= 64 || strncmp(code + n, "</Code>", 7) != 0)
        return 0;
    const char *cause = error_cause(code, n);
    snprintf(out, cap, "%.*s%s%s", (int)n, code, cause ? ": check " : "", cause ? cause : "");
    return 1;
}

const ck_scheme s3_scheme = {.name = "s3", .is = s3_is_url, .object_url = object_url,
                             .locate = s3_locate, .authorize = authorize,
                             .anonymous_unsigned = 1, .explain = explain};
