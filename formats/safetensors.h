/* safetensors.h — the safetensors format (one file) and Hugging Face shard directories.
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

/* Opens a directory of shards: model.safetensors.index.json's weight_map if present, else every
 * *.safetensors file in name order. A tensor in two shards, or a weight_map that disagrees with
 * the shards, is an error. */
int st_open_dir(const char *dir, ck_index **out, ck_error *err);

/* The same for the set an index file names (a local path or a URL: its shards are opened
 * beside it, ck_source_sibling; URLs through remote, http.h). */
int st_open_index(struct http_remote *remote, const char *ipath, ck_index **out, ck_error *err);

/* The set of shards called names (n, in that order) beside base (a location in their
 * directory), without an index file. */
int st_open_names(struct http_remote *remote, const char *base, const char *const *names, size_t n,
                  ck_index **out, ck_error *err);

/* True when head (the first n bytes of a file) can start a JSON object: an index file, which
 * ck_open hands to st_open_index (no other format it reads starts so). */
int st_index_probe(const unsigned char *head, size_t n);

#endif
