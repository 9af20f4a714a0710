/* pickle.c — the safe pickle VM (see pickle.h).
 *
 * Beyond the header's contract, what the VM guarantees about the tree it returns, and why:
 *  - It is finite and acyclic. A list, dict or set may change (APPEND, SETITEM, ADDITEMS) only
 *    until it is first put inside another container; after that it is frozen. Python's pickler
 *    always finishes a container before its parent takes it, so real pickles never hit this;
 *    only a cycle needs it, because the last edge closing a cycle must change a container that
 *    already has a parent (or put a container into itself, also refused).
 *  - Because children are frozen when adopted, a container's depth (1 + its deepest child's)
 *    and its walk size (the values a walk visits when it expands shared containers each time it
 *    meets them) are exact and final. Depth is bounded by max_depth and the walk by
 *    max_objects, so a consumer may walk the result naively, even recursively up to max_depth.
 *  - Memory stays proportional to the input: every value created counts against max_objects,
 *    and the REDUCEs that copy (OrderedDict(pairs), torch.Size(list), _codecs.encode,
 *    torch.device(type, index)) share a budget of 8 bytes per input byte, so no short pickle
 *    can copy one big value over and over.
 *  - A dict holds each key once, in the order keys were first set, with the last value set
 *    for it; keys Python finds equal (1, True, 1.0) are one key, named by the first (see
 *    set_item). A set keeps the first of equal members. A list, set or dict as a key or member
 *    is refused, as Python refuses it.
 *
 * Here: the VM and what REDUCE builds (the torch reducers). The opcode list and the globals it
 * allows or refuses are tables in pickle_policy.c; protocol 0's text arguments are decoded in
 * pickle_text.c; UTF-8 is utf8.c's.
 */
#include "pickle.h"

#include <stdarg.h>
#include <stdio.h>
#include <sanitizer/asan_interface.h> /* no-ops unless built with AddressSanitizer */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "../base/bytes.h"
#include "../base/cursor.h"
#include "index.h" /* CK_MAX_RANK */
#include "pickle_policy.h"
#include "pickle_text.h"
#include "../base/seed.h"
#include "../base/utf8.h"

#define OTHER_LIMITS .max_stack = 1000000, .max_marks = 10000, .max_depth = 1000
const pk_limits pk_default_limits = {OTHER_LIMITS, .max_memo = 10000000,
                                     .max_objects = 50000000};
/* A DCP .metadata of up to 256 MiB (dcp.c's DCP_MAX_METADATA) may hold 1,000,000 chunks
 * (DCP_MAX_CHUNKS) and more: Python's pickler (protocols 2-5) writes each chunk (its
 * ChunkStorageMetadata, two torch.Sizes, its MetadataIndex and _StorageInfo, their state dicts)
 * in 130 bytes or more, with 16 memo slots and 68 opcodes: at most 1/8 slot and 1/2 object per
 * byte, 32M slots and 128M objects for a full one. These are half as much again; the default's
 * 10M slots stopped at 625,000 chunks. Memory stays proportional to the input all the same: a
 * slot or an object costs an opcode byte. */
const pk_limits pk_dcp_limits = {OTHER_LIMITS, .max_memo = 48000000, .max_objects = 192000000,
                                 .dcp = 1};

#define COPY_PER_INPUT_BYTE 8
#define COPY_SLACK (1u << 20)
#define MAX_QUOTE 100 /* characters of a refused global's module or name quoted in a message */
/* Ints in this range are made once per pickle and shared, as Python shares them: a checkpoint
 * repeats 0, 1 and small dims in every tensor's arguments. */
#define SMALL_INT_MIN (-5)
#define SMALL_INT_MAX 256

/* --- values ---------------------------------------------------------------------------- */

/* BOX_PINNED: held where recycle cannot follow (see there). */
enum { BOX_SET = 1, BOX_FROZENSET = 2, BOX_PINNED = 4 };

/* A tuple, list or dict: a pk_obj of which only type and u.seq are used, with the container's
 * own fields in the bytes that u's larger members would take. 48 bytes, not 80 as a pk_obj
 * followed by them: a checkpoint makes three per tensor, and the fresh memory they take is
 * much of what parsing one costs. It lays out type and seq as pk_obj does (checked below), so
 * a container's pk_obj * is its pk_box * (the build has no strict aliasing). */
typedef struct pk_box {
    uint8_t type;         /* pk_obj.type */
    uint8_t frozen;       /* inside another container: no more changes (see the top) */
    uint8_t flags;        /* BOX_SET, BOX_FROZENSET: a set shown as a list; BOX_PINNED */
    uint32_t cap;         /* items allocated (BOX_MAX_ITEMS at most) */
    struct {              /* pk_obj.u.seq */
        pk_obj **items;
        size_t n;
    } seq;
    uint64_t walk;        /* values a walk visits, shared containers expanded: 1 + children's */
    union {
        const int64_t *ints;    /* TUPLE: its ints, converted once (sizes and strides recur) */
        struct key_table *keys; /* DICT, set: its keys by hash, past KEY_SCAN keys (see there) */
    };
    uint32_t depth;       /* 1 + the deepest child's depth (max_depth bounds it), or more
                           * once a dict's deepest value was replaced (see set_item) */
    uint32_t memo;        /* 1 + the one memo index that holds it, or 0 (recycle) */
} pk_box;

_Static_assert(offsetof(pk_box, type) == offsetof(pk_obj, type) &&
               offsetof(pk_box, seq.items) == offsetof(pk_obj, u.seq.items) &&
               offsetof(pk_box, seq.n) == offsetof(pk_obj, u.seq.n) &&
               sizeof(pk_box) <= sizeof(pk_obj),
               "a pk_box is read as a pk_obj");

/* No container holds more items than this: cap fits in 32 bits (and no real pickle comes
 * near: that is 32 GiB of item pointers). */
#define BOX_MAX_ITEMS UINT32_MAX

/* The items of a box that recycle takes back for reuse: a persistent id has 5,
 * _rebuild_tensor_v2's arguments 6, and a box of 5 takes as many bytes as one of 6. */
#define SPARE_CAP 6
#define SPARE_BYTES (sizeof(pk_box) + SPARE_CAP * sizeof(pk_obj *))
_Static_assert((sizeof(pk_box) + (SPARE_CAP - 1) * sizeof(pk_obj *) + 15) / 16 ==
               (sizeof(pk_box) + SPARE_CAP * sizeof(pk_obj *) + 15) / 16,
               "a box of SPARE_CAP - 1 items takes the arena's bytes of one of SPARE_CAP");

/* What the memo holds in place of a box that recycle took back: a GET of it makes the VM run
 * the pickle again without recycling (see recycle). */
static pk_obj recycled_memo;

static int is_container(const pk_obj *o)
{
    return (unsigned)o->type - PK_TUPLE <= PK_OBJECT - PK_TUPLE; /* four in a row */
}

_Static_assert(PK_LIST == PK_TUPLE + 1 && PK_DICT == PK_TUPLE + 2 && PK_OBJECT == PK_TUPLE + 3,
               "containers in a row");

static pk_box *box(pk_obj *o)
{
    return (pk_box *)o;
}

static pk_obj *obj(pk_box *b)
{
    return (pk_obj *)b;
}

static size_t depth_of(const pk_obj *o)
{
    return is_container(o) ? ((const pk_box *)o)->depth : 0;
}

static uint64_t walk_of(const pk_obj *o)
{
    return is_container(o) ? ((const pk_box *)o)->walk : 1;
}

const char *pk_type_name(enum pk_type t)
{
    static const char *const names[] = {
        [PK_NONE] = "None",   [PK_BOOL] = "bool",       [PK_INT] = "int",
        [PK_FLOAT] = "float", [PK_STR] = "str",         [PK_BYTES] = "bytes",
        [PK_TUPLE] = "tuple", [PK_LIST] = "list",       [PK_DICT] = "dict",
        [PK_OBJECT] = "object",
        [PK_GLOBAL] = "global", [PK_STORAGE] = "storage", [PK_TENSOR] = "tensor",
    };
    return (unsigned)t < sizeof names / sizeof *names ? names[t] : "?";
}

/* --- the machine ----------------------------------------------------------------------- */

typedef struct memo_slot {
    uint64_t key;
    pk_obj *val;              /* NULL: empty */
} memo_slot;

/* Objects found by their value: open addressing over pointers alone, with a hash computed from
 * the value when asked, not stored: a slot that held the hash and the key beside the pointer
 * would be three times as large, and a pickle of many storages would touch that much more fresh
 * memory. */
typedef struct obj_set {
    pk_obj **slot;            /* NULL: empty */
    size_t cap, n;
} obj_set;

typedef struct vm {
    ck_cursor in;             /* the pickle, at its file offset */
    size_t op;                /* where the running opcode starts */
    uint8_t opcode;
    const char *path;
    pk_limits lim;
    ck_error *err;
    int truncated;
    ck_arena *arena;
    size_t nobjects;
    uint64_t copy_left;       /* bytes copying REDUCEs may still make */
    uint64_t seed;            /* hash seed: key collisions cannot be planned */
    pk_obj *none, *yes, *no;  /* one each, as in Python */
    pk_obj *empty_tuple;      /* likewise; so are the small ints: */
    pk_obj *small_ints[SMALL_INT_MAX - SMALL_INT_MIN + 1];

    pk_obj **stack;
    size_t sp, cap_stack;
    size_t *marks;            /* stack heights at each MARK */
    size_t nmarks, cap_marks;

    /* The memo. Python numbers it densely from 0, so most indices live in an array; an index
     * far beyond what has been stored goes to a hash table, so a huge index costs one slot.
     * dense[0 .. dense_init) are set or NULL; the rest is not even touched yet. */
    pk_obj **dense;
    size_t cap_dense, dense_init;
    memo_slot *sparse;
    size_t cap_sparse, nsparse;
    size_t nmemo;             /* distinct indices set: MEMOIZE's next index */

    obj_set stores;           /* storage key -> its one PK_STORAGE */
    obj_set int_tuples;       /* the tuples of ints made so far, by value (see build_seq) */
    struct key_table *tables; /* every dict's and set's key table, to free */

    int recycle;              /* boxes used up may be reused (recycle) */
    int rerun;                /* a GET found one: run again with recycle 0 */
    pk_box *spare;            /* boxes recycle took back, linked through seq.items */
} vm;

static unsigned long long at(const vm *v)
{
    return (unsigned long long)(v->in.base + v->op);
}

static const char *opname(const vm *v)
{
    const char *name = pk_opcode_name(v->opcode);
    return name ? name : "?";
}

