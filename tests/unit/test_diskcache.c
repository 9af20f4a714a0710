/* The disk cache without a server (diskcache.h): what a key is made of and what it leaves out,
 * the names it gives files, a block's header and checksum, and a directory's files: a damaged
 * one is a miss and is removed, and the bound evicts the least recently used. Expectations come
 * from the header's contract; byte checks from the bytes the test wrote. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../sources/diskcache.h"
#include "helpers.h"

/* Removes the files the cache wrote into dir, so that tmp_cleanup can remove dir. */
static void empty_dir(const char *dir)
{
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            unlink(strf("%s/%s", dir, e->d_name));
    if (d)
        closedir(d);
}

static void cleanup(void)
{
    tmp_cleanup();
}

TestSuite(diskcache, .fini = cleanup);

static dc_key key(const char *url, const char *etag, const char *lm, uint64_t size)
{
    dc_key k;
    cr_assert_eq(dc_key_of(url, etag, lm, size, &k), 0, "%s", url);
    return k;
}

static int same(dc_key a, dc_key b)
{
    return memcmp(a.hash, b.hash, sizeof a.hash) == 0;
}

Test(diskcache, key_is_the_url_without_its_secrets_the_validator_and_the_size)
{
    dc_key k = key("https://h.example/m.safetensors", "\"e1\"", "", 100);
    cr_expect(same(k, key("https://user:pw@h.example/m.safetensors?X-Amz-Signature=s1#frag",
                          "\"e1\"", "", 100)), "userinfo, query and fragment are not the object");
    cr_expect(same(k, key("https://h.example/m.safetensors?X-Amz-Signature=s2", "\"e1\"",
                          "Tue, 01 Jan 2030 00:00:00 GMT", 100)), "an ETag wins over a date");
    cr_expect(!same(k, key("https://h.example/m.safetensors", "\"e2\"", "", 100)), "new ETag");
    cr_expect(!same(k, key("https://h.example/m.safetensors", "\"e1\"", "", 101)), "size");
    cr_expect(!same(k, key("https://h.example/n.safetensors", "\"e1\"", "", 100)), "path");
    cr_expect(!same(k, key("https://g.example/m.safetensors", "\"e1\"", "", 100)), "host");
    cr_expect(!same(k, key("https://h.example/m.safetensors", "", "\"e1\"", 100)),
              "a date is not an ETag that reads the same");
    dc_key none;
    cr_expect_eq(dc_key_of("https://h.example/m", "", "", 100, &none), -1, "no validator");
}

Test(diskcache, names_are_hex_of_the_key_and_the_index)
{
    dc_key k = key("https://h.example/m?secret=hunter2", "\"e\"", "", 1);
    char name[DC_NAME_MAX];
    dc_name(&k, 0x2a, name);
    cr_assert_eq(strlen(name), 49, "%s", name);
    cr_expect_str_eq(name + 32, "-000000000000002a");
    for (int i = 0; i < 32; i++)
        cr_expect(strchr("0123456789abcdef", name[i]) != NULL, "%s", name);
    char other[DC_NAME_MAX];
    dc_name(&k, 0x2b, other);
    cr_expect(strncmp(name, other, 32) == 0 && strcmp(name, other) != 0);
}

Test(diskcache, header_checks_every_field_and_the_bytes)
{
    dc_key k = key("http://h/m", "\"e\"", "", 9), k2 = key("http://h/m", "\"f\"", "", 9);
    unsigned char data[1000], h[DC_HEADER];
    fill_bytes(data, sizeof data, 7);
    dc_header(h, &k, 3, data, sizeof data);
    cr_expect(dc_check(h, &k, 3, data, sizeof data));
    cr_expect(!dc_check(h, &k2, 3, data, sizeof data), "another key");
    cr_expect(!dc_check(h, &k, 4, data, sizeof data), "another block");
    cr_expect(!dc_check(h, &k, 3, data, sizeof data - 1), "another length");
    data[500] ^= 1;
    cr_expect(!dc_check(h, &k, 3, data, sizeof data), "a flipped bit in the bytes");
    data[500] ^= 1;
    for (size_t i = 0; i < DC_HEADER; i++) {
        h[i] ^= 0x10;
        cr_expect(!dc_check(h, &k, 3, data, sizeof data), "a flipped bit at header byte %zu", i);
        h[i] ^= 0x10;
    }
}

