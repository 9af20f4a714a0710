/* diskcache.c — a directory of remote objects' blocks, shared by processes (diskcache.h). */
#include "diskcache.h"
#include "../base/bytes.h"
#include "../base/location.h" /* ck_location_shown: the key's URL, without its secrets */
#include "source.h"   /* ck_pread, ck_write_all */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack: dc_get streams */
#include <xxhash.h>

static const char MAGIC[8] = "ckdcblk1";
static const char TMP_PREFIX[] = ".ckdc-tmp-";
enum { STALE_TMP_S = 3600,   /* a temporary file this old was left by a crash */
       TMP_NAME_MAX = sizeof TMP_PREFIX + 32,
       PASS_CHUNK = 64 << 10 };   /* dc_get: the bytes outside the range asked pass through this */

struct diskcache {
    char *dir;
    int dfd;                  /* DIR, for the *at calls: a rename of DIR does not split us */
    uint64_t max, slack;      /* the bound; how far below it an eviction goes */
    dc_log log;
    pthread_mutex_t lock;     /* estimate, pending, since_scan */
    uint64_t estimate;        /* bytes in DIR: the last scan plus this process's writes since */
    uint64_t pending;         /* bytes of this process's writes in progress (temporary files) */
    uint64_t since_scan;      /* bytes written since that scan */
    atomic_int warned;        /* a write failed and was reported */
};

/* --- keys, names, headers ------------------------------------------------------------------ */

/* An XXH3-128 hash as 16 bytes, low half first: how keys and checksums are written. */
static void put_hash(unsigned char out[16], XXH128_hash_t h)
{
    put_le64(out, h.low64);
    put_le64(out + 8, h.high64);
}

int dc_key_of(const char *url, const char *etag, const char *last_modified, uint64_t size,
              dc_key *k)
{
    if (!etag[0] && !last_modified[0])
        return -1;
    char shown[CK_SHOWN_MAX];
    if (strlen(ck_location_shown(url, shown, sizeof shown)) + 1 >= sizeof shown)
        return -1; /* cut: another object's URL could be cut to the same text */
    char *text = NULL;
    int n = asprintf(&text, "%s\n%c%s\n%llu", shown, etag[0] ? 'E' : 'L',
                     etag[0] ? etag : last_modified, (unsigned long long)size);
    if (n < 0)
        return -1;
    put_hash(k->hash, XXH3_128bits(text, (size_t)n));
    free(text);
    return 0;
}

void dc_name(const dc_key *k, uint64_t index, char *out)
{
    char *p = out;
    for (int i = 0; i < 16; i++)
        p += sprintf(p, "%02x", k->hash[i]);
    snprintf(p, DC_NAME_MAX - 32, "-%016llx", (unsigned long long)index);
}

/* Whether name is one dc_name makes: 32 hex digits, '-', 16 hex digits. */
static int is_block_name(const char *name)
{
    for (int i = 0; i < 49; i++) {
        char c = name[i];
        int hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
        if (i == 32 ? c != '-' : !hex)
            return 0;
    }
    return name[49] == 0;
}

/* Layout: magic (8), key hash (16), index (8), length (8), XXH3-128 of the bytes (16), zeros. */
enum { SUM_AT = 40, SUM_END = SUM_AT + 16 };

/* The header of block `index` of k, len bytes long, but for its checksum (zeros). */
static void header_fields(unsigned char h[DC_HEADER], const dc_key *k, uint64_t index,
                          size_t len)
{
    memset(h, 0, DC_HEADER);
    memcpy(h, MAGIC, 8);
    memcpy(h + 8, k->hash, 16);
    put_le64(h + 24, index);
    put_le64(h + 32, len);
}

void dc_header(unsigned char h[DC_HEADER], const dc_key *k, uint64_t index, const void *data,
               size_t len)
{
    header_fields(h, k, index, len);
    put_hash(h + SUM_AT, XXH3_128bits(data, len));
}

/* Whether h's fields (all but the checksum) are those of block `index` of k, len bytes long. */
static int header_matches(const unsigned char h[DC_HEADER], const dc_key *k, uint64_t index,
                          size_t len)
{
    unsigned char want[DC_HEADER];
    header_fields(want, k, index, len);
    return memcmp(h, want, SUM_AT) == 0 &&
           memcmp(h + SUM_END, want + SUM_END, DC_HEADER - SUM_END) == 0;
}

int dc_check(const unsigned char h[DC_HEADER], const dc_key *k, uint64_t index,
             const void *data, size_t len)
{
    if (!header_matches(h, k, index, len))
        return 0; /* checked before the bytes: another key's file costs no checksum */
    unsigned char sum[16];
    put_hash(sum, XXH3_128bits(data, len));
    return memcmp(h + SUM_AT, sum, 16) == 0;
}

/* --- the directory ------------------------------------------------------------------------ */

