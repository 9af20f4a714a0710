/* inspect.h — what ckpt diff, info and stats share (tools/inspect.c): tensor bytes read
 * through the index in bounded chunks, and element values decoded (inspect_decode_batch is
 * their one owner in the tool): every whole-byte integer dtype, F64/F32/F16/BF16 and the F8
 * types E4M3 and E5M2. Complex, the sub-byte floats (F4, F6), F8_E8M0, the FNUZ float8s and ggml's
 * block-quantized types are not decoded: stats lists them as skipped and diff compares their
 * bytes only. Nothing is printed until a command has read everything it reports, so trouble
 * midway (a truncated source) leaves one line on stderr and no partial report on stdout.
 */
#ifndef CK_INSPECT_H
#define CK_INSPECT_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "../index/index.h"

#define INSPECT_CHUNK (4u << 20) /* bytes read at a time: a multiple of every whole-byte element */
#define INSPECT_BATCH 4096u      /* elements decoded to doubles at a time */

/* Reads len bytes of e at off, all of them: a short read is trouble, said in err (stats'
 * threads each keep their own, so that one line is printed whoever failed). */
int inspect_read_chunk(const ck_index *ix, const ck_entry *e, void *buf, size_t len,
                       uint64_t off, ck_error *err);

/* The element size (ck_dtype_nbytes of one element) of a dtype decode_one reads, else 0. */
unsigned inspect_decoded_size(enum ck_dtype dt);

/* Whether dt is a floating-point type inspect_decode_batch reads. */
int inspect_is_float(enum ck_dtype dt);

/* n elements of dtype dt at p as doubles (dt one that inspect_decoded_size knows). */
void inspect_decode_batch(enum ck_dtype dt, const unsigned char *p, size_t n, double *out);

/* The product of e's dims. */
uint64_t inspect_element_count(const ck_entry *e);

/* e's shape as a JSON array. */
cJSON *inspect_shape_json(const ck_entry *e);

/* A double as JSON, exactly: %.17g round-trips, where cJSON's own printing may keep only 15
 * digits. JSON has no NaN or Inf: such a figure is the string "nan", "inf" or "-inf". */
cJSON *inspect_number_json(double v);

/* Prints doc (then frees it) on stdout, one document; 0, or 2 when that fails. */
int inspect_print_json_doc(cJSON *doc);

/* Whether name is selected by any of the n patterns (none: every name). */
int inspect_selected(const ck_entry *e, const char *const *pats, int n);

/* e's name as a JSON string. */
cJSON *inspect_name_json(const ck_entry *e);

#endif
