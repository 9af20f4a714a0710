/* s3:// without a server: location parsing, the endpoint and addressing AWS documents
 * (virtual-hosted, path-style for dotted buckets and custom endpoints), the credential order
 * of the AWS SDKs (environment, then the shared credentials file, then the config file's
 * profile), which origins get signed, and ListObjectsV2 pages as AWS's API reference shows
 * them. The real server's behaviour is tests/integration's. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "../../sources/s3.h"
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
    ck_listing l = {0};
    char *token = NULL;
    ck_error err;
    cr_assert_eq(s3_parse_listing(page, strlen(page), "m/", &l, &token, "L", &err), 0, "%s",
                 err.msg);
    cr_assert_eq(l.n, 2, "only what is directly under the prefix");
    cr_expect_eq(l.keys, 3);
    cr_expect_str_eq(l.names[0], "model-00001-of-00002.safetensors");
    cr_expect_str_eq(l.names[1], "a&b.safetensors");
    cr_expect_str_eq(token, "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=");
    free(token);
    const char *last = "<ListBucketResult><IsTruncated>false</IsTruncated>"
                       "<Contents><Key>m/z&#46;safe&#x74;ensors</Key></Contents>"
                       "</ListBucketResult>";
    cr_assert_eq(s3_parse_listing(last, strlen(last), "m/", &l, &token, "L", &err), 0);
    cr_expect(l.n == 3 && token == NULL);
    cr_expect_str_eq(l.names[2], "z.safetensors", "character references, decimal and hex");
    ck_listing_free(&l);
    const char *bad[] = {"<Error><Code>AccessDenied</Code></Error>",
                         "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
                         "<ListBucketResult><Contents><Key>m/&bogus;</Key></Contents>"
                         "</ListBucketResult>",
                         "<ListBucketResult><Contents><Key>m/&#128;</Key></Contents>"
                         "</ListBucketResult>",
                         /* a Key after the Contents that lacks one is not its key */
                         "<ListBucketResult><Contents></Contents><Contents><Key>m/a</Key>"
                         "</Contents></ListBucketResult>"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_expect_eq(s3_parse_listing(bad[i], strlen(bad[i]), "m/", &l, &token, "L", &err), -1,
                     "%s", bad[i]);
        ck_listing_free(&l);
    }
}

/* The page as many <Contents> of short keys as fit in bytes. */
static char *many_keys(size_t count)
{
    const char *one = "<Contents><Key>m/k</Key></Contents>";
    size_t n = strlen(one), head = strlen("<ListBucketResult>");
    char *page = malloc(head + count * n + 1);
    cr_assert(page);
    memcpy(page, "<ListBucketResult>", head);
    for (size_t i = 0; i < count; i++)
        memcpy(page + head + i * n, one, n);
    page[head + count * n] = 0;
    return page;
}

Test(s3, a_listings_bounds_are_checked_as_its_keys_arrive)
{
    ck_listing l = {0};
    char *token = NULL, *page = many_keys(S3_MAX_KEYS / 2);
    ck_error err;
    cr_assert_eq(s3_parse_listing(page, strlen(page), "m/", &l, &token, "s3://b/m/", &err), 0,
                 "%s", err.msg);
    cr_assert_eq(s3_parse_listing(page, strlen(page), "m/", &l, &token, "s3://b/m/", &err), 0,
                 "%s", err.msg);
    cr_expect_eq(l.keys, S3_MAX_KEYS, "at the bound: admitted");
    cr_expect_eq(s3_parse_listing(page, strlen(page), "m/", &l, &token, "s3://b/m/", &err), -1);
    cr_expect_eq(l.keys, S3_MAX_KEYS + 1, "refused at the first key over it, not the page's end");
    cr_expect_str_eq(err.msg, "s3://b/m/: lists more than 100000 objects");
    ck_listing_free(&l);
    free(page);
}

Test(s3, container_credentials_urls_by_their_parsed_host)
{
    char why[256];
    const char *ok[] = {"http://127.0.0.1:9911/creds", "http://127.1.2.3/x", "http://[::1]:80/c",
                        "http://169.254.170.2/v2/credentials/id", "http://169.254.170.23/v1/c",
                        "http://[fd00:ec2::23]/c", "http://localhost:8080/c",
                        "http://LOCALHOST/c", "https://creds.example.com/c"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        cr_expect(s3_container_url_allowed(ok[i], why, sizeof why), "%s: %s", ok[i], why);
    /* each names another host than its prefix suggests */
    const char *no[] = {"http://127.0.0.1@10.9.9.9/", "http://localhost:@10.9.9.9/",
                        "http://169.254.170.2:@10.9.9.9/", "http://[::1]@10.9.9.9/",
                        "http://169.254.170.2:@10.9.9.9:9/creds", "http://127.example.com/c",
                        "http://127.0.0.1.example.com/c", "http://localhost.example.com/c",
                        "http://169.254.170.22/c", "http://10.1.2.3/c", "http://[::2]/c",
                        "https://user:pw@creds.example.com/c", "ftp://127.0.0.1/c",
                        "http://169.254.170.2.nip.io/c", "not a url"};
    for (size_t i = 0; i < sizeof no / sizeof *no; i++) {
        why[0] = 0;
        cr_expect(!s3_container_url_allowed(no[i], why, sizeof why), "%s", no[i]);
        cr_expect(strstr(why, "container credentials URL") != NULL, "%s: %s", no[i], why);
    }
}

Test(s3, credential_documents)
{
    http_sigv4 s = {0};
    time_t exp;
    const char *json = "{\"AccessKeyId\":\"ASIA1\",\"SecretAccessKey\":\"sec\","
                       "\"Token\":\"tok\",\"Expiration\":\"2099-01-01T00:00:00Z\"}";
    cr_assert_eq(s3_json_credentials(json, strlen(json), &s, &exp), 1);
    cr_expect(strcmp(s.access_key, "ASIA1") == 0 && strcmp(s.session_token, "tok") == 0);
    cr_expect_eq(exp, 4070908800);
    cr_expect_eq(s3_json_credentials("{\"AccessKeyId\":1}", 16, &s, &exp), 0);
    const char *sts = "<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult>"
                      "<Credentials><AccessKeyId>ASIA2</AccessKeyId><SecretAccessKey>s2"
                      "</SecretAccessKey><SessionToken>t2</SessionToken></Credentials>"
                      "</AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>";
    cr_assert_eq(s3_sts_credentials(sts, strlen(sts), &s, &exp), 1);
    cr_expect(strcmp(s.secret_key, "s2") == 0 && exp == 0);
    cr_expect_eq(s3_sts_credentials(sts, 60, &s, &exp), 0, "never past the length given");
    char ini[] = "[default]\nregion = x\n[profile lab]\n; c\naws_access_key_id = AKID \n";
    char out[64];
    cr_expect(s3_ini_find(ini, "profile lab", "aws_access_key_id", out, sizeof out));
    cr_expect_str_eq(out, "AKID");
}
