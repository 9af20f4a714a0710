/* dcp.c — torch.distributed.checkpoint directories into the common index (dcp.h). */
#include "dcp.h"
#include "../index/pickle.h"
#include "torch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define DCP_MAX_METADATA (256u << 20) /* the .metadata pickle may not be bigger */
#define DCP_MAX_CHUNKS 1000000u       /* chunks of one tensor */

/* One storage record: where the bytes of a fqn's chunk (offsets set) or value (NULL) are.
 * Plain C values, taken from the pickle's objects once, each checked for its type there. */
typedef struct dcp_record {
    const char *fqn;
    const int64_t *offsets;  /* the chunk's rank offsets (none negative), or NULL for a value */
    const char *rel;         /* the .distcp file's name */
    uint64_t offset, length;
    uint32_t file;
    uint32_t rank;
} dcp_record;

typedef struct dcp_reader {
    ck_index *ix;
    const char *path;        /* the .metadata, for messages */
    const char *meta;        /* its location, which the .distcp files are beside */
    dcp_record *records;
    size_t nrecords;
    pt_archives *archives;   /* each archive the records name, parsed once */
    ck_error *err;
} dcp_reader;

int dcp_is_metadata(const char *loc)
{
    const char *slash = strrchr(loc, '/');
    return strcmp(slash ? slash + 1 : loc, DCP_METADATA) == 0;
}

/* --- the metadata's objects ------------------------------------------------------------- */

/* A tuple of at most CK_MAX_RANK non-negative ints, into v[0..*n): 0, else -1. */
static int count_tuple(const pk_obj *t, int64_t *v, size_t *n)
{
    if (pk_int_tuple(t, CK_MAX_RANK, v, n) != 0)
        return -1;
    for (size_t i = 0; i < *n; i++)
        if (v[i] < 0)
            return -1;
    return 0;
}

/* --- storage records -------------------------------------------------------------------- */

static int record_of(dcp_reader *r, const pk_obj *key, const pk_obj *info, dcp_record *out)
{
    const pk_obj *index = pk_record(key, PKG_DCP_METADATA_INDEX);
    const pk_obj *where = pk_record(info, PKG_DCP_STORAGE_INFO);
    const char *fqn = pk_text(pk_field(index, "fqn"), NULL);
    const char *rel = pk_text(pk_field(where, "relative_path"), NULL);
    int64_t off, len, v[CK_MAX_RANK];
    if (!fqn || !rel || pk_int(pk_field(where, "offset"), &off) != 0 || off < 0 ||
        pk_int(pk_field(where, "length"), &len) != 0 || len < 0)
        return ck_fail(r->err, r->path, "storage record %zu is not a MetadataIndex(fqn, "
                       "offset, index) -> _StorageInfo(relative_path, offset, length)",
                       r->nrecords);
    const pk_obj *transforms = pk_field(where, "transform_descriptors");
    if (transforms && !pk_as(transforms, PK_NONE) &&
        !(pk_as(transforms, PK_LIST) && pk_len(transforms) == 0))
        return ck_fail(r->err, r->path, "'%s': its bytes are transformed (compressed or "
                       "encrypted on save), which ckptfs does not read", fqn);
    /* the chunk's offsets (a torch.Size), or None (absent) for a bytes value */
    const pk_obj *offsets = pk_field(index, "offset");
    size_t rank = 0;
    int64_t *at = NULL;
    if (offsets && !pk_as(offsets, PK_NONE)) {
        if (count_tuple(offsets, v, &rank) != 0)
            return ck_fail(r->err, r->path, "'%s': storage record %zu's chunk offset is a %s, "
                           "not None or a tuple of at most %d non-negative ints", fqn,
                           r->nrecords, pk_type_name(offsets->type), CK_MAX_RANK);
        if (!(at = ck_index_alloc(r->ix, rank * sizeof *at + 1)))
            return ck_fail(r->err, r->path, "out of memory");
        memcpy(at, v, rank * sizeof *at);
    }
    *out = (dcp_record){.fqn = fqn, .offsets = at, .rank = (uint32_t)rank, .rel = rel,
                        .offset = (uint64_t)off, .length = (uint64_t)len};
    return 0;
}