/* Sets the error to the message, then " (byte N)" with the running opcode's file offset. */
__attribute__((format(printf, 2, 3))) static int fail(vm *v, const char *fmt, ...)
{
    char what[sizeof v->err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return ck_fail(v->err, v->path, "%s (byte %llu)", what, at(v));
}

static int oom(vm *v)
{
    return fail(v, "out of memory running %s", opname(v));
}

/* --- input ----------------------------------------------------------------------------- */

/* The hot paths (take, push, need) stay small enough to inline; what they say when they fail
 * is out of line. */
__attribute__((noinline)) static const unsigned char *short_input(vm *v, uint64_t n,
                                                                  const char *what)
{
    v->truncated = 1;
    fail(v, "truncated pickle: %s %s needs %llu bytes, %zu remain", opname(v), what,
         (unsigned long long)n, ck_cursor_left(&v->in));
    return NULL;
}

static inline const unsigned char *take(vm *v, uint64_t n, const char *what)
{
    const unsigned char *p = ck_take(&v->in, n);
    return p ? p : short_input(v, n, what);
}

/* An n-byte little-endian unsigned integer, n 1, 2, 4 or 8. */
static inline int take_uint(vm *v, unsigned n, const char *what, uint64_t *out)
{
    return ck_take_le(&v->in, n, out) ? (short_input(v, n, what), -1) : 0;
}

/* The text up to the next newline (protocol 0 arguments), which is consumed but not returned. */
static const unsigned char *take_line(vm *v, size_t *n)
{
    const unsigned char *p = ck_take_until(&v->in, '\n', n);
    if (!p) {
        v->truncated = 1;
        fail(v, "truncated pickle: %s argument has no newline before the end of the input",
             opname(v));
    }
    return p;
}

/* A length of lenbytes bytes, then that many bytes (what they are); a 4-byte length is
 * signed when signed_len, as Python reads it. */
static inline const unsigned char *take_counted(vm *v, unsigned lenbytes, int signed_len,
                                                const char *what, uint64_t *n)
{
    const unsigned char *p = NULL;
    switch (ck_take_str(&v->in, lenbytes, signed_len ? INT32_MAX : UINT64_MAX, &p, n)) {
    case CK_STR_NO_LENGTH: return short_input(v, lenbytes, "length");
    case CK_STR_TOO_LONG: return fail(v, "%s has a negative byte count", opname(v)), NULL;
    case CK_STR_NO_BYTES: return short_input(v, *n, what);
    }
    return p;
}

/* --- allocation ------------------------------------------------------------------------ */

static void *alloc(vm *v, size_t n)
{
    void *p = ck_arena_alloc(&v->arena, n);
    if (!p)
        oom(v);
    return p;
}

static int count_object(vm *v)
{
    if (v->nobjects >= v->lim.max_objects)
        return fail(v, "%s: more than %zu objects", opname(v), v->lim.max_objects);
    v->nobjects++;
    return 0;
}

/* The bytes an object of type t takes: its type and its own member of the union, not the
 * largest member (a tensor's). A checkpoint makes a storage and two strs per tensor, and the
 * fresh memory they take is much of what parsing costs (pickle.h: only a tensor is ever
 * copied whole). */
#define OBJ_SIZE(member) (offsetof(pk_obj, u) + sizeof(((pk_obj *)0)->u.member))

static const uint8_t obj_size[] = {
    [PK_NONE] = OBJ_SIZE(i),  [PK_BOOL] = OBJ_SIZE(i),    [PK_INT] = OBJ_SIZE(i),
    [PK_FLOAT] = OBJ_SIZE(f), [PK_STR] = OBJ_SIZE(str),   [PK_BYTES] = OBJ_SIZE(str),
    [PK_TUPLE] = sizeof(pk_obj), [PK_LIST] = sizeof(pk_obj), [PK_DICT] = sizeof(pk_obj),
    [PK_GLOBAL] = OBJ_SIZE(global), [PK_STORAGE] = OBJ_SIZE(storage),
    [PK_TENSOR] = sizeof(pk_obj),
};

static pk_obj *new_obj(vm *v, enum pk_type t)
{
    if (count_object(v))
        return NULL;
    size_t size = obj_size[t];
    pk_obj *o = alloc(v, size);
    if (o) {
        memset(o, 0, size);
        o->type = (uint8_t)t;
    }
    return o;
}

/* Room for extra more items. Old arrays stay in the arena: doubling wastes at most as much as
 * the final array holds. */
static int reserve(vm *v, pk_box *b, size_t extra)
{
    size_t n = b->seq.n;
    if (b->cap - n >= extra)
        return 0;
    if (extra > BOX_MAX_ITEMS - n)
        return oom(v);
    size_t cap = (size_t)b->cap * 2 > n + extra ? (size_t)b->cap * 2 : n + extra;
    if (cap > BOX_MAX_ITEMS)
        cap = BOX_MAX_ITEMS;
    pk_obj **items = alloc(v, cap * sizeof *items);
    if (!items)
        return -1;
    if (n)
        memcpy(items, b->seq.items, n * sizeof *items);
    b->seq.items = items;
    b->cap = (uint32_t)cap;
    return 0;
}

static pk_box *new_box(vm *v, enum pk_type t, size_t cap)
{
    if (v->lim.max_depth < 1)
        return fail(v, "%s: containers nested deeper than %zu", opname(v), v->lim.max_depth),
               NULL;
    if (count_object(v))
        return NULL;
    if (cap > BOX_MAX_ITEMS)
        return oom(v), NULL;
    if (cap == SPARE_CAP - 1) /* the same bytes either way: the arena rounds to 16 */
        cap = SPARE_CAP;
    /* The items a container starts with live right behind it: one allocation, not two. */
    pk_box *b = cap == SPARE_CAP && v->spare ? v->spare
                                             : alloc(v, sizeof *b + cap * sizeof(pk_obj *));
    if (!b)
        return NULL;
    if (b == v->spare) {
        ASAN_UNPOISON_MEMORY_REGION(b, SPARE_BYTES);
        v->spare = (pk_box *)b->seq.items;
    }
    *b = (pk_box){.type = (uint8_t)t, .seq.items = (pk_obj **)(b + 1), .depth = 1,
                  .walk = 1, .cap = (uint32_t)cap};
    return b;
}

/* Bytes a REDUCE is about to copy out of values it already has. */
static int charge_copy(vm *v, uint64_t n, const char *what)
{
    if (n > v->copy_left)
        return fail(v, "%s: copies more than %d bytes per input byte in all", what,
                    COPY_PER_INPUT_BYTE);
    v->copy_left -= n;
    return 0;
}

static int check_open(vm *v, const pk_box *b)
{
    if (b->frozen)
        return fail(v, "%s changes a %s that is already inside another container (that could "
                    "make a cycle)", opname(v), pk_type_name(b->type));
    return 0;
}

/* Lets child into b in place of a value whose walk was gone (0 when it takes a new place),
 * enforcing what the top comment promises. */
static inline int admit(vm *v, pk_box *b, pk_obj *child, uint64_t gone)
{
    if (check_open(v, b))
        return -1;
    if (child == obj(b))
        return fail(v, "%s puts a %s inside itself", opname(v), pk_type_name(b->type));
    size_t d = depth_of(child) + 1;
    if (d > v->lim.max_depth)
        return fail(v, "%s: containers nested deeper than %zu", opname(v), v->lim.max_depth);
    uint64_t w = b->walk - gone + walk_of(child);
    if (w > v->lim.max_objects)
        return fail(v, "%s: a walk of the result would visit more than %zu values (shared "
                    "containers)", opname(v), v->lim.max_objects);
    if (d > b->depth)
        b->depth = (uint32_t)d;
    b->walk = w;
    if (is_container(child))
        box(child)->frozen = 1;
    return 0;
}

/* Adds child to b (the caller has made room). */
static inline int adopt(vm *v, pk_box *b, pk_obj *child)
{
    if (admit(v, b, child, 0))
        return -1;
    b->seq.items[b->seq.n++] = child;
    return 0;
}

static pk_obj *new_str(vm *v, enum pk_type t, const void *s, size_t len)
{
    if (len > SIZE_MAX - OBJ_SIZE(str) - 1)
        return oom(v), NULL;
    if (count_object(v))
        return NULL;
    /* The bytes live right behind the object: one allocation, not two. */
    pk_obj *o = alloc(v, OBJ_SIZE(str) + len + 1);
    if (!o)
        return NULL;
    o->type = (uint8_t)t;
    char *copy = (char *)o + OBJ_SIZE(str);
    if (len)
        memcpy(copy, s, len);
    copy[len] = 0;
    o->u.str.s = copy;
    o->u.str.len = len;
    return o;
}

static pk_obj *new_int(vm *v, int64_t i)
{
    pk_obj **slot = i >= SMALL_INT_MIN && i <= SMALL_INT_MAX ? &v->small_ints[i - SMALL_INT_MIN]
                                                             : NULL;
    if (slot && *slot)
        return *slot;
    pk_obj *o = new_obj(v, PK_INT);
    if (o)
        o->u.i = i;
    if (slot)
        *slot = o;
    return o;
}

static pk_obj *singleton(vm *v, pk_obj **slot, enum pk_type t, int64_t i)
{
    if (!*slot && (*slot = new_obj(v, t)))
        (*slot)->u.i = i;
    return *slot;
}

/* --- the stack ------------------------------------------------------------------------- */

static size_t floor_of(const vm *v)
{
    return v->nmarks ? v->marks[v->nmarks - 1] : 0;
}

__attribute__((noinline)) static int grow_stack(vm *v)
{
    if (v->sp >= v->lim.max_stack)
        return fail(v, "%s: more than %zu values on the stack", opname(v), v->lim.max_stack);
    size_t cap = v->cap_stack ? 2 * v->cap_stack : 64;
    if (cap > v->lim.max_stack)
        cap = v->lim.max_stack;
    pk_obj **s = realloc(v->stack, cap * sizeof *s);
    if (!s)
        return oom(v);
    v->stack = s;
    v->cap_stack = cap;
    return 0;
}

static int push(vm *v, pk_obj *o)
{
    if (!o || (v->sp == v->cap_stack && grow_stack(v)))
        return -1;
    v->stack[v->sp++] = o;
    return 0;
}

__attribute__((noinline)) static int underflow(vm *v, size_t n)
{
    size_t have = v->sp - floor_of(v);
    return fail(v, "stack underflow: %s needs %zu value%s above the mark, %zu there", opname(v),
                n, n == 1 ? "" : "s", have);
}

/* Checks that n values lie above the innermost MARK. */
static int need(vm *v, size_t n)
{
    return v->sp - floor_of(v) < n ? underflow(v, n) : 0;
}

static pk_obj *pop(vm *v)
{
    return v->stack[--v->sp];
}

static pk_obj *top(vm *v)
{
    return v->stack[v->sp - 1];
}

/* Removes the innermost MARK; the values it covered are stack[*start .. sp). */
static int pop_mark(vm *v, size_t *start)
{
    *start = v->sp;
    if (v->nmarks == 0)
        return fail(v, "%s without a MARK", opname(v));
    *start = v->marks[--v->nmarks];
    return 0;
}

/* Marks a container that something recycle cannot follow holds: a DUP or a GET puts it on
 * the stack a second time. */
static void pin(pk_obj *o)
{
    if (is_container(o))
        box(o)->flags |= BOX_PINNED;
}

/* --- the memo -------------------------------------------------------------------------- */

static uint64_t hash_u64(const vm *v, uint64_t key)
{
    return XXH3_64bits_withSeed(&key, sizeof key, v->seed);
}

static memo_slot *sparse_slot(const vm *v, uint64_t key)
{
    size_t mask = v->cap_sparse - 1;
    for (size_t i = hash_u64(v, key) & mask;; i = (i + 1) & mask)
        if (!v->sparse[i].val || v->sparse[i].key == key)
            return &v->sparse[i];
}

static pk_obj *memo_get(const vm *v, uint64_t key)
{
    if (key < v->dense_init && v->dense[key])
        return v->dense[key];
    /* An index stored in the table before the array grew over it is still found here. */
    return v->nsparse ? sparse_slot(v, key)->val : NULL;
}

static int sparse_put(vm *v, uint64_t key, pk_obj *o)
{
    if (2 * (v->nsparse + 1) > v->cap_sparse) {
        size_t cap = v->cap_sparse ? 2 * v->cap_sparse : 64;
        memo_slot *old = v->sparse, *s = calloc(cap, sizeof *s);
        if (!s)
            return oom(v);
        size_t oldcap = v->cap_sparse;
        v->sparse = s;
        v->cap_sparse = cap;
        for (size_t i = 0; i < oldcap; i++)
            if (old[i].val)
                *sparse_slot(v, old[i].key) = old[i];
        free(old);
    }
    memo_slot *slot = sparse_slot(v, key);
    v->nsparse += !slot->val;
    *slot = (memo_slot){key, o};
    return 0;
}

__attribute__((noinline)) static int memo_put(vm *v, uint64_t key, pk_obj *o)
{
    if (key >= v->lim.max_memo)
        return fail(v, "%s: memo index %llu is beyond the limit of %zu", opname(v),
                    (unsigned long long)key, v->lim.max_memo);
    int fresh = memo_get(v, key) == NULL;
    /* The array is first sized from the input, so that it need not be copied as it grows:
     * torch's pickles spend 15 bytes or more per memo index, and what is not used is not
     * touched, so costs no memory. It grows to cover a key beyond only while it stays at least
     * about half full. */
    if (!v->dense || (key >= v->cap_dense && key < 2 * v->nmemo + 1024)) {
        size_t cap = v->dense ? 2 * v->cap_dense : v->in.len / 8 + 1024;
        if (v->dense && cap <= key)
            cap = (size_t)key + 1;
        if (cap > v->lim.max_memo)
            cap = v->lim.max_memo;
        pk_obj **d = realloc(v->dense, cap * sizeof *d);
        if (!d)
            return oom(v);
        v->dense = d;
        v->cap_dense = cap;
    }
    if (key < v->cap_dense) {
        if (key >= v->dense_init) { /* clears only up to the key: pages are touched as used */
            if (key > v->dense_init) /* not the next index, as it nearly always is */
                memset(v->dense + v->dense_init, 0, (key - v->dense_init) * sizeof *v->dense);
            v->dense_init = (size_t)key + 1;
        }
        v->dense[key] = o;
    } else if (sparse_put(v, key, o)) {
        return -1;
    }
    v->nmemo += fresh;
    return 0;
}

static inline int memo_push(vm *v, uint64_t key)
{
    pk_obj *o = memo_get(v, key);
    if (!o)
        return fail(v, "%s of memo index %llu, which was never set", opname(v),
                    (unsigned long long)key);
    if (o == &recycled_memo) {
        v->rerun = 1;
        return fail(v, "%s of memo index %llu, which was recycled", opname(v),
                    (unsigned long long)key);
    }
    pin(o); /* now on the stack besides in the memo */
    return push(v, o);
}

/* Notes that the memo holds the box o at key: a box held at one index can still be recycled
 * (the index then says so), one held at two is pinned. */
static void memo_holds(pk_obj *o, uint64_t key)
{
    if (!is_container(o))
        return;
    pk_box *b = box(o);
    if (b->memo || key >= UINT32_MAX)
        b->flags |= BOX_PINNED;
    else
        b->memo = (uint32_t)key + 1;
}

static inline int memo_store_top(vm *v, uint64_t key)
{
    if (need(v, 1))
        return -1;
    memo_holds(top(v), key);
    /* The next index with room for it in the array, as nearly every PUT is: nothing to grow,
     * clear or look up (cap_dense <= max_memo bounds it, and a sparse key is ruled out). */
    if (key == v->dense_init && key < v->cap_dense && !v->nsparse) {
        v->dense[v->dense_init++] = top(v);
        v->nmemo++;
        return 0;
    }
    return memo_put(v, key, top(v));
}

/* Takes back a tuple that REDUCE (its arguments) or BINPERSID (a persistent id) has just used
 * up, when no other value can reach it: not inside another container (frozen), not held by the
 * int tuples, a DUP or two memo indices (pinned), not what the opcode left on the stack. torch
 * writes two such tuples a tensor, much of the memory its parse takes; taken back, the next
 * tensor's two reuse them. The memo may still hold it, at one index: that index then holds
 * recycled_memo, and since torch never reads these back, the pickle is run again without
 * recycling only in the rare case one is read. Items stay where they are; only the box goes. */
static void recycle(vm *v, pk_obj *o)
{
    pk_box *b = box(o);
    if (!v->recycle || o->type != PK_TUPLE || b->cap != SPARE_CAP ||
        b->seq.items != (pk_obj **)(b + 1) || b->frozen || (b->flags & BOX_PINNED) ||
        (v->sp && top(v) == o))
        return;
    if (b->memo) {
        uint64_t key = b->memo - 1;
        if (key < v->dense_init && v->dense[key] == o)
            v->dense[key] = &recycled_memo;
        else if (v->nsparse && sparse_slot(v, key)->val == o)
            sparse_slot(v, key)->val = &recycled_memo;
    }
    b->seq.items = (pk_obj **)v->spare;
    v->spare = b;
    ASAN_POISON_MEMORY_REGION(b, SPARE_BYTES); /* a stale use is caught by the sanitizers */
}

/* --- objects found by value ----------------------------------------------------------- */

typedef uint64_t (*obj_hash)(const vm *v, const pk_obj *o);

/* The slot of the member that same() finds equal to probe (whose hash is h), or the empty slot
 * where it would go. */
static pk_obj **set_find(const obj_set *s, uint64_t h, int (*same)(const pk_obj *, const void *),
                         const void *probe)
{
    size_t mask = s->cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask)
        if (!s->slot[i] || same(s->slot[i], probe))
            return &s->slot[i];
}

