/* gs:// without a server: location parsing, the endpoint as google-cloud-storage reads the
 * environment, a service account's JWT (its signature checked with the key's public half by
 * OpenSSL's verifier, its parts as RFC 7519 and Google's OAuth 2.0 for service accounts
 * spell them), a token endpoint's answer, and objects.list pages in the JSON API reference's
 * shape. The real exchanges are tests/integration/test_gcs.py's. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>

#include "../../sources/gcs.h"

static void clean_env(void)
{
    unsetenv("STORAGE_EMULATOR_HOST");
    unsetenv("CKPTFS_GCS_ENDPOINT");
}

TestSuite(gcs, .init = clean_env);

Test(gcs, locations)
{
    gcs_ref r;
    ck_error err;
    cr_assert_eq(gcs_parse("gs://my-bucket/models/llama/model.safetensors", &r, &err), 0, "%s",
                 err.msg);
    cr_expect_str_eq(r.bucket, "my-bucket");
    cr_expect_str_eq(r.object, "models/llama/model.safetensors");
    cr_assert_eq(gcs_parse("gs://my_bucket.example.com/prefix/", &r, &err), 0);
    cr_expect_str_eq(r.object, "prefix/");
    cr_assert_eq(gcs_parse("gs://bkt", &r, &err), 0);
    cr_expect_str_eq(r.object, "");
    const char *bad[] = {"gs://ab/x", "gs://UPPER/x", "gs://bucket/a//b", "gs://bucket/a/../b",
                         "gs://bucket/./b", "gs://bucket/a?x", "gs://bucket/a#x", "s3://a/b"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_expect_eq(gcs_parse(bad[i], &r, &err), -1, "%s", bad[i]);
}

Test(gcs, endpoint)
{
    char ep[256];
    cr_expect_eq(gcs_endpoint(ep, sizeof ep), 0);
    cr_expect_str_eq(ep, "https://storage.googleapis.com");
    setenv("CKPTFS_GCS_ENDPOINT", "https://storage.example/", 1);
    cr_expect_eq(gcs_endpoint(ep, sizeof ep), 0);
    cr_expect_str_eq(ep, "https://storage.example");
    setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:4443", 1); /* the client adds http:// */
    cr_expect_eq(gcs_endpoint(ep, sizeof ep), 1, "an emulator's: no credentials");
    cr_expect_str_eq(ep, "http://127.0.0.1:4443");
}

/* base64url without padding, decoded (malloc'ed, *n bytes). */
static unsigned char *unb64url(const char *s, size_t len, size_t *n)
{
    char *std = malloc(len + 4);
    cr_assert(std);
    size_t k = 0;
    for (size_t i = 0; i < len; i++)
        std[k++] = s[i] == '-' ? '+' : s[i] == '_' ? '/' : s[i];
    while (k % 4)
        std[k++] = '=';
    unsigned char *out = malloc(k);
    int got = EVP_DecodeBlock(out, (unsigned char *)std, (int)k);
    cr_assert(got >= 0);
    *n = (size_t)got - (size_t)(k - len > 2 ? 2 : k - len); /* the padding's zero bytes */
    free(std);
    return out;
}

static cJSON *json_part(const char *s, size_t len)
{
    size_t n;
    unsigned char *raw = unb64url(s, len, &n);
    cJSON *j = cJSON_ParseWithLength((const char *)raw, n);
    free(raw);
    cr_assert(j, "a part that is no JSON");
    return j;
}

