"""libckload's CUDA branch against the stand-in for the CUDA runtime (tests/fakecuda): loads to
"cuda" from every source kind, from a file and through a mount, read back with cudaMemcpy and
compared with what torch and the safetensors library read; staging variants; two devices;
readiness; every injected failure; DLPack; `ckpt load --device cuda`. After every test nothing
the stand-in counts is live and it saw no violation.

What this cannot show (tests/fakecuda/README.md): DMA, the driver, real speed, and torch's own
CUDA tensors (this torch has no CUDA). `make test-cuda-fake` runs it in a python whose
LD_LIBRARY_PATH finds the stand-in; elsewhere (the main test run, which keeps the real
libcudart) the module is skipped. Seeds vary per run: FAKECUDA_SEED=N replays one."""
import ctypes
import gc
import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import ckload
from ckptfs_testlib import ckpt_bin, run
from test_load import SOURCES, expected_tensors, flip_byte
from test_load_source import strided_source
from test_pack import pack, pack_header, safetensors_source

FAKE_PATH = os.environ.get("CKPTFS_FAKECUDA")
if not FAKE_PATH:
    pytest.skip("runs under the CUDA stand-in only (make test-cuda-fake)", allow_module_level=True)

cudaMemcpyDeviceToHost = 2
kDLCUDA = 2
LIVE = ("device_allocs", "pinned_allocs", "streams", "events")
RUNS = int(os.environ.get("FAKECUDA_RUNS", "10"))

lib = ckload.library()
fake = ctypes.CDLL(FAKE_PATH)
fake.fakecuda_stat.restype, fake.fakecuda_stat.argtypes = ctypes.c_longlong, [ctypes.c_char_p]
fake.fakecuda_configure.argtypes = [ctypes.c_char_p]
fake.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
fake.cudaSetDevice.argtypes = [ctypes.c_int]
fake.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
fake.cudaFree.argtypes = [ctypes.c_void_p]


def loaded_libcudart():
    """The paths of the libcudart objects mapped into this process."""
    return {line.split()[-1] for line in open("/proc/self/maps") if "libcudart" in line}


def stat(name):
    return fake.fakecuda_stat(name.encode())


def configure(spec):
    assert fake.fakecuda_configure(spec.encode()) == 0, spec


def drain_pool():
    """ckload.py keeps one pool of pinned buffers for the process; give them back, so that the
    pinned count says what a load left behind."""
    gc.collect()
    with ckload._lib_lock:
        if ckload._pool is not None:
            lib.ckl_pool_free(ckload._pool)
            ckload._pool = None


def counters():
    return {k: stat(k) for k in LIVE + ("device_bytes", "violations")}


@pytest.fixture(autouse=True)
def seeded():
    """Every test starts from a seeded stand-in (the seed printed, so that pytest shows it with
    a failure) and must leave nothing live and no violation."""
    seed = int(os.environ.get("FAKECUDA_SEED") or random.randrange(1 << 31))
    print(f"fakecuda seed={seed} (FAKECUDA_SEED={seed} replays it)")
    configure(f"seed={seed} delay=0-300")
    yield seed
    drain_pool()
    left = counters()
    configure("")
    assert left == dict.fromkeys(left, 0), f"left behind with seed {seed}: {left}"


# --- reading device memory back ------------------------------------------------------------------

def read_device(ptr, n, ordinal):
    """n bytes at device pointer ptr, by cudaMemcpy device-to-host on device ordinal (the
    calling thread's current device put back after)."""
    if n == 0:
        return b""
    buf, was = ctypes.create_string_buffer(n), ctypes.c_int()
    assert fake.cudaGetDevice(ctypes.byref(was)) == 0
    assert fake.cudaSetDevice(ordinal) == 0
    rc = fake.cudaMemcpy(buf, ptr, n, cudaMemcpyDeviceToHost)
    assert fake.cudaSetDevice(was.value) == 0
    assert rc == 0, f"cudaMemcpy: {rc}"
    return buf.raw


def read_tensor(ld, i):
    name, dtype, shape, nbytes = ld.info(i)
    return name, (dtype, list(shape), read_device(ld.pointer(i), nbytes, int(ld.device[5:])))


def read_all(ld):
    ld.wait_all()
    return dict(read_tensor(ld, i) for i in range(len(ld)))


