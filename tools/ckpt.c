/* ckpt — the checkpoint tool: the same readers as the mount, without mounting anything.
 * Every command prints one line "ckpt: ..." on stderr and exits 1 on failure, 2 on bad usage.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../views/view.h"
#include "../base/names.h"
#include "../formats/npy.h"
#include "../checkpoint/open.h"
#include "../formats/packfile.h"
#include "../loader/ckload.h"
#include "../checkpoint/synth.h"
#include "cli.h"
#include "commands.h"
#include "options.h"
#include "outfile.h"
#include "progress.h"

#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <xxhash.h>

typedef struct ck_command {
    const char *name;
    const char *usage;
    const char *help;
    const ck_option *options;
    int (*run)(int argc, char **argv, http_remote *remote); /* remote: cli.h */
} ck_command;

static const ck_command *find_command(const char *name);

/* Whether argv (a command's arguments) asks for help: -h or --help, before any "--". */
static int wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
            return 1;
    return 0;
}

/* The table of ls: for people (a terminal), a header and sizes as "1.5 MiB"; for scripts, the
 * same columns with sizes in bytes and no header. */
static void print_table(const ck_index *ix, const uint32_t *alias_of, int people, int bytes)
{
    char shape[1400], size[32];
    if (people)
        printf("NAME\tDTYPE\tSHAPE\tSIZE\tOFFSET%s\n", ix->nfiles > 1 ? "\tFILE" : "");
    for (size_t i = 0; i < ix->nentries; i++) {
        const ck_entry *e = &ix->entries[i];
        if (e->kind != CK_TENSOR)
            continue;
        ck_view_shape_json(e, shape, sizeof shape);
        if (people && !bytes)
            ck_size_human(e->nbytes, size, sizeof size);
        else
            snprintf(size, sizeof size, "%llu", (unsigned long long)e->nbytes);
        cli_print_name(e->name, e->name_len);
        printf("\t%s\t%s\t%s\t", ck_dtype_name(e->dtype), shape, size);
        if (e->layout == CK_CONTIGUOUS)
            printf("%llu", (unsigned long long)e->ext.offset);
        else
            printf("-");
        if (ix->nfiles > 1)
            printf("\t%s", ix->files[e->ext.file].path);
        if (alias_of[i] != UINT32_MAX) { /* tied: the name whose storage it shares */
            printf("\talias of ");
            cli_print_name(ix->entries[alias_of[i]].name, ix->entries[alias_of[i]].name_len);
        }
        putchar('\n');
    }
    for (size_t i = 0; i < ix->nomitted; i++) { /* left out: no tensor */
        cli_print_name(ix->omitted[i].name, strlen(ix->omitted[i].name));
        printf("\tomitted\t%s\n", ix->omitted[i].reason);
    }
}

static int print_json(const ck_index *ix, const uint32_t *alias_of, const char *source)
{
    ck_error err;
    ck_tree *tree;
    if (ck_tree_build(ix, NULL, NULL, 0, &tree, &err) != 0) {
        fprintf(stderr, "ckpt: %s\n", err.msg);
        return -1;
    }
    ck_text json;
    int rc = ck_view_index_json(ix, tree, alias_of, 1, &json);
    ck_tree_free(tree);
    if (rc) {
        char shown[CK_SHOWN_MAX];
        fprintf(stderr, "ckpt: %s: out of memory\n", ck_location_shown(source, shown, sizeof shown));
        return -1;
    }
    ck_text_write(&json, stdout);
    putchar('\n');
    ck_text_free(&json);
    return 0;
}

/* What opening a URL source took, on stderr: the listing on stdout stays as it is. */
static void report_requests(const ck_index *ix, const char *source)
{
    uint64_t requests = 0, bytes = 0;
    char shown[CK_SHOWN_MAX];
    for (uint32_t i = 0; i < ix->nfiles; i++) {
        uint64_t r, b;
        ck_file_stats(&ix->files[i], &r, &b);
        requests += r;
        bytes += b;
    }
    fprintf(stderr, "ckpt: %s: %llu requests, %llu bytes for the headers of %u file%s\n",
            ck_location_shown(source, shown, sizeof shown), (unsigned long long)requests,
            (unsigned long long)bytes, ix->nfiles, ix->nfiles == 1 ? "" : "s");
}

enum { LS_JSON, LS_BYTES };
static const ck_option ls_options[] = {
    {"json", NULL, "the mount's index.json, with \"file\" and \"offset\" for each tensor", 0},
    {"bytes", NULL, "sizes in bytes on a terminal too (in a pipe they always are)", 0},
    {NULL, NULL, NULL, 0}};

