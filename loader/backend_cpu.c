/* backend_cpu.c — loads into host memory: reader threads read straight into the block, which
 * needs no staging (in_place: the core does it, O_DIRECT included where a chunk's place in the
 * block has the file's phase: plan.h ck_plan_keep_phase); only O_DIRECT reads of other chunks
 * (a blob's partial first and last pages, blobs out of phase) go through an aligned bounce
 * buffer and a copy. Both the block and the bounce start on a 2 MiB boundary, so that all of
 * them can be huge pages. */
#include "backend.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* The first bytes (at most n - 1) of file path, NUL-terminated, into buf; "" if unreadable. */
static void read_small(const char *path, char *buf, size_t n)
{
    FILE *f = fopen(path, "re");
    size_t got = f ? fread(buf, 1, n - 1, f) : 0;
    buf[got] = 0;
    if (f)
        fclose(f);
}

/* Whether this machine gives the memory it frees back to a hypervisor: a virtio balloon
 * (device 0x0005) with free page reporting (feature bit 5, VIRTIO_BALLOON_F_REPORTING). */
static int freed_memory_reported(void)
{
    DIR *d = opendir("/sys/bus/virtio/devices");
    int reported = 0;
    for (struct dirent *e; d && !reported && (e = readdir(d)) != NULL;) {
        char path[512], device[16], features[16];
        snprintf(path, sizeof path, "/sys/bus/virtio/devices/%s/device", e->d_name);
        read_small(path, device, sizeof device);
        snprintf(path, sizeof path, "/sys/bus/virtio/devices/%s/features", e->d_name);
        read_small(path, features, sizeof features);
        reported = strncmp(device, "0x0005", 6) == 0 && strlen(features) > 5 && features[5] == '1';
    }
    if (d)
        closedir(d);
    return reported;
}

/* 2 MiB pages, unless the machine reports the memory it frees to its hypervisor; CKLOAD_HUGEPAGES
 * =0 or 1 decides instead. Such a machine hands a fresh 2 MiB page out of a block it has
 * reported (free page reporting reports 2 MiB blocks and larger), which the host must back
 * again on the first touch, while 4 KiB pages come mostly from memory it kept (BENCHMARKS.md,
 * "Machine A" and "Fresh processes"). Elsewhere 2 MiB pages make a load's faults 512 times
 * fewer. */
static int huge_pages(void)
{
    const char *v = getenv("CKLOAD_HUGEPAGES");
    return v ? strcmp(v, "0") != 0 : !freed_memory_reported();
}

enum { PAGE = 4096, HUGE_PAGE = 2 << 20 };

struct reader {
    void (*on_landed)(void *ctx, size_t b);
    void *ctx;
    unsigned char *bounce; /* NULL unless reads are O_DIRECT */
    size_t bounce_size;
};

/* n > 0 bytes of fresh anonymous memory starting on a 2 MiB boundary, advised huge or not; NULL
 * when memory runs out. The mapping is made 2 MiB longer and trimmed to the boundary: mmap alone
 * aligns a mapping to 2 MiB only on some kernels, and only for some lengths. */
static void *map_aligned(size_t n, int huge)
{
    size_t span = n + HUGE_PAGE;
    unsigned char *p =
        mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    size_t head = (HUGE_PAGE - (uintptr_t)p % HUGE_PAGE) % HUGE_PAGE;
    size_t used = head + (n + PAGE - 1) / PAGE * PAGE;
    if (head)
        munmap(p, head);
    if (span > used)
        munmap(p + used, span - used);
    madvise(p + head, n, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    return p + head;
}

static int cpu_check(int ordinal, char *why, size_t len)
{
    (void)ordinal, (void)why, (void)len;
    return 0;
}

/* Anonymous memory, page-aligned (so a chunk's place can share the file's O_DIRECT phase), with
 * huge pages where the kernel has them and huge_pages() says: filling a fresh block costs a page
 * fault per page, and 2 MiB pages make those 512 times fewer. */
static void *cpu_alloc(int ordinal, size_t n, char *why, size_t len)
{
    (void)ordinal;
    void *p = map_aligned(n, huge_pages());
    if (!p)
        snprintf(why, len, "out of memory (%zu bytes)", n);
    return p;
}

static void cpu_free(void *block, size_t n)
{
    munmap(block, n);
}

/* The bounce is huge pages whatever CKLOAD_HUGEPAGES says: a disk takes an O_DIRECT read as one
 * request per run of physically contiguous memory, so 2 MiB pages make a read fewer, larger
 * requests (BENCHMARKS.md, "cold sources through 2 MiB bounce pages"). */
static reader *cpu_open(const reader_setup *s, char *why, size_t len)
{
    reader *r = calloc(1, sizeof *r);
    if (r && s->direct && !(r->bounce = map_aligned(s->buffer_size, 1))) {
        free(r);
        r = NULL;
    }
    if (!r)
        snprintf(why, len, "out of memory");
    else
        r->on_landed = s->on_landed, r->ctx = s->ctx, r->bounce_size = s->buffer_size;
    return r;
}

int backend_cpu_populate(unsigned char *p, size_t n)
{
    uintptr_t start = (uintptr_t)p & ~(uintptr_t)(PAGE - 1);
    return madvise((void *)start, (uintptr_t)p + n - start, MADV_POPULATE_WRITE);
}

/* Each reader thread faults its chunk's pages in before reading into them, in one call rather
 * than a fault per page inside the read (BENCHMARKS.md, "Fresh processes"). */
static unsigned char *cpu_stage(reader *r, unsigned char *dst, size_t n, char *why, size_t len)
{
    (void)why, (void)len;
    backend_cpu_populate(dst, n);
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

static int cpu_copy(reader *r, unsigned char *dst, const unsigned char *src, size_t n, char *why,
                    size_t len)
{
    (void)r, (void)why, (void)len;
    memcpy(dst, src, n);
    return 0;
}

static int cpu_landed(reader *r, size_t blob, char *why, size_t len)
{
    (void)why, (void)len;
    r->on_landed(r->ctx, blob);
    return 0;
}

static void cpu_close(reader *r)
{
    if (r->bounce)
        munmap(r->bounce, r->bounce_size);
    free(r);
}

const backend backend_cpu = {
    .in_place = 1, .check = cpu_check, .alloc = cpu_alloc, .free = cpu_free, .open = cpu_open,
    .stage = cpu_stage, .put = cpu_put, .copy = cpu_copy, .landed = cpu_landed,
    .close = cpu_close,
};
