/* gguf.c — GGUF files and split sets (see gguf.h). */
#include "gguf.h"
#include "../base/bytes.h"
#include "../base/cursor.h"
#include "../base/json.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { WINDOW = 1 << 20, MAX_DIMS = 4, DEFAULT_ALIGNMENT = 32, MAX_ALIGNMENT = 1 << 20 };

/* GGUF value types, as the file numbers them. */
enum gv { GV_U8, GV_I8, GV_U16, GV_I16, GV_U32, GV_I32, GV_F32, GV_BOOL, GV_STR, GV_ARRAY,
          GV_U64, GV_I64, GV_F64, GV_COUNT };

static const struct {
    const char *name;
    unsigned size; /* bytes of one item; a string's is its 8-byte length, the least it takes */
    uint8_t value; /* enum ck_value_type of its value file */
} gv_types[GV_COUNT] = {
    [GV_U8] = {"UINT8", 1, CK_VAL_INT},     [GV_I8] = {"INT8", 1, CK_VAL_INT},
    [GV_U16] = {"UINT16", 2, CK_VAL_INT},   [GV_I16] = {"INT16", 2, CK_VAL_INT},
    [GV_U32] = {"UINT32", 4, CK_VAL_INT},   [GV_I32] = {"INT32", 4, CK_VAL_INT},
    [GV_F32] = {"FLOAT32", 4, CK_VAL_FLOAT}, [GV_BOOL] = {"BOOL", 1, CK_VAL_BOOL},
    [GV_STR] = {"STRING", 8, CK_VAL_STR},   [GV_ARRAY] = {"ARRAY", 12, CK_VAL_STR},
    [GV_U64] = {"UINT64", 8, CK_VAL_INT},   [GV_I64] = {"INT64", 8, CK_VAL_INT},
    [GV_F64] = {"FLOAT64", 8, CK_VAL_FLOAT},
};

/* ggml's type numbers (enum ggml_type) -> our dtype + 1; 0 for numbers ggml never had or
 * removed (4, 5: Q4_2, Q4_3; 31-33 and 36-38: the repacked Q4_0/IQ4_NL layouts). */
static const uint8_t ggml_types[] = {
    [0] = CK_F32 + 1,      [1] = CK_F16 + 1,      [2] = CK_Q4_0 + 1,     [3] = CK_Q4_1 + 1,
    [6] = CK_Q5_0 + 1,     [7] = CK_Q5_1 + 1,     [8] = CK_Q8_0 + 1,     [9] = CK_Q8_1 + 1,
    [10] = CK_Q2_K + 1,    [11] = CK_Q3_K + 1,    [12] = CK_Q4_K + 1,    [13] = CK_Q5_K + 1,
    [14] = CK_Q6_K + 1,    [15] = CK_Q8_K + 1,    [16] = CK_IQ2_XXS + 1, [17] = CK_IQ2_XS + 1,
    [18] = CK_IQ3_XXS + 1, [19] = CK_IQ1_S + 1,   [20] = CK_IQ4_NL + 1,  [21] = CK_IQ3_S + 1,
    [22] = CK_IQ2_S + 1,   [23] = CK_IQ4_XS + 1,  [24] = CK_I8 + 1,      [25] = CK_I16 + 1,
    [26] = CK_I32 + 1,     [27] = CK_I64 + 1,     [28] = CK_F64 + 1,     [29] = CK_IQ1_M + 1,
    [30] = CK_BF16 + 1,    [34] = CK_TQ1_0 + 1,   [35] = CK_TQ2_0 + 1,   [39] = CK_MXFP4 + 1,
    [40] = CK_NVFP4 + 1,   [41] = CK_Q1_0 + 1,
};

/* --- bounded reads through a window ----------------------------------------------------- */

/* The fields are taken through a cursor over a window of the file, read anew where a field
 * runs past it: the keys of a large model are tens of megabytes, read once, a window at a
 * time. */
typedef struct rd {
    const char *path;
    const ck_file *f;
    uint64_t size;          /* the file's size */
    ck_cursor c;            /* over the window: ck_cursor_at is the next byte to take */
    unsigned char *win;
    size_t win_cap;
    ck_error *err;
} rd;

