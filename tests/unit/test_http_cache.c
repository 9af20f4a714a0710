/* The remote-object block cache and readahead (blockcache.h's contract), driven in-process
 * through http_open_fetch by a fake transport that serves a known byte pattern, counts and
 * logs every range asked, and can fail or delay: no server, no network. Each test makes its
 * own remote context (and so its own cache). Expectations come from the contract (BC_FLOOR,
 * BC_PAGE, BC_BLOCK, the window), not from the code. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../sources/http.h"
#include "helpers.h"

enum { MAX_LOG = 4096 };

typedef struct asked {
    uint64_t off, len;
    unsigned tries;
} asked;

typedef struct fake {
    uint64_t size;
    pthread_mutex_t lock;
    asked log[MAX_LOG];
    size_t n;
    uint64_t fetched;              /* bytes served */
    uint64_t fail_from, fail_to;   /* ranges touching [fail_from, fail_to) fail */
    int fail_ahead_only;           /* only the readahead's requests (asked once) fail */
    unsigned delay_us;
} fake;

static unsigned char pattern(uint64_t i)
{
    return (unsigned char)(i ^ (i >> 8) ^ (i >> 16) ^ (i >> 24));
}

static int serve(void *ctx, unsigned char *buf, size_t len, uint64_t off, unsigned tries)
{
    fake *f = ctx;
    if (f->delay_us)
        usleep(f->delay_us);
    pthread_mutex_lock(&f->lock);
    if (f->n < MAX_LOG)
        f->log[f->n++] = (asked){off, len, tries};
    int fails = off < f->fail_to && off + len > f->fail_from &&
                (!f->fail_ahead_only || tries == 1);
    if (!fails)
        f->fetched += len;
    pthread_mutex_unlock(&f->lock);
    cr_assert(len > 0 && off + len <= f->size, "asked [%llu, +%zu) of %llu",
              (unsigned long long)off, len, (unsigned long long)f->size);
    if (fails)
        return -EIO;
    for (size_t i = 0; i < len; i++)
        buf[i] = pattern(off + i);
    return 0;
}

static fake *fake_new(uint64_t size)
{
    fake *f = calloc(1, sizeof *f);
    cr_assert_not_null(f);
    f->size = size;
    pthread_mutex_init(&f->lock, NULL);
    return f;
}

/* A remote context of its own: a block cache of cache_mem bytes (0: the default), a disk cache
 * in dir (or NULL: none). */
static http_remote *remote_new(uint64_t cache_mem, const char *dir)
{
    http_remote *r = http_remote_new(&(http_config){.cache_mem = cache_mem, .cache_dir = dir});
    cr_assert_not_null(r);
    return r;
}

/* f opened through r, named name; keyed for the disk cache when etag is given. */
static ck_file open_in(http_remote *r, fake *f, const char *name, const char *etag)
{
    ck_file file;
    ck_error err;
    cr_assert_eq(http_open_fetch(r, name, f->size, etag, serve, f, &file, &err), 0, "%s",
                 err.msg);
    return file;
}

/* One fake object of size bytes, opened through a remote context of its own (a block cache of
 * cache_mem bytes), as most tests want it. */
typedef struct served {
    fake *f;
    http_remote *r;
    ck_file file;
} served;

static served served_new(uint64_t size, uint64_t cache_mem)
{
    served s = {.f = fake_new(size), .r = remote_new(cache_mem, NULL)};
    s.file = open_in(s.r, s.f, "fake://object", NULL);
    return s;
}

static void served_free(served *s)
{
    ck_source_close(&s->file);
    http_remote_free(s->r);
    free(s->f);
}

static void expect_bytes(const unsigned char *buf, size_t len, uint64_t off)
{
    for (size_t i = 0; i < len; i++)
        if (buf[i] != pattern(off + i))
            cr_assert_fail("byte %llu: %u, not %u", (unsigned long long)(off + i), buf[i],
                           pattern(off + i));
}

static void read_ok(const ck_file *file, size_t len, uint64_t off)
{
    unsigned char *buf = malloc(len ? len : 1);
    cr_assert_eq(ck_file_read(file, buf, len, off), 0, "read [%llu, +%zu)",
                 (unsigned long long)off, len);
    expect_bytes(buf, len, off);
    free(buf);
}

