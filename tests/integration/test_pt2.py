"""torch.export archives (.pt2, formats/pt2.h): every weight and tensor constant is mounted under its
FQN with exactly the bytes torch.export.load gives (row-major, little-endian), `ckpt ls` and
`ckpt cat` agree, and `ckpt convert` writes a file the safetensors library reads back equal.
The archive and the expected bytes come from torch 2.x (.deps/torch2, which writes .pt2; the
system torch does not), run in a subprocess. Hostile archives (a real one rewritten with
zipfile) are refused with one line, nothing mounted."""
import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from ckptfs_testlib import (TORCH2, assert_refused, ckpt_bin, library_view, need_torch2,
                            read_index, run)

need_torch2()

# Writes OUT/model.pt2 with torch.export.save, then what torch.export.load reads back: every
# state_dict and constants tensor's row-major bytes as OUT/expected/N.bin and
# OUT/expected.json {name: {"dtype", "shape", "file"}}.
WRITER = r"""
import json, sys, torch
from pathlib import Path

out = Path(sys.argv[1])
NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
         torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL",
         torch.float64: "F64", torch.int8: "I8"}

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(7)
        self.lin = torch.nn.Linear(4, 3)
        self.cube = torch.nn.Parameter(torch.randn(3, 4, 5, generator=g).to(torch.bfloat16))
        # a transposed view as a parameter: strides (1, 6) over a 5x6 storage
        self.tr = torch.nn.Parameter(torch.randn(5, 6, generator=g).t())
        self.register_buffer("steps", torch.arange(-3, 3, dtype=torch.int64).reshape(2, 3))
        # two buffers on one storage, the second at storage offset 3
        self.register_buffer("whole", torch.arange(10, dtype=torch.float16))
        self.register_buffer("part", self.whole[3:7])
        self.register_buffer("flags", torch.tensor([True, False, True]))
        self.register_buffer("empty", torch.zeros(0, 3))
        self.const = torch.tensor([1.5, -2.5, 3.25], dtype=torch.float64)  # a tensor constant

    def forward(self, x):
        return (self.lin(x) + self.cube.float().sum() + self.tr.sum() + self.steps.sum()
                + self.whole.sum() + self.part.sum() + self.flags.sum() + self.empty.sum()
                + self.const.sum())

ep = torch.export.export(Model(), (torch.randn(2, 4),))
torch.export.save(ep, out / "model.pt2")
back = torch.export.load(out / "model.pt2")
assert back.constants, "no tensor constant was lifted"
(out / "expected").mkdir()
meta = {}
for i, (name, t) in enumerate([*back.state_dict.items(), *back.constants.items()]):
    t = t.detach()
    raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    (out / "expected" / f"{i}.bin").write_bytes(raw)
    meta[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "file": f"{i}.bin"}
(out / "expected.json").write_text(json.dumps(meta))
"""


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """(the .pt2, {name: (dtype, shape, bytes)} as torch.export.load reads it)."""
    out = tmp_path_factory.mktemp("pt2")
    p = subprocess.run([str(TORCH2), "-c", WRITER, str(out)], capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    meta = json.loads((out / "expected.json").read_text())
    want = {name: (m["dtype"], m["shape"], (out / "expected" / m["file"]).read_bytes())
            for name, m in meta.items()}
    return out / "model.pt2", want


def ckpt(*args):
    return run([ckpt_bin(), *map(str, args)], timeout=120)


def test_mount_matches_torch(source, mount):
    src, want = source
    with mount(src) as mnt:
        index = read_index(mnt)
        assert index["format"] == "pt2"
        assert {t["name"] for t in index["tensors"]} == set(want)
        assert len(index["tensors"]) == len(want)
        for ent in index["tensors"]:
            dtype, shape, data = want[ent["name"]]
            assert (ent["dtype"], ent["shape"], ent["nbytes"]) == (dtype, shape, len(data)), ent
            assert (mnt / ent["path"]).read_bytes() == data, ent["name"]


def test_ls_and_cat_agree(source, mount):
    src, want = source
    p = ckpt("ls", "--json", src)
    assert p.returncode == 0 and p.stderr == b"", p.stderr
    listed = json.loads(p.stdout)
    assert listed["format"] == "pt2"
    with mount(src) as mnt:
        index = {t["name"]: t for t in read_index(mnt)["tensors"]}
    assert {t["name"] for t in listed["tensors"]} == set(want)
    for t in listed["tensors"]:
        rest = {k: v for k, v in t.items() if k not in ("file", "offset")}
        assert rest == index[t["name"]]
        p = ckpt("cat", src, t["name"])
        assert p.returncode == 0 and p.stderr == b"", t["name"]
        assert p.stdout == want[t["name"]][2], t["name"]


def test_convert_to_safetensors(source, tmp_path):
    src, want = source
    out = tmp_path / "out.safetensors"
    p = ckpt("convert", src, out)
    assert p.returncode == 0 and p.stderr == b"", p.stderr.decode()
    got, _ = library_view(out)
    assert got == {name: (d, s, b) for name, (d, s, b) in want.items()}


# --- hostile archives ---------------------------------------------------------------------------

def rewrite(src, dst, change):
    """Copies the .pt2 src to dst (stored members, as torch writes them), the weights config
    passed through change(config dict) -> JSON text, or change(name, bytes) -> bytes | None for
    every member when change takes two arguments (None drops the member)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if change.__code__.co_argcount == 2:
                data = change(info.filename, data)
            elif info.filename.endswith("/data/weights/model_weights_config.json"):
                data = change(json.loads(data)).encode()
            if data is not None:
                zout.writestr(info.filename, data, zipfile.ZIP_STORED)
    return dst


def edit(field, value, fqn="lin.weight"):
    """A config change: payload fqn's tensor_meta field (path_name: the payload's own)."""
    def change(cfg):
        p = cfg["config"][fqn]
        (p if field == "path_name" else p["tensor_meta"])[field] = value
        return json.dumps(cfg)
    return change


def deflate_weights(src, dst):
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            method = zipfile.ZIP_DEFLATED if "/data/weights/weight_" in info.filename \
                else zipfile.ZIP_STORED
            zout.writestr(info.filename, zin.read(info), method)
    return dst


HOSTILE = {
    # name: (how to make it from the real archive, what the one line must say)
    "missing_member": (edit("path_name", "weight_99"), "weight_99' is missing"),
    "dropped_member": (lambda name, data: None if name.endswith("/weight_0") else data,
                       "is missing"),
    "sizes_past_member": (edit("sizes", [{"as_int": 300}, {"as_int": 4}]), "past the end"),
    "strides_past_member": (edit("strides", [{"as_int": 400}, {"as_int": 1}]), "past the end"),
    "offset_past_member": (edit("storage_offset", {"as_int": 1}), "past the end"),
    "huge_sizes": (edit("sizes", [{"as_int": 2 ** 52}, {"as_int": 2 ** 52}]), "overflow"),
    "unknown_dtype": (edit("dtype", 99), "unknown dtype 99"),
    "dtype_unknown_zero": (edit("dtype", 0), "unknown dtype 0"),
    "symbolic_size": (edit("sizes", [{"as_expr": "s0"}, {"as_int": 4}]), "sizes[0]"),
    "rank_mismatch": (edit("strides", [{"as_int": 1}]), "2 sizes but 1 strides"),
    "sparse_layout": (edit("layout", 1), "layout"),
    "malformed_json": (lambda cfg: json.dumps(cfg)[:-3], "not valid JSON"),
    "no_config_object": (lambda cfg: "[]", "no \"config\" object"),
    "float_number": (edit("dtype", 7.5), "not an integer"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_refused(source, case, tmp_path, mountpoint):
    make, says = HOSTILE[case]
    bad = rewrite(source[0], tmp_path / "bad.pt2", make)
    line = assert_refused(bad, mountpoint)
    assert says in line, line
    p = ckpt("ls", bad)
    assert p.returncode == 1 and p.stdout == b"" and p.stderr.count(b"\n") == 1, p.stderr


def test_deflated_weight_refused(source, tmp_path, mountpoint):
    bad = deflate_weights(source[0], tmp_path / "deflated.pt2")
    line = assert_refused(bad, mountpoint)
    assert "compressed" in line and "stored" in line, line


# Writes what torch.export.save stores for a payload it pickles (_save_pickled_tensors: the
# torch.save of a tensor subclass; a custom object's pickle.dumps): argv[1] the kind, argv[2]
# the file.
PICKLED = r"""
import io, pickle, sys, torch
kind, out = sys.argv[1], sys.argv[2]
g = torch.Generator().manual_seed(3)
if kind == "opaque":
    data = pickle.dumps({"lr": 0.001, "betas": (0.9, 0.95), "names": ["a", "b", "c"]})
