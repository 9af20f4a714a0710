#include "core.h"
#include "../views/view.h"
#include "../formats/npy.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const ck_tree_vfile ck_vfiles[CK_VFILE_COUNT] = {
    [CK_VFILE_INDEX_JSON] = {"index.json", CK_NODE_MEMFILE},
    [CK_VFILE_PACK] = {CK_VFILE_PACK_NAME, CK_NODE_SYNTH},
    [CK_VFILE_SAFETENSORS] = {"checkpoint.safetensors", CK_NODE_SYNTH},
    [CK_VFILE_STATUS] = {"status", CK_NODE_STATUS},
};

/* A tensor has the first three (and byteorder "big" when its source stores it big-endian: it
 * is served little-endian, as dtype says; alias_of, the name whose storage it shares, when it
 * is tied to one); a value has the name and its type. */
static const char *const xattr_names[] = {"user.ckptfs.name", "user.ckptfs.dtype",
                                          "user.ckptfs.shape", "user.ckptfs.type",
                                          "user.ckptfs.byteorder", "user.ckptfs.alias_of"};
enum { XA_NAME, XA_DTYPE, XA_SHAPE, XA_TYPE, XA_BYTEORDER, XA_ALIAS_OF, XA_COUNT };

/* --- building the view ------------------------------------------------------------------- */

/* p made absolute (malloc'ed) against the working directory, or NULL with err set. */
static char *absolute(const char *p, const char *src, ck_error *err)
{
    char cwd[PATH_MAX], *out = NULL;
    if (ck_location_is_url(p))
        p = "/"; /* a URL has no path to watch: source_check asks the remote file itself */
    if (p[0] != '/' && !getcwd(cwd, sizeof cwd))
        return ck_fail(err, src, "cannot name the working directory: %s", strerror(errno)), NULL;
    if (p[0] == '/' ? (out = strdup(p)) == NULL : asprintf(&out, "%s/%s", cwd, p) < 0)
        return ck_fail(err, src, "out of memory"), NULL; /* asprintf leaves out undefined */
    return out;
}

/* Each source file's path made absolute, for the source checks: the daemon changes to "/".
 * Symlinks stay unresolved, so a link repointed at another file counts as a replacement. */
static int absolute_paths(ck_fs *fs, const char *src, ck_error *err)
{
    if (!(fs->src_path = calloc(fs->ix->nfiles ? fs->ix->nfiles : 1, sizeof *fs->src_path)))
        return ck_fail(err, src, "out of memory");
    for (uint32_t i = 0; i < fs->ix->nfiles; i++)
        if (!(fs->src_path[i] = absolute(fs->ix->files[i].path, src, err)))
            return -1;
    return 0;
}

int ck_fs_publish_sources(ck_fs *fs, const char *source, ck_error *err)
{
    const char *src = ck_index_source(fs->ix);
    /* A URL goes to ck_sources_encode as given: it has no path to make absolute, and the
     * encoding shows it without its secrets. */
    int url = ck_location_is_url(source);
    char *abs = url ? NULL : absolute(source, src, err), *v = NULL;
    size_t len = 0;
    if (!url && !abs)
        return -1;
    int bad = ck_sources_encode(url ? source : abs, fs->ix, (const char *const *)fs->src_path,
                                &v, &len);
    free(abs);
    if (bad)
        return ck_fail(err, src, "out of memory");
    free(fs->sources);
    fs->sources = v;
    fs->sources_len = len;
    return 0;
}

int ck_fs_init(ck_fs *fs, ck_index *ix, uid_t uid, gid_t gid, ck_fs_log log, ck_error *err)
{
    const char *src = ck_index_source(ix);
    ck_tree *tree = NULL;
    *fs = (ck_fs){.ix = ix, .uid = uid, .gid = gid, .log = log};
    pthread_mutex_init(&fs->vfile_lock, NULL);
    if (ix->nfiles)
        fs->mtime = ix->files[0].mtime;
    /* Each part goes into fs as soon as it exists, so that on any failure ck_fs_free releases
     * all there is, the index included. */
    int rc = ck_tree_build(ix, CK_VDIR, ck_vfiles, CK_VFILE_COUNT, &tree, err);
    fs->tree = tree;
    if (rc == 0)
        rc = absolute_paths(fs, src, err);
    if (rc == 0 && !(fs->alias_of = ck_synth_aliases(ix, err)))
        rc = -1;
    if (rc)
        ck_fs_free(fs);
    return rc;
}

