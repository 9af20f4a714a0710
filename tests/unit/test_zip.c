/* The zip reader: archives written by Python's zipfile, by torch.save and by the corpus's tools,
 * checked entry by entry against Python's own reading of them; archives built byte by byte for
 * what those writers never do (torch's padded local headers, zip64 extras in the central
 * directory); and every lie a hostile archive can tell, each refused with a message that says
 * what is wrong. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../../index/zip.h"
#include "helpers.h"

TestSuite(zip_probe);
TestSuite(zip_python, .fini = tmp_cleanup);
TestSuite(zip_torch, .fini = tmp_cleanup);
TestSuite(zip_corpus, .fini = tmp_cleanup);
TestSuite(zip_built, .fini = tmp_cleanup);
TestSuite(zip_end, .fini = tmp_cleanup);
TestSuite(zip_central, .fini = tmp_cleanup);
TestSuite(zip_local, .fini = tmp_cleanup);
TestSuite(zip_fuzz, .fini = tmp_cleanup);

#define CORPUS "/work/shared/corpus/"

/* --- reading --------------------------------------------------------------------------- */

static int is_empty(const zip_archive *z)
{
    return !z->entries && !z->nentries && !z->names && !z->slots;
}

/* zip_read_directory on the file at path, told the file is size bytes (its real size when
 * size is -1); *z starts as garbage, as a caller's might. */
static int read_dir_sized(const char *path, long long size, zip_archive *z, ck_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0, "cannot open %s", path);
    struct stat st;
    cr_assert_eq(fstat(fd, &st), 0);
    memset(z, 0xA5, sizeof *z);
    *err = (ck_error){""};
    int rc = zip_read_directory(&(ck_file){.path = path, .fd = fd},
                                size < 0 ? (uint64_t)st.st_size : (uint64_t)size, path, z, err);
    close(fd);
    return rc;
}

static zip_archive read_ok(const char *path)
{
    zip_archive z;
    ck_error err;
    int rc = read_dir_sized(path, -1, &z, &err);
    cr_assert_eq(rc, 0, "zip_read_directory(%s) failed: %s", path, err.msg);
    return z;
}

/* Asserts that reading path fails: -1, *z empty, a one-line message naming path and saying
 * what. */
static void read_fails_sized(const char *path, long long size, const char *what)
{
    zip_archive z;
    ck_error err;
    int rc = read_dir_sized(path, size, &z, &err);
    if (rc == 0)
        zip_free(&z);
    cr_assert_eq(rc, -1, "%s was read, expected an error saying '%s'", path, what);
    cr_assert(is_empty(&z), "failed read left *z set");
    assert_error(&err, path, what);
}

static void read_fails(const char *path, const char *what)
{
    read_fails_sized(path, -1, what);
}

static uint64_t size_of(const char *path)
{
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "cannot stat %s", path);
    return (uint64_t)st.st_size;
}

/* What must hold of any directory read: names intact, each entry in one slot, zip_find
 * finding each entry, data inside the file; zip_free empties it. */
static void check_invariants(zip_archive *z, uint64_t file_size)
{
    cr_assert(z->nentries == 0 || (z->entries && z->names && z->slots));
    for (size_t i = 0; i < z->nentries; i++) {
        const zip_entry *e = &z->entries[i];
        cr_assert_eq(strlen(e->name), e->name_len, "entry %zu: name length", i);
        cr_assert(e->data_offset <= file_size && e->csize <= file_size - e->data_offset,
                  "entry %zu: data outside the file", i);
        cr_assert_eq(zip_find(z, e->name, e->name_len), e, "zip_find(%s)", e->name);
    }
    size_t filled = 0;
    for (size_t i = 0; z->nentries && i < z->nslots; i++) {
        cr_assert(z->slots[i] == ZIP_NO_SLOT || z->slots[i] < z->nentries, "slot %zu", i);
        filled += z->slots[i] != ZIP_NO_SLOT;
    }
    cr_assert_eq(filled, z->nentries, "%zu entries in %zu slots", z->nentries, filled);
    zip_free(z);
    cr_assert(is_empty(z), "zip_free did not empty the archive");
}

/* --- Python's reading of an archive ----------------------------------------------------- */

/* One line per entry, in central directory order: name (hex, "-" if empty), method, flags,
 * size, compressed size, data offset (header_offset + 30 + the local header's name and extra
 * lengths, read from the file here), then the first and last 8 bytes of a stored entry's
 * contents (hex, "-" if none). */
static const char *const LIST_PY =
    "import struct, sys, zipfile\n"
    "path = sys.argv[1]\n"
    "raw = open(path, 'rb').read()\n"
    "with zipfile.ZipFile(path) as zf:\n"
    "    for i in zf.infolist():\n"
    "        name = i.orig_filename.encode('utf-8' if i.flag_bits & 0x800 else 'cp437')\n"
    "        h = i.header_offset\n"
    "        n, e = struct.unpack('<HH', raw[h + 26:h + 30])\n"
    "        data = zf.read(i) if i.compress_type == 0 else b''\n"
    "        print(name.hex() or '-', i.compress_type, i.flag_bits, i.file_size,\n"
    "              i.compress_size, h + 30 + n + e, data[:8].hex() or '-',\n"
    "              data[-8:].hex() or '-')\n";

static size_t unhex(const char *s, unsigned char *out, size_t cap)
{
    if (strcmp(s, "-") == 0)
        return 0;
    size_t n = strlen(s) / 2;
    cr_assert_leq(n, cap);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        cr_assert_eq(sscanf(s + 2 * i, "%2x", &v), 1);
        out[i] = (unsigned char)v;
    }
    return n;
}

/* Reads the archive at path and asserts that every entry is what Python's zipfile says it is;
 * returns how many entries there were. */
