/* npy.c — NumPy .npy files and .npz archives; see npy.h.
 *
 * The header is a Python dict literal, but numpy writes it one way only (format.py,
 * _wrap_header: the keys sorted, repr() of each value, ", " after each, then spaces and a
 * newline), so it is matched as that text, byte by byte, not evaluated: whatever differs is
 * refused with the offset where it does.
 */
#include "npy.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/bytes.h"
#include "../base/cursor.h"
#include "../base/utf8.h"
#include "../index/zip.h"

typedef unsigned long long ull;

static const unsigned char MAGIC[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

int npy_probe(const unsigned char *head, size_t n)
{
    return n >= sizeof MAGIC && memcmp(head, MAGIC, sizeof MAGIC) == 0;
}

/* Whether name (len bytes) is an .npy member's: what np.savez writes, "KEY.npy". */
static int npy_member(const char *name, size_t len)
{
    return len >= 4 && memcmp(name + len - 4, ".npy", 4) == 0;
}

int npz_probe(const unsigned char *head, size_t n)
{
    size_t len;
    const char *first = zip_first_name(head, n, &len);
    return first && npy_member(first, len);
}

/* --- the header ------------------------------------------------------------------------ */

/* The descrs numpy writes for the dtypes we have: '|' for one-byte types, '<' for the rest. */
static const struct {
    const char *descr;
    enum ck_dtype dtype;
} DESCRS[] = {
    {"<f2", CK_F16}, {"<f4", CK_F32}, {"<f8", CK_F64}, {"|i1", CK_I8},   {"<i2", CK_I16},
    {"<i4", CK_I32}, {"<i8", CK_I64}, {"|u1", CK_U8},  {"<u2", CK_U16},  {"<u4", CK_U32},
    {"<u8", CK_U64}, {"|b1", CK_BOOL}, {"<c8", CK_C64}, {"<c16", CK_C128},
};

/* The header text's parser; every failure says where, as an offset in the file. */
typedef struct hp {
    ck_cursor c;       /* over the header text, at its file offset */
    const char *path, *what;
    ck_error *err;
} hp;

static int bad(hp *h, const char *expected)
{
    size_t left = ck_cursor_left(&h->c), n = left < 16 ? left : 16;
    const unsigned char *s = ck_cursor_rest(&h->c);
    char seen[16 * 4 + 1];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        k += (size_t)(c >= 0x20 && c < 0x7f && c != '\\'
                          ? snprintf(seen + k, sizeof seen - k, "%c", c)
                          : snprintf(seen + k, sizeof seen - k, "\\x%02x", c));
    }
    seen[k] = 0;
    return ck_fail(h->err, h->path, "%sheader: expected %s, found \"%s\"%s (offset %llu)",
                   h->what, expected, seen, left == 0 ? "(end of header)" : "",
                   (ull)ck_cursor_at(&h->c));
}

/* Consumes the literal s when it comes next: 1, else 0. */
static int accept(hp *h, const char *s)
{
    size_t n = strlen(s);
    if (ck_cursor_left(&h->c) < n || memcmp(ck_cursor_rest(&h->c), s, n) != 0)
        return 0;
    ck_take(&h->c, n);
    return 1;
}

/* Consumes the literal s, or fails saying it was expected. */
static int lit(hp *h, const char *s)
{
    if (accept(h, s))
        return 0;
    char want[64];
    snprintf(want, sizeof want, "\"%s\"", s);
    return bad(h, want);
}

static int refuse_descr(hp *h, npy_header *out, const char *d, size_t n)
{
    out->not_a_tensor = 1;
    const char *why;
    char k = n > 1 ? d[1] : 0;
    if (n == 2 && d[1] == 'O')
        why = "is an object array: it holds pickled Python objects, which np.load refuses "
              "without allow_pickle=True, and ckptfs never unpickles";
    else if (k == 'S' || k == 'U' || k == 'a')
        why = "is a string dtype, not a tensor";
    else if (k == 'M' || k == 'm')
        why = "is a datetime or timedelta dtype, not a tensor";
    else if (k == 'V')
        why = "is a void (raw bytes) dtype, not a tensor";
    else
        why = "is not a dtype ckptfs knows";
    return ck_fail(h->err, h->path, "%sdescr '%.*s' %s (offset %llu)", h->what, (int)n, d, why,
                   (ull)ck_cursor_at(&h->c));
}