void ck_fs_free(ck_fs *fs)
{
    if (fs->preparing)
        pthread_join(fs->prepare, NULL);
    for (uint32_t i = 0; fs->src_path && i < fs->ix->nfiles; i++)
        free(fs->src_path[i]);
    free(fs->src_path);
    free(fs->sources);
    free(fs->alias_of);
    for (int k = 0; k < CK_VFILE_COUNT; k++) {
        ck_text_free(&fs->vfile[k].text);
        ck_synth_free(fs->vfile[k].synth);
    }
    if (fs->ix)
        pthread_mutex_destroy(&fs->vfile_lock);
    ck_tree_free((ck_tree *)fs->tree);
    ck_index_free((ck_index *)fs->ix);
    *fs = (ck_fs){0};
}

/* --- nodes ------------------------------------------------------------------------------- */

/* Whether nd has a NAME.npy view: a tensor, with npy on, whose name leaves room for ".npy". */
static int has_npy(const ck_fs *fs, const ck_node *nd)
{
    return fs->npy && nd->kind == CK_NODE_TENSOR && nd->name_len + 4 <= CK_NAME_MAX;
}

/* Whether ino is a NAME.npy view (of the tensor node_of answers): above the tree's inodes. */
static int is_npy(const ck_fs *fs, uint64_t ino)
{
    return ino - CK_ROOT_INO >= fs->tree->nnodes;
}

/* The node behind an inode (a NAME.npy view's: its tensor), or NULL for an inode this mount
 * never handed out. */
static const ck_node *node_of(const ck_fs *fs, uint64_t ino)
{
    uint64_t n = fs->tree->nnodes, i = ino - CK_ROOT_INO;
    if (ino < CK_ROOT_INO)
        return NULL;
    if (i < n)
        return &fs->tree->nodes[i];
    return i - n < n && has_npy(fs, &fs->tree->nodes[i - n]) ? &fs->tree->nodes[i - n] : NULL;
}

static uint64_t ino_of(const ck_fs *fs, const ck_node *nd)
{
    return (uint64_t)(nd - fs->tree->nodes) + CK_ROOT_INO;
}

static uint64_t npy_ino_of(const ck_fs *fs, const ck_node *nd)
{
    return ino_of(fs, nd) + fs->tree->nnodes;
}

static const ck_entry *entry_of(const ck_fs *fs, const ck_node *nd)
{
    return &fs->ix->entries[nd->id];
}

/* Whether nd is a tensor tied to another's storage (ck_synth_aliases). */
static int is_alias(const ck_fs *fs, const ck_node *nd)
{
    return nd->kind == CK_NODE_TENSOR && fs->alias_of[nd->id] != UINT32_MAX;
}

/* Makes the mount's own file k: index.json's text, or a synthesized file's layout. */
static int make_vfile(ck_fs *fs, uint32_t k, ck_error *err)
{
    if (k == CK_VFILE_INDEX_JSON) {
        return ck_view_index_json(fs->ix, fs->tree, fs->alias_of, 0, &fs->vfile[k].text) == 0
                   ? 0 : ck_fail(err, ck_index_source(fs->ix), "out of memory");
    }
    return k == CK_VFILE_PACK ? ck_synth_pack(fs->ix, NULL, &fs->vfile[k].synth, err)
                              : ck_synth_safetensors(fs->ix, &fs->vfile[k].synth, err);
}

