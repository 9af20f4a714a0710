/* torch.c — PyTorch checkpoints (zip and legacy) into the common index, via the safe pickle VM. */
#include "torch.h"
#include "../base/bytes.h"
#include "../index/pickle.h"
#include "../index/pickle_text.h"
#include "../base/seed.h"
#include "../index/zip.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define PT_MAX_ENTRIES 10000000u /* shared subtrees could otherwise multiply without end */
#define PT_MAX_NAME 65536u
/* The entries' memory (their structs, names and value texts) may not pass this many bytes per
 * byte of the object pickle, plus PT_INDEX_SLACK: a name repeats every enclosing key, and a
 * container a pickle holds once is listed wherever it is shared, so without a bound a pickle of
 * a few KB could name gigabytes (1,000 references to one dict of 1,000 keys named 60 bytes
 * deep is a 10 KB pickle and 60 MB of names). Real checkpoints spend under 20 bytes of entry
 * per pickle byte: flat state dicts about 1, optimizer lists of small ints under 20. */
#define PT_INDEX_PER_BYTE 64u
#define PT_INDEX_SLACK (64u << 20)

/* Where a storage's bytes are in the source file. */
typedef struct pt_place {
    const char *key;
    uint64_t offset, bytes;
    uint64_t numel;
    uint8_t dtype;
} pt_place;

typedef struct pt_reader {
    ck_index *ix;
    uint32_t file;
    uint64_t base;            /* the archive's first byte in the file (pt_read_zip_at) */
    const char *root_name;    /* what the pickle's object is named ("": its children by key) */
    pt_tensor *tensor;        /* pt_read_zip_tensor: the one tensor, described here */
    int captured;             /* and whether it was */
    const char *path;
    const zip_archive *zip;   /* zip: records are found here under prefix */
    const char *prefix;
    size_t prefix_len;
    pt_place *places;         /* legacy: every storage, sorted by key */
    size_t nplaces;
    char *name;               /* the walk's current name */
    size_t name_cap;
    size_t visits;
    uint64_t index_left;      /* bytes the entries may still take (PT_INDEX_PER_BYTE) */
    ck_error *err;
} pt_reader;

typedef int (*pt_visit)(pt_reader *r, size_t name_len, const pk_obj *leaf);

/* --- text of keys and values --------------------------------------------------------------- */

/* The text Python's str() gives a scalar; *text points into buf (cap bytes, at least
 * PK_FLOAT_REPR_MAX) or into the object. Returns 0, or -1 when the object is no scalar. */
static int scalar_text(const pk_obj *o, char *buf, size_t cap, const char **text, size_t *len)
{
    *text = buf;
    switch (o->type) {
    case PK_NONE:
        *len = (size_t)snprintf(buf, cap, "None");
        return 0;
    case PK_BOOL:
        *len = (size_t)snprintf(buf, cap, o->u.i ? "True" : "False");
        return 0;
    case PK_INT:
        *len = (size_t)snprintf(buf, cap, "%lld", (long long)o->u.i);
        return 0;
    case PK_FLOAT:
        *len = pk_float_repr(o->u.f, buf);
        return 0;
    case PK_STR:
        *text = o->u.str.s;
        *len = o->u.str.len;
        return 0;
    case PK_GLOBAL:
        *text = o->u.global.name;
        *len = strlen(o->u.global.name);
        return 0;
    default:
        return -1;
    }
}

/* --- the walk over the object tree --------------------------------------------------------- */

typedef struct pt_frame {
    const pk_obj *obj;
    size_t next;      /* next child */
    size_t name_len;  /* this container's name */
    int named;        /* 0 for the root: its children take no '.' */
} pt_frame;

static int is_container(const pk_obj *o)
{
    return o->type == PK_TUPLE || o->type == PK_LIST || o->type == PK_DICT;
}

/* Makes room for a name of len bytes (and its NUL) in r->name. */
static int reserve_name(pt_reader *r, size_t len)
{
    if (len > PT_MAX_NAME)
        return ck_fail(r->err, r->path, "a name longer than %u bytes under '%.64s'",
                       PT_MAX_NAME, r->name ? r->name : "");
    if (len + 1 <= r->name_cap)
        return 0;
    size_t cap = r->name_cap ? r->name_cap : 256;
    while (cap < len + 1)
        cap *= 2;
    char *p = realloc(r->name, cap);
    if (!p)
        return ck_fail(r->err, r->path, "out of memory");
    r->name = p;
    r->name_cap = cap;
    return 0;
}

