"""The pack: `ckpt pack` from every source kind, the mount's virtual checkpoint.pack (byte for
byte what ckpt pack writes) and checkpoint.safetensors (read by the safetensors library), and
`ckpt verify`. Expected values come from torch.load and the safetensors library."""
import errno
import json
import os
import resource
import signal
import struct
import subprocess
import time

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ckptfs_testlib import (DTYPE_NAMES, assert_refused, check_torch_mount, ckpt_bin, library_view,
                            read_index, run, torch_bytes, xxh3)
from test_torch import training_checkpoint, views


def ckpt(*args, timeout=120):
    return run([ckpt_bin(), *args], timeout=timeout)


def pack(src, out, *extra):
    p = ckpt("pack", src, out, *extra)
    assert p.returncode == 0, p.stderr.decode()
    assert p.stderr == b"", p.stderr  # not a terminal: no progress bar
    return out


def torch_source(tmp_path, **kw):
    obj = dict(training_checkpoint(), views=views())
    obj["tied"] = {"a": obj["views"]["base"], "b": obj["views"]["base"]}
    path = tmp_path / "src.pt"
    torch.save(obj, path, **kw)
    return path


def safetensors_source(tmp_path):
    g = torch.Generator().manual_seed(3)
    t = {f"layers.{i}.w": torch.randn(4, i + 1, generator=g) for i in range(12)}
    t["embed"] = torch.randn(10, 3, generator=g).to(torch.bfloat16)
    t["scalar"] = torch.tensor(5, dtype=torch.int64)
    t["empty"] = torch.zeros(0, 2)
    path = tmp_path / "src.safetensors"
    save_file(t, str(path), metadata={"format": "pt", "note": "x"})
    return path


def sharded_source(tmp_path):
    d = tmp_path / "shards"
    d.mkdir()
    save_file({"a.w": torch.ones(3), "a.b": torch.zeros(2, 2)}, str(d / "m-1.safetensors"))
    save_file({"c": torch.arange(5)}, str(d / "m-2.safetensors"))
    return d


def pack_header(path):
    with open(path, "rb") as f:
        h = f.read(64)
    magic, version, flags, io_, il, do, dl, co, ix = struct.unpack("<8sIIQQQQQQ", h)
    return dict(magic=magic, version=version, flags=flags, index_offset=io_, index_length=il,
                data_offset=do, data_length=dl, checksum_offset=co)


# --- round trips -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["zip", "legacy", "protocol4"])
def test_torch_round_trip(tmp_path, mount, kind):
    kw = {"legacy": {"_use_new_zipfile_serialization": False},
          "protocol4": {"pickle_protocol": 4}}.get(kind, {})
    src = torch_source(tmp_path, **kw)
    out = pack(src, tmp_path / "out.pack")
    with mount(out) as mnt:
        index = check_torch_mount(mnt, src, "pack")
        assert index["metadata"]["ckptfs.source_format"].startswith("pytorch-")


def test_safetensors_round_trip(tmp_path, mount):
    src = safetensors_source(tmp_path)
    out = pack(src, tmp_path / "out.pack")
    tensors, meta = library_view(src)
    with mount(out) as mnt:
        index = read_index(mnt)
        assert index["metadata"] == dict(meta, **{"ckptfs.source_format": "safetensors"})
        assert {t["name"] for t in index["tensors"]} == set(tensors)
        for t in index["tensors"]:
            dtype, shape, data = tensors[t["name"]]
            assert (t["dtype"], t["shape"]) == (dtype, shape)
            assert (mnt / t["path"]).read_bytes() == data


def test_sharded_round_trip(tmp_path, mount):
    src = sharded_source(tmp_path)
    out = pack(src, tmp_path / "out.pack")
    tensors, _ = library_view(src)
    with mount(out) as mnt:
        for t in read_index(mnt)["tensors"]:
            assert (mnt / t["path"]).read_bytes() == tensors[t["name"]][2]


@pytest.mark.parametrize("name", ["candle_fortran_tensor_3d.pth", "tinypellm_pytorch_model.bin",
                                  "graykode_mnist_cnn_legacy.pt", "candle_test_with_key.pt"])
def test_corpus_round_trip(tmp_path, corpus, mount, name):
    out = pack(corpus / name, tmp_path / "out.pack")
    assert run([ckpt_bin(), "verify", out]).returncode == 0
    with mount(out) as mnt:
        check_torch_mount(mnt, corpus / name, "pack")


