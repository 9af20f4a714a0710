/* pickle_policy.h — what the safe pickle VM (pickle.c) knows and allows, as tables: the opcodes
 * by name, the globals it resolves, and the globals it refuses with a reason.
 *
 * Contract: PK_OPCODES lists every opcode of protocols 0-5 once, with its name and byte as
 * CPython's pickle spells them; enum pk_opcode and pk_opcode_name are made from that one list,
 * so a name cannot disagree with its byte. Which opcodes run is the VM's dispatch's business,
 * not this list's. pk_allowed_global matches (module, name) exactly against the allowlist
 * (modelled on torch's weights_only unpickler); pk_unsupported_kind names the kind of tensor a
 * refused global would have built ("quantized", "sparse", ...), so that the message says more
 * than "refused". Names come from the pickle: they are bytes with a length, and may hold
 * anything, NULs included.
 */
#ifndef CK_PICKLE_POLICY_H
#define CK_PICKLE_POLICY_H

#include <stddef.h>
#include <stdint.h>

/* X(name, byte), in the order of CPython's Lib/pickle.py: protocol 0 and 1, then 2 to 5. */
#define PK_OPCODES(X)                                                                          \
    X(MARK, '(') X(STOP, '.') X(POP, '0') X(POP_MARK, '1') X(DUP, '2') X(FLOAT, 'F')          \
    X(INT, 'I') X(BININT, 'J') X(BININT1, 'K') X(LONG, 'L') X(BININT2, 'M') X(NONE, 'N')      \
    X(PERSID, 'P') X(BINPERSID, 'Q') X(REDUCE, 'R') X(STRING, 'S') X(BINSTRING, 'T')          \
    X(SHORT_BINSTRING, 'U') X(UNICODE, 'V') X(BINUNICODE, 'X') X(APPEND, 'a') X(BUILD, 'b')   \
    X(GLOBAL, 'c') X(DICT, 'd') X(EMPTY_DICT, '}') X(APPENDS, 'e') X(GET, 'g')                \
    X(BINGET, 'h') X(INST, 'i') X(LONG_BINGET, 'j') X(LIST, 'l') X(EMPTY_LIST, ']')           \
    X(OBJ, 'o') X(PUT, 'p') X(BINPUT, 'q') X(LONG_BINPUT, 'r') X(SETITEM, 's')                \
    X(TUPLE, 't') X(EMPTY_TUPLE, ')') X(SETITEMS, 'u') X(BINFLOAT, 'G')                       \
    /* protocol 2 */                                                                           \
    X(PROTO, 0x80) X(NEWOBJ, 0x81) X(EXT1, 0x82) X(EXT2, 0x83) X(EXT4, 0x84)                  \
    X(TUPLE1, 0x85) X(TUPLE2, 0x86) X(TUPLE3, 0x87) X(NEWTRUE, 0x88) X(NEWFALSE, 0x89)        \
    X(LONG1, 0x8a) X(LONG4, 0x8b)                                                              \
    /* protocol 3 */                                                                           \
    X(BINBYTES, 'B') X(SHORT_BINBYTES, 'C')                                                    \
    /* protocol 4 */                                                                           \
    X(SHORT_BINUNICODE, 0x8c) X(BINUNICODE8, 0x8d) X(BINBYTES8, 0x8e) X(EMPTY_SET, 0x8f)      \
    X(ADDITEMS, 0x90) X(FROZENSET, 0x91) X(NEWOBJ_EX, 0x92) X(STACK_GLOBAL, 0x93)             \
    X(MEMOIZE, 0x94) X(FRAME, 0x95)                                                            \
    /* protocol 5 */                                                                           \
    X(BYTEARRAY8, 0x96) X(NEXT_BUFFER, 0x97) X(READONLY_BUFFER, 0x98)

enum pk_opcode {
#define PK_OPCODE_ENUM(name, byte) OP_##name = byte,
    PK_OPCODES(PK_OPCODE_ENUM)
#undef PK_OPCODE_ENUM
};

