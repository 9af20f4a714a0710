/* choose.c — ck_choose (choose.h): a directory's checkpoint files from their names. */
#include "choose.h"
#include "../formats/dcp.h"

#include <stdlib.h>
#include <string.h>

/* Files beside the weights that hold none: what vLLM's loader leaves out
 * (filter_files_not_needed_for_inference), so that a fine-tuning run's directory loads. */
static const char *const no_weights[] = {"training_args.bin", "optimizer.bin", "optimizer.pt",
                                         "scheduler.pt", "scaler.pt"};

/* The kinds of rule 8, a checkpoint of one file. */
static const char *const one_file[] = {".pth", ".ckpt", ".npz", ".npy", ".pt2", ".pack"};

static int ends(const char *name, const char *suffix)
{
    size_t n = strlen(name), k = strlen(suffix);
    return n > k && strcmp(name + n - k, suffix) == 0;
}

/* Whether name is a file of the directory itself that the rule may pick. */
static int candidate(const char *name)
{
    if (strchr(name, '/'))
        return 0;
    if (name[0] == '.')
        return strcmp(name, DCP_METADATA) == 0;
    for (size_t i = 0; i < sizeof no_weights / sizeof *no_weights; i++)
        if (strcmp(name, no_weights[i]) == 0)
            return 0;
    return 1;
}

static int by_name(const void *a, const void *b, void *names)
{
    const char *const *v = names;
    return strcmp(v[*(const size_t *)a], v[*(const size_t *)b]);
}

/* The candidates named exactly name (k = 0 or 1), or ending in suffix, into c->picked, in name
 * order: their count. */
static size_t pick(const char *const *names, size_t n, const char *name, const char *suffix,
                   ck_choice *c)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (candidate(names[i]) &&
            (name ? strcmp(names[i], name) == 0 : ends(names[i], suffix)))
            c->picked[k++] = i;
    if (name && k > 1) /* a listing that repeats a name: the file once */
        k = 1;
    qsort_r(c->picked, k, sizeof *c->picked, by_name, (void *)names);
    return k;
}

/* Rule 7: of k GGUF files in c->picked, the one to open. */
static int pick_gguf(const char *const *names, size_t k, const char *where, ck_choice *c,
                     ck_error *err)
{
    c->kind = CK_CHOSE_GGUF;
    c->n = k;
    if (k == 1)
        return 0;
    size_t firsts = 0, first = 0;
    for (size_t i = 0; i < k; i++) {
        const char *m = strstr(names[c->picked[i]], "-00001-of-");
        if (m && strlen(m) == strlen("-00001-of-00000.gguf")) {
            first = c->picked[i];
            firsts++;
        }
    }
    if (firsts != 1)
        return ck_fail(err, where, "holds %zu GGUF files that are not one split set (%zu first "
                       "splits named *-00001-of-*.gguf): name one, %s/FILE", k, firsts, where);
    /* Every other one a split of the same stem and count: PREFIX-0000K-of-0000N.gguf. */
    size_t stem = strlen(names[first]) - strlen("-00001-of-00000.gguf");
    const char *of = names[first] + stem + 6; /* "-of-NNNNN.gguf" */
    for (size_t i = 0; i < k; i++) {
        const char *name = names[c->picked[i]];
        if (strlen(name) != stem + 20 || memcmp(name, names[first], stem) ||
            strcmp(name + stem + 6, of))
            return ck_fail(err, where, "'%s' is not part of the split set of '%s'", name,
                           names[first]);
    }
    c->picked[0] = first;
    return 0;
}

int ck_choose(const char *const *names, size_t n, const char *where, ck_choice *c,
              ck_error *err)
{
    *c = (ck_choice){0};
    if (!(c->picked = malloc((n ? n : 1) * sizeof *c->picked)))
        return ck_fail(err, where, "out of memory");
    /* Rules 1 to 6, in order: an exact name (an index) or a suffix (a set). */
    static const struct {
        const char *name, *suffix;
        enum ck_choice_kind kind;
    } rules[] = {
        {DCP_METADATA, NULL, CK_CHOSE_DCP},
        {"model.safetensors.index.json", NULL, CK_CHOSE_INDEX},
        {NULL, ".safetensors", CK_CHOSE_FILES},
        {"pytorch_model.bin.index.json", NULL, CK_CHOSE_INDEX},
        {NULL, ".bin", CK_CHOSE_FILES},
        {NULL, ".pt", CK_CHOSE_FILES},
    };
    for (size_t r = 0; r < sizeof rules / sizeof *rules; r++)
        if ((c->n = pick(names, n, rules[r].name, rules[r].suffix, c))) {
            c->kind = rules[r].kind;
            return 0;
        }
    size_t k = pick(names, n, NULL, ".gguf", c);
    int rc = 0;
    if (k) {
        rc = pick_gguf(names, k, where, c, err);
    } else {
        for (size_t i = 0; i < n; i++)
            for (size_t s = 0; s < sizeof one_file / sizeof *one_file; s++)
                if (candidate(names[i]) && ends(names[i], one_file[s]))
                    c->picked[k++] = i;
        qsort_r(c->picked, k, sizeof *c->picked, by_name, (void *)names);
        c->kind = CK_CHOSE_FILES;
        c->n = k;
        if (k == 0)
            rc = ck_fail(err, where, "holds no checkpoint file (*.safetensors, *.bin, *.pt, "
                         "*.gguf, an index of shards or a DCP .metadata)");
        else if (k > 1)
            rc = ck_fail(err, where, "holds several checkpoint files (%s, %s, ...): name one, "
                         "%s/FILE", names[c->picked[0]], names[c->picked[1]], where);
    }
    if (rc)
        ck_choice_free(c);
    return rc;
}

void ck_choice_free(ck_choice *c)
{
    free(c->picked);
    *c = (ck_choice){0};
}