/* Whether the mount's own file k is there, made the first time anyone looks at it: it costs
 * memory and time that a mount used only for its tensors should not pay, and index.json of a
 * large checkpoint costs more than the rest of mounting it. 0 if it cannot be made; the reason
 * is logged by the one call that found out. */
static int vfile_ready(ck_fs *fs, uint32_t k)
{
    pthread_mutex_lock(&fs->vfile_lock);
    if (!fs->vfile[k].made && !fs->vfile[k].failed) {
        ck_error err;
        if (make_vfile(fs, k, &err) != 0) {
            char line[sizeof err.msg + 16];
            snprintf(line, sizeof line, "ckptfs: %s", err.msg);
            if (fs->log)
                fs->log(line);
            fs->vfile[k].failed = 1;
        } else {
            fs->vfile[k].made = 1;
            /* What the making freed (a JSON tree of every tensor: several times the file it
             * made), and what the parse before it freed, goes back to the kernel, not kept for
             * the life of the mount. Trimmed here, after the mount is made (ckptfs's main
             * starts index.json first), not on the way to it: the making reuses the parse's
             * freed pages, and the trim is off the path `ckptfs SRC MNT` waits on. */
            malloc_trim(0);
        }
    }
    int made = fs->vfile[k].made;
    pthread_mutex_unlock(&fs->vfile_lock);
    return made;
}

static void *prepare_index_json(void *fs)
{
    vfile_ready(fs, CK_VFILE_INDEX_JSON);
    return NULL;
}

void ck_fs_prepare(ck_fs *fs)
{
    if (!fs->preparing) /* once: a second call has nothing to start */
        fs->preparing = pthread_create(&fs->prepare, NULL, prepare_index_json, fs) == 0;
}

static size_t status_text(ck_fs *fs, char *buf, size_t cap);
enum { STATUS_MAX = PATH_MAX + 256 }; /* "source changed: PATH (why); remount to read it" */

/* A file's size: -EIO for one of the mount's own files that cannot be made. */
static int64_t node_size(ck_fs *fs, const ck_node *nd)
{
    char status[STATUS_MAX];
    switch (nd->kind) {
    case CK_NODE_DIR:
        return 0;
    case CK_NODE_STATUS:
        return (int64_t)status_text(fs, status, sizeof status);
    case CK_NODE_TENSOR:
    case CK_NODE_VALUE:
        return (int64_t)entry_of(fs, nd)->nbytes;
    case CK_NODE_MEMFILE:
        return vfile_ready(fs, nd->id) ? (int64_t)fs->vfile[nd->id].text.len : -EIO;
    default: /* CK_NODE_SYNTH */
        return vfile_ready(fs, nd->id) ? (int64_t)ck_synth_size(fs->vfile[nd->id].synth) : -EIO;
    }
}

/* The NAME.npy header of tensor node nd into buf (NPY_MAKE_MAX bytes); its length. */
static size_t npy_header_of(const ck_fs *fs, const ck_node *nd, unsigned char *buf)
{
    const ck_entry *e = entry_of(fs, nd);
    int raw;
    return npy_header_make(e->dtype, e->rank, e->shape, e->nbytes, buf, &raw);
}

/* The attributes of node nd, or of its NAME.npy view when npy. */
static int node_stat(ck_fs *fs, const ck_node *nd, int npy, struct stat *st)
{
    unsigned char head[NPY_MAKE_MAX];
    int64_t size = node_size(fs, nd);
    if (size < 0)
        return (int)size;
    memset(st, 0, sizeof *st);
    if (npy)
        size += (int64_t)npy_header_of(fs, nd, head);
    st->st_ino = npy ? npy_ino_of(fs, nd) : ino_of(fs, nd);
    st->st_uid = fs->uid;
    st->st_gid = fs->gid;
    st->st_size = (off_t)size;
    /* An alias's bytes are its owner's storage: du counts them once, there */
    st->st_blocks = is_alias(fs, nd) ? 0 : (st->st_size + 511) / 512;
    st->st_blksize = 1 << 20; /* cp and friends size their reads by this */
    st->st_mtim = st->st_ctim = st->st_atim =
        nd->kind == CK_NODE_TENSOR ? fs->ix->files[entry_of(fs, nd)->ext.file].mtime : fs->mtime;
    st->st_mode = nd->kind == CK_NODE_DIR ? S_IFDIR | 0555 : S_IFREG | 0444;
    st->st_nlink = nd->kind == CK_NODE_DIR ? 2 : 1;
    return 0;
}

