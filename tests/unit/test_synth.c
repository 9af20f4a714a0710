/* The synthesized files (checkpoint/synth.h): natural name order; the pack of a hand-built index,
 * checked against docs/PACK.md by a decoder written here and by the product's reader
 * (ck_open); the safetensors file, checked with cJSON; reading at odd offsets against writing;
 * --only; and a source that shrinks after its index was built. Expected bytes are gathered here
 * from the source file, never through ck_entry_read. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "../../base/names.h"
#include "../../checkpoint/synth.h"
#include "helpers.h"

TestSuite(natural, .fini = tmp_cleanup);
TestSuite(synth_pack, .fini = tmp_cleanup);
TestSuite(synth_only, .fini = tmp_cleanup);
TestSuite(synth_io, .fini = tmp_cleanup);
TestSuite(synth_st, .fini = tmp_cleanup);
TestSuite(synth_short, .fini = tmp_cleanup);

typedef unsigned long long ull;

static uint64_t align(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* --- ck_natural_cmp ------------------------------------------------------------------- */

static int sign(int v)
{
    return (v > 0) - (v < 0);
}

static int ncmp(const char *a, const char *b)
{
    return sign(ck_natural_cmp(a, strlen(a), b, strlen(b)));
}

static void assert_before(const char *a, const char *b)
{
    cr_assert_eq(ncmp(a, b), -1, "'%s' should sort before '%s'", a, b);
    cr_assert_eq(ncmp(b, a), 1, "'%s' should sort after '%s'", b, a);
}

Test(natural, digit_runs_compare_as_numbers)
{
    assert_before("layers.2", "layers.10");
    assert_before("layers.2.w", "layers.10.w");
    assert_before("a9", "a10");
    assert_before("9", "10");
    assert_before("n99", "n100");
    assert_before("a2z", "a10a"); /* the number decides before what follows it */
    assert_before("v1.2.3", "v1.10.0");
    assert_before("n18446744073709551615", "n18446744073709551616"); /* past 64 bits */
    assert_before("n18446744073709551616", "n100000000000000000000000000000");
    assert_before("n0000000000000000000000000000009", "n10");
}

Test(natural, leading_zeros_break_ties)
{
    assert_before("x1", "x01");
    assert_before("x01", "x001");
    assert_before("0", "00");
    assert_before("a0", "a00");
    assert_before("x01", "x2"); /* the value first, the zeros only when the values tie */
    assert_before("x001", "x2");
    assert_before("block.1.w", "block.01.w");
}

Test(natural, shorter_prefix_first)
{
    assert_before("", "a");
    assert_before("", "0");
    assert_before("a", "a0");
    assert_before("a", "a.b");
    assert_before("layers.1", "layers.1.w");
    assert_before("t.T", "t.T2");
}

Test(natural, other_bytes_compare_bytewise)
{
    assert_before("a", "b");
    assert_before("A", "a");
    assert_before("a.b", "a_b");
    assert_before("abc", "abd");
    assert_before("a.", "a1"); /* '.' < '0'..'9' < '_' as bytes */
    assert_before("a/", "a0");
    assert_before("a9", "a:");
    assert_before("a1", "a_");
    assert_before("z", "\xc3\xa9"); /* bytes over 0x7f are unsigned */
    assert_before("f4", "fnuz");
}

Test(natural, equal_only_when_identical_and_lengths_are_honoured)
{
    cr_assert_eq(ck_natural_cmp("", 0, "", 0), 0);
    cr_assert_eq(ncmp("layers.10.w", "layers.10.w"), 0);
    cr_assert_eq(ck_natural_cmp("abc", 2, "abd", 2), 0);
    cr_assert_eq(ck_natural_cmp("a12", 2, "a1", 2), 0); /* the run ends at the length */
    cr_assert_eq(sign(ck_natural_cmp("a12", 3, "a1", 2)), 1);
    cr_assert_eq(sign(ck_natural_cmp("a1", 2, "a12", 3)), -1);
    cr_assert_eq(sign(ck_natural_cmp("x00", 2, "x00", 3)), -1);
}

/* Distinct names built from pieces that put digit runs, zeros, dots and letters side by side. */
static size_t generated_names(const char **out, size_t cap)
{
    static const char *const pre[] = {"", "a", "a.", "x_"};
    static const char *const num[] = {"", "0", "00", "1", "01", "9", "10", "010", "100"};
    static const char *const suf[] = {"", ".2", "b"};
    size_t n = 0;
    for (size_t i = 0; i < sizeof pre / sizeof *pre; i++)
        for (size_t j = 0; j < sizeof num / sizeof *num; j++)
            for (size_t k = 0; k < sizeof suf / sizeof *suf; k++) {
                const char *s = strf("%s%s%s", pre[i], num[j], suf[k]);
                int dup = 0;
                for (size_t m = 0; m < n && !dup; m++)
                    dup = strcmp(out[m], s) == 0;
                if (!dup) {
                    cr_assert_lt(n, cap);
                    out[n++] = s;
                }
            }
    return n;
}

Test(natural, strict_weak_order_over_generated_names)
{
    const char *names[256];
    size_t n = generated_names(names, 256);
    cr_assert_geq(n, 40);
    static int c[256][256];
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            c[i][j] = ncmp(names[i], names[j]);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(c[i][i], 0, "'%s' is not equal to itself", names[i]);
        for (size_t j = 0; j < n; j++) {
            cr_assert_eq(c[i][j], -c[j][i], "'%s' vs '%s' is not antisymmetric", names[i],
                         names[j]);
            if (i != j)
                cr_assert_neq(c[i][j], 0, "distinct '%s' and '%s' compare equal", names[i],
                              names[j]);
        }
    }
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            if (c[i][j] >= 0)
                continue;
            for (size_t k = 0; k < n; k++)
                if (c[j][k] < 0)
                    cr_assert_lt(c[i][k], 0, "'%s' < '%s' < '%s' but not '%s' < '%s'", names[i],
                                 names[j], names[k], names[i], names[k]);
        }
}

/* --- the sample index ------------------------------------------------------------------- */

enum { CONTIG = 'c', STRIDED = 's', VALUE = 'v' };

typedef struct spec {
    const char *name;
    int how;             /* CONTIG, STRIDED or VALUE */
    int type;            /* enum ck_dtype, or enum ck_value_type for a value */
    unsigned rank;
    int64_t dims[3], strides[3];
    uint64_t at;         /* CONTIG: byte offset; STRIDED: element index of the first element */
    const char *text;    /* VALUE */
    size_t text_len;
    int share;           /* tensors with the same non-zero number must share one blob */
    const char *st;      /* the dtype in a safetensors file; NULL: left out of one */
} spec;