def load_cuda(path, device="cuda", **kw):
    with ckload.Load(path, device=device, **kw) as ld:
        assert ld.device == (device if ":" in device else "cuda:0")
        return read_all(ld)


def check(got, expected):
    assert set(got) == set(expected)
    for name, want in expected.items():
        assert got[name][:2] == (want[0], list(want[1])), name
        assert got[name][2] == want[2], f"bytes of {name!r} differ"


class Raw:
    """A load through the C API itself, for the options ckload.py leaves at their defaults
    (buffers) and with a pool of its own."""

    def __init__(self, path, **opts):
        self.ordinal = opts.get("cuda_device", 0)
        self.pool = lib.ckl_pool_new()
        o = ckload.Options()
        lib.ckl_default_options(ctypes.byref(o))
        o.device, o.pool = ckload.CKL_CUDA, self.pool
        for k, v in opts.items():
            setattr(o, k, v)
        self.err = ctypes.create_string_buffer(len(str(path)) + ckload.ERR_ROOM)
        self.h = ctypes.c_void_p()
        self.rc = lib.ckl_load_start(os.fsencode(path), ctypes.byref(o), ctypes.byref(self.h),
                                     self.err, len(self.err))

    def wait_all(self):
        return lib.ckl_wait_all(self.h, self.err, len(self.err))

    def read(self):
        out = {}
        for i in range(lib.ckl_count(self.h)):
            t = lib.ckl_get(self.h, i).contents
            out[t.name.decode()] = (t.dtype.decode(), [t.shape[k] for k in range(t.rank)],
                                    read_device(t.data, t.nbytes, self.ordinal))
        return out

    def release(self):
        if self.h:
            lib.ckl_release(self.h)
        lib.ckl_pool_free(self.pool)


# --- the stand-in is what runs -------------------------------------------------------------------

def test_libckload_runs_on_the_stand_in(tmp_path):
    assert loaded_libcudart() == {str(Path(FAKE_PATH).resolve())}
    assert ckload.cuda_built() and ckload.cuda_available()
    with ckload.Load(pack(safetensors_source(tmp_path), tmp_path / "o.pack")) as ld:
        assert ld.device == "cuda:0"  # auto finds the device


def test_the_stand_in_defines_every_cuda_function_libckload_needs():
    """libckload links no libcudart: it looks up by name, at the first CUDA use, the functions
    its table lists (loader/cudart.h); the stand-in defines every one of them."""
    import re
    table = (Path(__file__).parents[2] / "loader" / "cudart.h").read_text()
    need = {"cuda" + n for n in re.findall(r"\(\*(\w+)\)\(", table)}
    assert len(need) >= 18, need
    out = subprocess.run(["nm", "-D", FAKE_PATH], capture_output=True, check=True).stdout.decode()
    have = {ln.split()[-1].split("@")[0] for ln in out.splitlines() if ln.split()[-2] == "T"}
    assert need <= have, need - have
    out = subprocess.run(["nm", "-D", lib._name], capture_output=True, check=True).stdout.decode()
    assert not [ln for ln in out.splitlines() if " U cuda" in ln], "linked against libcudart"


def crashed(p):
    """Whether child p died of a segmentation fault (ASan, where preloaded, reports it itself)."""
    return p.returncode == -signal.SIGSEGV or b"AddressSanitizer: SEGV" in p.stderr


def test_device_memory_cannot_be_touched_by_the_host(tmp_path):
    """A host dereference of a device pointer crashes (the stand-in maps it PROT_NONE), and so
    does refilling a pinned buffer whose copy is still queued: both are run in a child."""
    out = pack(safetensors_source(tmp_path), tmp_path / "o.pack")
    child = ("import ckload, ctypes, sys\n"
             "ld = ckload.Load(sys.argv[1], device='cuda'); ld.wait_all()\n"
             "ctypes.string_at(ld.pointer(0), 1)\n")
    p = subprocess.run([sys.executable, "-c", child, out], capture_output=True, timeout=60)
    assert crashed(p), p.stderr.decode()
    child = ("import ctypes, sys\n"
             "f = ctypes.CDLL(sys.argv[1]); v = ctypes.c_void_p\n"
             "d, h, s = v(), v(), v()\n"
             "f.fakecuda_configure(b'delay=500000-500000')\n"
             "assert f.cudaMalloc(ctypes.byref(d), 4096) == 0\n"
             "assert f.cudaHostAlloc(ctypes.byref(h), 4096, 0) == 0\n"
             "assert f.cudaStreamCreateWithFlags(ctypes.byref(s), 1) == 0\n"
             "assert f.cudaMemcpyAsync(d, h, ctypes.c_size_t(4096), 1, s) == 0\n"
             "ctypes.memset(h, 1, 4096)\n")
    p = subprocess.run([sys.executable, "-c", child, FAKE_PATH], capture_output=True, timeout=60)
    assert crashed(p), p.stderr.decode()


