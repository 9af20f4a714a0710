#include "ll.h"
#include "view.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

const char *const ck_vfile_names[CK_VFILE_COUNT] = {
    [CK_VFILE_INDEX_JSON] = "index.json",
    [CK_VFILE_PACK] = "checkpoint.pack",
    [CK_VFILE_SAFETENSORS] = "checkpoint.safetensors",
};

/* A tensor has the first three; a value has the name and its type. */
static const char *const xattr_names[] = {"user.ckptfs.name", "user.ckptfs.dtype",
                                          "user.ckptfs.shape", "user.ckptfs.type"};

static int has_xattr(const ck_entry *e, size_t k)
{
    return k == 0 || (e->kind == CK_TENSOR ? k < 3 : k == 3);
}

static ck_fs *fs_of(fuse_req_t req)
{
    return fuse_req_userdata(req);
}

/* The node behind an inode, or CK_NO_NODE for an inode this mount never handed out. */
static uint32_t node_of(const ck_fs *fs, fuse_ino_t ino)
{
    return ino >= 1 && ino <= fs->tree->nnodes ? (uint32_t)(ino - 1) : CK_NO_NODE;
}

/* The synthesized file k, built the first time anyone looks at it: its header costs memory and
 * time that a mount used only for its tensors should not pay. NULL if it cannot be built. */
static ck_synth *synth_of(ck_fs *fs, uint32_t k)
{
    pthread_mutex_lock(&fs->synth_lock);
    if (!fs->synth[k] && !fs->synth_failed[k]) {
        ck_error err;
        int rc = k == CK_VFILE_PACK ? ck_synth_pack(fs->ix, NULL, &fs->synth[k], &err)
                                    : ck_synth_safetensors(fs->ix, &fs->synth[k], &err);
        fs->synth_failed[k] = rc != 0;
    }
    pthread_mutex_unlock(&fs->synth_lock);
    return fs->synth[k];
}

int ck_fs_source_check(const ck_fs *fs, uint32_t file)
{
    const ck_file *f = &fs->ix->files[file];
    struct stat st;
    /* The open descriptor first: a write or truncate changes its size or mtime. */
    if (fstat(f->fd, &st) != 0 || (uint64_t)st.st_size != f->size ||
        st.st_mtim.tv_sec != f->mtime.tv_sec || st.st_mtim.tv_nsec != f->mtime.tv_nsec)
        return -EIO;
    /* Then the path: a file renamed over it leaves our descriptor on the old, intact inode,
     * whose bytes are no longer what SOURCE holds. */
    if (stat(fs->src_path[file], &st) != 0 || st.st_dev != f->dev || st.st_ino != f->ino)
        return -ESTALE;
    return 0;
}

/* Checks every source file an entry's bytes come from. Values and index.json live in memory
 * and have none; a synthesized file reads from all of them. */
static int entry_check(const ck_fs *fs, int32_t entry)
{
    int rc = 0;
    if (entry < 0) {
        for (uint32_t i = 0; i < fs->ix->nfiles && !rc; i++)
            rc = ck_fs_source_check(fs, i);
        return rc;
    }
    const ck_entry *e = &fs->ix->entries[entry];
    return e->kind == CK_TENSOR ? ck_fs_source_check(fs, e->ext.file) : 0;
}

static uint64_t node_size(ck_fs *fs, const ck_node *nd)
{
    if (nd->entry >= 0)
        return fs->ix->entries[nd->entry].nbytes;
    if (nd->entry == CK_NODE_DIR)
        return 0;
    uint32_t k = CK_VIRTUAL_ID(nd->entry);
    if (fs->vdata[k])
        return fs->vlen[k];
    ck_synth *sy = synth_of(fs, k);
    return sy ? ck_synth_size(sy) : 0;
}

static void node_stat(ck_fs *fs, uint32_t node, struct stat *st)
{
    const ck_node *nd = &fs->tree->nodes[node];
    memset(st, 0, sizeof *st);
    st->st_ino = node + 1;
    st->st_uid = fs->uid;
    st->st_gid = fs->gid;
    st->st_size = (off_t)node_size(fs, nd);
    st->st_blocks = (st->st_size + 511) / 512;
    st->st_blksize = 1 << 20; /* cp and friends size their reads by this */
    st->st_mtim = st->st_ctim = st->st_atim = fs->mtime;
    if (nd->entry == CK_NODE_DIR) {
        st->st_mode = S_IFDIR | 0555;
        st->st_nlink = 2;
    } else {
        st->st_mode = S_IFREG | 0444;
        st->st_nlink = 1;
        if (nd->entry >= 0 && fs->ix->entries[nd->entry].kind == CK_TENSOR)
            st->st_mtim = st->st_ctim = st->st_atim =
                fs->ix->files[fs->ix->entries[nd->entry].ext.file].mtime;
    }
}

