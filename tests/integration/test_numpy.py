"""NumPy checkpoints (.npy, .npz) against numpy itself: every dtype numpy and ckptfs share, both
orders, 0-d and empty arrays, format versions 1.0/2.0/3.0, stored and compressed archives, on
generated files and the corpus. Each is checked through a mount (index.json, bytes, xattrs,
random reads, the virtual safetensors file and pack), through ckpt (ls, cat, pack, verify) and
through ckload.load, byte for byte against np.load (and np.load(mmap_mode="r") where numpy maps
the file). Files numpy cannot hand us as tensors are refused, naming what they hold."""
import io
import json
import os
import random
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

import ckload
from ckptfs_testlib import ckpt_bin, run

# numpy dtype -> (descr numpy writes, our dtype)
DTYPES = {
    "float16": "F16", "float32": "F32", "float64": "F64", "int8": "I8", "int16": "I16",
    "int32": "I32", "int64": "I64", "uint8": "U8", "uint16": "U16", "uint32": "U32",
    "uint64": "U64", "bool": "BOOL", "complex64": "C64", "complex128": "C128",
}


def sample(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape)) if shape else 1
    if dtype == "bool":
        a = rng.integers(0, 2, n).astype(bool)
    elif dtype.startswith("complex"):
        a = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype)
    elif dtype.startswith("float"):
        a = rng.standard_normal(n).astype(dtype)
    else:
        info = np.iinfo(dtype)
        a = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    return a.reshape(shape)


def arrays():
    """{key: array}: every dtype in C and Fortran order, 0-d and empty arrays."""
    out = {}
    for i, dt in enumerate(DTYPES):
        out[f"c.{dt}"] = sample(dt, (3, 5, 2), i)
        out[f"f.{dt}"] = np.asfortranarray(sample(dt, (4, 3, 5), 100 + i))
    out["scalar"] = np.float32(2.5) * np.ones((), np.float32)
    out["empty"] = np.zeros((0, 7), np.int16)
    out["f.empty"] = np.asfortranarray(np.zeros((3, 0, 2), np.float64))
    out["vec"] = np.arange(17, dtype=np.int64)
    return out


def ckpt(*args, timeout=120):
    return run([ckpt_bin(), *args], timeout=timeout)


def expected(path):
    """{name: (dtype, shape, row-major bytes)} as numpy reads path; the name rule of docs/SEMANTICS.md."""
    path = Path(path)
    if path.suffix == ".npy":
        a = np.load(path)
        m = np.load(path, mmap_mode="r")
        assert np.array_equal(a, m) or a.size == 0
        got = {"": a}
    else:
        with np.load(path) as z:
            got = {k: z[k] for k in z.files}
    return {k: (DTYPES[str(a.dtype)], list(a.shape), np.ascontiguousarray(a).tobytes())
            for k, a in got.items()}


def check_index_and_bytes(mnt, want, fmt):
    index = json.loads((mnt / ".ckptfs" / "index.json").read_bytes())
    assert index["format"] == fmt
    assert {t["name"] for t in index["tensors"]} == set(want)
    for t in index["tensors"]:
        dtype, shape, data = want[t["name"]]
        assert (t["dtype"], t["shape"], t["nbytes"]) == (dtype, shape, len(data)), t
        p = mnt / t["path"]
        assert p.read_bytes() == data, t["name"]
        assert os.stat(p).st_size == len(data)
        assert os.getxattr(p, "user.ckptfs.name") == t["name"].encode()
        assert os.getxattr(p, "user.ckptfs.dtype") == dtype.encode()
        assert json.loads(os.getxattr(p, "user.ckptfs.shape")) == shape
    return index


def check_random_reads(path, data, n=40, seed=1):
    rng = random.Random(seed)
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(n):
            off = rng.randrange(len(data) + 1)
            ln = rng.randrange(1, 200_000)
            assert os.pread(fd, ln, off) == data[off:off + ln], (path, off, ln)
    finally:
        os.close(fd)


def check_virtual_files(mnt, want, tmp):
    st = mnt / ".ckptfs" / "checkpoint.safetensors"
    omitted = {k for k, v in want.items() if v[0] == "C128"}
    with safe_open(st, framework="np") as f:
        assert set(f.keys()) == set(want) - omitted
        meta = f.metadata() or {}
        assert set(json.loads(meta.get("ckptfs.omitted", "[]"))) == omitted
        for k in f.keys():
            assert np.ascontiguousarray(f.get_tensor(k)).tobytes() == want[k][2], k
    pack = tmp / "copy.pack"
    pack.write_bytes((mnt / ".ckptfs" / "checkpoint.pack").read_bytes())
    assert ckpt("verify", pack).returncode == 0