def test_pack_layout_follows_the_spec(tmp_path):
    out = pack(torch_source(tmp_path), tmp_path / "out.pack")
    h = pack_header(out)
    assert h["magic"] == b"CKPTPACK" and h["version"] == 1 and h["flags"] == 0
    assert h["index_offset"] == 64 and h["data_offset"] % 4096 == 0
    assert h["data_length"] % 4096 == 0
    assert h["checksum_offset"] == h["data_offset"] + h["data_length"]
    listed = ckpt("ls", "--json", out)
    offsets = [t["offset"] for t in json.loads(listed.stdout)["tensors"]]
    assert all((o - h["data_offset"]) % 256 == 0 for o in offsets)


def test_natural_order_and_tied_weights_stored_once(tmp_path, mount):
    w = torch.randn(256, 256)
    obj = {f"layers.{i}.w": torch.full((4,), float(i)) for i in (10, 2, 1, 0)}
    obj.update(embed=w, head=w)
    src = tmp_path / "t.pt"
    torch.save(obj, src)
    out = pack(src, tmp_path / "out.pack")
    h = pack_header(out)
    assert h["data_length"] < 2 * w.numel() * 4, "the tied tensor was stored twice"
    with mount(out) as mnt:
        names = [t["name"] for t in read_index(mnt)["tensors"]]
        assert names == ["embed", "head", "layers.0.w", "layers.1.w", "layers.2.w", "layers.10.w"]
        assert (mnt / "embed").read_bytes() == (mnt / "head").read_bytes() == torch_bytes(w)


@pytest.mark.parametrize("only,expect", [("layers.1", {"layers.1.w"}),
                                         ("layers.*", {"layers.0.w", "layers.1.w", "layers.10.w"}),
                                         ("embed", {"embed"})])
def test_only(tmp_path, mount, only, expect):
    obj = {"layers.0.w": torch.ones(2), "layers.1.w": torch.ones(3), "layers.10.w": torch.ones(4),
           "embed": torch.zeros(5)}
    src = tmp_path / "s.pt"
    torch.save(obj, src)
    out = pack(src, tmp_path / "out.pack", "--only", only)
    with mount(out) as mnt:
        assert {t["name"] for t in read_index(mnt)["tensors"]} == expect


def test_only_that_selects_nothing_fails(tmp_path):
    src = safetensors_source(tmp_path)
    p = ckpt("pack", src, tmp_path / "out.pack", "--only", "nothing.here")
    assert p.returncode == 1 and b"selects nothing" in p.stderr
    assert os.listdir(tmp_path) == ["src.safetensors"]


# --- the virtual files ---------------------------------------------------------------------

@pytest.mark.parametrize("make", ["torch", "legacy", "safetensors", "sharded"])
def test_virtual_pack_is_the_written_pack(tmp_path, mount, make):
    src = {"torch": lambda: torch_source(tmp_path),
           "legacy": lambda: torch_source(tmp_path, _use_new_zipfile_serialization=False),
           "safetensors": lambda: safetensors_source(tmp_path),
           "sharded": lambda: sharded_source(tmp_path)}[make]()
    written = pack(src, tmp_path / "out.pack").read_bytes()
    with mount(src) as mnt:
        virtual = mnt / ".ckptfs" / "checkpoint.pack"
        assert os.stat(virtual).st_size == len(written)
        assert virtual.read_bytes() == written
        # read backwards in odd chunks: the trailer first, then the rest
        with open(virtual, "rb") as f:
            for off in range(len(written), 0, -99991):
                f.seek(max(0, off - 7777))
                assert f.read(7777) == written[max(0, off - 7777):off]


def test_pack_of_a_pack_is_identical(tmp_path, mount):
    first = pack(torch_source(tmp_path), tmp_path / "a.pack")
    second = pack(first, tmp_path / "b.pack")
    assert first.read_bytes() == second.read_bytes()
    with mount(first) as mnt:
        assert (mnt / ".ckptfs" / "checkpoint.pack").read_bytes() == first.read_bytes()


