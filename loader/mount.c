/* mount.c — what a load reads: the path as it is, or a mount's sources, or its virtual pack
 * (see mount.h). */
#include "mount.h"

#include "../views/mountinfo.h"
#include "../base/location.h"
#include "../checkpoint/open.h"
#include "../views/tree.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/xattr.h>
#include <unistd.h>

void mount_source_close(mount_source *s)
{
    ck_index_free(s->ix);
    free(s->keep);
    *s = (mount_source){0};
}

/* The root of the ckptfs mount that holds abs (an absolute path without links), malloc'ed, or
 * NULL when abs is in none: the nearest directory up from abs, on the same FUSE file system,
 * whose user.ckptfs.sources the mount publishes (every mount does, a remote source's too).
 * Only FUSE is asked: anyone may set a user. xattr on a directory of their own, but only a
 * mount can serve it from a FUSE file system. */
static char *mount_root(const char *abs)
{
    struct statfs sf;
    struct stat st0, st;
    if (statfs(abs, &sf) != 0 || sf.f_type != FUSE_SUPER_MAGIC || stat(abs, &st0) != 0)
        return NULL;
    char *cand = strdup(abs);
    while (cand && stat(cand, &st) == 0 && st.st_dev == st0.st_dev) {
        if (getxattr(cand, CK_SOURCES_XATTR, NULL, 0) > 0)
            return cand;
        char *slash = strrchr(cand, '/');
        if (!slash || slash == cand)
            break;
        *slash = 0;
    }
    free(cand);
    return NULL;
}

/* The mount's user.ckptfs.sources, malloc'ed (*len bytes), or NULL. */
static char *read_sources(const char *root, size_t *len)
{
    for (int tries = 0; tries < 4; tries++) {
        ssize_t n = getxattr(root, CK_SOURCES_XATTR, NULL, 0);
        char *v = n > 0 ? malloc((size_t)n) : NULL;
        ssize_t got = v ? getxattr(root, CK_SOURCES_XATTR, v, (size_t)n) : -1;
        if (got > 0) {
            *len = (size_t)got;
            return v;
        }
        free(v);
        if (n <= 0 || !v || errno != ERANGE) /* ERANGE: it grew in between; ask again */
            break;
    }
    return NULL;
}

/* Whether file f of ix is the file the mount parsed. */
static int same_file(const ck_file *f, const ck_source_file *m)
{
    return (uint64_t)f->dev == m->dev && (uint64_t)f->ino == m->ino && f->size == m->size &&
           f->mtime.tv_sec == m->mtime.tv_sec && f->mtime.tv_nsec == m->mtime.tv_nsec;
}

/* The mount's sources, opened here with the caller's credentials, or NULL when they cannot be
 * (hidden, unreadable, malformed xattr, remote) or are not the files the mount parsed. A remote
 * source is never opened: its credentials are the mount's, not the caller's. */
static ck_index *open_bypass(const char *root)
{
    size_t len = 0, n;
    char *v = read_sources(root, &len);
    const char *source;
    ck_source_file *files = NULL;
    ck_index *ix = NULL;
    ck_error e;
    if (v && ck_sources_parse(v, len, &source, &files, &n) == 0 &&
        !ck_location_is_url(source) && ck_open(source, &ix, &e) == 0) {
        int same = ix->nfiles == n;
        for (uint32_t i = 0; same && i < n; i++)
            same = same_file(&ix->files[i], &files[i]);
        if (!same) {
            ck_index_free(ix);
            ix = NULL;
        }
    }
    free(files);
    free(v);
    return ix;
}

/* keep[] for the entries under the node at rel (a path inside the mount), found with the
 * mount's tree over ix. 0, or -1 with err set. */
