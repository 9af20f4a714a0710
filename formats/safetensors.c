#include "safetensors.h"
#include "../base/bytes.h"
#include "../base/json.h"
#include "../base/names.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_INDEX_JSON "model.safetensors.index.json"

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

/* A JSON object's members in order, and their keys or their string values (NULL for another
 * value) as strings to group (ck_names_grouped). */
typedef struct members {
    const cJSON **node;
    const char **text;
    size_t n;
} members;

/* obj's members with their keys (values: their string values) as text. 0, or -1 when memory
 * runs out. */
static int members_of(const cJSON *obj, int values, members *m)
{
    m->n = 0;
    for (const cJSON *v = obj->child; v; v = v->next)
        m->n++;
    m->node = malloc((m->n ? m->n : 1) * sizeof *m->node);
    m->text = malloc((m->n ? m->n : 1) * sizeof *m->text);
    if (!m->node || !m->text) {
        free(m->node), free(m->text);
        return -1;
    }
    size_t i = 0;
    for (const cJSON *v = obj->child; v; v = v->next, i++) {
        m->node[i] = v;
        m->text[i] = !values ? v->string : cJSON_IsString(v) ? v->valuestring : NULL;
    }
    return 0;
}

static void members_free(members *m)
{
    free(m->node);
    free(m->text);
}

/* For each member of m, the member whose value its key takes: its key's last occurrence when it
 * is the key's first, else SIZE_MAX (json.loads keeps a repeated key where it first appears,
 * with the last value). malloc'ed; NULL when memory runs out. */
static size_t *winners(const members *m)
{
    size_t *order = ck_names_grouped(m->text, m->n);
    size_t *won = order ? malloc((m->n ? m->n : 1) * sizeof *won) : NULL;
    for (size_t s = 0, e; won && s < m->n; s = e) {
        for (e = s + 1; e < m->n && strcmp(m->text[order[s]], m->text[order[e]]) == 0; e++)
            won[order[e]] = SIZE_MAX;
        won[order[s]] = order[e - 1];
    }
    free(order);
    return won;
}

/* Adds metadata object obj's members to ix (see winners); a value that is not a string is an
 * error, or with stringify (an index file's "metadata") stands as its JSON text. */
static int add_metadata(ck_index *ix, const cJSON *obj, int stringify, const char *path,
                        ck_error *err)
{
    members m;
    if (members_of(obj, 0, &m))
        return ck_fail(err, path, "out of memory");
    size_t *won = winners(&m);
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
    members_free(&m);
    return rc;
}