static int by_file_name(const void *a, const void *b)
{
    return strcmp((*(const dcp_record *const *)a)->rel, (*(const dcp_record *const *)b)->rel);
}

/* Opens each .distcp file the records name, once, beside the metadata (records grouped by
 * name: no search per record), and checks each record lies inside its file. */
static int open_files(dcp_reader *r)
{
    dcp_record **by_name = malloc((r->nrecords ? r->nrecords : 1) * sizeof *by_name);
    if (!by_name)
        return ck_fail(r->err, r->path, "out of memory");
    for (size_t i = 0; i < r->nrecords; i++)
        by_name[i] = &r->records[i];
    qsort(by_name, r->nrecords, sizeof *by_name, by_file_name);
    int rc = 0;
    for (size_t i = 0; i < r->nrecords && rc == 0; i++) {
        dcp_record *rec = by_name[i];
        if (i && strcmp(rec->rel, by_name[i - 1]->rel) == 0) {
            rec->file = by_name[i - 1]->file;
        } else {
            char *loc = ck_source_sibling(r->meta, rec->rel, r->err);
            int f = loc ? ck_index_add_source(r->ix, loc, "a file the metadata names", r->err)
                        : -1;
            free(loc);
            if (f < 0) {
                rc = -1;
                break;
            }
            rec->file = (uint32_t)f;
        }
        const ck_file *f = &r->ix->files[rec->file];
        if (rec->offset > f->size || rec->length > f->size - rec->offset)
            rc = ck_fail(r->err, r->path, "'%s': its record (bytes %llu to %llu of %s) lies "
                         "past the end of that file (%llu bytes)", rec->fqn,
                         (unsigned long long)rec->offset,
                         (unsigned long long)(rec->offset + rec->length), rec->rel,
                         (unsigned long long)f->size);
    }
    free(by_name);
    return rc;
}

/* Orders records by fqn, then by chunk offsets (a value's NULL first). */
static int record_cmp(const void *a, const void *b)
{
    const dcp_record *x = a, *y = b;
    int c = strcmp(x->fqn, y->fqn);
    if (c || !x->offsets || !y->offsets)
        return c ? c : (x->offsets != NULL) - (y->offsets != NULL);
    uint32_t n = x->rank < y->rank ? x->rank : y->rank;
    for (uint32_t i = 0; i < n; i++)
        if (x->offsets[i] != y->offsets[i])
            return x->offsets[i] < y->offsets[i] ? -1 : 1;
    return (x->rank > n) - (y->rank > n);
}

static int read_records(dcp_reader *r, const pk_obj *storage)
{
    if (!pk_as(storage, PK_DICT))
        return ck_fail(r->err, r->path, "the metadata has no storage_data dict");
    size_t n = pk_len(storage);
    r->records = malloc((n ? n : 1) * sizeof *r->records);
    if (!r->records)
        return ck_fail(r->err, r->path, "out of memory");
    const pk_obj *key, *info;
    for (size_t i = 0; pk_pair(storage, i, &key, &info) == 0; i++, r->nrecords++)
        if (record_of(r, key, info, &r->records[i]) != 0)
            return -1;
    if (open_files(r) != 0)
        return -1;
    qsort(r->records, n, sizeof *r->records, record_cmp);
    for (size_t i = 1; i < n; i++)
        if (record_cmp(&r->records[i - 1], &r->records[i]) == 0)
            return ck_fail(r->err, r->path, "'%s': two storage records for one %s",
                           r->records[i].fqn, r->records[i].offsets ? "chunk" : "value");
    return 0;
}

/* The record of fqn's chunk at offsets (rank of them), or of its value (offsets NULL). */
static const dcp_record *find_record(const dcp_reader *r, const char *fqn,
                                     const int64_t *offsets, unsigned rank)
{
    dcp_record key = {.fqn = fqn, .offsets = offsets, .rank = rank};
    return bsearch(&key, r->records, r->nrecords, sizeof key, record_cmp);
}