static int select_subtree(mount_source *s, const char *path, const char *rel, char *err,
                          size_t errlen)
{
    ck_tree *t;
    ck_error e;
    if (ck_tree_build(s->ix, NULL, NULL, 0, &t, &e) != 0) {
        snprintf(err, errlen, "%s", e.msg);
        return -1;
    }
    uint32_t node = 0;
    for (const char *c = rel; *c && node != CK_NO_NODE;) {
        size_t n = strcspn(c, "/");
        node = ck_tree_lookup(t, node, c, n);
        c += n + (c[n] == '/');
    }
    size_t kept = 0;
    s->keep = node != CK_NO_NODE ? calloc(s->ix->nentries ? s->ix->nentries : 1, 1) : NULL;
    for (size_t i = 0; s->keep && i < s->ix->nentries; i++) {
        uint32_t up = t->entry_node[i];
        while (up != node && up != 0)
            up = t->nodes[up].parent;
        s->keep[i] = up == node && s->ix->entries[i].kind == CK_TENSOR;
        kept += s->keep[i];
    }
    ck_tree_free(t);
    if (node == CK_NO_NODE)
        snprintf(err, errlen, "%s: not in the tree of the mount's source", path);
    else if (!s->keep)
        snprintf(err, errlen, "%s: out of memory", path);
    else if (kept == 0)
        snprintf(err, errlen, "%s: holds no tensor", path);
    return node != CK_NO_NODE && s->keep && kept ? 0 : -1;
}

/* Whether rel (a path inside a mount) is in the mount's own directory (.ckptfs), and whether it
 * is the virtual pack. */
static int in_vdir(const char *rel)
{
    size_t n = strlen(CK_VDIR);
    return strncmp(rel, CK_VDIR, n) == 0 && (rel[n] == 0 || rel[n] == '/');
}

static int is_pack(const char *rel)
{
    return in_vdir(rel) && rel[strlen(CK_VDIR)] == '/' &&
           strcmp(rel + strlen(CK_VDIR) + 1, CK_VFILE_PACK_NAME) == 0;
}

/* A path inside the mount at root: the sources or the virtual pack, and the selection. */
static int open_in_mount(const char *path, const char *root, const char *rel,
                         mount_source *out, char *err, size_t errlen)
{
    char pack[PATH_MAX];
    snprintf(pack, sizeof pack, "%s/%s/%s", root, CK_VDIR, CK_VFILE_PACK_NAME);
    const char *bypass = getenv("CKLOAD_BYPASS");
    out->ix = bypass && strcmp(bypass, "0") == 0 ? NULL : open_bypass(root);
    out->read_path = out->ix ? "bypass" : "mount";
    ck_error e;
    if (!out->ix && ck_open(pack, &out->ix, &e) != 0) {
        snprintf(err, errlen, "%s", e.msg);
        return -1;
    }
    return !*rel || is_pack(rel) ? 0 : select_subtree(out, path, rel, err, errlen);
}

/* The class (ckload.h) of a failure to open the source at path: ENOENT where path does not
 * exist (or a directory on its way is not a directory), EACCES where it is there but cannot be
 * opened for reading, EIO otherwise (it opens, and what it holds is wrong; or it is a URL). */
static int open_failure(const char *path)
{
    if (ck_location_is_url(path))
        return EIO;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK); /* a FIFO: no wait */
    int e = fd < 0 ? errno : 0;
    if (fd >= 0)
        close(fd);
    return e == ENOENT || e == ENOTDIR ? ENOENT : e == EACCES || e == EPERM ? EACCES : EIO;
}

int mount_source_open(const char *path, mount_source *out, char *err, size_t errlen)
{
    *out = (mount_source){0};
    char abs[PATH_MAX], *root = realpath(path, abs) ? mount_root(abs) : NULL;
    const char *rel = root ? abs + strlen(root) + (abs[strlen(root)] == '/') : NULL;
    int rc;
    /* The mount's own files other than the pack are read as they are, through the mount. */
    if (root && (!in_vdir(rel) || is_pack(rel))) {
        rc = open_in_mount(path, root, rel, out, err, errlen);
    } else {
        ck_error e;
        rc = ck_open(path, &out->ix, &e);
        if (rc)
            snprintf(err, errlen, "%s", e.msg);
    }
    free(root);
    if (rc)
        mount_source_close(out);
    return rc ? open_failure(path) : 0;
}

const char *ckl_location_shown(const char *location, char *buf, size_t cap)
{
    return ck_location_shown(location, buf, cap);
}
