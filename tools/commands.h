/* commands.h — the ckpt commands, one file each (tools/NAME.c), for ckpt.c's table.
 * Contract: each file exports one ck_command, ckpt_NAME: its name, its usage line, its help
 * text and its options (what `ckpt NAME --help` prints: the usage line and help text beside the
 * code that does what they say), and its run function. run takes the command's argv (argv[0] =
 * the command name, --help already handled by ckpt.c) and the run's remote context (cli.h),
 * prints one line "ckpt: FILE: what" on trouble and returns the exit status: 0, 1 on failure,
 * 2 (CK_USAGE) on bad usage; diff 0 (same), 1 (different), 2 (trouble). What the commands share
 * is cli.h's (and loading.h's for load and serve), not ckpt.c's: a command never calls another.
 */
#ifndef CK_COMMANDS_H
#define CK_COMMANDS_H

#include <stddef.h>
#include <stdint.h>

#include "../base/size.h" /* ck_parse_size: counts and sizes of options */
#include "../sources/http.h"
#include "options.h"

typedef struct ck_command {
    const char *name;
    const char *usage; /* "ckpt NAME ...": one line */
    const char *help;  /* what it does, lines of at most 95 characters */
    const ck_option *options;
    int (*run)(int argc, char **argv, http_remote *remote); /* remote: cli.h */
} ck_command;

extern const ck_command ckpt_ls, ckpt_cat, ckpt_pack, ckpt_convert, ckpt_verify, ckpt_load,
    ckpt_serve, ckpt_diff, ckpt_info, ckpt_stats;

#endif