/* Reads the window anew at the cursor: n bytes at least, WINDOW when the file has them. */
static int refill(rd *r, uint64_t n, const char *what)
{
    uint64_t pos = ck_cursor_at(&r->c), left = r->size - pos;
    size_t want = (size_t)(left < WINDOW ? left : n > WINDOW ? n : WINDOW);
    if (want > r->win_cap) {
        unsigned char *p = realloc(r->win, want);
        if (!p)
            return ck_fail(r->err, r->path, "out of memory reading %s", what);
        r->win = p;
        r->win_cap = want;
    }
    int rc = ck_file_read(r->f, r->win, want, pos);
    if (rc)
        return ck_fail(r->err, r->path, "cannot read: %s (byte %llu)", strerror(-rc),
                       (unsigned long long)pos);
    r->c = ck_cursor_make(r->win, want, pos);
    return 0;
}

/* Fails unless the next n bytes are in the file (what names the field being read), and
 * brings them into the window. */
static int have(rd *r, uint64_t n, const char *what)
{
    uint64_t pos = ck_cursor_at(&r->c);
    if (n > r->size - pos)
        return ck_fail(r->err, r->path, "%s runs past the end of the file (%llu bytes) (byte "
                       "%llu)", what, (unsigned long long)r->size, (unsigned long long)pos);
    return n > ck_cursor_left(&r->c) ? refill(r, n, what) : 0;
}

/* Back to file offset at, read before: in the window when it still holds it, else the next
 * take reads it anew. */
static void rewind_to(rd *r, uint64_t at)
{
    ck_cursor whole = ck_cursor_make(r->win, r->c.len, r->c.base);
    if (at >= whole.base && ck_take(&whole, at - whole.base))
        r->c = whole;
    else
        r->c = ck_cursor_make(r->win, 0, at);
}

/* The next n bytes (valid until the next take), advancing; NULL with err set when the file
 * ends first. */
static const unsigned char *take(rd *r, uint64_t n, const char *what)
{
    return have(r, n, what) ? NULL : ck_take(&r->c, n);
}

static int take_u32(rd *r, uint32_t *v, const char *what)
{
    return have(r, 4, what) ? -1 : ck_take_u32(&r->c, v);
}

static int take_u64(rd *r, uint64_t *v, const char *what)
{
    return have(r, 8, what) ? -1 : ck_take_u64(&r->c, v);
}

/* A string: its u64 length, checked against ggml's limit and the file, then its bytes. */
static const unsigned char *take_string(rd *r, uint64_t *len, const char *what)
{
    uint64_t at = ck_cursor_at(&r->c);
    if (take_u64(r, len, what))
        return NULL;
    if (*len > GGUF_MAX_STRING) {
        ck_fail(r->err, r->path, "%s: length %llu exceeds the limit of %u (byte %llu)", what,
                (unsigned long long)*len, GGUF_MAX_STRING, (unsigned long long)at);
        return NULL;
    }
    return take(r, *len, what);
}

/* --- JSON text -------------------------------------------------------------------------- */

/* Text written into memory of a size known beforehand, or only counted: a key's JSON text is
 * written twice, first counted (s NULL), then into memory of exactly that size, so that the text
 * of a 16 Mi-item array is held once, where it stays, and never grown or copied. A
 * string's raw bytes (at most GGUF_MAX_STRING) go to a jbuf that grows instead. */
typedef struct jbuf {
    char *s;     /* NULL: count only */
    size_t len;  /* bytes written (or counted) */
    size_t cap;  /* bytes s holds */
    int grows;   /* s is malloc'ed, grown as needed; else fixed, and what passes cap is dropped */
    int oom;
} jbuf;

static void jput(jbuf *j, const void *s, size_t n)
{
    if (j->grows && !j->oom && n > j->cap - j->len) {
        size_t cap = j->cap ? j->cap : 256;
        while (cap - j->len < n && cap <= SIZE_MAX / 2)
            cap *= 2;
        char *p = cap - j->len >= n ? realloc(j->s, cap) : NULL;
        if (p)
            j->s = p, j->cap = cap;
        else
            j->oom = 1;
    }
    if (j->s && n && n <= j->cap - j->len) /* s may be NULL when n is 0 */
        memcpy(j->s + j->len, s, n);
    j->len += n;
}

static void jputs(jbuf *j, const char *s)
{
    jput(j, s, strlen(s));
}

static void jput_text(void *j, const char *s, size_t n)
{
    jput(j, s, n);
}

/* s as a JSON string (ck_json_string: a byte that breaks UTF-8 becomes U+FFFD, the value's own
 * file keeping the raw bytes). */
static void jstring(jbuf *j, const unsigned char *s, size_t n)
{
    ck_json_string(jput_text, j, (const char *)s, n, 0);
}

static void jfloat(jbuf *j, double v, int digits)
{
    char buf[40];
    if (isnan(v))
        jputs(j, "\"NaN\"");
    else if (isinf(v))
        jputs(j, v > 0 ? "\"Infinity\"" : "\"-Infinity\"");
    else
        jput(j, buf, (size_t)snprintf(buf, sizeof buf, "%.*g", digits, v));
}

