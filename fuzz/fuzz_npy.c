/* fuzz_npy.c — NumPy files: the .npy header parser on the raw input, then the input as a file,
 * read as an .npz when it starts like a zip (central directory, members, deflate streams and
 * their seek points) and as an .npy otherwise. fuzz_check then reads every tensor's ends, so a
 * deflated member is decoded again from its seek points. */
#include "../formats/npy.h"
#include "../index/zip.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ck_error err = {{0}};
    npy_header h;
    int rc = npy_parse_header(data, size, &h, "fuzz-input", "", 0, &err);
    fuzz_check(rc, NULL, &err);
    if (rc == 0)
        FUZZ_REQUIRE(h.data_offset <= size && h.rank <= CK_MAX_RANK);
    ck_index *ix = fuzz_index(data, size);
    err = (ck_error){{0}};
    rc = zip_probe(data, size) ? npz_read_file(ix, 0, &err) : npy_read_file(ix, 0, &err);
    fuzz_check(rc, rc == 0 ? ix : NULL, &err);
    ck_index_free(ix);
    return 0;
}
