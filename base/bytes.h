/* bytes.h — the byte-level helpers every format shares: little-endian fields and alignment.
 * Contract: get_le* decode from and put_le* encode into unaligned bytes, whatever the host's
 * byte order; ck_align_up rounds x up to a multiple of a (a > 0), and the caller keeps x + a
 * from overflowing. One copy for all the readers: the formats differ in layout, not in this.
 */
#ifndef CK_BYTES_H
#define CK_BYTES_H

#include <stdint.h>

static inline uint16_t get_le16(const unsigned char *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static inline uint32_t get_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t get_le64(const unsigned char *p)
{
    return (uint64_t)get_le32(p) | (uint64_t)get_le32(p + 4) << 32;
}

static inline void put_le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline void put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint64_t ck_align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

#endif
