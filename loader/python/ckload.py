"""ckload — a checkpoint straight into torch tensors, through libckload.

Pure ctypes, no compile step. The library is found through the environment variable
CKLOAD_LIB, else where `make install` put it (the installed copy of this file names
PREFIX/lib/libckload.so.N), else beside this file under its soname (a wheel: `pip install .`
makes this file the package's __init__.py), else next to this module as built:
build/python/ckload.py uses build/libckload.so.
The structs below mirror ckload.h by hand; on loading the library this module checks them (and
the ABI version) against what the library reports, and refuses a library that disagrees.

    import ckload
    sd = ckload.load("model.pack", device="cuda:0")     # {name: torch.Tensor}, in pack order
    sd = ckload.load("model.safetensors", device="cpu") # any source ckptfs mounts, as it is

A source is whatever ckptfs mounts: a pack, a safetensors file, a directory of shards, a
PyTorch zip or legacy file. It is read in place, laid out as its pack would be: natural name
order, tied tensors once, values left out, strided tensors gathered on the way.

Every tensor is a view into the one block libckload allocated (device memory for CUDA,
page-aligned host memory for the CPU), handed to torch through DLPack: nothing is copied, and
the block is freed when the last tensor that uses it is deleted. Tied tensors (stored once in
the pack) share memory.

Element types: torch gets the pack's dtype whenever this torch has it, BOOL, BF16, the F8 types
and C32 (complex32) included. Types this torch lacks come back as torch.uint8 holding the raw
little-endian bytes:
  - one-byte types (F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ on a torch without
    float8): the tensor's shape;
  - U16, U32, U64 (torch < 2.3) and C32: the tensor's shape plus a last dimension of the
    element's size in bytes;
  - F4, F6_E2M3, F6_E3M2 (sub-byte, always) and GGUF's block-quantized types (Q4_0 ... Q8_K,
    IQ*, TQ*, MXFP4, ...: raw ggml blocks): one dimension, the byte count.
`Load.info(i)` tells the pack's dtype and shape in every case.

Errors are one line, "ckload: FILE: what is wrong" (libckload's message), raised as the class
libckload reports (its errno): FileNotFoundError (the source does not exist), PermissionError
(it cannot be read), ValueError (an argument is refused: named as this module's parameter,
`only=`, `threads=`, `slices=`, `device=`...), and ckload.Error, a RuntimeError, for anything
else (a corrupt checkpoint, no CUDA device, a failed read, out of memory).

Integer arguments are ints (a bool or a float is refused), each within its bounds (ckload.h):
threads 0 to 256, buffers 0 to 64, buffer_size 0 or 4096 to 2**32, world_size 1 to 2**20,
rank 0 to world_size - 1, a slice rule's dim -1 to 63, the N of "cuda:N" 0 to 2**31 - 1; any
other value is a ValueError that names it and its range, never wrapped into what a C field
holds.
"""
from __future__ import annotations

import ctypes
import errno as _errno
import operator
import os
import stat
import threading
from typing import (Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence,
                    Tuple, Union)

try:
    import torch
    import torch.utils.dlpack
except ImportError as e:  # the wheel does not declare torch: the user's own build is kept
    raise ImportError(f"ckload needs torch, which this Python cannot import ({e}): install the "
                      f"torch build your machine uses, e.g. `pip install torch`") from None

__all__ = ["load", "stream", "entries", "Entry", "shown", "load_into", "Load", "Export",
           "IncompatibleKeys", "load_distributed", "DistributedLoad", "attach", "Attached",
           "serve", "Server", "default_socket", "Error", "cuda_available", "cuda_built",
           "library"]

ABI_VERSION = 5  # CKL_ABI_VERSION in ckload.h, which the structs below mirror
ERR_ROOM = 512   # libckload's message about a path fits in its length + ERR_ROOM (ckload.h)
CKL_CPU, CKL_CUDA, CKL_AUTO = 0, 1, 2
READ_ALL, READ_BALANCED, READ_RANK0, READ_PARTS = 0, 1, 2, 3  # enum ckl_read
kDLCPU, kDLCUDA = 1, 2
kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLComplex = 0, 1, 2, 4, 5

_c = ctypes
# What the public API accepts for a path and for a device.
PathLike = Union[str, bytes, os.PathLike]
Device = Union[str, torch.device]
ON_READY = _c.CFUNCTYPE(None, _c.c_void_p, _c.c_size_t)
DEST_BLOCK, DEST_AT, DEST_SKIP, DEST_REFUSE = 0, 1, 2, -1  # enum ckl_dest; any other: refused
SPELL_PARAMS = 1  # enum ckl_spelling: messages name options as this module's parameters
# The options' bounds (ckload.h's CKL_MAX_THREADS...), checked against the library's at load.
BOUNDS = {"CKL_MAX_THREADS": 256, "CKL_MIN_BUFFER_SIZE": 4096, "CKL_MAX_BUFFER_SIZE": 1 << 32,
          "CKL_MAX_BUFFERS": 64, "CKL_MAX_WORLD_SIZE": 1 << 20, "CKL_MAX_SLICE_DIM": 63}


class Error(RuntimeError):
    """A load failed for a reason that is neither a missing or unreadable source nor a bad
    argument: a corrupt checkpoint, no CUDA device, a failed read, out of memory. A
    RuntimeError, so `except RuntimeError` catches it as it caught every error before."""


# libckload's error classes (ckload.h: errno after a failed call) that have a Python exception
# of their own; every other class is Error.
_CLASSES = {_errno.ENOENT: FileNotFoundError, _errno.EACCES: PermissionError,
            _errno.EPERM: PermissionError, _errno.EINVAL: ValueError}


def _error(code, msg):
    """The exception for libckload's error class code (an errno) with message msg."""
    e = _CLASSES.get(code, Error)(msg)
    if isinstance(e, OSError):
        e.errno = code  # str(e) stays msg: no strerror, no filename
    return e


def _code_of(e):
    """The error class (an errno) of one of this module's exceptions: _error's inverse."""
    return next((code for code, cls in _CLASSES.items() if type(e) is cls), _errno.EIO)


class Slice(_c.Structure):
    """struct ckl_slice (loader/ckload.h)."""
    _fields_ = [("glob", _c.c_char_p), ("dim", _c.c_int)]


class Tensor(_c.Structure):
    """struct ckl_tensor (loader/ckload.h)."""
    _fields_ = [("name", _c.c_char_p),
                ("dtype", _c.c_char_p),
                ("shape", _c.POINTER(_c.c_int64)),
                ("data", _c.c_void_p),
                ("nbytes", _c.c_uint64),
                ("rank", _c.c_uint8),
                ("dtype_code", _c.c_uint8)]


DEST = _c.CFUNCTYPE(_c.c_int, _c.c_void_p, _c.POINTER(Tensor), _c.POINTER(_c.c_void_p))


class Options(_c.Structure):
    """struct ckl_options (loader/ckload.h)."""
    _fields_ = [("device", _c.c_int),
                ("cuda_device", _c.c_int),
                ("threads", _c.c_uint),
                ("buffer_size", _c.c_size_t),
                ("buffers", _c.c_uint),
                ("only", _c.c_char_p),
                ("verify", _c.c_int),
                ("on_ready", ON_READY),
                ("ctx", _c.c_void_p),
                ("pool", _c.c_void_p),
                ("slices", _c.POINTER(Slice)),
                ("nslices", _c.c_size_t),
                ("rank", _c.c_uint),
                ("world_size", _c.c_uint),
                ("read", _c.c_int),
                ("dest", DEST),
                ("spelling", _c.c_int)]


class DLDevice(_c.Structure):
    _fields_ = [("device_type", _c.c_int), ("device_id", _c.c_int)]


class DLDataType(_c.Structure):
    _fields_ = [("code", _c.c_uint8), ("bits", _c.c_uint8), ("lanes", _c.c_uint16)]


class DLTensor(_c.Structure):
    _fields_ = [("data", _c.c_void_p),
                ("device", DLDevice),
                ("ndim", _c.c_int),
                ("dtype", DLDataType),
                ("shape", _c.POINTER(_c.c_int64)),
                ("strides", _c.POINTER(_c.c_int64)),
                ("byte_offset", _c.c_uint64)]


class DLManagedTensor(_c.Structure):
    pass


DLManagedTensor._fields_ = [("dl_tensor", DLTensor),
                            ("manager_ctx", _c.c_void_p),
                            ("deleter", _c.CFUNCTYPE(None, _c.POINTER(DLManagedTensor)))]


class DLPackVersion(_c.Structure):
    _fields_ = [("major", _c.c_uint32), ("minor", _c.c_uint32)]


class DLManagedTensorVersioned(_c.Structure):
    pass


DLManagedTensorVersioned._fields_ = [
    ("version", DLPackVersion),
    ("manager_ctx", _c.c_void_p),
    ("deleter", _c.CFUNCTYPE(None, _c.POINTER(DLManagedTensorVersioned))),
    ("flags", _c.c_uint64),
    ("dl_tensor", DLTensor)]