/* In source order, which is deliberately not the natural order. */
static const spec sample[] = {
    {"layers.10.w", CONTIG, CK_F32, 2, {4, 4}, {0}, 0, NULL, 0, 0, "F32"},
    {"layers.2.w", CONTIG, CK_F32, 2, {4, 4}, {0}, 64, NULL, 0, 0, "F32"},
    {"embed.weight", CONTIG, CK_F16, 2, {16, 16}, {0}, 1000, NULL, 0, 1, "F16"},
    {"config.lr", VALUE, CK_VAL_FLOAT, 0, {0}, {0}, 0, "0.001", 5, 0, NULL},
    {"layers.1.w", CONTIG, CK_BF16, 2, {3, 5}, {0}, 130, NULL, 0, 0, "BF16"},
    {"lm_head.weight", CONTIG, CK_F16, 2, {16, 16}, {0}, 1000, NULL, 0, 1, "F16"}, /* tied */
    {"alias.bytes", CONTIG, CK_U8, 1, {512}, {0}, 1000, NULL, 0, 1, "U8"}, /* same bytes */
    {"embed.part", CONTIG, CK_F16, 1, {8}, {0}, 1000, NULL, 0, 0, "F16"}, /* fewer of them */
    {"empty.a", CONTIG, CK_F32, 2, {0, 3}, {0}, 5000, NULL, 0, 2, "F32"},
    {"step", VALUE, CK_VAL_INT, 0, {0}, {0}, 0, "100", 3, 0, NULL},
    {"empty.b", CONTIG, CK_I8, 1, {0}, {0}, 0, NULL, 0, 2, "I8"},
    {"scalar", CONTIG, CK_I64, 0, {0}, {0}, 2000, NULL, 0, 0, "I64"},
    {"big", CONTIG, CK_U8, 1, {5000}, {0}, 3000, NULL, 0, 0, "U8"}, /* crosses 4096 */
    {"t.T", STRIDED, CK_F32, 2, {5, 3}, {1, 5}, 1024, NULL, 0, 3, "F32"}, /* a transpose */
    {"t.view", STRIDED, CK_F32, 2, {5, 3}, {3, 1}, 1024, NULL, 0, 0, "F32"},
    {"t.T2", STRIDED, CK_F32, 2, {5, 3}, {1, 5}, 1024, NULL, 0, 3, "F32"}, /* the same gather */
    {"v.bytes", VALUE, CK_VAL_BYTES, 0, {0}, {0}, 0, "\0\xff\x01", 3, 0, NULL},
    {"block.01.w", CONTIG, CK_F32, 1, {3}, {0}, 6000, NULL, 0, 0, "F32"},
    {"block.1.w", CONTIG, CK_F32, 1, {3}, {0}, 6012, NULL, 0, 0, "F32"},
    {"z.c128", CONTIG, CK_C128, 1, {2}, {0}, 6100, NULL, 0, 0, NULL},
    {"z.fnuz", CONTIG, CK_F8_E5M2FNUZ, 1, {7}, {0}, 7100, NULL, 0, 0, NULL},
    {"z.f4", CONTIG, CK_F4, 2, {5, 2}, {0}, 7000, NULL, 0, 0, "F4"},
    {"v.empty", VALUE, CK_VAL_STR, 0, {0}, {0}, 0, "", 0, 0, NULL},
    {"big.f64", CONTIG, CK_F64, 2, {3, 3}, {0}, 8200, NULL, 0, 0, "F64"},
};
#define NSAMPLE (sizeof sample / sizeof *sample)

/* The sample's names in natural order, worked out by hand. */
static const char *const sample_order[] = {
    "alias.bytes", "big", "big.f64", "block.1.w", "block.01.w", "config.lr", "embed.part",
    "embed.weight", "empty.a", "empty.b", "layers.1.w", "layers.2.w", "layers.10.w",
    "lm_head.weight", "scalar", "step", "t.T", "t.T2", "t.view", "v.bytes", "v.empty", "z.c128",
    "z.f4", "z.fnuz",
};
#define NORDER (sizeof sample_order / sizeof *sample_order)

static const char *const sample_meta[][2] = {{"format", "pt"}, {"note", "h\xc3\xa9llo"}};
static const char *const sample_pack_meta[][2] = {
    {"ckptfs.source_format", "test"}, {"format", "pt"}, {"note", "h\xc3\xa9llo"}};

enum { SRC_LEN = 16384 };
static unsigned char src[SRC_LEN];

static const spec *find_spec(const char *name)
{
    for (size_t i = 0; i < NSAMPLE; i++)
        if (strcmp(sample[i].name, name) == 0)
            return &sample[i];
    cr_assert_fail("no spec named '%s'", name);
    return NULL;
}

static uint64_t spec_nbytes(const spec *s)
{
    if (s->how == VALUE)
        return s->text_len;
    uint64_t n = 0;
    cr_assert_eq(ck_tensor_nbytes(s->rank, s->dims, (enum ck_dtype)s->type, &n), 0);
    return n;
}

/* The bytes the spec stands for, gathered from src: malloc'ed, *n bytes. */
static unsigned char *spec_bytes(const spec *s, size_t *n)
{
    *n = (size_t)spec_nbytes(s);
    unsigned char *out = malloc(*n + 1);
    cr_assert_not_null(out);
    if (s->how == VALUE) {
        memcpy(out, s->text, *n);
    } else if (s->how == CONTIG) {
        cr_assert_leq(s->at + *n, SRC_LEN);
        memcpy(out, src + s->at, *n);
    } else {
        size_t esize = ck_dtype_bits((enum ck_dtype)s->type) / 8, count = *n / esize;
        for (size_t i = 0; i < count; i++) {
            size_t rest = i, el = (size_t)s->at;
            for (unsigned d = s->rank; d-- > 0;) {
                el += (rest % (size_t)s->dims[d]) * (size_t)s->strides[d];
                rest /= (size_t)s->dims[d];
            }
            cr_assert_leq((el + 1) * esize, SRC_LEN);
            memcpy(out + i * esize, src + el * esize, esize);
        }
    }
    return out;
}

static void add_spec(ck_index *ix, const spec *s)
{
    ck_error err = {""};
    if (s->how == VALUE) {
        cr_assert_not_null(ck_index_add_value(ix, s->name, strlen(s->name),
                                              (enum ck_value_type)s->type, s->text, s->text_len,
                                              &err), "%s", err.msg);
    } else if (s->how == CONTIG) {
        add_contig(ix, s->name, (enum ck_dtype)s->type, s->rank, s->dims, s->at, spec_nbytes(s));
    } else {
        int64_t both[6];
        for (unsigned d = 0; d < s->rank; d++) {
            both[d] = s->dims[d];
            both[s->rank + d] = s->strides[d];
        }
        ck_entry *e = ck_index_add_entry(ix, s->name, strlen(s->name), CK_STRIDED, s->rank, both,
                                         &err);
        cr_assert_not_null(e, "%s", err.msg);
        e->dtype = (uint8_t)s->type;
        e->nbytes = spec_nbytes(s);
        e->ext = (ck_extent){.offset = s->at * (ck_dtype_bits((enum ck_dtype)s->type) / 8),
                             .file = 0};
    }
}

/* An index over a temporary copy of src (format "test") holding the sample and its metadata. */
static ck_index *sample_index(void)
{
    fill_bytes(src, SRC_LEN, 7);
    ck_index *ix = index_over(src, SRC_LEN);
    for (size_t i = 0; i < NSAMPLE; i++)
        add_spec(ix, &sample[i]);
    for (size_t m = 0; m < 2; m++) {
        ck_error err = {""};
        cr_assert_eq(ck_index_add_meta(ix, sample_meta[m][0], sample_meta[m][1], &err), 0);
    }
    return ix;
}

static ck_synth *pack_ok(const ck_index *ix, const char *only)
{
    ck_synth *sy = NULL;
    ck_error err = {""};
    cr_assert_eq(ck_synth_pack(ix, only, &sy, &err), 0, "ck_synth_pack: %s", err.msg);
    cr_assert_not_null(sy);
    return sy;
}

static ck_synth *st_ok(const ck_index *ix)
{
    ck_synth *sy = NULL;
    ck_error err = {""};
    cr_assert_eq(ck_synth_safetensors(ix, &sy, &err), 0, "ck_synth_safetensors: %s", err.msg);
    cr_assert_not_null(sy);
    return sy;
}

/* The whole synthesized file through one ck_synth_read; malloc'ed. */
static unsigned char *synth_all(ck_synth *sy, size_t *len)
{
    uint64_t size = ck_synth_size(sy);
    unsigned char *b = malloc((size_t)size + 1);
    cr_assert_not_null(b);
    ssize_t got = ck_synth_read(sy, b, (size_t)size + 100, 0);
    cr_assert_eq(got, (ssize_t)size, "read %zd of %llu bytes", got, (ull)size);
    cr_assert_eq(ck_synth_read(sy, b, 1, size), 0, "a read at the end gave bytes");
    *len = (size_t)size;
    return b;
}

