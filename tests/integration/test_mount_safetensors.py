"""Single safetensors files, written by the real safetensors library or byte by byte, mounted and
compared tensor by tensor with what the library, torch and numpy read independently."""
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import safetensors.numpy
import safetensors.torch
from safetensors import deserialize, safe_open

from ckptfs_testlib import (DTYPE_BITS, check_mount, library_view, numel, read_index,
                            torch_bytes, write_safetensors)

# The safetensors spelling of each dtype, as the safetensors library itself names them.
TORCH_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64]
NUMPY_DTYPES = [np.bool_, np.uint8, np.int8, np.int16, np.uint16, np.int32, np.uint32, np.int64,
                np.uint64, np.float16, np.float32, np.float64, np.complex64]
SHAPES = [(3, 4), (), (0,), (2, 0, 3), (7,), (2, 3, 1, 5)]


def torch_tensor(dtype, shape, g):
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    if dtype.is_floating_point:
        t = (torch.randn(shape, generator=g) * 1000).to(dtype)
        flat = t.view(-1)
        specials = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0]).to(dtype)
        k = min(len(flat), len(specials))
        flat[:k] = specials[:k]
        return t
    info = torch.iinfo(dtype)
    t = torch.randint(info.min, info.max, shape, generator=g, dtype=dtype)
    flat = t.view(-1)
    if len(flat) >= 2:
        flat[0], flat[1] = info.min, info.max
    return t


def numpy_array(dtype, shape, rng):
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return np.asarray(rng.random(shape) > 0.5)
    if dt.kind == "c":
        return np.asarray(rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    if dt.kind == "f":
        return np.asarray(rng.standard_normal(shape) * 1000).astype(dt)
    info = np.iinfo(dt)
    a = np.asarray(rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True))
    if a.size >= 2:
        a.flat[0], a.flat[1] = info.min, info.max
    return a


def test_torch_save_file_every_dtype(tmp_path, mount):
    g = torch.Generator().manual_seed(1)
    tensors = {}
    for dt in TORCH_DTYPES:
        for shape in SHAPES:
            name = f"{str(dt).split('.')[1]}.s{'x'.join(map(str, shape)) or 'scalar'}"
            tensors[name] = torch_tensor(dt, shape, g)
    meta = {"format": "pt", "note": "written by safetensors.torch.save_file"}
    src = tmp_path / "torch.safetensors"
    safetensors.torch.save_file(tensors, str(src), metadata=meta)
    lib, lib_meta = library_view(src)
    assert lib_meta == meta
    with mount(src) as m:
        check_mount(m, lib, lib_meta, "safetensors")
        index = {t["name"]: t for t in read_index(m)["tensors"]}
        with safe_open(str(src), framework="pt") as f:
            for name, t in tensors.items():
                data = (m / index[name]["path"]).read_bytes()
                # The bytes torch itself holds, and what the library's torch reader returns.
                assert data == torch_bytes(t), name
                assert data == torch_bytes(f.get_tensor(name)), name
                assert index[name]["shape"] == list(t.shape)
                if t.numel():
                    back = torch.frombuffer(bytearray(data), dtype=t.dtype).reshape(t.shape)
                    torch.testing.assert_close(back, t, rtol=0, atol=0, equal_nan=True)


def test_numpy_save_file_every_dtype(tmp_path, mount):
    rng = np.random.default_rng(2)
    arrays = {}
    for dt in NUMPY_DTYPES:
        for shape in SHAPES:
            arrays[f"{np.dtype(dt).name}.s{'x'.join(map(str, shape)) or 'scalar'}"] = \
                numpy_array(dt, shape, rng)
    src = tmp_path / "numpy.safetensors"
    safetensors.numpy.save_file(arrays, str(src))
    lib, lib_meta = library_view(src)
    with mount(src) as m:
        check_mount(m, lib, lib_meta, "safetensors")
        index = {t["name"]: t for t in read_index(m)["tensors"]}
        for name, a in arrays.items():
            data = (m / index[name]["path"]).read_bytes()
            assert data == a.astype(a.dtype.newbyteorder("<")).tobytes(), name
            back = np.frombuffer(data, dtype=a.dtype).reshape(a.shape)
            np.testing.assert_array_equal(back, a)