/* Appends child k's name piece to r->name after the container's name. */
static int child_name(pt_reader *r, const pt_frame *f, size_t k, size_t *len)
{
    char buf[64];
    const char *piece = buf;
    size_t plen;
    if (f->obj->type == PK_DICT) {
        const pk_obj *key, *value;
        pk_pair(f->obj, k, &key, &value);
        if (scalar_text(key, buf, sizeof buf, &piece, &plen) != 0 || key->type == PK_GLOBAL)
            return ck_fail(r->err, r->path, "a dict key of type %s under '%.*s' (only str, int, "
                           "float, bool and None keys name files)", pk_type_name(key->type),
                           (int)f->name_len, r->name);
        /* Entry names are C strings (index.h): a NUL would cut the name short. */
        if (memchr(piece, 0, plen))
            return ck_fail(r->err, r->path, "a dict key holding a NUL byte under '%.*s'",
                           (int)f->name_len, r->name);
    } else {
        plen = (size_t)snprintf(buf, sizeof buf, "%zu", k);
    }
    size_t need = f->name_len + (f->named ? 1 : 0) + plen;
    if (reserve_name(r, need) != 0)
        return -1;
    size_t at = f->name_len;
    if (f->named)
        r->name[at++] = '.';
    memcpy(r->name + at, piece, plen);
    r->name[need] = 0;
    *len = need;
    return 0;
}

/* Calls visit for every leaf under root, depth first, in container order. Iterative: the VM
 * bounds the depth, and the visit count bounds a tree whose subtrees are shared. */
static int walk(pt_reader *r, const pk_obj *root, pt_visit visit)
{
    size_t cap = 64, n = 1;
    pt_frame *stack = malloc(cap * sizeof *stack);
    if (!stack)
        return ck_fail(r->err, r->path, "out of memory");
    size_t root_len = r->root_name ? strlen(r->root_name) : 0;
    if (reserve_name(r, root_len) != 0) {
        free(stack);
        return -1;
    }
    memcpy(r->name, r->root_name ? r->root_name : "", root_len + 1);
    stack[0] = (pt_frame){.obj = root, .name_len = root_len, .named = root_len > 0};
    int rc = 0;
    while (n && rc == 0) {
        pt_frame *f = &stack[n - 1];
        if (!is_container(f->obj)) {
            r->name[f->name_len] = 0;
            rc = visit(r, f->name_len, f->obj);
            n--;
            continue;
        }
        if (f->next == pk_len(f->obj)) {
            n--;
            continue;
        }
        size_t k = f->next++, len = 0;
        if (++r->visits > 4 * (size_t)PT_MAX_ENTRIES) {
            rc = ck_fail(r->err, r->path, "more than %u objects to list", 4 * PT_MAX_ENTRIES);
            break;
        }
        if ((rc = child_name(r, f, k, &len)) != 0)
            break;
        const pk_obj *key, *child = pk_item(f->obj, k);
        if (!child)
            pk_pair(f->obj, k, &key, &child);
        if (n == cap) {
            pt_frame *p = realloc(stack, 2 * cap * sizeof *stack);
            if (!p) {
                rc = ck_fail(r->err, r->path, "out of memory");
                break;
            }
            stack = p;
            cap *= 2;
        }
        stack[n++] = (pt_frame){.obj = child, .name_len = len, .named = 1};
    }
    free(stack);
    return rc;
}

/* --- storages and tensors ------------------------------------------------------------------ */

static unsigned elem_size(uint8_t dtype)
{
    return dtype == PK_DTYPE_BYTES ? 1 : ck_dtype_bits(dtype) / 8;
}

static int place_by_key(const void *a, const void *b)
{
    return strcmp(((const pt_place *)a)->key, ((const pt_place *)b)->key);
}

static const pt_place *legacy_place(const pt_reader *r, const char *key)
{
    pt_place probe = {.key = key};
    if (r->nplaces == 0) /* places is NULL then, which bsearch may not be given */
        return NULL;
    return bsearch(&probe, r->places, r->nplaces, sizeof probe, place_by_key);
}

/* The zip record called prefix + dir + name into out (cap bytes) as snprintf would write it: as
 * much as fits, NUL-terminated; returns the full length. Not snprintf itself: once per tensor,
 * it would cost more than finding the record. */
static size_t record_name(const pt_reader *r, const char *dir, const char *name, char *out,
                          size_t cap)
{
    const char *part[3] = {r->prefix, dir, name};
    size_t len[3] = {r->prefix_len, strlen(dir), strlen(name)}, n = 0;
    for (int k = 0; k < 3; k++) {
        if (n + 1 < cap)
            memcpy(out + n, part[k], len[k] < cap - 1 - n ? len[k] : cap - 1 - n);
        n += len[k];
    }
    out[n < cap ? n : cap - 1] = 0;
    return n;
}