static void ll_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    ck_fs *fs = fs_of(req);
    uint32_t dir = node_of(fs, parent);
    if (dir == CK_NO_NODE)
        return (void)fuse_reply_err(req, ENOENT);
    if (fs->tree->nodes[dir].entry != CK_NODE_DIR)
        return (void)fuse_reply_err(req, ENOTDIR);
    struct fuse_entry_param e = {.attr_timeout = fs->timeout, .entry_timeout = fs->timeout};
    uint32_t node = ck_tree_lookup(fs->tree, dir, name, strlen(name));
    if (node != CK_NO_NODE) { /* else ino 0: the kernel caches the miss as well */
        e.ino = node + 1;
        e.generation = 1;
        node_stat(fs, node, &e.attr);
    }
    fuse_reply_entry(req, &e);
}

static void ll_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)fi;
    ck_fs *fs = fs_of(req);
    uint32_t node = node_of(fs, ino);
    if (node == CK_NO_NODE)
        return (void)fuse_reply_err(req, ENOENT);
    struct stat st;
    node_stat(fs, node, &st);
    fuse_reply_attr(req, &st, fs->timeout);
}

static void ll_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    ck_fs *fs = fs_of(req);
    uint32_t node = node_of(fs, ino);
    if (node == CK_NO_NODE)
        return (void)fuse_reply_err(req, ENOENT);
    if (fs->tree->nodes[node].entry != CK_NODE_DIR)
        return (void)fuse_reply_err(req, ENOTDIR);
    fi->cache_readdir = 1;
    fi->keep_cache = 1;
    fuse_reply_open(req, fi);
}

/* Offsets: 0 is ".", 1 is "..", 2 + k is the k-th child in sorted order. */
static void ll_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                       struct fuse_file_info *fi)
{
    (void)fi;
    ck_fs *fs = fs_of(req);
    uint32_t node = node_of(fs, ino);
    if (node == CK_NO_NODE)
        return (void)fuse_reply_err(req, ENOENT);
    const ck_node *dir = &fs->tree->nodes[node];
    char *buf = malloc(size);
    if (!buf)
        return (void)fuse_reply_err(req, ENOMEM);
    size_t used = 0;
    for (off_t k = off < 0 ? 0 : off; k < 2 + (off_t)dir->nchild; k++) {
        uint32_t child = k == 0 ? node : k == 1 ? dir->parent : fs->tree->children[dir->child0 + k - 2];
        const char *name = k == 0 ? "." : k == 1 ? ".." : fs->tree->nodes[child].name;
        struct stat st = {.st_ino = child + 1};
        st.st_mode = fs->tree->nodes[child].entry == CK_NODE_DIR ? S_IFDIR : S_IFREG;
        size_t n = fuse_add_direntry(req, buf + used, size - used, name, &st, k + 1);
        if (n > size - used)
            break;
        used += n;
    }
    fuse_reply_buf(req, buf, used);
    free(buf);
}

static void ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    ck_fs *fs = fs_of(req);
    uint32_t node = node_of(fs, ino);
    if (node == CK_NO_NODE)
        return (void)fuse_reply_err(req, ENOENT);
    if (fs->tree->nodes[node].entry == CK_NODE_DIR)
        return (void)fuse_reply_err(req, EISDIR);
    if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC))
        return (void)fuse_reply_err(req, EROFS);
    /* Every source, not just this entry's: an open is rare next to reads, and a changed source
     * makes the whole view suspect. Refusing here also keeps new opens away from pages the
     * kernel cached before the change (keep_cache). */
    for (uint32_t i = 0; i < fs->ix->nfiles; i++)
        if (ck_fs_source_check(fs, i) != 0)
            return (void)fuse_reply_err(req, ESTALE);
    fi->keep_cache = 1; /* the bytes never change while mounted */
    fi->direct_io = fs->direct_io;
    fuse_reply_open(req, fi);
}