def test_the_stand_in_counts_and_refuses():
    """Its own checks, each provoked once: a pageable async copy is counted; a copy into device
    1's memory from a thread whose current device is 0, an event recorded on another device's
    stream, memory freed while a copy into it is queued, are refused or counted as violations;
    an injected failure returns the function's real error code once; a sticky one every time."""
    v, size = ctypes.c_void_p, ctypes.c_size_t
    configure("devices=2 delay=20000-20000")
    d0, d1, s0, s1, ev1 = v(), v(), v(), v(), v()
    host = ctypes.create_string_buffer(b"x" * 4096)
    assert fake.cudaMalloc(ctypes.byref(d0), size(4096)) == 0
    assert fake.cudaStreamCreateWithFlags(ctypes.byref(s0), 1) == 0
    assert fake.cudaSetDevice(1) == 0
    assert fake.cudaMalloc(ctypes.byref(d1), size(4096)) == 0
    assert fake.cudaStreamCreateWithFlags(ctypes.byref(s1), 1) == 0
    assert fake.cudaEventCreateWithFlags(ctypes.byref(ev1), 2) == 0
    assert fake.cudaSetDevice(0) == 0
    assert fake.cudaMemcpyAsync(d1, host, size(4096), 1, s1) == 101  # cudaErrorInvalidDevice
    assert fake.cudaMemcpyAsync(d1, host, size(4096), 1, s0) == 1  # not device 0's memory
    assert fake.cudaEventRecord(ev1, s0) == 400  # cudaErrorInvalidResourceHandle
    assert stat("violations") == 3
    assert fake.cudaMemcpyAsync(d0, host, size(4096), 1, s0) == 0
    assert fake.cudaMemcpyAsync(d0, host, size(4096), 1, s0) == 0
    assert stat("pageable_copies") == 2 and stat("max_in_flight") == 2
    assert fake.cudaFree(d0) == 0  # waits for the copies, but counts the misuse
    assert stat("violations") == 4 and stat("copies") == 2
    for h in (ev1,):
        assert fake.cudaEventDestroy(h) == 0
    for h in (s0, s1):
        assert fake.cudaStreamDestroy(h) == 0
    assert fake.cudaFree(d1) == 0
    configure("fail=cudaMalloc:2 sticky=cudaSetDevice:2")
    assert fake.cudaMalloc(ctypes.byref(d0), size(64)) == 0
    assert fake.cudaMalloc(ctypes.byref(d1), size(64)) == 2  # cudaErrorMemoryAllocation
    assert (fake.cudaGetLastError(), fake.cudaGetLastError()) == (2, 0)
    assert fake.cudaSetDevice(0) == 0
    assert [fake.cudaSetDevice(0), fake.cudaGetLastError(),
            fake.cudaMalloc(ctypes.byref(d1), size(64))] == [700] * 3  # an illegal address
    assert fake.cudaFree(d0) == 700  # the lost context's error; the stand-in frees it still
    configure("")  # the violations were the point


# --- byte-exact loads ----------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["pack", "source"])
@pytest.mark.parametrize("kind", SOURCES)
def test_file_to_cuda_is_byte_exact(tmp_path, kind, how):
    src = SOURCES[kind](tmp_path)
    path = pack(src, tmp_path / "o.pack") if how == "pack" else src
    check(load_cuda(path, verify=True), expected_tensors(src))


@pytest.mark.parametrize("how", ["vpack", "bypass", "no-bypass"])
@pytest.mark.parametrize("kind", SOURCES)
def test_mount_to_cuda_is_byte_exact(tmp_path, mount, monkeypatch, kind, how):
    src = SOURCES[kind](tmp_path)
    monkeypatch.setenv("CKLOAD_BYPASS", "0" if how == "no-bypass" else "1")
    with mount(src) as mnt:
        got = load_cuda(mnt / ".ckptfs/checkpoint.pack" if how == "vpack" else mnt)
    check(got, expected_tensors(src))


