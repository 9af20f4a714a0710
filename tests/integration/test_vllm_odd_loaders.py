"""The vLLM load format's placement (loader/python/ckload_vllm.py: fill) against weight loaders
that do what the placement could take for a plain copy and is not: a copy through every kind
of view torch has (lazy conjugation and negation among them), a loader that zeroes its
parameters at each call, one that holds a pair until both halves arrive, one that changes a
parameter through numpy after its copy (a row of a large one, an element of one in fresh
memory), one that takes each name once across calls. Each
model is compared byte for byte with the same module filled by its own load_weights from the
tensors the safetensors library reads (test_vllm_placement.py's reference and comparison).
The views are those torch's documentation lists ("Tensor Views") and the lazy ones (conj, the
negative view, dtype views), but for the sparse ones (indices, values): a checkpoint's tensor
is strided."""
import pytest
import torch
from safetensors.torch import load_file, save_file

import ckload
import ckload_vllm
from test_vllm_placement import Fresh, same, unwritten

F32, C64 = torch.float32, torch.complex64

# name: (the checkpoint tensor's shape and dtype, the view of it a loader copies from)
VIEWS = {
    "plain": ((4, 6), F32, lambda w: w),
    "getitem_rows": ((4, 6), F32, lambda w: w[1:3]),
    "getitem_column": ((4, 6), F32, lambda w: w[:, 2]),
    "getitem_step": ((4, 6), F32, lambda w: w[::2]),
    "getitem_none": ((4, 6), F32, lambda w: w[None]),
    "getitem_ellipsis": ((4, 6), F32, lambda w: w[...]),
    "getitem_list": ((4, 6), F32, lambda w: w[[2, 0, 1, 3]]),  # advanced indexing: a copy
    "adjoint": ((4, 6), F32, lambda w: w.adjoint()),
    "as_strided_window": ((4, 6), F32, lambda w: w.as_strided((3, 4), (4, 1), 2)),
    "as_strided_overlapping": ((4, 6), F32, lambda w: w.as_strided((4, 6), (1, 1))),
    "as_strided_whole": ((4, 6), F32, lambda w: w.as_strided((4, 6), (6, 1), 0)),
    "detach": ((4, 6), F32, lambda w: w.detach()),
    "alias": ((4, 6), F32, lambda w: torch.ops.aten.alias(w)),
    "diagonal": ((4, 6), F32, lambda w: w.diagonal()),
    "diagonal_offset": ((4, 6), F32, lambda w: w.diagonal(1)),
    "expand_rows": ((1, 6), F32, lambda w: w.expand(3, 6)),
    "expand_same": ((1, 6), F32, lambda w: w.expand(1, 6)),
    "expand_as": ((6,), F32, lambda w: w.expand_as(torch.empty(2, 6, device="meta"))),
    "movedim": ((2, 3, 4), F32, lambda w: w.movedim(0, 2)),
    "moveaxis": ((2, 3, 4), F32, lambda w: w.moveaxis(2, 0)),
    "narrow": ((4, 6), F32, lambda w: w.narrow(1, 2, 3)),
    "permute": ((2, 3, 4), F32, lambda w: w.permute(2, 0, 1)),
    "permute_size_one": ((1, 6), F32, lambda w: w.permute(1, 0)),
    "select": ((4, 6), F32, lambda w: w.select(0, 1)),
    "squeeze": ((1, 4, 1, 6), F32, lambda w: w.squeeze()),
    "unsqueeze": ((4, 6), F32, lambda w: w.unsqueeze(1)),
    "transpose": ((4, 6), F32, lambda w: w.transpose(0, 1)),
    "swapaxes": ((2, 3, 4), F32, lambda w: w.swapaxes(0, 2)),
    "swapdims": ((2, 3, 4), F32, lambda w: w.swapdims(1, 2)),
    "t": ((4, 6), F32, lambda w: w.t()),
    "t_t": ((4, 6), F32, lambda w: w.t().t()),
    "T": ((4, 6), F32, lambda w: w.T),
    "mT": ((2, 3, 4), F32, lambda w: w.mT),
    "H_real": ((4, 6), F32, lambda w: w.H),
    "unflatten": ((4, 6), F32, lambda w: w.unflatten(1, (2, 3))),
    "unfold": ((4, 6), F32, lambda w: w.unfold(1, 2, 1)),
    "unfold_tiling": ((4, 6), F32, lambda w: w.unfold(1, 2, 2)),
    "view": ((4, 6), F32, lambda w: w.view(6, 4)),
    "view_as": ((4, 6), F32, lambda w: w.view_as(torch.empty(2, 12, device="meta"))),
    "view_flat": ((4, 6), F32, lambda w: w.view(-1)),
    "view_int32": ((4, 6), F32, lambda w: w.view(torch.int32)),
    "view_uint8": ((4, 6), F32, lambda w: w.view(torch.uint8)),
    "view_float16": ((4, 6), F32, lambda w: w.view(torch.float16)),
    "reshape": ((4, 6), F32, lambda w: w.reshape(3, 8)),
    "reshape_as": ((4, 6), F32, lambda w: w.reshape_as(torch.empty(8, 3, device="meta"))),
    "reshape_of_transpose": ((4, 6), F32, lambda w: w.t().reshape(-1)),
    "flatten": ((2, 3, 4), F32, lambda w: w.flatten()),
    "ravel": ((2, 3, 4), F32, lambda w: w.ravel()),
    "contiguous": ((4, 6), F32, lambda w: w.contiguous()),
    "contiguous_of_transpose": ((4, 6), F32, lambda w: w.t().contiguous()),
    "unbind": ((4, 6), F32, lambda w: w.unbind()[1]),
    "split": ((4, 6), F32, lambda w: w.split(2)[1]),
    "split_with_sizes": ((4, 6), F32, lambda w: w.split([1, 3])[1]),
    "chunk": ((4, 6), F32, lambda w: w.chunk(2)[1]),
    "chunk_columns": ((4, 6), F32, lambda w: w.chunk(2, 1)[1]),
    "hsplit": ((4, 6), F32, lambda w: w.hsplit(2)[1]),
    "vsplit": ((4, 6), F32, lambda w: w.vsplit(2)[1]),
    "tensor_split": ((4, 6), F32, lambda w: w.tensor_split(3)[1]),
    "neg_view": ((4, 6), F32, lambda w: torch._neg_view(w)),
    "neg_view_chunk": ((4, 6), F32, lambda w: torch._neg_view(w).chunk(2)[1]),
    "neg_view_resolved": ((4, 6), F32, lambda w: torch._neg_view(w).resolve_neg()),
    "conj_real": ((4, 6), F32, lambda w: w.conj()),
    "complex": ((4, 6), C64, lambda w: w),
    "conj": ((4, 6), C64, lambda w: w.conj()),
    "conj_chunk": ((4, 6), C64, lambda w: w.conj().chunk(2)[1]),
    "conj_conj": ((4, 6), C64, lambda w: w.conj().conj()),
    "conj_resolved": ((4, 6), C64, lambda w: w.conj().resolve_conj()),
    "neg_view_complex": ((4, 6), C64, lambda w: torch._neg_view(w)),
    "H": ((4, 6), C64, lambda w: w.H),
    "mH": ((2, 3, 4), C64, lambda w: w.mH),
    "adjoint_complex": ((4, 6), C64, lambda w: w.adjoint()),
    "real": ((4, 6), C64, lambda w: w.real),
    "imag": ((4, 6), C64, lambda w: w.imag),
    "imag_of_conj": ((4, 6), C64, lambda w: w.conj().imag),
    "view_as_real": ((4, 6), C64, lambda w: torch.view_as_real(w)),
    "view_as_real_of_conj": ((4, 6), C64, lambda w: torch.view_as_real(w.conj().resolve_conj())),
    "view_as_complex": ((4, 6, 2), F32, lambda w: torch.view_as_complex(w)),
    "view_complex_as_float": ((4, 6), C64, lambda w: w.view(F32)),
}

