/* abi.c — what a binding that mirrors this library's structs by hand (loader/python/ckload.py)
 * checks when it loads it: the ABI version, the size and field offsets of every struct it
 * mirrors, ckload.h's and dlpack.h's, as this library was compiled, and the options' bounds it
 * checks its arguments against before they reach a C field. */
#include "ckload.h"

#include "dlpack_v1.h"

#include <string.h>

#define SIZE(s) {#s, sizeof(s)}
#define FIELD(s, f) {#s "." #f, offsetof(s, f)}
#define BOUND(b) {#b, (size_t)(b)}

static const struct {
    const char *what;
    size_t value;
} layout[] = {
    SIZE(ckl_options),          FIELD(ckl_options, device),     FIELD(ckl_options, cuda_device),
    FIELD(ckl_options, threads), FIELD(ckl_options, buffer_size), FIELD(ckl_options, buffers),
    FIELD(ckl_options, only),    FIELD(ckl_options, verify),      FIELD(ckl_options, on_ready),
    FIELD(ckl_options, ctx),     FIELD(ckl_options, pool),        FIELD(ckl_options, slices),
    FIELD(ckl_options, nslices), FIELD(ckl_options, rank),        FIELD(ckl_options, world_size),
    FIELD(ckl_options, read),    FIELD(ckl_options, dest),      FIELD(ckl_options, spelling),
    SIZE(ckl_slice),            FIELD(ckl_slice, glob),         FIELD(ckl_slice, dim),
    SIZE(ckl_tensor),           FIELD(ckl_tensor, name),        FIELD(ckl_tensor, dtype),
    FIELD(ckl_tensor, shape),    FIELD(ckl_tensor, data),         FIELD(ckl_tensor, nbytes),
    FIELD(ckl_tensor, rank),     FIELD(ckl_tensor, dtype_code),
    SIZE(DLDevice),             FIELD(DLDevice, device_type),   FIELD(DLDevice, device_id),
    SIZE(DLDataType),           FIELD(DLDataType, code),        FIELD(DLDataType, bits),
    FIELD(DLDataType, lanes),
    SIZE(DLTensor),             FIELD(DLTensor, data),          FIELD(DLTensor, device),
    FIELD(DLTensor, ndim),       FIELD(DLTensor, dtype),          FIELD(DLTensor, shape),
    FIELD(DLTensor, strides),    FIELD(DLTensor, byte_offset),
    SIZE(DLManagedTensor),      FIELD(DLManagedTensor, dl_tensor),
    FIELD(DLManagedTensor, manager_ctx), FIELD(DLManagedTensor, deleter),
    SIZE(DLPackVersion),        FIELD(DLPackVersion, major),    FIELD(DLPackVersion, minor),
    SIZE(DLManagedTensorVersioned), FIELD(DLManagedTensorVersioned, version),
    FIELD(DLManagedTensorVersioned, manager_ctx), FIELD(DLManagedTensorVersioned, deleter),
    FIELD(DLManagedTensorVersioned, flags), FIELD(DLManagedTensorVersioned, dl_tensor),
    BOUND(CKL_MAX_THREADS),     BOUND(CKL_MIN_BUFFER_SIZE),     BOUND(CKL_MAX_BUFFER_SIZE),
    BOUND(CKL_MAX_BUFFERS),     BOUND(CKL_MAX_WORLD_SIZE),      BOUND(CKL_MAX_SLICE_DIM),
};

unsigned ckl_abi_version(void)
{
    return CKL_ABI_VERSION;
}

long ckl_layout(const char *what)
{
    for (size_t i = 0; i < sizeof layout / sizeof *layout; i++)
        if (strcmp(layout[i].what, what) == 0)
            return (long)layout[i].value;
    return -1;
}
