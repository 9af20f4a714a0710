/* commands.h — the ckpt commands that live outside tools/ckpt.c, and the helpers of ckpt.c
 * they share.
 * Contract: each takes the command's argv (argv[0] = the command name, --help already handled
 * by ckpt.c), prints one line "ckpt: FILE: what" on trouble and returns the exit status; a
 * command whose usage line and help text live beside it exports them for ckpt.c's table.
 */
#ifndef CK_COMMANDS_H
#define CK_COMMANDS_H

#include <stddef.h>
#include <stdint.h>

#include "../base/size.h" /* parse_size: counts and sizes of options */
#include "options.h"

/* tools/convert.c */
int cmd_convert(int argc, char **argv);
extern const char convert_usage[], convert_help[];
extern const ck_option convert_options[];

/* tools/diff.c, info.c, stats.c: diff exits 0 (same), 1 (different), 2 (trouble); info and stats
 * 0, or 1/2. */
int cmd_diff(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_stats(int argc, char **argv);
extern const ck_option diff_options[], info_options[], stats_options[];

struct ck_index;

/* tools/ckpt.c: ck_open, its error said on one line "ckpt: FILE: what"; 0 or -1. */
int open_source(const char *source, struct ck_index **ix);
/* tools/ckpt.c: a name on one line: control bytes as \xNN, '\\' doubled (as ckpt ls). */
void print_name(const char *s, size_t len);

#endif
