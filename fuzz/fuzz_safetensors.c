/* fuzz_safetensors.c — one safetensors file: length prefix, JSON header, tiling (st_read_file). */
#include "../formats/safetensors.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ck_error err = {{0}};
    ck_index *ix = fuzz_index(data, size);
    fuzz_check(st_read_file(ix, 0, &err), ix, &err);
    ck_index_free(ix);
    return 0;
}
