/* pk_float_repr against Python itself: Python writes repr(x) next to the bits of many doubles
 * (random bits, every power of two and of ten and their neighbours, integral values, subnormals,
 * the notation boundaries at 1e-5/1e-4 and 1e15/1e16), and the C text must be the same. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../index/pickle_text.h"
#include "helpers.h"

TestSuite(float_repr, .fini = tmp_cleanup, .timeout = 120);

/* Prints "<16 hex digits of the bits> <repr>" per double. */
static const char *const doubles_py =
    "import math, random, struct, sys\n"
    "r = random.Random(int(sys.argv[1]))\n"
    "xs = [0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, 2.2250738585072014e-308,\n"
    "      1.7976931348623157e308, 1e-5, 1e-4, 9.999999999999999e-05, 1e15, 1e16,\n"
    "      9999999999999998.0, 1e16 - 2, 123456789012345680.0, 0.1, 0.3, 2 / 3]\n"
    "for k in range(-1074, 1024):\n"
    "    p = math.ldexp(1.0, k)\n"
    "    xs += [p, math.nextafter(p, 0), math.nextafter(p, math.inf)]\n"
    "for k in range(-325, 309):\n"
    "    p = float('1e%d' % k)\n"
    "    xs += [p, math.nextafter(p, 0), math.nextafter(p, math.inf)]\n"
    "for _ in range(40000):\n"
    "    xs.append(struct.unpack('<d', r.getrandbits(64).to_bytes(8, 'little'))[0])\n"
    "    xs.append(struct.unpack('<d', r.getrandbits(52).to_bytes(8, 'little'))[0])\n"
    "    xs.append(float(r.getrandbits(r.randint(1, 70))))\n"
    "    digits = r.randint(1, 17)\n"
    "    xs.append(float('%de%d' % (r.getrandbits(60) % 10**digits, r.randint(-30, 30))))\n"
    "    xs.append(r.uniform(-1, 1) * 10.0 ** r.randint(-8, 20))\n"
    "xs += [-x for x in xs]\n"
    "sys.stdout.write(''.join('%s %r\\n' % (struct.pack('>d', x).hex(), x) for x in xs))\n";

Test(float_repr, is_pythons)
{
    char *out = (char *)run_python(doubles_py, "25", NULL);
    size_t n = 0, bad = 0;
    char *save = NULL, first[256] = "";
    for (char *line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *want;
        unsigned long long bits = strtoull(line, &want, 16);
        cr_assert(want == line + 16 && *want == ' ', "bad line '%s'", line);
        want++;
        double d;
        memcpy(&d, &bits, sizeof d);
        char got[PK_FLOAT_REPR_MAX];
        size_t len = pk_float_repr(d, got);
        cr_assert_eq(len, strlen(got));
        if (strcmp(got, want) != 0 && bad++ == 0)
            snprintf(first, sizeof first, "bits %016llx: C '%s', Python '%s'", bits, got, want);
        n++;
    }
    cr_assert_gt(n, 200000);
    cr_assert_eq(bad, 0, "%zu of %zu doubles differ from Python's repr; first %s", bad, n,
                 first);
}