/* This thread's read buffer, at least size bytes. */
static char *read_buffer(ck_fs *fs, size_t size)
{
    size_t *b = pthread_getspecific(fs->read_buf);
    if (!b || *b < size) {
        free(b);
        b = malloc(sizeof(size_t) + size);
        pthread_setspecific(fs->read_buf, b);
        if (!b)
            return NULL;
        *b = size;
    }
    return (char *)(b + 1);
}

static void ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi)
{
    (void)fi;
    ck_fs *fs = fs_of(req);
    uint32_t node = node_of(fs, ino);
    if (node == CK_NO_NODE || off < 0)
        return (void)fuse_reply_err(req, node == CK_NO_NODE ? ENOENT : EINVAL);
    int32_t entry = fs->tree->nodes[node].entry;
    if (entry == CK_NODE_DIR)
        return (void)fuse_reply_err(req, EISDIR);
    uint32_t v = entry < 0 ? CK_VIRTUAL_ID(entry) : 0;
    if (entry < 0 && fs->vdata[v]) {
        size_t n = (uint64_t)off >= fs->vlen[v] ? 0 : fs->vlen[v] - (size_t)off;
        return (void)fuse_reply_buf(req, fs->vdata[v] + off, n < size ? n : size);
    }
    ck_synth *sy = entry < 0 ? synth_of(fs, v) : NULL;
    if (entry < 0 && !sy)
        return (void)fuse_reply_err(req, EIO);
    char *buf = read_buffer(fs, size);
    if (!buf)
        return (void)fuse_reply_err(req, ENOMEM);
    ssize_t n = sy ? ck_synth_read(sy, buf, size, (uint64_t)off)
                   : ck_entry_read(fs->ix, &fs->ix->entries[entry], buf, size, (uint64_t)off);
    /* Checked after the pread: a write that could have put new bytes into buf has already
     * moved the mtime (or the size) by the time the pread returns, so this sees it. */
    int changed = entry_check(fs, entry);
    if (n < 0 || changed)
        return (void)fuse_reply_err(req, changed ? -changed : (int)-n);
    fuse_reply_buf(req, buf, (size_t)n);
}

/* The value of one of our xattrs for an entry, in buf; its length, or -1 if there is none. */
static ssize_t xattr_value(const ck_entry *e, const char *name, char *buf, size_t cap)
{
    size_t k = 0;
    while (k < sizeof xattr_names / sizeof *xattr_names && strcmp(name, xattr_names[k]) != 0)
        k++;
    if (k == sizeof xattr_names / sizeof *xattr_names || !has_xattr(e, k))
        return -1;
    const char *text = k == 0 ? e->name : k == 1 ? ck_dtype_name(e->dtype)
                              : k == 3 ? ck_value_type_name(e->dtype) : NULL;
    if (!text)
        return (ssize_t)ck_view_shape_json(e, buf, cap);
    size_t n = k == 0 ? e->name_len : strlen(text);
    if (n > cap)
        return -1;
    memcpy(buf, text, n);
    return (ssize_t)n;
}

static void ll_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
    ck_fs *fs = fs_of(req);
    uint32_t node = node_of(fs, ino);
    if (node == CK_NO_NODE)
        return (void)fuse_reply_err(req, ENOENT);
    int32_t entry = fs->tree->nodes[node].entry;
    if (entry < 0)
        return (void)fuse_reply_err(req, ENODATA);
    const ck_entry *e = &fs->ix->entries[entry];
    /* Large enough for any shape (64 dims of 20 digits) and any name. */
    size_t cap = e->name_len > 2048 ? e->name_len : 2048;
    char *buf = malloc(cap);
    ssize_t n = buf ? xattr_value(e, name, buf, cap) : -1;
    if (!buf)
        fuse_reply_err(req, ENOMEM);
    else if (n < 0)
        fuse_reply_err(req, ENODATA);
    else if (size == 0)
        fuse_reply_xattr(req, (size_t)n);
    else if (size < (size_t)n)
        fuse_reply_err(req, ERANGE);
    else
        fuse_reply_buf(req, buf, (size_t)n);
    free(buf);
}

