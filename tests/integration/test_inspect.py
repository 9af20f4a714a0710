"""`ckpt diff`, `ckpt info` and `ckpt stats`. Every figure is checked against torch or numpy
computing it here from the same tensors (torch.load of the .bin, the safetensors library for
the .safetensors), never against output of our own code; the float8 values against the
constants of their specification (torch here predates float8)."""
import fnmatch
import json
import math

import numpy as np
import pytest
import safetensors.torch
import torch

from ckptfs_testlib import (ckpt_bin, run, run_on_a_terminal, torch_bytes, write_safetensors,
                            xxh3)


def make_tensors(seed):
    g = torch.Generator().manual_seed(seed)
    special = torch.randn(50, generator=g)
    special[[3, 7]] = float("nan")
    special[11] = float("inf")
    special[12] = -float("inf")
    special[20:25] = 0
    return {
        "enc.layer.0.w": torch.randn(64, 32, generator=g),
        "enc.layer.0.b": torch.randn(32, generator=g, dtype=torch.float64),
        "enc.layer.1.w": torch.randn(32, 16, generator=g).to(torch.bfloat16),
        "enc.layer.1.h": torch.randn(300, generator=g).half(),
        "dec.special": special,
        "dec.idx": torch.randint(-1000, 1000, (70,), generator=g, dtype=torch.int64),
        "dec.i32": torch.randint(-5, 5, (33,), generator=g, dtype=torch.int32),
        "dec.i16": torch.randint(-300, 300, (9,), generator=g, dtype=torch.int16),
        "dec.u8": torch.randint(0, 255, (40,), generator=g, dtype=torch.uint8),
        "dec.i8": torch.randint(-128, 127, (41,), generator=g, dtype=torch.int8),
        "dec.mask": torch.rand(5, 5, generator=g) > 0.5,
        "big": torch.randn(1_500_000, generator=g),  # 6 MB: more than one 4 MiB chunk
        "c": torch.randn(3, generator=g, dtype=torch.complex64),
        "empty": torch.zeros(0, 2),
    }


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    d = tmp_path_factory.mktemp("inspect")
    a = make_tensors(5)
    torch.save(a, d / "a.bin")
    safetensors.torch.save_file(a, str(d / "a.safetensors"), metadata={"format": "pt", "k": "v"})
    b = {k: v.clone() for k, v in a.items()}
    b["enc.layer.0.w"][5, 6] += 0.25
    b["big"][1_200_000] -= 3.0                     # a change in the second chunk
    b["enc.layer.1.w"][0, 0] = 7.0
    b["dec.idx"][0] += 1
    b["dec.i32"] = torch.zeros(34, dtype=torch.int32)   # shape change
    b["enc.layer.0.b"] = b["enc.layer.0.b"].float()     # dtype change, values kept
    del b["dec.u8"]
    b["new.t"] = torch.ones(2)
    safetensors.torch.save_file(b, str(d / "b.safetensors"))
    return d, a, b


def ckpt(*args):
    return run([ckpt_bin(), *args], timeout=120)


def diff_json(x, y, *extra):
    p = ckpt("diff", x, y, "--json", *extra)
    assert p.stderr == b"", p.stderr
    return p.returncode, json.loads(p.stdout)


def torch_max_abs_rel(x, y):
    x, y = x.double(), y.double()
    return torch.max(torch.abs(x - y)).item(), (torch.linalg.norm(x - y) / torch.linalg.norm(x)).item()


# --- diff ----------------------------------------------------------------------------------

def test_diff_same_across_formats(ckpts):
    d, a, _ = ckpts
    rc, doc = diff_json(d / "a.bin", d / "a.safetensors")
    assert rc == 0 and doc["same"] is True
    assert doc["only_in_a"] == [] and doc["only_in_b"] == []
    assert sorted(t["name"] for t in doc["tensors"]) == sorted(a)
    for t in doc["tensors"]:
        assert t["identical"] is True
        assert int(t["xxh3_a"], 16) == int(t["xxh3_b"], 16) == xxh3(torch_bytes(a[t["name"]]))
        assert t["max_abs_diff"] == 0 and t["rel_l2"] == 0
    p = ckpt("diff", d / "a.bin", d / "a.safetensors")
    assert p.returncode == 0 and p.stderr == b""
    assert p.stdout.decode().splitlines() == [
        f"{len(a)} tensors in both: {len(a)} identical, 0 differ; 0 only in A, 0 only in B"]


