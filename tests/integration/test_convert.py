"""`ckpt convert`: every output is read back by the safetensors library (safe_open, load_file) and
compared byte for byte with what torch.load, np.load or gguf-py read from the source; sharded
output is loaded through its model.safetensors.index.json (and by transformers where it is
installed). Also: determinism, atomicity (failures midway leave nothing), --only, dtypes
safetensors lacks, tied tensors, and --to pack against `ckpt pack`."""
import errno
import json
import os
import re
import signal

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ckptfs_testlib import ckpt_bin, need_module, run
from test_gguf import expected as gguf_expected, write_model as write_gguf
from test_pack import limited_to_1mib, one_line

INDEX = "model.safetensors.index.json"


def ckpt(*args, timeout=120, **kw):
    return run([ckpt_bin(), *args], timeout=timeout, **kw)


def convert(src, out, *extra):
    p = ckpt("convert", src, out, *extra)
    assert p.returncode == 0, p.stderr.decode()
    assert p.stderr == b"", p.stderr  # not a terminal: no progress bar
    return out


def raw(t):
    """A tensor's bytes, row-major, as torch holds them."""
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def nbytes(t):
    return t.numel() * t.element_size()


def torch_source(tmp_path):
    g = torch.Generator().manual_seed(5)
    base = torch.randn(6, 4, generator=g)
    sd = {
        "layers.10.w": torch.randn(3, 3, generator=g).to(torch.float16),
        "layers.2.w": torch.randn(5, generator=g).to(torch.bfloat16),
        "f64": torch.randn(2, 2, generator=g, dtype=torch.float64),
        "i64": torch.arange(-3, 3, dtype=torch.int64).reshape(2, 3),
        "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "flags": torch.tensor([True, False, True]),
        "scalar": torch.tensor(7, dtype=torch.int32),
        "empty": torch.zeros(0, 3),
        "embed.weight": base,
        "lm_head.weight": base,               # tied: the same storage, dtype and shape
        "transposed": base.t(),               # the same storage seen as another tensor
        "rows": base[2:4],                    # a slice of it
        "step": 3,                            # a value, not a tensor
    }
    path = tmp_path / "src.bin"
    torch.save(sd, path)
    return path


def check_against_torch(src, files):
    """files: the safetensors files of one conversion of src. Every tensor of torch.load(src) is
    in one of them with its bytes, or is an alias recorded in __metadata__ of a tensor with the
    same bytes; the metadata is HF's ("format": "pt") and the same in every file."""
    want = {k: v for k, v in torch.load(src, weights_only=True).items() if torch.is_tensor(v)}
    got, metas = {}, []
    for f in files:
        with safe_open(str(f), "pt") as st:
            metas.append(st.metadata())
        got.update(load_file(str(f)))
    assert all(m == metas[0] for m in metas)
    meta = metas[0]
    assert meta["format"] == "pt"
    for name, t in want.items():
        kept = meta.get(name, name) if name not in got else name
        assert kept in got, name
        assert got[kept].dtype == t.dtype and got[kept].shape == t.shape, name
        assert raw(got[kept]) == raw(t), name
    assert set(got) <= set(want)
    return got, meta


def test_torch_to_safetensors(tmp_path):
    src = torch_source(tmp_path)
    out = convert(src, tmp_path / "out.safetensors")
    got, meta = check_against_torch(src, [out])
    # tied: the first name in natural order is kept, the alias dropped and recorded
    assert "embed.weight" in got and "lm_head.weight" not in got
    assert meta["lm_head.weight"] == "embed.weight"
    # a different view of the same bytes is written on its own
    assert "transposed" in got and "rows" in got
    assert "step" not in got


def test_natural_order(tmp_path):
    out = convert(torch_source(tmp_path), tmp_path / "out.safetensors")
    n = int.from_bytes(out.read_bytes()[:8], "little")
    header = json.loads(out.read_bytes()[8:8 + n])
    names = [k for k in header if k != "__metadata__"]
    starts = [header[k]["data_offsets"][0] for k in names]
    assert starts == sorted(starts)
    assert names.index("layers.2.w") < names.index("layers.10.w")


