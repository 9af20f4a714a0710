#include "error.h"
#include "location.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* FILE as a message names it: as ck_location_shown shows it (a URL without its secrets), its
 * middle cut out when it is longer than FILE_IN_MESSAGE bytes, so that what is wrong always
 * fits after it and both of its ends stay readable. Any s3:// object is shown whole (a bucket
 * of at most 63 bytes, a key of at most 1,024), and so is a local path of that length. */
enum { FILE_IN_MESSAGE = 1100, FILE_HEAD = 550 };

static const char *message_file(const char *file, char *out, size_t cap)
{
    char small[CK_SHOWN_MAX];
    size_t len = strlen(file);
    char *big = len >= sizeof small ? malloc(len + 1) : NULL; /* the tail of a long one too */
    char *shown = ck_location_shown(file, big ? big : small, big ? len + 1 : sizeof small);
    size_t n = strlen(shown);
    if (n <= FILE_IN_MESSAGE)
        snprintf(out, cap, "%.*s", FILE_IN_MESSAGE, shown);
    else
        snprintf(out, cap, "%.*s...%.*s", FILE_HEAD, shown, FILE_IN_MESSAGE - FILE_HEAD - 3,
                 shown + n - (FILE_IN_MESSAGE - FILE_HEAD - 3));
    free(big);
    return out;
}

int ck_fail(ck_error *err, const char *file, const char *fmt, ...)
{
    if (!err)
        return -1;
    char shown[FILE_IN_MESSAGE + 1];
    int n = snprintf(err->msg, sizeof err->msg, "%s: ", message_file(file, shown, sizeof shown));
    if (n < 0 || (size_t)n >= sizeof err->msg)
        n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg + n, sizeof err->msg - (size_t)n, fmt, ap);
    va_end(ap);
    /* Names quoted into messages come from the checkpoint: keep the message one line. */
    ck_one_line(err->msg);
    return -1;
}

char *ck_one_line(char *msg)
{
    for (char *p = msg; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    return msg;
}

const char *ck_error_detail(const ck_error *err, const char *file)
{
    char shown[FILE_IN_MESSAGE + 1];
    size_t n = strlen(message_file(file, shown, sizeof shown));
    return strncmp(err->msg, shown, n) == 0 && strncmp(err->msg + n, ": ", 2) == 0
               ? err->msg + n + 2 : err->msg;
}
