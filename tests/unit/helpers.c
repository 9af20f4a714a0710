#include "helpers.h"
#include "../../checkpoint/open.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

/* Everything to undo at cleanup, in order of creation: paths to remove, or memory to free. */
static struct undo {
    char *p;
    int is_path;
} *undo;
static size_t nundo, cap_undo;

static char *keep(char *p, int is_path)
{
    cr_assert_not_null(p, "out of memory");
    if (nundo == cap_undo) {
        if (cap_undo == 0)
            atexit(tmp_cleanup);
        cap_undo = cap_undo ? 2 * cap_undo : 64;
        undo = realloc(undo, cap_undo * sizeof *undo);
        cr_assert_not_null(undo, "out of memory");
    }
    undo[nundo++] = (struct undo){p, is_path};
    return p;
}

void tmp_cleanup(void)
{
    while (nundo > 0) {
        struct undo u = undo[--nundo];
        if (u.is_path)
            remove(u.p);
        free(u.p);
    }
    free(undo);
    undo = NULL;
    cap_undo = 0;
}

const char *strf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    cr_assert_geq(n, 0, "out of memory");
    return keep(s, 0);
}

static void write_all(int fd, const void *data, size_t len, const char *path)
{
    const unsigned char *p = data;
    while (len) {
        ssize_t n = write(fd, p, len);
        cr_assert_gt(n, 0, "cannot write %s", path);
        p += n;
        len -= (size_t)n;
    }
}

const char *tmp_file(const void *data, size_t len)
{
    char *path = keep(strdup("/tmp/ckptfs-unit-XXXXXX"), 1);
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0, "mkstemp failed");
    write_all(fd, data, len, path);
    close(fd);
    return path;
}

const char *tmp_dir(void)
{
    char *path = keep(strdup("/tmp/ckptfs-unit-XXXXXX"), 1);
    cr_assert_not_null(mkdtemp(path), "mkdtemp failed");
    return path;
}

const char *tmp_path_in(const char *dir, const char *name)
{
    char *path = NULL;
    cr_assert_geq(asprintf(&path, "%s/%s", dir, name), 0, "out of memory");
    return keep(path, 1);
}

const char *tmp_file_in(const char *dir, const char *name, const void *data, size_t len)
{
    const char *path = tmp_path_in(dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    cr_assert_geq(fd, 0, "cannot create %s", path);
    write_all(fd, data, len, path);
    close(fd);
    return path;
}

void tmp_rewrite(const char *path, const void *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
    cr_assert_geq(fd, 0, "cannot open %s", path);
    write_all(fd, data, len, path);
    close(fd);
}

unsigned char *read_whole(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0, "cannot open %s", path);
    struct stat st;
    cr_assert_eq(fstat(fd, &st), 0, "cannot stat %s", path);
    unsigned char *b = malloc((size_t)st.st_size + 1);
    cr_assert_not_null(b, "out of memory");
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, b + got, (size_t)st.st_size - got);
        cr_assert_gt(n, 0, "cannot read %s", path);
        got += (size_t)n;
    }
    close(fd);
    *len = got;
    return b;
}

const char *run_python(const char *script, ...)
{
    const char *argv[16] = {"/usr/bin/python3", "-c", script};
    size_t argc = 3;
    va_list ap;
    va_start(ap, script);
    for (const char *a; (a = va_arg(ap, const char *));) {
        cr_assert_lt(argc, 15, "too many arguments for run_python");
        argv[argc++] = a;
    }
    va_end(ap);
    int out[2];
    cr_assert_eq(pipe(out), 0, "pipe failed");
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork failed");
    if (pid == 0) {
        dup2(out[1], 1);
        close(out[0]);
        close(out[1]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(out[1]);
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    cr_assert_not_null(buf, "out of memory");
    for (ssize_t n; (n = read(out[0], buf + len, cap - len - 1)) != 0;) {
        cr_assert_geq(n, 0, "cannot read python's output");
        len += (size_t)n;
        if (cap - len == 1) {
            buf = realloc(buf, cap *= 2);
            cr_assert_not_null(buf, "out of memory");
        }
    }
    buf[len] = 0;
    close(out[0]);
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid, "waitpid failed");
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "python failed (status 0x%x; its stderr is above) running:\n%s", status, script);
    return keep(buf, 0);
}

void fill_bytes(void *buf, size_t n, uint32_t seed)
{
    uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull;
    unsigned char *p = buf;
    for (size_t i = 0; i < n; i++) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        p[i] = (unsigned char)((x * 0x2545F4914F6CDD1Dull) >> 56);
    }
}

const char *st_tensor(const char *name, const char *dtype, const char *shape,
                      unsigned long long begin, unsigned long long end)
{
    return strf("\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%llu,%llu]}", name,
                dtype, shape, begin, end);
}

unsigned char *st_bytes(const char *header, const void *data, size_t data_len, size_t *len)
{
    size_t hlen = strlen(header);
    unsigned char *b = malloc(8 + hlen + data_len + 1);
    cr_assert_not_null(b, "out of memory");
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    memcpy(b + 8, header, hlen);
    if (data_len)
        memcpy(b + 8 + hlen, data, data_len);
    *len = 8 + hlen + data_len;
    return b;
}