static void to_stderr(const char *line)
{
    fprintf(stderr, "%s: %s\n", program_invocation_short_name, line);
}

static void report(diskcache *c, const char *what, int e)
{
    if (atomic_exchange(&c->warned, 1))
        return;
    char line[1024];
    char shown[512];
    snprintf(line, sizeof line, "%s: disk cache: %s (%s): blocks come from the network",
             ck_location_shown(c->dir, shown, sizeof shown), what, strerror(e));
    c->log(line);
}

/* One file of DIR, as a scan sees it. */
typedef struct entry {
    struct timespec used;
    uint64_t bytes;
    char name[DC_NAME_MAX];
} entry;

static int older(const void *a, const void *b)
{
    const struct timespec *x = &((const entry *)a)->used, *y = &((const entry *)b)->used;
    return x->tv_sec != y->tv_sec ? (x->tv_sec < y->tv_sec ? -1 : 1)
                                  : (x->tv_nsec > y->tv_nsec) - (x->tv_nsec < y->tv_nsec);
}

/* The temporary file of this process's write number `serial`, into out (TMP_NAME_MAX bytes);
 * with serial -1, the prefix of them all. */
static void tmp_name(char *out, long serial)
{
    int n = snprintf(out, TMP_NAME_MAX, "%s%ld.", TMP_PREFIX, (long)getpid());
    if (serial >= 0)
        snprintf(out + n, TMP_NAME_MAX - (size_t)n, "%ld", serial);
}

/* Counts the block files in DIR, and other processes' temporary files (writes in progress:
 * this process's are its pending bytes), into *total, the block files into *v (*n of them);
 * removes temporary files a crash left. 0, or -1 when DIR cannot be read. */