/* Room for one more member (a quarter of the slots stay empty); hash rehashes the members. */
static int set_reserve(vm *v, obj_set *s, obj_hash hash)
{
    if (4 * (s->n + 1) <= 3 * s->cap)
        return 0;
    size_t cap = s->cap ? 2 * s->cap : 64;
    pk_obj **slot = calloc(cap, sizeof *slot);
    if (!slot)
        return oom(v);
    for (size_t i = 0; i < s->cap; i++) {
        if (!s->slot[i])
            continue;
        size_t j = hash(v, s->slot[i]) & (cap - 1);
        while (slot[j])
            j = (j + 1) & (cap - 1);
        slot[j] = s->slot[i];
    }
    free(s->slot);
    s->slot = slot;
    s->cap = cap;
    return 0;
}

/* --- strings and text arguments -------------------------------------------------------- */

static int text_int(vm *v, const unsigned char *s, size_t n, int64_t *out)
{
    int rc = pk_text_int(s, n, out);
    if (rc == -2)
        return fail(v, "%s: integer %.*s does not fit in 64 bits", opname(v),
                    (int)(n > 40 ? 40 : n), (const char *)s);
    if (rc)
        return fail(v, "%s: '%.*s' is not a decimal integer", opname(v), (int)(n > 40 ? 40 : n),
                    (const char *)s);
    return 0;
}

/* A str from n bytes of input that must be UTF-8 (torch.load decodes with 'utf-8'). */
static pk_obj *new_utf8(vm *v, const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint64_t w;
        if (n - i >= sizeof w && (memcpy(&w, s + i, sizeof w), !(w & 0x8080808080808080ull))) {
            i += sizeof w; /* eight ASCII bytes: nearly every name in a checkpoint is ASCII */
            continue;
        }
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t bad = i;
        if (ck_utf8_next(s, n, &i, CK_UTF8_SURROGATES) < 0)
            return fail(v, "%s: string is not valid UTF-8 (its byte %zu)", opname(v), bad), NULL;
    }
    return new_str(v, PK_STR, s, n);
}

/* STRING (a Python 2 str, so it must be UTF-8) and UNICODE. */
static int op_text_string(vm *v, int unicode)
{
    size_t n, len;
    const unsigned char *s = take_line(v, &n);
    if (!s)
        return -1;
    if (n > (SIZE_MAX - 1) / 2)
        return oom(v);
    unsigned char *out = malloc(unicode ? 2 * n + 1 : n + 1);
    if (!out)
        return oom(v);
    const char *bad = unicode ? pk_text_unicode(s, n, out, &len) : pk_text_string(s, n, out, &len);
    pk_obj *o = bad ? NULL : unicode ? new_str(v, PK_STR, out, len) : new_utf8(v, out, len);
    free(out);
    if (bad)
        return fail(v, unicode ? "%s: string %s" : "%s argument %s", opname(v), bad);
    return push(v, o);
}

/* --- scalars --------------------------------------------------------------------------- */

/* n bytes of little-endian two's complement (LONG1, LONG4), which must fit in 64 bits. */
static int long_bytes(vm *v, const unsigned char *p, uint64_t n)
{
    uint64_t u = 0;
    if (n) {
        unsigned fill = p[n - 1] & 0x80 ? 0xFF : 0;
        for (uint64_t i = 8; i < n; i++)
            if (p[i] != fill)
                return fail(v, "%s: integer of %llu bytes does not fit in 64 bits", opname(v),
                            (unsigned long long)n);
        if (n > 8 && (p[7] & 0x80) != (fill & 0x80))
            return fail(v, "%s: integer of %llu bytes does not fit in 64 bits", opname(v),
                        (unsigned long long)n);
        unsigned char b[8]; /* sign-extended to 8 bytes */
        memset(b, (int)fill, sizeof b);
        memcpy(b, p, n < 8 ? (size_t)n : 8);
        u = get_le64(b);
    }
    int64_t i;
    memcpy(&i, &u, sizeof i);
    return push(v, new_int(v, i));
}

static int op_long_n(vm *v, unsigned lenbytes)
{
    uint64_t n = 0;
    const unsigned char *p = take_counted(v, lenbytes, lenbytes == 4, "integer", &n);
    return p ? long_bytes(v, p, n) : -1;
}

