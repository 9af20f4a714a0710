/* slice.h — tensor-parallel slices: one rank's part of a tensor, as a view of its index entry.
 *
 * Contract:
 *  - A slicing is an ordered list of rules (name glob or prefix, as ck_name_selected reads
 *    --only; dimension) and this process's rank among world_size. A tensor takes the dimension
 *    of the first rule that selects its name; -1, or no rule, means replicated: it is whole.
 *  - A dimension of n elements is split as torch.chunk(n, world_size) splits it: parts of
 *    ceil(n / world_size), the last smaller, and a rank past the parts torch returns (torch
 *    gives fewer when they run out: chunk(5, 4) is 2, 2, 1) gets an empty part.
 *  - ck_slice_entry derives the part as an entry over the same source bytes: a contiguous
 *    extent when the dimensions before the cut are all 1 (a dim-0 slice of a row-major tensor:
 *    one byte range), else CK_STRIDED (first element's offset and the source's strides, which
 *    ck_entry_read gathers with bounded memory): a strided PyTorch tensor's strides compose.
 *    Nothing is read. It refuses, with one line "FILE: tensor 'NAME': why": a value, a
 *    dimension the tensor does not have, a deflated (compressed .npz) entry, and a dtype stored
 *    in blocks (sub-byte floats, ggml's quantized types) where the cut would split a block or
 *    would need a strided gather.
 * No I/O, no CUDA.
 */
#ifndef CK_SLICE_H
#define CK_SLICE_H

#include <stddef.h>
#include <stdint.h>

#include "../index/index.h"

typedef struct ck_slice_rule {
    const char *glob; /* a glob or prefix over names, as --only */
    int dim;          /* the dimension to split; -1: replicated */
} ck_slice_rule;

typedef struct ck_slicing {
    const ck_slice_rule *rules;
    size_t nrules;
    unsigned rank, world; /* this process's part, of world (>= 1) */
    int parts_only;       /* a plan of the parts only: the tensors no rule cuts are left out
                           * (what one rank reads for another, ckload.h CKL_READ_PARTS) */
} ck_slicing;

/* The dimension s splits tensor name (len bytes) along, or -1 (whole). s NULL: -1. */
int ck_slice_dim(const ck_slicing *s, const char *name, size_t len);

/* Part `rank` of n elements split in `world` (torch.chunk): its first element and its length. */
void ck_slice_part(int64_t n, unsigned rank, unsigned world, int64_t *start, int64_t *len);

/* Entry e's part along dim for s's rank into *out, its dims (and strides when CK_STRIDED) in
 * dims (2 * CK_MAX_RANK room); out->shape points at dims, out->name at e's. 0, or -1 with err
 * set (see above). */
int ck_slice_entry(const ck_index *ix, const ck_entry *e, int dim, const ck_slicing *s,
                   ck_entry *out, int64_t *dims, ck_error *err);

#endif
