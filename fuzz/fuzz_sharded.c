/* fuzz_sharded.c — a directory of files, opened as ck_open opens one (checkpoint/choose.h):
 * Hugging Face's shards and their index among them. The input is the directory's files, as
 * fuzz_dir_files splits it. */
#include "../checkpoint/open.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *dir = fuzz_dir_files(data, size, NULL);
    ck_error err = {{0}};
    ck_index *ix = NULL;
    int rc = ck_open(dir, &ix, &err);
    FUZZ_REQUIRE((rc == 0) == (ix != NULL));
    fuzz_check(rc, ix, &err);
    ck_index_free(ix);
    fuzz_dir_clear();
    return 0;
}
