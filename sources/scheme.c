/* scheme.c — what a location names, released; the name checks and encoding every scheme's
 * URLs use (scheme.h). */
#include "scheme.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ck_located_free(ck_located *t)
{
    for (size_t i = 0; i < t->n; i++)
        free(t->names[i]);
    free(t->names);
    free(t->url);
    *t = (ck_located){0};
}

void ck_listing_free(ck_listing *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->names[i]);
    free(l->names);
    *l = (ck_listing){0};
}

int ck_listing_add(ck_listing *l, char *name)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        char **grown = realloc(l->names, cap * sizeof *grown);
        if (!grown)
            return -1;
        l->names = grown;
        l->cap = cap;
    }
    l->names[l->n++] = name;
    return 0;
}

int ck_list(const http_client *c, const char *loc, const ck_pager *p, ck_located *t,
            ck_error *err)
{
    ck_listing got = {0}, *l = &got;
    char *token = NULL, url[16384];
    size_t total = 0;
    int rc = 0;
    for (unsigned page = 0; rc == 0; page++) {
        if (page == p->max_pages) {
            rc = ck_fail(err, loc, "lists more than %u pages of objects", p->max_pages);
            break;
        }
        int fits = p->page_url(p->ctx, token, url, sizeof url) == 0;
        free(token);
        token = NULL;
        if (!fits) {
            rc = ck_fail(err, loc, "the listing's URL is too long");
            break;
        }
        char *body = NULL;
        size_t len = 0;
        rc = http_get(c, url, p->max_page, &body, &len, err);
        if (rc != 0) {
            char why[sizeof err->msg];
            snprintf(why, sizeof why, "%s", ck_error_detail(err, url));
            rc = ck_fail(err, loc, "cannot list it (page %u): %s", page + 1, why);
        } else if ((total += len) > p->max_total) {
            rc = ck_fail(err, loc, "its listing is over %zu MiB", p->max_total >> 20);
        } else {
            rc = p->parse(p->ctx, body, len, l, &token, loc, err);
        }
        free(body);
        if (rc == 0 && !token)
            break;
    }
    free(token);
    if (rc) {
        ck_listing_free(l);
        ck_located_free(t);
        return -1;
    }
    t->names = l->names; /* t takes them */
    t->n = l->n;
    return 0;
}

int ck_bad_segments(const char *key, size_t len)
{
    for (size_t at = 0; at < len;) {
        size_t n = strcspn(key + at, "/");
        if (n > len - at)
            n = len - at;
        int last = at + n >= len;
        if ((n == 0 && !last) || (n == 1 && key[at] == '.') ||
            (n == 2 && key[at] == '.' && key[at + 1] == '.'))
            return 1;
        at += n + 1;
    }
    return 0;
}

int ck_url_encode(const char *s, int keep_slash, char *out, size_t cap, size_t *at)
{
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        int plain = (*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') ||
                    (*c >= '0' && *c <= '9') || strchr("-._~", *c) || (keep_slash && *c == '/');
        int n = plain ? snprintf(out + *at, cap - *at, "%c", *c)
                      : snprintf(out + *at, cap - *at, "%%%02X", *c);
        if (n < 0 || (size_t)n >= cap - *at)
            return -1;
        *at += (size_t)n;
    }
    return 0;
}

