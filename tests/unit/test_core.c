/* The filesystem core (fs/core.h) without a mount: every operation on every kind of node,
 * inode numbering, readdir offsets, xattrs, statfs, the errors each one answers, index.json made
 * on first use (once, whatever the threads), a synthesized file that cannot be built (EIO,
 * logged once), and source files that change under the view. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "../../fs/core.h"
#include "../../views/view.h"

TestSuite(core, .fini = tmp_cleanup);

enum { SRC_LEN = 64, UID = 1234, GID = 5678 };

/* What the core logged: each test runs in its own process, so plain statics do. */
static int nlogged;
static char logged[1024];

static void capture(const char *line)
{
    nlogged++;
    snprintf(logged, sizeof logged, "%s", line);
}

/* The source every test mounts: SRC_LEN bytes, tensors w.a (F32[4] at 0), w.b (U8[2,3] at 16)
 * and n (I16 scalar at 22), and the value v (int "7\n"). */
static unsigned char src[SRC_LEN];

static ck_index *sample_index(void)
{
    fill_bytes(src, sizeof src, 7);
    ck_index *ix = index_over(src, sizeof src);
    add_contig(ix, "w.a", CK_F32, 1, (int64_t[]){4}, 0, 16);
    add_contig(ix, "w.b", CK_U8, 2, (int64_t[]){2, 3}, 16, 6);
    add_contig(ix, "n", CK_I16, 0, NULL, 22, 2);
    ck_error err = {""};
    cr_assert_not_null(ck_index_add_value(ix, "v", 1, CK_VAL_INT, "7\n", 2, &err), "%s",
                       err.msg);
    return ix;
}

static void init_ok(ck_fs *fs, ck_index *ix)
{
    ck_error err = {""};
    cr_assert_eq(ck_fs_init(fs, ix, UID, GID, capture, &err), 0, "%s", err.msg);
}

static ck_fs *sample_fs(void)
{
    static ck_fs fs;
    init_ok(&fs, sample_index());
    return &fs;
}

/* The inode at path ("a/b", "" for the root), found by lookups from the root; its stat. */
static uint64_t walk(ck_fs *fs, const char *path, struct stat *st)
{
    uint64_t ino = CK_ROOT_INO;
    cr_assert_eq(ck_fs_getattr(fs, ino, st), 0);
    while (*path) {
        const char *slash = strchr(path, '/');
        size_t len = slash ? (size_t)(slash - path) : strlen(path);
        const char *name = strf("%.*s", (int)len, path);
        int rc = ck_fs_lookup(fs, ino, name, st);
        cr_assert_eq(rc, 0, "lookup of '%s' gave %d", name, rc);
        ino = st->st_ino;
        path += len + (slash != NULL);
    }
    return ino;
}

static uint64_t ino_at(ck_fs *fs, const char *path)
{
    struct stat st;
    return walk(fs, path, &st);
}

/* The buffer a read's bytes are copied into (ck_fs_buffer): the caller's, as the FUSE adapter
 * hands its thread's buffer. */
static char *given(void *arg, size_t size)
{
    (void)size;
    return arg;
}

/* p's pieces, one after the other, into out: how many bytes. */
static size_t gather(const ck_pieces *p, void *out)
{
    size_t at = 0;
    for (unsigned i = 0; i < p->n; i++) {
        memcpy((char *)out + at, p->iov[i].iov_base, p->iov[i].iov_len);
        at += p->iov[i].iov_len;
    }
    return at;
}

/* ck_fs_read's pieces gathered into buf, as a reply gathers them, and released: the count or
 * -errno. (No assertion: racing threads call it.) */
static ssize_t read_at(ck_fs *fs, uint64_t ino, void *buf, size_t size, off_t off)
{
    char *scratch = malloc(size ? size : 1);
    ck_pieces p;
    ssize_t n = scratch ? ck_fs_read(fs, ino, size, off, given, scratch, &p) : -ENOMEM;
    size_t at = n >= 0 ? gather(&p, buf) : 0;
    if (n >= 0)
        ck_fs_read_release(fs, ino, &p);
    free(scratch);
    return n >= 0 && at != (size_t)n ? -EBADMSG : n;
}

/* A buffer for ck_fs_read that counts how often it is asked for. */
typedef struct counted_buf {
    char mem[1 << 12];
    unsigned calls;
} counted_buf;

static char *counted_buffer(void *arg, size_t size)
{
    counted_buf *b = arg;
    cr_assert_leq(size, sizeof b->mem);
    b->calls++;
    return b->mem;
}

/* The whole file ino, read in chunks of `chunk` bytes; its length in *len. */
static unsigned char *read_all(ck_fs *fs, uint64_t ino, size_t chunk, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    unsigned char *b = malloc(cap);
    cr_assert_not_null(b);
    for (;;) {
        if (n + chunk > cap)
            cr_assert_not_null(b = realloc(b, cap = 2 * (n + chunk)));
        ssize_t got = read_at(fs, ino, (char *)b + n, chunk, (off_t)n);
        cr_assert_geq(got, 0, "read at %zu gave %zd", n, got);
        if (got == 0)
            break;
        n += (size_t)got;
    }
    *len = n;
    return b;
}

/* --- kinds and attributes ---------------------------------------------------------------- */

Test(core, every_node_has_its_kind)
{
    ck_fs *fs = sample_fs();
    static const struct { const char *path; uint8_t kind; } want[] = {
        {"", CK_NODE_DIR}, {"w", CK_NODE_DIR}, {".ckptfs", CK_NODE_DIR},
        {"w/a", CK_NODE_TENSOR}, {"w/b", CK_NODE_TENSOR}, {"n", CK_NODE_TENSOR},
        {"v", CK_NODE_VALUE}, {".ckptfs/index.json", CK_NODE_MEMFILE},
        {".ckptfs/checkpoint.pack", CK_NODE_SYNTH},
        {".ckptfs/checkpoint.safetensors", CK_NODE_SYNTH}, {".ckptfs/status", CK_NODE_STATUS},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        uint64_t ino = ino_at(fs, want[i].path);
        cr_assert_eq(ino, tree_find(fs->tree, want[i].path) + 1, "%s", want[i].path);
        cr_assert_eq(fs->tree->nodes[ino - 1].kind, want[i].kind, "%s", want[i].path);
    }
    cr_assert_eq(fs->tree->nnodes, 11);
    ck_fs_free(fs);
}

Test(core, directory_attributes)
{
    ck_fs *fs = sample_fs();
    struct stat st;
    for (int k = 0; k < 3; k++) {
        const char *path = (const char *[]){"", "w", ".ckptfs"}[k];
        uint64_t ino = walk(fs, path, &st);
        cr_assert_eq(st.st_ino, ino);
        cr_assert_eq(st.st_mode, S_IFDIR | 0555, "%s", path);
        cr_assert_eq(st.st_nlink, 2);
        cr_assert_eq(st.st_size, 0);
        cr_assert_eq(st.st_uid, UID);
        cr_assert_eq(st.st_gid, GID);
        cr_assert_eq(st.st_mtim.tv_sec, fs->ix->files[0].mtime.tv_sec);
        cr_assert_eq(st.st_mtim.tv_nsec, fs->ix->files[0].mtime.tv_nsec);
    }
    cr_assert_eq(walk(fs, "", &st), CK_ROOT_INO);
    ck_fs_free(fs);
}

Test(core, file_attributes)
{
    ck_fs *fs = sample_fs();
    static const struct { const char *path; off_t size; } want[] = {
        {"w/a", 16}, {"w/b", 6}, {"n", 2}, {"v", 2},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        struct stat st, again;
        uint64_t ino = walk(fs, want[i].path, &st);
        cr_assert_eq(st.st_mode, S_IFREG | 0444, "%s", want[i].path);
        cr_assert_eq(st.st_nlink, 1);
        cr_assert_eq(st.st_size, want[i].size, "%s", want[i].path);
        cr_assert_eq(st.st_blocks, 1);
        cr_assert_eq(st.st_blksize, 1 << 20);
        cr_assert_eq(st.st_uid, UID);
        cr_assert_eq(st.st_gid, GID);
        cr_assert_eq(st.st_mtim.tv_nsec, fs->ix->files[0].mtime.tv_nsec);
        cr_assert_eq(ck_fs_getattr(fs, ino, &again), 0);
        cr_assert_eq(memcmp(&st, &again, sizeof st), 0, "lookup and getattr agree");
    }
    struct stat st;
    walk(fs, ".ckptfs/index.json", &st);
    cr_assert_eq((size_t)st.st_size, fs->vfile[CK_VFILE_INDEX_JSON].text.len);
    cr_assert_eq(st.st_blocks, (st.st_size + 511) / 512);
    ck_fs_free(fs);
}

