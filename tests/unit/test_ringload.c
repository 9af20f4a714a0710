/* The io_uring read loop (ringload.h): blobs at any offset read into destinations in phase with
 * them, their whole blocks in place and their partial first and last blocks through the bounce,
 * with each hook called as the contract says; a read past the end of the file fails that blob
 * alone; a stopped load queues nothing. Expected bytes are the file's own (the test's buffer it
 * was written from). Where the kernel refuses io_uring or /tmp refuses O_DIRECT: skipped, or
 * failed on CI. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../loader/direct.h"
#include "../../loader/ringload.h"
#include "helpers.h"

TestSuite(ringload, .fini = tmp_cleanup);

enum { MAXB = 8 };

/* What the hooks saw. */
typedef struct seen {
    int stop, stopped_after_failure;
    size_t nread, read[MAXB];
    size_t nfailed, failed_id;
    uint64_t failed_at; /* the least */
    int failed_rc;
    atomic_uint_least64_t done;
} seen;

static int stopped(void *ctx)
{
    seen *s = ctx;
    return s->stop || (s->stopped_after_failure && s->nfailed);
}

static void failed(void *ctx, size_t id, uint64_t at, int rc)
{
    seen *s = ctx;
    cr_assert(!s->nfailed || (id == s->failed_id && rc == s->failed_rc));
    if (!s->nfailed++ || at < s->failed_at)
        s->failed_id = id, s->failed_at = at, s->failed_rc = rc;
}

static void read_(void *ctx, size_t id)
{
    seen *s = ctx;
    cr_assert_lt(s->nread, MAXB);
    s->read[s->nread++] = id;
}

/* An O_DIRECT descriptor of a new file of n pseudo-random bytes (in *data, which the caller
 * frees), or the test cannot run here. */
static int direct_file(size_t n, unsigned char **data)
{
    *data = malloc(n);
    cr_assert_not_null(*data);
    fill_bytes(*data, n, 11);
    int fd = open(tmp_file(*data, n), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0)
        CANNOT_RUN_HERE("O_DIRECT refused under /tmp");
    return fd;
}

/* The loop over blobs, or the test cannot run here (a kernel that refuses io_uring). */
static ringload *new_or_skip(const ringload_blob *blobs, size_t n, size_t chunk)
{
    int refused = -1;
    ringload *rl = ringload_new(blobs, n, chunk, &refused);
    if (!rl && refused)
        CANNOT_RUN_HERE("io_uring refused here: %s", strerror(-refused));
    cr_assert_not_null(rl, "out of memory");
    return rl;
}

/* Blobs of every shape (whole blocks, a partial first or last block, inside one block, across
 * many chunks), each into a destination with its file offset's phase. */
static void reads_every_shape(size_t chunk)
{
    unsigned char *data;
    const size_t size = 40 * 4096 + 77;
    int fd = direct_file(size, &data);
    const struct { uint64_t off, len; } shape[] = {
        {0, 4 * 4096}, {5000, 7 * 4096 + 300}, {4096 * 12 + 10, 100}, {4096 * 14, 4096 + 1},
        {4096 * 17 - 1, 2}, {4096 * 20, size - 4096 * 20},
    };
    size_t n = sizeof shape / sizeof *shape;
    const size_t room = 24 * 4096; /* per blob: a block before it, then it */
    unsigned char *dst = aligned_alloc(DIRECT_ALIGN, n * room);
    cr_assert_not_null(dst);
    memset(dst, 0xee, n * room);
    ringload_blob blobs[MAXB];
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        blobs[i] = (ringload_blob){.id = 100 + i, .fd = fd, .off = shape[i].off,
                                   .len = shape[i].len,
                                   .dst = dst + i * room + 4096 + shape[i].off % 4096};
        total += shape[i].len;
    }
    ringload *rl = new_or_skip(blobs, n, chunk);
    seen s = {0};
    ringload_hooks h = {.ctx = &s, .stopped = stopped, .failed = failed, .read = read_,
                        .done_bytes = &s.done};
    cr_assert_eq(ringload_run(rl, &h), 0);
    cr_assert_eq(s.nfailed, 0);
    cr_assert_eq(s.nread, n, "every blob read once");
    unsigned char seen_id[MAXB] = {0};
    for (size_t i = 0; i < n; i++) {
        cr_assert(s.read[i] >= 100 && s.read[i] < 100 + n && !seen_id[s.read[i] - 100]++);
        cr_assert_arr_eq(blobs[i].dst, data + shape[i].off, shape[i].len, "blob %zu", i);
        cr_assert_eq(blobs[i].dst[-1], 0xee, "blob %zu: nothing before it written", i);
        cr_assert_eq(blobs[i].dst[shape[i].len], 0xee, "blob %zu: nothing after it written", i);
    }
    cr_assert_eq(atomic_load(&s.done), total);
    ringload_free(rl);
    free(dst);
    free(data);
    close(fd);
}