static int scan(diskcache *c, entry **v, size_t *n, uint64_t *total)
{
    int fd = openat(c->dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    size_t cap = 0;
    *v = NULL;
    *n = 0;
    *total = 0;
    time_t now = time(NULL);
    char mine[TMP_NAME_MAX];
    tmp_name(mine, -1);
    struct dirent *e;
    while ((e = readdir(d))) {
        int tmp = strncmp(e->d_name, TMP_PREFIX, sizeof TMP_PREFIX - 1) == 0;
        struct stat st;
        if ((!tmp && !is_block_name(e->d_name)) ||
            fstatat(c->dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (tmp && now - st.st_mtime > STALE_TMP_S) {
            unlinkat(c->dfd, e->d_name, 0);
            continue;
        }
        if (!tmp || strncmp(e->d_name, mine, strlen(mine)) != 0)
            *total += (uint64_t)st.st_size;
        if (tmp)
            continue; /* never evicted: its writer renames it */
        if (*n == cap) {
            cap = cap ? 2 * cap : 256;
            entry *w = realloc(*v, cap * sizeof *w);
            if (!w)
                break; /* counted so far; the rest waits for the next scan */
            *v = w;
        }
        (*v)[*n] = (entry){.used = st.st_mtim, .bytes = (uint64_t)st.st_size};
        memcpy((*v)[*n].name, e->d_name, 50); /* is_block_name: 49 characters and NUL */
        ++*n;
    }
    closedir(d);
    return 0;
}

/* Scans DIR and, when `incoming` more bytes would pass max, removes the least recently used
 * files until they fit max - slack. Sets the estimate (without incoming). Under c->lock. */
static void scan_and_evict(diskcache *c, uint64_t incoming)
{
    entry *v;
    size_t n;
    uint64_t total;
    if (scan(c, &v, &n, &total) != 0)
        return;
    if (total + incoming > c->max) {
        uint64_t target = c->max - c->slack > incoming ? c->max - c->slack - incoming : 0;
        if (n > 1) /* v is NULL when DIR holds no block: only others' writes in progress */
            qsort(v, n, sizeof *v, older);
        for (size_t i = 0; i < n && total > target; i++)
            if (unlinkat(c->dfd, v[i].name, 0) == 0 || errno == ENOENT) /* or another's */
                total -= v[i].bytes;
    }
    free(v);
    c->estimate = total;
    c->since_scan = 0;
}

diskcache *dc_open(const char *dir, uint64_t max, dc_log log, ck_error *err)
{
    err->msg[0] = 0;
    diskcache *c = calloc(1, sizeof *c);
    if (!c || !(c->dir = strdup(dir))) {
        free(c);
        return NULL;
    }
    c->log = log ? log : to_stderr;
    c->max = max ? max : DC_MAX_DEFAULT;
    c->slack = c->max / 8;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        report(c, "cannot create the directory", errno);
        goto off;
    }
    c->dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (c->dfd < 0) {
        if (errno == ENOTDIR)
            ck_fail(err, dir, "not a directory (the disk cache's directory)");
        else
            report(c, "cannot open the directory", errno);
        goto off;
    }
    /* The checksums catch damage, not a forger: whoever may write DIR chooses what is read. */
    struct stat st;
    if (fstat(c->dfd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 022)) {
        report(c, "not private (another user's, or writable by group or others)", EPERM);
        close(c->dfd);
        goto off;
    }
    pthread_mutex_init(&c->lock, NULL);
    scan_and_evict(c, 0);
    return c;
off:
    free(c->dir);
    free(c);
    return NULL;
}

void dc_close(diskcache *c)
{
    if (!c)
        return;
    close(c->dfd);
    pthread_mutex_destroy(&c->lock);
    free(c->dir);
    free(c);
}

/* Reads the len bytes after fd's header into a running checksum: those in [from, to) straight
 * into block at their place, the others through a small buffer of the stack's. 0, or -1. */
static int read_summed(int fd, unsigned char *block, size_t len, size_t from, size_t to,
                       unsigned char sum[16])
{
    unsigned char pass[PASS_CHUNK];
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    for (size_t pos = 0; pos < len;) {
        int inside = pos >= from && pos < to;
        size_t end = inside ? to : pos < from ? from : len;
        end = !inside && end - pos > sizeof pass ? pos + sizeof pass : end;
        unsigned char *dst = inside ? block + pos : pass;
        if (ck_pread(fd, dst, end - pos, DC_HEADER + pos) != 0)
            return -1;
        XXH3_128bits_update(&st, dst, end - pos);
        pos = end;
    }
    put_hash(sum, XXH3_128bits_digest(&st));
    return 0;
}

int dc_get(diskcache *c, const dc_key *k, uint64_t index, unsigned char *block, size_t len,
           size_t from, size_t n)
{
    char name[DC_NAME_MAX];
    dc_name(k, index, name);
    /* O_NONBLOCK: a FIFO planted at the name must not block the open; it is no regular file,
     * so a miss (and removed) */
    int fd = openat(c->dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return -1;
    unsigned char h[DC_HEADER], sum[16];
    struct stat st;
    int ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
             (uint64_t)st.st_size == DC_HEADER + (uint64_t)len &&
             ck_pread(fd, h, DC_HEADER, 0) == 0 && header_matches(h, k, index, len) &&
             read_summed(fd, block, len, from, from + n, sum) == 0 &&
             memcmp(h + SUM_AT, sum, 16) == 0;
    if (ok)
        futimens(fd, NULL); /* used now: the last to be evicted (fails harmlessly read-only) */
    else
        unlinkat(c->dfd, name, 0); /* damaged, or another's: whoever fetches it writes it anew */
    close(fd);
    return ok ? 0 : -1;
}

/* Reserves room for bytes more in DIR, evicting when they would not fit; 0, or -1 when they
 * do not fit even so (this process's other writes in progress fill it): not stored. */
static int reserve(diskcache *c, uint64_t bytes)
{
    pthread_mutex_lock(&c->lock);
    if (c->estimate + c->pending + bytes > c->max || c->since_scan >= c->slack)
        scan_and_evict(c, c->pending + bytes);
    int fits = c->estimate + c->pending + bytes <= c->max;
    if (fits) {
        c->pending += bytes;
        c->since_scan += bytes;
    }
    pthread_mutex_unlock(&c->lock);
    return fits ? 0 : -1;
}

/* A reserved write is over: its bytes are in DIR (stored) or not. */
static void settle(diskcache *c, uint64_t bytes, int stored)
{
    pthread_mutex_lock(&c->lock);
    c->pending -= bytes;
    c->estimate += stored ? bytes : 0;
    pthread_mutex_unlock(&c->lock);
}

void dc_put(diskcache *c, const dc_key *k, uint64_t index, const void *data, size_t len)
{
    uint64_t bytes = DC_HEADER + (uint64_t)len;
    if (bytes > c->max - c->slack)
        return; /* it would evict everything else, and then itself */
    if (reserve(c, bytes) != 0)
        return;
    unsigned char h[DC_HEADER];
    dc_header(h, k, index, data, len);
    char tmp[TMP_NAME_MAX], name[DC_NAME_MAX];
    dc_name(k, index, name);
    static atomic_uint serial; /* with the pid, unique among the writes in progress */
    tmp_name(tmp, (long)atomic_fetch_add(&serial, 1));
    int fd = openat(c->dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    int e = fd < 0 ? errno : -ck_write_all(fd, h, DC_HEADER);
    if (!e)
        e = -ck_write_all(fd, data, len);
    int ok = !e;
    if (fd >= 0 && close(fd) != 0 && ok)
        ok = 0, e = errno;
    if (ok && renameat(c->dfd, tmp, c->dfd, name) != 0)
        ok = 0, e = errno;
    settle(c, bytes, ok);
    if (!ok) {
        if (fd >= 0)
            unlinkat(c->dfd, tmp, 0);
        report(c, "cannot write a block", e);
    }
}
