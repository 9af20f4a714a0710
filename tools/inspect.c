/* inspect.c — ckpt diff, info and stats: what is in a checkpoint and what changed, read through
 * the same index as the mount (ck_open), tensor bytes through ck_entry_read in bounded chunks.
 * Element values are decoded here (decode_batch is their one owner in the tool): every whole-
 * byte integer dtype, F64/F32/F16/BF16 and the F8 types E4M3 and E5M2. Complex, the sub-byte
 * floats (F4, F6), F8_E8M0, the FNUZ float8s and ggml's block-quantized types are not decoded:
 * stats lists them as skipped and diff compares their bytes only.
 * Nothing is printed until a command has read everything it reports, so trouble midway (a
 * truncated source) leaves one line on stderr and no partial report on stdout.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <xxhash.h>

#include "../fs/view.h"
#include "../pack/bytes.h"
#include "../pack/json.h"
#include "../pack/synth.h"
#include "commands.h"

#define CHUNK (4u << 20) /* bytes read at a time: a multiple of every whole-byte element */
#define BATCH 4096u      /* elements decoded to doubles at a time */

/* --- reading and decoding ----------------------------------------------------------------- */

/* Reads len bytes of e at off, all of them: a short read is trouble, said in err (stats'
 * threads each keep their own, so that one line is printed whoever failed). */
static int read_chunk(const ck_index *ix, const ck_entry *e, void *buf, size_t len, uint64_t off,
                      ck_error *err)
{
    ssize_t n = ck_entry_read(ix, e, buf, len, off);
    if (n == (ssize_t)len)
        return 0;
    return ck_fail(err, ix->files[e->ext.file].path, "%s (reading tensor %.*s)",
                   n < 0 ? strerror((int)-n) : "ends early", (int)e->name_len, e->name);
}

/* The element size (ck_dtype_nbytes of one element) of a dtype decode_one reads, else 0. */
static unsigned decoded_size(enum ck_dtype dt)
{
    uint64_t bytes;
    switch (dt) {
    case CK_BOOL: case CK_U8: case CK_I8: case CK_F8_E4M3: case CK_F8_E5M2:
    case CK_I16: case CK_U16: case CK_F16: case CK_BF16:
    case CK_I32: case CK_U32: case CK_F32: case CK_I64: case CK_U64: case CK_F64:
        return ck_dtype_nbytes(dt, 1, &bytes) == 0 ? (unsigned)bytes : 0;
    default:
        return 0;
    }
}

static int is_float(enum ck_dtype dt)
{
    return dt == CK_F64 || dt == CK_F32 || dt == CK_F16 || dt == CK_BF16 || dt == CK_F8_E4M3 ||
           dt == CK_F8_E5M2;
}

/* An IEEE-style small float: sign, ebits exponent bits, mbits mantissa bits. With ieee, the
 * top exponent is Inf/NaN (F16, E5M2); without it only all-ones is NaN and there is no Inf
 * (E4M3, the "fn" variant torch and safetensors use). */
static double minifloat(unsigned v, unsigned ebits, unsigned mbits, int ieee)
{
    unsigned emax = (1u << ebits) - 1, mmask = (1u << mbits) - 1;
    unsigned e = (v >> mbits) & emax, m = v & mmask;
    int bias = (int)(emax >> 1);
    double x;
    if (e == emax && (ieee || m == mmask))
        x = ieee && m == 0 ? INFINITY : NAN;
    else if (e == 0)
        x = ldexp(m, 1 - bias - (int)mbits);
    else
        x = ldexp(m | (1u << mbits), (int)e - bias - (int)mbits);
    return v >> (ebits + mbits) ? -x : x;
}

static double decode_one(enum ck_dtype dt, const unsigned char *p)
{
    union { uint32_t u; float f; } f32;
    union { uint64_t u; double d; } f64;
    switch (dt) {
    case CK_BOOL: return p[0] != 0;
    case CK_U8: return p[0];
    case CK_I8: return (int8_t)p[0];
    case CK_F8_E4M3: return minifloat(p[0], 4, 3, 0);
    case CK_F8_E5M2: return minifloat(p[0], 5, 2, 1);
    case CK_I16: return (int16_t)get_le16(p);
    case CK_U16: return get_le16(p);
    case CK_F16: return minifloat(get_le16(p), 5, 10, 1);
    case CK_BF16: f32.u = (uint32_t)get_le16(p) << 16; return f32.f;
    case CK_I32: return (int32_t)get_le32(p);
    case CK_U32: return get_le32(p);
    case CK_F32: f32.u = get_le32(p); return f32.f;
    case CK_I64: return (double)(int64_t)get_le64(p);
    case CK_U64: return (double)get_le64(p);
    case CK_F64: f64.u = get_le64(p); return f64.d;
    default: return NAN; /* not reached: callers ask decoded_size first */
    }
}

static void decode_batch(enum ck_dtype dt, const unsigned char *p, size_t n, double *out)
{
    unsigned w = decoded_size(dt);
    for (size_t i = 0; i < n; i++)
        out[i] = decode_one(dt, p + i * w);
}

