/* pickle.h — a safe pickle reader for torch checkpoints: it decodes, it never executes.
 *
 * Contract:
 *  - pk_load runs the pickle opcodes of protocols 0-5 that torch.save can emit and builds a tree
 *    of plain values (pk_obj). GLOBAL / STACK_GLOBAL resolve only names on a fixed allowlist
 *    (modelled on torch's weights_only unpickler); any other name is an error that quotes it.
 *    REDUCE / NEWOBJ / BUILD act only on allowed callables, and each does one fixed, known
 *    thing (build a tensor, a dict, a torch.Size, ...). Nothing is imported, looked up by name
 *    at run time, or called.
 *  - Persistent ids ('storage', StorageClass, key, location, numel[, view_metadata]) become
 *    PK_STORAGE objects; the location is ignored. One PK_STORAGE object per distinct key, so
 *    tensors sharing a storage point at the same object.
 *  - Hard limits (pk_limits) bound stack depth, MARK nesting, memo size, container sizes and
 *    the total object count, so no pickle can exhaust memory or time. Every read of the input
 *    is bounds-checked; a truncated stream is an error naming the byte offset.
 *  - The result is a finite, acyclic tree (shared subtrees allowed): containers nest at most
 *    max_depth deep, and a walk that expands shared containers every time it meets them visits
 *    at most max_objects values, so consumers may walk it naively. A list or dict can no longer
 *    change once it is inside another container, which is what rules cycles out.
 *  - All objects live in one arena owned by the caller's pk_result; pk_free releases it.
 */
#ifndef CK_PICKLE_H
#define CK_PICKLE_H

#include <stddef.h>
#include <stdint.h>

#include "../base/arena.h"
#include "../base/dtype.h"
#include "../base/error.h"
#include "pickle_policy.h" /* enum pk_global, PK_DTYPE_BYTES */

enum pk_type {
    PK_NONE, PK_BOOL, PK_INT, PK_FLOAT, PK_STR, PK_BYTES,
    PK_TUPLE, PK_LIST, PK_DICT, /* DICT: items[2k] key, items[2k+1] value, in insertion order;
                                 * each key once, as Python has it (pickle.c: set_item) */
    PK_OBJECT,                  /* an instance of an allowed record class (a DCP .metadata's
                                 * dataclasses: pk_limits.dcp): items[0] its class (a GLOBAL),
                                 * items[1] the state BUILD gave it (a dict or tuple), n 1 or 2 */
    PK_GLOBAL,                  /* an allowed global that is a value: a storage class, a dtype */
    PK_STORAGE,                 /* a persistent id naming a storage record */
    PK_TENSOR,                  /* _rebuild_tensor* / _rebuild_parameter* */
};

/* An object takes only the bytes its type's member of u needs, so one is read through its own
 * member and never copied whole (`*a = *b`), except a TENSOR, which is full size. */
typedef struct pk_obj pk_obj;
struct pk_obj {
    uint8_t type;                  /* enum pk_type */
    union {
        int64_t i;                 /* BOOL, INT (ints beyond 64 bits are an error) */
        double f;                  /* FLOAT */
        struct {                   /* STR (UTF-8 as in the pickle), BYTES */
            const char *s;         /* NUL-terminated copy; len excludes the NUL */
            size_t len;
        } str;
        struct {                   /* TUPLE, LIST, DICT */
            pk_obj **items;
            size_t n;              /* DICT: 2 × the number of pairs */
        } seq;
        struct {                   /* GLOBAL */
            uint8_t which;         /* enum pk_global */
            uint8_t dtype;         /* STORAGE_CLASS, DTYPE: enum ck_dtype or PK_DTYPE_BYTES */
            const char *name;      /* "torch.FloatStorage", for messages */
        } global;
        struct {                   /* STORAGE */
            const char *key;       /* the record name: data/<key> in a zip, the key in legacy */
            uint64_t numel;        /* elements of dtype (bytes when PK_DTYPE_BYTES) */
            uint8_t dtype;
        } storage;
        struct {                   /* TENSOR */
            pk_obj *storage;       /* a PK_STORAGE */
            int64_t offset;        /* storage offset, elements */
            const int64_t *size;   /* rank dims */
            const int64_t *stride; /* rank strides, elements */
            uint8_t rank;
            uint8_t dtype;         /* the tensor's (v3 may differ from an untyped storage's); */
                                   /* never PK_DTYPE_BYTES: v1/v2 on an untyped storage is U8 */
            uint8_t parameter;     /* 1 when rebuilt as an nn.Parameter */
        } tensor;
    } u;
};

