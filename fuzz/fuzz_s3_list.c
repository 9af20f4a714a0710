/* fuzz_s3_list.c — a ListObjectsV2 page (s3.c): the input is PREFIX '\n' XML; the page is
 * parsed twice into one listing, as a second page would be, so the bounds kept across pages
 * are crossed too. What it keeps must be names directly under the prefix: non-empty, without
 * '/', within the listing's bounds; a continuation token is non-empty. */
#include "../sources/s3.h"
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nl = memchr(data, '\n', size < 256 ? size : 256);
    size_t plen = nl ? (size_t)(nl - data) : 0, xlen = nl ? size - plen - 1 : size;
    char *prefix = strndup((const char *)data, plen);
    char *xml = malloc(xlen + 1); /* the transport hands a page NUL-terminated */
    FUZZ_REQUIRE(prefix && xml);
    memcpy(xml, nl ? nl + 1 : data, xlen);
    xml[xlen] = 0;
    ck_listing l = {0};
    for (int page = 0; page < 2; page++) {
        ck_error err = {{0}};
        char *token = NULL;
        int rc = s3_parse_listing(xml, xlen, prefix, &l, &token, "s3://fuzz/p/", &err);
        fuzz_check(rc, NULL, &err);
        FUZZ_REQUIRE(rc != 0 || !token || token[0]);
        free(token);
        if (rc != 0)
            break;
    }
    FUZZ_REQUIRE(l.n <= l.keys && l.keys <= S3_MAX_KEYS && l.name_bytes <= S3_MAX_NAME_BYTES);
    for (size_t i = 0; i < l.n; i++)
        FUZZ_REQUIRE(l.names[i][0] && !strchr(l.names[i], '/'));
    ck_listing_free(&l);
    free(xml);
    free(prefix);
    return 0;
}
