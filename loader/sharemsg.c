/* sharemsg.c — the warm-attach message (sharemsg.h): written by the server, parsed with bounds
 * by the client. */
#include "sharemsg.h"

#include "../base/bytes.h"
#include "../base/cursor.h"
#include "../base/dtype.h"
#include "../base/seed.h"
#include "../index/index.h"
#include "../sources/source.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

static const char MAGIC[8] = "CKLSHARE";
enum { VERSION = 1, KIND_TABLE = 0, KIND_REFUSAL = 1 };
/* The fewest bytes a file, a blob and a tensor take, so that a count is checked against the
 * bytes left before anything is sized by it. */
enum { FILE_MIN = 4 + 8 * 4 + 4, BLOB_MIN = 16, TENSOR_MIN = 4 + 1 + 1 + 8 + 4 };

/* --- writing -------------------------------------------------------------------------------- */

typedef struct wbuf {
    unsigned char *p;
    size_t len, cap;
    int failed;
} wbuf;

static unsigned char *room(wbuf *w, size_t n)
{
    if (w->failed)
        return NULL;
    if (n > w->cap - w->len) {
        size_t cap = w->cap ? w->cap : 4096;
        while (cap - w->len < n)
            cap *= 2;
        unsigned char *p = realloc(w->p, cap);
        if (!p) {
            w->failed = 1;
            return NULL;
        }
        w->p = p;
        w->cap = cap;
    }
    w->len += n;
    return w->p + w->len - n;
}

static void put_bytes(wbuf *w, const void *s, size_t n)
{
    unsigned char *p = room(w, n);
    if (p && n)
        memcpy(p, s, n);
}

static void put_u32(wbuf *w, uint32_t v)
{
    unsigned char *p = room(w, 4);
    if (p)
        put_le32(p, v);
}

static void put_u64(wbuf *w, uint64_t v)
{
    unsigned char *p = room(w, 8);
    if (p)
        put_le64(p, v);
}

static void put_u8(wbuf *w, uint8_t v)
{
    put_bytes(w, &v, 1);
}

static void put_str(wbuf *w, const char *s, size_t max)
{
    size_t n = strlen(s);
    n = n < max ? n : max;
    put_u32(w, (uint32_t)n);
    put_bytes(w, s, n);
}

static void put_header(wbuf *w, uint32_t kind)
{
    put_bytes(w, MAGIC, sizeof MAGIC);
    put_u32(w, VERSION);
    put_u32(w, kind);
    put_u64(w, 0); /* the length, once known (finish) */
}

/* The length and the checksum: the message is whole. */
static int finish(wbuf *w, unsigned char **msg, size_t *len)
{
    put_u64(w, 0);
    if (w->failed) {
        free(w->p);
        return -1;
    }
    put_le64(w->p + 16, w->len);
    put_le64(w->p + w->len - 8, XXH3_64bits(w->p, w->len - 8));
    *msg = w->p;
    *len = w->len;
    return 0;
}

int share_encode_refusal(int code, const char *text, unsigned char **msg, size_t *len)
{
    wbuf w = {0};
    put_header(&w, KIND_REFUSAL);
    put_u32(&w, (uint32_t)code);
    put_str(&w, text, SHARE_MAX_TEXT);
    return finish(&w, msg, len);
}

