/* fakecuda.c — a stand-in for the CUDA runtime (libcudart), stricter than the hardware, so that
 * libckload's CUDA branch runs in every test run on machines without a GPU (fakecuda.h: the
 * contract and the configuration; docs/TESTING.md: what it checks and what only hardware shows).
 *
 * Model: device memory is a memfd mapped twice, PROT_NONE at the address the caller gets (a host
 * dereference crashes) and read-write where only this file's copies see it. Each stream has a
 * worker thread running its queue in order, each operation after a seeded random delay; a copy
 * reads its source when it runs, not when it was queued, and while a copy out of a pinned buffer
 * is queued that buffer is read-only, so refilling it early faults at once. One lock guards all
 * state; one condition variable is broadcast whenever anything completes.
 */
#include "fakecuda.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { MAX_DEVICES = 16, MAX_RULES = 32, PAGE = 4096 };

/* --- state ---------------------------------------------------------------------------------- */

typedef struct alloc {
    struct alloc *next;
    unsigned char *addr;  /* what the caller sees: PROT_NONE for device memory */
    unsigned char *view;  /* device memory as this file's copies see it; addr for pinned */
    size_t size, maplen;
    int device;           /* -1: pinned host memory */
    int fd;               /* device memory: its memfd, kept open for cudaIpcGetMemHandle's
                           * importers (/proc/PID/fd/FD); -1 for pinned and imported memory */
    int imported;         /* mapped by cudaIpcOpenMemHandle: cudaIpcCloseMemHandle unmaps it */
    unsigned queued;      /* queued copies reading or writing it */
} alloc;

typedef struct CUevent_st {
    struct CUevent_st *next;
    int device;
    unsigned long recorded, completed; /* records queued / run */
    unsigned refs;        /* the handle, and each queued record */
    int destroyed;
} event;

enum op_kind { OP_COPY, OP_RECORD, OP_HOSTFN };

typedef struct op {
    struct op *next;
    enum op_kind kind;
    unsigned char *dst;
    const unsigned char *src;
    size_t n;
    alloc *dev, *pinned;  /* the allocations a copy touches (pinned may be NULL: pageable) */
    alloc *from;          /* a device-to-device copy's source allocation, else NULL */
    event *ev;
    unsigned long seq;
    cudaHostFn_t fn;
    void *arg;
} op;

typedef struct CUstream_st {
    struct CUstream_st *next;
    int device;
    op *head, *tail;      /* head runs (or waits for its delay) while it is still queued */
    unsigned long long rng;
    int destroyed;
    pthread_t thread;
} fstream;

struct rule {
    char fn[40];
    unsigned long nth;
    cudaError_t code;
    int sticky;
};

static struct config {
    int devices, nodevice, nodriver;
    size_t capacity;
    unsigned delay_min, delay_max; /* microseconds */
    unsigned long long seed;
    struct rule rules[MAX_RULES];
    unsigned nrules;
    unsigned long fault_copy;      /* 0: none */
    char stats[4096];
} cfg;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static alloc *allocs;
static fstream *streams;
static event *events;
static cudaError_t sticky;
static unsigned long nstreams_made, copies_queued;
static size_t device_bytes[MAX_DEVICES];
static struct counters {
    long long device_allocs, pinned_allocs, streams, events, peak_device_bytes,
        pageable_copies, in_flight, max_in_flight, copies, violations, ipc_imports;
} st;
static struct call_count {
    const char *fn;
    cudaError_t usual; /* what an injected failure returns unless the rule names a code */
    unsigned long calls;
} calls[] = {
    {"cudaDeviceSynchronize", cudaErrorLaunchFailure, 0},
    {"cudaEventCreateWithFlags", cudaErrorMemoryAllocation, 0},
    {"cudaEventDestroy", cudaErrorInvalidResourceHandle, 0},
    {"cudaEventRecord", cudaErrorInvalidResourceHandle, 0},
    {"cudaEventSynchronize", cudaErrorLaunchFailure, 0},
    {"cudaFree", cudaErrorInvalidValue, 0},
    {"cudaFreeHost", cudaErrorInvalidValue, 0},
    {"cudaGetDevice", cudaErrorNoDevice, 0},
    {"cudaGetDeviceCount", cudaErrorNoDevice, 0},
    {"cudaGetDriverEntryPoint", cudaErrorInvalidValue, 0},
    {"cudaGetDriverEntryPointByVersion", cudaErrorInvalidValue, 0},
    {"cudaHostAlloc", cudaErrorMemoryAllocation, 0},
    {"cudaIpcCloseMemHandle", cudaErrorInvalidValue, 0},
    {"cudaIpcGetMemHandle", cudaErrorMapBufferObjectFailed, 0},
    {"cudaIpcOpenMemHandle", cudaErrorMapBufferObjectFailed, 0},
    {"cudaLaunchHostFunc", cudaErrorInvalidResourceHandle, 0},
    {"cudaMalloc", cudaErrorMemoryAllocation, 0},
    {"cudaMemGetInfo", cudaErrorInvalidValue, 0},
    {"cudaMemcpy", cudaErrorInvalidValue, 0},
    {"cudaMemcpyAsync", cudaErrorInvalidValue, 0},
    {"cudaSetDevice", cudaErrorInvalidDevice, 0},
    {"cudaStreamCreateWithFlags", cudaErrorMemoryAllocation, 0},
    {"cudaStreamDestroy", cudaErrorInvalidResourceHandle, 0},
    {"cudaStreamSynchronize", cudaErrorLaunchFailure, 0},
};

