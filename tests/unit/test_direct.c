/* The cold-read policy (direct.h): how a blob is cut into chunks, the O_DIRECT read of the whole
 * blocks around a chunk, and which source files are read O_DIRECT (cold ones, or as
 * CKLOAD_DIRECT says, never a file replaced since the index opened it). Expected bytes are the
 * file's own, read back with plain pread; expected decisions are the page cache's, asked with
 * mincore here. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../loader/direct.h"
#include "helpers.h"

TestSuite(direct, .fini = tmp_cleanup);

/* A blob at any offset, cut in place, is tiled by its chunks: each at most max bytes, and either
 * whole blocks or inside one block (its partial first or last). Out of place, chunks are max
 * bytes but the last. */
Test(direct, chunks_tile_a_blob_on_block_boundaries)
{
    const uint64_t offs[] = {0, 1, 100, 4095, 4096, 4097, 12288 - 7};
    const uint64_t lens[] = {1, 100, 4096, 4097, 8191, 3 * 4096, 100000};
    const size_t maxes[] = {4096, 8192, 16384 + 4096};
    for (size_t i = 0; i < sizeof offs / sizeof *offs; i++)
        for (size_t j = 0; j < sizeof lens / sizeof *lens; j++)
            for (size_t k = 0; k < sizeof maxes / sizeof *maxes; k++)
                for (int in_place = 0; in_place < 2; in_place++) {
                    uint64_t at = 0, off = offs[i], len = lens[j];
                    while (at < len) {
                        size_t n = direct_chunk(off + at, len - at, maxes[k], in_place);
                        cr_assert(n > 0 && n <= maxes[k] && at + n <= len);
                        uint64_t first = off + at, last = off + at + n - 1;
                        if (in_place)
                            cr_assert(direct_whole(first, n) || first / 4096 == last / 4096,
                                      "off %llu len %llu: chunk [%llu, +%zu)",
                                      (unsigned long long)off, (unsigned long long)len,
                                      (unsigned long long)first, n);
                        else
                            cr_assert(n == maxes[k] || at + n == len);
                        at += n;
                    }
                    cr_assert_eq(at, len);
                }
}

Test(direct, whole_means_aligned_start_and_length)
{
    cr_assert(direct_whole(0, 4096));
    cr_assert(direct_whole(8192, 3 * 4096));
    cr_assert_not(direct_whole(1, 4096));
    cr_assert_not(direct_whole(4096, 4095));
    cr_assert_eq(direct_start(4095), 0);
    cr_assert_eq(direct_start(4096), 4096);
    cr_assert_eq(direct_start(10000), 8192);
}

/* A file of n pseudo-random bytes; its path, and its bytes in *data (the caller frees). */
static const char *random_file(size_t n, unsigned char **data)
{
    *data = malloc(n);
    cr_assert_not_null(*data);
    fill_bytes(*data, n, 7);
    return tmp_file(*data, n);
}

/* An O_DIRECT descriptor of path, or the test cannot run here (a file system that refuses it). */
static int open_direct_or_skip(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0)
        CANNOT_RUN_HERE("O_DIRECT refused under /tmp");
    return fd;
}

Test(direct, pread_reads_the_blocks_around_a_chunk)
{
    unsigned char *data;
    const size_t size = 5 * 4096 + 123;
    const char *path = random_file(size, &data);
    int fd = open_direct_or_skip(path);
    const struct { uint64_t off; size_t n; } cases[] = {
        {0, 4096}, {1, 10}, {4095, 2}, {5000, 3 * 4096}, {4096, 4096}, {size - 123, 123},
        {size - 1, 1}, {100, size - 100},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        unsigned char *buf = aligned_alloc(DIRECT_ALIGN, (cases[i].n + DIRECT_SLACK + 4095) / 4096 * 4096);
        cr_assert_not_null(buf);
        cr_assert_eq(direct_pread(fd, buf, cases[i].off, cases[i].n), 0, "case %zu", i);
        cr_assert_arr_eq(buf + cases[i].off % DIRECT_ALIGN, data + cases[i].off, cases[i].n,
                         "case %zu: bytes [%llu, +%zu)", i, (unsigned long long)cases[i].off,
                         cases[i].n);
        free(buf);
    }
    unsigned char *buf = aligned_alloc(DIRECT_ALIGN, 4 * DIRECT_ALIGN);
    cr_assert_eq(direct_pread(fd, buf, size - 10, 11), -EIO, "past the end of the file");
    free(buf);
    close(fd);
    free(data);
}

/* An index over a file of size pseudo-random bytes, with one tensor of all of them after a
 * 4096-byte header, and its plan. */