# name: (the checkpoint tensor's shape and dtype, the parameter's, how the loader copies)
COPIES = {
    "copy_non_blocking": ((4, 6), F32, (4, 6), F32, lambda p, w: p.copy_(w, non_blocking=True)),
    "copy_setitem": ((4, 6), F32, (4, 6), F32, lambda p, w: p.__setitem__(slice(None), w)),
    "copy_broadcast": ((6,), F32, (4, 6), F32, lambda p, w: p.copy_(w)),
    "copy_converting": ((4, 6), F32, (4, 6), torch.float16, lambda p, w: p.copy_(w)),
    "copy_into_a_transpose": ((4, 6), F32, (6, 4), F32, lambda p, w: p.t().copy_(w)),
    "copy_into_a_conj": ((4, 6), C64, (4, 6), C64, lambda p, w: p.conj().copy_(w)),
    "copy_into_a_neg_view": ((4, 6), F32, (4, 6), F32, lambda p, w: torch._neg_view(p).copy_(w)),
}

# Those whose bytes, as the checkpoint stores them, are the view's own in order (no offset,
# no stride but the dense one, one dtype, no lazy bit), copied whole into a parameter: read
# straight into place (with this rank's torch.chunk parts, for a second rank of two).
WHOLE = {"plain", "getitem_none", "getitem_ellipsis", "as_strided_whole", "detach", "alias",
         "expand_same", "permute_size_one", "squeeze", "unsqueeze", "t_t", "unflatten",
         "unfold_tiling", "view", "view_as", "view_flat", "reshape", "reshape_as", "flatten",
         "ravel", "contiguous", "conj_real", "complex", "conj_conj", "copy_non_blocking",
         "copy_setitem"}
