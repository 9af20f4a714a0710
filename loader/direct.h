/* direct.h — the cold-read policy of a load: which source files are read O_DIRECT, the memory
 * alignment those reads need, and how a blob is cut into chunks so that whole pages can land in
 * place while its partial first and last pages go through a bounce.
 *
 * Contract:
 *  - direct_open decides per source file of the index: a local file whose bytes the plan reads
 *    in place (not gathered) are mostly not in the page cache gets an O_DIRECT descriptor and
 *    its phase (the memory alignment the kernel asks of its O_DIRECT reads); any other file,
 *    or one where O_DIRECT is refused (tmpfs, a ckptfs mount) or whose path no longer names the
 *    file the index opened, is read through the page cache. CKLOAD_DIRECT=0 or 1 overrides the
 *    choice. It reads no byte of the checkpoint.
 *  - An O_DIRECT read covers whole DIRECT_ALIGN blocks of the file: a buffer it lands in is
 *    aligned to the file's phase and holds the chunk plus DIRECT_SLACK (direct_pread).
 *  - direct_close closes the descriptors (the files then read as not O_DIRECT), direct_free
 *    frees what direct_open made; both take a direct_files that direct_open never filled.
 */
#ifndef CKL_DIRECT_H
#define CKL_DIRECT_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"

/* O_DIRECT reads cover whole 4096-byte blocks: a buffer for them is aligned to this and holds a
 * chunk plus 2 blocks of slack (its unaligned head and tail). */
enum { DIRECT_ALIGN = 4096, DIRECT_SLACK = 2 * DIRECT_ALIGN };

typedef struct direct_files {
    int *fds;        /* per source file: its O_DIRECT descriptor, or -1 (read through the cache) */
    uint32_t *phase; /* per source file: the memory alignment its O_DIRECT reads need (a power of
                      * two, at most DIRECT_ALIGN); 0 when it is not read so */
    uint32_t nfiles;
    int any;         /* some file is read O_DIRECT */
} direct_files;

/* Each source file of ix, as the plan p reads it (above). 0, or -1 when memory runs out. */
int direct_open(direct_files *d, const ck_index *ix, const ck_plan *p);
void direct_close(direct_files *d);
void direct_free(direct_files *d);

/* Whether blob bl is read O_DIRECT: its file is, and it is not gathered. */
static inline int direct_reads(const direct_files *d, const ck_plan_blob *bl)
{
    return !bl->gather && d->fds && d->fds[bl->file] >= 0;
}

/* Whether blob bl's O_DIRECT reads can land at dst, where its bytes go in host memory: dst has
 * their phase in the file modulo the alignment those reads need. */
static inline int direct_in_place(const direct_files *d, const ck_plan_blob *bl,
                                  const unsigned char *dst)
{
    return direct_reads(d, bl) &&
           ((uintptr_t)dst - (uintptr_t)bl->file_off) % d->phase[bl->file] == 0;
}

/* Whether [off, off + n) of a file is whole DIRECT_ALIGN blocks: read straight where it goes. */
static inline int direct_whole(uint64_t off, uint64_t n)
{
    return off % DIRECT_ALIGN == 0 && n % DIRECT_ALIGN == 0;
}

/* The length of the chunk at file offset off with left bytes of its blob to go: at most max.
 * In place, chunks end on the file's DIRECT_ALIGN boundaries, so that each is whole blocks
 * (direct_whole) or a blob's partial first or last block. */
static inline size_t direct_chunk(uint64_t off, uint64_t left, size_t max, int in_place)
{
    uint64_t n = left < max ? left : max, head = -off % DIRECT_ALIGN;
    if (!in_place)
        return (size_t)n;
    if (head)
        return (size_t)(head < left ? head : left);
    uint64_t whole = n / DIRECT_ALIGN * DIRECT_ALIGN;
    return (size_t)(whole ? whole : n);
}

/* The first byte of the DIRECT_ALIGN block that holds file offset off. */
static inline uint64_t direct_start(uint64_t off)
{
    return off & ~(uint64_t)(DIRECT_ALIGN - 1);
}

/* Bytes [off, off + n) of fd, an O_DIRECT descriptor, read with the whole blocks around them
 * into buf (aligned to the file's phase, n + DIRECT_SLACK bytes); they start at buf + off %
 * DIRECT_ALIGN. 0, or -errno (-EIO: the file ends before off + n). */
int direct_pread(int fd, unsigned char *buf, uint64_t off, size_t n);

#endif