/* --- keys and values -------------------------------------------------------------------- */

/* What the reader keeps of one file's keys. */
typedef struct kvinfo {
    uint32_t alignment;
    uint64_t split_no, split_count, split_tensors;
    int has_split_no, has_split_count, has_split_tensors;
} kvinfo;

/* One item of type t as JSON into j (a string's raw bytes into raw too, when raw is given). */
static int put_item(rd *r, unsigned t, jbuf *j, jbuf *raw, const char *what)
{
    if (t == GV_STR) {
        uint64_t n;
        const unsigned char *s = take_string(r, &n, what);
        if (!s)
            return -1;
        jstring(j, s, (size_t)n);
        if (raw)
            jput(raw, s, (size_t)n);
        return 0;
    }
    uint64_t at = ck_cursor_at(&r->c);
    const unsigned char *p = take(r, gv_types[t].size, what);
    if (!p)
        return -1;
    char buf[24];
    int n = 0;
    switch (t) {
    case GV_U8: n = snprintf(buf, sizeof buf, "%u", p[0]); break;
    case GV_I8: n = snprintf(buf, sizeof buf, "%d", (int8_t)p[0]); break;
    case GV_U16: n = snprintf(buf, sizeof buf, "%u", get_le16(p)); break;
    case GV_I16: n = snprintf(buf, sizeof buf, "%d", (int16_t)get_le16(p)); break;
    case GV_U32: n = snprintf(buf, sizeof buf, "%lu", (unsigned long)get_le32(p)); break;
    case GV_I32: n = snprintf(buf, sizeof buf, "%ld", (long)(int32_t)get_le32(p)); break;
    case GV_U64: n = snprintf(buf, sizeof buf, "%llu", (unsigned long long)get_le64(p)); break;
    case GV_I64: n = snprintf(buf, sizeof buf, "%lld", (long long)(int64_t)get_le64(p)); break;
    case GV_BOOL:
        if (p[0] > 1)
            return ck_fail(r->err, r->path, "%s: boolean byte is %u, not 0 or 1 (byte %llu)",
                           what, p[0], (unsigned long long)at);
        n = snprintf(buf, sizeof buf, "%s", p[0] ? "true" : "false");
        break;
    case GV_F32: {
        uint32_t bits = get_le32(p);
        float f;
        memcpy(&f, &bits, 4);
        jfloat(j, f, 9); /* 9 digits bring a float back exactly */
        return 0;
    }
    default: { /* GV_F64 */
        uint64_t bits = get_le64(p);
        double d;
        memcpy(&d, &bits, 8);
        jfloat(j, d, 17);
        return 0;
    }
    }
    jput(j, buf, (size_t)n);
    return 0;
}

/* A value type (u32) that is one of the 13, and not an array when in_array. */
static int take_type(rd *r, unsigned *t, int in_array, const char *what)
{
    uint64_t at = ck_cursor_at(&r->c);
    uint32_t v;
    if (take_u32(r, &v, what))
        return -1;
    if (v >= GV_COUNT || (in_array && v == GV_ARRAY))
        return ck_fail(r->err, r->path, "%s: %s %u (byte %llu)", what,
                       v == GV_ARRAY ? "an array of arrays, which ggml refuses: item type"
                                     : "unknown value type", v, (unsigned long long)at);
    *t = v;
    return 0;
}

/* One key's value as its typed JSON into m, {"type":...,"value":...}, the value itself at
 * [*vstart, m->len - 1) (before the closing brace); a string's raw bytes into raw. */
static int read_value(rd *r, jbuf *m, jbuf *raw, unsigned *vt, size_t *vstart,
                      const char *what)
{
    if (take_type(r, vt, 0, what))
        return -1;
    jputs(m, "{\"type\":\"");
    jputs(m, gv_types[*vt].name);
    jputs(m, "\"");
    unsigned it = *vt;
    uint64_t n = 0, at;
    if (*vt == GV_ARRAY) {
        if (take_type(r, &it, 1, what))
            return -1;
        at = ck_cursor_at(&r->c);
        if (take_u64(r, &n, what))
            return -1;
        if (n > GGUF_MAX_ARRAY || n * gv_types[it].size > r->size - ck_cursor_at(&r->c))
            return ck_fail(r->err, r->path, "%s: array of %llu %s items %s (byte %llu)", what,
                           (unsigned long long)n, gv_types[it].name,
                           n > GGUF_MAX_ARRAY ? "exceeds the limit of 67108864"
                                              : "runs past the end of the file",
                           (unsigned long long)at);
        jputs(m, ",\"item_type\":\"");
        jputs(m, gv_types[it].name);
        jputs(m, "\"");
    }
    jputs(m, ",\"value\":");
    *vstart = m->len;
    if (*vt != GV_ARRAY) {
        if (put_item(r, *vt, m, raw, what))
            return -1;
    } else {
        jput(m, "[", 1);
        for (uint64_t k = 0; k < n; k++) {
            if (k)
                jput(m, ",", 1);
            if (put_item(r, it, m, NULL, what))
                return -1;
        }
        jput(m, "]", 1);
    }
    /* The value's own file is the value and a newline: these very bytes (add_key) */
    jputs(m, "\n}");
    return 0;
}