static int cmd_ls(int argc, char **argv, http_remote *remote)
{
    int json = 0, bytes = 0, k;
    const char *source = NULL, *val;
    ck_opts p;
    ck_opts_init(&p, "ls", ls_options, argc, argv);
    while ((k = ck_opts_next(&p, &val)) != CK_OPT_END) {
        if (k == CK_OPT_ERROR)
            return CK_USAGE;
        if (k == LS_JSON)
            json = 1;
        else if (k == LS_BYTES)
            bytes = 1;
        else if (source)
            return ck_usage_error("ls", "one SOURCE only");
        else
            source = val;
    }
    if (!source)
        return ck_usage_error("ls", "missing SOURCE");
    ck_index *ix;
    if (cli_open_source(remote, source, &ix) != 0)
        return 1;
    ck_error err;
    uint32_t *alias_of = ck_synth_aliases(ix, &err);
    int rc = alias_of ? 0 : (fprintf(stderr, "ckpt: %s\n", err.msg), -1);
    if (alias_of && json)
        rc = print_json(ix, alias_of, source);
    else if (alias_of)
        print_table(ix, alias_of, isatty(STDOUT_FILENO), bytes);
    free(alias_of);
    if (ck_location_is_url(source))
        report_requests(ix, source);
    ck_index_free(ix);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "ckpt: stdout: %s\n", strerror(errno));
        return 1;
    }
    return rc ? 1 : 0;
}

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

enum { PACK_ONLY, PACK_VERBOSE };
static const ck_option pack_options[] = {
    {"only", "P", CK_ONLY_HELP, 0},
    {"verbose", NULL, "say what was written, in a pipe too (a terminal is told anyway)", 'v'},
    {NULL, NULL, NULL, 0}};

static int cmd_pack(int argc, char **argv, http_remote *remote)
{
    const char *only = NULL, *args[2], *val;
    int nargs = 0, k, flags = ck_out_say_default();
    ck_opts p;
    ck_opts_init(&p, "pack", pack_options, argc, argv);
    while ((k = ck_opts_next(&p, &val)) != CK_OPT_END) {
        if (k == CK_OPT_ERROR)
            return CK_USAGE;
        if (k == PACK_ONLY)
            only = val;
        else if (k == PACK_VERBOSE)
            flags |= CK_OUT_SAY;
        else if (nargs == 2)
            return ck_usage_error("pack", "need SOURCE and OUT only");
        else
            args[nargs++] = val;
    }
    if (nargs != 2)
        return ck_usage_error("pack", "need SOURCE and OUT");
    char *out = ck_out_file_path(args[1], "model.pack");
    ck_index *ix;
    if (!out || cli_open_source(remote, args[0], &ix) != 0) {
        free(out);
        return 1;
    }
    if (ck_out_spares_sources(out, 0, ix) != 0) {
        ck_index_free(ix);
        free(out);
        return 1;
    }
    ck_error err;
    ck_synth *sy;
    int rc = 1;
    if (ck_synth_pack(ix, only, &sy, &err) != 0) {
        fprintf(stderr, "ckpt: %s\n", err.msg);
    } else {
        ck_progress_catch_signals();
        signal(SIGXFSZ, SIG_IGN); /* past a file size limit: EFBIG, and the temp file goes */
        rc = ck_out_file(sy, out, "pack", flags) != 0;
        ck_synth_free(sy);
    }
    ck_index_free(ix);
    free(out);
    return rc;
}

/* XXH3 of file bytes [off, off + len), read into buf (n bytes at a time); the bar counts them
 * into *done. 0, or -errno (-ECANCELED when a signal stops it). */
static int hash_range(const ck_file *f, uint64_t off, uint64_t len, unsigned char *buf, size_t n,
                      uint64_t *sum, ck_bar *bar, uint64_t *done, uint64_t total)
{
    XXH3_state_t *st = XXH3_createState();
    int rc = st ? 0 : -ENOMEM;
    if (st)
        XXH3_64bits_reset(st);
    for (uint64_t at = 0; at < len && rc == 0; at += n) {
        size_t k = len - at < n ? (size_t)(len - at) : n;
        rc = ck_file_read(f, buf, k, off + at);
        if (rc == 0)
            XXH3_64bits_update(st, buf, k);
        *done += k;
        if (rc == 0 && ck_progress_tick(bar, *done, total))
            rc = -ECANCELED;
    }
    if (rc == 0)
        *sum = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return rc;
}

/* Hashes the blobs where the pack's layout (checked at open) puts them, in file order, up to
 * the first whose sum is not the stored one: *bad is its number, or nblobs when all match.
 * 0, or -errno. */
static int first_mismatch(const ck_index *ix, const pack_layout *pl, const uint64_t *stored,
                          uint32_t *bad)
{
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = malloc(CHUNK);
    uint64_t total = 0, done = 0, sum = 0;
    for (uint32_t b = 0; b < pl->nblobs; b++)
        total += pl->blobs[b].length;
    int rc = buf ? 0 : -ENOMEM;
    ck_bar bar;
    ck_bar_start(&bar, "verify");
    for (*bad = 0; rc == 0 && *bad < pl->nblobs; ++*bad) {
        const pack_blob *blob = &pl->blobs[*bad];
        rc = hash_range(&ix->files[pl->file], blob->offset, blob->length, buf, CHUNK, &sum,
                        &bar, &done, total);
        if (rc == 0 && sum != stored[*bad])
            break;
    }
    ck_bar_end(&bar);
    free(buf);
    return rc;
}

