/* pool.h — staging buffers kept across loads (ckl_pool, ckload.h): a CUDA reader's pinned
 * buffers, which are slow to pin, go back to the pool when the reader closes and are taken
 * again by the next reader that needs as many bytes.
 *
 * Contract: pool_take and pool_keep may be called from any thread; a buffer kept is the pool's
 * until taken again, and pool_free releases the ones still kept. The pool knows nothing of
 * what a buffer is: whoever keeps one says how it is released. It names the pool by its struct
 * tag and includes no header of the API: ckl_pool_new and ckl_pool_free (ckload.c) are
 * pool_new and pool_free.
 */
#ifndef CKL_POOL_H
#define CKL_POOL_H

#include <stddef.h>

struct ckl_pool;

/* An empty pool, or NULL when memory runs out. */
struct ckl_pool *pool_new(void);
/* Releases the buffers still kept, then the pool (NULL: nothing). */
void pool_free(struct ckl_pool *p);

/* A kept buffer of at least size bytes, or NULL: the caller makes a new one. */
void *pool_take(struct ckl_pool *p, size_t size);
/* Keeps buffer b (size bytes) for later loads; release frees it when the pool goes (or at once,
 * if it cannot be kept). */
void pool_keep(struct ckl_pool *p, void *b, size_t size, void (*release)(void *));

#endif
