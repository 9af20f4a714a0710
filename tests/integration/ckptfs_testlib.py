"""Shared helpers for the ckptfs integration tests.

Everything "expected" in these tests comes from an independent reader (the safetensors library,
torch, numpy) or from bytes a test wrote itself; nothing here knows what ckptfs prints.
"""
import contextlib
import ctypes
import ctypes.util
import importlib
import json
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
CORPUS = Path("/work/shared/corpus")
MOUNT_TIMEOUT = 30  # seconds for ckptfs to parse SOURCE and mount (or refuse)

assert sys.byteorder == "little", "these tests compare against little-endian host arrays"

# CI=true (or 1), as GitHub Actions and most CIs set it and .ci/run does: a machine where
# scripts/setup has run, with the CUDA toolkit, io_uring and O_DIRECT. There a dependency missing
# is a broken setup that a skip would hide, so `need` fails instead.
ON_CI = os.environ.get("CI", "").lower() in ("true", "1")
TORCH2 = REPO / ".deps" / "torch2" / "bin" / "python"  # scripts/setup's torch 2.x


def need(present, why):
    """Goes on where `present` is true; else skips the test (at a module's top, the module) with
    `why`, which says what is missing and what provides it, or fails it under CI=true (ON_CI).
    Either is reported at the caller's line."""
    __tracebackhide__ = True
    if present:
        return
    if ON_CI:
        pytest.fail(f"{why}: CI=true, where a missing dependency fails rather than skips",
                    pytrace=False)
    pytest.skip(f"{why} (under CI=true this fails)", allow_module_level=True)


def need_torch2():
    __tracebackhide__ = True
    need(TORCH2.exists(), "no .deps/torch2 (scripts/setup installs it)")


def need_module(name, why="scripts/setup installs it into .deps/python"):
    """The module `name` imported, or `need` says it is missing."""
    __tracebackhide__ = True
    try:
        return importlib.import_module(name)
    except ImportError as e:
        missing = e
    need(False, f"no module {name} ({missing}; {why})")

# XXH3-64 (seed 0) from the system libxxhash: the hash FORMAT.md and views/tree.h name, computed by a
# library ckptfs does not build.
_xx = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
_xx.XXH3_64bits.restype = ctypes.c_uint64
_xx.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def xxh3(b):
    return _xx.XXH3_64bits(bytes(b), len(b))


def build_dir():
    return Path(os.environ.get("CKPTFS_BUILD") or REPO / "build").resolve()


def ckptfs_bin():
    return build_dir() / "ckptfs"


def ckpt_bin():
    return build_dir() / "ckpt"


# --- /proc/mounts --------------------------------------------------------------------------

