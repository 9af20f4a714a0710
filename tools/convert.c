/* convert.c — `ckpt convert`: any source ckptfs mounts, written as safetensors the way Hugging
 * Face tools write and read it (one file, or shards with model.safetensors.index.json), or as a
 * pack. The bytes come from checkpoint/synth (one owner of both layouts); tools/outfile makes the
 * output appear whole or not at all. */
#include <signal.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../base/json.h"
#include "../base/names.h"
#include "../checkpoint/open.h"
#include "../checkpoint/synth.h"
#include "cli.h"
#include "commands.h"
#include "inspect.h"
#include "outfile.h"
#include "progress.h"

static const char convert_usage[] =
    "ckpt convert SOURCE OUT [--to safetensors|pack] [--max-shard-size SIZE] [--only P] "
    "[--skip-unsupported] [--keep P] [--drop P] [--force] [-v]";
static const char convert_help[] =
    "Writes SOURCE (any format ckptfs mounts) as OUT, without running anything in it.\n"
    "--to safetensors (the default): one safetensors file whose __metadata__ is {\"format\":\n"
    "\"pt\"} plus SOURCE's metadata, tensors in natural name order. With --max-shard-size SIZE\n"
    "(bytes, or as save_pretrained spells it: 5GB, 500MB, 100KB decimal; 2GiB, 512MiB binary)\n"
    "OUT is a directory of model-00001-of-0000N.safetensors shards, filled in order (a tensor\n"
    "larger than SIZE alone in its shard), and model.safetensors.index.json (metadata.total_size,\n"
    "weight_map), as transformers writes them. Tied tensors (one storage under several names,\n"
    "same dtype and shape) are written once, under the name that comes first in SOURCE's own\n"
    "order (a state_dict's: the input embedding before the head tied to it), as transformers'\n"
    "save_pretrained keeps them; each other name is dropped and recorded in __metadata__ as\n"
    "\"NAME\": \"KEPT NAME\". --keep P keeps the tied name that is P (or starts with P., or\n"
    "matches the glob) instead, --drop P keeps another than P; both repeat. When SOURCE's\n"
    "directory has a config.json saying \"tie_word_embeddings\": false, nothing is dropped\n"
    "(every name written, its bytes copied). Dtypes safetensors lacks (quantized GGUF blocks, complex...) are refused\n"
    "by name; --skip-unsupported leaves them out and lists them in __metadata__\n"
    "\"ckptfs.omitted\". Non-tensor values of a pickle are left out. --to pack writes what\n"
    "`ckpt pack` writes. --only keeps the entries whose name is P or starts with P., or\n"
    "matches the glob. Memory stays a few MiB; OUT (file or directory) is written beside\n"
    "itself and renamed, so it appears whole or not at all; the same input gives the same\n"
    "bytes. An existing directory OUT gets OUT/model.safetensors (or model.pack); a shard\n"
    "directory OUT must not exist or be empty, unless --force replaces it (a directory of\n"
    "files only). A progress bar is drawn when stderr is a terminal, and a line says what\n"
    "was written (-v: in a pipe too).";

typedef struct options {
    const char *source, *out, *only;
    uint64_t max_shard; /* 0: one file */
    int pack, skip_unsupported;
    int out_flags; /* CK_OUT_* */
    const char **keep, **drop; /* the patterns of --keep and --drop */
    int nkeep, ndrop;
} options;

enum { CONVERT_TO, CONVERT_MAX_SHARD_SIZE, CONVERT_ONLY, CONVERT_SKIP_UNSUPPORTED, CONVERT_KEEP,
       CONVERT_DROP, CONVERT_FORCE, CONVERT_VERBOSE };
static const ck_option convert_options[] = {
    {"to", "FORMAT", "safetensors (the default) or pack", 0},
    {"max-shard-size", "SIZE", "OUT a directory of Hugging Face shards of at most SIZE (5GB,\n"
                               "500MB decimal; 2GiB binary)", 0},
    {"only", "P", CK_ONLY_HELP, 0},
    {"skip-unsupported", NULL, "leave out the dtypes safetensors lacks (listed in the metadata)", 0},
    {"keep", "P", "of tied tensors, keep the name P selects; repeats", 0},
    {"drop", "P", "of tied tensors, keep another name than P; repeats", 0},
    {"force", NULL, "with --max-shard-size: replace OUT when it is a file or a directory of\n"
                    "files (a file OUT is always replaced, as cp does)", 0},
    {"verbose", NULL, "say what was written, in a pipe too (a terminal is told anyway)", 'v'},
    {NULL, NULL, NULL, 0}};

static void options_free(options *o)
{
    free(o->keep);
    free(o->drop);
}