def test_diff_reports_every_change(ckpts):
    d, a, b = ckpts
    rc, doc = diff_json(d / "a.bin", d / "b.safetensors")
    assert rc == 1 and doc["same"] is False
    assert doc["only_in_a"] == ["dec.u8"] and doc["only_in_b"] == ["new.t"]
    by = {t["name"]: t for t in doc["tensors"]}
    assert set(by) == set(a) - {"dec.u8"}
    changed = {n for n in by if torch_bytes(a[n]) != torch_bytes(b[n]) or a[n].dtype != b[n].dtype
               or a[n].shape != b[n].shape}
    assert {n for n, t in by.items() if not t["identical"]} == changed
    assert doc["summary"] == {"both": len(by), "identical": len(by) - len(changed),
                              "different": len(changed), "only_in_a": 1, "only_in_b": 1,
                              "aliases_dropped": 0}
    for n, t in by.items():  # "big" differs in its second 4 MiB chunk only
        if t["xxh3_a"] is not None:
            assert int(t["xxh3_a"], 16) == xxh3(torch_bytes(a[n]))
            assert int(t["xxh3_b"], 16) == xxh3(torch_bytes(b[n]))
    for n in ("enc.layer.0.w", "big", "enc.layer.1.w", "enc.layer.0.b"):
        want_max, want_rel = torch_max_abs_rel(a[n], b[n])
        assert by[n]["max_abs_diff"] == pytest.approx(want_max, rel=1e-12, abs=1e-300)
        assert by[n]["rel_l2"] == pytest.approx(want_rel, rel=1e-9)
    t = by["enc.layer.0.b"]  # F64 -> F32: not byte-comparable, values compared
    assert (t["dtype_a"], t["dtype_b"]) == ("F64", "F32") and t["xxh3_a"] is None
    t = by["dec.i32"]
    assert t["shape_a"] == [33] and t["shape_b"] == [34] and t["max_abs_diff"] is None
    t = by["dec.idx"]  # an integer change: bytes only
    assert t["identical"] is False and t["max_abs_diff"] is None
    assert int(t["xxh3_b"], 16) == xxh3(torch_bytes(b["dec.idx"]))
    text = ckpt("diff", d / "a.bin", d / "b.safetensors")
    assert text.returncode == 1
    lines = text.stdout.decode().splitlines()
    assert "only in A: dec.u8" in lines and "only in B: new.t" in lines
    assert any(l.startswith("changed: dec.i32: I32 [33] -> I32 [34]") for l in lines)
    assert any(l.startswith("differs: big (F32): max abs diff ") for l in lines)


def test_diff_only(ckpts):
    d, a, b = ckpts
    rc, doc = diff_json(d / "a.bin", d / "b.safetensors", "--only", "dec.mask")
    assert rc == 0 and [t["name"] for t in doc["tensors"]] == ["dec.mask"]
    rc, doc = diff_json(d / "a.bin", d / "b.safetensors", "--only", "enc.layer.1")
    assert rc == 1
    assert sorted(t["name"] for t in doc["tensors"]) == ["enc.layer.1.h", "enc.layer.1.w"]
    rc, doc = diff_json(d / "a.bin", d / "b.safetensors", "--only", "*.h")
    assert rc == 0 and [t["name"] for t in doc["tensors"]] == ["enc.layer.1.h"]


def test_diff_strided_bin_against_contiguous(tmp_path):
    """torch.save keeps a transposed view's strides: the .bin's bytes are gathered."""
    x = torch.randn(37, 53, generator=torch.Generator().manual_seed(2))
    torch.save({"w": x.t()}, tmp_path / "t.bin")
    y = x.t().contiguous().clone()
    y[4, 5] = 100.0
    safetensors.torch.save_file({"w": y}, str(tmp_path / "t.safetensors"))
    rc, doc = diff_json(tmp_path / "t.bin", tmp_path / "t.safetensors")
    want_max, want_rel = torch_max_abs_rel(x.t(), y)
    assert rc == 1
    assert doc["tensors"][0]["max_abs_diff"] == pytest.approx(want_max, rel=1e-12)
    assert doc["tensors"][0]["rel_l2"] == pytest.approx(want_rel, rel=1e-9)
    assert int(doc["tensors"][0]["xxh3_a"], 16) == xxh3(torch_bytes(x.t()))


# --- info ----------------------------------------------------------------------------------

