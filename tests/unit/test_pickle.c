/* The safe pickle VM: real pickles from Python and torch.save (protocols 0-5, zip and legacy)
 * decoded to exactly what Python says they hold, and hand-built hostile pickles refused with a
 * message that names the opcode or global and the byte, never crashing, hanging or running
 * anything. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../index/pickle.h"
#include "../../index/pickle_policy.h"
#include "helpers.h"

TestSuite(pickle_python, .fini = tmp_cleanup, .timeout = 120);
TestSuite(pickle_ops, .fini = tmp_cleanup);
TestSuite(pickle_torch, .fini = tmp_cleanup);
TestSuite(pickle_hostile, .fini = tmp_cleanup, .timeout = 60);
TestSuite(pickle_limits, .fini = tmp_cleanup, .timeout = 60);

#define PATH "t.pkl"

/* --- pickles built byte by byte ---------------------------------------------------------- */

typedef struct pb {
    unsigned char *b;
    size_t n, cap;
} pb;

static void put(pb *p, const void *d, size_t n)
{
    if (n == 0)
        return;
    if (p->n + n > p->cap) {
        p->cap = 2 * (p->n + n) + 64;
        p->b = realloc(p->b, p->cap);
        cr_assert_not_null(p->b, "out of memory");
    }
    memcpy(p->b + p->n, d, n);
    p->n += n;
}

/* Opcodes and their raw arguments, given as the bytes of a string literal (NULs included). */
#define ops(p, lit) put((p), "" lit, sizeof(lit) - 1)
/* A literal and its length, NULs included, for tables of raw pickle text. */
#define RAW(lit) "" lit, sizeof(lit) - 1

/* The opcodes of lit, given as for ops(), times over. */
static void repeat(pb *p, const char *lit, size_t len, int times)
{
    for (int i = 0; i < times; i++)
        put(p, lit, len);
}
#define ops_times(p, lit, times) repeat((p), "" lit, sizeof(lit) - 1, (times))

/* A name or text without NUL. */
static void text(pb *p, const char *s)
{
    put(p, s, strlen(s));
}

static void op(pb *p, unsigned char c)
{
    put(p, &c, 1);
}

static void le(pb *p, uint64_t v, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        op(p, (unsigned char)(v >> 8 * i));
}

/* BINUNICODE. */
static void str_(pb *p, const char *s)
{
    op(p, 'X');
    le(p, strlen(s), 4);
    text(p, s);
}

static void int_(pb *p, int64_t v)
{
    if (v >= 0 && v < 256) {
        op(p, 'K');
        le(p, (uint64_t)v, 1);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        op(p, 'J');
        le(p, (uint64_t)v, 4);
    } else {
        op(p, 0x8a);
        op(p, 8);
        le(p, (uint64_t)v, 8);
    }
}

static void global(pb *p, const char *module, const char *name)
{
    op(p, 'c');
    text(p, module);
    op(p, '\n');
    text(p, name);
    op(p, '\n');
}

static void stack_global(pb *p, const char *module, const char *name)
{
    str_(p, module);
    str_(p, name);
    op(p, 0x93);
}

/* BINPERSID of ('storage', torch.<cls>, key, 'cpu', numel). */
/* A storage's persistent id, up to its closing TUPLE: what torch passes to BINPERSID. */
static void persid_items(pb *p, const char *cls, const char *key, int64_t numel)
{
    op(p, '(');
    str_(p, "storage");
    global(p, "torch", cls);
    str_(p, key);
    str_(p, "cpu");
    int_(p, numel);
}

static void storage(pb *p, const char *cls, const char *key, int64_t numel)
{
    persid_items(p, cls, key, numel);
    ops(p, "tQ");
}

static void int_tuple(pb *p, unsigned n, const int64_t *v)
{
    op(p, '(');
    for (unsigned i = 0; i < n; i++)
        int_(p, v[i]);
    op(p, 't');
}

/* collections.OrderedDict() */
static void empty_odict(pb *p)
{
    global(p, "collections", "OrderedDict");
    ops(p, ")R");
}

/* _rebuild_tensor_v2(<storage cls key numel>, offset, size, stride, False, OrderedDict()) */
/* _rebuild_tensor_v2's arguments after the storage: offset, size, stride, requires_grad False,
 * empty backward hooks. */
static void view_args(pb *p, int64_t offset, unsigned rank, const int64_t *size,
                      const int64_t *stride)
{
    int_(p, offset);
    int_tuple(p, rank, size);
    int_tuple(p, rank, stride);
    op(p, 0x89);
    empty_odict(p);
}

static void tensor_v2(pb *p, const char *cls, const char *key, int64_t numel, int64_t offset,
                      unsigned rank, const int64_t *size, const int64_t *stride)
{
    global(p, "torch._utils", "_rebuild_tensor_v2");
    op(p, '(');
    storage(p, cls, key, numel);
    view_args(p, offset, rank, size, stride);
    ops(p, "tR");
}

/* --- loading ------------------------------------------------------------------------------ */

static int load_with(const pb *p, const pk_limits *lim, uint64_t base, pk_result *r,
                     ck_error *err)
{
    /* An exact-size copy, so that the sanitizers catch any read past the end. */
    unsigned char *copy = malloc(p->n ? p->n : 1);
    cr_assert_not_null(copy);
    if (p->n)
        memcpy(copy, p->b, p->n);
    int rc = pk_load(copy, p->n, lim, PATH, base, r, err);
    free(copy);
    return rc;
}

/* Loads p (then freed) under lim (NULL: the defaults), which must succeed and end at its
 * STOP. */
static pk_result load_ok_with(pb *p, const pk_limits *lim)
{
    pk_result r;
    ck_error err = {""};
    int rc = load_with(p, lim, 0, &r, &err);
    cr_assert_eq(rc, 0, "pk_load failed: %s", err.msg);
    cr_assert_eq(r.consumed, p->n);
    cr_assert_not_null(r.root);
    free(p->b);
    return r;
}

static pk_result load_ok(pb *p)
{
    return load_ok_with(p, NULL);
}

/* Loads p (then freed) under lim (NULL: the defaults), which must fail with rc, saying what. */
static void fails_with(pb *p, const pk_limits *lim, int rc, const char *what)
{
    pk_result r = {(pk_obj *)1, 1, (ck_arena *)1, (pk_obj **)1, 1};
    ck_error err = {""};
    int got = load_with(p, lim, 0, &r, &err);
    free(p->b);
    cr_assert_eq(got, rc, "pk_load gave %d (%s), expected %d saying '%s'", got, err.msg, rc,
                 what);
    cr_assert(r.root == NULL && r.arena == NULL && r.consumed == 0 && r.storages == NULL &&
              r.nstorages == 0, "failure left a result");
    assert_error(&err, PATH, what);
}

static void fails(pb *p, const char *what)
{
    fails_with(p, NULL, PK_ERROR, what);
}

/* --- the canonical form (as pickle_cases.py prints it) ----------------------------------- */

typedef struct dumper {
    FILE *f;
    const pk_obj *storages[256];
    size_t n;
} dumper;

static void esc(dumper *d, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\')
            fputc(c, d->f);
        else
            fprintf(d->f, "\\x%02x", c);
    }
}

static void dump_storage(dumper *d, const pk_obj *s)
{
    size_t i = 0;
    while (i < d->n && d->storages[i] != s)
        i++;
    if (i == d->n) {
        cr_assert_lt(d->n, 256, "too many storages");
        d->storages[d->n++] = s;
    }
    fprintf(d->f, "S%zu:%s:%llu", i,
            s->u.storage.dtype == PK_DTYPE_BYTES ? "bytes"
                                                 : ck_dtype_name(s->u.storage.dtype),
            (unsigned long long)s->u.storage.numel);
}

static void dump_dims(dumper *d, unsigned rank, const int64_t *v)
{
    fputc('(', d->f);
    for (unsigned i = 0; i < rank; i++)
        fprintf(d->f, "%s%lld", i ? "," : "", (long long)v[i]);
    fputc(')', d->f);
}

/* Recursive: test inputs are shallow (the VM bounds depth anyway). */
static void dump(dumper *d, const pk_obj *o)
{
    switch (o->type) {
    case PK_NONE: fputs("None", d->f); break;
    case PK_BOOL: fputs(o->u.i ? "True" : "False", d->f); break;
    case PK_INT: fprintf(d->f, "%lld", (long long)o->u.i); break;
    case PK_FLOAT: {
        uint64_t bits;
        memcpy(&bits, &o->u.f, sizeof bits);
        fprintf(d->f, "f:%016llx", (unsigned long long)bits);
        break;
    }
    case PK_STR:
    case PK_BYTES:
        cr_assert_eq(o->u.str.s[o->u.str.len], 0, "string not NUL-terminated");
        fputs(o->type == PK_BYTES ? "b\"" : "\"", d->f);
        esc(d, o->u.str.s, o->u.str.len);
        fputc('"', d->f);
        break;
    case PK_TUPLE:
    case PK_LIST:
    case PK_DICT:
        fputc(o->type == PK_TUPLE ? '(' : o->type == PK_LIST ? '[' : '{', d->f);
        for (size_t i = 0; i < o->u.seq.n; i++) {
            if (i)
                fputc(o->type == PK_DICT && i % 2 ? ':' : ',', d->f);
            dump(d, o->u.seq.items[i]);
        }
        fputc(o->type == PK_TUPLE ? ')' : o->type == PK_LIST ? ']' : '}', d->f);
        break;
    case PK_GLOBAL: fprintf(d->f, "G:%s", o->u.global.name); break;
    case PK_STORAGE: dump_storage(d, o); break;
    case PK_TENSOR:
        fprintf(d->f, "T(%s,", ck_dtype_name(o->u.tensor.dtype));
        dump_storage(d, o->u.tensor.storage);
        fprintf(d->f, ",%lld,", (long long)o->u.tensor.offset);
        dump_dims(d, o->u.tensor.rank, o->u.tensor.size);
        fputc(',', d->f);
        dump_dims(d, o->u.tensor.rank, o->u.tensor.stride);
        fprintf(d->f, ",%s)", o->u.tensor.parameter ? "P" : "-");
        break;
    default: cr_assert_fail("unknown pk_obj type %d", o->type);
    }
}

