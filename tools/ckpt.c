/* ckpt — the checkpoint tool: the same readers as the mount, without mounting anything.
 * Every command prints one line "ckpt: ..." on stderr and exits 1 on failure, 2 on bad usage.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../fs/view.h"
#include "../pack/npy.h"
#include "../pack/open.h"
#include "../pack/packfile.h"
#include "../cuda/ckload.h"
#include "../pack/synth.h"
#include "commands.h"
#include "outfile.h"
#include "progress.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <xxhash.h>

typedef struct ck_command {
    const char *name;
    const char *usage;
    const char *help;
    int (*run)(int argc, char **argv);
} ck_command;

static const ck_command *find_command(const char *name);

static int usage_error(const char *cmd, const char *what)
{
    fprintf(stderr, "ckpt: %s: %s (see ckpt %s --help)\n", cmd, what, cmd);
    return 2;
}

/* True when argv holds -h or --help. */
static int wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
            return 1;
    return 0;
}

/* What every source a command opens shares: one block cache, one disk cache (open.h). Made by
 * main, freed after the command. */
static http_remote *remote;

int open_source(const char *source, ck_index **ix)
{
    ck_error err;
    if (ck_open_through(remote, source, ix, &err) == 0)
        return 0;
    fprintf(stderr, "ckpt: %s\n", err.msg);
    return -1;
}

/* A name in the table: tabs, newlines and other control bytes would break its columns, so they
 * are written \xNN, and a backslash is doubled; --json has every name exactly. */
void print_name(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\')
            fputs("\\\\", stdout);
        else if (c < 0x20 || c == 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
}

static void print_table(const ck_index *ix, const uint32_t *alias_of)
{
    char shape[1400];
    for (size_t i = 0; i < ix->nentries; i++) {
        const ck_entry *e = &ix->entries[i];
        if (e->kind != CK_TENSOR)
            continue;
        ck_view_shape_json(e, shape, sizeof shape);
        print_name(e->name, e->name_len);
        printf("\t%s\t%s\t%llu\t", ck_dtype_name(e->dtype), shape,
               (unsigned long long)e->nbytes);
        if (e->layout == CK_CONTIGUOUS)
            printf("%llu", (unsigned long long)e->ext.offset);
        else
            printf("-");
        if (ix->nfiles > 1)
            printf("\t%s", ix->files[e->ext.file].path);
        if (alias_of[i] != UINT32_MAX) { /* tied: the name whose storage it shares */
            printf("\talias of ");
            print_name(ix->entries[alias_of[i]].name, ix->entries[alias_of[i]].name_len);
        }
        putchar('\n');
    }
    for (size_t i = 0; i < ix->nomitted; i++) { /* left out: no tensor */
        print_name(ix->omitted[i].name, strlen(ix->omitted[i].name));
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
    size_t len;
    char *json = ck_view_index_json(ix, tree, alias_of, 1, &len);
    ck_tree_free(tree);
    if (!json) {
        char shown[CK_SHOWN_MAX];
        fprintf(stderr, "ckpt: %s: out of memory\n", ck_location_shown(source, shown, sizeof shown));
        return -1;
    }
    fwrite(json, 1, len, stdout);
    putchar('\n');
    free(json);
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

static int cmd_ls(int argc, char **argv)
{
    int json = 0;
    const char *source = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else if (argv[i][0] == '-' && argv[i][1])
            return usage_error("ls", "unknown option");
        else if (source)
            return usage_error("ls", "one SOURCE only");
        else
            source = argv[i];
    }
    if (!source)
        return usage_error("ls", "missing SOURCE");
    ck_index *ix;
    if (open_source(source, &ix) != 0)
        return 1;
    ck_error err;
    uint32_t *alias_of = ck_synth_aliases(ix, &err);
    int rc = alias_of ? 0 : (fprintf(stderr, "ckpt: %s\n", err.msg), -1);
    if (alias_of && json)
        rc = print_json(ix, alias_of, source);
    else if (alias_of)
        print_table(ix, alias_of);
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
            fprintf(stderr, "ckpt: %s: cannot read tensor '%s': %s\n",
                    ck_location_shown(source, shown, sizeof shown), e->name,
                    strerror(n < 0 ? (int)-n : EIO));
            rc = -1;
        }
        if (rc == 0)
            rc = write_out(buf, (size_t)n);
        off += n > 0 ? (uint64_t)n : 0;
    }
    free(buf);
    return rc;
}

