/* torch.h — PyTorch checkpoints: the zip format (torch >= 1.6) and the legacy format.
 *
 * Contract: the object pickle is decoded by the safe VM (pickle.h), never executed. Its tree of
 * dicts, lists and tuples becomes entry names joined with '.' (dict keys as Python's str() of
 * the key, list and tuple indices in decimal); tensors become tensor entries whose bytes stay in
 * the source file (one extent when contiguous, a strided gather otherwise), and None, bool, int,
 * float, str and bytes leaves become value entries (text: Python's str() and a newline; bytes
 * raw). A tensor that is not a container's child is named "". Every tensor is bounds-checked
 * against its storage record. Only the headers are read: the central directory and local
 * headers (zip), or the pickles and one 8-byte count per storage (legacy).
 */
#ifndef CK_TORCH_H
#define CK_TORCH_H

#include "index.h"
#include "zip.h"

#define PT_MAX_PICKLE (256u << 20) /* the object pickle may not be bigger */

#define PT_PROBE_BYTES 32 /* what pt_probe_legacy needs to see */

/* True when head (the first n bytes) starts a legacy torch file (its magic-number pickle). */
int pt_probe_legacy(const unsigned char *head, size_t n);

/* Parse file `file` of ix (already added) and append its entries: a zip whose directory z
 * (zip_read_directory) is read, or a legacy file. */
int pt_read_zip(ck_index *ix, uint32_t file, const zip_archive *z, ck_error *err);
int pt_read_legacy(ck_index *ix, uint32_t file, ck_error *err);

/* A torch.save archive inside file `file` of ix, its size bytes at base (DCP writes them end to
 * end; a .pt2 stores pickled payloads so): pt_read_zip_at appends its entries named under name
 * (the object itself named name, a container's children name.KEY); pt_read_zip_or_omit does,
 * or when the archive cannot be read (not one, a class the policy refuses...) appends the
 * omission of name (len bytes) with why, after "context: " when context is not NULL, and fails
 * only for want of memory; pt_read_zip_tensor describes the one tensor it holds (an error if
 * it holds anything else) without adding an entry. */
typedef struct pt_tensor {
    int64_t dims[2 * CK_MAX_RANK]; /* rank dims, then rank strides (elements) */
    ck_extent ext;                 /* from its first element; its bytes when contiguous */
    uint8_t dtype, rank;
    uint8_t contiguous;            /* row-major: ext holds every byte, in order */
} pt_tensor;

int pt_read_zip_at(ck_index *ix, uint32_t file, uint64_t base, uint64_t size, const char *name,
                   ck_error *err);
int pt_read_zip_or_omit(ck_index *ix, uint32_t file, uint64_t base, uint64_t size,
                        const char *name, size_t len, const char *context, ck_error *err);
int pt_read_zip_tensor(ck_index *ix, uint32_t file, uint64_t base, uint64_t size,
                       pt_tensor *out, ck_error *err);

#endif