/* Where storage s is, checked against the size the pickle gives it. */
static int storage_place(pt_reader *r, const pk_obj *s, pt_place *out)
{
    unsigned esize = elem_size(s->u.storage.dtype);
    uint64_t need = s->u.storage.numel * esize;
    if (esize && need / esize != s->u.storage.numel)
        return ck_fail(r->err, r->path, "storage '%s': %llu elements overflow", s->u.storage.key,
                       (unsigned long long)s->u.storage.numel);
    if (!r->zip) {
        const pt_place *p = legacy_place(r, s->u.storage.key);
        if (!p || p->bytes == UINT64_MAX)
            return ck_fail(r->err, r->path, "storage '%s' has no data record",
                           s->u.storage.key);
        *out = *p;
        return 0;
    }
    char rec[512];
    size_t n = record_name(r, "data/", s->u.storage.key, rec, sizeof rec);
    const zip_entry *e = n < sizeof rec ? zip_find(r->zip, rec, n) : NULL;
    if (!e)
        return ck_fail(r->err, r->path, "storage '%s': no record '%s'", s->u.storage.key, rec);
    if (e->method != 0)
        return ck_fail(r->err, r->path, "record '%s' is compressed (method %u); ckptfs serves "
                       "stored records only", rec, e->method);
    if (e->size != need)
        return ck_fail(r->err, r->path, "record '%s' holds %llu bytes, its storage needs %llu",
                       rec, (unsigned long long)e->size, (unsigned long long)need);
    *out = (pt_place){.key = s->u.storage.key, .offset = r->base + e->data_offset, .bytes = e->size,
                      .numel = s->u.storage.numel, .dtype = s->u.storage.dtype};
    return 0;
}

/* The tensor t (named r->name) as a pt_tensor: checked against its storage. */
static int describe_tensor(pt_reader *r, const pk_obj *t, pt_tensor *out)
{
    const char *name = r->name;
    const pk_obj *s = t->u.tensor.storage;
    unsigned rank = t->u.tensor.rank, esize = elem_size(t->u.tensor.dtype);
    if (t->u.tensor.dtype == PK_DTYPE_BYTES || esize == 0)
        return ck_fail(r->err, r->path, "tensor '%s': no element type", name);
    pt_place p = {0};
    if (storage_place(r, s, &p) != 0)
        return -1;
    int64_t *dims = out->dims;
    for (unsigned d = 0; d < rank; d++) {
        if (t->u.tensor.stride[d] < 0)
            return ck_fail(r->err, r->path, "tensor '%s': negative stride %lld", name,
                           (long long)t->u.tensor.stride[d]);
        dims[d] = t->u.tensor.size[d];
        dims[rank + d] = t->u.tensor.stride[d];
    }
    uint64_t nbytes, last;
    if (ck_tensor_nbytes(rank, dims, t->u.tensor.dtype, &nbytes) != 0)
        return ck_fail(r->err, r->path, "tensor '%s': shape overflows", name);
    out->contiguous = nbytes == 0 || ck_strides_row_major(rank, dims);
    if (nbytes) {
        if (ck_strided_last(rank, dims, (uint64_t)t->u.tensor.offset, &last) != 0 ||
            last >= p.bytes / esize)
            return ck_fail(r->err, r->path, "tensor '%s' reaches past the end of its storage "
                           "'%s' (%llu bytes)", name, s->u.storage.key,
                           (unsigned long long)p.bytes);
    }
    out->dtype = t->u.tensor.dtype;
    out->rank = (uint8_t)rank;
    uint64_t first = nbytes ? p.offset + (uint64_t)t->u.tensor.offset * esize : p.offset;
    out->ext = (ck_extent){.offset = first, .length = nbytes, .file = r->file};
    return 0;
}

static int add_tensor(pt_reader *r, size_t name_len, const pk_obj *t)
{
    pt_tensor d;
    if (describe_tensor(r, t, &d) != 0)
        return -1;
    ck_entry *e = ck_index_add_entry(r->ix, r->name, name_len,
                                     d.contiguous ? CK_CONTIGUOUS : CK_STRIDED, d.rank, d.dims,
                                     r->err);
    if (!e)
        return -1;
    e->dtype = d.dtype;
    e->nbytes = d.ext.length;
    e->ext = d.ext;
    return 0;
}

/* pt_read_zip_tensor's visit: the object is one tensor, described into r->tensor. */
static int capture_tensor(pt_reader *r, size_t name_len, const pk_obj *leaf)
{
    if (name_len || leaf->type != PK_TENSOR) /* a name: a container's child */
        return ck_fail(r->err, r->path, "the torch.save archive at byte %llu holds a %s, not "
                       "one tensor", (unsigned long long)r->base,
                       name_len ? "container" : pk_type_name(leaf->type));
    r->captured = 1;
    return describe_tensor(r, leaf, r->tensor);
}