def test_virtual_safetensors_opens_with_the_library(tmp_path, mount):
    src = torch_source(tmp_path)
    expected = {}
    for name, v in flatten_tensors(torch.load(src, map_location="cpu", weights_only=False)).items():
        expected[name] = v
    with mount(src) as mnt:
        path = mnt / ".ckptfs" / "checkpoint.safetensors"
        with safe_open(str(path), framework="pt") as f:  # the library mmaps the file
            keys = set(f.keys())
            omitted = set(json.loads(
                (f.metadata() or {}).get("ckptfs.omitted", "[]")))
            for k in keys:
                assert torch.equal(f.get_tensor(k), expected[k].contiguous()), k
        assert keys | omitted == set(expected)
        assert all(expected[k].dtype not in DTYPE_NAMES or DTYPE_NAMES[expected[k].dtype] == "C128"
                   for k in omitted)


def flatten_tensors(obj, prefix=None, out=None):
    out = {} if out is None else out
    items = (obj.items() if isinstance(obj, dict) else
             enumerate(obj) if isinstance(obj, (list, tuple)) else None)
    if items is None:
        if isinstance(obj, torch.Tensor):
            out["" if prefix is None else prefix] = obj
        return out
    for k, v in items:
        flatten_tensors(v, str(k) if prefix is None else f"{prefix}.{k}", out)
    return out


# --- verify ------------------------------------------------------------------------------------

@pytest.mark.parametrize("victim", ["embed", "layers.7.w", "layers.11.w", "scalar"])
def test_verify_catches_one_flipped_byte(tmp_path, victim):
    """The first, a middle and the last blob: each mismatch is named by its own tensor."""
    src = safetensors_source(tmp_path)
    out = pack(src, tmp_path / "out.pack")
    ok = ckpt("verify", out)
    assert ok.returncode == 0, ok.stderr
    listed = json.loads(ckpt("ls", "--json", out).stdout)
    t = next(t for t in listed["tensors"] if t["name"] == victim)
    data = bytearray(out.read_bytes())
    data[t["offset"] + 5] ^= 0x10
    out.write_bytes(bytes(data))
    bad = ckpt("verify", out)
    assert bad.returncode == 1
    assert one_line(bad.stderr) == (f"ckpt: {out}: tensor '{victim}': checksum mismatch (data at "
                                    f"byte {t['offset']})\n")


def test_verify_catches_a_corrupt_checksum_table(tmp_path):
    out = pack(safetensors_source(tmp_path), tmp_path / "out.pack")
    data = bytearray(out.read_bytes())
    data[-3] ^= 1
    out.write_bytes(bytes(data))
    bad = ckpt("verify", out)
    assert bad.returncode == 1 and b"checksum table" in bad.stderr


def test_a_corrupt_index_is_refused_at_open(tmp_path):
    out = pack(safetensors_source(tmp_path), tmp_path / "out.pack")
    data = bytearray(out.read_bytes())
    data[100] ^= 1
    out.write_bytes(bytes(data))
    p = ckpt("ls", out)
    assert p.returncode == 1 and p.stderr.startswith(b"ckpt: ")


# --- a layout that breaks FORMAT.md ------------------------------------------------------------

def blob_table(data):
    """File offset of a pack's blob table, read as FORMAT.md says (nothing from ckptfs)."""
    nmeta = struct.unpack_from("<I", data, 64 + 16)[0]
    at = 64 + 24
    for _ in range(2 * nmeta):
        at += 4 + struct.unpack_from("<I", data, at)[0]
    return at


def blob_fields(data):
    """{name: file offset of its u64 blob number} for the tensors of a pack."""
    nentries, nblobs = struct.unpack_from("<QQ", data, 64)
    at = blob_table(data) + 16 * nblobs
    fields = {}
    for _ in range(nentries):
        n = struct.unpack_from("<I", data, at)[0]
        name = data[at + 4:at + 4 + n].decode()
        kind, _, rank, _ = data[at + 4 + n:at + 8 + n]
        at += 8 + n
        if kind == 0:
            fields[name] = at + 8 * rank
            at += 8 * rank + 8
        else:
            at += 4 + struct.unpack_from("<I", data, at)[0]
    assert at == 64 + struct.unpack_from("<Q", data, 24)[0]
    return fields


def fix_index_xxh3(data):
    index = bytes(data[64:64 + struct.unpack_from("<Q", data, 24)[0]])
    struct.pack_into("<Q", data, 56, xxh3(index))


