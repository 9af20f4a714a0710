/* view.h — what the mount's own files say about an index. No FUSE here.
 * Contract: the texts returned are the caller's to free; JSON is UTF-8 and
 * follows the formats documented in docs/SEMANTICS.md ("The mount").
 */
#ifndef CK_VIEW_H
#define CK_VIEW_H

#include <stddef.h>
#include <stdint.h>

#include "../base/text.h"
#include "tree.h"

/* .ckptfs/index.json: {"format", "metadata", "tensors": [{name, path, dtype, shape, nbytes}]},
 * and, when the index has values, "values": [{name, path, type}]; when parts of the source were
 * left out, "omitted": [{name, reason}]. A tensor tied to another
 * (alias_of[entry], from ck_synth_aliases; NULL: none) also has "alias_of": that name.
 * With locations, each tensor also has "file" (source file path) and "offset" (byte offset of
 * its first byte in that file; null unless its bytes are one extent) — `ckpt ls --json`. The
 * text into out (ck_text_free), lending the index's long metadata texts: 0, or -1 when memory
 * ran out. */
int ck_view_index_json(const ck_index *ix, const ck_tree *t, const uint32_t *alias_of,
                       int with_locations, ck_text *out);

/* A tensor's shape as a JSON array, e.g. "[2,3]" or "[]", into buf (cap bytes). Returns the
 * length, or what it would have been (like snprintf). */
size_t ck_view_shape_json(const ck_entry *e, char *buf, size_t cap);

#endif
