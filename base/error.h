/* error.h — one-line error messages, "FILE: what is wrong (where)".
 * Contract: every function that can fail on bad input fills a caller-owned ck_error and returns
 * -1 (or NULL); the message never holds a newline, so a tool prints it as exactly one line.
 */
#ifndef CK_ERROR_H
#define CK_ERROR_H

typedef struct ck_error {
    char msg[1280];
} ck_error;

/* Sets err to "FILE: " + the formatted text, control characters replaced by '?'. FILE is shown
 * as ck_location_shown (location.h) has it: a URL without its secrets; one longer than 1,100
 * bytes with its middle cut out ("HEAD...TAIL"), so the text always follows it. Returns -1. */
int ck_fail(ck_error *err, const char *file, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* msg (a message made apart from ck_fail, quoting another process's text) with each control
 * character replaced by '?', as ck_fail does: one line whatever the text held. Returns msg. */
char *ck_one_line(char *msg);

/* err's message without the "FILE: " ck_fail put in front of it for file: what is wrong alone
 * (a pointer into err->msg), or the whole message when it does not start so. */
const char *ck_error_detail(const ck_error *err, const char *file);

#endif