/* 'descr': a quoted simple type string. A list is a structured dtype. */
static int parse_descr(hp *h, npy_header *out)
{
    if (ck_peek(&h->c) == '[' && (out->not_a_tensor = 1))
        return ck_fail(h->err, h->path, "%sdescr is a list of fields: structured dtypes are "
                       "not supported (offset %llu)", h->what, (ull)ck_cursor_at(&h->c));
    if (lit(h, "'"))
        return -1;
    const char *d = (const char *)ck_cursor_rest(&h->c);
    size_t n = 0, left = ck_cursor_left(&h->c);
    while (n < left && n <= 32 && d[n] != '\'' && d[n] >= 0x20 && d[n] < 0x7f)
        n++;
    if (n == left || d[n] != '\'' || n == 0) {
        ck_take(&h->c, n);
        return bad(h, "a quoted descr of at most 32 printable characters");
    }
    /* A string dtype ('<U3': 3 UTF-32 characters; '|S5': 5 bytes): no tensor, but a 0-d one
     * is a value (add_text) */
    unsigned long size = 0;
    int end = 0;
    if (n > 2 && (d[0] == '<' || d[0] == '|') && (d[1] == 'U' || d[1] == 'S') &&
        sscanf(d + 2, "%lu%n", &size, &end) == 1 && (size_t)end == n - 2 && size > 0 &&
        size <= NPY_MAX_TEXT / (d[1] == 'U' ? 4 : 1) && d[2] != '0') {
        out->text = d[1];
        out->itemsize = (uint32_t)(size * (d[1] == 'U' ? 4 : 1));
        out->dtype = CK_U8; /* its bytes, for the size checks */
        ck_take(&h->c, n + 1);
        return 0;
    }
    /* '>' is a multi-byte type stored big-endian: the same type, its bytes swapped on read */
    int big = n > 1 && d[0] == '>';
    for (size_t i = 0; i < sizeof DESCRS / sizeof *DESCRS; i++)
        if (strlen(DESCRS[i].descr) == n && memcmp(DESCRS[i].descr + big, d + big, n - big) == 0 &&
            DESCRS[i].descr[0] == (big ? '<' : d[0])) {
            out->dtype = (uint8_t)DESCRS[i].dtype;
            out->big_endian = (uint8_t)big;
            ck_take(&h->c, n + 1);
            return 0;
        }
    return refuse_descr(h, out, d, n);
}

/* One dimension: decimal, no sign, no leading zero, at most INT64_MAX; with long, a Python 2
 * long's 'L' after it (numpy reads it in format 1.0 and 2.0 headers). */
static int parse_dim(hp *h, int64_t *dim, int long_ok)
{
    const unsigned char *s = ck_cursor_rest(&h->c);
    size_t n = 0, left = ck_cursor_left(&h->c);
    uint64_t v = 0;
    for (; n < left && s[n] >= '0' && s[n] <= '9'; n++) {
        if (n > 0 && v == 0)
            return bad(h, "a dimension without leading zeros");
        if (v > ((uint64_t)INT64_MAX - (s[n] - '0')) / 10)
            return bad(h, "a dimension of at most 2^63-1");
        v = v * 10 + (uint64_t)(s[n] - '0');
    }
    if (n == 0)
        return bad(h, "a dimension");
    ck_take(&h->c, n);
    if (long_ok)
        accept(h, "L");
    *dim = (int64_t)v;
    return 0;
}

