/* NumPy files: the .npy header parser on headers numpy itself writes (every dtype we share,
 * every version, 0-d to rank 5, both orders) and on each way a header can differ from numpy's
 * form; .npz archives opened whole and read back against numpy's bytes; and the deflated
 * entries' seek points (zip.h) on streams zlib's own deflate writes, read at every kind of
 * offset, with the points' count bounded by the span. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "../../formats/npy.h"
#include "../../checkpoint/open.h"
#include "../../index/zip.h"
#include "helpers.h"

TestSuite(npy_header, .fini = tmp_cleanup);
TestSuite(npy_open, .fini = tmp_cleanup);
TestSuite(npy_inflate, .fini = tmp_cleanup);

/* --- headers ----------------------------------------------------------------------------- */

/* The header numpy writes for np.zeros(shape, dtype, order), format version v. */
static unsigned char *numpy_header(const char *dtype, const char *shape, int fortran, int v,
                                   size_t *len)
{
    const char *path = tmp_file("", 0);
    run_python("import sys, numpy as np\n"
               "a = np.zeros(eval(sys.argv[2]), sys.argv[1], order='F' if sys.argv[3] == '1' "
               "else 'C')\n"
               "with open(sys.argv[4], 'wb') as f:\n"
               "    np.lib.format._write_array_header(f, np.lib.format.header_data_from_array_1_0"
               "(a), (int(sys.argv[5]), 0))\n",
               dtype, shape, fortran ? "1" : "0", path, strf("%d", v), NULL);
    return read_whole(path, len);
}

static npy_header parse_ok(const unsigned char *p, size_t n)
{
    npy_header h;
    ck_error err = {""};
    cr_assert_eq(npy_parse_header(p, n, &h, "x.npy", "", 0, &err), 0, "%s", err.msg);
    cr_assert_eq(h.data_offset, n, "the header is all of what numpy wrote");
    return h;
}

Test(npy_header, every_dtype_as_numpy_writes_it)
{
    static const struct {
        const char *numpy;
        enum ck_dtype ours;
        unsigned size;
    } t[] = {{"float16", CK_F16, 2}, {"float32", CK_F32, 4}, {"float64", CK_F64, 8},
             {"int8", CK_I8, 1},     {"int16", CK_I16, 2},   {"int32", CK_I32, 4},
             {"int64", CK_I64, 8},   {"uint8", CK_U8, 1},    {"uint16", CK_U16, 2},
             {"uint32", CK_U32, 4},  {"uint64", CK_U64, 8},  {"bool", CK_BOOL, 1},
             {"complex64", CK_C64, 8}, {"complex128", CK_C128, 16}};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        size_t n;
        unsigned char *p = numpy_header(t[i].numpy, "(3, 7)", 0, 1, &n);
        npy_header h = parse_ok(p, n);
        cr_expect_eq(h.dtype, t[i].ours, "%s", t[i].numpy);
        cr_expect_eq(h.nbytes, 21u * t[i].size, "%s", t[i].numpy);
        free(p);
    }
}

Test(npy_header, shapes_orders_and_versions)
{
    static const struct {
        const char *shape;
        unsigned rank;
        int64_t dims[5];
    } t[] = {{"()", 0, {0}}, {"(0,)", 1, {0}}, {"(5,)", 1, {5}}, {"(2, 0, 3)", 3, {2, 0, 3}},
             {"(1, 2, 3, 4, 5)", 5, {1, 2, 3, 4, 5}}};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        for (int v = 1; v <= 3; v++)
            for (int f = 0; f < 2; f++) {
                size_t n;
                unsigned char *p = numpy_header("float32", t[i].shape, f, v, &n);
                npy_header h = parse_ok(p, n);
                cr_expect_eq(h.major, v);
                cr_expect_eq(h.rank, t[i].rank, "%s", t[i].shape);
                cr_expect_arr_eq(h.shape, t[i].dims, t[i].rank * sizeof(int64_t));
                /* numpy says fortran_order only of an array that is not also C-contiguous:
                 * rank 2 or more, and not empty */
                cr_expect_eq(h.fortran, f && t[i].rank > 1 && h.nbytes, "%s %d", t[i].shape, f);
                free(p);
            }
}

