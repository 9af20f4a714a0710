/* fuzz_packfile.c — a pack: the 64-byte header and the binary index (pack_read_file). */
#include "../pack/packfile.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ck_error err = {{0}};
    ck_index *ix = fuzz_index(data, size);
    fuzz_check(pack_read_file(ix, 0, &err), ix, &err);
    ck_index_free(ix);
    return 0;
}