Test(core, tensor_mtime_is_its_files)
{
    /* Two source files with distinct mtimes: a tensor of the second shows the second's. */
    ck_index *ix = sample_index();
    const char *second = tmp_file("abcd", 4);
    struct timespec times[2] = {{.tv_sec = 1000000000, .tv_nsec = 5}, {.tv_sec = 1000000000,
                                                                        .tv_nsec = 5}};
    cr_assert_eq(utimensat(AT_FDCWD, second, times, 0), 0);
    ck_error err = {""};
    int fd = open(second, O_RDONLY | O_CLOEXEC);
    cr_assert_eq(ck_index_add_file(ix, second, fd, &err), 1, "%s", err.msg);
    ck_entry *e = add_contig(ix, "t", CK_U8, 1, (int64_t[]){4}, 0, 4);
    e->ext.file = 1;
    ck_fs fs;
    init_ok(&fs, ix);
    struct stat st;
    walk(&fs, "t", &st);
    cr_assert_eq(st.st_mtim.tv_sec, 1000000000);
    cr_assert_eq(st.st_mtim.tv_nsec, 5);
    walk(&fs, "v", &st); /* a value, like a directory, has the first file's */
    cr_assert_eq(st.st_mtim.tv_nsec, ix->files[0].mtime.tv_nsec);
    ck_fs_free(&fs);
}

Test(core, unknown_inodes)
{
    ck_fs *fs = sample_fs();
    struct stat st;
    char buf[64];
    ck_dirent d;
    uint64_t bad[] = {0, fs->tree->nnodes + 1, UINT64_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(ck_fs_getattr(fs, bad[i], &st), -ENOENT);
        cr_assert_eq(ck_fs_lookup(fs, bad[i], "w", &st), -ENOENT);
        cr_assert_eq(ck_fs_opendir(fs, bad[i]), -ENOENT);
        cr_assert_eq(ck_fs_readdir(fs, bad[i], 0, &d), -ENOENT);
        cr_assert_eq(ck_fs_open(fs, bad[i], O_RDONLY), -ENOENT);
        cr_assert_eq(read_at(fs, bad[i], buf, sizeof buf, 0), -ENOENT);
        cr_assert_eq(ck_fs_getxattr(fs, bad[i], "user.ckptfs.name", buf, sizeof buf), -ENOENT);
        cr_assert_eq(ck_fs_listxattr(fs, bad[i], buf, sizeof buf), -ENOENT);
    }
    cr_assert_eq(ck_fs_getattr(fs, fs->tree->nnodes, &st), 0, "the last inode is there");
    ck_fs_free(fs);
}

/* --- lookup, opendir, readdir ------------------------------------------------------------- */

Test(core, lookup_misses_and_non_directories)
{
    ck_fs *fs = sample_fs();
    struct stat st;
    cr_assert_eq(ck_fs_lookup(fs, CK_ROOT_INO, "nope", &st), -ENOENT);
    cr_assert_eq(ck_fs_lookup(fs, CK_ROOT_INO, "w.a", &st), -ENOENT); /* names are not paths */
    cr_assert_eq(ck_fs_lookup(fs, CK_ROOT_INO, "", &st), -ENOENT);
    cr_assert_eq(ck_fs_lookup(fs, ino_at(fs, "w"), "n", &st), -ENOENT); /* wrong parent */
    const char *files[] = {"w/a", "v", ".ckptfs/index.json", ".ckptfs/checkpoint.pack"};
    for (size_t i = 0; i < 4; i++) {
        uint64_t ino = ino_at(fs, files[i]);
        cr_assert_eq(ck_fs_lookup(fs, ino, "a", &st), -ENOTDIR, "%s", files[i]);
        cr_assert_eq(ck_fs_opendir(fs, ino), -ENOTDIR, "%s", files[i]);
        cr_assert_eq(ck_fs_readdir(fs, ino, 0, &(ck_dirent){0}), -ENOTDIR, "%s", files[i]);
    }
    cr_assert_eq(ck_fs_opendir(fs, CK_ROOT_INO), 0);
    cr_assert_eq(ck_fs_opendir(fs, ino_at(fs, ".ckptfs")), 0);
    ck_fs_free(fs);
}

/* Every entry of directory ino from offset off, as "name:ino:d|f" lines. */
static const char *listing(ck_fs *fs, uint64_t ino, off_t off)
{
    const char *s = "";
    ck_dirent d;
    int rc;
    off_t want_next = off < 0 ? 1 : off + 1;
    while ((rc = ck_fs_readdir(fs, ino, off, &d)) == 1) {
        cr_assert_eq(d.next, want_next++);
        s = strf("%s%s:%llu:%c\n", s, d.name, (unsigned long long)d.ino,
                 d.type == S_IFDIR ? 'd' : 'f');
        off = d.next;
    }
    cr_assert_eq(rc, 0);
    return s;
}

Test(core, readdir_offsets)
{
    ck_fs *fs = sample_fs();
    uint64_t w = ino_at(fs, "w"), v = ino_at(fs, ".ckptfs");
    const char *root = strf(".:1:d\n..:1:d\n.ckptfs:%llu:d\nn:%llu:f\nv:%llu:f\nw:%llu:d\n",
                            (unsigned long long)v, (unsigned long long)ino_at(fs, "n"),
                            (unsigned long long)ino_at(fs, "v"), (unsigned long long)w);
    cr_assert_str_eq(listing(fs, CK_ROOT_INO, 0), root);
    cr_assert_str_eq(listing(fs, CK_ROOT_INO, -5), root, "a negative offset is the start");
    /* Resuming at any offset gives the rest. */
    cr_assert_str_eq(listing(fs, CK_ROOT_INO, 3), strchr(strchr(strchr(root, '\n') + 1, '\n')
                                                          + 1, '\n') + 1);
    cr_assert_str_eq(listing(fs, CK_ROOT_INO, 6), "");
    cr_assert_str_eq(listing(fs, CK_ROOT_INO, 1000), "");
    cr_assert_str_eq(listing(fs, w, 0),
                     strf(".:%llu:d\n..:1:d\na:%llu:f\nb:%llu:f\n", (unsigned long long)w,
                          (unsigned long long)ino_at(fs, "w/a"),
                          (unsigned long long)ino_at(fs, "w/b")));
    cr_assert_str_eq(listing(fs, v, 1),
                     strf("..:1:d\ncheckpoint.pack:%llu:f\ncheckpoint.safetensors:%llu:f\n"
                          "index.json:%llu:f\nstatus:%llu:f\n",
                          (unsigned long long)ino_at(fs, ".ckptfs/checkpoint.pack"),
                          (unsigned long long)ino_at(fs, ".ckptfs/checkpoint.safetensors"),
                          (unsigned long long)ino_at(fs, ".ckptfs/index.json"),
                          (unsigned long long)ino_at(fs, ".ckptfs/status")));
    ck_fs_free(fs);
}

/* --- open and read ------------------------------------------------------------------------ */

Test(core, open_flags)
{
    ck_fs *fs = sample_fs();
    const char *files[] = {"w/a", "v", ".ckptfs/index.json", ".ckptfs/checkpoint.pack",
                           ".ckptfs/checkpoint.safetensors"};
    for (size_t i = 0; i < 5; i++) {
        uint64_t ino = ino_at(fs, files[i]);
        cr_assert_eq(ck_fs_open(fs, ino, O_RDONLY), 0, "%s", files[i]);
        cr_assert_eq(ck_fs_open(fs, ino, O_RDONLY | O_NOFOLLOW | O_CLOEXEC), 0);
        cr_assert_eq(ck_fs_open(fs, ino, O_WRONLY), -EROFS, "%s", files[i]);
        cr_assert_eq(ck_fs_open(fs, ino, O_RDWR), -EROFS);
        cr_assert_eq(ck_fs_open(fs, ino, O_RDONLY | O_TRUNC), -EROFS);
    }
    cr_assert_eq(ck_fs_open(fs, CK_ROOT_INO, O_RDONLY), -EISDIR);
    cr_assert_eq(ck_fs_open(fs, ino_at(fs, "w"), O_WRONLY), -EISDIR);
    ck_fs_free(fs);
}

