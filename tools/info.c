/* info.c — ckpt info: a checkpoint's totals and its name tree to a depth (inspect.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "../base/json.h"
#include "../checkpoint/synth.h"
#include "cli.h"
#include "commands.h"
#include "inspect.h"

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

/* The tree to depth maxd: every tensor adds itself to each of its prefixes (an alias its name
 * only: its parameters and bytes are its owner's), then equal prefixes are merged. Returns the
 * number of prefixes, or -1 on out-of-memory. */
static ssize_t build_tree(const ck_index *ix, const uint32_t *alias_of, unsigned maxd,
                          prefix **out)
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
            int own = alias_of[i] == UINT32_MAX;
            v[n++] = (prefix){e->name, end, d, 1, own ? inspect_element_count(e) : 0,
                              own ? e->nbytes : 0};
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
    size_t tensors, values, aliases;
    uint64_t params, bytes;
    dtype_sum by[CK_DTYPE_COUNT];
    prefix *tree;
    size_t ntree;
} info;

enum { SHOWN_ITEMS = 3, SHOWN_BYTES = 160 }; /* of a metadata value, without --full */

/* What an array's items are, in words, from the first byte of each (kinds: 1 a string, 2 a
 * boolean, 4 a number, 8 anything else): "strings", "booleans", "numbers", or "values" when
 * they are mixed. */
static const char *items_word(int kinds)
{
    return kinds == 1 ? "strings" : kinds == 2 ? "booleans" : kinds == 4 ? "numbers" : "values";
}

static int item_kind(char c)
{
    return c == '"' ? 1 : c == 't' || c == 'f' ? 2 : c == '-' || (c >= '0' && c <= '9') ? 4 : 8;
}

/* text (len bytes), cut after SHOWN_BYTES (at a character's start) unless full. */
static void print_cut(const char *text, size_t len, int full)
{
    size_t cut = SHOWN_BYTES;
    if (full || len <= SHOWN_BYTES) {
        cli_print_name(text, len);
        return;
    }
    while (cut && (text[cut] & 0xC0) == 0x80) /* not inside a UTF-8 character */
        cut--;
    cli_print_name(text, cut);
    printf("\u2026 (%zu bytes; --full shows all)", len);
}

/* A metadata value as `ckpt info` shows it: a typed JSON value (a GGUF key's {"type", "value"})
 * as its value, in JSON; an array of more than SHOWN_ITEMS items as its count and first items
 * unless full (a vocabulary of 128000 tokens: [128000 strings: "<unk>", "<s>", "</s>", …]);
 * text cut after SHOWN_BYTES unless full. The JSON is walked as the index holds it, not parsed:
 * a tree of a long array takes many times the text's memory, and the text is exact (a UINT64
 * above 2^53 too). */
static void print_meta_value(const ck_meta *m, int full)
{
    const char *s = m->value;
    size_t len = strlen(s), from = 0, to = len;
    if (m->json && ck_json_member(s, len, 0, "value", &from, &to) != 0)
        to = ck_json_end(s, len, from = ck_json_space(s, len, 0));
    if (m->json && !full && from < to && s[from] == '[') {
        size_t item[SHOWN_ITEMS][2], n = 0;
        int kinds = 0;
        for (size_t i = ck_json_space(s, to, from + 1); i < to && s[i] != ']';) {
            size_t end = ck_json_end(s, to, i);
            kinds |= item_kind(s[i]);
            if (n < SHOWN_ITEMS)
                item[n][0] = i, item[n][1] = end;
            n++;
            i = ck_json_space(s, to, end);
            if (i >= to || s[i] != ',')
                break;
            i = ck_json_space(s, to, i + 1);
        }
        if (n > SHOWN_ITEMS) {
            printf("[%zu %s: ", n, items_word(kinds));
            for (size_t k = 0; k < SHOWN_ITEMS; k++) {
                print_cut(s + item[k][0], item[k][1] - item[k][0], 0);
                printf(", ");
            }
            printf("\u2026]");
            return;
        }
    }
    print_cut(s + from, to - from, full);
}