static void ll_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
    ck_fs *fs = fs_of(req);
    uint32_t node = node_of(fs, ino);
    if (node == CK_NO_NODE)
        return (void)fuse_reply_err(req, ENOENT);
    int32_t entry = fs->tree->nodes[node].entry;
    char list[128];
    size_t n = 0;
    for (size_t i = 0; entry >= 0 && i < sizeof xattr_names / sizeof *xattr_names; i++)
        if (has_xattr(&fs->ix->entries[entry], i)) {
            size_t l = strlen(xattr_names[i]) + 1;
            memcpy(list + n, xattr_names[i], l);
            n += l;
        }
    if (size == 0)
        fuse_reply_xattr(req, n);
    else if (size < n)
        fuse_reply_err(req, ERANGE);
    else
        fuse_reply_buf(req, list, n);
}

static void ll_statfs(fuse_req_t req, fuse_ino_t ino)
{
    (void)ino;
    ck_fs *fs = fs_of(req);
    /* The entries and index.json: counting the synthesized files would build them. */
    uint64_t bytes = fs->vlen[CK_VFILE_INDEX_JSON];
    for (size_t i = 0; i < fs->ix->nentries; i++)
        bytes += fs->ix->entries[i].nbytes;
    struct statvfs sv = {
        .f_bsize = 4096, .f_frsize = 4096, .f_blocks = (bytes + 4095) / 4096,
        .f_files = fs->tree->nnodes, .f_namemax = CK_NAME_MAX, .f_flag = ST_RDONLY,
    };
    fuse_reply_statfs(req, &sv);
}

/* Everything that would change the tree: the view is read-only by design. */
static void ll_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                       struct fuse_file_info *fi)
{
    (void)ino, (void)attr, (void)to_set, (void)fi;
    fuse_reply_err(req, EROFS);
}
static void ll_mknod(fuse_req_t req, fuse_ino_t p, const char *n, mode_t m, dev_t d)
{
    (void)p, (void)n, (void)m, (void)d;
    fuse_reply_err(req, EROFS);
}
static void ll_mkdir(fuse_req_t req, fuse_ino_t p, const char *n, mode_t m)
{
    (void)p, (void)n, (void)m;
    fuse_reply_err(req, EROFS);
}
static void ll_unlink(fuse_req_t req, fuse_ino_t p, const char *n)
{
    (void)p, (void)n;
    fuse_reply_err(req, EROFS);
}
static void ll_symlink(fuse_req_t req, const char *l, fuse_ino_t p, const char *n)
{
    (void)l, (void)p, (void)n;
    fuse_reply_err(req, EROFS);
}
static void ll_rename(fuse_req_t req, fuse_ino_t p, const char *n, fuse_ino_t np,
                      const char *nn, unsigned int f)
{
    (void)p, (void)n, (void)np, (void)nn, (void)f;
    fuse_reply_err(req, EROFS);
}
static void ll_link(fuse_req_t req, fuse_ino_t i, fuse_ino_t np, const char *nn)
{
    (void)i, (void)np, (void)nn;
    fuse_reply_err(req, EROFS);
}
static void ll_write(fuse_req_t req, fuse_ino_t i, const char *b, size_t s, off_t o,
                     struct fuse_file_info *fi)
{
    (void)i, (void)b, (void)s, (void)o, (void)fi;
    fuse_reply_err(req, EROFS);
}
static void ll_create(fuse_req_t req, fuse_ino_t p, const char *n, mode_t m,
                      struct fuse_file_info *fi)
{
    (void)p, (void)n, (void)m, (void)fi;
    fuse_reply_err(req, EROFS);
}
static void ll_setxattr(fuse_req_t req, fuse_ino_t i, const char *n, const char *v, size_t s,
                        int f)
{
    (void)i, (void)n, (void)v, (void)s, (void)f;
    fuse_reply_err(req, EROFS);
}
static void ll_removexattr(fuse_req_t req, fuse_ino_t i, const char *n)
{
    (void)i, (void)n;
    fuse_reply_err(req, EROFS);
}

const struct fuse_lowlevel_ops ck_ll_ops = {
    .lookup = ll_lookup,
    .getattr = ll_getattr,
    .opendir = ll_opendir,
    .readdir = ll_readdir,
    .open = ll_open,
    .read = ll_read,
    .getxattr = ll_getxattr,
    .listxattr = ll_listxattr,
    .statfs = ll_statfs,
    .setattr = ll_setattr,
    .mknod = ll_mknod,
    .mkdir = ll_mkdir,
    .unlink = ll_unlink,
    .rmdir = ll_unlink,
    .symlink = ll_symlink,
    .rename = ll_rename,
    .link = ll_link,
    .write = ll_write,
    .create = ll_create,
    .setxattr = ll_setxattr,
    .removexattr = ll_removexattr,
};