# The C structs mirrored above, by their C names: checked against the library's ckl_layout.
MIRRORS = {"ckl_options": Options, "ckl_slice": Slice, "ckl_tensor": Tensor, "DLDevice": DLDevice,
           "DLDataType": DLDataType, "DLTensor": DLTensor, "DLManagedTensor": DLManagedTensor,
           "DLPackVersion": DLPackVersion, "DLManagedTensorVersioned": DLManagedTensorVersioned}

# --- the library -------------------------------------------------------------------------------

_lib = None
_lib_lock = threading.RLock()


# The library `make install` installed: the Makefile writes its path here in the installed copy
# (the module and the library live in different directories there); None in the build tree.
_INSTALLED_LIB = None


def _lib_path() -> str:
    """CKLOAD_LIB; else the library `make install` put (_INSTALLED_LIB); else the one a wheel
    put beside this file, under its soname; else the build tree's (build/libckload.so)."""
    here = os.path.dirname(os.path.abspath(__file__))
    bundled = os.path.join(here, f"libckload.so.{ABI_VERSION}")
    return (os.environ.get("CKLOAD_LIB") or _INSTALLED_LIB or
            (bundled if os.path.exists(bundled) else os.path.join(here, "..", "libckload.so")))


def _abi_mismatch(lib):
    """What this module and the library disagree on (ABI version, a mirrored struct's size or a
    field's offset), or None."""
    try:
        lib.ckl_abi_version.restype, lib.ckl_abi_version.argtypes = _c.c_uint, []
        lib.ckl_layout.restype, lib.ckl_layout.argtypes = _c.c_long, [_c.c_char_p]
    except AttributeError:
        return "the library has no ckl_abi_version (it is older than this ckload.py)"
    if lib.ckl_abi_version() != ABI_VERSION:
        return f"ABI version {lib.ckl_abi_version()}, this ckload.py expects {ABI_VERSION}"
    for bound, here in BOUNDS.items():
        there = lib.ckl_layout(bound.encode())
        if there != here:
            return f"{bound}: {there} in the library, {here} in ckload.py"
    for cname, cls in MIRRORS.items():
        mine = [(cname, "size", _c.sizeof(cls))]
        mine += [(f"{cname}.{f[0]}", "offset", getattr(cls, f[0]).offset) for f in cls._fields_]
        for what, kind, here in mine:
            there = lib.ckl_layout(what.encode())
            if there != here:
                return (f"{what}: {kind} {there} in the library, {here} in ckload.py"
                        if there >= 0 else f"the library does not know {what}")
    return None


def library() -> ctypes.CDLL:
    """The ctypes handle on libckload, with every function's signature set, once its ABI has
    been checked against this module's structs."""
    global _lib
    with _lib_lock:
        if _lib is None:
            path = _lib_path()
            # a wheel's libcurl (for URL sources) is the libckcurl.so beside its library
            curl = os.path.join(os.path.dirname(path), "libckcurl.so")
            if os.path.exists(curl):
                os.environ.setdefault("CKPTFS_LIBCURL", curl)
            try:
                lib = _c.CDLL(path, use_errno=True)  # a failed call's errno: its error class
            except OSError as e:
                raise Error(f"ckload: cannot load {path}: {e} (set CKLOAD_LIB, or run "
                            f"make)") from None
            wrong = _abi_mismatch(lib)
            if wrong:
                raise Error(f"ckload: {path}: does not match this ckload.py: {wrong}")
            load_p = _c.c_void_p
            sigs = {
                "ckl_default_options": (None, [_c.POINTER(Options)]),
                "ckl_load_start": (_c.c_int, [_c.c_char_p, _c.POINTER(Options),
                                              _c.POINTER(_c.c_void_p), _c.c_char_p,
                                              _c.c_size_t]),
                "ckl_count": (_c.c_size_t, [load_p]),
                "ckl_get": (_c.POINTER(Tensor), [load_p, _c.c_size_t]),
                "ckl_find": (_c.c_long, [load_p, _c.c_char_p]),
                "ckl_device_of": (_c.c_int, [load_p]),
                "ckl_cuda_ordinal": (_c.c_int, [load_p]),
                "ckl_total_bytes": (_c.c_uint64, [load_p]),
                "ckl_done_bytes": (_c.c_uint64, [load_p]),
                "ckl_read_path": (_c.c_char_p, [load_p]),
                "ckl_wait": (_c.c_int, [load_p, _c.c_size_t, _c.c_char_p, _c.c_size_t]),
                "ckl_wait_all": (_c.c_int, [load_p, _c.c_char_p, _c.c_size_t]),
                "ckl_release": (None, [load_p]),
                "ckl_retain": (None, [load_p]),
                "ckl_pool_new": (_c.c_void_p, []),
                "ckl_pool_free": (None, [_c.c_void_p]),
                "ckl_cuda_built": (_c.c_int, []),
                "ckl_cuda_available": (_c.c_int, []),
                "ckl_to_dlpack": (_c.POINTER(DLManagedTensor), [load_p, _c.c_size_t]),
                "ckl_to_dlpack_versioned": (_c.POINTER(DLManagedTensorVersioned),
                                            [load_p, _c.c_size_t, _c.c_uint64]),
                "ckl_selected": (_c.c_int, [_c.c_char_p, _c.c_char_p]),
                "ckl_location_shown": (_c.c_char_p, [_c.c_char_p, _c.c_char_p, _c.c_size_t]),
                "ckl_source_identity": (_c.c_uint64, [load_p]),
                "ckl_blob_count": (_c.c_size_t, [load_p]),
                "ckl_blob": (_c.c_int, [load_p, _c.c_size_t, _c.POINTER(_c.c_void_p),
                                        _c.POINTER(_c.c_uint64), _c.POINTER(_c.c_int),
                                        _c.POINTER(_c.c_int)]),
                "ckl_blob_wait": (_c.c_int, [load_p, _c.c_size_t, _c.c_char_p, _c.c_size_t]),
                "ckl_blob_put": (_c.c_int, [load_p, _c.c_size_t, _c.c_char_p, _c.c_size_t]),
                "ckl_fail": (None, [load_p, _c.c_char_p]),
                "ckl_serve": (_c.c_int, [load_p, _c.c_char_p, _c.c_long,
                                         _c.POINTER(_c.c_void_p), _c.c_char_p, _c.c_size_t]),
                "ckl_server_attached": (_c.c_uint, [_c.c_void_p]),
                "ckl_server_close": (_c.c_int, [_c.c_void_p, _c.c_int, _c.c_char_p,
                                                _c.c_size_t]),
                "ckl_attach": (_c.c_int, [_c.c_char_p, _c.c_int, _c.c_char_p, _c.c_long,
                                          _c.POINTER(_c.c_void_p), _c.c_char_p, _c.c_size_t]),
                "ckl_default_socket": (_c.c_int, [_c.c_char_p, _c.c_size_t, _c.c_char_p,
                                                  _c.c_size_t]),
            }
            for name, (res, args) in sigs.items():
                f = getattr(lib, name)
                f.restype, f.argtypes = res, args
            _lib = lib
        return _lib


def cuda_built() -> bool:
    """Whether libckload was built with the CUDA runtime."""
    return library().ckl_cuda_built() != 0


def cuda_available() -> bool:
    """Whether libckload can use a CUDA device now."""
    return library().ckl_cuda_available() != 0


# --- DLPack capsules ---------------------------------------------------------------------------

_api = _c.pythonapi
_api.PyCapsule_New.restype = _c.py_object
_api.PyCapsule_New.argtypes = [_c.c_void_p, _c.c_char_p, _c.c_void_p]
_api.PyCapsule_IsValid.restype = _c.c_int
_api.PyCapsule_IsValid.argtypes = [_c.c_void_p, _c.c_char_p]
_api.PyCapsule_GetPointer.restype = _c.c_void_p
_api.PyCapsule_GetPointer.argtypes = [_c.c_void_p, _c.c_char_p]
# A capsule keeps a pointer to its name, not a copy: these live as long as the module.
_DLTENSOR = _c.create_string_buffer(b"dltensor")
_DLTENSOR_VERSIONED = _c.create_string_buffer(b"dltensor_versioned")
READ_ONLY = 1  # CKL_DLPACK_READ_ONLY, DLPack 1.0's DLPACK_FLAG_BITMASK_READ_ONLY
# Whether this torch imports DLPack 1.0 capsules (torch 2.x, before 2.4 or so, takes only 0.6).
_TORCH_TAKES_VERSIONED = hasattr(torch._C, "_to_dlpack_versioned")


@_c.CFUNCTYPE(None, _c.c_void_p)
def _drop_unconsumed(capsule):
    """A capsule's destructor: one that no consumer took (a consumer renames it "used_...")
    still holds its export, given back here (its reference on the load dropped)."""
    for name, kind in ((_DLTENSOR, DLManagedTensor),
                       (_DLTENSOR_VERSIONED, DLManagedTensorVersioned)):
        if _api.PyCapsule_IsValid(capsule, _c.cast(name, _c.c_char_p)):
            m = _c.cast(_api.PyCapsule_GetPointer(capsule, _c.cast(name, _c.c_char_p)),
                        _c.POINTER(kind))
            m.contents.deleter(m)