HANDWRITTEN = [  # dtype, shapes (element counts fill whole bytes)
    ("U16", [(5,), (2, 3), ()]),
    ("U32", [(4,), (3, 0)]),
    ("U64", [(3,), ()]),
    ("F8_E4M3", [(9,), (), (0,)]),
    ("F8_E5M2", [(2, 5)]),
    ("F8_E8M0", [(6,), ()]),
    ("F4", [(2, 5), (8,), (0, 3), (1, 2)]),
    ("F6_E2M3", [(4,), (2, 6), (0,)]),
    ("F6_E3M2", [(8,), (3, 4)]),
    ("C64", [(3,), ()]),
    ("BF16", [(5,)]),
    ("BOOL", [(3,)]),
]


def test_handwritten_dtypes(tmp_path, mount):
    rnd = random.Random(3)
    tensors = []
    for dtype, shapes in HANDWRITTEN:
        for k, shape in enumerate(shapes):
            nbytes = numel(shape) * DTYPE_BITS[dtype] // 8
            assert numel(shape) * DTYPE_BITS[dtype] % 8 == 0
            data = bytes(rnd.randrange(256) for _ in range(nbytes))
            if dtype == "BOOL":
                data = bytes(b & 1 for b in data)
            tensors.append((f"hand.{dtype}.t{k}", dtype, list(shape), data))
    rnd.shuffle(tensors)  # data order differs from name order
    src = write_safetensors(tmp_path / "hand.safetensors", tensors, metadata={"by": "hand"})
    mine = {n: (d, s, b) for n, d, s, b in tensors}
    # The library agrees with what was written...
    lib, lib_meta = library_view(src)
    assert lib == mine and lib_meta == {"by": "hand"}
    # ...and so does the mount.
    with mount(src) as m:
        check_mount(m, mine, {"by": "hand"}, "safetensors")
        with safe_open(str(src), framework="numpy") as f:
            for ent in read_index(m)["tensors"]:
                s = f.get_slice(ent["name"])
                assert ent["dtype"] == s.get_dtype()
                assert ent["shape"] == list(s.get_shape())


def test_metadata(tmp_path, mount):
    meta = {"format": "pt", "unicode": "ünïcödé ☃ 日本", "empty": "", "quote": 'a"b\\c',
            "newline": "line1\nline2\ttab", "json": json.dumps({"a": [1, 2]}), "long": "x" * 5000}
    src = tmp_path / "meta.safetensors"
    safetensors.torch.save_file({"w": torch.ones(2)}, str(src), metadata=meta)
    lib, lib_meta = library_view(src)
    assert lib_meta == meta
    with mount(src) as m:
        check_mount(m, lib, lib_meta, "safetensors")

    bare = tmp_path / "nometa.safetensors"
    safetensors.torch.save_file({"w": torch.ones(2)}, str(bare))
    lib, lib_meta = library_view(bare)
    assert lib_meta == {}
    with mount(bare) as m:
        assert read_index(m)["metadata"] == {}
        check_mount(m, lib, {}, "safetensors")