static size_t check_like_python(const char *path)
{
    char *listing = strdup(run_python(LIST_PY, path, NULL));
    cr_assert_not_null(listing);
    size_t flen;
    unsigned char *file = read_whole(path, &flen);
    zip_archive z = read_ok(path);
    size_t i = 0;
    char *save = NULL;
    for (char *line = strtok_r(listing, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        static char hname[2 * 65536 + 2], head[64], tail[64];
        unsigned method, flags;
        unsigned long long size, csize, data;
        cr_assert_eq(sscanf(line, "%131073s %u %u %llu %llu %llu %63s %63s", hname, &method,
                            &flags, &size, &csize, &data, head, tail), 8, "line '%s'", line);
        cr_assert_lt(i, z.nentries, "%s: Python lists more entries than %zu", path, z.nentries);
        const zip_entry *e = &z.entries[i];
        static unsigned char name[65536];
        size_t nlen = unhex(hname, name, sizeof name);
        cr_assert(e->name_len == nlen && memcmp(e->name, name, nlen) == 0 && e->name[nlen] == 0,
                  "%s entry %zu: name '%s', Python says '%.*s'", path, i, e->name, (int)nlen,
                  name);
        cr_assert_eq(e->method, method, "%s '%s': method", path, e->name);
        cr_assert_eq(e->flags, flags, "%s '%s': flags", path, e->name);
        cr_assert_eq(e->size, size, "%s '%s': size %llu, Python %llu", path, e->name,
                     (unsigned long long)e->size, size);
        cr_assert_eq(e->csize, csize, "%s '%s': csize", path, e->name);
        cr_assert_eq(e->data_offset, data, "%s '%s': data offset %llu, Python %llu", path,
                     e->name, (unsigned long long)e->data_offset, data);
        unsigned char b[8];
        size_t hn = unhex(head, b, sizeof b);
        cr_assert(e->data_offset + hn <= flen && memcmp(file + e->data_offset, b, hn) == 0,
                  "%s '%s': first bytes", path, e->name);
        size_t tn = unhex(tail, b, sizeof b);
        cr_assert(memcmp(file + e->data_offset + e->csize - tn, b, tn) == 0,
                  "%s '%s': last bytes", path, e->name);
        i++;
    }
    cr_assert_eq(i, z.nentries, "%s: Python lists %zu entries, the reader %zu", path, i,
                 z.nentries);
    free(listing);
    free(file);
    check_invariants(&z, flen);
    return i;
}

/* A temporary archive written by the Python code body, which has zf (a ZipFile open for
 * writing with allowZip64) and sys. */
static const char *py_zip(const char *body)
{
    const char *path = tmp_file("", 0);
    run_python(strf("import sys, zipfile\n"
                    "with zipfile.ZipFile(sys.argv[1], 'w', allowZip64=True) as zf:\n%s",
                    body),
               path, NULL);
    return path;
}

/* --- archives built byte by byte --------------------------------------------------------- */

enum { MAXF = 8 };

typedef struct zb_file {
    const char *name;       /* NUL-terminated unless name_len is set */
    size_t name_len;
    const char *data;       /* stored as is; len bytes */
    size_t len;
    uint16_t method, flags;
    uint64_t size;          /* uncompressed size when method != 0 */
    const char *lextra;     /* local extra field bytes */
    size_t lextra_len;
    const char *cextra;     /* central extra field bytes, after the zip64 one if any */
    size_t cextra_len;
    int zip64;              /* central sizes and offset 0xFFFFFFFF, true ones in a zip64 extra */
    int crc0;               /* write CRC 0, as torch may */
} zb_file;

typedef struct zb {
    unsigned char *b;
    size_t len, cap;
    size_t local[MAXF], central[MAXF]; /* where each file's headers are */
    size_t cd, cd_size, end64, loc64, end;
} zb;

static void put(zb *z, const void *p, size_t n)
{
    if (z->len + n > z->cap) {
        z->cap = (z->len + n) * 2 + 256;
        z->b = realloc(z->b, z->cap);
        cr_assert_not_null(z->b);
    }
    if (n)
        memcpy(z->b + z->len, p, n);
    z->len += n;
}

static void put_le(zb *z, uint64_t v, int bytes)
{
    unsigned char b[8];
    for (int i = 0; i < bytes; i++)
        b[i] = (unsigned char)(v >> 8 * i);
    put(z, b, (size_t)bytes);
}

/* Overwrites bytes at off with v, little-endian. */
static void set_le(zb *z, size_t off, uint64_t v, int bytes)
{
    cr_assert_leq(off + (size_t)bytes, z->len);
    for (int i = 0; i < bytes; i++)
        z->b[off + (size_t)i] = (unsigned char)(v >> 8 * i);
}

static uint32_t crc32(const char *p, size_t n)
{
    uint32_t c = 0xFFFFFFFF;
    for (size_t i = 0; i < n; i++) {
        c ^= (unsigned char)p[i];
        for (int k = 0; k < 8; k++)
            c = c >> 1 ^ (0xEDB88320 & -(c & 1));
    }
    return ~c;
}

static size_t name_len(const zb_file *f)
{
    return f->name_len ? f->name_len : strlen(f->name);
}

/* An archive of the n files; zip64_end adds the zip64 end record and locator. */
static zb zb_build(const zb_file *f, size_t n, int zip64_end, const char *comment)
{
    zb z = {0};
    cr_assert_leq(n, MAXF);
    for (size_t i = 0; i < n; i++) {
        z.local[i] = z.len;
        uint32_t crc = f[i].crc0 ? 0 : crc32(f[i].data, f[i].len);
        uint64_t size = f[i].method ? f[i].size : f[i].len;
        put_le(&z, 0x04034b50, 4);
        put_le(&z, 20, 2);
        put_le(&z, f[i].flags, 2);
        put_le(&z, f[i].method, 2);
        put_le(&z, 0, 4); /* time, date */
        put_le(&z, crc, 4);
        put_le(&z, f[i].len, 4);
        put_le(&z, size, 4);
        put_le(&z, name_len(&f[i]), 2);
        put_le(&z, f[i].lextra_len, 2);
        put(&z, f[i].name, name_len(&f[i]));
        put(&z, f[i].lextra, f[i].lextra_len);
        put(&z, f[i].data, f[i].len);
    }
    z.cd = z.len;
    for (size_t i = 0; i < n; i++) {
        z.central[i] = z.len;
        uint32_t crc = f[i].crc0 ? 0 : crc32(f[i].data, f[i].len);
        uint64_t size = f[i].method ? f[i].size : f[i].len;
        int x = f[i].zip64;
        put_le(&z, 0x02014b50, 4);
        put_le(&z, 45, 2);
        put_le(&z, 45, 2);
        put_le(&z, f[i].flags, 2);
        put_le(&z, f[i].method, 2);
        put_le(&z, 0, 4);
        put_le(&z, crc, 4);
        put_le(&z, x ? 0xFFFFFFFF : f[i].len, 4);
        put_le(&z, x ? 0xFFFFFFFF : size, 4);
        put_le(&z, name_len(&f[i]), 2);
        put_le(&z, (x ? 28 : 0) + f[i].cextra_len, 2);
        put_le(&z, 0, 2);     /* comment */
        put_le(&z, 0, 2);     /* disk */
        put_le(&z, 0, 2);     /* internal attributes */
        put_le(&z, 0, 4);     /* external attributes */
        put_le(&z, x ? 0xFFFFFFFF : z.local[i], 4);
        put(&z, f[i].name, name_len(&f[i]));
        if (x) {
            put_le(&z, 1, 2);
            put_le(&z, 24, 2);
            put_le(&z, size, 8);
            put_le(&z, f[i].len, 8);
            put_le(&z, z.local[i], 8);
        }
        put(&z, f[i].cextra, f[i].cextra_len);
    }
    z.cd_size = z.len - z.cd;
    if (zip64_end) {
        z.end64 = z.len;
        put_le(&z, 0x06064b50, 4);
        put_le(&z, 44, 8);
        put_le(&z, 45, 2);
        put_le(&z, 45, 2);
        put_le(&z, 0, 4);
        put_le(&z, 0, 4);
        put_le(&z, n, 8);
        put_le(&z, n, 8);
        put_le(&z, z.cd_size, 8);
        put_le(&z, z.cd, 8);
        z.loc64 = z.len;
        put_le(&z, 0x07064b50, 4);
        put_le(&z, 0, 4);
        put_le(&z, z.end64, 8);
        put_le(&z, 1, 4);
    }
    z.end = z.len;
    size_t clen = comment ? strlen(comment) : 0;
    put_le(&z, 0x06054b50, 4);
    put_le(&z, 0, 2);
    put_le(&z, 0, 2);
    put_le(&z, zip64_end ? 0xFFFF : n, 2);
    put_le(&z, zip64_end ? 0xFFFF : n, 2);
    put_le(&z, zip64_end ? 0xFFFFFFFF : z.cd_size, 4);
    put_le(&z, zip64_end ? 0xFFFFFFFF : z.cd, 4);
    put_le(&z, clen, 2);
    put(&z, comment, clen);
    return z;
}

static const char *zb_path(zb *z)
{
    const char *path = tmp_file(z->b, z->len);
    free(z->b);
    z->b = NULL;
    return path;
}

/* Three small stored files; the last has a torch-style "FB" padding field in its local header
 * only, so that its data starts at a multiple of 64. */
static const zb_file THREE[] = {
    {.name = "archive/data.pkl", .data = "\x80\x02}q\x00.", .len = 6},
    {.name = "archive/data/0", .data = "0123456789abcdef", .len = 16},
    {.name = "archive/version", .data = "3\n", .len = 2,
     .lextra = "FB\x0b\x00ZZZZZZZZZZZ", .lextra_len = 15},
};

static zb three(int zip64_end)
{
    return zb_build(THREE, 3, zip64_end, NULL);
}

/* Where in a built archive a patch goes. */
enum at { END, END64, LOC64, CENTRAL0, CENTRAL1, CENTRAL2, LOCAL0, LOCAL1, LOCAL2 };

/* Overwrites the bytes-byte field at offset rel of the structure a of z with v. */
static void patch(zb *z, enum at a, size_t rel, uint64_t v, int bytes)
{
    size_t base = a == END ? z->end : a == END64 ? z->end64 : a == LOC64 ? z->loc64
                : a <= CENTRAL2 ? z->central[a - CENTRAL0] : z->local[a - LOCAL0];
    set_le(z, base + rel, v, bytes);
}

/* THREE (with zip64 end records or not), with one field patched. */
static const char *three_patched(int zip64_end, enum at a, size_t rel, uint64_t v, int bytes)
{
    zb z = three(zip64_end);
    patch(&z, a, rel, v, bytes);
    return zb_path(&z);
}

/* ===================================================================================== */

Test(zip_probe, local_header_signature)
{
    cr_assert(zip_probe((const unsigned char *)"PK\3\4\x14\0", 6));
    cr_assert(zip_probe((const unsigned char *)"PK\3\4", 4));
    cr_assert_not(zip_probe((const unsigned char *)"PK\3", 3));
    cr_assert_not(zip_probe((const unsigned char *)"PK\5\6\0\0", 6), "an empty archive");
    cr_assert_not(zip_probe((const unsigned char *)"PK\1\2\0\0", 6));
    cr_assert_not(zip_probe((const unsigned char *)"\x80\x02}q", 4), "a legacy torch file");
    cr_assert_not(zip_probe((const unsigned char *)"", 0));
}

/* --- written by Python's zipfile ------------------------------------------------------ */

Test(zip_python, stored_entries)
{
    const char *path = py_zip("    zf.writestr('a/data.pkl', b'\\x80\\x02}q\\x00.')\n"
                              "    zf.writestr('a/data/0', bytes(range(256)) * 3)\n"
                              "    zf.writestr('a/empty', b'')\n"
                              "    zf.writestr('a/dir/', b'')\n"
                              "    zf.writestr('a/\\u00e9t\\u00e9/\\u4e2d', b'unicode name')\n"
                              "    zf.writestr('Z-before-a', b'upper case sorts first')\n");
    cr_assert_eq(check_like_python(path), 6);
}

Test(zip_python, finds_by_exact_name)
{
    const char *path = py_zip("    for n in ['b', 'a', 'ab', 'a/b', 'a0', 'aa', 'c/', 'c']:\n"
                              "        zf.writestr(n, n.encode())\n");
    zip_archive z = read_ok(path);
    cr_assert_eq(z.nentries, 8);
    const zip_entry *e = zip_find(&z, "ab", 2);
    cr_assert(e && strcmp(e->name, "ab") == 0 && e->size == 2);
    cr_assert_eq(zip_find(&z, "abc", 2), e, "only len bytes of the name count");
    cr_assert_null(zip_find(&z, "a/", 2));
    cr_assert_null(zip_find(&z, "", 0));
    cr_assert_null(zip_find(&z, "ba", 2));
    cr_assert_null(zip_find(&z, "c//", 3));
    cr_assert_not_null(zip_find(&z, "c/", 2));
    check_invariants(&z, size_of(path));
}

Test(zip_python, comment_of_every_length)
{
    /* The longest comment puts the record at the very start of the 65557 bytes searched; 490
     * and 491 bytes at the start of, and just before, the 512 searched first. */
    const char *bodies[] = {"b''", "b'x'", "b'c' * 490", "b'c' * 491", "b'c' * 1000",
                            "b'c' * 65534", "b'c' * 65535"};
    for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) {
        const char *path = py_zip(strf("    zf.writestr('x', b'data')\n"
                                       "    zf.writestr('y', b'more data')\n"
                                       "    zf.comment = %s\n", bodies[i]));
        cr_assert_eq(check_like_python(path), 2, "comment %s", bodies[i]);
    }
}

