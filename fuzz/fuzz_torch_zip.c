/* fuzz_torch_zip.c — a torch.save zip: directory, records, data.pkl, the walk (pt_read_zip). */
#include "../pack/torch.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ck_error err = {{0}};
    ck_index *ix = fuzz_index(data, size);
    fuzz_check(pt_read_zip(ix, 0, &err), ix, &err);
    ck_index_free(ix);
    return 0;
}