/* `ckpt cat [--npy] SOURCE NAME`: with --npy, the NumPy header first, as the mount's NAME.npy
 * view (ckptfs -o npy) has it (npy_header_make owns it). */
static int cmd_cat(int argc, char **argv)
{
    const char *args[2];
    int nargs = 0, npy = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--npy") == 0) /* the only option: a NAME may begin with '-' */
            npy = 1;
        else if (nargs < 2)
            args[nargs++] = argv[i];
        else
            return usage_error("cat", "need SOURCE and NAME");
    }
    if (nargs != 2)
        return usage_error("cat", "need SOURCE and NAME");
    ck_index *ix;
    if (open_source(args[0], &ix) != 0)
        return 1;
    const ck_entry *e = ck_index_find(ix, args[1]);
    unsigned char head[NPY_MAKE_MAX];
    char shown[CK_SHOWN_MAX];
    int raw, rc = 1;
    if (!e || e->kind != CK_TENSOR)
        fprintf(stderr, "ckpt: %s: no tensor named '%s'\n",
                ck_location_shown(args[0], shown, sizeof shown), args[1]);
    else if (!npy || write_out((const char *)head, npy_header_make(e->dtype, e->rank, e->shape,
                                                                   e->nbytes, head, &raw)) == 0)
        rc = write_entry(ix, e, args[0]) != 0;
    ck_index_free(ix);
    return rc;
}

static int cmd_pack(int argc, char **argv)
{
    const char *only = NULL, *args[2];
    int nargs = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (argv[i][0] == '-' && argv[i][1])
            return usage_error("pack", "unknown option");
        else if (nargs == 2)
            return usage_error("pack", "need SOURCE and OUT only");
        else
            args[nargs++] = argv[i];
    }
    if (nargs != 2)
        return usage_error("pack", "need SOURCE and OUT");
    ck_index *ix;
    if (open_source(args[0], &ix) != 0)
        return 1;
    ck_error err;
    ck_synth *sy;
    int rc = 1;
    if (ck_synth_pack(ix, only, &sy, &err) != 0) {
        fprintf(stderr, "ckpt: %s\n", err.msg);
    } else {
        ck_progress_catch_signals();
        signal(SIGXFSZ, SIG_IGN); /* past a file size limit: EFBIG, and the temp file goes */
        rc = ck_out_file(sy, args[1], "pack") != 0;
        ck_synth_free(sy);
    }
    ck_index_free(ix);
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

