"""ckload.load_into: a checkpoint straight into a module's (or a dict's) own tensors, checked
against torch's own load_state_dict of what torch.load and the safetensors library read: byte
for byte, the same missing and unexpected names with strict=False, tied parameters, a module
built on `meta` and materialized with to_empty, `only`, slices, on_ready; nothing read when the
target does not fit; the host memory a load_into costs beside the model (no second copy).
Also: a finished load closes its sources (a mount it read unmounts while its tensors live), and
DLPack 1.0 exports (read-only where asked) to numpy. Runs under torch 1.13 and torch 2.x."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import ckload
from ckptfs_testlib import is_mounted, run, ckpt_bin, unmount


class Tiny(torch.nn.Module):
    """A small language-model shape: embedding, a block, a head tied to the embedding (or not),
    a persistent buffer and a non-persistent one (never in a checkpoint)."""

    def __init__(self, tied=True, vocab=50, dim=24):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, dim)
        self.ln = torch.nn.LayerNorm(dim)
        self.fc = torch.nn.Linear(dim, 2 * dim)
        self.proj = torch.nn.Linear(2 * dim, dim, bias=False)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        if tied:
            self.head.weight = self.wte.weight
        self.register_buffer("steps", torch.tensor([7], dtype=torch.int64))
        self.register_buffer("scratch", torch.zeros(3), persistent=False)


def trained(tied=True, seed=1, dtype=torch.float32):
    torch.manual_seed(seed)
    m = Tiny(tied=tied).to(dtype)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p))
    m.steps.fill_(seed)
    return m


def fresh(tied=True, dtype=torch.float32):
    torch.manual_seed(999)  # other values than trained()'s
    return Tiny(tied=tied).to(dtype)


def as_bytes(t):
    return t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() \
        else b""


def assert_same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and sa[k].shape == sb[k].shape, k
        assert as_bytes(sa[k]) == as_bytes(sb[k]), k


def safetensors_of(m, path):
    """m's state dict as the safetensors library saves it: one name per memory (a tied head is
    dropped, as save_model does)."""
    sd = {k: v.contiguous() for k, v in m.state_dict().items() if k != "head.weight"
          or m.head.weight.data_ptr() != m.wte.weight.data_ptr()}
    save_file(sd, str(path))
    return path


def sources(m, d):
    """m saved every way: torch.save (zip, ties kept), safetensors, and the pack of the .pt."""
    pt = d / "m.pt"
    torch.save(m.state_dict(), pt)
    pk = d / "m.pack"
    p = run([ckpt_bin(), "pack", pt, pk])
    assert p.returncode == 0, p.stderr
    return {"pt": pt, "safetensors": safetensors_of(m, d / "m.safetensors"), "pack": pk}


@pytest.mark.parametrize("kind", ["pt", "safetensors", "pack"])
def test_into_a_module_byte_exact(tmp_path, kind):
    src = trained()
    path = sources(src, tmp_path)[kind]
    want = fresh()
    want.load_state_dict(torch.load(path) if kind == "pt" else
                         load_file(str(sources(src, tmp_path)["safetensors"])), strict=False)
    got = fresh()
    before = {k: v.data_ptr() for k, v in got.state_dict().items()}
    keys = ckload.load_into(got, path)
    assert keys == ckload.IncompatibleKeys([], [])
    assert_same_state(got, want)
    assert_same_state(got, src)
    # into the module's own memory: no tensor moved, the tie holds
    assert {k: v.data_ptr() for k, v in got.state_dict().items()} == before
    assert got.head.weight.data_ptr() == got.wte.weight.data_ptr()
    assert torch.equal(got.scratch, torch.zeros(3))


def test_dict_target_and_untied_module_from_tied_checkpoint(tmp_path):
    """A .pt stores the tie once; an untied module gets the bytes in both of its tensors (the
    second a copy made by the loader), and a dict of tensors is filled as a module is."""
    src = trained(tied=True)
    pt = sources(src, tmp_path)["pt"]
    got = fresh(tied=False)
    assert ckload.load_into(got, pt) == ([], [])
    assert torch.equal(got.head.weight, src.wte.weight)
    assert torch.equal(got.wte.weight, src.wte.weight)
    assert got.head.weight.data_ptr() != got.wte.weight.data_ptr()
    target = {k: torch.empty_like(v) for k, v in src.state_dict().items()}
    ckload.load_into(target, pt)
    for k, v in src.state_dict().items():
        assert as_bytes(target[k]) == as_bytes(v), k


def test_a_name_from_the_checkpoint_stays_one_line(tmp_path):
    """A checkpoint's names are data: one with a newline and an ESC sequence (safetensors takes
    any string) reaches load_into's refusal and stream's KeyError as one line, each control
    character shown as '?', as libckload's own messages show names."""
    path = tmp_path / "m.safetensors"
    evil = "x\x1b[31m\nlooks like another line"
    save_file({evil: torch.ones(2), "w": torch.zeros(2)}, str(path))
    with pytest.raises(RuntimeError) as e:
        ckload.load_into(torch.nn.Module(), path)
    msg = str(e.value)
    assert "x?[31m?looks like another line" in msg, msg
    assert "\n" not in msg and "\x1b" not in msg
    with pytest.raises(KeyError) as k:
        list(ckload.stream(path, device="cpu", names=["w", "\x1bnope\n"]))
    assert "'?nope?'" in str(k.value) and "\x1b" not in str(k.value)