def _capsule(m, versioned):
    """A DLPack capsule that owns export *m (a DLManagedTensor, or a DLManagedTensorVersioned)."""
    name = _DLTENSOR_VERSIONED if versioned else _DLTENSOR
    return _api.PyCapsule_New(_c.cast(m, _c.c_void_p), _c.cast(name, _c.c_char_p),
                              _c.cast(_drop_unconsumed, _c.c_void_p))


# --- element types -----------------------------------------------------------------------------

# The dtypes libckload exports as bytes (kDLUInt 8, shape [nbytes]), and what torch calls them.
_RAW = {
    "BOOL": "bool", "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn",
    "F8_E8M0": "float8_e8m0fnu", "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz", "C32": "complex32", "F4": None, "F6_E2M3": None,
    "F6_E3M2": None,
}
_UNSIGNED = {"U16": ("uint16", 16), "U32": ("uint32", 32), "U64": ("uint64", 64)}
_ITEMSIZE = {"C32": 4}


def _torch_dtype(name):
    return getattr(torch, name, None) if name else None


def _retype(x, dtype, shape):
    """x as the pack's dtype and shape where torch can say it; else as documented above."""
    if dtype in _RAW:
        want = _torch_dtype(_RAW[dtype])
        if want is not None:
            return x.view(want).reshape(shape)
        if _RAW[dtype] is None:
            return x  # sub-byte: the bytes
        size = _ITEMSIZE.get(dtype, 1)
        return x.reshape(shape if size == 1 else shape + (size,))
    if dtype in _UNSIGNED and _torch_dtype(_UNSIGNED[dtype][0]) is None:
        return x.unsqueeze(-1).view(torch.uint8)  # exported as signed: the same bytes
    return x


# --- loads -------------------------------------------------------------------------------------

# on_ready callbacks by load, called through one trampoline that lives as long as the module:
# loader threads may still call it after a load was released.
_callbacks = {}
_callbacks_lock = threading.Lock()


@ON_READY
def _trampoline(ctx, i):
    with _callbacks_lock:
        fn = _callbacks.get(ctx)
    if fn is not None:
        try:
            fn(i)
        except Exception:  # an exception cannot cross into the loader thread
            import traceback
            traceback.print_exc()


_next_ctx = [1]

# One pool of pinned staging buffers for every load of this process: pinning costs about 0.5 s
# per GB, so buffers are pinned once and reused (libckload's pool is thread-safe).
_pool = None


def _shared_pool():
    global _pool
    with _lib_lock:
        if _pool is None:
            _pool = library().ckl_pool_new()
        return _pool


def _parse_device(device, path):
    """(enum ckl_device, ordinal) from "cpu", "cuda", "cuda:N", "auto" or a torch.device;
    ValueError about loading path otherwise."""
    s = str(device).strip().lower()
    if s == "cpu":
        return CKL_CPU, 0
    if s == "auto":
        return CKL_AUTO, 0
    if s == "cuda":
        return CKL_CUDA, 0
    if s.startswith("cuda:") and s[5:].isdigit():
        return CKL_CUDA, _c_int(path, "N", int(s[5:]), 0, _C_MAX[_c.c_int],
                                within=f"device={device!r}: ")
    raise _bad_argument(path, f"device={device!r}: expected cpu, cuda, cuda:N or auto")


# The largest value of each C integer type this module hands libckload.
_C_MAX = {t: (1 << (8 * _c.sizeof(t) - (t(-1).value < 0))) - 1
          for t in (_c.c_int, _c.c_uint, _c.c_size_t)}


def _c_int(path, name, v, lo, hi, default=None, within=""):
    """v, an integer (a bool or a float is not one) from lo to hi or the default, else the
    ValueError about loading path that names it ("{within}{name}=v") and its range. Every
    integer this module hands libckload passes through here: ctypes silently wraps what a C
    type cannot hold (world_size=2**32+2 loaded as 2, a slice's dim=2**63 as 0), so lo..hi is
    the meaningful range, always within the C type's."""
    try:
        n = None if isinstance(v, bool) else operator.index(v)
    except TypeError:
        n = None
    if n is not None and (lo <= n <= hi or (default is not None and n == default)):
        return n
    alone = "" if default is None else f"{default} or "
    raise _bad_argument(path, f"{within}{name}={v!r}: not {alone}an integer from {lo} to {hi}")


def _one_line(text: str) -> str:
    """text with each control character shown as '?': the rule of ck_one_line (base/error.h)
    for every name libckload prints, since a name comes from the checkpoint and a message stays
    one line."""
    return "".join("?" if ord(c) < 0x20 or ord(c) == 0x7F else c for c in text)


def _quoted(name: str) -> str:
    """A tensor's name as ckload's messages quote it: 'name', one line (_one_line)."""
    return f"'{_one_line(name)}'"


def _bad_argument(path, what, cls=ValueError):
    """The ValueError (or cls) for an argument refused before libckload sees it, worded as its
    own messages are ("ckload: FILE: what is wrong", FILE as shown() shows it)."""
    return cls(f"ckload: {shown(path)}: {what}")


def _raise(err):
    """libckload's message ("FILE: what is wrong") as this module's error, of the class its
    errno says (_error)."""
    raise _error(_c.get_errno(), "ckload: " + err.value.decode("utf-8", "replace"))


