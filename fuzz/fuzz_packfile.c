/* fuzz_packfile.c — a pack: the 64-byte header and the binary index (pack_read_file).
 *
 * The header holds an XXH3 of the index, and almost every mutation of the index breaks it, so
 * the fuzzer would never get past that check. The harness therefore writes the right checksum
 * into a copy of the input first (whenever the header's index_length fits the input); comparing
 * a checksum needs no fuzzing, and the unit tests cover a wrong one. */
#include "../pack/packfile.h"
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1);
    FUZZ_REQUIRE(copy != NULL);
    memcpy(copy, data, size);
    if (size >= PACK_HEADER_SIZE) {
        pack_header h;
        pack_header_decode(copy, &h);
        if (h.index_length <= size - PACK_HEADER_SIZE) {
            uint64_t sum = XXH3_64bits(copy + PACK_HEADER_SIZE, (size_t)h.index_length);
            for (int i = 0; i < 8; i++)
                copy[56 + i] = (uint8_t)(sum >> (8 * i));
        }
    }
    ck_error err = {{0}};
    ck_index *ix = fuzz_index(copy, size);
    fuzz_check(pack_read_file(ix, 0, &err), ix, &err);
    ck_index_free(ix);
    free(copy);
    return 0;
}