static int add_value(pt_reader *r, size_t name_len, const pk_obj *v)
{
    static const uint8_t types[] = {[PK_NONE] = CK_VAL_NONE, [PK_BOOL] = CK_VAL_BOOL,
                                    [PK_INT] = CK_VAL_INT,   [PK_FLOAT] = CK_VAL_FLOAT,
                                    [PK_STR] = CK_VAL_STR,   [PK_BYTES] = CK_VAL_BYTES,
                                    [PK_GLOBAL] = CK_VAL_GLOBAL};
    char buf[64];
    const char *text;
    size_t len;
    if (v->type == PK_BYTES) { /* raw, no newline: the file is the bytes */
        return ck_index_add_value(r->ix, r->name, name_len, CK_VAL_BYTES, v->u.str.s,
                                  v->u.str.len, r->err) ? 0 : -1;
    }
    if (scalar_text(v, buf, sizeof buf - 1, &text, &len) != 0)
        return ck_fail(r->err, r->path, "'%s' is a %s, which ckptfs cannot show", r->name,
                       pk_type_name(v->type));
    char *line = malloc(len + 1);
    if (!line)
        return ck_fail(r->err, r->path, "out of memory");
    memcpy(line, text, len);
    line[len] = '\n';
    int rc = ck_index_add_value(r->ix, r->name, name_len, types[v->type], line, len + 1, r->err)
                 ? 0 : -1;
    free(line);
    return rc;
}

/* Sets the entries' budget from the object pickle's size (see PT_INDEX_PER_BYTE). */
static void budget_index(pt_reader *r, const pk_result *obj)
{
    r->index_left = (uint64_t)obj->consumed * PT_INDEX_PER_BYTE + PT_INDEX_SLACK;
}

static int add_leaf(pt_reader *r, size_t name_len, const pk_obj *leaf)
{
    if (r->ix->nentries >= PT_MAX_ENTRIES)
        return ck_fail(r->err, r->path, "more than %u entries", PT_MAX_ENTRIES);
    uint64_t text = leaf->type == PK_STR || leaf->type == PK_BYTES ? leaf->u.str.len + 1
                                                                   : PK_FLOAT_REPR_MAX;
    uint64_t bytes = sizeof(ck_entry) + name_len + 1 + text;
    if (bytes > r->index_left)
        return ck_fail(r->err, r->path, "the entries take more than %u bytes per byte of the "
                       "object pickle, plus %u MiB: shared or deeply nested containers repeat "
                       "them (at '%.64s', entry %zu)", PT_INDEX_PER_BYTE, PT_INDEX_SLACK >> 20,
                       r->name, r->ix->nentries);
    r->index_left -= bytes;
    return leaf->type == PK_TENSOR ? add_tensor(r, name_len, leaf) : add_value(r, name_len, leaf);
}

/* --- legacy files ---------------------------------------------------------------------------- */

/* Every legacy file opens with a pickle of the magic number 0x1950a86a20f9469cfc6c: PROTO 2-5,
 * a FRAME from protocol 4 on, LONG1 with its 10 little-endian bytes, STOP. The number is wider
 * than the VM's integers, so it is matched as bytes. Returns the pickle's length, or 0. */
static size_t legacy_magic_len(const unsigned char *head, size_t n)
{
    static const unsigned char magic[] = {0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20,
                                          0x6a, 0xa8, 0x50, 0x19, '.'};
    if (n < 2 || head[0] != 0x80 || head[1] < 2 || head[1] > 5)
        return 0;
    size_t at = 2;
    if (n > at && head[at] == 0x95) /* FRAME and its 8-byte length */
        at += 9;
    return n >= at + sizeof magic && memcmp(head + at, magic, sizeof magic) == 0
               ? at + sizeof magic : 0;
}

int pt_probe_legacy(const unsigned char *head, size_t n)
{
    return legacy_magic_len(head, n) != 0;
}

/* Runs the pickle at file offset *pos, reading more of the file while the VM asks for more
 * (64 KiB first, then four times as much each time: the small pickles cost little, and the
 * object pickle a few rereads at most); advances *pos past it. */
