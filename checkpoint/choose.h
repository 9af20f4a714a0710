/* choose.h — which files of a directory make its checkpoint, decided from their names alone:
 * the one rule for a local directory, a Hub repository and an s3:// prefix.
 *
 * Contract: the first of these that the names hold wins, as transformers' from_pretrained and
 * vLLM's loader look (safetensors first, then PyTorch's .bin, then *.pt):
 *  1. `.metadata`: a DCP checkpoint;
 *  2. model.safetensors.index.json: the shards its weight_map names;
 *  3. every *.safetensors;
 *  4. pytorch_model.bin.index.json: the shards its weight_map names;
 *  5. every *.bin but those no weights are in (training_args.bin, optimizer.bin);
 *  6. every *.pt but optimizer.pt, scheduler.pt and scaler.pt;
 *  7. the *.gguf: the one, or the -00001-of-N split of the set every *.gguf belongs to;
 *  8. the one file of another checkpoint kind (.pth .ckpt .npz .npy .pt2 .pack).
 * Names are top-level file names ('/' in one: a file further down, ignored); hidden ones
 * (".x", but `.metadata`) are ignored. Several files of 3, 5 or 6 are taken in name order, as
 * one set; several of 8, or GGUF files of more than one set, are refused, naming two. Nothing
 * the rule finds is refused too. What each file holds is its content's business (open.h).
 */
#ifndef CK_CHOOSE_H
#define CK_CHOOSE_H

#include <stddef.h>

#include "../base/error.h"

enum ck_choice_kind {
    CK_CHOSE_DCP,   /* picked[0]: the .metadata */
    CK_CHOSE_INDEX, /* picked[0]: the index file */
    CK_CHOSE_FILES, /* picked[0..n): the files, in name order; one: a checkpoint of one file */
    CK_CHOSE_GGUF,  /* picked[0]: the first split; n: how many *.gguf the directory holds, all
                     * of which that split's set must open */
};

typedef struct ck_choice {
    enum ck_choice_kind kind;
    size_t *picked; /* indices into the names (malloc'ed) */
    size_t n;
} ck_choice;

/* Chooses among names (n of them) by the rule above: 0 with *c filled (ck_choice_free releases
 * it), or -1 with err set, said of where (the directory as the user named it). */
int ck_choose(const char *const *names, size_t n, const char *where, ck_choice *c,
              ck_error *err);
void ck_choice_free(ck_choice *c);

#endif