def test_ten_thousand_tensors(tmp_path, mount):
    rng = np.random.default_rng(4)
    dtypes = [np.float32, np.int8, np.float16, np.int64, np.bool_, np.uint8, np.float64]
    arrays = {}
    for i in range(7000):  # 70 directories of 100
        dt = dtypes[i % len(dtypes)]
        arrays[f"layers.{i // 100}.block{i % 100}.w"] = numpy_array(dt, (i % 5, 3)
                                                                     if i % 11 else (), rng)
    for i in range(3000):  # one directory with 3000 entries: readdir needs many replies
        arrays[f"flat.t{i:05d}"] = numpy_array(dtypes[i % len(dtypes)], (i % 4,), rng)
    assert len(arrays) == 10000
    src = tmp_path / "many.safetensors"
    safetensors.numpy.save_file(arrays, str(src))
    lib, lib_meta = library_view(src)
    with mount(src) as m:
        index = check_mount(m, lib, lib_meta, "safetensors")
        assert len(index["tensors"]) == 10000
        flat = os.listdir(m / "flat")
        assert len(flat) == 3000 and len(set(flat)) == 3000
        assert sorted(os.listdir(m / "layers")) == sorted(str(i) for i in range(70))


def test_scalar_and_empty_tensors(tmp_path, mount):
    tensors = {
        "scalar.f32": torch.tensor(3.5), "scalar.i64": torch.tensor(-7),
        "scalar.bool": torch.tensor(True), "scalar.bf16": torch.tensor(1.25, dtype=torch.bfloat16),
        "empty.a": torch.zeros(0), "empty.b": torch.zeros(0, 4, dtype=torch.int16),
        "empty.c": torch.zeros(3, 0, 2, dtype=torch.float64), "empty.d": torch.zeros(0, 0),
    }
    src = tmp_path / "edge.safetensors"
    safetensors.torch.save_file(tensors, str(src))
    lib, lib_meta = library_view(src)
    with mount(src) as m:
        check_mount(m, lib, lib_meta, "safetensors")
        index = {t["name"]: t for t in read_index(m)["tensors"]}
        for name, t in tensors.items():
            p = m / index[name]["path"]
            assert index[name]["shape"] == list(t.shape)
            assert p.read_bytes() == torch_bytes(t)
            assert os.stat(p).st_size == t.numel() * t.element_size()
            with open(p, "rb") as f:
                assert f.read(100) == torch_bytes(t)
                assert f.read(100) == b""


def test_noncontiguous_tensors_saved_contiguous(tmp_path, mount):
    base = torch.arange(4 * 6 * 5, dtype=torch.float32).reshape(4, 6, 5)
    views = {
        "transposed": base.transpose(0, 2),
        "sliced": base[:, ::2, 1:],
        "permuted": base.permute(1, 2, 0),
        "expanded": torch.arange(3, dtype=torch.int64).reshape(3, 1).expand(3, 7),
        "channels_last": torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
        "narrowed_bf16": base.to(torch.bfloat16).narrow(1, 2, 3).transpose(0, 1),
        "flipped_column": base.flip(0)[:, 1],
    }
    assert not any(v.is_contiguous() for v in views.values())
    src = tmp_path / "noncontig.safetensors"
    safetensors.torch.save_file({k: v.contiguous() for k, v in views.items()}, str(src))
    lib, lib_meta = library_view(src)
    with mount(src) as m:
        check_mount(m, lib, lib_meta, "safetensors")
        index = {t["name"]: t for t in read_index(m)["tensors"]}
        for name, v in views.items():
            data = (m / index[name]["path"]).read_bytes()
            # Row-major order of the logical (strided) view, computed by numpy.
            src_view = v.view(torch.int16) if v.dtype == torch.bfloat16 else v
            assert data == np.ascontiguousarray(src_view.numpy()).tobytes(), name
            back = torch.frombuffer(bytearray(data), dtype=v.dtype).reshape(v.shape)
            assert torch.equal(back, v), name


CHUNKS = [1, 3, 4095, 4096, 4097, 65536, 131073, 1 << 20, 3 << 20]