def test_strict_and_not_as_load_state_dict(tmp_path):
    """Missing and unexpected names: strict refuses before reading a byte, naming them; strict=False
    reports the names torch's load_state_dict(strict=False) reports for the same state dict."""
    src = trained()
    path = tmp_path / "m.safetensors"
    sd = {k: v.contiguous() for k, v in src.state_dict().items()
          if k not in ("head.weight", "fc.bias")}
    sd["extra.weight"] = torch.ones(3)
    save_file(sd, str(path))
    got = fresh(tied=False)
    untouched = {k: as_bytes(v) for k, v in got.state_dict().items()}
    with pytest.raises(RuntimeError) as e:
        ckload.load_into(got, path)
    msg = str(e.value)
    assert "missing key(s): fc.bias, head.weight" in msg
    assert "unexpected key(s): extra.weight" in msg
    assert {k: as_bytes(v) for k, v in got.state_dict().items()} == untouched
    ref = fresh(tied=False)
    expected = ref.load_state_dict(load_file(str(path)), strict=False)
    keys = ckload.load_into(got, path, strict=False)
    assert sorted(keys.missing_keys) == sorted(expected.missing_keys)
    assert sorted(keys.unexpected_keys) == sorted(expected.unexpected_keys)
    assert_same_state(got, ref)


@pytest.mark.parametrize("strict", [True, False])
def test_a_target_that_does_not_fit_is_refused_untouched(tmp_path, strict):
    """A dtype or shape that differs, or a target that is not contiguous, is an error either
    way (as load_state_dict's size mismatch), and no byte is read into any target."""
    src = trained()
    path = safetensors_of(src, tmp_path / "m.safetensors")
    for change, says in ((lambda m: m.fc.to(torch.float64), "float64"),
                         (lambda m: setattr(m, "proj", torch.nn.Linear(48, 25, bias=False)),
                          "[25, 48]"),
                         (lambda m: setattr(m.proj, "weight",
                                            torch.nn.Parameter(torch.empty(48, 24).t())),
                          "not contiguous")):
        got = fresh()
        change(got)
        untouched = {k: as_bytes(v) for k, v in got.state_dict().items()}
        with pytest.raises(RuntimeError, match="cannot load into the target") as e:
            ckload.load_into(got, path, strict=strict)
        assert says in str(e.value)
        assert {k: as_bytes(v) for k, v in got.state_dict().items()} == untouched


def test_a_conjugated_or_negated_view_is_refused_untouched(tmp_path):
    """A target whose values are not its bytes (a lazily conjugated or negated view: copy_ into
    it writes the conjugate or negation of what it is given) cannot take the checkpoint's
    bytes as they are: refused, as a target that is not contiguous, before a byte is read."""
    torch.manual_seed(0)
    save_file({"c": torch.randn(4, dtype=torch.complex64), "r": torch.randn(4)},
              tmp_path / "m.safetensors")
    memory = {"c": torch.zeros(4, dtype=torch.complex64), "r": torch.zeros(4)}
    for view, says in (({"c": memory["c"].conj()}, "conjugated"),
                       ({"r": torch._neg_view(memory["r"])}, "negated")):
        with pytest.raises(RuntimeError, match="cannot load into the target") as e:
            ckload.load_into(view, tmp_path / "m.safetensors", strict=False)
        assert says in str(e.value)
    assert all(not v.view(torch.uint8).any() for v in memory.values())