/* Recomputes every blob checksum and names the first tensor whose bytes do not match; path is
 * the pack as shown. */
static int verify_pack(const ck_index *ix, const char *path)
{
    const pack_layout *pl = pack_layout_of(ix, 0);
    uint64_t *stored = malloc(((size_t)pl->nblobs + 1) * sizeof *stored);
    uint32_t bad = 0;
    int rc = stored ? pack_read_trailer(ix, pl->file, pl->nblobs, stored) : -ENOMEM;
    if (rc == -EBADMSG)
        fprintf(stderr, "ckpt: %s: the checksum table is corrupt\n", path);
    else if (rc != 0)
        fprintf(stderr, "ckpt: %s: cannot read the checksum table: %s\n", path, strerror(-rc));
    else if ((rc = first_mismatch(ix, pl, stored, &bad)) != 0)
        fprintf(stderr, "ckpt: %s: %s\n", path, rc == -ECANCELED ? "interrupted" : strerror(-rc));
    else if (bad < pl->nblobs) {
        fprintf(stderr, "ckpt: %s: tensor '%s': checksum mismatch (data at byte %llu)\n", path,
                ix->entries[pl->first_entry + pl->blob_entry[bad]].name,
                (unsigned long long)pl->blobs[bad].offset);
        rc = -1;
    } else {
        printf("%s: %u blobs, %zu entries: every checksum matches\n", path, pl->nblobs,
               ix->nentries);
    }
    free(stored);
    return rc;
}

static const ck_option no_options[] = {{NULL, NULL, NULL, 0}};

static int cmd_verify(int argc, char **argv, http_remote *remote)
{
    const char *path = NULL, *val;
    int k;
    ck_opts p;
    ck_opts_init(&p, "verify", no_options, argc, argv);
    while ((k = ck_opts_next(&p, &val)) != CK_OPT_END) {
        if (k == CK_OPT_ERROR)
            return CK_USAGE;
        if (path)
            return ck_usage_error("verify", "need one FILE.pack");
        path = val;
    }
    if (!path)
        return ck_usage_error("verify", "need one FILE.pack");
    ck_index *ix;
    if (cli_open_source(remote, path, &ix) != 0)
        return 1;
    char shown[CK_SHOWN_MAX];
    ck_location_shown(path, shown, sizeof shown);
    int rc = 1;
    if (!pack_layout_of(ix, 0)) {
        fprintf(stderr, "ckpt: %s: not a pack (it is %s)\n", shown, ix->format);
    } else {
        ck_progress_catch_signals();
        rc = verify_pack(ix, shown) != 0;
    }
    ck_index_free(ix);
    return rc;
}

static int parse_device(const char *s, ckl_options *o)
{
    char *end;
    if (strcmp(s, "cpu") == 0)
        o->device = CKL_CPU;
    else if (strcmp(s, "auto") == 0)
        o->device = CKL_AUTO;
    else if (strcmp(s, "cuda") == 0)
        o->device = CKL_CUDA;
    else if (strncmp(s, "cuda:", 5) == 0 && s[5] >= '0' && s[5] <= '9' &&
             (o->cuda_device = (int)strtol(s + 5, &end, 10), !*end))
        o->device = CKL_CUDA;
    else
        return -1;
    return 0;
}

static double seconds_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Waits for the load, drawing the bar; 0, or -1 after printing why it failed. */
static int finish_load(ckl_load *l)
{
    char err[PATH_MAX + 512]; /* libckload's message fits in the path's length + 512 */
    ck_bar bar;
    ck_bar_start(&bar, "load");
    uint64_t total = ckl_total_bytes(l);
    int rc;
    while ((rc = ckl_wait_all_for(l, 100, err, sizeof err)) == 1 &&
           !ck_progress_tick(&bar, ckl_done_bytes(l), total))
        ;
    if (rc == 0)
        ck_progress_tick(&bar, total, total);
    ck_bar_end(&bar);
    if (rc < 0)
        fprintf(stderr, "ckpt: %s\n", err);
    else if (rc == 1)
        fprintf(stderr, "ckpt: load: interrupted\n");
    return rc ? -1 : 0;
}

/* ckl_read_path in words. */
static const char *read_path_words(const char *rp)
{
    return strcmp(rp, "bypass") == 0  ? "read from the sources, bypassing the mount"
           : strcmp(rp, "mount") == 0 ? "read through the mount"
           : strcmp(rp, "pack") == 0  ? "read from the pack"
                                      : "read from the source";
}

/* A rank or a world size: decimal digits only (0 included, which ck_parse_size cannot tell from an
 * error), at most CKL_MAX_WORLD_SIZE. 0, or -1. */
