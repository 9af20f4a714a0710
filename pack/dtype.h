/* dtype.h — element types, named as the safetensors spec names them.
 * Contract: ck_dtype values are stable (they are stored in packs); names round-trip through
 * ck_dtype_from_name; bits is the storage width of one element (4 and 6 for the sub-byte floats).
 */
#ifndef CK_DTYPE_H
#define CK_DTYPE_H

#include <stddef.h>

enum ck_dtype {
    CK_BOOL, CK_U8, CK_I8, CK_F8_E5M2, CK_F8_E4M3, CK_F8_E8M0, CK_I16, CK_U16, CK_F16, CK_BF16,
    CK_I32, CK_U32, CK_F32, CK_I64, CK_U64, CK_F64, CK_C64, CK_F4, CK_F6_E2M3, CK_F6_E3M2,
    /* torch dtypes the safetensors spec lacks, under names of ours */
    CK_C128,          /* complex128 */
    CK_C32,           /* complex32 (ComplexHalf) */
    CK_F8_E4M3FNUZ,   /* float8_e4m3fnuz */
    CK_F8_E5M2FNUZ,   /* float8_e5m2fnuz */
    CK_DTYPE_COUNT
};
/* The dtypes before this one are the safetensors spec's; a safetensors file may use no other. */
#define CK_ST_DTYPE_COUNT (CK_F6_E3M2 + 1)

const char *ck_dtype_name(enum ck_dtype dt);
unsigned ck_dtype_bits(enum ck_dtype dt);
/* -1 when len bytes at s name no dtype. */
int ck_dtype_from_name(const char *s, size_t len);

#endif
