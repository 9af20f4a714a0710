/* fuzz_pt2.c — a torch.export archive: directory, configs, every payload's checks (pt2_read_zip). */
#include "../pack/pt2.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ck_error err = {{0}};
    ck_index *ix = fuzz_index(data, size);
    const ck_file *f = &ix->files[0];
    zip_archive z;
    int rc = zip_read_directory(f, f->size, f->path, &z, &err);
    if (rc == 0) {
        rc = pt2_read_zip(ix, 0, &z, &err);
        zip_free(&z);
    }
    fuzz_check(rc, ix, &err);
    ck_index_free(ix);
    return 0;
}
