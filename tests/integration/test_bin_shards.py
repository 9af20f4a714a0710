"""Hugging Face's PyTorch checkpoints in a directory, as transformers writes them with
`save_pretrained(..., safe_serialization=False)`: sharded (`pytorch_model-0000N-of-0000M.bin` and
`pytorch_model.bin.index.json`) and one `pytorch_model.bin`, of tiny seeded models (Qwen2 with
tied embeddings, so that a shard holds one storage under two names, and GPT-2's Conv1D). Every
place a source goes - `ckptfs DIR`, `ckpt ls/cat/convert/pack/load`, ckload's load, load_into,
entries and stream, `hf://ORG/REPO` and an `s3://BUCKET/PREFIX/` - is checked byte for byte
against `torch.load` of each shard (weights_only=True) and against transformers' own
`from_pretrained` of the directory. Then the directory rule's order (safetensors over .bin as
transformers and vLLM take it, the training files beside a pytorch_model.bin left out, `*.pt`)
and the refusals of a shard set that does not add up, one line each."""
import io
import json
import os
import shutil

import numpy as np
import pytest
import torch

import netlab
from ckptfs_testlib import (DTYPE_NAMES, assert_refused, ckpt_bin, library_view, need_module,
                            read_index, run, torch_bytes)

transformers = need_module("transformers")
need_module("accelerate")  # what from_pretrained's low_cpu_mem_usage path needs in 4.44
ckload = need_module("ckload", "make builds it into build/python")
safetensors_torch = need_module("safetensors.torch")

INDEX = "pytorch_model.bin.index.json"
SHARD_SIZE = "20KB"  # a few shards of the tiny models below
TIMEOUT = 120


def configs():
    t = transformers
    return {
        "qwen2-tied": (t.Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, tie_word_embeddings=True),
                       t.Qwen2ForCausalLM),
        "gpt2": (t.GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64),
                 t.GPT2LMHeadModel),
    }


MODELS = list(configs())


def ckpt(*args, **kw):
    return run([ckpt_bin(), *args], timeout=TIMEOUT, **kw)


def build(name, seed=0):
    config, cls = configs()[name]
    torch.manual_seed(seed)
    return cls(config).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> (model, sharded directory, directory of one pytorch_model.bin), both written by
    transformers' save_pretrained with safe_serialization=False."""
    out = {}
    for name in MODELS:
        model = build(name)
        sharded = tmp_path_factory.mktemp(name + "-sharded")
        model.save_pretrained(sharded, safe_serialization=False, max_shard_size=SHARD_SIZE)
        single = tmp_path_factory.mktemp(name + "-single")
        model.save_pretrained(single, safe_serialization=False)
        # what the tests below stand on: transformers wrote what the Hub's PyTorch repos hold
        assert len(list(sharded.glob("pytorch_model-*-of-*.bin"))) >= 3, list(sharded.iterdir())
        assert (sharded / INDEX).is_file() and not list(sharded.glob("*.safetensors"))
        assert [p.name for p in single.glob("*.bin")] == ["pytorch_model.bin"]
        # both tie lm_head to the embeddings: one shard holds one storage under both names
        emb = next(n for n, p in model.named_parameters()
                   if p is model.get_input_embeddings().weight)
        tied = {"lm_head.weight", emb}
        for d in (sharded, single):
            assert {frozenset(t) for t in aliases_of(shards_of(d)).items()} == {frozenset(tied)}
        out[name] = (model, sharded, single)
    return out


# --- what torch and transformers read --------------------------------------------------------

def torch_load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def shards_of(d):
    """{file: {name: tensor}}: torch.load of each file the index names, or of pytorch_model.bin."""
    if (d / INDEX).exists():
        files = sorted(set(json.loads((d / INDEX).read_text())["weight_map"].values()))
    else:
        files = ["pytorch_model.bin"]
    return {f: torch_load(d / f) for f in files}


def tensors_of(shards):
    """{name: (file, tensor)} over every shard; a name is in one shard only."""
    out = {}
    for f, ts in shards.items():
        for n, t in ts.items():
            assert n not in out, f"{n} in {out[n][0]} and {f}"
            out[n] = (f, t)
    return out


