"""libckload's two read engines for a cold host load: io_uring (many O_DIRECT reads in flight
from one thread, for the blobs that land in place) and the reader threads (everything else, and
every blob where io_uring is refused or CKLOAD_URING=0). Both give bytes equal to torch's and
the safetensors library's, for every source kind; io_uring refused by a seccomp filter (as
Docker's default profile does) falls back to the threads, unless CKLOAD_URING=1 asks for it; a
hot load needs no ring; a read failing mid-flight is one clear error and leaves nothing behind."""
import ctypes
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import save_file

import ckload
from ckptfs_testlib import need, torch_bytes
from test_load import check_load, expected_tensors, flip_byte, load_error
from test_pack import pack, pack_header, safetensors_source, sharded_source, torch_source

SOURCES = {
    "safetensors": safetensors_source,
    "sharded": sharded_source,
    "zip": torch_source,
    "legacy": lambda d: torch_source(d, _use_new_zipfile_serialization=False),
}


def direct_io_works(d):
    """Whether files in d open O_DIRECT (tmpfs refuses it: then no load reads so)."""
    probe = d / "probe"
    probe.write_bytes(b"\0" * 4096)
    try:
        os.close(os.open(probe, os.O_RDONLY | os.O_DIRECT))
        return True
    except OSError:
        return False
    finally:
        probe.unlink()


def ring_refused():
    """Why this machine refuses io_uring (a kernel without it, or a container whose seccomp
    profile blocks it), or None: there only the fallback can be tested, and a load that demands
    the ring (CKLOAD_URING=1) must fail, as test_io_uring_refused_falls_back_to_the_threads shows."""
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)  # struct io_uring_params
    fd = libc.syscall(425, 1, params)           # io_uring_setup (x86_64 and aarch64)
    if fd < 0:
        return os.strerror(ctypes.get_errno())
    os.close(fd)
    return None


def use_engine(monkeypatch, engine):
    if engine == "1":
        refused = ring_refused()
        need(not refused, f"io_uring refused on this machine: {refused} (a seccomp profile "
                          f"or a kernel without it)")
    monkeypatch.setenv("CKLOAD_URING", engine)


@pytest.fixture
def cold(tmp_path, monkeypatch):
    """Loads from tmp_path read O_DIRECT, as a cold load does (CKLOAD_DIRECT=1)."""
    need(direct_io_works(tmp_path), f"O_DIRECT is refused under {tmp_path} (a tmpfs?)")
    monkeypatch.setenv("CKLOAD_DIRECT", "1")


def big_source(d, n=24, elems=40000):
    """A safetensors file of n float32 tensors of odd lengths, so that most start and end inside
    a page: partial first and last pages, whole pages between."""
    g = torch.Generator().manual_seed(31)
    src = d / "big.safetensors"
    save_file({f"layers.{i}.w": torch.randn(elems + 97 * i, generator=g) for i in range(n)},
              str(src))
    return src


# --- both engines, byte-exact --------------------------------------------------------------------

@pytest.mark.parametrize("engine", ["1", "0"])
@pytest.mark.parametrize("kind", sorted(SOURCES))
@pytest.mark.parametrize("packed", [True, False], ids=["pack", "source"])
def test_both_engines_are_byte_exact(tmp_path, cold, monkeypatch, engine, kind, packed):
    src = SOURCES[kind](tmp_path)
    path = pack(src, tmp_path / "out.pack") if packed else src
    use_engine(monkeypatch, engine)
    check_load(ckload.load(path, device="cpu", verify=True), expected_tensors(src))


@pytest.mark.parametrize("engine", ["1", "0"])
@pytest.mark.parametrize("buffer_size", [4096, 12288, 1 << 20])
def test_more_reads_than_the_ring_holds(tmp_path, cold, monkeypatch, engine, buffer_size):
    """Small reads: a blob takes many of them, far more than the ring has slots, so slots are
    reused while others are in flight; each blob's checksum is taken once all its reads are in."""
    src = big_source(tmp_path)
    out = pack(src, tmp_path / "out.pack")
    use_engine(monkeypatch, engine)
    for path in (out, src):
        check_load(ckload.load(path, device="cpu", buffer_size=buffer_size, verify=True),
                   expected_tensors(src))


@pytest.mark.parametrize("engine", ["1", "0"])
def test_ring_and_threads_share_a_load(tmp_path, cold, monkeypatch, engine):
    """With `only`, most selected blobs lose the file's phase in the block: the threads read those
    through their bounce while the ring reads the blobs that kept it; tensors still land in pack
    order for on_ready and wait."""
    g = torch.Generator().manual_seed(13)
    src = tmp_path / "s.safetensors"
    save_file({f"{'ab'[i % 2]}.{i}": torch.randn(700 + 2345 * i, generator=g) for i in range(16)},
              str(src))
    out = pack(src, tmp_path / "out.pack")
    use_engine(monkeypatch, engine)
    ready = []
    ld = ckload.Load(out, device="cpu", only="a", buffer_size=8192, verify=True,
                     on_ready=ready.append)
    with ld:
        for i in range(len(ld)):
            ld.wait(i)
        ld.wait_all()
        assert sorted(ready) == list(range(len(ld)))
        got = {ld.name(i): ld.tensor(i) for i in range(len(ld))}
    check_load(got, {k: v for k, v in expected_tensors(src).items() if k.startswith("a.")})


