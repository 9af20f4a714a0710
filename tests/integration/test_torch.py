"""PyTorch checkpoints (zip and legacy), written in the test run by Debian's torch, mounted and
compared entry by entry with what torch.load returns: every tensor file holds
tensor.contiguous()'s bytes, every value file the value's text."""
import importlib.util
import io
import json
import math
import os
import pickle
import random
import struct
import subprocess
import time
import types
import zipfile
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from ckptfs_testlib import (DTYPE_NAMES, assert_refused, check_torch_mount, ckpt_bin, ckptfs_bin,
                            flatten, is_mounted, read_index, run, torch_bytes, unmount)

def save(obj, path, **kw):
    torch.save(obj, path, **kw)
    return path


def every_dtype():
    g = torch.Generator().manual_seed(1)
    out = OrderedDict()
    for dt in DTYPE_NAMES:
        if dt == torch.bool:
            t = torch.rand(3, 5, generator=g) > 0.5
        elif dt.is_complex:
            t = torch.randn(3, 5, generator=g, dtype=dt)
        elif dt.is_floating_point:
            t = (torch.randn(3, 5, generator=g) * 100).to(dt)
        else:
            info = torch.iinfo(dt)
            t = torch.randint(info.min, info.max, (3, 5), generator=g, dtype=dt)
        out[DTYPE_NAMES[dt].lower()] = t
    return out


def views():
    base = torch.arange(4 * 6 * 5, dtype=torch.float32).reshape(4, 6, 5)
    m = torch.arange(48, dtype=torch.int64).reshape(6, 8)
    return {
        "transposed": m.t(),
        "stepped": m[::2, 1::3],
        "narrowed": m[2:5],
        "permuted": base.permute(2, 0, 1),
        "expanded": torch.arange(3, dtype=torch.int16).reshape(3, 1).expand(3, 7),
        "channels_last": torch.arange(2 * 3 * 4 * 5, dtype=torch.float16)
                              .reshape(2, 3, 4, 5).to(memory_format=torch.channels_last),
        "column": m[:, 3],
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "element": m[3, 4],
        "empty": torch.zeros(0, 4),
        "empty_view": m[:, 2:2],
        "base": base,
    }


def training_checkpoint():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                                torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 7,
            "lr": 0.001, "tag": "run-α", "best": None, "done": False, "blob": b"\x00\x01raw",
            "history": [0.5, 0.25, (1, "x")], "extra": ((), [torch.ones(2)])}


LEGACY = {"_use_new_zipfile_serialization": False}


@pytest.mark.parametrize("kw", [{}, {"pickle_protocol": 4}, {"pickle_protocol": 5}, LEGACY,
                                dict(LEGACY, pickle_protocol=4)],
                         ids=["zip", "protocol4", "protocol5", "legacy", "legacy-protocol4"])
@pytest.mark.parametrize("make", [every_dtype, views, training_checkpoint])
def test_checkpoints_match_torch_load(tmp_path, mount, make, kw):
    path = save(make(), tmp_path / "c.pt", **kw)
    fmt = "pytorch-legacy" if "_use_new_zipfile_serialization" in kw else "pytorch-zip"
    with mount(path) as mnt:
        check_torch_mount(mnt, path, fmt)


def test_parameters_and_tied_weights(tmp_path, mount):
    emb = torch.nn.Parameter(torch.randn(10, 4))
    obj = {"embed": emb, "lm_head": emb, "half": emb[:5], "plain": torch.nn.Parameter(torch.ones(3))}
    path = save(obj, tmp_path / "p.pt")
    with mount(path) as mnt:
        check_torch_mount(mnt, path, "pytorch-zip")
        assert (mnt / "embed").read_bytes() == (mnt / "lm_head").read_bytes()


def test_values_read_as_text(tmp_path, mount):
    path = save({"epoch": 7, "lr": 0.1, "name": "x", "ok": True, "none": None}, tmp_path / "v.pt")
    with mount(path) as mnt:
        assert (mnt / "epoch").read_bytes() == b"7\n"
        assert (mnt / "lr").read_bytes() == b"0.1\n"
        assert (mnt / "ok").read_bytes() == b"True\n"
        assert (mnt / "none").read_bytes() == b"None\n"
        types = {v["name"]: v["type"] for v in read_index(mnt)["values"]}
        assert types == {"epoch": "int", "lr": "float", "name": "str", "ok": "bool",
                         "none": "None"}


