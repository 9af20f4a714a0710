"""libckload straight from a source, with no pack made: a safetensors file, a shard directory,
a PyTorch zip (strided views, tied tensors) or legacy file, and real checkpoints of the corpus
load byte-exact against torch.load and the safetensors library, in the order and layout of the
source's pack (tied tensors share memory), with `only`, readiness, thread and buffer variants,
O_DIRECT, verify, and `ckpt load`."""
import json
import os
import struct
import threading

import pytest
import torch
from safetensors.torch import save_file

import ckload
from ckptfs_testlib import torch_bytes
from test_load import (SOURCES, check_load, ckpt_load, expected_tensors, load_error, one_line)
from test_pack import pack, safetensors_source, torch_source


def strided_source(d, n=300):
    """A .pt whose tensors are views that are not contiguous in their storage, large enough to be
    gathered over many chunks, and two names for one tensor."""
    g = torch.Generator().manual_seed(11)
    m = torch.randn(n, n + 7, generator=g)
    path = d / "strided.pt"
    torch.save({"layers.0.t": m.t(), "layers.1.slice": m[3:, 5:17], "layers.2.step": m[::3, ::2],
                "layers.10.whole": m, "tied.a": m[1:], "tied.b": m[1:],
                "head": m[7].to(torch.float16)}, path)
    return path


def load_direct(src, **kw):
    with ckload.Load(src, device="cpu", **kw) as ld:
        assert ld.read_path == "source"
        ld.wait_all()
        return {ld.name(i): ld.tensor(i) for i in range(len(ld))}


def layout(ld):
    """[(name, offset in the block)] of a load: the block starts where its lowest tensor does
    (the first blob, or an empty tensor, which points at the block's start)."""
    ptrs = [ld.pointer(i) for i in range(len(ld))]
    return [(ld.name(i), p - min(ptrs)) for i, p in enumerate(ptrs)]


@pytest.mark.parametrize("kind", SOURCES)
def test_source_loads_byte_exact_as_its_pack(tmp_path, kind):
    src = SOURCES[kind](tmp_path)
    check_load(load_direct(src), expected_tensors(src))
    # The same layout as the pack: the same names in the same order at the same offsets.
    out = pack(src, tmp_path / "out.pack")
    with ckload.Load(src, device="cpu") as direct, ckload.Load(out, device="cpu") as packed:
        assert packed.read_path == "pack"
        assert layout(direct) == layout(packed)
        assert direct.total_bytes() == packed.total_bytes()


def test_strided_and_tied_tensors(tmp_path):
    src = strided_source(tmp_path)
    expected = expected_tensors(src)
    for threads, buffer_size in [(1, 4096), (3, 5000), (4, 0)]:
        sd = load_direct(src, threads=threads, buffer_size=buffer_size)
        check_load(sd, expected)
        assert sd["tied.a"].data_ptr() == sd["tied.b"].data_ptr()  # loaded once, shared
    view = load_direct(torch_source(tmp_path))
    assert view["tied.a"].data_ptr() == view["tied.b"].data_ptr()


@pytest.mark.parametrize("name", ["candle_fortran_tensor_3d.pth", "tinypellm_pytorch_model.bin",
                                  "graykode_mnist_cnn_legacy.pt", "candle_test_with_key.pt",
                                  "peft_gpt2_adapter_model.safetensors",
                                  "safetensors_cpp_model.safetensors"])
def test_corpus_loads_byte_exact(corpus, name):
    check_load(load_direct(corpus / name, verify=True), expected_tensors(corpus / name))


@pytest.mark.parametrize("kind", ["zip", "safetensors", "sharded"])
def test_only_selects_from_any_source(tmp_path, kind):
    src = SOURCES[kind](tmp_path)
    expected = expected_tensors(src)
    prefix = sorted(expected)[-1].split(".")[0]
    names = {n for n in expected if n == prefix or n.startswith(prefix + ".")}
    check_load(load_direct(src, only=prefix), {n: expected[n] for n in names})
    glob = f"{prefix}*"
    names = {n for n in expected if n.startswith(prefix)}
    check_load(load_direct(src, only=glob), {n: expected[n] for n in names})
    msg = load_error(src, ValueError, device="cpu", only="no.such")
    assert "only='no.such' selects nothing" in msg and "--only" not in msg


def test_on_ready_comes_in_pack_order(tmp_path):
    """One reader takes blobs in pack order, so tensors are announced in natural name order
    (the empty one at once), whatever the order of the source."""
    g = torch.Generator().manual_seed(4)
    src = tmp_path / "s.pt"
    t = {f"layers.{i}.w": torch.randn(300, 40, generator=g).t() for i in reversed(range(12))}
    t["layers.3.empty"] = torch.zeros(0, 5)
    torch.save(t, src)
    seen, lock = [], threading.Lock()

    def ready(i):
        with lock:
            seen.append(i)

    with ckload.Load(src, device="cpu", threads=1, buffer_size=4096, on_ready=ready) as ld:
        ld.wait(0)
        first = ld.tensor(0)
        ld.wait_all()
        empty = ld.find("layers.3.empty")
        assert seen[0] == empty and seen[1:] == [i for i in range(len(ld)) if i != empty]
        assert torch_bytes(first) == expected_tensors(src)["layers.0.w"][2]
        assert ld.done_bytes() == ld.total_bytes()


@pytest.mark.parametrize("direct", ["0", "1"])
def test_direct_io_on_unaligned_source_offsets(tmp_path, monkeypatch, direct):
    """Source tensors start anywhere in the file: O_DIRECT reads cover the enclosing aligned
    blocks and give the same bytes as the page cache."""
    src = safetensors_source(tmp_path)
    monkeypatch.setenv("CKLOAD_DIRECT", direct)
    check_load(load_direct(src, buffer_size=8192), expected_tensors(src))
    check_load(load_direct(strided_source(tmp_path, 100), buffer_size=4096),
               expected_tensors(tmp_path / "strided.pt"))