static uint64_t fetched(fake *f)
{
    pthread_mutex_lock(&f->lock);
    uint64_t n = f->fetched;
    pthread_mutex_unlock(&f->lock);
    return n;
}

/* Waits until no fetch has been asked for a while: readahead runs on threads of its own. */
static void settle(fake *f)
{
    size_t n;
    do {
        pthread_mutex_lock(&f->lock);
        n = f->n;
        pthread_mutex_unlock(&f->lock);
        usleep(20000);
    } while (n != f->n);
}

static int by_offset(const void *x, const void *y)
{
    const asked *a = x, *b = y;
    return (a->off > b->off) - (a->off < b->off);
}

TestSuite(http_cache, .fini = tmp_cleanup);

Test(http_cache, random_reads_return_the_objects_bytes)
{
    served s = served_new(40ull << 20, 16ull << 20); /* four blocks: evictions happen */
    fake *f = s.f;
    srand(5);
    for (int i = 0; i < 300; i++) {
        size_t len = (size_t)(rand() % (3 * BC_PAGE)) + 1;
        uint64_t off = (uint64_t)rand() % (f->size - len);
        read_ok(&s.file, len, off);
    }
    read_ok(&s.file, 2 * BC_BLOCK + 12345, 3 * BC_BLOCK - 777); /* a large read, split */
    read_ok(&s.file, 1, f->size - 1);
    served_free(&s);
}

Test(http_cache, a_random_miss_fetches_its_pages_to_the_floor)
{
    served s = served_new(64ull << 20, 0);
    fake *f = s.f;
    uint64_t off = 10ull << 20; /* page-aligned, far from where reads ended (the start) */
    read_ok(&s.file, 4096, off);
    cr_expect_eq(fetched(f), BC_FLOOR, "fetched %llu, not BC_FLOOR",
                 (unsigned long long)fetched(f));
    cr_expect_eq(f->log[0].off, off);
    served_free(&s);
}

Test(http_cache, a_random_miss_stops_at_its_tensors_end)
{
    served s = served_new(64ull << 20, 0);
    fake *f = s.f;
    uint64_t off = 20ull << 20, tensor_end = off + 100000;
    const uint64_t bounds[] = {0, off, tensor_end, f->size};
    ck_file_hint(&s.file, bounds, 4);
    read_ok(&s.file, 4096, off);
    /* the pages of [off, tensor_end): two of BC_PAGE, not BC_FLOOR's four */
    cr_expect_eq(fetched(f), 2 * BC_PAGE, "fetched %llu", (unsigned long long)fetched(f));
    served_free(&s);
}

Test(http_cache, a_sequential_stream_fetches_each_byte_once_in_ever_larger_requests)
{
    served s = served_new(48ull << 20, 0);
    fake *f = s.f;
    size_t reads = 0;
    for (uint64_t off = 0; off < f->size; off += 128 << 10, reads++)
        read_ok(&s.file, 128 << 10, off);
    settle(f);
    cr_expect_eq(fetched(f), f->size, "each byte once: fetched %llu of %llu",
                 (unsigned long long)fetched(f), (unsigned long long)f->size);
    cr_expect_lt(f->n, reads / 4, "%zu requests for %zu reads", f->n, reads);
    /* the window grows to whole blocks: the stream's last requests are whole blocks */
    cr_expect_eq(f->log[f->n - 1].len % BC_BLOCK, 0);
    qsort(f->log, f->n, sizeof *f->log, by_offset); /* on parallel connections: any order */
    for (size_t i = 1; i < f->n; i++) /* none overlapping */
        cr_expect_geq(f->log[i].off, f->log[i - 1].off + f->log[i - 1].len);
    served_free(&s);
}

Test(http_cache, readahead_is_asked_once_and_the_reader_asks_again_with_retries)
{
    served s = served_new(32ull << 20, 0);
    fake *f = s.f;
    f->fail_from = 0, f->fail_to = f->size, f->fail_ahead_only = 1;
    for (uint64_t off = 0; off < (16ull << 20); off += 64 << 10)
        read_ok(&s.file, 64 << 10, off);
    settle(f);
    int ahead = 0, demanded = 0;
    for (size_t i = 0; i < f->n; i++) {
        ahead += f->log[i].tries == 1;
        demanded += f->log[i].tries == 0;
    }
    cr_expect_gt(ahead, 0, "readahead was asked");
    cr_expect_gt(demanded, 0, "the reads asked again themselves");
    served_free(&s);
}