/* The archive at path with comment (len bytes) added; the archive had none. */
static const char *with_comment(const char *path, const char *comment, size_t len)
{
    size_t n;
    unsigned char *b = read_whole(path, &n);
    cr_assert(n >= 22 && memcmp(b + n - 22, "PK\5\6", 4) == 0 && b[n - 2] == 0 && b[n - 1] == 0);
    b = realloc(b, n + len);
    cr_assert_not_null(b);
    memcpy(b + n, comment, len);
    b[n - 2] = (unsigned char)len;
    b[n - 1] = (unsigned char)(len >> 8);
    const char *out = tmp_file(b, n + len);
    free(b);
    return out;
}

Test(zip_python, comment_holding_the_record_signature)
{
    /* Python's zipfile takes the last "PK\5\6" in the file for the record, so it cannot read
     * these: the same archive without the comment, which it reads, is the reference. */
    static char sigs[65535], fake[22] = "PK\5\6";
    for (size_t i = 0; i < sizeof sigs; i++)
        sigs[i] = "PK\5\6"[i % 4];
    fake[20] = 5; /* a record whose comment would run 5 bytes past the end */
    const char *bodies[] = {"    zf.writestr('x', b'data')\n    zf.writestr('y', b'more')\n",
                            "    zf.writestr('big', bytes(200000))\n"};
    for (size_t i = 0; i < 2; i++) {
        const char *plain = py_zip(bodies[i]);
        check_like_python(plain);
        const char *variants[] = {with_comment(plain, sigs, sizeof sigs),
                                  with_comment(plain, sigs, 1001),
                                  with_comment(plain, fake, sizeof fake)};
        for (size_t k = 0; k < 3; k++) {
            zip_archive a = read_ok(plain), b = read_ok(variants[k]);
            cr_assert_eq(a.nentries, b.nentries);
            for (size_t e = 0; e < a.nentries; e++) {
                const zip_entry *x = &a.entries[e], *y = &b.entries[e];
                cr_assert(strcmp(x->name, y->name) == 0 && x->data_offset == y->data_offset &&
                          x->size == y->size && x->csize == y->csize, "variant %zu", k);
            }
            zip_free(&a);
            zip_free(&b);
        }
    }
}

Test(zip_python, forced_zip64_local_headers)
{
    /* force_zip64 gives each local header a zip64 extra field the central directory lacks. */
    const char *path = py_zip("    for n in ['x.npy', 'y/z.npy', 'w']:\n"
                              "        with zf.open(n, 'w', force_zip64=True) as f:\n"
                              "            f.write(n.encode() * 50)\n");
    size_t flen;
    unsigned char *b = read_whole(path, &flen);
    cr_assert_eq(b[28] | b[29] << 8, 20, "the first local extra is not a zip64 one");
    free(b);
    cr_assert_eq(check_like_python(path), 3);
}

