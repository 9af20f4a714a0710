#include "dtype.h"

#include <string.h>

/* The block geometry is the one fact every size is computed from. The quantized types' blocks
 * are ggml's (ggml-common.h: QK4_0 = 32, sizeof(block_q4_0) = 18, ..., QK_K = 256). */
static const struct {
    const char *name;
    unsigned elems, bytes;
} dtypes[CK_DTYPE_COUNT] = {
    [CK_BOOL] = {"BOOL", 1, 1},       [CK_U8] = {"U8", 1, 1},
    [CK_I8] = {"I8", 1, 1},           [CK_F8_E5M2] = {"F8_E5M2", 1, 1},
    [CK_F8_E4M3] = {"F8_E4M3", 1, 1}, [CK_F8_E8M0] = {"F8_E8M0", 1, 1},
    [CK_I16] = {"I16", 1, 2},         [CK_U16] = {"U16", 1, 2},
    [CK_F16] = {"F16", 1, 2},         [CK_BF16] = {"BF16", 1, 2},
    [CK_I32] = {"I32", 1, 4},         [CK_U32] = {"U32", 1, 4},
    [CK_F32] = {"F32", 1, 4},         [CK_I64] = {"I64", 1, 8},
    [CK_U64] = {"U64", 1, 8},         [CK_F64] = {"F64", 1, 8},
    [CK_C64] = {"C64", 1, 8},         [CK_F4] = {"F4", 2, 1},
    [CK_F6_E2M3] = {"F6_E2M3", 4, 3}, [CK_F6_E3M2] = {"F6_E3M2", 4, 3},
    [CK_C128] = {"C128", 1, 16},      [CK_C32] = {"C32", 1, 4},
    [CK_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 1, 1},
    [CK_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 1, 1},
    [CK_Q4_0] = {"Q4_0", 32, 18},     [CK_Q4_1] = {"Q4_1", 32, 20},
    [CK_Q5_0] = {"Q5_0", 32, 22},     [CK_Q5_1] = {"Q5_1", 32, 24},
    [CK_Q8_0] = {"Q8_0", 32, 34},     [CK_Q8_1] = {"Q8_1", 32, 36},
    [CK_Q2_K] = {"Q2_K", 256, 84},    [CK_Q3_K] = {"Q3_K", 256, 110},
    [CK_Q4_K] = {"Q4_K", 256, 144},   [CK_Q5_K] = {"Q5_K", 256, 176},
    [CK_Q6_K] = {"Q6_K", 256, 210},   [CK_Q8_K] = {"Q8_K", 256, 292},
    [CK_IQ2_XXS] = {"IQ2_XXS", 256, 66}, [CK_IQ2_XS] = {"IQ2_XS", 256, 74},
    [CK_IQ3_XXS] = {"IQ3_XXS", 256, 98}, [CK_IQ1_S] = {"IQ1_S", 256, 50},
    [CK_IQ4_NL] = {"IQ4_NL", 32, 18}, [CK_IQ3_S] = {"IQ3_S", 256, 110},
    [CK_IQ2_S] = {"IQ2_S", 256, 82},  [CK_IQ4_XS] = {"IQ4_XS", 256, 136},
    [CK_IQ1_M] = {"IQ1_M", 256, 56},  [CK_TQ1_0] = {"TQ1_0", 256, 54},
    [CK_TQ2_0] = {"TQ2_0", 256, 66},  [CK_MXFP4] = {"MXFP4", 32, 17},
    [CK_NVFP4] = {"NVFP4", 64, 36},   [CK_Q1_0] = {"Q1_0", 128, 18},
};

const char *ck_dtype_name(enum ck_dtype dt)
{
    return (unsigned)dt < CK_DTYPE_COUNT ? dtypes[dt].name : "?";
}

unsigned ck_dtype_block_elems(enum ck_dtype dt)
{
    return (unsigned)dt < CK_DTYPE_COUNT ? dtypes[dt].elems : 0;
}

unsigned ck_dtype_block_bytes(enum ck_dtype dt)
{
    return (unsigned)dt < CK_DTYPE_COUNT ? dtypes[dt].bytes : 0;
}

unsigned ck_dtype_bits(enum ck_dtype dt)
{
    unsigned e = ck_dtype_block_elems(dt), b = ck_dtype_block_bytes(dt);
    /* A ggml block holds scales beside its codes: its elements have no width of their own. */
    return e && dt < CK_Q4_0 ? 8 * b / e : 0;
}

int ck_dtype_nbytes(enum ck_dtype dt, uint64_t n, uint64_t *bytes)
{
    unsigned e = ck_dtype_block_elems(dt);
    if (e == 0 || n % e ||
        __builtin_mul_overflow(n / e, (uint64_t)ck_dtype_block_bytes(dt), bytes))
        return -1;
    return 0;
}

int ck_dtype_from_name(const char *s, size_t len)
{
    for (int i = 0; i < CK_DTYPE_COUNT; i++)
        if (strlen(dtypes[i].name) == len && memcmp(dtypes[i].name, s, len) == 0)
            return i;
    return -1;
}