def test_info_json(ckpts):
    d, a, _ = ckpts
    p = ckpt("info", d / "a.safetensors", "--json", "--depth", "3")
    assert p.returncode == 0 and p.stderr == b""
    doc = json.loads(p.stdout)
    assert doc["format"] == "safetensors" and doc["files"] == [str(d / "a.safetensors")]
    assert doc["tensors"] == len(a) and doc["values"] == 0
    assert doc["parameters"] == sum(t.numel() for t in a.values())
    assert doc["bytes"] == sum(t.numel() * t.element_size() for t in a.values())
    assert doc["metadata"] == {"format": "pt", "k": "v"}
    names = {torch.float32: "F32", torch.float64: "F64", torch.bfloat16: "BF16",
             torch.float16: "F16", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
             torch.uint8: "U8", torch.int8: "I8", torch.bool: "BOOL", torch.complex64: "C64"}
    want = {}
    for t in a.values():
        s = want.setdefault(names[t.dtype], {"tensors": 0, "parameters": 0, "bytes": 0})
        s["tensors"] += 1
        s["parameters"] += t.numel()
        s["bytes"] += t.numel() * t.element_size()
    assert doc["dtypes"] == want
    tree = {}
    for n, t in a.items():
        parts = n.split(".")
        for depth in range(1, min(3, len(parts)) + 1):
            s = tree.setdefault(".".join(parts[:depth]), [depth, 0, 0, 0])
            s[1] += 1
            s[2] += t.numel()
            s[3] += t.numel() * t.element_size()
    got = {e["prefix"]: [e["depth"], e["tensors"], e["parameters"], e["bytes"]] for e in doc["tree"]}
    assert got == tree
    order = [e["prefix"] for e in doc["tree"]]
    assert order == sorted(order, key=lambda s: s.split("."))


def test_info_text_and_formats(ckpts):
    d, a, _ = ckpts
    p = ckpt("info", d / "a.bin")
    assert p.returncode == 0 and p.stderr == b""
    out = p.stdout.decode()
    assert "format: pytorch" in out and f"tensors: {len(a)}\n" in out
    assert f"parameters: {sum(t.numel() for t in a.values())}\n" in out
    assert ckpt("info", d / "a.bin", "--depth", "x").returncode == 2


# --- stats ---------------------------------------------------------------------------------

def numpy_stats(t):
    if t.dtype == torch.bfloat16 or t.dtype == torch.float16:
        t = t.float()
    v = t.numpy().astype(np.float64).ravel()
    fin = v[np.isfinite(v)]
    return {"count": v.size, "finite": fin.size, "nan": int(np.isnan(v).sum()),
            "inf": int(np.isinf(v).sum()), "zero": int((v == 0).sum()),
            "min": fin.min() if fin.size else None, "max": fin.max() if fin.size else None,
            "mean": fin.mean() if fin.size else None, "std": fin.std() if fin.size else None}


def check_stats(doc, tensors):
    by = {t["name"]: t for t in doc["tensors"]}
    for name, t in tensors.items():
        if t.dtype == torch.complex64:
            assert {"name": name, "dtype": "C64"} in doc["skipped"] and name not in by
            continue
        got, want = by[name], numpy_stats(t)
        assert got["shape"] == list(t.shape)
        for k in ("count", "finite", "nan", "inf", "zero", "min", "max"):
            assert got[k] == want[k], (name, k)
        for k in ("mean", "std"):
            if want[k] is None:
                assert got[k] is None
            else:
                assert got[k] == pytest.approx(want[k], rel=1e-9, abs=1e-12), (name, k)


def test_stats_against_numpy(ckpts):
    d, a, _ = ckpts
    for src in ("a.bin", "a.safetensors"):
        p = ckpt("stats", d / src, "--json")
        assert p.returncode == 0 and p.stderr == b""
        check_stats(json.loads(p.stdout), a)


def test_stats_selects_by_name_prefix_and_glob(ckpts):
    d, a, _ = ckpts
    p = ckpt("stats", d / "a.bin", "dec", "*.w", "big", "--json")
    doc = json.loads(p.stdout)
    want = {n for n in a if n.startswith("dec.") or fnmatch.fnmatchcase(n, "*.w") or n == "big"}
    assert {t["name"] for t in doc["tensors"]} == want
    check_stats(doc, {n: a[n] for n in want})
    p = ckpt("stats", d / "a.bin", "nothing.here")
    assert p.returncode == 1 and p.stdout == b"" and len(p.stderr.splitlines()) == 1
    text = ckpt("stats", d / "a.bin", "dec.idx")
    rows = [l.split("\t") for l in text.stdout.decode().splitlines()]
    assert rows[0][:4] == ["name", "dtype", "count", "min"] and rows[1][:3] == ["dec.idx", "I64", "70"]
    assert float(rows[1][3]) == a["dec.idx"].min().item()


