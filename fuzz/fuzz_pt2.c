/* fuzz_pt2.c — a torch.export archive: directory, configs, every payload's checks (pt2_read_zip). */
#include "../formats/pt2.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_zip_reader_run(data, size, pt2_read_zip);
    return 0;
}