static uint64_t element_count(const ck_entry *e)
{
    uint64_t n = 1;
    for (unsigned i = 0; i < e->rank; i++)
        n *= (uint64_t)e->shape[i]; /* ck_open checked the product fits (ck_tensor_nbytes) */
    return n;
}

static cJSON *shape_json(const ck_entry *e)
{
    char buf[1400];
    ck_view_shape_json(e, buf, sizeof buf);
    return cJSON_Parse(buf);
}

/* A double as JSON, exactly: %.17g round-trips, where cJSON's own printing may keep only 15
 * digits. JSON has no NaN or Inf: such a figure is the string "nan", "inf" or "-inf". */
static cJSON *number_json(double v)
{
    char buf[32];
    if (!isfinite(v))
        return cJSON_CreateString(isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
    snprintf(buf, sizeof buf, "%.17g", v);
    return cJSON_CreateRaw(buf);
}

static int print_json_doc(cJSON *doc)
{
    char *s = doc ? cJSON_PrintUnformatted(doc) : NULL;
    cJSON_Delete(doc);
    if (!s) {
        fprintf(stderr, "ckpt: out of memory\n");
        return -1;
    }
    puts(s);
    free(s);
    return 0;
}

/* Whether name is selected by any of the n patterns (none: every name). */
static int selected(const ck_entry *e, char **pats, int n)
{
    if (n == 0)
        return 1;
    for (int i = 0; i < n; i++)
        if (ck_name_selected(e->name, e->name_len, pats[i]))
            return 1;
    return 0;
}

/* --- diff --------------------------------------------------------------------------------- */

typedef struct pair {
    const ck_entry *a, *b;
    int same_layout;      /* same dtype and shape: their bytes can be identical */
    int identical;
    int valued;           /* max_abs and rel_l2 were computed */
    XXH64_hash_t ha, hb;  /* XXH3-64 of each side's bytes, when same_layout */
    double max_abs, rel_l2;
} pair;

typedef struct diff_run {
    const ck_index *ia, *ib;
    unsigned char *ba, *bb;
    double *da, *db;
    ck_error err;
} diff_run;

/* Feeds st B's bytes [0, end): what B's hash missed while B matched A chunk for chunk. Leaves
 * r->bb holding B's chunk at end again. */
static int hash_b_prefix(diff_run *r, const ck_entry *b, XXH3_state_t *st, uint64_t end, size_t n)
{
    for (uint64_t off = 0; off < end; off += CHUNK) {
        if (read_chunk(r->ib, b, r->bb, CHUNK, off, &r->err))
            return -1;
        XXH3_64bits_update(st, r->bb, CHUNK);
    }
    return read_chunk(r->ib, b, r->bb, n, end, &r->err);
}

/* Both sides' bytes in lockstep: memcmp says identical, XXH3 records what each side was. While
 * the sides agree only A is hashed (B's hash is A's); B is hashed from its first difference on,
 * after its agreeing prefix is. This keeps diff of two near-identical files one hash pass. */
static int compare_bytes(diff_run *r, pair *p)
{
    XXH3_state_t *sa = XXH3_createState(), *sb = XXH3_createState();
    int rc = sa && sb ? 0 : -1;
    if (rc)
        ck_fail(&r->err, ck_index_source(r->ia), "out of memory");
    if (!rc) {
        XXH3_64bits_reset(sa);
        XXH3_64bits_reset(sb);
    }
    p->identical = 1;
    for (uint64_t off = 0; rc == 0 && off < p->a->nbytes; off += CHUNK) {
        size_t n = p->a->nbytes - off < CHUNK ? (size_t)(p->a->nbytes - off) : CHUNK;
        rc = read_chunk(r->ia, p->a, r->ba, n, off, &r->err) ||
             read_chunk(r->ib, p->b, r->bb, n, off, &r->err);
        if (rc == 0 && p->identical && memcmp(r->ba, r->bb, n) != 0) {
            p->identical = 0;
            rc = hash_b_prefix(r, p->b, sb, off, n);
        }
        if (rc)
            break;
        XXH3_64bits_update(sa, r->ba, n);
        if (!p->identical)
            XXH3_64bits_update(sb, r->bb, n);
    }
    if (rc == 0) {
        p->ha = XXH3_64bits_digest(sa);
        p->hb = p->identical ? p->ha : XXH3_64bits_digest(sb);
    }
    XXH3_freeState(sa);
    XXH3_freeState(sb);
    return rc ? -1 : 0;
}

/* max |a-b| and ||a-b|| / ||a|| over elements decoded to double (dtypes may differ: a .bin in
 * F32 against its BF16 conversion). A NaN on either side makes max_abs NaN. */
static int compare_values(diff_run *r, pair *p)
{
    unsigned wa = decoded_size(p->a->dtype), wb = decoded_size(p->b->dtype);
    uint64_t n = element_count(p->a), step = CHUNK / (wa > wb ? wa : wb);
    double max_abs = 0, dd = 0, aa = 0;
    for (uint64_t i = 0; i < n; i += step) {
        size_t k = n - i < step ? (size_t)(n - i) : (size_t)step;
        if (read_chunk(r->ia, p->a, r->ba, k * wa, i * wa, &r->err) ||
            read_chunk(r->ib, p->b, r->bb, k * wb, i * wb, &r->err))
            return -1;
        for (size_t j = 0; j < k; j += BATCH) {
            size_t m = k - j < BATCH ? k - j : BATCH;
            decode_batch(p->a->dtype, r->ba + j * wa, m, r->da);
            decode_batch(p->b->dtype, r->bb + j * wb, m, r->db);
            for (size_t t = 0; t < m; t++) {
                double d = fabs(r->da[t] - r->db[t]);
                if (!(d <= max_abs))
                    max_abs = d; /* NaN sticks: !(NaN <= x) */
                dd += d * d;
                aa += r->da[t] * r->da[t];
            }
        }
    }
    p->valued = 1;
    p->max_abs = max_abs;
    p->rel_l2 = dd == 0 ? 0 : sqrt(dd) / sqrt(aa); /* ||a|| = 0 with a change: Inf */
    return 0;
}

static int compare_pair(diff_run *r, pair *p)
{
    p->same_layout = p->a->dtype == p->b->dtype && ck_same_shape(p->a, p->b);
    if (p->same_layout && compare_bytes(r, p) != 0)
        return -1;
    if (p->identical || !ck_same_shape(p->a, p->b) || !is_float(p->a->dtype) ||
        !is_float(p->b->dtype))
        return 0;
    return compare_values(r, p);
}

static int cmp_entry_names(const void *x, const void *y)
{
    const ck_entry *a = *(const ck_entry *const *)x, *b = *(const ck_entry *const *)y;
    size_t n = a->name_len < b->name_len ? a->name_len : b->name_len;
    int c = memcmp(a->name, b->name, n);
    return c ? c : (a->name_len > b->name_len) - (a->name_len < b->name_len);
}

/* The selected tensors of ix, sorted by name (for bsearch); NULL on out-of-memory. */
static const ck_entry **sorted_tensors(const ck_index *ix, const char *only, size_t *n)
{
    const ck_entry **v = malloc((ix->nentries + 1) * sizeof *v);
    if (!v)
        return NULL;
    *n = 0;
    for (size_t i = 0; i < ix->nentries; i++) {
        const ck_entry *e = &ix->entries[i];
        if (e->kind == CK_TENSOR && ck_name_selected(e->name, e->name_len, only))
            v[(*n)++] = e;
    }
    qsort(v, *n, sizeof *v, cmp_entry_names);
    return v;
}

typedef struct diff_result {
    const ck_entry **ta, **tb;
    size_t na, nb, npairs;
    unsigned char *in_a; /* per tb: also in A */
    pair *pairs;
} diff_result;

static int diff_indexes(diff_run *r, const char *only, diff_result *d)
{
    d->ta = sorted_tensors(r->ia, only, &d->na);
    d->tb = sorted_tensors(r->ib, only, &d->nb);
    d->in_a = calloc(d->nb + 1, 1);
    d->pairs = calloc(d->na + 1, sizeof *d->pairs);
    if (!d->ta || !d->tb || !d->in_a || !d->pairs)
        return ck_fail(&r->err, ck_index_source(r->ia), "out of memory");
    for (size_t i = 0; i < d->na; i++) {
        const ck_entry **hit = bsearch(&d->ta[i], d->tb, d->nb, sizeof *d->tb, cmp_entry_names);
        if (!hit)
            continue;
        d->in_a[hit - d->tb] = 1;
        pair *p = &d->pairs[d->npairs++];
        p->a = d->ta[i];
        p->b = *hit;
        if (compare_pair(r, p) != 0)
            return -1;
    }
    return 0;
}

static void free_result(diff_result *d)
{
    free(d->ta);
    free(d->tb);
    free(d->in_a);
    free(d->pairs);
}

static size_t count_only_b(const diff_result *d)
{
    size_t n = 0;
    for (size_t i = 0; i < d->nb; i++)
        n += !d->in_a[i];
    return n;
}

static size_t count_identical(const diff_result *d)
{
    size_t n = 0;
    for (size_t i = 0; i < d->npairs; i++)
        n += d->pairs[i].identical;
    return n;
}

static cJSON *name_json(const ck_entry *e)
{
    return cJSON_CreateString(e->name); /* names are UTF-8 without NUL (index.h) */
}

static cJSON *pair_json(const pair *p)
{
    cJSON *o = cJSON_CreateObject();
    char h[17];
    cJSON_AddItemToObject(o, "name", name_json(p->a));
    cJSON_AddStringToObject(o, "dtype_a", ck_dtype_name(p->a->dtype));
    cJSON_AddStringToObject(o, "dtype_b", ck_dtype_name(p->b->dtype));
    cJSON_AddItemToObject(o, "shape_a", shape_json(p->a));
    cJSON_AddItemToObject(o, "shape_b", shape_json(p->b));
    cJSON_AddBoolToObject(o, "identical", p->identical);
    if (p->same_layout) {
        snprintf(h, sizeof h, "%016llx", (unsigned long long)p->ha);
        cJSON_AddStringToObject(o, "xxh3_a", h);
        snprintf(h, sizeof h, "%016llx", (unsigned long long)p->hb);
        cJSON_AddStringToObject(o, "xxh3_b", h);
    } else {
        cJSON_AddNullToObject(o, "xxh3_a");
        cJSON_AddNullToObject(o, "xxh3_b");
    }
    if (p->valued) {
        cJSON_AddItemToObject(o, "max_abs_diff", number_json(p->max_abs));
        cJSON_AddItemToObject(o, "rel_l2", number_json(p->rel_l2));
    } else if (p->identical) {
        cJSON_AddNumberToObject(o, "max_abs_diff", 0);
        cJSON_AddNumberToObject(o, "rel_l2", 0);
    } else {
        cJSON_AddNullToObject(o, "max_abs_diff");
        cJSON_AddNullToObject(o, "rel_l2");
    }
    return o;
}

static int print_diff_json(const diff_result *d, const char *a, const char *b, int same)
{
    cJSON *doc = cJSON_CreateObject(), *oa = cJSON_CreateArray(), *ob = cJSON_CreateArray(),
          *ts = cJSON_CreateArray(), *sum = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "a", a);
    cJSON_AddStringToObject(doc, "b", b);
    cJSON_AddBoolToObject(doc, "same", same);
    for (size_t i = 0, j = 0; i < d->na; i++) {
        if (j < d->npairs && d->pairs[j].a == d->ta[i])
            cJSON_AddItemToArray(ts, pair_json(&d->pairs[j++]));
        else
            cJSON_AddItemToArray(oa, name_json(d->ta[i]));
    }
    for (size_t i = 0; i < d->nb; i++)
        if (!d->in_a[i])
            cJSON_AddItemToArray(ob, name_json(d->tb[i]));
    cJSON_AddItemToObject(sum, "both", ck_json_uint(d->npairs));
    cJSON_AddItemToObject(sum, "identical", ck_json_uint(count_identical(d)));
    cJSON_AddItemToObject(sum, "different", ck_json_uint(d->npairs - count_identical(d)));
    cJSON_AddItemToObject(sum, "only_in_a", ck_json_uint(d->na - d->npairs));
    cJSON_AddItemToObject(sum, "only_in_b", ck_json_uint(count_only_b(d)));
    cJSON_AddItemToObject(doc, "summary", sum);
    cJSON_AddItemToObject(doc, "only_in_a", oa);
    cJSON_AddItemToObject(doc, "only_in_b", ob);
    cJSON_AddItemToObject(doc, "tensors", ts);
    return print_json_doc(doc);
}