/* Bytes of the files in dir (temporary ones too), *files of them. Safe from many threads. */
static size_t dir_bytes(const char *dir, size_t *files)
{
    size_t total = 0;
    *files = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && stat(path, &st) == 0)
            total += (size_t)st.st_size, ++*files;
    }
    if (d)
        closedir(d);
    return total;
}

Test(diskcache, stores_and_finds_a_block_and_keeps_no_secret)
{
    const char *dir = tmp_path_in(tmp_dir(), "cache"); /* created by dc_open */
    ck_error err;
    diskcache *c = dc_open(dir, 0, NULL, &err);
    cr_assert(c, "%s", err.msg);
    struct stat st;
    cr_assert_eq(stat(dir, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0700);
    dc_key k = key("https://h/m?sig=hunter2", "\"e\"", "", 5000);
    unsigned char data[5000], got[5000];
    fill_bytes(data, sizeof data, 1);
    cr_expect_eq(dc_get(c, &k, 0, got, sizeof got, 0, sizeof got), -1, "empty");
    dc_put(c, &k, 0, data, sizeof data);
    cr_expect_eq(dc_get(c, &k, 0, got, sizeof got, 0, sizeof got), 0);
    cr_expect(memcmp(got, data, sizeof data) == 0);
    cr_expect_eq(dc_get(c, &k, 1, got, sizeof got, 0, sizeof got), -1, "another block");
    char name[DC_NAME_MAX];
    dc_name(&k, 0, name);
    size_t len, files;
    unsigned char *file = read_whole(strf("%s/%s", dir, name), &len);
    cr_expect_eq(len, DC_HEADER + sizeof data);
    cr_expect(memmem(file, len, "hunter2", 7) == NULL && memmem(file, len, "https", 5) == NULL);
    free(file);
    cr_expect_eq(dir_bytes(dir, &files), DC_HEADER + sizeof data);
    cr_expect_eq(files, 1, "no temporary file is left");
    cr_expect_eq(dc_get(c, &k, 0, got, sizeof got - 1, 0, sizeof got - 1), -1,
                 "another length: damaged");
    cr_expect_eq(dir_bytes(dir, &files), 0, "and removed");
    dc_close(c);
    empty_dir(dir);
}

/* Rewrites byte `at` of dir's file for block 0 of k (or cuts the file there when cut). */
static void damage(const char *dir, const dc_key *k, size_t at, int cut)
{
    char name[DC_NAME_MAX];
    dc_name(k, 0, name);
    const char *path = strf("%s/%s", dir, name);
    size_t len;
    unsigned char *file = read_whole(path, &len);
    cr_assert(at < len);
    file[at] ^= 0x40;
    int fd = open(path, O_WRONLY | O_TRUNC);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, file, cut ? at : len), (ssize_t)(cut ? at : len));
    close(fd);
    free(file);
}

/* A range of a block (a run of http.c's pages): only its bytes are written, and the whole file's
 * checksum still decides (a flipped byte outside the range is a miss). Larger than the buffer
 * the other bytes pass through, so that they take several passes. */