/* One option k of convert, its value val, into o (and *to); 0 or CK_USAGE. */
static int convert_option(const ck_opts *p, int k, const char *val, options *o, const char **to)
{
    switch (k) {
    case CONVERT_TO:
        *to = val;
        return strcmp(val, "pack") == 0 || strcmp(val, "safetensors") == 0
                   ? 0 : ck_opts_bad_value(p, k, val, "safetensors or pack");
    case CONVERT_MAX_SHARD_SIZE:
        return (o->max_shard = ck_parse_size(val, 1))
                   ? 0 : ck_opts_bad_value(p, k, val, "a size such as 5GB or 500MiB");
    case CONVERT_ONLY:
        o->only = val;
        return 0;
    case CONVERT_SKIP_UNSUPPORTED:
        o->skip_unsupported = 1;
        return 0;
    case CONVERT_KEEP:
        o->keep[o->nkeep++] = val;
        return 0;
    case CONVERT_FORCE:
        o->out_flags |= CK_OUT_FORCE;
        return 0;
    case CONVERT_VERBOSE:
        o->out_flags |= CK_OUT_SAY;
        return 0;
    default: /* CONVERT_DROP */
        o->drop[o->ndrop++] = val;
        return 0;
    }
}

static int parse_args(int argc, char **argv, options *o)
{
    const char *to = "safetensors", *val;
    int nargs = 0, k;
    *o = (options){.keep = calloc((size_t)argc, sizeof *o->keep),
                   .drop = calloc((size_t)argc, sizeof *o->drop), .out_flags = ck_out_say_default()};
    if (!o->keep || !o->drop)
        return fprintf(stderr, "ckpt: out of memory\n"), 1;
    ck_opts p;
    ck_opts_init(&p, "convert", convert_options, argc, argv);
    while ((k = ck_opts_next(&p, &val)) != CK_OPT_END) {
        if (k == CK_OPT_ERROR)
            return CK_USAGE;
        if (k >= 0 && convert_option(&p, k, val, o, &to) != 0)
            return CK_USAGE;
        if (k == CK_OPT_OPERAND && nargs == 2)
            return ck_usage_error("convert", "need SOURCE and OUT only");
        if (k == CK_OPT_OPERAND)
            *(nargs++ ? &o->out : &o->source) = val;
    }
    if (nargs != 2)
        return ck_usage_error("convert", "need SOURCE and OUT");
    o->pack = strcmp(to, "pack") == 0;
    if (o->pack && o->max_shard)
        return ck_usage_error("convert", "--max-shard-size is for safetensors");
    return 0;
}

/* What a safetensors conversion writes: the tensors in order, those left out, and the
 * metadata it adds to the source's. */
typedef struct plan {
    uint32_t *write, nwrite;  /* entries, natural order */
    uint32_t *omit, nomit;    /* unsupported dtypes left out (--skip-unsupported) */
    ck_meta *extra;           /* one "alias": "kept" per dropped alias */
    size_t nextra;
    uint64_t total;           /* bytes of the written tensors */
} plan;

static void plan_free(plan *p)
{
    free(p->write);
    free(p->omit);
    free(p->extra);
}

/* Whether SOURCE's directory holds a config.json saying "tie_word_embeddings": false (read
 * whole, at most 1 MiB; a local SOURCE only). */
static int untied(const char *source)
{
    enum { MAX_CONFIG = 1 << 20 };
    struct stat st;
    ck_error err;
    ck_file f;
    if (ck_location_is_url(source))
        return 0;
    int dir = stat(source, &st) == 0 && S_ISDIR(st.st_mode);
    char *path = dir ? NULL : ck_source_sibling(source, "config.json", &err), *text = NULL;
    if (dir && asprintf(&path, "%s/config.json", source) < 0)
        path = NULL;
    int off = 0; /* a config.json that is missing, not a regular file or too big: no word */
    if (path && ck_source_open_local(path, NULL, &f, &err) == 0) {
        if (f.size < MAX_CONFIG && (text = malloc((size_t)f.size + 1)) &&
            ck_file_read(&f, text, (size_t)f.size, 0) == 0) {
            cJSON *root = cJSON_ParseWithLength(text, (size_t)f.size);
            off = cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings"));
            cJSON_Delete(root);
        }
        ck_source_close(&f);
    }
    free(text);
    free(path);
    return off;
}

/* The entry each tied group (alias_of's owners, ck_synth_aliases) keeps, per owner: the first
 * of the selected names in source order that --keep names, else the first that --drop does
 * not, else the first. NULL when memory runs out. */