def test_meta_then_to_empty(tmp_path):
    src = trained()
    path = sources(src, tmp_path)["pt"]
    got = Tiny().to("meta")
    with pytest.raises(ValueError, match="meta device: materialize"):
        ckload.load_into(got, path)
    got.to_empty(device="cpu")
    ckload.load_into(got, path, strict=False)  # the non-persistent buffer is not in it
    for k, v in src.state_dict().items():
        assert as_bytes(got.state_dict()[k]) == as_bytes(v), k


def test_only_on_ready_and_bf16(tmp_path):
    """only selects part of the checkpoint: the target's names it leaves out are not missing;
    on_ready names each tensor that landed."""
    src = trained(dtype=torch.bfloat16)
    path = sources(src, tmp_path)["pack"]
    got = fresh(dtype=torch.bfloat16)
    untouched = as_bytes(got.proj.weight)
    seen = []
    keys = ckload.load_into(got, path, only="fc", on_ready=seen.append)
    assert keys == ([], [])
    assert sorted(seen) == ["fc.bias", "fc.weight"]
    assert as_bytes(got.fc.weight) == as_bytes(src.fc.weight)
    assert as_bytes(got.proj.weight) == untouched


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_slices_land_in_the_local_shard(tmp_path, rank):
    src = trained()
    path = sources(src, tmp_path)["safetensors"]
    rules = [("fc.weight", 0), ("proj.weight", 1), ("fc.bias", 0)]
    sd = src.state_dict()
    target = {k: torch.empty_like(v) for k, v in sd.items() if k != "head.weight"}
    for name, dim in rules:
        target[name] = torch.empty_like(torch.chunk(sd[name], 3, dim)[rank]).contiguous()
    ckload.load_into(target, path, slices=rules, rank=rank, world_size=3)
    for name, dim in rules:
        assert torch.equal(target[name], torch.chunk(sd[name], 3, dim)[rank]), name
    assert torch.equal(target["wte.weight"], sd["wte.weight"])


def test_host_memory_is_the_model_once(tmp_path):
    """The peak RSS a load adds to a fresh process whose 256 MiB module is allocated but
    untouched (as to_empty leaves it), against torch filling it itself: load_into adds no block
    of its own (at most 5 % of the model more); load() + load_state_dict adds a second model
    (the test sees a copy)."""
    path = tmp_path / "big.safetensors"
    save_file({f"l{i}.weight": torch.full((1024, 1024 * 4), float(i)) for i in range(16)},
              str(path))
    code = textwrap.dedent("""
        import sys, torch, ckload
        def status_kib(key):  # VmHWM: this process's own peak (ru_maxrss keeps its parent's)
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) for l in f if l.startswith(key + ":"))
        m = torch.nn.Module()
        for i in range(16):
            setattr(m, f"l{i}", torch.nn.Module())
            getattr(m, f"l{i}").weight = torch.nn.Parameter(torch.empty(1024, 4096),
                                                           requires_grad=False)
        ckload.library()  # the library's own pages are not the load's
        before = status_kib("VmRSS")
        if sys.argv[2] == "fill":  # the model's own bytes, written by torch
            for i, p in enumerate(m.parameters()):
                p.fill_(float(i))
        elif sys.argv[2] == "into":
            ckload.load_into(m, sys.argv[1])
        else:
            m.load_state_dict(ckload.load(sys.argv[1], device="cpu"))
        assert float(m.l5.weight[3, 7]) == 5.0
        print(status_kib("VmHWM") - before)
    """)
    added = {}
    for how in ("fill", "into", "state_dict"):
        p = subprocess.run([sys.executable, "-c", code, str(path), how], capture_output=True,
                           timeout=300)
        assert p.returncode == 0, p.stderr.decode()
        added[how] = int(p.stdout.split()[-1])
    model_kib = 256 * 1024
    assert added["into"] - added["fill"] <= 0.05 * model_kib, added
    assert added["state_dict"] - added["fill"] >= 0.75 * model_kib, added


def test_a_finished_load_closes_its_sources(tmp_path, mount):
    """Once a load is done it holds no descriptor of its source: a mount it read can be unmounted
    while its tensors live, and they keep their bytes."""
    src = trained()
    pt = sources(src, tmp_path)["pt"]
    for bypass in ("1", "0"):
        os.environ["CKLOAD_BYPASS"] = bypass
        try:
            with mount(pt) as mnt:
                sd = ckload.load(mnt, device="cpu")
                fds = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                       if os.path.exists(f"/proc/self/fd/{fd}")]
                assert not [f for f in fds if f.startswith((str(mnt), str(pt)))], fds
                p = subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True)
                assert p.returncode == 0, p.stderr.decode()
                assert not is_mounted(mnt)
        finally:
            del os.environ["CKLOAD_BYPASS"]
        assert torch.equal(sd["fc.weight"], src.fc.weight.detach())