/* The whole synthesized file as ck_synth_write streams it to a temporary file; malloc'ed. */
static unsigned char *synth_written(ck_synth *sy, size_t *len)
{
    const char *path = tmp_file("", 0);
    int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    int rc = ck_synth_write(sy, fd, NULL, NULL);
    close(fd);
    cr_assert_eq(rc, 0, "ck_synth_write: %s", strerror(-rc));
    return read_whole(path, len);
}

/* --- a pack decoder, from FORMAT.md ----------------------------------------------------- */

typedef struct cursor {
    const unsigned char *p;
    size_t at, end;
} cursor;

static const unsigned char *take(cursor *c, size_t n)
{
    cr_assert_leq(n, c->end - c->at, "the index ends early");
    const unsigned char *r = c->p + c->at;
    c->at += n;
    return r;
}

static uint32_t take32(cursor *c)
{
    return le32(take(c, 4));
}

static uint64_t take64(cursor *c)
{
    return get_le64(take(c, 8));
}

typedef struct dentry {
    const char *name; /* strf'ed */
    uint8_t kind, type, rank;
    int64_t dims[CK_MAX_RANK];
    uint64_t blob;
    const unsigned char *text;
    uint32_t text_len;
} dentry;

typedef struct decoded {
    const unsigned char *file;
    size_t size;
    uint64_t index_length, data_offset, data_length, checksum_offset;
    uint64_t nentries, nblobs;
    uint32_t nmeta;
    const char *keys[16], *values[16];
    uint64_t *boff, *blen;
    dentry *e;
} decoded;

/* Decodes a whole pack file, asserting every layout rule of FORMAT.md on the way: the header
 * fields, zero padding, blob placement, first-appearance order, unused blobs and the trailer
 * (recomputed here from the blob bytes). */
static void decode(const unsigned char *f, size_t size, decoded *d)
{
    *d = (decoded){.file = f, .size = size};
    cr_assert_geq(size, 64);
    cr_assert_arr_eq(f, "CKPTPACK", 8, "bad magic");
    cr_assert_eq(le32(f + 8), 1, "version");
    cr_assert_eq(le32(f + 12), 0, "flags");
    cr_assert_eq(get_le64(f + 16), 64, "index_offset");
    d->index_length = get_le64(f + 24);
    d->data_offset = get_le64(f + 32);
    d->data_length = get_le64(f + 40);
    d->checksum_offset = get_le64(f + 48);
    cr_assert_eq(d->data_offset % 4096, 0, "data_offset %llu", (ull)d->data_offset);
    cr_assert_eq(d->data_offset, align(64 + d->index_length, 4096),
                 "data_offset is not the first multiple of 4096 after the index");
    cr_assert_eq(d->data_length % 4096, 0, "data_length %llu", (ull)d->data_length);
    cr_assert_eq(d->checksum_offset, d->data_offset + d->data_length);
    cr_assert_leq(d->data_offset, size);
    cr_assert_eq(get_le64(f + 56), XXH3_64bits(f + 64, (size_t)d->index_length),
                 "index_xxh3 is not the XXH3 of the index");
    for (size_t i = 64 + (size_t)d->index_length; i < d->data_offset; i++)
        cr_assert_eq(f[i], 0, "padding byte %zu before the data is not zero", i);

    cursor c = {f, 64, 64 + (size_t)d->index_length};
    d->nentries = take64(&c);
    d->nblobs = take64(&c);
    d->nmeta = take32(&c);
    cr_assert_eq(take32(&c), 0, "reserved");
    cr_assert_leq(d->nmeta, 16);
    for (uint32_t m = 0; m < d->nmeta; m++) {
        uint32_t kl = take32(&c);
        const unsigned char *k = take(&c, kl);
        uint32_t vl = take32(&c);
        const unsigned char *v = take(&c, vl);
        d->keys[m] = strf("%.*s", (int)kl, (const char *)k);
        d->values[m] = strf("%.*s", (int)vl, (const char *)v);
    }
    cr_assert_eq(size, d->checksum_offset + 8 * d->nblobs + 8, "file size");
    d->boff = calloc((size_t)d->nblobs + 1, sizeof *d->boff);
    d->blen = calloc((size_t)d->nblobs + 1, sizeof *d->blen);
    cr_assert(d->boff && d->blen);
    uint64_t end = 0;
    for (uint64_t b = 0; b < d->nblobs; b++) {
        d->boff[b] = take64(&c);
        d->blen[b] = take64(&c);
        cr_assert_eq(d->boff[b] % 256, 0, "blob %llu at %llu", (ull)b, (ull)d->boff[b]);
        cr_assert_eq(d->boff[b], align(end, 256), "blob %llu is not at the first multiple of 256 "
                     "after the one before", (ull)b);
        end = d->boff[b] + d->blen[b];
        cr_assert_leq(end, d->data_length, "blob %llu is outside the data region", (ull)b);
    }
    cr_assert_eq(d->data_length, align(end, 4096), "the data region is not as short as it can be");
    d->e = calloc((size_t)d->nentries + 1, sizeof *d->e);
    cr_assert_not_null(d->e);
    uint64_t next_blob = 0;
    for (uint64_t i = 0; i < d->nentries; i++) {
        dentry *x = &d->e[i];
        uint32_t nl = take32(&c);
        const unsigned char *name = take(&c, nl);
        x->name = strf("%.*s", (int)nl, (const char *)name);
        cr_assert_eq(strlen(x->name), nl, "a name holds a NUL");
        const unsigned char *h = take(&c, 4);
        x->kind = h[0], x->type = h[1], x->rank = h[2];
        cr_assert_eq(h[3], 0, "reserved byte of '%s'", x->name);
        cr_assert_leq(x->rank, CK_MAX_RANK);
        if (x->kind == 0) {
            for (unsigned r = 0; r < x->rank; r++)
                x->dims[r] = (int64_t)take64(&c);
            x->blob = take64(&c);
            cr_assert_lt(x->blob, d->nblobs, "'%s' names blob %llu", x->name, (ull)x->blob);
            cr_assert_leq(x->blob, next_blob, "blobs are not in the order of first use");
            if (x->blob == next_blob)
                next_blob++;
        } else {
            cr_assert_eq(x->kind, 1, "kind of '%s'", x->name);
            cr_assert_eq(x->rank, 0, "rank of value '%s'", x->name);
            x->text_len = take32(&c);
            x->text = take(&c, x->text_len);
        }
    }
    cr_assert_eq(c.at, c.end, "the index has bytes left over");
    cr_assert_eq(next_blob, d->nblobs, "a blob is not used");

    /* the data region: zero wherever no blob is */
    const unsigned char *data = f + d->data_offset;
    unsigned char *covered = calloc((size_t)d->data_length + 1, 1);
    cr_assert_not_null(covered);
    for (uint64_t b = 0; b < d->nblobs; b++)
        memset(covered + d->boff[b], 1, (size_t)d->blen[b]);
    for (size_t i = 0; i < d->data_length; i++)
        if (!covered[i])
            cr_assert_eq(data[i], 0, "data byte %zu between blobs is not zero", i);
    free(covered);

    /* the trailer */
    const unsigned char *t = f + d->checksum_offset;
    for (uint64_t b = 0; b < d->nblobs; b++)
        cr_assert_eq(get_le64(t + 8 * b), XXH3_64bits(data + d->boff[b], (size_t)d->blen[b]),
                     "the checksum of blob %llu", (ull)b);
    cr_assert_eq(get_le64(t + 8 * d->nblobs), XXH3_64bits(t, 8 * (size_t)d->nblobs),
                 "the checksum of the checksums");
}

static void decoded_free(decoded *d)
{
    free(d->boff);
    free(d->blen);
    free(d->e);
}

/* Checks a decoded pack against the sample: the entries named in order (natural order, worked
 * out by the caller), each one's kind, type, shape and bytes; the metadata; blob sharing exactly
 * as the specs' share numbers say. */