Test(http_cache, a_failed_fetch_fails_its_read_and_nothing_else)
{
    served s = served_new(32ull << 20, 0);
    fake *f = s.f;
    f->fail_from = 8ull << 20, f->fail_to = (8ull << 20) + 1;
    unsigned char buf[4096];
    cr_expect_eq(ck_file_read(&s.file, buf, sizeof buf, 8ull << 20), -EIO);
    read_ok(&s.file, 4096, 20ull << 20);
    f->fail_to = 0; /* the server recovers: the same read now works */
    read_ok(&s.file, 4096, 8ull << 20);
    served_free(&s);
}

typedef struct reader {
    ck_file *file;
    uint64_t size;
    unsigned seed;
} reader;

static void *read_at_random(void *arg)
{
    reader *r = arg;
    for (int i = 0; i < 100; i++) {
        size_t len = (size_t)(rand_r(&r->seed) % (2 * BC_PAGE)) + 1;
        uint64_t off = (uint64_t)rand_r(&r->seed) % (r->size - len);
        read_ok(r->file, len, off);
    }
    return NULL;
}

Test(http_cache, concurrent_readers_of_two_objects_share_a_small_cache)
{
    fake *a = fake_new(24ull << 20), *b = fake_new(20ull << 20);
    a->delay_us = b->delay_us = 200;
    http_remote *r = remote_new(3ull * BC_BLOCK, NULL);
    ck_file fa = open_in(r, a, "fake://object", NULL);
    ck_file fb;
    ck_error err;
    cr_assert_eq(http_open_fetch(r, "fake://b", b->size, NULL, serve, b, &fb, &err), 0);
    pthread_t t[4];
    reader rd[4] = {{&fa, a->size, 1}, {&fb, b->size, 2}, {&fa, a->size, 3}, {&fb, b->size, 4}};
    for (int i = 0; i < 4; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, read_at_random, &rd[i]), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    ck_source_close(&fa);
    read_ok(&fb, 5000, 7ull << 20); /* b goes on after a is closed */
    ck_source_close(&fb);
    http_remote_free(r);
    free(a);
    free(b);
}

Test(http_cache, an_evicted_block_is_fetched_again)
{
    served s = served_new(32ull << 20, 2ull * BC_BLOCK);
    fake *f = s.f;
    read_ok(&s.file, 4096, 0);
    for (uint64_t off = 8ull << 20; off < f->size; off += 3ull << 20) /* random misses elsewhere */
        read_ok(&s.file, 4096, off);
    settle(f);
    size_t before = f->n;
    read_ok(&s.file, 4096, 0);
    int again = 0;
    for (size_t i = before; i < f->n; i++)
        again |= f->log[i].off == 0;
    cr_expect(again, "block 0 was evicted and fetched again");
    /* and one still cached is not: the last block read */
    before = f->n;
    read_ok(&s.file, 4096, 29ull << 20);
    cr_expect_eq(f->n, before, "a cached page asked again");
    served_free(&s);
}

Test(http_cache, a_held_block_is_lent_in_place_and_kept)
{
    served s = served_new(16ull << 20, 1ull * BC_BLOCK);
    fake *f = s.f;
    const void *p;
    void *token;
    ssize_t n = ck_file_hold(&s.file, 8192, BC_BLOCK + 100, &p, &token);
    cr_assert_gt(n, 0);
    cr_assert_leq((uint64_t)n, 8192);
    expect_bytes(p, (size_t)n, BC_BLOCK + 100);
    for (uint64_t off = 2 * BC_BLOCK; off < f->size; off += BC_BLOCK) /* press the cache */
        read_ok(&s.file, 4096, off);
    expect_bytes(p, (size_t)n, BC_BLOCK + 100); /* still the same bytes: not evicted */
    ck_file_release(&s.file, token);
    served_free(&s);
}

Test(http_cache, a_large_read_goes_in_parallel_requests_of_a_block_or_more)
{
    served s = served_new(64ull << 20, 0);
    fake *f = s.f;
    read_ok(&s.file, 40ull << 20, 1000);
    cr_expect_leq(f->n, BC_PARALLEL);
    for (size_t i = 0; i < f->n; i++)
        cr_expect_geq(f->log[i].len, BC_BLOCK);
    cr_expect_eq(fetched(f), 40ull << 20, "straight into the caller's buffer, once");
    served_free(&s);
}

