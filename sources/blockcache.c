/* blockcache.c — the block cache of remote objects (blockcache.h). */
#include "blockcache.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

enum { HUGE_PAGE = 2 << 20 };

uint64_t bc_next_window(uint64_t window, int sequential)
{
    if (!sequential)
        return 0;
    if (window < BC_FLOOR)
        return BC_FLOOR;
    return window * 2 > BC_MAX_WINDOW ? BC_MAX_WINDOW : window * 2;
}

/* A block is filled in pages: a random read fetches only the pages around what it asks (within
 * its tensor), a sequential one whole blocks. One BC_BLOCK buffer per block keeps one unit for
 * the cache's accounting (cache_mem counts buffers) and its keys (object, block index); a block
 * of few valid pages holds the rest of its buffer unused, the price of not keeping a second
 * structure for small ranges. */
#define PAGES (BC_BLOCK / BC_PAGE)
_Static_assert(PAGES == 64, "a block's pages are the bits of a uint64_t");

typedef struct block {
    bc_object *o;
    uint64_t at;          /* a multiple of BC_BLOCK */
    unsigned char *data;
    size_t len;
    uint64_t used;        /* LRU stamp */
    uint64_t valid;       /* pages holding the object's bytes */
    uint64_t loading;     /* pages a fetch is writing: the block is not evicted */
    uint64_t ahead;       /* pages fetched as readahead that no read has needed yet */
    uint64_t failed;      /* pages whose fetch failed: the read that needs them takes err */
    int err;
    unsigned pins;        /* readers copying out of it without the lock, holds (bc_hold), or
                           * its store to the disk cache: not evicted, its buffer not reused */
    int passed;           /* a read reached the last byte of the whole block: streamed through,
                           * likely done with */
    int on_disk;          /* in the disk cache (pages came from there, or it was stored) */
} block;

/* Every block's buffer holds BC_BLOCK bytes; bytes counts them all, in use or spare. Spare
 * buffers are reused rather than freed while the cache is within its limit: the daemon's memory
 * then stays at what the limit allows, not at what a fragmented heap grows to. */
struct bc_cache {
    pthread_mutex_t lock;
    pthread_cond_t done;
    block *v;
    size_t n, cap;
    uint64_t bytes, clock, limit;
    unsigned char *spare;     /* a list, linked through each buffer's first bytes */
    diskcache *disk;          /* NULL: none */
};

struct bc_object {
    bc_cache *c;
    uint64_t size;
    uint64_t window, next;    /* readahead: the window; where the last read ended (cache lock) */
    uint64_t from;            /* where the last read began (cache lock) */
    uint64_t *bounds;         /* where tensors begin and end, sorted (bc_hint; cache lock) */
    size_t nbounds;
    atomic_int failing;       /* the last block fetched failed: no readahead until one works */
    dc_key key;               /* in the disk cache, when keyed */
    int keyed;
    bc_fetch_fn fetch;
    void *ctx;
};

/* The pages of a block that bytes [from, to) of it touch (from < to <= BC_BLOCK). */
static uint64_t pages_of(uint64_t from, uint64_t to)
{
    uint64_t a = from / BC_PAGE, b = (to - 1) / BC_PAGE;
    return (b == PAGES - 1 ? ~0ull : (1ull << (b + 1)) - 1) & ~((1ull << a) - 1);
}

static block *find_block(const bc_object *o, uint64_t at)
{
    const bc_cache *c = o->c;
    for (size_t i = 0; i < c->n; i++)
        if (c->v[i].o == o && c->v[i].at == at)
            return &c->v[i];
    return NULL;
}

/* A buffer no block uses: spare, or freed when the cache is over its limit. */
static void release(bc_cache *c, unsigned char *data)
{
    if (c->bytes > c->limit) {
        munmap(data, BC_BLOCK);
        c->bytes -= BC_BLOCK;
        return;
    }
    memcpy(data, &c->spare, sizeof c->spare);
    c->spare = data;
}

static void drop_block(bc_cache *c, size_t i)
{
    release(c, c->v[i].data);
    c->v[i] = c->v[--c->n];
}

