/* tuning.h — what makes a mount fast without changing what it serves: the kernel's readahead
 * window for the mount, and the heap the parse of SOURCE grows into.
 *
 * Contract: each is a best effort: what cannot be applied leaves things as they were, and
 * only ck_set_readahead asked for explicitly says so (one line on stderr, not fatal).
 */
#ifndef CK_TUNING_H
#define CK_TUNING_H

/* Sets the kernel's readahead window of the mount at mnt to kb KiB, once the mount exists.
 * Only root may: for others, and for kb 0, the kernel's default stays. explicit: -o readahead
 * was given, and a failure is reported. */
void ck_set_readahead(const char *mnt, unsigned kb, int explicit);

/* Keeps the memory the parse frees in the process's one heap, for the tree, index.json and the
 * serving threads to reuse, rather than handed back to the kernel between uses; bounded, blocks
 * above a threshold still come from and go back to the kernel. Called first, before anything
 * is allocated. */
void ck_keep_freed_memory(void);

/* Faults in, on a helper thread, the heap the parse of SOURCE (a local path) is about to grow
 * into, sized by SOURCE's size. Nothing where the heap is not malloc's brk heap (the
 * sanitizers'), the advice is refused, or one CPU is all there is. */
void ck_prefault_heap(const char *source);

#endif