static void print_pair_line(const pair *p)
{
    char sa[1400], sb[1400];
    if (p->identical)
        return;
    if (!p->same_layout) {
        ck_view_shape_json(p->a, sa, sizeof sa);
        ck_view_shape_json(p->b, sb, sizeof sb);
        printf("changed: ");
        print_name(p->a->name, p->a->name_len);
        printf(": %s %s -> %s %s", ck_dtype_name(p->a->dtype), sa, ck_dtype_name(p->b->dtype), sb);
    } else {
        printf("differs: ");
        print_name(p->a->name, p->a->name_len);
        printf(" (%s)", ck_dtype_name(p->a->dtype));
    }
    if (p->valued)
        printf(": max abs diff %.6g, relative L2 %.6g", p->max_abs, p->rel_l2);
    putchar('\n');
}

static void print_diff_text(const diff_result *d)
{
    for (size_t i = 0, j = 0; i < d->na; i++) {
        if (j < d->npairs && d->pairs[j].a == d->ta[i]) {
            print_pair_line(&d->pairs[j++]);
            continue;
        }
        printf("only in A: ");
        print_name(d->ta[i]->name, d->ta[i]->name_len);
        putchar('\n');
    }
    for (size_t i = 0; i < d->nb; i++) {
        if (d->in_a[i])
            continue;
        printf("only in B: ");
        print_name(d->tb[i]->name, d->tb[i]->name_len);
        putchar('\n');
    }
    printf("%zu tensors in both: %zu identical, %zu differ; %zu only in A, %zu only in B\n",
           d->npairs, count_identical(d), d->npairs - count_identical(d), d->na - d->npairs,
           count_only_b(d));
}