static void print_info_text(const ck_index *ix, const info *in, int full)
{
    char h[32];
    ck_size_human(in->bytes, h, sizeof h);
    printf("source: %s\nformat: %s\nfiles: %u\ntensors: %zu\nvalues: %zu\n", ck_index_source(ix),
           ix->format, ix->nfiles, in->tensors, in->values);
    if (in->aliases)
        printf("aliases: %zu (tied names: their parameters and bytes are counted once)\n",
               in->aliases);
    printf("parameters: %llu\nbytes: %llu (%s)\n", (unsigned long long)in->params,
           (unsigned long long)in->bytes, h);
    printf("by dtype:\n");
    for (unsigned t = 0; t < CK_DTYPE_COUNT; t++) {
        if (!in->by[t].tensors)
            continue;
        ck_size_human(in->by[t].bytes, h, sizeof h);
        printf("  %-10s %6llu tensors %14llu parameters %12s\n", ck_dtype_name(t),
               (unsigned long long)in->by[t].tensors, (unsigned long long)in->by[t].params, h);
    }
    printf("tree:\n");
    for (size_t i = 0; i < in->ntree; i++) {
        const prefix *p = &in->tree[i];
        ck_size_human(p->bytes, h, sizeof h);
        printf("  %10s %14llu  %*s", h, (unsigned long long)p->params, (int)(2 * (p->depth - 1)),
               "");
        cli_print_name(p->s, p->len);
        putchar('\n');
    }
    if (ix->nmeta)
        printf("metadata:\n");
    for (size_t i = 0; i < ix->nmeta; i++) {
        printf("  ");
        cli_print_name(ix->meta[i].key, strlen(ix->meta[i].key));
        printf(": ");
        print_meta_value(&ix->meta[i], full);
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

static void put_stdout(void *ctx, const char *s, size_t n)
{
    (void)ctx;
    fwrite(s, 1, n, stdout);
}

/* A JSON text as it is but for white space outside its strings (a GGUF key's typed JSON has a
 * newline before its closing brace), so that the summary stays one line. */
static void put_one_line(const char *s, size_t n)
{
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '"') {
            i = ck_json_end(s, n, i) - 1;
        } else if (ck_json_space(s, n, i) > i) {
            fwrite(s + run, 1, i - run, stdout);
            run = i + 1;
        }
    }
    fwrite(s + run, 1, n - run, stdout);
}

/* The summary as JSON, written as it goes: the metadata, last, as the index holds it (a typed
 * GGUF value's text, exact, rather than a tree of it, many times larger for a long array). */
static int print_info_json(const ck_index *ix, const info *in)
{
    cJSON *doc = cJSON_CreateObject(), *files = cJSON_CreateArray(), *by = cJSON_CreateObject(),
          *tree = cJSON_CreateArray();
    cJSON_AddStringToObject(doc, "source", ck_index_source(ix));
    cJSON_AddStringToObject(doc, "format", ix->format);
    for (uint32_t i = 0; i < ix->nfiles; i++)
        cJSON_AddItemToArray(files, cJSON_CreateString(ix->files[i].path));
    cJSON_AddItemToObject(doc, "files", files);
    cJSON_AddItemToObject(doc, "tensors", ck_json_uint(in->tensors));
    cJSON_AddItemToObject(doc, "values", ck_json_uint(in->values));
    cJSON_AddItemToObject(doc, "aliases", ck_json_uint(in->aliases));
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
    char *text = cJSON_PrintUnformatted(doc);
    cJSON_Delete(doc);
    if (!text) {
        fprintf(stderr, "ckpt: out of memory\n");
        return -1;
    }
    fwrite(text, 1, strlen(text) - 1, stdout); /* all but its closing brace: "metadata" follows */
    free(text);
    printf(",\"metadata\":{");
    for (size_t i = 0; i < ix->nmeta; i++) {
        const ck_meta *m = &ix->meta[i];
        if (i)
            putchar(',');
        ck_json_string(put_stdout, NULL, m->key, strlen(m->key), CK_JSON_UTF8 | CK_JSON_NAMED);
        putchar(':');
        if (m->json)
            put_one_line(m->value, strlen(m->value));
        else
            ck_json_string(put_stdout, NULL, m->value, strlen(m->value),
                           CK_JSON_UTF8 | CK_JSON_NAMED);
    }
    printf("}}\n");
    return 0;
}

