"""Shard directories: several save_file calls plus a weight_map index (and without the index),
checked against the safetensors library shard by shard."""
import json
import os

import numpy as np
import pytest
import torch
import safetensors.numpy
import safetensors.torch

from ckptfs_testlib import (assert_refused, check_mount, ckpt_bin, library_view, read_index, run,
                            torch_bytes, write_safetensors)

INDEX = "model.safetensors.index.json"


def make_shards(d):
    """Three shards from three save_file calls (torch and numpy); returns {shard: tensors}."""
    d.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(21)
    rng = np.random.default_rng(22)
    shards = {
        "model-00001-of-00003.safetensors": {
            "model.embed_tokens.weight": torch.randn(50, 16, generator=g),
            "model.layers.0.self_attn.q_proj.weight": torch.randn(16, 16, generator=g)
                                                      .to(torch.bfloat16),
            "model.layers.0.mlp.gate": torch.randint(-5, 5, (16,), generator=g, dtype=torch.int8),
        },
        "model-00002-of-00003.safetensors": {
            "model.layers.1.self_attn.q_proj.weight": rng.standard_normal((16, 16))
                                                      .astype(np.float16),
            "model.layers.1.mlp.counts": rng.integers(0, 2**40, (4, 3), dtype=np.uint64),
            "model.layers.1.scale": np.asarray(np.float64(2.5)),
        },
        "model-00003-of-00003.safetensors": {
            "model.norm.weight": torch.ones(16, dtype=torch.float32),
            "lm_head.weight": torch.randn(50, 16, generator=g).t(),   # non-contiguous source
            "model.empty": torch.zeros(0, 3),
        },
    }
    for name, tensors in shards.items():
        meta = {"format": "pt"}
        if name.startswith("model-00002"):
            meta["note"] = "two"
            safetensors.numpy.save_file(tensors, str(d / name), metadata=meta)
        else:
            safetensors.torch.save_file({k: v.contiguous() for k, v in tensors.items()},
                                        str(d / name), metadata=meta)
    return shards


def write_index(d, shards, metadata=None, extra_map=None):
    wm = {t: shard for shard, ts in shards.items() for t in ts}
    wm.update(extra_map or {})
    total = sum((d / s).stat().st_size for s in shards)
    body = {"metadata": metadata if metadata is not None else {"total_size": total},
            "weight_map": wm}
    (d / INDEX).write_text(json.dumps(body, indent=2))
    return body


def expected_bytes(v):
    return torch_bytes(v) if isinstance(v, torch.Tensor) else v.tobytes()


def check_shard_mount(m, d, shards, meta):
    lib = {}
    for shard in shards:  # the library reads each shard file on its own
        tensors, _ = library_view(d / shard)
        assert not set(tensors) & set(lib)
        lib.update(tensors)
    check_mount(m, lib, meta, "safetensors-sharded")
    index = {t["name"]: t for t in read_index(m)["tensors"]}
    for shard, tensors in shards.items():
        mtime = (d / shard).stat().st_mtime_ns
        for name, v in tensors.items():
            p = m / index[name]["path"]
            assert p.read_bytes() == expected_bytes(v), name
            assert index[name]["shape"] == list(v.shape)
            assert os.stat(p).st_mtime_ns == mtime, (name, shard)


@pytest.fixture
def shard_dir(tmp_path):
    d = tmp_path / "ckpt"
    shards = make_shards(d)
    # Distinct mtimes, so each tensor's can be traced to its own shard.
    for i, s in enumerate(sorted(shards)):
        t = 1_500_000_000_000_000_000 + i * 1_000_000_007
        os.utime(d / s, ns=(t, t))
    return d, shards


def test_with_weight_map_index(shard_dir, mount):
    d, shards = shard_dir
    body = write_index(d, shards)
    meta = {"total_size": str(body["metadata"]["total_size"]), "format": "pt", "note": "two"}
    with mount(d) as m:
        check_shard_mount(m, d, shards, meta)


def test_without_index(shard_dir, mount):
    d, shards = shard_dir
    (d / "README.md").write_text("not a shard")
    (d / "config.json").write_text("{}")
    with mount(d) as m:
        check_shard_mount(m, d, shards, {"format": "pt", "note": "two"})


def test_index_string_metadata_and_unlisted_shard_ignored(shard_dir, mount):
    d, shards = shard_dir
    write_index(d, shards, metadata={"total_size": "123", "producer": "test"})
    # A shard the weight_map does not name is not part of the checkpoint.
    safetensors.torch.save_file({"stray.tensor": torch.ones(2)}, str(d / "stray.safetensors"))
    with mount(d) as m:
        check_shard_mount(m, d, shards, {"total_size": "123", "producer": "test",
                                         "format": "pt", "note": "two"})
        assert "stray.tensor" not in {t["name"] for t in read_index(m)["tensors"]}


def test_single_shard_directory(tmp_path, mount):
    """A directory of one model.safetensors is that file, as an hf:// repository of one is."""
    d = tmp_path / "one"
    d.mkdir()
    safetensors.torch.save_file({"a.b": torch.arange(5)}, str(d / "model.safetensors"))
    lib, meta = library_view(d)
    with mount(d) as m:
        check_mount(m, lib, meta, "safetensors")


