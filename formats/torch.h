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

#include "../index/index.h"
#include "../index/zip.h"

#define PT_MAX_PICKLE (256u << 20) /* the object pickle may not be bigger */

#define PT_PROBE_BYTES 32 /* what pt_probe_legacy needs to see */

/* True when head (the first n bytes) starts a legacy torch file (its magic-number pickle). */
int pt_probe_legacy(const unsigned char *head, size_t n);

/* Parse file `file` of ix (already added) and append its entries: a zip whose directory z
 * (zip_read_directory) is read, or a legacy file. */
int pt_read_zip(ck_index *ix, uint32_t file, const zip_archive *z, ck_error *err);
int pt_read_legacy(ck_index *ix, uint32_t file, ck_error *err);

/* A torch.save archive inside file `file` of ix, its size bytes at base (DCP writes them end to
 * end; a .pt2 stores pickled payloads so): pt_read_zip_or_omit appends its entries named under
 * name (len bytes: the object itself named name, a container's children name.KEY), or when
 * the archive cannot be read (not one, a class the policy refuses...) the omission of name
 * with why, after "context: " when context is not NULL, and fails only for want of memory or
 * of the entries' budget; pt_read_zip_tensor describes the one tensor it holds (an error if it
 * holds anything else) without adding an entry.
 *
 * Several records may name one archive (a .pt2's tied weights, DCP storage records): each
 * archive is parsed once per pt_archives, which remembers what each read gave by where the
 * archive lies (file, base, size), so a reader's cost is linear in its records however they
 * share archives. A later pt_read_zip_or_omit of an archive adds the first one's entries again
 * under its own name (their bytes and text shared, their count within the budget of the first
 * read: PT_INDEX_PER_BYTE bytes of entries per byte of its object pickle, all names together);
 * a later pt_read_zip_tensor gives the first one's tensor. A reader makes one pt_archives per
 * open and frees it when done; it holds about 100 bytes per archive, plus its tensor. */
typedef struct pt_tensor {
    int64_t dims[2 * CK_MAX_RANK]; /* rank dims, then rank strides (elements) */
    ck_extent ext;                 /* from its first element; its bytes when contiguous */
    uint8_t dtype, rank;
    uint8_t contiguous;            /* row-major: ext holds every byte, in order */
} pt_tensor;

typedef struct pt_archives pt_archives;

pt_archives *pt_archives_new(void); /* NULL when memory runs out */
void pt_archives_free(pt_archives *seen);

int pt_read_zip_or_omit(ck_index *ix, pt_archives *seen, uint32_t file, uint64_t base,
                        uint64_t size, const char *name, size_t len, const char *context,
                        ck_error *err);
int pt_read_zip_tensor(ck_index *ix, pt_archives *seen, uint32_t file, uint64_t base,
                       uint64_t size, pt_tensor *out, ck_error *err);

#endif
