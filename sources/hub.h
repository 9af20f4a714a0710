/* hub.h — hf:// sources: the Hugging Face Hub's resolve URLs and revision API.
 *
 * Contract:
 *  - hf://ORG/REPO[@REVISION]/PATH is the Hub's resolve URL
 *    {endpoint}/ORG/REPO/resolve/{COMMIT}/PATH, opened as any URL, where COMMIT is REVISION
 *    when that is a commit id (40 hex digits), else the commit sha the revision API (below)
 *    reports for it (default main): a branch that moves while mounted changes nothing.
 *  - hf://ORG/REPO[@REVISION] alone asks the revision API
 *    (GET {endpoint}/api/models/ORG/REPO/revision/{REVISION}: JSON with "sha" and
 *    "siblings"[].rfilename), pins the commit sha it reports, and resolves to the repository's
 *    files at that commit, a directory (which of them are the weights: checkpoint/choose.h).
 *  - The endpoint is HF_ENDPOINT (default https://huggingface.co), as huggingface_hub reads it.
 *    The token is HF_TOKEN, else the file huggingface_hub writes: $HF_TOKEN_PATH, else
 *    $HF_HOME/token, else $XDG_CACHE_HOME/huggingface/token, else ~/.cache/huggingface/token.
 *    It is sent only to the endpoint's origin (hub_scheme's authorize), never printed.
 *  - Names are checked: ORG and REPO of [A-Za-z0-9._-] (not "." or ".."), a PATH of such
 *    segments separated by '/', none empty, "." or "..".
 */
#ifndef CK_HUB_H
#define CK_HUB_H

#include <stddef.h>

#include "../base/error.h"
#include "http_request.h"
#include "scheme.h"

typedef struct hub_ref {
    char repo[256];     /* ORG/REPO */
    char revision[256]; /* "main" when not given */
    char path[1024];    /* "" when not given */
} hub_ref;

/* Whether loc is an hf:// location. */
int hub_is_url(const char *loc);

/* Parses an hf:// location. 0, or -1 with err set. */
int hub_parse(const char *loc, hub_ref *r, ck_error *err);

/* The endpoint, without a trailing '/', into out (cap bytes). */
void hub_endpoint(char *out, size_t cap);

/* The token (malloc'ed, trimmed), or NULL when there is none. */
char *hub_token(void);

/* The token when url is on the endpoint's origin, else NULL. */
char *hub_token_for(const char *url);

/* The resolve URL of path in repo at revision (malloc'ed; the revision percent-encoded). */
char *hub_resolve_url(const char *repo, const char *revision, const char *path);

/* Resolves loc into *t, asking the revision API through c: a file's resolve URL, or a
 * repository's files beside the commit's resolve URL of "". 0, or -1 with err set and *t
 * empty. */
int hub_locate(const http_client *c, const char *loc, ck_located *t, ck_error *err);

/* The hf:// row of the schemes' table (schemes.h). */
extern const ck_scheme hub_scheme;

#endif
