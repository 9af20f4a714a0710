/* pt2.c — torch.export archives (.pt2) into the common index; see pt2.h. */
#include "pt2.h"
#include "../base/json.h"
#include "../base/names.h"
#include "torch.h"

#include <stdlib.h>
#include <string.h>

#define WEIGHTS_DIR "data/weights/"
#define CONSTANTS_DIR "data/constants/"
#define WEIGHTS_SUFFIX "_weights_config.json"
#define CONSTANTS_SUFFIX "_constants_config.json"
#define LAYOUT_STRIDED 7 /* torch's Layout.Strided */

/* A name built from pieces: a record's full name, an entry's. */
typedef struct buf {
    char *s;
    size_t cap;
} buf;

typedef struct pt2_reader {
    ck_index *ix;
    uint32_t file;
    const char *path;
    const zip_archive *z;
    size_t root_len;    /* the root folder, its '/' included: the first record's first part */
    const char *model;  /* the model whose configs are read, when there are several; else NULL */
    size_t model_len;
    buf rec, ent;       /* the record last looked for; the entry being added */
    pt_archives *archives; /* each use_pickle record, parsed once */
    ck_error *err;
} pt2_reader;

/* A tensor's description: rank sizes then rank element strides, as a CK_STRIDED entry's. */
typedef struct pt2_meta {
    int64_t dims[2 * CK_MAX_RANK];
    uint64_t offset; /* storage_offset, in elements */
    unsigned rank;
    enum ck_dtype dtype;
} pt2_meta;

/* torch's ScalarType numbers (torch/_export/serde/schema.py, class ScalarType) to ours. */
static int dtype_of(uint64_t code)
{
    static const struct {
        uint8_t code, dtype;
    } map[] = {
        {1, CK_U8},           {2, CK_I8},           {3, CK_I16},          {4, CK_I32},
        {5, CK_I64},          {6, CK_F16},          {7, CK_F32},          {8, CK_F64},
        {9, CK_C32},          {10, CK_C64},         {11, CK_C128},        {12, CK_BOOL},
        {13, CK_BF16},        {28, CK_U16},         {29, CK_F8_E4M3},     {30, CK_F8_E5M2},
        {31, CK_F8_E4M3FNUZ}, {32, CK_F8_E5M2FNUZ}, {33, CK_F8_E8M0},     {34, CK_U32},
        {35, CK_U64},
    };
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (map[i].code == code)
            return map[i].dtype;
    return -1;
}

/* Joins n pieces into b, NUL-terminated; *len its length. NULL when memory runs out. */
static const char *join(buf *b, const char *const *piece, const size_t *plen, int n, size_t *len)
{
    size_t need = 1, at = 0;
    for (int k = 0; k < n; k++)
        need += plen[k];
    if (need > b->cap) {
        char *p = realloc(b->s, need);
        if (!p)
            return NULL;
        b->s = p;
        b->cap = need;
    }
    for (int k = 0; k < n; k++) {
        memcpy(b->s + at, piece[k], plen[k]);
        at += plen[k];
    }
    b->s[at] = 0;
    *len = at;
    return b->s;
}

/* The length of z's root folder, '/' included; 0 when its first record lies in none. */
static size_t root_len(const zip_archive *z)
{
    if (z->nentries == 0)
        return 0;
    const char *slash = memchr(z->entries[0].name, '/', z->entries[0].name_len);
    return slash ? (size_t)(slash - z->entries[0].name) + 1 : 0;
}

/* The record ROOT + dir + name (len bytes) into *out, NULL when there is none; its name is left
 * in b. -1 when memory runs out. */
static int find(const zip_archive *z, size_t root, buf *b, const char *dir, const char *name,
                size_t len, const zip_entry **out)
{
    const char *piece[3] = {z->entries[0].name, dir, name};
    size_t plen[3] = {root, strlen(dir), len}, n;
    if (!join(b, piece, plen, 3, &n))
        return -1;
    *out = zip_find(z, b->s, n);
    return 0;
}