/* The numbers the reader itself needs: general.alignment and the split keys. */
static int note_key(rd *r, const char *key, unsigned vt, const char *value, kvinfo *kv,
                    uint64_t at)
{
    static const struct {
        const char *key;
        unsigned type;
    } known[] = {{"general.alignment", GV_U32}, {"split.no", GV_U16},
                 {"split.count", GV_U16}, {"split.tensors.count", GV_I32}};
    for (unsigned k = 0; k < sizeof known / sizeof *known; k++) {
        if (strcmp(key, known[k].key))
            continue;
        if (vt != known[k].type)
            return ck_fail(r->err, r->path, "key '%s' is a %s, not a %s (byte %llu)", key,
                           gv_types[vt].name, gv_types[known[k].type].name,
                           (unsigned long long)at);
        long long v = strtoll(value, NULL, 10);
        if (k == 0 && (v == 0 || (v & (v - 1)) || v > MAX_ALIGNMENT))
            return ck_fail(r->err, r->path, "general.alignment %lld is not a power of two up to "
                           "%d (byte %llu)", v, MAX_ALIGNMENT, (unsigned long long)at);
        if (k == 3 && v < 0)
            return ck_fail(r->err, r->path, "split.tensors.count is %lld (byte %llu)", v,
                           (unsigned long long)at);
        uint64_t *slot[] = {NULL, &kv->split_no, &kv->split_count, &kv->split_tensors};
        int *has[] = {NULL, &kv->has_split_no, &kv->has_split_count, &kv->has_split_tensors};
        if (k == 0)
            kv->alignment = (uint32_t)v;
        else
            *slot[k] = (uint64_t)v, *has[k] = 1;
    }
    return 0;
}

/* One key's value rendered by read_value twice: counted, then written into memory of exactly
 * that size, the index's when add (where it stays as the key's metadata), else malloc'ed; *text
 * is NUL-terminated, *len bytes. A string's raw bytes into raw. A file that changed between the
 * two reads is an error, not a text that overruns its memory. */
static int render_value(ck_index *ix, rd *r, int add, jbuf *raw, unsigned *vt, size_t *vstart,
                        char **text, size_t *len, const char *what)
{
    uint64_t from = ck_cursor_at(&r->c);
    jbuf count = {0};
    if (read_value(r, &count, NULL, vt, vstart, what))
        return -1;
    char *s = add ? ck_index_alloc(ix, count.len + 1) : malloc(count.len + 1);
    if (!s)
        return ck_fail(r->err, r->path, "out of memory for %s (%zu bytes of JSON)", what,
                       count.len);
    jbuf m = {.s = s, .cap = count.len};
    unsigned again;
    rewind_to(r, from);
    raw->len = 0;
    int rc = read_value(r, &m, raw, &again, vstart, what);
    if (rc == 0 && (m.len != count.len || again != *vt))
        rc = ck_fail(r->err, r->path, "%s changed while it was read (byte %llu)", what,
                     (unsigned long long)from);
    if (rc == 0 && raw->oom)
        rc = ck_fail(r->err, r->path, "out of memory");
    if (rc && !add)
        free(s);
    if (rc)
        return -1;
    s[m.len] = 0;
    *text = s;
    *len = m.len;
    return 0;
}

/* Adds key's metadata, its typed JSON (text, len bytes, held by the index: render_value), and
 * its value entry: the value and a newline, a string's raw bytes (raw) or else the value's
 * JSON, which is the metadata's own text from vstart up to its closing brace (held once: a
 * long array is hundreds of megabytes of text). */
