/* fuzz_torch_zip.c — a torch.save zip: directory, records, data.pkl, the walk (pt_read_zip). */
#include "../formats/torch.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_zip_reader_run(data, size, pt_read_zip);
    return 0;
}
