/* The schemes' table: which row a location is, the refusal of a scheme no row knows (by
 * name, not as a missing file), and an error reply explained in its scheme's words. */
#include <criterion/criterion.h>
#include <string.h>

#include "../../sources/http.h"
#include "../../sources/schemes.h"

Test(schemes, rows)
{
    cr_expect_str_eq(ck_scheme_of("gs://bkt/k")->name, "gs");
    cr_expect_str_eq(ck_scheme_of("s3://bkt/k")->name, "s3");
    cr_expect_str_eq(ck_scheme_of("hf://org/repo")->name, "hf");
    cr_expect_str_eq(ck_scheme_of("HTTPS://h/m")->name, "http(s)");
    cr_expect_null(ck_scheme_of("model.safetensors"));
    cr_expect_null(ck_scheme_of("ftp://h/m"));
    char names[128];
    ck_scheme_names(names, sizeof names);
    cr_expect_str_eq(names, "http(s), hf, s3, gs");
}

Test(schemes, an_unknown_scheme_is_refused_by_name)
{
    http_remote *r = http_remote_new(&(http_config){0});
    cr_assert(r);
    ck_file f;
    ck_error err;
    cr_expect_eq(ck_source_open(r, "ftp://user:pw@h/m.safetensors", NULL, &f, &err), -1);
    cr_expect(strstr(err.msg, "ftp://h/m.safetensors: not a scheme ckptfs reads (http(s), hf, "
                     "s3, gs)") != NULL, "%s", err.msg);
    cr_expect(!strstr(err.msg, "pw"), "%s", err.msg);
    http_remote_free(r);
}

Test(schemes, error_replies_in_each_schemes_words)
{
    char out[128];
    cr_assert(ck_schemes_explain("<Error><Code>SignatureDoesNotMatch</Code></Error>", out,
                                 sizeof out));
    cr_expect_str_eq(out, "SignatureDoesNotMatch: check the secret key, the region and this "
                     "machine's clock");
    cr_assert(ck_schemes_explain("{\"error\":{\"code\":403,\"errors\":[{\"reason\":\"forbidden\""
                                 "}]}}", out, sizeof out));
    cr_expect_str_eq(out, "forbidden");
    cr_expect(!ck_schemes_explain("{\"error\":{\"errors\":[{\"reason\":\"a b\\r\\nX: y\"}]}}",
                                  out, sizeof out), "a reason of other characters is not shown");
    cr_expect(!ck_schemes_explain("<html>busy</html>", out, sizeof out));
}
