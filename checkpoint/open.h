/* open.h — ck_open: a location (a file, a directory of shards or splits, a URL of a scheme
 * sources/schemes.h knows) to its index.
 *
 * Contract: the format is decided by content, never by the file's name: the first bytes of a
 * file (or, for a directory, the files in it) say which reader (one per format) builds the
 * index. No tensor data is read. Once the index is built, each remote file is told where its
 * tensors begin and end (ck_file_hint). This is the one place that knows every format.
 */
#ifndef CK_OPEN_H
#define CK_OPEN_H

#include "../base/error.h"
#include "../sources/http.h"
#include "../index/index.h"

/* A remote context (http.h) configured by c whose requests are authorised, and whose error
 * replies explained, by the schemes' table (schemes.h): each scheme's credential to its own
 * endpoint alone. What an entry point makes to open all its sources through. NULL without
 * memory. */
http_remote *ck_remote_new(const http_config *c);

/* Opens SOURCE and parses its headers, its remote files opened through remote (NULL: a context
 * of the index's own, ck_remote_new with the defaults and the environment, when SOURCE is
 * remote). On failure returns -1 with err set and *out NULL. */
int ck_open_through(http_remote *remote, const char *source, ck_index **out, ck_error *err);

/* ck_open_through(NULL, ...). */
int ck_open(const char *source, ck_index **out, ck_error *err);

#endif
