/* The parts of the remote sources that need no server: Content-Range, origins, Retry-After,
 * backoff bounds, the readahead window, sibling locations, hf:// parsing, the token's lookup
 * order and which files of a repository are opened. Expectations come from RFC 9110 and the
 * Hub's documentation, not from this code. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../../sources/http.h"
#include "../../sources/hub.h"
#include "helpers.h"

TestSuite(http, .fini = tmp_cleanup);

Test(http, content_range_forms)
{
    uint64_t a = 9, b = 9, t = 9;
    cr_expect_eq(http_content_range("bytes 0-99/1000", &a, &b, &t), 1);
    cr_expect(a == 0 && b == 99 && t == 1000);
    cr_expect_eq(http_content_range("bytes */1000", &a, &b, &t), 2);
    cr_expect_eq(t, 1000);
    const char *bad[] = {"bytes 5-4/10", "bytes 0-10/10", "bytes 0-9/", "bytes -9/10",
                         "bytes 0-9/10 ", "items 0-9/10", "bytes 0-9/*", "bytes 0x1-9/10",
                         "bytes 0-99999999999999999999/100000000000000000000", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_expect_eq(http_content_range(bad[i], &a, &b, &t), 0, "%s", bad[i]);
}

Test(http, range_answers_exactly_what_was_asked)
{
    uint64_t t;
    cr_expect(http_range_answers("bytes 100-199/1000", 100, 199, 1000, &t));
    cr_expect(!http_range_answers("bytes 100-198/1000", 100, 199, 1000, &t), "short");
    cr_expect(!http_range_answers("bytes 101-199/1000", 100, 199, 1000, &t), "shifted");
    cr_expect(!http_range_answers("bytes 100-199/1001", 100, 199, 1000, &t), "size changed");
    cr_expect(!http_range_answers(NULL, 100, 199, 1000, &t), "no Content-Range");
    /* At open the size is unknown: a small object answers with what it has. */
    cr_expect(http_range_answers("bytes 0-9/10", 0, 262143, 0, &t) && t == 10);
    cr_expect(!http_range_answers("bytes 0-8/10", 0, 262143, 0, &t), "ends before the end");
    cr_expect(http_range_answers("bytes 0-262143/999999", 0, 262143, 0, &t));
}

Test(http, same_origin)
{
    cr_expect(http_same_origin("https://huggingface.co/a", "https://HuggingFace.co:443/b?x"));
    cr_expect(http_same_origin("http://127.0.0.1/a", "http://127.0.0.1:80"));
    cr_expect(!http_same_origin("https://huggingface.co/a", "http://huggingface.co/a"));
    cr_expect(!http_same_origin("https://huggingface.co/a", "https://cdn-lfs.hf.co/a"));
    cr_expect(!http_same_origin("http://127.0.0.1:8000/", "http://127.0.0.1:8001/"));
    /* userinfo is not the host: this URL's host is evil.example */
    cr_expect(!http_same_origin("https://huggingface.co@evil.example/x", "https://huggingface.co/"));
    cr_expect(http_same_origin("http://[::1]:99/a", "http://[::1]:99/b"));
    cr_expect(!http_same_origin("http://[::1]:99/a", "http://[::1]/b"));
}

Test(http, retry_after)
{
    cr_expect_eq(http_retry_after("7", 0), 7);
    cr_expect_eq(http_retry_after("0", 0), 0);
    /* RFC 9110's example date, 784111777 seconds after the epoch. */
    cr_expect_eq(http_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 784111777 - 5), 5);
    cr_expect_eq(http_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 784111777 + 5), 0);
    cr_expect_lt(http_retry_after("soon", 0), 0);
    cr_expect_lt(http_retry_after("-1", 0), 0);
    cr_expect_lt(http_retry_after("", 0), 0);
}

Test(http, backoff_grows_is_capped_and_jittered)
{
    for (unsigned k = 1; k < 40; k++) {
        double lo = http_backoff(k, -1, 0), hi = http_backoff(k, -1, 0.999999);
        cr_expect(lo > 0 && lo <= hi && hi <= 8, "attempt %u: %g..%g", k, lo, hi);
        cr_expect(hi >= lo * 1.9, "jitter spreads attempt %u", k);
    }
    cr_expect_lt(http_backoff(1, -1, 0.5), http_backoff(3, -1, 0.5));
    cr_expect_eq(http_backoff(1, 30, 0.5), 30, "Retry-After wins");
}

Test(http, readahead_window)
{
    uint64_t w = bc_next_window(0, 0);
    cr_expect_eq(w, 0, "a random read opens no window");
    w = bc_next_window(w, 1);
    cr_expect_eq(w, BC_FLOOR);
    w = bc_next_window(w, 1);
    cr_expect_eq(w, 2 * BC_FLOOR);
    for (int i = 0; i < 20; i++)
        w = bc_next_window(w, 1);
    cr_expect_eq(w, BC_MAX_WINDOW);
    cr_expect_eq(bc_next_window(w, 0), 0, "reset on a random read");
}