int pt2_probe(const zip_archive *z)
{
    size_t root = root_len(z);
    buf b = {0};
    const zip_entry *format = NULL, *weights = NULL;
    if (root && find(z, root, &b, "", "archive_format", 14, &format) == 0 && !format)
        find(z, root, &b, WEIGHTS_DIR, "model" WEIGHTS_SUFFIX, 5 + strlen(WEIGHTS_SUFFIX),
             &weights);
    free(b.s);
    return format || weights;
}

/* find() for the reader: -1 with err set when memory runs out. */
static int record(pt2_reader *r, const char *dir, const char *name, size_t len,
                  const zip_entry **out)
{
    return find(r->z, r->root_len, &r->rec, dir, name, len, out) == 0
               ? 0 : ck_fail(r->err, r->path, "out of memory");
}

/* Stored record e's bytes (at most limit), malloc'ed and NUL-terminated; NULL with err set. */
static char *read_record(pt2_reader *r, const zip_entry *e, uint64_t limit)
{
    if (e->method != 0) {
        ck_fail(r->err, r->path, "record '%s' is compressed (method %u); ckptfs reads stored "
                "records only", e->name, e->method);
        return NULL;
    }
    if (e->size > limit) {
        ck_fail(r->err, r->path, "record '%s' is %llu bytes, over the limit of %llu", e->name,
                (unsigned long long)e->size, (unsigned long long)limit);
        return NULL;
    }
    char *text = malloc((size_t)e->size + 1);
    if (!text) {
        ck_fail(r->err, r->path, "out of memory");
        return NULL;
    }
    int rc = ck_file_pread(r->ix, r->file, text, (size_t)e->size, e->data_offset);
    if (rc) {
        ck_fail(r->err, r->path, "cannot read record '%s': %s", e->name, strerror(-rc));
        free(text);
        return NULL;
    }
    text[e->size] = 0;
    return text;
}

/* Record ROOT/name must say want; a missing one is an error when required. */
static int check_says(pt2_reader *r, const char *name, const char *want, int required)
{
    const zip_entry *e;
    if (record(r, "", name, strlen(name), &e) != 0)
        return -1;
    if (!e)
        return required ? ck_fail(r->err, r->path, "no record '%s': not a torch.export archive",
                                  r->rec.s) : 0;
    char *text = read_record(r, e, 64);
    if (!text)
        return -1;
    int ok = e->size == strlen(want) && memcmp(text, want, e->size) == 0;
    if (!ok)
        ck_fail(r->err, r->path, "record '%s' says '%.16s', not '%s'", e->name, text, want);
    free(text);
    return ok ? 0 : -1;
}

/* A SymInt that is a plain integer, {"as_int": N} with 0 <= N < 2^53: 0, else -1. */
static int sym_int(const cJSON *v, uint64_t *out)
{
    return cJSON_IsObject(v) ? ck_json_count(cJSON_GetObjectItemCaseSensitive(v, "as_int"), out)
                             : -1;
}

/* The SymInts of array a into out: the index of the first that is no plain integer, or -1. */
static int sym_ints(const cJSON *a, int64_t *out)
{
    int d = 0;
    for (const cJSON *x = a->child; x; x = x->next, d++) {
        uint64_t n;
        if (sym_int(x, &n))
            return d;
        out[d] = (int64_t)n;
    }
    return -1;
}