/* --- values ----------------------------------------------------------------------------- */

/* A bytes value: the entries of its archive, or an omission saying why there are none. */
static int add_value(dcp_reader *r, const char *fqn, size_t len)
{
    const dcp_record *rec = find_record(r, fqn, NULL, 0);
    if (!rec)
        return ck_fail(r->err, r->path, "value '%s' has no storage record", fqn);
    return pt_read_zip_or_omit(r->ix, r->archives, rec->file, rec->offset, rec->length, fqn, len,
                               NULL, r->err);
}

/* --- tensors ---------------------------------------------------------------------------- */

typedef struct dcp_tensor {
    const char *fqn;
    unsigned rank;
    int64_t dims[CK_MAX_RANK];
    uint8_t dtype;
    uint64_t esize;
} dcp_tensor;

static int tensor_fail(dcp_reader *r, const dcp_tensor *t, size_t chunk, const char *what)
{
    return ck_fail(r->err, r->path, "tensor '%s', chunk %zu: %s", t->fqn, chunk, what);
}

/* The tensor's dtype, rank and dims from its TensorStorageMetadata. */
static int tensor_header(dcp_reader *r, const pk_obj *meta, dcp_tensor *t)
{
    const char *name = t->fqn;
    /* TensorProperties' state: the tuple its __getstate__ gives (dtype, layout, ...), or the
     * dict of its fields */
    const pk_obj *props = pk_record(pk_field(meta, "properties"), PKG_DCP_TENSOR_PROPERTIES);
    const pk_obj *state = pk_as(pk_state(props), PK_TUPLE);
    const pk_obj *tuple = pk_len(state) >= 2 ? state : NULL;
    const pk_obj *dtype = tuple ? pk_item(tuple, 0) : pk_field(props, "dtype");
    const pk_obj *layout = tuple ? pk_item(tuple, 1) : pk_field(props, "layout");
    const char *layout_name = pk_text(layout, NULL);
    int dt = pk_dtype(dtype);
    size_t rank;
    if (dt < 0)
        return ck_fail(r->err, r->path, "tensor '%s': its properties name no dtype", name);
    if (layout && !(layout_name && strcmp(layout_name, "torch.strided") == 0))
        return ck_fail(r->err, r->path, "tensor '%s': layout %s is not supported (strided "
                       "only)", name, layout_name ? layout_name : "?");
    if (count_tuple(pk_field(meta, "size"), t->dims, &rank) != 0)
        return ck_fail(r->err, r->path, "tensor '%s': its size is not a torch.Size of at most "
                       "%d dims", name, CK_MAX_RANK);
    t->rank = (unsigned)rank;
    t->dtype = (uint8_t)dt;
    if (ck_dtype_block_elems(t->dtype) != 1 || ck_dtype_nbytes(t->dtype, 1, &t->esize) ||
        !t->esize)
        return ck_fail(r->err, r->path, "tensor '%s': dtype %s is not whole bytes per element",
                       name, ck_dtype_name(t->dtype));
    return 0;
}

static int by_value(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The edges of the grid along dim d: every chunk's start and end there, sorted, unique. */
static int64_t *grid_lines(const ck_chunk *c, size_t n, unsigned d, size_t *nlines)
{
    int64_t *v = malloc((2 * n + 1) * sizeof *v);
    if (!v)
        return NULL;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        v[m++] = c[i].offsets[d];
        v[m++] = c[i].offsets[d] + c[i].sizes[d];
    }
    qsort(v, m, sizeof *v, by_value);
    size_t u = 0;
    for (size_t i = 0; i < m; i++)
        if (!u || v[i] != v[u - 1])
            v[u++] = v[i];
    *nlines = u;
    return v;
}

