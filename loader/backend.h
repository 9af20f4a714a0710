/* backend.h — where a load's block lives and how a chunk read from the source gets into it: one
 * backend per kind of memory, backend_cpu.c and backend_cuda.c (backend_nocuda.c stands in for
 * the latter where libckload is built without the CUDA toolkit).
 *
 * Contract:
 *  - The core (ckload.c) plans the load, runs the reader threads, reads every chunk from the
 *    source and keeps track of readiness and errors. A backend owns only memory and movement:
 *    the destination block, a reader thread's staging, and the copy of a chunk into the block.
 *    It calls nothing of the core's: what it tells the core goes through reader_setup.
 *  - A reader thread opens one backend reader; per chunk it asks stage() where to read it, reads
 *    it there and hands the bytes to put(); after a blob's last chunk (and its checksum) it calls
 *    landed(), and the backend calls the setup's on_landed once every put before it has
 *    completed: at once, or later from the reader's thread. close() waits for all of that.
 *  - Functions that can fail return -1 (or NULL) and write the reason to why, one line without
 *    the file name: the core adds "FILE: " and what it was doing.
 *  - backend_cuda.c calls the CUDA runtime API only, opened at its first use (cudart.h), so
 *    that a machine without CUDA loads to the host and a stand-in for libcudart can take its
 *    place.
 */
#ifndef CKL_BACKEND_H
#define CKL_BACKEND_H

#include <stddef.h>

struct ckl_pool; /* pool.h */

typedef struct reader reader; /* one reader thread's state, the backend's own */

typedef struct reader_setup {
    /* Blob b has landed: every put before landed(b) has completed. Called from the reader's
     * thread, never from a thread of the backend's (on_landed may start the caller's work). */
    void (*on_landed)(void *ctx, size_t b);
    void *ctx;
    struct ckl_pool *pool; /* staging buffers come from it and go back to it */
    size_t buffer_size;    /* bytes a staging buffer must hold (a chunk plus DIRECT_SLACK) */
    unsigned buffers;      /* staging buffers per reader (CUDA) */
    int ordinal;           /* the device */
    int direct;            /* reads are O_DIRECT: they need an aligned buffer, not the block */
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
    /* on_landed(ctx, blob) once every put so far has completed. */
    int (*landed)(reader *r, size_t blob, char *why, size_t len);
    void (*close)(reader *r);
    /* Memory shared with other processes on this machine (share.h); NULL where the block is
     * this process's alone (the host's). share: the IPC handle (handle_size bytes at handle) of a
     * block alloc() gave. attach: the block another process shared, mapped on device ordinal,
     * and in *room the bytes the mapping holds from there on, as the driver says (the other
     * process's word on the block's size is no proof). detach: unmaps what attach mapped. */
    int (*share)(void *block, unsigned char *handle, size_t handle_size, char *why, size_t len);
    void *(*attach)(int ordinal, const unsigned char *handle, size_t handle_size, size_t *room,
                    char *why, size_t len);
    void (*detach)(int ordinal, void *block);
} backend;

extern const backend backend_cpu;
/* NULL in a libckload built without the CUDA toolkit. */
extern const backend *const backend_cuda;

/* Faults the pages of host memory [p, p + n) in (whole pages: the first and last may hold other
 * bytes, which it keeps): in a loop in the kernel (MADV_POPULATE_WRITE) rather than one
 * exception per page inside a read's copy. 0, or -1 where the kernel lacks it (before 5.14):
 * the reads then fault the pages. */
int backend_cpu_populate(unsigned char *p, size_t n);

#endif
