/* common.c — the memfd and the checks every harness shares (see fuzz.h). */
#include "fuzz.h"
#include "../pack/packfile.h"
#include "../pack/zip.h"

#include <errno.h>
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

/* Reads up to 4 KiB at off; a short or failed read of a validated entry is a parser bug. */
static void read_at(const ck_index *ix, const ck_entry *e, uint64_t off, unsigned char *buf)
{
    size_t want = e->nbytes - off < 4096 ? (size_t)(e->nbytes - off) : 4096;
    ssize_t got = ck_entry_read(ix, e, buf, 4096, off);
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