/* The valid header text with `from` replaced by `to`, as a v1.0 .npy preamble and header. */
static unsigned char *edited(const char *from, const char *to, size_t *len)
{
    char text[256];
    const char *base = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    const char *at = strstr(base, from);
    cr_assert(at);
    int n = snprintf(text, sizeof text, "%.*s%s%s", (int)(at - base), base, to,
                     at + strlen(from));
    unsigned char *p = malloc(10 + (size_t)n + 1);
    memcpy(p, "\x93NUMPY\x01\x00", 8);
    p[8] = (unsigned char)((n + 1) & 0xff);
    p[9] = (unsigned char)((n + 1) >> 8);
    memcpy(p + 10, text, (size_t)n);
    p[10 + n] = '\n';
    *len = 10 + (size_t)n + 1;
    return p;
}

static void refused(const char *from, const char *to, const char *what)
{
    size_t n;
    unsigned char *p = edited(from, to, &n);
    npy_header h;
    ck_error err = {""};
    cr_expect_eq(npy_parse_header(p, n, &h, "x.npy", "", 0, &err), -1, "%s -> %s", from, to);
    cr_expect(strstr(err.msg, what), "'%s' -> '%s': %s", from, to, err.msg);
    free(p);
}

/* What np.load also reads: Python 2's long dims in a format 1.0 header (numpy filters the 'L'
 * out for versions 1.0 and 2.0), and a big-endian descr: the same dtype, swapped on read. */
Test(npy_header, long_dims_and_big_endian_as_np_load_reads_them)
{
    size_t n;
    unsigned char *p = edited("(2, 3)", "(2L, 3L)", &n);
    npy_header h = parse_ok(p, n);
    cr_assert(h.rank == 2 && h.shape[0] == 2 && h.shape[1] == 3 && !h.big_endian);
    free(p);
    p = edited("'<f4'", "'>f4'", &n);
    h = parse_ok(p, n);
    cr_assert(h.dtype == CK_F32 && h.big_endian && h.nbytes == 24);
    free(p);
}

Test(npy_header, anything_but_numpys_form_is_refused)
{
    size_t n; /* the base parses: each case below differs from it in one place */
    unsigned char *p = edited("", "", &n);
    parse_ok(p, n);
    free(p);
    refused("'<f4'", "'|O'", "allow_pickle");
    refused("'<f4'", "'<U3'", "string");
    refused("'<f4'", "'<M8[s]'", "datetime");
    refused("'<f4'", "'|V8'", "void");
    refused("'<f4'", "[('a', '<f4')]", "structured");
    refused("'<f4'", "'<f16'", "not a dtype ckptfs knows");
    refused("'<f4'", "'<i1'", "'<i1'"); /* numpy writes '|i1' */
    refused("'<f4'", "\"<f4\"", "expected \"'\"");
    refused("False", "false", "expected \"False\"");
    refused("(2, 3)", "(2,3)", "expected \" \"");
    refused("(2, 3)", "(2, 3,)", "expected \", \"");
    refused("(2, 3)", "(6)", "expected \",\"");
    refused("(2, 3)", "(-6,)", "expected a dimension");
    refused("(2, 3)", "(06,)", "leading zeros");
    refused("(2, 3)", "(99999999999999999999,)", "at most 2^63-1");
    refused("(2, 3)", "(4611686018427387904, 2)", "overflows");
    refused(", }", "}", "expected \", }\"");
    refused("{'descr'", "{ 'descr'", "expected \"{'descr': \"");
    refused(", }", ", } x", "newline");
}