int cmd_diff(int argc, char **argv)
{
    const char *src[2] = {NULL, NULL}, *only = NULL;
    int json = 0, nsrc = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (argv[i][0] != '-' && nsrc < 2)
            src[nsrc++] = argv[i];
        else
            return fprintf(stderr, "ckpt: diff: bad arguments (see ckpt diff --help)\n"), 2;
    }
    if (nsrc != 2)
        return fprintf(stderr, "ckpt: diff: needs two sources (see ckpt diff --help)\n"), 2;
    ck_index *ia = NULL, *ib = NULL;
    diff_run r = {0};
    diff_result d = {0};
    int rc = 2;
    if (open_source(src[0], &ia) || open_source(src[1], &ib))
        goto out;
    r = (diff_run){ia, ib, malloc(CHUNK), malloc(CHUNK), malloc(BATCH * sizeof(double)),
                   malloc(BATCH * sizeof(double)), {{0}}};
    if (!r.ba || !r.bb || !r.da || !r.db) {
        fprintf(stderr, "ckpt: out of memory\n");
        goto out;
    }
    if (diff_indexes(&r, only, &d) != 0) {
        fprintf(stderr, "ckpt: %s\n", r.err.msg);
        goto out;
    }
    int same = count_identical(&d) == d.na && d.na == d.nb;
    if (!json)
        print_diff_text(&d);
    else if (print_diff_json(&d, src[0], src[1], same) != 0)
        goto out;
    rc = same ? 0 : 1;