def test_source_metadata_is_kept(tmp_path):
    src = tmp_path / "src.safetensors"
    save_file({"a": torch.ones(3), "b": torch.arange(4)}, str(src), metadata={"note": "x"})
    out = convert(src, tmp_path / "out.safetensors")
    with safe_open(str(out), "pt") as st:
        assert st.metadata() == {"note": "x", "format": "pt"}
    for k, v in load_file(str(src)).items():
        assert raw(load_file(str(out))[k]) == raw(v)


def test_numpy_source(tmp_path):
    a = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    np.save(tmp_path / "x.npy", a)
    out = convert(tmp_path / "x.npy", tmp_path / "out.safetensors")
    got = load_file(str(out))
    assert len(got) == 1
    (t,) = got.values()
    assert t.numpy().tobytes() == a.tobytes() and tuple(t.shape) == a.shape


def shard_files(d):
    index = json.loads((d / INDEX).read_text())
    files = sorted(set(index["weight_map"].values()))
    n = len(files)
    assert files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    assert sorted(os.listdir(d)) == sorted(files + [INDEX])
    return index, [d / f for f in files]


def test_sharded(tmp_path):
    src = torch_source(tmp_path)
    out = tmp_path / "sharded"
    convert(src, out, "--max-shard-size", "64")
    index, files = shard_files(out)
    assert len(files) > 2
    got, _ = check_against_torch(src, files)
    sizes = {}
    for f in files:  # every tensor is in the shard the index names
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                assert index["weight_map"][k] == f.name
                sizes.setdefault(f.name, []).append(nbytes(st.get_tensor(k)))
    assert set(index["weight_map"]) == set(got)
    assert index["metadata"]["total_size"] == sum(nbytes(t) for t in got.values())
    for s in sizes.values():  # within the limit, or one tensor alone
        assert sum(s) <= 64 or len([x for x in s if x]) == 1


def test_sharded_loads_with_transformers(tmp_path):
    modeling_utils = need_module("transformers.modeling_utils")
    src = torch_source(tmp_path)
    out = convert(src, tmp_path / "sharded", "--max-shard-size", "64")
    single = load_file(str(convert(src, tmp_path / "one.safetensors")))
    index, files = shard_files(out)
    merged = {}
    for f in files:
        merged.update(modeling_utils.load_state_dict(str(f)))
    assert set(merged) == set(single)
    assert all(raw(merged[k]) == raw(single[k]) for k in single)


@pytest.mark.parametrize("size,nshards", [("1KB", 2), ("1000", 2), ("999", 3), ("1KiB", 2),
                                          ("1MB", 1), ("1GiB", 1)])
def test_shard_size_units(tmp_path, size, nshards):
    src = tmp_path / "src.safetensors"
    save_file({f"t{i}": torch.full((125,), float(i)) for i in range(3)}, str(src))  # 500 B each
    out = convert(src, tmp_path / "out", "--max-shard-size", size)
    _, files = shard_files(out)
    assert len(files) == nshards


@pytest.mark.parametrize("bad", [["--max-shard-size", "5XB"], ["--max-shard-size", "0"],
                                 ["--to", "gguf"], ["--to", "pack", "--max-shard-size", "1GB"],
                                 ["--bogus"]])
def test_usage_errors(tmp_path, bad):
    p = ckpt("convert", torch_source(tmp_path), tmp_path / "out", *bad)
    assert p.returncode == 2 and one_line(p.stderr)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra", [[], ["--max-shard-size", "64"]], ids=["file", "sharded"])
def test_deterministic(tmp_path, extra):
    src = torch_source(tmp_path)
    a, b = convert(src, tmp_path / "a", *extra), convert(src, tmp_path / "b", *extra)
    if a.is_dir():
        assert sorted(os.listdir(a)) == sorted(os.listdir(b))
        assert all((a / f).read_bytes() == (b / f).read_bytes() for f in os.listdir(a))
    else:
        assert a.read_bytes() == b.read_bytes()


