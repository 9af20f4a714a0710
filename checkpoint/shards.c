/* shards.c — a checkpoint in several files (shards.h): the shards an index names, or a list,
 * each read by its content, checked against each other and the index's weight_map. */
#include "shards.h"
#include "../base/json.h"
#include "../base/names.h"
#include "../formats/safetensors.h"

#include <stdlib.h>
#include <string.h>

/* What a set is made of: the family of the format a shard was read as, or NULL for a format no
 * set may hold (a GGUF file, a NumPy array, a pack...). */
static const char *family_of(const char *format)
{
    if (strcmp(format, "safetensors") == 0)
        return "safetensors";
    if (strcmp(format, "pytorch-zip") == 0 || strcmp(format, "pytorch-legacy") == 0)
        return "pytorch";
    return NULL;
}

/* A set being read: its index, the reader, and the family its first shard set. */
typedef struct shard_set {
    ck_index *ix;
    shard_reader read;
    const char *family; /* NULL until the first shard is read */
} shard_set;

/* Shard `name` beside base: the name comes from the checkpoint, so ck_source_sibling accepts a
 * plain file name only. Its file id, or -1. */
static int open_shard(shard_set *s, const char *base, const char *name, ck_error *err)
{
    char *loc = ck_source_sibling(base, name, err);
    int id = loc ? ck_index_add_source(s->ix, loc, "shard", err) : -1;
    free(loc);
    const char *format = NULL;
    if (id < 0 || s->read(s->ix, (uint32_t)id, &format, err))
        return -1;
    const char *family = family_of(format), *path = s->ix->files[id].path;
    if (!family)
        return ck_fail(err, path, "a shard must be a safetensors or PyTorch file, not %s",
                       format);
    if (s->family && strcmp(family, s->family))
        return ck_fail(err, path, "a %s shard in a set of %s ones (%s)", family, s->family,
                       s->ix->files[0].path);
    s->family = family;
    return id;
}

/* Shards named by weight_map, each opened once, in order of first mention. */
static int open_indexed_shards(shard_set *s, const cJSON *map, const char *ipath, ck_error *err)
{
    for (const cJSON *v = map->child; v; v = v->next)
        if (!cJSON_IsString(v) || !ck_source_plain_name(v->valuestring))
            return ck_fail(err, ipath, "weight_map entry '%s' does not name a file in this "
                           "directory", v->string);
    ck_json_members m;
    if (ck_json_members_of(map, 1, &m))
        return ck_fail(err, ipath, "out of memory");
    size_t *won = ck_json_winners(&m); /* by value: a shard's first mention is its group's first */
    int rc = won ? 0 : ck_fail(err, ipath, "out of memory");
    for (size_t i = 0; i < m.n && rc == 0; i++)
        if (won[i] != SIZE_MAX && open_shard(s, ipath, m.text[i], err) < 0)
            rc = -1;
    free(won);
    ck_json_members_free(&m);
    return rc;
}

static int by_entry_name(const void *a, const void *b)
{
    return strcmp((*(const ck_entry *const *)a)->name, (*(const ck_entry *const *)b)->name);
}

/* Every tensor (by: ix's entries sorted by name, n of them) in the shard weight_map names for it
 * (a repeated key: its last value, as json.loads reads it), and every name weight_map gives a
 * tensor of some shard: one pass over both, sorted. */
static int check_weight_map(const ck_index *ix, const ck_entry *const *by, size_t n,
                            const cJSON *map, const char *ipath, ck_error *err)
{
    ck_json_members m;
    if (ck_json_members_of(map, 0, &m))
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
    ck_json_members_free(&m);
    return rc;
}

/* Every tensor in exactly one shard, and where weight_map (NULL: none) says. Entries were
 * appended shard by shard, so sorting a copy of the names finds tensors that appear twice. */
static int check_shards(const ck_index *ix, const cJSON *map, const char *where, ck_error *err)
{
    size_t n = ix->nentries;
    const ck_entry **by = malloc((n ? n : 1) * sizeof *by);
    if (!by)
        return ck_fail(err, where, "out of memory");
    for (size_t i = 0; i < n; i++)
        by[i] = &ix->entries[i];
    qsort(by, n, sizeof *by, by_entry_name);
    int rc = 0;
    for (size_t i = 1; i < n && rc == 0; i++)
        if (strcmp(by[i - 1]->name, by[i]->name) == 0)
            rc = ck_fail(err, where, "tensor '%s' is in two shards: %s and %s", by[i]->name,
                         ix->files[by[i - 1]->ext.file].path, ix->files[by[i]->ext.file].path);
    if (rc == 0 && map)
        rc = check_weight_map(ix, by, n, map, where, err);
    free(by);
    return rc;
}

/* Reads and parses the index file: its root, which has a "weight_map" object, its "metadata"
 * added to ix; NULL with err set. An index is JSON as a safetensors header is: the same bound. */
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
    if (cJSON_IsObject(meta) && st_add_metadata(ix, meta, 1, ipath, err) != 0) {
        cJSON_Delete(root);
        root = NULL;
    }
    free(text);
    ck_source_close(&f);
    return root;
}

/* The set: those the index at ipath names (names NULL), else names (n) beside base. */
static int open_set(struct http_remote *remote, const char *ipath, const char *base,
                    const char *const *names, size_t n, const char *where, shard_reader read,
                    ck_index **out, ck_error *err)
{
    *out = NULL;
    shard_set s = {ck_index_new(NULL), read, NULL};
    cJSON *root = NULL;
    int rc = s.ix ? 0 : ck_fail(err, where, "out of memory");
    if (s.ix)
        s.ix->remote = remote;
    if (rc == 0 && !names) {
        root = read_index_json(s.ix, ipath, err);
        rc = root ? open_indexed_shards(&s, cJSON_GetObjectItemCaseSensitive(root, "weight_map"),
                                        ipath, err)
                  : -1;
    }
    for (size_t i = 0; names && i < n && rc == 0; i++)
        rc = open_shard(&s, base, names[i], err) < 0 ? -1 : 0;
    if (rc == 0)
        rc = check_shards(s.ix, cJSON_GetObjectItemCaseSensitive(root, "weight_map"), where,
                          err);
    if (rc == 0)
        rc = ck_index_unique_meta(s.ix, err);
    cJSON_Delete(root);
    if (rc) {
        ck_index_free(s.ix);
        return -1;
    }
    /* An index that names no shard holds no tensor: a set of no family. */
    s.ix->format = !s.family ? "sharded"
                   : strcmp(s.family, "pytorch") == 0 ? "pytorch-sharded" : "safetensors-sharded";
    *out = s.ix;
    return 0;
}

int shards_open_index(struct http_remote *remote, const char *ipath, shard_reader read,
                      ck_index **out, ck_error *err)
{
    return open_set(remote, ipath, NULL, NULL, 0, ipath, read, out, err);
}

int shards_open_names(struct http_remote *remote, const char *base, const char *const *names,
                      size_t n, const char *where, shard_reader read, ck_index **out,
                      ck_error *err)
{
    return open_set(remote, NULL, base, names, n, where, read, out, err);
}

int shards_index_probe(const unsigned char *head, size_t n)
{
    size_t i = 0;
    while (i < n && (head[i] == ' ' || head[i] == '\t' || head[i] == '\n' || head[i] == '\r'))
        i++;
    return i < n && head[i] == '{';
}