out:
    free_result(&d);
    free(r.ba);
    free(r.bb);
    free(r.da);
    free(r.db);
    ck_index_free(ia);
    ck_index_free(ib);
    return rc;
}

/* --- info --------------------------------------------------------------------------------- */

/* One name prefix of the tree: the first `depth` '.'-separated parts of a tensor's name. */
typedef struct prefix {
    const char *s;
    size_t len;
    unsigned depth;
    uint64_t tensors, params, bytes;
} prefix;

/* Name order with '.' first, so that a prefix's children follow it, before "a-b" after "a". */
static int cmp_prefix(const void *x, const void *y)
{
    const prefix *a = x, *b = y;
    size_t n = a->len < b->len ? a->len : b->len;
    for (size_t i = 0; i < n; i++) {
        unsigned ca = a->s[i] == '.' ? 0 : (unsigned char)a->s[i];
        unsigned cb = b->s[i] == '.' ? 0 : (unsigned char)b->s[i];
        if (ca != cb)
            return ca < cb ? -1 : 1;
    }
    return (a->len > b->len) - (a->len < b->len);
}

/* The tree to depth maxd: every tensor adds itself to each of its prefixes, then equal
 * prefixes are merged. Returns the number of prefixes, or -1 on out-of-memory. */
static ssize_t build_tree(const ck_index *ix, unsigned maxd, prefix **out)
{
    size_t cap = 0, n = 0;
    for (size_t i = 0; i < ix->nentries; i++)
        cap += ix->entries[i].kind == CK_TENSOR ? maxd : 0;
    prefix *v = malloc((cap + 1) * sizeof *v);
    if (!v)
        return -1;
    for (size_t i = 0; i < ix->nentries; i++) {
        const ck_entry *e = &ix->entries[i];
        if (e->kind != CK_TENSOR)
            continue;
        size_t end = 0;
        for (unsigned d = 1; d <= maxd && end < e->name_len; d++) {
            const char *dot = memchr(e->name + end + (d > 1), '.', e->name_len - end - (d > 1));
            end = dot ? (size_t)(dot - e->name) : e->name_len;
            v[n++] = (prefix){e->name, end, d, 1, element_count(e), e->nbytes};
        }
    }
    qsort(v, n, sizeof *v, cmp_prefix);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m > 0 && cmp_prefix(&v[m - 1], &v[i]) == 0) {
            v[m - 1].tensors += v[i].tensors;
            v[m - 1].params += v[i].params;
            v[m - 1].bytes += v[i].bytes;
        } else {
            v[m++] = v[i];
        }
    }
    *out = v;
    return (ssize_t)m;
}

typedef struct dtype_sum {
    uint64_t tensors, params, bytes;
} dtype_sum;

typedef struct info {
    size_t tensors, values;
    uint64_t params, bytes;
    dtype_sum by[CK_DTYPE_COUNT];
    prefix *tree;
    size_t ntree;
} info;

static void human(uint64_t b, char *buf, size_t cap)
{
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)b;
    unsigned u = 0;
    while (v >= 1024 && u < 5) {
        v /= 1024;
        u++;
    }
    snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
}

static void print_info_text(const ck_index *ix, const info *in)
{
    char h[32];
    human(in->bytes, h, sizeof h);
    printf("source: %s\nformat: %s\nfiles: %u\ntensors: %zu\nvalues: %zu\nparameters: %llu\n"
           "bytes: %llu (%s)\n", ck_index_source(ix), ix->format, ix->nfiles, in->tensors,
           in->values, (unsigned long long)in->params, (unsigned long long)in->bytes, h);
    printf("by dtype:\n");
    for (unsigned t = 0; t < CK_DTYPE_COUNT; t++) {
        if (!in->by[t].tensors)
            continue;
        human(in->by[t].bytes, h, sizeof h);
        printf("  %-10s %6llu tensors %14llu parameters %12s\n", ck_dtype_name(t),
               (unsigned long long)in->by[t].tensors, (unsigned long long)in->by[t].params, h);
    }
    printf("tree:\n");
    for (size_t i = 0; i < in->ntree; i++) {
        const prefix *p = &in->tree[i];
        human(p->bytes, h, sizeof h);
        printf("  %10s %14llu  %*s", h, (unsigned long long)p->params, (int)(2 * (p->depth - 1)),
               "");
        print_name(p->s, p->len);
        putchar('\n');
    }
    if (ix->nmeta)
        printf("metadata:\n");
    for (size_t i = 0; i < ix->nmeta; i++) {
        printf("  ");
        print_name(ix->meta[i].key, strlen(ix->meta[i].key));
        printf(": ");
        print_name(ix->meta[i].value, strlen(ix->meta[i].value));
        putchar('\n');
    }
}

static cJSON *sums_json(uint64_t tensors, uint64_t params, uint64_t bytes)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "tensors", ck_json_uint(tensors));
    cJSON_AddItemToObject(o, "parameters", ck_json_uint(params));
    cJSON_AddItemToObject(o, "bytes", ck_json_uint(bytes));
    return o;
}

