/* npy.h — NumPy checkpoints: .npy files (format versions 1.0, 2.0, 3.0) and .npz archives.
 *
 * Contract:
 *  - An .npy file is one tensor, named "" (as a single-tensor PyTorch file is). An .npz member
 *    "K.npy" is the tensor "K": the key np.load gives it, '/' and '.' kept as they are (the tree
 *    rule of views/tree.h then splits at '.' and escapes '/'). A member not ending in ".npy" is
 *    refused: np.savez writes no other.
 *  - The header is parsed only in the exact form numpy writes,
 *    "{'descr': D, 'fortran_order': B, 'shape': S, }" then spaces and '\n', its length at most
 *    NPY_MAX_HEADER (np.load's own default limit); anything else is refused, saying where.
 *  - descr: '<f2' '<f4' '<f8' '|i1' '<i2' '<i4' '<i8' '|u1' '<u2' '<u4' '<u8' '|b1' '<c8'
 *    '<c16' are F16 F32 F64 I8 I16 I32 I64 U8 U16 U32 U64 BOOL C64 C128. Objects ('|O': pickled,
 *    refused as np.load(allow_pickle=False) does), big-endian data (refused, not swapped),
 *    structured, string, datetime and void dtypes are refused with a message naming the descr.
 *  - fortran_order True: the tensor is served row-major through a strided gather (CK_STRIDED).
 *  - The data must fill the rest of the file or member exactly: no short file, no trailing
 *    bytes.
 *  - .npz members may be stored (read in place, at the data offset the local header gives) or
 *    deflated (CK_DEFLATED: only the first bytes the header needs are inflated at open; the
 *    rest of the stream is decoded, checked and given seek points as reads need it, zip.h; a
 *    Fortran-ordered deflated member is gathered from an inflated copy made on its first read,
 *    whose origin, ck_file_origin, is the archive). Members must not overlap.
 *  - Only headers are read for .npy files and members; nothing is trusted unchecked.
 *  - Writing (npy_header_make, for `ckptfs -o npy` and `ckpt cat --npy`): format 1.0 (the
 *    longest header, CK_MAX_RANK dimensions, is far below 1.0's 65535 bytes), padded with
 *    spaces so that the data starts at a multiple of 64 bytes, as np.save pads it. A dtype
 *    NumPy has gets its descr above. One NumPy lacks is never given a wrong one: a type whose
 *    element is whole bytes (BF16, the F8 types, C32) is served as raw records '|VN' of its
 *    element size N, shape kept; a sub-byte or block type (F4, the F6 types, ggml's quantized
 *    types) as its bytes, '|u1' of shape (nbytes,). The true dtype is the tensor's
 *    user.ckptfs.dtype xattr (docs/SEMANTICS.md "The mount").
 */
#ifndef CK_NPY_H
#define CK_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "../index/index.h"

#define NPY_MAX_HEADER 10000u /* bytes of header text, as np.load's max_header_size */
#define NPY_MAX_TEXT (1u << 20) /* a 0-d string served as a value: at most these bytes */
#define NPY_PREAMBLE_MAX 12u  /* magic, version, header length (4 bytes from version 2.0) */
#define NPY_PROBE_BYTES 512   /* what npz_probe needs to see of a zip: its first member name */

typedef struct npy_header {
    uint64_t data_offset; /* bytes before the array: preamble and header text */
    uint64_t nbytes;      /* the array's bytes */
    int64_t shape[CK_MAX_RANK];
    unsigned rank;
    uint8_t dtype;        /* enum ck_dtype */
    uint8_t fortran;      /* fortran_order: True */
    uint8_t major;        /* format version 1, 2 or 3 */
    uint8_t big_endian;   /* descr '>...': served swapped (CK_SWAPPED) */
    char text;            /* 'U' or 'S': a string dtype (no tensor) of itemsize bytes an item */
    uint32_t itemsize;
    uint8_t not_a_tensor; /* set when parsing failed for the dtype alone (strings, objects, a
                           * structured or unknown dtype): an .npz leaves that member out */
} npy_header;

/* True when head (the first n bytes of a file) starts an .npy file. */
int npy_probe(const unsigned char *head, size_t n);
/* True when head starts a zip archive whose first member is an .npy file. */
int npz_probe(const unsigned char *head, size_t n);

/* Parses the header at the start of p (n bytes: at least the whole header, when the input is
 * that long). what prefixes the message ("" or "member 'x.npy': "); at is the offset of p in
 * the file, for messages. 0, or -1 with err set. */
int npy_parse_header(const unsigned char *p, size_t n, npy_header *h, const char *path,
                     const char *what, uint64_t at, ck_error *err);

/* The NumPy header (preamble, text, padding) of a tensor of dtype dt and shape (rank dims)
 * into buf (at least NPY_MAKE_MAX bytes); returns its length, a multiple of 64. *raw is set
 * when NumPy lacks dt and the header describes its bytes instead (see the contract). */
#define NPY_MAKE_MAX 1536u /* 64 dims of 19 digits and ", ", the dict's text, the padding */
size_t npy_header_make(enum ck_dtype dt, unsigned rank, const int64_t *shape, uint64_t nbytes,
                       unsigned char *buf, int *raw);

/* Parse file `file` of ix (already added) and append its entries. */
int npy_read_file(ck_index *ix, uint32_t file, ck_error *err);
int npz_read_file(ck_index *ix, uint32_t file, ck_error *err);

#endif