def test_strided_and_tied_tensors_through_staging(tmp_path):
    src = strided_source(tmp_path)
    with ckload.Load(src, device="cuda", threads=3, buffer_size=5000) as ld:
        check(read_all(ld), expected_tensors(src))
        assert ld.pointer(ld.find("tied.a")) == ld.pointer(ld.find("tied.b"))


def test_dest_places_tensors_in_the_callers_device_memory(tmp_path):
    """ckl_options.dest: each tensor lands in device memory the caller allocated, through the
    staging buffers; a tie placed apart gets a device-to-device copy; a skipped tensor is left
    out; the load's own block holds nothing."""
    src = strided_source(tmp_path)
    expected = expected_tensors(src)
    placed = {}

    def dest(ctx, tp, at):
        if not tp:
            return ckload.DEST_BLOCK  # the final call: go on
        t = tp.contents
        name = t.name.decode()
        if name == "head":
            return ckload.DEST_SKIP
        p = ctypes.c_void_p()
        assert fake.cudaMalloc(ctypes.byref(p), t.nbytes) == 0
        placed[name] = (p.value, t.nbytes)
        at[0] = p.value
        return ckload.DEST_AT

    ld = Raw(src, dest=ckload.DEST(dest), threads=3, buffer_size=5000)
    try:
        assert ld.rc == 0 and ld.wait_all() == 0, ld.err.value
        check(ld.read(), {k: v for k, v in expected.items() if k != "head"})
        for i in range(lib.ckl_count(ld.h)):
            t = lib.ckl_get(ld.h, i).contents
            assert t.data == placed[t.name.decode()][0]
        assert stat("device_bytes") - sum(n for _, n in placed.values()) <= 256
    finally:
        ld.release()
        for ptr, _ in placed.values():
            assert fake.cudaFree(ctypes.c_void_p(ptr)) == 0


def many_tensors(d, n=24, seed=5):
    g = torch.Generator().manual_seed(seed)
    path = d / "many.safetensors"
    save_file({f"t.{i}": torch.randn(1000 + 7777 * i, generator=g) for i in range(n)}, str(path))
    return path


@pytest.mark.parametrize("threads,buffers,size",
                         [(1, 1, 4096), (1, 2, 4096), (3, 3, 5000), (4, 2, 65536),
                          (16, 4, 1 << 20), (2, 8, 12288)])
def test_staging_variants(tmp_path, threads, buffers, size):
    src = many_tensors(tmp_path)
    ld = Raw(pack(src, tmp_path / "o.pack"), threads=threads, buffers=buffers,
             buffer_size=size, verify=1)
    try:
        assert ld.rc == 0 and ld.wait_all() == 0, ld.err.value
        check(ld.read(), expected_tensors(src))
        # a buffer is refilled only once its copy ran: never more copies queued than buffers
        assert 1 <= stat("max_in_flight") <= threads * buffers
        assert stat("pageable_copies") == 0
    finally:
        ld.release()


@pytest.mark.parametrize("run", range(RUNS))
def test_seeded_pipeline(tmp_path, seeded, run):
    """The pipeline under a seed's delays and shape: threads, buffers, chunk size, tensor sizes,
    source kind (strided PyTorch views are gathered through the staging buffers), pack or
    source, device 0 or 1 of 2, all drawn from it (make cuda-fake-soak runs hundreds)."""
    r = random.Random(seeded)
    g = torch.Generator().manual_seed(seeded)
    src = tmp_path / "s.safetensors"
    if r.random() < 0.25:
        src = strided_source(tmp_path, n=r.randrange(20, 300))
    else:
        save_file({f"t.{i}": torch.randn(r.randrange(1, 40000), generator=g)
                   for i in range(r.randrange(1, 30))}, str(src))
    path = pack(src, tmp_path / "o.pack") if r.random() < 0.5 else src
    threads, buffers, ordinal = r.randrange(1, 9), r.randrange(1, 5), r.randrange(2)
    configure(f"seed={seeded} devices=2 delay=0-{r.choice([0, 50, 500, 3000])}")
    ld = Raw(path, threads=threads, buffers=buffers, buffer_size=r.choice([4096, 5000, 65536]),
             verify=r.randrange(2), cuda_device=ordinal)
    try:
        assert ld.rc == 0 and ld.wait_all() == 0, ld.err.value
        check(ld.read(), expected_tensors(src))
        assert stat("max_in_flight") <= threads * buffers
        assert stat("pageable_copies") == 0
    finally:
        ld.release()


