/* fuzz_zip.c — a zip central directory, ZIP64 included (zip_read_directory, zip_find). */
#include "../index/zip.h"
#include "fuzz.h"

#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ck_error err = {{0}};
    zip_archive z;
    int fd = fuzz_memfd(data, size);
    int rc = zip_read_directory(&(ck_file){.path = "fuzz-input", .fd = fd}, size, "fuzz-input",
                                &z, &err);
    fuzz_check(rc, NULL, &err);
    if (rc == 0) {
        /* Every entry can be found by its own name, and lies inside the file. */
        for (size_t i = 0; i < z.nentries; i++) {
            const zip_entry *e = &z.entries[i];
            FUZZ_REQUIRE(strlen(e->name) == e->name_len);
            FUZZ_REQUIRE(zip_find(&z, e->name, e->name_len) == e);
            FUZZ_REQUIRE(e->data_offset <= size && e->csize <= size - e->data_offset);
        }
        FUZZ_REQUIRE(zip_find(&z, "no/such/record", 14) == NULL ||
                     strcmp(zip_find(&z, "no/such/record", 14)->name, "no/such/record") == 0);
        zip_free(&z);
    }
    close(fd);
    return 0;
}