Test(core, read_tensors_and_values)
{
    ck_fs *fs = sample_fs();
    char buf[64];
    uint64_t a = ino_at(fs, "w/a"), b = ino_at(fs, "w/b"), n = ino_at(fs, "n");
    cr_assert_eq(read_at(fs, a, buf, sizeof buf, 0), 16);
    cr_assert_arr_eq(buf, src, 16);
    cr_assert_eq(read_at(fs, a, buf, 5, 3), 5);
    cr_assert_arr_eq(buf, src + 3, 5);
    cr_assert_eq(read_at(fs, a, buf, sizeof buf, 15), 1);
    cr_assert_eq(buf[0], (char)src[15]);
    cr_assert_eq(read_at(fs, a, buf, sizeof buf, 16), 0);
    cr_assert_eq(read_at(fs, a, buf, sizeof buf, 1000), 0);
    cr_assert_eq(read_at(fs, a, buf, sizeof buf, -1), -EINVAL);
    cr_assert_eq(read_at(fs, b, buf, sizeof buf, 0), 6);
    cr_assert_arr_eq(buf, src + 16, 6);
    cr_assert_eq(read_at(fs, n, buf, sizeof buf, 0), 2);
    cr_assert_arr_eq(buf, src + 22, 2);
    uint64_t v = ino_at(fs, "v");
    cr_assert_eq(read_at(fs, v, buf, sizeof buf, 0), 2);
    cr_assert_arr_eq(buf, "7\n", 2);
    cr_assert_eq(read_at(fs, v, buf, sizeof buf, 1), 1);
    cr_assert_eq(read_at(fs, v, buf, sizeof buf, 2), 0);
    cr_assert_eq(read_at(fs, CK_ROOT_INO, buf, sizeof buf, 0), -EISDIR);
    cr_assert_eq(read_at(fs, ino_at(fs, ".ckptfs"), buf, sizeof buf, 0), -EISDIR);
    ck_fs_free(fs);
}

/* index.json's text as ck_view_index_json makes it, in one piece (*len bytes). */
static char *index_text(ck_fs *fs, size_t *len)
{
    ck_text v;
    cr_assert_eq(ck_view_index_json(fs->ix, fs->tree, fs->alias_of, 0, &v), 0);
    char *text = malloc(v.len + 1);
    cr_assert_not_null(text);
    *len = ck_text_read(&v, 0, text, v.len);
    cr_assert_eq(*len, v.len);
    text[*len] = 0;
    ck_text_free(&v);
    return text;
}

Test(core, read_index_json)
{
    ck_fs *fs = sample_fs();
    uint64_t ino = ino_at(fs, ".ckptfs/index.json");
    size_t len = 0, want_len = 0;
    char *want = index_text(fs, &want_len);
    for (size_t chunk = 1; chunk <= 4096; chunk *= 8) {
        unsigned char *got = read_all(fs, ino, chunk, &len);
        cr_assert_eq(len, want_len, "chunk %zu", chunk);
        cr_assert_arr_eq(got, want, len);
        free(got);
    }
    char buf[8];
    cr_assert_eq(read_at(fs, ino, buf, sizeof buf, (off_t)want_len + 100), 0);
    cr_assert_eq(read_at(fs, ino, buf, sizeof buf, -1), -EINVAL);
    /* The same bytes lent, without a copy: no buffer asked for. */
    ck_pieces p;
    counted_buf b = {0};
    for (size_t off = 0; off < want_len; off += 1000) {
        ssize_t n = ck_fs_read(fs, ino, 4096, (off_t)off, counted_buffer, &b, &p);
        size_t left = want_len - off;
        cr_assert_eq(n, (ssize_t)(left < 4096 ? left : 4096), "at %zu", off);
        cr_assert_eq(p.n, 1);
        cr_assert_eq(p.lent, 0, "the mount's own bytes: nothing to release");
        cr_assert_eq(p.iov[0].iov_len, (size_t)n);
        cr_assert_arr_eq(p.iov[0].iov_base, want + off, (size_t)n);
    }
    cr_assert_eq(ck_fs_read(fs, ino, 8, (off_t)want_len + 100, counted_buffer, &b, &p), 0);
    cr_assert_eq(p.n, 0);
    cr_assert_eq(ck_fs_read(fs, ino, 8, -1, counted_buffer, &b, &p), -EINVAL);
    cr_assert_eq(ck_fs_read(fs, 1u << 30, 8, 0, counted_buffer, &b, &p), -ENOENT);
    cr_assert_eq(b.calls, 0);
    free(want);
    ck_fs_free(fs);
}

/* --- one read: lent or copied ------------------------------------------------------------ */

/* A source file over src whose ops count what reads ask of them. With lending_ops it lends its
 * bytes in pieces of `piece` bytes, as a remote file lends its cached blocks; with copying_ops
 * it has no way to (a local file, an .npz member's inflated copy). */
typedef struct counted_src {
    size_t piece;
    int changed;
    unsigned preads, holds, releases;
} counted_src;

static int cs_pread(const ck_file *f, void *buf, size_t len, uint64_t off)
{
    counted_src *c = f->remote;
    c->preads++;
    if (off > f->size || len > f->size - off)
        return -EIO;
    memcpy(buf, src + off, len);
    return 0;
}

static int cs_same(const ck_file *f)
{
    return !((counted_src *)f->remote)->changed;
}

static void cs_close(ck_file *f)
{
    (void)f;
}

static void cs_stats(const ck_file *f, uint64_t *requests, uint64_t *bytes)
{
    (void)f;
    *requests = *bytes = 0;
}

static void cs_hint(ck_file *f, const uint64_t *bounds, size_t n)
{
    (void)f, (void)bounds, (void)n;
}

static ssize_t cs_hold(const ck_file *f, size_t len, uint64_t off, const void **ptr,
                       void **token)
{
    counted_src *c = f->remote;
    c->holds++;
    size_t n = c->piece - (size_t)(off % c->piece); /* to the end of its piece */
    *ptr = src + off;
    *token = c;
    return (ssize_t)(n < len ? n : len);
}

static void cs_release(const ck_file *f, void *token)
{
    cr_assert_eq(token, f->remote);
    ((counted_src *)f->remote)->releases++;
}

static const ck_source_ops copying_ops = {
    .pread = cs_pread, .same = cs_same, .close = cs_close, .stats = cs_stats, .hint = cs_hint,
};
static const ck_source_ops lending_ops = {
    .pread = cs_pread, .same = cs_same, .close = cs_close, .stats = cs_stats, .hint = cs_hint,
    .hold = cs_hold, .release = cs_release,
};

/* One test's mount of the sample's tensors (w.a, w.b, n) over a counted source, the buffer its
 * copies go to, and a read's pieces. */
typedef struct counted {
    counted_src c;
    ck_fs fs;
    counted_buf b;
    ck_pieces p;
} counted;

/* t's mount over a source read through ops, in pieces of `piece` bytes; w.a's inode. */
static uint64_t counted_mount(counted *t, const ck_source_ops *ops, size_t piece)
{
    *t = (counted){.c = {.piece = piece}};
    fill_bytes(src, sizeof src, 7);
    ck_index *ix = ck_index_new("test");
    cr_assert_not_null(ix);
    ck_error err = {""};
    ck_file f = {.path = "counted", .fd = -1, .size = SRC_LEN, .ops = ops, .remote = &t->c};
    cr_assert_eq(ck_index_add_opened(ix, &f, &err), 0, "%s", err.msg);
    add_contig(ix, "w.a", CK_F32, 1, (int64_t[]){4}, 0, 16);
    add_contig(ix, "w.b", CK_U8, 2, (int64_t[]){2, 3}, 16, 6);
    add_contig(ix, "n", CK_I16, 0, NULL, 22, 2);
    init_ok(&t->fs, ix);
    return ino_at(&t->fs, "w/a");
}

/* What a read asked for: the source's holds and preads, and buffers. */
static void assert_asked(const counted_src *c, const counted_buf *b, unsigned holds,
                         unsigned preads, unsigned buffers)
{
    cr_assert_eq(c->holds, holds, "holds");
    cr_assert_eq(c->preads, preads, "preads");
    cr_assert_eq(b->calls, buffers, "buffers");
}