static void check_contents(const decoded *d, const char *const *names, size_t n,
                           const char *const (*meta)[2], size_t nmeta)
{
    cr_assert_eq(d->nmeta, nmeta, "%u metadata pairs, expected %zu", d->nmeta, nmeta);
    for (size_t m = 0; m < nmeta; m++) {
        cr_assert_str_eq(d->keys[m], meta[m][0]);
        cr_assert_str_eq(d->values[m], meta[m][1]);
    }
    cr_assert_eq(d->nentries, n, "%llu entries, expected %zu", (ull)d->nentries, n);
    for (size_t k = 0; k < n; k++) {
        const dentry *x = &d->e[k];
        cr_assert_str_eq(x->name, names[k], "entry %zu", k);
        const spec *s = find_spec(names[k]);
        size_t len;
        unsigned char *want = spec_bytes(s, &len);
        if (s->how == VALUE) {
            cr_assert_eq(x->kind, 1, "'%s' is not a value", x->name);
            cr_assert_eq(x->type, s->type);
            cr_assert_eq(x->text_len, len);
            cr_assert_arr_eq(x->text, want, len, "the text of '%s'", x->name);
        } else {
            cr_assert_eq(x->kind, 0, "'%s' is not a tensor", x->name);
            cr_assert_eq(x->type, s->type, "dtype of '%s'", x->name);
            cr_assert_eq(x->rank, s->rank, "rank of '%s'", x->name);
            for (unsigned r = 0; r < s->rank; r++)
                cr_assert_eq(x->dims[r], s->dims[r], "dim %u of '%s'", r, x->name);
            cr_assert_eq(d->blen[x->blob], len, "blob length of '%s'", x->name);
            cr_assert_arr_eq(d->file + d->data_offset + d->boff[x->blob], want, len,
                             "the bytes of '%s'", x->name);
        }
        free(want);
    }
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++) {
            const spec *a = find_spec(names[i]), *b = find_spec(names[j]);
            if (a->how == VALUE || b->how == VALUE)
                continue;
            int same = d->e[i].blob == d->e[j].blob, want = a->share && a->share == b->share;
            cr_assert_eq(same, want, "'%s' and '%s' %s one blob", a->name, b->name,
                         same ? "share" : "do not share");
        }
}

/* The product's reader (ck_open, so pack_read_file) on the pack: the same entries in the same
 * order, with the same bytes through ck_entry_read, and the same metadata. A pack of that pack
 * is the same file. */
static void check_reopened(const unsigned char *f, size_t size, const char *const *names,
                           size_t n, const char *const (*meta)[2], size_t nmeta)
{
    ck_index *p = open_ok(tmp_file(f, size));
    cr_assert_str_eq(p->format, "pack");
    cr_assert_eq(p->nentries, n);
    for (size_t k = 0; k < n; k++) {
        const ck_entry *e = &p->entries[k];
        const spec *s = find_spec(names[k]);
        cr_assert_eq(e->name_len, strlen(names[k]));
        cr_assert_str_eq(e->name, names[k]);
        cr_assert_eq(e->kind, s->how == VALUE ? CK_VALUE : CK_TENSOR, "kind of '%s'", e->name);
        cr_assert_eq(e->dtype, s->type, "type of '%s'", e->name);
        if (s->how != VALUE) {
            cr_assert_eq(e->rank, s->rank, "rank of '%s'", e->name);
            for (unsigned r = 0; r < s->rank; r++)
                cr_assert_eq(e->shape[r], s->dims[r]);
        }
        size_t len;
        unsigned char *want = spec_bytes(s, &len), *got = malloc(len + 1);
        cr_assert_eq(e->nbytes, len, "size of '%s'", e->name);
        cr_assert_eq(ck_entry_read(p, e, got, len + 1, 0), (ssize_t)len);
        cr_assert_arr_eq(got, want, len, "the bytes of '%s' read back", e->name);
        free(want);
        free(got);
    }
    cr_assert_eq(p->nmeta, nmeta);
    for (size_t m = 0; m < nmeta; m++) {
        cr_assert_str_eq(p->meta[m].key, meta[m][0]);
        cr_assert_str_eq(p->meta[m].value, meta[m][1]);
    }
    ck_synth *again = pack_ok(p, NULL);
    size_t len;
    unsigned char *b = synth_all(again, &len);
    cr_assert_eq(len, size, "a pack of the pack has another size");
    cr_assert_arr_eq(b, f, size, "a pack of the pack differs");
    free(b);
    ck_synth_free(again);
    ck_index_free(p);
}

/* Packs the sample with `only`, then checks everything above on what ck_synth_read gives. */
static void check_sample_pack(const char *only, const char *const *names, size_t n)
{
    ck_index *ix = sample_index();
    ck_synth *sy = pack_ok(ix, only);
    size_t size;
    unsigned char *f = synth_all(sy, &size);
    decoded d;
    decode(f, size, &d);
    check_contents(&d, names, n, sample_pack_meta, 3);
    check_reopened(f, size, names, n, sample_pack_meta, 3);
    decoded_free(&d);
    free(f);
    ck_synth_free(sy);
    ck_index_free(ix);
}

/* --- the pack --------------------------------------------------------------------------- */

Test(synth_pack, sample_follows_the_format_and_reads_back)
{
    check_sample_pack(NULL, sample_order, NORDER);
}

Test(synth_pack, blob_sharing)
{
    ck_index *ix = sample_index();
    ck_synth *sy = pack_ok(ix, NULL);
    size_t size;
    unsigned char *f = synth_all(sy, &size);
    decoded d;
    decode(f, size, &d);
    /* 24 entries, 4 values; the tied three, the two empties and the strided twins share */
    cr_assert_eq(d.nblobs, 20 - 2 - 1 - 1, "%llu blobs", (ull)d.nblobs);
    uint64_t empty = UINT64_MAX, zero_blobs = 0;
    for (size_t k = 0; k < d.nentries; k++)
        if (d.e[k].kind == 0 && d.blen[d.e[k].blob] == 0) {
            cr_assert(empty == UINT64_MAX || empty == d.e[k].blob, "two empty blobs");
            empty = d.e[k].blob;
        }
    for (uint64_t b = 0; b < d.nblobs; b++)
        zero_blobs += d.blen[b] == 0;
    cr_assert_eq(zero_blobs, 1);
    decoded_free(&d);
    free(f);
    ck_synth_free(sy);
    ck_index_free(ix);
}

Test(synth_pack, strided_entries_are_gathered_row_major)
{
    ck_index *ix = sample_index();
    ck_synth *sy = pack_ok(ix, "t.*");
    size_t size;
    unsigned char *f = synth_all(sy, &size);
    decoded d;
    decode(f, size, &d);
    cr_assert_eq(d.nentries, 3);
    cr_assert_eq(d.nblobs, 2);
    /* t.T is the transpose of the [3][5] F32 storage at element 1024: element (i, j) of t.T is
     * storage element j * 5 + i */
    const unsigned char *t = f + d.data_offset + d.boff[d.e[0].blob];
    for (size_t i = 0; i < 5; i++)
        for (size_t j = 0; j < 3; j++)
            cr_assert_arr_eq(t + 4 * (i * 3 + j), src + 4 * (1024 + j * 5 + i), 4,
                             "t.T[%zu][%zu]", i, j);
    /* t.view is the storage as it lies */
    cr_assert_arr_eq(f + d.data_offset + d.boff[d.e[2].blob], src + 4096, 60);
    decoded_free(&d);
    free(f);
    ck_synth_free(sy);
    ck_index_free(ix);
}