const char *st_file(const char *header, const void *data, size_t data_len)
{
    size_t len;
    unsigned char *b = st_bytes(header, data, data_len, &len);
    const char *path = tmp_file(b, len);
    free(b);
    return path;
}

const char *st_file_in(const char *dir, const char *name, const char *header, const void *data,
                       size_t data_len)
{
    size_t len;
    unsigned char *b = st_bytes(header, data, data_len, &len);
    const char *path = tmp_file_in(dir, name, b, len);
    free(b);
    return path;
}

const char *st_file_hlen(uint64_t hlen, const void *rest, size_t rest_len)
{
    unsigned char *b = malloc(8 + rest_len);
    cr_assert_not_null(b, "out of memory");
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(b + 8, rest, rest_len);
    const char *path = tmp_file(b, 8 + rest_len);
    free(b);
    return path;
}

/* --- packs ------------------------------------------------------------------------------ */

void buf_put(bytebuf *b, const void *data, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        b->p = realloc(b->p, cap);
        cr_assert_not_null(b->p, "out of memory");
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, data, n);
    b->len += n;
}

void put_le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

void put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

uint64_t get_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

void buf_u8(bytebuf *b, uint8_t v)
{
    buf_put(b, &v, 1);
}

void buf_u32(bytebuf *b, uint32_t v)
{
    unsigned char le[4];
    put_le32(le, v);
    buf_put(b, le, 4);
}

void buf_u64(bytebuf *b, uint64_t v)
{
    unsigned char le[8];
    put_le64(le, v);
    buf_put(b, le, 8);
}

void pk_counts(bytebuf *ix, uint64_t nentries, uint64_t nblobs, uint32_t nmeta,
               uint32_t reserved)
{
    buf_u64(ix, nentries);
    buf_u64(ix, nblobs);
    buf_u32(ix, nmeta);
    buf_u32(ix, reserved);
}

void pk_str(bytebuf *ix, const void *s, uint32_t len)
{
    buf_u32(ix, len);
    buf_put(ix, s, len);
}

void pk_meta(bytebuf *ix, const char *key, const char *value)
{
    pk_str(ix, key, (uint32_t)strlen(key));
    pk_str(ix, value, (uint32_t)strlen(value));
}

void pk_head(bytebuf *ix, const char *name, size_t name_len, uint8_t kind, uint8_t type,
             uint8_t rank, uint8_t reserved)
{
    pk_str(ix, name, (uint32_t)name_len);
    buf_u8(ix, kind);
    buf_u8(ix, type);
    buf_u8(ix, rank);
    buf_u8(ix, reserved);
}

void pk_tensor(bytebuf *ix, const char *name, enum ck_dtype dt, unsigned rank,
               const int64_t *dims, uint64_t blob)
{
    pk_head(ix, name, strlen(name), 0, (uint8_t)dt, (uint8_t)rank, 0);
    for (unsigned d = 0; d < rank; d++)
        buf_u64(ix, (uint64_t)dims[d]);
    buf_u64(ix, blob);
}

void pk_value(bytebuf *ix, const char *name, enum ck_value_type t, const char *text, size_t len)
{
    pk_head(ix, name, strlen(name), 1, (uint8_t)t, 0, 0);
    pk_str(ix, text, (uint32_t)len);
}

void pk_place(pk_blob *blobs, size_t n)
{
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        blobs[i].offset = (at + 255) / 256 * 256;
        at = blobs[i].offset + blobs[i].length;
    }
}

void pk_blobs(bytebuf *ix, const pk_blob *blobs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        buf_u64(ix, blobs[i].offset);
        buf_u64(ix, blobs[i].length);
    }
}

unsigned char *pk_bytes(const bytebuf *ix, const pk_blob *blobs, size_t n, size_t *len)
{
    uint64_t data_offset = (64 + ix->len + 4095) / 4096 * 4096, data_length = 0;
    for (size_t i = 0; i < n; i++)
        if (blobs[i].offset + blobs[i].length > data_length)
            data_length = blobs[i].offset + blobs[i].length;
    data_length = (data_length + 4095) / 4096 * 4096;
    size_t size = (size_t)(data_offset + data_length + 8 * n + 8);
    unsigned char *b = calloc(1, size);
    cr_assert_not_null(b, "out of memory");
    memcpy(b, "CKPTPACK", 8);
    put_le32(b + 8, 1);
    put_le32(b + 12, 0);
    put_le64(b + 16, 64);
    put_le64(b + 24, ix->len);
    put_le64(b + 32, data_offset);
    put_le64(b + 40, data_length);
    put_le64(b + 48, data_offset + data_length);
    if (ix->len)
        memcpy(b + 64, ix->p, ix->len);
    pk_fix_xxh3(b);
    unsigned char *trailer = b + data_offset + data_length;
    for (size_t i = 0; i < n; i++) {
        unsigned char *at = b + data_offset + blobs[i].offset;
        if (blobs[i].data)
            memcpy(at, blobs[i].data, blobs[i].length);
        put_le64(trailer + 8 * i, XXH3_64bits(at, blobs[i].length));
    }
    put_le64(trailer + 8 * n, XXH3_64bits(trailer, 8 * n));
    *len = size;
    return b;
}