int share_encode_table(const share_table *t, unsigned char **msg, size_t *len)
{
    wbuf w = {0};
    const ck_plan *p = t->plan;
    put_header(&w, KIND_TABLE);
    put_bytes(&w, t->handle, SHARE_HANDLE_SIZE);
    put_u32(&w, (uint32_t)t->ordinal);
    put_u64(&w, t->block_size);
    put_str(&w, t->source, SHARE_MAX_PATH);
    put_u32(&w, t->nfiles);
    for (uint32_t f = 0; f < t->nfiles; f++) {
        const share_file *sf = &t->files[f];
        put_str(&w, sf->path, SHARE_MAX_PATH);
        put_u64(&w, sf->dev);
        put_u64(&w, sf->ino);
        put_u64(&w, sf->size);
        put_u64(&w, (uint64_t)sf->mtime_sec);
        put_u32(&w, sf->mtime_nsec);
    }
    put_u32(&w, (uint32_t)p->nblobs);
    for (size_t b = 0; b < p->nblobs; b++) {
        put_u64(&w, p->blobs[b].dest_off);
        put_u64(&w, p->blobs[b].len);
    }
    put_u32(&w, (uint32_t)p->ntensors);
    for (size_t i = 0; i < p->ntensors; i++) {
        const ckl_tensor *x = &t->tensors[i];
        put_str(&w, x->name, SHARE_MAX_NAME);
        put_u8(&w, x->dtype_code);
        put_u8(&w, x->rank);
        for (unsigned d = 0; d < x->rank; d++)
            put_u64(&w, (uint64_t)x->shape[d]);
        put_u64(&w, x->nbytes);
        put_u32(&w, p->tensors[i].blob);
    }
    return finish(&w, msg, len);
}

/* --- reading -------------------------------------------------------------------------------- */

uint64_t share_message_length(const unsigned char *h, const char *where, ck_error *err)
{
    uint64_t n = get_le64(h + 16);
    if (memcmp(h, MAGIC, sizeof MAGIC) != 0 || get_le32(h + 8) != VERSION)
        ck_fail(err, where, "not a ckload share server (no CKLSHARE version %d header)", VERSION);
    else if (n < SHARE_HEADER + 8 || n > SHARE_MAX_MESSAGE)
        ck_fail(err, where, "the server's message claims %llu bytes (not within %u to %llu)",
                (unsigned long long)n, SHARE_HEADER + 8, (unsigned long long)SHARE_MAX_MESSAGE);
    else
        return n;
    return 0;
}

/* What a parse is building, and where its refusals go. */
typedef struct parse {
    ck_cursor c;
    const char *where;
    ck_error *err;
    share_table *t;
    char *next_str;          /* the next free byte of t->strings */
    int64_t *next_dim;       /* of t->dims */
    uint32_t *names;         /* the tensors' names so far: a set, each slot a tensor + 1 */
    size_t mask;             /* its slots - 1 */
    uint64_t seed;           /* of its hash (ck_hash_seed): the names come from the peer */
} parse;

static int truncated(parse *ps, const char *what)
{
    return ck_fail(ps->err, ps->where, "the server's message is cut short in %s (byte %llu)",
                   what, (unsigned long long)ck_cursor_at(&ps->c));
}

/* A string of at most max bytes, without NUL, copied into the table's strings. */
static const char *take_str(parse *ps, uint64_t max, const char *what)
{
    const unsigned char *s;
    uint64_t n;
    uint64_t at = ck_cursor_at(&ps->c);
    int rc = ck_take_str(&ps->c, 4, max, &s, &n);
    if (rc == CK_STR_TOO_LONG) {
        ck_fail(ps->err, ps->where, "the server's %s is %llu bytes, more than %llu (byte %llu)",
                what, (unsigned long long)n, (unsigned long long)max, (unsigned long long)at);
        return NULL;
    }
    if (rc) {
        truncated(ps, what);
        return NULL;
    }
    if (memchr(s, 0, n)) {
        ck_fail(ps->err, ps->where, "the server's %s holds a NUL byte (byte %llu)", what,
                (unsigned long long)at);
        return NULL;
    }
    char *out = memcpy(ps->next_str, s, n);
    out[n] = 0;
    ps->next_str += n + 1;
    return out;
}

/* A count of items each at least min bytes long, checked against the bytes left. */
static int take_count(parse *ps, size_t min, const char *what, uint32_t *n)
{
    uint64_t at = ck_cursor_at(&ps->c);
    if (ck_take_u32(&ps->c, n))
        return truncated(ps, what);
    if ((uint64_t)*n * min > ck_cursor_left(&ps->c))
        return ck_fail(ps->err, ps->where, "the server's message claims %u %s, more than its "
                       "%zu bytes left hold (byte %llu)", *n, what, ck_cursor_left(&ps->c),
                       (unsigned long long)at);
    return 0;
}

