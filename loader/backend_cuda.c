/* backend_cuda.c — loads into device memory, through the CUDA runtime API and nothing else of
 * CUDA, opened at the first use (cudart.h), so that a machine without CUDA still loads to the
 * host and a stand-in for libcudart can take its place.
 *
 * Each reader thread owns a stream and a few pinned staging buffers (cudaHostAlloc, kept in the
 * load's pool across loads, pool.h: pinning is slow, BENCHMARKS.md "the GPU proof"), used in
 * turn: the thread preads into one while the copies out of the others run, and refills a buffer
 * only after the event recorded behind its copy has completed. A blob has landed when a host function queued on the
 * stream behind its last copy runs; that function only marks it, and the reader thread reports
 * it (on_landed, so on_ready) at its next chunk or when it closes: the runtime forbids CUDA
 * calls inside a host function, and on_ready may well make some (start work on an early layer).
 * tests/fakecuda runs all of this against a stand-in for the runtime that is stricter than the
 * hardware.
 */
#include "backend.h"
#include "cudart.h"
#include "pool.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A blob whose last copy is queued; its host function sets copied. */
typedef struct landing {
    struct landing *next;
    size_t blob;
    atomic_int copied;
} landing;

typedef struct stage {
    unsigned char *buf;
    cudaEvent_t event;
    int used;            /* a copy out of buf was queued: wait for event before refilling it */
} stage;

struct reader {
    void (*on_landed)(void *ctx, size_t b);
    void *ctx;
    struct ckl_pool *pool;
    size_t buffer_size;
    int ordinal;
    cudaStream_t stream;
    unsigned nstages, turn;
    stage *current;      /* the buffer stage() handed out last, for put() */
    /* The landings not reported yet, in stream order, so they are copied in this order. The
     * reader frees them, not their host functions: in a lost context the runtime drops host
     * functions without running them (cuLaunchHostFunc). Once close() has synchronized the
     * stream, each has run or (the synchronize failed) never will. */
    landing *first, *last;
    stage stages[];
};

static int cuda_check(int ordinal, char *why, size_t len)
{
    if (cudart_open(why, len) != 0)
        return -1;
    int count = 0;
    cudaError_t e = cudart.GetDeviceCount(&count);
    if (e == cudaSuccess && ordinal >= 0 && ordinal < count)
        return 0;
    if (e != cudaSuccess)
        snprintf(why, len, "no CUDA device is visible (%s)", cudart.GetErrorString(e));
    else if (count == 0)
        snprintf(why, len, "no CUDA device is visible");
    else
        snprintf(why, len, "no CUDA device %d (%d visible)", ordinal, count);
    return -1;
}

/* The block is allocated with ordinal current, and the caller's current device put back after:
 * it is per host thread, and the caller's own (torch's current device, say) must not move. */
static void *cuda_alloc(int ordinal, size_t n, char *why, size_t len)
{
    void *block = NULL;
    int was = 0;
    cudaError_t e = cudart.GetDevice(&was);
    if (e == cudaSuccess)
        e = cudart.SetDevice(ordinal);
    if (e == cudaSuccess) {
        e = cudart.Malloc(&block, n);
        cudaError_t back = cudart.SetDevice(was);
        if (e == cudaSuccess && back != cudaSuccess) {
            cudart.Free(block);
            e = back;
        }
    }
    if (e == cudaSuccess)
        return block;
    cudart.GetLastError(); /* so that the caller's next CUDA check does not see it */
    snprintf(why, len, "%s (%zu bytes on cuda:%d)",
             e == cudaErrorMemoryAllocation ? "out of device memory" : cudart.GetErrorString(e), n,
             ordinal);
    return NULL;
}

static void cuda_free(void *block, size_t n)
{
    (void)n;
    cudart.DeviceSynchronize(); /* no copy or callback may outlive the block */
    cudart.Free(block);
}

static void free_pinned(void *b)
{
    cudart.FreeHost(b);
}