static int op_float_text(vm *v)
{
    size_t n;
    const unsigned char *s = take_line(v, &n);
    if (!s)
        return -1;
    double d;
    int rc = pk_text_float(s, n, &d);
    if (rc == -1)
        return fail(v, "%s argument of %zu characters is not a float", opname(v), n);
    if (rc)
        return fail(v, "%s argument '%.*s' is not a float", opname(v), (int)n,
                    (const char *)s);
    pk_obj *o = new_obj(v, PK_FLOAT);
    if (o)
        o->u.f = d;
    return push(v, o);
}

static int op_binfloat(vm *v)
{
    const unsigned char *p = take(v, 8, "double");
    if (!p)
        return -1;
    uint64_t u = 0;
    for (int i = 0; i < 8; i++) /* big-endian */
        u = u << 8 | p[i];
    pk_obj *o = new_obj(v, PK_FLOAT);
    if (o)
        memcpy(&o->u.f, &u, sizeof u);
    return push(v, o);
}

static int op_int_text(vm *v, int is_long)
{
    size_t n;
    const unsigned char *s = take_line(v, &n);
    if (!s)
        return -1;
    if (!is_long && n == 2 && s[0] == '0' && (s[1] == '0' || s[1] == '1')) /* Python 2 bools */
        return push(v, s[1] == '1' ? singleton(v, &v->yes, PK_BOOL, 1)
                                   : singleton(v, &v->no, PK_BOOL, 0));
    if (is_long && n && s[n - 1] == 'L')
        n--;
    int64_t i;
    return text_int(v, s, n, &i) ? -1 : push(v, new_int(v, i));
}

static inline int op_binint(vm *v, unsigned nbytes)
{
    uint64_t u;
    if (take_uint(v, nbytes, "integer", &u))
        return -1;
    int64_t i = nbytes == 4 ? (int64_t)(int32_t)(uint32_t)u : (int64_t)u;
    return push(v, new_int(v, i));
}

/* BINSTRING, BINUNICODE, BINBYTES, ...: a length of lenbytes bytes, then the data. */
static inline int op_counted(vm *v, unsigned lenbytes, enum pk_type t, int signed_len)
{
    uint64_t n = 0;
    const char *what = t == PK_STR ? "string" : "bytes";
    const unsigned char *p = take_counted(v, lenbytes, signed_len, what, &n);
    if (!p)
        return -1;
    return push(v, t == PK_STR ? new_utf8(v, p, (size_t)n) : new_str(v, t, p, (size_t)n));
}

/* --- dict keys and set members, equal as Python has them equal -------------------------- */

/* A dict holds each key once, as Python's does: a key equal to one it holds (1, True and 1.0
 * are equal, and so are 0, False, 0.0 and -0.0; strs and bytes by their bytes) keeps the first
 * key and its place and takes the new value (set_item); a set keeps the first member. Numbers,
 * str, bytes, None and allowed globals compare by value; any other key (a tuple, a frozenset,
 * a tensor) only equals itself, which is Python's rule for tensors and a shortcut for tuples and
 * frozensets: Python's pickler never writes two equal keys, and torch.c refuses such keys. A
 * NaN only equals itself too, as in Python (a dict finds a key by identity first).
 *
 * Up to KEY_SCAN keys are searched one by one; past that a container gets a table of its keys
 * by a seeded hash, so that setting n keys costs O(n) whatever they are. */
#define KEY_SCAN 8

/* A key's number (item index / stride) and the low bits of its hash: a probe compares keys
 * only when those match, and growing the table needs no key again: for a dict of a million
 * keys, each visit to a key is a cache miss. */
typedef struct key_slot {
    uint32_t key;             /* KEY_EMPTY: an empty slot */
    uint32_t hash;
} key_slot;

typedef struct key_table {
    key_slot *slot;
    size_t cap;               /* a power of two (at most 2^32), over twice the keys */
    struct key_table *next;   /* vm.tables */
} key_table;

#define KEY_EMPTY UINT32_MAX

/* The int that f equals, when it equals one the VM can hold. */
static int float_as_int(double f, int64_t *i)
{
    if (!(f >= -0x1p63 && f < 0x1p63) || (double)(int64_t)f != f)
        return 0;
    *i = (int64_t)f;
    return 1;
}

/* Equal keys hash the same: an int and the float equal to it hash as the int. */
static uint64_t key_hash(const vm *v, const pk_obj *o)
{
    uint64_t w[2] = {o->type, 0};
    int64_t i;
    switch (o->type) {
    case PK_STR:
    case PK_BYTES:
        return XXH3_64bits_withSeed(o->u.str.s, o->u.str.len, v->seed + o->type);
    case PK_BOOL:
    case PK_INT:
        w[0] = PK_INT;
        memcpy(&w[1], &o->u.i, sizeof i);
        break;
    case PK_FLOAT:
        if (float_as_int(o->u.f, &i)) {
            w[0] = PK_INT;
            memcpy(&w[1], &i, sizeof i);
        } else if (o->u.f == o->u.f) {
            memcpy(&w[1], &o->u.f, sizeof o->u.f);
        } else {
            w[1] = (uintptr_t)o; /* a NaN */
        }
        break;
    case PK_NONE:
        break;
    case PK_GLOBAL:
        w[1] = (uintptr_t)o->u.global.name; /* one static name per allowed global */
        break;
    default:
        w[1] = (uintptr_t)o;
    }
    return XXH3_64bits_withSeed(w, sizeof w, v->seed);
}

static int is_number(const pk_obj *o)
{
    return o->type == PK_BOOL || o->type == PK_INT || o->type == PK_FLOAT;
}

static int same_key(const pk_obj *a, const pk_obj *b)
{
    if (a == b)
        return 1;
    if (is_number(a) && is_number(b)) {
        int64_t i;
        if (a->type == PK_FLOAT && b->type == PK_FLOAT)
            return a->u.f == b->u.f;
        if (a->type == PK_FLOAT)
            return float_as_int(a->u.f, &i) && i == b->u.i;
        if (b->type == PK_FLOAT)
            return float_as_int(b->u.f, &i) && i == a->u.i;
        return a->u.i == b->u.i;
    }
    if (a->type != b->type)
        return 0;
    switch (a->type) {
    case PK_STR:
    case PK_BYTES:
        return a->u.str.len == b->u.str.len && memcmp(a->u.str.s, b->u.str.s, a->u.str.len) == 0;
    case PK_NONE:
        return 1;
    case PK_GLOBAL:
        return a->u.global.name == b->u.global.name;
    default:
        return 0;
    }
}

/* The slot for hash h in t: the one of the key same() finds equal to key among b's keys
 * (every stride-th item), or the empty one where it would go. key NULL finds an empty slot. */
static key_slot *key_find(const key_table *t, const pk_box *b, size_t stride, uint32_t h,
                          const pk_obj *key)
{
    size_t mask = t->cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        key_slot *s = &t->slot[i];
        if (s->key == KEY_EMPTY ||
            (key && s->hash == h && same_key(b->seq.items[(size_t)s->key * stride], key)))
            return s;
    }
}

/* Gives b a key table with every key it holds (the first time it holds more than KEY_SCAN)
 * or doubles its table. */
static int grow_keys(vm *v, pk_box *b, size_t stride)
{
    key_table *t = b->keys, old = t ? *t : (key_table){0};
    if (!t) {
        if (!(t = calloc(1, sizeof *t)))
            return oom(v);
        t->next = v->tables;
        v->tables = b->keys = t;
    }
    size_t cap = old.cap ? 2 * old.cap : 4 * KEY_SCAN;
    key_slot *slot = malloc(cap * sizeof *slot);
    if (!slot)
        return oom(v);
    memset(slot, 0xff, cap * sizeof *slot); /* KEY_EMPTY */
    t->slot = slot;
    t->cap = cap;
    if (old.slot) {
        for (size_t i = 0; i < old.cap; i++)
            if (old.slot[i].key != KEY_EMPTY)
                *key_find(t, b, stride, old.slot[i].hash, NULL) = old.slot[i];
        free(old.slot);
        return 0;
    }
    for (size_t k = 0; k < b->seq.n / stride; k++) {
        uint32_t h = (uint32_t)key_hash(v, b->seq.items[k * stride]);
        *key_find(t, b, stride, h, NULL) = (key_slot){(uint32_t)k, h};
    }
    return 0;
}

/* Where a key goes in its container's table (found by find_key, filled by note_key). */
typedef struct key_place {
    key_slot *hole;           /* NULL: the container has no table */
    uint32_t hash;
} key_place;

/* The number of b's key equal to key (every stride-th item is a key), or -1 when none is;
 * then *at says where it would go. */
static int64_t find_key(const vm *v, const pk_box *b, size_t stride, const pk_obj *key,
                        key_place *at)
{
    *at = (key_place){0};
    if (!b->keys) {
        for (size_t k = 0; k < b->seq.n / stride; k++)
            if (same_key(b->seq.items[k * stride], key))
                return (int64_t)k;
        return -1;
    }
    at->hash = (uint32_t)key_hash(v, key);
    key_slot *s = key_find(b->keys, b, stride, at->hash, key);
    if (s->key != KEY_EMPTY)
        return s->key;
    at->hole = s;
    return -1;
}

/* Notes b's last key (just added where find_key said) in its table, making or growing the
 * table as needed. */
static int note_key(vm *v, pk_box *b, size_t stride, key_place at)
{
    size_t n = b->seq.n / stride;
    if (n <= KEY_SCAN)
        return 0;
    if (!at.hole)
        return grow_keys(v, b, stride); /* the first table, with every key */
    *at.hole = (key_slot){(uint32_t)(n - 1), at.hash};
    return 2 * n > b->keys->cap ? grow_keys(v, b, stride) : 0;
}

static void free_tables(key_table *t)
{
    while (t) {
        key_table *next = t->next;
        free(t->slot);
        free(t);
        t = next;
    }
}

/* A dict key or set member (what) must be hashable in Python: a list, set or dict is not. */
static int check_hashable(vm *v, const pk_obj *key, const char *what)
{
    if ((key->type == PK_LIST && !(box((pk_obj *)key)->flags & BOX_FROZENSET)) ||
        key->type == PK_DICT)
        return fail(v, "%s: a %s cannot be a %s (unhashable)", opname(v),
                    box((pk_obj *)key)->flags & BOX_SET ? "set" : pk_type_name(key->type),
                    what);
    return 0;
}

/* d[key] = val, as Python sets it (see the top of this part); the caller has made room. */
static int set_item(vm *v, pk_box *d, pk_obj *key, pk_obj *val)
{
    if (check_hashable(v, key, "dict key"))
        return -1;
    key_place place;
    int64_t k = find_key(v, d, 2, key, &place);
    if (k >= 0) {
        pk_obj **at = &d->seq.items[2 * k + 1];
        if (admit(v, d, val, walk_of(*at)))
            return -1;
        *at = val;
        return 0;
    }
    if (adopt(v, d, key) || adopt(v, d, val))
        return -1;
    return note_key(v, d, 2, place);
}