class Load:
    """One load (ckl_load): started at once, tensors handed out as they land.

    Load(path, device="auto", only=None, verify=False, threads=0, buffer_size=0, on_ready=None,
         slices=None, rank=0, world_size=1, buffers=0)
    raises FileNotFoundError, PermissionError, ValueError or Error ("ckload: FILE: what is
    wrong", libckload's line: the module's docstring) when the load cannot start. on_ready(i)
    runs on a loader thread as tensor i lands. slices: [(glob, dim), ...], the
    tensor-parallel rules (the first whose glob, a prefix or glob as `only`, selects a name
    decides; dim -1: whole): each tensor cut is loaded as part `rank` of world_size, as
    torch.chunk(tensor, world_size, dim)[rank] (empty where torch.chunk has fewer parts), read
    straight from the source. release() (or leaving a `with`
    block) drops this object's reference; tensors already handed out keep the memory alive.
    """

    def __init__(self, path: PathLike, device: Device = "auto", only: Optional[str] = None,
                 verify: bool = False, threads: int = 0, buffer_size: int = 0,
                 on_ready: Optional[Callable[[int], None]] = None,
                 slices: Optional[Sequence[Tuple[str, int]]] = None, rank: int = 0,
                 world_size: int = 1, buffers: int = 0, _read: int = READ_ALL,
                 _dest: Optional[Callable] = None) -> None:
        lib = library()
        self._path = os.fsencode(path)
        dev, ordinal = _parse_device(device, path)
        threads = _c_int(path, "threads", threads, 0, BOUNDS["CKL_MAX_THREADS"])
        buffer_size = _c_int(path, "buffer_size", buffer_size, BOUNDS["CKL_MIN_BUFFER_SIZE"],
                             BOUNDS["CKL_MAX_BUFFER_SIZE"], default=0)
        buffers = _c_int(path, "buffers", buffers, 0, BOUNDS["CKL_MAX_BUFFERS"])
        o = Options()
        lib.ckl_default_options(_c.byref(o))
        o.spelling = SPELL_PARAMS
        o.device, o.cuda_device = dev, ordinal
        if threads:
            o.threads = threads
        if buffer_size:
            o.buffer_size = buffer_size
        if buffers:
            o.buffers = buffers
        self._only = None if only is None else os.fsencode(only)
        o.only = self._only
        o.verify = 1 if verify else 0
        o.pool = _shared_pool()
        self._set_slices(o, slices, rank, world_size, _read)
        self._ctx = None
        if on_ready is not None:
            with _callbacks_lock:
                self._ctx = _next_ctx[0]
                _next_ctx[0] += 1
                _callbacks[self._ctx] = on_ready
            o.on_ready, o.ctx = _trampoline, self._ctx
        if _dest is not None:  # called only inside ckl_load_start, on this thread
            o.dest = DEST(_dest)
        err = _c.create_string_buffer(len(self._path) + ERR_ROOM)
        handle = _c.c_void_p()
        self._h = None
        if lib.ckl_load_start(self._path, _c.byref(o), _c.byref(handle), err, len(err)) != 0:
            self._forget_callback()
            _raise(err)
        self._h = handle
        self._lib = lib

    def _set_slices(self, o, slices, rank, world_size, read):
        """The slice rules, rank, world_size and read share into o (kept alive with self)."""
        rules = list(slices or [])
        world_size = _c_int(self._path, "world_size", world_size, 1,
                            BOUNDS["CKL_MAX_WORLD_SIZE"])
        rank = _c_int(self._path, "rank", rank, 0, world_size - 1,
                      within=f"world_size={world_size}: ")
        dims = [_c_int(self._path, "dim", dim, -1, BOUNDS["CKL_MAX_SLICE_DIM"],
                       within=f"slices=[({glob!r}, {dim!r})]: ") for glob, dim in rules]
        self._globs = [os.fsencode(g) for g, _ in rules]
        self._slices = (Slice * max(1, len(rules)))(
            *[Slice(g, d) for g, d in zip(self._globs, dims)])
        o.slices, o.nslices = self._slices, len(rules)
        o.rank, o.world_size, o.read = rank, world_size, read

    def _forget_callback(self):
        if self._ctx is not None:
            with _callbacks_lock:
                _callbacks.pop(self._ctx, None)
            self._ctx = None

    def _handle(self):
        if self._h is None:
            raise ValueError("ckload: this load was released")
        return self._h

    def __len__(self) -> int:
        """The number of tensors the load hands out."""
        return self._lib.ckl_count(self._handle())

    def _get(self, i):
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._lib.ckl_get(self._handle(), self._index(i)).contents

    def _index(self, i):
        """Tensor index i as ckl_get and ckl_wait take it (a size_t), or ValueError."""
        return _c_int(self._path, "i", i, 0, _C_MAX[_c.c_size_t])

    def name(self, i: int) -> str:
        """Tensor i's name."""
        return self._get(i).name.decode("utf-8", "surrogateescape")

    def info(self, i: int) -> Tuple[str, str, Tuple[int, ...], int]:
        """(name, dtype, shape, nbytes) of tensor i as the pack has it."""
        t = self._get(i)
        return (t.name.decode("utf-8", "surrogateescape"), t.dtype.decode(),
                tuple(t.shape[k] for k in range(t.rank)), t.nbytes)

    def pointer(self, i: int) -> int:
        """Tensor i's address in the load's block (a host or device pointer)."""
        return self._get(i).data or 0

    def _identity(self):
        """ckl_source_identity: what identifies the source files this load opened."""
        return self._lib.ckl_source_identity(self._handle())

    def find(self, name: str) -> int:
        """The index of tensor name, or -1."""
        return self._lib.ckl_find(self._handle(), os.fsencode(name))

    @property
    def device(self) -> str:
        """"cpu" or "cuda:N": where the block is."""
        h = self._handle()
        if self._lib.ckl_device_of(h) == CKL_CUDA:
            return f"cuda:{self._lib.ckl_cuda_ordinal(h)}"
        return "cpu"

    @property
    def read_path(self) -> str:
        """Where the bytes are read from: "pack" (a pack file; verify checks its checksums),
        "source" (a safetensors or PyTorch file or a shard directory, read in place; verify
        checks only that each file is unchanged: such sources store no checksums), "bypass" (a
        path inside a ckptfs mount, read from the mount's source files directly), "mount"
        (through the mount: the bypass was refused, or CKLOAD_BYPASS=0) or "attach" (nothing
        read: the block another process serves, mapped: Attached)."""
        return self._lib.ckl_read_path(self._handle()).decode()

    def total_bytes(self) -> int:
        """The bytes the load brings in, all tensors together."""
        return self._lib.ckl_total_bytes(self._handle())

    def done_bytes(self) -> int:
        """The bytes in place so far (progress)."""
        return self._lib.ckl_done_bytes(self._handle())

    def blobs(self) -> list:
        """[(address, nbytes, owner, sliced)] of the load's blobs (what it reads: tied tensors
        share one), in pack order (ckl_blob): owner the rank that reads it (-1: each its own
        part), sliced whether it is a part."""
        out = []
        for b in range(self._lib.ckl_blob_count(self._handle())):
            data, n, owner, sliced = _c.c_void_p(), _c.c_uint64(), _c.c_int(), _c.c_int()
            self._lib.ckl_blob(self._h, b, _c.byref(data), _c.byref(n), _c.byref(owner),
                               _c.byref(sliced))
            out.append((data.value or 0, n.value, owner.value, sliced.value))
        return out

    def wait(self, i: int) -> None:
        """Blocks until tensor i is in place; Error if the load failed (ValueError: no tensor
        i)."""
        err = _c.create_string_buffer(len(self._path) + ERR_ROOM)
        if self._lib.ckl_wait(self._handle(), self._index(i), err, len(err)) != 0:
            _raise(err)

    def wait_all(self) -> None:
        """Blocks until every tensor is in place; Error if the load failed."""
        err = _c.create_string_buffer(len(self._path) + ERR_ROOM)
        if self._lib.ckl_wait_all(self._handle(), err, len(err)) != 0:
            _raise(err)

    def _export(self, i, versioned, flags=0):
        """Tensor i as a DLPack capsule (1.0 if versioned, with flags; else 0.6): waits for it."""
        name = self.info(i)[0]
        h = self._handle()
        m = (self._lib.ckl_to_dlpack_versioned(h, i, flags) if versioned
             else self._lib.ckl_to_dlpack(h, i))
        if not m:
            self.wait(i)  # raises the load's error
            raise Error(f"ckload: tensor {_quoted(name)}: cannot export it (out of memory)")
        return m

    def tensor(self, i: int, read_only: bool = False) -> torch.Tensor:
        """Tensor i as a torch tensor over the load's memory (waits for it to land): handed to
        torch as a DLPack 1.0 capsule where this torch takes one, else as a 0.6 one. read_only:
        the 1.0 capsule says so (DLPack's read-only flag); a 0.6 one (torch < 2.9) cannot, and
        torch takes the flag without enforcing it (2.15 still writes such a tensor in place)."""
        dtype, shape = self.info(i)[1:3]
        flags = READ_ONLY if read_only and _TORCH_TAKES_VERSIONED else 0
        m = self._export(i, _TORCH_TAKES_VERSIONED, flags)
        if dtype in _UNSIGNED and _torch_dtype(_UNSIGNED[dtype][0]) is None:
            m.contents.dl_tensor.dtype.code = kDLInt  # this torch has no unsigned type this wide
        return _retype(torch.utils.dlpack.from_dlpack(_capsule(m, _TORCH_TAKES_VERSIONED)),
                       dtype, shape)

    def export(self, i: int, read_only: bool = False) -> "Export":
        """Tensor i for any DLPack consumer (numpy.from_dlpack, torch.from_dlpack, cupy, jax):
        an object with __dlpack__ and __dlpack_device__ over the load's memory, as
        DLPack exports it (ckload.h: types DLPack 0.6 cannot name come as bytes). read_only: the
        consumer must not write it (DLPack 1.0's read-only flag; a consumer that asks only for
        0.6 capsules, which cannot say so, is refused)."""
        return Export(self, i, read_only)

    def release(self) -> None:
        """Drops this object's reference on the load (tensors handed out keep it alive)."""
        if self._h is not None:
            h, self._h = self._h, None
            self._forget_callback()
            self._lib.ckl_release(h)

    def __enter__(self) -> Load:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass


def load(path: PathLike, device: Device = "auto", only: Optional[str] = None,
         verify: bool = False, threads: int = 0, buffer_size: int = 0,
         slices: Optional[Sequence[Tuple[str, int]]] = None, rank: int = 0,
         world_size: int = 1, buffers: int = 0) -> Dict[str, torch.Tensor]:
    """Loads the checkpoint at path (a pack file, a mount's .ckptfs/checkpoint.pack, a
    safetensors file, a shard directory, a PyTorch file) and returns {name: torch.Tensor} in
    pack order, on device ("cpu", "cuda", "cuda:N", or "auto": CUDA when libckload can use a
    device). only: a prefix or glob over names; verify: a pack's
    checksums, checked as the bytes stream; for other sources, which store none, only that each
    source file is unchanged while it is read. threads, buffer_size, buffers (pinned
    staging buffers per thread, CUDA): 0 to let libckload choose per load (ckload.h). slices,
    rank, world_size: this rank's tensor-parallel parts (Load). Raises FileNotFoundError (no
    such source), PermissionError (unreadable), ValueError (an argument refused) or Error (any
    other failure), each with one line "ckload: FILE: what is wrong"; then no tensor is returned
    and all memory is freed."""
    with Load(path, device=device, only=only, verify=verify, threads=threads,
              buffer_size=buffer_size, slices=slices, rank=rank, world_size=world_size,
              buffers=buffers) as ld:
        ld.wait_all()
        return {ld.name(i): ld.tensor(i) for i in range(len(ld))}


# --- warm attach: one process's block, mapped by others (share.h) --------------------------------

