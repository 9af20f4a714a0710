/* direct.c — the cold-read policy (direct.h): which files are read O_DIRECT, their phase, and
 * the reads of whole blocks around a chunk. */
#include "direct.h"

#include "../base/bytes.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Fraction of the data region's pages in the page cache, from a sample of up to 64 windows of
 * 4 MiB (mincore on a throwaway mapping); 1 when it cannot tell, e.g. where mmap is refused. */
static double cached_fraction(int fd, uint64_t off, uint64_t len)
{
    enum { WINDOW = 4 << 20, SAMPLES = 64 };
    unsigned char *vec = malloc(WINDOW / 4096);
    uint64_t resident = 0, pages = 0, step = len / SAMPLES > WINDOW ? len / SAMPLES : WINDOW;
    step = ck_align_up(step, DIRECT_ALIGN); /* mmap offsets must be page-aligned (else EINVAL) */
    int ok = vec != NULL;
    for (uint64_t at = direct_start(off); ok && at < off + len; at += step) {
        size_t n = off + len - at < WINDOW ? (size_t)(off + len - at) : WINDOW;
        void *m = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, (off_t)at);
        ok = m != MAP_FAILED && mincore(m, n, vec) == 0;
        if (m != MAP_FAILED)
            munmap(m, n);
        for (size_t i = 0; ok && i < (n + 4095) / 4096; i++)
            resident += vec[i] & 1, pages++;
    }
    free(vec);
    return ok && pages ? (double)resident / (double)pages : 1;
}

/* Whether O_DIRECT pays for source file f: most of the bytes the plan reads from it in place (not
 * gathered) are not in the page cache, and reading them through it would copy them twice. Where
 * they land does not matter: out of phase they cross the bounce and a copy, still faster than
 * the page cache (BENCHMARKS.md, "cold sources through 2 MiB bounce pages"). */
static int direct_pays(const ck_index *ix, const ck_plan *p, uint32_t f)
{
    uint64_t lo = UINT64_MAX, hi = 0;
    for (size_t b = 0; b < p->nblobs; b++) {
        const ck_plan_blob *bl = &p->blobs[b];
        if (bl->file != f || bl->gather)
            continue;
        lo = bl->file_off < lo ? bl->file_off : lo;
        hi = bl->file_off + bl->len > hi ? bl->file_off + bl->len : hi;
    }
    return lo < hi && cached_fraction(ix->files[f].fd, lo, hi - lo) < 0.5;
}

/* The memory alignment O_DIRECT reads of fd need, as the kernel tells it (statx: 512 bytes on a
 * disk of 512-byte sectors), or DIRECT_ALIGN where it does not tell or asks for more than the
 * reads' own DIRECT_ALIGN alignment gives. */
static uint32_t direct_phase(int fd)
{
#ifdef STATX_DIOALIGN
    struct statx sx;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
        uint32_t m = sx.stx_dio_mem_align;
        if (m && !(m & (m - 1)) && m <= DIRECT_ALIGN && sx.stx_dio_offset_align <= DIRECT_ALIGN)
            return m;
    }
#endif
    return DIRECT_ALIGN;
}

/* An O_DIRECT descriptor for source file f when direct_pays (or CKLOAD_DIRECT says), else -1;
 * also -1 where O_DIRECT is refused or the path is no longer the file the index opened. */
static int open_file(const ck_index *ix, const ck_plan *p, uint32_t f)
{
    const char *force = getenv("CKLOAD_DIRECT");
    const ck_file *cf = &ix->files[f];
    if (!ck_file_is_local(cf)) /* a URL: read with ck_file_pread only (source.h) */
        return -1;
    if (force ? strcmp(force, "1") != 0 : !direct_pays(ix, p, f))
        return -1;
    int fd = open(cf->path, O_RDONLY | O_DIRECT | O_NONBLOCK | O_CLOEXEC); /* a FIFO: no wait */
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || !ck_file_matches(cf, &st))) {
        close(fd);
        fd = -1;
    }
    return fd;
}

int direct_open(direct_files *d, const ck_index *ix, const ck_plan *p)
{
    size_t n = ix->nfiles ? ix->nfiles : 1;
    d->fds = malloc(n * sizeof *d->fds);
    d->phase = calloc(n, sizeof *d->phase);
    if (!d->fds || !d->phase)
        return -1;
    d->nfiles = ix->nfiles;
    for (uint32_t f = 0; f < ix->nfiles; f++) {
        d->fds[f] = open_file(ix, p, f);
        d->phase[f] = d->fds[f] >= 0 ? direct_phase(d->fds[f]) : 0;
        d->any |= d->fds[f] >= 0;
    }
    return 0;
}

void direct_close(direct_files *d)
{
    for (uint32_t f = 0; d->fds && f < d->nfiles; f++)
        if (d->fds[f] >= 0) {
            close(d->fds[f]);
            d->fds[f] = -1;
        }
}

void direct_free(direct_files *d)
{
    direct_close(d);
    free(d->fds);
    free(d->phase);
    *d = (direct_files){0};
}

int direct_pread(int fd, unsigned char *buf, uint64_t off, size_t n)
{
    uint64_t start = direct_start(off);
    return ck_pread_min(fd, buf, (size_t)ck_align_up(off + n - start, DIRECT_ALIGN), start,
                        (size_t)(off + n - start));
}
