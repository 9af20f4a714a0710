"""The `ckpt` tool: ls (table and --json), cat (raw bytes), errors and --help. Offsets are
checked against the file's own header, parsed here with the json module."""
import json
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import safetensors.numpy
import safetensors.torch

from ckptfs_testlib import ckpt_bin, library_view, read_index, run, torch_bytes


def header_of(path):
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), 8 + n


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    g = torch.Generator().manual_seed(31)
    tensors = {
        "enc.w": torch.randn(40, 30, generator=g),
        "enc.b": torch.randn(30, generator=g, dtype=torch.float64),
        "dec.emb": torch.randn(10, 8, generator=g).to(torch.bfloat16),
        "dec.mask": torch.rand(5, 5, generator=g) > 0.5,
        "dec.idx": torch.randint(-1000, 1000, (7,), generator=g, dtype=torch.int64),
        "dec.c": torch.randn(3, generator=g, dtype=torch.complex64),
        "big": torch.randn(700_000, generator=g),       # 2.8 MB: several 1 MiB chunks
        "scalar": torch.tensor(42, dtype=torch.int16),
        "empty": torch.zeros(0, 2),
    }
    src = tmp_path_factory.mktemp("tool") / "tool.safetensors"
    safetensors.torch.save_file(tensors, str(src), metadata={"format": "pt", "k": "v"})
    return src, tensors


def test_ls_table(source):
    src, tensors = source
    lib, _ = library_view(src)
    header, data_start = header_of(src)
    raw = src.read_bytes()
    p = run([ckpt_bin(), "ls", src])
    assert p.returncode == 0 and p.stderr == b""
    rows = [line.split("\t") for line in p.stdout.decode().splitlines()]
    assert sorted(r[0] for r in rows) == sorted(tensors)
    for name, dtype, shape, nbytes, offset in rows:  # a single file: five columns
        want_dtype, want_shape, want_data = lib[name]
        assert dtype == want_dtype
        assert json.loads(shape) == want_shape == list(tensors[name].shape)
        assert int(nbytes) == len(want_data)
        assert int(offset) == data_start + header[name]["data_offsets"][0]
        assert raw[int(offset):int(offset) + int(nbytes)] == want_data


def test_ls_json_matches_the_mount(source, mount):
    src, tensors = source
    header, data_start = header_of(src)
    p = run([ckpt_bin(), "ls", "--json", src])
    assert p.returncode == 0 and p.stderr == b""
    listed = json.loads(p.stdout)
    with mount(src) as m:
        index = read_index(m)
    assert listed["format"] == index["format"] == "safetensors"
    assert listed["metadata"] == index["metadata"] == {"format": "pt", "k": "v"}
    by_name = {t["name"]: t for t in index["tensors"]}
    assert len(listed["tensors"]) == len(tensors)
    for t in listed["tensors"]:
        assert t["file"] == str(src)
        assert t["offset"] == data_start + header[t["name"]]["data_offsets"][0]
        rest = {k: v for k, v in t.items() if k not in ("file", "offset")}
        assert rest == by_name[t["name"]]
    # Option order does not matter.
    p2 = run([ckpt_bin(), "ls", src, "--json"])
    assert p2.stdout == p.stdout


def test_cat_every_tensor(source):
    src, tensors = source
    lib, _ = library_view(src)
    for name, t in tensors.items():
        p = run([ckpt_bin(), "cat", src, name])
        assert p.returncode == 0 and p.stderr == b"", name
        assert p.stdout == lib[name][2] == torch_bytes(t), name


@pytest.mark.parametrize("corpus_file", sorted(
    p.name for p in Path("/work/shared/corpus").glob("*.safetensors") if "abuse" not in p.name))
def test_cat_corpus(corpus, corpus_file):
    src = corpus / corpus_file
    lib, _ = library_view(src)
    for name, (dtype, shape, data) in list(lib.items())[:40]:
        p = run([ckpt_bin(), "cat", src, name])
        assert p.returncode == 0, p.stderr
        assert p.stdout == data, name


def test_cat_numpy_written_names(tmp_path):
    arrays = {"a.b/c": np.arange(6, dtype=np.uint32), "ünï.%": np.ones(3, dtype=np.int16)}
    src = tmp_path / "n.safetensors"
    safetensors.numpy.save_file(arrays, str(src))
    for name, a in arrays.items():
        p = run([ckpt_bin(), "cat", src, name])
        assert p.returncode == 0 and p.stdout == a.tobytes()


def one_line(p, prefix):
    err = p.stderr.decode("utf-8", errors="replace")
    assert err.count("\n") == 1 and err.startswith(prefix), err
    return err


def test_cat_errors(source, tmp_path):
    src, _ = source
    p = run([ckpt_bin(), "cat", src, "no.such"])
    assert p.returncode == 1 and p.stdout == b""
    assert "no.such" in one_line(p, f"ckpt: {src}")
    p = run([ckpt_bin(), "cat", src, "__metadata__"])
    assert p.returncode == 1
    p = run([ckpt_bin(), "cat", src, "enc"])  # a directory in the mount, not a tensor
    assert p.returncode == 1
    missing = tmp_path / "missing.safetensors"
    p = run([ckpt_bin(), "cat", missing, "x"])
    assert p.returncode == 1
    one_line(p, f"ckpt: {missing}")


def test_ls_errors(tmp_path):
    missing = tmp_path / "missing.safetensors"
    p = run([ckpt_bin(), "ls", missing])
    assert p.returncode == 1 and p.stdout == b""
    one_line(p, f"ckpt: {missing}")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00" * 100)
    p = run([ckpt_bin(), "ls", "--json", bad])
    assert p.returncode == 1 and p.stdout == b""
    one_line(p, f"ckpt: {bad}")


@pytest.mark.parametrize("args", [
    [], ["bogus"], ["ls"], ["ls", "a", "b"], ["ls", "--bogus", "x"], ["cat"], ["cat", "x"],
    ["cat", "a", "b", "c"], ["help", "bogus"],
], ids=lambda a: "_".join(a) or "no_args")
def test_usage_errors_exit_2(args):
    p = run([ckpt_bin(), *args])
    assert p.returncode == 2, (args, p.returncode, p.stderr)
    assert p.stdout == b""
    assert p.stderr.startswith(b"usage: ckpt") or p.stderr.startswith(b"ckpt: "), p.stderr


@pytest.mark.parametrize("cmd", [["cat", "SRC", "big"], ["ls", "SRC"], ["ls", "--json", "SRC"]])
def test_stdout_write_failure(source, cmd):
    src, _ = source
    argv = [str(ckpt_bin()), *[str(src) if c == "SRC" else c for c in cmd]]
    assert run(argv).returncode == 0
    with open("/dev/full", "wb") as full:  # every write fails with ENOSPC
        q = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, timeout=30)
    assert q.returncode == 1, q.stderr
    assert q.stderr.decode().count("\n") == 1 and q.stderr.startswith(b"ckpt: stdout: "), q.stderr


@pytest.mark.parametrize("args,start", [
    (["--help"], b"usage: ckpt"), (["-h"], b"usage: ckpt"), (["help"], b"usage: ckpt"),
    (["ls", "--help"], b"usage: ckpt ls"), (["cat", "--help"], b"usage: ckpt cat"),
    (["cat", "-h"], b"usage: ckpt cat"), (["help", "ls"], b"usage: ckpt ls"),
    (["help", "cat"], b"usage: ckpt cat"), (["help", "--help"], b"usage: ckpt help"),
])
def test_help(args, start):
    p = run([ckpt_bin(), *args])
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(start), p.stdout
    assert p.stderr == b""
