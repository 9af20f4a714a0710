/* index.h — the common tensor index that every format reader produces.
 *
 * Contract:
 *  - An index is built once by a reader (ck_open) and immutable afterwards; every function that
 *    takes a const ck_index is safe to call from many threads at once (reads use pread only).
 *  - The index owns its source files (source.h: local descriptors or remote objects) and all
 *    strings; ck_index_free releases them.
 *  - An entry is a tensor (dtype, shape, bytes somewhere in the source files) or a non-tensor
 *    value (its text, e.g. JSON, held in memory). A tensor's bytes are described by a layout:
 *    one extent of one file, a strided gather from a storage, or part of a deflated zip entry
 *    (decoded from its seek points, zip.h). Whatever the layout,
 *    ck_entry_read returns the tensor's elements in row-major order, little-endian.
 *  - Nothing here knows about FUSE or CUDA.
 */
#ifndef CK_INDEX_H
#define CK_INDEX_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "../base/arena.h"
#include "../base/dtype.h"
#include "../base/error.h"
#include "../sources/source.h" /* ck_file: where the bytes come from */
#include "../base/utf8.h" /* ck_utf8_invalid_at, which every reader asks of names */

enum ck_entry_kind { CK_TENSOR = 0, CK_VALUE = 1 };

/* A value's Python type (kept in ck_entry.dtype of a CK_VALUE). */
enum ck_value_type {
    CK_VAL_NONE, CK_VAL_BOOL, CK_VAL_INT, CK_VAL_FLOAT, CK_VAL_STR, CK_VAL_BYTES, CK_VAL_GLOBAL,
    CK_VAL_TYPE_COUNT
};

enum ck_layout {
    CK_CONTIGUOUS, /* ext holds every byte, in order */
    CK_STRIDED,    /* ext.offset = first element; shape[rank..2*rank) = element strides */
    CK_DEFLATED,   /* ext = a deflated zip entry's compressed bytes; `deflated` has its seek
                    * points, and the tensor is its output from deflated->skip on */
    CK_SWAPPED,    /* ext holds every byte, in order, each scalar big-endian (a big-endian
                    * .npy): read, every scalar's bytes are reversed (a complex number's two
                    * halves each), so readers see the little-endian tensor */
    CK_CHUNKED,    /* `chunks` tile a whole tensor (a DCP checkpoint's shards, each in a file
                    * of its own); the entry is the box of it that starts at shape[rank..2*rank)
                    * (zeros: the whole tensor; a slice's start otherwise), of dims shape[0..rank).
                    * Whole-byte dtypes only. ext is unused. */
};


struct zip_inflated;

typedef struct ck_extent {
    uint64_t offset; /* byte offset in the source file */
    uint64_t length; /* bytes */
    uint32_t file;   /* index into ck_index.files */
} ck_extent;

/* One piece of a chunked tensor: the box it covers, and its elements, row-major over sizes in
 * ext, or gathered as a CK_STRIDED entry's from ext.offset on by rank element strides. */
typedef struct ck_chunk {
    const int64_t *offsets, *sizes; /* rank each */
    const int64_t *strides;         /* rank, none negative; NULL: row-major in ext */
    ck_extent ext;
} ck_chunk;

/* Chunks that tile a tensor of dims exactly once, as a grid (their reader checked it): along
 * each dim d, nedges[d] ascending edges from 0 to dims[d] (edges holds every dim's, one dim
 * after another), and a chunk per cell between them, in row-major order of the cells. */
typedef struct ck_chunks {
    const int64_t *dims;
    const ck_chunk *chunk;
    const int64_t *edges;
    const uint32_t *nedges;
    uint32_t n;
} ck_chunks;

typedef struct ck_entry {
    const char *name;      /* UTF-8, name_len bytes, NUL-terminated, never contains NUL */
    const int64_t *shape;  /* rank dims; CK_STRIDED: followed by rank strides (elements);
                            * CK_CHUNKED: followed by the box's start in the whole tensor */
    union {
        const char *text;                     /* CK_VALUE: nbytes bytes */
        struct zip_inflated *deflated;        /* CK_DEFLATED: how to decode it (zip.h; its
                                               * seek points grow as it is read, under its
                                               * own lock; the index owns it) */
        const ck_chunks *chunks;              /* CK_CHUNKED: its pieces */
    };
    ck_extent ext;         /* CK_CONTIGUOUS: the bytes; CK_STRIDED: file and first element;
                            * CK_DEFLATED: the compressed bytes */
    uint64_t nbytes;       /* size of what ck_entry_read yields */
    uint32_t name_len;
    uint8_t kind;          /* enum ck_entry_kind */
    uint8_t layout;        /* enum ck_layout */
    uint8_t dtype;         /* enum ck_dtype; CK_VALUE: enum ck_value_type */
    uint8_t rank;
} ck_entry;