Test(zip_python, deflated_entries_are_reported_as_such)
{
    const char *path = py_zip("    zf.writestr('stored', b'abc' * 100)\n"
                              "    zf.writestr('deflated', b'abc' * 1000, zipfile.ZIP_DEFLATED)\n"
                              "    zf.writestr('bzip2', b'abc' * 1000, zipfile.ZIP_BZIP2)\n");
    cr_assert_eq(check_like_python(path), 3);
    zip_archive z = read_ok(path);
    const zip_entry *e = zip_find(&z, "deflated", 8);
    cr_assert(e && e->method == 8 && e->size == 3000 && e->csize < 3000);
    e = zip_find(&z, "bzip2", 5);
    cr_assert(e && e->method == 12);
    zip_free(&z);
}

Test(zip_python, empty_archive)
{
    cr_assert_eq(check_like_python(py_zip("    pass\n")), 0);
}

Test(zip_python, exactly_65535_entries_without_zip64)
{
    /* 0xFFFF entries fit the plain record: Python writes no zip64 record for them. */
    const char *path = py_zip("    for i in range(65535):\n"
                              "        zf.writestr('e%d' % i, b'')\n");
    size_t flen;
    unsigned char *b = read_whole(path, &flen);
    cr_assert_neq(memcmp(b + flen - 42, "PK\6\7", 4), 0, "Python wrote a zip64 locator");
    free(b);
    cr_assert_eq(check_like_python(path), 65535);
}

Test(zip_python, hundred_thousand_entries_with_zip64_end, .timeout = 120)
{
    const char *path = py_zip("    for i in range(100000):\n"
                              "        zf.writestr('archive/data/%d' % i, bytes(i % 7))\n");
    size_t flen;
    unsigned char *b = read_whole(path, &flen);
    cr_assert_eq(memcmp(b + flen - 42, "PK\6\7", 4), 0, "Python wrote no zip64 locator");
    free(b);
    zip_archive z;
    ck_error err;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cr_assert_eq(read_dir_sized(path, -1, &z, &err), 0, "%s", err.msg);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    /* A few hundredths of a second when linear (more under sanitizers); quadratic work on
     * 100,000 entries would take minutes. */
    cr_assert_lt(s, 5.0, "reading 100,000 entries took %.2f s", s);
    cr_assert_eq(z.nentries, 100000);
    zip_free(&z);
    cr_assert_eq(check_like_python(path), 100000);
}

/* --- written by torch.save ------------------------------------------------------------- */

Test(zip_torch, state_dict, .timeout = 120)
{
    const char *dir = tmp_dir();
    const char *path = tmp_path_in(dir, "model.pt");
    run_python("import sys, torch\n"
               "torch.manual_seed(0)\n"
               "sd = {'w%d' % i: torch.randn(i + 1, 3) for i in range(40)}\n"
               "sd['half'] = torch.ones(5, dtype=torch.float16)\n"
               "sd['empty'] = torch.zeros(0)\n"
               "torch.save(sd, sys.argv[1])\n",
               path, NULL);
    /* 42 storages, data.pkl, version and whatever else this torch writes. */
    cr_assert_geq(check_like_python(path), 44);
}

Test(zip_torch, data_is_aligned_and_prefixed_by_the_stem, .timeout = 120)
{
    const char *dir = tmp_dir();
    const char *path = tmp_path_in(dir, "ckpt.pth");
    run_python("import sys, torch\n"
               "torch.save({'a': torch.arange(1000), 'b': [torch.ones(3), torch.ones(7)]},\n"
               "           sys.argv[1])\n",
               path, NULL);
    check_like_python(path);
    zip_archive z = read_ok(path);
    cr_assert_not_null(zip_find(&z, "ckpt/data.pkl", 13));
    size_t storages = 0;
    for (size_t i = 0; i < z.nentries; i++) {
        const zip_entry *e = &z.entries[i];
        cr_assert_eq(strncmp(e->name, "ckpt/", 5), 0, "%s", e->name);
        cr_assert_eq(e->method, 0);
        if (strncmp(e->name, "ckpt/data/", 10) == 0) {
            storages++;
            cr_assert_eq(e->data_offset % 64, 0, "%s at %llu", e->name,
                         (unsigned long long)e->data_offset);
        }
    }
    cr_assert_eq(storages, 3);
    zip_free(&z);
}

/* --- the corpus ------------------------------------------------------------------------ */

static void corpus_like_python(const char *name, size_t entries)
{
    const char *path = strf(CORPUS "%s", name);
    if (access(path, R_OK) != 0)
        CANNOT_RUN_HERE("%s is not here", path);
    unsigned char head[4];
    size_t flen;
    unsigned char *b = read_whole(path, &flen);
    memcpy(head, b, 4);
    free(b);
    cr_assert(zip_probe(head, 4), "%s", path);
    cr_assert_eq(check_like_python(path), entries, "%s", path);
}

Test(zip_corpus, candle_test_pt) { corpus_like_python("candle_test.pt", 5); }
Test(zip_corpus, candle_test_with_key_pt) { corpus_like_python("candle_test_with_key.pt", 5); }
Test(zip_corpus, candle_fortran_pth) { corpus_like_python("candle_fortran_tensor_3d.pth", 5); }
Test(zip_corpus, tinypellm_bin) { corpus_like_python("tinypellm_pytorch_model.bin", 27); }
Test(zip_corpus, candle_npz_zip64_local_extras)
{
    corpus_like_python("candle_test.npz", 2);
}

Test(zip_corpus, whisper_npz_deflated)
{
    corpus_like_python("whisper_mel_filters.npz", 2);
    zip_archive z = read_ok(CORPUS "whisper_mel_filters.npz");
    for (size_t i = 0; i < z.nentries; i++)
        cr_assert_eq(z.entries[i].method, 8, "%s", z.entries[i].name);
    zip_free(&z);
}

Test(zip_corpus, other_formats_are_not_zip)
{
    const char *names[] = {"graykode_mnist_cnn_legacy.pt", "candle_test.npy",
                           "peft_gpt2_adapter_model.safetensors",
                           "ollama_llama2_tiny_random.gguf",
                           "safetensors_cpp_abuse_attempt_1.safetensors"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const char *path = strf(CORPUS "%s", names[i]);
        if (access(path, R_OK) != 0)
            continue;
        size_t flen;
        unsigned char *b = read_whole(path, &flen);
        cr_assert_not(zip_probe(b, flen), "%s", path);
        free(b);
        read_fails(path, "no end-of-central-directory record");
    }
}

/* --- built byte by byte ----------------------------------------------------------------- */

Test(zip_built, local_extra_differs_from_central)
{
    zb z = three(0);
    size_t want = z.local[2] + 30 + strlen(THREE[2].name) + 15;
    const char *path = zb_path(&z);
    check_like_python(path);
    zip_archive a = read_ok(path);
    cr_assert_eq(a.entries[2].data_offset, want);
    zip_free(&a);
}