static int take_files(parse *ps)
{
    share_table *t = ps->t;
    if (take_count(ps, FILE_MIN, "files", &t->nfiles))
        return -1;
    t->files = calloc(t->nfiles ? t->nfiles : 1, sizeof *t->files);
    if (!t->files)
        return ck_fail(ps->err, ps->where, "out of memory");
    for (uint32_t f = 0; f < t->nfiles; f++) {
        share_file *sf = &t->files[f];
        uint64_t sec;
        if (!(sf->path = take_str(ps, SHARE_MAX_PATH, "file's path")))
            return -1;
        if (ck_take_u64(&ps->c, &sf->dev) || ck_take_u64(&ps->c, &sf->ino) ||
            ck_take_u64(&ps->c, &sf->size) || ck_take_u64(&ps->c, &sec) ||
            ck_take_u32(&ps->c, &sf->mtime_nsec))
            return truncated(ps, "a file's identity");
        sf->mtime_sec = (int64_t)sec;
    }
    return 0;
}

static int take_blobs(parse *ps)
{
    share_table *t = ps->t;
    uint32_t n;
    if (take_count(ps, BLOB_MIN, "blobs", &n))
        return -1;
    ck_plan *p = t->plan;
    p->blobs = calloc(n ? n : 1, sizeof *p->blobs);
    if (!p->blobs)
        return ck_fail(ps->err, ps->where, "out of memory");
    p->nblobs = n;
    for (uint32_t b = 0; b < n; b++) {
        ck_plan_blob *bl = &p->blobs[b];
        uint64_t at = ck_cursor_at(&ps->c);
        if (ck_take_u64(&ps->c, &bl->dest_off) || ck_take_u64(&ps->c, &bl->len))
            return truncated(ps, "the blobs");
        if (bl->len > t->block_size || bl->dest_off > t->block_size - bl->len)
            return ck_fail(ps->err, ps->where, "blob %u (%llu bytes at %llu) lies outside the "
                           "block of %llu bytes (byte %llu)", b, (unsigned long long)bl->len,
                           (unsigned long long)bl->dest_off,
                           (unsigned long long)t->block_size, (unsigned long long)at);
        bl->file = bl->pack_blob = CK_PLAN_NONE;
        bl->owner = CK_PLAN_EVERY;
    }
    p->block_size = t->block_size;
    return 0;
}

/* Adds tensor i's name to the set of names: a name the table holds twice is refused (a lookup
 * by name would find only one of them). */
static int name_once(parse *ps, size_t i, uint64_t at)
{
    const char *name = ps->t->tensors[i].name;
    size_t k = XXH3_64bits_withSeed(name, strlen(name), ps->seed) & ps->mask;
    for (;; k = (k + 1) & ps->mask) {
        if (!ps->names[k]) {
            ps->names[k] = (uint32_t)i + 1;
            return 0;
        }
        if (strcmp(ps->t->tensors[ps->names[k] - 1].name, name) == 0)
            return ck_fail(ps->err, ps->where, "the server's table names tensor '%s' twice "
                           "(byte %llu)", name, (unsigned long long)at);
    }
}