Test(ringload, reads_every_shape_of_blob)
{
    reads_every_shape(16384);
}

Test(ringload, reads_every_shape_one_block_a_chunk)
{
    reads_every_shape(4096);
}

/* One read in flight at a time: every chunk waits for a free slot. */
Test(ringload, reads_with_one_slot)
{
    setenv("CKLOAD_URING_DEPTH", "1", 1);
    reads_every_shape(8192);
}

/* A blob that runs past the end of the file fails at each chunk that does (-EIO), and is never
 * read; the blob before it is. */
Test(ringload, a_read_past_the_end_fails_that_blob)
{
    unsigned char *data;
    const size_t size = 6 * 4096;
    int fd = direct_file(size, &data);
    unsigned char *dst = aligned_alloc(DIRECT_ALIGN, 16 * 4096);
    ringload_blob blobs[] = {
        {.id = 1, .fd = fd, .off = 0, .len = 4096, .dst = dst},
        {.id = 2, .fd = fd, .off = 4096, .len = 8 * 4096, .dst = dst + 4096},
    };
    ringload *rl = new_or_skip(blobs, 2, 4096);
    seen s = {0};
    ringload_hooks h = {.ctx = &s, .stopped = stopped, .failed = failed, .read = read_,
                        .done_bytes = &s.done};
    cr_assert_eq(ringload_run(rl, &h), 0, "the ring itself did not fail");
    cr_assert_eq(s.nfailed, 3, "blocks 6, 7 and 8 of the file");
    cr_assert_eq(s.failed_id, 2);
    cr_assert_eq(s.failed_rc, -EIO);
    cr_assert_eq(s.failed_at, size - 4096, "the first block past the end, in the blob");
    cr_assert_eq(s.nread, 1);
    cr_assert_eq(s.read[0], 1);
    cr_assert_arr_eq(dst, data, 4096);
    ringload_free(rl);
    free(dst);
    free(data);
    close(fd);
}

/* A load that stops at its first failure reports no blob after it: with one slot, blob 1's
 * failure is in before blob 2's read completes. */
Test(ringload, a_stopped_load_reads_nothing_more)
{
    setenv("CKLOAD_URING_DEPTH", "1", 1);
    unsigned char *data;
    int fd = direct_file(2 * 4096, &data);
    unsigned char *dst = aligned_alloc(DIRECT_ALIGN, 8 * 4096);
    ringload_blob blobs[] = {
        {.id = 1, .fd = fd, .off = 4096, .len = 4 * 4096, .dst = dst},
        {.id = 2, .fd = fd, .off = 0, .len = 4096, .dst = dst + 4 * 4096},
    };
    ringload *rl = new_or_skip(blobs, 2, 4 * 4096);
    seen s = {.stopped_after_failure = 1};
    ringload_hooks h = {.ctx = &s, .stopped = stopped, .failed = failed, .read = read_,
                        .done_bytes = &s.done};
    cr_assert_eq(ringload_run(rl, &h), 0);
    cr_assert_eq(s.nfailed, 1);
    cr_assert_eq(s.nread, 0, "blob 2 is not reported");
    ringload_free(rl);
    free(dst);
    free(data);
    close(fd);
}

/* A load stopped before the loop runs reads nothing and reports nothing. */
Test(ringload, a_stopped_load_queues_nothing)
{
    unsigned char *data;
    int fd = direct_file(4 * 4096, &data);
    unsigned char *dst = aligned_alloc(DIRECT_ALIGN, 4 * 4096);
    memset(dst, 0xee, 4 * 4096);
    ringload_blob blob = {.id = 1, .fd = fd, .off = 0, .len = 4 * 4096, .dst = dst};
    ringload *rl = new_or_skip(&blob, 1, 4096);
    seen s = {.stop = 1};
    ringload_hooks h = {.ctx = &s, .stopped = stopped, .failed = failed, .read = read_,
                        .done_bytes = &s.done};
    cr_assert_eq(ringload_run(rl, &h), 0);
    cr_assert_eq(s.nread + s.nfailed + atomic_load(&s.done), 0);
    cr_assert_eq(dst[0], 0xee);
    ringload_free(rl);
    free(dst);
    free(data);
    close(fd);
}