class Attached(Load):
    """The load another process serves on the Unix socket `socket` (`ckpt serve`, or serve();
    None: default_socket(), where they serve when given none), mapped into this one through CUDA IPC: nothing is read, the tensors are the server's
    block. device: "cuda:N", the device this process expects the block on (None: whichever it
    is on; another is refused, ValueError). source: None, or the location this process expects
    the server to have loaded: another path, or one whose files changed since the server loaded
    them, is refused (Error, "changed source"). The server itself must run as this process's
    uid, as root, or in group (a gid, None: none), else it is refused (PermissionError) before
    a byte of its table is read; a table that claims more than the mapping holds, or an answer
    not whole within CKLOAD_ATTACH_WAIT seconds (default 30), is refused (Error). Raises
    FileNotFoundError (no server there), PermissionError (the server refused this uid, or is
    not trusted) or Error, each one line "ckload: SOCKET: what is wrong". It is a Load
    (read_path "attach"): tensor(i), find, info, export. The mapping and the connection (the
    attachment the server counts) last while this object or any tensor handed out lives; the
    server refuses to exit while they do (share.h)."""

    def __init__(self, socket: Optional[PathLike] = None, device: Optional[Device] = None,
                 source: Optional[PathLike] = None, group: Optional[int] = None) -> None:
        lib = library()
        socket = default_socket() if socket is None else socket
        self._path, self._ctx, self._h = os.fsencode(socket), None, None
        ordinal = -1
        gid = -1 if group is None else _c_int(socket, "group", group, 0, _C_MAX[_c.c_uint])
        if device is not None:
            dev, ordinal = _parse_device(device, socket)
            if dev != CKL_CUDA:
                raise _bad_argument(socket, f"device={device!r}: an attached block is on a "
                                            f"CUDA device")
        want = None if source is None else os.fsencode(source)
        err = _c.create_string_buffer(len(self._path) + (len(want) if want else 0) + 4096)
        handle = _c.c_void_p()
        if lib.ckl_attach(self._path, ordinal, want, gid, _c.byref(handle), err, len(err)) != 0:
            _raise(err)
        self._h, self._lib = handle, lib

    def tensors(self, read_only: bool = True) -> Dict[str, torch.Tensor]:
        """{name: torch.Tensor} over the served block, in pack order; read_only as tensor()
        says (the default: the block is every attached process's)."""
        return {self.name(i): self.tensor(i, read_only) for i in range(len(self))}


def attach(socket: Optional[PathLike] = None, device: Optional[Device] = None,
           source: Optional[PathLike] = None, read_only: bool = True, group: Optional[int] = None) -> Dict[str, torch.Tensor]:
    """{name: torch.Tensor} of the load served on `socket` (Attached: the arguments, group
    among them, and the refusals), in milliseconds: no byte is read or copied. The tensors
    keep the attachment: the block stays mapped, and the server counts this process, until
    the last of them is deleted. read_only (the default) marks them so through DLPack 1.0
    where torch takes it (Load.tensor); writing them writes every attached process's
    weights."""
    with Attached(socket, device=device, source=source, group=group) as a:
        return a.tensors(read_only)


def default_socket() -> str:
    """The socket serve() and `ckpt serve` use when given none: $XDG_RUNTIME_DIR/ckload.sock,
    else $TMPDIR/ckload-UID/ckload.sock (/tmp without TMPDIR) in a directory of this user's
    alone, made if missing (PermissionError when it is not that)."""
    lib = library()
    buf, err = _c.create_string_buffer(4096 + 64), _c.create_string_buffer(4096 + ERR_ROOM)
    if lib.ckl_default_socket(buf, len(buf), err, len(err)) != 0:
        _raise(err)
    return os.fsdecode(buf.value)


class Server:
    """A load served to the processes of this machine on the Unix socket `socket` (ckl_serve,
    share.h; None: default_socket()): serve(path, socket, device="cuda:N", group=None) loads
    path (any source load takes) and serves it from a thread of libckload's; processes of this
    uid, or in group (a gid), attach to it (attach()). The socket's directory must be this
    user's or root's and writable by no other user unless sticky (PermissionError); nothing
    but a stale socket of this user's is replaced (ValueError). socket: the path served on.
    attached(): the attachments live now (a client still receiving its table counts).
    close(force=False): stops serving and removes the socket; refused (Error) while
    attachments live unless force."""

    def __init__(self, load: Load, socket: Optional[PathLike] = None,
                 group: Optional[int] = None) -> None:
        lib = library()
        socket = default_socket() if socket is None else socket
        self.socket = os.fsdecode(socket)
        self._load, self._path, self._s = load, os.fsencode(socket), None
        gid = -1 if group is None else _c_int(socket, "group", group, 0, _C_MAX[_c.c_uint])
        err = _c.create_string_buffer(len(self._path) + len(load._path) + 2 * ERR_ROOM)
        s = _c.c_void_p()
        if lib.ckl_serve(load._handle(), self._path, gid, _c.byref(s), err, len(err)) != 0:
            _raise(err)
        self._s, self._lib = s, lib

    def attached(self) -> int:
        return self._lib.ckl_server_attached(self._s) if self._s else 0

    def close(self, force: bool = False) -> None:
        if self._s is None:
            return
        err = _c.create_string_buffer(len(self._path) + ERR_ROOM)
        if self._lib.ckl_server_close(self._s, 1 if force else 0, err, len(err)) != 0:
            _raise(err)
        self._s = None
        self._load.release()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve(path: PathLike, socket: Optional[PathLike] = None, device: Device = "cuda",
          group: Optional[int] = None, verify: bool = False) -> Server:
    """Loads path onto device (a CUDA one) and serves it on socket (Server; None:
    default_socket())."""
    ld = Load(path, device=device, verify=verify)
    try:
        return Server(ld, socket, group)
    except BaseException:
        ld.release()
        raise


def shown(location: PathLike) -> str:
    """location as ckload's messages show it: a URL without its secrets (user:password@, a
    presigned query), anything else as it is."""
    raw = os.fsencode(location)
    buf = _c.create_string_buffer(len(raw) + 1)
    return library().ckl_location_shown(raw, buf, len(buf)).decode("utf-8", "surrogateescape")


class Entry(NamedTuple):
    """A tensor a load selects, as stream and entries list it: its name, pack dtype ("BF16"),
    shape and bytes."""
    name: str
    dtype: str
    shape: Tuple[int, ...]
    nbytes: int

    @property
    def torch_dtype(self) -> Optional[torch.dtype]:
        """The torch dtype of its elements; None where this torch has none (stream then hands
        out its bytes, as load does)."""
        return _torch_dtype(_TORCH_NAMES.get(self.dtype))


def entries(path: PathLike, device: Device = "auto", only: Optional[str] = None) -> List[Entry]:
    """The tensors a load of path selects, in pack order (natural name order; tied tensors each),
    listed without reading a byte of any. Arguments and errors as load's."""
    return _listing(path, device, only)[0]


def _listing(path, device, only):
    """entries(path, device, only), and the identity of the files they were listed from
    (Load._identity)."""
    out = []

    def listing(ctx, t, at):
        if not t:
            return DEST_BLOCK
        c = t[0]
        out.append(Entry(c.name.decode("utf-8", "surrogateescape"), c.dtype.decode(),
                         tuple(c.shape[k] for k in range(c.rank)), c.nbytes))
        return DEST_SKIP

    with Load(path, device=device, only=only, _dest=listing) as ld:
        return out, ld._identity()


def _chosen(path, names, order):
    """The entries of order that names takes: all for None; else names must be an iterable of
    str (a str itself is refused, not taken as its characters), each the name of an entry of
    order (KeyError naming the first that is not), else TypeError."""
    if names is None:
        return order
    if isinstance(names, (str, bytes)):
        raise _bad_argument(path, f"names={names!r}: expected an iterable of tensor names, "
                                  f"not one string", TypeError)
    wanted = list(names)
    for n in wanted:
        if not isinstance(n, str):
            raise _bad_argument(path, f"names: {n!r} is not a str (a tensor name)", TypeError)
    known = {e.name for e in order}
    for n in wanted:
        if n not in known:
            raise _bad_argument(path, f"names: no tensor {_quoted(n)} among those selected", KeyError)
    wanted = set(wanted)
    return [e for e in order if e.name in wanted]


def _window(path, window):
    """stream's window (bytes held at once), an integer from 1 to 2**62, else the ValueError
    about path that says so (what the vLLM load format checks its `window` key with, too)."""
    return _c_int(path, "window", window, 1, 1 << 62)


def _windows(order, window):
    """order's names cut into runs of at most window bytes each (a larger tensor alone)."""
    run, size = [], 0
    for e in order:
        if run and size + e.nbytes > window:
            yield run
            run, size = [], 0
        run.append(e.name)
        size += e.nbytes
    if run:
        yield run


