/* pack.c — `ckpt pack`: any source written as a pack, whole or not at all (commands.h). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "../checkpoint/synth.h"
#include "cli.h"
#include "commands.h"
#include "outfile.h"
#include "progress.h"

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

const ck_command ckpt_pack = {
    "pack", "ckpt pack SOURCE OUT.pack [--only P] [-v]",
    "Writes SOURCE as a pack (docs/PACK.md): the same bytes as the mount's\n"
    ".ckptfs/checkpoint.pack. Memory stays a few MiB whatever the size. The file is written\n"
    "beside OUT, fsynced and renamed, so OUT appears whole or not at all (Ctrl-C and errors\n"
    "leave nothing). OUT a directory: OUT/model.pack. --only keeps the entries whose name is\n"
    "P or starts with P., or matches the glob. A progress bar is drawn when stderr is a\n"
    "terminal, and a line says what was written (-v: in a pipe too).",
    pack_options, cmd_pack};
