/* names.h — tensor names: their natural order, and which a selection picks.
 *
 * Contract: every list of tensors ckptfs shows, writes or loads (a pack's index, a mount's
 * directories, the virtual files, a load's block) is in ck_natural_cmp's order, and every
 * `only` (ckpt --only, ckl_options.only, slice rules) selects names as ck_name_selected does.
 * Pure functions.
 */
#ifndef CK_NAMES_H
#define CK_NAMES_H

#include <stddef.h>

/* Whether name (len bytes, NUL-terminated) is selected by only: NULL selects all; else a name
 * that equals only or continues it with '.' (only ending in '.': any name it begins), or that
 * matches it as a glob (fnmatch). */
int ck_name_selected(const char *name, size_t len, const char *only);

/* The edit distance (insertions, deletions, substitutions of bytes) between a and b when it is
 * at most max, else max + 1 (told from the lengths alone where they differ by more); names of
 * over CK_DISTANCE_MAX_LEN bytes are max + 1 from everything. For "did you mean" on a miss. */
#define CK_DISTANCE_MAX_LEN 256
size_t ck_name_distance(const char *a, size_t alen, const char *b, size_t blen, size_t max);

/* Natural order of names: digit runs compare as numbers ("layers.2" < "layers.10"). */
int ck_natural_cmp(const char *a, size_t alen, const char *b, size_t blen);

/* The indices 0..n-1 of keys (n C strings) sorted by strcmp, equal keys in index order, so that
 * each run of equal keys is one key's occurrences, first to last: how a repeated key is found
 * (and which occurrence wins) in O(n log n) instead of a search per key. malloc'ed (n of them);
 * NULL when memory runs out. */
size_t *ck_names_grouped(const char *const *keys, size_t n);

/* For each of keys (n C strings), whether an earlier one equals it: 1 for the repeats, 0 for
 * each key's first occurrence. malloc'ed (n bytes); NULL when memory runs out. O(n log n). */
unsigned char *ck_names_repeated(const char *const *keys, size_t n);

#endif