Test(zip_built, zip64_everywhere)
{
    zb_file f[3];
    memcpy(f, THREE, sizeof f);
    for (int i = 0; i < 3; i++)
        f[i].zip64 = 1;
    zb z = zb_build(f, 3, 1, "with a comment");
    size_t want[3];
    for (int i = 0; i < 3; i++)
        want[i] = z.local[i] + 30 + strlen(f[i].name) + f[i].lextra_len;
    const char *path = zb_path(&z);
    check_like_python(path);
    zip_archive a = read_ok(path);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(a.entries[i].data_offset, want[i]);
        cr_assert_eq(a.entries[i].size, f[i].len);
        cr_assert_eq(a.entries[i].csize, f[i].len);
    }
    zip_free(&a);
}

Test(zip_built, zip64_extra_with_only_some_fields)
{
    /* Only the local header offset reads 0xFFFFFFFF: the extra holds that one value. */
    zb_file f[1] = {{.name = "x", .data = "hello", .len = 5,
                     .cextra = "\x01\x00\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00",
                     .cextra_len = 12}};
    zb z = zb_build(f, 1, 0, NULL);
    set_le(&z, z.central[0] + 42, 0xFFFFFFFF, 4);
    const char *path = zb_path(&z);
    check_like_python(path);
}

Test(zip_built, zip64_extra_with_disk_number)
{
    zb_file f[1] = {{.name = "x", .data = "hello", .len = 5,
                     .cextra = "\x01\x00\x04\x00\x00\x00\x00\x00", .cextra_len = 8}};
    zb z = zb_build(f, 1, 0, NULL);
    set_le(&z, z.central[0] + 34, 0xFFFF, 2);
    zip_archive a = read_ok(zb_path(&z));
    cr_assert_eq(a.entries[0].data_offset, 31);
    zip_free(&a);
}

Test(zip_built, other_extra_fields_and_short_leftovers)
{
    /* An unknown field, then 3 bytes too few for a field header: ignored, as Python does. */
    zb_file f[1] = {{.name = "x", .data = "hello", .len = 5,
                     .cextra = "\x55\x54\x05\x00\x01\x02\x03\x04\x05\x99\x99\x99",
                     .cextra_len = 12}};
    zb z = zb_build(f, 1, 1, NULL);
    zip_archive a = read_ok(zb_path(&z));
    cr_assert_eq(a.nentries, 1);
    cr_assert_eq(a.entries[0].data_offset, 31);
    zip_free(&a);
}

Test(zip_built, crc_zero_is_accepted)
{
    zb_file f[2] = {{.name = "a", .data = "abc", .len = 3, .crc0 = 1},
                    {.name = "b", .data = "", .len = 0, .crc0 = 1}};
    zb z = zb_build(f, 2, 1, NULL);
    size_t want = z.local[1] + 31;
    zip_archive a = read_ok(zb_path(&z));
    cr_assert_eq(a.nentries, 2);
    cr_assert_eq(a.entries[1].data_offset, want);
    cr_assert_eq(a.entries[1].size, 0);
    zip_free(&a);
}

Test(zip_built, data_descriptor_flag_and_unknown_method_are_the_callers_business)
{
    zb_file f[2] = {{.name = "a", .data = "abc", .len = 3, .flags = 0x0808},
                    {.name = "b", .data = "zzzz", .len = 4, .method = 99, .size = 1000}};
    zb z = zb_build(f, 2, 0, NULL);
    zip_archive a = read_ok(zb_path(&z));
    cr_assert_eq(a.entries[0].flags, 0x0808);
    cr_assert_eq(a.entries[1].method, 99);
    cr_assert_eq(a.entries[1].size, 1000);
    cr_assert_eq(a.entries[1].csize, 4);
    zip_free(&a);
}

Test(zip_built, names_are_bytes)
{
    zb_file f[4] = {{.name = "\xff"}, {.name = "a"}, {.name = "\x80z"}, {.name = "\x80"}};
    zb z = zb_build(f, 4, 0, NULL);
    const char *path = zb_path(&z);
    zip_archive a = read_ok(path);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(zip_find(&a, f[i].name, strlen(f[i].name)), &a.entries[i]);
    cr_assert_null(zip_find(&a, "\x80y", 2));
    check_invariants(&a, size_of(path));
}

/* --- the end records ------------------------------------------------------------------- */