/* The canonical text of o; the storages seen, in order, go to d. */
static const char *dump_with(dumper *d, const pk_obj *o)
{
    char *buf = NULL;
    size_t len = 0;
    d->f = open_memstream(&buf, &len);
    cr_assert_not_null(d->f);
    dump(d, o);
    fclose(d->f);
    const char *s = strf("%s", buf);
    free(buf);
    return s;
}

static const char *dump_str(const pk_obj *o)
{
    dumper d = {0};
    return dump_with(&d, o);
}

/* Asserts that p (freed) loads to the value whose canonical text is want. */
static void loads_to(pb *p, const char *want)
{
    pk_result r = load_ok(p);
    const char *got = dump_str(r.root);
    cr_assert_str_eq(got, want);
    pk_free(&r);
}

/* --- real pickles from Python -------------------------------------------------------------- */

typedef struct pycase {
    unsigned char *data;
    size_t len;
    pk_result r[8];    /* each pickle's value (zeros for one that must fail) */
    size_t begin[8];   /* where each pickle starts */
    size_t n;
} pycase;

/* Makes the case with pickle_cases.py, then loads every pickle in it in turn, each from where
 * the last one ended, and compares each with what Python says it holds. */
static void check_case(const char *name, int proto, pycase *c, dumper *d)
{
    const char *here = __FILE__, *slash = strrchr(here, '/');
    const char *script = strf("%.*s/pickle_cases.py", slash ? (int)(slash - here) : 1,
                              slash ? here : ".");
    const char *dir = tmp_dir();
    const char *data = tmp_path_in(dir, "data.pkl");
    tmp_path_in(dir, "ckpt.pt");
    const char *out = run_python("import runpy, sys\n"
                                 "sys.argv = sys.argv[1:]\n"
                                 "runpy.run_path(sys.argv[0], run_name='__main__')\n",
                                 script, dir, name, strf("%d", proto), NULL);
    char *lines = (char *)strf("%s", out); /* strtok_r cuts it */
    c->data = read_whole(data, &c->len);
    c->n = 0;
    size_t at = 0;
    char *save = NULL;
    for (char *line = strtok_r(lines, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *sp = strchr(line, ' ');
        cr_assert(sp && c->n < 8, "bad line '%s'", line);
        size_t end = strtoull(line, NULL, 10);
        pk_result *r = &c->r[c->n];
        ck_error err = {""};
        c->begin[c->n] = at;
        int rc = pk_load(c->data + at, c->len - at, NULL, PATH, at, r, &err);
        if (sp[1] == '!') { /* Python holds an int the VM refuses */
            cr_assert_eq(rc, PK_ERROR, "%s protocol %d pickle %zu loads", name, proto, c->n);
            assert_error(&err, PATH, "does not fit in 64 bits");
            at = end;
            c->n++;
            continue;
        }
        cr_assert_eq(rc, 0, "%s protocol %d pickle %zu: %s", name, proto, c->n, err.msg);
        cr_assert_eq(at + r->consumed, end, "%s protocol %d pickle %zu ends at %zu, Python "
                     "says %zu", name, proto, c->n, at + r->consumed, end);
        cr_assert_str_eq(dump_with(d, r->root), sp + 1, "%s protocol %d pickle %zu", name, proto,
                         c->n);
        at = end;
        c->n++;
    }
    cr_assert_gt(c->n, 0);
}

static void free_case(pycase *c)
{
    for (size_t i = 0; i < c->n; i++) {
        pk_free(&c->r[i]);
        cr_assert_null(c->r[i].arena);
    }
    free(c->data);
}

static void check_python(const char *name, int proto)
{
    dumper d = {0};
    pycase c;
    check_case(name, proto, &c, &d);
    free_case(&c);
}

Test(pickle_python, plain_protocol_0) { check_python("plain", 0); }
Test(pickle_python, plain_protocol_1) { check_python("plain", 1); }
Test(pickle_python, plain_protocol_2) { check_python("plain", 2); }
Test(pickle_python, plain_protocol_3) { check_python("plain", 3); }
Test(pickle_python, plain_protocol_4) { check_python("plain", 4); }
Test(pickle_python, plain_protocol_5) { check_python("plain", 5); }
/* Equal keys set twice collapse as Python collapses them (pickle_cases.py: dupkeys). */
Test(pickle_python, dupkeys_protocol_0) { check_python("dupkeys", 0); }
Test(pickle_python, dupkeys_protocol_1) { check_python("dupkeys", 1); }
Test(pickle_python, dupkeys_protocol_2) { check_python("dupkeys", 2); }
Test(pickle_python, dupkeys_protocol_4) { check_python("dupkeys", 4); }
Test(pickle_python, dupkeys_protocol_5) { check_python("dupkeys", 5); }
Test(pickle_python, torch_zip_protocol_2) { check_python("torch", 2); }
Test(pickle_python, torch_zip_protocol_3) { check_python("torch", 3); }
Test(pickle_python, torch_zip_protocol_4) { check_python("torch", 4); }
Test(pickle_python, torch_zip_protocol_5) { check_python("torch", 5); }

/* The legacy format: five pickles back to back, the fourth with 6-item persistent ids, the fifth
 * listing the storage keys, which must be exactly the keys of the storages the fourth made. */
static void check_legacy(int proto)
{
    dumper d = {0};
    pycase c;
    check_case("legacy", proto, &c, &d);
    cr_assert_eq(c.n, 5);
    const pk_obj *keys = c.r[4].root;
    cr_assert_eq(keys->type, PK_LIST);
    cr_assert_gt(d.n, 10);
    cr_assert_eq(keys->u.seq.n, d.n, "%zu keys listed, %zu storages", keys->u.seq.n, d.n);
    for (size_t i = 0; i < d.n; i++) {
        const char *key = d.storages[i]->u.storage.key;
        size_t j = 0;
        while (j < keys->u.seq.n && strcmp(keys->u.seq.items[j]->u.str.s, key) != 0)
            j++;
        cr_assert_lt(j, keys->u.seq.n, "storage '%s' is not in the key list", key);
    }
    free_case(&c);
}

Test(pickle_python, torch_legacy_protocol_2) { check_legacy(2); }
Test(pickle_python, torch_legacy_protocol_5) { check_legacy(5); }

/* Every prefix of a valid pickle (the case's biggest) is a truncated pickle: never an error,
 * never a crash. */
static void every_prefix_truncated(const char *name, int proto)
{
    dumper d = {0};
    pycase c;
    check_case(name, proto, &c, &d);
    size_t k = 0;
    for (size_t i = 1; i < c.n; i++)
        if (c.r[i].consumed > c.r[k].consumed)
            k = i;
    size_t len = c.r[k].consumed;
    cr_assert_gt(len, 500);
    for (size_t n = 0; n < len; n++) {
        pb p = {0};
        put(&p, c.data + c.begin[k], n);
        pk_result r;
        ck_error err = {""};
        int rc = load_with(&p, NULL, 0, &r, &err);
        free(p.b);
        cr_assert_eq(rc, PK_TRUNCATED, "%s protocol %d cut to %zu bytes: rc %d: %s", name, proto,
                     n, rc, err.msg);
        cr_assert_null(r.arena);
        assert_error(&err, PATH, "truncated pickle");
    }
    free_case(&c);
}

Test(pickle_python, every_prefix_torch_protocol_2) { every_prefix_truncated("torch", 2); }
Test(pickle_python, every_prefix_torch_protocol_4) { every_prefix_truncated("torch", 4); }
Test(pickle_python, every_prefix_scalars_protocol_0) { every_prefix_truncated("scalars", 0); }
Test(pickle_python, every_prefix_scalars_protocol_1) { every_prefix_truncated("scalars", 1); }
Test(pickle_python, every_prefix_legacy_protocol_2) { every_prefix_truncated("legacy", 2); }

/* Corrupted real pickles (1 to 4 bytes overwritten, 4000 times) load or fail cleanly; whatever
 * loads can be walked. The sanitizer build catches what a plain run would not. */
static void random_corruption(const char *name, int proto)
{
    dumper d = {0};
    pycase c;
    check_case(name, proto, &c, &d);
    size_t len = c.r[0].consumed;
    for (uint32_t seed = 0; seed < 4000; seed++) {
        unsigned char rnd[16];
        fill_bytes(rnd, sizeof rnd, seed);
        pb p = {0};
        put(&p, c.data, len);
        for (unsigned k = 0; k <= rnd[0] % 4u; k++)
            p.b[(rnd[1 + 3 * k] | (size_t)rnd[2 + 3 * k] << 8) % len] = rnd[3 + 3 * k];
        pk_result r;
        ck_error err = {""};
        int rc = load_with(&p, NULL, 0, &r, &err);
        free(p.b);
        cr_assert(rc == 0 || rc == PK_ERROR || rc == PK_TRUNCATED, "seed %u: rc %d", seed, rc);
        if (rc == 0) {
            dumper e = {0};
            dump_with(&e, r.root);
            pk_free(&r);
        } else {
            assert_error(&err, PATH, "byte ");
        }
    }
    free_case(&c);
}

Test(pickle_python, random_corruption_torch_protocol_2) { random_corruption("torch", 2); }
Test(pickle_python, random_corruption_torch_protocol_4) { random_corruption("torch", 4); }
Test(pickle_python, random_corruption_scalars_protocol_0) { random_corruption("scalars", 0); }

/* A set in protocol 2 is a call of builtins.set, which is not on the allowlist. */
Test(pickle_python, set_before_protocol_4_is_refused)
{
    size_t len;
    const char *dir = tmp_dir(), *path = tmp_path_in(dir, "set.pkl");
    run_python("import pickle, sys\n"
               "open(sys.argv[1], 'wb').write(pickle.dumps({1, 2}, protocol=2))\n", path, NULL);
    pb p = {0};
    unsigned char *data = read_whole(path, &len);
    put(&p, data, len);
    free(data);
    fails(&p, "refused global '__builtin__ set' (byte 2)");
}

/* --- opcodes, one by one ------------------------------------------------------------------- */

Test(pickle_ops, constants_and_small_tuples)
{
    pb p = {0};
    ops(&p, "\x80\x02(" "N\x88\x89" ")" "N\x85" "NN\x86" "NNN\x87" "(NNNNt" "(t" "t.");
    loads_to(&p, "(None,True,False,(),(None),(None,None),(None,None,None),"
                 "(None,None,None,None),())");
}

Test(pickle_ops, binary_ints)
{
    pb p = {0};
    ops(&p, "(K\xff" "M\xff\xff" "J\xfb\xff\xff\xff" "J\x00\x00\x00\x80");
    ops(&p, "\x8a\x00");                                          /* LONG1 of no bytes: 0 */
    ops(&p, "\x8a\x09\xff\xff\xff\xff\xff\xff\xff\x7f\x00");      /* a redundant sign byte */
    ops(&p, "\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80");          /* -2^63 */
    op(&p, 0x8b);
    le(&p, 2, 4);
    ops(&p, "\xfe\xff");                                          /* LONG4: -2 */
    ops(&p, "t.");
    loads_to(&p, "(255,65535,-5,-2147483648,0,9223372036854775807,-9223372036854775808,-2)");
}

Test(pickle_ops, text_ints_and_floats)
{
    pb p = {0};
    ops(&p, "(I01\nI00\nI-42\nI+7\nL123L\nL-9223372036854775808\nL5\nF1.5\nF-0.0\nFinf\nt.");
    loads_to(&p, "(True,False,-42,7,123,-9223372036854775808,5,f:3ff8000000000000,"
                 "f:8000000000000000,f:7ff0000000000000)");
}

Test(pickle_ops, binfloat_is_big_endian)
{
    pb p = {0};
    ops(&p, "G\x3f\xf8");
    put(&p, "\0\0\0\0\0\0", 6);
    op(&p, '.');
    loads_to(&p, "f:3ff8000000000000");
}

Test(pickle_ops, counted_strings_and_bytes)
{
    pb p = {0};
    ops(&p, "(");
    ops(&p, "\x8c\x02\xc3\xa9");                  /* SHORT_BINUNICODE é */
    op(&p, 0x8d);
    le(&p, 1, 8);
    ops(&p, "z");                                 /* BINUNICODE8 */
    ops(&p, "U\x02hi");                           /* SHORT_BINSTRING: a Python 2 str */
    ops(&p, "T");
    le(&p, 1, 4);
    ops(&p, "y");                                 /* BINSTRING */
    ops(&p, "C\x03\x00\xff\x80");                 /* SHORT_BINBYTES */
    ops(&p, "B");
    le(&p, 1, 4);
    ops(&p, "b");                                 /* BINBYTES */
    op(&p, 0x8e);
    le(&p, 0, 8);                                 /* BINBYTES8, empty */
    op(&p, 0x96);
    le(&p, 2, 8);
    ops(&p, "ab");                                /* BYTEARRAY8 */
    str_(&p, "");
    ops(&p, "t.");
    loads_to(&p, "(\"\\xc3\\xa9\",\"z\",\"hi\",\"y\",b\"\\x00\\xff\\x80\",b\"b\",b\"\","
                 "b\"ab\",\"\")");
}

Test(pickle_ops, string_with_nul_keeps_its_length)
{
    pb p = {0};
    ops(&p, "C\x03" "a\0b" ".");
    pk_result r = load_ok(&p);
    cr_assert_eq(r.root->u.str.len, 3);
    cr_assert_eq(memcmp(r.root->u.str.s, "a\0b", 4), 0);
    pk_free(&r);
}

Test(pickle_ops, unicode_raw_escape)
{
    pb p = {0};
    ops(&p, "Vcaf\xe9 \\u00e9\\U0001F600\\\\u0041\n.");
    /* What Python's pickle.loads makes of these bytes. */
    loads_to(&p, "\"caf\\xc3\\xa9 \\xc3\\xa9\\xf0\\x9f\\x98\\x80\\x5c\\x5cu0041\"");
}

Test(pickle_ops, unicode_bad_escape)
{
    pb p = {0};
    ops(&p, "V\\u00\n.");
    fails(&p, "UNICODE: string holds a truncated \\u or \\U escape (byte 0)");
    p = (pb){0};
    ops(&p, "V\\U00110000\n.");
    fails(&p, "beyond U+10FFFF");
}

Test(pickle_ops, quoted_string)
{
    pb p = {0};
    ops(&p, "S'a\\n\\x41\\101\\'q\\z'\n.");
    loads_to(&p, "\"a\\x0aAA'q\\x5cz\"");
    p = (pb){0};
    ops(&p, "S\"x\"\n.");
    loads_to(&p, "\"x\"");
    p = (pb){0};
    ops(&p, "Sabc\n.");
    fails(&p, "STRING argument is not quoted (byte 0)");
    p = (pb){0};
    ops(&p, "S'\\x4'\n.");
    fails(&p, "invalid \\x escape");
}

Test(pickle_ops, python2_strings_must_be_utf8)
{
    pb p = {0};
    ops(&p, "K\x01U\x02\xc3(.");
    fails(&p, "SHORT_BINSTRING: string is not valid UTF-8 (its byte 0) (byte 2)");
    p = (pb){0};
    ops(&p, "X\x03\x00\x00\x00\xed\xa0\x80.");  /* an encoded surrogate: Python passes it */
    loads_to(&p, "\"\\xed\\xa0\\x80\"");
    p = (pb){0};
    ops(&p, "X\x02\x00\x00\x00\xc0\x80.");      /* overlong */
    fails(&p, "BINUNICODE: string is not valid UTF-8");
}

Test(pickle_ops, memo_put_get_memoize)
{
    pb p = {0};
    ops(&p, "\x80\x04(K\x07p5\nK\x08q\x09K\x09r\x00\x00\x01\x00" "K\x0a\x94" "0");
    ops(&p, "g5\nh\x09j\x00\x00\x01\x00h\x03t.");
    /* MEMOIZE stored at index 3: three distinct indices were set before it. */
    loads_to(&p, "(7,8,9,7,8,9,10)");
}

Test(pickle_ops, put_overwrites_and_memoize_counts_distinct)
{
    pb p = {0};
    ops(&p, "(K\x01q\x00K\x02q\x00K\x03\x94h\x00h\x01t.");
    loads_to(&p, "(1,2,3,2,3)");
}

Test(pickle_ops, pop_pop_mark_dup)
{
    pb p = {0};
    ops(&p, "(K\x01K\x02" "0" "2" "(K\x05K\x06" "1" "t.");
    loads_to(&p, "(1,1)");
    p = (pb){0};
    ops(&p, "K\x01(0.");     /* POP on an empty mark pops the mark, as Python does */
    loads_to(&p, "1");
}

Test(pickle_ops, list_dict_tuple_from_marks)
{
    pb p = {0};
    ops(&p, "(K\x01(K\x02K\x03l(");
    str_(&p, "k");
    ops(&p, "K\x04" "d(t]K\x05" "a]" "(K\x06K\x07" "e}");
    str_(&p, "a");
    ops(&p, "Ns}(K\x01K\x02K\x03K\x04u" "t.");
    loads_to(&p, "(1,[2,3],{\"k\":4},(),[5],[6,7],{\"a\":None},{1:2,3:4})");
}

Test(pickle_ops, sets_are_lists)
{
    pb p = {0};
    ops(&p, "(\x8f(K\x01K\x02\x90\x8f(K\x03\x91t.");
    loads_to(&p, "([1,2],[],[3])");
    p = (pb){0};
    ops(&p, "(K\x01\x91(K\x02\x90.");
    fails(&p, "ADDITEMS needs a set, got a frozenset (byte 7)");
    p = (pb){0};
    ops(&p, "\x8fK\x01" "a.");
    fails(&p, "APPEND needs a list, got a set (byte 3)");
    p = (pb){0};
    ops(&p, "](K\x01\x90.");
    fails(&p, "ADDITEMS needs a set, got a list");
}

Test(pickle_ops, frame_is_skipped)
{
    pb p = {0};
    ops(&p, "\x80\x04\x95");
    le(&p, 3, 8);
    ops(&p, "K\x2a.");
    loads_to(&p, "42");
}

Test(pickle_ops, consumed_stops_at_stop)
{
    pb p = {0};
    ops(&p, "K\x01.K\x02.garbage");
    pk_result r;
    ck_error err = {""};
    cr_assert_eq(load_with(&p, NULL, 0, &r, &err), 0, "%s", err.msg);
    cr_assert_eq(r.consumed, 3);
    cr_assert_eq(r.root->u.i, 1);
    pk_free(&r);
    free(p.b);
}

Test(pickle_ops, messages_give_file_offsets)
{
    pb p = {0};
    ops(&p, "\x80\x02");
    global(&p, "os", "system");
    pk_result r;
    ck_error err = {""};
    cr_assert_eq(load_with(&p, NULL, 1000, &r, &err), PK_ERROR);
    free(p.b);
    assert_error(&err, PATH, "refused global 'os system' (byte 1002)");
}

/* The opcode list names every opcode with the byte and name Python's pickletools gives it, and
 * no other byte. */
Test(pickle_ops, opcode_names_are_pythons)
{
    char *out = (char *)strf("%s", run_python("import pickletools\n"
                                              "for op in pickletools.opcodes:\n"
                                              "    print(ord(op.code), op.name)\n", NULL));
    const char *want[256] = {0};
    size_t n = 0;
    char *save = NULL;
    for (char *line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *name;
        unsigned long byte = strtoul(line, &name, 10);
        cr_assert(byte < 256 && *name == ' ' && !want[byte], "bad line '%s'", line);
        want[byte] = name + 1;
        n++;
    }
    cr_assert_eq(n, 68);
    for (unsigned b = 0; b < 256; b++) {
        const char *got = pk_opcode_name((unsigned char)b);
        if (want[b])
            cr_assert(got && strcmp(got, want[b]) == 0, "0x%02x: %s, Python says %s", b,
                      got ? got : "no opcode", want[b]);
        else
            cr_assert_null(got, "0x%02x is %s, which Python does not know", b, got);
    }
}

Test(pickle_ops, null_limits_are_the_defaults)
{
    cr_assert_eq(pk_default_limits.max_stack, 1000000);
    cr_assert_eq(pk_default_limits.max_marks, 10000);
    cr_assert_eq(pk_default_limits.max_memo, 10000000);
    cr_assert_eq(pk_default_limits.max_objects, 50000000);
    cr_assert_eq(pk_default_limits.max_depth, 1000);
}

Test(pickle_ops, type_names)
{
    const char *want[] = {"None", "bool", "int", "float", "str", "bytes", "tuple", "list",
                          "dict", "object", "global", "storage", "tensor"};
    for (int t = PK_NONE; t <= PK_TENSOR; t++)
        cr_assert_str_eq(pk_type_name((enum pk_type)t), want[t]);
    cr_assert_str_eq(pk_type_name((enum pk_type)99), "?");
}

Test(pickle_ops, none_true_false_are_shared)
{
    pb p = {0};
    ops(&p, "(NN\x88\x88" "I01\nt.");
    pk_result r = load_ok(&p);
    pk_obj **it = r.root->u.seq.items;
    cr_assert(it[0] == it[1] && it[2] == it[3] && it[3] == it[4]);
    pk_free(&r);
}

/* --- allowed globals and calls ------------------------------------------------------------- */

Test(pickle_ops, dtype_globals)
{
    static const struct {
        const char *name;
        int dtype;
    } dt[] = {
        {"float64", CK_F64}, {"double", CK_F64}, {"float32", CK_F32}, {"float", CK_F32},
        {"float16", CK_F16}, {"half", CK_F16}, {"bfloat16", CK_BF16}, {"int64", CK_I64},
        {"long", CK_I64}, {"int32", CK_I32}, {"int", CK_I32}, {"int16", CK_I16},
        {"short", CK_I16}, {"int8", CK_I8}, {"uint8", CK_U8}, {"uint16", CK_U16},
        {"uint32", CK_U32}, {"uint64", CK_U64}, {"bool", CK_BOOL}, {"complex64", CK_C64},
        {"cfloat", CK_C64}, {"complex128", CK_C128}, {"cdouble", CK_C128},
        {"complex32", CK_C32}, {"chalf", CK_C32}, {"float8_e4m3fn", CK_F8_E4M3},
        {"float8_e5m2", CK_F8_E5M2}, {"float8_e4m3fnuz", CK_F8_E4M3FNUZ},
        {"float8_e5m2fnuz", CK_F8_E5M2FNUZ}, {"float8_e8m0fnu", CK_F8_E8M0},
    };
    for (size_t i = 0; i < sizeof dt / sizeof *dt; i++) {
        for (int stacked = 0; stacked < 2; stacked++) {
            pb p = {0};
            ops(&p, "\x80\x04");
            if (stacked)
                stack_global(&p, "torch", dt[i].name);
            else
                global(&p, "torch", dt[i].name);
            op(&p, '.');
            pk_result r = load_ok(&p);
            cr_assert_eq(r.root->type, PK_GLOBAL);
            cr_assert_eq(r.root->u.global.which, PKG_DTYPE, "torch.%s", dt[i].name);
            cr_assert_eq(r.root->u.global.dtype, dt[i].dtype, "torch.%s", dt[i].name);
            cr_assert_str_eq(r.root->u.global.name, strf("torch.%s", dt[i].name));
            pk_free(&r);
        }
    }
}

Test(pickle_ops, storage_classes)
{
    static const struct {
        const char *module, *name;
        int dtype;
    } sc[] = {
        {"torch", "DoubleStorage", CK_F64}, {"torch", "FloatStorage", CK_F32},
        {"torch", "HalfStorage", CK_F16}, {"torch", "BFloat16Storage", CK_BF16},
        {"torch", "LongStorage", CK_I64}, {"torch", "IntStorage", CK_I32},
        {"torch", "ShortStorage", CK_I16}, {"torch", "CharStorage", CK_I8},
        {"torch", "ByteStorage", CK_U8}, {"torch", "BoolStorage", CK_BOOL},
        {"torch", "ComplexFloatStorage", CK_C64}, {"torch", "ComplexDoubleStorage", CK_C128},
        {"torch", "UntypedStorage", PK_DTYPE_BYTES},
        {"torch.storage", "UntypedStorage", PK_DTYPE_BYTES},
    };
    for (size_t i = 0; i < sizeof sc / sizeof *sc; i++) {
        pb p = {0};
        ops(&p, "(X\x07\x00\x00\x00storage");
        global(&p, sc[i].module, sc[i].name);
        str_(&p, "0");
        str_(&p, "cpu");
        int_(&p, 12);
        ops(&p, "tQ.");
        pk_result r = load_ok(&p);
        cr_assert_eq(r.root->type, PK_STORAGE, "%s", sc[i].name);
        cr_assert_eq(r.root->u.storage.dtype, sc[i].dtype, "%s", sc[i].name);
        cr_assert_eq(r.root->u.storage.numel, 12);
        cr_assert_str_eq(r.root->u.storage.key, "0");
        pk_free(&r);
    }
}

Test(pickle_ops, ordered_dict_forms)
{
    pb p = {0};
    op(&p, '(');
    empty_odict(&p);                                              /* OrderedDict() */
    global(&p, "collections", "OrderedDict");                     /* OrderedDict([(k, v)]) */
    ops(&p, "](");
    str_(&p, "a");
    ops(&p, "K\x01\x86");
    str_(&p, "b");
    ops(&p, "K\x02\x86" "e\x85R");
    global(&p, "collections", "OrderedDict");                     /* Python 2: [[k, v]] */
    ops(&p, "((K\x01K\x02l(K\x03K\x04lt\x85R");
    global(&p, "collections", "OrderedDict");                     /* OrderedDict(dict) */
    ops(&p, "}K\x05K\x06s\x85R");
    global(&p, "collections", "OrderedDict");                     /* NEWOBJ */
    ops(&p, ")\x81" "K\x07K\x08s");
    global(&p, "collections", "OrderedDict");                     /* NEWOBJ_EX */
    ops(&p, ")}\x92");
    ops(&p, "t.");
    loads_to(&p, "({},{\"a\":1,\"b\":2},{1:2,3:4},{5:6},{7:8},{})");
}

Test(pickle_ops, ordered_dict_bad_arguments)
{
    pb p = {0};
    global(&p, "collections", "OrderedDict");
    ops(&p, "K\x01K\x02\x86\x85R.");
    fails(&p, "collections.OrderedDict: item 0 is a int, not a (key, value) pair");
    p = (pb){0};
    global(&p, "collections", "OrderedDict");
    ops(&p, "K\x01\x85R.");
    fails(&p, "collections.OrderedDict: takes no argument or one dict or list of pairs");
}

Test(pickle_ops, build_drops_dict_and_tensor_state)
{
    pb p = {0};
    ops(&p, "(}K\x01K\x02s}X\x09\x00\x00\x00_metadata}sb" "}N}\x86" "b" "t.");
    loads_to(&p, "({1:2},{})");
    p = (pb){0};
    tensor_v2(&p, "FloatStorage", "0", 4, 0, 1, (int64_t[]){4}, (int64_t[]){1});
    ops(&p, "(NK\x01tb.");
    loads_to(&p, "T(F32,S0:F32:4,0,(4),(1),-)");
}

Test(pickle_ops, torch_size)
{
    pb p = {0};
    op(&p, '(');
    global(&p, "torch", "Size");
    ops(&p, "(K\x02K\x03t\x85R");
    global(&p, "torch", "Size");
    ops(&p, "(K\x04l\x85R");
    global(&p, "torch", "Size");
    ops(&p, ")R");
    ops(&p, "t.");
    loads_to(&p, "((2,3),(4),())");
    p = (pb){0};
    global(&p, "torch", "Size");
    ops(&p, "(Nt\x85R.");
    fails(&p, "torch.Size: item 0 is a None, not an int");
}

Test(pickle_ops, codecs_encode_and_bytes)
{
    pb p = {0};
    op(&p, '(');
    global(&p, "_codecs", "encode");
    ops(&p, "X\x05\x00\x00\x00\xc3\xbf\x00\x41\x7f");
    str_(&p, "latin1");
    ops(&p, "\x86R");
    global(&p, "__builtin__", "bytes");
    ops(&p, ")R");
    global(&p, "builtins", "bytes");
    ops(&p, ")R");
    ops(&p, "t.");
    loads_to(&p, "(b\"\\xff\\x00A\\x7f\",b\"\",b\"\")");
}

Test(pickle_ops, codecs_encode_refuses_other_text)
{
    pb p = {0};
    global(&p, "_codecs", "encode");
    ops(&p, "X\x02\x00\x00\x00\xc4\x80");
    str_(&p, "latin1");
    ops(&p, "\x86R.");
    fails(&p, "_codecs.encode: character U+0100 of the string is not latin1");
    p = (pb){0};
    global(&p, "_codecs", "encode");
    str_(&p, "x");
    str_(&p, "utf-8");
    ops(&p, "\x86R.");
    fails(&p, "_codecs.encode: encoding 'utf-8' is not latin1");
    p = (pb){0};
    global(&p, "builtins", "bytes");
    ops(&p, "K\x03\x85R.");
    fails(&p, "REDUCE builtins.bytes: only bytes() is supported");
}

Test(pickle_ops, torch_device)
{
    pb p = {0};
    op(&p, '(');
    global(&p, "torch", "device");
    str_(&p, "cuda:1");
    ops(&p, "\x85R");
    global(&p, "torch", "device");
    str_(&p, "cuda");
    ops(&p, "K\x02\x86R");
    global(&p, "torch", "device");
    str_(&p, "cpu");
    ops(&p, "N\x86R");
    ops(&p, "t.");
    loads_to(&p, "(\"cuda:1\",\"cuda:2\",\"cpu\")");
    p = (pb){0};
    global(&p, "torch", "device");
    ops(&p, "K\x01\x85R.");
    fails(&p, "torch.device: takes (str) or (str, index)");
}

/* --- tensors built by hand ----------------------------------------------------------------- */

static const int64_t S23[] = {2, 3}, R23[] = {3, 1};

/* torch >= 2.1 writes new dtypes this way: an untyped storage and _rebuild_tensor_v3. */
static void tensor_v3(pb *p, const char *storage_module, const char *dtype)
{
    global(p, "torch._utils", "_rebuild_tensor_v3");
    op(p, '(');
    op(p, '(');
    str_(p, "storage");
    global(p, storage_module, "UntypedStorage");
    str_(p, "7");
    str_(p, "cuda:0");
    int_(p, 16);
    ops(p, "tQ");
    view_args(p, 1, 2, S23, R23);
    global(p, "torch", dtype);
    ops(p, "tR");
}

Test(pickle_torch, v3_on_untyped_storage)
{
    pb p = {0};
    op(&p, '(');
    tensor_v3(&p, "torch", "float8_e4m3fn");
    tensor_v3(&p, "torch.storage", "uint16");
    ops(&p, "t.");
    pk_result r = load_ok(&p);
    cr_assert_str_eq(dump_str(r.root), "(T(F8_E4M3,S0:bytes:16,1,(2,3),(3,1),-),"
                                       "T(U16,S0:bytes:16,1,(2,3),(3,1),-))");
    const pk_obj *t = r.root->u.seq.items[0];
    cr_assert_eq(t->u.tensor.storage, r.root->u.seq.items[1]->u.tensor.storage);
    cr_assert_eq(t->u.tensor.storage->u.storage.dtype, PK_DTYPE_BYTES);
    pk_free(&r);
}

Test(pickle_torch, legacy_rebuild_tensor)
{
    pb p = {0};
    global(&p, "torch._utils", "_rebuild_tensor");
    op(&p, '(');
    storage(&p, "HalfStorage", "1", 6);
    int_(&p, 0);
    int_tuple(&p, 2, S23);
    int_tuple(&p, 2, R23);
    ops(&p, "tR.");
    loads_to(&p, "T(F16,S0:F16:6,0,(2,3),(3,1),-)");
}

Test(pickle_torch, v2_with_metadata_and_untyped_storage)
{
    pb p = {0};
    global(&p, "torch._utils", "_rebuild_tensor_v2");
    op(&p, '(');
    storage(&p, "UntypedStorage", "0", 6);
    int_(&p, 0);
    int_tuple(&p, 2, S23);
    int_tuple(&p, 2, R23);
    op(&p, 0x88);
    empty_odict(&p);
    ops(&p, "}tR.");
    loads_to(&p, "T(U8,S0:bytes:6,0,(2,3),(3,1),-)");
}

Test(pickle_torch, parameters)
{
    pb p = {0};
    op(&p, '(');
    tensor_v2(&p, "FloatStorage", "0", 6, 0, 2, S23, R23);
    ops(&p, "q\x00");
    global(&p, "torch._utils", "_rebuild_parameter");
    ops(&p, "h\x00\x88");
    empty_odict(&p);
    ops(&p, "\x87R");
    global(&p, "torch._utils", "_rebuild_parameter_with_state");
    ops(&p, "(h\x00\x89");
    empty_odict(&p);
    ops(&p, "}tR");
    ops(&p, "t.");
    pk_result r = load_ok(&p);
    cr_assert_str_eq(dump_str(r.root), "(T(F32,S0:F32:6,0,(2,3),(3,1),-),"
                                       "T(F32,S0:F32:6,0,(2,3),(3,1),P),"
                                       "T(F32,S0:F32:6,0,(2,3),(3,1),P))");
    cr_assert_neq(r.root->u.seq.items[0], r.root->u.seq.items[1], "the tensor was changed");
    pk_free(&r);
}

Test(pickle_torch, parameter_of_a_non_tensor)
{
    pb p = {0};
    global(&p, "torch._utils", "_rebuild_parameter");
    ops(&p, "K\x01\x88");
    empty_odict(&p);
    ops(&p, "\x87R.");
    fails(&p, "torch._utils._rebuild_parameter: data is a int, not a tensor");
}

Test(pickle_torch, shared_storage_is_one_object)
{
    pb p = {0};
    op(&p, '(');
    tensor_v2(&p, "FloatStorage", "5", 24, 0, 2, S23, R23);
    tensor_v2(&p, "FloatStorage", "6", 6, 0, 2, S23, R23);
    tensor_v2(&p, "FloatStorage", "5", 24, 6, 2, S23, R23);
    ops(&p, "t.");
    pk_result r = load_ok(&p);
    pk_obj **t = r.root->u.seq.items;
    cr_assert_eq(t[0]->u.tensor.storage, t[2]->u.tensor.storage);
    cr_assert_neq(t[0]->u.tensor.storage, t[1]->u.tensor.storage);
    cr_assert_str_eq(t[0]->u.tensor.storage->u.storage.key, "5");
    cr_assert_eq(t[2]->u.tensor.offset, 6);
    pk_free(&r);
}

/* The tuple of n tensors that tensor_v2 writes with these arguments, dumped. */
static const char *tensors_dump(int n, const char *const *keys, const int64_t *offsets)
{
    pb p = {0};
    op(&p, '(');
    for (int i = 0; i < n; i++)
        tensor_v2(&p, "FloatStorage", keys[i], 24, offsets[i], 2, S23, R23);
    ops(&p, "t.");
    pk_result r = load_ok(&p);
    const char *d = dump_str(r.root);
    pk_free(&r);
    return d;
}

Test(pickle_torch, used_up_tuples_read_back)
{
    /* A persistent id and _rebuild_tensor_v2's arguments, once used, are reused for the next
     * tensor's: here the memo reads both back after that, or a DUP keeps a second reference
     * on the stack. Each must still hold what it held. */
    static const char *const keys[] = {"5", "6", "5"};
    static const int64_t offsets[] = {0, 0, 0};
    const char *want = tensors_dump(3, keys, offsets);
    for (int how = 0; how < 3; how++) {
        pb p = {0};
        op(&p, '(');
        if (how == 0) { /* the persistent id PUT, used up, then read back for a third tensor */
            global(&p, "torch._utils", "_rebuild_tensor_v2");
            op(&p, '(');
            persid_items(&p, "FloatStorage", "5", 24);
            ops(&p, "tq\x07Q");
            view_args(&p, 0, 2, S23, R23);
            ops(&p, "tR");
            tensor_v2(&p, "FloatStorage", "6", 24, 0, 2, S23, R23);
            global(&p, "torch._utils", "_rebuild_tensor_v2");
            op(&p, '(');
            ops(&p, "h\x07Q");
            view_args(&p, 0, 2, S23, R23);
            ops(&p, "tR");
        } else if (how == 1) { /* the arguments PUT, used up, then read back */
            global(&p, "torch._utils", "_rebuild_tensor_v2");
            op(&p, '(');
            storage(&p, "FloatStorage", "5", 24);
            view_args(&p, 0, 2, S23, R23);
            ops(&p, "tq\x09R");
            tensor_v2(&p, "FloatStorage", "6", 24, 0, 2, S23, R23);
            global(&p, "torch._utils", "_rebuild_tensor_v2");
            ops(&p, "h\x09R");
        } else { /* the persistent id DUPed: used up once, then again from the stack */
            global(&p, "torch._utils", "_rebuild_tensor_v2");
            op(&p, '(');
            persid_items(&p, "FloatStorage", "5", 24);
            ops(&p, "t2Q0Q"); /* DUP, BINPERSID, POP, BINPERSID */
            view_args(&p, 0, 2, S23, R23);
            ops(&p, "tR");
            tensor_v2(&p, "FloatStorage", "6", 24, 0, 2, S23, R23);
            tensor_v2(&p, "FloatStorage", "5", 24, 0, 2, S23, R23);
        }
        ops(&p, "t.");
        pk_result r = load_ok(&p);
        cr_assert_str_eq(dump_str(r.root), want, "case %d", how);
        pk_obj **t = r.root->u.seq.items;
        cr_assert_eq(t[0]->u.tensor.storage, t[2]->u.tensor.storage, "case %d", how);
        pk_free(&r);
    }
}

Test(pickle_torch, storage_key_reused_with_another_dtype)
{
    pb p = {0};
    op(&p, '(');
    storage(&p, "FloatStorage", "0", 4);
    storage(&p, "HalfStorage", "0", 4);
    size_t q = p.n - 1;
    ops(&p, "t.");
    fails(&p, strf("BINPERSID: storage '0' is F16 × 4 here but F32 × 4 before (byte %zu)", q));
    p = (pb){0};
    op(&p, '(');
    storage(&p, "FloatStorage", "0", 4);
    storage(&p, "FloatStorage", "0", 5);
    ops(&p, "t.");
    fails(&p, "storage '0' is F32 × 5 here but F32 × 4 before");
}

/* _rebuild_tensor_v2 with the given storage argument (NULL: a FloatStorage of 64), then the
 * other arguments, as raw pickle text, must fail saying what. */
static void bad_tensor_(const char *st, size_t stlen, const char *args, size_t alen,
                        const char *what)
{
    pb p = {0};
    global(&p, "torch._utils", "_rebuild_tensor_v2");
    op(&p, '(');
    if (st)
        put(&p, st, stlen);
    else
        storage(&p, "FloatStorage", "0", 64);
    put(&p, args, alen);
    ops(&p, "tR.");
    fails(&p, what);
}
#define bad_tensor(args, what) bad_tensor_(NULL, 0, RAW(args), what)

Test(pickle_torch, bad_tensor_arguments)
{
    bad_tensor("K\x00(K\x02K\x03t(K\x03t\x89}", "size has 2 dims but stride 1");
    bad_tensor("K\x00(J\xff\xff\xff\xfft(K\x01t\x89}", "size[0] is negative (-1)");
    bad_tensor("K\x00(K\x01t(J\xff\xff\xff\xfft\x89}", "stride[0] is negative (-1)");
    bad_tensor("J\xff\xff\xff\xff)))\x89}", "storage offset is not a non-negative int");
    bad_tensor("K\x00(K\x01l(K\x01t\x89}", "size is a list, not a tuple of ints");
    bad_tensor("K\x00(Nt(K\x01t\x89}", "size[0] is a None, not an int");
    bad_tensor("K\x00))\x89", "torch._utils._rebuild_tensor_v2: 5 arguments is not a "
                                    "known signature");
    bad_tensor_(RAW("K\x01"), RAW("K\x00))\x89}"), "storage argument is a int, not a persistent "
                "storage");
    /* rank 65 */
    char buf[2 * 65 + 16];
    size_t n = 0;
    memcpy(buf, "K\x01(", 3);
    n = 3;
    for (int i = 0; i < 65; i++, n += 2)
        memcpy(buf + n, "K\x01", 2);
    memcpy(buf + n, "t)\x89}", 4);
    bad_tensor_(NULL, 0, buf, n + 4, "size has 65 dims, more than 64");
}

Test(pickle_torch, rank_64_is_allowed)
{
    int64_t ones[64];
    for (int i = 0; i < 64; i++)
        ones[i] = 1;
    pb p = {0};
    tensor_v2(&p, "FloatStorage", "0", 1, 0, 64, ones, ones);
    ops(&p, ".");
    pk_result r = load_ok(&p);
    cr_assert_eq(r.root->u.tensor.rank, 64);
    cr_assert_eq(r.root->u.tensor.size[63], 1);
    pk_free(&r);
}

Test(pickle_torch, v3_dtype_must_be_a_dtype)
{
    pb p = {0};
    global(&p, "torch._utils", "_rebuild_tensor_v3");
    op(&p, '(');
    storage(&p, "UntypedStorage", "0", 8);
    ops(&p, "K\x00))\x89}");
    global(&p, "torch", "FloatStorage");
    ops(&p, "tR.");
    fails(&p, "torch._utils._rebuild_tensor_v3: dtype argument is a global, not a torch dtype");
}

/* A persistent id made of the raw pickle text pid must be refused, saying what. */
static void bad_pid_(const char *pid, size_t len, const char *what)
{
    pb p = {0};
    put(&p, pid, len);
    ops(&p, "Q.");
    fails(&p, what);
}
#define bad_pid(pid, what) bad_pid_(RAW(pid), what)

Test(pickle_torch, persistent_ids_of_wrong_shape)
{
    bad_pid("(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00" "0K\x04t",
            "BINPERSID: persistent id is a tuple of 4, not a ('storage', class, key, location, "
            "numel) tuple");
    bad_pid("K\x05", "persistent id is a int of 0");
    bad_pid("(X\x06\x00\x00\x00modulectorch\nFloatStorage\nX\x01\x00\x00\x00" "0"
            "X\x03\x00\x00\x00" "cpuK\x04t", "persistent id is not a 'storage' record");
    bad_pid("(X\x07\x00\x00\x00storagectorch\nfloat32\nX\x01\x00\x00\x00" "0"
            "X\x03\x00\x00\x00" "cpuK\x04t", "persistent id names a global torch.float32, not "
            "a storage class");
    bad_pid("(X\x07\x00\x00\x00storagectorch\nFloatStorage\nK\x00X\x03\x00\x00\x00" "cpuK\x04t",
            "storage key is not a non-empty str without NUL");
    bad_pid("(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x02\x00\x00\x00" "a\0"
            "X\x03\x00\x00\x00" "cpuK\x04t", "storage key is not a non-empty str without NUL");
    bad_pid("(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00" "0K\x00K\x04t",
            "storage location is a int, not a str");
    bad_pid("(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00" "0"
            "X\x03\x00\x00\x00" "cpuJ\xff\xff\xff\xfft", "storage '0' size is not a non-negative "
            "int");
    /* legacy: a sixth item, view_metadata, must be None; the key is a decimal address */
    bad_pid("(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x03\x00\x00\x00" "123"
            "X\x03\x00\x00\x00" "cpuK\x04(X\x01\x00\x00\x00" "1K\x00K\x02tt",
            "storage '123' is a view (view_metadata is not None), which is not supported");
    bad_pid("(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x03\x00\x00\x00" "12a"
            "X\x03\x00\x00\x00" "cpuK\x04Nt", "legacy storage key '12a' is not a decimal number");
}

Test(pickle_torch, legacy_persistent_id)
{
    pb p = {0};
    ops(&p, "(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x03\x00\x00\x00" "123"
            "X\x03\x00\x00\x00" "cpuK\x04NtQ.");
    loads_to(&p, "S0:F32:4");
}

Test(pickle_torch, text_persistent_id_is_refused)
{
    pb p = {0};
    ops(&p, "P0\n.");
    fails(&p, "PERSID: persistent id is a str of 0, not a ('storage'");
}

/* --- hostile pickles ------------------------------------------------------------------------- */

static const char *const evil[][2] = {
    {"os", "system"}, {"posix", "system"}, {"nt", "system"}, {"builtins", "eval"},
    {"builtins", "exec"}, {"builtins", "getattr"}, {"__builtin__", "eval"},
    {"subprocess", "Popen"}, {"subprocess", "check_output"}, {"numpy.core.multiarray", "scalar"},
    {"numpy", "dtype"}, {"torch", "load"}, {"torch.serialization", "load"}, {"torch", "Tensor"},
    {"collections", "defaultdict"}, {"copyreg", "_reconstructor"}, {"pickle", "loads"},
    {"torch", ""}, {"", ""}, {"torch._utils", "_rebuild"},
};

Test(pickle_hostile, refused_globals)
{
    for (size_t i = 0; i < sizeof evil / sizeof *evil; i++) {
        pb p = {0};
        ops(&p, "\x80\x02");
        global(&p, evil[i][0], evil[i][1]);
        str_(&p, "echo pwned");
        ops(&p, "\x85R.");
        fails(&p, strf("refused global '%s %s' (byte 2)", evil[i][0], evil[i][1]));
    }
}

/* The DCP metadata's classes exist only for a .metadata pickle: a checkpoint's object pickle
 * may not name them, and getattr stays refused there (only _MEM_FORMAT_ENCODING's names,
 * and only in DCP mode, does it reach). */
static void dcp_metadata_object(pb *p)
{
    ops(p, "\x80\x02");
    global(p, "torch.distributed.checkpoint.metadata", "Metadata");
    ops(p, ")\x81.");
}

Test(pickle_hostile, dcp_globals_only_in_dcp_metadata)
{
    pb p = {0}, q = {0};
    dcp_metadata_object(&p);
    fails(&p, "refused global 'torch.distributed.checkpoint.metadata Metadata' (byte 2)");
    dcp_metadata_object(&q);
    pk_result r = load_ok_with(&q, &pk_dcp_limits);
    cr_assert_eq(r.root->type, PK_OBJECT);
    cr_assert_eq(r.root->u.seq.items[0]->u.global.which, PKG_DCP_METADATA);
    pk_free(&r);

    pb g = {0};
    ops(&g, "\x80\x02");
    global(&g, "builtins", "getattr");
    global(&g, "os", "system");
    str_(&g, "x");
    ops(&g, "\x86R.");
    fails(&g, "refused global 'builtins getattr' (byte 2)");
    pb h = {0};
    ops(&h, "\x80\x02");
    global(&h, "builtins", "getattr");
    global(&h, "os", "system");
    fails_with(&h, &pk_dcp_limits, PK_ERROR, "refused global 'os system'");
}

/* A record object takes one state, and only while no container holds it: no cycles. */
Test(pickle_hostile, dcp_object_state_once_and_before_adoption)
{
    pb p = {0};
    ops(&p, "\x80\x02");
    global(&p, "torch.distributed.checkpoint.metadata", "Metadata");
    ops(&p, ")\x81q\x00}b}b.");
    fails_with(&p, &pk_dcp_limits, PK_ERROR, "BUILD on a torch.distributed.checkpoint.metadata."
               "Metadata that has its state");
    pb c = {0};
    ops(&c, "\x80\x02");
    global(&c, "torch.distributed.checkpoint.metadata", "Metadata");
    ops(&c, ")\x81q\x00}\x8c\x01k" "h\x00" "sb."); /* obj; {'k': obj}; BUILD obj with it */
    fails_with(&c, &pk_dcp_limits, PK_ERROR, "already inside another container");
}

Test(pickle_hostile, refused_stack_globals)
{
    for (size_t i = 0; i < sizeof evil / sizeof *evil; i++) {
        pb p = {0};
        ops(&p, "\x80\x04");
        stack_global(&p, evil[i][0], evil[i][1]);
        str_(&p, "echo pwned");
        ops(&p, "\x85R.");
        fails(&p, strf("refused global '%s %s' (byte %zu)", evil[i][0], evil[i][1],
                       2 + 10 + strlen(evil[i][0]) + strlen(evil[i][1])));
    }
}

Test(pickle_hostile, global_names_are_exact)
{
    const char *near[][2] = {{"torch", "float32 "}, {"torch ", "float32"}, {"Torch", "float32"},
                             {"torch", "FloatStorage2"}, {"torch._utils", "rebuild_tensor_v2"},
                             {"torch._util", "_rebuild_tensor_v2"},
                             {"collections", "OrderedDictX"}};
    for (size_t i = 0; i < sizeof near / sizeof *near; i++) {
        pb p = {0};
        global(&p, near[i][0], near[i][1]);
        op(&p, '.');
        fails(&p, strf("'%s %s'", near[i][0], near[i][1]));
    }
}

Test(pickle_hostile, stack_global_needs_strings)
{
    pb p = {0};
    str_(&p, "os");
    ops(&p, "K\x01\x93.");
    fails(&p, "STACK_GLOBAL needs two str, got str and int");
}

Test(pickle_hostile, unsupported_tensor_kinds)
{
    const char *cases[][3] = {
        {"torch._utils", "_rebuild_qtensor", "quantized"},
        {"torch._utils", "_rebuild_sparse_tensor", "sparse"},
        {"torch._utils", "_rebuild_sparse_csr_tensor", "sparse"},
        {"torch._utils", "_rebuild_nested_tensor", "nested"},
        {"torch._utils", "_rebuild_wrapper_subclass", "tensor-subclass"},
        {"torch._utils", "_rebuild_device_tensor_from_numpy", "numpy-backed"},
        {"torch._utils", "_rebuild_meta_tensor_no_storage", "meta"},
        {"torch._utils", "_rebuild_something_new", "such"},
        {"torch._tensor", "_rebuild_from_type_v2", "tensor-subclass"},
        {"torch", "QInt8Storage", "quantized"},
        {"torch", "QUInt4x2Storage", "quantized"},
        {"torch", "qint8", "quantized"},
        {"torch", "sparse_coo", "sparse"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        pb p = {0};
        ops(&p, "\x80\x02");
        global(&p, cases[i][0], cases[i][1]);
        ops(&p, ")R.");
        fails(&p, strf("%s tensors are not supported (GLOBAL %s.%s at byte 2)", cases[i][2],
                       cases[i][0], cases[i][1]));
    }
}

Test(pickle_hostile, reduce_on_what_is_not_callable)
{
    pb p = {0};
    ops(&p, "K\x05)R.");
    fails(&p, "REDUCE calls a int, which is not callable (byte 3)");
    p = (pb){0};
    global(&p, "torch", "FloatStorage");
    ops(&p, ")R.");
    fails(&p, "REDUCE calls torch.FloatStorage, which may not be called");
    p = (pb){0};
    global(&p, "torch", "float16");
    ops(&p, ")R.");
    fails(&p, "REDUCE calls torch.float16, which may not be called");
    p = (pb){0};
    global(&p, "torch", "Size");
    ops(&p, "]R.");
    fails(&p, "REDUCE torch.Size: arguments are a list, not a tuple");
    p = (pb){0};
    ops(&p, "](R.");
    fails(&p, "stack underflow: REDUCE needs 2 values above the mark, 0 there");
}

Test(pickle_hostile, newobj_and_build_on_other_things)
{
    pb p = {0};
    global(&p, "torch", "Size");
    ops(&p, ")\x81.");
    fails(&p, "NEWOBJ of global torch.Size is not supported (only collections.OrderedDict)");
    p = (pb){0};
    ops(&p, "K\x01)}\x92.");
    fails(&p, "NEWOBJ_EX of int is not supported");
    p = (pb){0};
    ops(&p, "]}b.");
    fails(&p, "BUILD on a list is not supported (byte 2)");
    p = (pb){0};
    ops(&p, "}K\x01" "b.");
    fails(&p, "BUILD on a dict with a int state is not supported");
}

Test(pickle_hostile, mark_bomb)
{
    pb p = {0};
    ops_times(&p, "(", 100000);
    op(&p, '.');
    fails(&p, "MARK: more than 10000 nested marks (byte 10000)");
}

Test(pickle_hostile, deep_list_nesting)
{
    pb p = {0};
    ops_times(&p, "]", 1000000);
    ops_times(&p, "a", 999999);
    op(&p, '.');
    fails(&p, "APPEND: containers nested deeper than 1000 (byte 1000999)");
}

Test(pickle_hostile, deep_tuple_nesting)
{
    pb p = {0};
    op(&p, ')');
    ops_times(&p, "\x85", 1000000);
    op(&p, '.');
    fails(&p, "TUPLE1: containers nested deeper than 1000 (byte 1000)");
}

Test(pickle_hostile, deep_nesting_through_dicts_and_marks)
{
    pb p = {0};
    ops_times(&p, "}(K\x01", 5000);
    op(&p, 'N');
    ops_times(&p, "u", 5000);
    op(&p, '.');
    fails(&p, "containers nested deeper than 1000");
}

Test(pickle_hostile, depth_1000_is_allowed)
{
    pb p = {0};
    ops_times(&p, "]", 1000);
    ops_times(&p, "a", 999);
    op(&p, '.');
    pk_result r = load_ok(&p);
    size_t depth = 0;
    for (const pk_obj *o = r.root; o->type == PK_LIST; o = o->u.seq.n ? o->u.seq.items[0] : o) {
        depth++;
        if (!o->u.seq.n)
            break;
    }
    cr_assert_eq(depth, 1000);
    pk_free(&r);
}

Test(pickle_hostile, a_million_appends)
{
    pb p = {0};
    op(&p, ']');
    ops_times(&p, "Na", 1000000);
    op(&p, '.');
    pk_result r = load_ok(&p);
    cr_assert_eq(r.root->u.seq.n, 1000000);
    pk_free(&r);
}

Test(pickle_hostile, huge_memo_index)
{
    pb p = {0};
    ops(&p, "Nr\xff\xff\xff\xff.");
    fails(&p, "LONG_BINPUT: memo index 4294967295 is beyond the limit of 10000000 (byte 1)");
    p = (pb){0};
    ops(&p, "Np99999999999999999999\n.");
    fails(&p, "PUT: integer 99999999999999999999 does not fit in 64 bits");
    p = (pb){0};
    ops(&p, "Np-1\n.");
    fails(&p, "PUT: negative memo index -1");
}

Test(pickle_limits, sparse_memo_indices_cost_little)
{
    /* With the limit lifted, far-apart indices work, each in a small table slot: a dense
     * array up to 2^32 would need 32 GiB, which the sanitizers would refuse. */
    pk_limits lim = pk_default_limits;
    lim.max_memo = SIZE_MAX;
    pb p = {0};
    ops(&p, "(K\x01r\xff\xff\xff\xffK\x02r\x00\x00\x00\x80K\x03p123456789012\n");
    for (int i = 0; i < 5000; i++) { /* many sparse indices: the table grows */
        int_(&p, i);
        op(&p, 'r');
        le(&p, 0x10000000u + 977u * (uint32_t)i, 4);
        op(&p, '0');
    }
    ops(&p, "1");
    ops(&p, "(j\xff\xff\xff\xffj\x00\x00\x00\x80g123456789012\n");
    op(&p, 'j');
    le(&p, 0x10000000u + 977u * 4321u, 4);
    ops(&p, "t.");
    pk_result r = load_ok_with(&p, &lim);
    cr_assert_str_eq(dump_str(r.root), "(1,2,3,4321)");
    pk_free(&r);
}

Test(pickle_hostile, get_of_unset_memo)
{
    pb p = {0};
    ops(&p, "Nq\x00h\x03.");
    fails(&p, "BINGET of memo index 3, which was never set (byte 3)");
    p = (pb){0};
    ops(&p, "j\x00\x00\x00\x10.");
    fails(&p, "LONG_BINGET of memo index 268435456, which was never set");
    p = (pb){0};
    ops(&p, "g0\n.");
    fails(&p, "GET of memo index 0, which was never set");
    p = (pb){0};
    ops(&p, "q\x00.");
    fails(&p, "stack underflow: BINPUT needs 1 value above the mark, 0 there");
}

Test(pickle_hostile, lengths_past_the_end)
{
    pb p = {0};
    ops(&p, "\x80\x02X\xff\xff\xff\xff" "abc");
    fails_with(&p, NULL, PK_TRUNCATED, "truncated pickle: BINUNICODE string needs 4294967295 "
                                       "bytes, 3 remain (byte 2)");
    p = (pb){0};
    op(&p, 0x8e);
    le(&p, UINT64_MAX, 8);
    ops(&p, "xx.");
    fails_with(&p, NULL, PK_TRUNCATED, "BINBYTES8 bytes needs 18446744073709551615 bytes");
    p = (pb){0};
    ops(&p, "T\xff\xff\xff\xffxx.");
    fails(&p, "BINSTRING has a negative byte count (byte 0)");
    p = (pb){0};
    ops(&p, "\x8b\xfe\xff\xff\xff.");
    fails(&p, "LONG4 has a negative byte count");
    p = (pb){0};
    ops(&p, "cos\nsys");
    fails_with(&p, NULL, PK_TRUNCATED, "GLOBAL argument has no newline");
    p = (pb){0};
    fails_with(&p, NULL, PK_TRUNCATED, "truncated pickle: the input ends before STOP (byte 0)");
    p = (pb){0};
    ops(&p, "K\x01");
    fails_with(&p, NULL, PK_TRUNCATED, "the input ends before STOP (byte 2)");
}

Test(pickle_hostile, stack_underflow)
{
    const struct {
        const char *ops;
        size_t len;
        const char *what;
    } cases[] = {
        {RAW("\x86."), "stack underflow: TUPLE2 needs 2 values above the mark, 0 there (byte 0)"},
        {RAW("K\x01(K\x02\x86."), "TUPLE2 needs 2 values above the mark, 1 there"},
        {RAW("](K\x01" "a."), "APPEND needs 2 values above the mark, 1 there"},
        {RAW("(K\x01" "e."), "stack underflow: APPENDS has nothing to add to"},
        {RAW("K\x01(K\x02K\x03u."), "SETITEMS needs a dict, got a int"},
        {RAW("]K\x01K\x02s."), "SETITEM needs a dict, got a list (byte 5)"},
        {RAW("K\x01K\x02" "a."), "APPEND needs a list, got a int"},
        {RAW("}K\x01s."), "SETITEM needs 3 values above the mark, 2 there"},
        {RAW("."), "STOP needs 1 value above the mark, 0 there"},
        {RAW("K\x01(."), "STOP needs 1 value above the mark, 0 there"},
        {RAW("0."), "POP needs 1 value above the mark, 0 there"},
        {RAW("2."), "DUP needs 1 value above the mark, 0 there"},
        {RAW("K\x01" "e."), "APPENDS without a MARK"},
        {RAW("1."), "POP_MARK without a MARK"},
        {RAW("K\x01t."), "TUPLE without a MARK"},
        {RAW("}(K\x01u."), "SETITEMS: odd number of values (1) for key-value pairs"},
        {RAW("(K\x01" "d."), "DICT: odd number of values (1)"},
        {RAW("Q."), "BINPERSID needs 1 value"},
        {RAW("K\x01\x93."), "STACK_GLOBAL needs 2 values"},
        {RAW("b."), "BUILD needs 2 values"},
        {RAW("K\x01\x81."), "NEWOBJ needs 2 values"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        pb p = {0};
        put(&p, cases[i].ops, cases[i].len);
        fails(&p, cases[i].what);
    }
}

Test(pickle_hostile, ints_beyond_64_bits)
{
    pb p = {0};
    ops(&p, "\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01.");
    fails(&p, "LONG1: integer of 9 bytes does not fit in 64 bits (byte 0)");
    p = (pb){0};
    ops(&p, "\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00.");   /* 2^63 */
    fails(&p, "does not fit in 64 bits");
    p = (pb){0};
    ops(&p, "\x8a\x09\xff\xff\xff\xff\xff\xff\xff\x7f\xff.");   /* -2^63 - 2^63 - 1 */
    fails(&p, "does not fit in 64 bits");
    p = (pb){0};
    op(&p, 0x8b);
    le(&p, 100, 4);
    ops_times(&p, "\x11", 100);
    op(&p, '.');
    fails(&p, "LONG4: integer of 100 bytes does not fit in 64 bits");
    p = (pb){0};
    ops(&p, "L18446744073709551616L\n.");
    fails(&p, "LONG: integer 18446744073709551616 does not fit in 64 bits");
    p = (pb){0};
    ops(&p, "I9223372036854775808\n.");
    fails(&p, "INT: integer 9223372036854775808 does not fit in 64 bits");
    p = (pb){0};
    ops(&p, "I0x10\n.");
    fails(&p, "INT: '0x10' is not a decimal integer");
    p = (pb){0};
    ops(&p, "Fabc\n.");
    fails(&p, "FLOAT argument 'abc' is not a float");
}

Test(pickle_hostile, cycles_are_refused)
{
    pb p = {0};
    ops(&p, "]2a.");
    fails(&p, "APPEND puts a list inside itself (byte 2)");
    p = (pb){0};
    ops(&p, "}22s.");
    fails(&p, "a dict cannot be a dict key");
    p = (pb){0};
    ops(&p, "}K\x01" "h\x00s.");
    fails(&p, "BINGET of memo index 0");
    p = (pb){0};
    ops(&p, "}q\x00K\x01h\x00s.");
    fails(&p, "SETITEM puts a dict inside itself");
    p = (pb){0};
    /* a = [], b = [a], then a.append(b): a is already inside b */
    ops(&p, "]q\x00]q\x01h\x00" "a0h\x00h\x01" "a.");
    fails(&p, "APPEND changes a list that is already inside another container (that could make "
              "a cycle)");
    p = (pb){0};
    /* the same through a tuple: t = (a,), then a.append(t) */
    ops(&p, "]q\x00h\x00\x85q\x01" "0h\x00h\x01" "a.");
    fails(&p, "already inside another container");
    p = (pb){0};
    ops(&p, "\x8fq\x00(h\x00\x90.");
    fails(&p, "ADDITEMS: a set cannot be a set member (unhashable)"); /* as Python says */
}

Test(pickle_hostile, unhashable_keys)
{
    pb p = {0};
    ops(&p, "}]Ns.");
    fails(&p, "SETITEM: a list cannot be a dict key (unhashable)");
    p = (pb){0};
    ops(&p, "(\x8fNd.");
    fails(&p, "DICT: a set cannot be a dict key");
}

Test(pickle_hostile, unsupported_opcodes)
{
    const struct {
        const char *ops;
        size_t len;
        const char *what;
    } cases[] = {
        {RAW("(iou\nsystem\n."), "pickle opcode INST (0x69) is not supported (byte 1)"},
        {RAW("(K\x01o."), "pickle opcode OBJ (0x6f) is not supported (byte 3)"},
        {RAW("\x82\x01."), "pickle opcode EXT1 (0x82) is not supported (byte 0)"},
        {RAW("\x83\x01\x00."), "EXT2"},
        {RAW("\x84\x01\x00\x00\x00."), "EXT4"},
        {RAW("\x97."), "pickle opcode NEXT_BUFFER (0x97) is not supported"},
        {RAW("K\x01\x98."), "READONLY_BUFFER"},
        {RAW("\xff."), "unknown pickle opcode 0xff (byte 0)"},
        {RAW("\x80\x06."), "unsupported pickle protocol 6 (byte 0)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        pb p = {0};
        put(&p, cases[i].ops, cases[i].len);
        fails(&p, cases[i].what);
    }
    pb p = {0};
    put(&p, "\0.", 2);
    fails(&p, "unknown pickle opcode 0x00 (byte 0)");
}

Test(pickle_hostile, shared_containers_cannot_explode)
{
    /* l0 = [None]; l(k+1) = [lk, lk]: 2^k values when walked, from 5 bytes per level. */
    pb p = {0};
    ops(&p, "]Naq\x00");
    ops_times(&p, "](h\x00h\x00" "eq\x00" "0", 40);
    ops(&p, "h\x00.");
    fails(&p, "APPENDS: a walk of the result would visit more than 50000000 values (shared "
              "containers)");
}

Test(pickle_hostile, repeated_copies_are_bounded)
{
    /* OrderedDict(pairs) copies every pair: the same list of 10,000 pairs, copied 100,000
     * times, would take 16 GB from a pickle of a few hundred KB. */
    pb p = {0};
    global(&p, "collections", "OrderedDict");
    ops(&p, "q\x00](K\x01K\x02\x86q\x01");
    ops_times(&p, "h\x01", 10000);
    ops(&p, "e\x85q\x02" "0");
    ops_times(&p, "h\x00h\x02R0", 100000);
    ops(&p, "N.");
    fails(&p, "collections.OrderedDict: copies more than 8 bytes per input byte in all");
}

Test(pickle_hostile, messages_quote_names_safely)
{
    pb p = {0};
    ops(&p, "\x80\x04");
    stack_global(&p, "os\x01\x7f", "sys\x1btem");
    op(&p, '.');
    fails(&p, "refused global 'os?? sys?tem'");
    char longname[600];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    p = (pb){0};
    global(&p, longname, "x");
    op(&p, '.');
    fails(&p, "refused global 'aaaa");
}

/* --- limits ------------------------------------------------------------------------------- */

static pk_limits small(size_t stack, size_t marks, size_t memo, size_t objects, size_t depth)
{
    return (pk_limits){.max_stack = stack, .max_marks = marks, .max_memo = memo,
                       .max_objects = objects, .max_depth = depth};
}

Test(pickle_limits, stack)
{
    pk_limits lim = small(3, 10, 10, 100, 10);
    pb p = {0};
    ops(&p, "NNN0N.");
    pk_result r = load_ok_with(&p, &lim);
    pk_free(&r);
    p = (pb){0};
    ops(&p, "NNNN.");
    fails_with(&p, &lim, PK_ERROR, "NONE: more than 3 values on the stack (byte 3)");
}

Test(pickle_limits, marks)
{
    pk_limits lim = small(100, 2, 10, 100, 10);
    pb p = {0};
    ops(&p, "(((.");
    fails_with(&p, &lim, PK_ERROR, "MARK: more than 2 nested marks (byte 2)");
}

Test(pickle_limits, memo)
{
    pk_limits lim = small(100, 2, 10, 100, 10);
    pb p = {0};
    ops(&p, "Nq\x09q\x0a.");
    fails_with(&p, &lim, PK_ERROR, "BINPUT: memo index 10 is beyond the limit of 10 (byte 3)");
}

Test(pickle_limits, objects)
{
    pk_limits lim = small(100, 2, 10, 5, 10);
    pb p = {0};
    ops(&p, "(K\x01K\x02K\x03K\x04K\x05K\x06t.");
    fails_with(&p, &lim, PK_ERROR, "BININT1: more than 5 objects (byte 11)");
    p = (pb){0};
    ops(&p, "NNNNNNNNNN0000000000\x88\x89\x88\x88.");  /* singletons count once */
    pk_result r = load_ok_with(&p, &lim);
    pk_free(&r);
}

Test(pickle_limits, depth)
{
    pk_limits lim = small(100, 10, 10, 100, 3);
    pb p = {0};
    ops(&p, "]]]aa.");
    pk_result r = load_ok_with(&p, &lim);
    pk_free(&r);
    p = (pb){0};
    ops(&p, "))\x85\x85\x85.");
    fails_with(&p, &lim, PK_ERROR, "TUPLE1: containers nested deeper than 3 (byte 4)");
}

/* The typed accessors hand a value back only when it is of the type asked: a record's field
 * that holds a str where a tuple of ints belongs is refused where it is taken (never a string's
 * bytes read as pointers), and each takes NULL, so calls chain. */
Test(pickle_typed, accessors_refuse_another_type)
{
    pb p = {0};
    ops(&p, "\x80\x02");
    global(&p, "torch.distributed.checkpoint.metadata", "MetadataIndex");
    ops(&p, ")\x81}(");
    str_(&p, "fqn");
    str_(&p, "w");
    str_(&p, "offset");
    str_(&p, "oops");
    str_(&p, "index");
    ops(&p, "G\x3f\xf8\x00\x00\x00\x00\x00\x00"); /* 1.5 */
    str_(&p, "sizes");
    ops(&p, "(K\x02K\x03t");
    ops(&p, "ub.");
    pk_result r = load_ok_with(&p, &pk_dcp_limits);
    const pk_obj *o = pk_record(r.root, PKG_DCP_METADATA_INDEX);
    cr_assert_not_null(o);
    cr_assert_null(pk_record(r.root, PKG_DCP_CHUNK));
    cr_assert_str_eq(pk_text(pk_field(o, "fqn"), NULL), "w");
    const pk_obj *offset = pk_field(o, "offset");
    int64_t v[4], i;
    size_t n, len;
    cr_assert_not_null(offset);
    cr_assert_eq(pk_int_tuple(offset, 4, v, &n), -1);
    cr_assert_eq(pk_int(offset, &i), -1);
    cr_assert_null(pk_item(offset, 0));
    cr_assert_eq(pk_len(offset), 0);
    cr_assert_eq(pk_dtype(offset), -1);
    cr_assert_eq(pk_bool(offset), -1);
    cr_assert_str_eq(pk_text(offset, &len), "oops");
    cr_assert_eq(len, 4);
    cr_assert_eq(pk_int(pk_field(o, "index"), &i), -1);
    cr_assert_eq(pk_int_tuple(pk_field(o, "sizes"), 4, v, &n), 0);
    cr_assert(n == 2 && v[0] == 2 && v[1] == 3);
    cr_assert_eq(pk_int_tuple(pk_field(o, "sizes"), 1, v, &n), -1); /* longer than asked */
    cr_assert_eq(pk_int(pk_item(pk_field(o, "sizes"), 1), &i), 0);
    cr_assert_eq(i, 3);
    cr_assert_null(pk_item(pk_field(o, "sizes"), 2));
    cr_assert_null(pk_field(o, "absent"));
    cr_assert_null(pk_field(pk_field(o, "fqn"), "fqn")); /* a str has no fields */
    cr_assert_null(pk_state(pk_field(o, "sizes")));
    const pk_obj *k, *val;
    cr_assert_eq(pk_pair(pk_state(o), 3, &k, &val), 0);
    cr_assert_eq(pk_pair(pk_state(o), 4, &k, &val), -1);
    cr_assert_eq(pk_pair(pk_field(o, "sizes"), 0, &k, &val), -1);
    cr_assert_null(pk_text(NULL, NULL));
    cr_assert_null(pk_as(NULL, PK_STR));
    pk_free(&r);
}
