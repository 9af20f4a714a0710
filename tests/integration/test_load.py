"""libckload on the host target, through the Python module `ckload` and `ckpt load`: packs made
from every source kind, read from a pack file and from a mount's virtual checkpoint.pack, are
byte-exact against torch.load and the safetensors library; tensors are handed to torch through
DLPack without copies and live as long as the last of them; every error path refuses cleanly."""
import gc
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import ckload
from ckptfs_testlib import (DTYPE_NAMES, ckpt_bin, flatten, library_view, run, torch_bytes,
                            write_safetensors)
from test_pack import (pack, pack_header, safetensors_source, sharded_source, torch_source)
from test_torch import every_dtype

TORCH_DTYPE = {name: dt for dt, name in DTYPE_NAMES.items()}


def expected_tensors(src):
    """{name: (dtype, shape, bytes)} of the tensors in src, read by torch (a .pt) or by the
    safetensors library (a .safetensors file or a shard directory)."""
    if src.is_dir() or src.suffix == ".safetensors":
        return library_view(src)[0]
    out = {}
    for name, ent in flatten(torch.load(src, map_location="cpu", weights_only=False)).items():
        if ent[0] == "tensor":
            out[name] = ent[1:]
    return out


def check_load(sd, expected):
    assert list(sd) == sorted(sd, key=natural_key), "not in natural name order"
    assert set(sd) == set(expected)
    for name, (dtype, shape, data) in expected.items():
        t = sd[name]
        assert t.device.type == "cpu"
        assert t.dtype == TORCH_DTYPE[dtype], (name, t.dtype, dtype)
        assert list(t.shape) == list(shape), (name, t.shape, shape)
        assert torch_bytes(t) == data, f"bytes of {name!r} differ"


def natural_key(name):
    import re
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name)]


SOURCES = {
    "zip": lambda d: torch_source(d),
    "legacy": lambda d: torch_source(d, _use_new_zipfile_serialization=False),
    "protocol4": lambda d: torch_source(d, pickle_protocol=4),
    "every-dtype": lambda d: every_dtype_source(d),
    "safetensors": safetensors_source,
    "sharded": sharded_source,
}


def every_dtype_source(d):
    path = d / "dtypes.pt"
    torch.save(every_dtype(), path)
    return path


# --- byte-exact loads ----------------------------------------------------------------------------

@pytest.mark.parametrize("kind", SOURCES)
def test_pack_file_loads_byte_exact(tmp_path, kind):
    src = SOURCES[kind](tmp_path)
    out = pack(src, tmp_path / "out.pack")
    check_load(ckload.load(out, device="cpu"), expected_tensors(src))


@pytest.mark.parametrize("kind", SOURCES)
def test_virtual_pack_loads_byte_exact(tmp_path, mount, kind):
    src = SOURCES[kind](tmp_path)
    with mount(src) as mnt:
        sd = ckload.load(mnt / ".ckptfs/checkpoint.pack", device="cpu", verify=True)
    check_load(sd, expected_tensors(src))  # the tensors outlive the mount: they were copied in


@pytest.mark.parametrize("name", ["candle_fortran_tensor_3d.pth", "tinypellm_pytorch_model.bin",
                                  "graykode_mnist_cnn_legacy.pt", "candle_test_with_key.pt",
                                  "peft_gpt2_adapter_model.safetensors",
                                  "safetensors_cpp_model.safetensors"])
def test_corpus_loads_byte_exact(tmp_path, corpus, mount, name):
    out = pack(corpus / name, tmp_path / "out.pack")
    expected = expected_tensors(corpus / name)
    check_load(ckload.load(out, device="cpu", verify=True), expected)
    with mount(corpus / name) as mnt:
        check_load(ckload.load(mnt / ".ckptfs/checkpoint.pack", device="cpu"), expected)