int ck_fs_is_volatile(const ck_fs *fs, uint64_t ino)
{
    const ck_node *nd = node_of(fs, ino);
    return nd && nd->kind == CK_NODE_STATUS;
}

int ck_fs_getattr(ck_fs *fs, uint64_t ino, struct stat *st)
{
    const ck_node *nd = node_of(fs, ino);
    return nd ? node_stat(fs, nd, is_npy(fs, ino), st) : -ENOENT;
}

int ck_fs_lookup(ck_fs *fs, uint64_t parent, const char *name, struct stat *st)
{
    int rc = ck_fs_opendir(fs, parent);
    if (rc)
        return rc;
    uint32_t dir = (uint32_t)(parent - CK_ROOT_INO);
    size_t len = strlen(name);
    uint32_t node = ck_tree_lookup(fs->tree, dir, name, len);
    if (node != CK_NO_NODE)
        return node_stat(fs, &fs->tree->nodes[node], 0, st);
    /* NAME.npy: no node's name has a '.' outside .ckptfs, whose files have no views. */
    if (!fs->npy || len < 4 || memcmp(name + len - 4, ".npy", 4) != 0 ||
        (node = ck_tree_lookup(fs->tree, dir, name, len - 4)) == CK_NO_NODE ||
        !has_npy(fs, &fs->tree->nodes[node]))
        return -ENOENT;
    return node_stat(fs, &fs->tree->nodes[node], 1, st);
}

int ck_fs_opendir(const ck_fs *fs, uint64_t ino)
{
    const ck_node *nd = node_of(fs, ino);
    return !nd ? -ENOENT : nd->kind != CK_NODE_DIR ? -ENOTDIR : 0;
}

int ck_fs_readdir(const ck_fs *fs, uint64_t ino, off_t off, ck_dirent *d)
{
    int rc = ck_fs_opendir(fs, ino);
    if (rc)
        return rc;
    const ck_node *dir = node_of(fs, ino), *nd;
    uint64_t k = off < 0 ? 0 : (uint64_t)off, per = fs->npy ? 2 : 1, npy = 0;
    for (;; k++) { /* past the offsets of views that do not exist */
        if (k < 2)
            break;
        if ((k - 2) / per >= dir->nchild)
            return 0;
        nd = &fs->tree->nodes[fs->tree->children[dir->child0 + (k - 2) / per]];
        npy = (k - 2) % per;
        if (!npy || has_npy(fs, nd))
            break;
    }
    if (k < 2)
        nd = k == 0 ? dir : &fs->tree->nodes[dir->parent];
    *d = (ck_dirent){.name = k == 0 ? "." : k == 1 ? ".." : nd->name,
                     .ino = npy ? npy_ino_of(fs, nd) : ino_of(fs, nd),
                     .type = nd->kind == CK_NODE_DIR ? S_IFDIR : S_IFREG,
                     .next = (off_t)k + 1};
    if (npy) {
        snprintf(d->made, sizeof d->made, "%s.npy", nd->name);
        d->name = d->made;
    }
    return 1;
}

/* --- reading ----------------------------------------------------------------------------- */

/* What differs in a changed source file, as source_check answered (-EIO or -ESTALE). */
static const char *change_why(int rc)
{
    return rc == -EIO ? "its size or mtime differ from when it was mounted"
                      : "it was replaced or removed since it was mounted";
}

/* Source file `file` as messages name it: the absolute path watched, or a remote file's
 * location (without its secrets: ck_file's path). */
