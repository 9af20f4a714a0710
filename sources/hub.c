/* hub.c — hf:// locations: resolve URLs, the revision API, the token (hub.h). */
#include "hub.h"
#include "http_request.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HUB_DEFAULT_ENDPOINT "https://huggingface.co"
#define PREFIX_LEN 5 /* "hf://" */
#define HUB_MAX_API (16u << 20) /* a revision answer: the siblings of a large repository */

int hub_is_url(const char *loc)
{
    return strncmp(loc, "hf://", PREFIX_LEN) == 0;
}

/* Whether s[0..n) is a name the Hub allows for an organisation, repository or path segment. */
static int plain_segment(const char *s, size_t n)
{
    if (n == 0 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == '_' || s[i] == '-'))
            return 0;
    return 1;
}

int hub_parse(const char *loc, hub_ref *r, ck_error *err)
{
    *r = (hub_ref){0};
    const char *p = loc + PREFIX_LEN;
    size_t org = strcspn(p, "/");
    const char *name = p + org + (p[org] == '/');
    size_t repo = strcspn(name, "/@");
    if (!hub_is_url(loc) || p[org] != '/' || !plain_segment(p, org) ||
        !plain_segment(name, repo) || org + repo + 2 > sizeof r->repo)
        return ck_fail(err, loc, "not hf://ORG/REPO[@REVISION][/PATH]");
    snprintf(r->repo, sizeof r->repo, "%.*s/%.*s", (int)org, p, (int)repo, name);
    const char *rest = name + repo;
    if (*rest == '@') {
        size_t rev = strcspn(rest + 1, "/");
        if (rev == 0 || rev >= sizeof r->revision)
            return ck_fail(err, loc, "an empty or overlong revision");
        snprintf(r->revision, sizeof r->revision, "%.*s", (int)rev, rest + 1);
        for (const char *c = r->revision; *c; c++)
            if ((unsigned char)*c <= 0x20 || *c == 0x7f || *c == '?' || *c == '#' || *c == '%')
                return ck_fail(err, loc, "the revision holds a character a revision cannot");
        rest += 1 + rev;
    } else {
        snprintf(r->revision, sizeof r->revision, "main");
    }
    if (*rest == '/')
        rest++;
    for (const char *s = rest; *s;) {
        size_t k = strcspn(s, "/");
        if (!plain_segment(s, k))
            return ck_fail(err, loc, "path segment '%.*s' is not a plain file name",
                           (int)(k < 200 ? k : 200), s);
        s += k + (s[k] == '/');
        if (s[-1] == '/' && !*s)
            return ck_fail(err, loc, "the path ends in '/'");
    }
    if (strlen(rest) >= sizeof r->path)
        return ck_fail(err, loc, "the path is too long");
    snprintf(r->path, sizeof r->path, "%s", rest);
    return 0;
}

void hub_endpoint(char *out, size_t cap)
{
    const char *e = getenv("HF_ENDPOINT");
    e = e && *e ? e : HUB_DEFAULT_ENDPOINT;
    size_t n = strlen(e);
    while (n && e[n - 1] == '/')
        n--;
    snprintf(out, cap, "%.*s", (int)n, e);
}

/* The first line of file path, trimmed (malloc'ed), or NULL. */
static char *read_token_file(const char *path)
{
    FILE *f = fopen(path, "re");
    char line[4096];
    char *got = f ? fgets(line, sizeof line, f) : NULL;
    if (f)
        fclose(f);
    if (!got)
        return NULL;
    size_t a = strspn(line, " \t"), b = strlen(line);
    while (b > a && strchr(" \t\r\n", line[b - 1]))
        b--;
    char *t = b > a ? strndup(line + a, b - a) : NULL;
    memset(line, 0, sizeof line);
    return t;
}

char *hub_token(void)
{
    const char *v = getenv("HF_TOKEN");
    if (v && *v)
        return strdup(v);
    char path[4096];
    const char *tp = getenv("HF_TOKEN_PATH"), *home = getenv("HF_HOME");
    const char *xdg = getenv("XDG_CACHE_HOME"), *user = getenv("HOME");
    if (tp && *tp)
        snprintf(path, sizeof path, "%s", tp);
    else if (home && *home)
        snprintf(path, sizeof path, "%s/token", home);
    else if (xdg && *xdg)
        snprintf(path, sizeof path, "%s/huggingface/token", xdg);
    else if (user && *user)
        snprintf(path, sizeof path, "%s/.cache/huggingface/token", user);
    else
        return NULL;
    return read_token_file(path);
}

char *hub_token_for(const char *url)
{
    char endpoint[2048];
    hub_endpoint(endpoint, sizeof endpoint);
    return http_same_origin(url, endpoint) ? hub_token() : NULL;
}

