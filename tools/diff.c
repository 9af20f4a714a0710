/* diff.c — ckpt diff: which tensors of two checkpoints differ, and by how much (inspect.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "../views/view.h"
#include "../base/names.h"

#include "../base/json.h"
#include "../checkpoint/synth.h"
#include "cli.h"
#include "commands.h"
#include "inspect.h"

/* Two tensors compared: one name in both, or a name one side dropped as an alias (alias 1: A's
 * name, absent from B, against the tensor B kept for it; 2: the other way round). */
typedef struct pair {
    const ck_entry *a, *b;
    int alias;
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
    for (uint64_t off = 0; off < end; off += INSPECT_CHUNK) {
        if (inspect_read_chunk(r->ib, b, r->bb, INSPECT_CHUNK, off, &r->err))
            return -1;
        XXH3_64bits_update(st, r->bb, INSPECT_CHUNK);
    }
    return inspect_read_chunk(r->ib, b, r->bb, n, end, &r->err);
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
    for (uint64_t off = 0; rc == 0 && off < p->a->nbytes; off += INSPECT_CHUNK) {
        size_t n =
            p->a->nbytes - off < INSPECT_CHUNK ? (size_t)(p->a->nbytes - off) : INSPECT_CHUNK;
        rc = inspect_read_chunk(r->ia, p->a, r->ba, n, off, &r->err) ||
             inspect_read_chunk(r->ib, p->b, r->bb, n, off, &r->err);
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
    unsigned wa = inspect_decoded_size(p->a->dtype), wb = inspect_decoded_size(p->b->dtype);
    uint64_t n = inspect_element_count(p->a), step = INSPECT_CHUNK / (wa > wb ? wa : wb);
    double max_abs = 0, dd = 0, aa = 0;
    for (uint64_t i = 0; i < n; i += step) {
        size_t k = n - i < step ? (size_t)(n - i) : (size_t)step;
        if (inspect_read_chunk(r->ia, p->a, r->ba, k * wa, i * wa, &r->err) ||
            inspect_read_chunk(r->ib, p->b, r->bb, k * wb, i * wb, &r->err))
            return -1;
        for (size_t j = 0; j < k; j += INSPECT_BATCH) {
            size_t m = k - j < INSPECT_BATCH ? k - j : INSPECT_BATCH;
            inspect_decode_batch(p->a->dtype, r->ba + j * wa, m, r->da);
            inspect_decode_batch(p->b->dtype, r->bb + j * wb, m, r->db);
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
    if (p->identical || !ck_same_shape(p->a, p->b) || !inspect_is_float(p->a->dtype) ||
        !inspect_is_float(p->b->dtype))
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
    size_t *of_a, *of_b; /* per ta, per tb: its pair, or SIZE_MAX */
    pair *pairs;
} diff_result;

/* What one side says of its names: its alias records (a conversion's __metadata__ "DROPPED":
 * "KEPT", sorted by key) and its own sharing (ck_synth_aliases). */
typedef struct side {
    const ck_index *ix;
    const ck_meta **records;
    uint32_t *alias_of;
} side;

static int by_meta_key(const void *x, const void *y)
{
    return strcmp((*(const ck_meta *const *)x)->key, (*(const ck_meta *const *)y)->key);
}

static int side_open(side *s, const ck_index *ix, ck_error *err)
{
    *s = (side){.ix = ix, .records = malloc((ix->nmeta + 1) * sizeof *s->records)};
    if (!s->records)
        return ck_fail(err, ck_index_source(ix), "out of memory");
    for (size_t i = 0; i < ix->nmeta; i++)
        s->records[i] = &ix->meta[i];
    qsort(s->records, ix->nmeta, sizeof *s->records, by_meta_key);
    return (s->alias_of = ck_synth_aliases(ix, err)) ? 0 : -1;
}

static void side_free(side *s)
{
    free(s->records);
    free(s->alias_of);
}

/* The tensor of other (sorted, n) that name e stands for as an alias: the name this side's
 * record says other kept it as (records: the side that dropped it), or the name its own storage
 * owner has (owner: the side that still has it); NULL when neither is there. */
static const ck_entry *kept_for(const ck_entry *e, const side *records, const side *owner,
                                const ck_entry **other, size_t n)
{
    ck_meta key = {.key = e->name}, *kp = &key;
    const ck_meta **rec = bsearch(&kp, records->records, records->ix->nmeta,
                                  sizeof *records->records, by_meta_key);
    uint32_t o = owner->alias_of[e - owner->ix->entries];
    ck_entry want = {.name = rec ? (*rec)->value : o != UINT32_MAX ? owner->ix->entries[o].name
                                                                   : NULL};
    if (!want.name)
        return NULL;
    want.name_len = (uint32_t)strlen(want.name);
    const ck_entry *wp = &want, **hit = bsearch(&wp, other, n, sizeof *other, cmp_entry_names);
    return hit ? *hit : NULL;
}

/* Appends and compares pair (a, b). */
static int add_pair(diff_run *r, diff_result *d, const ck_entry *a, const ck_entry *b, int alias)
{
    pair *p = &d->pairs[d->npairs++];
    *p = (pair){.a = a, .b = b, .alias = alias};
    return compare_pair(r, p);
}

/* Names in both, then each side's names the other dropped as aliases (against what it kept). */
static int pair_up(diff_run *r, diff_result *d, const side *sa, const side *sb)
{
    for (size_t i = 0; i < d->na; i++) {
        const ck_entry **hit = bsearch(&d->ta[i], d->tb, d->nb, sizeof *d->tb, cmp_entry_names);
        if (!hit)
            continue;
        d->of_a[i] = d->of_b[hit - d->tb] = d->npairs;
        if (add_pair(r, d, d->ta[i], *hit, 0) != 0)
            return -1;
    }
    for (size_t i = 0; i < d->na; i++) {
        const ck_entry *k = d->of_a[i] == SIZE_MAX ? kept_for(d->ta[i], sb, sa, d->tb, d->nb)
                                                  : NULL;
        if (k && (d->of_a[i] = d->npairs, add_pair(r, d, d->ta[i], k, 1) != 0))
            return -1;
    }
    for (size_t i = 0; i < d->nb; i++) {
        const ck_entry *k = d->of_b[i] == SIZE_MAX ? kept_for(d->tb[i], sa, sb, d->ta, d->na)
                                                  : NULL;
        if (k && (d->of_b[i] = d->npairs, add_pair(r, d, k, d->tb[i], 2) != 0))
            return -1;
    }
    return 0;
}

static int diff_indexes(diff_run *r, const char *only, diff_result *d)
{
    side sa = {0}, sb = {0};
    d->ta = sorted_tensors(r->ia, only, &d->na);
    d->tb = sorted_tensors(r->ib, only, &d->nb);
    d->of_a = malloc((d->na + 1) * sizeof *d->of_a);
    d->of_b = malloc((d->nb + 1) * sizeof *d->of_b);
    d->pairs = calloc(d->na + d->nb + 1, sizeof *d->pairs);
    if (!d->ta || !d->tb || !d->of_a || !d->of_b || !d->pairs)
        return ck_fail(&r->err, ck_index_source(r->ia), "out of memory");
    for (size_t i = 0; i < d->na; i++)
        d->of_a[i] = SIZE_MAX;
    for (size_t i = 0; i < d->nb; i++)
        d->of_b[i] = SIZE_MAX;
    int rc = side_open(&sa, r->ia, &r->err) || side_open(&sb, r->ib, &r->err) ||
             pair_up(r, d, &sa, &sb) ? -1 : 0;
    side_free(&sa);
    side_free(&sb);
    return rc;
}

static void free_result(diff_result *d)
{
    free(d->ta);
    free(d->tb);
    free(d->of_a);
    free(d->of_b);
    free(d->pairs);
}

static size_t count_unpaired(const size_t *of, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += of[i] == SIZE_MAX;
    return k;
}

/* Pairs of names in both (alias 0), or aliases (1 or 2), that are identical (same 1) or not. */
static size_t count_pairs(const diff_result *d, int aliases, int same)
{
    size_t n = 0;
    for (size_t i = 0; i < d->npairs; i++)
        n += (d->pairs[i].alias != 0) == aliases && d->pairs[i].identical == same;
    return n;
}

static cJSON *pair_json(const pair *p)
{
    cJSON *o = cJSON_CreateObject();
    char h[17];
    cJSON_AddItemToObject(o, "name", inspect_name_json(p->alias == 2 ? p->b : p->a));
    if (p->alias) /* the name one side dropped, and what that side kept for it */
        cJSON_AddItemToObject(o, "alias_of", inspect_name_json(p->alias == 2 ? p->a : p->b));
    cJSON_AddStringToObject(o, "dtype_a", ck_dtype_name(p->a->dtype));
    cJSON_AddStringToObject(o, "dtype_b", ck_dtype_name(p->b->dtype));
    cJSON_AddItemToObject(o, "shape_a", inspect_shape_json(p->a));
    cJSON_AddItemToObject(o, "shape_b", inspect_shape_json(p->b));
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
        cJSON_AddItemToObject(o, "max_abs_diff", inspect_number_json(p->max_abs));
        cJSON_AddItemToObject(o, "rel_l2", inspect_number_json(p->rel_l2));
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
    for (size_t i = 0; i < d->na; i++) {
        if (d->of_a[i] != SIZE_MAX)
            cJSON_AddItemToArray(ts, pair_json(&d->pairs[d->of_a[i]]));
        else
            cJSON_AddItemToArray(oa, inspect_name_json(d->ta[i]));
    }
    for (size_t i = 0; i < d->nb; i++) {
        if (d->of_b[i] == SIZE_MAX)
            cJSON_AddItemToArray(ob, inspect_name_json(d->tb[i]));
        else if (d->pairs[d->of_b[i]].alias == 2)
            cJSON_AddItemToArray(ts, pair_json(&d->pairs[d->of_b[i]]));
    }
    cJSON_AddItemToObject(sum, "both", ck_json_uint(count_pairs(d, 0, 1) + count_pairs(d, 0, 0)));
    cJSON_AddItemToObject(sum, "identical", ck_json_uint(count_pairs(d, 0, 1)));
    cJSON_AddItemToObject(sum, "different", ck_json_uint(count_pairs(d, 0, 0) +
                                                          count_pairs(d, 1, 0)));
    cJSON_AddItemToObject(sum, "only_in_a", ck_json_uint(count_unpaired(d->of_a, d->na)));
    cJSON_AddItemToObject(sum, "only_in_b", ck_json_uint(count_unpaired(d->of_b, d->nb)));
    cJSON_AddItemToObject(sum, "aliases_dropped", ck_json_uint(count_pairs(d, 1, 1)));
    cJSON_AddItemToObject(doc, "summary", sum);
    cJSON_AddItemToObject(doc, "only_in_a", oa);
    cJSON_AddItemToObject(doc, "only_in_b", ob);
    cJSON_AddItemToObject(doc, "tensors", ts);
    return inspect_print_json_doc(doc);
}

static void print_pair_line(const pair *p)
{
    char sa[1400], sb[1400];
    const ck_entry *named = p->alias == 2 ? p->b : p->a, *kept = p->alias == 2 ? p->a : p->b;
    if (p->identical)
        return;
    printf(p->same_layout ? "differs: " : "changed: ");
    cli_print_name(named->name, named->name_len);
    if (p->alias) {
        printf(" (dropped in %s as an alias of ", p->alias == 1 ? "B" : "A");
        cli_print_name(kept->name, kept->name_len);
        putchar(')');
    }
    if (!p->same_layout) {
        ck_view_shape_json(p->a, sa, sizeof sa);
        ck_view_shape_json(p->b, sb, sizeof sb);
        printf(": %s %s -> %s %s", ck_dtype_name(p->a->dtype), sa, ck_dtype_name(p->b->dtype), sb);
    } else {
        printf(" (%s)", ck_dtype_name(p->a->dtype));
    }
    if (p->valued)
        printf(": max abs diff %.6g, relative L2 %.6g", p->max_abs, p->rel_l2);
    putchar('\n');
}

static void print_diff_text(const diff_result *d)
{
    for (size_t i = 0; i < d->na; i++) {
        if (d->of_a[i] != SIZE_MAX) {
            print_pair_line(&d->pairs[d->of_a[i]]);
            continue;
        }
        printf("only in A: ");
        cli_print_name(d->ta[i]->name, d->ta[i]->name_len);
        putchar('\n');
    }
    for (size_t i = 0; i < d->nb; i++) {
        if (d->of_b[i] != SIZE_MAX) {
            if (d->pairs[d->of_b[i]].alias == 2)
                print_pair_line(&d->pairs[d->of_b[i]]);
            continue;
        }
        printf("only in B: ");
        cli_print_name(d->tb[i]->name, d->tb[i]->name_len);
        putchar('\n');
    }
    size_t both = count_pairs(d, 0, 1) + count_pairs(d, 0, 0), aliases = count_pairs(d, 1, 1);
    printf("%zu tensors in both: %zu identical, %zu differ; %zu only in A, %zu only in B", both,
           count_pairs(d, 0, 1), count_pairs(d, 0, 0) + count_pairs(d, 1, 0),
           count_unpaired(d->of_a, d->na), count_unpaired(d->of_b, d->nb));
    if (aliases)
        printf("; %zu aliases dropped", aliases);
    putchar('\n');
}

enum { DIFF_JSON, DIFF_ONLY };
static const ck_option diff_options[] = {
    {"json", NULL, "the comparison as JSON", 0},
    {"only", "P", CK_ONLY_HELP, 0},
    {NULL, NULL, NULL, 0}};

static int cmd_diff(int argc, char **argv, http_remote *remote)
{
    const char *src[2] = {NULL, NULL}, *only = NULL, *val;
    int json = 0, nsrc = 0, k;
    ck_opts p;
    ck_opts_init(&p, "diff", diff_options, argc, argv);
    while ((k = ck_opts_next(&p, &val)) != CK_OPT_END) {
        if (k == CK_OPT_ERROR)
            return CK_USAGE;
        if (k == DIFF_JSON)
            json = 1;
        else if (k == DIFF_ONLY)
            only = val;
        else if (nsrc == 2)
            return ck_usage_error("diff", "needs two sources only");
        else
            src[nsrc++] = val;
    }
    if (nsrc != 2)
        return ck_usage_error("diff", "needs two sources");
    ck_index *ia = NULL, *ib = NULL;
    diff_run r = {0};
    diff_result d = {0};
    int rc = 2;
    if (cli_open_source(remote, src[0], &ia) || cli_open_source(remote, src[1], &ib))
        goto out;
    r = (diff_run){ia, ib, malloc(INSPECT_CHUNK), malloc(INSPECT_CHUNK),
                   malloc(INSPECT_BATCH * sizeof(double)), malloc(INSPECT_BATCH * sizeof(double)),
                   {{0}}};
    if (!r.ba || !r.bb || !r.da || !r.db) {
        fprintf(stderr, "ckpt: out of memory\n");
        goto out;
    }
    if (diff_indexes(&r, only, &d) != 0) {
        fprintf(stderr, "ckpt: %s\n", r.err.msg);
        goto out;
    }
    int same = !count_unpaired(d.of_a, d.na) && !count_unpaired(d.of_b, d.nb) &&
               !count_pairs(&d, 0, 0) && !count_pairs(&d, 1, 0);
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

const ck_command ckpt_diff = {
    "diff", "ckpt diff A B [--json] [--only PREFIX_OR_GLOB]",
    "Compares the tensors of two sources (formats may differ: a .bin and its safetensors):\n"
    "names only in A or only in B, dtype or shape changes, and for tensors in both whether\n"
    "their bytes are identical (XXH3 of each side, streamed). For float tensors (F64, F32,\n"
    "F16, BF16, F8 E4M3/E5M2) that differ: the max absolute difference and the relative L2\n"
    "||a-b||/||a||, computed in double. Values (non-tensor pickle entries) are not compared.\n"
    "--only compares the entries whose name is P or starts with P., or matches the glob.\n"
    "Exits 0 when the same, 1 when different, 2 on trouble (as cmp and diff do).",
    diff_options, cmd_diff};