static int print_info_json(const ck_index *ix, const info *in)
{
    cJSON *doc = cJSON_CreateObject(), *files = cJSON_CreateArray(), *by = cJSON_CreateObject(),
          *tree = cJSON_CreateArray(), *meta = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "source", ck_index_source(ix));
    cJSON_AddStringToObject(doc, "format", ix->format);
    for (uint32_t i = 0; i < ix->nfiles; i++)
        cJSON_AddItemToArray(files, cJSON_CreateString(ix->files[i].path));
    cJSON_AddItemToObject(doc, "files", files);
    cJSON_AddItemToObject(doc, "tensors", ck_json_uint(in->tensors));
    cJSON_AddItemToObject(doc, "values", ck_json_uint(in->values));
    cJSON_AddItemToObject(doc, "parameters", ck_json_uint(in->params));
    cJSON_AddItemToObject(doc, "bytes", ck_json_uint(in->bytes));
    for (unsigned t = 0; t < CK_DTYPE_COUNT; t++)
        if (in->by[t].tensors)
            cJSON_AddItemToObject(by, ck_dtype_name(t),
                                  sums_json(in->by[t].tensors, in->by[t].params, in->by[t].bytes));
    cJSON_AddItemToObject(doc, "dtypes", by);
    for (size_t i = 0; i < in->ntree; i++) {
        const prefix *p = &in->tree[i];
        cJSON *o = sums_json(p->tensors, p->params, p->bytes);
        char *s = strndup(p->s, p->len); /* a prefix is part of a name: no NUL ends it */
        cJSON_AddItemToObject(o, "prefix", s ? cJSON_CreateString(s) : NULL);
        free(s);
        cJSON_AddItemToObject(o, "depth", ck_json_uint(p->depth));
        cJSON_AddItemToArray(tree, o);
    }
    cJSON_AddItemToObject(doc, "tree", tree);
    for (size_t i = 0; i < ix->nmeta; i++)
        cJSON_AddItemToObject(meta, ix->meta[i].key, ix->meta[i].json
                                                         ? cJSON_Parse(ix->meta[i].value)
                                                         : cJSON_CreateString(ix->meta[i].value));
    cJSON_AddItemToObject(doc, "metadata", meta);
    return print_json_doc(doc);
}

int cmd_info(int argc, char **argv)
{
    const char *source = NULL;
    int json = 0;
    unsigned depth = 2;
    for (int i = 1; i < argc; i++) {
        char *end;
        if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else if (strcmp(argv[i], "--depth") == 0 && i + 1 < argc &&
                 (depth = (unsigned)strtoul(argv[++i], &end, 10)) <= 64 && !*end && *argv[i])
            continue;
        else if (argv[i][0] != '-' && !source)
            source = argv[i];
        else
            return fprintf(stderr, "ckpt: info: bad arguments (see ckpt info --help)\n"), 2;
    }
    if (!source)
        return fprintf(stderr, "ckpt: info: needs a source (see ckpt info --help)\n"), 2;
    ck_index *ix;
    if (open_source(source, &ix))
        return 1;
    info in = {0};
    for (size_t i = 0; i < ix->nentries; i++) {
        const ck_entry *e = &ix->entries[i];
        if (e->kind != CK_TENSOR) {
            in.values++;
            continue;
        }
        in.tensors++;
        in.params += element_count(e);
        in.bytes += e->nbytes;
        in.by[e->dtype].tensors++;
        in.by[e->dtype].params += element_count(e);
        in.by[e->dtype].bytes += e->nbytes;
    }
    ssize_t nt = build_tree(ix, depth, &in.tree);
    int rc = 0;
    if (nt < 0) {
        fprintf(stderr, "ckpt: out of memory\n");
        rc = 1;
    } else {
        in.ntree = (size_t)nt;
        if (json)
            rc = print_info_json(ix, &in) != 0;
        else
            print_info_text(ix, &in);
    }
    free(in.tree);
    ck_index_free(ix);
    return rc;
}

/* --- stats -------------------------------------------------------------------------------- */

#define HIST_BINS 10

/* Mean and variance are combined batch by batch (Chan et al.): each batch's mean and sum of
 * squared deviations are taken exactly in two passes over its doubles, then merged, which
 * keeps std accurate where a running sum of squares would cancel. Over finite values only. */
typedef struct stat_acc {
    uint64_t count, finite, nan, inf, zero;
    double min, max, mean, m2;
    uint64_t hist[HIST_BINS];
} stat_acc;

static void acc_batch(stat_acc *s, const double *v, size_t n)
{
    uint64_t k = 0;
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        double x = v[i];
        if (isnan(x)) {
            s->nan++;
            continue;
        }
        if (isinf(x)) {
            s->inf++;
            continue;
        }
        s->zero += x == 0;
        if (s->finite + k == 0 || x < s->min)
            s->min = x;
        if (s->finite + k == 0 || x > s->max)
            s->max = x;
        sum += x;
        k++;
    }
    s->count += n;
    if (k == 0)
        return;
    double mean = sum / (double)k, m2 = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(v[i]))
            m2 += (v[i] - mean) * (v[i] - mean);
    double tot = (double)(s->finite + k), delta = mean - s->mean;
    s->mean += delta * (double)k / tot;
    s->m2 += m2 + delta * delta * (double)s->finite * (double)k / tot;
    s->finite += k;
}