Test(zip_end, too_short_for_a_record)
{
    read_fails(tmp_file("PK\3\4\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 21),
               "file is 21 bytes, too short for a zip archive (needs 22)");
    read_fails(tmp_file("", 0), "file is 0 bytes, too short");
}

Test(zip_end, no_record)
{
    char b[5000];
    fill_bytes(b, sizeof b, 7);
    memcpy(b, "PK\3\4", 4);
    read_fails(tmp_file(b, sizeof b), "no end-of-central-directory record in the last 5000 "
               "bytes");
}

Test(zip_end, data_after_the_archive)
{
    zb z = three(0);
    put(&z, "!", 1);
    read_fails(zb_path(&z), strf("end-of-central-directory record says its comment is 0 bytes, "
                                 "but 1 bytes follow it: truncated, or data after the archive "
                                 "(offset %zu)", z.end));
}

Test(zip_end, comment_cut_short)
{
    zb z = zb_build(THREE, 3, 0, "a comment");
    z.len -= 3;
    read_fails(zb_path(&z), "says its comment is 9 bytes, but 6 bytes follow it");
}

Test(zip_end, multi_disk)
{
    read_fails(three_patched(0, END, 4, 1, 2), "multi-disk (split) archives are not supported");
    read_fails(three_patched(0, END, 6, 1, 2), "multi-disk");
    read_fails(three_patched(1, LOC64, 4, 1, 4), "zip64 end-of-central-directory locator says "
               "the archive spans several disks");
    read_fails(three_patched(1, LOC64, 16, 2, 4), "spans several disks");
    read_fails(three_patched(1, END64, 16, 1, 4), "zip64 end-of-central-directory record says "
               "the archive spans several disks");
    read_fails(three_patched(1, END64, 20, 3, 4), "spans several disks");
    /* Writers that put 0 in the locator's disk total are fine. */
    zip_archive a = read_ok(three_patched(1, LOC64, 16, 0, 4));
    zip_free(&a);
}

Test(zip_end, counts_disagree)
{
    read_fails(three_patched(0, END, 8, 2, 2), "counts 2 entries on this disk but 3 in all");
    read_fails(three_patched(1, END64, 24, 2, 8), "zip64 end-of-central-directory record counts "
               "2 entries on this disk but 3 in all");
}

Test(zip_end, count_too_small)
{
    zb z = three(0);
    patch(&z, END, 8, 2, 2);
    patch(&z, END, 10, 2, 2);
    size_t left = z.cd_size - (z.central[2] - z.cd);
    read_fails(zb_path(&z), strf("central directory holds %zu bytes after its 2 entries: the "
                                 "end record's count or size is wrong (offset %zu)", left,
                                 z.central[2]));
}

Test(zip_end, count_too_large_for_the_size)
{
    zb z = three(0);
    patch(&z, END, 8, 4, 2);
    patch(&z, END, 10, 4, 2);
    read_fails(zb_path(&z), strf("central directory of %zu bytes is too small for 4 entries",
                                 z.cd_size));
}

Test(zip_end, count_too_large_for_the_headers)
{
    char name[3][120];
    zb_file f[3];
    for (int i = 0; i < 3; i++) {
        memset(name[i], 'a' + i, sizeof name[i] - 1);
        name[i][sizeof name[i] - 1] = 0;
        f[i] = (zb_file){.name = name[i], .data = "x", .len = 1};
    }
    zb z = zb_build(f, 3, 1, NULL);
    patch(&z, END64, 24, 4, 8);
    patch(&z, END64, 32, 4, 8);
    read_fails(zb_path(&z), strf("central directory entry 3 is truncated: 0 bytes left of the "
                                 "46 it needs (offset %zu)", z.cd + z.cd_size));
}

Test(zip_end, count_over_the_limit)
{
    zb z = three(1);
    patch(&z, END64, 24, ZIP_MAX_ENTRIES + 1ull, 8);
    patch(&z, END64, 32, ZIP_MAX_ENTRIES + 1ull, 8);
    read_fails(zb_path(&z), strf("archive claims %llu entries, more than the limit of %u",
                                 ZIP_MAX_ENTRIES + 1ull, ZIP_MAX_ENTRIES));
    zb y = three(1);
    patch(&y, END64, 24, UINT64_MAX, 8);
    patch(&y, END64, 32, UINT64_MAX, 8);
    read_fails(zb_path(&y), "more than the limit");
}

Test(zip_end, directory_size_lies)
{
    zb z = three(0);
    read_fails(three_patched(0, END, 12, z.cd_size + 1, 4),
               strf("central directory (%zu bytes at offset %zu) runs past the end record at "
                    "offset %zu", z.cd_size + 1, z.cd, z.end));
    read_fails(three_patched(0, END, 12, z.cd_size - 1, 4), "central directory entry 2: name, "
               "extra field and comment (15 + 0 + 0 bytes) run past the end of the central "
               "directory");
    read_fails(three_patched(0, END, 12, z.cd_size - 40, 4), "central directory entry 2 is "
               "truncated: 21 bytes left of the 46 it needs");
    read_fails(three_patched(1, END64, 40, UINT64_MAX, 8), "runs past the end record");
    read_fails(three_patched(1, END64, 40, 0, 8), "central directory of 0 bytes is too small "
               "for 3 entries");
    free(z.b);
}

Test(zip_end, directory_offset_lies)
{
    zb z = three(0);
    read_fails(three_patched(0, END, 16, z.cd + 1, 4), "runs past the end record");
    read_fails(three_patched(0, END, 16, z.cd - 1, 4), strf("central directory entry 0 has "
               "signature 0x%02x4b50%02x, not 0x02014b50 (offset %zu)", 1, THREE[2].data[1],
               z.cd - 1));
    read_fails(three_patched(0, END, 16, 0xFFFFFFF0, 4),
               strf("(%zu bytes at offset 4294967280) runs past", z.cd_size));
    read_fails(three_patched(1, END64, 48, 1ull << 63, 8), "runs past the end record");
    read_fails(three_patched(1, END64, 48, 0, 8), "central directory entry 0 has signature "
               "0x04034b50");
    free(z.b);
}

Test(zip_end, zip64_sentinel_without_locator)
{
    read_fails(three_patched(0, END, 16, 0xFFFFFFFF, 4), "end-of-central-directory record "
               "defers to a zip64 record, but no zip64 end-of-central-directory locator "
               "precedes it");
    read_fails(three_patched(0, END, 12, 0xFFFFFFFF, 4), "no zip64 end-of-central-directory "
               "locator");
}

Test(zip_end, record_disagrees_with_zip64_record)
{
    read_fails(three_patched(1, END, 10, 2, 2), "end-of-central-directory record (2 entries, "
               "central directory of 4294967295 bytes at offset 4294967295) disagrees with the "
               "zip64 record (3 entries");
    read_fails(three_patched(1, END, 12, 100, 4), "disagrees with the zip64 record");
    read_fails(three_patched(1, END, 16, 0, 4), "disagrees with the zip64 record");
    read_fails(three_patched(1, END, 8, 4, 2), "disagrees with the zip64 record");
    /* Values that agree, as torch writes them, are fine. */
    zb z = three(1);
    patch(&z, END, 8, 3, 2);
    patch(&z, END, 10, 3, 2);
    patch(&z, END, 12, z.cd_size, 4);
    patch(&z, END, 16, z.cd, 4);
    check_like_python(zb_path(&z));
}

Test(zip_end, zip64_locator_points_outside)
{
    zb z = three(1);
    read_fails(three_patched(1, LOC64, 8, 1ull << 62, 8), strf("zip64 end-of-central-directory "
               "locator points to offset %llu, but the 56-byte record must lie before the "
               "locator at offset %zu", 1ull << 62, z.loc64));
    read_fails(three_patched(1, LOC64, 8, UINT64_MAX, 8), "locator points to offset");
    read_fails(three_patched(1, LOC64, 8, z.loc64, 8), "locator points to offset");
    read_fails(three_patched(1, LOC64, 8, z.end64 + 1, 8), "locator points to offset");
    read_fails(three_patched(1, LOC64, 8, 0, 8), strf("no zip64 end-of-central-directory record "
               "where the locator at offset %zu points (offset 0)", z.loc64));
    read_fails(three_patched(1, LOC64, 8, z.end64 - 1, 8), "no zip64 end-of-central-directory "
               "record where the locator");
    free(z.b);
}

Test(zip_end, zip64_record_size_lies)
{
    read_fails(three_patched(1, END64, 4, 45, 8), "zip64 end-of-central-directory record says "
               "it is 45 bytes after its first 12; it needs 44 and has 44 before the locator");
    read_fails(three_patched(1, END64, 4, 43, 8), "says it is 43 bytes");
    read_fails(three_patched(1, END64, 4, UINT64_MAX, 8), "zip64 end-of-central-directory "
               "record says it is 18446744073709551615 bytes");
}

/* --- central directory headers ------------------------------------------------------------- */

Test(zip_central, bad_signature)
{
    zb z = three(0);
    read_fails(three_patched(0, CENTRAL1, 0, 0x02014b51, 4), strf("central directory entry 1 "
               "has signature 0x02014b51, not 0x02014b50 (offset %zu)", z.central[1]));
    free(z.b);
}

Test(zip_central, name_with_nul)
{
    zb_file f[2] = {{.name = "ok", .data = "a", .len = 1},
                    {.name = "bad\0name", .name_len = 8, .data = "b", .len = 1}};
    zb z = zb_build(f, 2, 0, NULL);
    read_fails(zb_path(&z), "central directory entry 1: name 'bad' holds a NUL byte");
}

Test(zip_central, encrypted)
{
    read_fails(three_patched(0, CENTRAL1, 8, 0x0001, 2), "entry 'archive/data/0' is encrypted, "
               "which is not supported (central directory entry 1");
    read_fails(three_patched(0, CENTRAL0, 8, 0x0041, 2), "entry 'archive/data.pkl' is "
               "encrypted");
}

Test(zip_central, duplicate_names)
{
    zb_file f[4] = {{.name = "b"}, {.name = "same", .data = "1", .len = 1}, {.name = "a"},
                    {.name = "same", .data = "2", .len = 1}};
    zb z = zb_build(f, 4, 0, NULL);
    read_fails(zb_path(&z), "duplicate entry name 'same' (central directory entries 1 and 3)");
}

Test(zip_central, extra_field_runs_past_its_header)
{
    zb_file f[1] = {{.name = "x", .data = "hello", .len = 5,
                     .cextra = "\x55\x54\x10\x00" "abc", .cextra_len = 7}};
    zb z = zb_build(f, 1, 0, NULL);
    read_fails(zb_path(&z), "entry 'x': extra field 0x5455 of 16 bytes runs 13 bytes past the "
               "end of its header (central directory entry 0 at offset");
    /* The header's own extra length runs past the central directory. */
    read_fails(three_patched(0, CENTRAL2, 30, 1000, 2), "central directory entry 2: name, extra "
               "field and comment (15 + 1000 + 0 bytes) run past the end of the central "
               "directory");
    read_fails(three_patched(0, CENTRAL0, 32, 0xFFFF, 2), "(16 + 0 + 65535 bytes) run past");
}

Test(zip_central, zip64_extra_too_short)
{
    zb_file f[1] = {{.name = "x", .data = "hello", .len = 5,
                     .cextra = "\x01\x00\x08\x00\x05\x00\x00\x00\x00\x00\x00\x00",
                     .cextra_len = 12}};
    zb z = zb_build(f, 1, 0, NULL);
    patch(&z, CENTRAL0, 20, 0xFFFFFFFF, 4);
    patch(&z, CENTRAL0, 24, 0xFFFFFFFF, 4);
    read_fails(zb_path(&z), "entry 'x': zip64 extra field is 8 bytes, the fields it replaces "
               "need 16 (central directory entry 0 at offset 36)");
    zb y = zb_build(f, 1, 0, NULL);
    patch(&y, CENTRAL0, 34, 0xFFFF, 2);
    patch(&y, CENTRAL0, 42, 0xFFFFFFFF, 4);
    read_fails(zb_path(&y), "zip64 extra field is 8 bytes, the fields it replaces need 12");
}

Test(zip_central, two_zip64_extras)
{
    zb_file f[1] = {{.name = "x", .data = "hello", .len = 5, .zip64 = 1,
                     .cextra = "\x01\x00\x00\x00", .cextra_len = 4}};
    zb z = zb_build(f, 1, 0, NULL);
    read_fails(zb_path(&z), "entry 'x' has two zip64 extra fields");
}

Test(zip_central, sentinel_without_zip64_extra_is_taken_literally)
{
    /* 0xFFFFFFFF with no zip64 extra is a size like any other, here one past the file. */
    read_fails(three_patched(0, CENTRAL1, 42, 0xFFFFFFFF, 4), "entry 'archive/data/0': local "
               "header at offset 4294967295 does not lie before the central directory");
}

Test(zip_central, starts_on_another_disk)
{
    read_fails(three_patched(0, CENTRAL1, 34, 2, 2), "entry 'archive/data/0' starts on disk 2; "
               "multi-disk (split) archives are not supported");
}

Test(zip_central, stored_sizes_differ)
{
    read_fails(three_patched(0, CENTRAL1, 24, 17, 4), "entry 'archive/data/0' is stored (not "
               "compressed) but its sizes differ: 17 bytes, 16 in the archive");
}

Test(zip_central, long_names_are_cut_in_messages)
{
    char name[1001];
    memset(name, 'n', 1000);
    name[1000] = 0;
    zb_file f[1] = {{.name = name, .data = "x", .len = 1, .flags = 1}};
    zb z = zb_build(f, 1, 0, NULL);
    const char *path = zb_path(&z);
    zip_archive a;
    ck_error err;
    cr_assert_eq(read_dir_sized(path, -1, &a, &err), -1);
    assert_error(&err, path, strf("entry '%.200s' is encrypted", name));
}

/* --- local headers --------------------------------------------------------------------- */

Test(zip_local, offset_past_the_directory)
{
    zb z = three(0);
    read_fails(three_patched(0, CENTRAL1, 42, 0x7FFFFFFF, 4), strf("entry 'archive/data/0': "
               "local header at offset 2147483647 does not lie before the central directory "
               "at offset %zu (central directory entry 1)", z.cd));
    read_fails(three_patched(0, CENTRAL1, 42, z.cd, 4), "does not lie before the central");
    read_fails(three_patched(0, CENTRAL1, 42, z.cd - 29, 4), "does not lie before the central");
    zb_file f[1] = {{.name = "x", .data = "hello", .len = 5, .zip64 = 1}};
    zb w = zb_build(f, 1, 1, NULL);
    set_le(&w, w.central[0] + 46 + 1 + 4 + 16, 1ull << 60, 8);
    read_fails(zb_path(&w), "entry 'x': local header at offset 1152921504606846976 does not "
               "lie before the central directory");
    free(z.b);
}

Test(zip_local, bad_signature)
{
    zb z = three(0);
    read_fails(three_patched(0, CENTRAL1, 42, z.local[1] + 2, 4), strf("entry 'archive/data/0'"
               ": local header has signature 0x00140403, not 0x04034b50 (offset %zu)",
               z.local[1] + 2));
    read_fails(three_patched(0, LOCAL2, 0, 0x08074b50, 4), "entry 'archive/version': local "
               "header has signature 0x08074b50");
    free(z.b);
}

Test(zip_local, name_length_differs)
{
    read_fails(three_patched(0, LOCAL1, 26, 13, 2), "entry 'archive/data/0': local header "
               "names 13 bytes, the central directory 14");
}

Test(zip_local, data_runs_past_the_directory)
{
    zb z = three(0);
    size_t data1 = z.local[1] + 30 + 14;
    zb y = three(0);
    patch(&y, CENTRAL1, 20, 1000, 4);
    patch(&y, CENTRAL1, 24, 1000, 4);
    read_fails(zb_path(&y), strf("entry 'archive/data/0': data (1000 bytes at offset %zu) runs "
                                 "past the central directory at offset %zu (local header at "
                                 "offset %zu)", data1, z.cd, z.local[1]));
    read_fails(three_patched(0, LOCAL2, 28, 0xFFFF, 2), "entry 'archive/version': data (2 bytes "
               "at offset");
    /* One byte too many for the last entry, whose data ends where the directory starts. */
    zb x = three(0);
    patch(&x, CENTRAL2, 20, 3, 4);
    patch(&x, CENTRAL2, 24, 3, 4);
    read_fails(zb_path(&x), "entry 'archive/version': data (3 bytes at offset");
    free(z.b);
}

Test(zip_local, file_shorter_than_the_caller_says)
{
    zb z = three(0);
    size_t len = z.len;
    const char *path = zb_path(&z);
    read_fails_sized(path, (long long)len + 100, "cannot read the last");
}

/* Local headers are fetched in batches (headers a page or less apart in one read, at most
 * 1 MiB a read); each must still be checked against its own central directory entry. This
 * archive, written by Python, has 3,000 small records (all in batches), records after gaps of
 * 5,000 bytes (each read alone) and of 1.5 MiB (past a read's window), and its central
 * directory in reverse file order. */
static const char *many_headers(void)
{
    return py_zip("    for i in range(3000):\n"
                  "        zf.writestr('archive/data/%d' % i, bytes(64))\n"
                  "        if i % 1000 == 500:\n"
                  "            zf.writestr('archive/gap/%d' % i, bytes(5000))\n"
                  "        if i % 1000 == 999:\n"
                  "            zf.writestr('archive/big/%d' % i, bytes(3 << 19))\n"
                  "    zf.filelist.reverse()\n");
}

/* name's local header offset in the archive at path, as Python's zipfile reads it. */
static size_t local_offset(const char *path, const char *name)
{
    const char *out = run_python("import sys, zipfile\n"
                                 "print(zipfile.ZipFile(sys.argv[1]).getinfo(sys.argv[2])"
                                 ".header_offset)\n", path, name, NULL);
    return (size_t)strtoull(out, NULL, 10);
}

/* A copy of the archive at path with the 2-byte field at offset at + rel set to v. */
static const char *patched_copy(const char *path, size_t at, size_t rel, uint16_t v)
{
    size_t len;
    unsigned char *b = read_whole(path, &len);
    cr_assert_lt(at + rel + 2, len);
    b[at + rel] = (unsigned char)v;
    b[at + rel + 1] = (unsigned char)(v >> 8);
    const char *copy = tmp_file(b, len);
    free(b);
    return copy;
}

Test(zip_local, batched_headers_read_like_python, .timeout = 60)
{
    cr_assert_eq(check_like_python(many_headers()), 3000 + 3 + 3);
}

Test(zip_local, batched_headers_are_each_checked, .timeout = 60)
{
    const char *path = many_headers();
    /* The first and last record, one inside a batch, the ones after each gap, and the record
     * on each side of a big one. */
    static const char *const names[] = {
        "archive/data/0", "archive/data/1234", "archive/gap/500", "archive/data/501",
        "archive/data/999", "archive/big/999", "archive/data/1000", "archive/data/2999",
    };
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        size_t at = local_offset(path, names[k]), len = strlen(names[k]);
        read_fails(patched_copy(path, at, 26, (uint16_t)(len + 1)),
                   strf("entry '%s': local header names %zu bytes, the central directory %zu "
                        "(offset %zu)", names[k], len + 1, len, at));
        read_fails(patched_copy(path, at, 0, 0x4b51),
                   strf("entry '%s': local header has signature 0x04034b51, not 0x04034b50 "
                        "(offset %zu)", names[k], at));
    }
    /* The last record: a longer local extra field pushes its data into the directory. */
    size_t at = local_offset(path, "archive/big/2999");
    read_fails(patched_copy(path, at, 28, 0xFFFF), "entry 'archive/big/2999': data (1572864 "
               "bytes at offset");
}

