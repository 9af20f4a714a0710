/* cli.c — opening a command's SOURCE, and names in tables (cli.h). */
#include "cli.h"

#include <stdio.h>

#include "../checkpoint/open.h"

int cli_open_source(http_remote *remote, const char *source, ck_index **ix)
{
    ck_error err;
    if (ck_open_through(remote, source, ix, &err) == 0)
        return 0;
    fprintf(stderr, "ckpt: %s\n", err.msg);
    return -1;
}

/* A name in a table: tabs, newlines and other control bytes would break its columns, so they
 * are written \xNN, and a backslash is doubled; --json has every name exactly. */
void cli_print_name(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\')
            fputs("\\\\", stdout);
        else if (c < 0x20 || c == 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
}