/* Payload `fqn`'s tensor_meta m into t. what: "weight" or "constant". */
static int read_meta(pt2_reader *r, const char *what, const char *fqn, const cJSON *m,
                     pt2_meta *t)
{
    uint64_t code, layout;
    if (!cJSON_IsObject(m))
        return ck_fail(r->err, r->path, "%s '%s': \"tensor_meta\" is not an object", what, fqn);
    const cJSON *sizes = cJSON_GetObjectItemCaseSensitive(m, "sizes");
    const cJSON *strides = cJSON_GetObjectItemCaseSensitive(m, "strides");
    if (ck_json_count(cJSON_GetObjectItemCaseSensitive(m, "dtype"), &code))
        return ck_fail(r->err, r->path, "%s '%s': \"dtype\" is not a non-negative integer", what,
                       fqn);
    int dt = dtype_of(code);
    if (dt < 0)
        return ck_fail(r->err, r->path, "%s '%s': unknown dtype %llu (torch's ScalarType "
                       "numbers)", what, fqn, (unsigned long long)code);
    if (ck_json_count(cJSON_GetObjectItemCaseSensitive(m, "layout"), &layout) ||
        layout != LAYOUT_STRIDED)
        return ck_fail(r->err, r->path, "%s '%s': \"layout\" is not %d (Strided): sparse and "
                       "other layouts are not served", what, fqn, LAYOUT_STRIDED);
    if (!cJSON_IsArray(sizes) || !cJSON_IsArray(strides))
        return ck_fail(r->err, r->path, "%s '%s': \"sizes\" or \"strides\" is not an array",
                       what, fqn);
    int rank = cJSON_GetArraySize(sizes);
    if (rank > CK_MAX_RANK)
        return ck_fail(r->err, r->path, "%s '%s': rank %d exceeds %d", what, fqn, rank,
                       CK_MAX_RANK);
    if (cJSON_GetArraySize(strides) != rank)
        return ck_fail(r->err, r->path, "%s '%s': %d sizes but %d strides", what, fqn, rank,
                       cJSON_GetArraySize(strides));
    int bad = sym_ints(sizes, t->dims), bad_stride = sym_ints(strides, t->dims + rank);
    if (bad >= 0 || bad_stride >= 0)
        return ck_fail(r->err, r->path, "%s '%s': %s[%d] is not {\"as_int\": N}, N a "
                       "non-negative integer below 2^53", what, fqn, bad >= 0 ? "sizes" : "strides",
                       bad >= 0 ? bad : bad_stride);
    if (sym_int(cJSON_GetObjectItemCaseSensitive(m, "storage_offset"), &t->offset))
        return ck_fail(r->err, r->path, "%s '%s': \"storage_offset\" is not {\"as_int\": N}, N "
                       "a non-negative integer below 2^53", what, fqn);
    t->rank = (unsigned)rank;
    t->dtype = (enum ck_dtype)dt;
    return 0;
}

/* The entry's name for payload fqn: itself, or "MODEL.fqn" when there are several models. */
static const char *entry_name(pt2_reader *r, const char *fqn, size_t *len)
{
    const char *piece[3] = {r->model, ".", fqn};
    size_t plen[3] = {r->model_len, 1, strlen(fqn)};
    const char *name = r->model ? join(&r->ent, piece, plen, 3, len)
                                : (*len = plen[2], fqn);
    if (!name)
        ck_fail(r->err, r->path, "out of memory");
    return name;
}

/* Payload fqn as a tensor entry `name` whose bytes are in record e, or an omission (an empty
 * record of a tensor with elements). */
static int add_tensor(pt2_reader *r, const char *what, const char *fqn, const char *name,
                      size_t len, const zip_entry *e, const pt2_meta *t)
{
    unsigned esize = ck_dtype_bits(t->dtype) / 8; /* every dtype of dtype_of is whole bytes */
    uint64_t nbytes, last;
    if (e->method != 0)
        return ck_fail(r->err, r->path, "%s '%s': record '%s' is compressed (method %u); ckptfs "
                       "serves stored records only", what, fqn, e->name, e->method);
    if (ck_tensor_nbytes(t->rank, t->dims, t->dtype, &nbytes))
        return ck_fail(r->err, r->path, "%s '%s': its sizes overflow", what, fqn);
    if (e->size % esize)
        return ck_fail(r->err, r->path, "%s '%s': record '%s' holds %llu bytes, not a whole "
                       "number of %s elements", what, fqn, e->name, (unsigned long long)e->size,
                       ck_dtype_name(t->dtype));
    if (nbytes && e->size == 0)
        return ck_index_add_omission(r->ix, name, len, "its record is empty: a fake tensor, which "
                                     "torch.export.load makes zeros", r->err);
    if (nbytes && (ck_strided_last(t->rank, t->dims, t->offset, &last) != 0 ||
                   last >= e->size / esize))
        return ck_fail(r->err, r->path, "%s '%s': its sizes, strides and storage offset %llu "
                       "reach past the end of record '%s' (%llu bytes of %s)", what, fqn,
                       (unsigned long long)t->offset, e->name, (unsigned long long)e->size,
                       ck_dtype_name(t->dtype));
    int contiguous = nbytes == 0 || ck_strides_row_major(t->rank, t->dims);
    ck_entry *x = ck_index_add_entry(r->ix, name, len, contiguous ? CK_CONTIGUOUS : CK_STRIDED,
                                     t->rank, t->dims, r->err);
    if (!x)
        return -1;
    x->dtype = (uint8_t)t->dtype;
    x->nbytes = nbytes;
    x->ext = (ck_extent){.offset = e->data_offset + (nbytes ? t->offset * esize : 0),
                         .length = nbytes, .file = r->file};
    return 0;
}

