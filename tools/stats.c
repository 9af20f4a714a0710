/* stats.c — ckpt stats: each tensor's count, min, max, mean, std and histogram, computed on
 * threads (inspect.h). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


#include "../base/json.h"
#include "cli.h"
#include "commands.h"
#include "inspect.h"

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
    unsigned w = inspect_decoded_size(e->dtype);
    for (uint64_t off = 0; off < e->nbytes; off += INSPECT_CHUNK) {
        size_t n = e->nbytes - off < INSPECT_CHUNK ? (size_t)(e->nbytes - off) : INSPECT_CHUNK;
        if (inspect_read_chunk(ix, e, buf, n, off, err))
            return -1;
        for (size_t j = 0; j < n / w; j += INSPECT_BATCH) {
            size_t m = n / w - j < INSPECT_BATCH ? n / w - j : INSPECT_BATCH;
            inspect_decode_batch(e->dtype, buf + j * w, m, dv);
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
    cJSON_AddItemToObject(o, "name", inspect_name_json(e));
    cJSON_AddStringToObject(o, "dtype", ck_dtype_name(e->dtype));
    cJSON_AddItemToObject(o, "shape", inspect_shape_json(e));
    cJSON_AddItemToObject(o, "count", ck_json_uint(s->count));
    cJSON_AddItemToObject(o, "finite", ck_json_uint(s->finite));
    cJSON_AddItemToObject(o, "nan", ck_json_uint(s->nan));
    cJSON_AddItemToObject(o, "inf", ck_json_uint(s->inf));
    cJSON_AddItemToObject(o, "zero", ck_json_uint(s->zero));
    if (s->finite) {
        cJSON_AddItemToObject(o, "min", inspect_number_json(s->min));
        cJSON_AddItemToObject(o, "max", inspect_number_json(s->max));
        cJSON_AddItemToObject(o, "mean", inspect_number_json(s->mean));
        cJSON_AddItemToObject(o, "std", inspect_number_json(stat_std(s)));
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
    unsigned char *buf = malloc(INSPECT_CHUNK);
    double *dv = malloc(INSPECT_BATCH * sizeof *dv);
    w->failed_at = SIZE_MAX;
    for (size_t i; (i = atomic_fetch_add(&r->next, 1)) < r->n;) {
        const ck_entry *e = r->sel[i];
        int rc = buf && dv ? 0 : ck_fail(&w->err, ck_index_source(r->ix), "out of memory");
        if (rc == 0 && inspect_decoded_size(e->dtype))
            rc = scan_tensor(r->ix, e, buf, dv, &r->acc[i], acc_batch, &w->err);
        if (rc == 0 && inspect_decoded_size(e->dtype) && r->hist && r->acc[i].finite)
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

/* A tensor's line: for a pipe tab-separated at full precision (width 0); for a terminal in
 * columns, the name padded to width, numbers to 6 digits. */
static void print_stat_line(const ck_entry *e, const stat_acc *s, int width)
{
    cli_print_name(e->name, e->name_len);
    double min = s->finite ? s->min : NAN, max = s->finite ? s->max : NAN,
           mean = s->finite ? s->mean : NAN;
    if (!width) {
        printf("\t%s\t%llu\t%.9g\t%.9g\t%.9g\t%.9g\t%llu\t%llu\t%llu\n", ck_dtype_name(e->dtype),
               (unsigned long long)s->count, min, max, mean, stat_std(s),
               (unsigned long long)s->nan, (unsigned long long)s->inf,
               (unsigned long long)s->zero);
        return;
    }
    printf("%*s %-6s %12llu %12.6g %12.6g %12.6g %12.6g %8llu %8llu %10llu\n",
           width > (int)e->name_len ? width - (int)e->name_len : 0, "", ck_dtype_name(e->dtype),
           (unsigned long long)s->count, min, max, mean, stat_std(s),
           (unsigned long long)s->nan, (unsigned long long)s->inf, (unsigned long long)s->zero);
}

