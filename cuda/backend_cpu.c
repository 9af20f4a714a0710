/* backend_cpu.c — loads into host memory: reader threads read straight into the block, which
 * needs no staging (in_place: the core does it, O_DIRECT included where a chunk's place in the
 * block has the file's 4096-byte phase); only O_DIRECT reads of other chunks (a blob's partial
 * first and last pages, blobs out of phase) go through an aligned bounce buffer and a copy. */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* 2 MiB pages unless CKLOAD_HUGEPAGES=0. Measured on the 2-core VM of BENCHMARKS.md: a first
 * touch of fresh anonymous memory costs the same with either page size when the hypervisor has
 * taken the memory back (0.5-0.7 GB/s a thread), and huge pages are 5-10x faster when it has
 * not (memory freed a moment before); so huge pages by default, and a switch to compare. */
static int huge_pages(void)
{
    const char *v = getenv("CKLOAD_HUGEPAGES");
    return !v || strcmp(v, "0") != 0;
}

struct reader {
    ckl_load *load;
    unsigned char *bounce; /* NULL unless reads are O_DIRECT */
};

static int cpu_check(int ordinal, char *why, size_t len)
{
    (void)ordinal, (void)why, (void)len;
    return 0;
}

/* Anonymous memory, page-aligned (so a chunk's place can share the file's 4096-byte phase), with
 * huge pages where the kernel has them and huge_pages() says: filling a fresh block costs a page
 * fault per page, and 2 MiB pages make those 512 times fewer. */
static void *cpu_alloc(int ordinal, size_t n, char *why, size_t len)
{
    (void)ordinal;
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        snprintf(why, len, "out of memory (%zu bytes)", n);
        return NULL;
    }
    madvise(p, n, huge_pages() ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    return p;
}

static void cpu_free(void *block, size_t n)
{
    munmap(block, n);
}

static reader *cpu_open(const reader_setup *s, char *why, size_t len)
{
    reader *r = calloc(1, sizeof *r);
    if (r && s->direct &&
        posix_memalign((void **)&r->bounce, DIRECT_ALIGN, s->buffer_size) != 0) {
        free(r);
        r = NULL;
    }
    if (!r)
        snprintf(why, len, "out of memory");
    else
        r->load = s->load;
    return r;
}

static unsigned char *cpu_stage(reader *r, unsigned char *dst, char *why, size_t len)
{
    (void)why, (void)len;
    return r->bounce ? r->bounce : dst;
}

static int cpu_put(reader *r, unsigned char *dst, const unsigned char *p, size_t n, char *why,
                   size_t len)
{
    (void)r, (void)why, (void)len;
    if (p != dst)
        memcpy(dst, p, n);
    return 0;
}

static int cpu_landed(reader *r, size_t blob, char *why, size_t len)
{
    (void)why, (void)len;
    blob_landed(r->load, blob);
    return 0;
}

static void cpu_close(reader *r)
{
    free(r->bounce);
    free(r);
}

const backend cpu_backend = {
    .in_place = 1, .check = cpu_check, .alloc = cpu_alloc, .free = cpu_free, .open = cpu_open,
    .stage = cpu_stage, .put = cpu_put, .landed = cpu_landed, .close = cpu_close,
};
