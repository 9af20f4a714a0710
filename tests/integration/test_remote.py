"""Every format we read, served by nginx on loopback (plain HTTP and TLS with a CA of the
test's own), mounted by URL and read with `ckpt`: every tensor's bytes against the
independent reader of the local file (the safetensors library, torch.load, numpy, gguf-py's
GGUFReader), and what mounting cost, from nginx's own access log.

The servers are netlab's (127.0.0.1 only)."""
import json
import os
import subprocess
from pathlib import Path

import pytest

import netlab
import test_gguf as gguf_checks
import test_numpy as numpy_checks
from ckptfs_testlib import (check_mount, check_torch_mount, ckpt_bin, library_view,
                            write_safetensors)

CORPUS = Path("/work/shared/corpus")
HEADER_REQUESTS = 3           # mounting a safetensors source takes at most 3 requests
HEADER_BYTES = 1 << 20        # ... and reads less than 1 MiB


def ckpt(*args, timeout=120):
    return subprocess.run([str(ckpt_bin()), *map(str, args)], capture_output=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The directory nginx serves: the sample, a shard set with its index, a pack, and the
    corpus files (copied: nginx reads what it serves, so it is ours)."""
    d = tmp_path_factory.mktemp("served")
    tensors = netlab.sample_tensors()
    write_safetensors(d / "model.safetensors", tensors)
    half = len(tensors) // 2
    shards = d / "shards"
    shards.mkdir()
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    write_safetensors(shards / names[0], tensors[:half])
    write_safetensors(shards / names[1], tensors[half:])
    weight_map = {t[0]: names[0] for t in tensors[:half]}
    weight_map.update({t[0]: names[1] for t in tensors[half:]})
    (shards / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    p = ckpt("pack", d / "model.safetensors", d / "model.pack")
    assert p.returncode == 0, p.stderr.decode()
    for f in CORPUS.iterdir():
        if f.is_file() and "abuse" not in f.name and f.suffix != ".md":
            (d / f.name).write_bytes(f.read_bytes())
    return d


@pytest.fixture(scope="module", params=["http", "https"])
def server(request, served, tmp_path_factory):
    tls = netlab.tls_material(tmp_path_factory.mktemp("tls")) if request.param == "https" else None
    with netlab.Nginx(served, tls=tls) as srv:
        srv.options = [f"cacert={tls.ca}"] if tls else []
        srv.env = dict(os.environ, CKPTFS_CACERT=str(tls.ca)) if tls else None
        yield srv


def cat(srv, url, name):
    p = subprocess.run([str(ckpt_bin()), "cat", url, name], capture_output=True, timeout=120,
                       env=srv.env)
    assert p.returncode == 0, p.stderr.decode()
    return p.stdout


def test_safetensors_mount_cost_and_bytes(server, served, mount):
    tensors, meta = library_view(served / "model.safetensors")
    mark = server.mark()
    with mount(server.url("model.safetensors"), options=server.options) as mnt:
        reqs = server.requests(since=mark)
        assert len(reqs) <= HEADER_REQUESTS, reqs
        assert netlab.body_bytes(reqs) < HEADER_BYTES, reqs
        check_mount(mnt, tensors, meta, "safetensors")
    after = server.requests(since=mark)
    assert all(r["if_match"] not in ("", "-", None) for r in after[1:]), \
        "every request after the first is pinned to the ETag"
    name = next(iter(tensors))
    assert cat(server, server.url("model.safetensors"), name) == tensors[name][2]


def test_ckpt_ls_reports_requests(server):
    p = subprocess.run([str(ckpt_bin()), "ls", server.url("model.safetensors")],
                       capture_output=True, timeout=60, env=server.env)
    assert p.returncode == 0, p.stderr.decode()
    err = p.stderr.decode()
    assert err.count("\n") == 1 and "1 requests" in err and "1 file" in err, err


def test_shards_by_index_url(server, served, mount):
    tensors, meta = library_view(served / "shards")
    with mount(server.url("shards/model.safetensors.index.json"), options=server.options) as mnt:
        check_mount(mnt, tensors, meta, "safetensors-sharded")


def test_pack(server, served, mount):
    tensors, _ = library_view(served / "model.safetensors")
    with mount(server.url("model.pack"), options=server.options) as mnt:
        index = json.loads((mnt / ".ckptfs" / "index.json").read_bytes())
        assert index["format"] == "pack"
        for t in index["tensors"]:
            assert (mnt / t["path"]).read_bytes() == tensors[t["name"]][2], t["name"]


@pytest.mark.parametrize("name,fmt", [("candle_test.pt", "pytorch-zip"),
                                      ("candle_test_with_key.pt", "pytorch-zip"),
                                      ("tinypellm_pytorch_model.bin", "pytorch-zip"),
                                      ("candle_fortran_tensor_3d.pth", "pytorch-zip"),
                                      ("graykode_mnist_cnn_legacy.pt", "pytorch-legacy")])
def test_torch(server, served, mount, name, fmt):
    with mount(server.url(name), options=server.options) as mnt:
        check_torch_mount(mnt, served / name, fmt)


@pytest.mark.parametrize("name,fmt", [("candle_test.npy", "npy"), ("candle_test.npz", "npz"),
                                      ("whisper_mel_filters.npz", "npz")])
def test_numpy(server, served, mount, name, fmt):
    want = numpy_checks.expected(served / name)
    with mount(server.url(name), options=server.options) as mnt:
        numpy_checks.check_index_and_bytes(mnt, want, fmt)


def test_gguf(server, served, mount, monkeypatch):
    name = "ollama_llama2_tiny_random.gguf"
    if server.env:  # gguf_checks mounts without options: the CA by the environment
        monkeypatch.setenv("CKPTFS_CACERT", server.env["CKPTFS_CACERT"])
    tensors, _ = gguf_checks.check_mount(mount, server.url(name), [served / name], "gguf")
    first = next(iter(tensors))
    assert cat(server, server.url(name), first) == tensors[first][3]


@pytest.mark.parametrize("name", sorted(p.name for p in CORPUS.glob("*.safetensors")
                                        if "abuse" not in p.name))
def test_corpus_safetensors(server, served, mount, name):
    tensors, meta = library_view(served / name)
    with mount(server.url(name), options=server.options) as mnt:
        check_mount(mnt, tensors, meta, "safetensors")


def test_ckload_from_url(server, served, monkeypatch):
    import ckload
    import torch
    if server.env:
        monkeypatch.setenv("CKPTFS_CACERT", server.env["CKPTFS_CACERT"])
    got = ckload.load(server.url("model.safetensors"), device="cpu")
    tensors, _ = library_view(served / "model.safetensors")
    assert set(got) == set(tensors)
    for n, t in got.items():
        assert t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() == tensors[n][2], n


@pytest.mark.parametrize("server", ["https"], indirect=True)
def test_https_refused_without_the_ca(server, mountpoint):
    p = subprocess.run([str(ckpt_bin()), "ls", server.url("model.safetensors")],
                       capture_output=True, timeout=60)
    assert p.returncode == 1
    err = p.stderr.decode()
    assert err.count("\n") == 1 and "certificate" in err.lower(), err