static int cmd_verify(int argc, char **argv)
{
    if (argc != 2)
        return usage_error("verify", "need one FILE.pack");
    ck_index *ix;
    if (open_source(argv[1], &ix) != 0)
        return 1;
    char shown[CK_SHOWN_MAX];
    ck_location_shown(argv[1], shown, sizeof shown);
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

/* A rank or a world size: decimal digits only (0 included, which parse_size cannot tell from an
 * error), at most 2^20. 0, or -1. */
static int plain_count(const char *s, unsigned *out)
{
    if (!*s || strspn(s, "0123456789") != strlen(s) || strlen(s) > 7)
        return -1;
    unsigned long v = strtoul(s, NULL, 10);
    if (v > (1ul << 20))
        return -1;
    *out = (unsigned)v;
    return 0;
}

/* A --slice GLOB:DIM rule into *r: DIM after the last ':', -1 (whole) or a dimension up to 63.
 * 0, or -1 when it is not so. */
static int parse_slice(char *val, ckl_slice *r)
{
    char *colon = strrchr(val, ':'), *end;
    long dim = colon && colon > val ? strtol(colon + 1, &end, 10) : -2;
    if (dim < -1 || dim > 63 || !colon[1] || *end)
        return -1;
    *colon = 0;
    *r = (ckl_slice){.glob = val, .dim = (int)dim};
    return 0;
}

static int cmd_load(int argc, char **argv)
{
    ckl_options o;
    ckl_default_options(&o);
    const char *path = NULL;
    enum { MAX_SLICES = 64 };
    ckl_slice slices[MAX_SLICES];
    o.slices = slices;
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t n = val ? parse_size(val, 0) : 0;
        if (strcmp(opt, "--verify") == 0) {
            o.verify = 1;
            continue;
        }
        if (opt[0] == '-' && opt[1] && !val)
            return usage_error("load", "an option without its value");
        else if (strcmp(opt, "--device") == 0) {
            if (parse_device(val, &o) != 0)
                return usage_error("load", "--device: cpu, cuda, cuda:N or auto");
        } else if (strcmp(opt, "--only") == 0)
            o.only = val;
        else if (strcmp(opt, "--threads") == 0 && n && n <= CKL_MAX_THREADS)
            o.threads = (unsigned)n;
        else if (strcmp(opt, "--buffers") == 0 && n && n <= CKL_MAX_BUFFERS)
            o.buffers = (unsigned)n;
        else if (strcmp(opt, "--buffer-size") == 0 && n >= CKL_MIN_BUFFER_SIZE &&
                 n <= CKL_MAX_BUFFER_SIZE)
            o.buffer_size = (size_t)n;
        else if (strcmp(opt, "--slice") == 0 && o.nslices < MAX_SLICES) {
            if (parse_slice(argv[i + 1], &slices[o.nslices++]) != 0)
                return usage_error("load", "--slice GLOB:DIM, DIM -1 (whole) to 63");
        } else if (strcmp(opt, "--rank") == 0 && plain_count(val, &o.rank) == 0)
            ;
        else if (strcmp(opt, "--world-size") == 0 && plain_count(val, &o.world_size) == 0 &&
                 o.world_size)
            ;
        else if (opt[0] == '-' && opt[1])
            return usage_error("load", "unknown option or value out of range");
        else if (path)
            return usage_error("load", "one SOURCE only");
        else {
            path = opt;
            continue;
        }
        i++;
    }
    if (!path)
        return usage_error("load", "missing SOURCE");
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

static int cmd_help(int argc, char **argv);

static const ck_command commands[] = {
    {"ls", "ckpt ls SOURCE [--json]",
     "Lists the tensors of SOURCE, one per line, tab-separated: name, dtype, shape, bytes, byte\n"
     "offset in the source ('-' when the bytes are not one extent) and, for sharded sources, the\n"
     "file. Control bytes and '\\' in names are written \\xNN and \\\\. --json prints the mount's\n"
     "index.json with \"file\" and \"offset\" added to each tensor.",
     cmd_ls},
    {"cat", "ckpt cat [--npy] SOURCE NAME",
     "Writes the bytes of tensor NAME to stdout: row-major, little-endian, no header (the same\n"
     "bytes as the tensor's file in a mount). --npy puts a NumPy .npy header in front (the same\n"
     "bytes as NAME.npy in a mount made with -o npy), so that np.load reads it.",
     cmd_cat},
    {"pack", "ckpt pack SOURCE OUT.pack [--only PREFIX_OR_GLOB]",
     "Writes SOURCE as a pack (pack/FORMAT.md): the same bytes as the mount's\n"
     ".ckptfs/checkpoint.pack. Memory stays a few MiB whatever the size. The file is written\n"
     "beside OUT, fsynced and renamed, so OUT appears whole or not at all (Ctrl-C and errors\n"
     "leave nothing). --only keeps the entries whose name is PREFIX or starts with PREFIX.,\n"
     "or matches the glob. A progress bar is drawn when stderr is a terminal.",
     cmd_pack},
    {"convert", convert_usage, convert_help, cmd_convert},
    {"verify", "ckpt verify FILE.pack",
     "Recomputes every tensor's checksum. Names the first tensor that does not match and exits\n"
     "1; prints a summary and exits 0 when all match.",
     cmd_verify},
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
     cmd_load},
    {"diff", "ckpt diff A B [--json] [--only PREFIX_OR_GLOB]",
     "Compares the tensors of two sources (formats may differ: a .bin and its safetensors):\n"
     "names only in A or only in B, dtype or shape changes, and for tensors in both whether\n"
     "their bytes are identical (XXH3 of each side, streamed). For float tensors (F64, F32,\n"
     "F16, BF16, F8 E4M3/E5M2) that differ: the max absolute difference and the relative L2\n"
     "||a-b||/||a||, computed in double. Values (non-tensor pickle entries) are not compared.\n"
     "--only compares the entries whose name is P or starts with P., or matches the glob.\n"
     "Exits 0 when the same, 1 when different, 2 on trouble (as cmp and diff do).",
     cmd_diff},
    {"info", "ckpt info SOURCE [--depth N] [--json]",
     "Summarizes SOURCE: format, files, tensor and value counts, parameters (elements), bytes\n"
     "by dtype, a du-like tree of bytes and parameters by name prefix ('.'-separated parts) to\n"
     "depth N (default 2), and the metadata. Reads no tensor data.",
     cmd_info},
    {"stats", "ckpt stats SOURCE [NAME|GLOB...] [--json]",
     "For each tensor (or those named: NAME, a prefix, or a glob): element count, min, max,\n"
     "mean and std (population) over the finite values, and the NaN, Inf and zero counts.\n"
     "Every integer dtype, BOOL, F64/F32/F16/BF16 and F8 E4M3/E5M2 are decoded (64-bit\n"
     "integers through double); complex, F4/F6, F8 E8M0 and FNUZ, and GGUF block-quantized\n"
     "tensors are listed as skipped. On a terminal each tensor gets a 10-bin histogram.",
     cmd_stats},
    {"help", "ckpt help [COMMAND]", "Shows what a command does.", cmd_help},
};
enum { NCOMMANDS = sizeof commands / sizeof *commands };