def aliases_of(shards):
    """{name: the name it is an alias of}: in each shard, a name whose tensor is the same
    storage view as an earlier one's in torch.load's order, as ckptfs reports ties today."""
    out = {}
    for ts in shards.values():
        owner = {}
        for n, t in ts.items():
            key = (t.data_ptr(), t.dtype, tuple(t.shape), t.stride())
            if key in owner:
                out[n] = owner[key]
            else:
                owner[key] = n
    return out


def nbytes(t):
    return t.numel() * t.element_size()


def unique_bytes(shards):
    """The bytes a load reads: each storage view once."""
    return sum(nbytes(t) for f, ts in shards.items() for n, t in ts.items()
               if n not in aliases_of({f: ts}))


def pretrained(path, name):
    """transformers' own load of path: (model, loading info)."""
    model, info = configs()[name][1].from_pretrained(path, output_loading_info=True)
    return model.eval(), info


def assert_same_model(got, ref):
    """Every parameter and buffer of got equal to ref's, and the logits too."""
    a, b = got.state_dict(), ref.state_dict()
    assert set(a) == set(b)
    for k in b:
        assert torch.equal(a[k], b[k]), k
    ids = torch.arange(1, 9).reshape(1, 8)
    with torch.no_grad():
        assert torch.equal(got(input_ids=ids).logits, ref(input_ids=ids).logits)


def check_bytes(got, shards):
    """got ({name: tensor}) holds every tensor of shards, with torch.load's dtype, shape, bytes."""
    want = tensors_of(shards)
    assert set(got) == set(want)
    for n, (_, t) in want.items():
        assert got[n].dtype == t.dtype and got[n].shape == t.shape, n
        assert torch_bytes(got[n]) == torch_bytes(t), f"bytes of {n} differ"


# --- the mount -------------------------------------------------------------------------------

def index_metadata(d):
    """The metadata a mount of d reports: its index file's (as strings), else none (a .bin has
    no metadata of its own)."""
    if not (d / INDEX).exists():
        return {}
    return {k: str(v) for k, v in json.loads((d / INDEX).read_text())["metadata"].items()}


def check_mount(mnt, shards, fmt, metadata):
    """index.json, every tensor file's bytes, size and xattrs against torch.load of each shard;
    an alias is marked (user.ckptfs.alias_of) and owns no blocks."""
    want, owner = tensors_of(shards), aliases_of(shards)
    index = read_index(mnt)
    assert index["format"] == fmt
    assert index["metadata"] == metadata
    got = {e["name"]: e for e in index["tensors"]}
    assert len(got) == len(index["tensors"]) and set(got) == set(want)
    for name, (_, t) in want.items():
        e = got[name]
        assert (e["dtype"], e["shape"], e["nbytes"]) == (DTYPE_NAMES[t.dtype], list(t.shape),
                                                         nbytes(t)), e
        p = mnt / e["path"]
        assert p.read_bytes() == torch_bytes(t), f"bytes of {name} differ"
        st = os.stat(p)
        assert st.st_size == nbytes(t)
        assert os.getxattr(p, "user.ckptfs.name") == name.encode()
        assert os.getxattr(p, "user.ckptfs.dtype") == DTYPE_NAMES[t.dtype].encode()
        assert json.loads(os.getxattr(p, "user.ckptfs.shape")) == list(t.shape)
        if name in owner:
            assert os.getxattr(p, "user.ckptfs.alias_of") == owner[name].encode()
        else:
            assert "user.ckptfs.alias_of" not in os.listxattr(p), name
        assert (st.st_blocks == 0) == (name in owner), name
    return index


def layouts(saved, name):
    """(directory, the format its mount reports) of each layout of model name."""
    _, sharded, single = saved[name]
    return [(sharded, "pytorch-sharded"), (single, "pytorch-zip")]


@pytest.mark.parametrize("name", MODELS)
def test_mounts_every_shard_byte_exact(saved, mount, name):
    for d, fmt in layouts(saved, name):
        with mount(d) as mnt:
            check_mount(mnt, shards_of(d), fmt, index_metadata(d))
    _, d, _ = saved[name]
    assert index_metadata(d)["total_size"]  # transformers wrote it
    with mount(d / INDEX) as mnt:  # the index file named: its shards beside it, by content
        check_mount(mnt, shards_of(d), "pytorch-sharded", index_metadata(d))


