/* commands.h — the ckpt commands that live outside tools/ckpt.c, for its table.
 * Contract: each takes the command's argv (argv[0] = the command name, --help already handled
 * by ckpt.c) and the run's remote context (cli.h), prints one line "ckpt: FILE: what" on
 * trouble and returns the exit status; a command whose usage line and help text live beside
 * it exports them for ckpt.c's table. What the commands share is cli.h's, not ckpt.c's.
 */
#ifndef CK_COMMANDS_H
#define CK_COMMANDS_H

#include <stddef.h>
#include <stdint.h>

#include "../base/size.h" /* ck_parse_size: counts and sizes of options */
#include "../sources/http.h"
#include "options.h"

/* tools/convert.c */
int cmd_convert(int argc, char **argv, http_remote *remote);
extern const char convert_usage[], convert_help[];
extern const ck_option convert_options[];

/* tools/diff.c, info.c, stats.c: diff exits 0 (same), 1 (different), 2 (trouble); info and stats
 * 0, or 1/2. */
int cmd_diff(int argc, char **argv, http_remote *remote);
int cmd_info(int argc, char **argv, http_remote *remote);
int cmd_stats(int argc, char **argv, http_remote *remote);
extern const ck_option diff_options[], info_options[], stats_options[];

#endif