static const char *source_name(const ck_fs *fs, uint32_t file)
{
    return ck_file_origin(&fs->ix->files[file]) ? fs->src_path[file]
                                                 : fs->ix->files[file].path;
}

/* Logs the first change any check finds, once per mount: every read after it fails the same
 * way, and a log line per read would bury the one that says why. */
static void tell_change(ck_fs *fs, uint32_t file, int rc)
{
    pthread_mutex_lock(&fs->vfile_lock);
    int told = fs->change_told;
    fs->change_told = 1;
    pthread_mutex_unlock(&fs->vfile_lock);
    if (told || !fs->log)
        return;
    char line[STATUS_MAX + 64];
    snprintf(line, sizeof line, "ckptfs: %s: source changed (%s); reads fail until it is mounted"
             " again", source_name(fs, file), change_why(rc));
    fs->log(line);
}

/* 0 while source file `file` is still the one parsed at mount (same inode at the same path,
 * same size and mtime); else -EIO (its contents changed) or -ESTALE (the path now names
 * another file, or none). One fstat and one stat. */
static int source_unchanged(const ck_fs *fs, uint32_t file)
{
    const ck_file *f = &fs->ix->files[file], *local = ck_file_origin(f);
    struct stat st;
    /* The open descriptor first: a write or truncate changes its size or mtime. A remote file
     * is checked by every request it makes (source.h). */
    if (!ck_file_unchanged(f))
        return -EIO;
    if (!local)
        return 0;
    /* Then the path: a file renamed over it leaves our descriptor on the old, intact inode,
     * whose bytes are no longer what SOURCE holds (the same inode passed the check above). A
     * file made of a local one's bytes (an .npz member's inflated copy) is checked as that
     * one: its path is that one's. */
    if (stat(fs->src_path[file], &st) != 0 || !ck_file_matches(local, &st))
        return -ESTALE;
    return 0;
}

/* source_unchanged's answer; a change is told (tell_change). */
static int source_check(ck_fs *fs, uint32_t file)
{
    int rc = source_unchanged(fs, file);
    if (rc)
        tell_change(fs, file, rc);
    return rc;
}

/* source_check as ck_synth_each_source calls it. */
static int source_check_cb(void *fs, uint32_t file)
{
    return source_check(fs, file);
}

/* source_check of each file that bytes [off, off+len) of entry e are read from
 * (ck_entry_each_file): 0, or the first change's answer. */
static int entry_check(ck_fs *fs, const ck_entry *e, uint64_t off, uint64_t len)
{
    return ck_entry_each_file(e, off, len, source_check_cb, fs);
}

/* 0, or source_check's answer for the first changed file, whose index goes to *file. */
static int all_sources_check(ck_fs *fs, uint32_t *file)
{
    int rc = 0;
    for (*file = 0; *file < fs->ix->nfiles && !(rc = source_check(fs, *file)); ++*file)
        ;
    return rc;
}

/* .ckptfs/status's line into buf (cap bytes, NUL-terminated); its length. */
static size_t status_text(ck_fs *fs, char *buf, size_t cap)
{
    uint32_t file;
    int rc = all_sources_check(fs, &file);
    int n = rc ? snprintf(buf, cap, "source changed: %s (%s); remount to read it\n",
                          source_name(fs, file), change_why(rc))
               : snprintf(buf, cap, "ok\n");
    return (size_t)n < cap ? (size_t)n : cap - 1;
}

int ck_fs_open(ck_fs *fs, uint64_t ino, int flags)
{
    const ck_node *nd = node_of(fs, ino);
    if (!nd)
        return -ENOENT;
    if (nd->kind == CK_NODE_DIR)
        return -EISDIR;
    if ((flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC))
        return -EROFS;
    if ((nd->kind == CK_NODE_SYNTH || nd->kind == CK_NODE_MEMFILE) && !vfile_ready(fs, nd->id))
        return -EIO;
    uint32_t file;
    /* The files this one's bytes come from, as a read of all of it checks them (a tensor's or
     * a value's: ck_entry_each_file; a file made from the whole index: every source), and no
     * more: opening each of N tensors costs its own files, not N. Refusing here also keeps
     * new opens away from pages the kernel cached before the change. The status is what says
     * why, so it opens whatever the sources. */
    const ck_entry *e = nd->kind == CK_NODE_TENSOR || nd->kind == CK_NODE_VALUE
                            ? entry_of(fs, nd) : NULL;
    int rc = nd->kind == CK_NODE_STATUS ? 0
             : e                        ? entry_check(fs, e, 0, e->nbytes)
                                        : all_sources_check(fs, &file);
    return rc ? -ESTALE : 0;
}

