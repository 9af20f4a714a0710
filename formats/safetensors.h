/* safetensors.h — the safetensors format: one file (a set of shards is checkpoint/shards.h's).
 *
 * Contract: a file is accepted only if it follows every rule of the public spec: an 8-byte
 * little-endian header length (at most ST_MAX_HEADER), a UTF-8 JSON object of tensors and an
 * optional string→string "__metadata__", data offsets that start at 0 and tile the data region
 * exactly to the end of the file, each extent exactly shape × dtype bytes. The first broken rule
 * is reported, naming the tensor or header byte. Tensors enter the index in data-offset order.
 */
#ifndef CK_SAFETENSORS_H
#define CK_SAFETENSORS_H

#include "../index/index.h"

#include <cjson/cJSON.h>

#define ST_MAX_HEADER 100000000u

/* True when head (the first n bytes of a file) can start a safetensors file. */
int st_probe(const unsigned char *head, size_t n);

/* Parses file `file` of ix (already added) and appends its tensors; its __metadata__ entries
 * are added unless ix already has that key. */
int st_read_file(ck_index *ix, uint32_t file, ck_error *err);

/* The same for a header already in memory: json is len bytes; the data region starts at file
 * offset data_start and is data_len bytes long. */
int st_parse_header(ck_index *ix, uint32_t file, const char *json, size_t len,
                    uint64_t data_start, uint64_t data_len, ck_error *err);

/* Adds metadata object obj's members to ix as json.loads reads them (a repeated key: its last
 * value where it first stands); a value that is not a string is an error, or with stringify
 * (an index file's "metadata", which holds numbers) stands as its JSON text. */
int st_add_metadata(ck_index *ix, const cJSON *obj, int stringify, const char *path,
                    ck_error *err);

#endif
