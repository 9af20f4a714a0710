/* plan.h — where a load puts a checkpoint's tensors: the planning step of libckload, without I/O.
 *
 * Contract: ck_plan_make takes an index of any source ck_open reads (a pack, a safetensors file,
 * a shard directory, a PyTorch file), `only` (NULL, or a prefix or glob as ck_name_selected
 * says) and `keep` (NULL, or one flag per index entry: a subtree of a mount) and returns:
 *  - the selected tensors in pack order (natural name order), each with its entry and its blob
 *    in the plan (CK_PLAN_NONE for an empty tensor: it needs no bytes);
 *  - the blobs those tensors need, in pack order, each once however many tensors share it (tied
 *    tensors are one blob): where its bytes come from (len bytes of one source file at
 *    file_off, or, for a strided PyTorch tensor, its entry, read through ck_entry_read), its
 *    number in the pack (for a pack file: its checksum's place in the trailer), its place in
 *    one destination block (a multiple of CK_PLAN_ALIGN, in plan order, each at the first such
 *    place after the one before), its first tensor's name for messages, and its tensors
 *    (blob_tensors[first .. first + count), ascending): telling the tensors of a landed blob
 *    costs the number of those tensors, not a scan of all of them;
 *  - the block's size, and whether the source stores checksums (a pack does; nothing else).
 * For a pack the layout comes only from the reader (pack_layout_of), which checked it against
 * FORMAT.md; for any other source the grouping and order come from the virtual pack
 * (ck_synth_groups), so a load from the source and one from its mount's checkpoint.pack give
 * the same block (until ck_plan_keep_phase moves blobs for in-place O_DIRECT reads). Nothing
 * here re-derives either. Building a plan reads no file.
 * Slices (ck_plan_make_sliced): a tensor that the slicing cuts (slice.h) is planned as its
 * part, a view the plan owns: its entry has the part's shape and bytes, its blob is the part's
 * own (contiguous extent or strided gather of the source; tied tensors cut alike share one),
 * marked sliced, with no stored checksum (pack_blob CK_PLAN_NONE: a pack's checksum covers
 * the whole blob). A tensor that cannot be cut fails the plan with the slice's message.
 * Shares (ck_plan_share): which rank of a group reads each blob for all of them. Errors are one
 * line "FILE: what is wrong": `only` selects nothing, two entries with one name, out of memory.
 * No CUDA, no FUSE.
 */
#ifndef CK_PLAN_H
#define CK_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "../index/index.h"

#define CK_PLAN_ALIGN 256u      /* every tensor can be the target of an aligned GPU copy */
#define CK_PLAN_NONE UINT32_MAX /* the blob of an empty tensor */
#define CK_PLAN_EVERY (UINT32_MAX - 1) /* a blob's owner: every rank reads it (its own part) */
#define CK_PLAN_PHASE_MIN 8u    /* a blob keeps its phase only if 8x its modulus: its padding
                                 * (ck_plan_keep_phase) stays under 1/8 of it */

typedef struct ck_plan_blob {
    uint64_t file_off, len;  /* where its bytes are in file (unless gathered) */
    uint64_t dest_off;       /* where they go in the block */
    uint32_t file;           /* the source file's id in the index */
    uint32_t pack_blob;      /* its number in the (virtual) pack: a pack file's trailer place */
    const ck_entry *gather;  /* NULL: the bytes are contiguous in file; else read them with
                              * ck_entry_read of this entry (strided: gathered element-wise) */
    const char *name;        /* its first tensor's name, owned by the index */
    uint32_t first, count;   /* its tensors: blob_tensors[first .. first + count) */
    uint32_t owner;          /* the rank that reads it (ck_plan_share); CK_PLAN_EVERY: each */
    uint8_t sliced;          /* a part of its tensors' source bytes (slice.h) */
    uint8_t elsewhere;       /* its bytes go to memory outside the block (the loader's caller's,
                              * set before placing): it takes no room there, dest_off is 0 */
} ck_plan_blob;

typedef struct ck_plan_tensor {
    const ck_entry *entry;   /* in the index, or the plan's view of its part (sliced) */
    const ck_entry *whole;   /* in the index, whole: entry unless sliced */
    uint32_t blob;           /* in blobs[], or CK_PLAN_NONE for an empty tensor */
    uint8_t sliced;          /* entry is the plan's view of a part (ck_plan_make_sliced) */
} ck_plan_tensor;