static int plain_count(const char *s, unsigned *out)
{
    if (!*s || strspn(s, "0123456789") != strlen(s) || strlen(s) > 7)
        return -1;
    unsigned long v = strtoul(s, NULL, 10);
    if (v > CKL_MAX_WORLD_SIZE)
        return -1;
    *out = (unsigned)v;
    return 0;
}

/* A --slice GLOB:DIM rule into *r: DIM after the last ':', -1 (whole) or a dimension up to
 * CKL_MAX_SLICE_DIM. 0, or -1 when it is not so. */
static int parse_slice(char *val, ckl_slice *r)
{
    char *colon = strrchr(val, ':'), *end;
    long dim = colon && colon > val ? strtol(colon + 1, &end, 10) : -2;
    if (dim < -1 || dim > CKL_MAX_SLICE_DIM || !colon[1] || *end)
        return -1;
    *colon = 0;
    *r = (ckl_slice){.glob = val, .dim = (int)dim};
    return 0;
}

enum { LOAD_DEVICE, LOAD_THREADS, LOAD_BUFFERS, LOAD_BUFFER_SIZE, LOAD_ONLY, LOAD_VERIFY,
       LOAD_SLICE, LOAD_RANK, LOAD_WORLD_SIZE };
static const ck_option load_options[] = {
    {"device", "D", "cpu, cuda, cuda:N or auto (CUDA when a device is usable; the default)", 0},
    {"threads", "T", "reader threads", 0},
    {"buffers", "N", "pinned staging buffers per thread, for CUDA (default 2)", 0},
    {"buffer-size", "S", "bytes read at a time (K, M, G suffixes)", 0},
    {"only", "P", CK_ONLY_HELP, 0},
    {"verify", NULL, "a pack's checksums as the bytes stream; for other sources, that each\n"
                     "file is unchanged after its bytes are read", 0},
    {"slice", "GLOB:DIM", "rank R's part of the tensors GLOB selects, cut along DIM (-1:\n"
                          "whole) into W parts as torch.chunk cuts; repeats, the first that\n"
                          "selects a name decides", 0},
    {"rank", "R", "the part --slice loads (default 0)", 0},
    {"world-size", "W", "the parts --slice cuts (default 1)", 0},
    {NULL, NULL, NULL, 0}};

/* The value of a numeric option of load, from lo to hi: 0, or CK_USAGE after saying why. */
static int load_count(const ck_opts *p, int k, const char *val, uint64_t lo, uint64_t hi,
                      uint64_t *out)
{
    uint64_t n = ck_parse_size(val, 0);
    if (n >= lo && n <= hi) {
        *out = n;
        return 0;
    }
    char what[96];
    snprintf(what, sizeof what, "a %s from %llu to %llu",
             k == LOAD_BUFFER_SIZE ? "size" : "count", (unsigned long long)lo,
             (unsigned long long)hi);
    return ck_opts_bad_value(p, k, val, what);
}

/* One option of ckpt load into o (slices: room for max rules); 0, or CK_USAGE. */
static int load_option(const ck_opts *p, int k, const char *val, ckl_options *o,
                       ckl_slice *slices, unsigned max)
{
    uint64_t n = 0;
    switch (k) {
    case LOAD_DEVICE:
        return parse_device(val, o) == 0 ? 0
                                         : ck_opts_bad_value(p, k, val, "cpu, cuda, cuda:N or auto");
    case LOAD_THREADS:
        return load_count(p, k, val, 1, CKL_MAX_THREADS, &n) ? CK_USAGE
                                                            : (o->threads = (unsigned)n, 0);
    case LOAD_BUFFERS:
        return load_count(p, k, val, 1, CKL_MAX_BUFFERS, &n) ? CK_USAGE
                                                            : (o->buffers = (unsigned)n, 0);
    case LOAD_BUFFER_SIZE:
        return load_count(p, k, val, CKL_MIN_BUFFER_SIZE, CKL_MAX_BUFFER_SIZE, &n)
                   ? CK_USAGE : (o->buffer_size = (size_t)n, 0);
    case LOAD_ONLY:
        o->only = val;
        return 0;
    case LOAD_VERIFY:
        o->verify = 1;
        return 0;
    case LOAD_SLICE:
        if (o->nslices == max)
            return ck_opts_bad_value(p, k, val, "allowed: too many rules");
        return parse_slice((char *)val, &slices[o->nslices]) == 0 /* argv's own bytes */
                   ? (o->nslices++, 0)
                   : ck_opts_bad_value(p, k, val, "GLOB:DIM with DIM from -1 (whole) to 63");
    case LOAD_RANK:
        return plain_count(val, &o->rank) == 0
                   ? 0 : ck_opts_bad_value(p, k, val, "a rank from 0 to 1048576");
    default: /* LOAD_WORLD_SIZE */
        return plain_count(val, &o->world_size) == 0 && o->world_size
                   ? 0 : ck_opts_bad_value(p, k, val, "a world size from 1 to 1048576");
    }
}