def test_shards_without_their_index_and_in_the_legacy_format(saved, tmp_path, mount):
    """The same shards without pytorch_model.bin.index.json (every *.bin, as vLLM takes them),
    and with one shard in torch's legacy (pre-zip) format: a PyTorch file too."""
    _, src, _ = saved["qwen2-tied"]
    d = tmp_path / "noindex"
    shutil.copytree(src, d)
    shards = shards_of(d)
    (d / INDEX).unlink()
    with mount(d) as mnt:
        check_mount(mnt, shards, "pytorch-sharded", {})
    d = tmp_path / "legacy"
    shutil.copytree(src, d)
    legacy = shard_names(d)[1]
    torch.save(torch_load(d / legacy), d / legacy, _use_new_zipfile_serialization=False)
    shards = shards_of(d)
    with mount(d) as mnt:
        check_mount(mnt, shards, "pytorch-sharded", index_metadata(d))
    check_bytes(ckload.load(d, device="cpu"), shards)


def test_a_hub_cache_snapshot_of_symlinks(saved, tmp_path, mount):
    """huggingface_hub's cache: snapshots/REV/ holds symlinks to blobs/SHA256 (names that say
    nothing of a format); the shards are read through them."""
    _, src, _ = saved["qwen2-tied"]
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / ("c" * 40)
    blobs.mkdir()
    snap.mkdir(parents=True)
    for f in src.iterdir():
        blob = blobs / netlab.sha256(f.read_bytes())
        shutil.copy(f, blob)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    shards = shards_of(src)
    with mount(snap) as mnt:
        check_mount(mnt, shards, "pytorch-sharded", index_metadata(src))
    check_bytes(ckload.load(snap, device="cpu"), shards)
    ref, _ = pretrained(src, "qwen2-tied")
    model = build("qwen2-tied", seed=1)
    assert ckload.load_into(model, snap) == ([], [])
    assert_same_model(model, ref)


@pytest.mark.parametrize("name", MODELS)
def test_transformers_loads_the_mounts_virtual_safetensors(saved, mount, tmp_path, name):
    """from_pretrained of the mount's .ckptfs/checkpoint.safetensors (beside the config) is
    from_pretrained of the sharded directory itself: every parameter, the logits, no key missing
    or unexpected, ties tied."""
    _, d, _ = saved[name]
    ref, _ = pretrained(d, name)
    with mount(d) as mnt:
        hf = tmp_path / "hf"
        hf.mkdir()
        shutil.copy(d / "config.json", hf)
        os.symlink(mnt / ".ckptfs" / "checkpoint.safetensors", hf / "model.safetensors")
        model, info = pretrained(hf, name)
        assert not info["missing_keys"] and not info["unexpected_keys"], info
        assert_same_model(model, ref)
        if model.config.tie_word_embeddings:
            assert model.get_output_embeddings().weight.data_ptr() == \
                model.get_input_embeddings().weight.data_ptr()


# --- ckpt --------------------------------------------------------------------------------------

def ls_table(loc):
    """{name: (dtype, shape, size, offset, file or None, alias of or None)} of `ckpt ls loc`."""
    p = ckpt("ls", loc)
    assert p.returncode == 0, p.stderr
    out = {}
    for line in p.stdout.decode().splitlines():
        f = line.split("\t")
        rest = f[5:]
        alias = [x[len("alias of "):] for x in rest if x.startswith("alias of ")]
        files = [x for x in rest if not x.startswith("alias of ")]
        assert len(alias) <= 1 and len(files) <= 1, line
        out[f[0]] = (f[1], f[2], int(f[3]), f[4], files[0] if files else None,
                     alias[0] if alias else None)
    return out


