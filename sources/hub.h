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
 *    weights at that commit: model.safetensors.index.json if present, else its top-level
 *    *.safetensors (one, or all as shards), else its single checkpoint file.
 *  - The endpoint is HF_ENDPOINT (default https://huggingface.co), as huggingface_hub reads it.
 *    The token is HF_TOKEN, else the file huggingface_hub writes: $HF_TOKEN_PATH, else
 *    $HF_HOME/token, else $XDG_CACHE_HOME/huggingface/token, else ~/.cache/huggingface/token.
 *    It is sent only to the endpoint's origin (the opener hands hub_token_for to the transport:
 *    http_config's token_for), never printed.
 *  - Names are checked: ORG and REPO of [A-Za-z0-9._-] (not "." or ".."), a PATH of such
 *    segments separated by '/', none empty, "." or "..".
 */
#ifndef CK_HUB_H
#define CK_HUB_H

#include <stddef.h>

#include "../base/error.h"
#include "http_request.h"

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

/* Which files of a repository (or an s3:// prefix) to open, from its files' names (n of
 * them): the index file, else the top-level *.safetensors, else the one checkpoint file. Their
 * indices into *picked (at most n), their count returned; 0 when there is nothing to open, -1
 * when there are several checkpoint files and no way to choose (err set, naming them and where:
 * "hf://ORG/REPO", "s3://BUCKET/PREFIX"). */
int hub_pick(const char *const *names, size_t n, size_t *picked, const char *where,
             ck_error *err);

/* What an hf:// location resolves to (see the contract): the URL of the file to open, or with
 * shards the first shard's URL and every shard's file name beside it (each malloc'ed). */
typedef struct hub_target {
    char *url;
    char **shards;   /* NULL for one file */
    size_t nshards;
} hub_target;

/* Resolves loc into *t (hub_target_free releases it), asking the revision API through c.
 * 0, or -1 with err set and *t empty. */
int hub_locate(const http_client *c, const char *loc, hub_target *t, ck_error *err);
void hub_target_free(hub_target *t);

#endif
