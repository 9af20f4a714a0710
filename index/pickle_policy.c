/* pickle_policy.c — the tables of pickle_policy.h, and the lookups in them. */
#include "pickle_policy.h"

#include <string.h>

#include "../base/dtype.h" /* the storages' and dtypes' enum ck_dtype */

/* --- opcodes --------------------------------------------------------------------------- */

const char *pk_opcode_name(unsigned char op)
{
    static const char *const names[256] = {
#define PK_OPCODE_NAME(name, byte) [byte] = #name,
        PK_OPCODES(PK_OPCODE_NAME)
#undef PK_OPCODE_NAME
    };
    return names[op];
}

/* --- allowed globals ------------------------------------------------------------------- */

#define G(m, n, w, d) {m, n, m "." n, w, d}
static const pk_allowed allowlist[] = {
    G("torch._utils", "_rebuild_tensor", PKG_REBUILD_TENSOR, 0),
    G("torch._utils", "_rebuild_tensor_v2", PKG_REBUILD_TENSOR_V2, 0),
    G("torch._utils", "_rebuild_tensor_v3", PKG_REBUILD_TENSOR_V3, 0),
    G("torch._utils", "_rebuild_parameter", PKG_REBUILD_PARAMETER, 0),
    G("torch._utils", "_rebuild_parameter_with_state", PKG_REBUILD_PARAMETER_STATE, 0),
    G("collections", "OrderedDict", PKG_ORDERED_DICT, 0),
    G("torch", "Size", PKG_TORCH_SIZE, 0),
    G("_codecs", "encode", PKG_CODECS_ENCODE, 0),
    /* Protocols < 3 write b'' as bytes(); fix_imports spells builtins as __builtin__. */
    G("builtins", "bytes", PKG_BYTES, 0),
    G("__builtin__", "bytes", PKG_BYTES, 0),
    G("torch", "device", PKG_DEVICE, 0),
    G("torch", "DoubleStorage", PKG_STORAGE_CLASS, CK_F64),
    G("torch", "FloatStorage", PKG_STORAGE_CLASS, CK_F32),
    G("torch", "HalfStorage", PKG_STORAGE_CLASS, CK_F16),
    G("torch", "BFloat16Storage", PKG_STORAGE_CLASS, CK_BF16),
    G("torch", "LongStorage", PKG_STORAGE_CLASS, CK_I64),
    G("torch", "IntStorage", PKG_STORAGE_CLASS, CK_I32),
    G("torch", "ShortStorage", PKG_STORAGE_CLASS, CK_I16),
    G("torch", "CharStorage", PKG_STORAGE_CLASS, CK_I8),
    G("torch", "ByteStorage", PKG_STORAGE_CLASS, CK_U8),
    G("torch", "BoolStorage", PKG_STORAGE_CLASS, CK_BOOL),
    G("torch", "ComplexFloatStorage", PKG_STORAGE_CLASS, CK_C64),
    G("torch", "ComplexDoubleStorage", PKG_STORAGE_CLASS, CK_C128),
    G("torch", "UntypedStorage", PKG_STORAGE_CLASS, PK_DTYPE_BYTES),
    G("torch.storage", "UntypedStorage", PKG_STORAGE_CLASS, PK_DTYPE_BYTES),
    G("torch", "float64", PKG_DTYPE, CK_F64),
    G("torch", "double", PKG_DTYPE, CK_F64),
    G("torch", "float32", PKG_DTYPE, CK_F32),
    G("torch", "float", PKG_DTYPE, CK_F32),
    G("torch", "float16", PKG_DTYPE, CK_F16),
    G("torch", "half", PKG_DTYPE, CK_F16),
    G("torch", "bfloat16", PKG_DTYPE, CK_BF16),
    G("torch", "int64", PKG_DTYPE, CK_I64),
    G("torch", "long", PKG_DTYPE, CK_I64),
    G("torch", "int32", PKG_DTYPE, CK_I32),
    G("torch", "int", PKG_DTYPE, CK_I32),
    G("torch", "int16", PKG_DTYPE, CK_I16),
    G("torch", "short", PKG_DTYPE, CK_I16),
    G("torch", "int8", PKG_DTYPE, CK_I8),
    G("torch", "uint8", PKG_DTYPE, CK_U8),
    G("torch", "uint16", PKG_DTYPE, CK_U16),
    G("torch", "uint32", PKG_DTYPE, CK_U32),
    G("torch", "uint64", PKG_DTYPE, CK_U64),
    G("torch", "bool", PKG_DTYPE, CK_BOOL),
    G("torch", "complex64", PKG_DTYPE, CK_C64),
    G("torch", "cfloat", PKG_DTYPE, CK_C64),
    G("torch", "complex128", PKG_DTYPE, CK_C128),
    G("torch", "cdouble", PKG_DTYPE, CK_C128),
    G("torch", "complex32", PKG_DTYPE, CK_C32),
    G("torch", "chalf", PKG_DTYPE, CK_C32),
    G("torch", "float8_e4m3fn", PKG_DTYPE, CK_F8_E4M3),
    G("torch", "float8_e5m2", PKG_DTYPE, CK_F8_E5M2),
    G("torch", "float8_e4m3fnuz", PKG_DTYPE, CK_F8_E4M3FNUZ),
    G("torch", "float8_e5m2fnuz", PKG_DTYPE, CK_F8_E5M2FNUZ),
    G("torch", "float8_e8m0fnu", PKG_DTYPE, CK_F8_E8M0),
};