/* .ckptfs/status's bytes at off, made for this read. */
static ssize_t status_read(ck_fs *fs, char *buf, size_t size, uint64_t off)
{
    char text[STATUS_MAX];
    size_t len = status_text(fs, text, sizeof text);
    size_t n = off >= len ? 0 : len - (size_t)off < size ? len - (size_t)off : size;
    memcpy(buf, text + (n ? off : 0), n);
    return (ssize_t)n;
}

/* A NAME.npy view's bytes: its header, then the tensor's; where the tensor's begin goes to
 * *hl. */
static ssize_t npy_read(ck_fs *fs, const ck_node *nd, char *buf, size_t size, uint64_t off,
                        size_t *hl_out)
{
    unsigned char head[NPY_MAKE_MAX];
    size_t hl = *hl_out = npy_header_of(fs, nd, head), n = 0;
    if (off < hl) {
        n = hl - off < size ? hl - (size_t)off : size;
        memcpy(buf, head + off, n);
        if (n == size)
            return (ssize_t)n;
    }
    ssize_t r = ck_entry_read(fs->ix, entry_of(fs, nd), buf + n, size - n, off + n - hl);
    return r < 0 ? r : (ssize_t)n + r;
}

/* Bytes [off, off+size) of file ino (node nd, not a directory nor the mount's own text) copied
 * into buf: the count, or -errno as ck_fs_read. */
static ssize_t copy_read(ck_fs *fs, uint64_t ino, const ck_node *nd, char *buf, size_t size,
                         uint64_t off)
{
    ssize_t n;
    int changed = 0;
    switch (nd->kind) {
    case CK_NODE_VALUE: /* its text is in memory */
        return ck_entry_read(fs->ix, entry_of(fs, nd), buf, size, off);
    case CK_NODE_STATUS:
        return status_read(fs, buf, size, off);
    case CK_NODE_TENSOR: {
        size_t hl = 0; /* a NAME.npy view's header: the mount's own bytes */
        n = is_npy(fs, ino) ? npy_read(fs, nd, buf, size, off, &hl)
                            : ck_entry_read(fs->ix, entry_of(fs, nd), buf, size, off);
        /* Checked after the pread: a write that could have put new bytes into buf has already
         * moved the mtime (or the size) by the time the pread returns, so this sees it. Every
         * file the range's bytes come from (a DCP tensor's chunks lie in files of their own). */
        changed = entry_check(fs, entry_of(fs, nd), off > hl ? off - hl : 0, size);
        break;
    }
    default: { /* CK_NODE_SYNTH */
        if (!vfile_ready(fs, nd->id))
            return -EIO;
        ck_synth *sy = fs->vfile[nd->id].synth;
        n = ck_synth_read(sy, buf, size, off);
        /* Only the files these bytes came from: checking every shard on every read costs two
         * syscalls per shard per request. A failed read checks its whole range, so that a
         * source cut short answers as changed rather than short. */
        changed = ck_synth_each_source(sy, off, n < 0 ? size : (size_t)n, source_check_cb, fs);
    }
    }
    return changed ? changed : n;
}

/* Appends a piece of len bytes at base to p (none for no bytes). */
static void add_piece(ck_pieces *p, const void *base, size_t len)
{
    if (len)
        p->iov[p->n++] = (struct iovec){.iov_base = (void *)base, .iov_len = len};
}