static void print_usage(FILE *out)
{
    fprintf(out, "usage: ckpt [--cacert FILE] COMMAND [ARGS]   (SOURCE: a checkpoint file, a\n"
                 "       directory of shards, an http(s):// URL or hf://ORG/REPO[@REV][/PATH])\n"
                 "       ckpt --version\n\n");
    for (int i = 0; i < NCOMMANDS; i++)
        fprintf(out, "  %s\n", commands[i].usage);
    fprintf(out, "\nckpt COMMAND --help explains one command.\n");
}

static void print_command_help(const ck_command *c)
{
    printf("usage: %s\n\n%s\n", c->usage, c->help);
}

static int cmd_help(int argc, char **argv)
{
    const ck_command *c = argc > 1 ? find_command(argv[1]) : NULL;
    if (argc > 1 && !c)
        return usage_error("help", "unknown command");
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

int main(int argc, char **argv)
{
    /* A load, pack or convert runs long, and `ps` would show a URL SOURCE's secrets. */
    if (ck_location_hide_args(argc, argv) != 0) {
        fprintf(stderr, "ckpt: out of memory\n");
        return 1;
    }
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        print_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("ckpt %s\n", CKPTFS_VERSION);
        return 0;
    }
    if (strcmp(argv[1], "--cacert") == 0) { /* CA certificates for https sources */
        if (argc < 4)
            return usage_error("--cacert", "needs FILE and a COMMAND");
        /* the variable, not a config: `ckpt load` opens its source in libckload too */
        if (setenv("CKPTFS_CACERT", argv[2], 1) != 0) {
            fprintf(stderr, "ckpt: out of memory\n");
            return 1;
        }
        argc -= 2;
        argv += 2;
    }
    const ck_command *c = find_command(argv[1]);
    if (!c) {
        fprintf(stderr, "ckpt: unknown command '%s' (see ckpt --help)\n", argv[1]);
        return 2;
    }
    if (wants_help(argc - 1, argv + 1)) {
        print_command_help(c);
        return 0;
    }
    if (!(remote = ck_remote_new(&(http_config){0}))) {
        fprintf(stderr, "ckpt: out of memory\n");
        return 1;
    }
    int status = c->run(argc - 1, argv + 1);
    http_remote_free(remote);
    return status;
}
