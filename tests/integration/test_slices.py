"""Tensor-parallel slices (loader/slice.h, ckload's slices=, ckpt load --slice): each rank's part of
each tensor a rule cuts, read straight from the source, for every source the loader takes and
through a mount (bypass and CKLOAD_BYPASS=0). Byte-exact against torch.chunk of the tensor as
torch, the safetensors library, numpy or gguf-py read it; uneven splits (torch.chunk gives fewer
parts when they run out: the ranks past them get an empty part), dims 0, 1 and 2, strided and
offset PyTorch tensors; refusals (a dimension the tensor lacks, a compressed .npz member, a cut
through ggml blocks) are one line naming the tensor."""
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import ckload
from ckptfs_testlib import ckpt_bin, run, torch_bytes
from test_pack import pack

RULES = [("*.q_proj.weight", 0), ("*.o_proj.weight", 1), ("*.conv", 2), ("embed", 0),
         ("tiny", 0), ("*.norm", -1)]


def model():
    g = torch.Generator().manual_seed(18)
    return {"layers.0.q_proj.weight": torch.randn(7, 6, generator=g),
            "layers.0.o_proj.weight": torch.randn(6, 7, generator=g),
            "layers.0.conv": torch.randn(3, 4, 5, generator=g),
            "layers.0.norm": torch.randn(6, generator=g),
            "layers.1.q_proj.weight": torch.randn(9, 2, generator=g).to(torch.bfloat16),
            "embed": torch.randn(5, 3, generator=g).to(torch.float16),
            "tiny": torch.randn(2, 3, generator=g),
            "other": torch.arange(10, dtype=torch.int64)}


def strided_model():
    """The model with PyTorch views: a transposed matrix and a row range of a larger storage
    (torch.save keeps their strides and offsets)."""
    m = model()
    m["layers.0.o_proj.weight"] = m["layers.0.o_proj.weight"].t().contiguous().t()
    m["layers.0.conv"] = torch.cat([torch.zeros(1, 4, 5), m["layers.0.conv"]])[1:]
    m["tied.q_proj.weight"] = m["layers.0.q_proj.weight"]  # one storage, cut alike: one part
    assert not m["layers.0.o_proj.weight"].is_contiguous()
    return m


def safetensors_src(d):
    save_file(model(), str(d / "m.safetensors"))
    return d / "m.safetensors", lambda p: load_file(str(p))


def sharded_src(d):
    m, shards = model(), d / "shards"
    shards.mkdir()
    names = list(m)
    save_file({k: m[k] for k in names[:4]}, str(shards / "m-1.safetensors"))
    save_file({k: m[k] for k in names[4:]}, str(shards / "m-2.safetensors"))
    return shards, lambda p: {**load_file(str(p / "m-1.safetensors")),
                              **load_file(str(p / "m-2.safetensors"))}


def torch_src(d, **kw):
    torch.save(strided_model(), d / "m.pt", **kw)
    return d / "m.pt", lambda p: torch.load(p, map_location="cpu", weights_only=False)


def pack_src(d):
    src, _ = safetensors_src(d)
    return pack(src, d / "m.pack"), lambda p: load_file(str(src))


def npz_src(d):
    np.savez(d / "m.npz", **{k: v.float().numpy() for k, v in model().items()})
    return d / "m.npz", lambda p: {k: torch.from_numpy(v) for k, v in np.load(p).items()}


SOURCES = {"safetensors": safetensors_src, "sharded": sharded_src, "zip": torch_src,
           "legacy": lambda d: torch_src(d, _use_new_zipfile_serialization=False),
           "pack": pack_src, "npz": npz_src}


def part(t, dim, rank, world):
    """torch.chunk's part `rank`, or an empty part past the ones it gives."""
    parts = torch.chunk(t, world, dim)
    return parts[rank] if rank < len(parts) else t.narrow(dim, t.shape[dim], 0)


def dim_of(name):
    for glob, dim in RULES:
        import fnmatch
        if fnmatch.fnmatchcase(name, glob) or name == glob:
            return dim
    return -1


def check_parts(path, want, world, **kw):
    for rank in range(world):
        sd = ckload.load(path, device="cpu", slices=RULES, rank=rank, world_size=world, **kw)
        assert set(sd) == set(want)
        for name, t in want.items():
            d = dim_of(name)
            exp = t if d < 0 else part(t, d, rank, world)
            assert list(sd[name].shape) == list(exp.shape), (name, rank, world)
            assert torch_bytes(sd[name]) == torch_bytes(exp), (name, rank, world)


@pytest.mark.parametrize("kind", SOURCES)
def test_parts_of_every_source(tmp_path, kind):
    path, read = SOURCES[kind](tmp_path)
    want = read(path)
    for world in (1, 2, 3, 4):
        check_parts(path, want, world, verify=True)