static uint32_t *keepers(const ck_index *ix, const uint32_t *alias_of, const options *o)
{
    size_t n = ix->nentries ? ix->nentries : 1;
    uint32_t *keep = malloc(n * sizeof *keep), *spare = malloc(n * sizeof *spare);
    uint32_t *first = malloc(n * sizeof *first);
    if (!keep || !spare || !first) {
        free(keep), free(spare), free(first);
        return NULL;
    }
    for (size_t i = 0; i < ix->nentries; i++)
        keep[i] = spare[i] = first[i] = UINT32_MAX;
    for (uint32_t i = 0; i < ix->nentries; i++) { /* source order: an owner before its aliases */
        const ck_entry *e = &ix->entries[i];
        uint32_t g = alias_of[i] != UINT32_MAX ? alias_of[i] : i;
        if (!ck_name_selected(e->name, e->name_len, o->only))
            continue;
        first[g] = first[g] == UINT32_MAX ? i : first[g];
        if (keep[g] == UINT32_MAX && inspect_selected(e, o->keep, o->nkeep))
            keep[g] = i;
        if (spare[g] == UINT32_MAX && !inspect_selected(e, o->drop, o->ndrop))
            spare[g] = i;
    }
    for (size_t g = 0; g < ix->nentries; g++)
        keep[g] = keep[g] != UINT32_MAX ? keep[g] : spare[g] != UINT32_MAX ? spare[g] : first[g];
    free(spare);
    free(first);
    return keep;
}

static int make_plan(const ck_index *ix, const options *o, plan *p)
{
    ck_pack_groups g;
    ck_error err;
    *p = (plan){0};
    uint32_t *alias_of = ck_synth_aliases(ix, &err), *keep = NULL;
    if (!alias_of || ck_synth_groups(ix, o->only, NULL, &g, &err) != 0) {
        fprintf(stderr, "ckpt: %s\n", err.msg);
        free(alias_of);
        return -1;
    }
    int tied = !untied(o->source);
    size_t m = g.ntensors ? g.ntensors : 1;
    p->write = malloc(m * sizeof *p->write);
    p->omit = malloc(m * sizeof *p->omit);
    p->extra = malloc(m * sizeof *p->extra);
    keep = keepers(ix, alias_of, o);
    int rc = p->write && p->omit && p->extra && keep ? 0 : -1;
    if (rc != 0)
        fprintf(stderr, "ckpt: out of memory\n");
    for (uint32_t k = 0; k < g.ntensors && rc == 0; k++) {
        uint32_t i = g.tensors[k], kept = keep[alias_of[i] != UINT32_MAX ? alias_of[i] : i];
        const ck_entry *e = &ix->entries[i];
        if (e->dtype >= CK_ST_DTYPE_COUNT && !o->skip_unsupported) {
            char shown[CK_SHOWN_MAX];
            fprintf(stderr, "ckpt: %s: tensor '%s' is %s, which safetensors lacks "
                    "(--skip-unsupported leaves such tensors out)\n",
                    ck_location_shown(o->source, shown, sizeof shown), e->name,
                    ck_dtype_name(e->dtype));
            rc = -1;
        } else if (e->dtype >= CK_ST_DTYPE_COUNT) {
            p->omit[p->nomit++] = g.tensors[k];
        } else if (tied && kept != i) {
            p->extra[p->nextra++] = (ck_meta){.key = e->name, .value = ix->entries[kept].name};
        } else {
            p->write[p->nwrite++] = g.tensors[k];
            p->total += e->nbytes;
        }
    }
    ck_pack_groups_free(&g);
    free(alias_of);
    free(keep);
    if (rc != 0)
        plan_free(p);
    return rc;
}

/* The safetensors file of write[0..n): the omitted tensors go along so that st's metadata
 * names them (synth leaves them out), the same in every shard. */
static int synth_part(const ck_index *ix, const plan *p, const uint32_t *write, uint32_t n,
                      ck_synth **sy)
{
    uint32_t *ents = malloc(((size_t)n + p->nomit + 1) * sizeof *ents);
    ck_error err;
    int rc = -1;
    if (!ents) {
        fprintf(stderr, "ckpt: out of memory\n");
        return -1;
    }
    memcpy(ents, write, n * sizeof *ents);
    memcpy(ents + n, p->omit, p->nomit * sizeof *ents);
    if ((rc = ck_synth_safetensors_of(ix, ents, n + p->nomit, p->extra, p->nextra, sy, &err)))
        fprintf(stderr, "ckpt: %s\n", err.msg);
    free(ents);
    return rc;
}

/* Shards in order: a tensor goes to the current shard unless that would pass max and the shard
 * has something already (so a tensor larger than max is alone in its shard). first[s] is the
 * place in write of shard s's first tensor; first[nshards] == nwrite. */