/* The header of those lines, and the name column's width on a terminal (0 for a pipe). */
static int print_stat_header(const stats_run *r)
{
    enum { NAME_COLUMN = 64 }; /* longer names push their line's columns right */
    int width = 4;
    for (size_t i = 0; r->hist && i < r->n; i++)
        if ((int)r->sel[i]->name_len > width)
            width = r->sel[i]->name_len > NAME_COLUMN ? NAME_COLUMN : (int)r->sel[i]->name_len;
    if (!r->hist) {
        printf("name\tdtype\tcount\tmin\tmax\tmean\tstd\tnan\tinf\tzero\n");
        return 0;
    }
    printf("%-*s %-6s %12s %12s %12s %12s %12s %8s %8s %10s\n", width, "name", "dtype", "count",
           "min", "max", "mean", "std", "nan", "inf", "zero");
    return width;
}

static int print_stats(const stats_run *r, int json)
{
    cJSON *doc = json ? cJSON_CreateObject() : NULL, *ts = cJSON_CreateArray(),
          *sk = cJSON_CreateArray();
    int width = json ? 0 : print_stat_header(r);
    for (size_t i = 0; i < r->n; i++) {
        const ck_entry *e = r->sel[i];
        if (!inspect_decoded_size(e->dtype)) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddItemToObject(o, "name", inspect_name_json(e));
            cJSON_AddStringToObject(o, "dtype", ck_dtype_name(e->dtype));
            cJSON_AddItemToArray(sk, o);
            continue;
        }
        if (json) {
            cJSON_AddItemToArray(ts, stat_json(e, &r->acc[i]));
            continue;
        }
        print_stat_line(e, &r->acc[i], width);
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
    return inspect_print_json_doc(doc);
}

enum { STATS_JSON };
static const ck_option stats_options[] = {
    {"json", NULL, "the statistics as JSON", 0},
    {NULL, NULL, NULL, 0}};

static int cmd_stats(int argc, char **argv, http_remote *remote)
{
    const char *source = NULL, *val;
    int json = 0, npat = 0, k;
    const char **pats = calloc((size_t)argc, sizeof *pats);
    if (!pats)
        return fprintf(stderr, "ckpt: out of memory\n"), 1;
    ck_opts p;
    ck_opts_init(&p, "stats", stats_options, argc, argv);
    while ((k = ck_opts_next(&p, &val)) != CK_OPT_END && k != CK_OPT_ERROR) {
        if (k == STATS_JSON)
            json = 1;
        else if (!source)
            source = val;
        else
            pats[npat++] = val;
    }
    if (k == CK_OPT_ERROR || !source) {
        free(pats);
        return k == CK_OPT_ERROR ? CK_USAGE : ck_usage_error("stats", "needs a source");
    }
    ck_index *ix;
    if (cli_open_source(remote, source, &ix)) {
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
        if (ix->entries[i].kind == CK_TENSOR && inspect_selected(&ix->entries[i], pats, npat))
            r.sel[r.n++] = &ix->entries[i];
    if (npat && !r.n) {
        char shown[CK_SHOWN_MAX];
        fprintf(stderr, "ckpt: %s: no tensor matches\n",
                ck_location_shown(source, shown, sizeof shown));
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

const ck_command ckpt_stats = {
    "stats", "ckpt stats SOURCE [NAME|GLOB...] [--json]",
    "For each tensor (or those named: NAME, a prefix, or a glob): element count, min, max,\n"
    "mean and std (population) over the finite values, and the NaN, Inf and zero counts.\n"
    "Every integer dtype, BOOL, F64/F32/F16/BF16 and F8 E4M3/E5M2 are decoded (64-bit\n"
    "integers through double); complex, F4/F6, F8 E8M0 and FNUZ, and GGUF block-quantized\n"
    "tensors are listed as skipped. On a terminal each tensor gets a 10-bin histogram.",
    stats_options, cmd_stats};
