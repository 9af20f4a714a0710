/* The pool of staging buffers (pool.h): a buffer kept is taken again by a request it is large
 * enough for, never by a larger one, and the pool releases what it still keeps when it goes. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "../../loader/pool.h"

TestSuite(pool);

static int released;

static void release(void *b)
{
    released++;
    free(b);
}

Test(pool, kept_buffers_are_taken_again)
{
    struct ckl_pool *p = pool_new();
    cr_assert_not_null(p);
    cr_assert_null(pool_take(p, 1), "an empty pool");
    void *small = malloc(16), *big = malloc(64);
    pool_keep(p, small, 16, release);
    pool_keep(p, big, 64, release);
    cr_assert_null(pool_take(p, 65), "none is large enough");
    cr_assert_eq(pool_take(p, 64), big);
    cr_assert_null(pool_take(p, 17), "taken already");
    cr_assert_eq(pool_take(p, 8), small);
    pool_keep(p, small, 16, release);
    for (int i = 0; i < 40; i++) /* past the first allocation of its table */
        pool_keep(p, malloc(8), 8, release);
    cr_assert_eq(released, 0);
    pool_free(p);
    cr_assert_eq(released, 41);
    free(big);
}