static int add_key(ck_index *ix, const char *key, size_t klen, unsigned vt, const char *text,
                   size_t len, size_t vstart, jbuf *raw, ck_error *err)
{
    size_t pl = strlen(GGUF_META_DIR "."), nlen = pl + klen;
    char *name = malloc(nlen + 1);
    jput(raw, "\n", 1);
    if (!name || raw->oom) {
        free(name);
        return ck_fail(err, ck_index_source(ix), "out of memory");
    }
    memcpy(name, GGUF_META_DIR ".", pl);
    memcpy(name + pl, key, klen + 1);
    int rc = ck_index_add_meta(ix, key, "", err);
    if (rc == 0) /* the text is the index's already: no copy of it */
        ix->meta[ix->nmeta - 1].value = text, ix->meta[ix->nmeta - 1].json = 1;
    if (rc == 0 && !(vt == GV_STR ? ck_index_add_value(ix, name, nlen, gv_types[vt].value,
                                                       raw->s, raw->len, err)
                                  : ck_index_add_value_held(ix, name, nlen, gv_types[vt].value,
                                                            text + vstart, len - vstart - 1,
                                                            err)))
        rc = -1;
    free(name);
    return rc;
}

static int by_cstr(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Keys must be unique: sorted, a repeat is next to its twin. */
static int check_unique_keys(rd *r, char **keys, size_t n)
{
    if (n > 1)
        qsort(keys, n, sizeof *keys, by_cstr);
    for (size_t i = 1; i < n; i++)
        if (strcmp(keys[i - 1], keys[i]) == 0)
            return ck_fail(r->err, r->path, "duplicate key '%s'", keys[i]);
    return 0;
}

/* A name from the file (a key or a tensor name) as a C string: non-empty when it is a key,
 * UTF-8, no NUL. */
static char *take_name(rd *r, uint64_t *len, const char *what, uint64_t ordinal, int is_key)
{
    uint64_t at = ck_cursor_at(&r->c);
    char whom[48];
    snprintf(whom, sizeof whom, "%s %llu", what, (unsigned long long)ordinal);
    const unsigned char *s = take_string(r, len, whom);
    if (!s)
        return NULL;
    size_t bad = ck_utf8_invalid_at(s, (size_t)*len);
    const char *why = is_key && *len == 0 ? "is empty"
                      : memchr(s, 0, (size_t)*len) ? "holds a NUL byte"
                      : bad < *len                 ? "is not valid UTF-8"
                                                   : NULL;
    if (why) {
        ck_fail(r->err, r->path, "%s %s (byte %llu)", whom, why, (unsigned long long)at);
        return NULL;
    }
    char *copy = malloc((size_t)*len + 1);
    if (!copy) {
        ck_fail(r->err, r->path, "out of memory");
        return NULL;
    }
    memcpy(copy, s, (size_t)*len);
    copy[*len] = 0;
    return copy;
}

/* Every key of the file; added to ix when add (the first file of a set). */
static int read_keys(ck_index *ix, rd *r, uint64_t nkv, int add, kvinfo *kv)
{
    char **keys = calloc(nkv ? nkv : 1, sizeof *keys);
    if (!keys)
        return ck_fail(r->err, r->path, "out of memory for %llu keys", (unsigned long long)nkv);
    size_t n = 0;
    jbuf raw = {.grows = 1};
    int rc = 0;
    for (; n < nkv && rc == 0; n++) {
        uint64_t klen, at = ck_cursor_at(&r->c);
        if (!(keys[n] = take_name(r, &klen, "key", n, 1))) {
            rc = -1;
            break;
        }
        char what[96];
        snprintf(what, sizeof what, "key '%.64s'", keys[n]);
        unsigned vt;
        size_t vstart = 0, len = 0;
        char *text = NULL;
        rc = render_value(ix, r, add, &raw, &vt, &vstart, &text, &len, what);
        if (rc == 0)
            rc = note_key(r, keys[n], vt, text + vstart, kv, at);
        if (rc == 0 && add)
            rc = add_key(ix, keys[n], (size_t)klen, vt, text, len, vstart, &raw, r->err);
        if (!add)
            free(text);
    }
    if (rc == 0)
        rc = check_unique_keys(r, keys, n);
    for (size_t i = 0; i < n; i++)
        free(keys[i]);
    free(keys);
    free(raw.s);
    return rc;
}

/* --- tensor infos ----------------------------------------------------------------------- */

typedef struct gt {
    char *name;
    uint64_t name_len, offset, nbytes, at; /* at: where its info starts, for messages */
    int64_t shape[MAX_DIMS];               /* row-major: ne reversed */
    unsigned rank;
    uint8_t dtype;
} gt;

static int read_dims(rd *r, gt *t, int64_t ne[MAX_DIMS])
{
    uint64_t at = ck_cursor_at(&r->c);
    uint32_t n;
    if (take_u32(r, &n, "n_dims"))
        return -1;
    if (n > MAX_DIMS)
        return ck_fail(r->err, r->path, "tensor '%s': %u dimensions, more than ggml's %d "
                       "(byte %llu)", t->name, n, MAX_DIMS, (unsigned long long)at);
    int64_t count = 1;
    for (unsigned d = 0; d < n; d++) {
        uint64_t v;
        at = ck_cursor_at(&r->c);
        if (take_u64(r, &v, "a dimension"))
            return -1;
        ne[d] = (int64_t)v;
        if (ne[d] < 0 || __builtin_mul_overflow(count, ne[d], &count))
            return ck_fail(r->err, r->path, "tensor '%s': ne[%u] = %lld %s (byte %llu)", t->name,
                           d, (long long)ne[d], ne[d] < 0 ? "is negative"
                           : "makes the element count overflow int64", (unsigned long long)at);
        t->shape[n - 1 - d] = ne[d];
    }
    t->rank = n;
    return 0;
}

static int read_tensor(rd *r, gt *t, uint64_t i)
{
    t->at = ck_cursor_at(&r->c);
    if (!(t->name = take_name(r, &t->name_len, "tensor name", i, 0)))
        return -1;
    size_t pl = strlen(GGUF_META_DIR ".");
    if (t->name_len >= GGUF_MAX_NAME)
        return ck_fail(r->err, r->path, "tensor %llu: name is %llu bytes, ggml's limit is %d "
                       "(byte %llu)", (unsigned long long)i, (unsigned long long)t->name_len,
                       GGUF_MAX_NAME - 1, (unsigned long long)t->at);
    if (t->name_len >= pl && memcmp(t->name, GGUF_META_DIR ".", pl) == 0)
        return ck_fail(r->err, r->path, "tensor '%s': names under '" GGUF_META_DIR "' are the "
                       "metadata's (byte %llu)", t->name, (unsigned long long)t->at);
    int64_t ne[MAX_DIMS] = {1, 1, 1, 1};
    if (read_dims(r, t, ne))
        return -1;
    uint64_t at = ck_cursor_at(&r->c);
    uint32_t type;
    if (take_u32(r, &type, "a tensor type"))
        return -1;
    if (type >= sizeof ggml_types || !ggml_types[type])
        return ck_fail(r->err, r->path, "tensor '%s': unknown ggml type %u (byte %llu)", t->name,
                       type, (unsigned long long)at);
    t->dtype = (uint8_t)(ggml_types[type] - 1);
    unsigned block = ck_dtype_block_elems(t->dtype);
    if (ne[0] % block)
        return ck_fail(r->err, r->path, "tensor '%s': %s rows of %lld elements are not whole "
                       "blocks of %u (byte %llu)", t->name, ck_dtype_name(t->dtype),
                       (long long)ne[0], block, (unsigned long long)at);
    if (ck_tensor_nbytes(t->rank, t->shape, t->dtype, &t->nbytes))
        return ck_fail(r->err, r->path, "tensor '%s': its size in bytes overflows (byte %llu)",
                       t->name, (unsigned long long)at);
    return take_u64(r, &t->offset, "a tensor offset");
}

/* ggml's rule: tensor i starts where tensor i-1 ends, rounded up to the alignment; the data
 * region starts at the aligned end of the infos; every byte inside the file. */
static int check_offsets(rd *r, const gt *t, uint64_t n, uint64_t data, uint32_t align)
{
    if (n && data > r->size)
        return ck_fail(r->err, r->path, "data would start at byte %llu, past the end of the "
                       "file (%llu bytes)", (unsigned long long)data,
                       (unsigned long long)r->size);
    uint64_t expect = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (t[i].offset != expect)
            return ck_fail(r->err, r->path, "tensor '%s': data offset %llu, expected %llu (the "
                           "aligned end of the tensor before) (byte %llu)", t[i].name,
                           (unsigned long long)t[i].offset, (unsigned long long)expect,
                           (unsigned long long)t[i].at);
        if (t[i].nbytes > r->size - data || expect > r->size - data - t[i].nbytes)
            return ck_fail(r->err, r->path, "tensor '%s': bytes [%llu, +%llu) of the data "
                           "region run past the end of the file (%llu bytes)", t[i].name,
                           (unsigned long long)expect, (unsigned long long)t[i].nbytes,
                           (unsigned long long)r->size);
        expect = ck_align_up(expect + t[i].nbytes, align); /* both < 2^64 - 2^20 */
    }
    return 0;
}