static uint32_t *plan_shards(const ck_index *ix, const plan *p, uint64_t max, uint32_t *nshards)
{
    uint32_t *first = malloc(((size_t)p->nwrite + 2) * sizeof *first), n = 0;
    uint64_t size = 0;
    if (!first)
        return NULL;
    first[n++] = 0;
    for (uint32_t k = 0; k < p->nwrite; k++) {
        uint64_t b = ix->entries[p->write[k]].nbytes;
        if (k > first[n - 1] && size + b > max)
            first[n++] = k, size = 0;
        size += b;
    }
    first[n] = p->nwrite;
    *nshards = n;
    return first;
}

/* Shard s (from 0) of n, named as transformers names them. */
static void shard_name(char *buf, size_t size, uint32_t s, uint32_t n)
{
    snprintf(buf, size, "model-%05u-of-%05u.safetensors", s + 1, n);
}

/* model.safetensors.index.json: total size and which shard holds each tensor. */
static char *index_json(const ck_index *ix, const plan *p, const uint32_t *first, uint32_t n)
{
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_CreateObject(), *map = cJSON_CreateObject();
    char *text = NULL, name[64];
    if (!root || !meta || !map) {
        cJSON_Delete(root), cJSON_Delete(meta), cJSON_Delete(map);
        return NULL;
    }
    cJSON_AddItemToObject(meta, "total_size", ck_json_uint(p->total));
    cJSON_AddItemToObject(root, "metadata", meta);
    cJSON_AddItemToObject(root, "weight_map", map);
    for (uint32_t s = 0; s < n; s++) {
        shard_name(name, sizeof name, s, n);
        for (uint32_t k = first[s]; k < first[s + 1]; k++)
            cJSON_AddItemToObject(map, ix->entries[p->write[k]].name, cJSON_CreateString(name));
    }
    text = cJSON_Print(root);
    cJSON_Delete(root);
    return text;
}

static int write_sharded(const ck_index *ix, const plan *p, const options *o)
{
    uint32_t n, *first = plan_shards(ix, p, o->max_shard, &n);
    char *json = first ? index_json(ix, p, first, n) : NULL, name[64];
    ck_out_dir d;
    int rc = -1;
    if (!json)
        fprintf(stderr, "ckpt: out of memory\n");
    else if (ck_out_dir_begin(&d, o->out, p->total, "convert", o->out_flags) == 0) {
        rc = 0;
        for (uint32_t s = 0; s < n && rc == 0; s++) {
            ck_synth *sy;
            shard_name(name, sizeof name, s, n);
            if (synth_part(ix, p, p->write + first[s], first[s + 1] - first[s], &sy) != 0) {
                ck_out_dir_abort(&d);
                rc = -1;
                break;
            }
            rc = ck_out_dir_add(&d, name, sy);
            ck_synth_free(sy);
        }
        if (rc == 0)
            rc = ck_out_dir_add_bytes(&d, "model.safetensors.index.json", json, strlen(json));
        if (rc == 0)
            rc = ck_out_dir_commit(&d);
    }
    free(json);
    free(first);
    return rc;
}

static int convert(const ck_index *ix, const options *o)
{
    ck_synth *sy;
    ck_error err;
    plan p;
    int rc = -1;
    if (o->pack) {
        if (ck_synth_pack(ix, o->only, &sy, &err) != 0)
            fprintf(stderr, "ckpt: %s\n", err.msg);
        else
            rc = ck_out_file(sy, o->out, "convert", o->out_flags), ck_synth_free(sy);
        return rc;
    }
    if (make_plan(ix, o, &p) != 0)
        return -1;
    if (o->max_shard)
        rc = write_sharded(ix, &p, o);
    else if (synth_part(ix, &p, p.write, p.nwrite, &sy) == 0)
        rc = ck_out_file(sy, o->out, "convert", o->out_flags), ck_synth_free(sy);
    plan_free(&p);
    return rc;
}

static int cmd_convert(int argc, char **argv, http_remote *remote)
{
    options o;
    int rc = parse_args(argc, argv, &o);
    char *file = NULL; /* a file output's path: OUT, or a file in the directory OUT */
    if (rc == 0 && !o.max_shard &&
        !(file = ck_out_file_path(o.out, o.pack ? "model.pack" : "model.safetensors")))
        rc = 1;
    if (file)
        o.out = file;
    ck_index *ix;
    if (rc == 0 && cli_open_source(remote, o.source, &ix) != 0)
        rc = 1;
    if (rc == 0 && ck_out_spares_sources(o.out, o.max_shard != 0, ix) != 0) {
        ck_index_free(ix);
        rc = 1;
    }
    if (rc == 0) {
        ck_progress_catch_signals();
        signal(SIGXFSZ, SIG_IGN); /* past a file size limit: EFBIG, and the temp output goes */
        rc = convert(ix, &o) != 0;
        ck_index_free(ix);
    }
    options_free(&o);
    free(file);
    return rc;
}

const ck_command ckpt_convert = {"convert", convert_usage, convert_help, convert_options,
                                 cmd_convert};
