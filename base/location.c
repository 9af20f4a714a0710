/* location.c — locations: which scheme, and how they are shown (location.h). */
#include "location.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int ck_location_scheme(const char *loc)
{
    if (strncasecmp(loc, "http://", 7) == 0 || strncasecmp(loc, "https://", 8) == 0)
        return CK_SCHEME_HTTP;
    if (strncmp(loc, "hf://", CK_HUB_SCHEME_LEN) == 0)
        return CK_SCHEME_HUB;
    if (strncmp(loc, "s3://", CK_S3_SCHEME_LEN) == 0)
        return CK_SCHEME_S3;
    return CK_SCHEME_PATH;
}

int ck_location_is_url(const char *loc)
{
    return ck_location_scheme(loc) != CK_SCHEME_PATH;
}

/* Where loc's userinfo lies: [*from, *from + *len), the part of its authority (between "://" and
 * the first '/', '?' or '#', RFC 3986) before the last '@'; *len is 0 when there is none. */
static void userinfo(const char *loc, size_t *from, size_t *len)
{
    *from = *len = 0;
    if (ck_location_scheme(loc) != CK_SCHEME_HTTP) /* hf:// and s3:// have none (hf's '@' names
                                                     * a revision) */
        return;
    *from = (size_t)(strstr(loc, "://") - loc) + 3;
    size_t auth = *from + strcspn(loc + *from, "/?#");
    for (size_t i = *from; i < auth; i++)
        if (loc[i] == '@')
            *len = i + 1 - *from;
}

char *ck_location_shown(const char *loc, char *buf, size_t cap)
{
    size_t from, len, end = ck_location_is_url(loc) ? strcspn(loc, "?#") : strlen(loc);
    userinfo(loc, &from, &len);
    snprintf(buf, cap, "%.*s%.*s", (int)from, loc, (int)(end - from - len), loc + from + len);
    return buf;
}

int ck_location_hide_args(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        char shown[CK_SHOWN_MAX];
        size_t n = strlen(argv[i]);
        if (!ck_location_is_url(argv[i]) ||
            strlen(ck_location_shown(argv[i], shown, sizeof shown)) == n)
            continue;
        char *copy = strdup(argv[i]);
        if (!copy)
            return -1;
        /* The kernel shows the argument block itself: the secret goes from there. */
        memset(argv[i], 0, n);
        memcpy(argv[i], shown, strlen(shown));
        argv[i] = copy;
    }
    return 0;
}