/* index.json's bytes, lent as they lie in its text; those past the pieces p has room for
 * copied. */
static ssize_t text_lend(ck_fs *fs, const ck_node *nd, size_t size, uint64_t off,
                         ck_fs_buffer buffer, void *arg, ck_pieces *p)
{
    if (!vfile_ready(fs, nd->id))
        return -EIO;
    const ck_text *t = &fs->vfile[nd->id].text;
    uint64_t left = off >= t->len ? 0 : t->len - off;
    size_t want = left > size ? size : (size_t)left;
    size_t got = ck_text_lend(t, off, want, p->iov, CK_PIECES_MAX - 1, &p->n);
    if (got < want) {
        char *buf = buffer(arg, want - got);
        if (!buf)
            return p->n = 0, -ENOMEM;
        add_piece(p, buf, ck_text_read(t, off + got, buf, want - got));
    }
    return (ssize_t)want;
}

/* A tensor's bytes lent by its source (ck_entry_hold, a piece at a time); those past the pieces
 * p has room for copied. Checked as copy_read checks them. */
static ssize_t tensor_lend(ck_fs *fs, uint64_t ino, const ck_node *nd, size_t size,
                           uint64_t off, ck_fs_buffer buffer, void *arg, ck_pieces *p)
{
    const ck_entry *e = entry_of(fs, nd);
    size_t got = 0;
    ssize_t k = 1;
    while (got < size && k > 0 && p->n < CK_PIECES_MAX - 1) {
        const void *at;
        k = ck_entry_hold(fs->ix, e, size - got, off + got, &at, &p->token[p->n]);
        if (k > 0) {
            add_piece(p, at, (size_t)k);
            p->lent = p->n;
            got += (size_t)k;
        }
    }
    if (got < size && k > 0) {
        char *buf = buffer(arg, size - got);
        k = buf ? ck_entry_read(fs->ix, e, buf, size - got, off + got) : -ENOMEM;
        if (k > 0) {
            add_piece(p, buf, (size_t)k);
            got += (size_t)k;
        }
    }
    /* After the holds, as after copy_read's pread: a change seen while fetching is seen here. */
    int rc = k < 0 ? (int)k : entry_check(fs, e, off, size);
    if (rc < 0) {
        ck_fs_read_release(fs, ino, p);
        return rc;
    }
    return (ssize_t)got;
}

ssize_t ck_fs_read(ck_fs *fs, uint64_t ino, size_t size, off_t off, ck_fs_buffer buffer,
                   void *arg, ck_pieces *p)
{
    const ck_node *nd = node_of(fs, ino);
    p->n = p->lent = 0;
    if (!nd)
        return -ENOENT;
    if (off < 0)
        return -EINVAL;
    if (nd->kind == CK_NODE_DIR)
        return -EISDIR;
    if (nd->kind == CK_NODE_MEMFILE)
        return text_lend(fs, nd, size, (uint64_t)off, buffer, arg, p);
    if (nd->kind == CK_NODE_TENSOR && !is_npy(fs, ino) && ck_entry_lends(fs->ix, entry_of(fs, nd)))
        return tensor_lend(fs, ino, nd, size, (uint64_t)off, buffer, arg, p);
    char *buf = buffer(arg, size);
    if (!buf)
        return -ENOMEM;
    ssize_t n = copy_read(fs, ino, nd, buf, size, (uint64_t)off);
    if (n > 0)
        add_piece(p, buf, (size_t)n);
    return n;
}

void ck_fs_read_release(ck_fs *fs, uint64_t ino, ck_pieces *p)
{
    const ck_node *nd = node_of(fs, ino); /* a tensor's, where any piece is lent */
    while (p->lent > 0) {
        p->lent--;
        ck_entry_release(fs->ix, entry_of(fs, nd), p->token[p->lent]);
    }
    p->n = 0;
}

/* --- attributes -------------------------------------------------------------------------- */