/* 'shape': repr() of a tuple of ints: "()", "(5,)", "(2, 3)". */
static int parse_shape(hp *h, npy_header *out)
{
    if (lit(h, "("))
        return -1;
    out->rank = 0;
    if (accept(h, ")"))
        return 0;
    for (;;) {
        if (out->rank == CK_MAX_RANK)
            return ck_fail(h->err, h->path, "%sshape has more than %d dimensions (offset %llu)",
                           h->what, CK_MAX_RANK, (ull)ck_cursor_at(&h->c));
        if (parse_dim(h, &out->shape[out->rank++], out->major <= 2))
            return -1;
        if (out->rank == 1 ? lit(h, ",") : 0)
            return -1;
        if (accept(h, ")"))
            return 0;
        if (lit(h, out->rank == 1 ? " " : ", "))
            return -1;
    }
}

/* The magic, the version and the header length: *text becomes a cursor over the header text. */
static int parse_preamble(const unsigned char *p, size_t n, npy_header *out, ck_cursor *text,
                          const char *path, const char *what, uint64_t at, ck_error *err)
{
    if (!npy_probe(p, n))
        return ck_fail(err, path, "%snot an .npy file: no \\x93NUMPY magic (offset %llu)", what,
                       (ull)at);
    ck_cursor c = ck_cursor_make(p, n, at);
    const unsigned char *m = ck_take(&c, 10); /* the magic, the version, a 2-byte length */
    uint64_t high = 0; /* formats 2.0 and 3.0: the length's upper 2 of 4 bytes */
    if (!m)
        return ck_fail(err, path, "%s.npy header is cut short after %zu bytes (offset %llu)",
                       what, n, (ull)at);
    out->major = m[6];
    if ((m[6] != 1 && m[6] != 2 && m[6] != 3) || m[7] != 0)
        return ck_fail(err, path, "%s.npy format version %u.%u is not 1.0, 2.0 or 3.0 (offset "
                       "%llu)", what, m[6], m[7], (ull)(at + 6));
    if (m[6] > 1 && ck_take_le(&c, 2, &high))
        return ck_fail(err, path, "%s.npy header is cut short after %zu bytes (offset %llu)",
                       what, n, (ull)at);
    uint64_t hl = get_le16(m + 8) | high << 16;
    if (hl > NPY_MAX_HEADER)
        return ck_fail(err, path, "%s.npy header claims %llu bytes, more than the %u np.load "
                       "accepts (offset %llu)", what, (ull)hl, NPY_MAX_HEADER, (ull)(at + 8));
    if (ck_take_cursor(&c, hl, text))
        return ck_fail(err, path, "%s.npy header claims %llu bytes, but only %zu follow "
                       "(offset %llu)", what, (ull)hl, ck_cursor_left(&c), (ull)(at + 8));
    return 0;
}

int npy_parse_header(const unsigned char *p, size_t n, npy_header *out, const char *path,
                     const char *what, uint64_t at, ck_error *err)
{
    hp h = {.path = path, .what = what, .err = err};
    *out = (npy_header){0};
    if (parse_preamble(p, n, out, &h.c, path, what, at, err))
        return -1;
    /* The text's file offset and length: the data follows it. */
    uint64_t text = h.c.base - at, len = h.c.len;
    if (lit(&h, "{'descr': ") || parse_descr(&h, out) || lit(&h, ", 'fortran_order': "))
        return -1;
    if (accept(&h, "True"))
        out->fortran = 1;
    else if (lit(&h, "False"))
        return -1;
    if (lit(&h, ", 'shape': ") || parse_shape(&h, out) || lit(&h, ", }"))
        return -1;
    while (ck_cursor_left(&h.c) > 1 && accept(&h, " "))
        ;
    if (ck_cursor_left(&h.c) != 1 || ck_peek(&h.c) != '\n')
        return bad(&h, "spaces, then a newline ending the header");
    if (out->text && out->rank && (out->not_a_tensor = 1))
        return ck_fail(err, path, "%sdescr '%c%c%u' is a string dtype, not a tensor (only a 0-d "
                       "string is served, as a value) (offset %llu)", what,
                       out->text == 'U' ? '<' : '|', out->text,
                       out->text == 'U' ? out->itemsize / 4 : out->itemsize, (ull)(at + text));
    if (out->text)
        out->nbytes = out->itemsize;
    else if (ck_tensor_nbytes(out->rank, out->shape, out->dtype, &out->nbytes))
        return ck_fail(err, path, "%sshape's size in bytes overflows 64 bits (offset %llu)",
                       what, (ull)(at + text));
    out->data_offset = text + len;
    return 0;
}

