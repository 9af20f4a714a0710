#include "error.h"
#include "location.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int ck_fail(ck_error *err, const char *file, const char *fmt, ...)
{
    if (!err)
        return -1;
    /* file may be a URL: its secrets never reach a message (ck_location_shown). */
    char shown[sizeof err->msg];
    int n = snprintf(err->msg, sizeof err->msg, "%s: ",
                     ck_location_shown(file, shown, sizeof shown));
    if (n < 0 || (size_t)n >= sizeof err->msg)
        n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg + n, sizeof err->msg - (size_t)n, fmt, ap);
    va_end(ap);
    /* Names quoted into messages come from the checkpoint: keep the message one line. */
    for (char *p = err->msg; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    return -1;
}

const char *ck_error_detail(const ck_error *err, const char *file)
{
    char shown[CK_SHOWN_MAX];
    size_t n = strlen(ck_location_shown(file, shown, sizeof shown));
    return strncmp(err->msg, shown, n) == 0 && strncmp(err->msg + n, ": ", 2) == 0
               ? err->msg + n + 2 : err->msg;
}