/* A read's bytes, len of them as at want, are one piece: the copy in t's buffer. */
static void assert_copied(const counted *t, const void *want, size_t len)
{
    cr_assert_eq(t->p.n, 1);
    cr_assert_eq(t->p.lent, 0);
    cr_assert_eq(t->p.iov[0].iov_base, t->b.mem, "the bytes are in the caller's buffer");
    cr_assert_eq(t->p.iov[0].iov_len, len);
    cr_assert_arr_eq(t->b.mem, want, len);
}

Test(core, read_of_a_file_that_cannot_lend_copies_in_one_pass)
{
    /* Each read asks the source once, for all its bytes, into the one buffer: it never asks it
     * to lend first. */
    counted t;
    uint64_t a = counted_mount(&t, &copying_ops, 0);
    cr_assert_eq(ck_fs_read(&t.fs, a, 12, 2, counted_buffer, &t.b, &t.p), 12);
    assert_asked(&t.c, &t.b, 0, 1, 1);
    assert_copied(&t, src + 2, 12);
    ck_fs_read_release(&t.fs, a, &t.p);
    ck_fs_free(&t.fs);
    /* A local file is read the same way: one copy into the buffer. */
    ck_fs *local = sample_fs();
    uint64_t b = ino_at(local, "w/b");
    cr_assert_not(ck_file_lends(&local->ix->files[0]));
    t.b.calls = 0;
    cr_assert_eq(ck_fs_read(local, b, 64, 0, counted_buffer, &t.b, &t.p), 6);
    cr_assert_eq(t.b.calls, 1);
    assert_copied(&t, src + 16, 6);
    ck_fs_read_release(local, b, &t.p);
    ck_fs_free(local);
}

Test(core, read_of_a_file_that_lends_lends_and_releases)
{
    /* The source's own bytes, in its pieces, never copied; each piece released once. */
    counted t;
    uint64_t a = counted_mount(&t, &lending_ops, 8);
    cr_assert_eq(ck_fs_read(&t.fs, a, 64, 2, counted_buffer, &t.b, &t.p), 14);
    assert_asked(&t.c, &t.b, 2, 0, 0);
    cr_assert_eq(t.p.n, 2);
    cr_assert_eq(t.p.lent, 2);
    cr_assert_eq(t.p.iov[0].iov_base, src + 2);
    cr_assert_eq(t.p.iov[0].iov_len, 6);
    cr_assert_eq(t.p.iov[1].iov_base, src + 8);
    cr_assert_eq(t.p.iov[1].iov_len, 8);
    ck_fs_read_release(&t.fs, a, &t.p);
    cr_assert_eq(t.c.releases, 2);
    /* At or past the end: nothing held, nothing to release. */
    cr_assert_eq(ck_fs_read(&t.fs, a, 8, 16, counted_buffer, &t.b, &t.p), 0);
    cr_assert_eq(t.p.n, 0);
    ck_fs_read_release(&t.fs, a, &t.p);
    cr_assert_eq(t.c.releases, 2);
    ck_fs_free(&t.fs);
}

Test(core, read_that_needs_more_pieces_than_lent_copies_the_rest)
{
    /* 2-byte pieces: w.a's 16 bytes would take 8. The first CK_PIECES_MAX - 1 are lent, the
     * rest copied in one read into the buffer, and the whole comes out in order. */
    counted t;
    uint64_t a = counted_mount(&t, &lending_ops, 2);
    cr_assert_eq(ck_fs_read(&t.fs, a, 16, 0, counted_buffer, &t.b, &t.p), 16);
    assert_asked(&t.c, &t.b, CK_PIECES_MAX - 1, 1, 1);
    cr_assert_eq(t.p.n, CK_PIECES_MAX);
    cr_assert_eq(t.p.lent, CK_PIECES_MAX - 1);
    cr_assert_eq(t.p.iov[t.p.n - 1].iov_base, t.b.mem);
    unsigned char whole[16];
    cr_assert_eq(gather(&t.p, whole), 16);
    cr_assert_arr_eq(whole, src, 16);
    ck_fs_read_release(&t.fs, a, &t.p);
    cr_assert_eq(t.c.releases, t.c.holds);
    ck_fs_free(&t.fs);
}

Test(core, read_of_a_changed_lending_source_is_eio_with_nothing_held)
{
    counted t;
    uint64_t a = counted_mount(&t, &lending_ops, 8);
    t.c.changed = 1;
    cr_assert_eq(ck_fs_read(&t.fs, a, 16, 0, counted_buffer, &t.b, &t.p), -EIO);
    cr_assert_gt(t.c.holds, 0);
    cr_assert_eq(t.c.releases, t.c.holds, "every piece lent was given back");
    cr_assert_eq(t.p.n, 0);
    cr_assert_eq(t.p.lent, 0);
    ck_fs_free(&t.fs);
}

Test(core, npy_view_of_a_lending_source_is_copied)
{
    /* Its header is the mount's: the view is made in the buffer, the tensor's bytes read into
     * it after the header. */
    counted t;
    counted_mount(&t, &lending_ops, 8);
    t.fs.npy = 1;
    struct stat st;
    uint64_t npy = walk(&t.fs, "w/a.npy", &st);
    cr_assert_eq(ck_fs_read(&t.fs, npy, (size_t)st.st_size, 0, counted_buffer, &t.b, &t.p),
                 st.st_size);
    assert_asked(&t.c, &t.b, 0, 1, 1);
    cr_assert_arr_eq(t.b.mem + st.st_size - 16, src, 16);
    ck_fs_read_release(&t.fs, npy, &t.p);
    ck_fs_free(&t.fs);
}

/* --- index.json, made on first use -------------------------------------------------------- */

/* index.json's bytes as a fresh ck_fs makes them, checked to hold every entry by name. */
static char *index_json_of(ck_fs *fs, size_t *len)
{
    char *text = index_text(fs, len);
    for (size_t i = 0; i < fs->ix->nentries; i++)
        cr_assert_not_null(strstr(text, strf("\"name\":\"%s\"", fs->ix->entries[i].name)));
    return text;
}

/* index.json as fs serves it at ino (size and bytes, read `chunk` bytes at a time) is the text
 * ck_view makes of the same index, and nothing was logged. */
static void assert_index_json_served(ck_fs *fs, uint64_t ino, size_t chunk)
{
    struct stat st;
    size_t want_len = 0, len = 0;
    char *want = index_json_of(fs, &want_len);
    cr_assert_eq(ck_fs_getattr(fs, ino, &st), 0);
    cr_assert_eq((size_t)st.st_size, want_len);
    unsigned char *got = read_all(fs, ino, chunk, &len);
    cr_assert_eq(len, want_len);
    cr_assert_arr_eq(got, want, len);
    cr_assert_eq(nlogged, 0);
    free(got);
    free(want);
}

Test(core, index_json_is_made_on_first_use)
{
    /* Whichever operation reaches it first makes it; nothing else does. */
    for (int first = 0; first < 4; first++) {
        ck_fs *fs = sample_fs();
        uint32_t node = tree_find(fs->tree, ".ckptfs/index.json");
        uint64_t ino = node + 1, dir = ino_at(fs, ".ckptfs");
        struct stat st;
        ck_dirent d;
        for (off_t off = 0; ck_fs_readdir(fs, dir, off, &d) == 1; off = d.next)
            ;
        ino_at(fs, "w/a");
        cr_assert_not(fs->vfile[CK_VFILE_INDEX_JSON].made, "made before anyone looked");
        cr_assert_null(fs->vfile[CK_VFILE_INDEX_JSON].text.own);
        char buf[16];
        switch (first) {
        case 0: cr_assert_eq(ck_fs_lookup(fs, dir, "index.json", &st), 0); break;
        case 1: cr_assert_eq(ck_fs_getattr(fs, ino, &st), 0); break;
        case 2: cr_assert_eq(ck_fs_open(fs, ino, O_RDONLY), 0); break;
        default: cr_assert_eq(read_at(fs, ino, buf, sizeof buf, 0), (ssize_t)sizeof buf);
        }
        cr_assert(fs->vfile[CK_VFILE_INDEX_JSON].made, "operation %d did not make it", first);
        assert_index_json_served(fs, ino, 1000);
        ck_fs_free(fs);
    }
}

enum { RACERS = 8 };

typedef struct racer {
    ck_fs *fs;
    uint64_t ino;
    pthread_barrier_t *start;
    char *got;
    size_t len;
    off_t size;
} racer;