Test(diskcache, a_range_writes_only_its_bytes_and_checks_the_whole_file)
{
    const char *dir = tmp_dir();
    ck_error err;
    diskcache *c = dc_open(dir, 0, NULL, &err);
    cr_assert(c, "%s", err.msg);
    enum { LEN = 300000, FROM = 70001, N = 50000 };
    dc_key k = key("https://h/m", "\"e\"", "", LEN);
    unsigned char *data = malloc(LEN), *got = malloc(LEN);
    cr_assert(data && got);
    fill_bytes(data, LEN, 4);
    dc_put(c, &k, 0, data, LEN);
    memset(got, 0xAA, LEN);
    cr_expect_eq(dc_get(c, &k, 0, got, LEN, FROM, N), 0);
    cr_expect(memcmp(got + FROM, data + FROM, N) == 0);
    size_t untouched = 0;
    for (size_t i = 0; i < LEN; i++)
        untouched += (i < FROM || i >= FROM + N) && got[i] == 0xAA;
    cr_expect_eq(untouched, LEN - N, "bytes outside the range are not written");
    damage(dir, &k, DC_HEADER + 250000, 0);
    cr_expect_eq(dc_get(c, &k, 0, got, LEN, FROM, N), -1, "damage outside the range");
    size_t files;
    cr_expect_eq(dir_bytes(dir, &files), 0, "and removed");
    free(data);
    free(got);
    dc_close(c);
    empty_dir(dir);
}

