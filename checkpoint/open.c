/* open.c — ck_open (open.h): what kind of checkpoint a location holds, decided by content
 * alone; the one file that knows every format. */
#include "open.h"
#include "choose.h"
#include "shards.h"
#include "../formats/dcp.h"
#include "../formats/gguf.h"
#include "../sources/http.h"
#include "../sources/schemes.h"
#include "../formats/npy.h"
#include "../formats/packfile.h"
#include "../formats/pt2.h"
#include "../formats/safetensors.h"
#include "../formats/torch.h"
#include "../index/zip.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* A zip is an .npz when its first member is an .npy file (np.savez writes nothing else), and a
 * PyTorch archive when its first record lies in a folder: a torch.export archive (.pt2) when the
 * directory says so (pt2_probe), else a torch.save checkpoint ("archive/..."). The directory is
 * read once, for both. Any other zip is named for what it holds. */
static int read_zip(ck_index *ix, uint32_t id, const unsigned char *head, size_t n,
                    ck_error *err)
{
    size_t len;
    const char *first = zip_first_name(head, n, &len);
    if (npz_probe(head, n)) {
        ix->format = "npz";
        return npz_read_file(ix, id, err);
    }
    if (first && !memchr(first, '/', len))
        return ck_fail(err, ix->files[id].path, "a zip archive, but neither an .npz (its first "
                       "member '%.*s' is not an .npy file) nor a PyTorch checkpoint (whose "
                       "records lie in one folder)", (int)(len < 200 ? len : 200), first);
    const ck_file *f = &ix->files[id];
    zip_archive z;
    if (zip_read_directory(f, f->size, f->path, &z, err) != 0)
        return -1;
    int pt2 = pt2_probe(&z);
    ix->format = pt2 ? "pt2" : "pytorch-zip";
    int rc = pt2 ? pt2_read_zip(ix, id, &z, err) : pt_read_zip(ix, id, &z, err);
    zip_free(&z);
    return rc;
}

/* Reads file id of ix by its first bytes (the probes): the reader of its format, which is
 * set in *format (and ix->format, which a reader may refine: "gguf-split"). An index of
 * shards is not read here: *format says "index" and nothing is added. */
static int read_by_content(ck_index *ix, uint32_t id, const char **format, ck_error *err)
{
    /* Enough for every probe: a zip's first member name included. */
    unsigned char head[NPY_PROBE_BYTES > PT_PROBE_BYTES ? NPY_PROBE_BYTES : PT_PROBE_BYTES];
    const ck_file *f = &ix->files[id];
    size_t n = f->size < sizeof head ? (size_t)f->size : sizeof head;
    int rc = ck_file_read(f, head, n, 0);
    if (rc)
        return ck_fail(err, f->path, "cannot read: %s", strerror(-rc));
    if (n == 0)
        return ck_fail(err, f->path, "empty file");
    /* Content decides, never the file name. */
    if (pack_probe(head, n)) {
        ix->format = "pack";
        rc = pack_read_file(ix, id, err);
    } else if (st_probe(head, n)) {
        ix->format = "safetensors";
        rc = st_read_file(ix, id, err);
    } else if (npy_probe(head, n)) {
        ix->format = "npy";
        rc = npy_read_file(ix, id, err);
    } else if (gguf_probe(head, n)) {
        ix->format = "gguf";
        rc = gguf_read_file(ix, id, err);
    } else if (zip_probe(head, n)) {
        rc = read_zip(ix, id, head, n, err);
    } else if (pt_probe_legacy(head, n)) {
        ix->format = "pytorch-legacy";
        rc = pt_read_legacy(ix, id, err);
    } else if (shards_index_probe(head, n)) {
        ix->format = "index";
    } else {
        char hex[3 * 8 + 1] = "";
        for (size_t i = 0, k = 0; i < n && i < 8; i++)
            k += (size_t)snprintf(hex + k, sizeof hex - k, "%s%02x", i ? " " : "", head[i]);
        return ck_fail(err, f->path, "not a checkpoint format ckptfs knows (first bytes %s)",
                       hex);
    }
    *format = ix->format;
    return rc;
}

