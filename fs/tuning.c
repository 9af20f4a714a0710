#include "tuning.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* FUSE readahead is the kernel's default 128 KiB, which caps buffered reads at 128 KiB
 * requests; a larger window brings 1 MiB requests and a faster first read (BENCHMARKS.md, the
 * safetensors mount). */
void ck_set_readahead(const char *mnt, unsigned kb, int explicit)
{
    /* The mount's device, without asking the mount itself (that would wait on this very
     * process, which is not serving yet): AT_STATX_DONT_SYNC takes the attributes the kernel
     * has, and the device is the superblock's. */
    struct statx stx;
    char knob[96];
    if (kb == 0 || statx(AT_FDCWD, mnt, AT_STATX_DONT_SYNC, 0, &stx) != 0)
        return;
    snprintf(knob, sizeof knob, "/sys/class/bdi/%u:%u/read_ahead_kb", stx.stx_dev_major,
             stx.stx_dev_minor);
    FILE *f = fopen(knob, "we");
    int ok = f && fprintf(f, "%u\n", kb) > 0;
    ok = f && fclose(f) == 0 && ok;
    if (!ok && explicit)
        fprintf(stderr, "ckptfs: %s: cannot set readahead (%s): %s\n", mnt, knob,
                strerror(errno));
}

/* Memory the parse frees is what the tree, index.json and the serving threads then use: in a
 * VM a page the process touches for the first time is dear, and a mount of many small tensors
 * touches many (BENCHMARKS.md, mount latency), so blocks up to HEAP_REUSE stay in
 * the one heap that every thread shares, and are not handed back to the kernel between uses.
 * What stays is bounded: blocks above it still come from and go back to the kernel. */
enum { HEAP_REUSE = 32 << 20 };

void ck_keep_freed_memory(void)
{
    mallopt(M_MMAP_THRESHOLD, HEAP_REUSE);
    mallopt(M_TRIM_THRESHOLD, HEAP_REUSE);
    mallopt(M_ARENA_MAX, 1);
}

/* A large checkpoint's parse, tree and index.json touch many fresh pages, one after another on
 * the thread the mount waits for (BENCHMARKS.md, mount latency): a helper thread on the other
 * core faults them in while the parse runs. The window is added to the heap by allocating and
 * freeing it (it stays, as ck_keep_freed_memory keeps it); MADV_POPULATE_WRITE (Linux 5.14)
 * maps its pages without writing them, so it may run while malloc hands the same pages out.
 * With one CPU to run on, the helper would only take turns with the parse, and fault pages the
 * parse never uses. The window's size (prefault_size) is what such a parse's heap reaches
 * anyway. */
enum {
    HEAP_PREFAULT = 4 << 20,  /* the most: what a .pt of many thousand tensors takes */
    PREFAULT_PER_BYTE = 3,    /* bytes of heap per byte of a file, as that .pt's parse takes */
    PREFAULT_STEP = 256 << 10 /* also the least: a smaller parse is not worth a thread */
};

typedef struct heap_window {
    char *start;
    size_t len;
} heap_window;

/* Faults in the window arg points at, and frees that description. */
static void *prefault_run(void *arg)
{
    heap_window w = *(heap_window *)arg;
    free(arg);
    /* In steps: while it populates, the advice holds the address space's lock for reading,
     * and a step lets a writer (the parse's brk or mmap) in between. */
    for (size_t off = 0; off < w.len; off += PREFAULT_STEP) {
        size_t n = w.len - off < PREFAULT_STEP ? w.len - off : PREFAULT_STEP;
        if (madvise(w.start + off, n, MADV_POPULATE_WRITE) != 0)
            break;
    }
    return NULL;
}

/* Bytes of heap worth faulting ahead of the parse of SOURCE (a local path): a file's size
 * bounds its metadata, so a small file gets a small window (or none); a directory of shards, or
 * a file that cannot be looked at here (ck_open will say why), the largest. */
static size_t prefault_size(const char *source)
{
    struct stat st;
    if (stat(source, &st) != 0 || !S_ISREG(st.st_mode) ||
        (uint64_t)st.st_size >= HEAP_PREFAULT / PREFAULT_PER_BYTE)
        return HEAP_PREFAULT;
    size_t n = (size_t)st.st_size * PREFAULT_PER_BYTE;
    return n < PREFAULT_STEP ? 0 : n;
}

void ck_prefault_heap(const char *source)
{
    cpu_set_t cpus;
    size_t size = prefault_size(source);
    if (!size || sched_getaffinity(0, sizeof cpus, &cpus) != 0 || CPU_COUNT(&cpus) < 2)
        return;
    char *start = sbrk(0);
    void *volatile window = malloc(size); /* volatile: the pair is not optimised out */
    free(window);
    char *end = sbrk(0);
    if (start == (char *)-1 || end == (char *)-1 || end <= start)
        return;
    heap_window *w = malloc(sizeof *w); /* the thread's to free */
    if (!w)
        return;
    *w = (heap_window){start, (size_t)(end - start)};
    pthread_t t;
    if (pthread_create(&t, NULL, prefault_run, w) == 0)
        pthread_detach(t);
    else
        free(w);
}