typedef struct ck_meta {
    const char *key, *value; /* UTF-8 strings */
    uint8_t json;            /* value is a JSON text (a GGUF key's typed value): index.json
                              * shows it as is, not as a string */
} ck_meta;

/* A part of the source that is no tensor and no value, left out with the reason (an .npz
 * member of strings or objects): index.json and ckpt ls list it. */
typedef struct ck_omission {
    const char *name, *reason;
} ck_omission;

typedef struct ck_index {
    const char *format;      /* "safetensors", "safetensors-sharded", ... */
    ck_file *files;
    uint32_t nfiles;
    ck_entry *entries;       /* in source order */
    size_t nentries;
    ck_meta *meta;
    size_t nmeta;
    ck_omission *omitted;
    size_t nomitted;
    /* a pack's checked layout and its file, NULL for other formats: read it through
     * pack_layout_of (packfile.h) */
    const struct pack_layout *pack;
    uint32_t pack_file;
    /* where its remote files are opened (http.h; NULL: local files only), freed with the index
     * when own_remote */
    struct http_remote *remote;
    int own_remote;
    /* private to index.c */
    size_t cap_entries, cap_meta, cap_files, cap_omitted;
    ck_arena *arena;
} ck_index;

#define CK_MAX_RANK 64

void ck_index_free(ck_index *ix);

/* Closes ix's files (descriptors, connections, caches) for a caller that has read all it will:
 * the entries stay, and each file keeps its path for messages and its identity (device, inode,
 * size, mtime) for checks by path, a file made of a local one's bytes taking that one's
 * (ck_file_origin: a served load's source is re-checked by them); a read of a closed file
 * fails. Closing again, or freeing, is harmless. */
void ck_index_close_files(ck_index *ix);

/* The path that messages about ix name: its first file (the source as opened, or the first
 * shard), or "?" while it has none. */
const char *ck_index_source(const ck_index *ix);

/* Copies up to len bytes of the entry's row-major contents starting at off into buf.
 * Returns the number of bytes copied (0 at or past the end), or -errno. A source file that is
 * shorter than the index says gives -EIO: callers never see a short count before the end. */
ssize_t ck_entry_read(const ck_index *ix, const ck_entry *e, void *buf, size_t len, uint64_t off);

/* What a read of e found wrong with its bytes, where that is known beyond an errno (a deflated
 * member's stream: "its deflate stream is corrupt", zip_inflate_fault), for a message; NULL
 * otherwise. */
const char *ck_entry_fault(const ck_entry *e);

/* Whether e's bytes can be lent rather than copied: a tensor of one contiguous extent in a
 * source file that lends (ck_file_lends: a remote file's cached blocks, not a local file). */
int ck_entry_lends(const ck_index *ix, const ck_entry *e);
/* ck_entry_read without the copy, for an entry that lends (ck_entry_lends): *ptr points at the
 * count it returns of the bytes, held until ck_entry_release(ix, e, *token): as many as one
 * piece of the source holds, fewer than ck_entry_read would give where they lie in pieces (the
 * rest is asked for again); 0 at or past the end, nothing held; -errno as ck_entry_read. */
ssize_t ck_entry_hold(const ck_index *ix, const ck_entry *e, size_t len, uint64_t off,
                      const void **ptr, void **token);
void ck_entry_release(const ck_index *ix, const ck_entry *e, void *token);

/* The source files that bytes [off, off+len) of entry e are read from (len cut to the entry),
 * each given to fn(ctx, file) (an index of its index's files), until one answers non-zero: that answer,
 * else 0. The one owner of "which files does this read depend on", which every check that a
 * reader sees no changed file asks: a chunked entry's are the files of the chunks its range
 * may touch (those meeting the range's bounding box in the whole tensor; O(chunks), no I/O),
 * any other tensor's its extent's file, a value's the file its reader parsed it from (its
 * text is in memory). An empty range names none. A file may be named more than once, never
 * twice in a row. */
int ck_entry_each_file(const ck_entry *e, uint64_t off, uint64_t len,
                       int (*fn)(void *ctx, uint32_t file), void *ctx);

