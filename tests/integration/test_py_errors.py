"""ckload's exception classes (docs/LOADER.md, "Errors"): FileNotFoundError for a source that is
not there, PermissionError for one this user cannot read, ValueError for an argument refused
(named as the Python parameter, never as ckpt's flag), ckload.Error (a RuntimeError) for the
rest; each with libckload's one line, "ckload: FILE: what is wrong". The class comes from the
error class libckload reports (errno after a failed call, ckload.h), never from the message."""
import ctypes
import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import ckload
from ckptfs_testlib import build_dir, ckpt_bin, need, run
from test_load import flip_byte
from test_load_mount import plain_source as source
from test_pack import pack, pack_header

NOBODY = 65534


def raised(cls, path, **kw):
    """The message of the exception ckload.load(path, **kw) raised, once it is exactly of class
    cls (a subclass would not do), says FILE as given and is one line. Load raises the same."""
    for start in (ckload.load, ckload.Load):
        with pytest.raises(cls) as e:
            start(path, **kw)
        assert type(e.value) is cls, (type(e.value), e.value)
        msg = str(e.value)
        assert msg.startswith(f"ckload: {path}: ") and "\n" not in msg, msg
    return msg


def test_a_missing_source_is_file_not_found(tmp_path):
    src = source(tmp_path)
    for path, says in [(tmp_path / "none.safetensors", errno.ENOENT),
                       (tmp_path / "gone" / "shards", errno.ENOENT),
                       (src / "under_a_file", errno.ENOTDIR)]:  # no such file either
        msg = raised(FileNotFoundError, path, device="cpu")
        assert msg.endswith(os.strerror(says)), msg
        with pytest.raises(FileNotFoundError) as e:
            ckload.load(path, device="cpu")
        assert e.value.errno == errno.ENOENT and str(e.value) == msg


CHILD = """
import json, sys
import ckload
try:
    ckload.load(sys.argv[1], device="cpu")
    print(json.dumps(None))
except Exception as e:
    print(json.dumps({"class": type(e).__name__, "msg": str(e), "errno": getattr(e, "errno", 0),
                      "runtime": isinstance(e, RuntimeError)}))
"""