/* --- entries --------------------------------------------------------------------------- */

/* Appends the array h describes under name. Its bytes: at file offset `data` (contiguous, or
 * gathered column-major when Fortran-ordered), or the output of zi past its header. */
static int add_array(ck_index *ix, const char *name, size_t len, const npy_header *h,
                     uint32_t file, uint64_t data, zip_inflated *zi, const char *what,
                     ck_error *err)
{
    int64_t dims[2 * CK_MAX_RANK];
    memcpy(dims, h->shape, h->rank * sizeof *dims);
    /* A Fortran-ordered array of rank < 2 or no elements is laid out as a C-ordered one. */
    int strided = h->fortran && h->rank > 1 && h->nbytes > 0;
    if (h->big_endian && (zi || strided))
        return ck_fail(err, ix->files[file].path, "%sbig-endian and %s: its bytes can be "
                       "swapped on read only where they lie in order, uncompressed", what,
                       zi ? "compressed" : "Fortran-ordered");
    uint8_t layout = zi         ? CK_DEFLATED
                     : strided  ? CK_STRIDED
                     : h->big_endian ? CK_SWAPPED
                                     : CK_CONTIGUOUS;
    if (strided) { /* column-major: the first index varies fastest */
        int64_t step = 1;
        for (unsigned d = 0; d < h->rank; d++) {
            dims[h->rank + d] = step;
            step *= h->shape[d]; /* the product of all of them fits: nbytes did */
        }
    }
    ck_entry *e = ck_index_add_entry(ix, name, len, layout, h->rank, dims, err);
    if (!e)
        return -1;
    e->dtype = h->dtype;
    e->nbytes = h->nbytes;
    e->ext = (ck_extent){.offset = zi ? zi->data_offset : data,
                         .length = zi ? zi->csize : h->nbytes, .file = file};
    if (zi)
        e->deflated = zi;
    return 0;
}

/* A 0-d string array (h->text) as the value `name`: '<U' text (UTF-32) as UTF-8 and a newline,
 * '|S' bytes as they are; numpy drops the trailing NULs that pad both. Its itemsize bytes are
 * at file offset data, or the output of zi past its header. */
static int add_text(ck_index *ix, const char *name, size_t len, const npy_header *h,
                    uint32_t file, uint64_t data, zip_inflated *zi, const char *what,
                    ck_error *err)
{
    const ck_file *f = &ix->files[file];
    unsigned char *raw = malloc(h->itemsize), *text = malloc(h->itemsize + 1);
    int rc = raw && text ? 0 : ck_fail(err, f->path, "%sout of memory", what);
    if (rc == 0 && (zi ? zip_inflate_read(f, zi, raw, h->itemsize, zi->skip)
                       : ck_file_read(f, raw, h->itemsize, data)))
        rc = ck_fail(err, f->path, "%scannot read its string", what);
    size_t n = 0, end = h->itemsize, unit = h->text == 'U' ? 4 : 1;
    while (rc == 0 && end && (unit == 4 ? get_le32(raw + end - 4) : raw[end - 1]) == 0)
        end -= unit;
    for (size_t i = 0; rc == 0 && unit == 4 && i < end; i += 4) {
        uint32_t c = get_le32(raw + i);
        if (c > 0x10ffff || (c >= 0xd800 && c < 0xe000))
            rc = ck_fail(err, f->path, "%sa string holding U+%X, which is no character", what, c);
        else
            n += ck_utf8_put(text + n, c);
    }
    if (rc == 0 && unit == 4) {
        text[n] = '\n';
        rc = ck_index_add_value(ix, name, len, CK_VAL_STR, (const char *)text, n + 1, err) ? 0
                                                                                          : -1;
    } else if (rc == 0) {
        rc = ck_index_add_value(ix, name, len, CK_VAL_BYTES, (const char *)raw, end, err) ? 0
                                                                                       : -1;
    }
    free(raw);
    free(text);
    return rc;
}