def stream(path: PathLike, device: Device = "auto", window: int = 1 << 30,
           only: Optional[str] = None, verify: bool = False, threads: int = 0,
           buffer_size: int = 0,
           names: Optional[Iterable[str]] = None) -> Iterator[Tuple[str, torch.Tensor]]:
    """Yields (name, torch.Tensor) for the checkpoint at path in pack order, each as it lands,
    holding at most window bytes of it at a time (a tensor larger than window alone): for a
    consumer that copies each tensor into memory of its own (vLLM's model.load_weights), so
    that no copy of the whole checkpoint is ever made. names, when given (an iterable of str,
    never one str), takes only those of the selected tensors: a name that is not one raises
    KeyError naming the first such, an item that is not a str (or names given as one str)
    TypeError, before any tensor is handed out. Each window is one Load of the tensors it takes, started
    when the consumer has taken the last tensor of the one before, whose memory goes once the
    consumer drops its tensors; each checks that the source's files are still those the
    tensors were listed from (ckl_source_identity: device, inode, size, mtime), so that a file
    replaced or changed between two windows raises Error, never yields tensors of two
    checkpoints. Arguments and errors otherwise as load's."""
    window = _window(path, window)
    order, identity = _listing(path, device, only)
    order = _chosen(path, names, order)
    for run in _windows(order, window):
        chosen = set(run)

        def pick(ctx, t, at, chosen=chosen):
            if not t:
                return DEST_BLOCK
            name = t[0].name.decode("utf-8", "surrogateescape")
            return DEST_BLOCK if name in chosen else DEST_SKIP

        with Load(path, device=device, only=only, verify=verify, threads=threads,
                  buffer_size=buffer_size, _dest=pick) as ld:
            if ld._identity() != identity:
                raise Error(f"ckload: {shown(path)}: changed while streamed: its files are not "
                            f"those its tensors were listed from (device, inode, size, mtime)")
            for i in range(len(ld)):
                ld.wait(i)
                yield ld.name(i), ld.tensor(i)


class Export:
    """Tensor i of a load as the DLPack protocol hands it to a consumer (Load.export): each
    __dlpack__ call exports it once more, holding a reference on the load until the consumer's
    array goes. Its bytes are in place when it is exported: no stream needs to wait."""

    def __init__(self, load: Load, i: int, read_only: bool = False) -> None:
        load.wait(i)
        self._load, self._i, self._read_only = load, i, read_only

    def __dlpack_device__(self) -> Tuple[int, int]:
        dev = self._load.device
        return (kDLCUDA, int(dev[5:])) if dev.startswith("cuda") else (kDLCPU, 0)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError("ckload: a DLPack export is never a copy (copy=True)")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"ckload: the tensor is on {self._load.device}, not {dl_device}")
        versioned = max_version is not None and tuple(max_version)[0] >= 1
        if self._read_only and not versioned:
            raise BufferError("ckload: a read-only export needs DLPack 1.0 "
                              "(__dlpack__(max_version=(1, 0)))")
        m = self._load._export(self._i, versioned, READ_ONLY if self._read_only else 0)
        return _capsule(m, versioned)


# --- into the caller's tensors -----------------------------------------------------------------

class _Cuda:
    """A device range as __cuda_array_interface__ (what torch.as_tensor takes for memory it does
    not own): bytes of a CUDA block or target, for torch or NCCL to write or read."""

    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3}


def _block_bytes(device, ptr, n):
    """Bytes [ptr, ptr+n) on device ("cpu" or "cuda:N") as a uint8 tensor over that memory."""
    if device.startswith("cuda"):
        return torch.as_tensor(_Cuda(ptr, n), device=device)
    return torch.frombuffer((_c.c_char * n).from_address(ptr), dtype=torch.uint8)


class IncompatibleKeys(NamedTuple):
    """What load_into reports, as torch's load_state_dict does: the target's names that nothing
    filled, and the checkpoint's names that the target lacks."""
    missing_keys: List[str]
    unexpected_keys: List[str]


# The torch dtype of each pack dtype torch may have (by name: older torches lack some).
_TORCH_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                "C64": "complex64", "C128": "complex128",
                **{k: v for k, (v, _) in _UNSIGNED.items()}, **{k: v for k, v in _RAW.items() if v}}


def _targets_of(target):
    """{name: tensor} of a module (its state_dict's tensors, persistent buffers included, tied
    parameters under each name) or of a mapping of tensors."""
    if isinstance(target, torch.nn.Module):
        return {k: v.data if isinstance(v, torch.nn.Parameter) else v
                for k, v in target.state_dict(keep_vars=True).items()}
    out = {}
    for k, v in dict(target).items():
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"ckload: target {_quoted(k)} is {type(v).__name__}, not a torch.Tensor")
        out[k] = v
    return out


def _device_of(targets):
    """The one device every target tensor is on ("cpu" or "cuda:N"), or ValueError."""
    devices = set()
    for name, t in targets.items():
        if t.device.type == "meta":
            raise ValueError(f"ckload: target {_quoted(name)} is on the meta device: materialize the "
                             f"module first (module.to_empty(device=...))")
        devices.add(str(t.device) if t.device.type != "cuda"
                    else f"cuda:{t.device.index if t.device.index is not None else 0}")
    if len(devices) > 1:
        raise ValueError(f"ckload: the target's tensors are on several devices "
                         f"({', '.join(sorted(devices))}): load_into fills one device at a time")
    return devices.pop() if devices else "cpu"


def _memory(t):
    """The memory target t fills as a whole: (address, bytes). Tied targets share it."""
    return t.data_ptr(), t.numel() * t.element_size()


class _Placement:
    """ckl_options.dest for load_into: each checkpoint tensor into the target of its name,
    checked for dtype, shape and layout; the rest skipped. The final call refuses the load when
    any tensor did not fit, or (strict) when a name is missing or unexpected.

    Tied targets (several names, one memory) end as load_state_dict leaves them, copying name
    after name in the target's order: with the bytes of the last of their names (in the
    target's order) that the checkpoint has. That name's tensor is read straight into the
    memory; one an earlier name of the tie takes is left to the load's block (a later name may
    still come, in pack order) and copied in after the load when none did (settle). Targets
    that overlap otherwise are refused by libckload (their bytes would be a mix of both)."""

    def __init__(self, targets, strict, only):
        self.targets, self.strict, self.only = targets, strict, only
        lib, sel = library(), None if only is None else os.fsencode(only)
        self.order = {k: i for i, k in enumerate(targets)}
        self.last = {}  # each target memory: its last name (in the target's order) only selects
        for k, t in targets.items():
            if lib.ckl_selected(sel, os.fsencode(k)):
                self.last[_memory(t)] = k
        self.filled = set()    # target memory read into, or to be copied into (settle)
        self.straight = set()  # target memory its last name is read straight into
        self.later = {}        # target memory -> the name whose bytes settle copies in
        self.blocked = set()   # the names left to the load's block: never told on landing
        self.loaded, self.unexpected, self.wrong = set(), [], []
        self.refused = False

    def _fits(self, t, dtype, shape, nbytes):
        """Why target t cannot take the checkpoint's tensor, or None."""
        want = _torch_dtype(_TORCH_NAMES.get(dtype))
        if want is None:  # a type this torch lacks: the target holds its bytes
            if t.dtype != torch.uint8 or t.numel() != nbytes:
                return f"{dtype} {list(shape)} needs a torch.uint8 target of {nbytes} bytes"
        elif t.dtype != want or tuple(t.shape) != shape:
            return (f"the checkpoint has {want} {list(shape)}, the target {t.dtype} "
                    f"{list(t.shape)}")
        if not t.is_contiguous():
            return "the target is not contiguous"
        if t.is_conj() or t.is_neg():  # its values are not its bytes: a raw read would differ
            return "the target is a conjugated or negated view (is_conj, is_neg)"
        return None

    def __call__(self, ctx, tp, at):
        try:
            if not tp:
                return self.finish()
            c = tp.contents
            name = c.name.decode("utf-8", "surrogateescape")
            t = self.targets.get(name)
            if t is None:
                self.unexpected.append(name)
                return DEST_SKIP
            shape = tuple(c.shape[k] for k in range(c.rank))
            why = self._fits(t, c.dtype.decode(), shape, c.nbytes)
            if why:
                self.wrong.append(f"{_one_line(name)}: {why}")
                return DEST_SKIP
            key = _memory(t)
            self.loaded.add(name)
            self.filled.add(key)
            if key in self.straight:
                return DEST_SKIP  # tied: a later name of the target's fills this memory
            if name != self.last.get(key, name):  # tied: the latest name that comes wins
                if self.order[name] > self.order.get(self.later.get(key), -1):
                    self.later[key] = name
                self.blocked.add(name)
                return DEST_BLOCK
            self.straight.add(key)
            self.later.pop(key, None)
            at[0] = t.data_ptr() if c.nbytes else None
            return DEST_AT
        except BaseException as e:  # cannot cross into C: refuse, and say why afterwards
            self.wrong.append(f"{type(e).__name__}: {e}")
            return DEST_REFUSE

    def settles(self, name):
        """Whether name's bytes land in the load's block (settle may copy them in after)."""
        return name in self.blocked

    def settle(self, ld):
        """Copies each tied target memory's bytes in from the load's block where the name they
        come from was not read straight into it (see the class)."""
        for (ptr, n), name in self.later.items():
            if n:
                _block_bytes(ld.device, ptr, n).copy_(
                    _block_bytes(ld.device, ld.pointer(ld.find(name)), n))
        if ld.device.startswith("cuda"):
            torch.cuda.synchronize(ld.device)

    def missing(self):
        lib = library()
        only = None if self.only is None else os.fsencode(self.only)
        return [k for k, t in self.targets.items()
                if k not in self.loaded and lib.ckl_selected(only, os.fsencode(k)) and
                _memory(t) not in self.filled]

    def problems(self):
        """The lines of load_state_dict's error message that apply, or []."""
        out, missing = [], self.missing() if self.strict else []
        if missing:
            out.append("missing key(s): " + _one_line(", ".join(missing)))
        if self.strict and self.unexpected:
            out.append("unexpected key(s): " + _one_line(", ".join(self.unexpected)))
        out += [f"cannot load {w}" for w in self.wrong]
        return out

    def finish(self):
        self.refused = bool(self.problems())
        return DEST_REFUSE if self.refused else DEST_BLOCK