@pytest.mark.parametrize("name", MODELS)
def test_ckpt_ls_the_directory_and_its_index(saved, name):
    """`ckpt ls DIR` and `ckpt ls DIR/pytorch_model.bin.index.json` list the same: each tensor
    in the shard torch.load found it in, its bytes at the offset said, aliases as ties are;
    --json says pytorch-sharded."""
    _, d, _ = saved[name]
    shards = shards_of(d)
    want, owner = tensors_of(shards), aliases_of(shards)
    table = ls_table(d)
    assert ls_table(d / INDEX) == table
    assert set(table) == set(want)
    for n, (dtype, shape, size, offset, file, alias) in table.items():
        shard, t = want[n]
        assert (dtype, json.loads(shape), size) == (DTYPE_NAMES[t.dtype], list(t.shape), nbytes(t))
        assert file == str(d / shard), (n, file)
        assert alias == owner.get(n), n
        if offset != "-":  # torch.save stores its records uncompressed: the bytes lie there
            with open(d / shard, "rb") as f:
                f.seek(int(offset))
                assert f.read(size) == torch_bytes(t), n
    for loc in (d, d / INDEX):
        listed = json.loads(ckpt("ls", "--json", loc).stdout)
        assert listed["format"] == "pytorch-sharded"
        assert {e["name"]: e["file"] for e in listed["tensors"]} == \
            {n: str(d / s) for n, (s, _) in want.items()}
        assert {e["name"]: e["alias_of"] for e in listed["tensors"] if "alias_of" in e} == owner


@pytest.mark.parametrize("name", MODELS)
def test_ckpt_info_counts_as_transformers(saved, name):
    """`ckpt info DIR`: every shard file, each storage's parameters once (transformers'
    num_parameters()), the ties as aliases."""
    model, d, _ = saved[name]
    shards = shards_of(d)
    p = ckpt("info", "--json", d)
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert info["format"] == "pytorch-sharded"
    assert sorted(info["files"]) == sorted(str(d / f) for f in shards)
    assert info["tensors"] == len(tensors_of(shards))
    assert info["aliases"] == len(aliases_of(shards))
    assert info["parameters"] == model.num_parameters()
    assert info["bytes"] == unique_bytes(shards)


@pytest.mark.parametrize("name", MODELS)
def test_ckpt_cat_every_tensor(saved, name):
    for d, _ in layouts(saved, name):
        for n, (_, t) in tensors_of(shards_of(d)).items():
            p = ckpt("cat", d, n)
            assert p.returncode == 0, p.stderr
            assert p.stdout == torch_bytes(t), (d, n)
    _, d, _ = saved[name]
    n, (_, t) = next(iter(tensors_of(shards_of(d)).items()))
    assert ckpt("cat", d / INDEX, n).stdout == torch_bytes(t)


def check_converted(path, shards):
    """A safetensors file (or shard directory) `ckpt convert` wrote, as the safetensors library
    reads it: every name of each tie group once, the others recorded in __metadata__ as aliases
    of the one kept, every byte torch.load's."""
    tensors, meta = library_view(path)
    want = tensors_of(shards)
    groups = {}
    for n, (f, t) in want.items():
        groups.setdefault((f, t.data_ptr(), t.dtype, tuple(t.shape), t.stride()), []).append(n)
    for names in groups.values():
        kept = [n for n in names if n in tensors]
        assert len(kept) == 1, names
        for n in names:
            if n != kept[0]:
                assert meta.get(n) == kept[0], (n, meta)
    assert set(tensors) <= set(want)
    for n, (dtype, shape, data) in tensors.items():
        t = want[n][1]
        assert (dtype, shape, data) == (DTYPE_NAMES[t.dtype], list(t.shape), torch_bytes(t)), n


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("how", ["one-file", "shards"])
def test_ckpt_convert_to_safetensors(saved, tmp_path, name, how):
    """The conversion, read back by the safetensors library, holds torch.load's bytes; beside the
    config, transformers loads it as it loads the .bin shards."""
    _, d, _ = saved[name]
    out = tmp_path / "hf"
    if how == "one-file":
        out.mkdir()
        p = ckpt("convert", d, out / "model.safetensors")
    else:
        p = ckpt("convert", d, out, "--max-shard-size", SHARD_SIZE)
    assert p.returncode == 0, p.stderr
    shards = shards_of(d)
    check_converted(out if how == "shards" else out / "model.safetensors", shards)
    if how == "one-file":  # what a conversion drops is a recorded alias: the same checkpoint
        p = ckpt("diff", d, out / "model.safetensors")
        assert p.returncode == 0, p.stdout.decode() + p.stderr.decode()
    shutil.copy(d / "config.json", out)
    model, info = pretrained(out, name)
    ref, ref_info = pretrained(d, name)
    assert sorted(info["missing_keys"]) == sorted(ref_info["missing_keys"])
    assert not info["unexpected_keys"], info
    assert_same_model(model, ref)