/* Drops the least recently used block that no fetch writes and was last used before stamp
 * keep (what the read in progress uses stays), of those passed when `passed`; 0 when there is
 * none. */
static int evict_lru(bc_cache *c, uint64_t keep, int passed)
{
    size_t lru = SIZE_MAX;
    for (size_t i = 0; i < c->n; i++)
        if (!c->v[i].loading && !c->v[i].pins && c->v[i].used < keep &&
            (!passed || c->v[i].passed) &&
            (lru == SIZE_MAX || c->v[i].used < c->v[lru].used))
            lru = i;
    if (lru != SIZE_MAX)
        drop_block(c, lru);
    return lru != SIZE_MAX;
}

/* A new block buffer, counted: BC_BLOCK bytes mapped on their own, aligned to and advised
 * into huge pages (a hint). A block's first fill then faults twice, not 1,024 times
 * (BENCHMARKS.md, "Sequential, second round"). Mapped, not malloc'ed: an aligned malloc leaves
 * fragments in the heap that take the daemon's RSS past cache_mem + 32 MiB under a small
 * cache. */
static unsigned char *new_buffer(bc_cache *c)
{
    size_t span = BC_BLOCK + HUGE_PAGE;
    unsigned char *m =
        mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    size_t lead = (size_t)(-(uintptr_t)m & (HUGE_PAGE - 1));
    if (lead)
        munmap(m, lead);
    munmap(m + lead + BC_BLOCK, span - lead - BC_BLOCK);
    madvise(m + lead, BC_BLOCK, MADV_HUGEPAGE);
    c->bytes += BC_BLOCK;
    return m + lead;
}

/* A buffer for a block: a spare, a block's that reads have passed, a new one within the limit,
 * the least recently used block's; past the limit only for a read that needs it (not optional:
 * readahead is). NULL when none. A passed block's buffer comes before a new one: a sequential
 * read does not come back for bytes the kernel's page cache now holds, and fresh memory is dear
 * (the kernel zeroes every new huge page: BENCHMARKS.md, "Sequential, third round"); the cache
 * then stays near the readahead window's size. */
static unsigned char *take_buffer(bc_cache *c, int optional, uint64_t keep)
{
    for (;;) {
        if (c->spare) {
            unsigned char *d = c->spare;
            memcpy(&c->spare, d, sizeof c->spare);
            return d;
        }
        int fits = c->bytes + BC_BLOCK <= c->limit;
        if (evict_lru(c, keep, 1) || (!fits && evict_lru(c, keep, 0)))
            continue;
        if (!fits && optional)
            return NULL;
        return new_buffer(c);
    }
}

/* The length of o's block at `at`: BC_BLOCK but for the last. */
static size_t block_len(const bc_object *o, uint64_t at)
{
    return (size_t)(o->size - at < BC_BLOCK ? o->size - at : BC_BLOCK);
}

/* o's block at `at`, cached or new (no page valid yet); NULL when there is no room for it
 * (optional: readahead) or no memory. Blocks used since stamp keep are not evicted for it.
 * Under the lock. */
static block *get_block(bc_object *o, uint64_t at, int optional, uint64_t keep)
{
    bc_cache *c = o->c;
    block *had = find_block(o, at);
    if (had)
        return had;
    size_t len = block_len(o, at);
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 64;
        block *v = realloc(c->v, cap * sizeof *v);
        if (!v)
            return NULL;
        c->v = v;
        c->cap = cap;
    }
    unsigned char *data = take_buffer(c, optional, keep);
    if (!data)
        return NULL;
    block *b = &c->v[c->n++];
    *b = (block){.o = o, .at = at, .data = data, .len = len, .used = ++c->clock};
    return b;
}

/* Block `at` of o (len bytes) into data: from the disk cache when it has it, else fetched (tried
 * at most tries times; 0: as configured) and stored there. */