def two_tensor_pack(tmp_path):
    """`ckpt pack` of two F32 [2048] tensors, a (all 1) and b (all 2), and its bytes."""
    src = tmp_path / "two.safetensors"
    save_file({"a": torch.full((2048,), 1.0), "b": torch.full((2048,), 2.0)}, str(src))
    out = pack(src, tmp_path / "two.pack")
    return out, bytearray(out.read_bytes())


def test_swapped_blob_numbers_are_refused_everywhere(tmp_path, mountpoint):
    """The entries name their blobs in swapped order (a -> blob 1, b -> blob 0), the index
    checksum fixed: sizes and every checksum agree, only the numbering breaks FORMAT.md. A
    reader that rebuilt the layout instead would load both tensors from one place."""
    import ckload
    out, data = two_tensor_pack(tmp_path)
    fields = blob_fields(data)
    assert [struct.unpack_from("<Q", data, fields[n])[0] for n in "ab"] == [0, 1]
    struct.pack_into("<Q", data, fields["a"], 1)
    struct.pack_into("<Q", data, fields["b"], 0)
    fix_index_xxh3(data)
    out.write_bytes(bytes(data))
    want = (f"{out}: pack entry 0 ('a'): names blob 1 before any entry names blob 0: blobs are "
            f"numbered in the order their first tensor appears (byte {fields['a']})")
    for cmd in ("ls", "verify"):
        p = ckpt(cmd, out)
        assert p.returncode == 1 and p.stdout == b"", (cmd, p.stdout)
        assert one_line(p.stderr) == f"ckpt: {want}\n", cmd
    assert assert_refused(out, mountpoint) == f"ckptfs: {want}"
    with pytest.raises(RuntimeError) as e:
        ckload.load(out, device="cpu")
    assert want in str(e.value) and "\n" not in str(e.value)


def test_a_blob_out_of_its_place_is_refused(tmp_path):
    """Blob 1 said to start 256 bytes late (index checksum fixed): a gap FORMAT.md does not
    allow, so the table cannot be trusted as it stands."""
    out, data = two_tensor_pack(tmp_path)
    row = blob_table(data) + 16
    assert struct.unpack_from("<QQ", data, row) == (8192, 8192)
    struct.pack_into("<Q", data, row, 8192 + 256)
    fix_index_xxh3(data)
    out.write_bytes(bytes(data))
    p = ckpt("ls", out)
    assert p.returncode == 1
    assert one_line(p.stderr) == (f"ckpt: {out}: pack blob 1: offset 8448, but blob 0 ends at "
                                  f"8192, so this one starts at 8192, the next multiple of 256 "
                                  f"(byte {row})\n")


# --- failures leave nothing ------------------------------------------------------------------

def test_a_bad_source_leaves_nothing(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"PK\x03\x04" + b"\x00" * 100)
    p = ckpt("pack", bad, tmp_path / "out.pack")
    assert p.returncode == 1
    assert sorted(os.listdir(tmp_path)) == ["bad.pt"]


