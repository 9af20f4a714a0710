/* progress.h — the progress bar of long ckpt commands, and their Ctrl-C.
 * Contract: a bar is drawn on stderr only when stderr is a terminal, at most 10 times a second:
 * label, bar, bytes done of total (GiB), rate (MiB a second), ETA. ck_progress_tick has the
 * ck_progress signature and returns non-zero once SIGINT, SIGTERM or SIGHUP has arrived (after
 * ck_progress_catch_signals), so the command can stop and clean up instead of dying half-way;
 * ck_progress_die_if_interrupted then ends the process by that signal, as coreutils do, so
 * that the shell sees 128+N and a loop around the command stops too.
 */
#ifndef CK_TOOLS_PROGRESS_H
#define CK_TOOLS_PROGRESS_H

#include <stdint.h>

typedef struct ck_bar {
    const char *label;
    double start, last;  /* seconds */
    int tty, drawn;
} ck_bar;

void ck_progress_catch_signals(void);
void ck_progress_die_if_interrupted(void);

void ck_bar_start(ck_bar *b, const char *label);
int ck_progress_tick(void *bar, uint64_t done, uint64_t total);
/* Seconds since ck_bar_start. */
double ck_bar_seconds(const ck_bar *b);
/* Ends the bar's line, if one was drawn. */
void ck_bar_end(ck_bar *b);

#endif
