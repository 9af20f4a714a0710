/* s3.h — s3:// sources: objects of a bucket on AWS S3 or an S3-compatible store, read as URLs
 * of its API with requests signed by libcurl (AWS Signature Version 4).
 *
 * Contract:
 *  - s3://BUCKET/KEY is one checkpoint file; s3://BUCKET/PREFIX/ (or s3://BUCKET) a directory:
 *    its objects directly under PREFIX, listed with ListObjectsV2 (paginated, at most
 *    S3_MAX_PAGES pages), chosen among as any directory's files are (checkpoint/choose.h).
 *  - The endpoint is AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL (an S3-compatible store:
 *    path-style addressing, {endpoint}/BUCKET/KEY), else AWS's for the region
 *    (https://BUCKET.s3.REGION.amazonaws.com/KEY, virtual-hosted; path-style when BUCKET has a
 *    '.'). The region is AWS_REGION, else AWS_DEFAULT_REGION, else the profile's `region`,
 *    else us-east-1.
 *  - Credentials, in the AWS SDKs' order: the environment (AWS_ACCESS_KEY_ID,
 *    AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN); web identity (AWS_WEB_IDENTITY_TOKEN_FILE and
 *    AWS_ROLE_ARN, exchanged by STS AssumeRoleWithWebIdentity at AWS_ENDPOINT_URL_STS, else
 *    https://sts.REGION.amazonaws.com: EKS IRSA); the shared files for AWS_PROFILE (else
 *    "default"): AWS_SHARED_CREDENTIALS_FILE (else ~/.aws/credentials), then AWS_CONFIG_FILE
 *    (else ~/.aws/config, section "profile NAME"); the container endpoint
 *    (AWS_CONTAINER_CREDENTIALS_FULL_URI, else 169.254.170.2 + ..._RELATIVE_URI, with
 *    AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE or ..._TOKEN: ECS, EKS Pod Identity; http only to
 *    the loopback or those link-local addresses, as IP literals of the host libcurl parses,
 *    or localhost; no userinfo). No credential request follows a redirect. The environment
 *    and files are read again
 *    for each request (refreshed files are picked up); an endpoint's temporary credentials
 *    are kept, process-wide, until REFRESH_MARGIN_S before they expire, then asked again.
 *    None found: requests go unsigned (a public bucket). They go only to the endpoint's origin
 *    (s3_scheme's authorize), never into a message. Last, EC2 instance metadata (IMDSv2: a
 *    session token, then the role's credentials; AWS_EC2_METADATA_SERVICE_ENDPOINT,
 *    AWS_EC2_METADATA_DISABLED), asked with a 1 s budget and, when nothing answers (not on
 *    EC2), not again for 15 minutes.
 *  - Names are checked: a bucket of 3 to 63 [a-z0-9.-]; a key without "." or ".." segments or
 *    empty ones inside it.
 */
#ifndef CK_S3_H
#define CK_S3_H

#include <stddef.h>
#include <time.h>

#include "../base/error.h"
#include "http_request.h"
#include "scheme.h"

/* A listing's bounds, checked as its pages arrive (SEMANTICS.md's limits table): S3 answers
 * at most 1,000 keys a page. */
#define S3_MAX_PAGES 100                    /* 100,000 keys at S3's 1,000 a page */
#define S3_MAX_KEYS 100000u                 /* objects listed, every page's together */
#define S3_MAX_LISTING (8u << 20)           /* one page: 1,000 keys of 1 KiB and their fields */
#define S3_MAX_LISTING_TOTAL (64u << 20)    /* every page: S3_MAX_KEYS of 671 bytes */
#define S3_MAX_NAME_BYTES (16u << 20)       /* the names kept: S3_MAX_KEYS of 167 bytes */

typedef struct s3_ref {
    char bucket[64];
    char key[1024]; /* "" or ending in '/': a prefix */
} s3_ref;

/* Whether loc is an s3:// location. */
int s3_is_url(const char *loc);

/* Parses an s3:// location. 0, or -1 with err set. */
int s3_parse(const char *loc, s3_ref *r, ck_error *err);

/* The URL of key in bucket (malloc'ed; the key percent-encoded but for '/'), or NULL. */
char *s3_object_url(const char *bucket, const char *key);

/* The row's authorize (scheme.h), for SigV4: fills *out with the credentials and region when
 * url is on the S3 endpoint's origin and credentials are found; 1 then, else 0. */
int s3_sign_for(const char *url, http_sigv4 *out);

/* --- the parsers of what a server sends, for tests and fuzzers ----------------------------- */

/* The object names directly under prefix in xml (a ListObjectsV2 page of len bytes) added to
 * l, and whether the listing goes on (*token, the NextContinuationToken, malloc'ed, else NULL).
 * Linear in len; the bounds above checked as each key arrives. 0, or -1 with err set (what:
 * the location the user gave). */
int s3_parse_listing(const char *xml, size_t len, const char *prefix, ck_listing *l,
                     char **token, const char *what, ck_error *err);

/* Credentials in the JSON the container endpoint and instance metadata answer with
 * (AccessKeyId, SecretAccessKey, Token, Expiration: *expires, 0 when absent): 1, or 0 when
 * they are not there. */
int s3_json_credentials(const char *body, size_t len, http_sigv4 *out, time_t *expires);

/* Credentials in STS AssumeRoleWithWebIdentity's XML answer (len bytes): 1, or 0. */
int s3_sts_credentials(const char *xml, size_t len, http_sigv4 *out, time_t *expires);

/* The value of key in [section] of an INI text (the shared credentials and config files; the
 * text is cut up) into out (cap bytes): 1 when found. */
int s3_ini_find(char *text, const char *section, const char *key, char *out, size_t cap);

/* Whether a container credentials URL may be asked (s3.c says the rules): 1, or 0 with why
 * (cap bytes) set. */
int s3_container_url_allowed(const char *url, char *why, size_t cap);

/* What loc names (scheme.h): the object, or a prefix's listing (the names directly under it);
 * url an s3:// location (s3://BUCKET/KEY), which ck_source_open reads at its API URL (the
 * row's object_url), so that a message about it or a file beside it names the object as the
 * user's location does, never the API's URL. 0, or -1 with err set and *t empty. */
int s3_locate(const http_client *c, const char *loc, ck_located *t, ck_error *err);

/* The s3:// row of the schemes' table (schemes.h). */
extern const ck_scheme s3_scheme;

#endif