Test(synth_pack, source_format_first_and_not_repeated)
{
    fill_bytes(src, SRC_LEN, 7);
    ck_index *ix = index_over(src, SRC_LEN);
    add_spec(ix, find_spec("scalar"));
    ck_error err = {""};
    cr_assert_eq(ck_index_add_meta(ix, "ckptfs.source_format", "pytorch-zip", &err), 0);
    cr_assert_eq(ck_index_add_meta(ix, "note", "x", &err), 0);
    ck_synth *sy = pack_ok(ix, NULL);
    size_t size;
    unsigned char *f = synth_all(sy, &size);
    decoded d;
    decode(f, size, &d);
    static const char *const meta[][2] = {{"ckptfs.source_format", "pytorch-zip"},
                                          {"note", "x"}};
    static const char *const names[] = {"scalar"};
    check_contents(&d, names, 1, meta, 2);
    check_reopened(f, size, names, 1, meta, 2);
    decoded_free(&d);
    free(f);
    ck_synth_free(sy);
    ck_index_free(ix);
}

Test(synth_pack, no_metadata_of_its_own)
{
    fill_bytes(src, SRC_LEN, 7);
    ck_index *ix = index_over(src, SRC_LEN);
    add_spec(ix, find_spec("embed.weight"));
    add_spec(ix, find_spec("empty.a"));
    ck_synth *sy = pack_ok(ix, NULL);
    size_t size;
    unsigned char *f = synth_all(sy, &size);
    decoded d;
    decode(f, size, &d);
    static const char *const meta[][2] = {{"ckptfs.source_format", "test"}};
    static const char *const names[] = {"embed.weight", "empty.a"};
    check_contents(&d, names, 2, meta, 1);
    check_reopened(f, size, names, 2, meta, 1);
    decoded_free(&d);
    free(f);
    ck_synth_free(sy);
    ck_index_free(ix);
}

Test(synth_pack, an_empty_index)
{
    ck_index *ix = ck_index_new("nothing");
    cr_assert_not_null(ix);
    ck_synth *sy = pack_ok(ix, NULL);
    size_t size;
    unsigned char *f = synth_all(sy, &size);
    decoded d;
    decode(f, size, &d);
    cr_assert_eq(d.nentries, 0);
    cr_assert_eq(d.nblobs, 0);
    cr_assert_eq(d.data_length, 0);
    cr_assert_eq(size, 4096 + 8);
    static const char *const meta[][2] = {{"ckptfs.source_format", "nothing"}};
    check_contents(&d, NULL, 0, meta, 1);
    check_reopened(f, size, NULL, 0, meta, 1);
    decoded_free(&d);
    free(f);
    ck_synth_free(sy);
    ck_index_free(ix);
}

Test(synth_pack, generated_names_in_natural_order)
{
    const char *names[256];
    size_t n = generated_names(names, 256), kept = 0;
    for (size_t i = 0; i < n; i++) /* a pack allows the empty name only alone (FORMAT.md) */
        if (names[i][0])
            names[kept++] = names[i];
    n = kept;
    fill_bytes(src, SRC_LEN, 7);
    ck_index *ix = index_over(src, SRC_LEN);
    for (size_t i = 0; i < n; i++) { /* in a scrambled order, each its own byte */
        size_t k = (i * 37) % n;
        add_contig(ix, names[k], CK_U8, 1, (int64_t[]){1}, k, 1);
    }
    ck_synth *sy = pack_ok(ix, NULL);
    size_t size;
    unsigned char *f = synth_all(sy, &size);
    decoded d;
    decode(f, size, &d);
    cr_assert_eq(d.nentries, n);
    cr_assert_eq(d.nblobs, n);
    for (size_t k = 1; k < n; k++)
        cr_assert_lt(ncmp(d.e[k - 1].name, d.e[k].name), 0, "'%s' before '%s'", d.e[k - 1].name,
                     d.e[k].name);
    for (size_t k = 0; k < n; k++) { /* each name still has its own byte */
        size_t i = 0;
        while (strcmp(names[i], d.e[k].name) != 0)
            i++;
        cr_assert_eq(f[d.data_offset + d.boff[d.e[k].blob]], src[i]);
    }
    decoded_free(&d);
    free(f);
    ck_synth_free(sy);
    ck_index_free(ix);
}

/* Asserts that a ck_synth_* call failed cleanly: -1, *out NULL, a message about path. */
static void assert_synth_fails(int rc, ck_synth *sy, const ck_error *err, const char *path,
                               const char *what)
{
    cr_assert_eq(rc, -1);
    cr_assert_null(sy, "a failed call left *out set");
    assert_error(err, path, what);
}

Test(synth_pack, two_entries_with_one_name_fail)
{
    fill_bytes(src, SRC_LEN, 7);
    ck_index *ix = index_over(src, SRC_LEN);
    add_contig(ix, "dup", CK_U8, 1, (int64_t[]){4}, 0, 4);
    add_contig(ix, "other", CK_U8, 1, (int64_t[]){4}, 4, 4);
    add_contig(ix, "dup", CK_U8, 1, (int64_t[]){4}, 8, 4);
    const char *path = ix->files[0].path;
    int dummy, rc;
    ck_synth *sy = (ck_synth *)&dummy;
    ck_error err = {""};
    rc = ck_synth_pack(ix, NULL, &sy, &err);
    assert_synth_fails(rc, sy, &err, path, "two entries are named 'dup'");
    sy = (ck_synth *)&dummy;
    rc = ck_synth_pack(ix, "d*", &sy, &err);
    assert_synth_fails(rc, sy, &err, path, "two entries are named 'dup'");
    sy = (ck_synth *)&dummy;
    rc = ck_synth_safetensors(ix, &sy, &err);
    assert_synth_fails(rc, sy, &err, path, "two entries are named 'dup'");
    sy = pack_ok(ix, "other"); /* only one of them is a duplicate of nothing */
    size_t size;
    unsigned char *f = synth_all(sy, &size);
    decoded d;
    decode(f, size, &d);
    cr_assert_eq(d.nblobs, 1);
    decoded_free(&d);
    free(f);
    ck_synth_free(sy);
    ck_index_free(ix);
}

/* FORMAT.md allows the empty name only for a pack's one entry: the writer refuses what the
 * reader would, while the safetensors file (no such rule) is still built. */
Test(synth_pack, empty_name_beside_others_fails)
{
    fill_bytes(src, SRC_LEN, 7);
    ck_index *ix = index_over(src, SRC_LEN);
    add_contig(ix, "", CK_U8, 1, (int64_t[]){4}, 0, 4);
    add_contig(ix, "a", CK_U8, 1, (int64_t[]){4}, 4, 4);
    int dummy;
    ck_synth *sy = (ck_synth *)&dummy;
    ck_error err = {""};
    int rc = ck_synth_pack(ix, NULL, &sy, &err);
    assert_synth_fails(rc, sy, &err, ix->files[0].path, "empty name");
    sy = pack_ok(ix, "a");
    ck_synth_free(sy);
    cr_assert_eq(ck_synth_safetensors(ix, &sy, &err), 0, "%s", err.msg);
    ck_synth_free(sy);
    ck_index_free(ix);
}

/* The trailer, computed on first read: each tensor's blob sum is the XXH3 of its own bytes, as
 * an independent hash of what the test put there gives it, and the last 8 bytes sum the rest. */
Test(synth_pack, trailer_sums_each_blob_from_its_bytes)
{
    ck_index *ix = sample_index();
    ck_synth *sy = pack_ok(ix, NULL); /* nothing read yet: no trailer */
    size_t size;
    unsigned char *f = synth_all(sy, &size);
    decoded d;
    decode(f, size, &d);
    const unsigned char *sums = f + d.checksum_offset;
    for (size_t k = 0; k < d.nentries; k++) {
        if (d.e[k].kind != CK_TENSOR)
            continue;
        size_t len;
        unsigned char *want = spec_bytes(find_spec(d.e[k].name), &len);
        cr_assert_eq(get_le64(sums + 8 * d.e[k].blob), XXH3_64bits(want, len), "'%s'",
                     d.e[k].name);
        free(want);
    }
    cr_assert_eq(get_le64(sums + 8 * d.nblobs), XXH3_64bits(sums, 8 * d.nblobs));
    decoded_free(&d);
    free(f);
    ck_synth_free(sy);
    ck_index_free(ix);
}