def started_writing(p, d, prefix):
    deadline = time.time() + 20
    while not any(n.startswith(prefix) for n in os.listdir(d)):
        assert time.time() < deadline and p.poll() is None, "ckpt never started writing"
        time.sleep(0.005)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    path = tmp_path_factory.mktemp("big") / "big.safetensors"
    save_file({f"t{i}": torch.ones((64 << 20) // 4) for i in range(24)}, str(path))  # 1.5 GiB
    return path


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=lambda s: s.name)
@pytest.mark.parametrize("cmd", ["pack", "convert"])
def test_an_interrupted_command_leaves_nothing_and_dies_by_the_signal(big, tmp_path, sig, cmd):
    """As coreutils do: what it was writing is removed, then it dies by the same signal (the
    shell sees 128+N, and a loop around it stops)."""
    out = tmp_path / "out"
    p = subprocess.Popen([str(ckpt_bin()), cmd, str(big), str(out)], stderr=subprocess.PIPE)
    started_writing(p, tmp_path, "out.ckpt-tmp-")
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == -sig, (p.returncode, err)
    assert b"interrupted" in err
    assert os.listdir(tmp_path) == []


def test_a_killed_commands_leftover_is_cleaned_by_the_next_run(big, tmp_path):
    out = tmp_path / "out.pack"
    p = subprocess.Popen([str(ckpt_bin()), "pack", str(big), str(out)], stderr=subprocess.PIPE)
    started_writing(p, tmp_path, "out.pack.ckpt-tmp-")
    p.kill()
    p.communicate(timeout=60)
    left = os.listdir(tmp_path)
    assert len(left) == 1 and left[0].startswith(f"out.pack.ckpt-tmp-{p.pid}-"), left
    # a live writer's temp file (this process's pid) and another output's are not touched
    mine = tmp_path / f"out.pack.ckpt-tmp-{os.getpid()}-abcdef"
    other = tmp_path / f"other.pack.ckpt-tmp-{p.pid}-abcdef"
    mine.write_bytes(b"x")
    other.write_bytes(b"x")
    small = tmp_path.parent / "small.safetensors"
    save_file({"w": torch.ones(4)}, str(small))
    q = ckpt("pack", small, out)
    assert q.returncode == 0, q.stderr
    assert sorted(os.listdir(tmp_path)) == sorted(["out.pack", mine.name, other.name])


def test_a_killed_directory_outputs_leftover_is_cleaned(tmp_path):
    """A shard directory's temp: the directory and the files in it."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = tmp_path / f"hf.ckpt-tmp-{gone.pid}-abcdef"
    stale.mkdir()
    (stale / "model-00001-of-00002.safetensors").write_bytes(b"partial")
    small = tmp_path.parent / "small2.safetensors"
    save_file({"w": torch.ones(4)}, str(small))
    q = ckpt("convert", small, tmp_path / "hf", "--max-shard-size", "1MB")
    assert q.returncode == 0, q.stderr
    assert os.listdir(tmp_path) == ["hf"]


def one_line(stderr):
    """The failure contract's stderr: exactly one line, starting "ckpt: "."""
    text = stderr.decode()
    assert text.startswith("ckpt: ") and text.endswith("\n") and text.count("\n") == 1, text
    return text


def limited_to_1mib(sigxfsz):
    """preexec_fn: a 1 MiB file size limit, SIGXFSZ ignored (writes past it fail with EFBIG) or
    left to its default action (it kills the writer, unless the writer ignores it itself)."""
    def preexec():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        signal.signal(signal.SIGXFSZ, sigxfsz)
    return preexec


@pytest.mark.parametrize("sigxfsz", [signal.SIG_IGN, signal.SIG_DFL], ids=["ignored", "default"])
def test_a_write_error_leaves_nothing(tmp_path, sigxfsz):
    src = tmp_path / "src.safetensors"
    save_file({f"t{i}": torch.full(((1 << 20) // 4,), float(i)) for i in range(4)}, str(src))
    out = tmp_path / "out.pack"
    p = run([ckpt_bin(), "pack", src, out], timeout=60, preexec_fn=limited_to_1mib(sigxfsz))
    assert p.returncode == 1, (p.returncode, p.stderr)
    line = one_line(p.stderr)
    assert str(out) in line and os.strerror(errno.EFBIG) in line, line
    assert p.stdout == b""
    assert os.listdir(tmp_path) == ["src.safetensors"]


def test_pack_into_a_missing_directory_creates_nothing(tmp_path):
    src = safetensors_source(tmp_path)
    out = tmp_path / "missing" / "out.pack"
    p = ckpt("pack", src, out)
    assert p.returncode == 1
    line = one_line(p.stderr)
    assert line == (f"ckpt: {out}: cannot create it: {out.parent} does not exist "
                    f"(mkdir -p {out.parent} first)\n"), line
    assert p.stdout == b""
    assert os.listdir(tmp_path) == ["src.safetensors"]


@pytest.mark.parametrize("make", ["safetensors", "sharded", "garbage"])
def test_verify_of_something_that_is_not_a_pack(tmp_path, make):
    if make == "garbage":
        src = tmp_path / "x.bin"
        src.write_bytes(b"\x00" * 100)
    else:
        src = {"safetensors": safetensors_source, "sharded": sharded_source}[make](tmp_path)
    before = sorted(os.listdir(tmp_path))
    p = ckpt("verify", src)
    assert p.returncode == 1
    line = one_line(p.stderr)
    assert line.startswith(f"ckpt: {src}"), line
    if make != "garbage":
        assert "not a pack" in line, line
    assert p.stdout == b""
    assert sorted(os.listdir(tmp_path)) == before
