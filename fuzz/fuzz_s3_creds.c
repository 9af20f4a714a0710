/* fuzz_s3_creds.c — what credential providers read (s3.c): the input's first byte picks the
 * container endpoint's and instance metadata's JSON, STS AssumeRoleWithWebIdentity's XML, a
 * shared credentials or config file (INI), or a container credentials URL; the rest is the
 * document. Found credentials must fit their fields NUL-terminated. */
#include "../sources/s3.h"
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>

static void check_found(const http_sigv4 *s)
{
    FUZZ_REQUIRE(memchr(s->access_key, 0, sizeof s->access_key));
    FUZZ_REQUIRE(memchr(s->secret_key, 0, sizeof s->secret_key));
    FUZZ_REQUIRE(memchr(s->session_token, 0, sizeof s->session_token));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const char *const sections[] = {"default", "profile lab"};
    static const char *const keys[] = {"aws_access_key_id", "aws_secret_access_key",
                                       "aws_session_token", "region"};
    unsigned which = data[0] % 4;
    char *doc = malloc(size); /* the rest, NUL-terminated as the transport and files hand it */
    FUZZ_REQUIRE(doc != NULL);
    memcpy(doc, data + 1, size - 1);
    doc[size - 1] = 0;
    http_sigv4 s = {0};
    time_t expires = 0;
    char out[4096], why[256] = "";
    if (which == 0 && s3_json_credentials(doc, size - 1, &s, &expires))
        check_found(&s);
    if (which == 1 && s3_sts_credentials(doc, size - 1, &s, &expires))
        check_found(&s);
    if (which == 2) {
        unsigned pick = size > 1 ? data[1] : 0;
        if (s3_ini_find(doc, sections[pick % 2], keys[(pick / 2) % 4], out, sizeof out))
            FUZZ_REQUIRE(memchr(out, 0, sizeof out));
    }
    if (which == 3 && !s3_container_url_allowed(doc, why, sizeof why))
        FUZZ_REQUIRE(why[0] && memchr(why, 0, sizeof why));
    free(doc);
    return 0;
}