PARTS = {"split", "chunk", "chunk_columns", "hsplit", "vsplit"}


class Views(torch.nn.Module):
    """A parameter for each view kind (shaped as the view) and each way of copying, filled by
    load_weights through that view or copy."""

    def __init__(self):
        super().__init__()
        for name, (shape, dtype, view) in VIEWS.items():
            like = view(torch.empty(shape, dtype=dtype, device="meta"))
            self.register_parameter(name, unwritten(*like.shape, dtype=like.dtype))
        for name, (_, _, shape, dtype, _) in COPIES.items():
            self.register_parameter(name, unwritten(*shape, dtype=dtype))

    def load_weights(self, weights):
        loaded = set()
        for name, w in weights:
            p = getattr(self, name).data
            if name in VIEWS:
                p.copy_(VIEWS[name][2](w))
            else:
                COPIES[name][4](p, w)
            loaded.add(name)
        return loaded


def view_checkpoint(tmp_path):
    torch.manual_seed(0)
    specs = {**{n: v[:2] for n, v in VIEWS.items()}, **{n: c[:2] for n, c in COPIES.items()}}
    sd = {n: torch.randn(shape, dtype=dtype) for n, (shape, dtype) in specs.items()}
    save_file(sd, tmp_path / "views.safetensors")
    return tmp_path / "views.safetensors"


@pytest.mark.parametrize("rank,world", [(0, 1), (1, 2)])
def test_a_copy_through_every_kind_of_view_lands_as_load_weights_leaves_it(tmp_path,
                                                                         monkeypatch, rank,
                                                                         world):
    st = view_checkpoint(tmp_path)
    monkeypatch.setattr(ckload_vllm, "tensor_parallel", lambda: (rank, world))
    got = Views()
    placed, _, other = ckload_vllm.fill(got, str(st))
    want = Views()
    want.load_weights(load_file(st).items())
    same(got, want)
    assert placed == len(WHOLE) + (len(PARTS) if world > 1 else 0)
    assert placed + other == len(VIEWS) + len(COPIES)


class Pair(torch.nn.Module):
    """Two tensors of the checkpoint in one parameter, as vLLM's merged gate_up_proj: one
    copied as stored (gate), one stored transposed (up: streamed)."""

    def __init__(self):
        super().__init__()
        self.gate_up = unwritten(8, 4)
        self.norm = unwritten(4)

    def put(self, name, w):
        if name == "gate":
            self.gate_up.data[:4].copy_(w)
        elif name == "up":
            self.gate_up.data[4:].copy_(w.t())
        else:
            self.norm.data.copy_(w)


def pair_checkpoint(tmp_path):
    torch.manual_seed(1)
    sd = {"gate": torch.randn(4, 4), "up": torch.randn(4, 4), "norm": torch.randn(4)}
    save_file(sd, tmp_path / "pair.safetensors")
    return tmp_path / "pair.safetensors"


def filled(cls, st):
    """(the module fill filled from st, the same module its load_weights filled from
    safetensors' tensors)."""
    got = cls()
    ckload_vllm.fill(got, str(st))
    want = cls()
    want.load_weights(load_file(st).items())
    return got, want


class ZeroesFirst(Pair):
    """Zeroes every parameter when a call starts, then copies each tensor (a loader that
    resets what it fills): the call that streams up must not undo gate's placement."""
    through_numpy = False

    def load_weights(self, weights):
        for p in self.parameters():
            if self.through_numpy:
                p.data.numpy()[...] = 0
            else:
                p.data.zero_()
        loaded = set()
        for name, w in weights:
            self.put(name, w)
            loaded.add("norm" if name == "norm" else "gate_up")
        return loaded


class ZeroesFirstThroughNumpy(ZeroesFirst):
    through_numpy = True