def check_ckpt(src, want, tmp):
    p = ckpt("ls", src, "--json")
    assert p.returncode == 0, p.stderr
    listed = {t["name"]: t for t in json.loads(p.stdout)["tensors"]}
    assert set(listed) == set(want)
    for name, (dtype, shape, data) in want.items():
        assert (listed[name]["dtype"], listed[name]["shape"]) == (dtype, shape)
        c = ckpt("cat", src, name)
        assert c.returncode == 0 and c.stdout == data, (name, c.stderr)
    out = tmp / "out.pack"
    assert ckpt("pack", src, out).returncode == 0
    assert ckpt("verify", out).returncode == 0
    c = ckpt("ls", out, "--json")
    assert {t["name"] for t in json.loads(c.stdout)["tensors"]} == set(want)
    for name, (_, _, data) in want.items():
        assert ckpt("cat", out, name).stdout == data, name
    out.unlink()


def torch_raw(t):
    t = t.detach().cpu().contiguous()
    return t.reshape(-1).numpy().tobytes() if t.numel() else b""


def check_ckload(src, want, read_path="source"):
    """ckload's host load: names, dtypes and shapes as Load.info says them (a dtype torch lacks
    comes as bytes, ckload.py), and the bytes."""
    with ckload.Load(str(src), device="cpu") as ld:
        ld.wait_all()
        assert ld.read_path == read_path
        assert {ld.name(i) for i in range(len(ld))} == set(want)
        for i in range(len(ld)):
            name, dtype, shape, nbytes = ld.info(i)
            assert (dtype, list(shape), nbytes) == (want[name][0], want[name][1],
                                                    len(want[name][2])), name
            assert torch_raw(ld.tensor(i)) == want[name][2], name


def check_everywhere(mount, src, fmt, tmp):
    want = expected(src)
    with mount(src) as mnt:
        index = check_index_and_bytes(mnt, want, fmt)
        for t in index["tensors"]:
            if want[t["name"]][2]:
                check_random_reads(mnt / t["path"], want[t["name"]][2], n=8)
        check_virtual_files(mnt, want, tmp)
    check_ckpt(src, want, tmp)
    check_ckload(src, want)
    return want


# --- generated files -------------------------------------------------------------------------

@pytest.mark.parametrize("key", sorted(arrays()))
def test_npy_every_dtype_and_order(tmp_path, mount, key):
    a = arrays()[key]
    src = tmp_path / "a.npy"
    np.save(src, a)
    want = expected(src)
    with mount(src) as mnt:
        index = check_index_and_bytes(mnt, want, "npy")
        assert index["tensors"][0]["path"] == "%"  # the single-tensor name "", as for torch
    check_ckpt(src, want, tmp_path)
    check_ckload(src, want)


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_npy_format_versions(tmp_path, mount, version):
    a = np.asfortranarray(sample("float32", (6, 9), 3))
    src = tmp_path / "v.npy"
    with open(src, "wb") as f:
        np.lib.format.write_array(f, a, version=version)
    assert src.read_bytes()[6] == version[0]
    check_everywhere(mount, src, "npy", tmp_path)


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_every_dtype(tmp_path, mount, compressed):
    arr = arrays()  # Fortran-ordered members too: a compressed one is gathered from its copy
    src = tmp_path / "all.npz"
    (np.savez_compressed if compressed else np.savez)(src, **arr)
    with zipfile.ZipFile(src) as z:
        assert {i.compress_type for i in z.infolist()} == {8 if compressed else 0}
    check_everywhere(mount, src, "npz", tmp_path)


def fortran_npz(tmp_path, name="f.npz"):
    """np.savez_compressed of Fortran-ordered arrays, ranks 1 to 4, of several dtypes; every
    member deflated and, from rank 2 on, Fortran-ordered in its header."""
    arr = {}
    for i, dt in enumerate(["float32", "float64", "float16", "int8", "int64", "uint16", "bool"]):
        for shape in [(7,), (4, 3), (3, 4, 5), (2, 3, 4, 5)]:
            arr[f"r{len(shape)}.{dt}"] = np.asfortranarray(sample(dt, shape, 10 * i + len(shape)))
    src = tmp_path / name
    np.savez_compressed(src, **arr)
    with zipfile.ZipFile(src) as z:
        for info in z.infolist():
            assert info.compress_type == zipfile.ZIP_DEFLATED
            with z.open(info) as f:
                np.lib.format.read_magic(f)
                shape, fortran, _ = np.lib.format.read_array_header_1_0(f)
                assert fortran == (len(shape) > 1), (info.filename, shape, fortran)
    return src