typedef struct pk_limits {
    size_t max_stack;      /* values on the stack */
    size_t max_marks;      /* MARK nesting */
    size_t max_memo;       /* memo slots; an index beyond is an error */
    size_t max_objects;    /* objects created in all */
    size_t max_depth;      /* container nesting of the result */
    int dcp;               /* also the DCP .metadata's globals (PKG_DCP_* and after) */
} pk_limits;

/* Defaults: stack 1,000,000; marks 10,000; memo 10,000,000; objects 50,000,000; depth 1,000. */
extern const pk_limits pk_default_limits;
/* The same with the DCP .metadata's globals allowed, and memo 48,000,000 and objects
 * 192,000,000: what a 256 MiB .metadata of Python's pickler takes, and half again (pickle.c). */
extern const pk_limits pk_dcp_limits;

typedef struct pk_result {
    pk_obj *root;          /* the value STOP returned */
    size_t consumed;       /* bytes of input up to and including STOP */
    ck_arena *arena;
    pk_obj **storages;     /* every PK_STORAGE the pickle made, in no set order: also one that
                            * no value holds any more (a dict value set twice held it) */
    size_t nstorages;
} pk_result;

enum { PK_ERROR = -1, PK_TRUNCATED = -2 };

/* Runs the pickle in data[0..len). lim NULL means pk_default_limits. path names the input in
 * messages; base is the file offset of data[0], so messages give offsets in the file. On
 * failure returns PK_ERROR, or PK_TRUNCATED when the input ended before STOP (a caller reading
 * from a file can retry with more), with err set and nothing to free. */
int pk_load(const unsigned char *data, size_t len, const pk_limits *lim, const char *path,
            uint64_t base, pk_result *out, ck_error *err);

void pk_free(pk_result *r);

/* --- typed access ------------------------------------------------------------------------
 * How a reader takes values out of the tree: a reader reads no member of u itself but asks
 * one of these, which hands back what was asked only when the object is of the type that
 * member belongs to (NULL, 0 or -1 otherwise, and for a NULL object, so calls chain), so a
 * field that a file filled with another type is refused where it is taken, never read
 * through another type's member. */

/* o when it is of type t; NULL otherwise. */
const pk_obj *pk_as(const pk_obj *o, enum pk_type t);
/* A STR's text, NUL-terminated (*len its bytes when len is not NULL); NULL otherwise. */
const char *pk_text(const pk_obj *o, size_t *len);
/* An INT's value into *out: 0, or -1 when o is no INT (a BOOL is not one). */
int pk_int(const pk_obj *o, int64_t *out);
/* A BOOL's value, 0 or 1; -1 when o is no BOOL. */
int pk_bool(const pk_obj *o);
/* The items of a TUPLE or LIST, the pairs of a DICT; 0 for anything else. */
size_t pk_len(const pk_obj *o);
/* Item i of a TUPLE or LIST; NULL when o is neither or has no item i. */
const pk_obj *pk_item(const pk_obj *o, size_t i);
/* Pair i of a DICT into *key, *value: 0, or -1 when o is no DICT or has no pair i. */
int pk_pair(const pk_obj *o, size_t i, const pk_obj **key, const pk_obj **value);
/* A TUPLE of at most max INTs into out[0..*n): 0, or -1 when o is anything else. */
int pk_int_tuple(const pk_obj *o, size_t max, int64_t *out, size_t *n);
/* o when it is a GLOBAL that is g (enum pk_global); NULL otherwise. */
const pk_obj *pk_global_is(const pk_obj *o, enum pk_global g);
/* The dtype (enum ck_dtype) of a GLOBAL that is a torch dtype (torch.float32, ...); -1
 * otherwise. */
int pk_dtype(const pk_obj *o);
/* o when it is an OBJECT of the record class cls (enum pk_global); NULL otherwise. */
const pk_obj *pk_record(const pk_obj *o, enum pk_global cls);
/* A record's state as BUILD gave it (a DICT or TUPLE); NULL when o is no OBJECT or has none. */
const pk_obj *pk_state(const pk_obj *o);
/* Field name of a record whose state is a dict of fields, whatever its type; NULL when o is no
 * OBJECT, its state no DICT, or the field not among its first PK_MAX_FIELDS. A record class
 * has a handful of fields; one state dict of a million, shared by a million records, would
 * otherwise make each lookup a search of it. */
#define PK_MAX_FIELDS 64
const pk_obj *pk_field(const pk_obj *o, const char *name);

/* The pk_type's name as Python spells it ("int", "str", "tensor", ...), for messages and for
 * the "type" of values in index.json. */
const char *pk_type_name(enum pk_type t);

#endif