static int load_pickle_at(pt_reader *r, uint64_t *pos, pk_result *res)
{
    const ck_file *f = &r->ix->files[r->file];
    uint64_t left = f->size - *pos;
    size_t want = left < (64u << 10) ? (size_t)left : (64u << 10);
    for (;;) {
        unsigned char *buf = malloc(want ? want : 1);
        if (!buf)
            return ck_fail(r->err, r->path, "out of memory");
        int rc = ck_file_read(f, buf, want, *pos);
        if (rc) {
            free(buf);
            return ck_fail(r->err, r->path, "cannot read: %s", strerror(-rc));
        }
        rc = pk_load(buf, want, &pk_default_limits, r->path, *pos, res, r->err);
        free(buf);
        if (rc == 0) {
            *pos += res->consumed;
            return 0;
        }
        if (rc != PK_TRUNCATED || want == left)
            return -1;
        if (want >= PT_MAX_PICKLE)
            return ck_fail(r->err, r->path, "a pickle at byte %llu is over %u bytes",
                           (unsigned long long)*pos, PT_MAX_PICKLE);
        want = left < (uint64_t)want * 4 ? (size_t)left : want * 4;
    }
}

/* Every storage of the object pickle, sorted by key (the VM made one per key). Those of no
 * tensor count too: the file holds their bytes all the same (a dict value set twice held one,
 * and torch.load reads it and drops it). */
static int collect_places(pt_reader *r, const pk_result *obj)
{
    r->nplaces = obj->nstorages;
    if (r->nplaces == 0)
        return 0;
    if (!(r->places = malloc(r->nplaces * sizeof *r->places)))
        return ck_fail(r->err, r->path, "out of memory");
    for (size_t i = 0; i < r->nplaces; i++) {
        const pk_obj *s = obj->storages[i];
        r->places[i] = (pt_place){.key = s->u.storage.key, .numel = s->u.storage.numel,
                                  .dtype = s->u.storage.dtype, .bytes = UINT64_MAX};
    }
    qsort(r->places, r->nplaces, sizeof *r->places, place_by_key);
    return 0;
}

/* After the pickles: for each key of the list, an 8-byte little-endian element count and the
 * storage's bytes. Only the counts are read. */
static int place_legacy_storages(pt_reader *r, const pk_obj *keys, uint64_t pos)
{
    const ck_file *f = &r->ix->files[r->file];
    if (!pk_as(keys, PK_LIST))
        return ck_fail(r->err, r->path, "the storage key list is a %s", pk_type_name(keys->type));
    for (size_t i = 0; i < pk_len(keys); i++) {
        const char *key = pk_text(pk_item(keys, i), NULL);
        pt_place *p = key ? (pt_place *)legacy_place(r, key) : NULL;
        if (!p)
            return ck_fail(r->err, r->path, "storage key %zu of the list names no storage of "
                           "the object pickle (byte %llu)", i, (unsigned long long)pos);
        unsigned char c[8];
        if (pos > f->size || f->size - pos < 8 || ck_file_read(f, c, 8, pos) != 0)
            return ck_fail(r->err, r->path, "storage '%s': its record runs past the end of the "
                           "file (byte %llu)", p->key, (unsigned long long)pos);
        uint64_t numel = get_le64(c);
        uint64_t bytes = numel * elem_size(p->dtype);
        if (numel != p->numel || (numel && bytes / numel != elem_size(p->dtype)))
            return ck_fail(r->err, r->path, "storage '%s': the file says %llu elements, the "
                           "pickle %llu (byte %llu)", p->key, (unsigned long long)numel,
                           (unsigned long long)p->numel, (unsigned long long)pos);
        if (bytes > f->size - pos - 8)
            return ck_fail(r->err, r->path, "storage '%s': %llu bytes run past the end of the "
                           "file (byte %llu)", p->key, (unsigned long long)bytes,
                           (unsigned long long)pos + 8);
        if (p->bytes != UINT64_MAX)
            return ck_fail(r->err, r->path, "storage '%s' listed twice", p->key);
        p->offset = pos + 8;
        p->bytes = bytes;
        pos += 8 + bytes;
    }
    return 0;
}

/* Opening pickles: protocol version 1001, then sys_info, which must say little-endian. */
static int check_legacy_preamble(pt_reader *r, uint64_t *pos)
{
    pk_result res;
    if (load_pickle_at(r, pos, &res) != 0)
        return -1;
    int64_t version;
    int ok = pk_int(res.root, &version) == 0 && version == 1001;
    pk_free(&res);
    if (!ok)
        return ck_fail(r->err, r->path, "legacy protocol version is not 1001");
    if (load_pickle_at(r, pos, &res) != 0)
        return -1;
    const pk_obj *key, *value;
    int little = -1;
    for (size_t i = 0; pk_pair(res.root, i, &key, &value) == 0; i++) {
        const char *k = pk_text(key, NULL);
        if (k && strcmp(k, "little_endian") == 0)
            little = pk_bool(value);
    }
    pk_free(&res);
    if (little != 1)
        return ck_fail(r->err, r->path, little == 0 ? "big-endian checkpoints are not supported"
                                                   : "sys_info does not say little_endian");
    return 0;
}