@pytest.mark.parametrize("name", MODELS)
def test_ckpt_pack_then_load_the_pack(saved, tmp_path, name):
    for d, _ in layouts(saved, name):
        out = tmp_path / (d.name + ".pack")
        p = ckpt("pack", d, out)
        assert p.returncode == 0, p.stderr
        assert ckpt("verify", out).returncode == 0
        check_bytes(ckload.load(out, device="cpu"), shards_of(d))


@pytest.mark.parametrize("name", MODELS)
def test_ckpt_load(saved, name):
    """`ckpt load` reads every tensor once per storage, and the shards are unchanged after."""
    for d, _ in layouts(saved, name):
        shards = shards_of(d)
        for loc in [d] + ([d / INDEX] if (d / INDEX).exists() else []):
            p = ckpt("load", loc, "--device", "cpu", "--verify")
            assert p.returncode == 0, p.stderr
            out = p.stdout.decode()
            assert out.startswith(f"{loc}: {len(tensors_of(shards))} tensors, "
                                  f"{unique_bytes(shards)} bytes into cpu "), out
            assert "sources unchanged" in out, out


# --- ckload ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
def test_ckload_load_entries_stream(saved, name):
    for d, _ in layouts(saved, name):
        shards = shards_of(d)
        want = tensors_of(shards)
        check_bytes(ckload.load(d, device="cpu"), shards)
        if (d / INDEX).exists():
            check_bytes(ckload.load(d / INDEX, device="cpu"), shards)
        entries = ckload.entries(d, device="cpu")
        assert {e.name: (e.dtype, list(e.shape), e.nbytes) for e in entries} == \
            {n: (DTYPE_NAMES[t.dtype], list(t.shape), nbytes(t)) for n, (_, t) in want.items()}
        # a window smaller than most tensors: many loads, each checking the files are the same
        streamed = {}
        for n, t in ckload.stream(d, device="cpu", window=4096):
            assert n not in streamed
            streamed[n] = t.clone()
        check_bytes(streamed, shards)


@pytest.mark.parametrize("name", MODELS)
def test_ckload_load_into_is_from_pretrained(saved, name):
    """load_into a freshly built model (other seed: other values) from the directory leaves it
    as transformers' from_pretrained of that directory."""
    for d, _ in layouts(saved, name):
        ref, _ = pretrained(d, name)
        model = build(name, seed=1)
        assert not torch.equal(next(iter(model.state_dict().values())),
                               next(iter(ref.state_dict().values())))
        keys = ckload.load_into(model, d)
        assert keys == ([], []), keys
        assert_same_model(model, ref)


# --- refusals ------------------------------------------------------------------------------

def shard_names(d):
    return sorted(p.name for p in d.glob("pytorch_model-*.bin"))


def edit_index(d, edit):
    body = json.loads((d / INDEX).read_text())
    edit(body["weight_map"])
    (d / INDEX).write_text(json.dumps(body, indent=2))


def listed_but_missing(d):
    edit_index(d, lambda wm: wm.update({"model.no_such.weight": shard_names(d)[0]}))
    return ["'model.no_such.weight'"]


def not_listed(d):
    wm = json.loads((d / INDEX).read_text())["weight_map"]
    name = sorted(n for n, f in wm.items() if f == shard_names(d)[1])[0]
    edit_index(d, lambda m: m.pop(name))
    return [f"'{name}'"]


def in_two_shards(d, keep_index=True):
    """The first tensor of shard 1 saved into shard 2 as well (torch.save, as transformers)."""
    s = shard_names(d)
    one, two = torch_load(d / s[0]), torch_load(d / s[1])
    name = sorted(one)[0]
    two[name] = one[name].clone()
    torch.save(two, d / s[1])
    if not keep_index:
        (d / INDEX).unlink()
    return [f"'{name}'"]


def names_missing_file(d):
    missing = "pytorch_model-00099-of-00099.bin"
    edit_index(d, lambda wm: wm.update({sorted(wm)[-1]: missing}))
    return [missing]


def shard_is_npy(d):
    """A shard that is a NumPy file (ckptfs reads .npy, but it is no shard of a PyTorch set)."""
    s = shard_names(d)[1]
    with open(d / s, "wb") as f:
        np.save(f, np.arange(12, dtype=np.float32))
    return [s]