static int cmd_load(int argc, char **argv, http_remote *remote)
{
    (void)remote; /* libckload opens SOURCE itself */
    ckl_options o;
    ckl_default_options(&o);
    const char *path = NULL, *val;
    enum { MAX_SLICES = 64 };
    ckl_slice slices[MAX_SLICES];
    o.slices = slices;
    int k;
    ck_opts p;
    ck_opts_init(&p, "load", load_options, argc, argv);
    while ((k = ck_opts_next(&p, &val)) != CK_OPT_END) {
        if (k == CK_OPT_ERROR)
            return CK_USAGE;
        if (k >= 0 && load_option(&p, k, val, &o, slices, MAX_SLICES) != 0)
            return CK_USAGE;
        if (k == CK_OPT_OPERAND && path)
            return ck_usage_error("load", "one SOURCE only");
        if (k == CK_OPT_OPERAND)
            path = val;
    }
    if (!path)
        return ck_usage_error("load", "missing SOURCE");
    char err[PATH_MAX + 512];
    ckl_load *l;
    double t0 = seconds_now();
    if (ckl_load_start(path, &o, &l, err, sizeof err) != 0) {
        fprintf(stderr, "ckpt: %s\n", err);
        return 1;
    }
    ck_progress_catch_signals();
    int rc = finish_load(l);
    double dt = seconds_now() - t0;
    if (rc == 0) {
        uint64_t bytes = ckl_total_bytes(l);
        char dev[32] = "cpu";
        if (ckl_device_of(l) == CKL_CUDA)
            snprintf(dev, sizeof dev, "cuda:%d", ckl_cuda_ordinal(l));
        const char *rp = ckl_read_path(l);
        int sums = strcmp(rp, "pack") == 0 || strcmp(rp, "mount") == 0; /* the pack read */
        char shown[CK_SHOWN_MAX];
        printf("%s: %zu tensors, %llu bytes into %s in %.3f s (%.2f GB/s), %s%s\n",
               ck_location_shown(path, shown, sizeof shown), ckl_count(l),
               (unsigned long long)bytes, dev, dt,
               dt > 0 ? (double)bytes / dt / 1e9 : 0.0, read_path_words(rp),
               !o.verify ? "" : sums ? ", checksums match" : ", sources unchanged");
    }
    ckl_release(l);
    return rc != 0;
}

enum { SERVE_DEVICE, SERVE_SOCKET, SERVE_GROUP, SERVE_ONLY, SERVE_VERIFY };
static const ck_option serve_options[] = {
    {"device", "D", "cuda or cuda:N (default cuda: cuda:0)", 0},
    {"socket", "PATH", "the Unix socket clients attach to (default $XDG_RUNTIME_DIR/ckload.sock, "
                       "else $TMPDIR/ckload-UID/ckload.sock)", 0},
    {"group", "G", "a group (name or gid) whose members may attach too", 0},
    {"only", "P", CK_ONLY_HELP, 0},
    {"verify", NULL, "as ckpt load --verify", 0},
    {NULL, NULL, NULL, 0}};

typedef struct serve_args {
    ckl_options o;
    const char *path, *socket;
    long gid;
} serve_args;

/* A group by name or number into a->gid; 0, or CK_USAGE after saying why. */
static int serve_group(const ck_opts *p, int k, const char *val, serve_args *a)
{
    char *end, buf[4096];
    struct group g, *found = NULL;
    long n = strtol(val, &end, 10);
    if (*val && !*end && n >= 0) {
        a->gid = n;
        return 0;
    }
    if (getgrnam_r(val, &g, buf, sizeof buf, &found) == 0 && found) {
        a->gid = (long)found->gr_gid;
        return 0;
    }
    return ck_opts_bad_value(p, k, val, "a group name or gid");
}

static int serve_parse(int argc, char **argv, serve_args *a)
{
    const char *val;
    int k, rc = 0;
    ck_opts p;
    ckl_default_options(&a->o);
    a->o.device = CKL_CUDA;
    a->gid = -1;
    ck_opts_init(&p, "serve", serve_options, argc, argv);
    while (rc == 0 && (k = ck_opts_next(&p, &val)) != CK_OPT_END) {
        if (k == CK_OPT_ERROR)
            return CK_USAGE;
        if (k == SERVE_DEVICE && (parse_device(val, &a->o) != 0 || a->o.device != CKL_CUDA))
            rc = ck_opts_bad_value(&p, k, val, "cuda or cuda:N");
        else if (k == SERVE_SOCKET)
            a->socket = val;
        else if (k == SERVE_GROUP)
            rc = serve_group(&p, k, val, a);
        else if (k == SERVE_ONLY)
            a->o.only = val;
        else if (k == SERVE_VERIFY)
            a->o.verify = 1;
        else if (k == CK_OPT_OPERAND && a->path)
            rc = ck_usage_error("serve", "one SOURCE only");
        else if (k == CK_OPT_OPERAND)
            a->path = val;
    }
    if (rc == 0 && !a->path)
        rc = ck_usage_error("serve", "missing SOURCE");
    return rc;
}

