"""The vLLM load format's placement (loader/python/ckload_vllm.py: fill, Recorder) on a module
whose load_weights does what vLLM's weight loaders do, without vLLM: each result is the module
that the same load_weights fills from tensors read by safetensors or torch (independent
readers), compared byte for byte. The real vLLM's loaders are test_vllm.py's.

What a probe run shows decides each tensor's path: copied whole, or as the part torch.chunk
cuts for this rank, into contiguous memory of the module's: read straight there; converted,
changed after its copy, split otherwise, or used by a computation: through load_weights; never
copied: not read. Every parameter starts with all its bits set (NaN), so that a byte nothing
wrote never passes for one the reference wrote."""
import ctypes
import math
import mmap

import pytest
import torch
from safetensors.torch import load_file, save_file

import ckload
import ckload_vllm
from ckptfs_testlib import build_dir, run


def unwritten(*shape, dtype=torch.float32):
    """A parameter of shape and dtype with every bit set (NaN, or -1): not what a write leaves."""
    p = torch.nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)
    p.data.view(-1).view(torch.uint8).fill_(0xFF)
    return p


def fresh(*shape):
    """A float32 parameter of shape in memory nothing has written yet (a private anonymous
    mapping of its own, as a large allocation of torch's gets), kept alive by the tensor."""
    mem = mmap.mmap(-1, 4 * math.prod(shape), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    t = torch.frombuffer(mem, dtype=torch.float32).view(*shape)
    t._mem = mem
    return torch.nn.Parameter(t, requires_grad=False)


class Toy(torch.nn.Module):
    """load_weights as vLLM's: q, k, v stacked into one parameter (narrow, then copy_), an
    embedding padded past the checkpoint's rows (copy_ into the first, fill_ of the rest), a
    column-parallel and a row-parallel weight (this rank's part, cut along dim 0 / dim 1 of
    the checkpoint's tensor), a weight scaled in place after its copy, one converted to float16,
    one cut unlike torch.chunk, and a name it skips."""

    def __init__(self, rank=0, world=1):
        super().__init__()
        self.rank, self.world = rank, world
        self.qkv = unwritten(12, 4)
        self.emb = unwritten(10, 4)
        self.norm = unwritten(4)
        self.col = unwritten(8 // world, 6)
        self.row = unwritten(6, 8 // world)
        self.scaled = unwritten(4, 4)
        self.f16 = unwritten(4, 4, dtype=torch.float16)
        self.odd = unwritten(3, 6)

    def load_weights(self, weights):
        loaded = set()
        for name, w in weights:
            if name == "rotary.inv_freq":
                continue
            if name in ("q", "k", "v"):
                self.qkv.data.narrow(0, 4 * "qkv".index(name), 4).copy_(w)
                loaded.add("qkv")
                continue
            p = getattr(self, name)
            if name == "emb":
                p.data[:w.shape[0]].copy_(w)
                p.data[w.shape[0]:].fill_(0)
            elif name in ("col", "row"):
                dim = 0 if name == "col" else 1
                n = w.shape[dim] // self.world
                p.data.copy_(w.narrow(dim, self.rank * n, n))
            elif name == "scaled":
                p.data.copy_(w)
                p.data.mul_(2)
            elif name == "odd":
                p.data.copy_(w[1:4])  # rows 1-3 of 4: no torch.chunk part
            else:
                p.data.copy_(w)
            loaded.add(name)
        return loaded


def checkpoint(tmp_path):
    torch.manual_seed(0)
    sd = {"q": torch.randn(4, 4), "k": torch.randn(4, 4), "v": torch.randn(4, 4),
          "emb": torch.randn(7, 4), "norm": torch.randn(4), "col": torch.randn(8, 6),
          "row": torch.randn(6, 8), "scaled": torch.randn(4, 4), "f16": torch.randn(4, 4),
          "odd": torch.randn(4, 6), "rotary.inv_freq": torch.randn(2)}
    st = tmp_path / "model.safetensors"
    save_file(sd, st)
    return st


def sources(tmp_path, st):
    torch.save(load_file(st), tmp_path / "model.bin")
    p = run([build_dir() / "ckpt", "pack", st, tmp_path / "model.pack"], timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    return {"safetensors": st, "bin": tmp_path / "model.bin", "pack": tmp_path / "model.pack"}


def reference(st, rank=0, world=1):
    """The module as its own load_weights fills it from safetensors' tensors."""
    want = Toy(rank, world)
    want.load_weights(load_file(st).items())
    return want


def same(got, want):
    for (name, a), (_, b) in zip(got.named_parameters(), want.named_parameters()):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name


@pytest.mark.parametrize("kind", ["safetensors", "bin", "pack"])
def test_placed_and_streamed_tensors_end_as_load_weights_leaves_them(tmp_path, kind):
    st = checkpoint(tmp_path)
    got = Toy()
    placed, read, other = ckload_vllm.fill(got, str(sources(tmp_path, st)[kind]))
    same(got, reference(st))
    # q, k, v, emb, norm, col, row straight into place; scaled, f16, odd through load_weights;
    # rotary.inv_freq never read
    sd = load_file(st)
    assert (placed, other) == (7, 4)
    assert read == sum(sd[k].numel() * 4 for k in ("q", "k", "v", "emb", "norm", "col", "row"))


def test_a_ranks_parts_are_read_as_torch_chunk_cuts_them(tmp_path, monkeypatch):
    st = checkpoint(tmp_path)
    sd = load_file(st)
    monkeypatch.setattr(ckload_vllm, "tensor_parallel", lambda: (1, 2))
    got = Toy(1, 2)
    placed, read, other = ckload_vllm.fill(got, str(st))
    same(got, reference(st, 1, 2))
    assert (placed, other) == (7, 4)
    halves = sum(sd[k].numel() * 4 // 2 for k in ("col", "row"))
    assert read == halves + sum(sd[k].numel() * 4 for k in ("q", "k", "v", "emb", "norm"))


class NoProbes(Toy):
    """A loader that looks at a value (as vLLM's default loader does for one-element tensors):
    probes have none, so everything goes through load_weights."""

    def load_weights(self, weights):
        def looked_at():
            for name, w in weights:
                if name == "norm":
                    float(w[0])
                yield name, w
        return super().load_weights(looked_at())


def test_a_loader_that_reads_values_gets_every_tensor_streamed(tmp_path):
    st = checkpoint(tmp_path)
    got = NoProbes()
    placed, read, other = ckload_vllm.fill(got, str(st))
    same(got, reference(st))
    assert (placed, read, other) == (0, 0, len(load_file(st)))


def test_a_parameter_no_tensor_fills_is_refused(tmp_path):
    st = checkpoint(tmp_path)
    sd = load_file(st)
    del sd["norm"]
    save_file(sd, tmp_path / "short.safetensors")
    with pytest.raises(ckload.Error) as e:
        ckload_vllm.fill(Toy(), str(tmp_path / "short.safetensors"))
    assert str(e.value) == f"ckload: {tmp_path / 'short.safetensors'}: no tensor for the " \
                           f"model's norm"


def test_attach_is_refused_where_no_gpu_block_can_be(tmp_path):
    """`attach` (a ckpt serve keeper's socket): a served block is on a GPU, so a model on the
    host is refused before any connection; the stand-in's tests (test_cuda_fake_share.py) serve
    and attach across processes."""
    with pytest.raises(ValueError) as e:
        ckload_vllm.attach_into(Toy(), tmp_path / "keeper.sock")
    assert str(e.value) == (f"ckload: {tmp_path / 'keeper.sock'}: device='cpu': an attached "
                            f"block is on a CUDA device")


class Silent(Toy):
    """A load_weights that does not say what it loaded (returns None), as some models' do."""

    def load_weights(self, weights):
        super().load_weights(weights)


def test_a_model_that_does_not_say_what_it_loaded_is_not_refused(tmp_path):
    st = checkpoint(tmp_path)
    got = Silent()
    assert ckload_vllm.fill(got, str(st))[0] == 7
    same(got, reference(st))


def replaced_once_listed(monkeypatch, st, without):
    """st replaced, once ckload has listed it, by a copy without tensor `without`."""
    sd = load_file(st)
    del sd[without]
    short = st.with_name("short.safetensors")
    save_file(sd, short)
    listed = ckload.entries

    def then_replaced(*args, **kw):
        out = listed(*args, **kw)
        if short.exists():
            short.replace(st)
        return out

    monkeypatch.setattr(ckload, "entries", then_replaced)


def test_a_placed_tensor_the_load_does_not_find_is_refused(tmp_path, monkeypatch):
    """The file is replaced between the listing the probes are made from and the load that
    reads them into place: a tensor placed but no longer there is never written, and fill says
    so rather than leave the parameter as it was."""
    st = checkpoint(tmp_path)
    replaced_once_listed(monkeypatch, st, "norm")
    with pytest.raises(ckload.Error) as e:
        ckload_vllm.fill(Toy(), str(st))
    assert str(e.value) == f"ckload: {st}: tensor 'norm': read into the model 0 times, not " \
                           f"once (the source changed since it was listed)"


def test_a_streamed_tensor_the_load_does_not_find_is_refused(tmp_path, monkeypatch):
    """As above, for a tensor streamed through load_weights (scaled): never fed, so never
    written; fill fails with a line naming the source (here, or where ckload.stream refuses
    a name the source lacks)."""
    st = checkpoint(tmp_path)
    replaced_once_listed(monkeypatch, st, "scaled")
    with pytest.raises(ckload.Error) as e:
        ckload_vllm.fill(Toy(), str(st))
    assert str(e.value).startswith(f"ckload: {st}: ")


@pytest.mark.parametrize("extra, line", [
    ({"verify": "no"}, "verify='no': expected true or false"),
    ({"verify": 0}, "verify=0: expected true or false"),
    ({"verify": None}, "verify=None: expected true or false"),
    ({"source": ""}, "source='': expected a path or URL"),
    ({"source": ["a"]}, "source=['a']: expected a path or URL"),
    ({"attach": 3}, "attach=3: expected a path or URL"),
])
def test_each_extra_config_key_is_checked_with_one_line(extra, line):
    """model_loader_extra_config's verify, source and attach, refused as window is, before a
    byte is read: a verify of "no" was taken as true (bool("no"))."""
    with pytest.raises(ValueError) as e:
        ckload_vllm.checked_config(extra)
    assert str(e.value) == f"ckload: model_loader_extra_config: {line}"
    ok = {"verify": False, "source": "/m", "attach": None}
    assert ckload_vllm.checked_config(ok) == ok


def backed_pages(t):
    """How many of the pages t covers hold memory (mincore: the kernel's own count)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    n = -(-t.numel() * t.element_size() // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * n)()
    assert t.data_ptr() % mmap.PAGESIZE == 0
    assert libc.mincore(t.data_ptr(), n * mmap.PAGESIZE, vec) == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec)


class Fresh(torch.nn.Module):
    """One weight of 4 MiB in memory nothing has written, copied whole."""

    def __init__(self):
        super().__init__()
        self.big = fresh(1024, 1024)

    def load_weights(self, weights):
        for _, w in weights:
            self.big.data.copy_(w)
        return {"big"}


def test_the_probes_leave_fresh_parameter_memory_to_the_read(tmp_path):
    """The probe run touches none of a placed parameter's fresh pages (the read is their first
    touch, each zeroed by the kernel just before ckload fills it); the load fills them all."""
    torch.manual_seed(4)
    save_file({"big": torch.randn(1024, 1024)}, tmp_path / "big.safetensors")
    st = str(tmp_path / "big.safetensors")
    got = Fresh()
    recorder = ckload_vllm.Recorder(got, 0, 1)
    recorder.record(ckload.entries(st, device="cpu"))
    assert list(recorder.plan.placed) == ["big"] and backed_pages(got.big) == 0
    assert ckload_vllm.fill(got, st) == (1, 4 << 20, 0)
    assert backed_pages(got.big) == 1024
    want = Fresh()
    want.load_weights(load_file(st).items())
    same(got, want)