static void hist_batch(stat_acc *s, const double *v, size_t n)
{
    double w = s->max - s->min;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(v[i]))
            continue;
        int b = w > 0 ? (int)((v[i] - s->min) / w * HIST_BINS) : 0;
        s->hist[b >= HIST_BINS ? HIST_BINS - 1 : b < 0 ? 0 : b]++;
    }
}

/* Streams e's elements through fn (acc_batch, then hist_batch for the histogram's pass). */
static int scan_tensor(const ck_index *ix, const ck_entry *e, unsigned char *buf, double *dv,
                       stat_acc *s, void (*fn)(stat_acc *, const double *, size_t), ck_error *err)
{
    unsigned w = decoded_size(e->dtype);
    for (uint64_t off = 0; off < e->nbytes; off += CHUNK) {
        size_t n = e->nbytes - off < CHUNK ? (size_t)(e->nbytes - off) : CHUNK;
        if (read_chunk(ix, e, buf, n, off, err))
            return -1;
        for (size_t j = 0; j < n / w; j += BATCH) {
            size_t m = n / w - j < BATCH ? n / w - j : BATCH;
            decode_batch(e->dtype, buf + j * w, m, dv);
            fn(s, dv, m);
        }
    }
    return 0;
}

static double stat_std(const stat_acc *s)
{
    return s->finite ? sqrt(s->m2 / (double)s->finite) : NAN;
}

static cJSON *stat_json(const ck_entry *e, const stat_acc *s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "name", name_json(e));
    cJSON_AddStringToObject(o, "dtype", ck_dtype_name(e->dtype));
    cJSON_AddItemToObject(o, "shape", shape_json(e));
    cJSON_AddItemToObject(o, "count", ck_json_uint(s->count));
    cJSON_AddItemToObject(o, "finite", ck_json_uint(s->finite));
    cJSON_AddItemToObject(o, "nan", ck_json_uint(s->nan));
    cJSON_AddItemToObject(o, "inf", ck_json_uint(s->inf));
    cJSON_AddItemToObject(o, "zero", ck_json_uint(s->zero));
    if (s->finite) {
        cJSON_AddItemToObject(o, "min", number_json(s->min));
        cJSON_AddItemToObject(o, "max", number_json(s->max));
        cJSON_AddItemToObject(o, "mean", number_json(s->mean));
        cJSON_AddItemToObject(o, "std", number_json(stat_std(s)));
    } else {
        cJSON_AddNullToObject(o, "min");
        cJSON_AddNullToObject(o, "max");
        cJSON_AddNullToObject(o, "mean");
        cJSON_AddNullToObject(o, "std");
    }
    return o;
}

static void print_hist(const stat_acc *s)
{
    uint64_t top = 0;
    for (int b = 0; b < HIST_BINS; b++)
        top = s->hist[b] > top ? s->hist[b] : top;
    double w = (s->max - s->min) / HIST_BINS;
    for (int b = 0; b < HIST_BINS && top; b++)
        printf("    %12.5g %-40.*s %llu\n", s->min + w * b, (int)(40 * s->hist[b] / top),
               "########################################", (unsigned long long)s->hist[b]);
}

static void print_stat_line(const ck_entry *e, const stat_acc *s)
{
    print_name(e->name, e->name_len);
    printf("\t%s\t%llu\t%.9g\t%.9g\t%.9g\t%.9g\t%llu\t%llu\t%llu\n", ck_dtype_name(e->dtype),
           (unsigned long long)s->count, s->finite ? s->min : NAN, s->finite ? s->max : NAN,
           s->finite ? s->mean : NAN, stat_std(s), (unsigned long long)s->nan,
           (unsigned long long)s->inf, (unsigned long long)s->zero);
}

typedef struct stats_run {
    const ck_index *ix;
    const ck_entry **sel; /* the selected tensors, source order */
    size_t n;
    stat_acc *acc;        /* per selected tensor */
    int hist;             /* stdout is a terminal: a second pass bins the values */
    atomic_size_t next;   /* the next tensor a worker takes */
} stats_run;

#define STATS_THREADS 4u /* decoding is CPU-bound: a few cores pay, more only contend */

typedef struct stats_worker {
    stats_run *r;
    pthread_t tid;
    size_t failed_at; /* the tensor that failed, or SIZE_MAX */
    ck_error err;
} stats_worker;

/* Takes tensors one at a time until none is left or one fails; each tensor's figures are its
 * own accumulator's, so workers share nothing but the counter. */
