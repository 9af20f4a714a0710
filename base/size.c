/* size.c — sizes in and out (size.h). */
#include "size.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t ck_parse_size(const char *s, int decimal_b)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *s == '-')
        return 0;
    const char *units = "KMG";
    const char *u = *end ? strchr(units, *end & ~0x20) : NULL;
    if (u) {
        unsigned power = (unsigned)(u - units + 1);
        int binary = (end[1] & ~0x20) == 'I';
        end += 1 + binary;
        int b = (*end & ~0x20) == 'B';
        end += b;
        uint64_t mul = 1;
        for (unsigned k = 0; k < power; k++)
            mul *= decimal_b && b && !binary ? 1000 : 1024;
        if (v > UINT64_MAX / mul)
            return 0;
        v *= mul;
    }
    return *end ? 0 : v;
}

void ck_size_human(uint64_t b, char *buf, size_t cap)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)b;
    unsigned u = 0;
    while (v >= 1024 && u < 5) {
        v /= 1024;
        u++;
    }
    snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
}