/* The data must fill what follows the header exactly. */
static int check_fill(const npy_header *h, uint64_t have, const char *path, const char *what,
                      uint64_t at, ck_error *err)
{
    if (have - h->data_offset == h->nbytes)
        return 0;
    if (have - h->data_offset < h->nbytes)
        return ck_fail(err, path, "%sthe header promises %llu bytes of data, only %llu follow "
                       "it: truncated (offset %llu)", what, (ull)h->nbytes,
                       (ull)(have - h->data_offset), (ull)(at + h->data_offset));
    return ck_fail(err, path, "%s%llu bytes follow the %llu bytes of data the header promises "
                   "(several arrays saved to one file?) (offset %llu)", what,
                   (ull)(have - h->data_offset - h->nbytes), (ull)h->nbytes,
                   (ull)(at + h->data_offset + h->nbytes));
}

/* Reads and parses the header of the .npy that starts at file offset at and is size bytes. */
static int read_header(const ck_index *ix, uint32_t file, uint64_t at, uint64_t size,
                       npy_header *h, const char *what, ck_error *err)
{
    unsigned char buf[NPY_PREAMBLE_MAX + NPY_MAX_HEADER];
    const ck_file *f = &ix->files[file];
    size_t n = size < sizeof buf ? (size_t)size : sizeof buf;
    int rc = ck_file_read(f, buf, n, at);
    if (rc)
        return ck_fail(err, f->path, "%scannot read the header: %s (offset %llu)", what,
                       strerror(-rc), (ull)at);
    if (npy_parse_header(buf, n, h, f->path, what, at, err))
        return -1;
    return check_fill(h, size, f->path, what, at, err);
}

int npy_read_file(ck_index *ix, uint32_t file, ck_error *err)
{
    npy_header h = {0};
    if (read_header(ix, file, 0, ix->files[file].size, &h, "", err))
        return -1;
    return h.text ? add_text(ix, "", 0, &h, file, h.data_offset, NULL, "", err)
                  : add_array(ix, "", 0, &h, file, h.data_offset, NULL, "", err);
}

/* --- .npz ------------------------------------------------------------------------------ */

/* --- Fortran-ordered arrays in deflated members: an inflated copy ------------------------
 *
 * Such an array is gathered column-major, from anywhere in its bytes, which a deflate stream
 * cannot give. So its member is inflated once, on the first read of it, into a file of its own
 * (under $TMPDIR, else /tmp, unlinked at once): a member can be far larger than memory, and the
 * page cache keeps what is read often. The copy is one more source file of the index, as a
 * remote object is (source.h: read through ck_file_read only), whose identity is the archive's:
 * it is unchanged exactly while the archive is (ck_file_unchanged), every read of it checks the
 * archive first, and its origin (ck_file_origin) is the archive, so that whoever checks a source
 * by its path (the mount) checks the archive's: a .npz changed, or renamed over, after the copy
 * was made is an error to its readers, never bytes that no longer match it. The copy owns the
 * member's decoder (zip_inflate_close on close). */
typedef struct npz_copy {
    const ck_index *ix;       /* whose files hold the archive (the array moves as files are added) */
    uint32_t archive;
    zip_inflated *zi;         /* the member; the array's bytes start at zi->skip */
    pthread_mutex_t lock;     /* held while the copy is made */
    int fd;                   /* the copy, once made; -1 before */
} npz_copy;

static int put_fd(void *fd, const void *buf, size_t len)
{
    return ck_write_all(*(int *)fd, buf, len);
}

