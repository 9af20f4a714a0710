/* fuzz_sharded.c — a Hugging Face shard directory: model.safetensors.index.json and the shards
 * it names, or every *.safetensors file when it is absent (st_open_dir). The input is the
 * directory's files, as fuzz_dir_files splits it. */
#include "../formats/safetensors.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *dir = fuzz_dir_files(data, size, NULL);
    ck_error err = {{0}};
    ck_index *ix = NULL;
    int rc = st_open_dir(dir, &ix, &err);
    FUZZ_REQUIRE((rc == 0) == (ix != NULL));
    fuzz_check(rc, ix, &err);
    ck_index_free(ix);
    fuzz_dir_clear();
    return 0;
}