Test(zip_local, first_bad_header_in_directory_order_is_reported, .timeout = 60)
{
    /* The central directory runs backwards: of two bad headers, the one later in the file is
     * the first entry, whichever batch was read first. */
    const char *path = many_headers();
    size_t early = local_offset(path, "archive/data/10"), late = local_offset(path,
                                                                             "archive/data/20");
    const char *one = patched_copy(path, early, 26, 1);
    size_t len;
    unsigned char *b = read_whole(one, &len);
    b[late + 26] = 2;
    b[late + 27] = 0;
    const char *two = tmp_file(b, len);
    free(b);
    read_fails(two, strf("entry 'archive/data/20': local header names 2 bytes, the central "
                         "directory 15 (offset %zu)", late));
}

/* --- truncated, mutated and random files --------------------------------------------- */

/* Every prefix of the archive at path must be refused: each cut, one file rewritten. */
static void every_cut_fails(const char *path, size_t step)
{
    size_t len;
    unsigned char *b = read_whole(path, &len);
    const char *cut = tmp_file(b, len);
    for (size_t n = len; n-- > 0;) {
        if (n % step && n + 100 < len)
            continue;
        cr_assert_eq(truncate(cut, (off_t)n), 0);
        zip_archive z;
        ck_error err;
        int rc = read_dir_sized(cut, -1, &z, &err);
        cr_assert_eq(rc, -1, "%s cut to %zu of %zu bytes was read", path, n, len);
        cr_assert(is_empty(&z));
        assert_error(&err, cut, "");
    }
    free(b);
}

