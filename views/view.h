/* view.h — what the mount's own files say about an index. No FUSE here.
 * Contract: the texts returned are the caller's to free; JSON is UTF-8 and
 * follows the formats documented in docs/SEMANTICS.md ("The mount").
 */
#ifndef CK_VIEW_H
#define CK_VIEW_H

#include <stddef.h>

#include <stdint.h>
#include <stdio.h>
#include <sys/uio.h>

#include "tree.h"

/* A text in pieces: its own bytes and, between them, texts the index holds, lent rather than
 * copied (a GGUF key's typed JSON, shown as is in index.json, can be ~100 MB: a copy would
 * double what the mount holds). Valid as long as the index. */
typedef struct ck_view_piece {
    const char *s;
    size_t len;
    uint64_t at; /* where it starts in the text */
} ck_view_piece;

typedef struct ck_view_text {
    char *own;            /* the text's own bytes (malloc'ed), which pieces point into */
    ck_view_piece *piece; /* in order, none empty */
    size_t npieces;
    uint64_t len;         /* the text's bytes */
} ck_view_text;

/* t's bytes [off, off + size) as at most max pieces (iov, *n of them): the bytes they hold,
 * fewer where the range ends past the text or needs more pieces than max. */
size_t ck_view_text_lend(const ck_view_text *t, uint64_t off, size_t size, struct iovec *iov,
                         unsigned max, unsigned *n);
/* The same bytes copied into buf: how many (fewer only past the end). */
size_t ck_view_text_read(const ck_view_text *t, uint64_t off, void *buf, size_t size);
/* All of t to f: 0, or -1 when a write failed. */
int ck_view_text_write(const ck_view_text *t, FILE *f);
void ck_view_text_free(ck_view_text *t);

/* .ckptfs/index.json: {"format", "metadata", "tensors": [{name, path, dtype, shape, nbytes}]},
 * and, when the index has values, "values": [{name, path, type}]; when parts of the source were
 * left out, "omitted": [{name, reason}]. A tensor tied to another
 * (alias_of[entry], from ck_synth_aliases; NULL: none) also has "alias_of": that name.
 * With locations, each tensor also has "file" (source file path) and "offset" (byte offset of
 * its first byte in that file; null unless its bytes are one extent) — `ckpt ls --json`. The
 * text into out (ck_view_text_free): 0, or -1 when memory ran out. */
int ck_view_index_json(const ck_index *ix, const ck_tree *t, const uint32_t *alias_of,
                       int with_locations, ck_view_text *out);

/* A tensor's shape as a JSON array, e.g. "[2,3]" or "[]", into buf (cap bytes). Returns the
 * length, or what it would have been (like snprintf). */
size_t ck_view_shape_json(const ck_entry *e, char *buf, size_t cap);

#endif
