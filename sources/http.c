/* http.c — remote source files (http.h): the ck_file ops over a target's head bytes and the
 * block cache, and the remote context that owns the caches. */
#include "http.h"
#include "../base/location.h"
#include "../base/size.h" /* ck_parse_size: CKPTFS_CACHE_MAX */
#include "schemes.h"     /* the URL an object location is read at */

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct http_remote {
    http_config config;        /* its strings are the copies below */
    char *cacert, *cache_dir;
    http_client client;
    pthread_mutex_t lock;      /* opening the caches */
    int opened;                /* the caches were opened, or refused (why) */
    ck_error why;
    diskcache *disk;           /* NULL: none */
    bc_cache *cache;
};

/* A remote file: the bytes of its head, the rest through the block cache. */
typedef struct remote_file {
    http_target *target;       /* NULL for a transport of http_open_fetch */
    unsigned char *head;       /* bytes [0, head_len) from the open */
    size_t head_len;
    uint64_t size;
    bc_object *blocks;
    char name[1024];           /* http_open_fetch's name: the file's path */
} remote_file;

http_remote *http_remote_new(const http_config *c)
{
    http_remote *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->config = *c;
    r->cacert = c->cacert ? strdup(c->cacert) : NULL;
    r->cache_dir = c->cache_dir ? strdup(c->cache_dir) : NULL;
    if ((c->cacert && !r->cacert) || (c->cache_dir && !r->cache_dir)) {
        http_remote_free(r);
        return NULL;
    }
    r->config.cacert = r->cacert;
    r->config.cache_dir = r->cache_dir;
    r->client = (http_client){.cacert = r->cacert, .authorize = c->authorize,
                              .explain = c->explain};
    pthread_mutex_init(&r->lock, NULL);
    return r;
}

void http_remote_free(http_remote *r)
{
    if (!r)
        return;
    bc_free(r->cache);
    dc_close(r->disk);
    pthread_mutex_destroy(&r->lock);
    free(r->cacert);
    free(r->cache_dir);
    free(r);
}

const http_client *http_remote_client(const http_remote *r)
{
    return &r->client;
}

/* The disk cache of r (options win over the environment), when there is one: r->why says why
 * not when its configuration is wrong. */
static void open_disk(http_remote *r)
{
    const char *dir = r->config.cache_dir ? r->config.cache_dir : getenv("CKPTFS_CACHE_DIR");
    const char *max_env = getenv("CKPTFS_CACHE_MAX");
    uint64_t max = r->config.cache_max;
    if (!dir || !*dir)
        return;
    if (!max && max_env && *max_env && !(max = ck_parse_size(max_env, 0))) {
        ck_fail(&r->why, "CKPTFS_CACHE_MAX", "'%s' is not a size (e.g. 512M, 10G)", max_env);
        return;
    }
    r->disk = dc_open(dir, max, r->config.log, &r->why);
}

/* r's caches, opened on its first remote file. 0, or -1 with err set. */
static int caches_ready(http_remote *r, ck_error *err)
{
    pthread_mutex_lock(&r->lock);
    if (!r->opened) {
        r->opened = 1;
        open_disk(r);
        if (!r->why.msg[0] && !(r->cache = bc_new(r->config.cache_mem, r->disk)))
            ck_fail(&r->why, "block cache", "out of memory");
    }
    int rc = r->why.msg[0] ? -1 : 0;
    if (rc)
        *err = r->why;
    pthread_mutex_unlock(&r->lock);
    return rc;
}

/* --- the ops ------------------------------------------------------------------------------ */

static int changed(const remote_file *o)
{
    return o->target && http_target_changed(o->target);
}

/* Whether [off, off+len) cannot be read from o: it changed, or the range passes its end. */
static int unreadable(const remote_file *o, size_t len, uint64_t off)
{
    return changed(o) || off > o->size || len > o->size - off;
}

static int op_pread(const ck_file *f, void *buf, size_t len, uint64_t off)
{
    remote_file *o = f->remote;
    if (len == 0) /* nothing to read, anywhere */
        return changed(o) ? -EIO : 0;
    if (unreadable(o, len, off))
        return -EIO;
    if (off + len <= o->head_len) {
        memcpy(buf, o->head + off, len);
        return 0;
    }
    int rc = bc_read(o->blocks, buf, len, off);
    return rc ? rc : changed(o) ? -EIO : 0;
}

/* Lends [off, off+len) up to the end of the cached block that holds off (bc_hold); the head's
 * bytes are lent as they are. */