def shard_is_safetensors(d):
    """Shard 2 holds its tensors as safetensors, under its .bin name: opened by content, it is
    no PyTorch file, and a set is of one family."""
    s = shard_names(d)[1]
    tensors = torch_load(d / s)
    safetensors_torch.save_file({k: v.clone().contiguous() for k, v in tensors.items()},
                                str(d / s), metadata={"format": "pt"})
    return [s]


def mixes_safetensors(d):
    """Shard 2 converted to model-...safetensors (same tensors, weight_map updated), the rest
    .bin. Tried through the index file only: in the directory, the rule takes the one
    *.safetensors before it reaches pytorch_model.bin.index.json (as vLLM does)."""
    s = shard_names(d)[1]
    st = s[:-len(".bin")] + ".safetensors"
    tensors = torch_load(d / s)
    safetensors_torch.save_file({k: v.clone().contiguous() for k, v in tensors.items()},
                                str(d / st), metadata={"format": "pt"})
    (d / s).unlink()
    edit_index(d, lambda wm: wm.update({n: st for n, f in list(wm.items()) if f == s}))
    return [st]


REFUSED = {
    "weight_map_names_a_tensor_no_shard_holds": listed_but_missing,
    "a_shards_tensor_missing_from_weight_map": not_listed,
    "a_name_in_two_shards_with_index": in_two_shards,
    "a_name_in_two_shards_without_index": lambda d: in_two_shards(d, keep_index=False),
    "weight_map_names_a_file_that_does_not_exist": names_missing_file,
    "a_shard_that_is_a_numpy_file": shard_is_npy,
    "a_bin_shard_that_is_safetensors": shard_is_safetensors,
    "an_index_mixing_safetensors_and_bin_shards": mixes_safetensors,
}
INDEX_ONLY = {"an_index_mixing_safetensors_and_bin_shards"}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_in_one_line_everywhere(saved, tmp_path, mountpoint, case):
    """ckptfs (nothing mounted), ckpt ls and ckload.load each refuse in one line that names
    what is wrong: the tensor or the file (the rest of the wording is the core's); so for the
    directory and for its index file named."""
    _, src, _ = saved["qwen2-tied"]
    d = tmp_path / "bad"
    shutil.copytree(src, d)
    says = REFUSED[case](d)
    locs = [d / INDEX] if case in INDEX_ONLY else [d] + [d / INDEX] * (d / INDEX).exists()
    for loc in locs:
        for line in (assert_refused(loc, mountpoint, prefix=d),
                     ckpt_refusal(loc, prefix=d),
                     ckload_refusal(loc, prefix=d)):
            for s in says:
                assert s in line, (case, line)


def ckpt_refusal(loc, prefix):
    p = ckpt("ls", loc)
    err = p.stderr.decode()
    assert p.returncode == 1 and p.stdout == b"", (p.returncode, err)
    assert err.count("\n") == 1 and err.startswith(f"ckpt: {prefix}"), err
    return err


def ckload_refusal(loc, prefix):
    with pytest.raises(RuntimeError) as e:
        ckload.load(loc, device="cpu")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"ckload: {prefix}"), msg
    return msg


# --- the directory rule's order ---------------------------------------------------------------

def test_safetensors_win_over_bin_as_transformers_takes_them(saved, tmp_path, mount):
    """A directory holding both (each of another model): the mount, ckpt and ckload give the
    safetensors' tensors, which transformers' from_pretrained loads too (not the .bin's)."""
    for sharded in (False, True):
        d = tmp_path / f"both-{sharded}"
        kw = {"max_shard_size": SHARD_SIZE} if sharded else {}
        build("qwen2-tied", seed=1).save_pretrained(d, safe_serialization=True, **kw)
        build("qwen2-tied", seed=2).save_pretrained(d, safe_serialization=False, **kw)
        assert list(d.glob("*.safetensors")) and list(d.glob("*.bin"))
        tensors, meta = library_view(d)
        ref, _ = pretrained(d, "qwen2-tied")
        for n, (_, _, data) in tensors.items():
            assert torch_bytes(ref.state_dict()[n]) == data, n  # transformers took these
        fmt = "safetensors-sharded" if sharded else "safetensors"
        with mount(d) as mnt:
            index = read_index(mnt)
            assert index["format"] == fmt
            assert {e["name"] for e in index["tensors"]} == set(tensors)
            for e in index["tensors"]:
                assert (mnt / e["path"]).read_bytes() == tensors[e["name"]][2], e["name"]
        assert json.loads(ckpt("ls", "--json", d).stdout)["format"] == fmt
        got = ckload.load(d, device="cpu")
        assert {n: torch_bytes(t) for n, t in got.items()} == \
            {n: data for n, (_, _, data) in tensors.items()}