/* The copy of c's array: made now if it was not (0 or -errno). Under c->lock. */
static int make_copy(npz_copy *c, const ck_file *archive)
{
    if (c->fd >= 0)
        return 0;
    const char *dir = getenv("TMPDIR");
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/ckptfs-npz-XXXXXX", dir && *dir ? dir : "/tmp") >=
        (int)sizeof path)
        return -ENAMETOOLONG;
    int fd = mkostemp(path, O_CLOEXEC);
    if (fd < 0)
        return -errno;
    unlink(path);
    int rc = zip_inflate_each(archive, c->zi, c->zi->skip, put_fd, &fd);
    if (rc == 0 && !ck_file_unchanged(archive)) /* changed while it was inflated */
        rc = -EIO;
    if (rc) {
        close(fd);
        return rc;
    }
    c->fd = fd;
    return 0;
}

static int copy_pread(const ck_file *f, void *buf, size_t len, uint64_t off)
{
    npz_copy *c = f->remote;
    const ck_file *archive = &c->ix->files[c->archive];
    if (off > f->size || len > f->size - off || !ck_file_unchanged(archive))
        return -EIO;
    pthread_mutex_lock(&c->lock);
    int rc = make_copy(c, archive);
    pthread_mutex_unlock(&c->lock);
    return rc ? rc : ck_pread(c->fd, buf, len, off);
}

static int copy_same(const ck_file *f)
{
    const npz_copy *c = f->remote;
    return ck_file_unchanged(&c->ix->files[c->archive]);
}

static const ck_file *copy_origin(const ck_file *f)
{
    const npz_copy *c = f->remote;
    return ck_file_origin(&c->ix->files[c->archive]);
}