/* Stats index.json and reads it whole, starting with the other racers. */
static void *race(void *arg)
{
    racer *r = arg;
    pthread_barrier_wait(r->start);
    struct stat st;
    if (ck_fs_getattr(r->fs, r->ino, &st) != 0)
        return NULL;
    r->size = st.st_size;
    r->got = malloc((size_t)st.st_size + 1);
    ssize_t n = r->got ? read_at(r->fs, r->ino, r->got, (size_t)st.st_size + 1, 0) : -1;
    r->len = n < 0 ? 0 : (size_t)n;
    return NULL;
}

Test(core, index_json_is_made_once_by_racing_threads)
{
    ck_fs *fs = sample_fs();
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, RACERS);
    pthread_t t[RACERS];
    racer r[RACERS];
    uint64_t ino = tree_find(fs->tree, ".ckptfs/index.json") + 1;
    for (int i = 0; i < RACERS; i++) {
        r[i] = (racer){.fs = fs, .ino = ino, .start = &start};
        cr_assert_eq(pthread_create(&t[i], NULL, race, &r[i]), 0);
    }
    for (int i = 0; i < RACERS; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&start);
    size_t want_len = 0;
    char *want = index_json_of(fs, &want_len);
    for (int i = 0; i < RACERS; i++) {
        cr_assert_eq((size_t)r[i].size, want_len, "racer %d saw size %lld", i,
                     (long long)r[i].size);
        cr_assert_eq(r[i].len, want_len, "racer %d read %zu", i, r[i].len);
        cr_assert_arr_eq(r[i].got, want, want_len, "racer %d", i);
        free(r[i].got);
    }
    cr_assert_eq(nlogged, 0);
    free(want);
    ck_fs_free(fs);
}

Test(core, index_json_prepared_in_the_background)
{
    /* Made by ck_fs_prepare's thread, or by whichever operation gets there first: the same
     * bytes once either way, and ck_fs_free waits for the thread. */
    for (int reader_first = 0; reader_first < 2; reader_first++) {
        ck_fs *fs = sample_fs();
        uint64_t ino = tree_find(fs->tree, ".ckptfs/index.json") + 1;
        struct stat st;
        if (reader_first)
            cr_assert_eq(ck_fs_getattr(fs, ino, &st), 0);
        ck_fs_prepare(fs);
        ck_fs_prepare(fs); /* a second call starts nothing */
        cr_assert(fs->preparing);
        assert_index_json_served(fs, ino, 4096);
        ck_fs_free(fs);
    }
    /* Freed while the thread may still be making it: nothing leaks, nothing is used after. */
    for (int i = 0; i < 20; i++) {
        ck_fs *fs = sample_fs();
        ck_fs_prepare(fs);
        ck_fs_free(fs);
    }
}

Test(core, index_json_that_could_not_be_made_stays_eio_when_prepared)
{
    /* The thread tries nothing more once it failed (only memory can run out: set by hand). */
    ck_fs *fs = sample_fs();
    fs->vfile[CK_VFILE_INDEX_JSON].failed = 1;
    ck_fs_prepare(fs);
    struct stat st;
    cr_assert_eq(ck_fs_getattr(fs, tree_find(fs->tree, ".ckptfs/index.json") + 1, &st), -EIO);
    cr_assert_null(fs->vfile[CK_VFILE_INDEX_JSON].text.own);
    ck_fs_free(fs);
}

Test(core, index_json_that_could_not_be_made_is_eio)
{
    /* Only memory can run out making it; the state that leaves is set here by hand. */
    ck_fs *fs = sample_fs();
    fs->vfile[CK_VFILE_INDEX_JSON].failed = 1;
    uint64_t dir = ino_at(fs, ".ckptfs"), ino = tree_find(fs->tree, ".ckptfs/index.json") + 1;
    struct stat st;
    char buf[16];
    cr_assert_eq(ck_fs_lookup(fs, dir, "index.json", &st), -EIO);
    cr_assert_eq(ck_fs_getattr(fs, ino, &st), -EIO);
    cr_assert_eq(ck_fs_open(fs, ino, O_RDONLY), -EIO);
    cr_assert_eq(read_at(fs, ino, buf, sizeof buf, 0), -EIO);
    cr_assert_null(fs->vfile[CK_VFILE_INDEX_JSON].text.own, "made after all");
    /* statfs counts the entries alone; everything else still serves. */
    struct statvfs sv;
    ck_fs_statfs(fs, &sv);
    cr_assert_eq(sv.f_blocks, 1);
    cr_assert_eq(read_at(fs, ino_at(fs, "w/a"), buf, sizeof buf, 0), 16);
    cr_assert_arr_eq(buf, src, 16);
    ck_fs_free(fs);
}

/* The synthesized file at path, read through the core, written out and opened again by the
 * reader of its format: its tensors must hold the source's bytes. */
static void check_synthesized(const char *path, const char *format)
{
    ck_fs *fs = sample_fs();
    cr_assert_null(fs->vfile[CK_VFILE_PACK].synth, "built before anyone looked");
    cr_assert_null(fs->vfile[CK_VFILE_SAFETENSORS].synth);
    struct stat st;
    uint64_t ino = walk(fs, path, &st);
    cr_assert_eq(ck_fs_open(fs, ino, O_RDONLY), 0);
    size_t len = 0;
    unsigned char *bytes = read_all(fs, ino, 100, &len);
    cr_assert_eq((size_t)st.st_size, len, "%s: stat says %lld, read %zu", path,
                 (long long)st.st_size, len);
    ck_index *back = open_ok(tmp_file(bytes, len));
    cr_assert_str_eq(back->format, format);
    static const struct { const char *name; size_t at, len; } t[] = {
        {"w.a", 0, 16}, {"w.b", 16, 6}, {"n", 22, 2}};
    for (size_t i = 0; i < 3; i++) {
        const ck_entry *e = ck_index_find(back, t[i].name);
        cr_assert_not_null(e, "%s: no %s", path, t[i].name);
        char buf[16];
        cr_assert_eq(ck_entry_read(back, e, buf, sizeof buf, 0), (ssize_t)t[i].len);
        cr_assert_arr_eq(buf, src + t[i].at, t[i].len, "%s: %s", path, t[i].name);
    }
    cr_assert_eq(nlogged, 0);
    ck_index_free(back);
    free(bytes);
    ck_fs_free(fs);
}

Test(core, read_checkpoint_pack)
{
    check_synthesized(".ckptfs/checkpoint.pack", "pack");
}

Test(core, read_checkpoint_safetensors)
{
    check_synthesized(".ckptfs/checkpoint.safetensors", "safetensors");
}

/* --- a synthesized file that cannot be built ---------------------------------------------- */

/* Tensors "" and "a": a pack allows the empty name only for its one entry (FORMAT.md). */
static ck_fs *unpackable_fs(void)
{
    static ck_fs fs;
    fill_bytes(src, sizeof src, 9);
    ck_index *ix = index_over(src, sizeof src);
    add_contig(ix, "", CK_F32, 1, (int64_t[]){2}, 0, 8);
    add_contig(ix, "a", CK_U8, 1, (int64_t[]){3}, 8, 3);
    init_ok(&fs, ix);
    return &fs;
}

Test(core, unbuildable_pack_is_eio_everywhere_and_logged_once)
{
    ck_fs *fs = unpackable_fs();
    uint64_t dir = ino_at(fs, ".ckptfs");
    uint32_t node = tree_find(fs->tree, ".ckptfs/checkpoint.pack");
    cr_assert_neq(node, CK_NO_NODE, "still listed");
    uint64_t ino = node + 1;
    struct stat st;
    char buf[64];
    for (int round = 0; round < 3; round++) {
        cr_assert_eq(ck_fs_lookup(fs, dir, "checkpoint.pack", &st), -EIO);
        cr_assert_eq(ck_fs_getattr(fs, ino, &st), -EIO);
        cr_assert_eq(ck_fs_open(fs, ino, O_RDONLY), -EIO);
        cr_assert_eq(read_at(fs, ino, buf, sizeof buf, 0), -EIO);
        cr_assert_eq(read_at(fs, ino, buf, sizeof buf, 1 << 20), -EIO);
    }
    cr_assert_eq(nlogged, 1, "logged %d times", nlogged);
    const char *want = strf("ckptfs: %s: ", fs->ix->files[0].path);
    cr_assert_eq(strncmp(logged, want, strlen(want)), 0, "%s", logged);
    cr_assert(strstr(logged, "empty name"), "%s", logged);
    cr_assert_null(strchr(logged, '\n'));
    /* The same line `ckpt pack` prints. */
    ck_synth *sy = NULL;
    ck_error err = {""};
    cr_assert_eq(ck_synth_pack(fs->ix, NULL, &sy, &err), -1);
    cr_assert_str_eq(logged, strf("ckptfs: %s", err.msg));
    /* Everything else still serves. */
    cr_assert_eq(ck_fs_open(fs, ino_at(fs, "a"), O_RDONLY), 0);
    cr_assert_eq(read_at(fs, ino_at(fs, "a"), buf, sizeof buf, 0), 3);
    cr_assert_arr_eq(buf, src + 8, 3);
    cr_assert_eq(read_at(fs, ino_at(fs, "%"), buf, sizeof buf, 0), 8);
    cr_assert_arr_eq(buf, src, 8);
    uint64_t st_ino = walk(fs, ".ckptfs/checkpoint.safetensors", &st);
    cr_assert_gt(st.st_size, 0);
    cr_assert_eq(read_at(fs, st_ino, buf, 8, 0), 8);
    cr_assert_eq(nlogged, 1);
    ck_fs_free(fs);
}

