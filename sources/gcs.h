/* gcs.h — gs:// sources: objects of a Google Cloud Storage bucket, read through its JSON API.
 *
 * Contract:
 *  - gs://BUCKET/OBJECT is one checkpoint file; gs://BUCKET/PREFIX/ (or gs://BUCKET) a
 *    directory: its objects directly under PREFIX, listed with objects.list (prefix,
 *    delimiter '/', pageToken; at most GCS_MAX_PAGES pages and the bounds below), chosen among
 *    as any directory's files are (checkpoint/choose.h).
 *  - An object is read as its metadata says (GET .../b/BUCKET/o/OBJECT: its generation), then
 *    by ranged media reads (alt=media) with ifGenerationMatch of that generation: an object
 *    replaced while mounted fails the read (412), it never mixes two generations' bytes.
 *  - The endpoint is STORAGE_EMULATOR_HOST when set (as google-cloud-storage reads it: http://
 *    added when it names no scheme; no credentials), else CKPTFS_GCS_ENDPOINT (another
 *    endpoint, with credentials), else https://storage.googleapis.com.
 *  - Credentials, as Google's client libraries find them: the key file GOOGLE_APPLICATION_
 *    CREDENTIALS names, else the application-default file gcloud writes
 *    ($CLOUDSDK_CONFIG, else ~/.config/gcloud, /application_default_credentials.json): a
 *    service_account key (an RS256-signed JWT, signed with OpenSSL, exchanged at its token_uri)
 *    or an authorized_user's refresh token (exchanged at its token_uri, else Google's);
 *    else the metadata server (GCE_METADATA_HOST, else 169.254.169.254; the header
 *    Metadata-Flavor: Google; 1 s; when nothing answers, not asked again for 15 minutes).
 *    No credential request follows a redirect. A token is kept, process-wide, until
 *    REFRESH_MARGIN_S before it expires. It goes only to the endpoint's origin (gcs_scheme's
 *    authorize, as a bearer token), never into a message; none found: requests go without
 *    (a public bucket), as with -o anonymous.
 *  - Names are checked: a bucket of 3 to 222 [a-z0-9._-]; an object name without "." or ".."
 *    segments or empty ones inside it, no "?" or "#", at most 1,024 bytes.
 */
#ifndef CK_GCS_H
#define CK_GCS_H

#include <stddef.h>
#include <time.h>

#include "../base/error.h"
#include "http_request.h"
#include "scheme.h"

/* A listing's bounds, checked as its pages arrive (SEMANTICS.md's limits table): the JSON API
 * answers at most 1,000 objects a page. */
#define GCS_MAX_PAGES 100
#define GCS_MAX_KEYS 100000u
#define GCS_MAX_LISTING (8u << 20)
#define GCS_MAX_LISTING_TOTAL (64u << 20)
#define GCS_MAX_NAME_BYTES (16u << 20)
#define GCS_MAX_TOKEN_REPLY (64u << 10) /* a token endpoint's answer */

typedef struct gcs_ref {
    char bucket[224];
    char object[1025]; /* "" or ending in '/': a prefix */
} gcs_ref;

/* Whether loc is a gs:// location. */
int gcs_is_url(const char *loc);

/* Parses a gs:// location. 0, or -1 with err set. */
int gcs_parse(const char *loc, gcs_ref *r, ck_error *err);

/* The endpoint without a trailing '/' into out (cap bytes); 1 when it is an emulator's (no
 * credentials), else 0. */
int gcs_endpoint(char *out, size_t cap);

/* --- the pieces, for tests and fuzzers -------------------------------------------------- */

/* The object names directly under prefix in an objects.list page (JSON, len bytes) added to l,
 * and whether the listing goes on (*token, its nextPageToken, malloc'ed, else NULL). The
 * bounds above checked as each name arrives. 0, or -1 with err set (what: the location). */
int gcs_parse_listing(const char *json, size_t len, const char *prefix, ck_listing *l,
                      char **token, const char *what, ck_error *err);

/* A service account's signed JWT (RFC 7519, RS256) asking for scope at aud, issued by iss at
 * now for an hour: "HEADER.CLAIMS.SIGNATURE", base64url without padding (malloc'ed). key is
 * the key file's private_key (PEM), kid its private_key_id or NULL. NULL with err set (never
 * naming the key). */
char *gcs_jwt(const char *iss, const char *kid, const char *key_pem, const char *aud,
              const char *scope, time_t now, ck_error *err);

/* A token endpoint's answer (JSON: access_token, expires_in): the token (malloc'ed) and
 * *expires_in (0 when absent), or NULL when there is none. */
char *gcs_token_reply(const char *body, size_t len, long *expires_in);

/* The gs:// row of the schemes' table (schemes.h). */
extern const ck_scheme gcs_scheme;

#endif