def random_floats(n, seed):
    """n doubles of every kind repr() treats differently: random bits (subnormals included),
    integral values, powers of ten and their neighbours around the 1e-5/1e-4 and 1e15/1e16
    notation boundaries; never nan, which is not equal to itself."""
    r = random.Random(seed)
    xs = [0.0, -0.0, float("inf"), float("-inf"), 5e-324]
    for k in list(range(-8, 0)) + list(range(13, 19)):
        p = float("1e%d" % k)
        xs += [p, -p, math.nextafter(p, 0), math.nextafter(p, math.inf), p * 3]
    while len(xs) < n:
        xs.append(struct.unpack("<d", r.getrandbits(64).to_bytes(8, "little"))[0])
        xs.append(float(r.getrandbits(r.randint(1, 64))))
        xs.append(r.uniform(-1, 1) * 10.0 ** r.randint(-7, 18))
        xs.append(struct.unpack("<d", r.getrandbits(52).to_bytes(8, "little"))[0])
    return [x for x in xs if x == x]


def test_float_keys_and_values_read_as_python_str(tmp_path, mount):
    """Float keys name entries, and float values read, exactly as Python's str() gives them."""
    keys = random_floats(3000, 25)
    obj = {k: torch.tensor([k]) if i % 100 == 0 else k for i, k in enumerate(keys)}
    obj["values"] = keys
    path = save(obj, tmp_path / "f.pt")
    listed = json.loads(run([ckpt_bin(), "ls", "--json", path]).stdout)
    names = {e["name"] for e in listed["tensors"] + listed.get("values", [])}
    want = {str(k) for k, v in obj.items() if not isinstance(v, list)}
    assert want <= names and len(names - want) == len(keys)
    with mount(path) as mnt:
        check_torch_mount(mnt, path, "pytorch-zip")