static int fetch_block(bc_object *o, unsigned char *data, size_t len, uint64_t at, unsigned tries)
{
    int cached = o->c->disk && o->keyed;
    if (cached && dc_get(o->c->disk, &o->key, at / BC_BLOCK, data, len, 0, len) == 0)
        return 0;
    int rc = o->fetch(o->ctx, data, len, at, tries);
    if (rc == 0 && cached)
        dc_put(o->c->disk, &o->key, at / BC_BLOCK, data, len);
    return rc;
}

typedef struct page_fetch {
    bc_object *o;
    uint64_t at;          /* the block */
    uint64_t pages;       /* a run of its pages */
    size_t from, len;     /* their bytes in the block */
    unsigned char *data;
    int ahead;
} page_fetch;

/* Unpins the block whose buffer is data (under the cache lock). Blocks move in the array (it is
 * realloc'ed, dropped blocks are swapped out), but a pinned block keeps its buffer. */
static void unpin_block(bc_cache *c, const unsigned char *data)
{
    for (size_t i = 0; i < c->n; i++)
        if (c->v[i].data == data) {
            c->v[i].pins--;
            return;
        }
}

/* Writes b, whole now, to the disk cache. Pinned meanwhile, so that neither eviction nor
 * bc_close takes its buffer; its pages are all valid, so no fetch writes them. Under the cache
 * lock, which it drops while writing. */
static void store_block(block *b)
{
    bc_cache *c = b->o->c;
    const dc_key *key = &b->o->key;
    uint64_t index = b->at / BC_BLOCK;
    const unsigned char *data = b->data;
    size_t len = b->len;
    b->on_disk = 1;
    b->pins++;
    pthread_mutex_unlock(&c->lock);
    dc_put(c->disk, key, index, data, len);
    pthread_mutex_lock(&c->lock);
    unpin_block(c, data);
    pthread_cond_broadcast(&c->done); /* bc_close may wait for it */
}

/* Fetches f's pages: from the disk cache when it holds their block (only those bytes are
 * written: the block's other pages may be another fetch's), else from the server; the fetch
 * that makes a block whole stores it there, unless its pages came from there. */
static void *fetch_main(void *arg)
{
    page_fetch *f = arg;
    bc_object *o = f->o;
    bc_cache *c = o->c;
    int cached = o->c->disk && o->keyed;
    int from_disk = cached && dc_get(o->c->disk, &o->key, f->at / BC_BLOCK, f->data,
                                     block_len(o, f->at), f->from, f->len) == 0;
    int rc = from_disk ? 0
                       : o->fetch(o->ctx, f->data + f->from, f->len, f->at + f->from,
                                   f->ahead ? 1 : 0);
    if (!from_disk)
        atomic_store(&o->failing, rc != 0);
    pthread_mutex_lock(&c->lock);
    block *b = find_block(o, f->at); /* loading: never evicted meanwhile */
    b->loading &= ~f->pages;
    int completes = 0;
    if (rc == 0) {
        uint64_t whole = pages_of(0, b->len);
        completes = b->valid != whole && (b->valid | f->pages) == whole;
        b->valid |= f->pages;
        b->on_disk |= from_disk;
    } else {
        b->ahead &= ~f->pages;
        if (!f->ahead) { /* a reader waits for them: it takes the failure */
            b->failed |= f->pages;
            b->err = rc;
        }
    }
    pthread_cond_broadcast(&c->done);
    if (completes && cached && !b->on_disk)
        store_block(b);
    pthread_mutex_unlock(&c->lock);
    free(f);
    return (void *)(intptr_t)rc;
}

/* Starts fetching pages (a run) of block b; ahead: readahead, asked once. On a thread of its
 * own, or, when mine is given and still empty, left there for the caller to run (fetch_main,
 * without the lock): the read that waits for it anyway spares a thread's start and wake-up.
 * Under the cache lock. */