/* Serves until SIGTERM, SIGINT or SIGHUP (blocked in every thread, taken here): with nothing
 * attached it closes at once; while attached (a client still receiving its table counts) it
 * says so and keeps serving until the last attachment closes, and a second signal closes
 * anyway (the attached processes' block is then the driver's to tear down: share.h). The
 * close itself decides whether anything is attached (EBUSY), so that no client slips in
 * between a count and the close. */
static void serve_until_told(ckl_server *s, const char *socket, const sigset_t *stop)
{
    char err[PATH_MAX + 512];
    int told = 0;
    for (;;) {
        struct timespec tick = {.tv_nsec = 200000000L};
        int sig = sigtimedwait(stop, NULL, &tick);
        unsigned n = ckl_server_attached(s);
        if (sig > 0 && told) {
            fprintf(stderr, "ckpt: %s: told twice: closing with %u attachment%s live\n", socket,
                    n, n == 1 ? "" : "s");
            ckl_server_close(s, 1, err, sizeof err);
            return;
        }
        if (sig <= 0 && !told)
            continue;
        if (ckl_server_close(s, 0, err, sizeof err) == 0)
            return;
        if (!told)
            fprintf(stderr, "ckpt: %s: %u attachment%s live: serving until %s, or a second "
                    "signal\n", socket, n, n == 1 ? "" : "s", n == 1 ? "it ends" : "they end");
        told = 1;
    }
}

static int cmd_serve(int argc, char **argv, http_remote *remote)
{
    (void)remote; /* libckload opens SOURCE itself */
    serve_args a = {0};
    int rc = serve_parse(argc, argv, &a);
    if (rc != 0)
        return rc;
    char err[2 * PATH_MAX + 512], socket[PATH_MAX];
    ckl_load *l;
    ckl_server *s = NULL;
    if (!a.socket && ckl_default_socket(socket, sizeof socket, err, sizeof err) != 0) {
        fprintf(stderr, "ckpt: %s\n", err);
        return 1;
    }
    a.socket = a.socket ? a.socket : socket;
    if (ckl_load_start(a.path, &a.o, &l, err, sizeof err) != 0) {
        fprintf(stderr, "ckpt: %s\n", err);
        return 1;
    }
    ck_progress_catch_signals();
    if (finish_load(l) != 0) {
        ckl_release(l);
        return 1;
    }
    /* Blocked before the server's thread starts, so that it inherits the mask. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    rc = ckl_serve(l, a.socket, a.gid, &s, err, sizeof err);
    if (rc == 0) {
        char shown[CK_SHOWN_MAX];
        printf("%s: %zu tensors, %llu bytes on cuda:%d, served on %s\n",
               ck_location_shown(a.path, shown, sizeof shown), ckl_count(l),
               (unsigned long long)ckl_total_bytes(l), ckl_cuda_ordinal(l), a.socket);
        fflush(stdout);
    } else {
        fprintf(stderr, "ckpt: %s\n", err);
    }
    ckl_release(l); /* the server holds its own reference */
    if (rc != 0)
        return 1;
    serve_until_told(s, a.socket, &stop);
    return 0;
}

static int cmd_help(int argc, char **argv, http_remote *remote);