int pt_read_legacy(ck_index *ix, uint32_t file, ck_error *err)
{
    pt_reader r = {.ix = ix, .file = file, .path = ix->files[file].path, .err = err};
    const ck_file *f = &ix->files[file];
    unsigned char head[PT_PROBE_BYTES];
    size_t n = f->size < sizeof head ? (size_t)f->size : sizeof head;
    uint64_t pos = ck_file_read(f, head, n, 0) == 0 ? legacy_magic_len(head, n) : 0;
    if (pos == 0)
        return ck_fail(err, r.path, "not a legacy torch file (no magic number)");
    pk_result obj = {0}, keys = {0};
    int rc = check_legacy_preamble(&r, &pos);
    if (rc == 0)
        rc = load_pickle_at(&r, &pos, &obj);
    if (rc == 0)
        rc = load_pickle_at(&r, &pos, &keys);
    if (rc == 0)
        rc = collect_places(&r, &obj);
    if (rc == 0)
        rc = place_legacy_storages(&r, keys.root, pos);
    if (rc == 0) {
        budget_index(&r, &obj);
        rc = walk(&r, obj.root, add_leaf);
    }
    pk_free(&obj);
    pk_free(&keys);
    free(r.places);
    free(r.name);
    return rc;
}

/* --- zip files ------------------------------------------------------------------------------- */

/* Every record shares the first one's top folder, whatever its name. */
static int find_prefix(pt_reader *r, const zip_archive *z)
{
    if (z->nentries == 0)
        return ck_fail(r->err, r->path, "empty zip archive");
    const char *slash = memchr(z->entries[0].name, '/', z->entries[0].name_len);
    if (!slash)
        return ck_fail(r->err, r->path, "record '%s' is not inside a folder", z->entries[0].name);
    r->prefix = z->entries[0].name;
    r->prefix_len = (size_t)(slash - r->prefix) + 1;
    for (size_t i = 1; i < z->nentries; i++)
        if (z->entries[i].name_len < r->prefix_len ||
            memcmp(z->entries[i].name, r->prefix, r->prefix_len) != 0)
            return ck_fail(r->err, r->path, "record '%s' is outside the archive folder '%.*s'",
                           z->entries[i].name, (int)r->prefix_len, r->prefix);
    return 0;
}

static const zip_entry *record(const pt_reader *r, const char *name)
{
    char full[512];
    size_t n = record_name(r, "", name, full, sizeof full);
    return n < sizeof full ? zip_find(r->zip, full, n) : NULL;
}

/* A small stored record's bytes, NUL-terminated, into buf. */
static int read_small_record(pt_reader *r, const zip_entry *e, char *buf, size_t cap)
{
    if (e->method != 0 || e->size >= cap)
        return ck_fail(r->err, r->path, "record '%s' is compressed or over %zu bytes", e->name,
                       cap - 1);
    int rc = ck_file_pread(r->ix, r->file, buf, (size_t)e->size, r->base + e->data_offset);
    if (rc)
        return ck_fail(r->err, r->path, "cannot read record '%s': %s", e->name, strerror(-rc));
    buf[e->size] = 0;
    return 0;
}

static int check_zip_records(pt_reader *r)
{
    char text[64];
    const zip_entry *e;
    if (record(r, "constants.pkl"))
        return ck_fail(r->err, r->path, "a TorchScript archive (it has constants.pkl); save the "
                       "state_dict with torch.save instead");
    if ((e = record(r, "byteorder")) != NULL) {
        if (read_small_record(r, e, text, sizeof text) != 0)
            return -1;
        if (strcmp(text, "little") != 0)
            return ck_fail(r->err, r->path, "byte order '%s' is not supported (little only)",
                           strcmp(text, "big") == 0 ? "big" : "unknown");
    }
    if (!record(r, "data.pkl"))
        return ck_fail(r->err, r->path, "no record '%.*sdata.pkl': not a torch.save archive",
                       (int)r->prefix_len, r->prefix);
    return 0;
}

static int load_data_pkl(pt_reader *r, pk_result *res)
{
    const zip_entry *e = record(r, "data.pkl");
    if (e->method != 0)
        return ck_fail(r->err, r->path, "record '%s' is compressed (method %u)", e->name,
                       e->method);
    if (e->size > PT_MAX_PICKLE)
        return ck_fail(r->err, r->path, "record '%s' is %llu bytes, over the limit of %u",
                       e->name, (unsigned long long)e->size, PT_MAX_PICKLE);
    unsigned char *buf = malloc(e->size ? (size_t)e->size : 1);
    if (!buf)
        return ck_fail(r->err, r->path, "out of memory");
    int rc = ck_file_pread(r->ix, r->file, buf, (size_t)e->size, r->base + e->data_offset);
    if (rc)
        ck_fail(r->err, r->path, "cannot read record '%s': %s", e->name, strerror(-rc));
    else if ((rc = pk_load(buf, (size_t)e->size, &pk_default_limits, r->path,
                           r->base + e->data_offset,
                           res, r->err)) != 0)
        rc = -1;
    free(buf);
    return rc;
}