Test(core, unbuildable_without_a_log)
{
    ck_fs fs;
    fill_bytes(src, sizeof src, 9);
    ck_index *ix = index_over(src, sizeof src);
    add_contig(ix, "", CK_U8, 0, NULL, 0, 1);
    add_contig(ix, "b", CK_U8, 0, NULL, 1, 1);
    ck_error err = {""};
    cr_assert_eq(ck_fs_init(&fs, ix, UID, GID, NULL, &err), 0, "%s", err.msg);
    struct stat st;
    cr_assert_eq(ck_fs_getattr(&fs, tree_find(fs.tree, ".ckptfs/checkpoint.pack") + 1, &st),
                 -EIO);
    ck_fs_free(&fs);
}

/* --- xattrs ------------------------------------------------------------------------------- */

static void expect_xattr(ck_fs *fs, const char *path, const char *name, const char *value)
{
    uint64_t ino = ino_at(fs, path);
    size_t n = strlen(value);
    char buf[256];
    cr_assert_eq(ck_fs_getxattr(fs, ino, name, NULL, 0), (ssize_t)n, "%s %s", path, name);
    memset(buf, 'Z', sizeof buf);
    cr_assert_eq(ck_fs_getxattr(fs, ino, name, buf, n), (ssize_t)n, "exact size");
    cr_assert_arr_eq(buf, value, n);
    cr_assert_eq(buf[n], 'Z', "nothing written past it");
    cr_assert_eq(ck_fs_getxattr(fs, ino, name, buf, sizeof buf), (ssize_t)n);
    if (n > 1) /* size 0 asks for the length */
        cr_assert_eq(ck_fs_getxattr(fs, ino, name, buf, n - 1), -ERANGE, "%s %s", path, name);
}

Test(core, getxattr)
{
    ck_fs *fs = sample_fs();
    expect_xattr(fs, "w/a", "user.ckptfs.name", "w.a");
    expect_xattr(fs, "w/a", "user.ckptfs.dtype", "F32");
    expect_xattr(fs, "w/a", "user.ckptfs.shape", "[4]");
    expect_xattr(fs, "w/b", "user.ckptfs.shape", "[2,3]");
    expect_xattr(fs, "n", "user.ckptfs.shape", "[]");
    expect_xattr(fs, "n", "user.ckptfs.dtype", "I16");
    expect_xattr(fs, "v", "user.ckptfs.name", "v");
    expect_xattr(fs, "v", "user.ckptfs.type", "int");
    char buf[64];
    struct { const char *path, *name; } none[] = {
        {"w/a", "user.ckptfs.type"}, {"v", "user.ckptfs.dtype"}, {"v", "user.ckptfs.shape"},
        {"w/a", "user.other"}, {"w/a", "user.ckptfs.nam"}, {"w/a", ""},
        {"", "user.ckptfs.name"}, {"w", "user.ckptfs.name"},
        {".ckptfs/index.json", "user.ckptfs.name"},
        {".ckptfs/checkpoint.pack", "user.ckptfs.name"},
    };
    for (size_t i = 0; i < sizeof none / sizeof *none; i++) {
        uint64_t ino = ino_at(fs, none[i].path);
        cr_assert_eq(ck_fs_getxattr(fs, ino, none[i].name, buf, sizeof buf), -ENODATA,
                     "%s %s", none[i].path, none[i].name);
        cr_assert_eq(ck_fs_getxattr(fs, ino, none[i].name, NULL, 0), -ENODATA);
    }
    ck_fs_free(fs);
}

Test(core, getxattr_long_name_and_shape)
{
    /* A name of 5000 bytes and a rank-64 shape of 20-digit dims come back whole. */
    char *name = malloc(5001);
    cr_assert_not_null(name);
    memset(name, 'x', 5000);
    name[5000] = 0;
    int64_t dims[CK_MAX_RANK];
    for (int d = 0; d < CK_MAX_RANK; d++)
        dims[d] = d ? 1 : INT64_MAX;
    fill_bytes(src, sizeof src, 3);
    ck_index *ix = index_over(src, sizeof src);
    add_contig(ix, name, CK_U8, CK_MAX_RANK, dims, 0, 1); /* nbytes need not match here */
    ck_fs fs;
    init_ok(&fs, ix);
    uint64_t ino = fs.tree->entry_node[0] + 1;
    char *buf = malloc(6000);
    cr_assert_not_null(buf);
    cr_assert_eq(ck_fs_getxattr(&fs, ino, "user.ckptfs.name", buf, 6000), 5000);
    cr_assert_arr_eq(buf, name, 5000);
    char want[2048];
    size_t n = ck_view_shape_json(&ix->entries[0], want, sizeof want);
    cr_assert_lt(n, sizeof want);
    cr_assert_eq(ck_fs_getxattr(&fs, ino, "user.ckptfs.shape", NULL, 0), (ssize_t)n);
    cr_assert_eq(ck_fs_getxattr(&fs, ino, "user.ckptfs.shape", buf, n), (ssize_t)n);
    cr_assert_arr_eq(buf, want, n);
    cr_assert_eq(strncmp(buf, "[9223372036854775807,1,1,", 25), 0);
    free(buf);
    free(name);
    ck_fs_free(&fs);
}

Test(core, listxattr)
{
    ck_fs *fs = sample_fs();
    static const char tensor[] = "user.ckptfs.name\0user.ckptfs.dtype\0user.ckptfs.shape";
    static const char value[] = "user.ckptfs.name\0user.ckptfs.type";
    char buf[256];
    uint64_t a = ino_at(fs, "w/a"), v = ino_at(fs, "v");
    cr_assert_eq(ck_fs_listxattr(fs, a, NULL, 0), (ssize_t)sizeof tensor);
    cr_assert_eq(ck_fs_listxattr(fs, a, buf, sizeof tensor), (ssize_t)sizeof tensor);
    cr_assert_arr_eq(buf, tensor, sizeof tensor);
    cr_assert_eq(ck_fs_listxattr(fs, a, buf, sizeof tensor - 1), -ERANGE);
    cr_assert_eq(ck_fs_listxattr(fs, v, buf, sizeof buf), (ssize_t)sizeof value);
    cr_assert_arr_eq(buf, value, sizeof value);
    cr_assert_eq(ck_fs_listxattr(fs, v, buf, 1), -ERANGE);
    const char *bare[] = {"", "w", ".ckptfs", ".ckptfs/index.json", ".ckptfs/checkpoint.pack"};
    for (size_t i = 0; i < 5; i++) {
        cr_assert_eq(ck_fs_listxattr(fs, ino_at(fs, bare[i]), NULL, 0), 0, "%s", bare[i]);
        cr_assert_eq(ck_fs_listxattr(fs, ino_at(fs, bare[i]), buf, sizeof buf), 0);
    }
    ck_fs_free(fs);
}

/* --- statfs ------------------------------------------------------------------------------- */

Test(core, statfs)
{
    ck_fs *fs = sample_fs();
    struct statvfs sv;
    ck_fs_statfs(fs, &sv);
    uint64_t bytes = 16 + 6 + 2 + 2 + fs->vfile[CK_VFILE_INDEX_JSON].text.len;
    cr_assert_eq(sv.f_bsize, 4096);
    cr_assert_eq(sv.f_frsize, 4096);
    cr_assert_eq(sv.f_blocks, (bytes + 4095) / 4096);
    cr_assert_eq(sv.f_bfree, 0);
    cr_assert_eq(sv.f_bavail, 0);
    cr_assert_eq(sv.f_files, fs->tree->nnodes);
    cr_assert_eq(sv.f_ffree, 0);
    cr_assert_eq(sv.f_namemax, CK_NAME_MAX);
    cr_assert_eq(sv.f_flag, ST_RDONLY);
    cr_assert_null(fs->vfile[CK_VFILE_PACK].synth, "statfs built the pack");
    cr_assert_null(fs->vfile[CK_VFILE_SAFETENSORS].synth);
    ck_fs_free(fs);
}

