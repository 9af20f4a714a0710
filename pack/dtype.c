#include "dtype.h"

#include <string.h>

static const struct {
    const char *name;
    unsigned bits;
} dtypes[CK_DTYPE_COUNT] = {
    [CK_BOOL] = {"BOOL", 8},         [CK_U8] = {"U8", 8},           [CK_I8] = {"I8", 8},
    [CK_F8_E5M2] = {"F8_E5M2", 8},   [CK_F8_E4M3] = {"F8_E4M3", 8}, [CK_F8_E8M0] = {"F8_E8M0", 8},
    [CK_I16] = {"I16", 16},          [CK_U16] = {"U16", 16},        [CK_F16] = {"F16", 16},
    [CK_BF16] = {"BF16", 16},        [CK_I32] = {"I32", 32},        [CK_U32] = {"U32", 32},
    [CK_F32] = {"F32", 32},          [CK_I64] = {"I64", 64},        [CK_U64] = {"U64", 64},
    [CK_F64] = {"F64", 64},          [CK_C64] = {"C64", 64},        [CK_F4] = {"F4", 4},
    [CK_F6_E2M3] = {"F6_E2M3", 6},   [CK_F6_E3M2] = {"F6_E3M2", 6},   [CK_C128] = {"C128", 128},
    [CK_C32] = {"C32", 32},          [CK_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8},
    [CK_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8},
};

const char *ck_dtype_name(enum ck_dtype dt)
{
    return (unsigned)dt < CK_DTYPE_COUNT ? dtypes[dt].name : "?";
}

unsigned ck_dtype_bits(enum ck_dtype dt)
{
    return (unsigned)dt < CK_DTYPE_COUNT ? dtypes[dt].bits : 0;
}

int ck_dtype_from_name(const char *s, size_t len)
{
    for (int i = 0; i < CK_DTYPE_COUNT; i++)
        if (strlen(dtypes[i].name) == len && memcmp(dtypes[i].name, s, len) == 0)
            return i;
    return -1;
}