static void *stats_work(void *arg)
{
    stats_worker *w = arg;
    stats_run *r = w->r;
    unsigned char *buf = malloc(CHUNK);
    double *dv = malloc(BATCH * sizeof *dv);
    w->failed_at = SIZE_MAX;
    for (size_t i; (i = atomic_fetch_add(&r->next, 1)) < r->n;) {
        const ck_entry *e = r->sel[i];
        int rc = buf && dv ? 0 : ck_fail(&w->err, ck_index_source(r->ix), "out of memory");
        if (rc == 0 && decoded_size(e->dtype))
            rc = scan_tensor(r->ix, e, buf, dv, &r->acc[i], acc_batch, &w->err);
        if (rc == 0 && decoded_size(e->dtype) && r->hist && r->acc[i].finite)
            rc = scan_tensor(r->ix, e, buf, dv, &r->acc[i], hist_batch, &w->err);
        if (rc) {
            w->failed_at = i;
            atomic_store(&r->next, r->n); /* the others stop after their current tensor */
            break;
        }
    }
    free(buf);
    free(dv);
    return NULL;
}

/* Runs the workers; on trouble prints the error of the first tensor that failed, one line. */
static int stats_compute(stats_run *r)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned nt = cpus < 1 ? 1 : cpus < (long)STATS_THREADS ? (unsigned)cpus : STATS_THREADS;
    stats_worker w[STATS_THREADS];
    unsigned started = 0;
    for (; started < nt && (size_t)started < r->n; started++) {
        w[started] = (stats_worker){.r = r, .failed_at = SIZE_MAX};
        if (pthread_create(&w[started].tid, NULL, stats_work, &w[started]) != 0)
            break;
    }
    if (started == 0) { /* no thread could start (or no tensor): this one does the work */
        w[started] = (stats_worker){.r = r};
        stats_work(&w[started++]);
    } else {
        for (unsigned t = 0; t < started; t++)
            pthread_join(w[t].tid, NULL);
    }
    const stats_worker *bad = NULL;
    for (unsigned t = 0; t < started; t++)
        if (w[t].failed_at != SIZE_MAX && (!bad || w[t].failed_at < bad->failed_at))
            bad = &w[t];
    if (bad)
        fprintf(stderr, "ckpt: %s\n", bad->err.msg);
    return bad ? -1 : 0;
}

static int print_stats(const stats_run *r, int json)
{
    cJSON *doc = json ? cJSON_CreateObject() : NULL, *ts = cJSON_CreateArray(),
          *sk = cJSON_CreateArray();
    if (!json)
        printf("name\tdtype\tcount\tmin\tmax\tmean\tstd\tnan\tinf\tzero\n");
    for (size_t i = 0; i < r->n; i++) {
        const ck_entry *e = r->sel[i];
        if (!decoded_size(e->dtype)) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddItemToObject(o, "name", name_json(e));
            cJSON_AddStringToObject(o, "dtype", ck_dtype_name(e->dtype));
            cJSON_AddItemToArray(sk, o);
            continue;
        }
        if (json) {
            cJSON_AddItemToArray(ts, stat_json(e, &r->acc[i]));
            continue;
        }
        print_stat_line(e, &r->acc[i]);
        if (r->hist)
            print_hist(&r->acc[i]);
    }
    if (!json) {
        for (cJSON *o = sk->child; o; o = o->next)
            fprintf(stdout, "skipped (dtype %s not decoded): %s\n",
                    cJSON_GetObjectItem(o, "dtype")->valuestring,
                    cJSON_GetObjectItem(o, "name")->valuestring);
        cJSON_Delete(ts);
        cJSON_Delete(sk);
        return 0;
    }
    cJSON_AddStringToObject(doc, "source", ck_index_source(r->ix));
    cJSON_AddItemToObject(doc, "tensors", ts);
    cJSON_AddItemToObject(doc, "skipped", sk);
    return print_json_doc(doc);
}

int cmd_stats(int argc, char **argv)
{
    const char *source = NULL;
    int json = 0, npat = 0;
    char **pats = calloc((size_t)argc, sizeof *pats);
    if (!pats)
        return fprintf(stderr, "ckpt: out of memory\n"), 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else if (argv[i][0] == '-') {
            free(pats);
            return fprintf(stderr, "ckpt: stats: bad arguments (see ckpt stats --help)\n"), 2;
        } else if (!source)
            source = argv[i];
        else
            pats[npat++] = argv[i];
    }
    if (!source) {
        free(pats);
        return fprintf(stderr, "ckpt: stats: needs a source (see ckpt stats --help)\n"), 2;
    }
    ck_index *ix;
    if (open_source(source, &ix)) {
        free(pats);
        return 1;
    }
    stats_run r = {ix, malloc((ix->nentries + 1) * sizeof *r.sel), 0,
                   calloc(ix->nentries + 1, sizeof *r.acc), !json && isatty(STDOUT_FILENO), 0};
    int rc = 1;
    if (!r.sel || !r.acc) {
        fprintf(stderr, "ckpt: out of memory\n");
        goto out;
    }
    for (size_t i = 0; i < ix->nentries; i++)
        if (ix->entries[i].kind == CK_TENSOR && selected(&ix->entries[i], pats, npat))
            r.sel[r.n++] = &ix->entries[i];
    if (npat && !r.n) {
        char shown[CK_SHOWN_MAX];
        fprintf(stderr, "ckpt: %s: no tensor matches\n",
                ck_source_shown(source, shown, sizeof shown));
        goto out;
    }
    if (stats_compute(&r) == 0 && print_stats(&r, json) == 0)
        rc = 0;
out:
    free(r.sel);
    free(r.acc);
    free(pats);
    ck_index_free(ix);
    return rc;
}
