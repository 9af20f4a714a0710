/* open.h — ck_open: a location (a file, a directory of shards or splits, an http(s):// or
 * hf:// URL) to its index.
 *
 * Contract: the format is decided by content, never by the file's name: the first bytes of a
 * file (or, for a directory, the files in it) say which reader (one per format) builds the
 * index. No tensor data is read. Once the index is built, each remote file is told where its
 * tensors begin and end (ck_file_hint). This is the one place that knows every format.
 */
#ifndef CK_OPEN_H
#define CK_OPEN_H

#include "error.h"
#include "index.h"

/* Opens SOURCE and parses its headers. On failure returns -1 with err set and *out NULL. */
int ck_open(const char *source, ck_index **out, ck_error *err);

#endif
