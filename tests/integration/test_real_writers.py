"""Files that other writers really produce, read as their own libraries read them:
MLX's `"__metadata__": null`, numpy's Python 2 `L` dims, big-endian `.npy`, and `.npz`
archives with members that are not tensors. Each fixture is made by its writer where it runs
here (numpy), or byte by byte per the spec where it does not (MLX)."""
import json
import os
import struct
import subprocess

import numpy as np
import pytest

from ckptfs_testlib import ckpt_bin, library_view, raw_file, read_index


def ckpt_json(src):
    p = subprocess.run([ckpt_bin(), "ls", src, "--json"], capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_null_metadata_as_mlx_writes_it(tmp_path, mount):
    """MLX writes "__metadata__": null when it is given no metadata; the safetensors library
    reads such a file (metadata() is None), and so does ckptfs."""
    text = '{"__metadata__":null,"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    src = raw_file(tmp_path / "mlx.safetensors", text + " " * (-len(text) % 8),
                   bytes(range(8)))
    from safetensors import safe_open
    with safe_open(str(src), framework="numpy") as f:
        assert f.metadata() is None
    tensors, _ = library_view(src)
    got = ckpt_json(src)
    assert got["metadata"] == {}
    assert [t["name"] for t in got["tensors"]] == list(tensors)
    with mount(src) as mnt:
        assert (mnt / "w").read_bytes() == tensors["w"][2]
        assert read_index(mnt)["metadata"] == {}


BIG_ENDIAN = [">f2", ">f4", ">f8", ">i2", ">i4", ">i8", ">u2", ">u4", ">u8", ">c8", ">c16"]


def seeded(dtype, shape=(3, 5), seed=3):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape) * 1000
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(dtype)


@pytest.mark.parametrize("dtype", BIG_ENDIAN)
def test_big_endian_npy_is_served_little_endian(tmp_path, mount, dtype):
    """np.load reads a big-endian .npy; ckptfs serves it as the little-endian tensor (the bytes
    swapped on read, per scalar), says so in user.ckptfs.byteorder, and converts it so."""
    a = seeded(dtype)
    src = tmp_path / "b.npy"
    np.save(src, a)
    want = np.load(src).astype(np.dtype(dtype).newbyteorder("<")).tobytes()
    p = subprocess.run([ckpt_bin(), "cat", src, ""], capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout == want
    with mount(src) as mnt:
        f = mnt / "%"  # an .npy's one tensor, named "" (docs/FORMATS.md)
        assert f.read_bytes() == want
        assert os.getxattr(f, "user.ckptfs.byteorder") == b"big"
        with open(f, "rb") as h:  # reads that start and end inside a scalar
            h.seek(3)
            assert h.read(9) == want[3:12]
    if np.dtype(dtype).kind == "c":  # safetensors has no complex dtype
        return
    out = tmp_path / "out.safetensors"
    subprocess.run([ckpt_bin(), "convert", src, out], check=True, capture_output=True)
    from safetensors.numpy import load_file
    assert np.array_equal(load_file(str(out))[""], np.load(src))


def test_python2_long_dims(tmp_path):
    """A format 1.0 header written by Python 2's numpy says (2L, 3L); np.load reads it."""
    a = seeded("<f4", (2, 3))
    src = tmp_path / "l.npy"
    np.save(src, a)
    raw = bytearray(src.read_bytes())
    hlen = struct.unpack("<H", raw[8:10])[0]
    header = raw[10:10 + hlen].decode("latin1").replace("(2, 3)", "(2L, 3L)")
    header = header[:-1].rstrip(" ")
    header += " " * (hlen - len(header) - 1) + "\n"
    src.write_bytes(bytes(raw[:10]) + header.encode("latin1") + bytes(raw[10 + hlen:]))
    assert np.array_equal(np.load(src), a)
    got = ckpt_json(src)
    assert got["tensors"][0]["shape"] == [2, 3]
    p = subprocess.run([ckpt_bin(), "cat", src, ""], capture_output=True, timeout=60)
    assert p.stdout == a.tobytes()


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_with_members_that_are_not_tensors(tmp_path, mount, compressed):
    """np.savez of tensors beside strings, objects and a structured array: np.load reads the
    tensors, and so does ckptfs; each other member is listed in index.json's "omitted" (and by
    ckpt ls) with its reason, and a 0-d string is a value, a text file as a .pt's strings are."""
    src = tmp_path / "m.npz"
    members = {"w": seeded("<f4", (4, 3)), "tag": np.array("héllo"), "raw": np.array(b"ab\0c"),
               "words": np.array(["ab", "c"]), "objs": np.array([1, "x"], dtype=object),
               "rec": np.zeros(2, dtype=[("x", "<f4"), ("y", "<i2")]), "n": np.arange(5)}
    (np.savez_compressed if compressed else np.savez)(src, **members)
    with np.load(src, allow_pickle=True) as z:
        assert sorted(z.files) == sorted(members)
    doc = ckpt_json(src)
    assert [t["name"] for t in doc["tensors"]] == ["w", "n"]
    assert {o["name"] for o in doc["omitted"]} == {"words", "objs", "rec"}
    reasons = {o["name"]: o["reason"] for o in doc["omitted"]}
    assert "string" in reasons["words"] and "allow_pickle" in reasons["objs"] and \
        "structured" in reasons["rec"], reasons
    assert {v["name"]: v["type"] for v in doc["values"]} == {"tag": "str", "raw": "bytes"}
    lines = subprocess.run([ckpt_bin(), "ls", src], capture_output=True).stdout.decode()
    assert "words\tomitted\t" in lines
    with mount(src) as mnt:
        with np.load(src, allow_pickle=True) as z:
            assert (mnt / "w").read_bytes() == z["w"].tobytes()
            assert (mnt / "n").read_bytes() == z["n"].tobytes()
            assert (mnt / "tag").read_text() == str(z["tag"]) + "\n"
            assert (mnt / "raw").read_bytes() == bytes(z["raw"])
        assert {o["name"] for o in read_index(mnt)["omitted"]} == {"words", "objs", "rec"}