/* Whether every file that bytes [off, off+len) of e are read from (ck_entry_each_file) is
 * still the file opened (ck_file_unchanged): 1, or 0 with the first that is not in *changed. */
int ck_entry_unchanged(const ck_index *ix, const ck_entry *e, uint64_t off, uint64_t len,
                       uint32_t *changed);

/* ck_file_read of source file `file` of ix: how the index's users read a source's bytes. */
int ck_file_pread(const ck_index *ix, uint32_t file, void *buf, size_t len, uint64_t off);
/* Whether tensors a and b have the same rank and dims (their strides aside). */
int ck_same_shape(const ck_entry *a, const ck_entry *b);

/* Looks an entry up by exact name; NULL if absent. Linear: for tools, not for hot paths. */
const ck_entry *ck_index_find(const ck_index *ix, const char *name);

/* --- for format readers --------------------------------------------------------------- */

ck_index *ck_index_new(const char *format);
/* Takes ownership of fd. Returns the file id, or -1 (out of memory, err set). */
int ck_index_add_file(ck_index *ix, const char *path, int fd, ck_error *err);
/* Opens location loc (a path or a URL: ck_source_open; what names it in a failure, e.g.
 * "shard") and adds it. The file id, or -1 with err set. */
int ck_index_add_source(ck_index *ix, const char *loc, const char *what, ck_error *err);
/* Adds *f, a file opened by its reader (a source of its own ops, source.h), which the index
 * owns from now on (closed on failure). The file id, or -1 with err set. */
int ck_index_add_opened(ck_index *ix, ck_file *f, ck_error *err);
/* Appends an entry with a copy of name and shape (rank dims, plus rank strides when the layout
 * is CK_STRIDED, or the start when CK_CHUNKED); the caller fills in where the bytes are. NULL with err set when rank exceeds
 * CK_MAX_RANK, name_len UINT32_MAX, or memory runs out. */
ck_entry *ck_index_add_entry(ck_index *ix, const char *name, size_t name_len, uint8_t layout,
                             unsigned rank, const int64_t *shape, ck_error *err);
/* Appends a value entry holding a copy of text (len bytes). */
ck_entry *ck_index_add_value(ck_index *ix, const char *name, size_t name_len,
                             enum ck_value_type type, const char *text, size_t len,
                             ck_error *err);
/* The same for text the index already holds (its arena: another entry's or metadata's bytes),
 * not copied. */
ck_entry *ck_index_add_value_held(ck_index *ix, const char *name, size_t name_len,
                                  enum ck_value_type type, const char *text, size_t len,
                                  ck_error *err);
int ck_index_add_meta(ck_index *ix, const char *key, const char *value, ck_error *err);

/* Records that name (name_len bytes) was left out, and why (copied). 0, or -1 with err set. */
int ck_index_add_omission(ck_index *ix, const char *name, size_t name_len, const char *reason,
                          ck_error *err);

/* Drops every metadata entry whose key an earlier one has (the first source's key wins: an
 * index file's over its shards', a shard's over the next). O(n log n). 0, or -1 with err set. */
int ck_index_unique_meta(ck_index *ix, ck_error *err);
/* "None", "bool", "int", "float", "str", "bytes", "global": as index.json spells them. */
const char *ck_value_type_name(enum ck_value_type t);
/* Memory that lives as long as the index. NULL on out-of-memory. */
void *ck_index_alloc(ck_index *ix, size_t n);
char *ck_index_strndup(ck_index *ix, const char *s, size_t n);

/* The bytes of a tensor: its element count (the product of dims) through ck_dtype_nbytes. -1 on
 * overflow, a negative dim, or an element count that is not a whole number of the dtype's
 * blocks (a sub-byte dtype whose elements do not fill whole bytes). */
int ck_tensor_nbytes(unsigned rank, const int64_t *shape, enum ck_dtype dt, uint64_t *nbytes);

/* A strided tensor as a CK_STRIDED entry holds it: rank dims, then rank element strides (none
 * negative). ck_strides_row_major: whether its elements lie row-major contiguous (every dim of
 * more than one element steps by the product of the dims after it), so one extent serves it.
 * ck_strided_last: the last element it touches, in elements from its storage's start, its first
 * being `offset`; every dim at least 1 (a tensor with elements). -1 on overflow. */
int ck_strides_row_major(unsigned rank, const int64_t *shape);
int ck_strided_last(unsigned rank, const int64_t *shape, uint64_t offset, uint64_t *last);

#endif