def _unescape_mount_field(s):
    # /proc/mounts writes space, tab, newline and backslash as \ooo.
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and len(s[i + 1:i + 4]) == 3 and s[i + 1:i + 4].isdigit():
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def mount_entries():
    """(source, mountpoint, fstype, options) for every line of /proc/mounts."""
    rows = []
    with open("/proc/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 4:
                rows.append((_unescape_mount_field(fields[0]), _unescape_mount_field(fields[1]),
                             fields[2], fields[3]))
    return rows


def mount_entry(mountpoint):
    mp = os.path.realpath(str(mountpoint))
    for row in mount_entries():
        if row[1] == mp:
            return row
    return None


def is_mounted(mountpoint):
    return mount_entry(mountpoint) is not None


def unmount(mountpoint):
    """fusermount3 -u, then a lazy -uz if that did not work. Returns True when it is gone."""
    mp = str(mountpoint)
    if not is_mounted(mp):
        return True
    for args in (["-u"], ["-uz"]):
        for _ in range(20):
            subprocess.run(["fusermount3", *args, mp], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=20)
            if not is_mounted(mp):
                return True
            time.sleep(0.1)
    return not is_mounted(mp)


# --- FUSE availability ---------------------------------------------------------------------

def fuse_problem():
    """None when /dev/fuse and fusermount3 are usable, else a sentence saying what is wrong."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist"
    st = os.stat("/dev/fuse")
    if not stat.S_ISCHR(st.st_mode):
        return "/dev/fuse is not a character device"
    try:
        fd = os.open("/dev/fuse", os.O_RDWR)
    except OSError as e:
        return f"/dev/fuse cannot be opened read-write: {e}"
    os.close(fd)
    if not shutil.which("fusermount3"):
        return "fusermount3 is not on PATH"
    return None


# --- running ckptfs ------------------------------------------------------------------------

class Mounter:
    """mount(source, options=(), cwd=None): context manager; mounts with the daemonizing
    `ckptfs` on a fresh empty directory, yields its Path, always unmounts and removes it."""

    def __init__(self, base):
        self.base = Path(base)

    def new_mountpoint(self):
        return Path(tempfile.mkdtemp(prefix="mnt-", dir=self.base))

    @contextlib.contextmanager
    def __call__(self, source, options=(), cwd=None):
        mnt = self.new_mountpoint()
        cmd = [str(ckptfs_bin())]
        if options:
            cmd += ["-o", ",".join(options)]
        cmd += [str(source), str(mnt)]
        try:
            try:
                p = subprocess.run(cmd, capture_output=True, timeout=MOUNT_TIMEOUT, cwd=cwd)
            except subprocess.TimeoutExpired:
                pytest.fail(f"ckptfs did not return within {MOUNT_TIMEOUT}s: {cmd}")
            if p.returncode != 0:
                pytest.fail(f"ckptfs failed (exit {p.returncode}) for {cmd}:\n"
                            f"{p.stderr.decode(errors='replace')}")
            entry = mount_entry(mnt)
            assert entry is not None, f"ckptfs exited 0 but {mnt} is not in /proc/mounts"
            assert entry[2] == "fuse.ckptfs", entry
            yield mnt
        finally:
            gone = unmount(mnt)
            try:
                mnt.rmdir()
            except OSError:
                pass
            if not gone:
                pytest.fail(f"could not unmount {mnt}")


def ckptfs_pids(arg):
    """Live processes running ckptfs with arg (a mountpoint or a source) in their command line;
    a daemon is not our child, so /proc is the only way to find it."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if argv[0].endswith(b"ckptfs") and str(arg).encode() in argv and state != "Z":
            pids.append(int(d.name))
    return pids


def wait_until(cond, timeout=20):
    """Polls cond until it holds (True) or timeout seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def run(cmd, timeout=30, **kw):
    try:
        return subprocess.run([str(c) for c in cmd], capture_output=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{cmd} did not finish within {timeout}s (hung?)")


def assert_refused(source, mountpoint, *, prefix=None, tool="ckptfs"):
    """Runs `ckptfs SOURCE MOUNTPOINT` and checks the failure contract: exit 1, exactly one
    line on stderr that starts with "ckptfs: " (+ prefix), nothing on stdout, nothing mounted.
    Returns the line."""
    mountpoint = Path(mountpoint)
    p = run([ckptfs_bin(), source, mountpoint], timeout=20)
    mounted = is_mounted(mountpoint)
    if mounted:
        unmount(mountpoint)
    err = p.stderr.decode("utf-8", errors="replace")
    assert not mounted, f"ckptfs left {mountpoint} mounted (stderr: {err!r})"
    assert p.returncode == 1, f"exit {p.returncode}, stderr {err!r}"
    assert p.stdout == b"", p.stdout
    assert err.endswith("\n") and err.count("\n") == 1, f"not exactly one line: {err!r}"
    want = "ckptfs: " + (str(prefix if prefix is not None else source))
    assert err.startswith(want), f"{err!r} does not start with {want!r}"
    return err.rstrip("\n")


# --- safetensors files ---------------------------------------------------------------------

DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def header_bytes(header):
    h = json.dumps(header, ensure_ascii=False).encode("utf-8")
    return h + b" " * (-len(h) % 8)


def write_safetensors(path, tensors, metadata=None, order=None):
    """Writes a safetensors file byte by byte. tensors: list of (name, dtype, shape, data);
    data are laid out in list order (or `order`, a list of names)."""
    header, blobs, at = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    by_name = {t[0]: t for t in tensors}
    for name in order or [t[0] for t in tensors]:
        _, dtype, shape, data = by_name[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    h = header_bytes(header)
    Path(path).write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    return Path(path)


def raw_file(path, header_text, data=b"", hlen=None):
    """A file with an arbitrary header text (bytes or str) and length field."""
    if isinstance(header_text, str):
        header_text = header_text.encode("utf-8")
    n = len(header_text) if hlen is None else hlen
    Path(path).write_bytes(struct.pack("<Q", n) + header_text + data)
    return Path(path)


def library_view(path):
    """What the safetensors library reads from a file or a shard directory:
    ({name: (dtype, shape, bytes)}, metadata). For a directory, every *.safetensors file."""
    from safetensors import deserialize, safe_open
    path = Path(path)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    tensors, meta = {}, {}
    for f in files:
        for name, v in deserialize(f.read_bytes()):
            assert name not in tensors, f"{name} twice"
            tensors[name] = (v["dtype"], list(v["shape"]), bytes(v["data"]))
        with safe_open(str(f), framework="numpy") as h:
            for k, val in (h.metadata() or {}).items():
                meta.setdefault(k, val)
    return tensors, meta


def torch_bytes(t):
    """Row-major little-endian bytes of a torch tensor, whatever its strides."""
    import torch
    # as bytes: numpy has no bfloat16 or float8 (which torch 2.x hands out)
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


# --- the mount -----------------------------------------------------------------------------

# The mount's own files (docs/SEMANTICS.md, "The mount").
VIRTUAL_FILES = {".ckptfs/index.json", ".ckptfs/checkpoint.pack", ".ckptfs/checkpoint.safetensors",
                 ".ckptfs/status"}


def read_index(mnt):
    return json.loads((Path(mnt) / ".ckptfs" / "index.json").read_bytes())


def xattrs_of(path):
    return {k: os.getxattr(path, k) for k in
            ("user.ckptfs.name", "user.ckptfs.dtype", "user.ckptfs.shape")}


def check_mount(mnt, tensors, metadata, fmt, xattrs=True):
    """Checks index.json, every tensor file's bytes and size, and its xattrs against
    `tensors` ({name: (dtype, shape, bytes)}) from an independent reader."""
    mnt = Path(mnt)
    index = read_index(mnt)
    assert set(index) == {"format", "metadata", "tensors"}
    assert index["format"] == fmt
    assert index["metadata"] == metadata
    names = [t["name"] for t in index["tensors"]]
    assert len(names) == len(set(names)), "a tensor is listed twice"
    assert set(names) == set(tensors)
    paths = set()
    for ent in index["tensors"]:
        assert set(ent) == {"name", "path", "dtype", "shape", "nbytes"}, ent
        dtype, shape, data = tensors[ent["name"]]
        assert ent["dtype"] == dtype, ent
        assert ent["shape"] == shape, ent
        assert ent["nbytes"] == len(data) == numel(shape) * DTYPE_BITS[dtype] // 8, ent
        assert ent["path"] not in paths
        paths.add(ent["path"])
        p = mnt / ent["path"]
        st = os.stat(p)
        assert stat.S_ISREG(st.st_mode), ent
        assert st.st_size == len(data), ent
        with open(p, "rb") as f:
            got = f.read()
        assert got == data, f"bytes of {ent['name']!r} differ"
        if xattrs:
            x = xattrs_of(p)
            assert x["user.ckptfs.name"] == ent["name"].encode("utf-8")
            assert x["user.ckptfs.dtype"] == dtype.encode()
            assert json.loads(x["user.ckptfs.shape"]) == shape
            assert set(os.listxattr(p)) == set(x)
    return index


# --- PyTorch checkpoints --------------------------------------------------------------------

DTYPE_NAMES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
               torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
               torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
               torch.complex64: "C64", torch.complex128: "C128"}


def flatten(obj, prefix=None, out=None):
    """{name: ("tensor", dtype, shape, bytes) | ("value", type, bytes)} by the mount's naming
    rule: dict keys as str(), list and tuple indices, joined with '.'."""
    out = {} if out is None else out
    if isinstance(obj, dict):
        items = [(str(k), v) for k, v in obj.items()]
    elif isinstance(obj, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(obj)]
    else:
        name = "" if prefix is None else prefix
        if isinstance(obj, torch.Tensor):
            out[name] = ("tensor", DTYPE_NAMES[obj.dtype], list(obj.shape), torch_bytes(obj))
        elif isinstance(obj, bytes):
            out[name] = ("value", "bytes", obj)
        else:
            kind = {type(None): "None", bool: "bool", int: "int", float: "float",
                    str: "str"}[type(obj)]
            out[name] = ("value", kind, (str(obj) + "\n").encode())
        return out
    for k, v in items:
        flatten(v, k if prefix is None else prefix + "." + k, out)
    return out


def check_torch_mount(mnt, path, fmt):
    """Mount contents against torch.load(path): index.json, every file's bytes, xattrs."""
    expected = flatten(torch.load(path, map_location="cpu", weights_only=False))
    mnt = Path(mnt)
    index = read_index(mnt)
    assert index["format"] == fmt
    seen = {}
    for ent in index["tensors"]:
        kind, dtype, shape, data = expected[ent["name"]]
        assert kind == "tensor", ent
        assert (ent["dtype"], ent["shape"], ent["nbytes"]) == (dtype, shape, len(data)), ent
        p = mnt / ent["path"]
        assert p.read_bytes() == data, f"bytes of {ent['name']!r} differ"
        assert os.stat(p).st_size == len(data)
        assert os.getxattr(p, "user.ckptfs.name") == ent["name"].encode()
        assert os.getxattr(p, "user.ckptfs.dtype") == dtype.encode()
        assert json.loads(os.getxattr(p, "user.ckptfs.shape")) == shape
        seen[ent["name"]] = ent["path"]
    for ent in index.get("values", []):
        kind, vtype, text = expected[ent["name"]]
        assert kind == "value" and ent["type"] == vtype, ent
        p = mnt / ent["path"]
        assert p.read_bytes() == text, ent
        assert os.getxattr(p, "user.ckptfs.type") == vtype.encode()
        seen[ent["name"]] = ent["path"]
    assert set(seen) == set(expected)
    assert len(set(seen.values())) == len(seen), "two entries share a path"
    return index




def run_on_a_terminal(argv, stderr_too=False, timeout=60):
    """argv with its stdout (and stderr too, or else a pipe) a pseudo-terminal, as a person
    runs it: (status, what the terminal shows with "\r\n" as "\n", stderr's bytes or b"")."""
    import pty
    master, slave = pty.openpty()
    p = subprocess.run([str(a) for a in argv], stdout=slave,
                       stderr=slave if stderr_too else subprocess.PIPE, timeout=timeout)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the other side is closed and all is read
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return p.returncode, out.decode().replace("\r\n", "\n"), p.stderr or b""


def client_env(set_, drop, over):
    """os.environ with set_ added, the names in drop removed (stray settings of the host), then
    over applied: a value sets its name, None removes it."""
    env = dict(os.environ, **set_)
    for k in drop:
        env.pop(k, None)
    for k, v in over.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env