def test_truncated_source_leaves_nothing(tmp_path):
    src = torch_source(tmp_path)
    data = src.read_bytes()
    src.write_bytes(data[:len(data) // 2])
    for extra in ([], ["--max-shard-size", "64"]):
        p = ckpt("convert", src, tmp_path / "out", *extra)
        assert p.returncode == 1 and one_line(p.stderr)
        assert sorted(os.listdir(tmp_path)) == ["src.bin"]


@pytest.mark.parametrize("extra", [[], ["--max-shard-size", "600KB"]], ids=["file", "sharded"])
def test_a_write_error_midway_leaves_nothing(tmp_path, extra):
    """Under a 1 MiB file size limit: sharded, three shards of 512 KiB are written before the
    fourth (a 1.5 MiB tensor alone) fails."""
    src = tmp_path / "src.safetensors"
    t = {f"t{i}": torch.full(((1 << 19) // 4,), float(i)) for i in range(3)}
    t["t3"] = torch.ones(3 * (1 << 19) // 4)
    save_file(t, str(src))
    out = tmp_path / "out"
    p = run([ckpt_bin(), "convert", src, out, *extra], timeout=60,
            preexec_fn=limited_to_1mib(signal.SIG_DFL))
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert os.strerror(errno.EFBIG) in one_line(p.stderr)
    assert os.listdir(tmp_path) == ["src.safetensors"]


def test_existing_directory_is_not_replaced(tmp_path):
    src = torch_source(tmp_path)
    out = convert(src, tmp_path / "out", "--max-shard-size", "64")
    before = {f: (out / f).read_bytes() for f in os.listdir(out)}
    p = ckpt("convert", src, out, "--max-shard-size", "128")
    assert p.returncode == 1 and one_line(p.stderr)
    assert {f: (out / f).read_bytes() for f in os.listdir(out)} == before
    assert sorted(os.listdir(tmp_path)) == ["out", "src.bin"]


@pytest.mark.parametrize("only,names", [("layers", {"layers.2.w", "layers.10.w"}),
                                        ("*.weight", {"embed.weight"}), ("i8", {"i8"})])
def test_only(tmp_path, only, names):
    out = convert(torch_source(tmp_path), tmp_path / "out.safetensors", "--only", only)
    assert set(load_file(str(out))) == names


def test_only_selecting_nothing_fails(tmp_path):
    p = ckpt("convert", torch_source(tmp_path), tmp_path / "out", "--only", "nothing")
    assert p.returncode == 1 and "nothing" in one_line(p.stderr)
    assert not (tmp_path / "out").exists()


def test_unsupported_dtypes(tmp_path):
    src = write_gguf(tmp_path / "m.gguf")
    p = ckpt("convert", src, tmp_path / "out")
    line = one_line(p.stderr)
    assert p.returncode == 1 and re.search(r"tensor 'q\.\w+' is \w+", line), line
    assert "--skip-unsupported" in line and not (tmp_path / "out").exists()

    out = convert(src, tmp_path / "out", "--skip-unsupported")
    tensors, _ = gguf_expected([src])
    got = load_file(str(out))
    with safe_open(str(out), "pt") as st:
        meta = st.metadata()
    omitted = set(json.loads(meta["ckptfs.omitted"]))
    assert set(got) | omitted == set(tensors) and not set(got) & omitted
    # the GGUF types safetensors has (its spec's dtype names) are written, the others omitted
    assert omitted == {k for k, v in tensors.items()
                       if v[0] not in ("F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8")}
    for k, t in got.items():
        dtype, shape, _, data, _ = tensors[k]
        assert list(t.shape) == shape and raw(t) == data, k
    assert meta["format"] == "pt"


def test_to_pack_is_ckpt_pack(tmp_path):
    src = torch_source(tmp_path)
    a = convert(src, tmp_path / "a.pack", "--to", "pack", "--only", "layers")
    b = tmp_path / "b.pack"
    p = ckpt("pack", src, b, "--only", "layers")
    assert p.returncode == 0
    assert a.read_bytes() == b.read_bytes()


def test_help():
    p = ckpt("convert", "--help")
    assert p.returncode == 0 and b"--max-shard-size" in p.stdout
    assert b"ckpt convert" in ckpt("--help").stdout


def test_npz_and_pack_sources(tmp_path):
    a = {"a": np.arange(5.0), "b": np.ones((2, 2), np.int16)}
    np.savez(tmp_path / "z.npz", **a)
    got = load_file(str(convert(tmp_path / "z.npz", tmp_path / "z.safetensors")))
    assert {k: raw(v) for k, v in got.items()} == {k: v.tobytes() for k, v in a.items()}

    src = torch_source(tmp_path)
    pk = convert(src, tmp_path / "src.pack", "--to", "pack")
    check_against_torch(src, [convert(pk, tmp_path / "from-pack.safetensors")])


def test_an_output_that_is_its_source_is_refused(tmp_path):
    """`ckpt convert m.pt m.pt` replaced its own source (its values lost): refused as `cp a a` is,
    by device and inode, whatever the spelling (a symlink, another path, OUT a directory whose
    output file is the source), and for `ckpt pack` and --to pack alike; a sharded output that
    would replace the directory holding the source's shards is refused too. The source keeps
    every byte; an output beside it is fine."""
    torch.save({"w": torch.arange(6.0), "step": 5}, tmp_path / "m.pt")
    before = (tmp_path / "m.pt").read_bytes()
    (tmp_path / "link.pt").symlink_to("m.pt")
    (tmp_path / "sub").mkdir()
    elsewhere = os.path.relpath(tmp_path / "m.pt", tmp_path / "sub")
    cases = [("convert", "m.pt", "m.pt"), ("convert", "m.pt", "./link.pt"),
             ("convert", "m.pt", f"../{tmp_path.name}/m.pt"), ("pack", "m.pt", "m.pt"),
             ("pack", "link.pt", "m.pt"), ("convert", "m.pt", "m.pt", "--to", "pack"),
             ("convert", "m.pt", "m.pt", "--max-shard", "1K", "--force")]
    for cmd, src, out, *extra in cases:
        p = ckpt(cmd, src, out, *extra, cwd=tmp_path)
        assert p.returncode == 1, (cmd, src, out, p.stderr)
        assert p.stderr.decode() == f"ckpt: '{src}' and '{out}' are the same file\n", p.stderr
        assert (tmp_path / "m.pt").read_bytes() == before
    p = ckpt("convert", elsewhere, ".", "--to", "pack", cwd=tmp_path / "sub")
    assert p.returncode == 0 and not (tmp_path / "sub" / "m.pt").exists(), p.stderr
    shards = tmp_path / "shards"
    shards.mkdir()
    save_file({"a": torch.ones(300)}, str(shards / "model.safetensors"))
    save_file({"b": torch.ones(300)}, str(shards / "other.safetensors"))
    p = ckpt("convert", shards / "model.safetensors", shards)  # OUT/model.safetensors
    assert p.returncode == 1 and p.stderr.decode() == (
        f"ckpt: '{shards}/model.safetensors' and '{shards}/model.safetensors' are the same "
        f"file\n"), p.stderr
    p = ckpt("convert", shards, shards, "--max-shard", "1K", "--force")
    assert p.returncode == 1, p.stderr
    assert re.fullmatch(rf"ckpt: {shards}: holds '{shards}/\w+\.safetensors', a file of the "
                        rf"source, which the output would replace\n", p.stderr.decode()), p.stderr
    assert sorted(os.listdir(shards)) == ["model.safetensors", "other.safetensors"]
    assert torch.equal(load_file(str(shards / "other.safetensors"))["b"], torch.ones(300))
    convert(shards, tmp_path / "out", "--max-shard", "1K")
