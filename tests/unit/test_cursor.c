/* base/cursor.h against bytes written out by hand: every take at and past the end, lengths
 * that would overflow off + n, zero-length takes, and length-prefixed strings. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "../../base/cursor.h"

TestSuite(cursor);

static const unsigned char B[] = {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09};

Test(cursor, take_to_the_end_then_nothing)
{
    ck_cursor c = ck_cursor_make(B, sizeof B, 1000);
    cr_assert_eq(ck_cursor_at(&c), 1000);
    cr_assert_eq(ck_take(&c, 4), B);
    cr_assert_eq(ck_cursor_at(&c), 1004);
    cr_assert_eq(ck_take(&c, 5), B + 4); /* exactly the bytes left */
    cr_assert_eq(ck_cursor_left(&c), 0);
    cr_assert_null(ck_take(&c, 1));
    cr_assert_eq(ck_cursor_at(&c), 1009);
}

Test(cursor, take_past_the_end_leaves_the_cursor)
{
    ck_cursor c = ck_cursor_make(B, sizeof B, 0);
    ck_take(&c, 3);
    cr_assert_null(ck_take(&c, 7));
    cr_assert_eq(c.pos, 3);
    cr_assert_eq(ck_take(&c, 6), B + 3);
}

Test(cursor, lengths_that_would_wrap_are_refused)
{
    ck_cursor c = ck_cursor_make(B, sizeof B, UINT64_MAX - 4);
    ck_take(&c, 2);
    const uint64_t huge[] = {UINT64_MAX, UINT64_MAX - 1, (uint64_t)SIZE_MAX - 1, SIZE_MAX,
                             1ull << 63, 8};
    for (size_t i = 0; i < sizeof huge / sizeof *huge; i++) {
        cr_assert_null(ck_take(&c, huge[i]), "n = %llu", (unsigned long long)huge[i]);
        cr_assert_eq(c.pos, 2);
    }
    ck_cursor sub;
    cr_assert_eq(ck_take_cursor(&c, UINT64_MAX, &sub), -1);
    cr_assert_eq(c.pos, 2);
}

Test(cursor, zero_bytes_anywhere_even_with_no_bytes)
{
    ck_cursor c = ck_cursor_make(B, sizeof B, 0);
    cr_assert_eq(ck_take(&c, 0), B);
    ck_take(&c, sizeof B);
    cr_assert_not_null(ck_take(&c, 0)); /* at the end */
    cr_assert_eq(c.pos, sizeof B);
    ck_cursor none = ck_cursor_make(NULL, 0, 77);
    cr_assert_not_null(ck_take(&none, 0));
    cr_assert_null(ck_take(&none, 1));
    cr_assert_eq(ck_peek(&none), -1);
    uint8_t u8 = 0xEE;
    cr_assert_eq(ck_take_u8(&none, &u8), -1);
    cr_assert_eq(u8, 0xEE);
    cr_assert_eq(ck_cursor_at(&none), 77);
}

Test(cursor, integers_little_endian_at_and_past_the_end)
{
    static const unsigned char v[] = {0x80, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88,
                                      0x99, 0xAA, 0xBB, 0xCC, 0xDD, 0xEE};
    ck_cursor c = ck_cursor_make(v, sizeof v, 0);
    uint8_t a;
    uint32_t d;
    uint64_t e;
    uint64_t b;
    cr_assert_eq(ck_take_u8(&c, &a), 0);
    cr_assert_eq(a, 0x80);
    cr_assert_eq(ck_take_le(&c, 2, &b), 0);
    cr_assert_eq(b, 0x2211);
    cr_assert_eq(ck_take_u32(&c, &d), 0);
    cr_assert_eq(d, 0x66554433u);
    cr_assert_eq(ck_take_u64(&c, &e), 0);
    cr_assert_eq(e, 0xEEDDCCBBAA998877ull);
    cr_assert_eq(ck_cursor_left(&c), 0);
    /* Each width one byte short: refused, nothing written, nothing taken. */
    for (unsigned w = 1; w <= 8; w *= 2) {
        ck_cursor s = ck_cursor_make(v, w - 1, 0);
        uint64_t out = 42;
        cr_assert_eq(ck_take_le(&s, w, &out), -1, "width %u", w);
        cr_assert_eq(out, 42);
        cr_assert_eq(s.pos, 0);
        s = ck_cursor_make(v, w, 0); /* and exactly enough */
        cr_assert_eq(ck_take_le(&s, w, &out), 0);
        cr_assert_eq(ck_cursor_left(&s), 0);
    }
    ck_cursor s = ck_cursor_make(v, 7, 0);
    cr_assert_eq(ck_take_u64(&s, &e), -1);
    s = ck_cursor_make(v, 3, 0);
    cr_assert_eq(ck_take_u32(&s, &d), -1);
    s = ck_cursor_make(v, 0, 0);
    a = 0x5A;
    cr_assert_eq(ck_take_u8(&s, &a), -1);
    cr_assert_eq(a, 0x5A);
    cr_assert_eq(s.pos, 0);
}

