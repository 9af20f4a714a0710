/* cat.c — `ckpt cat`: one tensor's bytes (or a value's text) on stdout, optionally behind a
 * NumPy header; a miss names the nearest names (commands.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../views/view.h"
#include "../base/names.h"
#include "../formats/npy.h"
#include "../checkpoint/open.h"
#include "cli.h"
#include "commands.h"

/* Writes n bytes of buf to stdout. */
static int write_out(const char *buf, size_t n)
{
    int rc = ck_write_all(1, buf, n);
    if (rc)
        fprintf(stderr, "ckpt: stdout: %s\n", strerror(-rc));
    return rc ? -1 : 0;
}

static int write_entry(const ck_index *ix, const ck_entry *e, const char *source)
{
    enum { CHUNK = 1 << 20 };
    char *buf = malloc(CHUNK);
    if (!buf) {
        fprintf(stderr, "ckpt: out of memory\n");
        return -1;
    }
    int rc = 0;
    for (uint64_t off = 0; off < e->nbytes && rc == 0;) {
        ssize_t n = ck_entry_read(ix, e, buf, CHUNK, off);
        if (n <= 0) {
            char shown[CK_SHOWN_MAX];
            const char *fault = ck_entry_fault(e);
            fprintf(stderr, "ckpt: %s: cannot read tensor '%s': %s\n",
                    ck_location_shown(source, shown, sizeof shown), e->name,
                    fault ? fault : strerror(n < 0 ? (int)-n : EIO));
            rc = -1;
        }
        if (rc == 0)
            rc = write_out(buf, (size_t)n);
        off += n > 0 ? (uint64_t)n : 0;
    }
    free(buf);
    return rc;
}

enum { CAT_NPY };
static const ck_option cat_options[] = {
    {"npy", NULL, "a NumPy .npy header first (as NAME.npy in a mount made with -o npy)", 0},
    {NULL, NULL, NULL, 0}};

/* The entry that name names in ix: by its name, else by its path in a mount ("a/b/c", as `ls
 * -R` shows it under the mountpoint, escapes and all); NULL when neither. */
static const ck_entry *entry_named(const ck_index *ix, const char *name)
{
    const ck_entry *e = ck_index_find(ix, name);
    ck_tree *t;
    ck_error err;
    if (e || !strchr(name, '/') || ck_tree_build(ix, NULL, NULL, 0, &t, &err) != 0)
        return e;
    uint32_t node = 0;
    for (const char *p = name; node != CK_NO_NODE && *p;) {
        size_t n = strcspn(p, "/");
        if (n)
            node = ck_tree_lookup(t, node, p, n);
        p += n + (p[n] == '/');
    }
    if (node != CK_NO_NODE &&
        (t->nodes[node].kind == CK_NODE_TENSOR || t->nodes[node].kind == CK_NODE_VALUE))
        e = &ix->entries[t->nodes[node].id];
    ck_tree_free(t);
    return e;
}

/* What to say after a miss of name: the first three names it selects as a prefix (enc.w for
 * "enc", the mount's directory), else the (up to) three names of ix nearest to it, within three
 * edits; "" when none. */