/* on_landed for the blobs at the front of the queue whose host function has run. */
static void report_landed(reader *r)
{
    while (r->first && atomic_load(&r->first->copied)) {
        landing *c = r->first;
        r->first = c->next;
        r->last = r->first ? r->last : NULL;
        r->on_landed(r->ctx, c->blob);
        free(c);
    }
}

static void cuda_close(reader *r)
{
    if (r->stream)
        cudart.StreamSynchronize(r->stream);
    report_landed(r);
    for (unsigned k = 0; k < r->nstages; k++) {
        if (r->stages[k].event)
            cudart.EventDestroy(r->stages[k].event);
        if (r->stages[k].buf)
            pool_keep(r->pool, r->stages[k].buf, r->buffer_size, free_pinned);
    }
    if (r->stream)
        cudart.StreamDestroy(r->stream);
    for (landing *c = r->first, *next; c; c = next) { /* dropped by a lost context */
        next = c->next;
        free(c);
    }
    free(r);
}

static reader *cuda_open(const reader_setup *s, char *why, size_t len)
{
    reader *r = calloc(1, sizeof *r + s->buffers * sizeof *r->stages);
    if (!r) {
        snprintf(why, len, "out of memory");
        return NULL;
    }
    r->on_landed = s->on_landed;
    r->ctx = s->ctx;
    r->pool = s->pool;
    r->buffer_size = s->buffer_size;
    r->ordinal = s->ordinal;
    r->nstages = s->buffers;
    cudaError_t e = cudart.SetDevice(s->ordinal);
    if (e == cudaSuccess)
        e = cudart.StreamCreateWithFlags(&r->stream, cudaStreamNonBlocking);
    for (unsigned k = 0; e == cudaSuccess && k < r->nstages; k++) {
        void *b = pool_take(s->pool, s->buffer_size);
        if (!b && (e = cudart.HostAlloc(&b, s->buffer_size, cudaHostAllocDefault)) != cudaSuccess)
            break;
        r->stages[k].buf = b;
        e = cudart.EventCreateWithFlags(&r->stages[k].event, cudaEventDisableTiming);
    }
    if (e != cudaSuccess) {
        snprintf(why, len, "cannot set up pinned buffers and a stream on cuda:%d: %s",
                 s->ordinal, cudart.GetErrorString(e));
        cuda_close(r);
        return NULL;
    }
    return r;
}

static unsigned char *cuda_stage(reader *r, unsigned char *dst, size_t n, char *why, size_t len)
{
    (void)dst, (void)n;
    stage *s = r->current = &r->stages[r->turn++ % r->nstages];
    cudaError_t e = s->used ? cudart.EventSynchronize(s->event) : cudaSuccess;
    if (e != cudaSuccess) {
        snprintf(why, len, "copying to cuda:%d: %s", r->ordinal, cudart.GetErrorString(e));
        return NULL;
    }
    report_landed(r);
    return s->buf;
}

static int cuda_put(reader *r, unsigned char *dst, const unsigned char *p, size_t n, char *why,
                    size_t len)
{
    cudaError_t e = cudart.MemcpyAsync(dst, p, n, cudaMemcpyHostToDevice, r->stream);
    if (e == cudaSuccess)
        e = cudart.EventRecord(r->current->event, r->stream);
    if (e != cudaSuccess) {
        snprintf(why, len, "copying to cuda:%d: %s", r->ordinal, cudart.GetErrorString(e));
        return -1;
    }
    r->current->used = 1;
    return 0;
}

static int cuda_copy(reader *r, unsigned char *dst, const unsigned char *src, size_t n, char *why,
                     size_t len)
{
    cudaError_t e = cudart.MemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, r->stream);
    if (e != cudaSuccess)
        snprintf(why, len, "copying on cuda:%d: %s", r->ordinal, cudart.GetErrorString(e));
    return e == cudaSuccess ? 0 : -1;
}

/* No CUDA here, nor anything that may call it: only the mark the reader looks for. */
static void CUDART_CB on_copied(void *p)
{
    atomic_store(&((landing *)p)->copied, 1);
}