def test_training_files_beside_pytorch_model_bin_are_left_out(saved, tmp_path, mount):
    """training_args.bin and optimizer.bin (what vLLM's loader skips) are no part of the model."""
    _, _, src = saved["qwen2-tied"]
    d = tmp_path / "run"
    shutil.copytree(src, d)
    torch.save({"lr": torch.tensor(1e-3), "steps": 10}, d / "training_args.bin")
    torch.save({"state": {0: {"exp_avg": torch.ones(4)}}, "param_groups": []},
               d / "optimizer.bin")
    shards = shards_of(d)
    with mount(d) as mnt:
        check_mount(mnt, shards, "pytorch-zip", {})
    assert json.loads(ckpt("ls", "--json", d).stdout)["format"] == "pytorch-zip"
    check_bytes(ckload.load(d, device="cpu"), shards)


def test_a_directory_of_pt_files(saved, tmp_path, mount):
    """Only *.pt: one is that file (optimizer.pt, scheduler.pt, scaler.pt beside it left out);
    two holding disjoint tensors are a PyTorch shard set."""
    model, _, _ = saved["gpt2"]
    sd = model.state_dict()
    d = tmp_path / "one"
    d.mkdir()
    torch.save(sd, d / "model.pt")
    for extra in ("optimizer.pt", "scheduler.pt", "scaler.pt"):
        torch.save({"state": {}, "step": torch.tensor(3)}, d / extra)
    with mount(d) as mnt:
        check_mount(mnt, {"model.pt": torch_load(d / "model.pt")}, "pytorch-zip", {})
    d = tmp_path / "two"
    d.mkdir()
    names = sorted(sd)
    half = len(names) // 2
    torch.save({n: sd[n] for n in names[:half]}, d / "part-a.pt")
    # the second in torch's legacy format: one family with the zip one
    torch.save({n: sd[n] for n in names[half:]}, d / "part-b.pt",
               _use_new_zipfile_serialization=False)
    shards = {f: torch_load(d / f) for f in ("part-a.pt", "part-b.pt")}
    with mount(d) as mnt:
        check_mount(mnt, shards, "pytorch-sharded", {})
    check_bytes(ckload.load(d, device="cpu"), shards)


# --- hf:// and s3:// ---------------------------------------------------------------------------