Test(npy_header, preamble_lies)
{
    size_t n;
    unsigned char *p = edited("", "", &n);
    npy_header h;
    ck_error err = {""};
    cr_expect_eq(npy_parse_header(p, n - 1, &h, "x.npy", "", 0, &err), -1);
    cr_expect(strstr(err.msg, "only"), "%s", err.msg);
    p[6] = 4;
    cr_expect_eq(npy_parse_header(p, n, &h, "x.npy", "", 0, &err), -1);
    cr_expect(strstr(err.msg, "version 4.0"), "%s", err.msg);
    p[6] = 1;
    p[8] = 0x20, p[9] = 0x4e; /* 20000 */
    cr_expect_eq(npy_parse_header(p, n, &h, "x.npy", "", 0, &err), -1);
    cr_expect(strstr(err.msg, "10000"), "%s", err.msg);
    cr_expect_eq(npy_parse_header(p, 9, &h, "x.npy", "", 0, &err), -1);
    cr_expect(strstr(err.msg, "cut short"), "%s", err.msg);
    memcpy(p, "\x93NUMPZ", 6);
    cr_expect_eq(npy_parse_header(p, n, &h, "x.npy", "", 0, &err), -1);
    cr_expect(strstr(err.msg, "magic"), "%s", err.msg);
    free(p);
}

/* --- whole files, against numpy ----------------------------------------------------------- */

/* Every tensor of the index at path, read through ck_entry_read in odd-sized pieces, against
 * numpy's row-major bytes of the same key. */
static void check_against_numpy(const char *path, size_t want_entries, const char *format)
{
    ck_index *ix;
    ck_error err;
    cr_assert_eq(ck_open(path, &ix, &err), 0, "%s", err.msg);
    cr_expect_str_eq(ix->format, format);
    cr_assert_eq(ix->nentries, want_entries);
    for (size_t i = 0; i < ix->nentries; i++) {
        const ck_entry *e = &ix->entries[i];
        const char *out = tmp_file("", 0);
        run_python("import sys, numpy as np\n"
                   "p, k, out = sys.argv[1:4]\n"
                   "a = np.load(p) if p.endswith('.npy') else np.load(p)[k]\n"
                   "open(out, 'wb').write(np.ascontiguousarray(a).tobytes())\n",
                   path, e->name, out, NULL);
        size_t n;
        unsigned char *want = read_whole(out, &n);
        cr_assert_eq(e->nbytes, n, "%s", e->name);
        unsigned char *got = malloc(n + 1);
        for (size_t off = 0, step = 1; off < n; off += step, step = step * 3 + 7) {
            size_t len = off + step < n ? step : n - off;
            cr_assert_eq(ck_entry_read(ix, e, got + off, len, off), (ssize_t)len);
        }
        cr_expect(n == 0 || memcmp(got, want, n) == 0, "bytes of '%s' differ", e->name);
        free(got);
        free(want);
    }
    ck_index_free(ix);
}

/* Two files of the same arrays (named a and b + ext) written by script, which gets their paths
 * as argv[1] and argv[2]; each checked against numpy. */
static void check_pair(const char *ext, const char *script, size_t entries, const char *format)
{
    const char *dir = tmp_dir();
    const char *a = tmp_path_in(dir, strf("a%s", ext)), *b = tmp_path_in(dir, strf("b%s", ext));
    run_python(strf("import sys, numpy as np\n%s", script), a, b, NULL);
    check_against_numpy(a, entries, format);
    check_against_numpy(b, entries, format);
}

Test(npy_open, npy_fortran_and_c)
{
    check_pair(".npy", "a = np.arange(4 * 5 * 6, dtype='<i2').reshape(4, 5, 6)\n"
               "np.save(sys.argv[1], a); np.save(sys.argv[2], np.asfortranarray(a))\n",
               1, "npy");
}

Test(npy_open, npz_stored_and_compressed)
{
    check_pair(".npz", "r = np.random.default_rng(1)\n"
               "d = dict(a=r.standard_normal((300, 700)).astype('<f4'), "
               "b=np.arange(3_000_000, dtype='<u4'), c=np.float64(1.5), e=np.zeros((0, 3)))\n"
               "np.savez(sys.argv[1], **d); np.savez_compressed(sys.argv[2], **d)\n",
               4, "npz");
}