static int take_tensor(parse *ps, size_t i)
{
    share_table *t = ps->t;
    ckl_tensor *x = &t->tensors[i];
    uint8_t code, rank;
    uint64_t at = ck_cursor_at(&ps->c), nbytes, want;
    uint32_t blob;
    if (!(x->name = take_str(ps, SHARE_MAX_NAME, "tensor name")) || name_once(ps, i, at))
        return -1;
    if (ck_take_u8(&ps->c, &code) || ck_take_u8(&ps->c, &rank))
        return truncated(ps, "a tensor");
    if (code >= CK_DTYPE_COUNT || rank > CK_MAX_RANK)
        return ck_fail(ps->err, ps->where, "tensor '%s': dtype %u or rank %u is not one "
                       "(byte %llu)", x->name, code, rank, (unsigned long long)at);
    if ((uint64_t)rank * 8 > ck_cursor_left(&ps->c))
        return truncated(ps, "a tensor's shape");
    x->shape = ps->next_dim;
    for (unsigned d = 0; d < rank; d++)
        ck_take_u64(&ps->c, (uint64_t *)ps->next_dim++);
    if (ck_take_u64(&ps->c, &nbytes) || ck_take_u32(&ps->c, &blob))
        return truncated(ps, "a tensor");
    const ck_plan *p = t->plan;
    if (ck_tensor_nbytes(rank, x->shape, code, &want) != 0 || want != nbytes ||
        (blob == SHARE_NO_BLOB ? nbytes != 0 : blob >= p->nblobs || nbytes == 0 ||
                                                   nbytes > p->blobs[blob].len))
        return ck_fail(ps->err, ps->where, "tensor '%s': its %llu bytes fit neither its dtype "
                       "and shape nor its blob (byte %llu)", x->name,
                       (unsigned long long)nbytes, (unsigned long long)at);
    x->dtype = ck_dtype_name(code);
    x->dtype_code = code;
    x->rank = rank;
    x->nbytes = nbytes;
    t->plan->tensors[i].blob = blob == SHARE_NO_BLOB ? CK_PLAN_NONE : blob;
    return 0;
}

/* Each blob's tensors, ascending (plan.h's blob_tensors); each blob must have one. */
static int group_tensors(parse *ps)
{
    ck_plan *p = ps->t->plan;
    p->blob_tensors = calloc(p->ntensors ? p->ntensors : 1, sizeof *p->blob_tensors);
    if (!p->blob_tensors)
        return ck_fail(ps->err, ps->where, "out of memory");
    for (size_t i = 0; i < p->ntensors; i++)
        if (p->tensors[i].blob != CK_PLAN_NONE)
            p->blobs[p->tensors[i].blob].count++;
    uint32_t first = 0;
    for (size_t b = 0; b < p->nblobs; b++) {
        if (!p->blobs[b].count)
            return ck_fail(ps->err, ps->where, "blob %zu has no tensor", b);
        p->blobs[b].first = first;
        first += p->blobs[b].count;
        p->blobs[b].count = 0;
    }
    for (size_t i = 0; i < p->ntensors; i++) {
        uint32_t b = p->tensors[i].blob;
        if (b == CK_PLAN_NONE)
            continue;
        ck_plan_blob *bl = &p->blobs[b];
        if (!bl->count)
            bl->name = ps->t->tensors[i].name;
        p->blob_tensors[bl->first + bl->count++] = (uint32_t)i;
    }
    return 0;
}

static int take_tensors(parse *ps)
{
    share_table *t = ps->t;
    uint32_t n;
    if (take_count(ps, TENSOR_MIN, "tensors", &n))
        return -1;
    ck_plan *p = t->plan;
    p->tensors = calloc(n ? n : 1, sizeof *p->tensors);
    t->tensors = calloc(n ? n : 1, sizeof *t->tensors);
    size_t slots = 2;
    while (slots < 2 * (size_t)n) /* at most half full */
        slots *= 2;
    ps->names = calloc(slots, sizeof *ps->names);
    ps->mask = slots - 1;
    ps->seed = ck_hash_seed();
    if (!p->tensors || !t->tensors || !ps->names)
        return ck_fail(ps->err, ps->where, "out of memory");
    p->ntensors = n;
    for (uint32_t i = 0; i < n; i++)
        if (take_tensor(ps, i))
            return -1;
    return group_tensors(ps);
}