/* s.add(member): a member equal to one s holds changes nothing. The caller has made room. */
static int add_member(vm *v, pk_box *s, pk_obj *member)
{
    if (check_hashable(v, member, "set member") || check_open(v, s))
        return -1;
    key_place place;
    if (find_key(v, s, 1, member, &place) >= 0)
        return 0;
    return adopt(v, s, member) || note_key(v, s, 1, place) ? -1 : 0;
}

/* --- containers ------------------------------------------------------------------------ */

/* Tuples of up to INT_TUPLE_MAX ints are made once per value and then shared: a checkpoint
 * repeats its sizes and strides, (4096, 4096) and (4096, 1), in tensor after tensor, and a
 * tuple never changes, so nothing can tell the copies apart (and copies would be much of the
 * memory a small-tensor checkpoint's parse touches). */
#define INT_TUPLE_MAX 8

typedef struct int_key {
    int64_t i[INT_TUPLE_MAX];
    size_t n;
} int_key;

static uint64_t ints_hash(const vm *v, const int_key *k)
{
    return XXH3_64bits_withSeed(k->i, k->n * sizeof *k->i, v->seed);
}

static int same_ints(const pk_obj *o, const void *probe)
{
    const int_key *k = probe;
    if (o->u.seq.n != k->n)
        return 0;
    for (size_t j = 0; j < k->n; j++)
        if (o->u.seq.items[j]->u.i != k->i[j])
            return 0;
    return 1;
}

/* The values of the n ints in items, or 0 when one is not an int. */
static int ints_of(pk_obj *const *items, size_t n, int_key *k)
{
    k->n = n;
    for (size_t j = 0; j < n; j++) {
        if (items[j]->type != PK_INT)
            return 0;
        k->i[j] = items[j]->u.i;
    }
    return 1;
}

static uint64_t int_tuple_hash(const vm *v, const pk_obj *o)
{
    int_key k;
    ints_of(o->u.seq.items, o->u.seq.n, &k);
    return ints_hash(v, &k);
}

/* A tuple, list or set of the n values on top of the stack, which it pops. */
static int build_seq(vm *v, enum pk_type t, size_t n, uint8_t flags)
{
    pk_obj **shared = NULL;
    int_key k;
    if (t == PK_TUPLE && n && n <= INT_TUPLE_MAX && ints_of(v->stack + v->sp - n, n, &k)) {
        if (set_reserve(v, &v->int_tuples, int_tuple_hash))
            return -1;
        shared = set_find(&v->int_tuples, ints_hash(v, &k), same_ints, &k);
        if (*shared) {
            v->sp -= n;
            return push(v, *shared);
        }
    }
    pk_box *b = new_box(v, t, n);
    if (!b)
        return -1;
    b->flags = flags;
    size_t start = v->sp - n;
    for (size_t i = 0; i < n; i++)
        if (flags & BOX_SET ? add_member(v, b, v->stack[start + i])
                            : adopt(v, b, v->stack[start + i]))
            return -1;
    v->sp = start;
    if (flags & BOX_FROZENSET)
        b->frozen = 1;
    if (shared) {
        *shared = obj(b);
        v->int_tuples.n++;
        b->flags |= BOX_PINNED;
    }
    return push(v, obj(b));
}

static int op_tuple_n(vm *v, size_t n)
{
    if (n == 0 && v->empty_tuple) /* immutable, so one will do */
        return push(v, v->empty_tuple);
    if (need(v, n) || build_seq(v, PK_TUPLE, n, 0))
        return -1;
    if (n == 0)
        v->empty_tuple = top(v);
    return 0;
}

static int op_marked_seq(vm *v, enum pk_type t, uint8_t flags)
{
    size_t start;
    if (pop_mark(v, &start))
        return -1;
    return build_seq(v, t, v->sp - start, flags);
}

/* Sets the pairs stack[start .. sp) into dict d and pops them. */
static int set_pairs(vm *v, pk_box *d, size_t start)
{
    size_t n = v->sp - start;
    if (n % 2)
        return fail(v, "%s: odd number of values (%zu) for key-value pairs", opname(v), n);
    if (reserve(v, d, n))
        return -1;
    for (size_t i = start; i < v->sp; i += 2)
        if (set_item(v, d, v->stack[i], v->stack[i + 1]))
            return -1;
    v->sp = start;
    return 0;
}

static int op_dict(vm *v)
{
    size_t start;
    if (pop_mark(v, &start))
        return -1;
    pk_box *d = new_box(v, PK_DICT, 0);
    if (!d || set_pairs(v, d, start))
        return -1;
    return push(v, obj(d));
}

static const char *kind_of(const pk_obj *o)
{
    if (o->type == PK_LIST && box((pk_obj *)o)->flags & BOX_FROZENSET)
        return "frozenset";
    if (o->type == PK_LIST && box((pk_obj *)o)->flags & BOX_SET)
        return "set";
    return pk_type_name(o->type);
}

/* The container under the values stack[start..) that APPENDS, SETITEMS or ADDITEMS adds. */
static pk_box *target(vm *v, size_t start, enum pk_type t, uint8_t set)
{
    if (start <= floor_of(v))
        return fail(v, "stack underflow: %s has nothing to add to", opname(v)), NULL;
    pk_obj *o = v->stack[start - 1];
    const char *want = t == PK_DICT ? "dict" : set ? "set" : "list";
    if (o->type != t || (t == PK_LIST && (box(o)->flags & (BOX_SET | BOX_FROZENSET)) != set))
        return fail(v, "%s needs a %s, got a %s", opname(v), want, kind_of(o)), NULL;
    return box(o);
}

static int op_appends(vm *v, int marked, uint8_t set)
{
    size_t start = v->sp - 1;
    if (marked ? pop_mark(v, &start) : need(v, 2))
        return -1;
    pk_box *l = target(v, start, PK_LIST, set);
    if (!l || reserve(v, l, v->sp - start))
        return -1;
    for (size_t i = start; i < v->sp; i++)
        if (set ? add_member(v, l, v->stack[i]) : adopt(v, l, v->stack[i]))
            return -1;
    v->sp = start;
    return 0;
}

static int op_setitems(vm *v, int marked)
{
    size_t start = v->sp - 2;
    if (marked ? pop_mark(v, &start) : need(v, 3))
        return -1;
    pk_box *d = target(v, start, PK_DICT, 0);
    return d ? set_pairs(v, d, start) : -1;
}

/* --- globals --------------------------------------------------------------------------- */

static int resolve(vm *v, const char *mod, size_t ml, const char *name, size_t nl)
{
    const pk_allowed *a = pk_allowed_global(mod, ml, name, nl, v->lim.dcp);
    if (a) {
        pk_obj *o = new_obj(v, PK_GLOBAL);
        if (o) {
            o->u.global.which = a->which;
            o->u.global.dtype = a->dtype;
            o->u.global.name = a->full;
        }
        return push(v, o);
    }
    const char *kind = pk_unsupported_kind(mod, ml, name, nl);
    if (kind)
        return ck_fail(v->err, v->path, "%s tensors are not supported (%s %.*s.%.*s at byte %llu)",
                       kind, opname(v), (int)ml, mod, (int)(nl > MAX_QUOTE ? MAX_QUOTE : nl), name,
                       at(v));
    return fail(v, "refused global '%.*s %.*s'", (int)(ml > MAX_QUOTE ? MAX_QUOTE : ml), mod,
                (int)(nl > MAX_QUOTE ? MAX_QUOTE : nl), name);
}

static int op_global(vm *v)
{
    size_t ml, nl;
    const unsigned char *mod = take_line(v, &ml);
    const unsigned char *name = mod ? take_line(v, &nl) : NULL;
    return name ? resolve(v, (const char *)mod, ml, (const char *)name, nl) : -1;
}

static int op_stack_global(vm *v)
{
    if (need(v, 2))
        return -1;
    pk_obj *name = pop(v), *mod = pop(v);
    if (mod->type != PK_STR || name->type != PK_STR)
        return fail(v, "%s needs two str, got %s and %s", opname(v), kind_of(mod),
                    kind_of(name));
    return resolve(v, mod->u.str.s, mod->u.str.len, name->u.str.s, name->u.str.len);
}

/* --- persistent ids: storages ---------------------------------------------------------- */

typedef struct store_key {
    const char *s;
    size_t len;
} store_key;

static int same_store(const pk_obj *o, const void *probe)
{
    const store_key *k = probe;
    return memcmp(o->u.storage.key, k->s, k->len) == 0 && o->u.storage.key[k->len] == 0;
}

static uint64_t store_hash(const vm *v, const pk_obj *o)
{
    return XXH3_64bits_withSeed(o->u.storage.key, strlen(o->u.storage.key), v->seed);
}

static const char *dtype_name(uint8_t dt)
{
    return dt == PK_DTYPE_BYTES ? "bytes" : ck_dtype_name((enum ck_dtype)dt);
}

/* ('storage', StorageClass, key, location, numel) in zip files; legacy files add a sixth item,
 * view_metadata, which must be None (storage views predate torch 1.0), and key is the storage's
 * address in decimal. */
static int persistent_load(vm *v, pk_obj *pid)
{
    if (pid->type != PK_TUPLE || (pid->u.seq.n != 5 && pid->u.seq.n != 6))
        return fail(v, "%s: persistent id is a %s of %zu, not a ('storage', class, key, "
                    "location, numel) tuple", opname(v), kind_of(pid),
                    is_container(pid) ? pid->u.seq.n : (size_t)0);
    pk_obj **a = pid->u.seq.items;
    int legacy = pid->u.seq.n == 6;
    if (a[0]->type != PK_STR || strcmp(a[0]->u.str.s, "storage") != 0 ||
        a[0]->u.str.len != 7)
        return fail(v, "%s: persistent id is not a 'storage' record", opname(v));
    if (a[1]->type != PK_GLOBAL || a[1]->u.global.which != PKG_STORAGE_CLASS)
        return fail(v, "%s: persistent id names a %s%s%s, not a storage class", opname(v),
                    kind_of(a[1]), a[1]->type == PK_GLOBAL ? " " : "",
                    a[1]->type == PK_GLOBAL ? a[1]->u.global.name : "");
    if (a[2]->type != PK_STR || a[2]->u.str.len == 0 ||
        memchr(a[2]->u.str.s, 0, a[2]->u.str.len))
        return fail(v, "%s: storage key is not a non-empty str without NUL", opname(v));
    const char *key = a[2]->u.str.s;
    size_t len = a[2]->u.str.len;
    if (legacy && strspn(key, "0123456789") != len)
        return fail(v, "%s: legacy storage key '%.*s' is not a decimal number", opname(v),
                    MAX_QUOTE, key);
    if (a[3]->type != PK_STR)
        return fail(v, "%s: storage location is a %s, not a str", opname(v), kind_of(a[3]));
    if (a[4]->type != PK_INT || a[4]->u.i < 0)
        return fail(v, "%s: storage '%.*s' size is not a non-negative int", opname(v),
                    MAX_QUOTE, key);
    if (legacy && a[5]->type != PK_NONE)
        return fail(v, "%s: storage '%.*s' is a view (view_metadata is not None), which is not "
                    "supported", opname(v), MAX_QUOTE, key);
    uint8_t dt = a[1]->u.global.dtype;
    uint64_t numel = (uint64_t)a[4]->u.i;

    if (set_reserve(v, &v->stores, store_hash))
        return -1;
    store_key probe = {key, len};
    pk_obj **slot = set_find(&v->stores, XXH3_64bits_withSeed(key, len, v->seed), same_store,
                             &probe);
    if (*slot) {
        const pk_obj *s = *slot;
        if (s->u.storage.dtype != dt || s->u.storage.numel != numel)
            return fail(v, "%s: storage '%.*s' is %s × %llu here but %s × %llu before",
                        opname(v), MAX_QUOTE, key, dtype_name(dt), (unsigned long long)numel,
                        dtype_name(s->u.storage.dtype),
                        (unsigned long long)s->u.storage.numel);
        return push(v, *slot);
    }
    pk_obj *s = new_obj(v, PK_STORAGE);
    if (!s)
        return -1;
    s->u.storage.key = key; /* the str's copy already lives in the arena */
    s->u.storage.numel = numel;
    s->u.storage.dtype = dt;
    *slot = s;
    v->stores.n++;
    return push(v, s);
}