/* An object keyed for the disk cache, opened through r (whose disk cache is DIR). */
static ck_file open_cached(http_remote *r, fake *f)
{
    return open_in(r, f, "fake://cached", "\"v1\"");
}

/* A new open of f in a new remote context, as a new mount would: [off, off+len) comes from
 * the disk, nothing fetched. */
static void expect_from_disk(fake *f, const char *dir, size_t len, uint64_t off)
{
    http_remote *r = remote_new(0, dir);
    ck_file file = open_cached(r, f);
    uint64_t before = fetched(f);
    read_ok(&file, len, off);
    settle(f);
    cr_expect_eq(fetched(f), before, "[%llu, +%zu) fetched, not read from disk",
                 (unsigned long long)off, len);
    ck_source_close(&file);
    http_remote_free(r);
}

Test(http_cache, a_stream_stores_whole_blocks_that_the_next_open_reads_from_disk)
{
    const char *dir = tmp_dir();
    fake *f = fake_new(20ull << 20);
    http_remote *r = remote_new(0, dir);
    ck_file file = open_cached(r, f);
    for (uint64_t off = 0; off < f->size; off += 256 << 10)
        read_ok(&file, 256 << 10, off);
    settle(f);
    ck_source_close(&file);
    http_remote_free(r);
    cr_expect_eq(fetched(f), f->size);
    expect_from_disk(f, dir, 12345, 777);         /* through the cache's pages */
    expect_from_disk(f, dir, f->size - 777, 777); /* every block, as a large read */
    free(f);
}

Test(http_cache, a_random_miss_fetches_only_its_pages_even_with_a_disk_cache)
{
    const char *dir = tmp_dir();
    fake *f = fake_new(32ull << 20);
    http_remote *r = remote_new(0, dir);
    ck_file file = open_cached(r, f);
    read_ok(&file, 4096, 12ull << 20);
    cr_expect_eq(fetched(f), BC_FLOOR, "not a whole block: %llu",
                 (unsigned long long)fetched(f));
    /* the block's other pages, read at random until it is whole: then it is stored */
    for (uint64_t off = 12ull << 20; off < (16ull << 20); off += BC_FLOOR)
        read_ok(&file, BC_FLOOR, off);
    settle(f);
    ck_source_close(&file);
    http_remote_free(r);
    expect_from_disk(f, dir, 100000, (12ull << 20) + 5000);
    free(f);
}

Test(http_cache, a_large_read_with_a_disk_cache_goes_block_by_block)
{
    const char *dir = tmp_dir();
    fake *f = fake_new(24ull << 20);
    http_remote *r = remote_new(0, dir);
    ck_file file = open_cached(r, f);
    read_ok(&file, (12ull << 20) + 4321, 1000); /* whole blocks and two partial ones */
    for (size_t i = 0; i < f->n; i++) /* each asked whole, so that it can be stored */
        cr_expect(f->log[i].off % BC_BLOCK == 0 && f->log[i].len == BC_BLOCK);
    cr_expect(ck_file_unchanged(&file));
    ck_source_close(&file);
    http_remote_free(r);
    expect_from_disk(f, dir, 8ull << 20, BC_BLOCK);
    free(f);
}

Test(http_cache, two_remote_contexts_share_nothing)
{
    fake *f = fake_new(16ull << 20);
    http_remote *r1 = remote_new(0, NULL), *r2 = remote_new(0, NULL);
    ck_file a = open_in(r1, f, "fake://object", NULL), b = open_in(r2, f, "fake://object", NULL);
    read_ok(&a, 4096, 8ull << 20);
    cr_expect_eq(fetched(f), BC_FLOOR);
    read_ok(&a, 4096, 8ull << 20); /* held in r1's cache */
    cr_expect_eq(fetched(f), BC_FLOOR);
    read_ok(&b, 4096, 8ull << 20); /* not in r2's: fetched again */
    cr_expect_eq(fetched(f), 2 * BC_FLOOR);
    ck_source_close(&a);
    http_remote_free(r1);
    read_ok(&b, 4096, 8ull << 20); /* r2 goes on without r1 */
    cr_expect_eq(fetched(f), 2 * BC_FLOOR);
    ck_source_close(&b);
    http_remote_free(r2);
    free(f);
}