def pickle_cases():
    """tests/unit/pickle_cases.py, whose DupPickler writes dicts that set equal keys."""
    path = Path(__file__).resolve().parents[1] / "unit" / "pickle_cases.py"
    spec = importlib.util.spec_from_file_location("pickle_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("kw", [{}, LEGACY], ids=["zip", "legacy"])
def test_equal_keys_collapse_as_torch_load_has_them(tmp_path, mount, kw):
    """A pickle that sets 1, True and 1.0 (or a str twice) is one entry, named by the first key,
    holding the last value, as torch.load has it."""
    pc = pickle_cases()
    t = torch.arange(6, dtype=torch.int16)
    many = [(k if i % 2 else float(k), torch.full((2,), i)) for i, k in
            enumerate(i % 300 for i in range(1000))]
    obj = pc.Pairs([(1, t), (True, "b"), (1.0, torch.ones(2)), ("w", t), ("w", 2.5),
                    (0, "x"), (False, torch.zeros(3)), (-0.0, "z"), (2.5, t[1:]),
                    ("n", pc.Pairs([("a", 1), ("a", t), ("b", None)])),
                    ("many", pc.Pairs(many))])
    path = tmp_path / "dup.pt"
    module = types.ModuleType("dup_pickle")
    module.Pickler, module.dump = pc.DupPickler, pickle.dump
    torch.save(obj, path, pickle_module=module, **kw)
    loaded = torch.load(path)
    assert [str(k) for k in loaded] == ["1", "w", "0", "2.5", "n", "many"]  # what we fed in
    listed = json.loads(run([ckpt_bin(), "ls", "--json", path]).stdout)
    names = [e["name"] for e in listed["tensors"] + listed.get("values", [])]
    assert sorted(names) == sorted(flatten(loaded))
    fmt = "pytorch-legacy" if kw else "pytorch-zip"
    with mount(path) as mnt:
        check_torch_mount(mnt, path, fmt)


def test_a_bare_tensor(tmp_path, mount):
    path = save(torch.arange(5), tmp_path / "t.pt")
    with mount(path) as mnt:
        index = check_torch_mount(mnt, path, "pytorch-zip")
        assert [t["name"] for t in index["tensors"]] == [""]


def test_ten_thousand_tensors(tmp_path, mount):
    obj = OrderedDict((f"layers.{i // 10}.w{i % 10}", torch.full((2,), i, dtype=torch.int32))
                      for i in range(10000))
    path = save(obj, tmp_path / "many.pt")
    with mount(path) as mnt:
        check_torch_mount(mnt, path, "pytorch-zip")


def test_large_transposed_tensor_reads_in_chunks(tmp_path, mount):
    t = torch.arange(700 * 900, dtype=torch.float32).reshape(700, 900).t()
    path = save({"t": t}, tmp_path / "big.pt")
    want = torch_bytes(t)
    with mount(path) as mnt:
        with open(mnt / "t", "rb") as f:
            for off, n in [(0, 4096), (3, 17), (131072, 300000), (len(want) - 5, 100)]:
                f.seek(off)
                assert f.read(n) == want[off:off + n]


@pytest.mark.parametrize("name", ["candle_fortran_tensor_3d.pth", "candle_test.pt",
                                  "candle_test_with_key.pt", "tinypellm_pytorch_model.bin",
                                  "graykode_mnist_cnn_legacy.pt"])
def test_corpus(corpus, mount, name):
    fmt = "pytorch-legacy" if "legacy" in name else "pytorch-zip"
    with mount(corpus / name) as mnt:
        check_torch_mount(mnt, corpus / name, fmt)


def test_ckpt_ls_and_cat(tmp_path):
    obj = views()
    path = save(obj, tmp_path / "v.pt")
    listed = json.loads(run([ckpt_bin(), "ls", "--json", path]).stdout)
    assert {t["name"] for t in listed["tensors"]} == set(obj)
    for name, t in obj.items():
        p = run([ckpt_bin(), "cat", path, name])
        assert p.returncode == 0 and p.stdout == torch_bytes(t), name


# --- refused ---------------------------------------------------------------------------------

class Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def zip_with(path, records, compress=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression=compress) as z:
        for name, data in records.items():
            z.writestr(name, data)
    return path


@pytest.mark.parametrize("payload,message", [
    (pickle.dumps({"x": Evil()}, protocol=2), "posix system"),
    (pickle.dumps({"x": Evil()}, protocol=4), "posix system"),
    (pickle.dumps(eval, protocol=2), "eval"),
])
def test_code_in_the_pickle_is_refused(tmp_path, mountpoint, payload, message):
    path = zip_with(tmp_path / "evil.pt", {"archive/data.pkl": payload, "archive/version": "3\n"})
    err = assert_refused(path, mountpoint)
    assert message in err
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_compressed_records_are_refused(tmp_path, mountpoint):
    src = io.BytesIO()
    torch.save({"w": torch.ones(1000)}, src)
    src.seek(0)
    with zipfile.ZipFile(src) as z:
        records = {i.filename: z.read(i) for i in z.infolist()}
    path = zip_with(tmp_path / "deflated.pt", records, zipfile.ZIP_DEFLATED)
    assert "compressed" in assert_refused(path, mountpoint)


def test_torchscript_is_refused(tmp_path, mountpoint):
    path = tmp_path / "script.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(path))
    assert "TorchScript" in assert_refused(path, mountpoint)


def test_tensor_past_its_storage_is_refused(tmp_path, mountpoint):
    src = io.BytesIO()
    torch.save({"w": torch.arange(10, dtype=torch.int64)}, src)
    src.seek(0)
    with zipfile.ZipFile(src) as z:
        records = {i.filename: z.read(i) for i in z.infolist()}
    key = next(n for n in records if "/data/" in n)
    records[key] = records[key][:40]  # storage shorter than the 80 bytes its tensor needs
    path = zip_with(tmp_path / "short.pt", records)
    assert_refused(path, mountpoint)


def test_shared_containers_cannot_multiply_the_entries(tmp_path, mountpoint):
    """One dict of 3,000 keys listed at 3,000 places is a 200 KB pickle and 9M entries: refused
    by the entries' budget (64 bytes per pickle byte + 64 MiB) before it takes a gigabyte."""
    d = {"k" * 50 + str(i): i for i in range(3000)}
    path = save([d] * 3000, tmp_path / "shared.pt")
    assert len(torch.load(path)) == 3000
    line = assert_refused(path, mountpoint)
    assert "entries take more than 64 bytes per byte of the object pickle, plus 64 MiB" in line


@pytest.mark.parametrize("cut", [10, 100, 1000, -22, -100])
def test_truncated_archives_are_refused(tmp_path, mountpoint, cut):
    data = (save(training_checkpoint(), tmp_path / "t.pt")).read_bytes()
    bad = tmp_path / "cut.pt"
    bad.write_bytes(data[:cut] if cut > 0 else data[:len(data) + cut])
    assert_refused(bad, mountpoint)


@pytest.mark.parametrize("kw", [{}, LEGACY], ids=["zip", "legacy"])
def test_mounting_reads_no_tensor_data(tmp_path, mountpoint, kw):
    """The daemon's read counter (/proc/PID/io rchar) after mounting and reading index.json
    stays far below the 64 MiB of tensor data: only headers and the pickle are read."""
    obj = {f"w{i}": torch.full((1024, 1024), i, dtype=torch.float32) for i in range(16)}
    path = save(obj, tmp_path / "big.pt", **kw)
    p = subprocess.Popen([str(ckptfs_bin()), "-f", str(path), str(mountpoint)])
    try:
        deadline = time.time() + 20
        while not is_mounted(mountpoint):
            assert time.time() < deadline and p.poll() is None, "mount did not come up"
            time.sleep(0.02)
        read_index(mountpoint)
        with open(f"/proc/{p.pid}/io") as f:
            rchar = next(int(line.split()[1]) for line in f if line.startswith("rchar:"))
        assert rchar < 1 << 20, f"the daemon read {rchar} bytes to mount a 64 MiB checkpoint"
    finally:
        unmount(mountpoint)
        p.wait(timeout=20)