static int start_fetch(block *b, uint64_t pages, int ahead, page_fetch **mine)
{
    page_fetch *f = malloc(sizeof *f);
    pthread_t t;
    size_t first = (size_t)__builtin_ctzll(pages), end = PAGES - (size_t)__builtin_clzll(pages);
    size_t from = first * BC_PAGE, to = end * BC_PAGE < b->len ? end * BC_PAGE : b->len;
    if (f) {
        *f = (page_fetch){.o = b->o, .at = b->at, .pages = pages, .from = from, .len = to - from,
                     .data = b->data, .ahead = ahead};
        b->loading |= pages;
        if (mine && !*mine) {
            *mine = f;
            return 0;
        }
        if (pthread_create(&t, NULL, fetch_main, f) == 0) {
            pthread_detach(t);
            return 0;
        }
        b->loading &= ~pages;
    }
    free(f);
    return -ENOMEM;
}

/* Fetches the pages of b in mask that are neither held nor coming, a request per run (one of
 * those the read needs may be left in *mine: start_fetch). A run holding none of the pages the
 * read needs is readahead (asked once); with mark, the pages beyond need are marked ahead: the
 * read that first needs them widens the window. */
static int fill(block *b, uint64_t mask, uint64_t need, int mark, page_fetch **mine)
{
    uint64_t missing = mask & ~b->valid & ~b->loading;
    while (missing) {
        uint64_t run = missing & ~(missing + (missing & -missing)); /* the lowest run of bits */
        int ahead = !(run & need);
        int rc = start_fetch(b, run, ahead, ahead ? NULL : mine);
        if (rc)
            return ahead ? 0 : rc;
        if (mark)
            b->ahead |= run & ~need;
        missing &= ~run;
    }
    return 0;
}

/* Whether fetches of o are still running, or its blocks being stored (under the cache lock). */
static int busy(const bc_object *o)
{
    const bc_cache *c = o->c;
    for (size_t i = 0; i < c->n; i++)
        if (c->v[i].o == o && (c->v[i].loading || c->v[i].pins))
            return 1;
    return 0;
}

/* Where the tensor holding byte off ends: the first boundary after it (http_hint), else the
 * object's end. */