typedef struct ck_plan {
    ck_plan_tensor *tensors; /* the selected tensors, in pack order */
    size_t ntensors;
    ck_plan_blob *blobs;     /* the blobs they need, in file order */
    size_t nblobs;
    uint32_t *blob_tensors;  /* tensor numbers grouped by blob (see ck_plan_blob.first) */
    uint64_t block_size;     /* the end of the last blob in the block; 0 when there is none */
    int stored_sums;         /* the source is a pack: ck_plan_sums can tell its checksums */
} ck_plan;

/* What ck_plan_make returns when the caller's own arguments are refused (`only` selects nothing, a
 * slice rule cannot cut a tensor it selects), rather than the checkpoint or memory (-1). */
#define CK_PLAN_REFUSED (-2)

/* Whether only and keep (as ck_plan_make takes them) select a tensor of ix. */
int ck_plan_selects(const ck_index *ix, const char *only, const unsigned char *keep);

/* The plan of ix's tensors selected by only and keep into *out (ck_plan_free frees it). 0, or -1
 * or CK_PLAN_REFUSED with err set and *out NULL. */
int ck_plan_make(const ck_index *ix, const char *only, const unsigned char *keep, ck_plan **out,
                 ck_error *err);

struct ck_slicing;
/* As ck_plan_make, each tensor that slicing (NULL, or slice.h's rules: a rule-less one cuts
 * nothing) cuts planned as its part, and with parts_only the others left out. Also fails with
 * the message of a slice refused (CK_PLAN_REFUSED). */
int ck_plan_make_sliced(const ck_index *ix, const char *only, const unsigned char *keep,
                        const struct ck_slicing *slicing, ck_plan **out, ck_error *err);

/* Who reads what when world ranks load one plan each (the same selection and slicing, so the
 * same whole blobs in the same order): CK_READ_ALL, each rank every blob (what ck_plan_make
 * sets); CK_READ_BALANCED, each whole blob by one rank, the one that has least so far, in plan
 * order (so each reads at most 1/world of the whole blobs' bytes plus one blob), and each part
 * by its own rank (CK_PLAN_EVERY); CK_READ_RANK0, every blob by rank 0. Sets each blob's owner.
 * 0, or -1 when memory runs out. */
enum ck_plan_read { CK_READ_ALL, CK_READ_BALANCED, CK_READ_RANK0 };
int ck_plan_share(ck_plan *p, enum ck_plan_read read, unsigned world);

/* Places p's blobs again for a host load that reads source file f with O_DIRECT straight into
 * the block wherever a blob's place there has its file offset's phase modulo phase[f] (the
 * memory alignment O_DIRECT needs, a power of two; 0: f is not read so). Each blob that is
 * contiguous in its file, at least CK_PLAN_PHASE_MIN * phase[f] long, and at a file offset
 * aligned to each of its tensors' elements goes to the first place after the blob before with
 * that phase; every other blob to the next CK_PLAN_ALIGN boundary, as ck_plan_make placed it.
 * A tensor moved so is aligned in the block as it is in its file (at least to its element, to
 * 256 bytes where its file offset is), as an mmap of the file would give it; a pack's blobs are
 * 256-aligned in its file, so they stay where ck_plan_make put them. The order, the blobs and
 * their tensors do not change; block_size grows by less than phase[f] per blob moved. phase
 * NULL places them as ck_plan_make did. Either way a blob marked elsewhere takes no room. */
void ck_plan_keep_phase(ck_plan *p, const uint32_t *phase);

void ck_plan_free(ck_plan *p);

/* The checksums a pack's trailer stores for p's blobs (after checking the trailer's own):
 * sums[b] for p->blobs[b] (0 for a part, which has none). Reads the trailer (8 bytes a blob of the whole pack). 0, or -1 with
 * err set: "FILE: not a pack (it is FORMAT)" (no stored_sums), "FILE: the checksum table is
 * corrupt", a read error, out of memory. */
int ck_plan_sums(const ck_index *ix, const ck_plan *p, uint64_t *sums, ck_error *err);

#endif