# --- devices -------------------------------------------------------------------------------------

def test_second_of_two_devices(tmp_path):
    """cuda:1 of 2: the block, the streams and every copy on device 1, from reader threads that
    must each select it; the caller's own current device is left as it was."""
    configure("devices=2")
    src = many_tensors(tmp_path, n=8)
    with ckload.Load(pack(src, tmp_path / "o.pack"), device="cuda:1", threads=3,
                     buffer_size=8192) as ld:
        assert ld.device == "cuda:1"
        assert stat("current_device") == 0  # the caller's device, not the load's
        check(read_all(ld), expected_tensors(src))
        m = lib.ckl_to_dlpack(ld._handle(), 0)
        dev = m.contents.dl_tensor.device
        assert (dev.device_type, dev.device_id) == (kDLCUDA, 1)
        m.contents.deleter(m)


def test_no_device_and_no_driver(tmp_path):
    """No device is a ckload.Error (a RuntimeError) of one line: "no CUDA device is visible",
    with the driver's reason after it."""
    out = pack(safetensors_source(tmp_path), tmp_path / "o.pack")
    for spec, says in [("nodevice", "no CUDA-capable device is detected"),
                       ("nodriver", "CUDA driver version is insufficient for CUDA runtime "
                                    "version")]:
        configure(spec)
        assert not ckload.cuda_available()
        with pytest.raises(ckload.Error) as e:
            ckload.Load(out, device="cuda")
        assert str(e.value) == f"ckload: {out}: no CUDA device is visible ({says})"
        assert isinstance(e.value, RuntimeError)
        assert {t.device.type for t in ckload.load(out).values()} == {"cpu"}  # auto
    configure("devices=2")
    with pytest.raises(ckload.Error) as e:
        ckload.Load(out, device="cuda:2")
    assert str(e.value) == f"ckload: {out}: no CUDA device 2 (2 visible)"


# --- readiness -----------------------------------------------------------------------------------

def test_only_and_readiness_in_order(tmp_path):
    """on_ready fires once per tensor; once ckl_wait(i) returns, tensor i's bytes are on the
    device while later ones may still be queued (cudaMemcpy does not wait for them)."""
    g = torch.Generator().manual_seed(4)
    src = tmp_path / "s.safetensors"
    save_file({f"layers.{i}.w": torch.randn(1 << 14, generator=g) for i in range(30)}, str(src))
    out = pack(src, tmp_path / "o.pack")
    expected = expected_tensors(src)
    check(load_cuda(out, only="layers.1*"),
          {n: expected[n] for n in expected if n.startswith("layers.1")})
    configure("delay=200-2000")
    seen = []
    with ckload.Load(out, device="cuda", threads=2, buffer_size=1 << 14,
                     on_ready=seen.append) as ld:
        for i in range(len(ld)):
            ld.wait(i)
            name, got = read_tensor(ld, i)
            assert got[2] == expected[name][2], name
        ld.wait_all()
        assert sorted(seen) == list(range(len(ld)))


def test_verify_catches_a_flipped_byte_and_leaves_nothing(tmp_path):
    out = pack(safetensors_source(tmp_path), tmp_path / "o.pack")
    flip_byte(out, pack_header(out)["data_offset"] + 1)
    with pytest.raises(RuntimeError, match="checksum"):
        load_cuda(out, verify=True)
    os.truncate(out, pack_header(out)["data_offset"] + 10)
    with pytest.raises(RuntimeError):
        load_cuda(out)


# --- failures ------------------------------------------------------------------------------------

