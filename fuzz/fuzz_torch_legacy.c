/* fuzz_torch_legacy.c — a legacy torch file: the pickle chain, the walk, storage placement
 * (pt_read_legacy). */
#include "../formats/torch.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ck_error err = {{0}};
    ck_index *ix = fuzz_index(data, size);
    fuzz_check(pt_read_legacy(ix, 0, &err), ix, &err);
    ck_index_free(ix);
    return 0;
}
