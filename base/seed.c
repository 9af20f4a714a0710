#include "seed.h"

#include <sys/random.h>
#include <time.h>

uint64_t ck_hash_seed(void)
{
    uint64_t seed;
    if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) == (ssize_t)sizeof seed)
        return seed;
    return (uint64_t)(uintptr_t)&seed ^ (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull;
}