def saved_bytes(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def repo_files(d):
    return {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}


def check_remote_mount(mnt, shards, fmt):
    index = read_index(mnt)
    assert index["format"] == fmt
    paths = {e["name"]: mnt / e["path"] for e in index["tensors"]}
    want = tensors_of(shards)
    assert set(paths) == set(want)
    got = netlab.read_many(paths.values())  # read by another process, as a user reads a mount
    assert {n: got[str(p)] for n, p in paths.items()} == \
        {n: ("ok", netlab.sha256(torch_bytes(t))) for n, (_, t) in want.items()}


@pytest.fixture(scope="module")
def hub(saved, tmp_path_factory):
    _, sharded, single = saved["qwen2-tied"]
    both = tmp_path_factory.mktemp("both")
    build("qwen2-tied", seed=1).save_pretrained(both, safe_serialization=True)
    build("qwen2-tied", seed=2).save_pretrained(both, safe_serialization=False)
    with netlab.HubServer(tmp_path_factory.mktemp("hubstore")) as h:
        h.add_repo("org/binshards", repo_files(sharded))
        h.add_repo("org/bin-with-training-files",
                   {**repo_files(single), "training_args.bin": saved_bytes({"lr": torch.ones(1)}),
                    "optimizer.bin": saved_bytes({"state": {0: {"exp_avg": torch.ones(4)}}})})
        h.add_repo("org/both", repo_files(both))
        h.local = {"org/binshards": sharded, "org/bin-with-training-files": single,
                   "org/both": both}
        yield h


@pytest.fixture
def hub_env(hub, monkeypatch, tmp_path):
    for var in ("HF_TOKEN", "HF_TOKEN_PATH", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", hub.base)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    return hub


def test_hub_repo_of_bin_shards_mounts(hub_env, mount):
    """hf://ORG/REPO whose repo holds .bin shards and their index (and a config): the Hub
    listing's choice follows the directory rule; so with a training file beside
    pytorch_model.bin (left out), and with safetensors beside the .bin (taken)."""
    d = hub_env.local["org/binshards"]
    shards = shards_of(d)
    with mount("hf://org/binshards") as mnt:
        check_remote_mount(mnt, shards, "pytorch-sharded")
    listed = json.loads(ckpt("ls", "--json", "hf://org/binshards").stdout)
    assert listed["format"] == "pytorch-sharded"
    assert {e["name"] for e in listed["tensors"]} == set(tensors_of(shards))
    check_bytes(ckload.load("hf://org/binshards", device="cpu"), shards)
    with mount(f"hf://org/binshards/{INDEX}") as mnt:
        check_remote_mount(mnt, shards, "pytorch-sharded")
    single = hub_env.local["org/bin-with-training-files"]
    with mount("hf://org/bin-with-training-files") as mnt:
        check_remote_mount(mnt, shards_of(single), "pytorch-zip")
    tensors, _ = library_view(hub_env.local["org/both"])
    with mount("hf://org/both") as mnt:
        assert read_index(mnt)["format"] == "safetensors"
        paths = {e["name"]: mnt / e["path"] for e in read_index(mnt)["tensors"]}
        got = netlab.read_many(paths.values())
        assert {n: got[str(p)] for n, p in paths.items()} == \
            {n: ("ok", netlab.sha256(data)) for n, (_, _, data) in tensors.items()}


def test_an_index_url_opens_its_bin_shards_beside_it(saved, mount):
    """An http:// URL of pytorch_model.bin.index.json: a JSON object, so an index, whose shards
    are opened beside it by their content (their name once decided they were safetensors)."""
    _, d, _ = saved["qwen2-tied"]
    shards = shards_of(d)
    with netlab.FileServer(d) as srv:
        url = srv.url(INDEX)
        p = ckpt("ls", "--json", url)
        assert p.returncode == 0, p.stderr
        listed = json.loads(p.stdout)
        assert listed["format"] == "pytorch-sharded"
        assert {e["name"] for e in listed["tensors"]} == set(tensors_of(shards))
        with mount(url) as mnt:
            check_remote_mount(mnt, shards, "pytorch-sharded")
        check_bytes(ckload.load(url, device="cpu"), shards)


S3_BUCKET = "binshards"


@pytest.fixture
def s3_env(s3server, saved, monkeypatch):
    """The sharded Qwen2 directory under s3://binshards/qwen/ (a README beside it), and the
    environment of a client of the server."""
    _, d, _ = saved["qwen2-tied"]
    if not getattr(s3server, "binshards", False):
        s3server.create_bucket(S3_BUCKET)
        for name, data in repo_files(d).items():
            s3server.put(S3_BUCKET, f"qwen/{name}", data)
        s3server.put(S3_BUCKET, "qwen/README.md", b"a model\n")
        s3server.binshards = True
    env = {"AWS_ENDPOINT_URL": s3server.endpoint, "AWS_REGION": s3server.region,
           "AWS_ACCESS_KEY_ID": s3server.access_key,
           "AWS_SECRET_ACCESS_KEY": s3server.secret_key,
           "AWS_EC2_METADATA_DISABLED": "true"}  # never 169.254.169.254
    for k in ("AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE",
              "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return d


def test_s3_prefix_of_bin_shards(s3_env, mount):
    d = s3_env
    loc = f"s3://{S3_BUCKET}/qwen/"
    shards = shards_of(d)
    want = tensors_of(shards)
    p = ckpt("ls", "--json", loc)
    assert p.returncode == 0, p.stderr
    listed = json.loads(p.stdout)
    assert listed["format"] == "pytorch-sharded"
    assert {e["name"] for e in listed["tensors"]} == set(want)
    for n, (_, t) in list(want.items())[:3]:
        p = ckpt("cat", loc, n)
        assert p.returncode == 0 and p.stdout == torch_bytes(t), (n, p.stderr)
    with mount(loc) as mnt:
        check_remote_mount(mnt, shards, "pytorch-sharded")
    check_bytes(ckload.load(loc, device="cpu"), shards)
