"""`ckptfs -o npy` and `ckpt cat --npy`: every tensor NAME is also NAME.npy, a NumPy file that
np.load reads (mapped or not) as the tensor torch.load, the safetensors library or gguf-py
reads. Dtypes NumPy lacks are served as raw records ('|VN', N the element size, shape kept) or,
for sub-byte and block types, as '|u1' bytes of shape (nbytes,), the true dtype in the xattr
(formats/npy.h): the tests check that treatment against the independent reader's bytes."""
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from ckptfs_testlib import ckpt_bin, need_module, read_index, run, write_safetensors

# torch dtype -> the numpy dtype np.load must give (None: raw records of the element size)
TORCH = {
    torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64,
    torch.int8: np.int8, torch.int16: np.int16, torch.int32: np.int32, torch.int64: np.int64,
    torch.uint8: np.uint8, torch.bool: np.bool_, torch.complex64: np.complex64,
    torch.complex128: np.complex128,
    torch.bfloat16: None,
}
for name, nd in (("uint16", np.uint16), ("uint32", np.uint32), ("uint64", np.uint64),
                 ("float8_e4m3fn", None), ("float8_e5m2", None),
                 ("float8_e4m3fnuz", None), ("float8_e5m2fnuz", None)):
    if hasattr(torch, name):
        TORCH[getattr(torch, name)] = nd


def raw(t):
    """The tensor's row-major bytes, whatever its dtype and strides."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def tensors():
    """Every dtype, in shapes that matter: 2-d, 0-d, empty, one dimension; and a transposed
    (strided) tensor, which the mount gathers."""
    g = torch.Generator().manual_seed(3)
    out = {}
    for i, dt in enumerate(TORCH):
        base = torch.randn(3, 5, generator=g, dtype=torch.float64) * 50
        if dt.is_complex:
            t = torch.complex(base, -base).to(dt)
        elif dt == torch.bool:
            t = base > 0
        elif dt.is_floating_point:
            t = base.to(dt)
        else:
            t = base.clamp(0 if str(dt).startswith("torch.uint") else -100, 100).to(dt)
        key = str(dt).removeprefix("torch.")
        out[f"m.{key}"] = t
        out[f"scalar.{key}"] = t[1, 2].clone()
        out[f"empty.{key}"] = t[:0].clone()
        out[f"row.{key}"] = t[2].clone()
    out["strided"] = torch.arange(24, dtype=torch.float32).reshape(4, 6).t()
    return out


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    src = tensors()
    path = tmp_path_factory.mktemp("npy") / "model.pt"
    torch.save(src, path)
    return path, torch.load(path, weights_only=True)


def ckpt(*args):
    return run([ckpt_bin(), *map(str, args)], timeout=120)


def check_npy(path, expected, dtype_name):
    """np.load of path (plain and mapped) against the torch tensor expected."""
    want = TORCH[expected.dtype]
    for mode in (None, "r"):
        a = np.load(path, mmap_mode=mode, allow_pickle=False)
        if want is not None:
            assert a.dtype == np.dtype(want), (path, a.dtype)
            assert a.shape == tuple(expected.shape), path
            assert np.array_equal(a, expected.contiguous().numpy(), equal_nan=True), path
        else:  # raw records of the element size, the shape kept
            assert a.dtype == np.dtype(f"V{expected.element_size()}"), (path, a.dtype)
            assert a.shape == tuple(expected.shape), path
        assert np.ascontiguousarray(a).tobytes() == raw(expected), path
        del a
    assert os.getxattr(path, "user.ckptfs.dtype").decode() == dtype_name


def test_every_torch_dtype(source, mount):
    path, ref = source
    with mount(path, options=["npy"]) as mnt:
        index = {t["name"]: t for t in read_index(mnt)["tensors"]}
        assert set(index) == set(ref)
        for name, t in ref.items():
            f = mnt / index[name]["path"]
            npy = Path(f"{f}.npy")
            check_npy(npy, t, index[name]["dtype"])
            data = f.read_bytes()
            whole = npy.read_bytes()
            st = npy.stat()
            # the header, 64-aligned as np.save pads it, then exactly the tensor file's bytes
            assert whole.endswith(data) and (len(whole) - len(data)) % 64 == 0
            assert st.st_size == len(whole) and st.st_blocks == (len(whole) + 511) // 512
            assert os.listxattr(npy) == os.listxattr(f)
            assert os.getxattr(npy, "user.ckptfs.shape") == os.getxattr(f, "user.ckptfs.shape")
            # ckpt cat --npy writes the same file
            p = ckpt("cat", "--npy", path, name)
            assert p.returncode == 0, p.stderr
            assert p.stdout == whole, name
        # the listing has each tensor file and its view, nothing else new
        for d, _, files in os.walk(mnt):
            if ".ckptfs" in Path(d).parts:
                continue
            plain = {x for x in files if not x.endswith(".npy")}
            assert {x for x in files if x.endswith(".npy")} == {x + ".npy" for x in plain}, d


def test_random_reads_match(source, mount):
    """Reads at every offset around the header's end, as mmap and readers split them."""
    path, ref = source
    with mount(path, options=["npy"]) as mnt:
        index = {t["name"]: t for t in read_index(mnt)["tensors"]}
        npy = Path(f"{mnt / index['m.float64']['path']}.npy")
        whole = npy.read_bytes()
        fd = os.open(npy, os.O_RDONLY)
        try:
            for off in range(0, len(whole) + 3):
                for n in (1, 7, 64, 200):
                    assert os.pread(fd, n, off) == whole[off:off + n], (off, n)
        finally:
            os.close(fd)


