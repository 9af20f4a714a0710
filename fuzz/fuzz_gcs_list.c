/* fuzz_gcs_list.c — an objects.list page (gcs.c): the input is PREFIX '\n' JSON; the page is
 * parsed twice into one listing, as a second page would be, so the bounds kept across pages
 * are crossed too. What it keeps must be names directly under the prefix: non-empty, without
 * '/', within the listing's bounds; a page token is non-empty. */
#include "../sources/gcs.h"
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nl = memchr(data, '\n', size < 256 ? size : 256);
    size_t plen = nl ? (size_t)(nl - data) : 0, jlen = nl ? size - plen - 1 : size;
    char *prefix = strndup((const char *)data, plen);
    char *json = malloc(jlen + 1); /* the transport hands a page NUL-terminated */
    FUZZ_REQUIRE(prefix && json);
    memcpy(json, nl ? nl + 1 : data, jlen);
    json[jlen] = 0;
    ck_listing l = {0};
    for (int page = 0; page < 2; page++) {
        ck_error err = {{0}};
        char *token = NULL;
        int rc = gcs_parse_listing(json, jlen, prefix, &l, &token, "gs://fuzz/p/", &err);
        fuzz_check(rc, NULL, &err);
        FUZZ_REQUIRE(rc != 0 || !token || token[0]);
        free(token);
        if (rc != 0)
            break;
    }
    FUZZ_REQUIRE(l.n <= l.keys && l.keys <= GCS_MAX_KEYS && l.name_bytes <= GCS_MAX_NAME_BYTES);
    for (size_t i = 0; i < l.n; i++)
        FUZZ_REQUIRE(l.names[i][0] && !strchr(l.names[i], '/'));
    ck_listing_free(&l);
    free(json);
    free(prefix);
    return 0;
}