Test(npy_open, corpus)
{
    check_against_numpy("/work/shared/corpus/candle_test.npy", 1, "npy");
    check_against_numpy("/work/shared/corpus/candle_test.npz", 2, "npz");
    check_against_numpy("/work/shared/corpus/whisper_mel_filters.npz", 2, "npz");
}

/* --- seek points ------------------------------------------------------------------------- */

/* A raw deflate stream of data, as zlib writes it (level; memLevel: 8 is zlib's default, 1 its
 * smallest, whose blocks hold 128 symbols each). */
static unsigned char *deflate_mem(const unsigned char *data, size_t n, int level, int mem_level,
                                  size_t *out)
{
    z_stream s = {0};
    cr_assert_eq(deflateInit2(&s, level, Z_DEFLATED, -15, mem_level, Z_DEFAULT_STRATEGY), Z_OK);
    size_t cap = deflateBound(&s, n);
    unsigned char *c = malloc(cap);
    s.next_in = (unsigned char *)data;
    s.avail_in = (uInt)n;
    s.next_out = c;
    s.avail_out = (uInt)cap;
    cr_assert_eq(deflate(&s, Z_FINISH), Z_STREAM_END);
    *out = cap - s.avail_out;
    deflateEnd(&s);
    return c;
}

static unsigned char *deflate_raw(const unsigned char *data, size_t n, int level, size_t *out)
{
    return deflate_mem(data, n, level, 8, out);
}

/* An entry of n output bytes (CRC-32 crc) whose stream is the whole file fd (cn bytes). */
static zip_entry entry_of(size_t n, size_t cn, uint32_t crc)
{
    return (zip_entry){.name = "m", .name_len = 1, .method = 8, .size = n, .csize = cn,
                       .crc = crc};
}

/* data (n bytes) deflated (level, memLevel) into a file of its own, opened as an entry with a
 * point every span output bytes at most. */
typedef struct stream {
    unsigned char *c; /* the compressed bytes, cn of them */
    size_t cn;
    ck_file zf;
    zip_inflated zi;
} stream;

static void stream_open(stream *st, const unsigned char *data, size_t n, int level,
                        int mem_level, uint64_t span)
{
    st->c = deflate_mem(data, n, level, mem_level, &st->cn);
    const char *path = tmp_file(st->c, st->cn);
    st->zf = (ck_file){.path = path, .fd = open(path, O_RDONLY)};
    zip_entry e = entry_of(n, st->cn, (uint32_t)crc32(0, data, (uInt)n));
    ck_error err;
    cr_assert_eq(zip_inflate_open(&e, span, &st->zi, path, &err), 0, "%s", err.msg);
}

static void stream_close(stream *st)
{
    zip_inflate_close(&st->zi);
    close(st->zf.fd);
    free(st->c);
}

Test(npy_inflate, random_reads_through_every_point)
{
    size_t n = 3 << 20;
    unsigned char *data = malloc(n);
    fill_bytes(data, n, 9);
    for (size_t i = 0; i < n; i++) /* compressible, with matches reaching back across points */
        data[i] = (unsigned char)(i % 4096 < 2048 ? data[i] % 16 : data[i - i % 4096 + 7]);
    for (int level = 1; level <= 9; level += 8) {
        uint64_t span = 64 << 10;
        stream st;
        stream_open(&st, data, n, level, 8, span);
        zip_inflated *zi = &st.zi;
        const ck_file *zf = &st.zf;
        unsigned char head[100];
        cr_assert_eq(zip_inflate_read(zf, zi, head, sizeof head, 0), 0);
        cr_expect_arr_eq(head, data, sizeof head);
        cr_expect_eq(zi->npoints, 1, "a read of the head makes no point: %zu", zi->npoints);
        unsigned char *got = malloc(n);
        cr_assert_eq(zip_inflate_read(zf, zi, got, 1, n - 1), 0, "the last byte");
        cr_assert_eq(got[0], data[n - 1]);
        cr_expect_gt(zi->npoints, 10, "points: %zu", zi->npoints);
        cr_expect_leq(zi->npoints, n / span + 1, "points: %zu", zi->npoints);
        for (size_t k = 1; k < zi->npoints; k++)
            cr_expect_geq(zi->points[k].out - zi->points[k - 1].out, span);
        uint32_t x = 12345;
        for (int r = 0; r < 300; r++) {
            x = x * 1103515245u + 12345u;
            size_t off = (x >> 4) % n, len = (x >> 8) % 200000 + 1;
            if (r % 3 == 0 && r / 3 < (int)zi->npoints) /* exactly at a point, and just before */
                off = zi->points[r / 3].out - (r % 2 && zi->points[r / 3].out ? 1 : 0);
            if (len > n - off)
                len = n - off;
            cr_assert_eq(zip_inflate_read(zf, zi, got, len, off), 0);
            cr_assert_arr_eq(got, data + off, len, "level %d off %zu len %zu", level, off, len);
        }
        cr_expect_eq(zip_inflate_read(zf, zi, got, 2, n - 1), -EIO, "past the end");
        stream_close(&st);
        free(got);
    }
    free(data);
}

