/* arena.h — bump allocation for many small objects that all die together (names, shapes).
 * Contract: ck_arena_alloc returns 16-byte-aligned memory valid until ck_arena_free of the same
 * arena (an arena pointer starting NULL), or NULL when out of memory. Not thread-safe.
 */
#ifndef CK_ARENA_H
#define CK_ARENA_H

#include <stddef.h>

typedef struct ck_arena ck_arena;

void *ck_arena_alloc(ck_arena **arena, size_t n);
void ck_arena_free(ck_arena *arena);

#endif