/* --- when the source changes ------------------------------------------------------------- */

Test(core, modified_source_is_eio_on_read_estale_on_open)
{
    ck_fs *fs = sample_fs();
    uint64_t a = ino_at(fs, "w/a"), pack = ino_at(fs, ".ckptfs/checkpoint.pack");
    uint64_t json = ino_at(fs, ".ckptfs/index.json"), v = ino_at(fs, "v");
    char buf[64];
    cr_assert_eq(ck_fs_open(fs, a, O_RDONLY), 0);
    /* Another size: the mtime alone may not move within the clock's granularity. */
    unsigned char other[SRC_LEN + 1] = {0};
    tmp_rewrite(fs->ix->files[0].path, other, sizeof other);
    cr_assert_eq(read_at(fs, a, buf, sizeof buf, 0), -EIO);
    cr_assert_eq(read_at(fs, pack, buf, sizeof buf, 0), -EIO);
    for (uint64_t ino = 1; ino <= fs->tree->nnodes; ino++)
        if (fs->tree->nodes[ino - 1].kind != CK_NODE_DIR)
            /* but the status, which says why */
            cr_assert_eq(ck_fs_open(fs, ino, O_RDONLY),
                         fs->tree->nodes[ino - 1].kind == CK_NODE_STATUS ? 0 : -ESTALE,
                         "inode %llu", (unsigned long long)ino);
    /* What lives in memory keeps reading. */
    cr_assert_eq(read_at(fs, v, buf, sizeof buf, 0), 2);
    cr_assert_gt(read_at(fs, json, buf, sizeof buf, 0), 0);
    ck_fs_free(fs);
}

Test(core, replaced_or_removed_source_is_estale)
{
    ck_fs *fs = sample_fs();
    uint64_t a = ino_at(fs, "w/a"), st_file = ino_at(fs, ".ckptfs/checkpoint.safetensors");
    const char *path = fs->ix->files[0].path;
    char buf[64];
    /* Renamed over: our descriptor still holds the old, intact inode. */
    cr_assert_eq(rename(tmp_file(src, sizeof src), path), 0);
    cr_assert_eq(read_at(fs, a, buf, sizeof buf, 0), -ESTALE);
    cr_assert_eq(read_at(fs, st_file, buf, sizeof buf, 0), -ESTALE);
    cr_assert_eq(ck_fs_open(fs, a, O_RDONLY), -ESTALE);
    cr_assert_eq(unlink(path), 0);
    cr_assert_eq(read_at(fs, a, buf, sizeof buf, 0), -ESTALE);
    cr_assert_eq(ck_fs_open(fs, a, O_RDONLY), -ESTALE);
    ck_fs_free(fs);
}

/* .ckptfs/status as a reader sees it: its size, and its text read in chunks of 5 bytes (each
 * read makes it again), which must agree. */
static const char *status_of(ck_fs *fs)
{
    struct stat st;
    uint64_t ino = walk(fs, ".ckptfs/status", &st);
    cr_assert_eq(ck_fs_open(fs, ino, O_RDONLY), 0, "the status opens whatever the sources");
    size_t len;
    unsigned char *text = read_all(fs, ino, 5, &len);
    cr_assert_eq((size_t)st.st_size, len);
    const char *s = strf("%.*s", (int)len, (const char *)text);
    free(text);
    return s;
}

Test(core, status_says_ok_then_why_reads_fail_and_the_log_says_it_once)
{
    ck_fs *fs = sample_fs();
    uint64_t a = ino_at(fs, "w/a"), status = ino_at(fs, ".ckptfs/status");
    cr_assert(ck_fs_is_volatile(fs, status));
    for (uint64_t ino = 0; ino <= fs->tree->nnodes + 1; ino++)
        cr_assert(ino == status || !ck_fs_is_volatile(fs, ino), "inode %llu",
                  (unsigned long long)ino);
    cr_assert_str_eq(status_of(fs), "ok\n");
    unsigned char other[SRC_LEN + 1] = {0};
    tmp_rewrite(fs->ix->files[0].path, other, sizeof other);
    const char *why = "its size or mtime differ from when it was mounted";
    cr_assert_eq(nlogged, 0, "nothing looked yet");
    char buf[64];
    for (int k = 0; k < 3; k++)
        cr_assert_eq(read_at(fs, a, buf, sizeof buf, 0), -EIO);
    cr_assert_eq(ck_fs_open(fs, a, O_RDONLY), -ESTALE);
    cr_assert_str_eq(status_of(fs), strf("source changed: %s (%s); remount to read it\n",
                                         fs->src_path[0], why));
    cr_assert_eq(nlogged, 1, "logged %d times", nlogged);
    cr_assert_str_eq(logged, strf("ckptfs: %s: source changed (%s); reads fail until it is "
                                  "mounted again", fs->src_path[0], why));
    ck_fs_free(fs);
}

Test(core, status_of_a_removed_source_and_the_first_to_see_it_logs)
{
    ck_fs *fs = sample_fs();
    cr_assert_eq(unlink(fs->ix->files[0].path), 0);
    const char *why = "it was replaced or removed since it was mounted";
    cr_assert_str_eq(status_of(fs), strf("source changed: %s (%s); remount to read it\n",
                                         fs->src_path[0], why));
    cr_assert_eq(nlogged, 1, "the status's own check told it");
    cr_assert_str_eq(logged, strf("ckptfs: %s: source changed (%s); reads fail until it is "
                                  "mounted again", fs->src_path[0], why));
    ck_fs_free(fs);
}

/* Where needle (n bytes) starts in hay, which must hold it. */
static size_t offset_of(const unsigned char *hay, size_t len, const unsigned char *needle, size_t n)
{
    const unsigned char *at = memmem(hay, len, needle, n);
    cr_assert_not_null(at);
    return (size_t)(at - hay);
}

Test(core, synthesized_read_checks_the_sources_it_reads)
{
    /* Two shards: once one changes, pack bytes from the other still read (whole and exact),
     * while its own bytes, and the header made from both, fail. */
    const char *dir = tmp_dir();
    unsigned char da[8192], db[8192];
    fill_bytes(da, sizeof da, 11);
    fill_bytes(db, sizeof db, 12);
    const char *pa = st_file_in(dir, "a.safetensors",
                                strf("{%s}", st_tensor("a", "U8", "[8192]", 0, 8192)), da, 8192);
    st_file_in(dir, "b.safetensors", strf("{%s}", st_tensor("b", "U8", "[8192]", 0, 8192)), db,
               8192);
    ck_fs fs;
    init_ok(&fs, open_ok(dir));
    uint64_t pack = ino_at(&fs, ".ckptfs/checkpoint.pack");
    size_t len;
    unsigned char *whole = read_all(&fs, pack, 1 << 20, &len);
    size_t at_a = offset_of(whole, len, da, sizeof da), at_b = offset_of(whole, len, db, sizeof db);
    unsigned char other[1] = {0};
    tmp_rewrite(pa, other, sizeof other);
    unsigned char buf[8192];
    cr_assert_eq(read_at(&fs, pack, (char *)buf, sizeof buf, (off_t)at_b), 8192);
    cr_assert_arr_eq(buf, db, sizeof db);
    cr_assert_eq(read_at(&fs, pack, (char *)buf, 100, (off_t)at_a + 100), -EIO);
    cr_assert_eq(read_at(&fs, pack, (char *)buf, 64, 0), -EIO);
    /* The trailer is hashed from every file. */
    cr_assert_eq(read_at(&fs, pack, (char *)buf, 8, (off_t)len - 8), -EIO);
    cr_assert_eq(ck_fs_open(&fs, pack, O_RDONLY), -ESTALE);
    free(whole);
    ck_fs_free(&fs);
}

