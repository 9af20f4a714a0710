/* ck_open: what a path holds, decided by content, and the errors for paths that hold nothing
 * it can read. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "../../formats/safetensors.h"
#include "helpers.h"

TestSuite(source, .fini = tmp_cleanup);

Test(source, missing_path)
{
    assert_open_fails(tmp_path_in(tmp_dir(), "absent"), "cannot open: No such file or directory");
}

Test(source, fifo_is_not_a_regular_file)
{
    const char *path = tmp_path_in(tmp_dir(), "fifo");
    cr_assert_eq(mkfifo(path, 0600), 0);
    assert_open_fails(path, "not a regular file");
}

Test(source, device_is_not_a_regular_file)
{
    assert_open_fails("/dev/null", "not a regular file");
}

Test(source, empty_file)
{
    assert_open_fails(tmp_file("", 0), "empty file");
}

/* "xx xx ..." of the first (at most 8) bytes. */
static const char *hex8(const unsigned char *b, size_t n)
{
    const char *s = "";
    for (size_t i = 0; i < n && i < 8; i++)
        s = strf("%s%s%02x", s, i ? " " : "", b[i]);
    return s;
}

Test(source, unknown_format_shows_first_bytes)
{
    static const unsigned char text[] = "hello, world!\n";
    assert_open_fails(tmp_file(text, sizeof text - 1),
                      strf("not a checkpoint format ckptfs knows (first bytes %s)",
                           hex8(text, sizeof text - 1)));
    cr_assert_str_eq(hex8(text, 14), "68 65 6c 6c 6f 2c 20 77");
}

Test(source, too_short_to_probe)
{
    static const unsigned char b[] = {2, 0, 0, 0, 0, 0, 0, '{'};
    assert_open_fails(tmp_file(b, sizeof b), strf("(first bytes %s)", hex8(b, sizeof b)));
    static const unsigned char one[] = {0xff};
    assert_open_fails(tmp_file(one, 1), "(first bytes ff)");
}

Test(source, header_must_start_at_byte_8)
{
    size_t len;
    unsigned char *b = st_bytes(" {}", NULL, 0, &len);
    assert_open_fails(tmp_file(b, len), "not a checkpoint format ckptfs knows");
    free(b);
}

Test(source, probe)
{
    unsigned char head[9] = {2, 0, 0, 0, 0, 0, 0, 0, '{'};
    cr_assert(st_probe(head, 9));
    cr_assert_not(st_probe(head, 8));
    head[8] = '[';
    cr_assert_not(st_probe(head, 9));
}

Test(source, file_is_safetensors)
{
    ck_index *ix = open_ok(st_file("{}", NULL, 0));
    cr_assert_str_eq(ix->format, "safetensors");
    ck_index_free(ix);
}

Test(source, directory_of_one_file_is_that_file)
{
    const char *dir = tmp_dir();
    st_file_in(dir, "a.safetensors", "{}", NULL, 0);
    ck_index *ix = open_ok(dir);
    cr_assert_str_eq(ix->format, "safetensors");
    ck_index_free(ix);
}