static uint64_t tensor_end(const bc_object *o, uint64_t off)
{
    size_t lo = 0, hi = o->nbounds;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (o->bounds[mid] <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < o->nbounds ? o->bounds[lo] : o->size;
}

/* Notes a read of [off, off+len) of o, and starts fetching the pages it needs and those its
 * readahead window covers (under the cache lock; blocks used since stamp keep are not evicted
 * for it; one fetch may be left in *mine: start_fetch). A read that finds its pages neither held
 * nor coming, at a place the reads so far did not lead to (random), fetches at least BC_FLOOR
 * bytes from it, within its tensor; a sequential one widens the readahead window when it misses
 * or first needs pages fetched ahead, and keeps the window's blocks coming, whole. */
static int start_reads(bc_object *o, size_t len, uint64_t off, uint64_t keep, page_fetch **mine)
{
    bc_cache *c = o->c;
    uint64_t end = off + len, first = off / BC_BLOCK * BC_BLOCK;
    /* A later piece of a read lent a block at a time (bc_hold) was noted with the first: a
     * random read across two blocks must not look sequential for its second. */
    if (off > o->from && end == o->next)
        return 0;
    /* Sequential within a block: the kernel's reads of one stream reach several threads of the
     * daemon, and arrive a little out of order. */
    int seq = off <= o->next + BC_BLOCK && off + BC_BLOCK >= o->next;
    o->next = seq && end < o->next ? o->next : end;
    o->from = off;
    int missed = 0, fresh = 0;
    for (uint64_t at = first; at < end; at += BC_BLOCK) {
        block *b = find_block(o, at);
        uint64_t to = end - at < BC_BLOCK ? end - at : BC_BLOCK;
        uint64_t need = pages_of(off > at ? off - at : 0, to);
        missed |= !b || (need & ~b->valid & ~b->loading) != 0;
        fresh |= b && (need & b->ahead) != 0;
        if (b)
            b->ahead &= ~need;
    }
    o->window = !seq ? 0 : missed || fresh ? bc_next_window(o->window, 1) : o->window;
    uint64_t want = end;
    if (!seq && missed) {
        uint64_t floor = off + BC_FLOOR, stop = tensor_end(o, off);
        want = floor < stop ? floor : stop;
        want = want > end ? want : end;
    } else if (!atomic_load(&o->failing) && o->window) {
        want = end + o->window;
        /* A long stream: whole blocks, the fewest requests; with a disk cache, any stream: a
         * block is stored only whole, and a reader that goes on is likely to read it all. */
        if (o->window >= BC_BLOCK || (o->c->disk && o->keyed))
            want = (want + BC_BLOCK - 1) / BC_BLOCK * BC_BLOCK;
    }
    want = want < o->size ? want : o->size;
    int rc = 0;
    for (uint64_t at = first; at < want && rc == 0; at += BC_BLOCK) {
        int beyond = at >= end; /* readahead only */
        block *b = get_block(o, at, beyond, keep);
        if (!b)
            return beyond ? 0 : -ENOMEM;
        if (at < end)
            b->used = ++c->clock;
        uint64_t from = off > at ? off - at : 0, to = want - at < b->len ? want - at : b->len;
        uint64_t need = end > at ? pages_of(from, end - at < b->len ? end - at : b->len) : 0;
        rc = fill(b, pages_of(from, to), need, seq, mine);
    }
    return rc;
}

/* Runs the fetch start_reads left to the read (under the cache lock, dropped meanwhile): its
 * pages are loading, so nothing evicts their block. */
static void run_mine(bc_cache *c, page_fetch *mine)
{
    if (!mine)
        return;
    pthread_mutex_unlock(&c->lock);
    fetch_main(mine);
    pthread_mutex_lock(&c->lock);
}

/* Waits (under the cache lock) until the pages of o's block at `at` that [off, end) covers are
 * held, fetching again those that failed or were dropped for room, and pins the block: it stays
 * in the cache, its data in place, until unpin_block. 0, or -errno (a failure is taken: the
 * next read asks again). */
static int pin_pages(bc_object *o, uint64_t at, uint64_t off, uint64_t end, uint64_t keep,
                     block **out)
{
    bc_cache *c = o->c;
    uint64_t from = off > at ? off - at : 0;
    for (;;) {
        block *b = get_block(o, at, 0, keep);
        if (!b)
            return -ENOMEM;
        uint64_t to = end - at < b->len ? end - at : b->len;
        uint64_t need = pages_of(from, to);
        if (need & b->failed) {
            b->failed = 0;
            return b->err;
        }
        if (need & ~b->valid) { /* coming (or dropped for room: asked again) */
            int rc = fill(b, need, need, 0, NULL);
            if (rc)
                return rc;
            if (need & ~b->valid & b->loading)
                pthread_cond_wait(&c->done, &c->lock);
            continue;
        }
        b->used = ++c->clock;
        b->pins++;
        /* Passed: a read reached the last byte of a whole block (a stream's; a random read's
         * pages rarely make one whole). */
        b->passed |= to == b->len && b->valid == pages_of(0, b->len);
        *out = b;
        return 0;
    }
}

/* Copies [off, off+len) out of the cache, a block at a time, waiting for its pages. Under the
 * cache lock, which it drops while copying. */
static int copy_out(bc_object *o, unsigned char *buf, size_t len, uint64_t off, uint64_t keep)
{
    bc_cache *c = o->c;
    uint64_t end = off + len;
    for (uint64_t at = off / BC_BLOCK * BC_BLOCK; at < end; at += BC_BLOCK) {
        block *b;
        int rc = pin_pages(o, at, off, end, keep, &b);
        if (rc)
            return rc;
        uint64_t from = off > at ? off - at : 0;
        uint64_t to = end - at < b->len ? end - at : b->len;
        /* The copy runs unlocked, the block pinned: the other readers' copies and the fetches'
         * completions do not queue behind it. */
        const unsigned char *data = b->data;
        pthread_mutex_unlock(&c->lock);
        memcpy(buf + (at + from - off), data + from, (size_t)(to - from));
        pthread_mutex_lock(&c->lock);
        unpin_block(c, data);
    }
    return 0;
}

/* Notes a read of [off, off+len) and starts its fetches, running the one left to it (under the
 * cache lock). *keep: the stamp of what the read touches, which stays until the read is done
 * with it. */
static int begin_read(bc_object *o, size_t len, uint64_t off, uint64_t *keep)
{
    *keep = o->c->clock + 1;
    page_fetch *mine = NULL;
    int rc = start_reads(o, len, off, *keep, &mine);
    run_mine(o->c, mine);
    return rc;
}

/* Reads [off, off+len) (within one or two blocks) through the cache. */
static int read_cached(bc_object *o, unsigned char *buf, size_t len, uint64_t off)
{
    bc_cache *c = o->c;
    uint64_t keep;
    pthread_mutex_lock(&c->lock);
    int rc = begin_read(o, len, off, &keep);
    if (rc == 0)
        rc = copy_out(o, buf, len, off, keep);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

typedef struct part {
    bc_object *o;
    unsigned char *buf;
    size_t len;
    uint64_t off;
    int rc;
} part;

static void *part_main(void *arg)
{
    part *p = arg;
    p->rc = p->o->fetch(p->o->ctx, p->buf, p->len, p->off, 0);
    return NULL;
}

/* A large read with a disk cache: the blocks it touches, taken in turn by up to
 * BC_PARALLEL threads, each block whole (fetch_block); a block the read covers only in
 * part goes through a buffer of the thread's. */
typedef struct blocks {
    bc_object *o;
    unsigned char *buf;
    size_t len;
    uint64_t off, last;       /* last: the index of the last block */
    atomic_uint_fast64_t next; /* the index of the next block to take */
    atomic_int rc;
} blocks;

static int copy_block(blocks *j, uint64_t i, unsigned char **bounce)
{
    uint64_t at = i * BC_BLOCK, end = j->off + j->len;
    size_t blen = block_len(j->o, at);
    uint64_t from = at > j->off ? at : j->off, to = at + blen < end ? at + blen : end;
    if (from == at && to == at + blen)
        return fetch_block(j->o, j->buf + (at - j->off), blen, at, 0);
    if (!*bounce && !(*bounce = malloc(BC_BLOCK)))
        return -ENOMEM;
    int rc = fetch_block(j->o, *bounce, blen, at, 0);
    if (rc == 0)
        memcpy(j->buf + (from - j->off), *bounce + (from - at), (size_t)(to - from));
    return rc;
}

static void *blocks_main(void *arg)
{
    blocks *j = arg;
    unsigned char *bounce = NULL;
    for (uint64_t i; !atomic_load(&j->rc) && (i = atomic_fetch_add(&j->next, 1)) <= j->last;) {
        int rc = copy_block(j, i, &bounce);
        if (rc)
            atomic_compare_exchange_strong(&j->rc, &(int){0}, rc);
    }
    free(bounce);
    return NULL;
}

static int read_blocks(bc_object *o, unsigned char *buf, size_t len, uint64_t off)
{
    blocks j = {.o = o, .buf = buf, .len = len, .off = off, .last = (off + len - 1) / BC_BLOCK};
    atomic_init(&j.next, off / BC_BLOCK);
    atomic_init(&j.rc, 0);
    uint64_t count = j.last - off / BC_BLOCK + 1;
    size_t n = count < BC_PARALLEL ? (size_t)count : BC_PARALLEL;
    pthread_t t[BC_PARALLEL];
    size_t started = 0;
    while (started + 1 < n && pthread_create(&t[started], NULL, blocks_main, &j) == 0)
        started++;
    blocks_main(&j);
    for (size_t i = 0; i < started; i++)
        pthread_join(t[i], NULL);
    return atomic_load(&j.rc);
}

/* A large read, in up to BC_PARALLEL parallel requests of at least BC_BLOCK bytes. */
static int read_direct(bc_object *o, unsigned char *buf, size_t len, uint64_t off)
{
    if (o->c->disk && o->keyed)
        return read_blocks(o, buf, len, off);
    size_t n = len / BC_BLOCK < BC_PARALLEL ? len / BC_BLOCK : BC_PARALLEL;
    size_t each = (len + n - 1) / n;
    part parts[BC_PARALLEL];
    pthread_t t[BC_PARALLEL];
    int started[BC_PARALLEL] = {0}, rc = 0;
    for (size_t i = 0; i < n; i++) {
        size_t at = i * each, k = len - at < each ? len - at : each;
        parts[i] = (part){.o = o, .buf = buf + at, .len = k, .off = off + at};
        started[i] = i + 1 < n && pthread_create(&t[i], NULL, part_main, &parts[i]) == 0;
        if (!started[i])
            part_main(&parts[i]);
    }
    for (size_t i = 0; i < n; i++) {
        if (started[i])
            pthread_join(t[i], NULL);
        rc = rc ? rc : parts[i].rc;
    }
    return rc;
}

/* --- the interface ------------------------------------------------------------------------ */

bc_cache *bc_new(uint64_t mem, diskcache *disk)
{
    bc_cache *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->done, NULL);
    c->limit = mem ? mem : BC_MEM_DEFAULT;
    c->disk = disk;
    return c;
}

void bc_free(bc_cache *c)
{
    if (!c)
        return;
    while (c->spare) {
        unsigned char *d = c->spare;
        memcpy(&c->spare, d, sizeof c->spare);
        munmap(d, BC_BLOCK);
    }
    free(c->v);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->done);
    free(c);
}

