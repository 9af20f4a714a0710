"""GGUF files through the mount, `ckpt`, the pack, the virtual safetensors file and the loader,
checked against gguf-py's GGUFReader (the PyPI `gguf` package): names, types, shapes, offsets
and raw bytes of every tensor, and every key with its type and value. Files are written by
gguf-py's GGUFWriter (every key type, every tensor type, quantized ones through gguf-py's own
quantizers where it has one, split sets), plus the corpus file."""
import json
import os
import shutil
import struct

import numpy as np
import pytest
import torch
from safetensors import safe_open

import gguf
from gguf import GGMLQuantizationType as Q, GGUFReader, GGUFValueType as V, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES

import ckload
from ckptfs_testlib import assert_refused, ckpt_bin, read_index, run
from test_pack import pack

CORPUS_FILE = "ollama_llama2_tiny_random.gguf"
META = "__metadata__"
# gguf-py's Q8_1 block is 40 bytes, ggml's (ggml-common.h block_q8_1: half2 ds + 32 codes) 36:
# no file holds Q8_1 (it is ggml's scratch type for dot products), so it is not written here.
SKIP_TYPES = {Q.Q8_1}
PLAIN = {Q.F32: np.float32, Q.F16: np.float16, Q.F64: np.float64, Q.I8: np.int8,
         Q.I16: np.int16, Q.I32: np.int32, Q.I64: np.int64}

SCALARS = [("t.u8", V.UINT8, 255), ("t.i8", V.INT8, -128), ("t.u16", V.UINT16, 65535),
           ("t.i16", V.INT16, -32768), ("t.u32", V.UINT32, 2**32 - 1),
           ("t.i32", V.INT32, -2**31), ("t.f32", V.FLOAT32, 0.1), ("t.bool", V.BOOL, True),
           ("t.false", V.BOOL, False), ("t.str", V.STRING, "h\u00e9llo \"q\" \\ \n\t\x01 \u2603"),
           ("t.empty_str", V.STRING, ""), ("t.u64", V.UINT64, 2**64 - 1),
           ("t.i64", V.INT64, -2**63), ("t.f64", V.FLOAT64, 1 / 3),
           ("t.big_i64", V.INT64, 2**63 - 1)]
ARRAYS = [("a.u8", V.UINT8, [0, 1, 255]), ("a.i32", V.INT32, [-1, 2, -3]),
          ("a.f32", V.FLOAT32, [0.5, -1.25, 3e-7]), ("a.bool", V.BOOL, [True, False]),
          ("a.str", V.STRING, ["a", "", "\u00fc"]), ("a.u64", V.UINT64, [2**64 - 1, 0]),
          ("a.i64", V.INT64, [-2**63]), ("a.f64", V.FLOAT64, [1e300, -2.5]),
          ("a.u16", V.UINT16, [7]), ("a.i8", V.INT8, [-7]),
          ("a.i16", V.INT16, [-300]), ("a.u32", V.UINT32, [4_000_000_000])]


def ckpt(*args, timeout=120):
    return run([ckpt_bin(), *args], timeout=timeout)


def quantized(qtype, rows, rng):
    """A tensor of type qtype, rows x (2 blocks): gguf-py's quantizer where it has one, else
    random blocks (every type's bytes are raw to the reader). Returns (array, raw_dtype)."""
    block, size = GGML_QUANT_SIZES[qtype]
    x = rng.standard_normal((rows, 2 * block)).astype(np.float32)
    try:
        return gguf.quants.quantize(x, qtype), qtype
    except (NotImplementedError, gguf.quants.QuantError):
        return rng.integers(0, 256, (rows, 2 * size), dtype=np.uint8), qtype