/* Whether the n (non-empty, in-bounds) chunks tile dims (not empty) exactly once, as a grid:
 * each chunk one cell between consecutive edges in every dim, the edges reaching 0 and the
 * dim, and as many chunks as cells, no two in one cell. If so, the grid goes into *cs (its
 * edges in the index's arena, the chunks in c put in cell order: index.c finds an element's
 * chunk by a search of the edges, not of every chunk). Returns NULL, or what is wrong. */
static const char *check_grid(dcp_reader *r, const dcp_tensor *t, ck_chunk *c, size_t n,
                              ck_chunks *cs)
{
    if (!n)
        return "no chunk holds any of it";
    uint64_t *cell = calloc(n, sizeof *cell), cells = 1;
    int64_t *lines_of[CK_MAX_RANK] = {0};
    uint32_t *nedges = ck_index_alloc(r->ix, t->rank * sizeof *nedges);
    size_t total = 0;
    const char *why = cell && nedges ? NULL : "out of memory";
    for (unsigned d = 0; d < t->rank && !why; d++) {
        size_t m;
        int64_t *lines = lines_of[d] = grid_lines(c, n, d, &m);
        if (!lines) {
            why = "out of memory";
            break;
        }
        if (lines[0] != 0 || lines[m - 1] != t->dims[d])
            why = "the chunks leave part of the tensor uncovered";
        for (size_t i = 0; i < n && !why; i++) {
            int64_t *at = bsearch(&c[i].offsets[d], lines, m, sizeof *lines, by_value);
            size_t k = (size_t)(at - lines);
            if (k + 1 >= m || lines[k + 1] != c[i].offsets[d] + c[i].sizes[d])
                why = "the chunks overlap, or do not form a grid";
            else
                cell[i] = cell[i] * (m - 1) + k;
        }
        cells = m - 1 && cells > UINT64_MAX / (m - 1) ? UINT64_MAX : cells * (m - 1);
        nedges[d] = (uint32_t)m;
        total += m;
    }
    int64_t *edges = why ? NULL : ck_index_alloc(r->ix, total * sizeof *edges + 1);
    if (!why && !edges)
        why = "out of memory";
    *cs = (ck_chunks){.dims = t->dims, .chunk = c, .edges = edges, .nedges = nedges,
                      .n = (uint32_t)n};
    size_t at = 0;
    for (unsigned d = 0; d < t->rank; d++) {
        if (edges) {
            memcpy(edges + at, lines_of[d], nedges[d] * sizeof *edges);
            at += nedges[d];
        }
        free(lines_of[d]);
    }
    if (!why && cells != n)
        why = "the chunks leave part of the tensor uncovered, or overlap";
    /* as many cells as chunks, each below n: chunk i goes to place cell[i], once */
    ck_chunk *placed = why ? NULL : malloc(n * sizeof *placed);
    if (!why && !placed)
        why = "out of memory";
    for (size_t i = 0; i < n && !why; i++)
        placed[cell[i]].sizes = NULL;
    for (size_t i = 0; i < n && !why; i++) {
        if (placed[cell[i]].sizes)
            why = "two chunks cover the same part of the tensor";
        placed[cell[i]] = c[i];
    }
    if (!why)
        memcpy(c, placed, n * sizeof *c);
    free(placed);
    free(cell);
    return why;
}

/* Chunk i's box from the metadata, checked against the tensor, into c (its arrays in the
 * index's arena). */
static int chunk_box(dcp_reader *r, const dcp_tensor *t, const pk_obj *meta, size_t i,
                     ck_chunk *c)
{
    const pk_obj *box = pk_record(meta, PKG_DCP_CHUNK);
    int64_t *v = ck_index_alloc(r->ix, 2 * t->rank * sizeof *v + 1);
    size_t n_offsets, n_sizes;
    if (!v)
        return ck_fail(r->err, r->path, "out of memory");
    if (count_tuple(pk_field(box, "offsets"), v, &n_offsets) != 0 || n_offsets != t->rank ||
        count_tuple(pk_field(box, "sizes"), v + t->rank, &n_sizes) != 0 || n_sizes != t->rank)
        return tensor_fail(r, t, i, "not a ChunkStorageMetadata(offsets, sizes) of the "
                           "tensor's rank");
    for (unsigned d = 0; d < t->rank; d++)
        if (v[t->rank + d] > t->dims[d] || v[d] > t->dims[d] - v[t->rank + d])
            return tensor_fail(r, t, i, "it reaches past the tensor's size");
    *c = (ck_chunk){.offsets = v, .sizes = v + t->rank};
    return 0;
}

