/* fuzz_packfile.c — a pack: the 64-byte header and the binary index (pack_read_file).
 *
 * The harness writes the right index checksum into a copy of the input first
 * (fuzz_fix_pack_xxh3), so that mutations of the index get past that check. */
#include "../formats/packfile.h"
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1);
    FUZZ_REQUIRE(copy != NULL);
    memcpy(copy, data, size);
    fuzz_fix_pack_xxh3(copy, size);
    ck_error err = {{0}};
    ck_index *ix = fuzz_index(copy, size);
    fuzz_check(pack_read_file(ix, 0, &err), ix, &err);
    ck_index_free(ix);
    free(copy);
    return 0;
}