Test(core, relative_source_checked_from_anywhere)
{
    /* A SOURCE given relative to the working directory is still found after a chdir("/"), as
     * the daemon does. */
    const char *dir = tmp_dir();
    st_file_in(dir, "m.safetensors", strf("{%s}", st_tensor("t", "U8", "[3]", 0, 3)), "xyz", 3);
    char cwd[4096];
    cr_assert_not_null(getcwd(cwd, sizeof cwd));
    cr_assert_eq(chdir(dir), 0);
    ck_index *ix = open_ok("m.safetensors");
    ck_fs fs;
    init_ok(&fs, ix);
    cr_assert_eq(chdir("/"), 0);
    cr_assert_str_eq(fs.src_path[0], strf("%s/m.safetensors", dir));
    uint64_t t = ino_at(&fs, "t");
    char buf[8];
    cr_assert_eq(ck_fs_open(&fs, t, O_RDONLY), 0);
    cr_assert_eq(read_at(&fs, t, buf, sizeof buf, 0), 3);
    cr_assert_arr_eq(buf, "xyz", 3);
    cr_assert_eq(chdir(cwd), 0);
    ck_fs_free(&fs);
}

/* --- init -------------------------------------------------------------------------------- */

Test(core, init_failure_frees_the_index)
{
    /* Two entries with one path: the tree cannot be built. The index is freed with the rest
     * (valgrind and ASan's leak check see it), and the fs is left zeroed. */
    fill_bytes(src, sizeof src, 5);
    ck_index *ix = index_over(src, sizeof src);
    add_contig(ix, "a.b", CK_U8, 0, NULL, 0, 1);
    add_contig(ix, "a.b", CK_U8, 0, NULL, 1, 1);
    const char *path = strf("%s", ix->files[0].path);
    ck_fs fs;
    memset(&fs, 0x5a, sizeof fs);
    ck_error err = {""};
    cr_assert_eq(ck_fs_init(&fs, ix, UID, GID, capture, &err), -1);
    assert_error(&err, path, "tensors 'a.b' and 'a.b' map to one path");
    cr_assert_null(fs.ix);
    cr_assert_null(fs.tree);
    cr_assert_null(fs.src_path);
    ck_fs_free(&fs); /* a zeroed fs is fine */
    cr_assert_eq(nlogged, 0);
}

Test(core, mount_files_table)
{
    cr_assert_str_eq(ck_vfiles[CK_VFILE_INDEX_JSON].name, "index.json");
    cr_assert_eq(ck_vfiles[CK_VFILE_INDEX_JSON].kind, CK_NODE_MEMFILE);
    cr_assert_str_eq(ck_vfiles[CK_VFILE_PACK].name, "checkpoint.pack");
    cr_assert_eq(ck_vfiles[CK_VFILE_PACK].kind, CK_NODE_SYNTH);
    cr_assert_str_eq(ck_vfiles[CK_VFILE_SAFETENSORS].name, "checkpoint.safetensors");
    cr_assert_eq(ck_vfiles[CK_VFILE_SAFETENSORS].kind, CK_NODE_SYNTH);
    cr_assert_str_eq(ck_vfiles[CK_VFILE_STATUS].name, "status");
    cr_assert_eq(ck_vfiles[CK_VFILE_STATUS].kind, CK_NODE_STATUS);
}

/* --- the sources, published on the root for loaders ---------------------------------------- */

Test(core, sources_xattr)
{
    ck_fs *fs = sample_fs();
    char buf[8192];
    cr_assert_eq(ck_fs_getxattr(fs, CK_ROOT_INO, CK_SOURCES_XATTR, buf, sizeof buf), -ENODATA);
    cr_assert_eq(ck_fs_listxattr(fs, CK_ROOT_INO, buf, sizeof buf), 0);
    ck_error err = {""};
    cr_assert_eq(ck_fs_publish_sources(fs, "some/source", &err), 0, "%s", err.msg);
    ssize_t n = ck_fs_getxattr(fs, CK_ROOT_INO, CK_SOURCES_XATTR, NULL, 0);
    cr_assert_gt(n, 0);
    cr_assert_eq(ck_fs_getxattr(fs, CK_ROOT_INO, CK_SOURCES_XATTR, buf, (size_t)n - 1), -ERANGE);
    cr_assert_eq(ck_fs_getxattr(fs, CK_ROOT_INO, CK_SOURCES_XATTR, buf, sizeof buf), n);
    cr_assert_eq(ck_fs_listxattr(fs, CK_ROOT_INO, buf + n, sizeof buf - (size_t)n),
                 (ssize_t)sizeof CK_SOURCES_XATTR);
    cr_assert_str_eq(buf + n, CK_SOURCES_XATTR);
    /* Only the root has it. */
    cr_assert_eq(ck_fs_getxattr(fs, ino_at(fs, "w/a"), CK_SOURCES_XATTR, NULL, 0), -ENODATA);
    cr_assert_eq(ck_fs_getxattr(fs, ino_at(fs, ".ckptfs"), CK_SOURCES_XATTR, NULL, 0), -ENODATA);
    /* SOURCE made absolute, then each file's identity as stat(2) tells it now. */
    char cwd[4096];
    cr_assert_not_null(getcwd(cwd, sizeof cwd));
    const char *source;
    ck_source_file *files;
    size_t nfiles;
    cr_assert_eq(ck_sources_parse(buf, (size_t)n, &source, &files, &nfiles), 0);
    cr_assert_str_eq(source, strf("%s/some/source", cwd));
    cr_assert_eq(nfiles, fs->ix->nfiles);
    struct stat st;
    cr_assert_eq(stat(fs->ix->files[0].path, &st), 0);
    cr_assert_str_eq(files[0].path, fs->ix->files[0].path);
    cr_assert_eq(files[0].dev, st.st_dev);
    cr_assert_eq(files[0].ino, st.st_ino);
    cr_assert_eq(files[0].size, (uint64_t)st.st_size);
    cr_assert_eq(files[0].mtime.tv_sec, st.st_mtim.tv_sec);
    cr_assert_eq(files[0].mtime.tv_nsec, st.st_mtim.tv_nsec);
    free(files);
    ck_fs_free(fs);
}

/* A URL's mount publishes the URL as shown (not made absolute, no secret) and no file: a loader
 * knows the mount, and reads it through its pack. */
Test(core, sources_xattr_of_a_url)
{
    ck_fs *fs = sample_fs();
    ck_error err = {""};
    cr_assert_eq(ck_fs_publish_sources(fs, "http://user:S3CR3T@h:8/m.safetensors?sig=S3CR3T",
                                       &err), 0, "%s", err.msg);
    char buf[256];
    static const char want[] = "http://h:8/m.safetensors";
    cr_assert_eq(ck_fs_getxattr(fs, CK_ROOT_INO, CK_SOURCES_XATTR, buf, sizeof buf),
                 (ssize_t)sizeof want);
    cr_assert_eq(memcmp(buf, want, sizeof want), 0, "%s", buf);
    ck_fs_free(fs);
}

Test(core, sources_xattr_malformed)
{
    static const struct {
        const char *v;
        size_t len;
    } bad[] = {
        {"", 0},
        {"/src", 4},                           /* not NUL-terminated */
        {"src\0", 4},                          /* not absolute */
        {"/src\0" "1 2 3 4.5 rel\0", 19},      /* a relative file */
        {"/src\0" "1 2 3 4 /f\0", 16},         /* no nanoseconds */
        {"/src\0" "1 2 x 4.5 /f\0", 18},       /* not a number */
        {"/src\0" "1 2 3 4.5/f\0", 17},        /* no space before the path */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char v[64];
        memcpy(v, bad[i].v, bad[i].len);
        const char *source;
        ck_source_file *files = (ck_source_file *)v;
        size_t nfiles = 7;
        cr_assert_eq(ck_sources_parse(v, bad[i].len, &source, &files, &nfiles), -1, "%zu", i);
        cr_assert_null(files);
        cr_assert_eq(nfiles, 0);
    }
    char ok[] = "/src\0" "1 2 3 4.000000005 /a b\0" "6 7 8 9.000000010 /c\0";
    const char *source;
    ck_source_file *files;
    size_t nfiles;
    cr_assert_eq(ck_sources_parse(ok, sizeof ok - 1, &source, &files, &nfiles), 0);
    cr_assert_str_eq(source, "/src");
    cr_assert_eq(nfiles, 2);
    cr_assert_str_eq(files[0].path, "/a b");
    cr_assert_eq(files[0].mtime.tv_nsec, 5);
    cr_assert_eq(files[1].dev, 6);
    cr_assert_eq(files[1].size, 8);
    cr_assert_str_eq(files[1].path, "/c");
    free(files);
}
