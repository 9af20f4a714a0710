/* load.c — `ckpt load`: a source loaded with libckload, timed, and freed (commands.h). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/location.h"
#include "../loader/ckload.h"
#include "commands.h"
#include "loading.h"
#include "progress.h"

static double seconds_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
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
        return loading_parse_device(val, o) == 0 ? 0
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

/* The line a finished load prints: what, how much, where, how fast, read from where. */
static void print_loaded(ckl_load *l, const char *path, double dt, int verified)
{
    uint64_t bytes = ckl_total_bytes(l);
    char dev[32] = "cpu";
    if (ckl_device_of(l) == CKL_CUDA)
        snprintf(dev, sizeof dev, "cuda:%d", ckl_cuda_ordinal(l));
    const char *rp = ckl_read_path(l);
    int sums = strcmp(rp, "pack") == 0 || strcmp(rp, "mount") == 0; /* the pack read */
    char shown[CK_SHOWN_MAX];
    printf("%s: %zu tensors, %llu bytes into %s in %.3f s (%.2f GB/s), %s%s\n",
           ck_location_shown(path, shown, sizeof shown), ckl_count(l), (unsigned long long)bytes,
           dev, dt, dt > 0 ? (double)bytes / dt / 1e9 : 0.0, read_path_words(rp),
           !verified ? "" : sums ? ", checksums match" : ", sources unchanged");
}

/* The operand and options of ckpt load into *path and o (slices: room for max rules); 0, or
 * CK_USAGE after saying why. */
static int load_parse(int argc, char **argv, const char **path, ckl_options *o,
                      ckl_slice *slices, unsigned max)
{
    const char *val;
    int k;
    ck_opts p;
    ck_opts_init(&p, "load", load_options, argc, argv);
    while ((k = ck_opts_next(&p, &val)) != CK_OPT_END) {
        if (k == CK_OPT_ERROR)
            return CK_USAGE;
        if (k >= 0 && load_option(&p, k, val, o, slices, max) != 0)
            return CK_USAGE;
        if (k == CK_OPT_OPERAND && *path)
            return ck_usage_error("load", "one SOURCE only");
        if (k == CK_OPT_OPERAND)
            *path = val;
    }
    return *path ? 0 : ck_usage_error("load", "missing SOURCE");
}

static int cmd_load(int argc, char **argv, http_remote *remote)
{
    (void)remote; /* libckload opens SOURCE itself */
    ckl_options o;
    ckl_default_options(&o);
    const char *path = NULL;
    enum { MAX_SLICES = 64 };
    ckl_slice slices[MAX_SLICES];
    o.slices = slices;
    if (load_parse(argc, argv, &path, &o, slices, MAX_SLICES) != 0)
        return CK_USAGE;
    char err[PATH_MAX + 512];
    ckl_load *l;
    double t0 = seconds_now();
    if (ckl_load_start(path, &o, &l, err, sizeof err) != 0) {
        fprintf(stderr, "ckpt: %s\n", err);
        return 1;
    }
    ck_progress_catch_signals();
    int rc = loading_finish(l);
    if (rc == 0)
        print_loaded(l, path, seconds_now() - t0, o.verify);
    ckl_release(l);
    return rc != 0;
}

const ck_command ckpt_load = {
    "load", "ckpt load SOURCE [--device D] [--threads T] [--buffers N] [--buffer-size S] "
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
    load_options, cmd_load};
