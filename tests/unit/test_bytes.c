/* base/bytes.h against byte patterns written out by hand (not through helpers.h, whose own
 * little-endian writers stay independent of the product's). */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "../../base/bytes.h"

TestSuite(bytes);

Test(bytes, get_reads_little_endian_at_any_address)
{
    const unsigned char b[] = {0xAA, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0xF8};
    cr_assert_eq(get_le16(b + 1), 0x0201);
    cr_assert_eq(get_le32(b + 1), 0x04030201u);
    cr_assert_eq(get_le64(b + 1), 0xF807060504030201ull);
    cr_assert_eq(get_le16(b + 7), 0xF807); /* the top bit survives each widening */
}

Test(bytes, put_writes_exactly_its_width)
{
    unsigned char b[10];
    memset(b, 0xEE, sizeof b);
    put_le32(b + 1, 0x80FF0102u);
    const unsigned char want32[] = {0xEE, 0x02, 0x01, 0xFF, 0x80, 0xEE};
    cr_assert_arr_eq(b, want32, sizeof want32);
    memset(b, 0xEE, sizeof b);
    put_le64(b + 1, 0x8877665544332211ull);
    const unsigned char want64[] = {0xEE, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xEE};
    cr_assert_arr_eq(b, want64, sizeof want64);
}

Test(bytes, round_trips)
{
    const uint64_t v[] = {0, 1, 0xFF, 0x100, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
                          0x100000000ull, UINT64_MAX - 1, UINT64_MAX};
    unsigned char b[8];
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        put_le64(b, v[i]);
        cr_assert_eq(get_le64(b), v[i]);
        put_le32(b, (uint32_t)v[i]);
        cr_assert_eq(get_le32(b), (uint32_t)v[i]);
        cr_assert_eq(get_le16(b), (uint16_t)v[i]);
    }
}

Test(bytes, align_up)
{
    cr_assert_eq(ck_align_up(0, 256), 0);
    cr_assert_eq(ck_align_up(1, 256), 256);
    cr_assert_eq(ck_align_up(256, 256), 256);
    cr_assert_eq(ck_align_up(257, 256), 512);
    cr_assert_eq(ck_align_up(5, 3), 6);
    cr_assert_eq(ck_align_up(7, 1), 7);
}