/* One member of a config: the payload p (its key the FQN), whose record is in dir. */
static int add_payload(pt2_reader *r, const char *what, const char *dir, const cJSON *p)
{
    const char *fqn = p->string;
    if (!cJSON_IsObject(p))
        return ck_fail(r->err, r->path, "%s '%s': its description is not an object", what, fqn);
    const cJSON *pname = cJSON_GetObjectItemCaseSensitive(p, "path_name");
    const cJSON *pickled = cJSON_GetObjectItemCaseSensitive(p, "use_pickle");
    if (!cJSON_IsString(pname))
        return ck_fail(r->err, r->path, "%s '%s': no string \"path_name\"", what, fqn);
    if (!cJSON_IsBool(pickled))
        return ck_fail(r->err, r->path, "%s '%s': no boolean \"use_pickle\"", what, fqn);
    const zip_entry *e;
    if (record(r, dir, pname->valuestring, strlen(pname->valuestring), &e) != 0)
        return -1;
    if (!e)
        return ck_fail(r->err, r->path, "%s '%s': its record '%s' is missing", what, fqn,
                       r->rec.s);
    size_t len;
    const char *name = entry_name(r, fqn, &len);
    if (!name)
        return -1;
    if (cJSON_IsTrue(pickled)) /* torch.save'd into the record: its pickle through our VM */
        return e->method != 0
                   ? ck_index_add_omission(r->ix, name, len, "use_pickle, in a compressed "
                                           "record", r->err)
                   : pt_read_zip_or_omit(r->ix, r->archives, r->file, e->data_offset, e->size,
                                         name, len, "use_pickle", r->err);
    pt2_meta t;
    if (read_meta(r, what, fqn, cJSON_GetObjectItemCaseSensitive(p, "tensor_meta"), &t) != 0)
        return -1;
    return add_tensor(r, what, fqn, name, len, e, &t);
}

/* The config in record e: every payload of its "config" object, records in dir. */
static int read_config(pt2_reader *r, const zip_entry *e, const char *what, const char *dir)
{
    char *text = read_record(r, e, PT2_MAX_CONFIG);
    if (!text)
        return -1;
    const char *shown = e->name + r->root_len;
    size_t bad = ck_utf8_invalid_at((const unsigned char *)text, (size_t)e->size);
    cJSON *root = NULL;
    int rc = 0;
    if (bad < e->size)
        rc = ck_fail(r->err, r->path, "%s is not valid UTF-8 (%s byte %zu)", shown, shown, bad);
    else if (!(root = ck_json_parse(text, (size_t)e->size, shown, r->path, r->err)))
        rc = -1;
    const cJSON *config = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "config")
                                               : NULL;
    if (rc == 0 && !cJSON_IsObject(config))
        rc = ck_fail(r->err, r->path, "%s holds no \"config\" object", shown);
    for (const cJSON *p = rc == 0 ? config->child : NULL; p && rc == 0; p = p->next)
        rc = add_payload(r, what, dir, p);
    cJSON_Delete(root);
    free(text);
    return rc;
}

