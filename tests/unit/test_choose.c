/* ck_choose (checkpoint/choose.h): which files of a directory make its checkpoint, the rule
 * transformers' from_pretrained and vLLM's loader follow, each rule against the next. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "../../checkpoint/choose.h"

#define NAMES(...) ((const char *const[]){__VA_ARGS__})
#define COUNT(...) (sizeof NAMES(__VA_ARGS__) / sizeof(const char *))

/* Chooses among the names; their picks joined by ' ' into out. */
static enum ck_choice_kind chosen(const char *const *names, size_t n, char *out, size_t cap)
{
    ck_choice c;
    ck_error err = {{0}};
    cr_assert_eq(ck_choose(names, n, "DIR", &c, &err), 0, "%s", err.msg);
    out[0] = 0;
    size_t shown = c.kind == CK_CHOSE_GGUF ? 1 : c.n;
    for (size_t i = 0; i < shown; i++)
        snprintf(out + strlen(out), cap - strlen(out), "%s%s", i ? " " : "", names[c.picked[i]]);
    enum ck_choice_kind kind = c.kind;
    ck_choice_free(&c);
    return kind;
}

#define CHOSEN(kind, want, ...)                                                                  \
    do {                                                                                         \
        char got[512];                                                                           \
        cr_expect_eq(chosen(NAMES(__VA_ARGS__), COUNT(__VA_ARGS__), got, sizeof got), kind);     \
        cr_expect_str_eq(got, want);                                                             \
    } while (0)

static void refused(const char *const *names, size_t n, const char *gist)
{
    ck_choice c;
    ck_error err = {{0}};
    cr_assert_eq(ck_choose(names, n, "DIR", &c, &err), -1);
    cr_expect(strstr(err.msg, gist) && strncmp(err.msg, "DIR: ", 5) == 0, "%s", err.msg);
}

#define REFUSED(gist, ...) refused(NAMES(__VA_ARGS__), COUNT(__VA_ARGS__), gist)

Test(choose, safetensors_index_before_its_shards_and_the_bin)
{
    CHOSEN(CK_CHOSE_INDEX, "model.safetensors.index.json", "README.md",
           "model-00002-of-00002.safetensors", "model.safetensors.index.json",
           "pytorch_model.bin", "model-00001-of-00002.safetensors");
}

Test(choose, every_top_level_safetensors_in_name_order)
{
    CHOSEN(CK_CHOSE_FILES, "a.safetensors b.safetensors", "b.safetensors", "config.json",
           "a.safetensors", "onnx/c.safetensors", ".hidden.safetensors", "pytorch_model.bin",
           "pytorch_model.bin.index.json");
    CHOSEN(CK_CHOSE_FILES, "model.safetensors", "model.safetensors", "x.gguf");
}

Test(choose, the_bin_index_then_the_bin_files)
{
    CHOSEN(CK_CHOSE_INDEX, "pytorch_model.bin.index.json", "pytorch_model-00001-of-00002.bin",
           "pytorch_model.bin.index.json", "pytorch_model-00002-of-00002.bin", "model.pt");
    CHOSEN(CK_CHOSE_FILES, "pytorch_model.bin", "config.json", "pytorch_model.bin",
           "training_args.bin", "optimizer.bin", "model.pt", "model.gguf");
    CHOSEN(CK_CHOSE_FILES, "a.bin b.bin", "b.bin", "a.bin");
}

Test(choose, pt_files_but_a_trainer_state)
{
    CHOSEN(CK_CHOSE_FILES, "model.pt", "optimizer.pt", "scheduler.pt", "scaler.pt", "model.pt",
           "training_args.bin", "x.npz");
}

Test(choose, gguf_one_or_the_first_split)
{
    CHOSEN(CK_CHOSE_GGUF, "m.gguf", "m.gguf", "x.npz");
    CHOSEN(CK_CHOSE_GGUF, "m-00001-of-00002.gguf", "m-00002-of-00002.gguf",
           "m-00001-of-00002.gguf");
    REFUSED("holds 2 GGUF files that are not one split set (0 first splits", "a.gguf", "b.gguf");
    REFUSED("'n-00002-of-00002.gguf' is not part of the split set of 'm-00001-of-00002.gguf'",
            "m-00001-of-00002.gguf", "m-00002-of-00002.gguf", "n-00002-of-00002.gguf");
}

Test(choose, dcp_metadata_first)
{
    CHOSEN(CK_CHOSE_DCP, ".metadata", "__0_0.distcp", ".metadata", "model.safetensors");
}

Test(choose, one_other_checkpoint_file_or_a_refusal)
{
    CHOSEN(CK_CHOSE_FILES, "weights.npz", "README.md", "weights.npz");
    REFUSED("holds several checkpoint files (a.pth, b.ckpt, ...): name one, DIR/FILE", "b.ckpt",
            "a.pth");
    REFUSED("holds no checkpoint file", "README.md", "config.json", "training_args.bin");
    REFUSED("holds no checkpoint file", ".safetensors");
    ck_choice c;
    ck_error err = {{0}};
    cr_expect_eq(ck_choose(NULL, 0, "DIR", &c, &err), -1, "an empty directory");
}