Test(zip_fuzz, truncated_anywhere)
{
    zb z = zb_build(THREE, 3, 1, "comment");
    every_cut_fails(zb_path(&z), 1);
    zb y = three(0);
    every_cut_fails(zb_path(&y), 1);
    every_cut_fails(py_zip("    for n in ['x.npy', 'y/z.npy']:\n"
                           "        with zf.open(n, 'w', force_zip64=True) as f:\n"
                           "            f.write(n.encode() * 50)\n"
                           "    zf.comment = b'PK\\x05\\x06' * 20\n"), 1);
    if (access(CORPUS "candle_test.pt", R_OK) == 0)
        every_cut_fails(CORPUS "candle_test.pt", 1);
    if (access(CORPUS "tinypellm_pytorch_model.bin", R_OK) == 0)
        every_cut_fails(CORPUS "tinypellm_pytorch_model.bin", 4099);
}

/* Reads path, which may or may not hold an archive: either it fails cleanly or what it reads
 * holds together. */
static int read_anything(const char *path, uint64_t size)
{
    zip_archive z;
    ck_error err;
    int rc = read_dir_sized(path, -1, &z, &err);
    if (rc == 0) {
        check_invariants(&z, size);
    } else {
        cr_assert(is_empty(&z));
        assert_error(&err, path, "");
    }
    return rc;
}

Test(zip_fuzz, mutated_bytes, .timeout = 120)
{
    zb_file f[4];
    memcpy(f, THREE, sizeof THREE);
    f[3] = (zb_file){.name = "z64", .data = "zip64 entry", .len = 11, .zip64 = 1};
    zb z = zb_build(f, 4, 1, "the comment");
    const char *path = zb_path(&z);
    size_t len;
    unsigned char *base = read_whole(path, &len);
    unsigned char *b = malloc(len);
    cr_assert_not_null(b);
    uint32_t seed[64];
    int ok = 0;
    for (int round = 0; round < 20000; round++) {
        memcpy(b, base, len);
        fill_bytes(seed, sizeof seed, (uint32_t)round);
        for (unsigned k = 0; k <= seed[0] % 3; k++) {
            size_t at = seed[1 + 2 * k] % len;
            /* Mostly values that matter to a parser: small, 0xFF.., or the file's own. */
            switch (seed[2 + 2 * k] % 4) {
            case 0: b[at] = (unsigned char)seed[9 + k]; break;
            case 1: b[at] = 0xFF; break;
            case 2: b[at] = 0; break;
            default: b[at] ^= (unsigned char)(1u << (seed[12 + k] % 8)); break;
            }
        }
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        cr_assert_eq(pwrite(fd, b, len, 0), (ssize_t)len);
        close(fd);
        ok += read_anything(path, len) == 0;
    }
    /* Mutations of the names, data and comment leave an archive that reads. */
    cr_assert_gt(ok, 0);
    free(b);
    free(base);
}

Test(zip_fuzz, random_bytes)
{
    unsigned char b[3000];
    for (uint32_t seed = 0; seed < 300; seed++) {
        size_t len = 22 + seed * 9;
        fill_bytes(b, len, seed);
        memcpy(b, "PK\3\4", 4);
        if (seed % 2) {
            /* A record at the end, so that what follows it is random too. */
            memcpy(b + len - 22, "PK\5\6", 4);
            b[len - 2] = b[len - 1] = 0;
        }
        const char *path = tmp_file(b, len);
        cr_assert_eq(read_anything(path, len), -1, "random bytes (seed %u) read", seed);
    }
}

Test(zip_end, directory_size_no_header_could_fill)
{
    /* One entry claims the whole file, 300,000 bytes, as its central directory: more than
     * 46 + 3 * 65535 bytes, the most one header can take. */
    static char big[300000];
    zb_file f[1] = {{.name = "big", .data = big, .len = sizeof big}};
    zb z = zb_build(f, 1, 1, NULL);
    patch(&z, END64, 40, z.end64, 8);
    patch(&z, END64, 48, 0, 8);
    read_fails(zb_path(&z), strf("central directory of %zu bytes is too large for 1 entries of "
                                 "at most 196651 bytes each (offset 0)", z.end64));
}