class _EarlyReady:
    """on_ready(i) as on_ready(name) for load_into: tensors that land before the load's handle
    is known (its readers start inside ckl_load_start) are told once it is, on the caller's
    thread; the others on the loader thread they land on. A name whose bytes land in the load's
    block, to be copied into its target after the load (later: a _Placement's settles), is told
    by load_into once they are."""

    def __init__(self, on_ready, later):
        self.on_ready, self.later, self.load, self.pending = on_ready, later, None, []
        self.lock = threading.Lock()

    def _tell(self, name):
        if not self.later(name):
            self.on_ready(name)

    def __call__(self, i):
        with self.lock:
            if self.load is None:
                self.pending.append(i)
                return
        self._tell(self.load.name(i))

    def start(self, load):
        with self.lock:
            self.load, pending, self.pending = load, self.pending, []
        for i in pending:
            self._tell(load.name(i))


def _is_socket(path):
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except (OSError, TypeError, ValueError):
        return False


def _into_from_attached(targets, device, source, strict, only, on_ready):
    """load_into from a served block (an Attached, or the socket of one, attached for the
    call): the same checks (_Placement, asked of each tensor in pack order as a load's dest
    would be), then device-to-device copies."""
    a = source if isinstance(source, Attached) else Attached(source, device=device)
    try:
        if a.device != device:
            raise _bad_argument(a._path, f"the served block is on {a.device}, the target on "
                                         f"{device}")
        place, lib = _Placement(targets, strict, only), library()
        sel = None if only is None else os.fsencode(only)
        copies = []
        for i in range(len(a)):
            tp = lib.ckl_get(a._handle(), i)
            at = (_c.c_void_p * 1)()
            if lib.ckl_selected(sel, tp.contents.name) and place(None, tp, at) == DEST_AT:
                copies.append((i, at[0]))
        if place(None, None, None) != DEST_BLOCK:
            raise Error(f"ckload: {shown(a._path)}: cannot load into the target: " +
                        "; ".join(place.problems()))
        torch.cuda.synchronize(device)  # the targets' pending writes (a fill) go first
        for i, ptr in copies:
            n = a.info(i)[3]
            if n:
                _block_bytes(device, ptr, n).copy_(_block_bytes(device, a.pointer(i), n))
        place.settle(a)  # tied targets' bytes, then a synchronize
        for name in sorted(place.loaded, key=place.order.get) if on_ready else ():
            on_ready(name)
        return IncompatibleKeys(place.missing(), place.unexpected)
    finally:
        if a is not source:
            a.release()


def load_into(target, path: PathLike, strict: bool = True, only: Optional[str] = None,
              verify: bool = False, threads: int = 0, buffer_size: int = 0,
              slices: Optional[Sequence[Tuple[str, int]]] = None, rank: int = 0,
              world_size: int = 1, buffers: int = 0,
              on_ready: Optional[Callable[[str], None]] = None) -> IncompatibleKeys:
    """Loads the checkpoint at path (any source load takes) into target's own memory: an
    nn.Module (its state_dict's parameters and buffers) or a mapping {name: torch.Tensor}, all
    on one device (CPU or CUDA, any allocator; a module built on `meta` must be materialized
    first, e.g. with to_empty). Each tensor's bytes land straight in the target tensor of its
    name (read into it for the host, through the pinned staging buffers for CUDA): no second
    copy, no memory of ckload's that outlives the call, and on CUDA torch's allocator counts
    it all. Names are matched exactly; each target must have the checkpoint's dtype and shape
    (a tensor part's shape, with slices) and be contiguous, not a conjugated or negated view
    (is_conj, is_neg). Tied parameters (one memory under
    several names) end as load_state_dict leaves them: with the bytes of the last of their
    names, in the target's order (its state_dict's, or the mapping's), that the checkpoint
    has, whatever the checkpoint holds under the others (read once, straight in, where that
    name comes last in pack order too; else the earlier name's bytes go through ckload's
    memory, freed before the call returns, and on_ready names the tie once they are in).
    Targets whose memory overlaps otherwise (views of one tensor at different offsets or
    lengths) are refused before a byte is read (ValueError naming two of them): their
    shared bytes would be a mix of both tensors'. strict (the default): every target name must be filled
    and every checkpoint name (selected by only) wanted, else nothing is read and Error (a
    RuntimeError, as load_state_dict's) lists the missing and unexpected names; strict=False
    loads what matches and returns IncompatibleKeys(missing_keys, unexpected_keys). A dtype
    or shape mismatch is an error either way. Target names that only leaves out are not
    missing. on_ready(name) runs on a loader thread as each tensor lands. The other
    arguments are load's. Returns IncompatibleKeys once every byte is in place; on any other
    failure raises what load raises, and the target may hold some of the bytes. path may
    also be the socket of a served block (ckpt serve) or an Attached: then the tensors are
    copied device to device from the block other processes share, with the same checks
    (nothing is copied when any fails), and on_ready runs once they are all in."""
    targets = _targets_of(target)
    device = _device_of(targets)
    if isinstance(path, Attached) or _is_socket(path):
        return _into_from_attached(targets, device, path, strict, only, on_ready)
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)  # the targets' pending writes (a fill) go first
    place = _Placement(targets, strict, only)
    early = _EarlyReady(on_ready, place.settles)
    try:
        ld = Load(path, device=device, only=only, verify=verify, threads=threads,
                  buffer_size=buffer_size, slices=slices, rank=rank, world_size=world_size,
                  buffers=buffers, on_ready=early if on_ready else None, _dest=place)
    except RuntimeError:
        if place.refused or place.wrong:
            raise Error(f"ckload: {shown(path)}: cannot load into the target: " +
                        "; ".join(place.problems())) from None
        raise
    with ld:
        early.start(ld)
        ld.wait_all()
        place.settle(ld)
    if on_ready:
        for name in place.later.values():
            on_ready(name)
    return IncompatibleKeys(place.missing(), place.unexpected)


# --- many processes: read once, broadcast ------------------------------------------------------

