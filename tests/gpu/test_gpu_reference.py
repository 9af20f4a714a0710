"""libckload into cuda:0 against what the libraries users run put on the same device:
safetensors.torch.load_file(device="cuda:0") and torch.load(map_location="cuda:0"), compared on
the device, from a pack, the source itself and a mount (bypass and FUSE); torch kernels on the
DLPack tensors (a matmul on loaded weights equals the reference's); the order tensors land."""
import pytest
import torch
from safetensors.torch import load_file, save_file

import ckload
from ckptfs_testlib import flatten, torch_bytes
from test_load import SOURCES
from test_pack import pack


def same_on_device(a, b):
    """a and b hold the same bytes (compared on the device, raw: NaN patterns are data)."""
    return (a.device == b.device and a.dtype == b.dtype and a.shape == b.shape and
            torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                        b.contiguous().reshape(-1).view(torch.uint8)))


def reference(src):
    """{name: tensor on cuda:0 | bytes} as the libraries load src onto the device."""
    if src.is_dir():
        out = {}
        for f in sorted(src.glob("*.safetensors")):
            out.update(load_file(str(f), device="cuda:0"))
        return out
    if src.suffix == ".safetensors":
        return load_file(str(src), device="cuda:0")
    obj = torch.load(src, map_location="cuda:0", weights_only=False)
    return {n: e[3] for n, e in flatten(obj).items() if e[0] == "tensor"}


def loaded(path, **kw):
    with ckload.Load(path, device="cuda:0", **kw) as ld:
        ld.wait_all()
        return {ld.name(i): ld.tensor(i) for i in range(len(ld))}


@pytest.mark.parametrize("how", ["pack", "source", "bypass", "fuse"])
@pytest.mark.parametrize("kind", ["zip", "legacy", "safetensors", "sharded"])
def test_same_as_the_libraries_on_the_device(tmp_path, mount, monkeypatch, kind, how):
    src = SOURCES[kind](tmp_path)
    want = reference(src)
    if how == "pack":
        got = loaded(pack(src, tmp_path / "o.pack"))
    elif how == "source":
        got = loaded(src)
    else:
        monkeypatch.setenv("CKLOAD_BYPASS", "1" if how == "bypass" else "0")
        with mount(src) as mnt:
            got = loaded(mnt / ".ckptfs/checkpoint.pack")
    assert set(got) == set(want)
    for name, w in want.items():
        g = got[name]
        assert g.device == torch.device("cuda:0"), name
        if isinstance(w, bytes):  # torch.load's tensor, as bytes (flatten)
            assert torch_bytes(g) == w, name
        else:
            assert same_on_device(g, w), name


def test_torch_kernels_on_loaded_weights(tmp_path):
    """A layer's forward pass on ckload's tensors equals the same pass on the library's."""
    g = torch.Generator().manual_seed(29)
    src = tmp_path / "layer.safetensors"
    save_file({"w": torch.randn(512, 256, generator=g).to(torch.bfloat16),
               "b": torch.randn(512, generator=g).to(torch.bfloat16),
               "x": torch.randn(64, 256, generator=g).to(torch.bfloat16)}, str(src))
    ours = ckload.load(pack(src, tmp_path / "o.pack"), device="cuda:0")
    ref = load_file(str(src), device="cuda:0")
    y = torch.nn.functional.linear(ours["x"], ours["w"], ours["b"])
    y_ref = torch.nn.functional.linear(ref["x"], ref["w"], ref["b"])
    assert y.device == torch.device("cuda:0")
    assert torch.equal(y, y_ref)
    assert torch.equal(ours["w"] @ ours["x"].T, ref["w"] @ ref["x"].T)


def test_slices_on_the_device(tmp_path):
    """A rank's tensor-parallel part, read straight into cuda:0, is torch.chunk of the whole."""
    g = torch.Generator().manual_seed(7)
    src = tmp_path / "m.safetensors"
    save_file({"a.q_proj.weight": torch.randn(12, 10, generator=g),
               "a.o_proj.weight": torch.randn(10, 12, generator=g),
               "a.norm": torch.randn(10, generator=g)}, str(src))
    ref = load_file(str(src), device="cuda:0")
    rules = [("*.q_proj.weight", 0), ("*.o_proj.weight", 1)]
    for rank in range(3):
        got = loaded(src, slices=rules, rank=rank, world_size=3)
        for name, dim in (("a.q_proj.weight", 0), ("a.o_proj.weight", 1)):
            part = torch.chunk(ref[name], 3, dim)[rank].contiguous()
            assert same_on_device(got[name], part), (name, rank)
        assert same_on_device(got["a.norm"], ref["a.norm"])


def test_one_reader_lands_tensors_in_pack_order(tmp_path):
    """ckload.h: threads take tensors in pack order, so with one reader the first layers are
    ready first, each before the next (what progressive loading relies on)."""
    g = torch.Generator().manual_seed(8)
    src = tmp_path / "s.safetensors"
    save_file({f"layers.{i}.w": torch.randn(1 << 14, generator=g) for i in range(30)}, str(src))
    seen = []
    ld = ckload.Load(pack(src, tmp_path / "o.pack"), device="cuda:0", threads=1,
                     buffer_size=1 << 16, on_ready=seen.append)
    ld.wait_all()
    names = [ld.name(i) for i in seen]
    ld.release()
    assert seen == list(range(30)), names