enum { INFO_DEPTH, INFO_JSON, INFO_FULL };
static const ck_option info_options[] = {
    {"depth", "N", "the tree of bytes by name prefix to depth N, 0 to 64 (default 2)", 0},
    {"json", NULL, "the summary as JSON (metadata always whole, as index.json has it)", 0},
    {"full", NULL, "metadata values whole: long arrays and text are cut without it", 0},
    {NULL, NULL, NULL, 0}};

static int cmd_info(int argc, char **argv, http_remote *remote)
{
    const char *source = NULL, *val;
    int json = 0, full = 0, k;
    unsigned depth = 2;
    ck_opts p;
    ck_opts_init(&p, "info", info_options, argc, argv);
    while ((k = ck_opts_next(&p, &val)) != CK_OPT_END) {
        char *end;
        if (k == CK_OPT_ERROR)
            return CK_USAGE;
        if (k == INFO_JSON) {
            json = 1;
        } else if (k == INFO_FULL) {
            full = 1;
        } else if (k == INFO_DEPTH) {
            unsigned long d = strtoul(val, &end, 10);
            if (!*val || *end || d > 64 || val[0] == '-')
                return ck_opts_bad_value(&p, k, val, "a depth from 0 to 64");
            depth = (unsigned)d;
        } else if (source) {
            return ck_usage_error("info", "one SOURCE only");
        } else {
            source = val;
        }
    }
    if (!source)
        return ck_usage_error("info", "needs a source");
    ck_index *ix;
    if (cli_open_source(remote, source, &ix))
        return 1;
    info in = {0};
    ck_error err;
    uint32_t *alias_of = ck_synth_aliases(ix, &err);
    if (!alias_of) {
        fprintf(stderr, "ckpt: %s\n", err.msg);
        ck_index_free(ix);
        return 1;
    }
    for (size_t i = 0; i < ix->nentries; i++) {
        const ck_entry *e = &ix->entries[i];
        if (e->kind != CK_TENSOR) {
            in.values++;
            continue;
        }
        in.tensors++;
        in.by[e->dtype].tensors++;
        if (alias_of[i] != UINT32_MAX) { /* tied: its owner counts the storage */
            in.aliases++;
            continue;
        }
        in.params += inspect_element_count(e);
        in.bytes += e->nbytes;
        in.by[e->dtype].params += inspect_element_count(e);
        in.by[e->dtype].bytes += e->nbytes;
    }
    ssize_t nt = build_tree(ix, alias_of, depth, &in.tree);
    free(alias_of);
    int rc = 0;
    if (nt < 0) {
        fprintf(stderr, "ckpt: out of memory\n");
        rc = 1;
    } else {
        in.ntree = (size_t)nt;
        if (json)
            rc = print_info_json(ix, &in) != 0;
        else
            print_info_text(ix, &in, full);
    }
    free(in.tree);
    ck_index_free(ix);
    return rc;
}

const ck_command ckpt_info = {
    "info", "ckpt info SOURCE [--depth N] [--json] [--full]",
    "Summarizes SOURCE: format, files, tensor and value counts, parameters (elements), bytes\n"
    "by dtype, a du-like tree of bytes and parameters by name prefix ('.'-separated parts) to\n"
    "depth N (default 2), and the metadata (a long array as its count and first items, long\n"
    "text cut: --full shows them whole). Reads no tensor data.",
    info_options, cmd_info};