Test(cursor, take_le_reads_each_width)
{
    static const unsigned char v[] = {0xF1, 0xF2, 0xF3, 0xF4, 0xF5, 0xF6, 0xF7, 0xF8};
    const uint64_t want[] = {0, 0xF1, 0xF2F1, 0, 0xF4F3F2F1, 0, 0, 0, 0xF8F7F6F5F4F3F2F1ull};
    for (unsigned w = 1; w <= 8; w *= 2) {
        ck_cursor c = ck_cursor_make(v, sizeof v, 0);
        uint64_t out;
        cr_assert_eq(ck_take_le(&c, w, &out), 0);
        cr_assert_eq(out, want[w], "width %u", w);
        cr_assert_eq(c.pos, w);
    }
}

Test(cursor, strings)
{
    static const unsigned char v[] = {3, 0, 'a', 'b', 'c', 0, 0, 2, 0};
    ck_cursor c = ck_cursor_make(v, sizeof v, 500);
    const unsigned char *s;
    uint64_t n;
    cr_assert_eq(ck_take_str(&c, 2, 3, &s, &n), 0);
    cr_assert_eq(n, 3);
    cr_assert_eq(s, v + 2);
    cr_assert_eq(ck_take_str(&c, 2, 0, &s, &n), 0); /* the empty string */
    cr_assert_eq(n, 0);
    cr_assert_not_null(s);
    cr_assert_eq(ck_cursor_at(&c), 507);
    /* Its length says 2, but no byte follows: the cursor stands where the bytes would. */
    cr_assert_eq(ck_take_str(&c, 2, UINT64_MAX, &s, &n), CK_STR_NO_BYTES);
    cr_assert_eq(n, 2);
    cr_assert_eq(ck_cursor_at(&c), 509);
    cr_assert_eq(ck_take_str(&c, 2, UINT64_MAX, &s, &n), CK_STR_NO_LENGTH);
    cr_assert_eq(ck_cursor_at(&c), 509);
}

Test(cursor, string_length_checked_against_max_before_the_end)
{
    static const unsigned char v[] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
    ck_cursor c = ck_cursor_make(v, sizeof v, 0);
    const unsigned char *s;
    uint64_t n;
    cr_assert_eq(ck_take_str(&c, 4, INT32_MAX, &s, &n), CK_STR_TOO_LONG);
    cr_assert_eq(n, 0xFFFFFFFFu);
    cr_assert_eq(c.pos, 4);
    c = ck_cursor_make(v, sizeof v, 0); /* a 64-bit length of 2^64 - 1: no wrap */
    cr_assert_eq(ck_take_str(&c, 8, UINT64_MAX, &s, &n), CK_STR_NO_BYTES);
    cr_assert_eq(n, UINT64_MAX);
    cr_assert_eq(c.pos, 8);
    c = ck_cursor_make(v, 3, 0); /* the length itself cut short */
    cr_assert_eq(ck_take_str(&c, 4, UINT64_MAX, &s, &n), CK_STR_NO_LENGTH);
    cr_assert_eq(c.pos, 0);
}

Test(cursor, sub_cursor_keeps_its_file_offset_and_end)
{
    ck_cursor c = ck_cursor_make(B, sizeof B, 100), sub;
    ck_take(&c, 2);
    cr_assert_eq(ck_take_cursor(&c, 3, &sub), 0);
    cr_assert_eq(ck_cursor_at(&sub), 102);
    cr_assert_eq(ck_cursor_left(&sub), 3);
    cr_assert_eq(ck_cursor_at(&c), 105);
    uint32_t v;
    cr_assert_eq(ck_take_u32(&sub, &v), -1); /* the record's end, not the buffer's */
    cr_assert_eq(ck_take_cursor(&c, 5, &sub), -1);
    cr_assert_eq(ck_cursor_at(&c), 105);
}

Test(cursor, peek_rest_and_until)
{
    static const unsigned char v[] = {'a', 'b', '\n', 'c'};
    ck_cursor c = ck_cursor_make(v, sizeof v, 0);
    cr_assert_eq(ck_peek(&c), 'a');
    cr_assert_eq(c.pos, 0);
    cr_assert_eq(ck_cursor_rest(&c), v);
    size_t n = 99;
    cr_assert_eq(ck_take_until(&c, '\n', &n), v);
    cr_assert_eq(n, 2);
    cr_assert_eq(ck_cursor_left(&c), 1); /* the newline taken with the line */
    cr_assert_null(ck_take_until(&c, '\n', &n));
    cr_assert_eq(ck_cursor_left(&c), 1);
    ck_take(&c, 1);
    cr_assert_eq(ck_peek(&c), -1);
    cr_assert_null(ck_take_until(&c, '\n', &n));
}

Test(cursor, peek_reads_high_bytes_as_unsigned)
{
    static const unsigned char v[] = {0xFF};
    ck_cursor c = ck_cursor_make(v, 1, 0);
    cr_assert_eq(ck_peek(&c), 0xFF);
}