/* Where chunk c's elements are: the one contiguous tensor of its sizes in its archive. */
static int chunk_bytes(dcp_reader *r, const dcp_tensor *t, size_t i, ck_chunk *c)
{
    const dcp_record *rec = find_record(r, t->fqn, c->offsets, t->rank);
    if (!rec)
        return tensor_fail(r, t, i, "no storage record holds it");
    pt_tensor pt;
    ck_error why;
    if (pt_read_zip_tensor(r->ix, r->archives, rec->file, rec->offset, rec->length, &pt,
                           &why) != 0)
        return tensor_fail(r, t, i, why.msg);
    if (pt.dtype != t->dtype || pt.rank != t->rank)
        return tensor_fail(r, t, i, pt.dtype != t->dtype
                                        ? "its archive's dtype is not the tensor's"
                                        : "its archive's tensor is not of the chunk's rank");
    for (unsigned d = 0; d < t->rank; d++)
        if (pt.dims[d] != c->sizes[d])
            return tensor_fail(r, t, i, "its archive's tensor is not of the chunk's sizes");
    c->ext = pt.ext;
    if (!pt.contiguous) { /* a view saved as is (a transposed weight): gathered by its strides */
        int64_t *strides = ck_index_alloc(r->ix, t->rank * sizeof *strides);
        if (!strides)
            return ck_fail(r->err, r->path, "out of memory");
        memcpy(strides, pt.dims + t->rank, t->rank * sizeof *strides);
        c->strides = strides;
    }
    return 0;
}

static int add_tensor(dcp_reader *r, const char *fqn, size_t fqn_len, const pk_obj *meta)
{
    dcp_tensor t = {.fqn = fqn};
    if (tensor_header(r, meta, &t) != 0)
        return -1;
    const pk_obj *list = pk_as(pk_field(meta, "chunks"), PK_LIST);
    size_t nchunks = pk_len(list);
    if (!list || nchunks > DCP_MAX_CHUNKS)
        return ck_fail(r->err, r->path, "tensor '%s': no list of at most %u chunks", fqn,
                       DCP_MAX_CHUNKS);
    uint64_t nbytes;
    int64_t shape[2 * CK_MAX_RANK] = {0};
    memcpy(shape, t.dims, t.rank * sizeof *shape);
    if (ck_tensor_nbytes(t.rank, shape, t.dtype, &nbytes) != 0)
        return ck_fail(r->err, r->path, "tensor '%s': its size overflows", fqn);
    ck_chunk *chunk = ck_index_alloc(r->ix, (nchunks + 1) * sizeof *chunk);
    if (!chunk)
        return ck_fail(r->err, r->path, "out of memory");
    size_t n = 0;
    for (size_t i = 0; i < nchunks; i++) {
        if (chunk_box(r, &t, pk_item(list, i), i, &chunk[n]) != 0)
            return -1;
        uint64_t volume = 1;
        for (unsigned d = 0; d < t.rank; d++)
            volume *= (uint64_t)chunk[n].sizes[d];
        if (volume && chunk_bytes(r, &t, i, &chunk[n]) != 0)
            return -1;
        n += volume != 0; /* an empty chunk (a rank with no rows) covers nothing */
    }
    ck_chunks grid;
    const char *why = nbytes ? check_grid(r, &t, chunk, n, &grid) : NULL;
    if (why)
        return ck_fail(r->err, r->path, "tensor '%s': %s", fqn, why);
    int one = n == 1 || !nbytes, strided = one && n && chunk[0].strides;
    if (strided)
        memcpy(shape + t.rank, chunk[0].strides, t.rank * sizeof *shape);
    ck_entry *e = ck_index_add_entry(r->ix, fqn, fqn_len,
                                     strided ? CK_STRIDED : one ? CK_CONTIGUOUS : CK_CHUNKED,
                                     t.rank, shape, r->err);
    ck_chunks *cs = one ? NULL : ck_index_alloc(r->ix, sizeof *cs);
    if (!e || (!one && !cs))
        return e ? ck_fail(r->err, r->path, "out of memory") : -1;
    e->dtype = t.dtype;
    e->nbytes = nbytes;
    if (one) {
        e->ext = n ? chunk[0].ext : (ck_extent){0};
    } else {
        *cs = grid;
        cs->dims = e->shape;
        e->chunks = cs;
    }
    return 0;
}

