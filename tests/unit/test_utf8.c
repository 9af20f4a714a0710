/* utf8.c against Python's own decoder and encoder: what bytes.decode('utf-8') accepts, where it
 * says the first bad byte is, and the code points it returns (with 'surrogatepass' for
 * CK_UTF8_SURROGATES, as pickles need); what chr(cp).encode('utf-8', 'surrogatepass') writes.
 * Every expectation comes from Python, run here. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/utf8.h"
#include "helpers.h"

TestSuite(utf8, .fini = tmp_cleanup, .timeout = 60);

/* For each input (hex, separated by spaces; or "all": every lead byte followed by the continuation
 * bytes, their edges and bytes that break them, cut at every length), one line: the input in
 * hex, then how strict and surrogatepass decoding end: the code points in hex joined by ',',
 * or ! and the offset Python reports (UnicodeDecodeError.start). */
static const char decoder_py[] =
    "import sys\n"
    "def show(b, errors):\n"
    "    try:\n"
    "        s = b.decode('utf-8', errors)\n"
    "    except UnicodeDecodeError as e:\n"
    "        return '!%d' % e.start\n"
    "    return ','.join('%x' % ord(c) for c in s)\n"
    "if sys.argv[1] == 'all':\n"
    "    cases = [bytes([a]) for a in range(256)]\n"
    "    second = [0x00, 0x41, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc2, 0xe0,\n"
    "              0xed, 0xf0, 0xf4, 0xff]\n"
    "    rest = [0x41, 0x80, 0xbf, 0xc0]\n"
    "    for a in [0x00, 0x41, 0x7f] + list(range(0x80, 0x100)):\n"
    "        for b in second:\n"
    "            cases.append(bytes([a, b]))\n"
    "            for c in rest:\n"
    "                cases.append(bytes([a, b, c]))\n"
    "                cases += [bytes([a, b, c, d]) for d in rest]\n"
    "else:\n"
    "    cases = [bytes.fromhex(h) for h in sys.argv[1].split()]\n"
    "for b in cases:\n"
    "    print(b.hex(), show(b, 'strict'), show(b, 'surrogatepass'))\n";

/* How ck_utf8_next decodes s, in the form decoder_py prints. */
static void decode(const unsigned char *s, size_t n, unsigned flags, char *buf, size_t size)
{
    size_t o = 0;
    buf[0] = 0;
    for (size_t i = 0; i < n;) {
        size_t at = i;
        long cp = ck_utf8_next(s, n, &i, flags);
        if (cp < 0) {
            cr_assert_eq(i, at, "ck_utf8_next moved past a bad sequence");
            snprintf(buf, size, "!%zu", at);
            return;
        }
        cr_assert_gt(i, at);
        o += (size_t)snprintf(buf + o, size - o, "%s%lx", at ? "," : "", (unsigned long)cp);
        cr_assert_lt(o, size);
    }
}

/* Checks ck_utf8_next, with and without CK_UTF8_SURROGATES, and ck_utf8_invalid_at against
 * each line decoder_py printed; the number of lines. */
static size_t check_lines(const char *out)
{
    char *lines = strdup(out), *save = NULL;
    cr_assert_not_null(lines);
    size_t count = 0;
    for (char *line = strtok_r(lines, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char hex[64], strict[64], pass[64], got[64];
        cr_assert_eq(sscanf(line, "%63s %63s %63s", hex, strict, pass), 3, "bad line '%s'", line);
        size_t n = strlen(hex) / 2;
        unsigned char *s = malloc(n); /* exact size: the sanitizers catch a read past it */
        cr_assert_not_null(s);
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(sscanf(hex + 2 * i, "%2hhx", &s[i]), 1);
        decode(s, n, 0, got, sizeof got);
        cr_assert_str_eq(got, strict, "%s: strict", hex);
        decode(s, n, CK_UTF8_SURROGATES, got, sizeof got);
        cr_assert_str_eq(got, pass, "%s: surrogatepass", hex);
        size_t bad = strict[0] == '!' ? strtoull(strict + 1, NULL, 10) : n;
        cr_assert_eq(ck_utf8_invalid_at(s, n), bad, "%s: ck_utf8_invalid_at", hex);
        free(s);
        count++;
    }
    free(lines);
    return count;
}

/* Runs decoder_py over the inputs (hex, separated by single spaces; or "all") and checks what it
 * prints; the number of inputs checked. */
static size_t agrees(const char *inputs)
{
    size_t checked = check_lines(run_python(decoder_py, inputs, NULL)), words = 1;
    for (const char *c = inputs; *c; c++)
        words += *c == ' ';
    if (strcmp(inputs, "all") != 0)
        cr_assert_eq(checked, words);
    return checked;
}

Test(utf8, overlong_forms)
{
    agrees("c080 c1bf e08080 e09fbf f0808080 f08fbfbf c280 e0a080 f0908080 417f");
}

Test(utf8, surrogates)
{
    agrees("eda080 edbfbf ed9fbf ee8080 eda080edb080 61eda080 edb0 eda0ff");
}

Test(utf8, beyond_u10ffff)
{
    agrees("f48fbfbf f4908080 f5808080 f7bfbfbf f888808080 fc8480808080 f08f8080");
}

Test(utf8, truncated_sequences)
{
    agrees("c2 e0a0 f09080 61f09080 e0a041 f0908041 80 bf 61c2 eda0 c3a9c3");
}

Test(utf8, every_lead_byte_and_its_edges)
{
    cr_assert_gt(agrees("all"), 40000);
}

/* ck_utf8_put writes what Python's encoder writes, and ck_utf8_next reads it back, at every
 * edge between lengths and around the surrogates, and at points spread over the whole range. */
Test(utf8, encoder)
{
    const char *out = run_python(
        "edges = [0, 0x7f, 0x80, 0x7ff, 0x800, 0xd7ff, 0xd800, 0xdbff, 0xdc00, 0xdfff, 0xe000,\n"
        "         0xfffd, 0xffff, 0x10000, 0x10ffff]\n"
        "for cp in sorted(set(edges) | set(range(0, 0x110000, 0x101))):\n"
        "    print('%x %s' % (cp, chr(cp).encode('utf-8', 'surrogatepass').hex()))\n", NULL);
    char *lines = strdup(out), *save = NULL;
    cr_assert_not_null(lines);
    size_t count = 0;
    for (char *line = strtok_r(lines, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        unsigned long cp;
        char want[16], got[16];
        cr_assert_eq(sscanf(line, "%lx %15s", &cp, want), 2, "bad line '%s'", line);
        unsigned char buf[4];
        size_t n = ck_utf8_put(buf, cp);
        for (size_t i = 0; i < n; i++)
            snprintf(got + 2 * i, 3, "%02x", buf[i]);
        got[2 * n] = 0;
        cr_assert_str_eq(got, want, "U+%04lX", cp);
        size_t i = 0;
        cr_assert_eq(ck_utf8_next(buf, n, &i, CK_UTF8_SURROGATES), (long)cp, "U+%04lX", cp);
        cr_assert_eq(i, n);
        count++;
    }
    free(lines);
    cr_assert_gt(count, 4000);
}
