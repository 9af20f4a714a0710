/* s3:// without a server: location parsing, the endpoint and addressing AWS documents
 * (virtual-hosted, path-style for dotted buckets and custom endpoints), the credential order
 * of the AWS SDKs (environment, then the shared credentials file, then the config file's
 * profile), which origins get signed, and ListObjectsV2 pages as AWS's API reference shows
 * them. The real server's behaviour is tests/integration's. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "../../pack/s3.h"
#include "helpers.h"

static void clean_env(void)
{
    static const char *const vars[] = {
        "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION",
        "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
        "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        unsetenv(vars[i]);
    setenv("HOME", "/nonexistent-home", 1);
    /* no chain may end at 169.254.169.254 here: nothing but the loopback is ever tried */
    setenv("AWS_EC2_METADATA_DISABLED", "true", 1);
}

TestSuite(s3, .init = clean_env, .fini = tmp_cleanup);

static const char *tmp_text(const char *text)
{
    return tmp_file(text, strlen(text));
}

Test(s3, locations)
{
    s3_ref r;
    ck_error err;
    cr_assert_eq(s3_parse("s3://my-bucket/models/llama/model.safetensors", &r, &err), 0, "%s",
                 err.msg);
    cr_expect_str_eq(r.bucket, "my-bucket");
    cr_expect_str_eq(r.key, "models/llama/model.safetensors");
    cr_assert_eq(s3_parse("s3://my.bucket/prefix/", &r, &err), 0);
    cr_expect_str_eq(r.key, "prefix/");
    cr_assert_eq(s3_parse("s3://bkt", &r, &err), 0);
    cr_expect_str_eq(r.key, "");
    const char *bad[] = {"s3://ab/x", "s3://UPPER/x", "s3://b_u_c/x", "s3://bucket/a//b",
                         "s3://bucket/a/../b", "s3://bucket/./b", "s3://bucket/a?x", "hf://a/b"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_expect_eq(s3_parse(bad[i], &r, &err), -1, "%s", bad[i]);
}

Test(s3, addressing)
{
    char *u = s3_object_url("bucket", "a b/c+d.safetensors");
    cr_expect_str_eq(u, "https://bucket.s3.us-east-1.amazonaws.com/a%20b/c%2Bd.safetensors");
    free(u);
    setenv("AWS_REGION", "eu-west-3", 1);
    u = s3_object_url("my.bucket", "k");
    cr_expect_str_eq(u, "https://s3.eu-west-3.amazonaws.com/my.bucket/k", "dotted: path-style");
    free(u);
    setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000/", 1);
    u = s3_object_url("bucket", "k");
    cr_expect_str_eq(u, "http://127.0.0.1:9000/bucket/k");
    free(u);
    setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9001", 1);
    u = s3_object_url("bucket", "k");
    cr_expect_str_eq(u, "http://127.0.0.1:9001/bucket/k", "the S3-specific one wins");
    free(u);
}

Test(s3, credentials_in_the_sdks_order)
{
    http_sigv4 s;
    const char *creds = tmp_text("[default]\naws_access_key_id = FILEKEY\n"
                                      "aws_secret_access_key=FILESECRET\n"
                                      "[other]\naws_access_key_id = OTHERKEY\n"
                                      "aws_secret_access_key = OTHERSECRET\n"
                                      "aws_session_token = OTHERTOKEN\n");
    const char *config = tmp_text("[default]\nregion = ap-south-1\n"
                                       "[profile cfg]\naws_access_key_id = CFGKEY\n"
                                       "aws_secret_access_key = CFGSECRET\nregion = sa-east-1\n");
    const char *url = "https://b.s3.ap-south-1.amazonaws.com/k";
    cr_expect_eq(s3_sign_for(url, &s), 0, "nothing anywhere: unsigned");
    setenv("AWS_SHARED_CREDENTIALS_FILE", creds, 1);
    setenv("AWS_CONFIG_FILE", config, 1);
    cr_assert_eq(s3_sign_for(url, &s), 1);
    cr_expect(strcmp(s.access_key, "FILEKEY") == 0 && strcmp(s.secret_key, "FILESECRET") == 0);
    cr_expect_str_eq(s.region, "ap-south-1", "the profile's region");
    setenv("AWS_PROFILE", "other", 1);
    cr_expect_eq(s3_sign_for("https://b.s3.us-east-1.amazonaws.com/k", &s), 1);
    cr_expect_str_eq(s.session_token, "OTHERTOKEN");
    setenv("AWS_PROFILE", "cfg", 1);
    cr_expect_eq(s3_sign_for("https://b.s3.sa-east-1.amazonaws.com/k", &s), 1);
    cr_expect_str_eq(s.access_key, "CFGKEY", "the config file's profile, last");
    setenv("AWS_ACCESS_KEY_ID", "ENVKEY", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "ENVSECRET", 1);
    setenv("AWS_REGION", "us-west-2", 1);
    cr_expect_eq(s3_sign_for("https://b.s3.us-west-2.amazonaws.com/k", &s), 1);
    cr_expect(strcmp(s.access_key, "ENVKEY") == 0 && s.session_token[0] == 0, "env first");
}

Test(s3, only_the_endpoints_origin_is_signed)
{
    http_sigv4 s;
    setenv("AWS_ACCESS_KEY_ID", "K", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "S", 1);
    cr_expect_eq(s3_sign_for("https://bucket.s3.us-east-1.amazonaws.com/k", &s), 1);
    cr_expect_eq(s3_sign_for("https://s3.us-east-1.amazonaws.com/b.c/k", &s), 1);
    const char *not_ours[] = {"https://evil.example/k", "http://bucket.s3.us-east-1.amazonaws.com/k",
                              "https://bucket.s3.us-east-1.amazonaws.com.evil.example/k",
                              "https://xs3.us-east-1.amazonaws.com/k",
                              "https://bucket.s3.eu-west-1.amazonaws.com/k"};
    for (size_t i = 0; i < sizeof not_ours / sizeof *not_ours; i++) {
        cr_expect_eq(s3_sign_for(not_ours[i], &s), 0, "%s", not_ours[i]);
        cr_expect_eq(s.access_key[0], 0, "nothing left in it");
    }
    setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000", 1);
    cr_expect_eq(s3_sign_for("http://127.0.0.1:9000/b/k", &s), 1);
    cr_expect_eq(s3_sign_for("http://127.0.0.1:9001/b/k", &s), 0);
    cr_expect_eq(s3_sign_for("https://bucket.s3.us-east-1.amazonaws.com/k", &s), 0);
}

Test(s3, listing_pages)
{
    /* The shape of AWS's ListObjectsV2 example, keys with entities and a sub-prefix */
    const char *page = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                       "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
                       "<Name>b</Name><Prefix>m/</Prefix><KeyCount>3</KeyCount>"
                       "<MaxKeys>3</MaxKeys><IsTruncated>true</IsTruncated>"
                       "<NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM="
                       "</NextContinuationToken>"
                       "<Contents><Key>m/model-00001-of-00002.safetensors</Key><Size>5</Size>"
                       "<ETag>&quot;abc&quot;</ETag></Contents>"
                       "<Contents><Key>m/a&amp;b.safetensors</Key><Size>1</Size></Contents>"
                       "<Contents><Key>m/deeper/x.bin</Key><Size>1</Size></Contents>"
                       "<CommonPrefixes><Prefix>m/sub/</Prefix></CommonPrefixes>"
                       "</ListBucketResult>";
    char **names = NULL, *token = NULL;
    size_t n = 0;
    ck_error err;
    cr_assert_eq(s3_parse_listing(page, "m/", &names, &n, &token, "L", &err), 0, "%s", err.msg);
    cr_assert_eq(n, 2, "only what is directly under the prefix");
    cr_expect_str_eq(names[0], "model-00001-of-00002.safetensors");
    cr_expect_str_eq(names[1], "a&b.safetensors");
    cr_expect_str_eq(token, "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=");
    free(token);
    const char *last = "<ListBucketResult><IsTruncated>false</IsTruncated>"
                       "<Contents><Key>m/z.safetensors</Key></Contents></ListBucketResult>";
    cr_assert_eq(s3_parse_listing(last, "m/", &names, &n, &token, "L", &err), 0);
    cr_expect(n == 3 && token == NULL);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    const char *bad[] = {"<Error><Code>AccessDenied</Code></Error>",
                         "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
                         "<ListBucketResult><Contents><Key>m/&bogus;</Key></Contents>"
                         "</ListBucketResult>"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        names = NULL, n = 0;
        cr_expect_eq(s3_parse_listing(bad[i], "m/", &names, &n, &token, "L", &err), -1, "%s",
                     bad[i]);
        for (size_t k = 0; k < n; k++)
            free(names[k]);
        free(names);
    }
}