static int st_read_metadata(ck_index *ix, const cJSON *meta, const char *path, ck_error *err)
{
    if (cJSON_IsNull(meta)) /* MLX's writer, when given no metadata; the library reads it */
        return 0;
    if (!cJSON_IsObject(meta))
        return ck_fail(err, path, "__metadata__ is not an object");
    return add_metadata(ix, meta, 0, path, err);
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

/* --- shard directories ---------------------------------------------------------------- */

/* Shard `name` beside base (the index file's location, or any in the shards' directory): the
 * name comes from the checkpoint, so ck_source_sibling accepts a plain file name only. */
static int open_shard(ck_index *ix, const char *base, const char *name, ck_error *err)
{
    char *loc = ck_source_sibling(base, name, err);
    int id = loc ? ck_index_add_source(ix, loc, "shard", err) : -1;
    free(loc);
    if (id < 0)
        return -1;
    return st_read_file(ix, (uint32_t)id, err) ? -1 : id;
}

/* Shards named by weight_map, each opened once, in order of first mention. */
static int open_indexed_shards(ck_index *ix, const cJSON *map, const char *ipath, ck_error *err)
{
    for (const cJSON *v = map->child; v; v = v->next)
        if (!cJSON_IsString(v) || !ck_source_plain_name(v->valuestring))
            return ck_fail(err, ipath, "weight_map entry '%s' does not name a file in this "
                           "directory", v->string);
    members m;
    if (members_of(map, 1, &m))
        return ck_fail(err, ipath, "out of memory");
    size_t *won = winners(&m); /* by value: a shard's first mention is its group's first */
    int rc = won ? 0 : ck_fail(err, ipath, "out of memory");
    for (size_t i = 0; i < m.n && rc == 0; i++)
        if (won[i] != SIZE_MAX && open_shard(ix, ipath, m.text[i], err) < 0)
            rc = -1;
    free(won);
    members_free(&m);
    return rc;
}

static int by_entry_name(const void *a, const void *b)
{
    return strcmp((*(const ck_entry *const *)a)->name, (*(const ck_entry *const *)b)->name);
}

static int open_listed_shards(ck_index *ix, int dirfd, const char *dir, const char *ipath,
                              ck_error *err)
{
    int fd = dup(dirfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return ck_fail(err, dir, "cannot list directory: %s", strerror(e));
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (struct dirent *de; rc == 0 && (de = readdir(d));) {
        size_t l = strlen(de->d_name);
        if (l <= 12 || strcmp(de->d_name + l - 12, ".safetensors") || de->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **p = realloc(names, cap * sizeof *p);
            if (!p) {
                rc = ck_fail(err, dir, "out of memory");
                break;
            }
            names = p;
        }
        if (!(names[n++] = strdup(de->d_name)))
            rc = ck_fail(err, dir, "out of memory");
    }
    closedir(d);
    if (rc == 0 && n == 0)
        rc = ck_fail(err, dir, "directory holds no *.safetensors file and no " ST_INDEX_JSON);
    if (n) /* names is NULL when there are none */
        qsort(names, n, sizeof *names, by_cstr);
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = open_shard(ix, ipath, names[i], err) < 0 ? -1 : 0;
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return rc;
}

/* Every tensor (by: ix's entries sorted by name, n of them) in the shard weight_map names for it
 * (a repeated key: its last value, as json.loads reads it), and every name weight_map gives a
 * tensor of some shard: one pass over both, sorted. */
static int check_weight_map(const ck_index *ix, const ck_entry *const *by, size_t n,
                            const cJSON *map, const char *ipath, ck_error *err)
{
    members m;
    if (members_of(map, 0, &m))
        return ck_fail(err, ipath, "out of memory");
    size_t *order = ck_names_grouped(m.text, m.n);
    int rc = order ? 0 : ck_fail(err, ipath, "out of memory");
    size_t g = 0, stray = SIZE_MAX; /* the first name in weight_map that no shard holds */
    for (size_t i = 0; i < n && rc == 0; i++) {
        for (; g < m.n && strcmp(m.text[order[g]], by[i]->name) < 0; g++)
            stray = order[g] < stray ? order[g] : stray;
        size_t e = g;
        while (e < m.n && strcmp(m.text[order[e]], by[i]->name) == 0)
            e++;
        const char *shard = strrchr(ix->files[by[i]->ext.file].path, '/') + 1;
        if (e == g)
            rc = ck_fail(err, ipath, "tensor '%s' of shard %s is missing from weight_map",
                         by[i]->name, shard);
        else if (strcmp(m.node[order[e - 1]]->valuestring, shard))
            rc = ck_fail(err, ipath, "weight_map puts tensor '%s' in %s, but it is in %s",
                         by[i]->name, m.node[order[e - 1]]->valuestring, shard);
        g = e;
    }
    for (; rc == 0 && g < m.n; g++)
        stray = order[g] < stray ? order[g] : stray;
    if (rc == 0 && stray != SIZE_MAX)
        rc = ck_fail(err, ipath, "weight_map names tensor '%s', which is in no shard (%s)",
                     m.text[stray], m.node[stray]->valuestring);
    free(order);
    members_free(&m);
    return rc;
}

/* Every tensor in exactly one shard, and where weight_map says. Entries were appended shard by
 * shard, so sorting a copy of the names finds tensors that appear twice. */
static int check_shards(const ck_index *ix, const cJSON *map, const char *dir, const char *ipath,
                        ck_error *err)
{
    size_t n = ix->nentries;
    const ck_entry **by = malloc((n ? n : 1) * sizeof *by);
    if (!by)
        return ck_fail(err, dir, "out of memory");
    for (size_t i = 0; i < n; i++)
        by[i] = &ix->entries[i];
    qsort(by, n, sizeof *by, by_entry_name);
    int rc = 0;
    for (size_t i = 1; i < n && rc == 0; i++)
        if (strcmp(by[i - 1]->name, by[i]->name) == 0)
            rc = ck_fail(err, dir, "tensor '%s' is in two shards: %s and %s", by[i]->name,
                         ix->files[by[i - 1]->ext.file].path, ix->files[by[i]->ext.file].path);
    if (rc == 0 && map)
        rc = check_weight_map(ix, by, n, map, ipath, err);
    free(by);
    return rc;
}

/* Reads and parses the index JSON; its non-object "metadata" values become strings. */
static cJSON *read_index_json(ck_index *ix, const char *ipath, ck_error *err)
{
    ck_file f;
    if (ck_source_open(ix->remote, ipath, NULL, &f, err) != 0)
        return NULL;
    cJSON *root = NULL;
    char *text = NULL;
    int rc;
    if (f.size > ST_MAX_HEADER) {
        ck_fail(err, ipath, "not a regular file of at most %u bytes", ST_MAX_HEADER);
    } else if (!(text = malloc((size_t)f.size + 1))) {
        ck_fail(err, ipath, "out of memory");
    } else if ((rc = ck_file_read(&f, text, (size_t)f.size, 0))) {
        ck_fail(err, ipath, "cannot read: %s", strerror(-rc));
    } else {
        const char *end = NULL;
        root = cJSON_ParseWithLengthOpts(text, (size_t)f.size, &end, 0);
        const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
        if (!root)
            ck_fail(err, ipath, "not valid JSON (byte %zu)", end ? (size_t)(end - text) : 0);
        else if (!cJSON_IsObject(map))
            ck_fail(err, ipath, "no \"weight_map\" object");
        if (!cJSON_IsObject(map)) {
            cJSON_Delete(root);
            root = NULL;
        }
    }
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    if (cJSON_IsObject(meta) && add_metadata(ix, meta, 1, ipath, err) != 0) {
        cJSON_Delete(root);
        root = NULL;
    }
    free(text);
    ck_source_close(&f);
    return root;
}

/* The shards of a set, checked against each other: those the index file at ipath names when
 * dirfd is -1, else every *.safetensors in dir (open at dirfd). dir names the set in messages. */
static int open_sharded(struct http_remote *remote, const char *dir, const char *ipath, int dirfd,
                        ck_index **out, ck_error *err)
{
    *out = NULL;
    ck_index *ix = ck_index_new("safetensors-sharded");
    cJSON *root = NULL;
    int rc = ix ? 0 : ck_fail(err, dir, "out of memory");
    if (ix)
        ix->remote = remote;
    if (rc == 0 && dirfd < 0) {
        root = read_index_json(ix, ipath, err);
        rc = root ? open_indexed_shards(ix, cJSON_GetObjectItemCaseSensitive(root, "weight_map"),
                                        ipath, err)
                  : -1;
    } else if (rc == 0) {
        rc = open_listed_shards(ix, dirfd, dir, ipath, err);
    }
    if (rc == 0)
        rc = check_shards(ix, cJSON_GetObjectItemCaseSensitive(root, "weight_map"), dir, ipath,
                          err);
    if (rc == 0)
        rc = ck_index_unique_meta(ix, err);
    cJSON_Delete(root);
    if (rc) {
        ck_index_free(ix);
        return -1;
    }
    *out = ix;
    return 0;
}

int st_open_index(struct http_remote *remote, const char *ipath, ck_index **out, ck_error *err)
{
    return open_sharded(remote, ipath, ipath, -1, out, err);
}

int st_open_names(struct http_remote *remote, const char *base, const char *const *names, size_t n,
                  ck_index **out, ck_error *err)
{
    *out = NULL;
    ck_index *ix = ck_index_new("safetensors-sharded");
    int rc = ix ? 0 : ck_fail(err, base, "out of memory");
    if (ix)
        ix->remote = remote;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = open_shard(ix, base, names[i], err) < 0 ? -1 : 0;
    if (rc == 0)
        rc = check_shards(ix, NULL, base, base, err);
    if (rc == 0)
        rc = ck_index_unique_meta(ix, err);
    if (rc) {
        ck_index_free(ix);
        return -1;
    }
    *out = ix;
    return 0;
}

int st_index_probe(const unsigned char *head, size_t n)
{
    size_t i = 0;
    while (i < n && (head[i] == ' ' || head[i] == '\t' || head[i] == '\n' || head[i] == '\r'))
        i++;
    return i < n && head[i] == '{';
}

int st_open_dir(const char *dir, ck_index **out, ck_error *err)
{
    *out = NULL;
    char ipath[4096];
    snprintf(ipath, sizeof ipath, "%s/%s", dir, ST_INDEX_JSON);
    int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0)
        return ck_fail(err, dir, "cannot open directory: %s", strerror(errno));
    int indexed = faccessat(dirfd, ST_INDEX_JSON, F_OK, 0) == 0;
    int rc = open_sharded(NULL, dir, ipath, indexed ? -1 : dirfd, out, err);
    close(dirfd);
    return rc;
}
