/* fuzz_gguf.c — one GGUF file: header, keys and values, tensor infos, offsets (gguf_read_file).
 * The memfd's name is no split's, so a split set is refused by name, after its first file. */
#include "../formats/gguf.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ck_error err = {{0}};
    ck_index *ix = fuzz_index(data, size);
    fuzz_check(gguf_read_file(ix, 0, &err), ix, &err);
    ck_index_free(ix);
    return 0;
}
