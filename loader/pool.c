/* pool.c — staging buffers kept across loads (pool.h). */
#include "pool.h"

#include <pthread.h>
#include <stdlib.h>

struct ckl_pool {
    pthread_mutex_t lock;
    struct kept {
        void *buf;
        size_t size;
        void (*release)(void *);
    } *kept;
    size_t n, cap;
};

struct ckl_pool *pool_new(void)
{
    struct ckl_pool *p = calloc(1, sizeof *p);
    if (p)
        pthread_mutex_init(&p->lock, NULL);
    return p;
}

void pool_free(struct ckl_pool *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n; i++)
        p->kept[i].release(p->kept[i].buf);
    free(p->kept);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

void *pool_take(struct ckl_pool *p, size_t size)
{
    void *b = NULL;
    pthread_mutex_lock(&p->lock);
    for (size_t i = 0; i < p->n && !b; i++)
        if (p->kept[i].size >= size) {
            b = p->kept[i].buf;
            p->kept[i] = p->kept[--p->n];
        }
    pthread_mutex_unlock(&p->lock);
    return b;
}

void pool_keep(struct ckl_pool *p, void *b, size_t size, void (*release)(void *))
{
    pthread_mutex_lock(&p->lock);
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 16;
        struct kept *k = realloc(p->kept, cap * sizeof *k);
        if (k) {
            p->kept = k;
            p->cap = cap;
        }
    }
    int keep = p->n < p->cap;
    if (keep)
        p->kept[p->n++] = (struct kept){.buf = b, .size = size, .release = release};
    pthread_mutex_unlock(&p->lock);
    if (!keep)
        release(b);
}
