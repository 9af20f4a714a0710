/* common.c — the memfd and the checks every harness shares (see fuzz.h). */
#include "fuzz.h"
#include "../formats/packfile.h"
#include "../index/zip.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

void fuzz_fail(const char *what, const char *file, int line)
{
    fprintf(stderr, "fuzz: %s:%d: invariant broken: %s\n", file, line, what);
    abort();
}

int fuzz_memfd(const uint8_t *data, size_t size)
{
    int fd = memfd_create("fuzz-input", MFD_CLOEXEC);
    FUZZ_REQUIRE(fd >= 0);
    for (size_t done = 0; done < size;) {
        ssize_t n = write(fd, data + done, size - done);
        if (n < 0 && errno == EINTR)
            continue;
        FUZZ_REQUIRE(n > 0);
        done += (size_t)n;
    }
    return fd;
}

ck_index *fuzz_index(const uint8_t *data, size_t size)
{
    ck_error err;
    ck_index *ix = ck_index_new(NULL);
    FUZZ_REQUIRE(ix != NULL);
    FUZZ_REQUIRE(ck_index_add_file(ix, "fuzz-input", fuzz_memfd(data, size), &err) == 0);
    return ix;
}

void fuzz_zip_reader_run(const uint8_t *data, size_t size, fuzz_zip_reader read)
{
    ck_error err = {{0}};
    ck_index *ix = fuzz_index(data, size);
    const ck_file *f = &ix->files[0];
    zip_archive z;
    int rc = zip_read_directory(f, f->size, f->path, &z, &err);
    if (rc == 0) {
        rc = read(ix, 0, &z, &err);
        zip_free(&z);
    }
    fuzz_check(rc, ix, &err);
    ck_index_free(ix);
}

#define SEP "\0FZ\0"
#define SEP_LEN 4
#define MAX_FILES 16

static char dir[PATH_MAX];
static int dirfd = -1;
static char names[MAX_FILES][65]; /* the files of the last input ("": none) */

/* The work directory, made on first use; dirfd stays open on it. */
static const char *work_dir(void)
{
    if (!dir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/ckptfs-fuzz-XXXXXX",
                 base && *base ? base : access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
        FUZZ_REQUIRE(mkdtemp(dir) != NULL);
        dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        FUZZ_REQUIRE(dirfd >= 0);
    }
    return dir;
}

static void remove_dir(void)
{
    fuzz_dir_clear();
    if (dir[0])
        rmdir(dir);
}

static int plain_name(const uint8_t *s, size_t n)
{
    if (n == 0 || n > 64 || s[0] == '.')
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!(s[i] >= 'a' && s[i] <= 'z') && !(s[i] >= 'A' && s[i] <= 'Z') &&
            !(s[i] >= '0' && s[i] <= '9') && !(s[i] && strchr("._-", s[i])))
            return 0;
    return 1;
}

/* Writes one piece as a file in the work directory: its name in out, or "" if dropped. The
 * name is the piece's first line, or `name` when not NULL (the whole piece its contents). */
static void write_piece(const uint8_t *p, size_t n, const char *name, char out[65])
{
    out[0] = 0;
    const uint8_t *body = p;
    if (name) {
        snprintf(out, 65, "%s", name);
    } else {
        const uint8_t *nl = memchr(p, '\n', n);
        if (!nl || !plain_name(p, (size_t)(nl - p)))
            return;
        memcpy(out, p, (size_t)(nl - p));
        out[nl - p] = 0;
        body = nl + 1;
    }
    work_dir();
    int fd = openat(dirfd, out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    FUZZ_REQUIRE(fd >= 0);
    size_t left = n - (size_t)(body - p);
    while (left) {
        ssize_t w = write(fd, body, left);
        FUZZ_REQUIRE(w > 0);
        body += w;
        left -= (size_t)w;
    }
    close(fd);
}

static const uint8_t *find_sep(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i + SEP_LEN <= n; i++)
        if (memcmp(p + i, SEP, SEP_LEN) == 0)
            return p + i;
    return NULL;
}