def test_cat_npy_is_np_loadable(source, tmp_path):
    path, ref = source
    out = tmp_path / "x.npy"
    p = ckpt("cat", "--npy", path, "strided")
    assert p.returncode == 0, p.stderr
    out.write_bytes(p.stdout)
    a = np.load(out, mmap_mode="r")
    assert np.array_equal(a, ref["strided"].numpy())
    # without --npy: the bare bytes
    p = ckpt("cat", path, "strided")
    assert p.returncode == 0 and p.stdout == raw(ref["strided"])
    p = ckpt("cat", "--npy", path)
    assert p.returncode == 2 and p.stderr.decode().startswith("ckpt: cat: ")


def test_no_views_without_the_option(source, mount):
    path, _ = source
    with mount(path) as mnt:
        assert not [f for _, _, fs in os.walk(mnt) for f in fs if f.endswith(".npy")]
        assert not (mnt / "strided.npy").exists()
        assert (mnt / "strided").exists()


def test_safetensors_sub_byte_types(tmp_path, mount):
    """safetensors F4 and F6 (no NumPy type, not whole bytes) are '|u1' bytes of shape
    (nbytes,); BF16 is '|V2', the F8 types '|V1' (torch here predates float8); the library's
    bytes are what np.load gives."""
    from ckptfs_testlib import library_view
    rng = np.random.default_rng(5)
    f = write_safetensors(tmp_path / "s.safetensors", [
        ("f4", "F4", [4, 6], rng.integers(0, 256, 12, dtype=np.uint8).tobytes()),
        ("f6", "F6_E2M3", [2, 4], rng.integers(0, 256, 6, dtype=np.uint8).tobytes()),
        ("bf", "BF16", [3], rng.integers(0, 256, 6, dtype=np.uint8).tobytes()),
        ("e4", "F8_E4M3", [2, 3], rng.integers(0, 256, 6, dtype=np.uint8).tobytes()),
        ("e5", "F8_E5M2", [5], rng.integers(0, 256, 5, dtype=np.uint8).tobytes()),
        ("f", "F32", [2, 2], np.arange(4, dtype=np.float32).tobytes()),
    ])
    lib, _ = library_view(f)
    with mount(f, options=["npy"]) as mnt:
        for name, (dtype, shape, data) in lib.items():
            a = np.load(mnt / f"{name}.npy", mmap_mode="r")
            assert a.tobytes() == data, name
            assert os.getxattr(mnt / f"{name}.npy", "user.ckptfs.dtype").decode() == dtype
            if dtype in ("F4", "F6_E2M3"):
                assert a.dtype == np.uint8 and a.shape == (len(data),), name
            elif dtype == "BF16":
                assert a.dtype == np.dtype("V2") and list(a.shape) == shape
            elif dtype.startswith("F8"):
                assert a.dtype == np.dtype("V1") and list(a.shape) == shape
            else:
                assert a.dtype == np.float32 and list(a.shape) == shape
                assert np.array_equal(a, np.frombuffer(data, np.float32).reshape(shape))


def test_gguf_block_types(tmp_path, mount):
    """ggml's quantized blocks are '|u1' bytes of shape (nbytes,), equal to gguf-py's."""
    gguf = need_module("gguf")
    from gguf import GGMLQuantizationType as Q
    rng = np.random.default_rng(2)
    path = tmp_path / "q.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    x = rng.standard_normal((2, 64)).astype(np.float32)
    w.add_tensor("q", gguf.quants.quantize(x, Q.Q8_0), raw_dtype=Q.Q8_0)
    w.add_tensor("v", np.arange(5, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ref = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    with mount(path, options=["npy"]) as mnt:
        index = {t["name"]: t for t in read_index(mnt)["tensors"]}
        q = np.load(Path(f"{mnt / index['q']['path']}.npy"), mmap_mode="r")
        assert q.dtype == np.uint8 and q.shape == (ref["q"].n_bytes,)
        assert q.tobytes() == np.asarray(ref["q"].data).tobytes()
        v = np.load(Path(f"{mnt / index['v']['path']}.npy"))
        assert v.dtype == np.float32
        assert np.array_equal(v.reshape(-1), np.asarray(ref["v"].data).reshape(-1))


def test_what_has_no_view(tmp_path, mount):
    """Values have none; nor a tensor whose file name leaves no room for ".npy" (over 251
    bytes); one of exactly 251 bytes has one. A directory of thousands lists every view once,
    across many readdir replies."""
    path = tmp_path / "v.pt"
    torch.save({"w": torch.ones(2), "step": 5}, path)
    with mount(path, options=["npy"]) as mnt:
        assert sorted(os.listdir(mnt)) == [".ckptfs", "step", "w", "w.npy"]
        assert not (mnt / "step.npy").exists()
    one = np.float32(1).tobytes()
    names = ["a" * 251, "b" * 252, "c" * 300] + [f"t{i:05d}" for i in range(3000)]
    f = write_safetensors(tmp_path / "n.safetensors", [(n, "F32", [], one) for n in names])
    with mount(f, options=["npy"]) as mnt:
        listed = os.listdir(mnt)
        assert len(listed) == len(set(listed))
        views = {x[:-4] for x in listed if x.endswith(".npy")}
        plain = {x for x in listed if not x.endswith(".npy") and x != ".ckptfs"}
        assert len(plain) == len(names)
        assert views == {x for x in plain if len(x) <= 251}
        assert "a" * 251 in views and "b" * 252 not in views
        assert np.load(mnt / ("a" * 251 + ".npy")) == np.float32(1)
        for name in ("b" * 252, "t00000.npy.npy", "t00000.np", ".ckptfs.npy"):
            assert not (mnt / f"{name}.npy").exists(), name