@pytest.mark.parametrize("kind", ["zip", "sharded"])
@pytest.mark.parametrize("window", [1, 4096, 1 << 30])
def test_stream_hands_out_every_tensor_in_pack_order(tmp_path, kind, window):
    """ckload.stream: the same tensors and bytes as load, in its order, whatever the window
    (1 byte: one tensor a window; 1 GiB: one window)."""
    src = SOURCES[kind](tmp_path)
    got = list(ckload.stream(src, device="cpu", window=window))
    assert [name for name, _ in got] == list(ckload.load(src, device="cpu"))
    check_load(dict(got), expected_tensors(src))


STREAM_PEAK = """
import sys, ckload

def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(key))

with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) starts again from here, after torch's import
base = status("VmRSS:")
if sys.argv[2] == "stream":
    for name, t in ckload.stream(sys.argv[1], device="cpu", window=int(sys.argv[3])):
        t.sum()  # touched, then dropped as a consumer that copies it would
else:
    sd = ckload.load(sys.argv[1], device="cpu")
print(status("VmHWM:") - base)
"""


def test_stream_holds_one_window_at_a_time(tmp_path):
    """Streaming 256 MiB in 16 MiB windows, dropping each tensor, grows the process by about a
    window or two; loading it whole grows it by the whole checkpoint."""
    mib = 1 << 20
    src = write_safetensors(tmp_path / "big.safetensors",
                            [(f"w{i}", "F32", [4 * mib // 4], bytes(4 * mib)) for i in range(64)])
    grown = {}
    for how in ("stream", "load"):
        p = subprocess.run([sys.executable, "-c", STREAM_PEAK, str(src), how, str(16 * mib)],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        grown[how] = int(p.stdout.split()[-1])  # KiB
    assert grown["load"] >= 256 * 1024
    assert grown["stream"] < 64 * 1024, grown


def test_stream_refuses_a_window_of_nothing(tmp_path):
    src = SOURCES["zip"](tmp_path)
    with pytest.raises(ValueError, match="window"):
        next(ckload.stream(src, device="cpu", window=0))


@pytest.mark.parametrize("names,error,says", [
    ("ab", TypeError, "names='ab': expected an iterable of tensor names, not one string"),
    (["a", 7], TypeError, "names: 7 is not a str (a tensor name)"),
    (["nope", "a", "also.nope"], KeyError, "names: no tensor 'nope'"),
])
def test_stream_refuses_names_it_cannot_take(tmp_path, names, error, says):
    """names: a str is not taken as its characters (tensors "a" and "b" exist), a non-str item
    and an unknown name are refused, the first unknown named, before any tensor is handed out."""
    src = tmp_path / "ab.safetensors"
    save_file({"a": torch.ones(2), "b": torch.zeros(3)}, str(src))
    with pytest.raises(error) as e:
        next(ckload.stream(src, device="cpu", names=names))
    assert e.value.args[0] == f"ckload: {src}: {says}" + \
        (" among those selected" if error is KeyError else ""), e.value.args[0]
    assert dict(ckload.stream(src, device="cpu", names=["b"])).keys() == {"b"}


@pytest.mark.parametrize("verify", [False, True])
@pytest.mark.parametrize("how", ["replaced", "rewritten"])
def test_stream_refuses_a_source_changed_between_windows(tmp_path, verify, how):
    """A file replaced (a new inode renamed over it) or rewritten in place between two windows
    of one stream: the next window raises Error naming the source, never hands out tensors of
    the other checkpoint; the tensors before it are the first checkpoint's (safetensors')."""
    from safetensors.torch import load_file
    src, other = tmp_path / "m.safetensors", tmp_path / "other.safetensors"
    save_file({f"w{i}": torch.full((64,), float(i)) for i in range(4)}, str(src))
    save_file({f"w{i}": torch.full((64,), -1.0) for i in range(4)}, str(other))
    want = load_file(str(src))
    it = ckload.stream(src, device="cpu", window=256, verify=verify)  # one tensor a window
    name, t = next(it)
    assert torch.equal(t, want[name])
    if how == "replaced":
        os.replace(other, src)
    else:
        st = src.stat()
        src.write_bytes(other.read_bytes())
        os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
    with pytest.raises(ckload.Error) as e:
        next(it)
    assert str(e.value) == (f"ckload: {src}: changed while streamed: its files are not those "
                            f"its tensors were listed from (device, inode, size, mtime)")


@pytest.mark.parametrize("threads,buffer_size", [(1, 4096), (3, 5000), (16, 1 << 20)])
def test_threads_and_buffer_sizes(tmp_path, threads, buffer_size):
    g = torch.Generator().manual_seed(5)
    src = tmp_path / "s.safetensors"
    save_file({f"t.{i}": torch.randn(1000 + 777 * i, generator=g) for i in range(20)}, str(src))
    out = pack(src, tmp_path / "out.pack")
    sd = ckload.load(out, device="cpu", threads=threads, buffer_size=buffer_size, verify=True)
    check_load(sd, expected_tensors(src))


@pytest.mark.parametrize("direct", ["0", "1"])
def test_direct_io_and_page_cache_paths_agree(tmp_path, monkeypatch, direct):
    """CKLOAD_DIRECT forces O_DIRECT (whole pages straight into the block, a tensor's partial
    first and last pages through a bounce buffer) or the page cache; both give the same bytes,
    also for tensors that do not start or end on a 4096 boundary."""
    g = torch.Generator().manual_seed(9)
    src = tmp_path / "s.safetensors"
    save_file({f"t.{i}": torch.randn(3 + 1531 * i, generator=g) for i in range(12)}, str(src))
    out = pack(src, tmp_path / "out.pack")
    monkeypatch.setenv("CKLOAD_DIRECT", direct)
    check_load(ckload.load(out, device="cpu", buffer_size=8192, verify=True),
               expected_tensors(src))


@pytest.mark.parametrize("threads", [1, 3])
def test_direct_io_out_of_phase_falls_back_to_the_bounce(tmp_path, monkeypatch, threads):
    """With `only`, the selected blobs sit tight in the block while the pack keeps the others
    between them, so most lose the file's 4096-byte phase: O_DIRECT cannot read them straight
    into place and goes through the bounce buffer. In and out of phase, every byte is right."""
    g = torch.Generator().manual_seed(13)
    src = tmp_path / "s.safetensors"
    save_file({f"{'ab'[i % 2]}.{i}": torch.randn(700 + 2345 * i, generator=g) for i in range(16)},
              str(src))
    out = pack(src, tmp_path / "out.pack")
    monkeypatch.setenv("CKLOAD_DIRECT", "1")
    expected = {k: v for k, v in expected_tensors(src).items() if k.startswith("a.")}
    check_load(ckload.load(out, device="cpu", only="a", threads=threads, buffer_size=12288,
                           verify=True), expected)


@pytest.mark.parametrize("huge", ["0", "1"])
@pytest.mark.parametrize("direct", ["0", "1"])
def test_page_size_choice_gives_the_same_bytes(tmp_path, monkeypatch, huge, direct):
    """CKLOAD_HUGEPAGES=0 gives the host block 4 KiB pages, 1 (the default) 2 MiB pages where
    the kernel has them; a block of several huge pages comes out the same either way."""
    g = torch.Generator().manual_seed(21)
    src = tmp_path / "s.safetensors"
    save_file({f"t.{i}": torch.randn((1 << 19) + 333 * i, generator=g) for i in range(5)},
              str(src))
    out = pack(src, tmp_path / "out.pack")
    monkeypatch.setenv("CKLOAD_HUGEPAGES", huge)
    monkeypatch.setenv("CKLOAD_DIRECT", direct)
    check_load(ckload.load(out, device="cpu", verify=True), expected_tensors(src))


def test_types_this_torch_lacks_come_as_bytes(tmp_path):
    """Every safetensors dtype: the ones torch has come typed, the others as uint8 bytes laid
    out as the module's docstring says; Load.info always tells the pack's dtype and shape."""
    from ckptfs_testlib import DTYPE_BITS, numel
    g = torch.Generator().manual_seed(2)
    tensors = []
    for i, (dtype, bits) in enumerate(sorted(DTYPE_BITS.items())):
        shape = [2, 4] if bits % 8 == 0 else [4, 4]  # sub-byte: a whole number of bytes
        n = numel(shape) * bits // 8
        data = torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8).numpy().tobytes()
        if dtype == "BOOL":
            data = bytes(b & 1 for b in data)
        tensors.append((f"x.{i}.{dtype}", dtype, shape, data))
    src = write_safetensors(tmp_path / "all.safetensors", tensors)
    out = pack(src, tmp_path / "out.pack")
    expected = library_view(src)[0]
    with ckload.Load(out, device="cpu") as ld:
        ld.wait_all()
        for i in range(len(ld)):
            name, dtype, shape, nbytes = ld.info(i)
            want_dtype, want_shape, data = expected[name]
            assert (dtype, list(shape), nbytes) == (want_dtype, want_shape, len(data))
            t = ld.tensor(i)
            assert torch_bytes(t) == data, name
            if dtype in TORCH_DTYPE:
                assert (t.dtype, list(t.shape)) == (TORCH_DTYPE[dtype], want_shape)
            elif getattr(torch, {"U16": "uint16", "U32": "uint32", "U64": "uint64"}
                         .get(dtype, "-"), None) is None and dtype[0] == "U":
                assert t.dtype == torch.uint8
                assert list(t.shape) == want_shape + [DTYPE_BITS[dtype] // 8]
            elif DTYPE_BITS[dtype] < 8:
                assert (t.dtype, list(t.shape)) == (torch.uint8, [len(data)])


def test_only_loads_a_subset(tmp_path):
    src = safetensors_source(tmp_path)
    out = pack(src, tmp_path / "out.pack")
    expected = expected_tensors(src)
    for only, names in [("layers.1", {"layers.1.w"}),
                        ("layers.1*", {n for n in expected if n.startswith("layers.1")}),
                        ("embed", {"embed"})]:
        sd = ckload.load(out, device="cpu", only=only)
        check_load(sd, {n: expected[n] for n in names})


# --- zero copy, lifetime, readiness ---------------------------------------------------------------

def mapped(addr):
    """Whether addr is inside a mapping of this process."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                return True
    return False


def test_tensors_are_views_into_one_block(tmp_path):
    src = torch_source(tmp_path)
    out = pack(src, tmp_path / "out.pack")
    with ckload.Load(out, device="cpu") as ld:
        ld.wait_all()
        tensors = [ld.tensor(i) for i in range(len(ld))]
        for i, t in enumerate(tensors):
            if t.numel():  # torch says 0 for the address of an empty tensor
                assert t.data_ptr() == ld.pointer(i), "a copy was made"
                assert t.data_ptr() % 256 == 0
        a, b = tensors[ld.find("tied.a")], tensors[ld.find("tied.b")]
        assert a.data_ptr() == b.data_ptr()  # stored once in the pack, loaded once
        assert ld.find("no.such.tensor") == -1


def test_memory_lives_as_long_as_the_last_tensor(tmp_path):
    src = safetensors_source(tmp_path)
    out = pack(src, tmp_path / "out.pack")
    expected = expected_tensors(src)
    sd = ckload.load(out, device="cpu")
    keep = sd["layers.11.w"]
    addr = keep.data_ptr()
    del sd
    gc.collect()
    assert mapped(addr)
    assert torch_bytes(keep) == expected["layers.11.w"][2]
    del keep
    gc.collect()
    assert not mapped(addr), "the block outlived every tensor"


def test_released_load_keeps_exported_tensors(tmp_path):
    src = safetensors_source(tmp_path)
    out = pack(src, tmp_path / "out.pack")
    ld = ckload.Load(out, device="cpu")
    t = ld.tensor(ld.find("embed"))
    ld.release()
    with pytest.raises(ValueError):
        len(ld)
    assert torch_bytes(t) == expected_tensors(src)["embed"][2]


def test_on_ready_and_wait(tmp_path):
    g = torch.Generator().manual_seed(4)
    src = tmp_path / "s.safetensors"
    t = {f"layers.{i}.w": torch.randn(5000, generator=g) for i in range(30)}
    t["layers.3.empty"] = torch.zeros(0, 5)  # no bytes: ready at once, still announced
    save_file(t, str(src))
    out = pack(src, tmp_path / "out.pack")
    seen, lock = [], threading.Lock()

    def ready(i):
        with lock:
            seen.append(i)

    ld = ckload.Load(out, device="cpu", threads=3, buffer_size=4096, on_ready=ready)
    ld.wait(0)
    first = ld.tensor(0)  # usable before the rest is in
    ld.wait_all()
    assert sorted(seen) == list(range(len(ld)))
    total = sum(len(t[2]) for t in expected_tensors(src).values())
    assert ld.done_bytes() == ld.total_bytes() == total
    assert torch_bytes(first) == expected_tensors(src)["layers.0.w"][2]
    ld.release()


def test_auto_picks_what_is_there(tmp_path):
    out = pack(safetensors_source(tmp_path), tmp_path / "out.pack")
    sd = ckload.load(out)  # device="auto"
    want = "cuda" if ckload.cuda_available() else "cpu"
    assert {t.device.type for t in sd.values()} == {want}


# --- errors --------------------------------------------------------------------------------------

def load_error(path, raises=None, **kw):
    """ckload.load(path, **kw)'s one-line message, once it has raised raises (ckload.Error
    unless said: a RuntimeError, so code that catches RuntimeError still does)."""
    with pytest.raises(raises or ckload.Error) as e:
        ckload.load(path, **kw)
    msg = str(e.value)
    assert msg.startswith(f"ckload: {path}"), msg
    assert "\n" not in msg
    return msg


def ckpt_load(*args, timeout=120, **kw):
    return run([ckpt_bin(), "load", *args], timeout=timeout, **kw)


def one_line(p, code=1):
    err = p.stderr.decode()
    assert p.returncode == code, (p.returncode, err)
    assert err.startswith("ckpt: ") and err.count("\n") == 1, err
    assert p.stdout == b""
    return err


def flip_byte(path, at):
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x40]))


def test_missing_file(tmp_path):
    msg = load_error(tmp_path / "none.pack", FileNotFoundError, device="cpu")
    assert os.strerror(2) in msg
    one_line(ckpt_load(tmp_path / "none.pack"))


@pytest.mark.parametrize("cut", ["data", "trailer", "index"])
def test_truncated_pack(tmp_path, cut):
    out = pack(safetensors_source(tmp_path), tmp_path / "out.pack")
    h = pack_header(out)
    keep = {"data": h["data_offset"] + 100, "trailer": h["checksum_offset"] + 4,
            "index": h["index_offset"] + 10}[cut]
    os.truncate(out, keep)
    load_error(out, device="cpu")
    one_line(ckpt_load(out, "--device", "cpu"))


def test_flipped_data_byte_is_caught_by_verify(tmp_path):
    src = safetensors_source(tmp_path)
    out = pack(src, tmp_path / "out.pack")
    listed = run([ckpt_bin(), "ls", "--json", out])
    import json
    victim = next(t for t in json.loads(listed.stdout)["tensors"] if t["name"] == "layers.7.w")
    flip_byte(out, victim["offset"] + 5)
    msg = load_error(out, device="cpu", verify=True)
    assert "layers.7.w" in msg and "checksum" in msg, msg
    assert "layers.7.w" in one_line(ckpt_load(out, "--device", "cpu", "--verify"))
    # Without verify the bytes come as stored: exactly that byte differs.
    got = torch_bytes(ckload.load(out, device="cpu")["layers.7.w"])
    want = expected_tensors(src)["layers.7.w"][2]
    assert [i for i in range(len(want)) if got[i] != want[i]] == [5]


def test_after_a_failure_nothing_is_handed_out(tmp_path):
    out = pack(safetensors_source(tmp_path), tmp_path / "out.pack")
    h = pack_header(out)
    flip_byte(out, h["data_offset"])  # the first blob
    ld = ckload.Load(out, device="cpu", verify=True, threads=1)
    with pytest.raises(RuntimeError):
        ld.wait_all()
    for i in range(len(ld)):
        with pytest.raises(RuntimeError):
            ld.tensor(i)
    ld.release()


def test_corrupt_checksum_table(tmp_path):
    out = pack(safetensors_source(tmp_path), tmp_path / "out.pack")
    flip_byte(out, pack_header(out)["checksum_offset"] + 3)
    assert "checksum table is corrupt" in load_error(out, device="cpu", verify=True)
    ckload.load(out, device="cpu")  # the table is read only to verify


def test_corrupt_header(tmp_path):
    out = pack(safetensors_source(tmp_path), tmp_path / "out.pack")
    flip_byte(out, 0)
    load_error(out, device="cpu")
    one_line(ckpt_load(out))


def test_only_that_selects_nothing(tmp_path):
    out = pack(safetensors_source(tmp_path), tmp_path / "out.pack")
    assert "selects nothing" in load_error(out, ValueError, device="cpu", only="nothing.*")
    assert "selects nothing" in one_line(ckpt_load(out, "--only", "zzz"))


def test_cuda_without_a_device(tmp_path):
    """On a machine without a usable GPU (CI), asking for CUDA is one clear error; where there is
    one, the same call loads there (tests/gpu checks those bytes)."""
    out = pack(safetensors_source(tmp_path), tmp_path / "out.pack")
    if ckload.cuda_available():
        assert all(t.is_cuda for t in ckload.load(out, device="cuda:0").values())
    else:
        msg = load_error(out, device="cuda:0")
        assert "CUDA" in msg, msg
        assert "CUDA" in one_line(ckpt_load(out, "--device", "cuda"))
    msg = load_error(out, device="cuda:99") if ckload.cuda_built() else None
    assert msg is None or "cuda" in msg.lower()


def test_ckpt_load_errors_carry_its_own_name_only(tmp_path):
    """libckload's messages are "FILE: what is wrong": each program puts its own name in front,
    the module "ckload: ", the tool "ckpt: ", and neither strips the other's."""
    src = safetensors_source(tmp_path)
    out = pack(src, tmp_path / "out.pack")
    missing = tmp_path / "none.pack"
    victim = tmp_path / "flipped.pack"
    victim.write_bytes(out.read_bytes())
    flip_byte(victim, pack_header(victim)["data_offset"] + 3)
    short = tmp_path / "short.safetensors"
    short.write_bytes(src.read_bytes()[:-10])
    for path, extra, raises in [(missing, [], FileNotFoundError), (short, [], ckload.Error),
                                (victim, ["--verify"], ckload.Error)]:
        err = one_line(ckpt_load(path, "--device", "cpu", *extra))
        assert err.startswith(f"ckpt: {path}: ") and "ckload:" not in err, err
        msg = load_error(path, raises, device="cpu", verify=bool(extra))
        assert msg == "ckload: " + err[len("ckpt: "):].rstrip("\n"), (msg, err)


def test_a_long_path_is_kept_whole(tmp_path):
    """Far longer than 256 bytes, in the messages and for the reads."""
    deep = tmp_path.joinpath(*[f"{'d' * 60}{i}" for i in range(6)])
    deep.mkdir(parents=True)
    src = safetensors_source(tmp_path)
    out = pack(src, deep / "out.pack")
    assert len(str(out)) > 400
    check_load(ckload.load(out, device="cpu", verify=True), expected_tensors(src))
    p = ckpt_load(out, "--device", "cpu")
    assert p.returncode == 0 and p.stdout.decode().startswith(f"{out}: "), p.stderr
    flip_byte(out, pack_header(out)["data_offset"] + 1)  # an error found by a reader thread
    msg = load_error(out, device="cpu", verify=True)
    assert msg.startswith(f"ckload: {out}: tensor '") and "checksum mismatch" in msg, msg
    assert one_line(ckpt_load(out, "--verify")).startswith(f"ckpt: {out}: tensor '")
    missing = deep / "none.pack"  # an error found before the load starts
    assert os.strerror(2) in load_error(missing, FileNotFoundError, device="cpu")


@pytest.mark.parametrize("kw, says", [
    ({"threads": 10**6}, "threads=1000000: not an integer from 0 to 256"),
    ({"buffers": 65}, "buffers=65: not an integer from 0 to 64"),
    ({"buffer_size": 2**64 - 4096}, f"buffer_size={2**64 - 4096}: not 0 or an integer from "
                                    f"4096 to {2**32}"),
    ({"buffer_size": 100}, "buffer_size=100: not 0 or an integer from 4096 to"),
])
def test_options_out_of_bounds_are_refused_before_anything_is_sized(tmp_path, kw, says):
    """An absurd option is refused at the start, naming its bound: a buffer size near 2**64
    wrapped in the gather of a cold strided .pt (a segfault), and threads=10**6 started
    thousands of threads."""
    src = torch_source(tmp_path)  # a .pt: strided tensors gathered through the buffer
    for path in (src, pack(src, tmp_path / "out.pack")):
        msg = load_error(path, ValueError, device="cpu", **kw)
        assert says in msg, msg


def test_options_ctypes_cannot_hold_are_refused_not_wrapped(tmp_path):
    out = pack(safetensors_source(tmp_path), tmp_path / "out.pack")
    for kw in ({"threads": 2**32 + 8}, {"buffers": 2**32 + 2}, {"buffer_size": 2**64 + 4096}):
        with pytest.raises(ValueError):
            ckload.load(out, device="cpu", **kw)


def test_bad_arguments(tmp_path):
    out = pack(safetensors_source(tmp_path), tmp_path / "out.pack")
    for device in ["tpu", "cuda:x", "cuda:-1", ""]:
        with pytest.raises(ValueError):
            ckload.load(out, device=device)
    with pytest.raises(ValueError):
        ckload.load(out, threads=-1)
    for args in [[out, "--device", "tpu"], [out, "--threads", "0"], [out, "--threads", "x"],
                 [out, "--buffers", "65"], [out, "--buffer-size", "12"],
                 [out, "--buffer-size", "1Q"], [out, "--bogus"], [out, "--threads"], [],
                 [out, out, "--device", "cpu"], ["--verify"]]:
        p = ckpt_load(*args)
        assert p.returncode == 2, (args, p.stderr)
        assert p.stderr.decode().count("\n") == 1 and p.stdout == b""


def sparse_safetensors(path, nbytes):
    """A safetensors file with one U8 tensor of nbytes, holes instead of data (nothing written)."""
    header = f'{{"big":{{"dtype":"U8","shape":[{nbytes}],"data_offsets":[0,{nbytes}]}}}}'
    header += " " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header.encode())
        f.truncate(8 + len(header) + nbytes)
    return path


# Run in a Python that limits its address space to what it maps now plus 512 MiB, then runs the
# rest. Relative, so that it also holds under ASan, whose shadow takes terabytes of it.
HEADROOM = ("import os, resource, sys\n"
            "vm = next(int(l.split()[1]) for l in open('/proc/self/status') "
            "if l.startswith('VmSize'))\n"
            "lim = vm * 1024 + (512 << 20)\n"
            "resource.setrlimit(resource.RLIMIT_AS, (lim, lim))\n")


def test_out_of_memory_is_refused_cleanly(tmp_path, mount):
    """A 4 GiB virtual pack (over a sparse source) loaded with 512 MiB of address space to
    spare: one line, exit 1, for the tool; RuntimeError, nothing handed out, for the module."""
    src = sparse_safetensors(tmp_path / "big.safetensors", 4 << 30)
    with mount(src) as mnt:
        vpack = str(mnt / ".ckptfs/checkpoint.pack")
        tool = HEADROOM + "os.execv(sys.argv[1], sys.argv[1:])\n"
        err = one_line(run([sys.executable, "-c", tool, ckpt_bin(), "load", vpack, "--device",
                            "cpu"], timeout=120))
        assert "out of memory" in err, err
        module = ("import ckload\n" + HEADROOM +
                  "try:\n"
                  "    ckload.load(sys.argv[1], device='cpu')\n"
                  "except RuntimeError as e:\n"
                  "    print(e)\n")
        p = subprocess.run([sys.executable, "-c", module, vpack], capture_output=True,
                           timeout=120, env=os.environ)
        assert p.returncode == 0, p.stderr.decode()
        assert "out of memory" in p.stdout.decode(), p.stdout


# --- ckpt load ------------------------------------------------------------------------------------

def test_ckpt_load_reports_bytes_and_rate(tmp_path):
    src = safetensors_source(tmp_path)
    out = pack(src, tmp_path / "out.pack")
    total = sum(len(t[2]) for t in expected_tensors(src).values())
    for extra in [[], ["--verify", "--threads", "2", "--buffers", "3", "--buffer-size", "64K"]]:
        p = ckpt_load(out, "--device", "cpu", *extra)
        assert p.returncode == 0 and p.stderr == b"", p.stderr  # no terminal, no bar
        line = p.stdout.decode()
        assert line.startswith(f"{out}: {len(expected_tensors(src))} tensors, {total} bytes "
                               f"into cpu in "), line
        assert line.rstrip().endswith("read from the pack" if not extra
                                      else "read from the pack, checksums match"), line
    p = ckpt_load(out, "--device", "cpu", "--only", "layers.1")
    assert p.returncode == 0 and " 1 tensors, " in p.stdout.decode()


def test_no_cuda_runtime_at_link_time_nor_to_load_to_the_host(tmp_path):
    """No shipped binary needs libcudart to start (it is opened at the first CUDA use): with
    none to be found, ckpt lists and loads to the host, and a CUDA load fails in one line that
    says what was looked for and how to point at one."""
    build = Path(ckpt_bin()).parent
    for f in ("ckpt", "ckptfs", "libckload.so"):
        p = subprocess.run(["ldd", str(build / f)], capture_output=True, text=True)
        assert "libcudart" not in p.stdout, p.stdout
    out = pack(safetensors_source(tmp_path), tmp_path / "out.pack")
    env = dict(os.environ, CKLOAD_CUDART=str(tmp_path / "none" / "libcudart.so.13"),
               LD_LIBRARY_PATH="")
    assert run([ckpt_bin(), "ls", out], env=env).returncode == 0
    p = run([ckpt_bin(), "load", out, "--device", "cpu"], env=env)
    assert p.returncode == 0, p.stderr
    p = run([ckpt_bin(), "load", out, "--device", "cuda"], env=env)
    err = p.stderr.decode()
    assert p.returncode == 1 and err.count("\n") == 1, err
    assert "no CUDA runtime" in err and "CKLOAD_CUDART" in err, err
    script = ("import ckload, sys; sd = ckload.load(sys.argv[1]); "
              "print(sorted({str(t.device) for t in sd.values()}))")
    p = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True,
                       env=env, timeout=120)
    assert p.returncode == 0 and p.stdout.decode().strip() == "['cpu']", p.stderr
