#include "arena.h"

#include <stdlib.h>

struct ck_arena {
    struct ck_arena *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

enum { ARENA_BLOCK = 256 * 1024 };

void *ck_arena_alloc(ck_arena **arena, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    ck_arena *a = *arena;
    if (!a || a->cap - a->used < n) {
        size_t cap = n > ARENA_BLOCK ? n : ARENA_BLOCK;
        ck_arena *b = malloc(sizeof *b + cap);
        if (!b)
            return NULL;
        b->used = 0;
        b->cap = cap;
        /* An oversized block goes behind the current one, whose free tail stays in use. */
        if (a && n > ARENA_BLOCK) {
            b->next = a->next;
            a->next = b;
        } else {
            b->next = a;
            *arena = b;
        }
        a = b;
    }
    void *p = a->data + a->used;
    a->used += n;
    return p;
}

void ck_arena_free(ck_arena *a)
{
    while (a) {
        ck_arena *next = a->next;
        free(a);
        a = next;
    }
}
