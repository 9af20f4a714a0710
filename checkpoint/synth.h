/* synth.h — files synthesized from an index: the pack (FORMAT.md) and a safetensors file.
 *
 * Contract: a synthesized file (ck_synth) is a list of segments that together make the file: bytes held in memory
 * (header, index, the safetensors JSON), zeros (alignment padding), an entry's contents (read
 * through ck_entry_read, so strided tensors are gathered), and, for the pack, the checksum
 * trailer. Building one reads no tensor data. Reading any byte range is thread-safe; the
 * first read that touches the pack's trailer computes every blob checksum once (a pass over the
 * data) unless a writer already supplied them. ck_synth_write streams the whole file to an fd
 * with a bounded buffer, hashing blobs as they pass, so `ckpt pack` and the mount's virtual
 * pack are the same bytes by construction. No FUSE here.
 */
#ifndef CK_SYNTH_H
#define CK_SYNTH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../index/index.h"

typedef struct ck_synth ck_synth;

/* The pack of ix's entries, in natural name order. only: NULL for every entry, else a prefix
 * or a glob (fnmatch) over names; a name matches a prefix when it equals it or continues with
 * '.' after it. Fails on out-of-memory, or when only selects nothing. */
int ck_synth_pack(const ck_index *ix, const char *only, ck_synth **out, ck_error *err);

/* A safetensors file of ix's tensors (values and dtypes the spec lacks are left out; their
 * names are listed in __metadata__ "ckptfs.omitted"), natural name order, tied tensors copied. */
int ck_synth_safetensors(const ck_index *ix, ck_synth **out, ck_error *err);

/* The same, of entries[0..n) (tensors) in that order, as one file of a conversion or one shard:
 * __metadata__ is ix's metadata, then each pair of extra whose key is not already there. The
 * entries and extra are only read during the call. */
int ck_synth_safetensors_of(const ck_index *ix, const uint32_t *entries, uint32_t n,
                            const ck_meta *extra, size_t nextra, ck_synth **out, ck_error *err);

/* How the pack of ix's tensors selected by only (and by keep[entry] unless keep is NULL) groups
 * their bytes, as ck_synth_pack lays them
 * out (values left out): the tensors in pack order (natural name order) and each one's blob;
 * blobs are numbered by first use, and the tensors of one blob have the same bytes (tied, or
 * one storage range seen twice); blob_entry[b] is the entry whose bytes blob b holds. The
 * loader's plan (plan.h) takes this for every source but a pack, so a load from the source and
 * one from its virtual pack place the same bytes in the same order. Fails as ck_synth_pack
 * does (only selects no tensor, two entries with one name, out of memory). */
typedef struct ck_pack_groups {
    uint32_t *tensors;    /* entry numbers, in pack order */
    uint32_t *blob_of;    /* per tensor: its blob */
    uint32_t *blob_entry; /* per blob: the entry that supplies its bytes */
    uint32_t ntensors, nblobs;
} ck_pack_groups;

/* For each entry of ix, the entry it is an alias of: a tensor whose bytes its blob's owner
 * (ck_pack_groups' blob_entry: the first of them in the source's order) supplies, seen with the
 * same dtype and shape; UINT32_MAX for every other entry. What index.json's "alias_of", the
 * user.ckptfs.alias_of xattr, ckpt ls and info and a conversion's dropped names all ask.
 * malloc'ed (nentries); NULL with err set when memory runs out. */
uint32_t *ck_synth_aliases(const ck_index *ix, ck_error *err);

int ck_synth_groups(const ck_index *ix, const char *only, const unsigned char *keep,
                    ck_pack_groups *out, ck_error *err);
void ck_pack_groups_free(ck_pack_groups *g);

void ck_synth_free(ck_synth *sy);

uint64_t ck_synth_size(const ck_synth *sy);

/* Copies up to len bytes at off; returns the count (0 at the end) or -errno (-EIO when the
 * source is shorter than its index says). */
ssize_t ck_synth_read(ck_synth *sy, void *buf, size_t len, uint64_t off);

/* Calls fn(ctx, file) for each source file (an index of ix->files) that bytes [off, off+len)
 * are made from, and returns the first non-zero answer, else 0: an entry's bytes come from the
 * files ck_entry_each_file names for the part of it the range holds; the bytes held in memory (made by parsing every file) and the pack's trailer (hashed
 * from every file) from all of them; padding from none. A file may be named more than once.
 * So a reader can check only the sources a read depended on. */
int ck_synth_each_source(const ck_synth *sy, uint64_t off, size_t len,
                         int (*fn)(void *ctx, uint32_t file), void *ctx);

/* Progress: called now and then with bytes written so far; a non-zero return stops the write
 * (it fails with -ECANCELED). */
typedef int (*ck_progress)(void *ctx, uint64_t done, uint64_t total);

/* Writes the whole file to fd from its current position. 0, or -errno: -EIO when a source is
 * shorter than its index says, or is not by the end the file the index opened (ck_file_unchanged:
 * written to meanwhile, it may have given old and new bytes mixed). */
int ck_synth_write(ck_synth *sy, int fd, ck_progress progress, void *ctx);

#endif