static int op_binpersid(vm *v)
{
    if (need(v, 1))
        return -1;
    pk_obj *pid = pop(v);
    if (persistent_load(v, pid))
        return -1;
    recycle(v, pid);
    return 0;
}

static int op_persid(vm *v)
{
    size_t n;
    const unsigned char *s = take_line(v, &n);
    pk_obj *pid = s ? new_str(v, PK_STR, s, n) : NULL;
    return pid ? persistent_load(v, pid) : -1;
}

/* --- calls: REDUCE, NEWOBJ, BUILD ------------------------------------------------------ */

/* The ints of a tuple (size or stride), converted once per tuple. */
static const int64_t *int_tuple(vm *v, const char *fn, const char *what, pk_obj *t, size_t *n)
{
    if (t->type != PK_TUPLE)
        return fail(v, "%s: %s is a %s, not a tuple of ints", fn, what, kind_of(t)), NULL;
    pk_box *b = box(t);
    *n = t->u.seq.n;
    if (*n > CK_MAX_RANK)
        return fail(v, "%s: %s has %zu dims, more than %d", fn, what, *n, CK_MAX_RANK), NULL;
    static const int64_t none[1];
    if (*n == 0)
        return none;
    if (b->ints)
        return b->ints;
    int64_t *d = alloc(v, *n * sizeof *d);
    if (!d)
        return NULL;
    for (size_t i = 0; i < *n; i++) {
        if (t->u.seq.items[i]->type != PK_INT)
            return fail(v, "%s: %s[%zu] is a %s, not an int", fn, what, i,
                        kind_of(t->u.seq.items[i])), NULL;
        d[i] = t->u.seq.items[i]->u.i;
    }
    return b->ints = d;
}

static int rebuild_tensor(vm *v, const pk_obj *fn, pk_obj *args)
{
    const char *name = fn->u.global.name;
    size_t n = args->u.seq.n;
    uint8_t which = fn->u.global.which;
    if ((which == PKG_REBUILD_TENSOR && n != 4) ||
        (which == PKG_REBUILD_TENSOR_V2 && n != 6 && n != 7) ||
        (which == PKG_REBUILD_TENSOR_V3 && n != 7 && n != 8))
        return fail(v, "%s: %zu arguments is not a known signature", name, n);
    pk_obj **a = args->u.seq.items;
    if (a[0]->type != PK_STORAGE)
        return fail(v, "%s: storage argument is a %s, not a persistent storage", name,
                    kind_of(a[0]));
    if (a[1]->type != PK_INT || a[1]->u.i < 0)
        return fail(v, "%s: storage offset is not a non-negative int", name);
    size_t rank, srank;
    const int64_t *size = int_tuple(v, name, "size", a[2], &rank);
    const int64_t *stride = size ? int_tuple(v, name, "stride", a[3], &srank) : NULL;
    if (!stride)
        return -1;
    if (rank != srank)
        return fail(v, "%s: size has %zu dims but stride %zu", name, rank, srank);
    for (size_t i = 0; i < rank; i++)
        if (size[i] < 0 || stride[i] < 0)
            return fail(v, "%s: %s[%zu] is negative (%lld)", name, size[i] < 0 ? "size" : "stride",
                        i, (long long)(size[i] < 0 ? size[i] : stride[i]));
    uint8_t dt = a[0]->u.storage.dtype;
    if (which == PKG_REBUILD_TENSOR_V3) {
        if (a[6]->type != PK_GLOBAL || a[6]->u.global.which != PKG_DTYPE)
            return fail(v, "%s: dtype argument is a %s, not a torch dtype", name, kind_of(a[6]));
        dt = a[6]->u.global.dtype;
    } else if (dt == PK_DTYPE_BYTES) {
        dt = CK_U8; /* what torch makes of an untyped storage without a dtype */
    }
    pk_obj *t = new_obj(v, PK_TENSOR);
    if (!t)
        return -1;
    t->u.tensor.storage = a[0];
    t->u.tensor.offset = a[1]->u.i;
    t->u.tensor.size = rank ? size : NULL;
    t->u.tensor.stride = rank ? stride : NULL;
    t->u.tensor.rank = (uint8_t)rank;
    t->u.tensor.dtype = dt;
    v->stack[v->sp - 1] = t;
    return 0;
}

static int rebuild_parameter(vm *v, const pk_obj *fn, pk_obj *args)
{
    size_t want = fn->u.global.which == PKG_REBUILD_PARAMETER ? 3 : 4;
    if (args->u.seq.n != want)
        return fail(v, "%s: %zu arguments, expected %zu", fn->u.global.name, args->u.seq.n,
                    want);
    pk_obj *src = args->u.seq.items[0];
    if (src->type != PK_TENSOR)
        return fail(v, "%s: data is a %s, not a tensor", fn->u.global.name, kind_of(src));
    pk_obj *t = new_obj(v, PK_TENSOR); /* a new object: the plain tensor may be shared */
    if (!t)
        return -1;
    *t = *src;
    t->u.tensor.parameter = 1;
    v->stack[v->sp - 1] = t;
    return 0;
}

static int is_pair(const pk_obj *o)
{
    return (o->type == PK_TUPLE || o->type == PK_LIST) && o->u.seq.n == 2;
}

/* OrderedDict() or OrderedDict(pairs): pairs a dict, or a list or tuple of 2-item lists or
 * tuples (Python 2 pickled OrderedDicts as a list of [key, value] lists). */
static int make_ordered_dict(vm *v, const pk_obj *fn, pk_obj *args)
{
    size_t n = args->u.seq.n;
    pk_obj *src = n == 1 ? args->u.seq.items[0] : NULL;
    if (n > 1 || (src && !is_container(src)))
        return fail(v, "%s: takes no argument or one dict or list of pairs",
                    fn->u.global.name);
    size_t m = src ? src->u.seq.n : 0;
    if (src && src->type != PK_DICT)
        for (size_t i = 0; i < m; i++)
            if (!is_pair(src->u.seq.items[i]))
                return fail(v, "%s: item %zu is a %s, not a (key, value) pair",
                            fn->u.global.name, i, kind_of(src->u.seq.items[i]));
    size_t slots = src && src->type != PK_DICT ? 2 * m : m;
    pk_box *d = new_box(v, PK_DICT, slots);
    if (!d || charge_copy(v, (uint64_t)slots * sizeof(pk_obj *), fn->u.global.name))
        return -1;
    for (size_t i = 0; src && i < m; i += src->type == PK_DICT ? 2 : 1) {
        pk_obj **kv = src->type == PK_DICT ? &src->u.seq.items[i]
                                           : src->u.seq.items[i]->u.seq.items;
        if (set_item(v, d, kv[0], kv[1]))
            return -1;
    }
    v->stack[v->sp - 1] = obj(d);
    return 0;
}

static int make_size(vm *v, const pk_obj *fn, pk_obj *args)
{
    size_t n = args->u.seq.n;
    pk_obj *src = n == 1 ? args->u.seq.items[0] : NULL;
    if (n > 1 || (src && src->type != PK_TUPLE && src->type != PK_LIST))
        return fail(v, "%s: takes no argument or one tuple of ints", fn->u.global.name);
    size_t m = src ? src->u.seq.n : 0;
    for (size_t i = 0; i < m; i++)
        if (src->u.seq.items[i]->type != PK_INT)
            return fail(v, "%s: item %zu is a %s, not an int", fn->u.global.name, i,
                        kind_of(src->u.seq.items[i]));
    if (src && src->type == PK_TUPLE) { /* a torch.Size is the tuple it was made from */
        v->stack[v->sp - 1] = src;
        return 0;
    }
    pk_box *t = new_box(v, PK_TUPLE, m);
    if (!t || charge_copy(v, (uint64_t)m * sizeof(pk_obj *), fn->u.global.name))
        return -1;
    for (size_t i = 0; i < m; i++)
        if (adopt(v, t, src->u.seq.items[i]))
            return -1;
    v->stack[v->sp - 1] = obj(t);
    return 0;
}

/* _codecs.encode(str, 'latin1'): how protocols < 3 write bytes. Each code point is a byte. */
static int codecs_encode(vm *v, const pk_obj *fn, pk_obj *args)
{
    pk_obj **a = args->u.seq.items;
    if (args->u.seq.n != 2 || a[0]->type != PK_STR || a[1]->type != PK_STR)
        return fail(v, "%s: takes (str, encoding)", fn->u.global.name);
    if (strcmp(a[1]->u.str.s, "latin1") != 0 && strcmp(a[1]->u.str.s, "latin-1") != 0)
        return fail(v, "%s: encoding '%.*s' is not latin1", fn->u.global.name, MAX_QUOTE,
                    a[1]->u.str.s);
    const unsigned char *s = (const unsigned char *)a[0]->u.str.s;
    size_t n = a[0]->u.str.len, o = 0;
    if (charge_copy(v, n, fn->u.global.name))
        return -1;
    unsigned char *out = malloc(n + 1);
    if (!out)
        return oom(v);
    for (size_t i = 0; i < n;) {
        long cp = ck_utf8_next(s, n, &i, CK_UTF8_SURROGATES); /* checked when it was made */
        if (cp < 0 || cp > 0xFF) {
            free(out);
            return fail(v, "%s: character U+%04lX of the string is not latin1",
                        fn->u.global.name, (unsigned long)cp);
        }
        out[o++] = (unsigned char)cp;
    }
    pk_obj *b = new_str(v, PK_BYTES, out, o);
    free(out);
    if (!b)
        return -1;
    v->stack[v->sp - 1] = b;
    return 0;
}

