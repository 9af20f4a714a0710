/* dtype.h — element types, named as the safetensors spec names them, and ggml's block types.
 * Contract: ck_dtype values are stable (they are stored in packs: FORMAT.md lists the codes);
 * names round-trip through ck_dtype_from_name. Each dtype is stored in blocks: `elems` elements
 * in `bytes` bytes (1 element for the whole-byte types; 2 in 1 byte for F4, 4 in 3 for the F6
 * types; ggml's quantized types as ggml lays them out, e.g. Q4_0 = 32 elements in 18 bytes).
 * ck_dtype_nbytes is the one owner of "how many bytes do n elements take".
 */
#ifndef CK_DTYPE_H
#define CK_DTYPE_H

#include <stddef.h>
#include <stdint.h>

enum ck_dtype {
    CK_BOOL, CK_U8, CK_I8, CK_F8_E5M2, CK_F8_E4M3, CK_F8_E8M0, CK_I16, CK_U16, CK_F16, CK_BF16,
    CK_I32, CK_U32, CK_F32, CK_I64, CK_U64, CK_F64, CK_C64, CK_F4, CK_F6_E2M3, CK_F6_E3M2,
    /* torch dtypes the safetensors spec lacks, under names of ours */
    CK_C128,          /* complex128 */
    CK_C32,           /* complex32 (ComplexHalf) */
    CK_F8_E4M3FNUZ,   /* float8_e4m3fnuz */
    CK_F8_E5M2FNUZ,   /* float8_e5m2fnuz */
    /* ggml's block-quantized types (GGUF), named as ggml names them: raw blocks */
    CK_Q4_0, CK_Q4_1, CK_Q5_0, CK_Q5_1, CK_Q8_0, CK_Q8_1, CK_Q2_K, CK_Q3_K, CK_Q4_K, CK_Q5_K,
    CK_Q6_K, CK_Q8_K, CK_IQ2_XXS, CK_IQ2_XS, CK_IQ3_XXS, CK_IQ1_S, CK_IQ4_NL, CK_IQ3_S, CK_IQ2_S,
    CK_IQ4_XS, CK_IQ1_M, CK_TQ1_0, CK_TQ2_0, CK_MXFP4, CK_NVFP4, CK_Q1_0,
    CK_DTYPE_COUNT
};
/* The dtypes before this one are the safetensors spec's; a safetensors file may use no other. */
#define CK_ST_DTYPE_COUNT (CK_F6_E3M2 + 1)

const char *ck_dtype_name(enum ck_dtype dt);
/* The storage width of one element in bits (4 and 6 for the sub-byte floats); 0 for ggml's
 * block types (CK_Q4_0 on), whose blocks hold scales beside the codes, and unknown codes. */
unsigned ck_dtype_bits(enum ck_dtype dt);
/* Elements per block and bytes per block; 0 for an unknown code. */
unsigned ck_dtype_block_elems(enum ck_dtype dt);
unsigned ck_dtype_block_bytes(enum ck_dtype dt);
/* The bytes that n elements take: -1 when n is not a whole number of blocks or the size
 * overflows, or the code is unknown. */
int ck_dtype_nbytes(enum ck_dtype dt, uint64_t n, uint64_t *bytes);
/* -1 when len bytes at s name no dtype. */
int ck_dtype_from_name(const char *s, size_t len);

#endif
