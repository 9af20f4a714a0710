/* fuzz_pickle.c — the safe pickle VM alone, with the default limits (pk_load). */
#include "../index/pickle.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ck_error err = {{0}};
    pk_result res;
    int rc = pk_load(data, size, NULL, "fuzz-input", 0, &res, &err);
    fuzz_check(rc, NULL, &err);
    if (rc == 0) {
        FUZZ_REQUIRE(res.root != NULL && res.consumed >= 1 && res.consumed <= size);
        pk_free(&res);
    } else {
        FUZZ_REQUIRE(rc == PK_ERROR || rc == PK_TRUNCATED);
    }
    return 0;
}