class DistributedLoad(Load):
    """One load on every rank of a torch.distributed process group (ckload.h's read shares):
    each blob (the unit libckload reads; tied tensors share one) is read from storage by one
    rank and sent from it, in pack order, while later blobs are still being read: a whole
    tensor's blob broadcast to every rank, a part that a slice rule cuts only to its own rank.

    DistributedLoad(path, group=None, device="auto", plan="balanced", slices=None, only=None,
                    verify=False, threads=0, buffer_size=0, on_ready=None)
    is collective: every rank of group calls it with the same path (as each sees it), selection
    and rules. plan "balanced": each rank reads the whole blobs it is given by size (at most 1/N
    of their bytes plus one blob) and its own parts (disjoint bytes: nothing sent); "rank0":
    rank 0 reads everything (when only it has the file), each rank's parts too, and sends each
    rank its own: no rank but rank 0 ever holds more of a tensor than its part. wait, on_ready
    and tensor work per tensor on every rank as for Load: a tensor is ready once its bytes are
    in this rank's block, read here or received. Any rank's error (a missing file, a corrupt
    blob, a bad rule, torch.distributed's own) fails the load on every rank with that rank's
    message ("ckload: rank R: FILE: what is wrong"), as the exception class that rank raised
    at the start (FileNotFoundError, PermissionError, ValueError), else as Error; the group's
    timeout bounds every step.
    bytes_read() tells the bytes this rank read from storage (rank 0's for other ranks' parts
    included).
    """

    def __init__(self, path: PathLike, group=None, device: Device = "auto",
                 plan: str = "balanced", slices: Optional[Sequence[Tuple[str, int]]] = None,
                 only: Optional[str] = None, verify: bool = False, threads: int = 0,
                 buffer_size: int = 0,
                 on_ready: Optional[Callable[[int], None]] = None) -> None:
        import torch.distributed as dist
        self._dist, self._group = dist, group
        self._h, self._thread, self._ctx, self._others = None, None, None, {}
        self._others_read = 0  # bytes the loads of self._others read, once they are released
        if plan not in ("balanced", "rank0"):
            raise _bad_argument(path, f"plan={plan!r}: expected 'balanced' or 'rank0'")
        self._rank, world = dist.get_rank(group), dist.get_world_size(group)
        kw = dict(device=device, only=only, verify=verify, threads=threads,
                  buffer_size=buffer_size, slices=slices, world_size=world)
        why = None
        try:
            super().__init__(path, on_ready=on_ready, rank=self._rank,
                             _read=READ_BALANCED if plan == "balanced" else READ_RANK0, **kw)
            if plan == "rank0" and slices and self._rank == 0:  # the others' parts, to send
                self._others = {r: Load(path, rank=r, _read=READ_PARTS, **kw)
                                for r in range(1, world)}
        except (RuntimeError, ValueError, OSError) as e:
            why = (_code_of(e), str(e))
        # Every rank learns every rank's start, and that they planned the same whole blobs: a
        # rank that could not start, or whose checkpoint differs, fails them all.
        everyone = [None] * world
        dist.all_gather_object(everyone, (why, None if why else self._whole_blobs()), group)
        failed = next((r for r, (w, _) in enumerate(everyone) if w), None)
        if failed is None and any(s != everyone[0][1] for _, s in everyone):
            failed = 0
            everyone[0] = ((_errno.EIO, "ckload: the ranks' checkpoints differ (their blobs do "
                                        "not match)"), 0)
        if failed is not None:
            self._release_all()
            code, msg = everyone[failed][0]
            raise _error(code, "ckload: " + self._rank_says(failed, msg))
        steps = [self._steps() if self._rank == 0 else None]
        dist.broadcast_object_list(steps, src=self._global(0), group=group)
        self._lib.ckl_retain(self._h)  # the sender's reference
        self._thread = threading.Thread(target=self._send_all, args=(self._h, steps[0]),
                                        name="ckload-send", daemon=True)
        self._thread.start()

    @staticmethod
    def _rank_says(rank, msg):
        """Rank rank's message msg ("ckload: FILE: what is wrong") as every rank's load error."""
        return f"rank {rank}: {msg[len('ckload: '):] if msg.startswith('ckload: ') else msg}"

    def _release_others(self):
        others, self._others = self._others, {}
        for other in others.values():
            other.release()

    def _release_all(self):
        self._release_others()
        self.release()

    def _whole_blobs(self):
        """(owner, bytes) of each whole blob: what the ranks agree on."""
        return [(owner, n) for _, n, owner, sliced in self.blobs() if not sliced]

    def _steps(self):
        """Rank 0's schedule of what is sent, in pack order (by each blob's first tensor):
        ("whole", k), the k-th whole blob broadcast from its owner; ("part", r, k), rank r's k-th
        part sent by rank 0, which read it (rank0 with slices)."""
        def first_tensors(ld):  # a blob's place in the block -> its first tensor
            at = {}
            for i in range(len(ld)):
                if ld.info(i)[3]:
                    at.setdefault(ld.pointer(i), i)
            return at
        mine = first_tensors(self)
        whole = [data for data, _, _, sliced in self.blobs() if not sliced]
        steps = [(mine[data], 0, ("whole", k)) for k, data in enumerate(whole)]
        for r, ld in self._others.items():
            theirs = first_tensors(ld)
            steps += [(self.find(ld.name(theirs[data])), r, ("part", r, k))
                      for k, (data, *_) in enumerate(ld.blobs())]
        return [step for *_, step in sorted(steps)]

    def _global(self, rank):
        if self._group is None:
            return rank
        return self._dist.distributed_c10d._get_global_rank(self._group, rank)

    def _status(self, why, src):
        """Whether rank src's step went well (why None there), as every rank learns it."""
        flag = torch.tensor([0 if why else 1], dtype=torch.int32,
                            device=self.device if self.device.startswith("cuda") else "cpu")
        self._dist.broadcast(flag, src=self._global(src), group=self._group)
        return bool(flag.item())

    def _agree(self, h, why):
        """Every rank fails with the first failing rank's message (why on that rank) if any."""
        said = [None] * self._dist.get_world_size(self._group)
        self._dist.all_gather_object(said, why, self._group)
        bad = next((r for r, w in enumerate(said) if w), None)
        if bad is not None:
            self._lib.ckl_fail(h, self._rank_says(bad, said[bad]).encode())
        return bad is None

    def _wait_blob(self, ld, b):
        """None once blob b of ld (read here) is in, else that load's error."""
        err = _c.create_string_buffer(len(ld._path) + ERR_ROOM)
        if ld._lib.ckl_blob_wait(ld._h, b, err, len(err)) == 0:
            return None
        return "ckload: " + err.value.decode("utf-8", "replace")

    def _put(self, h, b):
        err = _c.create_string_buffer(len(self._path) + ERR_ROOM)
        self._lib.ckl_blob_put(h, b, err, len(err))  # fails only once the load has: said so

    def _step(self, h, blobs, whole, parts, step):
        """One step of the schedule; False once it failed on its sender (every rank knows)."""
        if step[0] == "whole":
            b = whole[step[1]]
            ptr, n, owner, _ = blobs[b]
            why = self._wait_blob(self, b) if owner == self._rank else None
            if not self._status(why, owner):
                return self._agree(h, why)
            self._dist.broadcast(_block_bytes(self.device, ptr, n), src=self._global(owner),
                                 group=self._group)
            if owner != self._rank:
                self._put(h, b)
            return True
        _, r, k = step
        why = self._wait_blob(self._others[r], k) if self._rank == 0 else None
        if not self._status(why, 0):
            return self._agree(h, why)
        if self._rank == 0:
            ptr, n, *_ = self._others[r].blobs()[k]
            part = _block_bytes(self.device, ptr, n)
            self._dist.send(part.cpu() if self._host_p2p() else part, dst=self._global(r),
                            group=self._group)
        elif self._rank == r:
            ptr, n, *_ = blobs[parts[k]]
            part = _block_bytes(self.device, ptr, n)
            into = torch.empty(n, dtype=torch.uint8) if self._host_p2p() else part
            self._dist.recv(into, src=self._global(0), group=self._group)
            if into is not part:
                part.copy_(into)  # from pageable memory: done when copy_ returns
            self._put(h, parts[k])
        return True

    def _host_p2p(self):
        """Whether a part goes through host memory: gloo sends and receives only CPU tensors
        (it broadcasts CUDA ones), so a CUDA load over gloo stages its parts in host memory."""
        return (self.device.startswith("cuda") and
                self._dist.get_backend(self._group) == "gloo")

    def _send_all(self, h, steps):
        """The schedule, step by step; then the ranks agree that every blob read here for this
        rank alone went well. Any failure fails every rank's load."""
        try:
            blobs = self.blobs()
            whole = [b for b, (_, _, _, sliced) in enumerate(blobs) if not sliced]
            parts = [b for b, (_, _, _, sliced) in enumerate(blobs) if sliced]
            if all(self._step(h, blobs, whole, parts, step) for step in steps):
                mine = [b for b in parts if blobs[b][2] in (-1, self._rank)]
                self._agree(h, next((w for w in (self._wait_blob(self, b) for b in mine) if w),
                                    None))
        except Exception as e:  # torch.distributed's error or timeout: this rank's message
            self._lib.ckl_fail(h, f"rank {self._rank}: torch.distributed: {e}".encode())
        finally:
            self._others_read = sum(o.done_bytes() for o in self._others.values())
            self._release_others()
            self._lib.ckl_release(h)

    def bytes_read(self) -> int:
        """The bytes this rank read from storage, once the load is done."""
        return self.done_bytes() + self._others_read

    def _ranked(self, wait, *args):
        """wait(*args), its error as a rank's: this rank's own, unless another rank's already."""
        try:
            wait(*args)
        except RuntimeError as e:
            msg = str(e)
            if msg.startswith("ckload: rank "):
                raise
            raise Error("ckload: " + self._rank_says(self._rank, msg)) from None

    def wait(self, i: int) -> None:
        """Blocks until tensor i is in place on this rank; Error with the failing rank's
        message if the load failed."""
        self._ranked(super().wait, i)

    def wait_all(self) -> None:
        """Blocks until every tensor is in place on this rank and every rank has agreed that all
        went well; Error with the failing rank's message otherwise."""
        if self._thread is not None:
            self._thread.join()
        self._ranked(super().wait_all)


def load_distributed(path: PathLike, group=None, device: Device = "auto",
                     plan: str = "balanced",
                     slices: Optional[Sequence[Tuple[str, int]]] = None,
                     only: Optional[str] = None, verify: bool = False, threads: int = 0,
                     buffer_size: int = 0) -> Dict[str, torch.Tensor]:
    """ckload.load on every rank of a torch.distributed group at once, each byte read from
    storage by one rank (DistributedLoad): {name: torch.Tensor} on every rank, the whole state
    dict, or with slices each rank's parts of the tensors they cut. Collective; raises
    ("ckload: rank R: FILE: what is wrong", DistributedLoad says which class) on every rank when
    any rank fails, and then frees everything."""
    with DistributedLoad(path, group=group, device=device, plan=plan, slices=slices, only=only,
                         verify=verify, threads=threads, buffer_size=buffer_size) as ld:
        ld.wait_all()
        return {ld.name(i): ld.tensor(i) for i in range(len(ld))}