def test_npz_compressed_fortran_members(tmp_path, mount):
    """A Fortran-ordered array in a compressed member, which np.load reads: its member is
    inflated once into a private file and the array gathered from it: the bytes are np.load's
    row-major ones through the mount (tensor files, their .npy views, checkpoint.safetensors and
    .pack), ckpt ls/cat/pack/convert and ckload."""
    from safetensors.numpy import load_file
    src = fortran_npz(tmp_path)
    want = check_everywhere(mount, src, "npz", tmp_path)
    with np.load(src) as z:
        arrays_of = {k: z[k] for k in z.files}
    with mount(src, options=["npy"]) as mnt:
        index = json.loads((mnt / ".ckptfs" / "index.json").read_bytes())
        assert "omitted" not in index
        for t in index["tensors"]:
            view = np.load(Path(f"{mnt / t['path']}.npy"))
            a = arrays_of[t["name"]]
            assert view.dtype == a.dtype and view.shape == a.shape, t["name"]
            assert np.ascontiguousarray(view).tobytes() == want[t["name"]][2], t["name"]
    out = tmp_path / "out.safetensors"
    p = ckpt("convert", src, out)
    assert p.returncode == 0, p.stderr
    got = load_file(str(out))
    assert set(got) == set(want)
    for k, a in got.items():
        assert np.ascontiguousarray(a).tobytes() == want[k][2], k


def read_direct(fd, n, off):
    """n bytes at off through an O_DIRECT descriptor, into a page-aligned buffer."""
    import mmap
    buf = mmap.mmap(-1, n)
    return buf[:os.preadv(fd, [buf], off)]


@pytest.mark.parametrize("change", ["rewritten", "appended", "renamed over"])
def test_npz_compressed_fortran_copy_checks_its_archive(tmp_path, mount, change):
    """The inflated copy is the archive's bytes only while the archive is unchanged: after the
    first read made it, a .npz rewritten in place (same size, other bytes), grown, or replaced
    by another file renamed over its path fails every read of the array, the copied one as well
    as one never read, and never serves the copy (nor the old archive's bytes)."""
    import errno
    src = fortran_npz(tmp_path)
    want = expected(src)
    other = fortran_npz(tmp_path, "other.npz")  # same arrays: the same size; other bytes below
    with mount(src) as mnt:
        a, b = mnt / "r3" / "float32", mnt / "r4" / "int64"
        assert a.read_bytes() == want["r3.float32"][2]  # the copy is made
        fa = os.open(a, os.O_RDONLY | os.O_DIRECT)
        fb = os.open(b, os.O_RDONLY)  # opened before, never read: nothing cached
        try:
            assert read_direct(fa, 4096, 0) == want["r3.float32"][2][:4096]
            st = os.stat(src)
            if change == "rewritten":
                data = bytearray(other.read_bytes())
                data[100:108] = b"\xff" * 8  # in the first member's compressed bytes
                with open(src, "r+b") as f:
                    f.write(data)
                os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
            elif change == "appended":
                with open(src, "ab") as f:
                    f.write(b"\0" * 64)
            else:
                os.rename(other, src)
            for fd, read in ((fa, lambda: read_direct(fa, 4096, 0)),
                             (fb, lambda: os.pread(fb, 4096, 0))):
                with pytest.raises(OSError) as e:
                    read()
                assert e.value.errno in (errno.EIO, errno.ESTALE), e.value
        finally:
            os.close(fa)
            os.close(fb)


def test_npz_names_map_to_the_tree(tmp_path, mount):
    """Member KEY.npy is tensor KEY: '.' splits into directories, '/' is escaped (tree rule)."""
    src = tmp_path / "names.npz"
    np.savez(src, **{"params/dense/kernel": np.ones(3, np.float32),
                     "layer.0.weight": np.zeros(2, np.int8), "x.npy": np.arange(2)})
    with mount(src) as mnt:
        index = json.loads((mnt / ".ckptfs" / "index.json").read_bytes())
        paths = {t["name"]: t["path"] for t in index["tensors"]}
        assert paths == {"params/dense/kernel": "params%2Fdense%2Fkernel",
                         "layer.0.weight": "layer/0/weight", "x.npy": "x/npy"}
        assert (mnt / "layer" / "0" / "weight").read_bytes() == bytes(2)


def test_deflated_member_many_seek_points(tmp_path, mount):
    """A member of several MiB of output: reads anywhere, through every seek point, match."""
    rng = np.random.default_rng(7)
    big = np.concatenate([np.arange(1_500_000, dtype=np.int32),
                          rng.integers(0, 50, 1_500_000, dtype=np.int32)])
    src = tmp_path / "big.npz"
    np.savez_compressed(src, big=big, small=np.arange(3.0))
    want = expected(src)
    with mount(src) as mnt:
        check_index_and_bytes(mnt, want, "npz")
        check_random_reads(mnt / "big", want["big"][2], n=150, seed=3)
    check_ckload(src, want)


