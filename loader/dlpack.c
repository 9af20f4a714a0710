/* dlpack.c — a loaded tensor as a DLPack 0.6 DLManagedTensor, or as a DLPack 1.0
 * DLManagedTensorVersioned for a consumer that asks for one (the same tensor, version 1.0 and
 * the flags the caller gives).
 *
 * Element types DLPack 0.6 can name are exported as themselves: U8..U64 as kDLUInt, I8..I64 as
 * kDLInt, F16/F32/F64 as kDLFloat, BF16 as kDLBfloat 16, C64/C128 as kDLComplex 64/128, each
 * with the tensor's shape. The others ("raw": BOOL, which 0.6 has no code for, the F8 types,
 * C32, F4, F6_E2M3, F6_E3M2, and GGUF's block-quantized types) are exported as their bytes: kDLUInt 8 with shape [nbytes]; the
 * consumer reinterprets them (loader/python/ckload.py views them as the torch dtype).
 * Strides are NULL (compact row-major), byte_offset is 0, and data is the tensor's pointer into
 * the load's block (aligned as ckload.h says). The export holds a reference on the load, dropped by
 * the deleter, so the block lives as long as the last exported tensor.
 */
#include "ckload.h"

#include "../base/dtype.h"

#include "dlpack_v1.h"

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

static void release_versioned(DLManagedTensorVersioned *self)
{
    ckl_load *l = self->manager_ctx;
    free(self);
    ckl_release(l);
}

/* Tensor i of l, once it has landed, as a DLTensor whose shape array is at shape (room for
 * rank entries, at least one) into *dl; then a reference on l for the export. 0, or -1 if the
 * load failed or has no tensor i. */
static int export_tensor(ckl_load *l, size_t i, DLTensor *dl, int64_t *shape)
{
    char err[8];
    const ckl_tensor *t = ckl_get(l, i);
    if (!t || ckl_wait(l, i, err, sizeof err) != 0)
        return -1;
    DLDataType dt;
    int typed = dl_type_of(t->dtype_code, &dt);
    int ndim = typed ? t->rank : 1;
    if (typed && ndim) /* a rank-0 tensor has no shape array at all */
        memcpy(shape, t->shape, (size_t)ndim * sizeof *shape);
    else
        shape[0] = (int64_t)t->nbytes;
    int cuda = ckl_device_of(l) == CKL_CUDA;
    *dl = (DLTensor){.data = t->data,
                     .device = {.device_type = cuda ? kDLCUDA : kDLCPU,
                                .device_id = cuda ? ckl_cuda_ordinal(l) : 0},
                     .ndim = ndim,
                     .dtype = dt,
                     .shape = shape,
                     .strides = NULL,
                     .byte_offset = 0};
    ckl_retain(l);
    return 0;
}

/* Room for tensor i's shape: its rank, at least one entry (so that the pointer always points
 * into the export's allocation). */
static size_t shape_room(const ckl_load *l, size_t i)
{
    const ckl_tensor *t = l ? ckl_get(l, i) : NULL;
    return t && t->rank ? t->rank : 1;
}

DLManagedTensor *ckl_to_dlpack(ckl_load *l, size_t i)
{
    /* One allocation: the struct, then the shape entries. */
    DLManagedTensor *m = l ? malloc(sizeof *m + shape_room(l, i) * sizeof(int64_t)) : NULL;
    if (!m || export_tensor(l, i, &m->dl_tensor, (int64_t *)(m + 1)) != 0) {
        free(m);
        return NULL;
    }
    m->manager_ctx = l;
    m->deleter = release_export;
    return m;
}

DLManagedTensorVersioned *ckl_to_dlpack_versioned(ckl_load *l, size_t i, uint64_t flags)
{
    if (flags & ~(uint64_t)CKL_DLPACK_READ_ONLY)
        return NULL;
    DLManagedTensorVersioned *m =
        l ? malloc(sizeof *m + shape_room(l, i) * sizeof(int64_t)) : NULL;
    if (!m || export_tensor(l, i, &m->dl_tensor, (int64_t *)(m + 1)) != 0) {
        free(m);
        return NULL;
    }
    m->version = (DLPackVersion){.major = 1, .minor = 0};
    m->manager_ctx = l;
    m->deleter = release_versioned;
    m->flags = flags;
    return m;
}
