#include "index.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void *ck_index_alloc(ck_index *ix, size_t n)
{
    return ck_arena_alloc(&ix->arena, n);
}

char *ck_index_strndup(ck_index *ix, const char *s, size_t n)
{
    char *p = ck_index_alloc(ix, n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

ck_index *ck_index_new(const char *format)
{
    ck_index *ix = calloc(1, sizeof *ix);
    if (ix)
        ix->format = format;
    return ix;
}

void ck_index_free(ck_index *ix)
{
    if (!ix)
        return;
    for (uint32_t i = 0; i < ix->nfiles; i++)
        close(ix->files[i].fd);
    free(ix->files);
    free(ix->entries);
    free(ix->meta);
    ck_arena_free(ix->arena);
    free(ix);
}

/* Grows *v (of *cap elements of size sz) so that it holds at least need. */
static int grow(void **v, size_t *cap, size_t need, size_t sz)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap * 2 : 16;
    while (n < need)
        n *= 2;
    void *p = realloc(*v, n * sz);
    if (!p)
        return -1;
    *v = p;
    *cap = n;
    return 0;
}

int ck_index_add_file(ck_index *ix, const char *path, int fd, ck_error *err)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return ck_fail(err, path, "cannot stat: %s", strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ck_fail(err, path, "not a regular file");
    }
    void *v = ix->files;
    if (grow(&v, &ix->cap_files, (size_t)ix->nfiles + 1, sizeof(ck_file)) != 0) {
        close(fd);
        return ck_fail(err, path, "out of memory");
    }
    ix->files = v;
    const char *copy = ck_index_strndup(ix, path, strlen(path));
    if (!copy) {
        close(fd);
        return ck_fail(err, path, "out of memory");
    }
    ix->files[ix->nfiles] = (ck_file){
        .path = copy, .fd = fd, .size = (uint64_t)st.st_size, .mtime = st.st_mtim,
        .dev = st.st_dev, .ino = st.st_ino,
    };
    return (int)ix->nfiles++;
}

ck_entry *ck_index_add_entry(ck_index *ix, const char *name, size_t name_len, uint8_t layout,
                             unsigned rank, const int64_t *shape, ck_error *err)
{
    void *v = ix->entries;
    if (rank > CK_MAX_RANK || name_len > UINT32_MAX ||
        grow(&v, &ix->cap_entries, ix->nentries + 1, sizeof(ck_entry)) != 0)
        return ck_fail(err, ix->nfiles ? ix->files[0].path : "?", "out of memory"), NULL;
    ix->entries = v;
    size_t ndims = layout == CK_STRIDED ? 2 * (size_t)rank : rank;
    int64_t *dims = ndims ? ck_index_alloc(ix, ndims * sizeof *dims) : NULL;
    char *nm = ck_index_strndup(ix, name, name_len);
    if ((ndims && !dims) || !nm)
        return ck_fail(err, ix->nfiles ? ix->files[0].path : "?", "out of memory"), NULL;
    if (ndims)
        memcpy(dims, shape, ndims * sizeof *dims);
    ck_entry *e = &ix->entries[ix->nentries++];
    *e = (ck_entry){.name = nm, .shape = dims, .name_len = (uint32_t)name_len,
                    .kind = CK_TENSOR, .layout = layout, .rank = (uint8_t)rank};
    return e;
}

ck_entry *ck_index_add_value(ck_index *ix, const char *name, size_t name_len,
                             enum ck_value_type type, const char *text, size_t len,
                             ck_error *err)
{
    ck_entry *e = ck_index_add_entry(ix, name, name_len, CK_CONTIGUOUS, 0, NULL, err);
    char *copy = e ? ck_index_strndup(ix, text, len) : NULL;
    if (!copy)
        return e ? ck_fail(err, ix->nfiles ? ix->files[0].path : "?", "out of memory"), NULL
                 : NULL;
    e->kind = CK_VALUE;
    e->dtype = (uint8_t)type;
    e->u.text = copy;
    e->nbytes = len;
    return e;
}

const char *ck_value_type_name(enum ck_value_type t)
{
    static const char *const names[CK_VAL_TYPE_COUNT] = {"None", "bool", "int", "float",
                                                         "str", "bytes", "global"};
    return (unsigned)t < CK_VAL_TYPE_COUNT ? names[t] : "?";
}

int ck_index_add_meta(ck_index *ix, const char *key, const char *value, ck_error *err)
{
    void *v = ix->meta;
    if (grow(&v, &ix->cap_meta, ix->nmeta + 1, sizeof(ck_meta)) != 0)
        return ck_fail(err, ix->nfiles ? ix->files[0].path : "?", "out of memory");
    ix->meta = v;
    ck_meta *m = &ix->meta[ix->nmeta];
    m->key = ck_index_strndup(ix, key, strlen(key));
    m->value = ck_index_strndup(ix, value, strlen(value));
    if (!m->key || !m->value)
        return ck_fail(err, ix->nfiles ? ix->files[0].path : "?", "out of memory");
    ix->nmeta++;
    return 0;
}

const ck_entry *ck_index_find(const ck_index *ix, const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; i < ix->nentries; i++)
        if (ix->entries[i].name_len == n && memcmp(ix->entries[i].name, name, n) == 0)
            return &ix->entries[i];
    return NULL;
}

int ck_tensor_nbytes(unsigned rank, const int64_t *shape, enum ck_dtype dt, uint64_t *nbytes)
{
    uint64_t count = 1, bits;
    for (unsigned i = 0; i < rank; i++) {
        if (shape[i] < 0 || __builtin_mul_overflow(count, (uint64_t)shape[i], &count))
            return -1;
    }
    if (__builtin_mul_overflow(count, (uint64_t)ck_dtype_bits(dt), &bits) || bits % 8)
        return -1;
    *nbytes = bits / 8;
    return 0;
}