def write_model(path, rng=None, split_max_tensors=0):
    """A GGUF with every key type, arrays of each, and a tensor of every type gguf-py knows."""
    rng = rng or np.random.default_rng(1)
    w = GGUFWriter(str(path), "llama", split_max_tensors=split_max_tensors)
    w.add_name("test model")
    for key, vt, v in SCALARS:
        w.add_key_value(key, v, vt)
    for key, vt, v in ARRAYS:
        w.add_key_value(key, v, V.ARRAY, sub_type=vt)
    w.add_token_list([f"tok{i}" for i in range(1000)])
    for t, dt in PLAIN.items():
        x = (rng.standard_normal((3, 5)) * 100).astype(dt)
        w.add_tensor(f"plain.{t.name.lower()}", x, raw_dtype=t)
    w.add_tensor("blk.0.attn_q.weight", rng.standard_normal((4, 8)).astype(np.float32))
    w.add_tensor("bf16", gguf.quants.quantize(rng.standard_normal((2, 6)).astype(np.float32),
                                              Q.BF16), raw_dtype=Q.BF16)
    w.add_tensor("vec", np.arange(7, dtype=np.float32))
    w.add_tensor("cube", rng.standard_normal((2, 3, 4)).astype(np.float16))
    for qt in Q:
        if qt in PLAIN or qt in SKIP_TYPES or qt in (Q.BF16,):
            continue
        data, raw = quantized(qt, 3, rng)
        w.add_tensor(f"q.{qt.name.lower()}", data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def field_value(f):
    """A GGUFReader field as (type, item_type, value): value as gguf-py decodes it."""
    types = f.types
    item = types[1].name if types[0] == V.ARRAY else None
    return types[0].name, item, f.contents()


def same_value(vtype, want, got):
    if vtype in ("FLOAT32", "FLOAT64"):
        cast = np.float32 if vtype == "FLOAT32" else np.float64
        if isinstance(want, list):
            return len(want) == len(got) and all(cast(a) == cast(b) for a, b in zip(want, got))
        return cast(want) == cast(got)
    return want == got


def expected(paths):
    """{name: (dtype, shape, offset, bytes, path)} and {key: (type, item_type, value)} of a
    file or a split set, as GGUFReader reads them (split keys of later splits left out)."""
    tensors, keys = {}, {}
    for k, p in enumerate(paths):
        r = GGUFReader(str(p))
        for f in r.fields.values():
            if f.name.startswith("GGUF.") or k:
                continue
            keys[f.name] = field_value(f)
        for t in r.tensors:
            shape = [int(d) for d in reversed(t.shape.tolist())]
            assert t.name not in tensors
            tensors[t.name] = (t.tensor_type.name, shape, int(t.data_offset),
                               t.data.tobytes(), str(p))
    return tensors, keys


def check_index(index, tensors, keys, fmt):
    assert index["format"] == fmt
    got = {t["name"]: t for t in index["tensors"]}
    assert set(got) == set(tensors)
    for name, (dtype, shape, _, data, _) in tensors.items():
        ent = got[name]
        assert ent["dtype"] == dtype, name
        assert ent["shape"] == shape, name
        assert ent["nbytes"] == len(data), name
    meta = index["metadata"]
    assert set(meta) == set(keys)
    for key, (vtype, item, value) in keys.items():
        m = meta[key]
        assert m["type"] == vtype, key
        assert m.get("item_type") == item, key
        assert same_value(item or vtype, value, m["value"]), (key, value, m["value"])
    values = {v["name"]: v for v in index.get("values", [])}
    assert set(values) == {f"{META}.{k}" for k in keys}


def check_files(mnt, index, tensors, keys):
    for ent in index["tensors"]:
        p = mnt / ent["path"]
        assert p.read_bytes() == tensors[ent["name"]][3], ent["name"]
        assert os.getxattr(p, "user.ckptfs.dtype") == ent["dtype"].encode()
        assert json.loads(os.getxattr(p, "user.ckptfs.shape")) == ent["shape"]
    for key, (vtype, item, value) in keys.items():
        text = (mnt / META / key.replace(".", "/")).read_bytes()
        assert text.endswith(b"\n"), key
        text = text[:-1]
        if vtype == "STRING":
            assert text == value.encode(), key
        else:
            assert same_value(item or vtype, value, json.loads(text)), (key, text)


def check_mount(mount, src, paths, fmt):
    tensors, keys = expected(paths)
    with mount(src) as mnt:
        index = read_index(mnt)
        check_index(index, tensors, keys, fmt)
        check_files(mnt, index, tensors, keys)
    return tensors, keys


def check_ls(src, tensors):
    p = ckpt("ls", "--json", src)
    assert p.returncode == 0, p.stderr.decode()
    listed = {t["name"]: t for t in json.loads(p.stdout)["tensors"]}
    for name, (_, _, offset, _, path) in tensors.items():
        assert listed[name]["offset"] == offset, name
        assert listed[name]["file"] == path, name


# --- files written by GGUFWriter ------------------------------------------------------------


@pytest.fixture
def model(tmp_path):
    return write_model(tmp_path / "model.gguf")


def test_every_type_against_gguf_py(model, mount):
    tensors, keys = check_mount(mount, model, [model], "gguf")
    assert {t[0] for t in tensors.values()} >= {"Q4_0", "Q4_K", "Q6_K", "IQ2_XXS", "MXFP4",
                                                "TQ1_0", "BF16", "F64", "I64"}
    assert {k[0] for k in keys.values()} == {v.name for v in V}
    check_ls(model, tensors)


def test_names_paths_and_values(model, mount):
    with mount(model) as mnt:
        assert (mnt / "blk/0/attn_q/weight").stat().st_size == 4 * 8 * 4
        assert (mnt / META / "general/architecture").read_text() == "llama\n"
        assert (mnt / META / "t/u64").read_text() == f"{2**64 - 1}\n"
        assert (mnt / META / "t/bool").read_text() == "true\n"
        tokens = json.loads((mnt / META / "tokenizer/ggml/tokens").read_text())
        assert tokens == [f"tok{i}" for i in range(1000)]
        meta = read_index(mnt)["metadata"]
        assert meta["t.i64"]["value"] == -2**63 and meta["t.big_i64"]["value"] == 2**63 - 1


def test_ckpt_cat(model):
    tensors, _ = expected([model])
    for name in ("q.q4_k", "plain.i64", "cube"):
        p = ckpt("cat", model, name)
        assert p.returncode == 0, p.stderr.decode()
        assert p.stdout == tensors[name][3], name


def test_corpus_file(corpus, mount):
    src = corpus / CORPUS_FILE
    tensors, keys = check_mount(mount, src, [src], "gguf")
    assert "tokenizer.ggml.tokens" in keys
    check_ls(src, tensors)


def test_version_2(tmp_path, model, mount):
    v2 = tmp_path / "v2.gguf"
    data = bytearray(model.read_bytes())
    data[4:8] = struct.pack("<I", 2)
    v2.write_bytes(bytes(data))
    assert GGUFReader(str(v2)).fields["GGUF.version"].contents() == 2
    check_mount(mount, v2, [v2], "gguf")


def test_big_endian_is_refused(tmp_path, mountpoint):
    path = tmp_path / "be.gguf"
    w = GGUFWriter(str(path), "llama", endianess=gguf.GGUFEndian.BIG)
    w.add_tensor("x", np.arange(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    line = assert_refused(path, mountpoint)
    assert "byte-swapped (big-endian)" in line, line


# --- pack, safetensors view, loader ---------------------------------------------------------


def test_pack_round_trip(tmp_path, model, mount):
    tensors, _ = expected([model])
    out = pack(model, tmp_path / "m.pack")
    p = ckpt("verify", out)
    assert p.returncode == 0, p.stderr.decode()
    with mount(out) as mnt:
        index = read_index(mnt)
        got = {t["name"]: t for t in index["tensors"]}
        assert set(got) == set(tensors)
        for name, (dtype, shape, _, data, _) in tensors.items():
            assert (got[name]["dtype"], got[name]["shape"]) == (dtype, shape)
            assert (mnt / got[name]["path"]).read_bytes() == data, name
        assert (mnt / META / "general/architecture").read_text() == "llama\n"
    with mount(model) as mnt:
        assert (mnt / ".ckptfs" / "checkpoint.pack").read_bytes() == out.read_bytes()


def test_virtual_safetensors_omits_block_types(model, mount):
    tensors, _ = expected([model])
    with mount(model) as mnt:
        with safe_open(str(mnt / ".ckptfs" / "checkpoint.safetensors"), framework="pt") as f:
            keys = set(f.keys())
            omitted = set(json.loads(f.metadata()["ckptfs.omitted"]))
            for k in keys:
                got = f.get_tensor(k).contiguous().view(torch.uint8).numpy().tobytes()
                assert got == tensors[k][3], k
    assert keys | omitted == set(tensors) and not keys & omitted
    assert all(tensors[k][0] not in ("F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64")
               for k in omitted)
    assert {k for k in keys if tensors[k][0].startswith(("Q", "IQ", "TQ"))} == set()


def test_loader(model):
    tensors, _ = expected([model])
    with ckload.Load(str(model), device="cpu") as ld:
        ld.wait_all()
        assert ld.read_path == "source"
        seen = set()
        for i in range(len(ld)):
            name, dtype, shape, nbytes = ld.info(i)
            want = tensors[name]
            assert (dtype, list(shape), nbytes) == (want[0], want[1], len(want[3])), name
            t = ld.tensor(i)
            if dtype in ("F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"):
                assert list(t.shape) == want[1], name
            else:
                assert t.dtype == torch.uint8 and list(t.shape) == [len(want[3])], name
            assert t.contiguous().view(torch.uint8).numpy().tobytes() == want[3], name
            seen.add(name)
        assert seen == set(tensors)


# --- split sets ------------------------------------------------------------------------------


@pytest.fixture
def split_dir(tmp_path):
    d = tmp_path / "split"
    d.mkdir()
    write_model(d / "model.gguf", split_max_tensors=12)
    return d


def split_paths(d):
    return sorted(d.glob("*.gguf"))


def test_split_first_file_and_directory(split_dir, mount):
    paths = split_paths(split_dir)
    assert len(paths) > 2 and paths[0].name.endswith("-00001-of-%05d.gguf" % len(paths))
    tensors, _ = check_mount(mount, paths[0], paths, "gguf-split")
    check_mount(mount, split_dir, paths, "gguf-split")
    check_ls(paths[0], tensors)
    with ckload.Load(str(split_dir), device="cpu") as ld:
        ld.wait_all()
        for i in range(len(ld)):
            data = ld.tensor(i).contiguous().view(torch.uint8).numpy().tobytes()
            assert data == tensors[ld.name(i)][3]


def test_split_missing_is_refused(split_dir, mountpoint):
    paths = split_paths(split_dir)
    paths[1].unlink()
    line = assert_refused(paths[0], mountpoint, prefix=paths[1])
    assert "cannot open split 2 of" in line, line
    line = assert_refused(split_dir, mountpoint, prefix=paths[1])


def test_split_later_split_alone_is_refused(split_dir, mountpoint):
    paths = split_paths(split_dir)
    line = assert_refused(paths[1], mountpoint)
    assert "is split 2 of" in line and "open the first split" in line, line


def test_split_swapped_is_refused(split_dir, mountpoint):
    paths = split_paths(split_dir)
    tmp = split_dir / "tmp"
    shutil.move(paths[1], tmp)
    shutil.move(paths[2], paths[1])
    shutil.move(tmp, paths[2])
    line = assert_refused(paths[0], mountpoint, prefix=paths[1])
    assert "is not split 2 of" in line, line


def test_directory_of_unrelated_files_is_refused(tmp_path, mountpoint):
    d = tmp_path / "two"
    d.mkdir()
    write_model(d / "a.gguf")
    write_model(d / "b.gguf")
    line = assert_refused(d, mountpoint)
    assert "not one split set" in line, line
