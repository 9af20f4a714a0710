/* fuzz_source.c — ck_open on a file: the probe by content, then whichever reader it picks. The
 * path is the memfd's /proc/self/fd entry, so ck_open opens it as it would any file. */
#include "fuzz.h"
#include "../checkpoint/open.h"

#include <stdio.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ck_error err = {{0}};
    ck_index *ix = NULL;
    int fd = fuzz_memfd(data, size);
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    int rc = ck_open(path, &ix, &err);
    FUZZ_REQUIRE((rc == 0) == (ix != NULL));
    fuzz_check(rc, ix, &err);
    ck_index_free(ix);
    close(fd);
    return 0;
}