def test_ckpt_ls_names_the_shard_files(shard_dir):
    d, shards = shard_dir
    write_index(d, shards)
    p = run([ckpt_bin(), "ls", d])
    assert p.returncode == 0, p.stderr
    where = {}
    for line in p.stdout.decode().splitlines():
        fields = line.split("\t")
        assert len(fields) == 6, line
        where[fields[0]] = fields[5]
    assert where == {t: str(d / s) for s, ts in shards.items() for t in ts}
    p = run([ckpt_bin(), "ls", "--json", d])
    listed = json.loads(p.stdout)
    assert {t["name"]: t["file"] for t in listed["tensors"]} == where


# --- refused shard directories ---------------------------------------------------------------

def test_tensor_in_two_shards_without_index(tmp_path, mountpoint):
    d = tmp_path / "dup"
    d.mkdir()
    safetensors.torch.save_file({"w": torch.ones(2), "a": torch.ones(1)}, str(d / "a.safetensors"))
    safetensors.torch.save_file({"w": torch.ones(2), "b": torch.ones(1)}, str(d / "b.safetensors"))
    line = assert_refused(d, mountpoint)
    assert "'w'" in line
    # `ckpt ls` builds no tree: the shard check itself must catch it.
    p = run([ckpt_bin(), "ls", d])
    assert p.returncode == 1 and p.stdout == b"", p.stdout
    assert p.stderr.decode().count("\n") == 1 and "'w'" in p.stderr.decode()


def test_tensor_in_two_shards_with_index(tmp_path, mountpoint):
    d = tmp_path / "dup"
    d.mkdir()
    safetensors.torch.save_file({"w": torch.ones(2), "a": torch.ones(1)}, str(d / "a.safetensors"))
    safetensors.torch.save_file({"w": torch.ones(2), "b": torch.ones(1)}, str(d / "b.safetensors"))
    (d / INDEX).write_text(json.dumps({"weight_map": {"w": "a.safetensors", "a": "a.safetensors",
                                                      "b": "b.safetensors"}}))
    assert_refused(d, mountpoint)
    p = run([ckpt_bin(), "ls", d])
    assert p.returncode == 1 and p.stdout == b""


def _shards_with_index(tmp_path, weight_map_edit=None, index_text=None):
    d = tmp_path / "idx"
    shards = make_shards(d)
    if index_text is not None:
        (d / INDEX).write_text(index_text)
    else:
        body = write_index(d, shards)
        weight_map_edit(body["weight_map"])
        (d / INDEX).write_text(json.dumps(body))
    return d


BAD_INDEX = {
    "weight_map_names_missing_tensor": lambda wm: wm.update(
        {"no.such.tensor": "model-00001-of-00003.safetensors"}),
    "weight_map_wrong_shard": lambda wm: wm.update(
        {"model.norm.weight": "model-00001-of-00003.safetensors"}),
    "weight_map_omits_tensor": lambda wm: wm.pop("model.norm.weight"),
    "weight_map_missing_shard_file": lambda wm: wm.update(
        {"model.norm.weight": "model-00009-of-00009.safetensors"}),
    "weight_map_escapes_directory": lambda wm: wm.update(
        {"model.norm.weight": "../model-00003-of-00003.safetensors"}),
    "weight_map_absolute_path": lambda wm: wm.update({"model.norm.weight": "/etc/passwd"}),
    "weight_map_value_not_string": lambda wm: wm.update({"model.norm.weight": 3}),
}


@pytest.mark.parametrize("case", list(BAD_INDEX))
def test_bad_weight_map(tmp_path, mountpoint, case):
    d = _shards_with_index(tmp_path, BAD_INDEX[case])
    assert_refused(d, mountpoint)
    p = run([ckpt_bin(), "ls", d])
    assert p.returncode == 1 and p.stderr.decode().count("\n") == 1


@pytest.mark.parametrize("text", ["{not json", "[]", '{"metadata": {}}', '{"weight_map": []}'],
                         ids=["invalid_json", "array", "no_weight_map", "weight_map_array"])
def test_bad_index_file(tmp_path, mountpoint, text):
    d = _shards_with_index(tmp_path, index_text=text)
    assert_refused(d, mountpoint)


def test_index_is_a_directory(tmp_path, mountpoint):
    d = tmp_path / "idx"
    make_shards(d)
    (d / INDEX).mkdir()
    assert_refused(d, mountpoint)


def test_shard_that_is_a_symlink_to_outside_still_reads(tmp_path, mount):
    """A shard may be a symlink (as in the Hugging Face cache); its bytes are the target's."""
    d = tmp_path / "linked"
    d.mkdir()
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    write_safetensors(blobs / "blob1", [("x.y", "I16", [3], b"\x01\x00\x02\x00\xff\xff")])
    (d / "model.safetensors").symlink_to(blobs / "blob1")
    with mount(d) as m:
        assert (m / "x" / "y").read_bytes() == b"\x01\x00\x02\x00\xff\xff"