@pytest.mark.parametrize("options", [(), ("direct_io",)], ids=["page_cache", "direct_io"])
def test_large_tensors_chunked_reads(tmp_path, mount, options):
    rng = np.random.default_rng(5)
    arrays = {
        "big.f32": rng.standard_normal(1536 * 1024).astype(np.float32),        # 6 MiB
        "big.odd": rng.integers(0, 256, (3 << 20) + 3, dtype=np.uint8),        # 3 MiB + 3
        "big.i16": rng.integers(-30000, 30000, (1024, 1031), dtype=np.int16),  # ~2 MiB
        "small": np.arange(5, dtype=np.int32),
    }
    src = tmp_path / "big.safetensors"
    safetensors.numpy.save_file(arrays, str(src))
    lib, lib_meta = library_view(src)
    r = random.Random(6)
    with mount(src, options=options) as m:
        check_mount(m, lib, lib_meta, "safetensors", xattrs=False)
        index = {t["name"]: t for t in read_index(m)["tensors"]}
        for name, a in arrays.items():
            want = a.tobytes()
            assert want == lib[name][2]
            size = len(want)
            fd = os.open(m / index[name]["path"], os.O_RDONLY)
            try:
                offsets = {0, 1, 4095, 4096, 65537, size // 2, size - 1, size - 5, size, size + 10}
                offsets |= {r.randrange(size) for _ in range(4)}
                for off in sorted(o for o in offsets if o >= 0):
                    for chunk in CHUNKS + [size]:
                        got = os.pread(fd, chunk, off)
                        assert got == want[off:off + chunk], (name, off, chunk)
                # Sequential reads of an odd size rebuild the whole tensor.
                os.lseek(fd, 0, os.SEEK_SET)
                parts = []
                while True:
                    b = os.read(fd, 12345)
                    if not b:
                        break
                    parts.append(b)
                assert b"".join(parts) == want
            finally:
                os.close(fd)


def corpus_safetensors():
    d = Path("/work/shared/corpus")
    return sorted(p.name for p in d.glob("*.safetensors") if "abuse" not in p.name)


@pytest.mark.parametrize("name", corpus_safetensors())
def test_corpus_file(corpus, mount, name):
    src = corpus / name
    lib, lib_meta = library_view(src)
    assert lib, f"{name}: the library found no tensors"
    with mount(src) as m:
        check_mount(m, lib, lib_meta, "safetensors")
        index = {t["name"]: t for t in read_index(m)["tensors"]}
        with safe_open(str(src), framework="pt") as f:
            for tname in f.keys():
                t = f.get_tensor(tname)
                assert (m / index[tname]["path"]).read_bytes() == torch_bytes(t), tname
                assert index[tname]["shape"] == list(t.shape)


def test_corpus_has_the_expected_files(corpus):
    names = corpus_safetensors()
    assert len(names) >= 4, names
    assert (corpus / "safetensors_cpp_abuse_attempt_1.safetensors").is_file()


def test_relative_source_path(tmp_path, mount):
    src = tmp_path / "rel.safetensors"
    safetensors.torch.save_file({"a.b": torch.arange(10)}, str(src))
    lib, lib_meta = library_view(src)
    # The daemon changes directory to / after mounting: it must not need the path any more.
    with mount("rel.safetensors", cwd=tmp_path) as m:
        check_mount(m, lib, lib_meta, "safetensors")


def test_symlinked_source(tmp_path, mount):
    src = tmp_path / "real.safetensors"
    safetensors.torch.save_file({"x": torch.arange(6, dtype=torch.int16)}, str(src))
    link = tmp_path / "link.safetensors"
    link.symlink_to(src)
    lib, lib_meta = library_view(src)
    with mount(link) as m:
        check_mount(m, lib, lib_meta, "safetensors")


def test_library_reader_agrees_with_raw_header(tmp_path):
    """Sanity check of the independent reader itself on a file written here byte by byte."""
    data = bytes(range(12))
    src = write_safetensors(tmp_path / "t.safetensors", [("a", "U8", [12], data)])
    assert deserialize(src.read_bytes()) == [("a", {"dtype": "U8", "shape": [12],
                                                    "data": bytearray(data)})]
