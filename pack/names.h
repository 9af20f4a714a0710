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
 * that equals only or continues it with '.', or that matches it as a glob (fnmatch). */
int ck_name_selected(const char *name, size_t len, const char *only);

/* Natural order of names: digit runs compare as numbers ("layers.2" < "layers.10"). */
int ck_natural_cmp(const char *a, size_t alen, const char *b, size_t blen);

#endif
