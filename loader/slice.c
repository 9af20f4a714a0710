/* slice.c — one rank's part of a tensor as a view of its entry (slice.h). */
#include "slice.h"
#include "../base/names.h" /* ck_name_selected: rules read globs as --only does */

#include <string.h>

int ck_slice_dim(const ck_slicing *s, const char *name, size_t len)
{
    for (size_t i = 0; s && i < s->nrules; i++)
        if (ck_name_selected(name, len, s->rules[i].glob))
            return s->rules[i].dim < 0 ? -1 : s->rules[i].dim;
    return -1;
}

void ck_slice_part(int64_t n, unsigned rank, unsigned world, int64_t *start, int64_t *len)
{
    int64_t each = world ? (n + (int64_t)world - 1) / (int64_t)world : n;
    int64_t at = (int64_t)rank * each;
    *start = at < n ? at : n;
    *len = n - *start < each ? n - *start : each;
}

/* Why e cannot be cut along dim into the part [start, start+len), or NULL: a block of a dtype
 * stored in blocks must stay whole, and only a contiguous part can keep them so (the gather
 * reads whole elements). */
static const char *uncuttable(const ck_entry *e, int contiguous, uint64_t inner, int64_t start,
                              int64_t len, uint64_t *off, uint64_t *bytes)
{
    enum ck_dtype dt = e->dtype;
    if (ck_dtype_block_elems(dt) == 1)
        return NULL;
    if (!contiguous)
        return "its dtype is stored in blocks of several elements, which a strided slice "
               "would split";
    if (ck_dtype_nbytes(dt, (uint64_t)start * inner, off) ||
        ck_dtype_nbytes(dt, (uint64_t)len * inner, bytes))
        return "its dtype is stored in blocks of several elements, which this cut would split";
    return NULL;
}

int ck_slice_entry(const ck_index *ix, const ck_entry *e, int dim, const ck_slicing *s,
                   ck_entry *out, int64_t *dims, ck_error *err)
{
    const char *src = ck_index_source(ix);
    int nl = (int)(e->name_len < 200 ? e->name_len : 200);
    if (e->kind != CK_TENSOR)
        return ck_fail(err, src, "'%.*s' is a value, not a tensor: it has no slices", nl, e->name);
    if (dim < 0 || dim >= e->rank)
        return ck_fail(err, src, "tensor '%.*s' has %u dimensions: no dimension %d to slice",
                       nl, e->name, e->rank, dim);
    if (e->layout == CK_DEFLATED)
        return ck_fail(err, src, "tensor '%.*s' is compressed (a deflated .npz entry): a slice "
                       "of it cannot be read without inflating it whole", nl, e->name);
    if (e->layout == CK_SWAPPED)
        return ck_fail(err, src, "tensor '%.*s' is big-endian in its source: load it whole, "
                       "or convert it first", nl, e->name);
    int64_t start, len;
    ck_slice_part(e->shape[dim], s->rank, s->world, &start, &len);
    unsigned rank = e->rank;
    if (e->layout == CK_CHUNKED) { /* a box of the chunks: only its start moves (index.h) */
        *out = *e;
        memcpy(dims, e->shape, 2 * rank * sizeof *dims);
        dims[dim] = len;
        dims[rank + dim] += start;
        out->shape = dims;
        return ck_tensor_nbytes(rank, dims, e->dtype, &out->nbytes) == 0 ? 0
               : ck_fail(err, src, "tensor '%.*s': its slice's size overflows", nl, e->name);
    }
    int contiguous = e->layout == CK_CONTIGUOUS;
    uint64_t inner = 1, esize = 0; /* elements after dim; one element's bytes */
    for (unsigned k = 0; k < rank; k++) {
        contiguous &= k >= (unsigned)dim || e->shape[k] == 1;
        inner *= k > (unsigned)dim ? (uint64_t)e->shape[k] : 1;
    }
    uint64_t off = 0, bytes = 0;
    const char *why = uncuttable(e, contiguous, inner, start, len, &off, &bytes);
    if (why)
        return ck_fail(err, src, "tensor '%.*s' (%s): cannot slice dimension %d: %s", nl,
                       e->name, ck_dtype_name(e->dtype), dim, why);
    *out = *e;
    memcpy(dims, e->shape, (e->layout == CK_STRIDED ? 2 : 1) * rank * sizeof *dims);
    dims[dim] = len;
    out->shape = dims;
    if (ck_dtype_block_elems(e->dtype) == 1) { /* whole-byte elements: offsets by element */
        ck_dtype_nbytes(e->dtype, 1, &esize);
        off = (uint64_t)start * inner * esize;
        bytes = (uint64_t)len * inner * esize;
        for (unsigned k = 0; k < rank; k++)
            bytes *= k < (unsigned)dim ? (uint64_t)e->shape[k] : 1;
    }
    if (!contiguous && e->layout == CK_CONTIGUOUS) { /* row-major strides of the source */
        out->layout = CK_STRIDED;
        int64_t stride = 1;
        for (unsigned k = rank; k-- > 0;) {
            dims[rank + k] = stride;
            stride *= e->shape[k];
        }
    }
    if (out->layout == CK_STRIDED)
        off = (uint64_t)start * (uint64_t)dims[rank + dim] * esize;
    out->ext.offset = e->ext.offset + (len ? off : 0);
    out->nbytes = out->ext.length = bytes;
    return 0;
}
