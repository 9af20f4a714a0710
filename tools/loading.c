/* loading.c — what ckpt load and ckpt serve share (loading.h). */
#include "loading.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "progress.h"

int loading_parse_device(const char *s, ckl_options *o)
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

/* Waits for the load, drawing the bar; 0, or -1 after printing why it failed. */
int loading_finish(ckl_load *l)
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