static int has_xattr(const ck_fs *fs, const ck_node *nd, int k)
{
    if (k == XA_BYTEORDER)
        return nd->kind == CK_NODE_TENSOR && entry_of(fs, nd)->layout == CK_SWAPPED;
    if (k == XA_ALIAS_OF)
        return is_alias(fs, nd);
    return (nd->kind == CK_NODE_TENSOR && k != XA_TYPE) ||
           (nd->kind == CK_NODE_VALUE && (k == XA_NAME || k == XA_TYPE));
}

/* What getxattr(2) and listxattr(2) answer for a value of n bytes. */
static ssize_t xattr_answer(const char *text, size_t n, char *buf, size_t size)
{
    if (size == 0)
        return (ssize_t)n;
    if (size < n)
        return -ERANGE;
    memcpy(buf, text, n);
    return (ssize_t)n;
}

ssize_t ck_fs_getxattr(const ck_fs *fs, uint64_t ino, const char *name, char *buf, size_t size)
{
    const ck_node *nd = node_of(fs, ino);
    if (!nd)
        return -ENOENT;
    if (ino == CK_ROOT_INO && fs->sources && strcmp(name, CK_SOURCES_XATTR) == 0)
        return xattr_answer(fs->sources, fs->sources_len, buf, size);
    int k = 0;
    while (k < XA_COUNT && strcmp(name, xattr_names[k]) != 0)
        k++;
    if (k == XA_COUNT || !has_xattr(fs, nd, k))
        return -ENODATA;
    const ck_entry *e = entry_of(fs, nd);
    char shape[2048]; /* 64 dims of 20 digits and a comma, and the brackets */
    switch (k) {
    case XA_NAME:
        return xattr_answer(e->name, e->name_len, buf, size);
    case XA_DTYPE:
        return xattr_answer(ck_dtype_name(e->dtype), strlen(ck_dtype_name(e->dtype)), buf, size);
    case XA_SHAPE:
        return xattr_answer(shape, ck_view_shape_json(e, shape, sizeof shape), buf, size);
    case XA_BYTEORDER:
        return xattr_answer("big", 3, buf, size);
    case XA_ALIAS_OF: {
        const ck_entry *owner = &fs->ix->entries[fs->alias_of[nd->id]];
        return xattr_answer(owner->name, owner->name_len, buf, size);
    }
    default: /* XA_TYPE */
        return xattr_answer(ck_value_type_name(e->dtype),
                            strlen(ck_value_type_name(e->dtype)), buf, size);
    }
}

ssize_t ck_fs_listxattr(const ck_fs *fs, uint64_t ino, char *buf, size_t size)
{
    const ck_node *nd = node_of(fs, ino);
    if (!nd)
        return -ENOENT;
    char list[256];
    size_t n = 0;
    if (ino == CK_ROOT_INO && fs->sources) {
        memcpy(list, CK_SOURCES_XATTR, sizeof CK_SOURCES_XATTR);
        n = sizeof CK_SOURCES_XATTR;
    }
    for (int k = 0; k < XA_COUNT; k++)
        if (has_xattr(fs, nd, k)) {
            size_t l = strlen(xattr_names[k]) + 1;
            memcpy(list + n, xattr_names[k], l);
            n += l;
        }
    return xattr_answer(list, n, buf, size);
}

void ck_fs_statfs(ck_fs *fs, struct statvfs *sv)
{
    int json = vfile_ready(fs, CK_VFILE_INDEX_JSON);
    uint64_t bytes = json ? fs->vfile[CK_VFILE_INDEX_JSON].text.len : 0;
    for (size_t i = 0; i < fs->ix->nentries; i++) /* an alias's storage is its owner's */
        bytes += fs->alias_of[i] == UINT32_MAX ? fs->ix->entries[i].nbytes : 0;
    *sv = (struct statvfs){
        .f_bsize = 4096, .f_frsize = 4096, .f_blocks = (bytes + 4095) / 4096,
        .f_files = fs->tree->nnodes, .f_namemax = CK_NAME_MAX, .f_flag = ST_RDONLY,
    };
}
