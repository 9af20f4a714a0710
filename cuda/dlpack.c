/* dlpack.c — a loaded tensor as a DLPack 0.6 DLManagedTensor.
 *
 * Element types DLPack 0.6 can name are exported as themselves: U8..U64 as kDLUInt, I8..I64 as
 * kDLInt, F16/F32/F64 as kDLFloat, BF16 as kDLBfloat 16, C64/C128 as kDLComplex 64/128, each
 * with the tensor's shape. The others ("raw": BOOL, which 0.6 has no code for, the F8 types,
 * C32, F4, F6_E2M3, F6_E3M2, and GGUF's block-quantized types) are exported as their bytes: kDLUInt 8 with shape [nbytes]; the
 * consumer reinterprets them (cuda/python/ckload.py views them as the torch dtype).
 * Strides are NULL (compact row-major), byte_offset is 0, and data is the tensor's pointer into
 * the load's block (aligned as ckload.h says). The export holds a reference on the load, dropped by
 * the deleter, so the block lives as long as the last exported tensor.
 */
#include "ckload.h"

#include "../pack/dtype.h"

#include <dlpack/dlpack.h>
#include <stdlib.h>
#include <string.h>

/* The DLPack type of code; 0 when it is exported raw. */
static int dl_type_of(int code, DLDataType *dt)
{
    static const struct {
        int code;
        uint8_t dl, bits;
    } map[] = {
        {CK_U8, kDLUInt, 8},     {CK_U16, kDLUInt, 16},  {CK_U32, kDLUInt, 32},
        {CK_U64, kDLUInt, 64},   {CK_I8, kDLInt, 8},     {CK_I16, kDLInt, 16},
        {CK_I32, kDLInt, 32},    {CK_I64, kDLInt, 64},   {CK_F16, kDLFloat, 16},
        {CK_F32, kDLFloat, 32},  {CK_F64, kDLFloat, 64}, {CK_BF16, kDLBfloat, 16},
        {CK_C64, kDLComplex, 64}, {CK_C128, kDLComplex, 128},
    };
    for (size_t k = 0; k < sizeof map / sizeof *map; k++)
        if (map[k].code == code) {
            *dt = (DLDataType){.code = map[k].dl, .bits = map[k].bits, .lanes = 1};
            return 1;
        }
    *dt = (DLDataType){.code = kDLUInt, .bits = 8, .lanes = 1};
    return 0;
}

static void release_export(DLManagedTensor *self)
{
    ckl_load *l = self->manager_ctx;
    free(self); /* the shape array is in the same allocation */
    ckl_release(l);
}

DLManagedTensor *ckl_to_dlpack(ckl_load *l, size_t i)
{
    char err[8];
    const ckl_tensor *t = l ? ckl_get(l, i) : NULL;
    if (!t || ckl_wait(l, i, err, sizeof err) != 0)
        return NULL;
    DLDataType dt;
    int typed = dl_type_of(t->dtype_code, &dt);
    int ndim = typed ? t->rank : 1;
    /* One allocation: the struct, then ndim shape entries (at least one, so that the pointer
     * always points into it). */
    DLManagedTensor *m = malloc(sizeof *m + (size_t)(ndim ? ndim : 1) * sizeof(int64_t));
    if (!m)
        return NULL;
    int64_t *shape = (int64_t *)(m + 1);
    if (typed && ndim) /* a rank-0 tensor has no shape array at all */
        memcpy(shape, t->shape, (size_t)ndim * sizeof *shape);
    else
        shape[0] = (int64_t)t->nbytes;
    int cuda = ckl_device_of(l) == CKL_CUDA;
    *m = (DLManagedTensor){
        .dl_tensor = {.data = t->data,
                      .device = {.device_type = cuda ? kDLCUDA : kDLCPU,
                                 .device_id = cuda ? ckl_cuda_ordinal(l) : 0},
                      .ndim = ndim,
                      .dtype = dt,
                      .shape = shape,
                      .strides = NULL,
                      .byte_offset = 0},
        .manager_ctx = l,
        .deleter = release_export,
    };
    ckl_retain(l);
    return m;
}