def test_verify_catches_a_flipped_byte_read_through_the_ring(tmp_path, cold, monkeypatch):
    src = big_source(tmp_path, n=6)
    out = pack(src, tmp_path / "out.pack")
    flip_byte(out, pack_header(out)["data_offset"] + 3 * 4096 + 7)
    use_engine(monkeypatch, "1")
    msg = load_error(out, device="cpu", verify=True)
    assert "checksum mismatch" in msg and "layers." in msg, msg
    got = torch_bytes(ckload.load(out, device="cpu", buffer_size=4096)["layers.0.w"])
    want = expected_tensors(src)["layers.0.w"][2]
    assert [i for i in range(len(want)) if got[i] != want[i]] == [3 * 4096 + 7]


# --- a read failing mid-flight -------------------------------------------------------------------

def open_fds():
    return sorted(os.listdir("/proc/self/fd"))


def threads():
    return len(os.listdir("/proc/self/task"))


@pytest.mark.parametrize("engine", ["1", "0"])
def test_source_truncated_while_reading(tmp_path, cold, monkeypatch, engine):
    """The pack is cut short once its first tensor has landed: the reads past the new end come
    back short, then empty. One error naming a tensor and the failure; once released, no
    descriptor (the ring's included) and no thread is left."""
    src = big_source(tmp_path, n=64)
    out = pack(src, tmp_path / "out.pack")
    keep = pack_header(out)["data_offset"] + (1 << 20) + 100
    use_engine(monkeypatch, engine)
    fds, nthreads = open_fds(), threads()

    def cut(i):
        if os.path.getsize(out) > keep:
            os.truncate(out, keep)
    ld = ckload.Load(out, device="cpu", buffer_size=4096, on_ready=cut)
    with pytest.raises(RuntimeError) as e:
        ld.wait_all()
    msg = str(e.value)
    assert msg.startswith(f"ckload: {out}: cannot read tensor 'layers."), msg
    assert os.strerror(5) in msg and "\n" not in msg, msg
    with pytest.raises(RuntimeError):
        ld.tensor(len(ld) - 1)
    ld.release()
    del ld
    assert open_fds() == fds
    assert threads() == nthreads


# --- io_uring refused: a seccomp filter, as in a container -----------------------------------------

# Run in a python of its own: a seccomp filter cannot be taken back. The filter answers
# io_uring_setup (425 on every Linux architecture) with an errno and lets everything else through.
SECCOMP_LOAD = textwrap.dedent("""
    import ctypes, os, struct, sys
    import ckload, torch
    from safetensors.torch import load_file
    errno_, path, src = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    def insn(code, k, jt=0, jf=0):
        return struct.pack("HBBI", code, jt, jf, k)
    prog = b"".join([insn(0x20, 0),                     # A = syscall number
                     insn(0x15, 425, 0, 1),             # io_uring_setup?
                     insn(0x06, 0x00050000 | errno_),   # SECCOMP_RET_ERRNO
                     insn(0x06, 0x7fff0000)])           # SECCOMP_RET_ALLOW
    buf = ctypes.create_string_buffer(prog)
    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    fprog = Fprog(len(prog) // 8, ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(38, 1, 0, 0, 0) == 0                                  # NO_NEW_PRIVS
    assert libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0, ctypes.get_errno()  # FILTER
    try:
        sd = ckload.load(path, device="cpu", verify=True)
    except RuntimeError as e:
        print(e)
        sys.exit(1)
    want = load_file(src)
    assert set(sd) == set(want)
    for k, t in want.items():
        assert sd[k].view(-1).view(torch.uint8).equal(t.view(-1).view(torch.uint8)), k
    print("same bytes")
""")


def load_under_seccomp(errno_, path, src, **env):
    e = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", SECCOMP_LOAD, str(errno_), str(path), str(src)],
                          env=e, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("errno_", [38, 1], ids=["ENOSYS", "EPERM"])
@pytest.mark.parametrize("packed", [True, False], ids=["pack", "source"])
def test_io_uring_refused_falls_back_to_the_threads(tmp_path, cold, errno_, packed):
    src = big_source(tmp_path)
    path = pack(src, tmp_path / "out.pack") if packed else src
    p = load_under_seccomp(errno_, path, src)
    assert (p.returncode, p.stdout) == (0, "same bytes\n"), p.stderr
    p = load_under_seccomp(errno_, path, src, CKLOAD_URING="0")
    assert (p.returncode, p.stdout) == (0, "same bytes\n"), p.stderr
    # Asked for, the ring is an error where it cannot be had: so the run above did without it.
    p = load_under_seccomp(errno_, path, src, CKLOAD_URING="1")
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert p.stdout == f"ckload: {path}: cannot set up io_uring (CKLOAD_URING=1): " \
                       f"{os.strerror(errno_)}\n"


def test_hot_load_needs_no_ring(tmp_path):
    """A file in the page cache is read through it (direct_pays), by the threads: the ring is
    not even set up, so a load that demands it succeeds where io_uring is refused."""
    src = big_source(tmp_path)
    out = pack(src, tmp_path / "out.pack")
    for path in (out, src):
        with open(path, "rb") as f:
            while f.read(1 << 20):
                pass
        p = load_under_seccomp(1, path, src, CKLOAD_URING="1")
        assert (p.returncode, p.stdout) == (0, "same bytes\n"), p.stderr
