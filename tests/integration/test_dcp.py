"""torch.distributed.checkpoint (DCP) directories: written by torch 2.x itself (one process, and
2 and 4 gloo ranks with DTensor Shard(0) / Shard(1) / Replicate and an FSDP2 module with Adam's
state), read by ckptfs (mount, ckpt ls / cat, convert, over nginx too) and ckload (whole, into a
module's memory, and resharded: a rank's tensor-parallel part of an FSDP checkpoint, with the
bytes it read counted by the kernel) and compared with what torch reads back
(dcp_to_torch_save, then torch.load); hostile metadata refused in one line."""
import fnmatch
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ckload
import netlab
from ckptfs_testlib import (TORCH2, assert_refused, ckpt_bin, need_torch2, read_index, run,
                            torch_bytes)
from test_slices import part

need_torch2()
WRITER = Path(__file__).with_name("dcp_writer.py")


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


def expected_tensor(exp, t):
    dtype = getattr(torch, t["dtype"].split(".")[-1])
    flat = torch.frombuffer(bytearray(expected_bytes(exp, t)), dtype=dtype)
    return flat.reshape(t["shape"])


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


def test_convert_to_hugging_face_shards_leaving_optimizer_state_out(checkpoint, tmp_path):
    d, manifest, exp = checkpoint
    out = tmp_path / "hf"
    p = run([ckpt_bin(), "convert", d, out, "--max-shard-size", "1KB", "--only", "model."],
            timeout=120)
    assert p.returncode == 0, p.stderr
    weight_map = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    want = {n: t for n, t in manifest["tensors"].items() if n.startswith("model.")}
    assert set(weight_map) == set(want) and want
    from safetensors.torch import load_file
    for shard in set(weight_map.values()):
        for name, t in load_file(str(out / shard)).items():
            assert weight_map[name] == shard
            assert torch_bytes(t.contiguous()) == expected_bytes(exp, want[name]), name


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


def test_views_saved_as_they_are_read_as_torch_reads_them(tmp_path_factory, mount):
    """A state dict holding non-contiguous tensors (a transposed weight, a permuted cube),
    saved from one process: DCP writes each archive's tensor with its strides, which was
    refused; ckpt cat, the mount and ckload.load give the bytes dcp_to_torch_save + torch.load
    give."""
    d, manifest, exp = written(tmp_path_factory, "views")
    assert {"w.t", "cube.permuted", "half.t"} <= set(manifest["tensors"])
    with mount(d) as m:
        index = {t["name"]: t for t in read_index(m)["tensors"]}
        for name, t in manifest["tensors"].items():
            want = expected_bytes(exp, t)
            assert index[name]["shape"] == t["shape"], name
            assert (m / index[name]["path"]).read_bytes() == want, name
            assert run([ckpt_bin(), "cat", d, name]).stdout == want, name
    sd = ckload.load(d, device="cpu")
    for name, t in manifest["tensors"].items():
        assert torch.equal(sd[name], expected_tensor(exp, t)), name


def test_a_million_chunks_written_by_pythons_pickle_open(tmp_path):
    """DCP_MAX_CHUNKS chunks of one tensor, each its own record (all naming one archive, so
    the test stays small): Python's pickle spends 16 memo slots a chunk, which the VM's memo
    limit (10M) refused at 625,000; every row reads as the archive's tensor, as torch wrote it."""
    d = tmp_path / "million"
    torch2("shared", d, 1000000, 0, timeout=600)
    p = run([ckpt_bin(), "ls", "--json", d], timeout=300)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    assert [(t["name"], t["shape"]) for t in json.loads(p.stdout)["tensors"]] == \
        [("w", [1000000, 4])]
    row = torch_bytes(torch.load(d / "a.distcp"))  # the one archive, as torch reads it
    got = run([ckpt_bin(), "cat", d, "w"], timeout=300).stdout
    assert len(row) == 16 and got == row * 1000000


@pytest.fixture(scope="module")
def wrong_fields(sharded2, tmp_path_factory):
    """dcp_writer.py fields: one checkpoint per field of the metadata set to another type."""
    d = tmp_path_factory.mktemp("dcp-fields")
    torch2("fields", sharded2, d)
    return d