static ck_index *one_tensor(size_t size, ck_plan **p)
{
    unsigned char *data = malloc(size);
    cr_assert_not_null(data);
    fill_bytes(data, size, 9);
    ck_index *ix = index_over(data, size);
    free(data);
    add_contig(ix, "w", CK_U8, 1, (int64_t[]){(int64_t)(size - 4096)}, 4096, size - 4096);
    ck_error err = {""};
    cr_assert_eq(ck_plan_make(ix, NULL, NULL, p, &err), 0, "%s", err.msg);
    return ix;
}

/* The fraction of path's pages in the page cache, as mincore says. */
static double resident(int fd, size_t size)
{
    void *m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    cr_assert_neq(m, MAP_FAILED);
    size_t pages = (size + 4095) / 4096, in = 0;
    unsigned char *vec = malloc(pages);
    cr_assert_eq(mincore(m, size, vec), 0);
    for (size_t i = 0; i < pages; i++)
        in += vec[i] & 1;
    free(vec);
    munmap(m, size);
    return (double)in / (double)pages;
}

static void assert_direct(const direct_files *d, int want)
{
    cr_assert_eq(d->any, want);
    cr_assert_eq(d->fds[0] >= 0, want);
    if (want)
        cr_assert(d->phase[0] && d->phase[0] <= DIRECT_ALIGN &&
                  !(d->phase[0] & (d->phase[0] - 1)), "phase %u", d->phase[0]);
    else
        cr_assert_eq(d->phase[0], 0);
}

/* A file the page cache holds is read through it; once evicted, O_DIRECT. */
Test(direct, cold_files_are_read_direct)
{
    const size_t size = 64 * 4096;
    ck_plan *p;
    ck_index *ix = one_tensor(size, &p);
    int fd = ix->files[0].fd;
    close(open_direct_or_skip(ix->files[0].path));
    unsetenv("CKLOAD_DIRECT");
    direct_files d = {0};
    cr_assert_eq(resident(fd, size), 1.0, "written a moment ago");
    cr_assert_eq(direct_open(&d, ix, p), 0);
    assert_direct(&d, 0);
    direct_free(&d);
    cr_assert_eq(fdatasync(fd), 0);
    cr_assert_eq(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    if (resident(fd, size) >= 0.5)
        cr_skip_test("the page cache kept the file");
    cr_assert_eq(direct_open(&d, ix, p), 0);
    assert_direct(&d, 1);
    direct_close(&d);
    cr_assert_eq(d.fds[0], -1, "closed");
    cr_assert_not(direct_reads(&d, &p->blobs[0]));
    direct_free(&d);
    direct_free(&d); /* twice, or never opened: nothing to do */
    ck_plan_free(p);
    ck_index_free(ix);
}

/* CKLOAD_DIRECT=1 and 0 decide whatever the page cache holds; a blob reads O_DIRECT and lands in
 * place only where its destination has its file offset's phase. */
Test(direct, the_environment_decides)
{
    ck_plan *p;
    ck_index *ix = one_tensor(8 * 4096, &p);
    close(open_direct_or_skip(ix->files[0].path));
    direct_files d = {0};
    setenv("CKLOAD_DIRECT", "1", 1);
    cr_assert_eq(direct_open(&d, ix, p), 0);
    assert_direct(&d, 1);
    const ck_plan_blob *bl = &p->blobs[0];
    cr_assert(direct_reads(&d, bl));
    unsigned char *block = aligned_alloc(DIRECT_ALIGN, 2 * DIRECT_ALIGN);
    cr_assert(direct_in_place(&d, bl, block + bl->file_off % d.phase[0]));
    cr_assert_not(direct_in_place(&d, bl, block + bl->file_off % d.phase[0] + 1));
    free(block);
    direct_free(&d);
    setenv("CKLOAD_DIRECT", "0", 1);
    cr_assert_eq(direct_open(&d, ix, p), 0);
    assert_direct(&d, 0);
    cr_assert_not(direct_reads(&d, bl));
    direct_free(&d);
    ck_plan_free(p);
    ck_index_free(ix);
}

/* A path that names another file than the one the index opened is not read O_DIRECT: the bytes
 * would not be the indexed ones. */
Test(direct, a_replaced_file_is_not_read_direct)
{
    ck_plan *p;
    ck_index *ix = one_tensor(8 * 4096, &p);
    close(open_direct_or_skip(ix->files[0].path));
    unsigned char other[8 * 4096] = {0};
    const char *twin = tmp_file(other, sizeof other);
    cr_assert_eq(rename(twin, ix->files[0].path), 0);
    setenv("CKLOAD_DIRECT", "1", 1);
    direct_files d = {0};
    cr_assert_eq(direct_open(&d, ix, p), 0);
    assert_direct(&d, 0);
    direct_free(&d);
    ck_plan_free(p);
    ck_index_free(ix);
}