static int add_tensors(ck_index *ix, uint32_t file, const gt *t, uint64_t n, uint64_t data,
                       ck_error *err)
{
    for (uint64_t i = 0; i < n; i++) {
        ck_entry *e = ck_index_add_entry(ix, t[i].name, (size_t)t[i].name_len, CK_CONTIGUOUS,
                                         t[i].rank, t[i].shape, err);
        if (!e)
            return -1;
        e->dtype = t[i].dtype;
        e->nbytes = t[i].nbytes;
        e->ext = (ck_extent){.offset = data + t[i].offset, .length = t[i].nbytes, .file = file};
    }
    return 0;
}

static int read_tensors(ck_index *ix, rd *r, uint32_t file, uint64_t ntensors, uint32_t align)
{
    /* Each info takes at least 8 + 4 + 4 + 8 bytes: a count past that is a lie. */
    uint64_t left = r->size - ck_cursor_at(&r->c);
    if (ntensors > left / 24)
        return ck_fail(r->err, r->path, "%llu tensors cannot fit in the %llu bytes left",
                       (unsigned long long)ntensors, (unsigned long long)left);
    gt *t = calloc(ntensors ? ntensors : 1, sizeof *t);
    if (!t)
        return ck_fail(r->err, r->path, "out of memory");
    int rc = 0;
    uint64_t n = 0;
    for (; n < ntensors && rc == 0; n++)
        rc = read_tensor(r, &t[n], n);
    uint64_t data = ck_align_up(ck_cursor_at(&r->c), align);
    if (rc == 0)
        rc = check_offsets(r, t, n, data, align);
    if (rc == 0)
        rc = add_tensors(ix, file, t, n, data, r->err);
    for (uint64_t i = 0; i < n; i++)
        free(t[i].name);
    free(t);
    return rc;
}

