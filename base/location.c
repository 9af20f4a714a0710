/* location.c — locations: a path or a URL, and how they are shown (location.h). */
#include "location.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int ck_location_is_http(const char *loc)
{
    return strncasecmp(loc, "http://", 7) == 0 || strncasecmp(loc, "https://", 8) == 0;
}

int ck_location_is_url(const char *loc)
{
    if (ck_location_is_http(loc))
        return 1;
    if (!(*loc >= 'a' && *loc <= 'z'))
        return 0;
    size_t n = 1 + strspn(loc + 1, "abcdefghijklmnopqrstuvwxyz0123456789+-.");
    return strncmp(loc + n, "://", 3) == 0;
}

/* Where loc's userinfo lies: [*from, *from + *len), the part of its authority (between "://" and
 * the first '/', '?' or '#', RFC 3986) before the last '@'; *len is 0 when there is none. */
static void userinfo(const char *loc, size_t *from, size_t *len)
{
    *from = *len = 0;
    if (!ck_location_is_url(loc)) /* any scheme's: hf://'s '@' (a revision) follows a '/' */
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
