/* open.c — ck_open (open.h): what kind of checkpoint a location holds, decided by content
 * alone; the one file that knows every format. */
#include "open.h"
#include "../formats/dcp.h"
#include "../formats/gguf.h"
#include "../sources/http.h"
#include "../sources/hub.h"
#include "../sources/s3.h"
#include "../formats/npy.h"
#include "../formats/packfile.h"
#include "../formats/pt2.h"
#include "../formats/safetensors.h"
#include "../formats/torch.h"
#include "../index/zip.h"

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

static int open_file(http_remote *remote, const char *source, ck_index **out, ck_error *err)
{
    /* Enough for every probe: a zip's first member name included. */
    unsigned char head[NPY_PROBE_BYTES > PT_PROBE_BYTES ? NPY_PROBE_BYTES : PT_PROBE_BYTES];
    ck_index *ix = ck_index_new(NULL);
    if (!ix)
        return ck_fail(err, source, "out of memory");
    ix->remote = remote;
    int id = ck_index_add_source(ix, source, NULL, err);
    if (id < 0)
        goto fail;
    const ck_file *f = &ix->files[id];
    size_t n = f->size < sizeof head ? (size_t)f->size : sizeof head;
    int rc = ck_file_read(f, head, n, 0);
    if (rc) {
        ck_fail(err, source, "cannot read: %s", strerror(-rc));
        goto fail;
    }
    if (n == 0) {
        ck_fail(err, source, "empty file");
        goto fail;
    }
    /* Content decides, never the file name. */
    int rc_read;
    if (pack_probe(head, n)) {
        ix->format = "pack";
        rc_read = pack_read_file(ix, (uint32_t)id, err);
    } else if (st_probe(head, n)) {
        ix->format = "safetensors";
        rc_read = st_read_file(ix, (uint32_t)id, err);
    } else if (npy_probe(head, n)) {
        ix->format = "npy";
        rc_read = npy_read_file(ix, (uint32_t)id, err);
    } else if (gguf_probe(head, n)) {
        ix->format = "gguf";
        rc_read = gguf_read_file(ix, (uint32_t)id, err);
    } else if (zip_probe(head, n)) {
        rc_read = read_zip(ix, (uint32_t)id, head, n, err);
    } else if (pt_probe_legacy(head, n)) {
        ix->format = "pytorch-legacy";
        rc_read = pt_read_legacy(ix, (uint32_t)id, err);
    } else if (st_index_probe(head, n)) { /* a shard set's index file: the shards beside it */
        ck_index_free(ix);
        return st_open_index(remote, source, out, err);
    } else {
        char hex[3 * sizeof head + 1] = "";
        for (size_t i = 0, k = 0; i < n && i < 8; i++)
            k += (size_t)snprintf(hex + k, sizeof hex - k, "%s%02x", i ? " " : "", head[i]);
        ck_fail(err, source, "not a checkpoint format ckptfs knows (first bytes %s)", hex);
        goto fail;
    }
    if (rc_read != 0)
        goto fail;
    *out = ix;
    return 0;
fail:
    ck_index_free(ix);
    return -1;
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

/* An hf:// location: the file or files the Hub resolves it to (hub.h), opened as any URL, or
 * as a shard set. */
static int open_hub(http_remote *remote, const char *loc, ck_index **out, ck_error *err)
{
    hub_target t;
    if (hub_locate(http_remote_client(remote), loc, &t, err))
        return -1;
    int rc = t.nshards ? st_open_names(remote, t.url, (const char *const *)t.shards, t.nshards,
                                       out, err)
                       : open_file(remote, t.url, out, err);
    hub_target_free(&t);
    return rc;
}

/* An s3:// location: the object, the shard set or the DCP checkpoint its prefix holds (s3.h),
 * each file opened by its s3:// location. */
static int open_s3(http_remote *remote, const char *loc, ck_index **out, ck_error *err)
{
    hub_target t;
    int dcp;
    if (s3_locate(http_remote_client(remote), loc, &t, &dcp, err))
        return -1;
    int rc = dcp ? dcp_open(remote, t.url, out, err)
             : t.nshards ? st_open_names(remote, t.url, (const char *const *)t.shards,
                                         t.nshards, out, err)
                         : open_file(remote, t.url, out, err);
    hub_target_free(&t);
    return rc;
}

static int open_dcp_dir(http_remote *remote, const char *dir, ck_index **out, ck_error *err)
{
    char *meta = NULL;
    if (asprintf(&meta, "%s/" DCP_METADATA, dir) < 0)
        return ck_fail(err, dir, "out of memory");
    int rc = dcp_open(remote, meta, out, err);
    free(meta);
    return rc;
}

/* What ck_open opens, before the hints. */
static int open_any(http_remote *remote, const char *source, ck_index **out, ck_error *err)
{
    *out = NULL;
    if (hub_is_url(source))
        return open_hub(remote, source, out, err);
    if (s3_is_url(source))
        return open_s3(remote, source, out, err);
    struct stat st;
    if (!http_is_url(source) && stat(source, &st) == 0 && S_ISDIR(st.st_mode)) {
        /* The one place a directory's kind is decided: a DCP checkpoint (its .metadata), GGUF
         * splits, else safetensors shards. */
        if (dcp_dir_probe(source))
            return open_dcp_dir(remote, source, out, err);
        return gguf_dir_probe(source) ? gguf_open_dir(source, out, err)
                                      : st_open_dir(source, out, err);
    }
    return dcp_is_metadata(source) ? dcp_open(remote, source, out, err)
                                   : open_file(remote, source, out, err);
}

http_remote *ck_remote_new(const http_config *c)
{
    http_config with_token = *c;
    const char *anonymous = getenv("CKPTFS_NO_SIGN_REQUEST"); /* how ckpt and ckload say it */
    with_token.token_for = hub_token_for;
    with_token.sign_for = c->anonymous || (anonymous && strcmp(anonymous, "1") == 0)
                              ? NULL : s3_sign_for;
    return http_remote_new(&with_token);
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