static ssize_t op_hold(const ck_file *f, size_t len, uint64_t off, const void **ptr,
                       void **token)
{
    remote_file *o = f->remote;
    if (unreadable(o, len, off))
        return -EIO;
    *token = NULL;
    if (off + len <= o->head_len) {
        *ptr = o->head + off;
        return (ssize_t)len;
    }
    ssize_t n = bc_hold(o->blocks, len, off, ptr, token);
    if (n > 0 && changed(o)) {
        bc_release(o->blocks, *token);
        *token = NULL;
        return -EIO;
    }
    return n;
}

static void op_release(const ck_file *f, void *token)
{
    remote_file *o = f->remote;
    if (token) /* else the head's */
        bc_release(o->blocks, token);
}

static int op_same(const ck_file *f)
{
    return !changed(f->remote);
}

static void op_stats(const ck_file *f, uint64_t *requests, uint64_t *bytes)
{
    const remote_file *o = f->remote;
    *requests = *bytes = 0;
    if (o->target)
        http_target_stats(o->target, requests, bytes);
}

static void op_hint(ck_file *f, const uint64_t *bounds, size_t n)
{
    remote_file *o = f->remote;
    bc_hint(o->blocks, bounds, n);
}

static void free_file(remote_file *o)
{
    if (o->blocks)
        bc_close(o->blocks); /* first: its fetches use the target */
    http_target_close(o->target);
    free(o->head);
    free(o);
}

static void op_close(ck_file *f)
{
    free_file(f->remote);
    f->remote = NULL;
}

static const ck_source_ops http_ops = {
    .pread = op_pread, .same = op_same, .close = op_close, .stats = op_stats, .hint = op_hint,
    .hold = op_hold, .release = op_release,
};

/* --- opening ------------------------------------------------------------------------------ */

int ck_source_open(http_remote *remote, const char *loc, const char *what, ck_file *f,
                   ck_error *err)
{
    if (!ck_location_is_url(loc))
        return ck_source_open_local(loc, what, f, err);
    if (!remote)
        return ck_fail(err, loc, "a URL where only local files are opened");
    return http_open(remote, loc, what, f, err);
}

/* Opens url, the object named loc (http_target_open), into *f. */
static int open_named(http_remote *r, const char *url, const char *loc, const char *what,
                      ck_file *f, ck_error *err)
{
    if (caches_ready(r, err))
        return -1;
    remote_file *o = calloc(1, sizeof *o);
    if (!o || !(o->head = malloc(HTTP_HEAD_BYTES))) {
        free(o);
        return ck_fail(err, loc, "out of memory");
    }
    o->target = http_target_open(&r->client, url, loc, what, o->head, HTTP_HEAD_BYTES,
                                 &o->head_len, err);
    if (!o->target) {
        free_file(o);
        return -1;
    }
    o->size = http_target_size(o->target);
    dc_key key;
    int keyed = http_target_key(o->target, &key) == 0;
    o->blocks = bc_open(r->cache, o->size, o->head_len, keyed ? &key : NULL, http_target_fetch,
                        o->target);
    if (!o->blocks) {
        ck_fail(err, http_target_shown(o->target), "out of memory");
        free_file(o);
        return -1;
    }
    *f = (ck_file){.path = http_target_shown(o->target), .fd = -1, .size = o->size,
                   .mtime = {.tv_sec = http_target_mtime(o->target)}, .ops = &http_ops,
                   .remote = o};
    return 0;
}

int http_open(http_remote *r, const char *loc, const char *what, ck_file *f, ck_error *err)
{
    const ck_scheme *s = ck_scheme_of(loc);
    if (!s) {
        char shown[CK_SHOWN_MAX], names[256];
        ck_scheme_names(names, sizeof names);
        return ck_fail(err, ck_location_shown(loc, shown, sizeof shown),
                       "not a scheme ckptfs reads (%s)", names);
    }
    if (!s->object_url)
        return open_named(r, loc, loc, what, f, err);
    char *url = s->object_url(&r->client, loc, err);
    int rc = url ? open_named(r, url, loc, what, f, err) : -1;
    free(url);
    return rc;
}

int http_open_fetch(http_remote *r, const char *name, uint64_t size, const char *etag,
                    bc_fetch_fn fetch, void *ctx, ck_file *f, ck_error *err)
{
    if (caches_ready(r, err))
        return -1;
    remote_file *o = calloc(1, sizeof *o);
    dc_key key;
    int keyed = etag && dc_key_of(name, etag, "", size, &key) == 0;
    if (!o || !(o->blocks = bc_open(r->cache, size, 0, keyed ? &key : NULL, fetch, ctx))) {
        free(o);
        return ck_fail(err, name, "out of memory");
    }
    snprintf(o->name, sizeof o->name, "%s", name);
    o->size = size;
    *f = (ck_file){.path = o->name, .fd = -1, .size = size, .ops = &http_ops, .remote = o};
    return 0;
}
