/* cli.h — what every ckpt command does the same way with a checkpoint: opens its SOURCE, and
 * writes a name into a table.
 * Contract: the commands (tools/ckpt.c and the files commands.h names) call these; these call
 * no command, so the dispatcher and the commands never call each other. The remote context is
 * the one main made for the run (one block cache and disk cache for every source a command
 * opens), passed down, never kept here.
 */
#ifndef CK_CLI_H
#define CK_CLI_H

#include <stddef.h>

#include "../index/index.h"
#include "../sources/http.h"

/* ck_open of source through remote, its error said on one line "ckpt: FILE: what"; 0 or -1. */
int cli_open_source(http_remote *remote, const char *source, ck_index **ix);

/* A name on one line of stdout: control bytes as \xNN, '\\' doubled (as ckpt ls). */
void cli_print_name(const char *s, size_t len);

#endif