static const ck_command commands[] = {
    {"ls", "ckpt ls SOURCE [--json] [--bytes]",
     "Lists the tensors of SOURCE, one per line, tab-separated: name, dtype, shape, size, byte\n"
     "offset in the source ('-' when the bytes are not one extent) and, for sharded sources, the\n"
     "file. On a terminal a header comes first and sizes read 1.5 MiB; in a pipe there is no\n"
     "header and sizes are bytes. Control bytes and '\\' in names are written \\xNN and \\\\.\n"
     "--json prints the mount's index.json with \"file\" and \"offset\" added to each tensor.",
     ls_options, cmd_ls},
    {"cat", "ckpt cat [--npy] SOURCE NAME",
     "Writes the bytes of tensor NAME to stdout: row-major, little-endian, no header (the same\n"
     "bytes as the tensor's file in a mount); a value (a pickle's epoch, a DCP step) as the\n"
     "mount's text. NAME is a name or its path in a mount (model/h/0/ln_1/weight); a miss\n"
     "names the nearest names. A NAME that begins with '-' goes after \"--\". --npy puts a\n"
     "NumPy .npy header in front (the same bytes as NAME.npy in a mount made with -o npy), so\n"
     "that np.load reads it.",
     cat_options, cmd_cat},
    {"pack", "ckpt pack SOURCE OUT.pack [--only P] [-v]",
     "Writes SOURCE as a pack (docs/PACK.md): the same bytes as the mount's\n"
     ".ckptfs/checkpoint.pack. Memory stays a few MiB whatever the size. The file is written\n"
     "beside OUT, fsynced and renamed, so OUT appears whole or not at all (Ctrl-C and errors\n"
     "leave nothing). OUT a directory: OUT/model.pack. --only keeps the entries whose name is\n"
     "P or starts with P., or matches the glob. A progress bar is drawn when stderr is a\n"
     "terminal, and a line says what was written (-v: in a pipe too).",
     pack_options, cmd_pack},
    {"convert", convert_usage, convert_help, convert_options, cmd_convert},
    {"verify", "ckpt verify FILE.pack",
     "Recomputes every tensor's checksum. Names the first tensor that does not match and exits\n"
     "1; prints a summary and exits 0 when all match.",
     no_options, cmd_verify},
    {"load", "ckpt load SOURCE [--device D] [--threads T] [--buffers N] [--buffer-size S] "
             "[--only P] [--verify] [--slice GLOB:DIM ... --rank R --world-size W]",
     "Loads SOURCE (a pack file, a mount's .ckptfs/checkpoint.pack, or any source ckptfs mounts,\n"
     "read in place as its pack would lay it out) with libckload into memory on D (cpu, cuda,\n"
     "cuda:N or auto: CUDA when a device is usable; default auto), then prints bytes, time,\n"
     "GB/s and where it read from (the pack, or the source) and frees it. T reader threads\n"
     "reading S bytes at a time (K, M, G suffixes; by default 4 and 16M, or 8 and 4M for a\n"
     "cold source loaded on cpu whose tensors mostly cannot land in place), each with N\n"
     "pinned staging buffers (default 2) of S bytes for CUDA. --only loads the entries whose\n"
     "name is P or starts with P., or matches the glob. --verify checks a pack's checksums as\n"
     "the bytes stream; other sources store none, so for them it checks only that each source\n"
     "file is unchanged (device, inode, size, mtime) after its bytes are read. A progress bar\n"
     "is drawn when stderr is a terminal. --slice loads rank R's part of each tensor whose name\n"
     "GLOB selects (as --only), cut along DIM into W parts as torch.chunk cuts it (DIM -1:\n"
     "whole; the first --slice that selects a name decides), read straight from the source.",
     load_options, cmd_load},
    {"serve", "ckpt serve SOURCE [--socket PATH] [--device cuda:N] [--group G] [--only P] "
              "[--verify]",
     "Loads SOURCE onto a CUDA device (as ckpt load) and keeps it there, served on the Unix\n"
     "socket PATH to the processes of this machine that attach to it (ckload.attach in\n"
     "Python, ckl_attach in C): they map the same device memory through CUDA IPC instead of\n"
     "loading it again. PATH by default: $XDG_RUNTIME_DIR/ckload.sock, else\n"
     "$TMPDIR/ckload-UID/ckload.sock (/tmp without TMPDIR; the directory made 0700). PATH's\n"
     "directory must be yours or root's and writable by no one else unless sticky; nothing\n"
     "there is replaced but a stale socket of yours. A process attaches if its uid is this\n"
     "one's or it is in group G (a name or gid), and while SOURCE's files are still those\n"
     "loaded; others are refused with one line. Prints one line once serving. SIGTERM, SIGINT\n"
     "or SIGHUP: with nothing attached it exits 0 and removes the socket; while attached (a\n"
     "client still receiving counts) it says how many and keeps serving until the last\n"
     "attachment ends (then exits 0), and a second signal exits anyway (the attached\n"
     "processes' tensors are then no longer safe to use).",
     serve_options, cmd_serve},
    {"diff", "ckpt diff A B [--json] [--only PREFIX_OR_GLOB]",
     "Compares the tensors of two sources (formats may differ: a .bin and its safetensors):\n"
     "names only in A or only in B, dtype or shape changes, and for tensors in both whether\n"
     "their bytes are identical (XXH3 of each side, streamed). For float tensors (F64, F32,\n"
     "F16, BF16, F8 E4M3/E5M2) that differ: the max absolute difference and the relative L2\n"
     "||a-b||/||a||, computed in double. Values (non-tensor pickle entries) are not compared.\n"
     "--only compares the entries whose name is P or starts with P., or matches the glob.\n"
     "Exits 0 when the same, 1 when different, 2 on trouble (as cmp and diff do).",
     diff_options, cmd_diff},
    {"info", "ckpt info SOURCE [--depth N] [--json] [--full]",
     "Summarizes SOURCE: format, files, tensor and value counts, parameters (elements), bytes\n"
     "by dtype, a du-like tree of bytes and parameters by name prefix ('.'-separated parts) to\n"
     "depth N (default 2), and the metadata (a long array as its count and first items, long\n"
     "text cut: --full shows them whole). Reads no tensor data.",
     info_options, cmd_info},
    {"stats", "ckpt stats SOURCE [NAME|GLOB...] [--json]",
     "For each tensor (or those named: NAME, a prefix, or a glob): element count, min, max,\n"
     "mean and std (population) over the finite values, and the NaN, Inf and zero counts.\n"
     "Every integer dtype, BOOL, F64/F32/F16/BF16 and F8 E4M3/E5M2 are decoded (64-bit\n"
     "integers through double); complex, F4/F6, F8 E8M0 and FNUZ, and GGUF block-quantized\n"
     "tensors are listed as skipped. On a terminal each tensor gets a 10-bin histogram.",
     stats_options, cmd_stats},
    {"help", "ckpt help [COMMAND]", "Shows what a command does.", no_options, cmd_help},
};
enum { NCOMMANDS = sizeof commands / sizeof *commands };