/* A shard of a set (shards.h's reader): any file but another index. */
static int read_shard(ck_index *ix, uint32_t id, const char **format, ck_error *err)
{
    if (read_by_content(ix, id, format, err))
        return -1;
    return strcmp(*format, "index") ? 0
           : ck_fail(err, ix->files[id].path, "an index of shards, not a shard");
}

static int open_file(http_remote *remote, const char *source, ck_index **out, ck_error *err)
{
    ck_index *ix = ck_index_new(NULL);
    if (!ix)
        return ck_fail(err, source, "out of memory");
    ix->remote = remote;
    const char *format = NULL;
    int id = ck_index_add_source(ix, source, NULL, err);
    if (id < 0 || read_by_content(ix, (uint32_t)id, &format, err)) {
        ck_index_free(ix);
        return -1;
    }
    if (strcmp(format, "index") == 0) { /* a shard set's index file: the shards beside it */
        ck_index_free(ix);
        return shards_open_index(remote, source, read_shard, out, err);
    }
    *out = ix;
    return 0;
}

/* A place in a source file: where a tensor begins or ends. */
typedef struct bound {
    uint32_t file;
    uint64_t at;
} bound;

static int by_place(const void *a, const void *b)
{
    const bound *x = a, *y = b;
    return x->file != y->file ? (x->file > y->file) - (x->file < y->file)
                              : (x->at > y->at) - (x->at < y->at);
}

/* Hands every remote file of ix where its tensors begin and end (ck_file_hint): a strided
 * tensor's first element only, its span being no extent. Without memory, no hint: reads go on
 * unhinted. */
static void hint_bounds(ck_index *ix)
{
    int remote = 0;
    for (uint32_t i = 0; i < ix->nfiles; i++)
        remote |= !ck_file_is_local(&ix->files[i]);
    if (!remote)
        return;
    bound *v = malloc(2 * ix->nentries * sizeof *v + 1);
    uint64_t *at = malloc(2 * ix->nentries * sizeof *at + 1);
    size_t n = 0;
    for (size_t i = 0; v && at && i < ix->nentries; i++) {
        const ck_entry *e = &ix->entries[i];
        if (e->kind != CK_TENSOR || ck_file_is_local(&ix->files[e->ext.file]))
            continue;
        v[n++] = (bound){e->ext.file, e->ext.offset};
        if (e->layout != CK_STRIDED)
            v[n++] = (bound){e->ext.file, e->ext.offset + e->ext.length};
    }
    if (n > 1) /* n is 0 without memory */
        qsort(v, n, sizeof *v, by_place);
    for (size_t i = 0, k; i < n; i = k) {
        size_t m = 0;
        for (k = i; k < n && v[k].file == v[i].file; k++)
            if (m == 0 || at[m - 1] != v[k].at)
                at[m++] = v[k].at;
        ck_file_hint(&ix->files[v[i].file], at, m);
    }
    free(at);
    free(v);
}

/* The file called name beside base, opened as what the rule chose it for: a DCP checkpoint's
 * .metadata, an index of shards (by its name: a file that is no index says why), else by
 * open_file. */
static int open_beside(http_remote *remote, const char *base, const char *name,
                       enum ck_choice_kind kind, ck_index **out, ck_error *err)
{
    char *loc = ck_source_sibling(base, name, err);
    if (!loc)
        return -1;
    int rc = kind == CK_CHOSE_DCP     ? dcp_open(remote, loc, out, err)
             : kind == CK_CHOSE_INDEX ? shards_open_index(remote, loc, read_shard, out, err)
                                      : open_file(remote, loc, out, err);
    free(loc);
    return rc;
}

/* A directory (a local one, a Hub repository, an s3:// prefix) of the n files called names,
 * each resolved beside base: what ck_choose picks of them. where names the directory. */
