"""torch.distributed.checkpoint (DCP) directories: written by torch 2.x itself (one process, and
2 and 4 gloo ranks with DTensor Shard(0) / Shard(1) / Replicate and an FSDP2 module with Adam's
state), read by ckptfs (mount, ckpt ls / cat, convert) and compared with what torch reads back
(dcp_to_torch_save, then torch.load); hostile metadata refused in one line."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ckptfs_testlib import REPO, assert_refused, ckpt_bin, read_index, run

TORCH2 = REPO / ".deps" / "torch2" / "bin" / "python"
WRITER = Path(__file__).with_name("dcp_writer.py")
pytestmark = pytest.mark.skipif(not TORCH2.exists(),
                                reason="no .deps/torch2 (scripts/setup installs it)")


def torch2(*args, timeout=300):
    p = subprocess.run([str(TORCH2), str(WRITER), *map(str, args)], capture_output=True,
                       timeout=timeout)
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-3000:]


def written(tmp_path_factory, how, *args):
    d = tmp_path_factory.mktemp("dcp") / "ckpt"
    torch2(how, d, *args)
    exp = d.parent / "expect"
    torch2("expect", d, exp)
    return d, json.loads((exp / "manifest.json").read_text()), exp


@pytest.fixture(scope="module", params=["one", "world2", "world4"])
def checkpoint(request, tmp_path_factory):
    if request.param == "one":
        return written(tmp_path_factory, "save")
    return written(tmp_path_factory, "sharded", request.param[-1])


def expected_bytes(exp, t):
    return (exp / t["file"]).read_bytes()


def test_every_tensor_mounts_at_its_global_shape_with_torchs_bytes(checkpoint, mount):
    d, manifest, exp = checkpoint
    with mount(d) as m:
        index = read_index(m)
        assert index["format"] == "dcp"
        got = {t["name"]: t for t in index["tensors"]}
        assert set(got) == set(manifest["tensors"])
        for name, t in manifest["tensors"].items():
            assert got[name]["shape"] == t["shape"], name
            assert (m / got[name]["path"]).read_bytes() == expected_bytes(exp, t), name
        values = {v["name"]: v for v in index.get("values", [])}
        for name, text in manifest["values"].items():
            assert name in values, name
            assert (m / values[name]["path"]).read_text().rstrip("\n") == text, name


def test_reads_at_any_offset_gather_across_chunks(checkpoint, mount):
    """A read that starts and ends inside elements, crossing chunk boundaries."""
    d, manifest, exp = checkpoint
    with mount(d) as m:
        paths = {t["name"]: t["path"] for t in read_index(m)["tensors"]}
        for name, t in manifest["tensors"].items():
            want = expected_bytes(exp, t)
            with open(m / paths[name], "rb") as f:
                for start in range(0, len(want), 7):
                    f.seek(start)
                    assert f.read(13) == want[start:start + 13], (name, start)


def test_ckpt_cat_and_convert_agree_with_torch(checkpoint, tmp_path):
    d, manifest, exp = checkpoint
    for name, t in manifest["tensors"].items():
        p = run([ckpt_bin(), "cat", d, name])
        assert p.returncode == 0, p.stderr
        assert p.stdout == expected_bytes(exp, t), name
    out = tmp_path / "out.safetensors"
    p = run([ckpt_bin(), "convert", d, out], timeout=120)
    assert p.returncode == 0, p.stderr
    from safetensors.torch import load_file
    loaded = load_file(str(out))
    assert set(loaded) == set(manifest["tensors"])
    for name, t in manifest["tensors"].items():
        flat = loaded[name].contiguous().reshape(-1)
        assert flat.view(torch.uint8).numpy().tobytes() == expected_bytes(exp, t), name


def test_the_metadata_file_itself_is_a_source(checkpoint):
    d, manifest, _ = checkpoint
    p = run([ckpt_bin(), "ls", d / ".metadata"])
    assert p.returncode == 0, p.stderr
    names = {line.split("\t")[0] for line in p.stdout.decode().splitlines()}
    assert names == set(manifest["tensors"])


@pytest.fixture(scope="module")
def sharded2(tmp_path_factory):
    d = tmp_path_factory.mktemp("dcp-hostile") / "ckpt"
    torch2("sharded", d, 2)
    return d


@pytest.mark.parametrize("kind,says", [
    ("overlap", "overlap"), ("gap", "uncovered"), ("no_chunks", "no chunk"),
    ("past_file", "past the end"),
    ("dtype", "dtype"), ("size", "uncovered"), ("class", "refused global"),
    ("not_zip", "chunk")])
def test_hostile_metadata_is_refused_in_one_line(sharded2, tmp_path, mountpoint, kind, says):
    bad = tmp_path / kind
    torch2("hostile", sharded2, bad, kind)
    line = assert_refused(bad, mountpoint, prefix=bad / ".metadata")
    assert says in line, line
