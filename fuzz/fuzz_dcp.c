/* fuzz_dcp.c — a torch.distributed.checkpoint directory (dcp_open): the .metadata pickle run
 * by the VM with the DCP classes allowed (pk_dcp_limits), its records and tensors, and the
 * .distcp archives they name. The input is the directory's files as fuzz_dir_files splits it:
 * the first piece the .metadata, each later one "NAME\nCONTENTS" (a .distcp file). */
#include "../formats/dcp.h"
#include "fuzz.h"

#include <limits.h>
#include <stdio.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char meta[PATH_MAX];
    snprintf(meta, sizeof meta, "%s/" DCP_METADATA, fuzz_dir_files(data, size, DCP_METADATA));
    ck_error err = {{0}};
    ck_index *ix = NULL;
    int rc = dcp_open(NULL, meta, &ix, &err);
    FUZZ_REQUIRE((rc == 0) == (ix != NULL));
    fuzz_check(rc, ix, &err);
    ck_index_free(ix);
    fuzz_dir_clear();
    return 0;
}