def test_parts_of_an_npy_file(tmp_path):
    """A .npy file holds one tensor, named "" (a glob "*" selects it), in either order."""
    for order in ("C", "F"):
        a = np.asfortranarray(np.arange(35, dtype=np.float32).reshape(7, 5)) if order == "F" \
            else np.arange(35, dtype=np.float32).reshape(7, 5)
        np.save(tmp_path / "x.npy", a)
        t = torch.from_numpy(np.load(tmp_path / "x.npy").copy())
        for dim in (0, 1):
            for rank in range(3):
                sd = ckload.load(tmp_path / "x.npy", device="cpu", slices=[("*", dim)],
                                 rank=rank, world_size=3)
                assert torch_bytes(sd[""]) == torch_bytes(part(t, dim, rank, 3)), (order, dim)


def test_tied_twins_cut_alike_share_their_part(tmp_path):
    path, _ = torch_src(tmp_path)
    with ckload.Load(path, device="cpu", slices=RULES, rank=1, world_size=2) as ld:
        ld.wait_all()
        a, b = ld.find("layers.0.q_proj.weight"), ld.find("tied.q_proj.weight")
        assert ld.pointer(a) == ld.pointer(b) and ld.info(a)[2] == (3, 6)


def test_parts_through_a_mount(tmp_path, mount, monkeypatch):
    path, read = torch_src(tmp_path)
    want = read(path)
    with mount(path) as mnt:
        for bypass in ("1", "0"):
            monkeypatch.setenv("CKLOAD_BYPASS", bypass)
            for p in (mnt, mnt / ".ckptfs" / "checkpoint.pack"):
                check_parts(p, want, 3, verify=True)