# (spec, whether the load must fail). Each names the nth call of a function this load makes:
# cudaSetDevice 1 selects the block's device, 2 puts the caller's back, 3.. are the readers';
# copies and records come per chunk.
FAULTS = [
    ("fail=cudaGetDeviceCount:1", True), ("fail=cudaGetDevice:1", True),
    ("fail=cudaSetDevice:1", True), ("fail=cudaSetDevice:2", True),
    ("fail=cudaSetDevice:3", True), ("fail=cudaMalloc:1", True),
    ("fail=cudaStreamCreateWithFlags:1", True), ("fail=cudaStreamCreateWithFlags:2", True),
    ("fail=cudaHostAlloc:1", True), ("fail=cudaHostAlloc:4", True),
    ("fail=cudaEventCreateWithFlags:3", True), ("fail=cudaMemcpyAsync:1", True),
    ("fail=cudaMemcpyAsync:7", True), ("fail=cudaEventRecord:5", True),
    ("fail=cudaLaunchHostFunc:2", True), ("fail=cudaEventSynchronize:2", True),
    ("fail=cudaStreamSynchronize:1", False), ("fail=cudaDeviceSynchronize:1", False),
    ("sticky=cudaMemcpyAsync:4", True), ("sticky=cudaEventRecord:2", True),
    ("sticky=cudaEventSynchronize:3", True), ("fault=3", True), ("fault=20", True),
    ("capacity=64K", True),
]


@pytest.mark.parametrize("spec,must_fail", FAULTS, ids=[f[0] for f in FAULTS])
def test_every_failure_is_clean(tmp_path, spec, must_fail):
    """Each injected failure: either every byte right or one clean error ("FILE: ..."), and
    after release nothing live."""
    src = many_tensors(tmp_path, n=10)
    out = pack(src, tmp_path / "o.pack")
    configure(spec + " delay=0-100")
    try:
        got = load_cuda(out, threads=2, buffer_size=16384)
    except RuntimeError as e:
        msg = str(e)
        assert msg.startswith(f"ckload: {out}: ") and "\n" not in msg, msg
        if spec.startswith("capacity"):
            assert "out of device memory" in msg, msg
    else:
        assert not must_fail, "the load succeeded"
        check(got, expected_tensors(src))


@pytest.mark.parametrize("device", ["cuda:0", "cuda:1"])
def test_on_ready_may_use_cuda(tmp_path, device):
    """on_ready(i) may use CUDA, here to read tensor i back, whose bytes are then all there.
    It runs outside the CUDA host function behind the copies, where the runtime forbids CUDA
    calls (the stand-in refuses them, cudaErrorNotPermitted)."""
    configure("devices=2 delay=0-1000")
    src = many_tensors(tmp_path, n=12)
    expected = expected_tensors(src)
    got, ld = {}, None
    ready = threading.Event()

    def on_ready(i):
        ready.wait()
        name, t = read_tensor(ld, i)
        got[name] = t

    ld = ckload.Load(pack(src, tmp_path / "o.pack"), device=device, threads=3,
                     buffer_size=8192, on_ready=on_ready)
    ready.set()
    ld.wait_all()
    ld.release()
    check(got, expected)


# --- DLPack, the module, the tool ----------------------------------------------------------------

def test_dlpack_capsule_says_cuda(tmp_path):
    out = pack(safetensors_source(tmp_path), tmp_path / "o.pack")
    with ckload.Load(out, device="cuda") as ld:
        ld.wait_all()
        i = ld.find("layers.3.w")
        m = lib.ckl_to_dlpack(ld._handle(), i)
        t = m.contents.dl_tensor
        assert (t.device.device_type, t.device.device_id) == (kDLCUDA, 0)
        assert t.data == ld.pointer(i) and t.ndim == 2 and [t.shape[0], t.shape[1]] == [4, 4]
        m.contents.deleter(m)
        # this torch has no CUDA: it refuses the capsule, which the module gives back
        with pytest.raises(Exception):
            ld.tensor(i)
        with pytest.raises(Exception):
            ckload.load(out, device="cuda")


# What DLPack 0.6 calls each dtype (its own header's codes), with the bits it takes.
DL_CODES = {"U8": (1, 8), "U16": (1, 16), "U32": (1, 32), "U64": (1, 64), "I8": (0, 8),
            "I16": (0, 16), "I32": (0, 32), "I64": (0, 64), "F16": (2, 16), "F32": (2, 32),
            "F64": (2, 64), "BF16": (4, 16), "C64": (5, 64), "C128": (5, 128)}