/* torch.device('cuda:0') or torch.device('cuda', 0), as torch pickles it: the str "cuda:0". */
static int make_device(vm *v, const pk_obj *fn, pk_obj *args)
{
    size_t n = args->u.seq.n;
    pk_obj **a = args->u.seq.items;
    if (n < 1 || n > 2 || a[0]->type != PK_STR ||
        (n == 2 && a[1]->type != PK_NONE && (a[1]->type != PK_INT || a[1]->u.i < 0)))
        return fail(v, "%s: takes (str) or (str, index)", fn->u.global.name);
    if (n == 1 || a[1]->type == PK_NONE) {
        v->stack[v->sp - 1] = a[0];
        return 0;
    }
    size_t len = a[0]->u.str.len;
    if (len > MAX_QUOTE || charge_copy(v, len + 24, fn->u.global.name))
        return len > MAX_QUOTE ? fail(v, "%s: device type of %zu bytes", fn->u.global.name, len)
                               : -1;
    char buf[MAX_QUOTE + 24];
    int m = snprintf(buf, sizeof buf, "%s:%lld", a[0]->u.str.s, (long long)a[1]->u.i);
    pk_obj *s = new_str(v, PK_STR, buf, (size_t)m);
    if (!s)
        return -1;
    v->stack[v->sp - 1] = s;
    return 0;
}

/* The str args[0] of a call that takes one str and stands for it (_get_layout: the reader
 * checks the layout's name), or of getattr(_MEM_FORMAT_ENCODING, name): the name. */
static int str_argument(vm *v, const pk_obj *fn, pk_obj *args)
{
    size_t n = args->u.seq.n, first = fn->u.global.which == PKG_GETATTR;
    pk_obj **a = args->u.seq.items;
    if (n != first + 1 || a[first]->type != PK_STR ||
        (first && (a[0]->type != PK_GLOBAL || a[0]->u.global.which != PKG_DCP_MEM_FORMAT)))
        return fail(v, "%s: takes (%sstr)", fn->u.global.name,
                    first ? "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING, " : "");
    v->stack[v->sp - 1] = a[first];
    return 0;
}

/* pathlib.PosixPath(*parts), as the str of its parts joined by '/' ("." for none). */
static int posix_path(vm *v, const pk_obj *fn, pk_obj *args)
{
    size_t n = args->u.seq.n, len = 0;
    pk_obj **a = args->u.seq.items;
    for (size_t i = 0; i < n; i++) {
        if (a[i]->type != PK_STR)
            return fail(v, "%s: part %zu is a %s, not a str", fn->u.global.name, i,
                        kind_of(a[i]));
        len += a[i]->u.str.len + 1;
    }
    if (charge_copy(v, len + 1, fn->u.global.name))
        return -1;
    char *path = malloc(len + 2);
    if (!path)
        return oom(v);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (i)
            path[at++] = '/';
        memcpy(path + at, a[i]->u.str.s, a[i]->u.str.len);
        at += a[i]->u.str.len;
    }
    if (!n)
        path[at++] = '.';
    pk_obj *o = new_str(v, PK_STR, path, at);
    free(path);
    if (!o)
        return -1;
    v->stack[v->sp - 1] = o;
    return 0;
}

/* What REDUCE of fn (an allowed global) on args (a tuple) leaves on the stack, in fn's place. */
static int call(vm *v, const pk_obj *fn, pk_obj *args)
{
    const char *name = fn->u.global.name;
    switch (fn->u.global.which) {
    case PKG_REBUILD_TENSOR:
    case PKG_REBUILD_TENSOR_V2:
    case PKG_REBUILD_TENSOR_V3:
        return rebuild_tensor(v, fn, args);
    case PKG_REBUILD_PARAMETER:
    case PKG_REBUILD_PARAMETER_STATE:
        return rebuild_parameter(v, fn, args);
    case PKG_ORDERED_DICT:
        return make_ordered_dict(v, fn, args);
    case PKG_TORCH_SIZE:
        return make_size(v, fn, args);
    case PKG_CODECS_ENCODE:
        return codecs_encode(v, fn, args);
    case PKG_DEVICE:
        return make_device(v, fn, args);
    case PKG_GET_LAYOUT:
    case PKG_GETATTR:
        return str_argument(v, fn, args);
    case PKG_POSIX_PATH:
        return posix_path(v, fn, args);
    case PKG_BYTES: {
        if (args->u.seq.n != 0)
            return fail(v, "%s %s: only bytes() is supported", opname(v), name);
        pk_obj *b = new_str(v, PK_BYTES, "", 0);
        if (!b)
            return -1;
        v->stack[v->sp - 1] = b;
        return 0;
    }
    default:
        return fail(v, "%s calls %s, which may not be called", opname(v), name);
    }
}

static int op_reduce(vm *v)
{
    if (need(v, 2))
        return -1;
    pk_obj *args = pop(v), *fn = top(v);
    if (fn->type != PK_GLOBAL)
        return fail(v, "%s calls a %s, which is not callable", opname(v), kind_of(fn));
    if (args->type != PK_TUPLE)
        return fail(v, "%s %s: arguments are a %s, not a tuple", opname(v), fn->u.global.name,
                    kind_of(args));
    if (call(v, fn, args))
        return -1;
    recycle(v, args);
    return 0;
}

static int is_record_class(const pk_obj *o)
{
    return o->type == PK_GLOBAL && o->u.global.which >= PKG_DCP_METADATA &&
           o->u.global.which <= PKG_DCP_STORAGE_INFO;
}

/* NEWOBJ (cls, args) and NEWOBJ_EX (cls, args, kwargs): OrderedDict, whose __new__ makes an
 * empty dict whatever the arguments (its items come later, by SETITEMS), and a record class
 * with no arguments (a dataclass, its fields set by BUILD): an object of it. */
static int op_newobj(vm *v, int ex)
{
    if (need(v, ex ? 3 : 2))
        return -1;
    pk_obj *kwargs = ex ? pop(v) : NULL, *args = pop(v), *cls = pop(v);
    int record = is_record_class(cls);
    if (!record && (cls->type != PK_GLOBAL || cls->u.global.which != PKG_ORDERED_DICT))
        return fail(v, "%s of %s%s%s is not supported (only collections.OrderedDict%s)",
                    opname(v), kind_of(cls), cls->type == PK_GLOBAL ? " " : "",
                    cls->type == PK_GLOBAL ? cls->u.global.name : "",
                    v->lim.dcp ? " and the DCP metadata's classes" : "");
    if (args->type != PK_TUPLE || (kwargs && kwargs->type != PK_DICT))
        return fail(v, "%s: arguments are not a tuple%s", opname(v), ex ? " and a dict" : "");
    if (record && (args->u.seq.n || (kwargs && kwargs->u.seq.n)))
        return fail(v, "%s of %s: takes no arguments", opname(v), cls->u.global.name);
    pk_box *b = new_box(v, record ? PK_OBJECT : PK_DICT, record ? 2 : 0);
    if (!b || (record && adopt(v, b, cls)))
        return -1;
    return push(v, obj(b));
}

/* BUILD of an object: its state, once (a dict of fields, or the tuple a __getstate__ gave). */
static int build_object(vm *v, pk_obj *o, pk_obj *state)
{
    if (box(o)->seq.n != 1)
        return fail(v, "%s on a %s that has its state", opname(v),
                    o->u.seq.items[0]->u.global.name);
    if (state->type != PK_DICT && state->type != PK_TUPLE)
        return fail(v, "%s on a %s with a %s state is not supported", opname(v),
                    o->u.seq.items[0]->u.global.name, kind_of(state));
    return adopt(v, box(o), state);
}

static int is_state_dict(const pk_obj *o)
{
    return o->type == PK_NONE || o->type == PK_DICT;
}

/* BUILD (setstate): a dict's state is its Python attributes (a state_dict's _metadata) and a
 * tensor's is legacy backward hooks; neither is part of the data, so both are dropped. */
static int op_build(vm *v)
{
    if (need(v, 2))
        return -1;
    pk_obj *state = pop(v), *o = top(v);
    if (o->type == PK_TENSOR)
        return 0;
    if (o->type == PK_OBJECT)
        return build_object(v, o, state);
    if (o->type != PK_DICT)
        return fail(v, "%s on a %s is not supported", opname(v), kind_of(o));
    if (!is_state_dict(state) &&
        !(state->type == PK_TUPLE && state->u.seq.n == 2 &&
          is_state_dict(state->u.seq.items[0]) && is_state_dict(state->u.seq.items[1])))
        return fail(v, "%s on a dict with a %s state is not supported", opname(v),
                    kind_of(state));
    return 0;
}

/* --- the loop -------------------------------------------------------------------------- */

static int op_mark(vm *v)
{
    if (v->nmarks == v->cap_marks) {
        if (v->nmarks >= v->lim.max_marks)
            return fail(v, "%s: more than %zu nested marks", opname(v), v->lim.max_marks);
        size_t cap = v->cap_marks ? 2 * v->cap_marks : 64;
        if (cap > v->lim.max_marks)
            cap = v->lim.max_marks;
        size_t *m = realloc(v->marks, cap * sizeof *m);
        if (!m)
            return oom(v);
        v->marks = m;
        v->cap_marks = cap;
    }
    v->marks[v->nmarks++] = v->sp;
    return 0;
}

static int op_pop(vm *v)
{
    if (v->sp > floor_of(v)) {
        v->sp--;
        return 0;
    }
    if (v->nmarks) { /* POP on an empty mark pops the mark, as Python does */
        v->nmarks--;
        return 0;
    }
    return need(v, 1);
}

__attribute__((always_inline)) static inline int op_get_put(vm *v, unsigned nbytes, int put)
{
    uint64_t key;
    if (nbytes == 0) {
        size_t n;
        const unsigned char *s = take_line(v, &n);
        int64_t i;
        if (!s || text_int(v, s, n, &i))
            return -1;
        if (i < 0)
            return fail(v, "%s: negative memo index %lld", opname(v), (long long)i);
        key = (uint64_t)i;
    } else if (take_uint(v, nbytes, "memo index", &key)) {
        return -1;
    }
    return put ? memo_store_top(v, key) : memo_push(v, key);
}

static int op_proto(vm *v)
{
    const unsigned char *p = take(v, 1, "version");
    if (!p)
        return -1;
    if (*p > 5)
        return fail(v, "unsupported pickle protocol %u", *p);
    return 0;
}

/* Runs one opcode. The handlers it passes a constant width (op_binint, op_counted, op_get_put)
 * are inline, so each opcode gets its own copy without the tests on the width and without a
 * call: a checkpoint runs tens of thousands of them. */