char *hub_resolve_url(const char *repo, const char *revision, const char *path)
{
    char endpoint[2048], rev[3 * 256 + 1];
    hub_endpoint(endpoint, sizeof endpoint);
    size_t k = 0;
    for (const char *c = revision; *c && k + 4 < sizeof rev; c++) /* refs/pr/1: one segment */
        k += (size_t)(*c == '/' ? snprintf(rev + k, sizeof rev - k, "%%2F")
                                : snprintf(rev + k, sizeof rev - k, "%c", *c));
    rev[k] = 0;
    char *url = NULL;
    return asprintf(&url, "%s/%s/resolve/%s/%s", endpoint, repo, rev, path) < 0 ? NULL : url;
}

/* Whether s is a commit id as the Hub writes one: 40 lowercase hex digits (huggingface_hub's
 * REGEX_COMMIT_HASH). */
static int is_commit(const char *s)
{
    int hex = s && strlen(s) == 40;
    for (const char *c = s; hex && *c; c++)
        hex = (*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f');
    return hex;
}

/* The revision API's answer: the commit and the file names (pointers into root). */
static int revision_info(const http_client *c, const hub_ref *r, const char *loc, cJSON **root,
                         const char **sha, ck_error *err)
{
    char endpoint[2048], *url = NULL, *body = NULL;
    size_t len = 0;
    hub_endpoint(endpoint, sizeof endpoint);
    char *rev = hub_resolve_url(r->repo, r->revision, "");
    /* The resolve URL's encoding of the revision is the API's too: take it from there. */
    const char *enc = rev ? strstr(rev, "/resolve/") : NULL;
    if (!enc || asprintf(&url, "%s/api/models/%s/revision/%.*s", endpoint, r->repo,
                         (int)strlen(enc + 9) - 1, enc + 9) < 0) {
        free(rev);
        return ck_fail(err, loc, "out of memory");
    }
    free(rev);
    int rc = http_get(c, url, HUB_MAX_API, &body, &len, err);
    if (rc) { /* said of loc, as the user named it, never of the API's URL */
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", ck_error_detail(err, url));
        ck_fail(err, loc, "the Hub's revision API: %s", why);
    }
    free(url);
    if (rc)
        return -1;
    *root = cJSON_ParseWithLength(body, len);
    free(body);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(*root, "sha");
    *sha = cJSON_IsString(s) ? s->valuestring : NULL;
    if (!is_commit(*sha) || !cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(*root, "siblings"))) {
        cJSON_Delete(*root);
        return ck_fail(err, loc, "the Hub's revision answer has no commit sha of 40 hex digits "
                       "or no siblings");
    }
    return 0;
}

/* The repository's files at r's revision, pinned to the commit the Hub reports: their names,
 * resolved beside the commit's resolve URL of "". */
static int locate_repository(const http_client *c, const hub_ref *r, const char *loc,
                             ck_located *t, ck_error *err)
{
    cJSON *root = NULL;
    const char *sha = NULL;
    if (revision_info(c, r, loc, &root, &sha, err))
        return -1;
    const cJSON *sib = cJSON_GetObjectItemCaseSensitive(root, "siblings");
    size_t n = (size_t)cJSON_GetArraySize(sib);
    t->dir = 1;
    t->url = hub_resolve_url(r->repo, sha, "");
    t->names = calloc(n ? n : 1, sizeof *t->names);
    int rc = t->url && t->names ? 0 : -1;
    for (const cJSON *e = sib ? sib->child : NULL; e && rc == 0; e = e->next) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(e, "rfilename");
        if (cJSON_IsString(f) && !(t->names[t->n++] = strdup(f->valuestring)))
            rc = -1;
    }
    cJSON_Delete(root);
    if (rc) {
        ck_located_free(t);
        return ck_fail(err, loc, "out of memory");
    }
    return 0;
}

int hub_locate(const http_client *c, const char *loc, ck_located *t, ck_error *err)
{
    hub_ref r;
    *t = (ck_located){0};
    if (hub_parse(loc, &r, err))
        return -1;
    if (!r.path[0])
        return locate_repository(c, &r, loc, t, err);
    /* A branch or tag moves: the file is opened at the commit it names now, so that every
     * later request (and the shards an index names beside it) resolves that commit. */
    cJSON *root = NULL;
    const char *sha = r.revision;
    if (!is_commit(r.revision) && revision_info(c, &r, loc, &root, &sha, err))
        return -1;
    t->url = hub_resolve_url(r.repo, sha, r.path);
    cJSON_Delete(root);
    return t->url ? 0 : ck_fail(err, loc, "out of memory");
}

/* The resolve URL a file location is read at (hub_locate's); a repository is no file. */
static char *object_url(const http_client *c, const char *loc, ck_error *err)
{
    ck_located t;
    if (hub_locate(c, loc, &t, err))
        return NULL;
    char *url = t.dir ? NULL : t.url;
    if (t.dir)
        ck_fail(err, loc, "a repository, not a file");
    else
        t.url = NULL;
    ck_located_free(&t);
    return url;
}

static int authorize(const char *url, http_auth *out)
{
    out->bearer = hub_token_for(url);
    return out->bearer ? 1 : 0;
}

const ck_scheme hub_scheme = {.name = "hf", .is = hub_is_url, .object_url = object_url,
                              .locate = hub_locate, .authorize = authorize};