const char *pk_file(const bytebuf *ix, const pk_blob *blobs, size_t n)
{
    size_t len;
    unsigned char *b = pk_bytes(ix, blobs, n, &len);
    const char *path = tmp_file(b, len);
    free(b);
    return path;
}

void pk_fix_xxh3(unsigned char *pack)
{
    put_le64(pack + 56, XXH3_64bits(pack + 64, (size_t)get_le64(pack + 24)));
}

void assert_error(const ck_error *err, const char *path, const char *what)
{
    cr_assert(strncmp(err->msg, path, strlen(path)) == 0 && err->msg[strlen(path)] != 0,
              "message '%s' does not start with the path %s", err->msg, path);
    cr_assert_not_null(strstr(err->msg, what), "message '%s' does not say '%s'", err->msg, what);
    for (const char *p = err->msg; *p; p++)
        cr_assert((unsigned char)*p >= 0x20 && *p != 0x7f,
                  "message '%s' holds a control character", err->msg);
}

void assert_open_fails(const char *path, const char *what)
{
    ck_index sentinel;
    ck_index *ix = &sentinel;
    ck_error err = {""};
    int rc = ck_open(path, &ix, &err);
    cr_assert_eq(rc, -1, "ck_open(%s) gave %d, expected an error saying '%s'", path, rc, what);
    cr_assert_null(ix, "ck_open failed but left *out set");
    assert_error(&err, path, what);
}

ck_index *open_ok(const char *path)
{
    ck_index *ix = NULL;
    ck_error err = {""};
    int rc = ck_open(path, &ix, &err);
    cr_assert_eq(rc, 0, "ck_open(%s) failed: %s", path, err.msg);
    cr_assert_not_null(ix);
    return ix;
}

ck_index *index_over(const void *data, size_t len)
{
    const char *path = tmp_file(data, len);
    ck_index *ix = ck_index_new("test");
    cr_assert_not_null(ix);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0, "cannot open %s", path);
    ck_error err = {""};
    cr_assert_eq(ck_index_add_file(ix, path, fd, &err), 0, "%s", err.msg);
    return ix;
}

ck_entry *add_contig(ck_index *ix, const char *name, enum ck_dtype dt, unsigned rank,
                     const int64_t *shape, uint64_t offset, uint64_t nbytes)
{
    ck_error err = {""};
    ck_entry *e = ck_index_add_entry(ix, name, strlen(name), CK_CONTIGUOUS, rank, shape, &err);
    cr_assert_not_null(e, "%s", err.msg);
    e->dtype = (uint8_t)dt;
    e->nbytes = nbytes;
    e->ext = (ck_extent){.offset = offset, .length = nbytes, .file = 0};
    return e;
}

ck_index *index_of_names(const char *const *names, size_t n)
{
    ck_index *ix = ck_index_new("names");
    cr_assert_not_null(ix);
    for (size_t i = 0; i < n; i++) {
        ck_error err = {""};
        ck_entry *e = ck_index_add_entry(ix, names[i], strlen(names[i]), CK_CONTIGUOUS, 0, NULL,
                                         &err);
        cr_assert_not_null(e, "%s", err.msg);
        e->dtype = CK_U8;
        e->nbytes = 1;
    }
    return ix;
}

ck_tree *tree_ok(const ck_index *ix, const char *vdir, const ck_tree_vfile *vfiles,
                 unsigned nvirtual)
{
    ck_tree *t = NULL;
    ck_error err = {""};
    cr_assert_eq(ck_tree_build(ix, vdir, vfiles, nvirtual, &t, &err), 0, "%s", err.msg);
    cr_assert_not_null(t);
    return t;
}

uint32_t tree_find(const ck_tree *t, const char *path)
{
    uint32_t node = 0;
    while (*path && node != CK_NO_NODE) {
        const char *slash = strchr(path, '/');
        size_t len = slash ? (size_t)(slash - path) : strlen(path);
        node = ck_tree_lookup(t, node, path, len);
        path += len + (slash != NULL);
    }
    return node;
}

int on_ci(void)
{
    const char *ci = getenv("CI");
    return ci && (strcasecmp(ci, "true") == 0 || strcmp(ci, "1") == 0);
}

#ifdef __SANITIZE_ADDRESS__
/* LeakSanitizer asks this at exit. Criterion runs each test in a child that it starts with
 * BXFI_MAP set; the runner itself (no BXFI_MAP) runs only criterion, whose timer for a test with
 * .timeout now and then leaks one 48-byte entry when the test ends first (criterion 2.4.1, about
 * every other run with --jobs 2). So leaks are checked in every test process and not in the runner. */
int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void)
{
    return getenv("BXFI_MAP") == NULL;
}
#endif