static int take_table(parse *ps)
{
    share_table *t = ps->t;
    const unsigned char *h = ck_take(&ps->c, SHARE_HANDLE_SIZE);
    uint32_t ordinal;
    if (!h || ck_take_u32(&ps->c, &ordinal) || ck_take_u64(&ps->c, &t->block_size))
        return truncated(ps, "the block");
    memcpy(t->handle, h, SHARE_HANDLE_SIZE);
    if (ordinal > INT16_MAX)
        return ck_fail(ps->err, ps->where, "device %u is no CUDA ordinal", ordinal);
    t->ordinal = (int)ordinal;
    if (!(t->source = take_str(ps, SHARE_MAX_PATH, "source")) || take_files(ps) ||
        take_blobs(ps) || take_tensors(ps))
        return -1;
    return 0;
}

static int take_refusal(parse *ps, share_reply *out)
{
    uint32_t code;
    if (ck_take_u32(&ps->c, &code))
        return truncated(ps, "the refusal");
    const char *text = take_str(ps, SHARE_MAX_TEXT, "refusal");
    if (!text)
        return -1;
    out->refused = 1;
    out->code = code == EACCES || code == EINVAL || code == ENODEV ? (int)code : EIO;
    snprintf(out->text, sizeof out->text, "%s", text);
    return 0;
}

int share_parse(const unsigned char *msg, size_t len, const char *where, share_reply *out,
                ck_error *err)
{
    *out = (share_reply){0};
    if (len < SHARE_HEADER + 8)
        return ck_fail(err, where, "the server's message is cut short (%zu bytes)", len);
    uint64_t want = share_message_length(msg, where, err);
    if (!want)
        return -1;
    if (want != len)
        return ck_fail(err, where, "the server's message is %zu bytes, not the %llu its header "
                       "says", len, (unsigned long long)want);
    if (XXH3_64bits(msg, len - 8) != get_le64(msg + len - 8))
        return ck_fail(err, where, "the server's message fails its checksum");
    share_table *t = &out->table;
    /* Each string takes its length's 4 bytes and its own in the message, and one more than its
     * own here; each dim takes 8 bytes there: what they need here is bounded by len. */
    t->strings = malloc(len);
    t->dims = malloc(len / 8 * sizeof *t->dims + sizeof *t->dims);
    t->plan = calloc(1, sizeof *t->plan);
    parse ps = {.c = ck_cursor_make(msg + SHARE_HEADER, len - SHARE_HEADER - 8, SHARE_HEADER),
                .where = where, .err = err, .t = t, .next_str = t->strings,
                .next_dim = t->dims};
    uint32_t kind = get_le32(msg + 12);
    int rc = !t->strings || !t->dims || !t->plan ? ck_fail(err, where, "out of memory")
             : kind == KIND_TABLE                ? take_table(&ps)
             : kind == KIND_REFUSAL              ? take_refusal(&ps, out)
             : ck_fail(err, where, "the server's message is of kind %u, not a table or a "
                       "refusal", kind);
    if (rc == 0 && ck_cursor_left(&ps.c))
        rc = ck_fail(err, where, "the server's message has %zu bytes past its end (byte %llu)",
                     ck_cursor_left(&ps.c), (unsigned long long)ck_cursor_at(&ps.c));
    free(ps.names);
    if (rc || out->refused)
        share_table_free(t);
    return rc;
}

void share_table_free(share_table *t)
{
    ck_plan_free(t->plan);
    free(t->tensors);
    free(t->files);
    free(t->strings);
    free(t->dims);
    *t = (share_table){0};
}

long share_files_changed(const share_file *files, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        const share_file *sf = &files[i];
        ck_file f = {.path = sf->path, .fd = -1, .size = sf->size,
                     .mtime = {.tv_sec = (time_t)sf->mtime_sec, .tv_nsec = sf->mtime_nsec},
                     .dev = (dev_t)sf->dev, .ino = (ino_t)sf->ino};
        struct stat st;
        if (stat(sf->path, &st) != 0 || !ck_file_matches(&f, &st))
            return (long)i;
    }
    return -1;
}