/* Reads front to back in pieces, as a mount's reader does: each piece's bytes come from the
 * pass as it goes (or from a point it made), and are the data. */
Test(npy_inflate, reads_in_order_extend_the_pass)
{
    size_t n = 5 << 20, piece = 128 << 10;
    unsigned char *data = malloc(n), *got = malloc(piece);
    fill_bytes(data, n, 3);
    for (size_t i = 0; i < n; i++)
        data[i] %= 8;
    stream st;
    stream_open(&st, data, n, 6, 8, 256 << 10);
    for (size_t off = 0; off < n; off += piece) {
        cr_assert_eq(zip_inflate_read(&st.zf, &st.zi, got, piece, off), 0, "off %zu", off);
        cr_assert_arr_eq(got, data + off, piece, "off %zu", off);
        cr_assert_geq(st.zi.reached, off + piece);
    }
    cr_expect(st.zi.done, "the whole stream checked once its end was read");
    cr_expect_null(zip_inflate_fault(&st.zi));
    stream_close(&st);
    free(got);
    free(data);
}

/* Threads reading one member at once, each its own random ranges, while the pass is still
 * being made: every read is the data (the pass and its points are shared under a lock). */
typedef struct reader_arg {
    stream *st;
    const unsigned char *data;
    size_t n;
    unsigned seed;
    int bad;
} reader_arg;

static void *read_randomly(void *p)
{
    reader_arg *a = p;
    unsigned char *got = malloc(300000);
    uint32_t x = a->seed;
    for (int r = 0; r < 60 && !a->bad; r++) {
        x = x * 1103515245u + 12345u;
        size_t off = (x >> 4) % a->n, len = (x >> 8) % 300000 + 1;
        if (len > a->n - off)
            len = a->n - off;
        a->bad = zip_inflate_read(&a->st->zf, &a->st->zi, got, len, off) != 0 ||
                 memcmp(got, a->data + off, len) != 0;
    }
    free(got);
    return NULL;
}