/* "MARK", "BINUNICODE8", ...; NULL for a byte that is no opcode. */
const char *pk_opcode_name(unsigned char op);

/* The allowed globals. */
enum pk_global {
    PKG_REBUILD_TENSOR,            /* torch._utils._rebuild_tensor (legacy) */
    PKG_REBUILD_TENSOR_V2,         /* torch._utils._rebuild_tensor_v2 */
    PKG_REBUILD_TENSOR_V3,         /* torch._utils._rebuild_tensor_v3 (dtype given) */
    PKG_REBUILD_PARAMETER,         /* torch._utils._rebuild_parameter */
    PKG_REBUILD_PARAMETER_STATE,   /* torch._utils._rebuild_parameter_with_state */
    PKG_ORDERED_DICT,              /* collections.OrderedDict */
    PKG_TORCH_SIZE,                /* torch.Size */
    PKG_CODECS_ENCODE,             /* _codecs.encode: protocol 2 writes bytes this way */
    PKG_STORAGE_CLASS,             /* torch.<X>Storage, torch.UntypedStorage: .dtype says which */
    PKG_DTYPE,                     /* torch.float32, torch.float8_e4m3fn, ...: .dtype */
    PKG_DEVICE,                    /* torch.device */
    PKG_BYTES,                     /* builtins.bytes: protocols < 3 write b'' as bytes() */
    /* Allowed only in a DCP .metadata pickle (pk_limits.dcp). Record classes, which NEWOBJ
     * makes and BUILD gives a state (PK_OBJECT): */
    PKG_DCP_METADATA,              /* torch.distributed.checkpoint.metadata.Metadata */
    PKG_DCP_TENSOR_STORAGE,        /* ...metadata.TensorStorageMetadata */
    PKG_DCP_BYTES_STORAGE,         /* ...metadata.BytesStorageMetadata */
    PKG_DCP_CHUNK,                 /* ...metadata.ChunkStorageMetadata */
    PKG_DCP_TENSOR_PROPERTIES,     /* ...metadata.TensorProperties */
    PKG_DCP_METADATA_INDEX,        /* ...metadata.MetadataIndex */
    PKG_DCP_STORAGE_META,          /* ...metadata.StorageMeta */
    PKG_DCP_STORAGE_INFO,          /* torch.distributed.checkpoint.filesystem._StorageInfo */
    /* and values: */
    PKG_DCP_MEM_FORMAT,            /* ...metadata._MEM_FORMAT_ENCODING, only for getattr */
    PKG_GET_LAYOUT,                /* torch.serialization._get_layout(name): the str name */
    PKG_GETATTR,                   /* builtins.getattr(_MEM_FORMAT_ENCODING, name): the str */
    PKG_POSIX_PATH,                /* pathlib.PosixPath(*parts): the parts joined by '/' */
};

/* Marks an untyped storage (torch.UntypedStorage): its numel counts bytes, and the tensors on
 * it carry their own dtype (_rebuild_tensor_v3). Every other dtype is an enum ck_dtype. */
#define PK_DTYPE_BYTES 255

/* An allowed global and what it stands for. */
typedef struct pk_allowed {
    const char *module, *name;
    const char *full;      /* "module.name", for messages */
    uint8_t which;         /* enum pk_global */
    uint8_t dtype;         /* PKG_STORAGE_CLASS, PKG_DTYPE: enum ck_dtype or PK_DTYPE_BYTES */
} pk_allowed;

/* The allowlist's entry for module.name, or NULL when it is not allowed. The DCP .metadata's
 * globals are allowed only when dcp is set: nothing else is made of them. */
const pk_allowed *pk_allowed_global(const char *module, size_t ml, const char *name, size_t nl,
                                    int dcp);

/* The kind of tensor ("quantized", "sparse", ...) a global that is not allowed builds, or NULL
 * when it is not one of those. */
const char *pk_unsupported_kind(const char *module, size_t ml, const char *name, size_t nl);

#endif