def test_a_field_of_another_type_is_refused_in_one_line(wrong_fields, mountpoint):
    """A field of the metadata that holds a str, float, bytes, dtype or a tuple of strs where
    torch wrote an int, a tuple, a str or a record (MetadataIndex.offset, the storage key of a
    chunk's record: a string read as a pointer would crash): ckpt ls, the
    mount and ckload.load each refuse it in one line naming the .metadata, and live on."""
    cases = sorted(wrong_fields.iterdir())
    assert len(cases) > 60 and {c.name for c in cases} >= {
        "index.offset-str", "index.offset-float", "index.offset-bytes", "index.offset-dtype",
        "properties.state-short", "properties.state-empty"}
    for bad in cases:
        meta = bad / ".metadata"
        p = run([ckpt_bin(), "ls", bad])
        err = p.stderr.decode(errors="replace")
        assert p.returncode == 1 and p.stdout == b"", (bad.name, p.returncode, err)
        assert err.startswith(f"ckpt: {meta}: ") and err.count("\n") == 1, (bad.name, err)
        assert_refused(bad, mountpoint, prefix=meta)
        with pytest.raises(ckload.Error) as e:
            ckload.load(bad, device="cpu")
        assert str(e.value).startswith(f"ckload: {meta}: "), (bad.name, str(e.value))


def test_ckload_loads_every_tensor_and_fills_a_modules_memory(checkpoint):
    d, manifest, exp = checkpoint
    sd = ckload.load(d, device="cpu")
    assert set(sd) == set(manifest["tensors"])
    for name, t in manifest["tensors"].items():
        assert list(sd[name].shape) == t["shape"], name
        assert torch_bytes(sd[name]) == expected_bytes(exp, t), name
    target = {name: torch.zeros(t["shape"], dtype=getattr(torch, t["dtype"].split(".")[-1]))
              for name, t in manifest["tensors"].items()}
    ckload.load_into(target, d)
    for name, t in manifest["tensors"].items():
        assert torch_bytes(target[name]) == expected_bytes(exp, t), name


@pytest.fixture(scope="module")
def fsdp4(tmp_path_factory):
    """4 ranks' FSDP2 checkpoint of two 256-wide blocks: each weight in 4 chunks of rows."""
    return written(tmp_path_factory, "model", 4, 2, 256)


def rchar():
    """Bytes this process has asked read(2) and pread(2) for, every thread's, whatever the page
    cache held (the kernel's count, /proc/self/io): what the loader read, not what readahead
    brought in."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def counted(fn):
    before = rchar()
    out = fn()
    return out, rchar() - before


# tensor-parallel rules over FSDP's row chunks: rows for the input projections, columns (a
# piece of every chunk) for the output ones
TP_RULES = [("*.o_proj", 1), ("*.down_proj", 1), ("*", 0)]


@pytest.mark.parametrize("world", [2, 3])
def test_a_resharded_load_reads_its_share_and_no_more(fsdp4, world):
    """4 ranks' FSDP chunks loaded as `world` tensor-parallel parts: each rank's tensors are
    torch.chunk's parts of torch's own tensors, and each rank reads, by the kernel's count, at
    most 1/world of the tensor bytes plus one chunk, besides what opening the checkpoint reads
    (a whole load's count less its tensor bytes)."""
    d, manifest, exp = fsdp4
    whole = lambda: ckload.load(d, device="cpu")
    counted(whole)  # the first: imports and lazy set-up out of the counts
    sd, whole_read = counted(whole)
    total = sum(t.numel() * t.element_size() for t in sd.values())
    opening = whole_read - total
    assert 0 <= opening < total / 20, (whole_read, total)
    chunk = max(t.numel() * t.element_size() for t in sd.values()) // 4
    for rank in range(world):
        got, read = counted(lambda: ckload.load(d, device="cpu", slices=TP_RULES, rank=rank,
                                                world_size=world))
        for name, t in manifest["tensors"].items():
            dim = next(dim for glob, dim in TP_RULES if fnmatch.fnmatchcase(name, glob))
            want = part(expected_tensor(exp, t), dim, rank, world)
            assert torch_bytes(got[name]) == torch_bytes(want), (name, rank)
        assert read <= total / world + chunk + opening, (rank, read, total, chunk, opening)


def test_over_http_as_any_source(checkpoint, mount):
    """The .metadata's URL: the .distcp files beside it fetched by range."""
    d, manifest, exp = checkpoint
    with netlab.Nginx(d) as srv:
        url = srv.url(".metadata")
        with mount(url) as m:
            paths = {t["name"]: t["path"] for t in read_index(m)["tensors"]}
            for name, t in manifest["tensors"].items():
                assert (m / paths[name]).read_bytes() == expected_bytes(exp, t), name
        sd = ckload.load(url, device="cpu")
        for name, t in manifest["tensors"].items():
            assert torch_bytes(sd[name]) == expected_bytes(exp, t), name