/* The archive whose directory is z (read from the file, or through a window onto it at
 * r->base), its object walked with visit. */
static int walk_archive(pt_reader *r, const zip_archive *z, pt_visit visit)
{
    r->zip = z;
    pk_result res = {0};
    int rc = find_prefix(r, z);
    if (rc == 0)
        rc = check_zip_records(r);
    if (rc == 0)
        rc = load_data_pkl(r, &res);
    if (rc == 0) {
        budget_index(r, &res);
        rc = walk(r, res.root, visit);
    }
    pk_free(&res);
    free(r->name);
    return rc;
}

int pt_read_zip(ck_index *ix, uint32_t file, const zip_archive *z, ck_error *err)
{
    pt_reader r = {.ix = ix, .file = file, .path = ix->files[file].path, .err = err};
    return walk_archive(&r, z, add_leaf);
}

/* The archive of size bytes at r->base in r->file, read through a window onto them. */
static int read_window(pt_reader *r, uint64_t size, pt_visit visit)
{
    ck_window w;
    ck_window_init(&w, &r->ix->files[r->file], r->base, size);
    zip_archive z;
    if (zip_read_directory(&w.file, size, r->path, &z, r->err) != 0)
        return -1;
    int rc = walk_archive(r, &z, visit);
    zip_free(&z);
    return rc;
}

/* --- archives that several records name ------------------------------------------------ */

/* An archive pt_read_zip_tensor or pt_read_zip_or_omit read, by where it lies, and what the
 * read gave: read again, the archive is not parsed again (see torch.h). */
typedef struct pt_seen {
    uint64_t base, size;
    uint32_t file;
    uint8_t used, has_tensor, has_entries;
    pt_tensor *tensor;     /* pt_read_zip_tensor's */
    size_t first, n;       /* pt_read_zip_or_omit's: entries [first, first + n) of the index, */
    size_t omission;       /* or its omission (SIZE_MAX: none) */
    size_t name_len;       /* the name they were given, which the copies replace */
    uint64_t index_left;   /* what the entries may still take, copies included */
} pt_seen;

struct pt_archives {
    pt_seen *slot;         /* open addressing, by a seeded hash of where the archive lies */
    size_t cap, n;
    uint64_t seed;
};

pt_archives *pt_archives_new(void)
{
    pt_archives *a = calloc(1, sizeof *a);
    if (a)
        a->seed = ck_hash_seed();
    return a;
}

void pt_archives_free(pt_archives *a)
{
    for (size_t i = 0; a && i < a->cap; i++)
        free(a->slot[i].tensor);
    if (a)
        free(a->slot);
    free(a);
}

static pt_seen *seen_probe(pt_seen *slot, size_t cap, uint64_t seed, uint32_t file,
                           uint64_t base, uint64_t size)
{
    uint64_t key[3] = {file, base, size};
    for (size_t i = XXH3_64bits_withSeed(key, sizeof key, seed) & (cap - 1);;
         i = (i + 1) & (cap - 1))
        if (!slot[i].used || (slot[i].file == file && slot[i].base == base &&
                              slot[i].size == size))
            return &slot[i];
}

/* The archive's slot, a new one when it was never read; NULL when memory runs out. */
static pt_seen *seen_at(pt_archives *a, uint32_t file, uint64_t base, uint64_t size)
{
    if (2 * (a->n + 1) > a->cap) { /* at most half full */
        size_t cap = a->cap ? 2 * a->cap : 64;
        pt_seen *slot = calloc(cap, sizeof *slot);
        if (!slot)
            return NULL;
        for (size_t i = 0; i < a->cap; i++)
            if (a->slot[i].used)
                *seen_probe(slot, cap, a->seed, a->slot[i].file, a->slot[i].base,
                            a->slot[i].size) = a->slot[i];
        free(a->slot);
        a->slot = slot;
        a->cap = cap;
    }
    pt_seen *s = seen_probe(a->slot, a->cap, a->seed, file, base, size);
    if (!s->used) {
        *s = (pt_seen){.base = base, .size = size, .file = file, .used = 1,
                       .omission = SIZE_MAX};
        a->n++;
    }
    return s;
}

/* What an earlier read of s's archive under another name added, added again under name (len
 * bytes): its entries, renamed, their text and places shared, within the budget the first
 * read left; or its omission. */