static void copy_close(ck_file *f)
{
    npz_copy *c = f->remote;
    if (c->fd >= 0)
        close(c->fd);
    zip_inflate_close(c->zi);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static void copy_stats(const ck_file *f, uint64_t *requests, uint64_t *bytes)
{
    (void)f;
    *requests = *bytes = 0;
}

static void copy_hint(ck_file *f, const uint64_t *bounds, size_t n)
{
    (void)f, (void)bounds, (void)n;
}

static const ck_source_ops copy_ops = {
    .pread = copy_pread, .same = copy_same, .close = copy_close, .stats = copy_stats,
    .hint = copy_hint, .origin = copy_origin,
};

/* Adds the copy of the array of nbytes that member zi of file `archive` holds past zi->skip, to
 * be made on its first read; the copy owns zi, even when this fails. Its file id, or -1 with
 * err set. */
static int add_copy(ck_index *ix, uint32_t archive, zip_inflated *zi, uint64_t nbytes,
                    ck_error *err)
{
    const ck_file *a = &ix->files[archive];
    npz_copy *c = malloc(sizeof *c);
    if (!c) {
        zip_inflate_close(zi);
        return ck_fail(err, a->path, "out of memory");
    }
    *c = (npz_copy){.ix = ix, .archive = archive, .zi = zi, .fd = -1};
    pthread_mutex_init(&c->lock, NULL);
    ck_file f = {.path = a->path, .fd = -1, .size = nbytes, .mtime = a->mtime, .ops = &copy_ops,
                 .remote = c};
    return ck_index_add_opened(ix, &f, err);
}

/* The header of deflated member ze, from the first bytes its stream inflates to (no more: the
 * rest is decoded when read), into *h; it must describe all of the member's output. */
static int deflated_header(const ck_file *f, const zip_entry *ze, zip_inflated *zi,
                           npy_header *h, const char *what, int *not_a_tensor, ck_error *err)
{
    unsigned char head[NPY_PREAMBLE_MAX + NPY_MAX_HEADER];
    size_t n = ze->size < sizeof head ? (size_t)ze->size : sizeof head;
    int rc = zip_inflate_read(f, zi, head, n, 0);
    if (rc) {
        const char *fault = zip_inflate_fault(zi);
        return ck_fail(err, f->path, "%scannot inflate its header: %s (offset %llu)", what,
                       fault ? fault : strerror(-rc), (ull)ze->data_offset);
    }
    if (npy_parse_header(head, n, h, f->path, what, 0, err) ||
        check_fill(h, ze->size, f->path, what, 0, err))
        return *not_a_tensor = h->not_a_tensor, -1;
    zi->skip = h->data_offset;
    return 0;
}

/* A deflated member: its header now, its data decoded (and its stream checked) when read. The
 * entry owns the member's decoder (ck_index_free closes it); a value has read what it needs. */
static int add_deflated(ck_index *ix, uint32_t file, const zip_entry *ze, const char *what,
                        int *not_a_tensor, ck_error *err)
{
    const ck_file *f = &ix->files[file];
    zip_inflated *zi = ck_index_alloc(ix, sizeof *zi);
    if (!zi)
        return ck_fail(err, f->path, "%sout of memory", what);
    if (zip_inflate_open(ze, ZIP_SEEK_SPAN, zi, f->path, err))
        return -1;
    npy_header h = {0};
    int rc = deflated_header(f, ze, zi, &h, what, not_a_tensor, err);
    if (rc == 0 && !h.text && h.fortran && h.rank > 1 && h.nbytes > 0 && !h.big_endian) {
        int id = add_copy(ix, file, zi, h.nbytes, err); /* gathered from a copy, which owns zi */
        return id < 0 ? -1 : add_array(ix, ze->name, ze->name_len - 4, &h, (uint32_t)id, 0,
                                       NULL, what, err);
    }
    if (rc == 0)
        rc = (h.text ? add_text : add_array)(ix, ze->name, ze->name_len - 4, &h, file, 0, zi,
                                             what, err);
    if (rc || h.text)
        zip_inflate_close(zi);
    return rc;
}

/* Adds member ze; *not_a_tensor says a failure was for what the member holds (no .npy, or
 * no tensor in it), which leaves only that member out. */
static int add_member(ck_index *ix, uint32_t file, const zip_entry *ze, int *not_a_tensor,
                      ck_error *err)
{
    const char *path = ix->files[file].path;
    char what[300];
    snprintf(what, sizeof what, "member '%.*s': ", ze->name_len < 200 ? (int)ze->name_len : 200,
             ze->name);
    if (!npy_member(ze->name, ze->name_len) && (*not_a_tensor = 1))
        return ck_fail(err, path, "%snot an .npy file: an .npz holds only KEY.npy members (as "
                       "np.savez writes)", what);
    size_t bad_at = ck_utf8_invalid_at((const unsigned char *)ze->name, ze->name_len);
    if (bad_at < ze->name_len)
        return ck_fail(err, path, "%sname is not valid UTF-8 (byte %zu)", what, bad_at);
    if (ze->method == 8)
        return add_deflated(ix, file, ze, what, not_a_tensor, err);
    if (ze->method != 0)
        return ck_fail(err, path, "%scompression method %u is not supported: only stored (0) "
                       "and deflated (8) members are (offset %llu)", what, ze->method,
                       (ull)ze->data_offset);
    npy_header h = {0};
    if (read_header(ix, file, ze->data_offset, ze->size, &h, what, err))
        return *not_a_tensor = h.not_a_tensor, -1;
    return (h.text ? add_text : add_array)(ix, ze->name, ze->name_len - 4, &h, file,
                                           ze->data_offset + h.data_offset, NULL, what, err);
}

static int by_data(const void *x, const void *y)
{
    const zip_entry *a = *(const zip_entry *const *)x, *b = *(const zip_entry *const *)y;
    return (a->data_offset > b->data_offset) - (a->data_offset < b->data_offset);
}

/* Members whose bytes overlap are refused: one compressed stream counted twice is how zip
 * bombs multiply themselves, and a tensor is never another's bytes in np.savez's output. */
static int check_overlaps(const zip_archive *z, const char *path, ck_error *err)
{
    const zip_entry **order = malloc(z->nentries * sizeof *order);
    if (!order)
        return ck_fail(err, path, "out of memory");
    for (size_t i = 0; i < z->nentries; i++)
        order[i] = &z->entries[i];
    qsort(order, z->nentries, sizeof *order, by_data);
    int rc = 0;
    for (size_t i = 1; i < z->nentries && rc == 0; i++)
        if (order[i]->data_offset - order[i - 1]->data_offset < order[i - 1]->csize ||
            order[i]->data_offset == order[i - 1]->data_offset)
            rc = ck_fail(err, path, "members '%s' and '%s' overlap (data at offsets %llu and "
                         "%llu)", order[i - 1]->name, order[i]->name,
                         (ull)order[i - 1]->data_offset, (ull)order[i]->data_offset);
    free(order);
    return rc;
}

/* A member that holds no tensor (strings, objects, a structured or unknown dtype, no .npy) is
 * left out, with the reason, and the others are read, as np.load reads them. A member that is
 * a tensor but damaged, or unreadable, fails the archive. */
static int add_or_omit(ck_index *ix, uint32_t file, const zip_entry *ze, ck_error *err)
{
    ck_error why;
    int not_a_tensor = 0;
    if (add_member(ix, file, ze, &not_a_tensor, &why) == 0)
        return 0;
    if (!not_a_tensor) {
        *err = why;
        return -1;
    }
    const char *reason = strstr(why.msg, "': "); /* past "FILE: member 'NAME.npy'" */
    size_t len = npy_member(ze->name, ze->name_len) ? ze->name_len - 4 : ze->name_len;
    return ck_index_add_omission(ix, ze->name, len, reason ? reason + 3 : why.msg, err);
}

int npz_read_file(ck_index *ix, uint32_t file, ck_error *err)
{
    const ck_file *f = &ix->files[file];
    zip_archive z;
    if (zip_read_directory(f, f->size, f->path, &z, err) != 0)
        return -1;
    int rc = z.nentries ? check_overlaps(&z, f->path, err)
                        : ck_fail(err, f->path, "empty zip archive");
    for (size_t i = 0; i < z.nentries && rc == 0; i++)
        rc = add_or_omit(ix, file, &z.entries[i], err);
    zip_free(&z);
    return rc;
}

/* --- writing --------------------------------------------------------------------------- */

/* The descr for dt, and the shape NumPy sees (into shape, *rank): the tensor's own for a
 * dtype NumPy has or a whole-byte one served as '|VN' records, (nbytes,) for the rest. */
static const char *make_descr(enum ck_dtype dt, unsigned *rank, int64_t *shape,
                              uint64_t nbytes, char *vbuf, int *raw)
{
    *raw = 0;
    for (size_t i = 0; i < sizeof DESCRS / sizeof *DESCRS; i++)
        if (DESCRS[i].dtype == dt)
            return DESCRS[i].descr;
    *raw = 1;
    if (ck_dtype_block_elems(dt) == 1) {
        sprintf(vbuf, "|V%u", ck_dtype_block_bytes(dt));
        return vbuf;
    }
    *rank = 1;
    shape[0] = (int64_t)nbytes; /* a tensor's bytes fit in int64: ck_tensor_nbytes checked */
    return "|u1";
}

size_t npy_header_make(enum ck_dtype dt, unsigned rank, const int64_t *shape, uint64_t nbytes,
                       unsigned char *buf, int *raw)
{
    int64_t dims[CK_MAX_RANK];
    char vbuf[16];
    for (unsigned d = 0; d < rank; d++) /* not memcpy: a 0-d tensor's shape may be NULL */
        dims[d] = shape[d];
    const char *descr = make_descr(dt, &rank, dims, nbytes, vbuf, raw);
    char *t = (char *)buf + 10; /* after the magic, the version and the 2-byte length */
    size_t n = (size_t)sprintf(t, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (unsigned d = 0; d < rank; d++) /* repr() of a tuple: "(5,)" for one element */
        n += (size_t)sprintf(t + n, d ? ", %lld" : rank == 1 ? "%lld," : "%lld",
                             (long long)dims[d]);
    n += (size_t)sprintf(t + n, "), }");
    size_t total = (10 + n + 1 + 63) / 64 * 64; /* the newline ends it; data 64-aligned */
    memset(t + n, ' ', total - 10 - n - 1);
    buf[total - 1] = '\n';
    memcpy(buf, MAGIC, sizeof MAGIC);
    buf[6] = 1, buf[7] = 0;
    buf[8] = (unsigned char)((total - 10) & 0xff), buf[9] = (unsigned char)((total - 10) >> 8);
    return total;
}