@pytest.mark.parametrize("cls", [ZeroesFirst, ZeroesFirstThroughNumpy])
def test_a_loader_that_zeroes_its_parameters_at_each_call_keeps_the_placed_tensors(tmp_path,
                                                                                   cls):
    same(*filled(cls, pair_checkpoint(tmp_path)))


class HoldsPairs(Pair):
    """Holds gate until up arrives (or, flush_at_end, both until the call's last tensor), then
    copies the two: gate's copy happens while another tensor is fed."""
    flush_at_end = False

    def load_weights(self, weights):
        held, loaded = {}, set()
        for name, w in weights:
            if name == "norm":
                self.put(name, w)
                loaded.add(name)
                continue
            held[name] = w
            if len(held) == 2 and not self.flush_at_end:
                self.flush(held, loaded)
        if len(held) == 2:
            self.flush(held, loaded)
        return loaded

    def flush(self, held, loaded):
        for name in ("gate", "up"):
            self.put(name, held.pop(name))
        loaded.add("gate_up")


class HoldsPairsToTheEnd(HoldsPairs):
    flush_at_end = True


@pytest.mark.parametrize("cls", [HoldsPairs, HoldsPairsToTheEnd])
def test_a_loader_that_holds_a_pair_until_both_arrive_gets_both(tmp_path, cls):
    same(*filled(cls, pair_checkpoint(tmp_path)))


class ScalesThroughNumpy(Pair):
    """Doubles a parameter through numpy after its copy (torch's dispatcher never sees it):
    norm right after its own copy, or (later) gate's half when norm arrives."""
    later = False

    def load_weights(self, weights):
        loaded = set()
        for name, w in weights:
            self.put(name, w)
            if name == "norm":
                changed = self.gate_up.data[:4] if self.later else self.norm.data
                changed.numpy()[...] *= 2
            loaded.add("norm" if name == "norm" else "gate_up")
        return loaded


class ScalesThroughNumpyLater(ScalesThroughNumpy):
    later = True


@pytest.mark.parametrize("cls", [ScalesThroughNumpy, ScalesThroughNumpyLater])
def test_a_change_through_numpy_after_the_copy_is_kept(tmp_path, cls):
    same(*filled(cls, pair_checkpoint(tmp_path)))


class ScalesARowThroughNumpy(torch.nn.Module):
    """Doubles one row (4 KiB) of a 256 KiB weight through numpy after its copy: not every
    byte of a large tensor is watched, but a change of one row is seen."""

    def __init__(self):
        super().__init__()
        self.big = unwritten(64, 1024)

    def load_weights(self, weights):
        for _, w in weights:
            self.big.data.copy_(w)
            self.big.data[37].numpy()[...] *= 2
        return {"big"}


def test_a_change_through_numpy_to_a_row_of_a_large_tensor_is_kept(tmp_path):
    torch.manual_seed(2)
    save_file({"big": torch.randn(64, 1024)}, tmp_path / "big.safetensors")
    same(*filled(ScalesARowThroughNumpy, tmp_path / "big.safetensors"))


class ScalesAnElementThroughNumpy(Fresh):
    """Doubles one element of a 4 MiB weight in fresh memory through numpy after its copy,
    one that no sampled element is (every 256th): the page it is in was backed by nothing."""

    def load_weights(self, weights):
        loaded = super().load_weights(weights)
        self.big.data.view(-1)[5000:5001].numpy()[...] *= 2
        return loaded


def test_a_change_through_numpy_to_one_element_of_fresh_memory_is_kept(tmp_path):
    torch.manual_seed(3)
    save_file({"big": torch.randn(1024, 1024)}, tmp_path / "big.safetensors")
    same(*filled(ScalesAnElementThroughNumpy, tmp_path / "big.safetensors"))


class TakesEachNameOnce(Pair):
    """Takes a name only the first time any call feeds it (state kept across calls): a second
    call does not do what the probes showed, and nothing is left half filled."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def load_weights(self, weights):
        loaded = set()
        for name, w in weights:
            if name not in self.seen:
                self.seen.add(name)
                self.put(name, w)
                loaded.add("norm" if name == "norm" else "gate_up")
        return loaded


def test_a_loader_whose_second_call_differs_is_refused_not_left_half_filled(tmp_path):
    st = pair_checkpoint(tmp_path)
    with pytest.raises(ckload.Error) as e:
        ckload_vllm.fill(TakesEachNameOnce(), str(st))
    assert str(e.value) == f"ckload: {st}: no tensor for the model's gate_up, norm"