static void print_usage(FILE *out)
{
    fprintf(out, "usage: ckpt [--cacert FILE] [--no-sign-request] COMMAND [ARGS]   (SOURCE: a\n"
                 "       checkpoint file, a directory of shards or a DCP checkpoint, an http(s)://\n"
                 "       URL, hf://ORG/REPO[@REV][/PATH] or s3://BUCKET/KEY[/])\n"
                 "       ckpt --version\n\n");
    for (int i = 0; i < NCOMMANDS; i++)
        fprintf(out, "  %s\n", commands[i].usage);
    fprintf(out, "\nckpt COMMAND --help explains one command.\n");
}

static void print_command_help(const ck_command *c)
{
    printf("usage: %s\n\n%s\n", c->usage, c->help);
    ck_opts_print_help(stdout, c->options);
}

static int cmd_help(int argc, char **argv, http_remote *remote)
{
    (void)remote;
    const ck_command *c = argc > 1 ? find_command(argv[1]) : NULL;
    if (argc > 1 && !c)
        return ck_usage_error("help", "unknown command");
    if (c)
        print_command_help(c);
    else
        print_usage(stdout);
    return 0;
}

static const ck_command *find_command(const char *name)
{
    for (int i = 0; i < NCOMMANDS; i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

/* ckpt's own options, before the COMMAND: --cacert FILE (or =FILE), CA certificates for https
 * sources; --no-sign-request, s3:// unsigned (a public bucket). Both become the variables every
 * opener reads (CKPTFS_CACERT, CKPTFS_NO_SIGN_REQUEST): `ckpt load` opens its source in
 * libckload too. The arguments argv[1] used (0: none is one), or -2 (usage, said), -1. */
static int global_option(int argc, char **argv)
{
    if (strncmp(argv[1], "--cacert", 8) == 0 && (!argv[1][8] || argv[1][8] == '=')) {
        int eq = argv[1][8] == '=', used = eq ? 1 : 2;
        if (argc < used + 2 || (eq && !argv[1][9])) {
            fprintf(stderr, "ckpt: --cacert needs FILE and a COMMAND (see ckpt --help)\n");
            return -2;
        }
        if (setenv("CKPTFS_CACERT", eq ? argv[1] + 9 : argv[2], 1) != 0)
            return fprintf(stderr, "ckpt: out of memory\n"), -1;
        return used;
    }
    if (strcmp(argv[1], "--no-sign-request") == 0) {
        if (argc < 3) {
            fprintf(stderr, "ckpt: --no-sign-request needs a COMMAND (see ckpt --help)\n");
            return -2;
        }
        if (setenv("CKPTFS_NO_SIGN_REQUEST", "1", 1) != 0)
            return fprintf(stderr, "ckpt: out of memory\n"), -1;
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    /* A load, pack or convert runs long, and `ps` would show a URL SOURCE's secrets. */
    if (ck_location_hide_args(argc, argv) != 0) {
        fprintf(stderr, "ckpt: out of memory\n");
        return 1;
    }
    /* A descriptor per source file while a command reads them (a DCP job's file per rank),
     * besides its outputs and connections: all the hard limit allows. */
    ck_nofile_raise();
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        print_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? CK_USAGE : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("ckpt %s\n", CKPTFS_VERSION);
        return 0;
    }
    int used;
    while ((used = global_option(argc, argv)) > 0) {
        argc -= used;
        argv += used;
    }
    if (used < 0)
        return used == -1 ? 1 : CK_USAGE;
    const ck_command *c = find_command(argv[1]);
    if (!c) {
        fprintf(stderr, "ckpt: unknown command '%s' (see ckpt --help)\n", argv[1]);
        return CK_USAGE;
    }
    if (wants_help(argc - 1, argv + 1)) {
        print_command_help(c);
        return 0;
    }
    /* What every source the command opens shares: one block cache, one disk cache (open.h). */
    http_remote *remote = ck_remote_new(&(http_config){0});
    if (!remote) {
        fprintf(stderr, "ckpt: out of memory\n");
        return 1;
    }
    int status = c->run(argc - 1, argv + 1, remote);
    http_remote_free(remote);
    ck_progress_die_if_interrupted(); /* what it was writing is gone: now die as asked */
    return status;
}