/* Whether record e is ROOT/data/weights/M_weights_config.json: M into *m, *mlen. */
static int is_weights_config(const pt2_reader *r, const zip_entry *e, const char **m,
                             size_t *mlen)
{
    size_t pre = r->root_len + strlen(WEIGHTS_DIR), suf = strlen(WEIGHTS_SUFFIX);
    if (e->name_len < pre + suf || memcmp(e->name, r->z->entries[0].name, r->root_len) != 0 ||
        memcmp(e->name + r->root_len, WEIGHTS_DIR, pre - r->root_len) != 0 ||
        memcmp(e->name + e->name_len - suf, WEIGHTS_SUFFIX, suf) != 0)
        return 0;
    *m = e->name + pre;
    *mlen = e->name_len - pre - suf;
    return memchr(*m, '/', *mlen) == NULL;
}

/* Model m's weights (config in record w), then its constants. */
static int read_model(pt2_reader *r, const zip_entry *w, const char *m, size_t mlen)
{
    if (read_config(r, w, "weight", WEIGHTS_DIR) != 0)
        return -1;
    const char *piece[2] = {m, CONSTANTS_SUFFIX};
    size_t plen[2] = {mlen, strlen(CONSTANTS_SUFFIX)}, n;
    const zip_entry *c;
    if (!join(&r->ent, piece, plen, 2, &n))
        return ck_fail(r->err, r->path, "out of memory");
    if (record(r, CONSTANTS_DIR, r->ent.s, n, &c) != 0)
        return -1;
    if (!c)
        return ck_fail(r->err, r->path, "no record '%s' beside '%s'", r->rec.s, w->name);
    return read_config(r, c, "constant", CONSTANTS_DIR);
}

/* Every model's configs; with several models, each one's entries under its name. */
static int read_models(pt2_reader *r)
{
    const zip_archive *z = r->z;
    const char *m;
    size_t mlen, models = 0;
    for (size_t i = 0; i < z->nentries; i++)
        models += (size_t)is_weights_config(r, &z->entries[i], &m, &mlen);
    if (models == 0)
        return ck_fail(r->err, r->path, "no record '%.*s" WEIGHTS_DIR "*" WEIGHTS_SUFFIX "': "
                       "no exported program's weights", (int)r->root_len, z->entries[0].name);
    for (size_t i = 0; i < z->nentries; i++) {
        if (!is_weights_config(r, &z->entries[i], &m, &mlen))
            continue;
        if (models > 1) {
            r->model = m;
            r->model_len = mlen;
        }
        if (read_model(r, &z->entries[i], m, mlen) != 0)
            return -1;
    }
    return 0;
}

/* No name may be given twice, as an entry or an omission (a JSON key repeated, or a weight and
 * a constant of one FQN). */
static int check_unique(pt2_reader *r)
{
    const ck_index *ix = r->ix;
    size_t n = ix->nentries + ix->nomitted;
    const char **names = malloc((n ? n : 1) * sizeof *names);
    unsigned char *again = NULL;
    for (size_t i = 0; names && i < n; i++)
        names[i] = i < ix->nentries ? ix->entries[i].name : ix->omitted[i - ix->nentries].name;
    if (!names || !(again = ck_names_repeated(names, n))) {
        free(names);
        return ck_fail(r->err, r->path, "out of memory");
    }
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        if (again[i])
            rc = ck_fail(r->err, r->path, "the name '%s' is given twice", names[i]);
    free(again);
    free(names);
    return rc;
}

int pt2_read_zip(ck_index *ix, uint32_t file, const zip_archive *z, ck_error *err)
{
    pt2_reader r = {.ix = ix, .file = file, .path = ix->files[file].path, .z = z,
                    .root_len = root_len(z), .archives = pt_archives_new(), .err = err};
    int rc = !r.archives  ? ck_fail(err, r.path, "out of memory")
             : r.root_len ? 0
                          : ck_fail(err, r.path, "the first record of the archive lies in no "
                                    "folder: not a torch.export archive");
    if (rc == 0)
        rc = check_says(&r, "archive_format", "pt2", 1);
    if (rc == 0)
        rc = check_says(&r, "byteorder", "little", 0);
    if (rc == 0)
        rc = read_models(&r);
    if (rc == 0)
        rc = check_unique(&r);
    free(r.rec.s);
    free(r.ent.s);
    pt_archives_free(r.archives);
    return rc;
}
