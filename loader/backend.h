/* backend.h — where a load's block lives and how a chunk read from the pack gets into it: one
 * backend per kind of memory, backend_cpu.c and backend_cuda.c (backend_nocuda.c stands in for
 * the latter where libckload is built without the CUDA toolkit).
 *
 * Contract:
 *  - The core (ckload.c) plans the load, runs the reader threads, reads every chunk from the
 *    pack and keeps track of readiness and errors. A backend owns only memory and movement:
 *    the destination block, a reader thread's staging, and the copy of a chunk into the block.
 *  - A reader thread opens one backend reader; per chunk it asks stage() where to read it, reads
 *    it there and hands the bytes to put(); after a blob's last chunk (and its checksum) it calls
 *    landed(), and the backend calls blob_landed() once every put before it has completed: at
 *    once, or later from a thread of its own. close() waits for all of that.
 *  - Functions that can fail return -1 (or NULL) and write the reason to why, one line without
 *    the file name: the core adds "FILE: " and what it was doing.
 *  - backend_cuda.c calls the CUDA runtime API only, opened at its first use (cudart.h), so
 *    that a machine without CUDA loads to the host and a stand-in for libcudart can take its
 *    place.
 */
#ifndef CKL_BACKEND_H
#define CKL_BACKEND_H

#include "ckload.h"

/* O_DIRECT reads cover whole 4096-byte blocks: a reader's buffer is aligned to this and holds a
 * chunk plus 2 blocks of slack. */
enum { DIRECT_ALIGN = 4096, DIRECT_SLACK = 2 * DIRECT_ALIGN };

typedef struct reader reader; /* one reader thread's state, the backend's own */

typedef struct reader_setup {
    ckl_load *load;      /* passed back to blob_landed */
    ckl_pool *pool;      /* staging buffers come from it and go back to it */
    size_t buffer_size;  /* bytes a staging buffer must hold (a chunk plus DIRECT_SLACK) */
    unsigned buffers;    /* staging buffers per reader (CUDA) */
    int ordinal;         /* the device */
    int direct;          /* reads are O_DIRECT: they need an aligned buffer, not the block */
} reader_setup;

typedef struct backend {
    /* The block is host memory that the core may read into itself, bypassing stage() and put():
     * with O_DIRECT it does so for the chunks whose place in the block has the file's phase. */
    int in_place;
    /* 0 if device ordinal can take a load now. */
    int (*check)(int ordinal, char *why, size_t len);
    /* A destination block of n > 0 bytes on device ordinal; free() takes it back once no copy
     * into it is in flight. */
    void *(*alloc)(int ordinal, size_t n, char *why, size_t len);
    void (*free)(void *block, size_t n);
    reader *(*open)(const reader_setup *s, char *why, size_t len);
    /* Where to read the chunk of n bytes whose place in the block is dst: dst itself, or a
     * staging buffer (once the copy out of it has finished). */
    unsigned char *(*stage)(reader *r, unsigned char *dst, size_t n, char *why, size_t len);
    /* The n bytes at p, inside the buffer stage() gave, go to dst. */
    int (*put)(reader *r, unsigned char *dst, const unsigned char *p, size_t n, char *why,
               size_t len);
    /* The n bytes already at src in the destination's memory (a blob's place) go to dst there
     * too, after every put so far: a tied tensor the caller placed apart (ckl_options.dest). */
    int (*copy)(reader *r, unsigned char *dst, const unsigned char *src, size_t n, char *why,
                size_t len);
    /* blob_landed(load, blob) once every put so far has completed. */
    int (*landed)(reader *r, size_t blob, char *why, size_t len);
    void (*close)(reader *r);
} backend;

extern const backend cpu_backend;
/* NULL in a libckload built without the CUDA toolkit. */
extern const backend *const cuda_backend;

/* Faults the pages of host memory [p, p + n) in (whole pages: the first and last may hold other
 * bytes, which it keeps). A read into fresh memory faults each page inside the kernel's copy,
 * one exception per page; MADV_POPULATE_WRITE faults them in a loop in the kernel. Pages
 * already there cost a page-table walk. 0, or -1 where the kernel lacks it (before 5.14): the
 * reads then fault the pages as before. backend_cpu.c. */
int populate(unsigned char *p, size_t n);

/* What the core gives its backends (ckload.c). Blob b of load l is in place. */
void blob_landed(ckl_load *l, size_t b);
/* A kept staging buffer of at least size bytes, or NULL: the caller makes a new one. */
void *pool_take(ckl_pool *p, size_t size);
/* Keeps buffer b (size bytes) for later loads; release frees it when the pool goes (or at once,
 * if it cannot be kept). */
void pool_keep(ckl_pool *p, void *b, size_t size, void (*release)(void *));

#endif