/* --- the checkpoint --------------------------------------------------------------------- */

static int read_metadata(dcp_reader *r, pk_result *res)
{
    const ck_file *f = &r->ix->files[0];
    if (f->size > DCP_MAX_METADATA)
        return ck_fail(r->err, r->path, "%llu bytes, over the limit of %u",
                       (unsigned long long)f->size, DCP_MAX_METADATA);
    unsigned char *buf = malloc(f->size ? (size_t)f->size : 1);
    if (!buf)
        return ck_fail(r->err, r->path, "out of memory");
    int rc = ck_file_pread(r->ix, 0, buf, (size_t)f->size, 0);
    if (rc)
        ck_fail(r->err, r->path, "cannot read: %s", strerror(-rc));
    else if (pk_load(buf, (size_t)f->size, &pk_dcp_limits, r->path, 0, res, r->err) != 0)
        rc = -1;
    free(buf);
    return rc;
}

static int add_entries(dcp_reader *r, const pk_obj *root)
{
    const pk_obj *meta = pk_record(root, PKG_DCP_METADATA);
    const pk_obj *sd = pk_as(pk_field(meta, "state_dict_metadata"), PK_DICT), *key, *value;
    if (!sd)
        return ck_fail(r->err, r->path, "not a DCP Metadata with a state_dict_metadata dict");
    if (read_records(r, pk_field(meta, "storage_data")) != 0)
        return -1;
    for (size_t i = 0; pk_pair(sd, i, &key, &value) == 0; i++) {
        size_t len;
        const char *fqn = pk_text(key, &len);
        if (!fqn || memchr(fqn, 0, len))
            return ck_fail(r->err, r->path, "state_dict_metadata key %zu is not a name", i);
        int rc = pk_record(value, PKG_DCP_TENSOR_STORAGE)  ? add_tensor(r, fqn, len, value)
                 : pk_record(value, PKG_DCP_BYTES_STORAGE) ? add_value(r, fqn, len)
                     : ck_fail(r->err, r->path, "'%s': neither tensor nor bytes metadata", fqn);
        if (rc)
            return -1;
    }
    return 0;
}

int dcp_open(http_remote *remote, const char *meta, ck_index **out, ck_error *err)
{
    (void)remote;
    ck_index *ix = ck_index_new("dcp");
    if (!ix)
        return ck_fail(err, meta, "out of memory");
    ix->remote = remote;
    dcp_reader r = {.ix = ix, .meta = meta, .archives = pt_archives_new(), .err = err};
    pk_result res = {0};
    int rc = !r.archives ? ck_fail(err, meta, "out of memory")
             : ck_index_add_source(ix, meta, NULL, err) < 0 ? -1 : 0;
    r.path = ix->nfiles ? ix->files[0].path : meta;
    if (rc == 0)
        rc = read_metadata(&r, &res);
    if (rc == 0)
        rc = add_entries(&r, res.root);
    pk_free(&res);
    free(r.records);
    pt_archives_free(r.archives);
    if (rc) {
        ck_index_free(ix);
        return -1;
    }
    *out = ix;
    return 0;
}