def test_dlpack_versioned_where_asked(tmp_path):
    """torch gets DLPack 1.0 capsules where it takes them (torch 2.x), 0.6 ones where it does not;
    numpy gets a read-only array from a read-only export when it asks for 1.0, and a consumer
    that asks only for 0.6 cannot take a read-only export."""
    src = trained()
    path = sources(src, tmp_path)["safetensors"]
    names = []
    real = ckload._capsule
    ckload._capsule = lambda m, versioned: names.append(versioned) or real(m, versioned)
    try:
        sd = ckload.load(path, device="cpu")
    finally:
        ckload._capsule = real
    assert set(names) == {hasattr(torch._C, "_to_dlpack_versioned")}
    with ckload.Load(path, device="cpu") as ld:
        i = ld.find("fc.weight")
        a = np.from_dlpack(ld.export(i))
        assert np.array_equal(a, sd["fc.weight"].numpy())
        ro = ld.export(i, read_only=True)
        with pytest.raises(BufferError, match="needs DLPack 1.0"):
            ro.__dlpack__()
        if tuple(int(x) for x in np.__version__.split(".")[:2]) >= (2, 1):  # asks for 1.0
            assert a.flags.writeable
            b = np.from_dlpack(ro)
            assert not b.flags.writeable and np.array_equal(b, a)
        ro.__dlpack__(max_version=(1, 0))  # not consumed: its capsule gives the reference back