def test_stats_float8_by_specification(tmp_path):
    # OCP FP8: E4M3 (fn: no Inf, S.1111.111 NaN) 0x38 = 1, 0x7e = 448, 0x01 = 2^-9;
    # E5M2 (IEEE-like) 0x3c = 1, 0x7b = 57344, 0x7c = Inf, 0x7d = NaN, 0x01 = 2^-16.
    e4 = bytes([0x38, 0x7e, 0xfe, 0x01, 0x7f, 0x00, 0xb8])
    e5 = bytes([0x3c, 0x7b, 0x7c, 0x7d, 0x01, 0x80, 0xfc])
    src = write_safetensors(tmp_path / "f8.safetensors", [
        ("e4", "F8_E4M3", [7], e4), ("e5", "F8_E5M2", [7], e5)])
    doc = json.loads(ckpt("stats", src, "--json").stdout)
    by = {t["name"]: t for t in doc["tensors"]}
    v4 = np.array([1, 448, -448, 2.0 ** -9, 0, -1])
    assert (by["e4"]["min"], by["e4"]["max"]) == (-448, 448)
    assert (by["e4"]["nan"], by["e4"]["inf"], by["e4"]["zero"]) == (1, 0, 1)
    assert by["e4"]["mean"] == pytest.approx(v4.mean()) and by["e4"]["std"] == pytest.approx(v4.std())
    v5 = np.array([1, 57344, 2.0 ** -16, -0.0])
    assert (by["e5"]["min"], by["e5"]["max"]) == (v5.min(), 57344)
    assert (by["e5"]["nan"], by["e5"]["inf"], by["e5"]["zero"]) == (1, 2, 1)
    assert by["e5"]["mean"] == pytest.approx(v5.mean())


# --- trouble -------------------------------------------------------------------------------

def test_usage_errors(ckpts):
    d, _, _ = ckpts
    for args in (["diff", d / "a.bin"], ["diff", d / "a.bin", d / "a.bin", "--bogus"],
                 ["info"], ["stats", "--bogus", d / "a.bin"]):
        p = ckpt(*args)
        assert p.returncode == 2 and p.stdout == b"" and len(p.stderr.splitlines()) == 1
    for c in ("diff", "info", "stats"):
        p = ckpt(c, "--help")
        assert p.returncode == 0 and p.stdout.startswith(f"usage: ckpt {c}".encode())


def test_missing_source_is_trouble(ckpts, tmp_path):
    d, _, _ = ckpts
    p = ckpt("diff", d / "a.bin", tmp_path / "absent.safetensors", "--json")
    assert p.returncode == 2 and p.stdout == b""
    assert p.stderr.decode().count("\n") == 1 and "absent.safetensors" in p.stderr.decode()


@pytest.mark.parametrize("cut", [0.3, 0.6, 0.95])
def test_truncated_source_midway(ckpts, tmp_path, cut):
    """A source cut short anywhere: exit 2 (diff) or 1 (info, stats), one line on stderr, and
    no report on stdout, JSON or text."""
    d, _, _ = ckpts
    for name in ("a.safetensors", "a.bin"):
        data = (d / name).read_bytes()
        bad = tmp_path / f"cut-{name}"
        bad.write_bytes(data[:int(len(data) * cut)])
        for json_flag in ([], ["--json"]):
            p = ckpt("diff", d / name, bad, *json_flag)
            assert p.returncode == 2, (name, cut, p.stderr)
            assert p.stdout == b"" and p.stderr.decode().count("\n") == 1
            assert p.stderr.startswith(b"ckpt: ")
            p = ckpt("stats", bad, *json_flag)
            assert p.returncode == 1 and p.stdout == b"" and p.stderr.decode().count("\n") == 1



def test_stats_histogram_on_a_terminal(ckpts):
    """On a terminal each tensor gets 10 bins over [min, max] of its finite values; their
    counts add up to numpy's count of finite values and follow numpy.histogram but for values
    on a bin edge (the two round the edges differently)."""
    d, a, _ = ckpts
    rc, out, err = run_on_a_terminal([ckpt_bin(), "stats", d / "a.bin", "dec.special", "big"])
    assert rc == 0 and err == b""
    lines = out.splitlines()
    for name in ("dec.special", "big"):
        i = next(k for k, l in enumerate(lines) if l.split() and l.split()[0] == name)
        counts = [int(l.split()[-1]) for l in lines[i + 1:i + 11]]
        v = a[name].double().numpy()
        v = v[np.isfinite(v)]
        want, _ = np.histogram(v, bins=10, range=(v.min(), v.max()))
        assert sum(counts) == v.size
        assert all(abs(c - w) <= 2 for c, w in zip(counts, want)), (counts, want)