/* --- one file --------------------------------------------------------------------------- */

static int read_header(rd *r, uint64_t *ntensors, uint64_t *nkv)
{
    const unsigned char *p = take(r, 24, "the GGUF header");
    if (!p)
        return -1;
    if (memcmp(p, "GGUF", 4))
        return ck_fail(r->err, r->path, "not a GGUF file: magic is not \"GGUF\" (byte 0)");
    uint32_t version = get_le32(p + 4);
    *ntensors = get_le64(p + 8);
    *nkv = get_le64(p + 16);
    if (version && (version & 0xffff) == 0)
        return ck_fail(r->err, r->path, "byte-swapped (big-endian) GGUF file: version reads "
                       "0x%08x; only little-endian files are supported (byte 4)", version);
    if (version != 2 && version != 3)
        return ck_fail(r->err, r->path, "GGUF version %u; versions 2 and 3 are supported "
                       "(byte 4)", version);
    /* A key takes at least 8 + 1 + 4 + 1 bytes, a tensor info 24. */
    if (*ntensors > r->size / 24 || *nkv > r->size / 14)
        return ck_fail(r->err, r->path, "header counts %llu tensors and %llu keys, more than "
                       "the %llu-byte file can hold (byte 8)", (unsigned long long)*ntensors,
                       (unsigned long long)*nkv, (unsigned long long)r->size);
    return 0;
}

/* Parses file `file` of ix: its keys (added when add) and its tensors. */
static int read_one(ck_index *ix, uint32_t file, int add, kvinfo *kv, ck_error *err)
{
    const ck_file *f = &ix->files[file];
    rd r = {.path = f->path, .f = f, .size = f->size, .c = ck_cursor_make(NULL, 0, 0),
            .err = err};
    *kv = (kvinfo){.alignment = DEFAULT_ALIGNMENT};
    uint64_t ntensors = 0, nkv = 0;
    int rc = read_header(&r, &ntensors, &nkv);
    if (rc == 0)
        rc = read_keys(ix, &r, nkv, add, kv);
    if (rc == 0)
        rc = read_tensors(ix, &r, file, ntensors, kv->alignment);
    free(r.win);
    return rc;
}

int gguf_probe(const unsigned char *head, size_t n)
{
    return n >= 4 && memcmp(head, "GGUF", 4) == 0;
}

/* --- split sets ------------------------------------------------------------------------- */

/* Where "-00001-of-NNNNN.gguf" begins in path (the first split's name, count NNNNN), or -1. */
static long split_stem(const char *path, uint64_t count)
{
    char tail[32];
    int n = snprintf(tail, sizeof tail, "-%05u-of-%05u.gguf", 1u, (unsigned)count);
    size_t len = strlen(path);
    return len > (size_t)n && strcmp(path + len - (size_t)n, tail) == 0 ? (long)(len - (size_t)n)
                                                                         : -1;
}