Test(http, siblings)
{
    ck_error err;
    char *s = ck_source_sibling("http://h/a/b/model.safetensors.index.json?sig=1", "m-1.safetensors",
                                &err);
    cr_assert(s, "%s", err.msg);
    cr_expect_str_eq(s, "http://h/a/b/m-1.safetensors");
    free(s);
    s = ck_source_sibling("dir/x.json", "y", &err);
    cr_expect_str_eq(s, "dir/y");
    free(s);
    s = ck_source_sibling("x.json", "y", &err);
    cr_expect_str_eq(s, "./y");
    free(s);
    const char *bad[] = {"", ".", "..", "../x", "/etc/passwd", "a/b", "a\nb"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_expect_null(ck_source_sibling("http://h/a/i.json", bad[i], &err), "'%s'", bad[i]);
    cr_expect_null(ck_source_sibling("http://h/a/i.json", "x?y", &err), "a query in a URL");
    cr_expect_null(ck_source_sibling("http://h/a/i.json", "%2e%2e", &err), "an escape in a URL");
    /* An s3:// object's sibling is an s3:// location (opened at its API URL, named as it is);
     * '?', '#' and '%' are refused there as in any URL. */
    s = ck_source_sibling("s3://bkt/m/model.safetensors.index.json", "m-1.safetensors", &err);
    cr_assert(s, "%s", err.msg);
    cr_expect_str_eq(s, "s3://bkt/m/m-1.safetensors");
    free(s);
    for (size_t i = 0; i < 3; i++)
        cr_expect_null(ck_source_sibling("s3://bkt/m/.metadata", (const char *[]){"x?y", "x#y",
                                         "%2e%2e"}[i], &err), "in an s3:// location");
}

Test(http, hub_parse)
{
    hub_ref r;
    ck_error err;
    cr_assert_eq(hub_parse("hf://org/repo", &r, &err), 0, "%s", err.msg);
    cr_expect_str_eq(r.repo, "org/repo");
    cr_expect_str_eq(r.revision, "main");
    cr_expect_str_eq(r.path, "");
    cr_assert_eq(hub_parse("hf://org/repo@v1.0/sub/model.safetensors", &r, &err), 0, "%s",
                 err.msg);
    cr_expect_str_eq(r.revision, "v1.0");
    cr_expect_str_eq(r.path, "sub/model.safetensors");
    cr_assert_eq(hub_parse("hf://org/repo/model.safetensors", &r, &err), 0, "%s", err.msg);
    cr_expect_str_eq(r.revision, "main");
    const char *bad[] = {"hf://org", "hf://org/", "hf:///repo", "hf://org/re po",
                         "hf://org/repo/../x", "hf://org/repo/a//b", "hf://org/repo@/x",
                         "hf://org/repo/x/", "hf://../repo", "hf://org/repo@a%2f/x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_expect_neq(hub_parse(bad[i], &r, &err), 0, "%s", bad[i]);
}

Test(http, hub_resolve_url_and_endpoint)
{
    setenv("HF_ENDPOINT", "http://127.0.0.1:9/", 1);
    char *u = hub_resolve_url("org/repo", "refs/pr/1", "a/model.safetensors");
    cr_expect_str_eq(u, "http://127.0.0.1:9/org/repo/resolve/refs%2Fpr%2F1/a/model.safetensors");
    free(u);
    unsetenv("HF_ENDPOINT");
    u = hub_resolve_url("org/repo", "main", "m.gguf");
    cr_expect_str_eq(u, "https://huggingface.co/org/repo/resolve/main/m.gguf");
    free(u);
}

/* huggingface_hub's order: HF_TOKEN, then HF_TOKEN_PATH, then HF_HOME/token, then the cache
 * directory's huggingface/token. */
Test(http, token_lookup_order)
{
    const char *dir = tmp_dir();
    const char *path_file = tmp_file_in(dir, "t1", "path-token\n", 11);
    const char *home = strf("%s/home", dir), *xdg = strf("%s/xdg", dir);
    cr_assert_eq(system(strf("mkdir -p %s %s/huggingface", home, xdg)), 0);
    tmp_file_in(home, "token", "  home-token \n", 14);
    tmp_file_in(strf("%s/huggingface", xdg), "token", "xdg-token", 9);
    setenv("HF_TOKEN", "env-token", 1);
    setenv("HF_TOKEN_PATH", path_file, 1);
    setenv("HF_HOME", home, 1);
    setenv("XDG_CACHE_HOME", xdg, 1);
    const char *want[] = {"env-token", "path-token", "home-token", "xdg-token"};
    const char *drop[] = {"HF_TOKEN", "HF_TOKEN_PATH", "HF_HOME", "XDG_CACHE_HOME"};
    for (int i = 0; i < 4; i++) {
        char *t = hub_token();
        cr_expect_str_eq(t ? t : "(none)", want[i]);
        free(t);
        unsetenv(drop[i]);
    }
    setenv("HOME", dir, 1);
    cr_expect_null(hub_token(), "no ~/.cache/huggingface/token");
    setenv("HF_TOKEN", "", 1);
    cr_expect_null(hub_token(), "an empty HF_TOKEN is none");
    unsetenv("HF_TOKEN");
    /* Only the endpoint's origin gets it. */
    setenv("HF_TOKEN", "secret", 1);
    setenv("HF_ENDPOINT", "https://hub.example", 1);
    char *t = hub_token_for("https://hub.example/org/repo/resolve/main/x");
    cr_expect_str_eq(t ? t : "(none)", "secret");
    free(t);
    cr_expect_null(hub_token_for("https://cdn.example/x"));
    cr_expect_null(hub_token_for("http://hub.example/x"));
    unsetenv("HF_TOKEN");
    unsetenv("HF_ENDPOINT");
}