def test_a_dim0_part_is_a_byte_range_of_the_tensor_file(tmp_path, mount):
    """docs/LOADER.md's dd recipe: rows [s, e) of the mount's tensor file, s = r * ceil(n / N)."""
    import json
    import os
    import subprocess
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # not the ASan run's
    path, read = safetensors_src(tmp_path)
    t = read(path)["layers.0.q_proj.weight"]
    with mount(path) as mnt:
        index = json.loads((mnt / ".ckptfs" / "index.json").read_text())
        f = mnt / next(x["path"] for x in index["tensors"]
                       if x["name"] == "layers.0.q_proj.weight")
        n, b, world = t.shape[0], t[0].numel() * t.element_size(), 3
        for r in range(world):
            c = -(-n // world)
            s, e = min(r * c, n), min(r * c + c, n)
            out = subprocess.run(["dd", f"if={f}", "iflag=skip_bytes,count_bytes",
                                  f"skip={s * b}", f"count={(e - s) * b}", "status=none"],
                                 capture_output=True, check=True, env=env).stdout
            assert out == torch_bytes(part(t, 0, r, world))


def test_a_part_shares_no_memory_with_the_whole(tmp_path):
    """The block holds the parts only: its bytes are the parts' (and the whole tensors')."""
    path, read = safetensors_src(tmp_path)
    want = read(path)
    whole = ckload.Load(path, device="cpu")
    cut = ckload.Load(path, device="cpu", slices=RULES, rank=0, world_size=4)
    try:
        sliced = sum(part(t, dim_of(n), 0, 4).numel() * t.element_size()
                     for n, t in want.items() if dim_of(n) >= 0)
        plain = sum(t.numel() * t.element_size() for n, t in want.items() if dim_of(n) < 0)
        assert cut.total_bytes() == sliced + plain
        assert cut.total_bytes() < whole.total_bytes()
    finally:
        whole.release()
        cut.release()


def test_gguf_rows_and_blocks(tmp_path):
    import gguf
    from gguf import GGMLQuantizationType as Q, GGUFReader, GGUFWriter
    rng = np.random.default_rng(18)
    w = GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    w.add_tensor("plain", rng.standard_normal((5, 6)).astype(np.float32))
    w.add_tensor("q8", gguf.quants.quantize(rng.standard_normal((5, 64)).astype(np.float32),
                                            Q.Q8_0), raw_dtype=Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    raw = {t.name: torch.from_numpy(np.array(t.data)) for t in GGUFReader(tmp_path / "m.gguf").tensors}
    for rank in range(3):
        sd = ckload.load(tmp_path / "m.gguf", device="cpu", rank=rank, world_size=3,
                         slices=[("plain", 1), ("q8", 0)])
        assert torch_bytes(sd["plain"]) == torch_bytes(part(raw["plain"], 1, rank, 3))
        # Quantized rows are raw bytes: the rows of gguf-py's (rows, bytes a row) array.
        assert torch_bytes(sd["q8"]) == torch_bytes(part(raw["q8"], 0, rank, 3))
    with pytest.raises(ValueError, match=r"tensor 'q8' \(Q8_0\): cannot slice dimension 1: "
                       r".*blocks"):
        ckload.load(tmp_path / "m.gguf", device="cpu", slices=[("q8", 1)], rank=0, world_size=2)


def test_refusals(tmp_path):
    path, _ = safetensors_src(tmp_path)
    with pytest.raises(ValueError) as e:  # the rule is refused: a bad argument
        ckload.load(path, device="cpu", slices=[("layers.0.norm", 1)], rank=0, world_size=2)
    msg = str(e.value)
    assert msg == (f"ckload: {path}: tensor 'layers.0.norm' has 1 dimensions: no dimension 1 "
                   f"to slice"), msg
    np.savez_compressed(tmp_path / "c.npz", w=np.ones((4, 4), np.float32))
    with pytest.raises(ValueError, match=r"tensor 'w' is compressed \(a deflated .npz entry\)"):
        ckload.load(tmp_path / "c.npz", device="cpu", slices=[("w", 0)], rank=0, world_size=2)
    with pytest.raises(ValueError, match="world_size=2: rank=2: not an integer from 0 to 1"):
        ckload.load(path, device="cpu", slices=RULES, rank=2, world_size=2)
    with pytest.raises(ValueError, match="dim=-2: not an integer from -1 to 63"):
        ckload.load(path, device="cpu", slices=[("x", -2)], rank=0, world_size=2)


WRAPPED = [  # each acted as the low bits ctypes kept: world_size 2, the whole tensor, dim 1, dim 0
    {"world_size": 2**32 + 2}, {"world_size": 2**40}, {"world_size": 2**20 + 1},
    {"slices": [("*.q_proj.weight", 2**32 + 1)]}, {"slices": [("*.q_proj.weight", 2**63)]},
    {"slices": [("*.q_proj.weight", 64)]}, {"slices": [("*.q_proj.weight", -2**32 + 1)]},
    {"rank": 2**32 + 1}, {"rank": -1}, {"world_size": 0}, {"world_size": -2**32 + 2},
    {"threads": 2**32 + 4}, {"buffers": 2**32 + 2}, {"buffer_size": 2**64 + 4096},
    {"threads": -1}, {"device": "cuda:4294967296"},
    {"world_size": 2.0}, {"rank": True}, {"slices": [("*.q_proj.weight", 0.0)]},
    {"threads": 4.5}, {"buffer_size": "4096"},
]


@pytest.mark.parametrize("kw", WRAPPED, ids=lambda kw: repr(kw)[:60])
def test_arguments_c_cannot_hold_are_refused_not_wrapped(tmp_path, kw):
    """A number the C field cannot hold, or out of the option's bounds, or not an int (a bool, a
    float): ValueError naming the parameter and its range, from load, Load and load_into alike,
    as `ckpt load` refuses the same values; nothing is loaded."""
    path, read = safetensors_src(tmp_path)
    args = {"device": "cpu", "world_size": 2, "rank": 1, "slices": RULES, **kw}
    name = next(iter(kw))
    into = [lambda p, device, **a: ckload.load_into(read(p), p, **a)] if name != "device" else []
    for start in [ckload.load, ckload.Load, *into]:
        with pytest.raises(ValueError) as e:
            start(path, **args)
        msg = str(e.value)
        assert msg.startswith(f"ckload: {path}: ") and "\n" not in msg, msg
        assert (f"{'N' if name == 'device' else 'dim' if name == 'slices' else name}="
                in msg and "not " in msg), msg


def test_the_cli_refuses_what_the_module_refuses(tmp_path):
    path, _ = safetensors_src(tmp_path)
    for flags in (["--world-size", str(2**32 + 2)], ["--world-size", str(2**20 + 1)],
                  ["--slice", f"*.q_proj.weight:{2**32 + 1}"], ["--rank", str(2**32 + 1)]):
        p = run([ckpt_bin(), "load", path, "--device", "cpu", *flags])
        assert p.returncode == 2 and p.stderr.startswith(b"ckpt: load: --"), (flags, p.stderr)


def test_a_load_index_c_cannot_hold_is_refused(tmp_path):
    """Load.wait(2**64) waited for tensor 0 (ctypes kept the low 64 bits)."""
    path, _ = safetensors_src(tmp_path)
    with ckload.Load(path, device="cpu") as ld:
        for i in (2**64, -1, 0.0, True):
            with pytest.raises(ValueError, match=f"i={i!r}: not an integer"):
                ld.wait(i)
        with pytest.raises(ValueError, match=f"ckload: {path}: no tensor {len(ld)}"):
            ld.wait(len(ld))
        ld.wait(0)


def test_ckpt_load_slice(tmp_path):
    path, read = safetensors_src(tmp_path)
    want = read(path)
    p = run([ckpt_bin(), "load", path, "--device", "cpu", "--slice", "*.q_proj.weight:0",
             "--slice", "*:-1", "--rank", "1", "--world-size", "2"])
    assert p.returncode == 0, p.stderr
    total = sum(t.numel() * t.element_size() for t in want.values())
    cut = sum(t.numel() * t.element_size() - part(t, 0, 1, 2).numel() * t.element_size()
              for n, t in want.items() if n.endswith(".q_proj.weight"))
    assert f" {total - cut} bytes " in p.stdout.decode(), p.stdout
    bad = run([ckpt_bin(), "load", path, "--slice", "nodim"])
    assert bad.returncode == 2 and b"--slice: 'nodim' is not GLOB:DIM" in bad.stderr, bad.stderr
