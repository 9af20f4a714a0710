/* tuning.h — what makes a mount fast without changing what it serves: the kernel's readahead
 * window for the mount, and the heap the parse grows into.
 *
 * Contract: each is a best effort: one that cannot be applied leaves things as they were.
 */
#ifndef CK_TUNING_H
#define CK_TUNING_H

void ck_set_readahead(const char *mnt, unsigned kb, int explicit);
void ck_keep_freed_memory(void);
void ck_prefault_heap(const char *source);

#endif