static int open_split(ck_index *ix, const char *path, uint64_t k, const kvinfo *first,
                      uint64_t *ntensors, ck_error *err)
{
    char what[64];
    snprintf(what, sizeof what, "split %llu of %llu", (unsigned long long)k + 1,
             (unsigned long long)first->split_count);
    int id = ck_index_add_source(ix, path, what, err);
    if (id < 0)
        return -1;
    size_t before = ix->nentries;
    kvinfo kv;
    if (read_one(ix, (uint32_t)id, 0, &kv, err))
        return -1;
    if (!kv.has_split_no || kv.split_no != k || !kv.has_split_count ||
        kv.split_count != first->split_count)
        return ck_fail(err, path, "is not split %llu of %llu: its split.no/split.count say "
                       "%lld of %lld", (unsigned long long)k + 1,
                       (unsigned long long)first->split_count,
                       kv.has_split_no ? (long long)kv.split_no + 1 : -1LL,
                       kv.has_split_count ? (long long)kv.split_count : -1LL);
    *ntensors += ix->nentries - before;
    return 0;
}

static int by_entry_name(const void *a, const void *b)
{
    return strcmp((*(const ck_entry *const *)a)->name, (*(const ck_entry *const *)b)->name);
}

/* No tensor name twice in the whole set (within one file, or across splits). */
static int check_unique_tensors(const ck_index *ix, ck_error *err)
{
    size_t n = 0;
    const ck_entry **by = malloc((ix->nentries ? ix->nentries : 1) * sizeof *by);
    if (!by)
        return ck_fail(err, ck_index_source(ix), "out of memory");
    for (size_t i = 0; i < ix->nentries; i++)
        if (ix->entries[i].kind == CK_TENSOR)
            by[n++] = &ix->entries[i];
    if (n > 1)
        qsort(by, n, sizeof *by, by_entry_name);
    int rc = 0;
    for (size_t i = 1; i < n && rc == 0; i++)
        if (strcmp(by[i - 1]->name, by[i]->name) == 0)
            rc = ck_fail(err, ix->files[by[i]->ext.file].path, "duplicate tensor name '%s'%s%s",
                         by[i]->name, by[i - 1]->ext.file == by[i]->ext.file ? "" : ", also in ",
                         by[i - 1]->ext.file == by[i]->ext.file
                             ? "" : ix->files[by[i - 1]->ext.file].path);
    free(by);
    return rc;
}

/* The splits after the first, by the names the first one's implies. */
static int read_splits(ck_index *ix, const kvinfo *first, uint64_t ntensors, ck_error *err)
{
    const char *path = ix->files[0].path;
    if (!first->has_split_no || first->split_no != 0)
        return ck_fail(err, path, "is split %lld of %llu: open the first split or the "
                       "directory", first->has_split_no ? (long long)first->split_no + 1 : -1LL,
                       (unsigned long long)first->split_count);
    long stem = split_stem(path, first->split_count);
    if (stem < 0)
        return ck_fail(err, path, "first of %llu splits, but its name does not end in "
                       "-00001-of-%05llu.gguf", (unsigned long long)first->split_count,
                       (unsigned long long)first->split_count);
    size_t len = (size_t)stem + 32;
    char *sib = malloc(len);
    if (!sib)
        return ck_fail(err, path, "out of memory");
    int rc = 0;
    for (uint64_t k = 1; k < first->split_count && rc == 0; k++) {
        snprintf(sib, len, "%.*s-%05u-of-%05u.gguf", (int)stem, path, (unsigned)k + 1,
                 (unsigned)first->split_count);
        rc = open_split(ix, sib, k, first, &ntensors, err);
    }
    free(sib);
    if (rc == 0 && first->has_split_tensors && ntensors != first->split_tensors)
        rc = ck_fail(err, path, "split.tensors.count is %llu, but the %llu splits hold %llu "
                     "tensors", (unsigned long long)first->split_tensors,
                     (unsigned long long)first->split_count, (unsigned long long)ntensors);
    return rc;
}

int gguf_read_file(ck_index *ix, uint32_t file, ck_error *err)
{
    kvinfo kv;
    size_t before = ix->nentries;
    if (read_one(ix, file, 1, &kv, err))
        return -1;
    uint64_t ntensors = 0;
    for (size_t i = before; i < ix->nentries; i++)
        ntensors += ix->entries[i].kind == CK_TENSOR;
    if (kv.has_split_count && kv.split_count > 1) {
        ix->format = "gguf-split";
        if (read_splits(ix, &kv, ntensors, err))
            return -1;
    }
    return check_unique_tensors(ix, err);
}