int ck_pread(int fd, void *buf, size_t len, uint64_t off)
{
    unsigned char *p = buf;
    while (len) {
        ssize_t n = pread(fd, p, len, (off_t)off);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (n == 0)
            return -EIO;
        p += n;
        len -= (size_t)n;
        off += (uint64_t)n;
    }
    return 0;
}

static int read_extents(const ck_index *ix, const ck_extent *x, uint32_t n, unsigned char *buf,
                        size_t len, uint64_t off)
{
    for (uint32_t i = 0; i < n && len; i++) {
        if (off >= x[i].length) {
            off -= x[i].length;
            continue;
        }
        size_t take = x[i].length - off < len ? (size_t)(x[i].length - off) : len;
        int rc = ck_pread(ix->files[x[i].file].fd, buf, take, x[i].offset + off);
        if (rc)
            return rc;
        buf += take;
        len -= take;
        off = 0;
    }
    return 0;
}

/* A strided tensor is read one innermost row at a time: a row with unit stride is one pread
 * straight into the caller's buffer; any other row is read as the span it covers, in bounded
 * pieces, and gathered. Memory stays O(GATHER_SPAN) whatever the tensor size. */
enum { GATHER_SPAN = 256 * 1024 };

static int read_row(int fd, uint64_t first, int64_t stride, size_t count, unsigned esize,
                    unsigned char *out, unsigned char *scratch)
{
    if (stride == 1 || count == 1)
        return ck_pread(fd, out, count * esize, first);
    if (stride == 0) {
        int rc = ck_pread(fd, out, esize, first);
        for (size_t i = 1; rc == 0 && i < count; i++)
            memcpy(out + i * esize, out, esize);
        return rc;
    }
    size_t step = (size_t)stride * esize;
    size_t per = step <= GATHER_SPAN ? (GATHER_SPAN - esize) / step + 1 : 1;
    for (size_t i = 0; i < count; i += per) {
        size_t k = count - i < per ? count - i : per;
        size_t span = (k - 1) * step + esize;
        int rc = ck_pread(fd, scratch, span, first + i * step);
        if (rc)
            return rc;
        for (size_t j = 0; j < k; j++)
            memcpy(out + (i + j) * esize, scratch + j * step, esize);
    }
    return 0;
}

static int read_strided(const ck_index *ix, const ck_entry *e, unsigned char *buf, size_t len,
                        uint64_t off)
{
    unsigned esize = ck_dtype_bits(e->dtype) / 8;
    unsigned rank = e->rank;
    const int64_t *dims = e->shape, *strides = e->shape + rank;
    int fd = ix->files[e->ext.file].fd;
    size_t row = rank ? (size_t)dims[rank - 1] : 1;
    int64_t rstride = rank ? strides[rank - 1] : 1;
    uint64_t first = off / esize, last = (off + len + esize - 1) / esize; /* elements */
    unsigned char *scratch = malloc(GATHER_SPAN + esize);
    unsigned char elem[16];
    if (!scratch)
        return -ENOMEM;
    int rc = 0;
    for (uint64_t i = first; i < last && rc == 0;) {
        /* Element i: its row, its position in the row, and the row's first byte. */
        uint64_t r = i / row, col = i % row, base = e->ext.offset;
        for (unsigned d = rank - 1; rank && d-- > 0;) {
            base += (uint64_t)((int64_t)(r % (uint64_t)dims[d]) * strides[d]) * esize;
            r /= (uint64_t)dims[d];
        }
        size_t count = (size_t)(row - col < last - i ? row - col : last - i);
        uint64_t start = base + (uint64_t)((int64_t)col * rstride) * esize;
        uint64_t lo = i * esize, hi = (i + count) * esize; /* bytes of the tensor this covers */
        if (lo >= off && hi <= off + len) {
            rc = read_row(fd, start, rstride, count, esize, buf + (lo - off), scratch);
        } else {
            /* A partial element at either end of the request: read whole elements one by one. */
            for (size_t j = 0; j < count && rc == 0; j++) {
                uint64_t eb = (i + j) * esize;
                rc = ck_pread(fd, elem, esize, start + (uint64_t)((int64_t)j * rstride) * esize);
                uint64_t from = eb < off ? off - eb : 0, to = eb + esize > off + len ? off + len - eb : esize;
                if (rc == 0)
                    memcpy(buf + (eb + from - off), elem + from, (size_t)(to - from));
            }
        }
        i += count;
    }
    free(scratch);
    return rc;
}

ssize_t ck_entry_read(const ck_index *ix, const ck_entry *e, void *buf, size_t len, uint64_t off)
{
    if (off >= e->nbytes)
        return 0;
    if (len > e->nbytes - off)
        len = (size_t)(e->nbytes - off);
    if (len > SSIZE_MAX)
        len = SSIZE_MAX;
    int rc = 0;
    switch (e->kind == CK_VALUE ? 255 : e->layout) {
    case 255:
        memcpy(buf, e->u.text + off, len);
        return (ssize_t)len;
    case CK_CONTIGUOUS:
        rc = read_extents(ix, &e->ext, 1, buf, len, off);
        break;
    case CK_EXTENTS:
        rc = read_extents(ix, e->u.extents, e->nextents, buf, len, off);
        break;
    case CK_STRIDED:
        rc = read_strided(ix, e, buf, len, off);
        break;
    default:
        return -EIO;
    }
    return rc ? rc : (ssize_t)len;
}
