/* shards.h — a checkpoint in several files: the shards an index file names (Hugging Face's
 * model.safetensors.index.json, pytorch_model.bin.index.json: a JSON object whose
 * "weight_map" maps each tensor to its shard), or a list of them, as one index.
 *
 * Contract:
 *  - Each shard is opened beside the index (or the base location: ck_source_sibling, a plain
 *    file name only) and read by its content, by the reader the opener hands in; all must be of
 *    one family (safetensors; PyTorch, zip or legacy), else the set is refused naming the shard.
 *    The index's format is "safetensors-sharded" or "pytorch-sharded".
 *  - Shards are opened in order of first mention in weight_map (a listed set: as given).
 *  - Checked, one line each: a tensor in two shards; a tensor weight_map does not name, or puts
 *    in another shard; a name weight_map gives that no shard holds; a weight_map value that is
 *    not a plain file name. A repeated key counts as json.loads reads it (its last value).
 *  - The index's "metadata" object joins the index's metadata (values that are not strings as
 *    their JSON text), beside each shard's own.
 */
#ifndef CK_SHARDS_H
#define CK_SHARDS_H

#include "../base/error.h"
#include "../index/index.h"

/* Reads file `file` of ix (already added) by its content, appending its entries, and sets
 * *format to what it found ("safetensors", "pytorch-zip", ...). 0, or -1 with err set. */
typedef int (*shard_reader)(ck_index *ix, uint32_t file, const char **format, ck_error *err);

/* True when head (the first n bytes of a file) can start a JSON object: an index file (no
 * checkpoint format ckptfs reads starts so). */
int shards_index_probe(const unsigned char *head, size_t n);

/* The set the index file at ipath names, its files opened through remote (NULL: local). On
 * failure -1 with err set and *out NULL. */
int shards_open_index(struct http_remote *remote, const char *ipath, shard_reader read,
                      ck_index **out, ck_error *err);

/* The set of the files called names (n, in that order) beside base, a location in their
 * directory (a path or URL ending in '/' names the directory itself); where names the set in
 * messages. */
int shards_open_names(struct http_remote *remote, const char *base, const char *const *names,
                      size_t n, const char *where, shard_reader read, ck_index **out,
                      ck_error *err);

#endif