typedef struct progress_log {
    uint64_t calls, last_done, total, stop_after;
    int backwards;
} progress_log;

static int log_progress(void *ctx, uint64_t done, uint64_t total)
{
    progress_log *p = ctx;
    if (done < p->last_done)
        p->backwards = 1;
    p->calls++;
    p->last_done = done;
    p->total = total;
    return p->stop_after && p->calls >= p->stop_after;
}

/* --- --only ---------------------------------------------------------------------------- */

#define CHECK_ONLY(only, ...)                                                                  \
    do {                                                                                       \
        static const char *const names_[] = {__VA_ARGS__};                                     \
        check_sample_pack(only, names_, sizeof names_ / sizeof *names_);                       \
    } while (0)

Test(synth_only, prefix_is_the_name_or_a_name_that_goes_on_with_a_dot)
{
    CHECK_ONLY("layers.1", "layers.1.w");
    CHECK_ONLY("layers.1.", "layers.1.w"); /* ending in a dot: the names it begins */
    CHECK_ONLY("layers", "layers.1.w", "layers.2.w", "layers.10.w");
    CHECK_ONLY("layers.", "layers.1.w", "layers.2.w", "layers.10.w");
    CHECK_ONLY("layers.10.w", "layers.10.w");
    CHECK_ONLY("embed", "embed.part", "embed.weight");
    CHECK_ONLY("block.1", "block.1.w");
    CHECK_ONLY("t.T", "t.T");
    CHECK_ONLY("big", "big", "big.f64");
    CHECK_ONLY("step", "step"); /* a value alone: no blobs at all */
}

Test(synth_only, glob)
{
    CHECK_ONLY("*.w", "block.1.w", "block.01.w", "layers.1.w", "layers.2.w", "layers.10.w");
    CHECK_ONLY("layers.[12].w", "layers.1.w", "layers.2.w");
    CHECK_ONLY("t.T?", "t.T2");
    CHECK_ONLY("*mpty*", "empty.a", "empty.b", "v.empty");
    CHECK_ONLY("v.*", "v.bytes", "v.empty");
    CHECK_ONLY("*weight", "embed.weight", "lm_head.weight");
    check_sample_pack("*", sample_order, NORDER);
}

Test(synth_only, name_selected)
{
    cr_assert(ck_name_selected("anything", 8, NULL));
    cr_assert(ck_name_selected("layers.1", 8, "layers.1"));
    cr_assert(ck_name_selected("layers.1.w", 10, "layers.1"));
    cr_assert_not(ck_name_selected("layers.10.w", 11, "layers.1"));
    cr_assert_not(ck_name_selected("layers", 6, "layers.1"));
    cr_assert(ck_name_selected("model.layers.0.w", 16, "model."));
    cr_assert_not(ck_name_selected("model", 5, "model."));
    cr_assert_not(ck_name_selected("optim.state.w", 13, "model."));
    cr_assert(ck_name_selected("layers.10.w", 11, "layers.*"));
    cr_assert(ck_name_selected("a.b.c", 5, "*c"));
    cr_assert_not(ck_name_selected("a.b.c", 5, "*d"));
    cr_assert_not(ck_name_selected("layers.1x", 9, "layers.1"));
}

Test(synth_only, selecting_nothing_fails)
{
    ck_index *ix = sample_index();
    static const char *const none[] = {"nothing", "lay", "layers.9.", "LAYERS.*", "t.t", "*.x"};
    for (size_t i = 0; i < sizeof none / sizeof *none; i++) {
        int dummy;
        ck_synth *sy = (ck_synth *)&dummy;
        ck_error err = {""};
        int rc = ck_synth_pack(ix, none[i], &sy, &err);
        assert_synth_fails(rc, sy, &err, ix->files[0].path, "selects nothing");
        cr_assert_not_null(strstr(err.msg, none[i]), "'%s' does not name '%s'", err.msg, none[i]);
    }
    ck_index_free(ix);
}

/* --- reading and writing ----------------------------------------------------------------- */

static void assert_read(ck_synth *sy, const unsigned char *want, size_t size, uint64_t off,
                        size_t len)
{
    unsigned char *buf = malloc(len + 1);
    cr_assert_not_null(buf);
    size_t expect = off >= size ? 0 : len < size - off ? len : (size_t)(size - off);
    ssize_t got = ck_synth_read(sy, buf, len, off);
    cr_assert_eq(got, (ssize_t)expect, "read of %zu at %llu gave %zd, expected %zu", len,
                 (ull)off, got, expect);
    cr_assert_arr_eq(buf, want + off, expect, "read of %zu at %llu", len, (ull)off);
    free(buf);
}

/* Every way of reading sy against the bytes ck_synth_write wrote: the end first, backwards in
 * odd chunks, forwards in chunk sizes around the alignments, random ranges, past the end. */
static void check_reads(ck_synth *sy, const unsigned char *want, size_t size)
{
    cr_assert_eq(ck_synth_size(sy), size);
    assert_read(sy, want, size, size - 8, 8);
    assert_read(sy, want, size, size - 3, 100);
    for (uint64_t end = size; end > 0;) {
        uint64_t off = end > 4099 ? end - 4099 : 0;
        assert_read(sy, want, size, off, (size_t)(end - off));
        end = off;
    }
    static const size_t chunks[] = {1, 7, 255, 256, 257, 4095, 4096, 4097, 65537};
    for (size_t c = 0; c < sizeof chunks / sizeof *chunks; c++)
        for (uint64_t off = 0; off < size; off += chunks[c])
            assert_read(sy, want, size, off, chunks[c]);
    unsigned char r[8 * 300];
    fill_bytes(r, sizeof r, 99);
    for (size_t i = 0; i < 300; i++) {
        uint64_t a = get_le64(r + 8 * i);
        assert_read(sy, want, size, (a & 0xffffffff) % (size + 16), (size_t)((a >> 32) % 9000));
    }
    assert_read(sy, want, size, 0, 0);
    assert_read(sy, want, size, size, 10);
    assert_read(sy, want, size, size + 1, 10);
    unsigned char b;
    cr_assert_eq(ck_synth_read(sy, &b, 1, UINT64_MAX), 0);
}

Test(synth_io, pack_write_is_read_at_any_offset)
{
    ck_index *ix = sample_index();
    ck_synth *sy = pack_ok(ix, NULL);
    size_t size;
    unsigned char *written = synth_written(sy, &size);
    decoded d;
    decode(written, size, &d);
    check_contents(&d, sample_order, NORDER, sample_pack_meta, 3);
    decoded_free(&d);
    /* the trailer the write cached serves reads, and a second write is the same */
    check_reads(sy, written, size);
    size_t size2;
    unsigned char *again = synth_written(sy, &size2);
    cr_assert_eq(size2, size);
    cr_assert_arr_eq(again, written, size);
    free(again);
    ck_synth_free(sy);
    /* a fresh one computes the trailer on the first read, here a read of the trailer */
    sy = pack_ok(ix, NULL);
    check_reads(sy, written, size);
    ck_synth_free(sy);
    /* a fresh one whose first read starts in the data and runs into the trailer */
    sy = pack_ok(ix, NULL);
    assert_read(sy, written, size, size - 5000, 5000);
    again = synth_written(sy, &size2);
    cr_assert_arr_eq(again, written, size);
    free(again);
    ck_synth_free(sy);
    free(written);
    ck_index_free(ix);
}