def test_dlpack_of_every_dtype(tmp_path):
    """Each tensor's export: on the device it is on, its dtype as DLPack names it and its
    shape, or raw bytes (kDLUInt 8, [nbytes]) for the types DLPack 0.6 has no code for; the
    bytes it points at are the tensor's. A failed load exports nothing."""
    src = SOURCES["every-dtype"](tmp_path)
    expected = expected_tensors(src)
    with ckload.Load(src, device="cuda") as ld:
        ld.wait_all()
        for i in range(len(ld)):
            name, dtype, shape, nbytes = ld.info(i)
            m = lib.ckl_to_dlpack(ld._handle(), i)
            t = m.contents.dl_tensor
            code, bits = DL_CODES.get(dtype, (1, 8))
            dims = list(shape) if dtype in DL_CODES else [nbytes]
            assert (t.device.device_type, t.device.device_id) == (kDLCUDA, 0), name
            assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (code, bits, 1), name
            assert [t.shape[k] for k in range(t.ndim)] == dims, name
            assert read_device(t.data, nbytes, 0) == expected[name][2], name
            m.contents.deleter(m)
        assert not lib.ckl_to_dlpack(ld._handle(), len(ld))
    configure("fail=cudaMemcpyAsync:1")
    with ckload.Load(src, device="cuda") as ld:
        assert not lib.ckl_to_dlpack(ld._handle(), 0)


def test_ckpt_load_to_cuda(tmp_path, seeded):
    src = many_tensors(tmp_path, n=6)
    out = pack(src, tmp_path / "o.pack")
    stats = tmp_path / "stats"
    for args, spec, code in [(["--device", "cuda", "--verify"], "", 0),
                             (["--device", "cuda:1", "--threads", "3", "--buffers", "3",
                               "--buffer-size", "8K"], "devices=2", 0),
                             (["--device", "cuda"], "capacity=64K", 1),
                             (["--device", "cuda"], "nodevice", 1)]:
        env = dict(os.environ, FAKECUDA=f"seed={seeded} stats={stats} {spec}")
        p = run([ckpt_bin(), "load", out, *args], env=env, timeout=120)
        assert p.returncode == code, p.stderr
        if code == 0:
            assert f" into {args[1] if ':' in args[1] else 'cuda:0'} in " in p.stdout.decode()
        else:
            assert p.stderr.decode().startswith("ckpt: ") and p.stderr.count(b"\n") == 1
        left = dict(line.split() for line in stats.read_text().splitlines())
        assert all(left[k] == "0" for k in LIVE + ("violations",)), (args, spec, left)
        assert code or int(left["copies"]) > 0


# --- a lost context leaks nothing ---------------------------------------------------------------

def leak_checked(cmd):
    """(cmd, env) that run cmd under a leak checker: ASan's where the build has it, else
    valgrind's memcheck."""
    env = dict(os.environ)
    syms = subprocess.run(["nm", str(cmd[0])], capture_output=True).stdout
    if b"__asan_init" in syms:
        env["ASAN_OPTIONS"] = "detect_leaks=1"
        return cmd, env
    return ["valgrind", "-q", "--leak-check=full", "--errors-for-leak-kinds=definite",
            "--show-leak-kinds=definite", "--error-exitcode=99", *cmd], env


@pytest.mark.parametrize("spec", ["fault=2", "sticky=cudaEventSynchronize:2",
                                  "fail=cudaStreamSynchronize:1"])
def test_a_lost_context_leaks_nothing(tmp_path, spec):
    """In a lost context the runtime drops the host functions queued behind the copies instead
    of running them (cuLaunchHostFunc's documentation says so), so what they were to free must
    be freed by whoever queued them: `ckpt load` under a leak checker, one clean line."""
    out = pack(many_tensors(tmp_path, n=6), tmp_path / "o.pack")
    cmd, env = leak_checked([ckpt_bin(), "load", out, "--device", "cuda", "--threads", "2",
                             "--buffer-size", "16K"])
    env["FAKECUDA"] = spec + " delay=100-1000"
    p = run(cmd, env=env, timeout=300)
    err = p.stderr.decode()
    assert p.returncode in (0, 1), err
    assert "LeakSanitizer" not in err and "definitely lost" not in err, err
    assert p.returncode == 0 or (err.startswith("ckpt: ") and err.count("\n") == 1), err