static int open_listed(http_remote *remote, const char *base, const char *const *names, size_t n,
                       const char *where, ck_index **out, ck_error *err)
{
    ck_choice c;
    if (ck_choose(names, n, where, &c, err))
        return -1;
    const char *first = names[c.picked[0]];
    int rc;
    if (c.kind == CK_CHOSE_FILES && c.n > 1) {
        const char **set = malloc(c.n * sizeof *set);
        for (size_t i = 0; set && i < c.n; i++)
            set[i] = names[c.picked[i]];
        rc = set ? shards_open_names(remote, base, set, c.n, where, read_shard, out, err)
                 : ck_fail(err, where, "out of memory");
        free(set);
    } else {
        rc = open_beside(remote, base, first, c.kind, out, err);
    }
    /* The directory is the GGUF set: each of its *.gguf files was opened as a split. */
    if (rc == 0 && c.kind == CK_CHOSE_GGUF && (*out)->nfiles != c.n) {
        rc = ck_fail(err, where, "holds %zu GGUF files, but the set of '%s' has %u", c.n, first,
                     (*out)->nfiles);
        ck_index_free(*out);
        *out = NULL;
    }
    ck_choice_free(&c);
    return rc;
}

/* A local directory's entries (hidden ones too: .metadata), listed: a folder among them that
 * the rule picks fails as a file that is not regular would. */
static int open_directory(http_remote *remote, const char *dir, ck_index **out, ck_error *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return ck_fail(err, dir, "cannot list directory: %s", strerror(errno));
    char **names = NULL, *base = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (struct dirent *de; rc == 0 && (de = readdir(d));) {
        if (n == cap) {
            char **p = realloc(names, (cap = cap ? 2 * cap : 16) * sizeof *p);
            if (!p) {
                rc = ck_fail(err, dir, "out of memory");
                break;
            }
            names = p;
        }
        if (!(names[n++] = strdup(de->d_name)))
            rc = ck_fail(err, dir, "out of memory");
    }
    closedir(d);
    size_t len = strlen(dir);
    if (rc == 0 && asprintf(&base, "%s%s", dir, len && dir[len - 1] == '/' ? "" : "/") < 0)
        rc = ck_fail(err, dir, "out of memory");
    if (rc == 0)
        rc = open_listed(remote, base, (const char *const *)names, n, dir, out, err);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    free(base);
    return rc;
}

/* A location of scheme s (hf://, s3://...): the object it names, or the directory it lists. */
static int open_remote(http_remote *remote, const ck_scheme *s, const char *loc, ck_index **out,
                       ck_error *err)
{
    ck_located t;
    if (s->locate(http_remote_client(remote), loc, &t, err))
        return -1;
    int rc = t.dir ? open_listed(remote, t.url, (const char *const *)t.names, t.n, loc, out, err)
                   : dcp_is_metadata(t.url) ? dcp_open(remote, t.url, out, err)
                                            : open_file(remote, t.url, out, err);
    ck_located_free(&t);
    return rc;
}

/* What ck_open opens, before the hints. */
static int open_any(http_remote *remote, const char *source, ck_index **out, ck_error *err)
{
    *out = NULL;
    const ck_scheme *s = ck_scheme_of(source);
    if (s && s->locate)
        return open_remote(remote, s, source, out, err);
    struct stat st;
    if (!ck_location_is_url(source) && stat(source, &st) == 0 && S_ISDIR(st.st_mode))
        return open_directory(remote, source, out, err);
    return dcp_is_metadata(source) ? dcp_open(remote, source, out, err)
                                   : open_file(remote, source, out, err);
}

http_remote *ck_remote_new(const http_config *c)
{
    http_config with_table = *c;
    const char *anonymous = getenv("CKPTFS_NO_SIGN_REQUEST"); /* how ckpt and ckload say it */
    with_table.authorize = c->anonymous || (anonymous && strcmp(anonymous, "1") == 0)
                               ? ck_schemes_authorize_anonymous : ck_schemes_authorize;
    with_table.explain = ck_schemes_explain;
    return http_remote_new(&with_table);
}

int ck_open_through(http_remote *remote, const char *source, ck_index **out, ck_error *err)
{
    http_remote *own = NULL;
    if (!remote && ck_location_is_url(source) &&
        !(remote = own = ck_remote_new(&(http_config){0}))) {
        char shown[1024];
        ck_location_shown(source, shown, sizeof shown);
        *out = NULL;
        return ck_fail(err, shown, "out of memory");
    }
    int rc = open_any(remote, source, out, err);
    if (rc == 0) {
        (*out)->own_remote = own != NULL;
        hint_bounds(*out);
    } else {
        http_remote_free(own);
    }
    return rc;
}

int ck_open(const char *source, ck_index **out, ck_error *err)
{
    return ck_open_through(NULL, source, out, err);
}