/* Globals that build tensors this reader cannot show: refused with a message that says what
 * kind of tensor, not just "refused". A NULL name matches any name starting with "_rebuild_". */
static const struct {
    const char *module, *name, *kind;
} unsupported[] = {
    {"torch._utils", "_rebuild_qtensor", "quantized"},
    {"torch._utils", "_rebuild_sparse_tensor", "sparse"},
    {"torch._utils", "_rebuild_sparse_csr_tensor", "sparse"},
    {"torch._utils", "_rebuild_nested_tensor", "nested"},
    {"torch._utils", "_rebuild_wrapper_subclass", "tensor-subclass"},
    {"torch._utils", "_rebuild_device_tensor_from_numpy", "numpy-backed"},
    {"torch._utils", "_rebuild_device_tensor_from_cpu_tensor", "device-specific"},
    {"torch._utils", "_rebuild_meta_tensor_no_storage", "meta"},
    {"torch._utils", "_rebuild_xla_tensor", "XLA"},
    {"torch._utils", "_rebuild_mlc_tensor", "MLC"},
    {"torch._utils", NULL, "such"},
    {"torch._tensor", "_rebuild_from_type", "tensor-subclass"},
    {"torch._tensor", "_rebuild_from_type_v2", "tensor-subclass"},
    {"torch.serialization", "_get_layout", "sparse"},
    {"torch", "sparse_coo", "sparse"},
    {"torch", "sparse_csr", "sparse"},
    {"torch", "sparse_csc", "sparse"},
    {"torch", "sparse_bsr", "sparse"},
    {"torch", "sparse_bsc", "sparse"},
    {"torch", "QInt8Storage", "quantized"},
    {"torch", "QUInt8Storage", "quantized"},
    {"torch", "QInt32Storage", "quantized"},
    {"torch", "QUInt4x2Storage", "quantized"},
    {"torch", "QUInt2x4Storage", "quantized"},
    {"torch", "qint8", "quantized"},
    {"torch", "quint8", "quantized"},
    {"torch", "qint32", "quantized"},
    {"torch", "quint4x2", "quantized"},
    {"torch", "quint2x4", "quantized"},
};

#define DCP_MODULE "torch.distributed.checkpoint.metadata"
static const pk_allowed dcp_allowlist[] = {
    G(DCP_MODULE, "Metadata", PKG_DCP_METADATA, 0),
    G(DCP_MODULE, "TensorStorageMetadata", PKG_DCP_TENSOR_STORAGE, 0),
    G(DCP_MODULE, "BytesStorageMetadata", PKG_DCP_BYTES_STORAGE, 0),
    G(DCP_MODULE, "ChunkStorageMetadata", PKG_DCP_CHUNK, 0),
    G(DCP_MODULE, "TensorProperties", PKG_DCP_TENSOR_PROPERTIES, 0),
    G(DCP_MODULE, "MetadataIndex", PKG_DCP_METADATA_INDEX, 0),
    G(DCP_MODULE, "StorageMeta", PKG_DCP_STORAGE_META, 0),
    G(DCP_MODULE, "_MEM_FORMAT_ENCODING", PKG_DCP_MEM_FORMAT, 0),
    G("torch.distributed.checkpoint.filesystem", "_StorageInfo", PKG_DCP_STORAGE_INFO, 0),
    G("torch.serialization", "_get_layout", PKG_GET_LAYOUT, 0),
    G("builtins", "getattr", PKG_GETATTR, 0),
    G("__builtin__", "getattr", PKG_GETATTR, 0), /* protocols < 3: fix_imports' spelling */
    G("pathlib", "PosixPath", PKG_POSIX_PATH, 0),
};

/* --- lookups -------------------------------------------------------------------------- */

static int eq(const char *s, size_t n, const char *lit)
{
    return strlen(lit) == n && memcmp(s, lit, n) == 0;
}

static const pk_allowed *find_allowed(const pk_allowed *list, size_t n, const char *module,
                                      size_t ml, const char *name, size_t nl)
{
    for (size_t i = 0; i < n; i++)
        if (eq(module, ml, list[i].module) && eq(name, nl, list[i].name))
            return &list[i];
    return NULL;
}

const pk_allowed *pk_allowed_global(const char *module, size_t ml, const char *name, size_t nl,
                                    int dcp)
{
    const pk_allowed *a =
        find_allowed(allowlist, sizeof allowlist / sizeof *allowlist, module, ml, name, nl);
    if (!a && dcp)
        a = find_allowed(dcp_allowlist, sizeof dcp_allowlist / sizeof *dcp_allowlist, module, ml,
                         name, nl);
    return a;
}

const char *pk_unsupported_kind(const char *module, size_t ml, const char *name, size_t nl)
{
    for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++)
        if (eq(module, ml, unsupported[i].module) &&
            (unsupported[i].name ? eq(name, nl, unsupported[i].name)
                                 : nl > 9 && memcmp(name, "_rebuild_", 9) == 0))
            return unsupported[i].kind;
    return NULL;
}