def evict(path):
    """Drops path from the page cache (written back first: dirty pages cannot be dropped)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.mark.parametrize("kind", ["safetensors", "strided"])
def test_cold_source_by_default(tmp_path, monkeypatch, kind):
    """With the source out of the page cache and no CKLOAD_DIRECT, the loader picks O_DIRECT
    where the filesystem takes it, although the tensors are out of phase with their places in
    the block (through the bounce): the same bytes as the page cache, with any chunk size."""
    src = safetensors_source(tmp_path) if kind == "safetensors" else strided_source(tmp_path, 100)
    monkeypatch.delenv("CKLOAD_DIRECT", raising=False)
    expected = expected_tensors(src)
    for threads, buffer_size in [(1, 4096), (3, 12288), (4, 0)]:
        evict(src)
        check_load(load_direct(src, threads=threads, buffer_size=buffer_size), expected)


def odd_offsets_source(path):
    """A safetensors file written by hand (the library's writer keeps every tensor in line): the
    data starts 2 bytes past a multiple of 4, and tensors of 40-200 KiB follow one another at
    offsets out of page phase, some F32s out of line with their elements. Returns
    {name: file offset}."""
    g = torch.Generator().manual_seed(17)
    tensors = {"a.u8": torch.randint(0, 256, (40_002,), dtype=torch.uint8, generator=g),
               "b.f32": torch.randn(50_000, generator=g),
               "c.bf16": torch.randn(3, 33_335, generator=g).to(torch.bfloat16),
               "d.f32": torch.randn(25, 2_001, generator=g),
               "e.i64": torch.randint(-2**62, 2**62, (9_000,), dtype=torch.int64, generator=g)}
    dtypes = {torch.uint8: "U8", torch.float32: "F32", torch.bfloat16: "BF16",
              torch.int64: "I64"}
    header, blobs, at = {}, [], 0
    for name, t in tensors.items():
        data = torch_bytes(t)
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape),
                        "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((14 - (8 + len(text)) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    start = 8 + len(text)
    return {name: start + h["data_offsets"][0] for name, h in header.items()}


@pytest.mark.parametrize("direct", ["0", "1"])
def test_in_place_direct_reads_keep_file_phase(tmp_path, monkeypatch, direct):
    """Read O_DIRECT into host memory, a source's tensors are placed in the block with their
    file offsets' phase modulo the disk's O_DIRECT alignment (512 or 4096 bytes), so their whole
    pages land in place: each such tensor's address is its file offset's modulo 512, and every
    tensor stays aligned to its element (one out of line in the file keeps a 256-byte place).
    Without O_DIRECT the layout is the pack's. The bytes are the safetensors library's."""
    src = tmp_path / "odd.safetensors"
    offsets = odd_offsets_source(src)
    monkeypatch.setenv("CKLOAD_DIRECT", direct)
    expected = expected_tensors(src)
    with ckload.Load(src, device="cpu") as ld:
        ld.wait_all()
        sd = {ld.name(i): ld.tensor(i) for i in range(len(ld))}
        check_load(sd, expected)
        for name, t in sd.items():
            ptr, size = t.data_ptr(), t.element_size()
            assert ptr % size == 0, name
            if direct == "1" and offsets[name] % size == 0:
                assert (ptr - offsets[name]) % 512 == 0, name
            else:
                assert ptr % 256 == 0, name
    in_line = {n for n, off in offsets.items() if off % sd[n].element_size() == 0}
    assert in_line != set(offsets) and len(in_line) >= 3  # both kinds are tried


def test_cold_large_source_chosen_per_load(tmp_path, monkeypatch):
    """A cold safetensors file with threads and chunk size left to libckload: tensors of several
    chunks each, of odd lengths and at offsets out of page phase, so that chunks and tensors end
    mid-page (read in place where their place keeps the phase, through the bounce else)."""
    g = torch.Generator().manual_seed(13)
    t = {f"layers.{i}.w": torch.randint(-2**31, 2**31 - 1, ((i % 4 + 1) * 500_003 + i,),
                                        dtype=torch.int32, generator=g) for i in range(10)}
    t["head"] = torch.randn(3, 1_000_001, generator=g).to(torch.bfloat16)
    src = tmp_path / "large.safetensors"
    save_file(t, str(src))
    monkeypatch.delenv("CKLOAD_DIRECT", raising=False)
    expected = expected_tensors(src)
    evict(src)
    check_load(load_direct(src, threads=0, buffer_size=0), expected)


def test_truncated_source(tmp_path):
    src = safetensors_source(tmp_path)
    os.truncate(src, os.path.getsize(src) - 10)
    msg = load_error(src, device="cpu")
    assert msg.startswith(f"ckload: {src}: ")
    one_line(ckpt_load(src, "--device", "cpu"))


def test_ckpt_load_says_where_it_read(tmp_path):
    src = torch_source(tmp_path)
    out = pack(src, tmp_path / "out.pack")
    lines = {}
    for path, ends in [(src, "read from the source, sources unchanged"),
                       (out, "read from the pack, checksums match")]:
        p = ckpt_load(path, "--device", "cpu", "--verify")
        assert p.returncode == 0 and p.stderr == b"", p.stderr
        line = lines[path] = p.stdout.decode()
        assert line.startswith(f"{path}: "), line
        assert line.rstrip().endswith(ends), line
    # The same tensors and bytes either way.
    assert lines[src].split(" into ")[0][len(str(src)):] == \
        lines[out].split(" into ")[0][len(str(out)):]