static int step(vm *v)
{
    switch (v->opcode) {
    case OP_PROTO: return op_proto(v);
    case OP_FRAME: { /* a buffering hint; opcodes are read the same across frames */
        uint64_t n;
        if (take_uint(v, 8, "length", &n))
            return -1;
        /* Python refuses a frame that runs past the input, so it cannot be a real pickle. */
        if (n > ck_cursor_left(&v->in)) {
            v->truncated = 1;
            return fail(v, "truncated pickle: %s of %llu bytes, %zu remain", opname(v),
                        (unsigned long long)n, ck_cursor_left(&v->in));
        }
        return 0;
    }
    case OP_MARK: return op_mark(v);
    case OP_POP: return op_pop(v);
    case OP_POP_MARK: {
        size_t start;
        if (pop_mark(v, &start))
            return -1;
        v->sp = start;
        return 0;
    }
    case OP_DUP: return need(v, 1) ? -1 : (pin(top(v)), push(v, top(v)));
    case OP_EMPTY_DICT: {
        pk_box *d = new_box(v, PK_DICT, 0);
        return d ? push(v, obj(d)) : -1;
    }
    case OP_EMPTY_LIST: {
        pk_box *l = new_box(v, PK_LIST, 0);
        return l ? push(v, obj(l)) : -1;
    }
    case OP_EMPTY_SET: {
        pk_box *s = new_box(v, PK_LIST, 0);
        if (s)
            s->flags = BOX_SET;
        return s ? push(v, obj(s)) : -1;
    }
    case OP_EMPTY_TUPLE: return op_tuple_n(v, 0);
    case OP_TUPLE1: return op_tuple_n(v, 1);
    case OP_TUPLE2: return op_tuple_n(v, 2);
    case OP_TUPLE3: return op_tuple_n(v, 3);
    case OP_TUPLE: return op_marked_seq(v, PK_TUPLE, 0);
    case OP_LIST: return op_marked_seq(v, PK_LIST, 0);
    case OP_FROZENSET: return op_marked_seq(v, PK_LIST, BOX_SET | BOX_FROZENSET);
    case OP_DICT: return op_dict(v);
    case OP_APPEND: return op_appends(v, 0, 0);
    case OP_APPENDS: return op_appends(v, 1, 0);
    case OP_ADDITEMS: return op_appends(v, 1, BOX_SET);
    case OP_SETITEM: return op_setitems(v, 0);
    case OP_SETITEMS: return op_setitems(v, 1);
    case OP_NONE: return push(v, singleton(v, &v->none, PK_NONE, 0));
    case OP_NEWTRUE: return push(v, singleton(v, &v->yes, PK_BOOL, 1));
    case OP_NEWFALSE: return push(v, singleton(v, &v->no, PK_BOOL, 0));
    case OP_INT: return op_int_text(v, 0);
    case OP_LONG: return op_int_text(v, 1);
    case OP_BININT: return op_binint(v, 4);
    case OP_BININT1: return op_binint(v, 1);
    case OP_BININT2: return op_binint(v, 2);
    case OP_LONG1: return op_long_n(v, 1);
    case OP_LONG4: return op_long_n(v, 4);
    case OP_FLOAT: return op_float_text(v);
    case OP_BINFLOAT: return op_binfloat(v);
    case OP_STRING: return op_text_string(v, 0);
    case OP_UNICODE: return op_text_string(v, 1);
    case OP_BINSTRING: return op_counted(v, 4, PK_STR, 1);
    case OP_SHORT_BINSTRING: return op_counted(v, 1, PK_STR, 0);
    case OP_BINUNICODE: return op_counted(v, 4, PK_STR, 0);
    case OP_SHORT_BINUNICODE: return op_counted(v, 1, PK_STR, 0);
    case OP_BINUNICODE8: return op_counted(v, 8, PK_STR, 0);
    case OP_BINBYTES: return op_counted(v, 4, PK_BYTES, 0);
    case OP_SHORT_BINBYTES: return op_counted(v, 1, PK_BYTES, 0);
    case OP_BINBYTES8: return op_counted(v, 8, PK_BYTES, 0);
    case OP_BYTEARRAY8: return op_counted(v, 8, PK_BYTES, 0);
    case OP_PUT: return op_get_put(v, 0, 1);
    case OP_BINPUT: return op_get_put(v, 1, 1);
    case OP_LONG_BINPUT: return op_get_put(v, 4, 1);
    case OP_MEMOIZE: return memo_store_top(v, v->nmemo);
    case OP_GET: return op_get_put(v, 0, 0);
    case OP_BINGET: return op_get_put(v, 1, 0);
    case OP_LONG_BINGET: return op_get_put(v, 4, 0);
    case OP_GLOBAL: return op_global(v);
    case OP_STACK_GLOBAL: return op_stack_global(v);
    case OP_REDUCE: return op_reduce(v);
    case OP_NEWOBJ: return op_newobj(v, 0);
    case OP_NEWOBJ_EX: return op_newobj(v, 1);
    case OP_BUILD: return op_build(v);
    case OP_PERSID: return op_persid(v);
    case OP_BINPERSID: return op_binpersid(v);
    default:
        if (pk_opcode_name(v->opcode))
            return fail(v, "pickle opcode %s (0x%02x) is not supported", opname(v), v->opcode);
        return fail(v, "unknown pickle opcode 0x%02x", v->opcode);
    }
}

static int run(vm *v, pk_obj **root)
{
    for (;;) {
        v->op = v->in.pos;
        if (ck_take_u8(&v->in, &v->opcode)) {
            v->truncated = 1;
            return fail(v, "truncated pickle: the input ends before STOP");
        }
        if (v->opcode == OP_STOP) {
            if (need(v, 1))
                return -1;
            *root = pop(v);
            return 0;
        }
        if (step(v))
            return -1;
    }
}

/* The storages into out, from the set of them (in the arena, which the result keeps). */
static int list_storages(vm *v, pk_result *out)
{
    out->nstorages = 0;
    if (v->stores.n && !(out->storages = alloc(v, v->stores.n * sizeof *out->storages)))
        return -1;
    for (size_t i = 0; i < v->stores.cap; i++)
        if (v->stores.slot[i])
            out->storages[out->nstorages++] = v->stores.slot[i];
    return 0;
}

/* One run of the pickle, boxes recycled or not (see recycle). */
static int load(const unsigned char *data, size_t len, const pk_limits *lim, const char *path,
                uint64_t base, int recycle_boxes, pk_result *out, ck_error *err, int *rerun)
{
    vm v = {
        .in = ck_cursor_make(data, len, base), .path = path,
        .lim = lim ? *lim : pk_default_limits, .err = err,
        .copy_left = (uint64_t)len * COPY_PER_INPUT_BYTE + COPY_SLACK,
        .seed = ck_hash_seed(), .recycle = recycle_boxes,
    };
    pk_obj *root = NULL;
    int rc = run(&v, &root);
    if (rc == 0)
        rc = list_storages(&v, out);
    free(v.stack);
    free(v.marks);
    free(v.dense);
    free(v.sparse);
    free(v.stores.slot);
    free(v.int_tuples.slot);
    free_tables(v.tables);
    *rerun = v.rerun;
    if (rc) {
        ck_arena_free(v.arena);
        return v.truncated ? PK_TRUNCATED : PK_ERROR;
    }
    out->root = root;
    out->consumed = v.in.pos;
    out->arena = v.arena;
    return 0;
}

int pk_load(const unsigned char *data, size_t len, const pk_limits *lim, const char *path,
            uint64_t base, pk_result *out, ck_error *err)
{
    *out = (pk_result){0};
    int rerun;
    int rc = load(data, len, lim, path, base, 1, out, err, &rerun);
    if (rc && rerun) /* it read back a box it had recycled: again, keeping every box */
        rc = load(data, len, lim, path, base, 0, out, err, &rerun);
    return rc;
}

void pk_free(pk_result *r)
{
    if (!r)
        return;
    ck_arena_free(r->arena);
    *r = (pk_result){0};
}

/* --- typed access ---------------------------------------------------------------------- */

const pk_obj *pk_as(const pk_obj *o, enum pk_type t)
{
    return o && o->type == t ? o : NULL;
}

const char *pk_text(const pk_obj *o, size_t *len)
{
    if (!pk_as(o, PK_STR))
        return NULL;
    if (len)
        *len = o->u.str.len;
    return o->u.str.s;
}

int pk_int(const pk_obj *o, int64_t *out)
{
    if (!pk_as(o, PK_INT))
        return -1;
    *out = o->u.i;
    return 0;
}

int pk_bool(const pk_obj *o)
{
    return pk_as(o, PK_BOOL) ? o->u.i != 0 : -1;
}

size_t pk_len(const pk_obj *o)
{
    if (!o || (o->type != PK_TUPLE && o->type != PK_LIST && o->type != PK_DICT))
        return 0;
    return o->type == PK_DICT ? o->u.seq.n / 2 : o->u.seq.n;
}

const pk_obj *pk_item(const pk_obj *o, size_t i)
{
    return o && (o->type == PK_TUPLE || o->type == PK_LIST) && i < o->u.seq.n ? o->u.seq.items[i]
                                                                              : NULL;
}

int pk_pair(const pk_obj *o, size_t i, const pk_obj **key, const pk_obj **value)
{
    if (!pk_as(o, PK_DICT) || i >= o->u.seq.n / 2)
        return -1;
    *key = o->u.seq.items[2 * i];
    *value = o->u.seq.items[2 * i + 1];
    return 0;
}

int pk_int_tuple(const pk_obj *o, size_t max, int64_t *out, size_t *n)
{
    if (!pk_as(o, PK_TUPLE) || o->u.seq.n > max)
        return -1;
    for (size_t i = 0; i < o->u.seq.n; i++)
        if (pk_int(o->u.seq.items[i], &out[i]) != 0)
            return -1;
    *n = o->u.seq.n;
    return 0;
}

const pk_obj *pk_global_is(const pk_obj *o, enum pk_global g)
{
    return pk_as(o, PK_GLOBAL) && o->u.global.which == g ? o : NULL;
}

int pk_dtype(const pk_obj *o)
{
    return pk_global_is(o, PKG_DTYPE) ? o->u.global.dtype : -1;
}

/* An OBJECT's items[0] is its class, a GLOBAL: op_newobj makes it so, and nothing else makes
 * an OBJECT. */
const pk_obj *pk_record(const pk_obj *o, enum pk_global cls)
{
    return pk_as(o, PK_OBJECT) && pk_global_is(o->u.seq.items[0], cls) ? o : NULL;
}

const pk_obj *pk_state(const pk_obj *o)
{
    return pk_as(o, PK_OBJECT) && o->u.seq.n == 2 ? o->u.seq.items[1] : NULL;
}

const pk_obj *pk_field(const pk_obj *o, const char *name)
{
    const pk_obj *state = pk_state(o), *k, *v;
    for (size_t i = 0; i < PK_MAX_FIELDS && pk_pair(state, i, &k, &v) == 0; i++) {
        const char *key = pk_text(k, NULL);
        if (key && strcmp(key, name) == 0)
            return v;
    }
    return NULL;
}