Test(npy_inflate, threads_share_the_pass)
{
    size_t n = 6 << 20;
    unsigned char *data = malloc(n);
    fill_bytes(data, n, 4);
    for (size_t i = 0; i < n; i++)
        data[i] %= 32;
    stream st;
    stream_open(&st, data, n, 6, 8, 128 << 10);
    pthread_t t[4];
    reader_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (reader_arg){.st = &st, .data = data, .n = n, .seed = 77u + (unsigned)i};
        cr_assert_eq(pthread_create(&t[i], NULL, read_randomly, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        cr_expect_not(args[i].bad, "thread %d read wrong bytes", i);
    }
    stream_close(&st);
    free(data);
}

/* Zeros in small deflate blocks (memLevel 1: a block per 128 symbols, ~33 KiB of output from
 * a few dozen bytes): a point at every span of output would hold ~1,000 times the compressed
 * size in windows; they stay within 8 times it (plus the point at the start). */
Test(npy_inflate, points_cost_at_most_8_times_the_compressed_size)
{
    size_t n = 64 << 20;
    unsigned char *data = calloc(1, n), got[64];
    stream st;
    stream_open(&st, data, n, 9, 1, 64 << 10);
    cr_assert_eq(zip_inflate_read(&st.zf, &st.zi, got, sizeof got, n - sizeof got), 0);
    cr_assert(st.zi.done);
    size_t windows = (st.zi.npoints - 1) * (size_t)ZIP_WINDOW;
    cr_expect_leq(windows, 8 * st.cn, "%zu points: %zu bytes of windows for %zu compressed",
                  st.zi.npoints, windows, st.cn);
    cr_expect_gt(st.zi.npoints, 1, "points still made: %zu", st.zi.npoints);
    cr_assert_eq(zip_inflate_read(&st.zf, &st.zi, got, sizeof got, n / 2), 0);
    cr_expect_arr_eq(got, data, sizeof got);
    stream_close(&st);
    free(data);
}

/* A stream wrong past its head (its CRC, its end, a corrupt tail): open and a read of the head
 * decode only the head, so they succeed; the read that reaches the fault fails, and so does
 * every read after it, the head's too, with the fault said. */
Test(npy_inflate, a_fault_past_the_head_is_found_by_the_read_that_reaches_it)
{
    size_t n = 2 << 20, cn;
    unsigned char *data = malloc(n), *got = malloc(n);
    fill_bytes(data, n, 5);
    for (size_t i = 0; i < n; i++)
        data[i] %= 4;
    unsigned char *c = deflate_raw(data, n, 6, &cn);
    uint32_t crc = (uint32_t)crc32(0, data, (uInt)n);
    const struct {
        const char *name, *fault;
        size_t cut;      /* compressed bytes kept */
        uint32_t crc;
        size_t size;     /* declared */
    } cases[] = {
        {"crc", "CRC-32", cn, crc ^ 1, n},
        {"truncated", "truncated", cn - 100, crc, n},
        {"declared too long", "ends before the size", cn, crc, n + 10},
        {"declared too short", "inflates past", cn, crc, n - 10},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const char *path = tmp_file(c, cases[k].cut);
        const ck_file zf = {.path = path, .fd = open(path, O_RDONLY)};
        zip_entry e = entry_of(cases[k].size, cases[k].cut, cases[k].crc);
        zip_inflated zi;
        ck_error err;
        cr_assert_eq(zip_inflate_open(&e, 64 << 10, &zi, path, &err), 0, "%s", err.msg);
        cr_assert_eq(zip_inflate_read(&zf, &zi, got, 4096, 0), 0, "%s: the head", cases[k].name);
        cr_expect_arr_eq(got, data, 4096);
        cr_expect_null(zip_inflate_fault(&zi));
        size_t len = cases[k].size - 4096;
        cr_expect_eq(zip_inflate_read(&zf, &zi, got, len, 4096), -EIO, "%s", cases[k].name);
        const char *fault = zip_inflate_fault(&zi);
        cr_expect(fault && strstr(fault, cases[k].fault), "%s: %s", cases[k].name,
                  fault ? fault : "(none)");
        cr_expect_eq(zip_inflate_read(&zf, &zi, got, 16, 0), -EIO, "%s: sticks", cases[k].name);
        zip_inflate_close(&zi);
        close(zf.fd);
    }
    free(c);
    free(got);
    free(data);
}

/* Declaring more output than deflate can make of the compressed bytes is refused at open,
 * before anything is decoded. */
Test(npy_inflate, a_bomb_is_refused_at_open)
{
    zip_entry e = entry_of((size_t)ZIP_MAX_RATIO * 100 + 1, 100, 0);
    zip_inflated zi;
    ck_error err;
    cr_assert_eq(zip_inflate_open(&e, 1 << 20, &zi, "x.npz", &err), -1);
    cr_expect(strstr(err.msg, "zip bomb"), "%s", err.msg);
    zip_inflate_close(&zi); /* harmless on a refused one */
}

Test(npy_inflate, a_changed_file_reads_eio)
{
    size_t n = 1 << 20;
    unsigned char *data = calloc(1, n);
    stream st;
    stream_open(&st, data, n, 6, 8, 1 << 16);
    cr_assert_eq(zip_inflate_read(&st.zf, &st.zi, data, n, 0), 0);
    memset(st.c, 0xff, st.cn);
    tmp_rewrite(st.zf.path, st.c, st.cn / 2); /* truncated and corrupt */
    close(st.zf.fd);
    st.zf.fd = open(st.zf.path, O_RDONLY);
    cr_expect_lt(zip_inflate_read(&st.zf, &st.zi, data, n, 0), 0);
    stream_close(&st);
    free(data);
}

/* --- npy_header_make --------------------------------------------------------------------- */

/* What npy_header_make writes is read back by the strict reader as the same dtype and shape,
 * the data 64-aligned; the longest header (64 dims of 19 digits) fits NPY_MAKE_MAX. */
Test(npy_header, made_headers_parse_back)
{
    static const enum ck_dtype ours[] = {CK_F16, CK_F32, CK_F64, CK_I8, CK_I16, CK_I32, CK_I64,
                                         CK_U8, CK_U16, CK_U32, CK_U64, CK_BOOL, CK_C64,
                                         CK_C128};
    static const int64_t shape[] = {3, 1, 0, 7};
    unsigned char buf[NPY_MAKE_MAX];
    for (size_t i = 0; i < sizeof ours / sizeof *ours; i++)
        for (unsigned rank = 0; rank <= 4; rank++) {
            uint64_t nbytes;
            cr_assert_eq(ck_tensor_nbytes(rank, shape, ours[i], &nbytes), 0);
            int raw = -1;
            size_t n = npy_header_make(ours[i], rank, shape, nbytes, buf, &raw);
            cr_expect_eq(raw, 0);
            cr_expect_eq(n % 64, 0);
            npy_header h = parse_ok(buf, n);
            cr_expect_eq(h.dtype, ours[i]);
            cr_expect_eq(h.rank, rank);
            cr_expect_eq(h.nbytes, nbytes);
            cr_expect_arr_eq(h.shape, shape, rank * sizeof *shape);
        }
    int64_t big[CK_MAX_RANK];
    for (unsigned d = 0; d < CK_MAX_RANK; d++)
        big[d] = INT64_MAX;
    int raw;
    size_t n = npy_header_make(CK_C128, CK_MAX_RANK, big, 0, buf, &raw);
    cr_expect(n <= NPY_MAKE_MAX && n % 64 == 0, "%zu", n);
    cr_expect_eq(buf[n - 1], '\n');
}

/* A dtype NumPy lacks is never given a NumPy type: whole-byte elements as '|VN' records of the
 * shape, sub-byte and block types as '|u1' bytes of shape (nbytes,); *raw says so. */
Test(npy_header, types_numpy_lacks_are_raw)
{
    static const struct {
        enum ck_dtype dt;
        const char *text;
    } t[] = {{CK_BF16, "{'descr': '|V2', 'fortran_order': False, 'shape': (2, 3), }"},
             {CK_F8_E4M3, "{'descr': '|V1', 'fortran_order': False, 'shape': (2, 3), }"},
             {CK_C32, "{'descr': '|V4', 'fortran_order': False, 'shape': (2, 3), }"},
             {CK_F4, "{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }"},
             {CK_Q4_0, "{'descr': '|u1', 'fortran_order': False, 'shape': (99,), }"}};
    static const int64_t shape[] = {2, 3};
    unsigned char buf[NPY_MAKE_MAX];
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        int raw = 0;
        uint64_t nbytes = t[i].dt == CK_F4 ? 3 : t[i].dt == CK_Q4_0 ? 99 : 0;
        size_t n = npy_header_make(t[i].dt, 2, shape, nbytes, buf, &raw);
        cr_expect_eq(raw, 1);
        cr_expect(n > 10 + strlen(t[i].text) &&
                      memcmp(buf + 10, t[i].text, strlen(t[i].text)) == 0,
                  "%s: %.*s", ck_dtype_name(t[i].dt), (int)(n - 10), buf + 10);
    }
}