Test(gcs, jwt_is_rs256_signed_by_the_key)
{
    EVP_PKEY *key = EVP_RSA_gen(2048);
    cr_assert(key);
    BIO *b = BIO_new(BIO_s_mem());
    cr_assert(PEM_write_bio_PrivateKey(b, key, NULL, NULL, 0, NULL, NULL) == 1);
    char *pem = NULL;
    long plen = BIO_get_mem_data(b, &pem);
    char *pem0 = strndup(pem, (size_t)plen);
    ck_error err;
    time_t now = 1714564800;
    char *jwt = gcs_jwt("r@p.iam.gserviceaccount.com", "kid-1", pem0,
                        "https://oauth2.googleapis.com/token", "scope-x", now, &err);
    cr_assert(jwt, "%s", err.msg);
    cr_expect_eq(strspn(jwt, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_."),
                 strlen(jwt), "base64url without padding");
    char *d1 = strchr(jwt, '.'), *d2 = d1 ? strchr(d1 + 1, '.') : NULL;
    cr_assert(d1 && d2 && !strchr(d2 + 1, '.'));
    cJSON *h = json_part(jwt, (size_t)(d1 - jwt)), *c = json_part(d1 + 1, (size_t)(d2 - d1 - 1));
    cr_expect_str_eq(cJSON_GetObjectItem(h, "alg")->valuestring, "RS256");
    cr_expect_str_eq(cJSON_GetObjectItem(h, "typ")->valuestring, "JWT");
    cr_expect_str_eq(cJSON_GetObjectItem(h, "kid")->valuestring, "kid-1");
    cr_expect_str_eq(cJSON_GetObjectItem(c, "iss")->valuestring, "r@p.iam.gserviceaccount.com");
    cr_expect_str_eq(cJSON_GetObjectItem(c, "aud")->valuestring,
                     "https://oauth2.googleapis.com/token");
    cr_expect_str_eq(cJSON_GetObjectItem(c, "scope")->valuestring, "scope-x");
    cr_expect_eq(cJSON_GetObjectItem(c, "iat")->valuedouble, (double)now);
    cr_expect_eq(cJSON_GetObjectItem(c, "exp")->valuedouble, (double)now + 3600);
    size_t slen;
    unsigned char *sig = unb64url(d2 + 1, strlen(d2 + 1), &slen);
    EVP_MD_CTX *m = EVP_MD_CTX_new();
    cr_assert(EVP_DigestVerifyInit(m, NULL, EVP_sha256(), NULL, key) == 1);
    cr_expect_eq(EVP_DigestVerify(m, sig, slen, (unsigned char *)jwt, (size_t)(d2 - jwt)), 1,
                 "the signature verifies with the public key over HEADER.CLAIMS");
    jwt[3] ^= 1; /* another header: the same signature no longer holds */
    cr_assert(EVP_DigestVerifyInit(m, NULL, EVP_sha256(), NULL, key) == 1);
    cr_expect_neq(EVP_DigestVerify(m, sig, slen, (unsigned char *)jwt, (size_t)(d2 - jwt)), 1);
    EVP_MD_CTX_free(m);
    cJSON_Delete(h);
    cJSON_Delete(c);
    free(sig);
    free(jwt);
    cr_expect_null(gcs_jwt("i", NULL, "-----BEGIN PRIVATE KEY-----\nnot\n-----END PRIVATE KEY-----\n",
                           "a", "s", now, &err));
    cr_expect(strstr(err.msg, "no RSA key") != NULL, "%s", err.msg);
    free(pem0);
    BIO_free(b);
    EVP_PKEY_free(key);
}

Test(gcs, token_reply)
{
    long exp;
    const char *ok = "{\"access_token\":\"ya29.a\",\"expires_in\":3599,\"token_type\":\"Bearer\"}";
    char *t = gcs_token_reply(ok, strlen(ok), &exp);
    cr_assert(t);
    cr_expect_str_eq(t, "ya29.a");
    cr_expect_eq(exp, 3599);
    free(t);
    const char *bad[] = {"{\"error\":\"invalid_grant\"}", "{\"access_token\":\"\"}",
                         "{\"access_token\":7}", "not json"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_expect_null(gcs_token_reply(bad[i], strlen(bad[i]), &exp), "%s", bad[i]);
}

Test(gcs, listing_pages)
{
    const char *page = "{\"kind\":\"storage#objects\",\"nextPageToken\":\"CgVtL3ovYQ==\","
                       "\"prefixes\":[\"m/sub/\"],\"items\":["
                       "{\"name\":\"m/model-00001-of-00002.safetensors\",\"generation\":\"1\"},"
                       "{\"name\":\"m/\"},{\"name\":\"m/a\\\"b.safetensors\"}]}";
    ck_listing l = {0};
    char *token = NULL;
    ck_error err;
    cr_assert_eq(gcs_parse_listing(page, strlen(page), "m/", &l, &token, "L", &err), 0, "%s",
                 err.msg);
    cr_assert_eq(l.n, 2, "the folder's own placeholder object is no file of it");
    cr_expect_eq(l.keys, 3);
    cr_expect_str_eq(l.names[0], "model-00001-of-00002.safetensors");
    cr_expect_str_eq(l.names[1], "a\"b.safetensors");
    cr_expect_str_eq(token, "CgVtL3ovYQ==");
    free(token);
    const char *last = "{\"kind\":\"storage#objects\",\"items\":[{\"name\":\"m/z.safetensors\"}]}";
    cr_assert_eq(gcs_parse_listing(last, strlen(last), "m/", &l, &token, "L", &err), 0);
    cr_expect(l.n == 3 && token == NULL);
    ck_listing_free(&l);
    const char *empty = "{\"kind\":\"storage#objects\"}";
    cr_assert_eq(gcs_parse_listing(empty, strlen(empty), "none/", &l, &token, "L", &err), 0);
    cr_expect(l.n == 0 && token == NULL);
#define K "{\"kind\":\"storage#objects\","
    const char *bad[] = {"{\"error\":{\"code\":403}}", K "\"items\":[]}x", "[]",
                         K "\"items\":{}}", K "\"items\":[{\"name\":\"other/a\"}]}",
                         K "\"items\":[{}]}", K "\"items\":[],\"nextPageToken\":\"\"}",
                         K "\"items\":[],\"nextPageToken\":5}"};
#undef K
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_expect_eq(gcs_parse_listing(bad[i], strlen(bad[i]), "m/", &l, &token, "L", &err), -1,
                     "%s", bad[i]);
        ck_listing_free(&l);
    }
}

Test(gcs, listing_bounds)
{
    const char *one = "{\"name\":\"m/k\"},";
    size_t n = strlen(one), count = GCS_MAX_KEYS + 1;
    char *page = malloc(64 + count * n);
    cr_assert(page);
    size_t at = (size_t)sprintf(page, "{\"kind\":\"storage#objects\",\"items\":[");
    for (size_t i = 0; i < count; i++, at += n)
        memcpy(page + at, one, n);
    strcpy(page + at - 1, "]}");
    ck_listing l = {0};
    char *token = NULL;
    ck_error err;
    cr_expect_eq(gcs_parse_listing(page, strlen(page), "m/", &l, &token, "gs://b/m/", &err), -1);
    cr_expect(strstr(err.msg, "lists more than 100000 objects") != NULL, "%s", err.msg);
    ck_listing_free(&l);
    free(page);
}