Test(diskcache, a_damaged_file_is_a_miss_and_is_removed)
{
    const char *dir = tmp_dir();
    ck_error err;
    diskcache *c = dc_open(dir, 0, NULL, &err);
    cr_assert(c, "%s", err.msg);
    dc_key k = key("https://h/m", "\"e\"", "", 5000);
    unsigned char data[3000], got[3000];
    fill_bytes(data, sizeof data, 2);
    size_t cases[][2] = {{DC_HEADER + 1234, 0}, {DC_HEADER + 1234, 1}, {10, 0}, {30, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        dc_put(c, &k, 0, data, sizeof data);
        damage(dir, &k, cases[i][0], (int)cases[i][1]);
        cr_expect_eq(dc_get(c, &k, 0, got, sizeof got, 0, sizeof got), -1, "case %zu", i);
        size_t files;
        cr_expect_eq(dir_bytes(dir, &files), 0, "case %zu: removed", i);
    }
    dc_close(c);
    empty_dir(dir);
}

/* A FIFO planted at a block's name (no writer ever comes) would block a reader's open for good:
 * it is a miss, at once, and removed (the test's timeout catches a hang). */
Test(diskcache, a_fifo_at_a_blocks_name_is_a_miss_not_a_hang, .timeout = 20)
{
    const char *dir = tmp_dir();
    ck_error err;
    diskcache *c = dc_open(dir, 0, NULL, &err);
    cr_assert(c, "%s", err.msg);
    dc_key k = key("https://h/m", "\"e\"", "", 5000);
    char name[DC_NAME_MAX];
    dc_name(&k, 0, name);
    cr_assert_eq(mkfifo(strf("%s/%s", dir, name), 0600), 0);
    unsigned char got[3000];
    cr_expect_eq(dc_get(c, &k, 0, got, sizeof got, 0, sizeof got), -1);
    struct stat st;
    cr_expect_neq(lstat(strf("%s/%s", dir, name), &st), 0, "the FIFO is removed");
    dc_close(c);
    empty_dir(dir);
}

Test(diskcache, the_bound_evicts_the_least_recently_used)
{
    const char *dir = tmp_dir();
    enum { LEN = 4096, FILE_BYTES = DC_HEADER + LEN, MAX = 16 * FILE_BYTES };
    ck_error err;
    diskcache *c = dc_open(dir, MAX, NULL, &err);
    cr_assert(c, "%s", err.msg);
    dc_key k = key("https://h/m", "\"e\"", "", 1 << 30);
    unsigned char data[LEN], got[LEN];
    char name[DC_NAME_MAX];
    for (uint64_t i = 0; i < 16; i++) {
        fill_bytes(data, sizeof data, (uint32_t)i);
        dc_put(c, &k, i, data, sizeof data);
        /* Ages set here, not by the clock: file times are coarse. Block i is i hours old... */
        dc_name(&k, i, name);
        struct timespec t[2] = {{.tv_sec = 1000000 - (time_t)i * 3600}, {0}};
        t[1] = t[0];
        cr_assert_eq(utimensat(AT_FDCWD, strf("%s/%s", dir, name), t, 0), 0);
    }
    /* ... and the oldest, block 15, is used now: the last to go. */
    cr_expect_eq(dc_get(c, &k, 15, got, sizeof got, 0, sizeof got), 0);
    size_t files;
    for (uint64_t i = 16; i < 24; i++) { /* fewer than 16: what is used now stays */
        dc_put(c, &k, i, data, sizeof data);
        cr_expect_leq(dir_bytes(dir, &files), (size_t)MAX, "after block %llu",
                      (unsigned long long)i);
    }
    cr_expect_eq(dc_get(c, &k, 15, got, sizeof got, 0, sizeof got), 0, "used most recently: kept");
    fill_bytes(data, sizeof data, 15);
    cr_expect(memcmp(got, data, sizeof data) == 0);
    cr_expect_eq(dc_get(c, &k, 14, got, sizeof got, 0, sizeof got), -1, "older: evicted");
    dc_close(c);
    /* A new process counts what is there. */
    c = dc_open(dir, 4 * FILE_BYTES, NULL, &err);
    cr_assert(c);
    dc_put(c, &k, 99, data, sizeof data);
    cr_expect_leq(dir_bytes(dir, &files), (size_t)4 * FILE_BYTES);
    dc_close(c);
    empty_dir(dir);
}

enum { RACE_LEN = 4096, RACE_MAX = 4 * (DC_HEADER + RACE_LEN), RACE_THREADS = 8 };

typedef struct racer {
    diskcache *c;
    const char *dir;
    uint64_t first;
    size_t worst; /* the most bytes this thread saw in dir */
} racer;

static void *race(void *arg)
{
    racer *r = arg;
    dc_key k = key("https://h/m", "\"e\"", "", 1 << 30);
    unsigned char data[RACE_LEN] = {0};
    for (uint64_t i = r->first; i < r->first + 16; i++) {
        dc_put(r->c, &k, i, data, sizeof data);
        size_t files, now = dir_bytes(r->dir, &files);
        r->worst = now > r->worst ? now : r->worst;
    }
    return NULL;
}

Test(diskcache, concurrent_writers_of_one_process_stay_within_the_bound)
{
    const char *dir = tmp_dir();
    ck_error err;
    diskcache *c = dc_open(dir, RACE_MAX, NULL, &err);
    cr_assert(c, "%s", err.msg);
    racer r[RACE_THREADS];
    pthread_t t[RACE_THREADS];
    for (int i = 0; i < RACE_THREADS; i++) {
        r[i] = (racer){.c = c, .dir = dir, .first = 100 * (uint64_t)i};
        cr_assert_eq(pthread_create(&t[i], NULL, race, &r[i]), 0);
    }
    for (int i = 0; i < RACE_THREADS; i++) {
        pthread_join(t[i], NULL);
        cr_expect_leq(r[i].worst, (size_t)RACE_MAX, "thread %d saw %zu bytes", i, r[i].worst);
    }
    size_t files;
    cr_expect_leq(dir_bytes(dir, &files), (size_t)RACE_MAX);
    cr_expect_gt(files, 0);
    dc_close(c);
    empty_dir(dir);
}

Test(diskcache, foreign_files_in_the_directory_are_left_alone)
{
    const char *dir = tmp_dir();
    tmp_file_in(dir, "notes.txt", "mine", 4);
    ck_error err;
    enum { LEN = 4096 };
    diskcache *c = dc_open(dir, 4 * (DC_HEADER + LEN), NULL, &err);
    cr_assert(c, "%s", err.msg);
    dc_key k = key("https://h/m", "\"e\"", "", 1 << 30);
    unsigned char data[LEN] = {0};
    for (uint64_t i = 0; i < 10; i++)
        dc_put(c, &k, i, data, sizeof data);
    struct stat st;
    cr_expect_eq(stat(strf("%s/notes.txt", dir), &st), 0);
    dc_close(c);
    empty_dir(dir);
}

Test(diskcache, a_directory_that_is_a_file_is_refused)
{
    const char *file = tmp_file("x", 1);
    ck_error err;
    cr_expect_null(dc_open(file, 0, NULL, &err));
    cr_expect(strstr(err.msg, "not a directory") != NULL, "%s", err.msg);
    cr_expect(strchr(err.msg, '\n') == NULL);
}