static __thread int current_device;     /* per host thread, as cudaSetDevice's is */
static __thread cudaError_t last_error;
static __thread int in_host_fn;         /* this thread is running a cudaLaunchHostFunc function */

static void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void violation(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("fakecuda: violation: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    st.violations++;
}

/* --- configuration --------------------------------------------------------------------------- */

static struct call_count *call_named(const char *fn, size_t len)
{
    for (size_t k = 0; k < sizeof calls / sizeof *calls; k++)
        if (strlen(calls[k].fn) == len && strncmp(calls[k].fn, fn, len) == 0)
            return &calls[k];
    return NULL;
}

static int parse_size(const char *s, size_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;
    if (end == s || (shift && *++end) || *end)
        return -1;
    *out = (size_t)(v << shift);
    return 0;
}

/* FUNC:N[:CODE] into r. */
static int parse_rule(const char *v, int is_sticky, struct rule *r)
{
    const char *colon = strchr(v, ':');
    struct call_count *c = colon ? call_named(v, (size_t)(colon - v)) : NULL;
    char *end;
    if (!c)
        return -1;
    snprintf(r->fn, sizeof r->fn, "%s", c->fn);
    r->nth = strtoul(colon + 1, &end, 10);
    r->code = is_sticky ? cudaErrorIllegalAddress : c->usual;
    /* What a synchronize call fails with is an asynchronous error, which loses the context. */
    r->sticky = is_sticky || strstr(c->fn, "Synchronize") != NULL;
    if (*end == ':' && !is_sticky)
        r->code = (cudaError_t)strtol(end + 1, &end, 10);
    return r->nth && !*end ? 0 : -1;
}

static int parse_word(struct config *c, const char *w)
{
    const char *eq = strchr(w, '=');
    const char *v = eq ? eq + 1 : "";
    size_t k = eq ? (size_t)(eq - w) : strlen(w);
    char *end;
#define IS(name) (k == strlen(name) && strncmp(w, name, k) == 0)
    if (IS("nodevice") && !eq)
        return c->nodevice = 1, 0;
    if (IS("nodriver") && !eq)
        return c->nodriver = 1, 0;
    if (IS("devices"))
        return c->devices = (int)strtol(v, &end, 10),
               *end || c->devices < 1 || c->devices > MAX_DEVICES ? -1 : 0;
    if (IS("capacity"))
        return parse_size(v, &c->capacity);
    if (IS("delay"))
        return sscanf(v, "%u-%u", &c->delay_min, &c->delay_max) == 2 &&
                       c->delay_min <= c->delay_max ? 0 : -1;
    if (IS("seed"))
        return c->seed = strtoull(v, &end, 10), *end ? -1 : 0;
    if (IS("fault"))
        return c->fault_copy = strtoul(v, &end, 10), *end || !c->fault_copy ? -1 : 0;
    if (IS("stats"))
        return snprintf(c->stats, sizeof c->stats, "%s", v) < (int)sizeof c->stats ? 0 : -1;
    if ((IS("fail") || IS("sticky")) && c->nrules < MAX_RULES)
        return parse_rule(v, IS("sticky"), &c->rules[c->nrules++]);
#undef IS
    return -1;
}

static int parse_spec(const char *spec, struct config *c)
{
    *c = (struct config){.devices = 1, .capacity = (size_t)1 << 30, .delay_max = 200, .seed = 1};
    char *copy = strdup(spec ? spec : ""), *save = NULL;
    int rc = copy ? 0 : -1;
    for (char *w = copy ? strtok_r(copy, " ,", &save) : NULL; w && rc == 0;
         w = strtok_r(NULL, " ,", &save))
        if ((rc = parse_word(c, w)) != 0)
            fprintf(stderr, "fakecuda: cannot understand '%s' in the configuration\n", w);
    free(copy);
    return rc;
}

/* Handles the caller holds (a destroyed stream may still be draining: it holds none). */
static int anything_live(void)
{
    return st.device_allocs || st.pinned_allocs || st.streams || st.events || st.ipc_imports;
}

int fakecuda_configure(const char *spec)
{
    struct config c;
    if (parse_spec(spec, &c) != 0)
        return -1;
    pthread_mutex_lock(&mu);
    int rc = anything_live() && c.devices != cfg.devices ? -1 : 0;
    if (rc == 0) {
        cfg = c;
        sticky = cudaSuccess;
        copies_queued = nstreams_made = 0;
        for (size_t k = 0; k < sizeof calls / sizeof *calls; k++)
            calls[k].calls = 0;
        st.pageable_copies = st.max_in_flight = st.copies = st.violations = 0;
        st.peak_device_bytes = 0;
        for (int d = 0; d < MAX_DEVICES; d++)
            st.peak_device_bytes += (long long)device_bytes[d];
    } else {
        fprintf(stderr, "fakecuda: cannot change the devices while anything is live\n");
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

long long fakecuda_stat(const char *name)
{
    const struct {
        const char *name;
        long long *v;
    } named[] = {
        {"device_allocs", &st.device_allocs}, {"pinned_allocs", &st.pinned_allocs},
        {"streams", &st.streams}, {"events", &st.events},
        {"peak_device_bytes", &st.peak_device_bytes}, {"pageable_copies", &st.pageable_copies},
        {"max_in_flight", &st.max_in_flight}, {"copies", &st.copies},
        {"violations", &st.violations}, {"ipc_imports", &st.ipc_imports},
    };
    long long v = -1;
    pthread_mutex_lock(&mu);
    for (size_t k = 0; k < sizeof named / sizeof *named; k++)
        if (strcmp(name, named[k].name) == 0)
            v = *named[k].v;
    if (strcmp(name, "device_bytes") == 0)
        for (int d = v = 0; d < MAX_DEVICES; d++)
            v += (long long)device_bytes[d];
    if (strcmp(name, "current_device") == 0)
        v = current_device;
    pthread_mutex_unlock(&mu);
    return v;
}

static void dump_stats(void)
{
    static const char *const names[] = {"device_allocs", "pinned_allocs", "streams", "events",
                                        "ipc_imports",
                                        "device_bytes", "peak_device_bytes", "pageable_copies",
                                        "max_in_flight", "copies", "violations"};
    FILE *f = cfg.stats[0] ? fopen(cfg.stats, "w") : NULL;
    for (size_t k = 0; f && k < sizeof names / sizeof *names; k++)
        fprintf(f, "%s %lld\n", names[k], fakecuda_stat(names[k]));
    if (f)
        fclose(f);
}

__attribute__((constructor)) static void configure_from_env(void)
{
    if (parse_spec(getenv("FAKECUDA"), &cfg) != 0) {
        fprintf(stderr, "fakecuda: FAKECUDA: not a configuration (fakecuda.h says what is)\n");
        exit(2);
    }
    atexit(dump_stats);
}

/* --- every call ------------------------------------------------------------------------------ */

static cudaError_t fail(cudaError_t e)
{
    if (e != cudaSuccess)
        last_error = e;
    return e;
}

/* What a call of fn returns before doing anything: success, or the error that the setup
 * (no driver, no device, a sticky error, an injected failure) or the caller (CUDA from inside a
 * host function) makes it return. */
static cudaError_t enter(const char *fn)
{
    if (in_host_fn) {
        pthread_mutex_lock(&mu);
        violation("%s called from a host function (cudaLaunchHostFunc forbids it)", fn);
        pthread_mutex_unlock(&mu);
        return fail(cudaErrorNotPermitted);
    }
    cudaError_t e = cudaSuccess;
    pthread_mutex_lock(&mu);
    struct call_count *c = call_named(fn, strlen(fn));
    unsigned long n = ++c->calls;
    if (cfg.nodriver || cfg.nodevice)
        e = cfg.nodriver ? cudaErrorInsufficientDriver : cudaErrorNoDevice;
    else if (sticky)
        e = sticky;
    for (unsigned k = 0; e == cudaSuccess && k < cfg.nrules; k++)
        if (cfg.rules[k].nth == n && strcmp(cfg.rules[k].fn, fn) == 0) {
            e = cfg.rules[k].code;
            if (cfg.rules[k].sticky)
                sticky = e;
        }
    pthread_mutex_unlock(&mu);
    return fail(e);
}

/* --- memory ---------------------------------------------------------------------------------- */

static size_t page_round(size_t n)
{
    return (n + PAGE - 1) / PAGE * PAGE;
}

/* The allocation holding [p, p+n), of device dev (-1: pinned host memory). */
static alloc *find_alloc(const void *p, size_t n, int dev)
{
    const unsigned char *b = p;
    for (alloc *a = allocs; a; a = a->next)
        if (a->device == dev && b >= a->addr && b <= a->addr + a->size && n <= a->size &&
            (size_t)(b - a->addr) <= a->size - n)
            return a;
    return NULL;
}

/* The allocation that starts at p: the only pointer cudaFree and cudaFreeHost take. */
static alloc **find_start(const void *p, int device_memory)
{
    for (alloc **a = &allocs; *a; a = &(*a)->next)
        if ((*a)->addr == p && ((*a)->device >= 0) == device_memory)
            return a;
    return NULL;
}

static void unmap(alloc *a)
{
    if (a->fd >= 0)
        close(a->fd);
    if (a->view != a->addr)
        munmap(a->view, a->maplen);
    munmap(a->addr, a->maplen);
    free(a);
}

/* a->fd mapped twice into a: PROT_NONE where the caller sees it, read-write for the copies.
 * 0, or -1 with neither mapped. */
static int map_both(alloc *a)
{
    a->addr = mmap(NULL, a->maplen, PROT_NONE, MAP_SHARED, a->fd, 0);
    a->view = mmap(NULL, a->maplen, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
    if (a->addr != MAP_FAILED && a->view != MAP_FAILED)
        return 0;
    if (a->addr != MAP_FAILED)
        munmap(a->addr, a->maplen);
    if (a->view != MAP_FAILED)
        munmap(a->view, a->maplen);
    return -1;
}

/* Device memory: a memfd seen PROT_NONE by the caller, read-write by the copies. */
static alloc *map_device(size_t size, int dev)
{
    alloc *a = calloc(1, sizeof *a);
    int fd = memfd_create("fakecuda-device", MFD_CLOEXEC);
    if (!a || fd < 0)
        goto fail;
    *a = (alloc){.size = size, .maplen = page_round(size ? size : 1), .device = dev, .fd = fd};
    if (ftruncate(fd, (off_t)a->maplen) == 0 && map_both(a) == 0)
        return a;
fail:
    if (fd >= 0)
        close(fd);
    free(a);
    return NULL;
}

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    cudaError_t e = enter("cudaMalloc");
    if (e)
        return e;
    if (!devPtr)
        return fail(cudaErrorInvalidValue);
    int dev = current_device;
    pthread_mutex_lock(&mu);
    alloc *a = device_bytes[dev] + size <= cfg.capacity && size <= cfg.capacity
                   ? map_device(size, dev) : NULL;
    if (a) {
        a->next = allocs;
        allocs = a;
        device_bytes[dev] += size;
        st.device_allocs++;
        long long total = 0;
        for (int d = 0; d < MAX_DEVICES; d++)
            total += (long long)device_bytes[d];
        st.peak_device_bytes = total > st.peak_device_bytes ? total : st.peak_device_bytes;
        *devPtr = a->addr;
    }
    pthread_mutex_unlock(&mu);
    return a ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

/* Waits until no copy is queued into or out of a; freeing it earlier is a violation (the
 * runtime would wait, but code that relies on that frees memory it still uses). */
static void wait_unqueued(alloc *a, const char *fn)
{
    if (a->queued)
        violation("%s of %p while %u copies into or out of it are queued", fn, (void *)a->addr,
                  a->queued);
    while (a->queued)
        pthread_cond_wait(&cv, &mu);
}

static cudaError_t free_alloc(const void *p, int device_memory, const char *fn)
{
    cudaError_t e = enter(fn);
    if (e && e != sticky) /* in a lost context the stand-in still frees, so leaks stay visible */
        return e;
    if (!p)
        return e;
    pthread_mutex_lock(&mu);
    alloc **at = find_start(p, device_memory), *a = at ? *at : NULL;
    if (a && a->imported) { /* undefined in the runtime (cudaIpcOpenMemHandle says so) */
        violation("%s of %p, mapped by cudaIpcOpenMemHandle (cudaIpcCloseMemHandle unmaps it)",
                  fn, p);
        a = NULL;
    }
    if (a) {
        wait_unqueued(a, fn);
        *find_start(p, device_memory) = a->next; /* the list may have changed while waiting */
        if (device_memory) {
            device_bytes[a->device] -= a->size;
            st.device_allocs--;
        } else {
            st.pinned_allocs--;
        }
        unmap(a);
    }
    pthread_mutex_unlock(&mu);
    return a ? e : fail(device_memory ? cudaErrorInvalidDevicePointer : cudaErrorInvalidValue);
}

cudaError_t cudaFree(void *devPtr)
{
    return free_alloc(devPtr, 1, "cudaFree");
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    cudaError_t e = enter("cudaHostAlloc");
    if (e)
        return e;
    if (!pHost ||
        (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped |
                             cudaHostAllocWriteCombined)))
        return fail(cudaErrorInvalidValue);
    alloc *a = calloc(1, sizeof *a);
    if (a) {
        *a = (alloc){.size = size, .maplen = page_round(size ? size : 1), .device = -1, .fd = -1};
        a->addr = mmap(NULL, a->maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
        a->view = a->addr;
    }
    if (!a || a->addr == MAP_FAILED) {
        free(a);
        return fail(cudaErrorMemoryAllocation);
    }
    pthread_mutex_lock(&mu);
    a->next = allocs;
    allocs = a;
    st.pinned_allocs++;
    pthread_mutex_unlock(&mu);
    *pHost = a->addr;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr)
{
    return free_alloc(ptr, 0, "cudaFreeHost");
}

/* --- memory shared between processes (cudaIpc*MemHandle) --------------------------------------
 * A handle names the exporter's memfd as another process opens it, /proc/PID/fd/FD, and the
 * memfd's device and inode, so that a number reused by another file after the exporter closed
 * it is refused rather than mapped; the importer maps it as an allocation of its own (so its
 * copies see it, and the host still cannot touch it). */

#define IPC_MAGIC 0x43504946u /* "FIPC" */

typedef struct ipc_handle {
    uint32_t magic;
    int32_t pid, fd, device;
    uint64_t size, dev, ino;
} ipc_handle;
_Static_assert(sizeof(ipc_handle) <= sizeof(cudaIpcMemHandle_t), "fits the runtime's handle");

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
    cudaError_t e = enter("cudaIpcGetMemHandle");
    if (e)
        return e;
    struct stat sb;
    pthread_mutex_lock(&mu);
    alloc **at = handle ? find_start(devPtr, 1) : NULL, *a = at ? *at : NULL;
    /* The runtime takes only the base of a cudaMalloc'ed allocation, not an imported one. */
    e = !a || a->imported ? cudaErrorInvalidValue
        : fstat(a->fd, &sb) != 0 ? cudaErrorMapBufferObjectFailed : cudaSuccess;
    if (e == cudaSuccess) {
        ipc_handle h = {.magic = IPC_MAGIC, .pid = (int32_t)getpid(), .fd = a->fd,
                        .device = a->device, .size = a->size, .dev = (uint64_t)sb.st_dev,
                        .ino = (uint64_t)sb.st_ino};
        memset(handle, 0, sizeof *handle);
        memcpy(handle->reserved, &h, sizeof h);
    }
    pthread_mutex_unlock(&mu);
    return fail(e);
}

/* The memfd that h names, opened read-write, and its size; -1 with *e set when it names nothing
 * live. */
static int ipc_open_fd(const ipc_handle *h, size_t *size, cudaError_t *e)
{
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/%d/fd/%d", (int)h->pid, (int)h->fd);
    int fd = h->magic == IPC_MAGIC ? open(proc, O_RDWR | O_CLOEXEC) : -1;
    struct stat sb;
    if (fd >= 0 && fstat(fd, &sb) == 0 && (uint64_t)sb.st_dev == h->dev &&
        (uint64_t)sb.st_ino == h->ino && (uint64_t)sb.st_size >= h->size) {
        *size = (size_t)sb.st_size;
        return fd;
    }
    if (fd >= 0)
        close(fd);
    *e = cudaErrorInvalidResourceHandle;
    return -1;
}

/* The stand-in maps a handle only on its own device: it models no peer access. */
cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags)
{
    cudaError_t e = enter("cudaIpcOpenMemHandle");
    if (e)
        return e;
    ipc_handle h;
    memcpy(&h, handle.reserved, sizeof h);
    if (!devPtr || flags != cudaIpcMemLazyEnablePeerAccess)
        return fail(cudaErrorInvalidValue);
    if (h.magic == IPC_MAGIC && h.pid == (int32_t)getpid())
        return fail(cudaErrorDeviceUninitialized); /* the runtime's, for its own handle */
    size_t size = 0;
    int fd = ipc_open_fd(&h, &size, &e);
    if (fd < 0)
        return fail(e);
    if (h.device != current_device) {
        close(fd);
        return fail(cudaErrorInvalidDevice);
    }
    /* The whole allocation the handle names, whatever else the handle says: the memfd. */
    alloc *a = calloc(1, sizeof *a);
    if (a)
        *a = (alloc){.size = size, .maplen = page_round(size ? size : 1), .device = h.device,
                     .fd = fd, .imported = 1};
    if (!a || map_both(a) != 0) {
        close(fd);
        free(a);
        return fail(cudaErrorMapBufferObjectFailed);
    }
    pthread_mutex_lock(&mu);
    a->next = allocs;
    allocs = a;
    st.ipc_imports++;
    pthread_mutex_unlock(&mu);
    *devPtr = a->addr;
    return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void *devPtr)
{
    cudaError_t e = enter("cudaIpcCloseMemHandle");
    if (e && e != sticky)
        return e;
    pthread_mutex_lock(&mu);
    alloc **at = find_start(devPtr, 1), *a = at ? *at : NULL;
    int mine = a && a->imported;
    if (mine) {
        wait_unqueued(a, "cudaIpcCloseMemHandle");
        *find_start(devPtr, 1) = a->next;
        st.ipc_imports--;
        unmap(a);
    }
    pthread_mutex_unlock(&mu);
    return mine ? e : fail(cudaErrorInvalidValue);
}

/* --- the driver, through the runtime's door to it (cudaGetDriverEntryPointByVersion) ----------
 * Only cuMemGetAddressRange, the driver function libckload asks for: the allocation holding a
 * device address of the current device, the caller's own or an import (whose size is its
 * memfd's, cudaIpcOpenMemHandle). */
static CUresult fake_mem_get_address_range(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    pthread_mutex_lock(&mu);
    const alloc *a = find_alloc((const void *)(uintptr_t)dptr, 1, current_device);
    if (a && pbase)
        *pbase = (CUdeviceptr)(uintptr_t)a->addr;
    if (a && psize)
        *psize = a->size;
    pthread_mutex_unlock(&mu);
    return a ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

static cudaError_t entry_point(const char *fn, const char *symbol, void **funcPtr,
                               unsigned int cudaVersion, unsigned long long flags,
                               enum cudaDriverEntryPointQueryResult *driverStatus)
{
    cudaError_t e = enter(fn);
    if (e)
        return e;
    if (!symbol || !funcPtr || flags > cudaEnablePerThreadDefaultStream || cudaVersion < 1000 ||
        cudaVersion > CUDART_VERSION)
        return fail(cudaErrorInvalidValue);
    /* cuMemGetAddressRange_v2, the one cuda.h names, came with CUDA 3.2 */
    int known = strcmp(symbol, "cuMemGetAddressRange") == 0;
    int recent = cudaVersion >= 3020;
    *funcPtr = known && recent ? (void *)fake_mem_get_address_range : NULL;
    if (driverStatus)
        *driverStatus = !known ? cudaDriverEntryPointSymbolNotFound
                        : recent ? cudaDriverEntryPointSuccess
                                 : cudaDriverEntryPointVersionNotSufficent;
    return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                             unsigned int cudaVersion, unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point("cudaGetDriverEntryPointByVersion", symbol, funcPtr, cudaVersion, flags,
                       driverStatus);
}

/* The deprecated door, as of the runtime's own version. */
cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags,
                                    enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point("cudaGetDriverEntryPoint", symbol, funcPtr, CUDART_VERSION, flags,
                       driverStatus);
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    cudaError_t e = enter("cudaMemGetInfo");
    if (e)
        return e;
    pthread_mutex_lock(&mu);
    *free_bytes = cfg.capacity - device_bytes[current_device];
    *total = cfg.capacity;
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

/* --- devices --------------------------------------------------------------------------------- */

cudaError_t cudaGetDeviceCount(int *count)
{
    *count = 0;
    cudaError_t e = enter("cudaGetDeviceCount");
    if (e == cudaSuccess)
        *count = cfg.devices;
    return e;
}

cudaError_t cudaSetDevice(int device)
{
    cudaError_t e = enter("cudaSetDevice");
    if (e)
        return e;
    if (device < 0 || device >= cfg.devices)
        return fail(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    cudaError_t e = enter("cudaGetDevice");
    if (e == cudaSuccess)
        *device = current_device;
    return e;
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    pthread_mutex_lock(&mu);
    if (in_host_fn)
        violation("cudaGetLastError called from a host function (cudaLaunchHostFunc forbids it)");
    else if (cfg.nodriver || cfg.nodevice)
        e = cfg.nodriver ? cudaErrorInsufficientDriver : cudaErrorNoDevice;
    if (sticky)
        e = sticky;
    pthread_mutex_unlock(&mu);
    last_error = cudaSuccess;
    return e;
}

const char *cudaGetErrorString(cudaError_t error)
{
    static const struct {
        cudaError_t e;
        const char *s;
    } text[] = {
        {cudaSuccess, "no error"},
        {cudaErrorInvalidValue, "invalid argument"},
        {cudaErrorMemoryAllocation, "out of memory"},
        {cudaErrorInvalidDevicePointer, "invalid device pointer"},
        {cudaErrorInsufficientDriver,
         "CUDA driver version is insufficient for CUDA runtime version"},
        {cudaErrorNoDevice, "no CUDA-capable device is detected"},
        {cudaErrorInvalidDevice, "invalid device ordinal"},
        {cudaErrorInvalidResourceHandle, "invalid resource handle"},
        {cudaErrorIllegalAddress, "an illegal memory access was encountered"},
        {cudaErrorLaunchFailure, "unspecified launch failure"},
        {cudaErrorNotPermitted, "operation not permitted"},
        {cudaErrorMapBufferObjectFailed, "mapping of buffer object failed"},
    };
    for (size_t k = 0; k < sizeof text / sizeof *text; k++)
        if (text[k].e == error)
            return text[k].s;
    return "unrecognized error code";
}

/* --- streams and their workers --------------------------------------------------------------- */

static int live_stream(const fstream *s)
{
    for (const fstream *x = streams; x; x = x->next)
        if (x == s && !x->destroyed)
            return 1;
    return 0;
}

static int live_event(const event *ev)
{
    for (const event *x = events; x; x = x->next)
        if (x == ev && !x->destroyed)
            return 1;
    return 0;
}

static void drop_event_ref(event *ev)
{
    if (--ev->refs)
        return;
    for (event **at = &events; *at; at = &(*at)->next)
        if (*at == ev) {
            *at = ev->next;
            break;
        }
    free(ev);
}

static unsigned next_delay(fstream *s)
{
    s->rng = s->rng * 6364136223846793005ULL + 1442695040888963407ULL;
    unsigned span = cfg.delay_max - cfg.delay_min + 1;
    return cfg.delay_min + (unsigned)((s->rng >> 33) % span);
}

/* Runs o (the lock not held). A copy reads its source now; after a sticky error nothing runs,
 * as in a lost context. */
static void run_op(op *o, int lost)
{
    if (o->kind == OP_COPY && !lost)
        memcpy(o->dst, o->src, o->n);
    if (o->kind == OP_HOSTFN && !lost) {
        in_host_fn = 1;
        o->fn(o->arg);
        in_host_fn = 0;
    }
}

/* Bookkeeping once o has run (the lock held). */
static void retire_op(op *o)
{
    if (o->kind == OP_COPY) {
        st.in_flight--;
        st.copies++;
        o->dev->queued--;
        if (o->from)
            o->from->queued--;
        if (o->pinned && --o->pinned->queued == 0)
            mprotect(o->pinned->addr, o->pinned->maplen, PROT_READ | PROT_WRITE);
    }
    if (o->kind == OP_RECORD) {
        o->ev->completed = o->seq > o->ev->completed ? o->seq : o->ev->completed;
        drop_event_ref(o->ev);
    }
}

static void *stream_worker(void *arg)
{
    fstream *s = arg;
    pthread_mutex_lock(&mu);
    for (;;) {
        while (!s->head && !s->destroyed)
            pthread_cond_wait(&cv, &mu);
        op *o = s->head;
        if (!o)
            break;
        unsigned us = next_delay(s);
        unsigned long nth = o->kind == OP_COPY ? o->seq : 0;
        if (nth && nth == cfg.fault_copy && !sticky)
            sticky = cudaErrorIllegalAddress; /* reported by later calls */
        int lost = sticky != cudaSuccess;
        pthread_mutex_unlock(&mu);
        if (us && !lost)
            nanosleep(&(struct timespec){.tv_sec = us / 1000000, .tv_nsec = us % 1000000 * 1000L},
                      NULL);
        run_op(o, lost);
        pthread_mutex_lock(&mu);
        s->head = o->next;
        if (!s->head)
            s->tail = NULL;
        retire_op(o);
        free(o);
        pthread_cond_broadcast(&cv);
    }
    for (fstream **at = &streams; *at; at = &(*at)->next)
        if (*at == s) {
            *at = s->next;
            break;
        }
    pthread_mutex_unlock(&mu);
    free(s);
    return NULL;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    cudaError_t e = enter("cudaStreamCreateWithFlags");
    if (e)
        return e;
    if (!pStream || flags > cudaStreamNonBlocking)
        return fail(cudaErrorInvalidValue);
    fstream *s = calloc(1, sizeof *s);
    if (!s)
        return fail(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&mu);
    s->device = current_device;
    s->rng = cfg.seed * 0x9e3779b97f4a7c15ULL + ++nstreams_made;
    int ok = pthread_create(&s->thread, NULL, stream_worker, s) == 0;
    if (ok) {
        pthread_detach(s->thread);
        s->next = streams;
        streams = s;
        st.streams++;
    }
    pthread_mutex_unlock(&mu);
    if (!ok) {
        free(s);
        return fail(cudaErrorMemoryAllocation);
    }
    *pStream = s;
    return cudaSuccess;
}

/* As the runtime: returns at once; queued work still runs, then the worker goes. */
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    cudaError_t e = enter("cudaStreamDestroy");
    if (e && e != sticky)
        return e;
    pthread_mutex_lock(&mu);
    int ok = live_stream(s);
    if (ok) {
        s->destroyed = 1;
        st.streams--;
        pthread_cond_broadcast(&cv);
    }
    pthread_mutex_unlock(&mu);
    return ok ? e : fail(cudaErrorInvalidResourceHandle);
}

/* Queues o on s, the lock held. */
static void enqueue(fstream *s, op *o)
{
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    pthread_cond_broadcast(&cv);
}

/* Whether a copy on stream s may touch device memory dev (found for p..+n): it is memory of
 * the stream's device, the calling thread's current one (stricter than UVA hardware, which
 * would let either pass); else a violation. */
static cudaError_t copy_allowed(const fstream *s, const alloc *dev, const void *p, size_t n)
{
    if (!dev) {
        violation("cudaMemcpyAsync: %p..+%zu is not memory of device %d, the stream's", p, n,
                  s->device);
        return cudaErrorInvalidValue;
    }
    if (s->device != current_device) {
        violation("cudaMemcpyAsync into device %d from a thread whose current device is %d",
                  s->device, current_device);
        return cudaErrorInvalidDevice;
    }
    return cudaSuccess;
}

/* A queued copy from device memory to device memory, both the stream's device's. */
static cudaError_t queue_d2d(fstream *s, unsigned char *dst, const unsigned char *src, size_t n)
{
    alloc *to = find_alloc(dst, n, s->device), *from = find_alloc(src, n, s->device);
    cudaError_t e = copy_allowed(s, to, dst, n);
    if (e == cudaSuccess)
        e = copy_allowed(s, from, src, n);
    op *o = e == cudaSuccess ? calloc(1, sizeof *o) : NULL;
    if (e != cudaSuccess || !o)
        return e != cudaSuccess ? e : cudaErrorMemoryAllocation;
    *o = (op){.kind = OP_COPY, .n = n, .dev = to, .from = from, .seq = ++copies_queued,
              .dst = to->view + (dst - to->addr), .src = from->view + (src - from->addr)};
    to->queued++;
    from->queued++;
    if (++st.in_flight > st.max_in_flight)
        st.max_in_flight = st.in_flight;
    enqueue(s, o);
    return cudaSuccess;
}

/* A queued copy between host and device memory (copy_allowed says which device memory). */
static cudaError_t queue_copy(fstream *s, unsigned char *dst, const unsigned char *src, size_t n,
                              enum cudaMemcpyKind kind)
{
    if (kind == cudaMemcpyDeviceToDevice)
        return queue_d2d(s, dst, src, n);
    int h2d = kind == cudaMemcpyHostToDevice;
    alloc *dev = find_alloc(h2d ? dst : src, n, s->device);
    if (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToHost)
        return cudaErrorInvalidValue;
    cudaError_t e = copy_allowed(s, dev, h2d ? dst : src, n);
    if (e != cudaSuccess)
        return e;
    op *o = calloc(1, sizeof *o);
    if (!o)
        return cudaErrorMemoryAllocation;
    alloc *pinned = find_alloc(h2d ? src : dst, n, -1);
    size_t at = (size_t)((h2d ? dst : src) - dev->addr);
    *o = (op){.kind = OP_COPY, .n = n, .dev = dev, .pinned = pinned, .seq = ++copies_queued,
              .dst = h2d ? dev->view + at : dst, .src = h2d ? src : dev->view + at};
    dev->queued++;
    st.pageable_copies += !pinned;
    if (pinned && pinned->queued++ == 0 && h2d) /* its host side may not change until it ran */
        mprotect(pinned->addr, pinned->maplen, PROT_READ);
    if (++st.in_flight > st.max_in_flight)
        st.max_in_flight = st.in_flight;
    enqueue(s, o);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    cudaError_t e = enter("cudaMemcpyAsync");
    if (e)
        return e;
    pthread_mutex_lock(&mu);
    e = live_stream(stream) ? queue_copy(stream, dst, src, count, kind)
                            : cudaErrorInvalidResourceHandle;
    pthread_mutex_unlock(&mu);
    return fail(e);
}

/* Synchronous copies (the tests read device memory back with them), done at once: like the
 * runtime's on the legacy default stream, they do not wait for work queued on non-blocking
 * streams, so reading a tensor back before its copy ran shows the wrong bytes. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    cudaError_t e = enter("cudaMemcpy");
    if (e)
        return e;
    int h2d = kind == cudaMemcpyHostToDevice;
    pthread_mutex_lock(&mu);
    alloc *dev = find_alloc(h2d ? dst : src, count, current_device);
    if ((kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToHost) && dev && !sticky) {
        size_t at = (size_t)((const unsigned char *)(h2d ? dst : src) - dev->addr);
        memcpy(h2d ? dev->view + at : dst, h2d ? src : dev->view + at, count);
    }
    e = sticky ? sticky : dev ? cudaSuccess : cudaErrorInvalidValue;
    pthread_mutex_unlock(&mu);
    return fail(e);
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
    cudaError_t e = enter("cudaLaunchHostFunc");
    if (e)
        return e;
    op *o = calloc(1, sizeof *o);
    if (!o)
        return fail(cudaErrorMemoryAllocation);
    *o = (op){.kind = OP_HOSTFN, .fn = fn, .arg = userData};
    pthread_mutex_lock(&mu);
    int ok = live_stream(stream) && fn;
    if (ok)
        enqueue(stream, o);
    pthread_mutex_unlock(&mu);
    if (!ok)
        free(o);
    return ok ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

/* Waits (the lock held) until done(); returns the sticky error, if any. In a lost context the
 * queued work is dropped rather than run, and the wait lasts until it is gone, so that no copy
 * the caller was told about is left pending. */
static cudaError_t wait_for(int (*done)(const void *), const void *what)
{
    while (!done(what))
        pthread_cond_wait(&cv, &mu);
    return sticky;
}

static int stream_idle(const void *s)
{
    return ((const fstream *)s)->head == NULL;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    cudaError_t e = enter("cudaStreamSynchronize");
    if (e && e != sticky)
        return e;
    pthread_mutex_lock(&mu);
    e = live_stream(stream) ? wait_for(stream_idle, stream) : cudaErrorInvalidResourceHandle;
    pthread_mutex_unlock(&mu);
    return fail(e);
}

static int device_idle(const void *dev)
{
    for (const fstream *s = streams; s; s = s->next)
        if (s->device == *(const int *)dev && s->head)
            return 0;
    return 1;
}

cudaError_t cudaDeviceSynchronize(void)
{
    cudaError_t e = enter("cudaDeviceSynchronize");
    if (e && e != sticky)
        return e;
    int dev = current_device;
    pthread_mutex_lock(&mu);
    e = wait_for(device_idle, &dev);
    pthread_mutex_unlock(&mu);
    return fail(e);
}

/* --- events ---------------------------------------------------------------------------------- */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned int flags)
{
    cudaError_t e = enter("cudaEventCreateWithFlags");
    if (e)
        return e;
    if (!ev ||
        (flags &
         ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess)))
        return fail(cudaErrorInvalidValue);
    event *x = calloc(1, sizeof *x);
    if (!x)
        return fail(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&mu);
    x->device = current_device;
    x->refs = 1;
    x->next = events;
    events = x;
    st.events++;
    pthread_mutex_unlock(&mu);
    *ev = x;
    return cudaSuccess;
}

/* As the runtime: returns at once; a record still queued completes later. */
cudaError_t cudaEventDestroy(cudaEvent_t ev)
{
    cudaError_t e = enter("cudaEventDestroy");
    if (e && e != sticky)
        return e;
    pthread_mutex_lock(&mu);
    int ok = live_event(ev);
    if (ok) {
        ev->destroyed = 1;
        st.events--;
        drop_event_ref(ev);
    }
    pthread_mutex_unlock(&mu);
    return ok ? e : fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t stream)
{
    cudaError_t e = enter("cudaEventRecord");
    if (e)
        return e;
    op *o = calloc(1, sizeof *o);
    if (!o)
        return fail(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&mu);
    int ok = live_event(ev) && live_stream(stream) && ev->device == stream->device;
    if (ok) {
        *o = (op){.kind = OP_RECORD, .ev = ev, .seq = ++ev->recorded};
        ev->refs++;
        enqueue(stream, o);
    } else if (live_event(ev) && live_stream(stream)) {
        violation("cudaEventRecord of an event of device %d on a stream of device %d",
                  ev->device, stream->device);
    }
    pthread_mutex_unlock(&mu);
    if (!ok)
        free(o);
    return ok ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

static int event_done(const void *p)
{
    const struct {
        const event *ev;
        unsigned long seq;
    } *w = p;
    return w->ev->completed >= w->seq;
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev)
{
    cudaError_t e = enter("cudaEventSynchronize");
    if (e && e != sticky)
        return e;
    pthread_mutex_lock(&mu);
    if (live_event(ev)) {
        struct {
            const event *ev;
            unsigned long seq;
        } w = {ev, ev->recorded};
        ev->refs++; /* the handle may be destroyed while this thread waits */
        e = wait_for(event_done, &w);
        drop_event_ref(ev);
    } else {
        e = cudaErrorInvalidResourceHandle;
    }
    pthread_mutex_unlock(&mu);
    return fail(e);
}