bc_object *bc_open(bc_cache *c, uint64_t size, uint64_t next, const dc_key *key,
                   bc_fetch_fn fetch, void *ctx)
{
    bc_object *o = calloc(1, sizeof *o);
    if (!o)
        return NULL;
    *o = (bc_object){.c = c, .size = size, .next = next, .keyed = key != NULL, .fetch = fetch,
                     .ctx = ctx};
    if (key)
        o->key = *key;
    atomic_init(&o->failing, 0);
    return o;
}

void bc_close(bc_object *o)
{
    bc_cache *c = o->c;
    pthread_mutex_lock(&c->lock);
    while (busy(o)) /* readahead still running, or a store: they use o's blocks */
        pthread_cond_wait(&c->done, &c->lock);
    for (size_t i = c->n; i-- > 0;)
        if (c->v[i].o == o)
            drop_block(c, i);
    pthread_mutex_unlock(&c->lock);
    free(o->bounds);
    free(o);
}

int bc_read(bc_object *o, void *buf, size_t len, uint64_t off)
{
    return len >= BC_BLOCK ? read_direct(o, buf, len, off) : read_cached(o, buf, len, off);
}

/* The whole read is noted (readahead, the fetches of the pages it needs in every block) with
 * its first piece. */
ssize_t bc_hold(bc_object *o, size_t len, uint64_t off, const void **ptr, void **token)
{
    bc_cache *c = o->c;
    uint64_t keep;
    pthread_mutex_lock(&c->lock);
    int rc = begin_read(o, len, off, &keep);
    uint64_t at = off / BC_BLOCK * BC_BLOCK;
    if (len > at + BC_BLOCK - off)
        len = (size_t)(at + BC_BLOCK - off);
    block *b = NULL;
    if (rc == 0)
        rc = pin_pages(o, at, off, off + len, keep, &b);
    if (rc == 0) {
        *ptr = b->data + (off - at);
        *token = b->data;
    }
    pthread_mutex_unlock(&c->lock);
    return rc ? rc : (ssize_t)len;
}

void bc_release(bc_object *o, void *token)
{
    pthread_mutex_lock(&o->c->lock);
    unpin_block(o->c, token);
    pthread_mutex_unlock(&o->c->lock);
}

void bc_hint(bc_object *o, const uint64_t *bounds, size_t n)
{
    uint64_t *copy = n ? malloc(n * sizeof *copy) : NULL;
    if (copy)
        memcpy(copy, bounds, n * sizeof *copy);
    pthread_mutex_lock(&o->c->lock);
    free(o->bounds);
    o->bounds = copy;
    o->nbounds = copy ? n : 0;
    pthread_mutex_unlock(&o->c->lock);
}
