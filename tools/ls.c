/* ls.c — `ckpt ls`: the tensors of a SOURCE, a table for people or scripts, or the mount's
 * index.json (commands.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../views/view.h"
#include "../checkpoint/open.h"
#include "../checkpoint/synth.h"
#include "cli.h"
#include "commands.h"

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

const ck_command ckpt_ls = {
    "ls", "ckpt ls SOURCE [--json] [--bytes]",
    "Lists the tensors of SOURCE, one per line, tab-separated: name, dtype, shape, size, byte\n"
    "offset in the source ('-' when the bytes are not one extent) and, for sharded sources, the\n"
    "file. On a terminal a header comes first and sizes read 1.5 MiB; in a pipe there is no\n"
    "header and sizes are bytes. Control bytes and '\\' in names are written \\xNN and \\\\.\n"
    "--json prints the mount's index.json with \"file\" and \"offset\" added to each tensor.",
    ls_options, cmd_ls};
