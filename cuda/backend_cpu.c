/* backend_cpu.c — loads into host memory: reader threads pread straight into the block, which
 * needs no staging; only O_DIRECT reads go through an aligned bounce buffer, since a place in
 * the block has no 4096-byte alignment. */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

struct reader {
    ckl_load *load;
    unsigned char *bounce; /* NULL unless reads are O_DIRECT */
};

static int cpu_check(int ordinal, char *why, size_t len)
{
    (void)ordinal, (void)why, (void)len;
    return 0;
}

/* Anonymous memory with huge pages where the kernel has them: filling a fresh block costs a page
 * fault per page, and 2 MiB pages make those 512 times fewer. */
static void *cpu_alloc(int ordinal, size_t n, char *why, size_t len)
{
    (void)ordinal;
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        snprintf(why, len, "out of memory (%zu bytes)", n);
        return NULL;
    }
    madvise(p, n, MADV_HUGEPAGE);
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
    .check = cpu_check, .alloc = cpu_alloc, .free = cpu_free, .open = cpu_open,
    .stage = cpu_stage, .put = cpu_put, .landed = cpu_landed, .close = cpu_close,
};