Test(synth_io, write_reports_progress_and_can_be_stopped)
{
    ck_index *ix = sample_index();
    ck_synth *sy = pack_ok(ix, NULL);
    const char *path = tmp_file("", 0);
    int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
    progress_log log = {0};
    cr_assert_eq(ck_synth_write(sy, fd, log_progress, &log), 0);
    close(fd);
    cr_assert_gt(log.calls, 0);
    cr_assert_eq(log.backwards, 0);
    cr_assert_eq(log.last_done, ck_synth_size(sy));
    cr_assert_eq(log.total, ck_synth_size(sy));
    fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
    log = (progress_log){.stop_after = 1};
    cr_assert_eq(ck_synth_write(sy, fd, log_progress, &log), -ECANCELED);
    close(fd);
    /* a write to a descriptor that cannot be written */
    fd = open(path, O_RDONLY | O_CLOEXEC);
    cr_assert_lt(ck_synth_write(sy, fd, NULL, NULL), 0);
    close(fd);
    ck_synth_free(sy);
    ck_index_free(ix);
}

/* A source written to while a pack or safetensors file is made from it (its mtime moves): the
 * write fails with -EIO, whichever bytes it read, since they may be old and new mixed. */
Test(synth_io, write_fails_when_a_source_changed)
{
    ck_index *ix = sample_index();
    ck_synth *pk = pack_ok(ix, NULL), *st = NULL;
    ck_error err = {""};
    cr_assert_eq(ck_synth_safetensors(ix, &st, &err), 0, "%s", err.msg);
    const char *path = tmp_file("", 0);
    int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
    cr_assert_eq(ck_synth_write(pk, fd, NULL, NULL), 0);
    /* The same bytes written back: only the mtime tells. */
    struct timespec later[2] = {{.tv_nsec = UTIME_OMIT}, {0}};
    cr_assert_eq(clock_gettime(CLOCK_REALTIME, &later[1]), 0);
    later[1].tv_sec += 5;
    cr_assert_eq(futimens(ix->files[0].fd, later), 0);
    cr_assert_eq(ftruncate(fd, 0), 0);
    cr_assert_eq(ck_synth_write(pk, fd, NULL, NULL), -EIO);
    cr_assert_eq(ck_synth_write(st, fd, NULL, NULL), -EIO);
    close(fd);
    ck_synth_free(pk);
    ck_synth_free(st);
    ck_index_free(ix);
}

/* --- the safetensors file ---------------------------------------------------------------- */

/* Parses a safetensors file's header independently: the length (a multiple of 8), the JSON,
 * then only spaces (fewer than 8) up to the data. */
static cJSON *st_header_of(const unsigned char *f, size_t size, uint64_t *hlen)
{
    cr_assert_geq(size, 8);
    *hlen = get_le64(f);
    cr_assert_eq(*hlen % 8, 0, "header length %llu", (ull)*hlen);
    cr_assert_leq(8 + *hlen, size);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts((const char *)f + 8, (size_t)*hlen, &end, 0);
    cr_assert_not_null(root, "the header is not JSON");
    cr_assert(cJSON_IsObject(root));
    size_t json_len = (size_t)(end - (const char *)f - 8);
    cr_assert_lt(*hlen - json_len, 8, "more padding than needed");
    for (size_t i = json_len; i < *hlen; i++)
        cr_assert_eq(f[8 + i], ' ', "header padding byte %zu is not a space", i);
    return root;
}

/* Checks the tensors of a safetensors header: the names in order, dtype, shape, data_offsets
 * contiguous from 0, the bytes, and that the file ends with the last one. */
static void check_st_tensors(const unsigned char *f, size_t size, cJSON *root,
                             const char *const *names, size_t n)
{
    uint64_t hlen = get_le64(f), at = 0;
    size_t k = 0;
    for (cJSON *t = root->child; t; t = t->next) {
        if (strcmp(t->string, "__metadata__") == 0)
            continue;
        cr_assert_lt(k, n, "an extra tensor '%s'", t->string);
        cr_assert_str_eq(t->string, names[k], "tensor %zu", k);
        const spec *s = find_spec(names[k]);
        cr_assert_not_null(s->st, "'%s' should have been left out", s->name);
        cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
        cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
        cJSON *offs = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
        cr_assert(cJSON_IsString(dt) && cJSON_IsArray(shape) && cJSON_IsArray(offs));
        cr_assert_str_eq(dt->valuestring, s->st, "dtype of '%s'", s->name);
        cr_assert_eq(cJSON_GetArraySize(shape), (int)s->rank, "rank of '%s'", s->name);
        for (unsigned r = 0; r < s->rank; r++)
            cr_assert_eq(cJSON_GetArrayItem(shape, (int)r)->valuedouble, (double)s->dims[r]);
        cr_assert_eq(cJSON_GetArraySize(offs), 2);
        uint64_t begin = (uint64_t)cJSON_GetArrayItem(offs, 0)->valuedouble;
        uint64_t end = (uint64_t)cJSON_GetArrayItem(offs, 1)->valuedouble;
        size_t len;
        unsigned char *want = spec_bytes(s, &len);
        cr_assert_eq(begin, at, "'%s' does not start where the one before ends", s->name);
        cr_assert_eq(end - begin, len, "size of '%s'", s->name);
        cr_assert_leq(8 + hlen + end, size);
        cr_assert_arr_eq(f + 8 + hlen + begin, want, len, "the bytes of '%s'", s->name);
        free(want);
        at = end;
        k++;
    }
    cr_assert_eq(k, n, "%zu tensors, expected %zu", k, n);
    cr_assert_eq(size, 8 + hlen + at, "the file does not end with the last tensor");
}

static const char *const st_order[] = {
    "alias.bytes", "big", "big.f64", "block.1.w", "block.01.w", "embed.part", "embed.weight",
    "empty.a", "empty.b", "layers.1.w", "layers.2.w", "layers.10.w", "lm_head.weight", "scalar",
    "t.T", "t.T2", "t.view", "z.f4",
};

Test(synth_st, sample)
{
    ck_index *ix = sample_index();
    ck_synth *sy = st_ok(ix);
    size_t size;
    unsigned char *f = synth_all(sy, &size);
    uint64_t hlen;
    cJSON *root = st_header_of(f, size, &hlen);
    check_st_tensors(f, size, root, st_order, sizeof st_order / sizeof *st_order);
    /* values are not tensors of a safetensors file, and are not listed as left out */
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    cr_assert(cJSON_IsObject(meta), "no __metadata__");
    cr_assert_eq(cJSON_GetArraySize(meta), 3);
    for (size_t m = 0; m < 2; m++) {
        cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, sample_meta[m][0]);
        cr_assert(cJSON_IsString(v), "metadata '%s' is missing", sample_meta[m][0]);
        cr_assert_str_eq(v->valuestring, sample_meta[m][1]);
    }
    cJSON *om = cJSON_GetObjectItemCaseSensitive(meta, "ckptfs.omitted");
    cr_assert(cJSON_IsString(om), "ckptfs.omitted is not a string");
    cJSON *list = cJSON_Parse(om->valuestring);
    cr_assert(cJSON_IsArray(list), "ckptfs.omitted is not a JSON array: %s", om->valuestring);
    cr_assert_eq(cJSON_GetArraySize(list), 2);
    cr_assert_str_eq(cJSON_GetArrayItem(list, 0)->valuestring, "z.c128");
    cr_assert_str_eq(cJSON_GetArrayItem(list, 1)->valuestring, "z.fnuz");
    cJSON_Delete(list);
    cJSON_Delete(root);

    /* ck_synth_write gives the same bytes, and odd reads agree with them */
    size_t wsize;
    unsigned char *w = synth_written(sy, &wsize);
    cr_assert_eq(wsize, size);
    cr_assert_arr_eq(w, f, size);
    check_reads(sy, w, wsize);
    free(w);

    /* the product's own safetensors reader takes it */
    ck_index *back = open_ok(tmp_file(f, size));
    cr_assert_str_eq(back->format, "safetensors");
    cr_assert_eq(back->nentries, sizeof st_order / sizeof *st_order);
    for (size_t k = 0; k < back->nentries; k++) {
        size_t len;
        unsigned char *want = spec_bytes(find_spec(st_order[k]), &len);
        const ck_entry *e = ck_index_find(back, st_order[k]);
        cr_assert_not_null(e, "'%s' is missing", st_order[k]);
        unsigned char *got = malloc(len + 1);
        cr_assert_eq(ck_entry_read(back, e, got, len + 1, 0), (ssize_t)len);
        cr_assert_arr_eq(got, want, len);
        free(got);
        free(want);
    }
    ck_index_free(back);
    free(f);
    ck_synth_free(sy);
    ck_index_free(ix);
}

