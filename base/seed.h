/* seed.h — seeds for the hash tables that index checkpoint data (pickle objects, zip names, the
 * tree's paths).
 * Contract: ck_hash_seed returns 64 random bits (getrandom, else a mix of the clock and an
 * address), so a checkpoint cannot be made of keys that all collide: a hash table over its data
 * stays linear in its size whatever the file holds.
 */
#ifndef CK_SEED_H
#define CK_SEED_H

#include <stdint.h>

uint64_t ck_hash_seed(void);

#endif