@pytest.mark.parametrize("bypass", ["1", "0"])
def test_ckload_from_a_mount(tmp_path, mount, monkeypatch, bypass):
    """A mount of an .npz loads whole: from its sources (the bypass) or through the mount, and
    its virtual pack likewise."""
    monkeypatch.setenv("CKLOAD_BYPASS", bypass)
    src = tmp_path / "m.npz"
    arr = {k: v for k, v in arrays().items() if k.startswith("c.")}
    np.savez_compressed(src, **arr)
    want = expected(src)
    how = "bypass" if bypass == "1" else "mount"
    with mount(src) as mnt:
        check_ckload(mnt, want, how)
        check_ckload(mnt / ".ckptfs" / "checkpoint.pack", want, how)


def test_mixed_stored_and_deflated_members(tmp_path, mount):
    src = tmp_path / "mixed.npz"
    with zipfile.ZipFile(src, "w") as z:
        for i, (key, method) in enumerate([("a", zipfile.ZIP_STORED),
                                           ("b", zipfile.ZIP_DEFLATED)]):
            buf = io.BytesIO()
            np.save(buf, sample("float64", (50, 7), i))
            z.writestr(zipfile.ZipInfo(f"{key}.npy"), buf.getvalue(), compress_type=method)
    check_everywhere(mount, src, "npz", tmp_path)


# --- the corpus ------------------------------------------------------------------------------

@pytest.mark.parametrize("name,fmt", [("candle_test.npy", "npy"), ("candle_test.npz", "npz"),
                                      ("whisper_mel_filters.npz", "npz")])
def test_corpus(corpus, tmp_path, mount, name, fmt):
    check_everywhere(mount, corpus / name, fmt, tmp_path)


# --- what is refused -------------------------------------------------------------------------

def refused(src, *words):
    p = ckpt("ls", src)
    err = p.stderr.decode()
    assert p.returncode == 1 and err.count("\n") == 1, err
    assert err.startswith(f"ckpt: {src}: "), err
    for w in words:
        assert w in err, (w, err)
    return err


@pytest.mark.parametrize("array,words", [
    (np.asfortranarray(np.zeros((2, 3), dtype=">f4")), ["big-endian", "Fortran-ordered"]),
    (np.array(["ab", "c"]), ["'<U2'", "string"]),
    (np.array([b"ab"]), ["'|S2'", "string"]),
    (np.array(["2020-01-01"], dtype="datetime64[D]"), ["'<M8[D]'", "datetime"]),
    (np.array([1], dtype="timedelta64[s]"), ["'<m8[s]'", "timedelta"]),
    (np.zeros(2, dtype="V4"), ["'|V4'", "void"]),
    (np.zeros(2, dtype=[("x", "<f4"), ("y", "<i2")]), ["structured"]),
    (np.array([1, "x"], dtype=object), ["'|O'", "allow_pickle"]),
    (np.zeros(2, dtype=np.longdouble), ["'<f16'", "not a dtype ckptfs knows"]),
])
def test_refused_dtypes(tmp_path, array, words):
    src = tmp_path / "r.npy"
    np.save(src, array, allow_pickle=True)
    refused(src, *words)
    z = tmp_path / "r.npz"  # in an archive: that member left out, with the same reason
    np.savez(z, bad=array, good=np.arange(3))
    if array.dtype.byteorder == ">":  # a tensor, but one that cannot be served: the archive too
        assert "member 'bad.npy'" in refused(z, *words)
        return
    doc = json.loads(ckpt("ls", z, "--json").stdout)
    assert [t["name"] for t in doc["tensors"]] == ["good"]
    assert [o["name"] for o in doc["omitted"]] == ["bad"]
    for w in words:
        assert w in doc["omitted"][0]["reason"], (w, doc["omitted"])


def test_zip_neither_npz_nor_torch(tmp_path):
    src = tmp_path / "w.npz"
    with zipfile.ZipFile(src, "w") as z:
        z.writestr("readme.txt", "hello")
    refused(src, "neither an .npz", "'readme.txt'", "PyTorch")


def test_npz_with_another_member(tmp_path):
    """A member that is no .npy is left out, with the reason; the arrays are served."""
    src = tmp_path / "w.npz"
    with zipfile.ZipFile(src, "w") as z:
        buf = io.BytesIO()
        np.save(buf, np.arange(3))
        z.writestr("a.npy", buf.getvalue())
        z.writestr("notes.txt", "hello")
    doc = json.loads(ckpt("ls", src, "--json").stdout)
    assert [t["name"] for t in doc["tensors"]] == ["a"]
    assert doc["omitted"][0]["name"] == "notes.txt" and "not an .npy" in doc["omitted"][0]["reason"]


def test_torch_zip_still_torch(tmp_path, mount):
    src = tmp_path / "t.pt"
    torch.save({"w": torch.arange(4.0)}, src)
    p = ckpt("ls", src, "--json")
    assert json.loads(p.stdout)["format"] == "pytorch-zip"