const char *fuzz_dir_files(const uint8_t *data, size_t size, const char *first_name)
{
    static int registered;
    if (!registered) {
        registered = 1;
        atexit(remove_dir);
    }
    for (size_t nfiles = 0; nfiles < MAX_FILES; nfiles++) {
        const uint8_t *sep = find_sep(data, size);
        size_t n = sep ? (size_t)(sep - data) : size;
        write_piece(data, n, nfiles == 0 ? first_name : NULL, names[nfiles]);
        if (!sep)
            break;
        size -= n + SEP_LEN;
        data = sep + SEP_LEN;
    }
    return work_dir();
}

void fuzz_dir_clear(void)
{
    for (size_t i = 0; i < MAX_FILES; i++)
        if (names[i][0]) {
            unlinkat(dirfd, names[i], 0);
            names[i][0] = 0;
        }
}

void fuzz_fix_pack_xxh3(uint8_t *data, size_t size)
{
    if (size < PACK_HEADER_SIZE)
        return;
    pack_header h;
    pack_header_decode(data, &h);
    if (h.index_length <= size - PACK_HEADER_SIZE) {
        uint64_t sum = XXH3_64bits(data + PACK_HEADER_SIZE, (size_t)h.index_length);
        for (int i = 0; i < 8; i++)
            data[56 + i] = (uint8_t)(sum >> (8 * i));
    }
}

/* Reads up to 4 KiB at off; a short or failed read of a validated entry is a parser bug, but
 * for one whose bytes are a deflate stream's (a deflated member, or its inflated copy): that
 * stream is checked only as far as reads go (zip.h), so a fault past its header is found by
 * the read that reaches it, -EIO. */
static void read_at(const ck_index *ix, const ck_entry *e, uint64_t off, unsigned char *buf)
{
    size_t want = e->nbytes - off < 4096 ? (size_t)(e->nbytes - off) : 4096;
    ssize_t got = ck_entry_read(ix, e, buf, 4096, off);
    const ck_file *f = &ix->files[e->ext.file];
    if (got == -EIO && (e->layout == CK_DEFLATED || ck_file_origin(f) != f))
        return;
    if (got != (ssize_t)want)
        fprintf(stderr, "fuzz: entry '%s': read at %llu gave %zd, wanted %zu\n", e->name,
                (unsigned long long)off, got, want);
    FUZZ_REQUIRE(got == (ssize_t)want);
}

void fuzz_check(int rc, const ck_index *ix, const ck_error *err)
{
    if (rc != 0) {
        size_t n = strnlen(err->msg, sizeof err->msg);
        FUZZ_REQUIRE(n > 0 && n < sizeof err->msg);
        FUZZ_REQUIRE(strchr(err->msg, '\n') == NULL);
        return;
    }
    if (!ix) /* a parser that builds no index (zip, pickle) */
        return;
    static unsigned char buf[4096];
    /* Bounded, so one input with a million entries stays fast. */
    size_t n = ix->nentries < 512 ? ix->nentries : 512;
    for (size_t i = 0; i < n; i++) {
        const ck_entry *e = &ix->entries[i];
        FUZZ_REQUIRE(e->name != NULL && strlen(e->name) == e->name_len);
        FUZZ_REQUIRE(e->rank <= CK_MAX_RANK);
        if (e->kind == CK_TENSOR) {
            FUZZ_REQUIRE(e->dtype < CK_DTYPE_COUNT);
            FUZZ_REQUIRE(e->ext.file < ix->nfiles);
        }
        if (e->nbytes == 0)
            continue;
        read_at(ix, e, 0, buf);
        if (e->nbytes > 4096)
            read_at(ix, e, e->nbytes - 4096, buf);
    }
    for (size_t i = 0; i < ix->nmeta; i++)
        FUZZ_REQUIRE(ix->meta[i].key != NULL && ix->meta[i].value != NULL);
}