else:
    obj = torch.randn(3, generator=g)  # lin.bias's shape and dtype, a Parameter as torch's
    if kind == "subclass":
        from torch.testing._internal.two_tensor import TwoTensor
        obj = TwoTensor(obj, torch.randn(3, generator=g))
    buf = io.BytesIO()
    torch.save(torch.nn.Parameter(obj) if kind == "tensor" else obj, buf)
    data = buf.getvalue()
open(out, "wb").write(data)
"""

# torch.export.load's lin.bias of argv[1], its bytes into argv[2]
LOADED_BIAS = r"""
import sys, torch
t = torch.export.load(sys.argv[1]).state_dict["lin.bias"].detach()
open(sys.argv[2], "wb").write(t.contiguous().view(torch.uint8).numpy().tobytes())
"""


def torch2(script, *args):
    p = subprocess.run([str(TORCH2), "-c", script, *map(str, args)], capture_output=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr.decode()[-3000:]


def with_pickled_bias(src, dst, payload):
    """src with lin.bias's record replaced by payload and marked use_pickle, as torch writes a
    pickled payload."""
    record = json.loads(zipfile.ZipFile(src).read(next(
        n for n in zipfile.ZipFile(src).namelist()
        if n.endswith("/data/weights/model_weights_config.json"))))["config"]["lin.bias"]
    path_name = record["path_name"]

    def change(name, data):
        if name.endswith(f"/data/weights/{path_name}"):
            return payload
        if name.endswith("/data/weights/model_weights_config.json"):
            cfg = json.loads(data)
            cfg["config"]["lin.bias"]["use_pickle"] = True
            return json.dumps(cfg).encode()
        return data
    return rewrite(src, dst, change)


def test_pickled_tensor_payload_served(source, tmp_path, mount):
    """A use_pickle payload holding a plain tensor (torch.save inside the archive) is read
    through the safe VM, with the bytes torch.export.load gives."""
    src, want = source
    torch2(PICKLED, "tensor", tmp_path / "payload")
    path = with_pickled_bias(src, tmp_path / "pickled.pt2", (tmp_path / "payload").read_bytes())
    torch2(LOADED_BIAS, path, tmp_path / "bias.bin")
    with mount(path) as mnt:
        index = read_index(mnt)
        tensors = {t["name"]: t for t in index["tensors"]}
        assert set(tensors) == set(want) and not index.get("omitted")
        assert (mnt / tensors["lin.bias"]["path"]).read_bytes() == \
            (tmp_path / "bias.bin").read_bytes()


@pytest.mark.parametrize("kind,says", [("subclass", "tensor-subclass"),
                                       ("opaque", "not a zip archive")])
def test_pickled_payload_it_cannot_show_is_omitted(source, tmp_path, mount, kind, says):
    """A tensor subclass's pickle (a class outside the policy) or a custom object's is listed as
    omitted, saying why; the rest is served."""
    src, want = source
    torch2(PICKLED, kind, tmp_path / "payload")
    path = with_pickled_bias(src, tmp_path / "pickled.pt2", (tmp_path / "payload").read_bytes())
    with mount(path) as mnt:
        index = read_index(mnt)
        assert {t["name"] for t in index["tensors"]} == set(want) - {"lin.bias"}
        assert [o["name"] for o in index["omitted"]] == ["lin.bias"]
        reason = index["omitted"][0]["reason"]
        assert reason.startswith("use_pickle: ") and says in reason, reason


def test_torch_save_zip_still_pytorch_zip(tmp_path):
    """A torch.save archive is still read as one (the directory says it is no .pt2)."""
    script = "import sys, torch; torch.save({'w': torch.arange(3.)}, sys.argv[1])"
    p = subprocess.run([str(TORCH2), "-c", script, str(tmp_path / "x.pt")], capture_output=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    p = ckpt("ls", "--json", tmp_path / "x.pt")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["format"] == "pytorch-zip"