/* transformers loads a safetensors file only with a "format" it knows in __metadata__: a source
 * that has none gets the Hub converter's "pt". */
Test(synth_st, metadata_says_format_pt_when_the_source_has_no_format)
{
    fill_bytes(src, SRC_LEN, 7);
    ck_index *ix = index_over(src, SRC_LEN);
    add_spec(ix, find_spec("layers.10.w"));
    add_spec(ix, find_spec("step"));
    add_spec(ix, find_spec("layers.2.w"));
    ck_synth *sy = st_ok(ix);
    size_t size;
    unsigned char *f = synth_all(sy, &size);
    uint64_t hlen;
    cJSON *root = st_header_of(f, size, &hlen);
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    cr_assert_eq(cJSON_GetArraySize(meta), 1);
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(meta, "format")->valuestring, "pt");
    static const char *const names[] = {"layers.2.w", "layers.10.w"};
    check_st_tensors(f, size, root, names, 2);
    cJSON_Delete(root);
    free(f);
    ck_synth_free(sy);
    ck_index_free(ix);
}

Test(synth_st, only_omitted_metadata)
{
    fill_bytes(src, SRC_LEN, 7);
    ck_index *ix = index_over(src, SRC_LEN);
    add_spec(ix, find_spec("z.c128"));
    ck_synth *sy = st_ok(ix);
    size_t size;
    unsigned char *f = synth_all(sy, &size);
    uint64_t hlen;
    cJSON *root = st_header_of(f, size, &hlen);
    check_st_tensors(f, size, root, NULL, 0);
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    cr_assert_eq(cJSON_GetArraySize(meta), 2); /* format, ckptfs.omitted */
    cJSON *om = cJSON_GetObjectItemCaseSensitive(meta, "ckptfs.omitted");
    cr_assert(cJSON_IsString(om));
    cr_assert_str_eq(om->valuestring, "[\"z.c128\"]");
    cJSON_Delete(root);
    free(f);
    ck_synth_free(sy);
    ck_index_free(ix);
}

/* ck_synth_safetensors_of (a conversion's file or shard): the given entries in the given order,
 * and the extra metadata after the source's, a key the source has keeping the source's value. */
Test(synth_st, of_chosen_entries_with_extra_metadata)
{
    ck_index *ix = sample_index();
    static const char *const names[] = {"layers.10.w", "layers.2.w"}; /* not natural order */
    uint32_t ents[2];
    for (size_t k = 0; k < 2; k++)
        for (uint32_t i = 0; i < ix->nentries; i++)
            if (strcmp(ix->entries[i].name, names[k]) == 0)
                ents[k] = i;
    const ck_meta extra[] = {{.key = "format", .value = "tf"}, {.key = "b", .value = "layers.2.w"}};
    ck_synth *sy;
    ck_error err;
    cr_assert_eq(ck_synth_safetensors_of(ix, ents, 2, extra, 2, &sy, &err), 0, "%s", err.msg);
    size_t size;
    unsigned char *f = synth_all(sy, &size);
    uint64_t hlen;
    cJSON *root = st_header_of(f, size, &hlen);
    check_st_tensors(f, size, root, names, 2);
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    cr_assert_eq(cJSON_GetArraySize(meta), 3);
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(meta, "format")->valuestring, "pt");
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(meta, "note")->valuestring,
                     sample_meta[1][1]);
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(meta, "b")->valuestring, "layers.2.w");
    cJSON_Delete(root);
    free(f);
    ck_synth_free(sy);
    ck_index_free(ix);
}

Test(synth_st, an_empty_index)
{
    ck_index *ix = ck_index_new("nothing");
    ck_synth *sy = st_ok(ix);
    size_t size;
    unsigned char *f = synth_all(sy, &size);
    uint64_t hlen;
    cJSON *root = st_header_of(f, size, &hlen);
    cr_assert_eq(size, 8 + hlen);
    cr_assert_eq(cJSON_GetArraySize(root), 1); /* __metadata__ alone: {"format": "pt"} */
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(meta, "format")->valuestring, "pt");
    cJSON_Delete(root);
    free(f);
    ck_synth_free(sy);
    ck_index_free(ix);
}

/* --- a source that is shorter than its index says ----------------------------------------- */

Test(synth_short, reads_fail_whole_and_writes_fail)
{
    fill_bytes(src, SRC_LEN, 7);
    ck_index *ix = index_over(src, 8192);
    add_contig(ix, "a", CK_U8, 1, (int64_t[]){4096}, 0, 4096);
    add_contig(ix, "b", CK_U8, 1, (int64_t[]){4096}, 4096, 4096);
    add_contig(ix, "c", CK_U8, 1, (int64_t[]){100}, 8000, 100);
    ck_synth *sy = pack_ok(ix, NULL), *st = st_ok(ix);
    uint64_t size = ck_synth_size(sy);
    cr_assert_eq(truncate(ix->files[0].path, 6000), 0);

    unsigned char *buf = malloc(1 << 16);
    cr_assert_eq(ck_synth_read(sy, buf, 64, 0), 64); /* the header and index need no source */
    uint64_t data = get_le64(buf + 32);
    cr_assert_eq(ck_synth_read(sy, buf, 4096, data), 4096); /* "a" is all there */
    cr_assert_arr_eq(buf, src, 4096);
    cr_assert_eq(ck_synth_read(sy, buf, 1904, data + 4096), 1904); /* "b" up to the cut */
    cr_assert_eq(ck_synth_read(sy, buf, 1905, data + 4096), -EIO);
    cr_assert_eq(ck_synth_read(sy, buf, 1, data + 4096 + 1904), -EIO);
    cr_assert_eq(ck_synth_read(sy, buf, 8192, data + 100), -EIO, "a short count, not -EIO");
    cr_assert_eq(ck_synth_read(sy, buf, 100, data + 8192), -EIO); /* "c" */
    cr_assert_eq(ck_synth_read(sy, buf, (size_t)size, 0), -EIO);
    for (int i = 0; i < 2; i++) /* the trailer needs every blob; a failure is not cached */
        cr_assert_eq(ck_synth_read(sy, buf, 8, size - 8), -EIO);

    const char *path = tmp_file("", 0);
    int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
    cr_assert_eq(ck_synth_write(sy, fd, NULL, NULL), -EIO);
    close(fd);
    fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
    cr_assert_eq(ck_synth_write(st, fd, NULL, NULL), -EIO);
    close(fd);
    cr_assert_eq(ck_synth_read(st, buf, (size_t)ck_synth_size(st), 0), -EIO);

    /* the source back whole, its mtime too (else a write fails: it changed since opened):
     * everything reads again */
    tmp_rewrite(ix->files[0].path, src, 8192);
    const struct timespec was[2] = {{.tv_nsec = UTIME_OMIT}, ix->files[0].mtime};
    cr_assert_eq(utimensat(AT_FDCWD, ix->files[0].path, was, 0), 0);
    size_t len;
    unsigned char *w = synth_written(sy, &len);
    cr_assert_eq(len, size);
    decoded d;
    decode(w, len, &d);
    decoded_free(&d);
    free(w);
    free(buf);
    ck_synth_free(st);
    ck_synth_free(sy);
    ck_index_free(ix);
}
