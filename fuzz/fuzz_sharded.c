/* fuzz_sharded.c — a Hugging Face shard directory: model.safetensors.index.json and the shards
 * it names, or every *.safetensors file when it is absent (st_open_dir).
 *
 * The input is split into files at each SEP (4 bytes that no seed holds by chance). Each piece
 * is "NAME\nCONTENTS"; a piece whose name is not made of [A-Za-z0-9._-], starts with '.', or is
 * longer than 64 bytes is dropped. The files go into one directory per process, emptied after
 * each input. gen_seeds.py writes seeds in this form. */
#include "../pack/safetensors.h"
#include "fuzz.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SEP "\0FZ\0"
#define SEP_LEN 4
#define MAX_FILES 16

static char dir[PATH_MAX];
static int dirfd = -1;

/* The work directory, made on first use; dirfd stays open on it. */
static const char *work_dir(void)
{
    if (!dir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/ckptfs-fuzz-sharded-XXXXXX",
                 base && *base ? base : access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
        FUZZ_REQUIRE(mkdtemp(dir) != NULL);
        dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        FUZZ_REQUIRE(dirfd >= 0);
    }
    return dir;
}

static void remove_dir(void)
{
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

/* Writes one piece as a file in the work directory; returns its name in out, or "" if dropped. */
static void write_piece(const uint8_t *p, size_t n, char out[65])
{
    out[0] = 0;
    const uint8_t *nl = memchr(p, '\n', n);
    if (!nl || !plain_name(p, (size_t)(nl - p)))
        return;
    memcpy(out, p, (size_t)(nl - p));
    out[nl - p] = 0;
    work_dir();
    int fd = openat(dirfd, out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    FUZZ_REQUIRE(fd >= 0);
    const uint8_t *body = nl + 1;
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int registered;
    if (!registered) {
        registered = 1;
        atexit(remove_dir);
    }
    char names[MAX_FILES][65];
    size_t nfiles = 0;
    while (nfiles < MAX_FILES) {
        const uint8_t *sep = find_sep(data, size);
        size_t n = sep ? (size_t)(sep - data) : size;
        write_piece(data, n, names[nfiles]);
        nfiles++;
        if (!sep)
            break;
        size -= n + SEP_LEN;
        data = sep + SEP_LEN;
    }
    ck_error err = {{0}};
    ck_index *ix = NULL;
    int rc = st_open_dir(work_dir(), &ix, &err);
    FUZZ_REQUIRE((rc == 0) == (ix != NULL));
    fuzz_check(rc, ix, &err);
    ck_index_free(ix);
    for (size_t i = 0; i < nfiles; i++)
        if (names[i][0])
            unlinkat(dirfd, names[i], 0);
    return 0;
}
