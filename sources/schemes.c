/* schemes.c — the table of remote schemes (schemes.h). */
#include "schemes.h"
#include "gcs.h"
#include "hub.h"
#include "s3.h"

#include <stdio.h>
#include <string.h>

/* A URL of http(s): read as it is, with no credential of ours. */
static const ck_scheme http_scheme = {.name = "http(s)", .is = http_is_url};

static const ck_scheme *const rows[] = {&http_scheme, &hub_scheme, &s3_scheme, &gcs_scheme};

enum { NROWS = sizeof rows / sizeof *rows };

const ck_scheme *ck_scheme_of(const char *loc)
{
    for (size_t i = 0; i < NROWS; i++)
        if (rows[i]->is(loc))
            return rows[i];
    return NULL;
}

void ck_scheme_names(char *out, size_t cap)
{
    size_t at = 0;
    out[0] = 0;
    for (size_t i = 0; i < NROWS && at < cap; i++) {
        int n = snprintf(out + at, cap - at, "%s%s", i ? ", " : "", rows[i]->name);
        at += n > 0 ? (size_t)n : 0;
    }
}

/* The first row that authorises url (1, or -1 with out->error set), else 0; rows an anonymous
 * remote leaves unsigned skipped when anonymous. */
static int authorize(const char *url, int anonymous, http_auth *out)
{
    for (size_t i = 0; i < NROWS; i++) {
        if (!rows[i]->authorize || (anonymous && rows[i]->anonymous_unsigned))
            continue;
        int rc = rows[i]->authorize(url, out);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int ck_schemes_authorize(const char *url, http_auth *out)
{
    return authorize(url, 0, out);
}

int ck_schemes_authorize_anonymous(const char *url, http_auth *out)
{
    return authorize(url, 1, out);
}

int ck_schemes_explain(const char *body, char *out, size_t cap)
{
    for (size_t i = 0; i < NROWS; i++)
        if (rows[i]->explain && rows[i]->explain(body, out, cap))
            return 1;
    return 0;
}