static int copy_read(ck_index *ix, pt_seen *s, const char *name, size_t len, ck_error *err)
{
    const char *path = ix->files[s->file].path;
    if (s->omission != SIZE_MAX)
        return ck_index_add_omission(ix, name, len, ix->omitted[s->omission].reason, err);
    char *full = NULL;
    int rc = 0;
    for (size_t i = s->first; i < s->first + s->n && rc == 0; i++) {
        ck_entry src = ix->entries[i]; /* by value: adding may move the entries */
        size_t n = len + src.name_len - s->name_len;
        uint64_t bytes = sizeof(ck_entry) + n + 1;
        if (ix->nentries >= PT_MAX_ENTRIES || bytes > s->index_left) {
            rc = ck_fail(err, path, "'%s': the archive at byte %llu, named by several records, "
                         "lists more entries than its object pickle allows (%u bytes per "
                         "byte, plus %u MiB)", name, (unsigned long long)s->base,
                         PT_INDEX_PER_BYTE, PT_INDEX_SLACK >> 20);
            break;
        }
        s->index_left -= bytes;
        char *p = realloc(full, n + 1);
        if (!p) {
            rc = ck_fail(err, path, "out of memory");
            break;
        }
        full = p;
        memcpy(full, name, len);
        memcpy(full + len, src.name + s->name_len, src.name_len - s->name_len + 1);
        ck_entry *e = src.kind == CK_VALUE
                          ? ck_index_add_value_held(ix, full, n, src.dtype, src.text,
                                                    src.nbytes, err)
                          : ck_index_add_entry(ix, full, n, src.layout, src.rank, src.shape, err);
        if (!e) {
            rc = -1;
        } else if (src.kind != CK_VALUE) {
            e->dtype = src.dtype;
            e->nbytes = src.nbytes;
            e->ext = src.ext;
        }
    }
    free(full);
    return rc;
}

/* The archive's entries under name, as pt_read_zip_or_omit adds them; *left: the budget its
 * entries left. */
static int read_at(ck_index *ix, uint32_t file, uint64_t base, uint64_t size, const char *name,
                   uint64_t *left, ck_error *err)
{
    pt_reader r = {.ix = ix, .file = file, .base = base, .root_name = name,
                   .path = ix->files[file].path, .err = err};
    int rc = read_window(&r, size, add_leaf);
    *left = r.index_left;
    return rc;
}

int pt_read_zip_or_omit(ck_index *ix, pt_archives *seen, uint32_t file, uint64_t base,
                        uint64_t size, const char *name, size_t len, const char *context,
                        ck_error *err)
{
    pt_seen *s = seen_at(seen, file, base, size);
    if (!s)
        return ck_fail(err, ix->files[file].path, "out of memory");
    if (s->has_entries)
        return copy_read(ix, s, name, len, err);
    size_t before = ix->nentries;
    ck_error why;
    *s = (pt_seen){.base = base, .size = size, .file = file, .used = 1, .has_entries = 1,
                   .has_tensor = s->has_tensor, .tensor = s->tensor, .first = before,
                   .omission = SIZE_MAX, .name_len = len};
    if (read_at(ix, file, base, size, name, &s->index_left, &why) == 0) {
        s->n = ix->nentries - before;
        return 0;
    }
    ix->nentries = before; /* what it added before it failed is not the object */
    /* the reason without the "FILE: " the message starts with: an omission is of that file */
    char reason[sizeof why.msg + 128];
    const char *msg = ck_error_detail(&why, ix->files[file].path);
    snprintf(reason, sizeof reason, "%s%s%s", context ? context : "", context ? ": " : "", msg);
    s->omission = ix->nomitted;
    return ck_index_add_omission(ix, name, len, reason, err);
}

int pt_read_zip_tensor(ck_index *ix, pt_archives *seen, uint32_t file, uint64_t base,
                       uint64_t size, pt_tensor *out, ck_error *err)
{
    pt_seen *s = seen_at(seen, file, base, size);
    if (!s)
        return ck_fail(err, ix->files[file].path, "out of memory");
    if (s->has_tensor) {
        *out = *s->tensor;
        return 0;
    }
    pt_reader r = {.ix = ix, .file = file, .base = base, .tensor = out,
                   .path = ix->files[file].path, .err = err};
    int rc = read_window(&r, size, capture_tensor);
    if (rc == 0 && !r.captured)
        rc = ck_fail(err, r.path, "the torch.save archive at byte %llu holds an empty "
                     "container, not one tensor", (unsigned long long)base);
    if (rc == 0 && (s->tensor = malloc(sizeof *s->tensor)) != NULL) {
        *s->tensor = *out;
        s->has_tensor = 1;
    }
    return rc; /* not kept when memory runs out: it is read again then */
}
