#include "safetensors.h"
#include "../base/bytes.h"
#include "../base/json.h"
#include "../base/names.h"

#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

int st_probe(const unsigned char *head, size_t n)
{
    return n >= 9 && head[8] == '{';
}

typedef struct st_tensor {
    const char *name;
    const cJSON *shape;
    uint64_t begin, end;
    uint8_t dtype, rank;
} st_tensor;

/* Decodes a shape array of at most CK_MAX_RANK elements into dims: the index of the first
 * element that is not a count below 2^53, or -1 when all are. */
static int st_dims(const cJSON *shape, int64_t *dims)
{
    int d = 0;
    for (const cJSON *x = shape->child; x; x = x->next, d++) {
        uint64_t n;
        if (ck_json_count(x, &n))
            return d;
        dims[d] = (int64_t)n;
    }
    return -1;
}

static int by_offsets(const void *a, const void *b)
{
    const st_tensor *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int by_cstr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Adds metadata object obj's members to ix (see winners); a value that is not a string is an
 * error, or with stringify (an index file's "metadata") stands as its JSON text. */
int st_add_metadata(ck_index *ix, const cJSON *obj, int stringify, const char *path,
                    ck_error *err)
{
    ck_json_members m;
    if (ck_json_members_of(obj, 0, &m))
        return ck_fail(err, path, "out of memory");
    size_t *won = ck_json_winners(&m);
    int rc = won ? 0 : ck_fail(err, path, "out of memory");
    for (size_t i = 0; i < m.n && rc == 0 && !stringify; i++)
        if (!cJSON_IsString(m.node[i]))
            rc = ck_fail(err, path, "__metadata__ value of '%s' is not a string", m.text[i]);
    for (size_t i = 0; i < m.n && rc == 0; i++) {
        if (won[i] == SIZE_MAX)
            continue;
        const cJSON *v = m.node[won[i]];
        char *s = cJSON_IsString(v) ? NULL : cJSON_PrintUnformatted(v);
        rc = ck_index_add_meta(ix, m.text[i], s ? s : v->valuestring, err);
        free(s);
    }
    free(won);
    ck_json_members_free(&m);
    return rc;
}

static int st_read_metadata(ck_index *ix, const cJSON *meta, const char *path, ck_error *err)
{
    if (cJSON_IsNull(meta)) /* MLX's writer, when given no metadata; the library reads it */
        return 0;
    if (!cJSON_IsObject(meta))
        return ck_fail(err, path, "__metadata__ is not an object");
    return st_add_metadata(ix, meta, 0, path, err);
}

/* Checks one tensor's description and fills t; the extent is checked against the others later. */
static int st_read_tensor(const cJSON *v, st_tensor *t, const char *path, ck_error *err)
{
    const char *name = v->string;
    if (!cJSON_IsObject(v))
        return ck_fail(err, path, "tensor '%s': description is not an object", name);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(v, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(v, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(v, "data_offsets");
    if (!cJSON_IsString(dtype))
        return ck_fail(err, path, "tensor '%s': missing or non-string \"dtype\"", name);
    int dt = ck_dtype_from_name(dtype->valuestring, strlen(dtype->valuestring));
    if (dt < 0 || dt >= CK_ST_DTYPE_COUNT)
        return ck_fail(err, path, "tensor '%s': unknown dtype '%s'", name, dtype->valuestring);
    if (!cJSON_IsArray(shape))
        return ck_fail(err, path, "tensor '%s': missing or non-array \"shape\"", name);
    int rank = cJSON_GetArraySize(shape);
    if (rank > CK_MAX_RANK)
        return ck_fail(err, path, "tensor '%s': rank %d exceeds %d", name, rank, CK_MAX_RANK);
    int64_t dims[CK_MAX_RANK];
    int bad = st_dims(shape, dims);
    if (bad >= 0)
        return ck_fail(err, path, "tensor '%s': shape[%d] is not a non-negative integer "
                       "below 2^53", name, bad);
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        ck_json_count(offs->child, &t->begin) || ck_json_count(offs->child->next, &t->end))
        return ck_fail(err, path, "tensor '%s': \"data_offsets\" is not two non-negative "
                       "integers below 2^53", name);
    if (t->end < t->begin)
        return ck_fail(err, path, "tensor '%s': data_offsets [%llu, %llu] end before they begin",
                       name, (unsigned long long)t->begin, (unsigned long long)t->end);
    uint64_t nbytes;
    if (ck_tensor_nbytes((unsigned)rank, dims, (enum ck_dtype)dt, &nbytes))
        return ck_fail(err, path, "tensor '%s': shape × %s overflows or is not a whole number "
                       "of bytes", name, ck_dtype_name((enum ck_dtype)dt));
    if (nbytes != t->end - t->begin)
        return ck_fail(err, path, "tensor '%s': data_offsets [%llu, %llu] hold %llu bytes, "
                       "shape × %s needs %llu", name, (unsigned long long)t->begin,
                       (unsigned long long)t->end, (unsigned long long)(t->end - t->begin),
                       ck_dtype_name((enum ck_dtype)dt), (unsigned long long)nbytes);
    t->name = name;
    t->shape = shape;
    t->dtype = (uint8_t)dt;
    t->rank = (uint8_t)rank;
    return 0;
}

/* The spec's tiling rule: sorted by offset, extents start at 0, touch without hole or overlap,
 * and end exactly where the file ends. */
static int st_check_tiling(st_tensor *t, size_t n, uint64_t data_len, const char *path,
                           ck_error *err)
{
    qsort(t, n, sizeof *t, by_offsets);
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (t[i].begin > at)
            return ck_fail(err, path, "hole in the data region: bytes [%llu, %llu) belong to no "
                           "tensor (before tensor '%s')", (unsigned long long)at,
                           (unsigned long long)t[i].begin, t[i].name);
        if (t[i].begin < at)
            return ck_fail(err, path, "tensor '%s' [%llu, %llu] overlaps tensor '%s'", t[i].name,
                           (unsigned long long)t[i].begin, (unsigned long long)t[i].end,
                           t[i - 1].name);
        at = t[i].end;
    }
    if (at > data_len)
        return ck_fail(err, path, "tensor '%s' ends at data byte %llu, past the end of file "
                       "(data region is %llu bytes)", t[n - 1].name, (unsigned long long)at,
                       (unsigned long long)data_len);
    if (at < data_len)
        return ck_fail(err, path, "%llu trailing bytes after the last tensor (data region is "
                       "%llu bytes, tensors end at %llu)", (unsigned long long)(data_len - at),
                       (unsigned long long)data_len, (unsigned long long)at);
    return 0;
}

static int st_check_unique(const st_tensor *t, size_t n, const char *path, ck_error *err)
{
    const char **names = malloc((n ? n : 1) * sizeof *names);
    if (!names)
        return ck_fail(err, path, "out of memory");
    for (size_t i = 0; i < n; i++)
        names[i] = t[i].name;
    qsort(names, n, sizeof *names, by_cstr);
    int rc = 0;
    for (size_t i = 1; i < n && rc == 0; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            rc = ck_fail(err, path, "duplicate tensor name '%s'", names[i]);
    free(names);
    return rc;
}

static int st_add_tensors(ck_index *ix, uint32_t file, const st_tensor *t, size_t n,
                          uint64_t data_start, ck_error *err)
{
    for (size_t i = 0; i < n; i++) {
        int64_t dims[CK_MAX_RANK];
        st_dims(t[i].shape, dims); /* checked by st_read_tensor */
        ck_entry *e = ck_index_add_entry(ix, t[i].name, strlen(t[i].name), CK_CONTIGUOUS,
                                         t[i].rank, dims, err);
        if (!e)
            return -1;
        e->dtype = t[i].dtype;
        e->nbytes = t[i].end - t[i].begin;
        e->ext = (ck_extent){.offset = data_start + t[i].begin, .length = e->nbytes,
                             .file = file};
    }
    return 0;
}

int st_parse_header(ck_index *ix, uint32_t file, const char *json, size_t len,
                    uint64_t data_start, uint64_t data_len, ck_error *err)
{
    const char *path = ix->files[file].path;
    size_t bad = ck_utf8_invalid_at((const unsigned char *)json, len);
    if (bad < len)
        return ck_fail(err, path, "header is not valid UTF-8 (header byte %zu)", bad);
    if (len == 0 || json[0] != '{')
        return ck_fail(err, path, "header does not start with '{' (header byte 0)");
    cJSON *root = ck_json_parse(json, len, "header", path, err);
    if (!root)
        return -1;
    int rc = 0;
    size_t n = 0, nmeta = 0;
    st_tensor *t = NULL;
    /* root is an object: the text starts with '{' and parsed whole. */
    for (const cJSON *v = root->child; v; v = v->next)
        n++;
    t = malloc((n ? n : 1) * sizeof *t);
    if (!t) {
        rc = ck_fail(err, path, "out of memory");
        goto out;
    }
    n = 0;
    for (const cJSON *v = root->child; v && rc == 0; v = v->next) {
        if (strcmp(v->string, "__metadata__") == 0) {
            rc = nmeta++ ? ck_fail(err, path, "duplicate \"__metadata__\"")
                         : st_read_metadata(ix, v, path, err);
        } else {
            rc = st_read_tensor(v, &t[n++], path, err);
        }
    }
    if (rc == 0)
        rc = st_check_unique(t, n, path, err);
    if (rc == 0)
        rc = st_check_tiling(t, n, data_len, path, err);
    if (rc == 0)
        rc = st_add_tensors(ix, file, t, n, data_start, err);
out:
    free(t);
    cJSON_Delete(root);
    return rc;
}

int st_read_file(ck_index *ix, uint32_t file, ck_error *err)
{
    const ck_file *f = &ix->files[file];
    unsigned char lenbuf[8];
    if (f->size < 8)
        return ck_fail(err, f->path, "file is %llu bytes, too short for a safetensors header "
                       "(needs 8)", (unsigned long long)f->size);
    int rc = ck_file_read(f, lenbuf, 8, 0);
    if (rc)
        return ck_fail(err, f->path, "cannot read header length: %s", strerror(-rc));
    uint64_t hlen = get_le64(lenbuf);
    if (hlen > ST_MAX_HEADER)
        return ck_fail(err, f->path, "header length %llu exceeds the limit of %u (bytes 0-7)",
                       (unsigned long long)hlen, ST_MAX_HEADER);
    if (hlen > f->size - 8)
        return ck_fail(err, f->path, "header length %llu runs past the end of the file "
                       "(%llu bytes) (bytes 0-7)", (unsigned long long)hlen,
                       (unsigned long long)f->size);
    char *json = malloc(hlen ? hlen : 1);
    if (!json)
        return ck_fail(err, f->path, "out of memory for a %llu-byte header",
                       (unsigned long long)hlen);
    rc = ck_file_read(f, json, hlen, 8);
    if (rc)
        rc = ck_fail(err, f->path, "cannot read header: %s", strerror(-rc));
    else
        rc = st_parse_header(ix, file, json, hlen, 8 + hlen, f->size - 8 - hlen, err);
    free(json);
    return rc;
}