static void suggest(const ck_index *ix, const char *name, char *buf, size_t cap)
{
    enum { SHOW = 3, FAR = 3 };
    const ck_entry *best[SHOW + 1] = {0};
    size_t dist[SHOW] = {FAR + 1, FAR + 1, FAR + 1}, len = strlen(name), under = 0;
    for (size_t i = 0; i < ix->nentries && under <= SHOW; i++)
        if (ck_name_selected(ix->entries[i].name, ix->entries[i].name_len, name))
            best[under++] = &ix->entries[i];
    for (size_t i = 0; !under && i < ix->nentries; i++) {
        const ck_entry *e = &ix->entries[i];
        size_t d = ck_name_distance(name, len, e->name, e->name_len, FAR);
        for (size_t k = 0; k < SHOW && d <= FAR; k++)
            if (d < dist[k]) { /* insert at k */
                memmove(&best[k + 1], &best[k], (SHOW - 1 - k) * sizeof *best);
                memmove(&dist[k + 1], &dist[k], (SHOW - 1 - k) * sizeof *dist);
                best[k] = e, dist[k] = d;
                break;
            }
    }
    const char *lead = under ? " (under it: " : " (did you mean ";
    size_t used = 0;
    buf[0] = 0;
    for (size_t k = 0; k < SHOW && best[k] && used < cap; k++)
        used += (size_t)snprintf(buf + used, cap - used, "%s'%.80s'", k ? ", " : lead,
                                 best[k]->name);
    if (used && used < cap)
        snprintf(buf + used, cap - used, "%s", under > SHOW ? ", ...)" : under ? ")" : "?)");
}

/* `ckpt cat [--npy] SOURCE NAME`: NAME a tensor's or a value's name, or its path in a mount;
 * with --npy, a tensor's NumPy header first, as the mount's NAME.npy view (ckptfs -o npy) has
 * it (npy_header_make owns it). A NAME that begins with '-' comes after "--". */
static int cmd_cat(int argc, char **argv, http_remote *remote)
{
    const char *args[2], *val;
    int nargs = 0, npy = 0, k;
    ck_opts p;
    ck_opts_init(&p, "cat", cat_options, argc, argv);
    while ((k = ck_opts_next(&p, &val)) != CK_OPT_END) {
        if (k == CK_OPT_ERROR)
            return CK_USAGE;
        if (k == CAT_NPY)
            npy = 1;
        else if (nargs < 2)
            args[nargs++] = val;
        else
            return ck_usage_error("cat", "need SOURCE and NAME");
    }
    if (nargs != 2)
        return ck_usage_error("cat", "need SOURCE and NAME");
    ck_index *ix;
    if (cli_open_source(remote, args[0], &ix) != 0)
        return 1;
    const ck_entry *e = entry_named(ix, args[1]);
    unsigned char head[NPY_MAKE_MAX];
    char shown[CK_SHOWN_MAX], hint[400];
    int raw, rc = 1;
    ck_location_shown(args[0], shown, sizeof shown);
    if (!e) {
        char dotted[CK_DISTANCE_MAX_LEN + 1]; /* a path's suggestions: as a name ('/' as '.') */
        snprintf(dotted, sizeof dotted, "%s", args[1] + (args[1][0] == '/'));
        for (char *c = dotted; (c = strchr(c, '/'));)
            *c = '.';
        suggest(ix, dotted, hint, sizeof hint);
        fprintf(stderr, "ckpt: %s: no tensor or value named '%s'%s\n", shown, args[1], hint);
    } else if (npy && e->kind != CK_TENSOR) {
        fprintf(stderr, "ckpt: %s: '%s' is a value, not a tensor: --npy is for tensors\n", shown,
                e->name);
    } else if (!npy || write_out((const char *)head, npy_header_make(e->dtype, e->rank, e->shape,
                                                                     e->nbytes, head, &raw)) == 0) {
        rc = write_entry(ix, e, args[0]) != 0;
    }
    ck_index_free(ix);
    return rc;
}

const ck_command ckpt_cat = {
    "cat", "ckpt cat [--npy] SOURCE NAME",
    "Writes the bytes of tensor NAME to stdout: row-major, little-endian, no header (the same\n"
    "bytes as the tensor's file in a mount); a value (a pickle's epoch, a DCP step) as the\n"
    "mount's text. NAME is a name or its path in a mount (model/h/0/ln_1/weight); a miss\n"
    "names the nearest names. A NAME that begins with '-' goes after \"--\". --npy puts a\n"
    "NumPy .npy header in front (the same bytes as NAME.npy in a mount made with -o npy), so\n"
    "that np.load reads it.",
    cat_options, cmd_cat};