class Lm(torch.nn.Module):
    """A language model's ends, the head tied to the embedding as transformers ties them
    (`lm_head.weight is embed.weight`): the tie's later name in the state dict's order sorts
    after its first, so the pack's order (natural, by name) meets the tie's names as the
    module's order does."""

    def __init__(self, tied=True):
        super().__init__()
        self.embed = torch.nn.Embedding(40, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.lm_head = torch.nn.Linear(16, 40, bias=False)
        if tied:
            self.lm_head.weight = self.embed.weight


def lm(tied, seed):
    torch.manual_seed(seed)
    return Lm(tied)


def saved(m, d, kinds=("pt", "safetensors", "pack")):
    """m's state dict saved by torch.save, the safetensors library (every name: an untied
    model's) and as the pack of the .pt."""
    out = {"pt": d / "lm.pt", "safetensors": d / "lm.safetensors", "pack": d / "lm.pack"}
    torch.save(m.state_dict(), out["pt"])
    if "safetensors" in kinds:
        save_file({k: v.contiguous() for k, v in m.state_dict().items()},
                  str(out["safetensors"]))
    p = run([ckpt_bin(), "pack", out["pt"], out["pack"]])
    assert p.returncode == 0, p.stderr
    return {k: out[k] for k in kinds}


@pytest.mark.parametrize("kind", ["pt", "safetensors", "pack"])
def test_a_tied_target_from_an_untied_checkpoint_ends_as_load_state_dict(tmp_path, kind):
    """The checkpoint holds other bytes for embed.weight and lm_head.weight; the target ties
    them. load_state_dict copies name after name: the memory ends with lm_head.weight's bytes
    (the later name), which load_into gives too (it kept embed.weight's, the first in pack
    order); a dict of tensors sharing one memory ends as copying it in its order does."""
    path = saved(lm(tied=False, seed=3), tmp_path)[kind]
    sd = load_file(str(path)) if kind == "safetensors" else torch.load(tmp_path / "lm.pt")
    assert not torch.equal(sd["embed.weight"], sd["lm_head.weight"])
    want = lm(tied=True, seed=9)
    want.load_state_dict(sd)
    got = lm(tied=True, seed=9)
    assert ckload.load_into(got, path) == ([], [])
    assert_same_state(got, want)
    assert got.lm_head.weight.data_ptr() == got.embed.weight.data_ptr()
    assert torch.equal(got.embed.weight, sd["lm_head.weight"])
    for order in (["embed.weight", "lm_head.weight"], ["lm_head.weight", "embed.weight"]):
        one = torch.empty(40, 16)
        target = {k: one for k in order}
        target["norm.weight"], target["norm.bias"] = torch.empty(16), torch.empty(16)
        ckload.load_into(target, path)
        copied = torch.empty(40, 16)
        for k in order:  # what copying the state dict in the target's order leaves
            copied.copy_(sd[k])
        assert as_bytes(one) == as_bytes(copied), order


def test_a_tie_whose_later_name_is_absent_keeps_the_earlier_names_bytes(tmp_path):
    """strict=False with only embed.weight in the checkpoint (or only selecting it): the tie
    gets embed.weight's bytes as load_state_dict(strict=False) gives them (read into the load's
    block, then copied in: lm_head.weight might have come later), and on_ready tells it once
    they are in the target."""
    src = lm(tied=False, seed=4)
    path = tmp_path / "lm.safetensors"
    save_file({k: v.contiguous() for k, v in src.state_dict().items()
               if k != "lm_head.weight"}, str(path))
    want = lm(tied=True, seed=9)
    want.load_state_dict(load_file(str(path)), strict=False)
    got = lm(tied=True, seed=9)
    seen = []
    keys = ckload.load_into(got, path, strict=False, on_ready=seen.append)
    assert keys == ([], [])  # lm_head.weight's memory was filled: not missing, as torch says
    assert_same_state(got, want)
    assert sorted(seen) == ["embed.weight", "norm.bias", "norm.weight"]
    full = saved(lm(tied=False, seed=5), tmp_path / ".." / tmp_path.name)["pack"]
    got = lm(tied=True, seed=9)
    ckload.load_into(got, full, only="embed")
    assert torch.equal(got.embed.weight, torch.load(tmp_path / "lm.pt")["embed.weight"])


def test_a_tied_target_from_a_tied_checkpoint(tmp_path):
    src = lm(tied=True, seed=6)
    for kind, path in saved(src, tmp_path, ("pt", "pack")).items():
        want, got = lm(tied=True, seed=9), lm(tied=True, seed=9)
        want.load_state_dict(torch.load(tmp_path / "lm.pt"))
        seen = []
        assert ckload.load_into(got, path, on_ready=seen.append) == ([], [])
        assert_same_state(got, want)
        assert_same_state(got, src)
        assert "lm_head.weight" in seen, (kind, seen)


@pytest.mark.parametrize("views", [(slice(0, 10), slice(5, 15)), (slice(0, 10), slice(0, 5)),
                                   (slice(3, 8), slice(0, 16))])
def test_overlapping_targets_are_refused_before_a_byte_is_read(tmp_path, views):
    """Two targets over one memory at different offsets or lengths (views of one tensor) are
    filled by different threads: their shared bytes were a mix of both sources'. Refused,
    naming both, with the target untouched; views that only touch load."""
    a, b = views
    path = tmp_path / "v.safetensors"
    save_file({"a": torch.full((a.stop - a.start,), 1.0), "b": torch.full((b.stop - b.start,),
                                                                           2.0)}, str(path))
    base = torch.full((16,), -1.0)
    for target in ({"a": base[a], "b": base[b]}, {"b": base[b], "a": base[a]}):
        with pytest.raises(ValueError) as e:
            ckload.load_into(target, path)
        assert str(e.value) == (f"ckload: {path}: tensors 'a' and 'b' are placed in overlapping "
                                f"memory (their bytes would be a mix of both's)"), str(e.value)
        assert torch.equal(base, torch.full((16,), -1.0))
    m = torch.nn.Module()
    m.a, m.b = torch.nn.Parameter(base[a]), torch.nn.Parameter(base[b])
    with pytest.raises(ValueError, match="tensors 'a' and 'b' are placed in overlapping"):
        ckload.load_into(m, path)
    apart = tmp_path / "apart.safetensors"
    save_file({"a": torch.full((5,), 1.0), "b": torch.full((11,), 2.0)}, str(apart))
    ckload.load_into({"a": base[:5], "b": base[5:]}, apart)
    assert torch.equal(base, torch.cat([torch.full((5,), 1.0), torch.full((11,), 2.0)]))


def test_many_targets_are_checked_for_overlap_in_n_log_n(tmp_path):
    """20,000 targets, views of one tensor side by side, the last overlapping the first: refused
    naming those two."""
    n = 20000
    path = tmp_path / "many.safetensors"
    save_file({f"t{i}": torch.full((2,), float(i)) for i in range(n)}, str(path))
    base = torch.zeros(2 * n)
    target = {f"t{i}": base[2 * i:2 * i + 2] for i in range(n - 1)}
    target[f"t{n - 1}"] = base[1:3]
    with pytest.raises(ValueError, match=f"tensors 't0' and 't{n - 1}' are placed in overlapping"):
        ckload.load_into(target, path)
