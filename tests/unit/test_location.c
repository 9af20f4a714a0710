/* Locations: which scheme a location has (RFC 3986: schemes are case-insensitive; hf:// is the
 * Hub's own, as huggingface_hub spells it), and how one is shown without its secrets. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/location.h"

Test(location, schemes)
{
    cr_expect(ck_location_is_http("http://h/m"));
    cr_expect(ck_location_is_http("HTTPS://h/m"));
    cr_expect(!ck_location_is_http("hf://org/repo"));
    cr_expect(ck_location_is_url("hf://org/repo"));
    cr_expect(ck_location_is_url("s3://b/k"));
    cr_expect(ck_location_is_url("gs://b/k"));
    cr_expect(!ck_location_is_url("HF://org/repo"));
    cr_expect(!ck_location_is_url("http:/h"));
    cr_expect(!ck_location_is_url("./http://x"));
    cr_expect(!ck_location_is_url("://x"));
    cr_expect(ck_location_is_url("https://h/m"));
    cr_expect(!ck_location_is_url("model.safetensors"));
}

Test(location, shown_source_has_no_secrets)
{
    static const char *const cases[][2] = {
        {"https://bucket.example/m.safetensors?X-Amz-Signature=secret#f",
         "https://bucket.example/m.safetensors"},
        {"http://alice:pw@127.0.0.1:8080/a/m.gguf", "http://127.0.0.1:8080/a/m.gguf"},
        {"HTTPS://alice@h/m?sig=1", "HTTPS://h/m"},
        {"http://u:p@ss@h", "http://h"},              /* the authority's last '@' ends it */
        {"http://h/a@b/m#x", "http://h/a@b/m"},       /* an '@' in the path is no userinfo */
        {"http://h?u:p@x/y", "http://h"},             /* nor one in the query */
        {"hf://org/repo@v1.0/m.safetensors", "hf://org/repo@v1.0/m.safetensors"},
        {"ftp://u:pw@h/m?x", "ftp://h/m"}, /* any scheme's userinfo, a scheme unread too */
        {"gs://bkt/o/m.safetensors#f", "gs://bkt/o/m.safetensors"},
        {"dir/m@1.safetensors?x#y", "dir/m@1.safetensors?x#y"}, /* a path is shown as is */
    };
    char out[128];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        cr_expect_str_eq(ck_location_shown(cases[i][0], out, sizeof out), cases[i][1]);
    cr_expect_str_eq(ck_location_shown("http://u:p@host/long", out, 10), "http://ho",
                     "cut to fit");
}

Test(location, hidden_args_keep_their_value)
{
    char block[] = "prog\0http://u:pw@h/m?sig=S\0/mnt\0";
    char *argv[] = {block, block + 5, block + 27, NULL};
    cr_assert_eq(ck_location_hide_args(3, argv), 0);
    cr_expect_str_eq(argv[1], "http://u:pw@h/m?sig=S", "the program reads the whole URL");
    cr_expect_str_eq(argv[2], "/mnt");
    cr_expect_str_eq(block + 5, "http://h/m", "the argument block holds the shown form");
    for (size_t i = 5 + strlen("http://h/m"); i < 27; i++)
        cr_expect_eq(block[i], 0, "NUL after it (byte %zu)", i);
    cr_expect_eq(argv[0], block);
    free(argv[1]);
}
