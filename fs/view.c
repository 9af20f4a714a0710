#include "view.h"
#include "../pack/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t ck_view_shape_json(const ck_entry *e, char *buf, size_t cap)
{
    size_t n = 0;
    char tmp[24];
    /* Like snprintf: what fits of each piece is copied, so a short buffer holds a prefix. */
#define PUT(s) do { size_t l_ = strlen(s); \
                    if (n < cap) memcpy(buf + n, s, n + l_ < cap ? l_ : cap - 1 - n); \
                    n += l_; } while (0)
    PUT("[");
    for (unsigned d = 0; d < e->rank; d++) {
        snprintf(tmp, sizeof tmp, "%s%lld", d ? "," : "", (long long)e->shape[d]);
        PUT(tmp);
    }
    PUT("]");
#undef PUT
    if (cap)
        buf[n < cap ? n : cap - 1] = 0;
    return n;
}

/* {"name", "path"} of entry i: what tensors and values both start with. */
static cJSON *entry_json(const ck_index *ix, const ck_tree *t, size_t i)
{
    char path[4096];
    size_t plen = ck_tree_path(t, t->entry_node[i], path, sizeof path);
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddItemToObject(o, "name", cJSON_CreateString(ix->entries[i].name));
    if (plen < sizeof path)
        cJSON_AddItemToObject(o, "path", cJSON_CreateString(path));
    else { /* deeper than PATH_MAX: build it in full */
        char *p = malloc(plen + 1);
        ck_tree_path(t, t->entry_node[i], p, p ? plen + 1 : 0);
        cJSON_AddItemToObject(o, "path", cJSON_CreateString(p ? p : ""));
        free(p);
    }
    return o;
}

static cJSON *tensor_json(const ck_index *ix, const ck_tree *t, size_t i, int with_locations)
{
    const ck_entry *e = &ix->entries[i];
    cJSON *o = entry_json(ix, t, i), *shape = cJSON_CreateArray();
    if (!o || !shape) {
        cJSON_Delete(o);
        cJSON_Delete(shape);
        return NULL;
    }
    cJSON_AddItemToObject(o, "dtype", cJSON_CreateString(ck_dtype_name(e->dtype)));
    for (unsigned d = 0; d < e->rank; d++)
        cJSON_AddItemToArray(shape, ck_json_uint((uint64_t)e->shape[d]));
    cJSON_AddItemToObject(o, "shape", shape);
    cJSON_AddItemToObject(o, "nbytes", ck_json_uint(e->nbytes));
    if (with_locations) {
        const ck_file *f = &ix->files[e->ext.file];
        cJSON_AddItemToObject(o, "file", cJSON_CreateString(f->path));
        cJSON_AddItemToObject(o, "offset", e->layout == CK_CONTIGUOUS
                                               ? ck_json_uint(e->ext.offset) : cJSON_CreateNull());
    }
    return o;
}

char *ck_view_index_json(const ck_index *ix, const ck_tree *t, int with_locations, size_t *len)
{
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_CreateObject(), *list = cJSON_CreateArray();
    char *text = NULL;
    if (!root || !meta || !list) {
        cJSON_Delete(meta);
        cJSON_Delete(list);
        goto out;
    }
    cJSON_AddItemToObject(root, "format", cJSON_CreateString(ix->format));
    cJSON_AddItemToObject(root, "metadata", meta);
    cJSON_AddItemToObject(root, "tensors", list);
    for (size_t i = 0; i < ix->nmeta; i++)
        cJSON_AddItemToObject(meta, ix->meta[i].key, cJSON_CreateString(ix->meta[i].value));
    cJSON *values = NULL;
    for (size_t i = 0; i < ix->nentries; i++) {
        int tensor = ix->entries[i].kind == CK_TENSOR;
        if (!tensor && !values && !(values = cJSON_AddArrayToObject(root, "values")))
            goto out;
        cJSON *o = tensor ? tensor_json(ix, t, i, with_locations) : entry_json(ix, t, i);
        if (!o)
            goto out;
        if (!tensor)
            cJSON_AddItemToObject(o, "type", cJSON_CreateString(
                                                 ck_value_type_name(ix->entries[i].dtype)));
        cJSON_AddItemToArray(tensor ? list : values, o);
    }
    text = cJSON_PrintUnformatted(root);
out:
    cJSON_Delete(root);
    if (text)
        *len = strlen(text);
    return text;
}
