/* tree.h — the directory tree a mount shows for an index. No FUSE here: testable on its own.
 *
 * Tensor "a.b.c" is the file a/b/c. The mapping is deterministic and reversible:
 *  - a name is split at every '.', each piece one path component;
 *  - in a component, '%', '/', bytes 0x01-0x1F and 0x7F are written %XX (uppercase hex);
 *  - an empty piece (from "a..b", ".a" or "a.") is written "%";
 *  - a file whose path is also a directory (tensors "a" and "a.b") gets "%" appended: "a%"
 *    (a 255-byte component takes the hashed form below first, to leave room for it);
 *  - a component whose escaped form is over 255 bytes keeps its first whole characters and
 *    escapes (at most 236 bytes), then "%~" and 16 lowercase hex digits: the XXH3-64 of the
 *    piece's original bytes.
 * No component can be "." or "..", begin with '.', or hold '/', so no path leaves the mount, and
 * the names beginning with '.' (.ckptfs) are free for the mount's own files. Node 0 is the root;
 * children of a directory are sorted bytewise.
 */
#ifndef CK_TREE_H
#define CK_TREE_H

#include <stddef.h>
#include <stdint.h>

#include "../index/index.h"

#define CK_NAME_MAX 255
#define CK_NO_NODE UINT32_MAX

/* What a node is, and what its id means. */
enum ck_node_kind {
    CK_NODE_DIR,     /* a directory (id unused) */
    CK_NODE_TENSOR,  /* index entry id, a tensor: its bytes are in the source files */
    CK_NODE_VALUE,   /* index entry id, a value: its text is in memory */
    CK_NODE_MEMFILE, /* the mount's own file id, whose bytes are made in memory (index.json) */
    CK_NODE_SYNTH,   /* the mount's own file id, synthesized from the index on first use */
    CK_NODE_STATUS,  /* the mount's own file id, whose text is made on every use (its state) */
};

/* One of the mount's own files: its name and kind (CK_NODE_MEMFILE, CK_NODE_SYNTH or
 * CK_NODE_STATUS). */
typedef struct ck_tree_vfile {
    const char *name;
    uint8_t kind;
} ck_tree_vfile;

typedef struct ck_node {
    const char *name;   /* escaped component, NUL-terminated; "" for the root */
    uint32_t name_len;
    uint32_t parent;
    uint32_t child0;    /* children are tree->children[child0 .. child0 + nchild) */
    uint32_t nchild;
    uint32_t id;        /* the entry (tensor, value) or the virtual file (memfile, synth) */
    uint8_t kind;       /* enum ck_node_kind */
    uint8_t plain;      /* its path is its name's pieces as they are, joined by '/' (nothing
                         * on the way escaped or renamed): index.json's path is then the
                         * entry's name with each '.' a '/' */
} ck_node;

typedef struct ck_tree {
    ck_node *nodes;
    uint32_t nnodes;
    uint32_t *children;
    uint32_t *entry_node; /* index entry -> its node */
    uint32_t *slots;      /* hash of (parent, name) -> node */
    size_t nslots;
    uint64_t seed;        /* of that hash (ck_hash_seed): names come from the checkpoint */
    ck_arena *arena;
} ck_tree;

/* Builds the tree for ix, with the directory `vdir` (e.g. ".ckptfs") holding nvirtual files
 * vfiles[k], node id k of kind vfiles[k].kind; no such directory when vdir is NULL. Fails
 * only on out-of-memory or two entries with one path (err names both). The tree may name its
 * files with ix's entry names (a file that needs no escape is the end of its tensor's name):
 * it must be freed before ix. */
int ck_tree_build(const ck_index *ix, const char *vdir, const ck_tree_vfile *vfiles,
                  unsigned nvirtual, ck_tree **out, ck_error *err);
void ck_tree_free(ck_tree *t);

/* The child of parent called name (len bytes), or CK_NO_NODE. */
uint32_t ck_tree_lookup(const ck_tree *t, uint32_t parent, const char *name, size_t len);

/* Writes node's path relative to the root ("a/b/c") into buf; returns its length, or the length
 * it would have had when cap is too small (like snprintf). */
size_t ck_tree_path(const ck_tree *t, uint32_t node, char *buf, size_t cap);

/* Escapes one component (len bytes, no '.') into out (CK_NAME_MAX + 1 bytes), NUL-terminated;
 * returns the escaped length. */
size_t ck_escape_component(const char *s, size_t len, char *out);

#endif