static int cuda_landed(reader *r, size_t blob, char *why, size_t len)
{
    landing *c = malloc(sizeof *c);
    if (!c) {
        snprintf(why, len, "out of memory");
        return -1;
    }
    c->next = NULL;
    c->blob = blob;
    atomic_init(&c->copied, 0);
    cudaError_t e = cudart.LaunchHostFunc(r->stream, on_copied, c);
    if (e != cudaSuccess) {
        free(c);
        snprintf(why, len, "cannot track it on its CUDA stream: %s", cudart.GetErrorString(e));
        return -1;
    }
    if (r->last)
        r->last->next = c;
    else
        r->first = c;
    r->last = c;
    return 0;
}

/* The block's legacy IPC handle (cudaIpcGetMemHandle: the block is its own cudaMalloc, so its
 * base is the allocation's). */
static int cuda_share(void *block, unsigned char *handle, size_t handle_size, char *why,
                      size_t len)
{
    cudaIpcMemHandle_t h;
    _Static_assert(sizeof h.reserved == CUDA_IPC_HANDLE_SIZE, "the runtime's handle");
    cudaError_t e = handle_size == sizeof h.reserved ? cudart.IpcGetMemHandle(&h, block)
                                                      : cudaErrorInvalidValue;
    if (e != cudaSuccess) {
        cudart.GetLastError();
        snprintf(why, len, "cannot export the block (cudaIpcGetMemHandle: %s)",
                 cudart.GetErrorString(e));
        return -1;
    }
    memcpy(handle, h.reserved, sizeof h.reserved);
    return 0;
}

/* The bytes of the allocation holding p from p on, as the driver says: 0, or -1 with why set. */
static int room_from(const void *p, size_t *room, char *why, size_t len)
{
    uintptr_t base;
    size_t size;
    if (cudart_address_range(p, &base, &size, why, len) != 0)
        return -1;
    if ((uintptr_t)p < base || (uintptr_t)p - base > size) {
        snprintf(why, len, "the driver places the mapping at %p outside its allocation", p);
        return -1;
    }
    *room = size - ((uintptr_t)p - base);
    return 0;
}

/* Maps on ordinal (made current for the call, the caller's put back: cuda_alloc says why). */
static void *cuda_attach(int ordinal, const unsigned char *handle, size_t handle_size,
                         size_t *room, char *why, size_t len)
{
    cudaIpcMemHandle_t h;
    void *p = NULL;
    int was = 0, sized = -1;
    if (handle_size != sizeof h.reserved || cuda_check(ordinal, why, len) != 0)
        return NULL;
    memcpy(h.reserved, handle, sizeof h.reserved);
    cudaError_t e = cudart.GetDevice(&was);
    if (e == cudaSuccess && (e = cudart.SetDevice(ordinal)) == cudaSuccess) {
        e = cudart.IpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
        sized = e == cudaSuccess ? room_from(p, room, why, len) : -1;
        if (e == cudaSuccess && sized != 0)
            cudart.IpcCloseMemHandle(p);
        cudart.SetDevice(was);
    }
    if (sized == 0)
        return p;
    if (e == cudaSuccess) /* mapped, but its size unknown: why says so */
        return NULL;
    cudart.GetLastError();
    snprintf(why, len, "cannot map the served block on cuda:%d (cudaIpcOpenMemHandle: %s)",
             ordinal, cudart.GetErrorString(e));
    return NULL;
}

static void cuda_detach(int ordinal, void *block)
{
    int was = 0;
    if (cudart.GetDevice(&was) == cudaSuccess && cudart.SetDevice(ordinal) == cudaSuccess) {
        cudart.IpcCloseMemHandle(block);
        cudart.SetDevice(was);
    }
}

static const backend cuda = {
    .check = cuda_check, .alloc = cuda_alloc, .free = cuda_free, .open = cuda_open,
    .stage = cuda_stage, .put = cuda_put, .copy = cuda_copy, .landed = cuda_landed,
    .close = cuda_close, .share = cuda_share, .attach = cuda_attach, .detach = cuda_detach,
};
const backend *const backend_cuda = &cuda;