@pytest.fixture
def open_dir():
    """A folder under /tmp that every user may enter (pytest's own are 0700)."""
    d = Path(tempfile.mkdtemp(prefix="ckload-err-", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def as_nobody(path):
    """What CHILD raised loading path as user nobody (root's tests), or as this user."""
    user = (["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
            if os.geteuid() == 0 else [])
    p = run([*user, sys.executable, "-c", CHILD, str(path)], timeout=60, env=dict(os.environ))
    assert p.returncode == 0, p.stderr.decode()
    return json.loads(p.stdout)


def test_an_unreadable_source_is_permission_error(open_dir):
    """A file no one but root may read, and a directory of shards no one but root may list,
    loaded by another user: PermissionError (an OSError, errno EACCES), not Error."""
    src = source(open_dir / "file")
    os.chmod(src, 0o000)
    shards = open_dir / "shards"
    source(shards)
    os.chmod(shards, 0o000)
    for path in (src, shards):
        got = as_nobody(path)
        assert (got["class"], got["errno"], got["runtime"]) == ("PermissionError",
                                                                errno.EACCES, False), got
        assert got["msg"].startswith(f"ckload: {path}: ") and "\n" not in got["msg"], got
        assert got["msg"].endswith(os.strerror(errno.EACCES)), got
    os.chmod(src, 0o644)
    os.chmod(shards, 0o755)
    assert as_nobody(src) is None  # readable now: it loads


@pytest.mark.parametrize("kw, says", [
    ({"only": "no.such.*"}, "only='no.such.*' selects nothing"),
    ({"threads": 10**6}, "threads=1000000: not an integer from 0 to 256"),
    ({"threads": -1}, "threads=-1: not an integer from 0 to 256"),
    ({"buffers": 65}, "buffers=65: not an integer from 0 to 64"),
    ({"buffer_size": 100}, "buffer_size=100: not 0 or an integer from 4096 to 4294967296"),
    ({"device": "tpu"}, "device='tpu': expected cpu, cuda, cuda:N or auto"),
    ({"slices": [("enc.w", -2)], "world_size": 2},
     "slices=[('enc.w', -2)]: dim=-2: not an integer from -1 to 63"),
    ({"slices": [("enc.w", 1)], "world_size": 2},
     "tensor 'enc.w' has 1 dimensions: no dimension 1 to slice"),
    ({"rank": 2, "world_size": 2}, "world_size=2: rank=2: not an integer from 0 to 1"),
])
def test_a_bad_argument_is_value_error_named_as_the_parameter(tmp_path, kw, says):
    path = source(tmp_path)
    msg = raised(ValueError, path, **{"device": "cpu", **kw})
    assert msg == f"ckload: {path}: {says}" or msg.startswith(f"ckload: {path}: {says}"), msg
    assert "--" not in msg, msg  # never ckpt's flags


def test_the_cli_keeps_its_flags(tmp_path):
    """The same refusal from `ckpt load` names its flag: the library says what its caller calls
    the option (ckl_options.spelling; ckpt checks the numbers' bounds itself)."""
    path = source(tmp_path)
    p = run([ckpt_bin(), "load", path, "--device", "cpu", "--only", "no.such.*"])
    assert p.returncode == 1, p.stderr
    assert p.stderr.decode() == f"ckpt: {path}: --only 'no.such.*' selects nothing\n"


def test_any_other_failure_is_error_a_runtime_error(tmp_path):
    """A corrupt checkpoint (found before the load starts, and by a reader thread while it
    runs) and a source that is no checkpoint: ckload.Error, caught by `except RuntimeError`
    (code that catches RuntimeError still does)."""
    src = source(tmp_path)
    short = tmp_path / "short.safetensors"
    short.write_bytes(src.read_bytes()[:-10])
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x07" * 4096)
    for path in (short, junk):
        msg = raised(ckload.Error, path, device="cpu")
        with pytest.raises(RuntimeError):
            ckload.load(path, device="cpu")
    out = pack(src, tmp_path / "out.pack")
    flip_byte(out, pack_header(out)["data_offset"] + 1)
    with ckload.Load(out, device="cpu", verify=True) as ld:
        with pytest.raises(ckload.Error) as e:
            ld.wait_all()
    msg = str(e.value)
    assert isinstance(e.value, RuntimeError) and not isinstance(e.value, (OSError, ValueError))
    assert msg.startswith(f"ckload: {out}: tensor '") and "checksum mismatch" in msg, msg
    assert "\n" not in msg
    assert ckload.Error.__mro__[1] is RuntimeError and "Error" in ckload.__all__


def test_load_into_refusals_stay_runtime_errors(tmp_path):
    """load_into's own refusal (a name missing, as torch's load_state_dict says it) is an
    Error, a RuntimeError as torch's is; its bad arguments are ValueErrors as load's."""
    path = source(tmp_path)
    target = {"enc.w": torch.empty(300), "enc.b": torch.empty(7, dtype=torch.int16),
              "extra": torch.empty(2)}
    with pytest.raises(ckload.Error, match="missing key\\(s\\): extra"):
        ckload.load_into(target, path)
    with pytest.raises(ValueError, match="only='zzz' selects nothing"):
        ckload.load_into(target, path, only="zzz")
    # only selects, but the target takes none of it: nothing to load, as without only (the
    # library's plan of what is left is made without only, never refusing it in ckpt's words)
    assert ckload.load_into({"x": torch.empty(2)}, path, strict=False, only="enc.w") == ([],
                                                                                      ["enc.w"])
    assert ckload.load_into({"x": torch.empty(2)}, path, strict=False) == (
        ["x"], ["enc.b", "enc.w"])


def test_the_library_reports_the_class_in_errno(tmp_path):
    """libckload's own contract (ckload.h): a failed call sets errno to the error's class."""
    lib = ckload.library()
    path = source(tmp_path)
    o = ckload.Options()
    lib.ckl_default_options(ctypes.byref(o))
    o.device = ckload.CKL_CPU
    err = ctypes.create_string_buffer(4096)

    def start(p, **fields):
        for k, v in fields.items():
            setattr(o, k, v)
        h = ctypes.c_void_p()
        rc = lib.ckl_load_start(os.fsencode(p), ctypes.byref(o), ctypes.byref(h), err,
                                len(err))
        return rc, ctypes.get_errno(), err.value.decode(), h

    assert start(tmp_path / "none")[:2] == (-1, errno.ENOENT)
    rc, code, msg, _ = start(path, only=b"zzz")
    assert (rc, code, msg) == (-1, errno.EINVAL, f"{path}: --only 'zzz' selects nothing")
    o.spelling = ckload.SPELL_PARAMS
    assert start(path)[2:3] == (f"{path}: only='zzz' selects nothing",)
    rc, code, msg, h = start(path, only=None)
    assert rc == 0, msg
    try:
        assert lib.ckl_wait(h, 99, err, len(err)) == -1 and ctypes.get_errno() == errno.EINVAL
        assert err.value.decode() == f"{path}: no tensor 99"
        assert lib.ckl_wait_all(h, err, len(err)) == 0
    finally:
        lib.ckl_release(h)
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x07" * 4096)
    assert start(junk)[:2] == (-1, errno.EIO)


def test_the_library_refuses_options_out_of_bounds_itself(tmp_path):
    """libckload's own bounds (ckload.h), for a caller that is not this module: a world of more
    than CKL_MAX_WORLD_SIZE ranks (2**32 - 1 made the balanced share search every rank for
    every blob), a slice rule's dim below -1 (read as whole) or past a tensor's last possible
    dimension, a device that is no enum ckl_device. EINVAL, one line naming the option."""
    lib = ckload.library()
    path = source(tmp_path)
    err = ctypes.create_string_buffer(4096)
    rule = (ckload.Slice * 1)(ckload.Slice(b"enc.w", 0))

    def start(**fields):
        o = ckload.Options()
        lib.ckl_default_options(ctypes.byref(o))
        o.device, o.spelling = ckload.CKL_CPU, ckload.SPELL_PARAMS
        for k, v in fields.items():
            setattr(o, k, v)
        h = ctypes.c_void_p()
        rc = lib.ckl_load_start(os.fsencode(path), ctypes.byref(o), ctypes.byref(h), err,
                                len(err))
        if rc == 0:
            lib.ckl_release(h)
        return rc, ctypes.get_errno(), err.value.decode()

    bound = ckload.BOUNDS["CKL_MAX_WORLD_SIZE"]
    assert start(world_size=bound + 1, rank=0) == (
        -1, errno.EINVAL, f"{path}: world_size={bound + 1}: more than {bound} ranks")
    assert start(world_size=2**32 - 1, rank=5)[:2] == (-1, errno.EINVAL)
    for dim in (-2, 64, -2**31, 2**31 - 1):
        rule[0].dim = dim
        assert start(slices=rule, nslices=1, world_size=2) == (
            -1, errno.EINVAL, f"{path}: slice rule 'enc.w': dim {dim} is not -1 (whole) or a "
                              f"dimension from 0 to 63")
    assert start(device=7) == (-1, errno.EINVAL,
                               f"{path}: device 7: not CPU, CUDA or auto (enum ckl_device)")
    assert start(threads=1000) == (-1, errno.EINVAL,
                                   f"{path}: threads=1000: more than 256 reader threads")
    rule[0].dim = 0
    assert start(slices=rule, nslices=1, world_size=bound, rank=bound - 1)[0] == 0


def test_the_modules_bounds_are_the_librarys():
    """The bounds this module checks its arguments against before they reach a C field are
    ckload.h's, as the library reports them (checked at load: a library that disagrees is
    refused)."""
    lib = ckload.library()
    for name, value in ckload.BOUNDS.items():
        assert lib.ckl_layout(name.encode()) == value, name


def fake_cudart():
    """The CUDA stand-in (tests/fakecuda, `make test-cuda-fake` builds it), or None."""
    given = os.environ.get("CKPTFS_FAKECUDA")
    if given:
        return given
    found = sorted((Path(build_dir()) / "fakecuda").glob("libcudart.so.*[0-9]"))
    return str(found[0]) if found else None


NO_DEVICE = """
import json, sys
import ckload
try:
    ckload.Load(sys.argv[1], device="cuda")
    print(json.dumps(None))
except Exception as e:
    print(json.dumps({"class": type(e).__name__, "msg": str(e),
                      "runtime": isinstance(e, RuntimeError)}))
"""


@pytest.mark.parametrize("spec, reason", [
    ("nodevice", "no CUDA-capable device is detected"),
    ("nodriver", "CUDA driver version is insufficient for CUDA runtime version"),
])
def test_no_device_under_the_cuda_stand_in(tmp_path, spec, reason):
    """No device: ckload.Error, "no CUDA device is visible" with the driver's reason, under the
    CUDA stand-in in a process of its own (its library found as torch's would be)."""
    fake = fake_cudart()
    need(fake, f"no CUDA stand-in in {build_dir()}/fakecuda (`make test` builds it where the "
               f"CUDA toolkit is)")
    path = source(tmp_path)
    env = dict(os.environ, CKLOAD_CUDART=fake, FAKECUDA=spec,
               LD_LIBRARY_PATH=str(Path(fake).parent))
    p = subprocess.run([sys.executable, "-c", NO_DEVICE, str(path)], env=env,
                       capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    assert json.loads(p.stdout) == {
        "class": "Error", "runtime": True,
        "msg": f"ckload: {path}: no CUDA device is visible ({reason})"}
