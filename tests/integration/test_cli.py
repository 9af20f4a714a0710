"""The command line's conventions, the same for every `ckpt` command (tools/options.c):
`--opt value` and `--opt=value` alike, a unique prefix for the name, `--` ending the options, an
unknown option named with the nearest known one, a bad value naming the option and the value,
each command's --help listing its options, and exit status 2 for every usage error."""
import json
import os

import pytest
import torch
import safetensors.torch

from ckptfs_testlib import ckpt_bin, run, run_on_a_terminal

COMMANDS = ["ls", "cat", "pack", "convert", "verify", "load", "diff", "info", "stats"]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    g = torch.Generator().manual_seed(5)
    tensors = {"model.a.w": torch.randn(4, 3, generator=g), "model.b": torch.randn(2, generator=g),
               "-dash": torch.arange(3, dtype=torch.int32)}
    src = tmp_path_factory.mktemp("cli") / "m.safetensors"
    safetensors.torch.save_file(tensors, str(src))
    return src, tensors


def ckpt(*args):
    return run([ckpt_bin(), *map(str, args)], timeout=60)


def usage_error(p, *says):
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stdout == b""
    line = p.stderr.decode()
    assert line.count("\n") == 1 and line.startswith("ckpt: "), line
    for s in says:
        assert s in line, (s, line)
    return line


@pytest.mark.parametrize("args", [
    ("info", "--depth=1"), ("info", "--depth", "1"), ("info", "--dep=1"), ("info", "--dep", "1")])
def test_a_value_joined_or_apart_and_a_prefix_mean_the_same(source, args):
    src, _ = source
    want = ckpt("info", src, "--depth", "1")
    assert want.returncode == 0, want.stderr
    p = ckpt(*args, src)
    assert (p.returncode, p.stdout, p.stderr) == (0, want.stdout, b"")


def test_convert_to_pack_with_equals(source, tmp_path):
    src, _ = source
    p = ckpt("convert", "--to=pack", src, tmp_path / "o.pack")
    assert p.returncode == 0, p.stderr
    assert ckpt("verify", tmp_path / "o.pack").returncode == 0


def test_double_dash_ends_the_options(source):
    src, tensors = source
    p = ckpt("cat", src, "--", "-dash")
    assert p.returncode == 0, p.stderr
    assert p.stdout == tensors["-dash"].numpy().tobytes()
    usage_error(ckpt("cat", src, "-dash"), "unknown option '-dash'")


@pytest.mark.parametrize("cmd,typo,guess", [
    ("info", "--jsn", "--json"), ("ls", "--josn", "--json"), ("convert", "--tp", "--to"),
    ("load", "--treads", "--threads"), ("diff", "--onyl", "--only"),
    ("stats", "--jason", "--json"), ("pack", "--olny", "--only"), ("cat", "--nyp", "--npy")])
def test_an_unknown_option_is_named_with_the_nearest(source, cmd, typo, guess):
    src, _ = source
    line = usage_error(ckpt(cmd, typo, src), f"ckpt: {cmd}: unknown option '{typo}'")
    assert f"(did you mean {guess}?)" in line, line


@pytest.mark.parametrize("args,says", [
    (("load", "--threads", "abc", "SRC"), "--threads: 'abc' is not a count"),
    (("load", "--threads=0", "SRC"), "--threads: '0' is not a count"),
    (("load", "--device", "tpu", "SRC"), "--device: 'tpu' is not cpu, cuda, cuda:N or auto"),
    (("load", "--slice", "x", "SRC"), "--slice: 'x' is not GLOB:DIM"),
    (("load", "--world-size", "0", "SRC"), "--world-size: '0' is not a world size"),
    (("info", "--depth", "-1", "SRC"), "--depth: '-1' is not a depth"),
    (("info", "--depth=99", "SRC"), "--depth: '99' is not a depth"),
    (("info", "SRC", "--depth"), "option '--depth' needs a value"),
    (("convert", "--to", "onnx", "a", "b"), "--to: 'onnx' is not safetensors or pack"),
    (("convert", "--max-shard-size", "lots", "a", "b"), "--max-shard-size: 'lots' is not a size"),
    (("ls", "--json=yes", "SRC"), "option '--json' takes no value"),
    (("load", "--b", "1", "SRC"), "option '--b' is ambiguous: --buffers --buffer-size"),
])
def test_a_bad_value_names_the_option_and_the_value(source, args, says):
    src, _ = source
    usage_error(ckpt(*[src if a == "SRC" else a for a in args]), says)


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_command_lists_its_options_in_help(cmd):
    p = ckpt(cmd, "--help")
    assert p.returncode == 0 and p.stderr == b"", p.stderr
    text = p.stdout.decode()
    assert text.startswith(f"usage: ckpt {cmd}"), text
    usage = text.splitlines()[0]
    for opt in {w.strip("[]").split("=")[0] for w in usage.split() if w.startswith(("[--", "--"))}:
        assert f"\n  {opt}" in text, (opt, text)
    assert "-h, --help" in text
    assert ckpt(cmd, "-h").stdout == p.stdout


@pytest.mark.parametrize("args", [
    ("ls",), ("cat", "x"), ("pack", "x"), ("convert", "x"), ("verify",), ("load",), ("diff", "x"),
    ("info",), ("stats",), ("ls", "a", "b"), ("verify", "a", "b"), ("bogus",), ("--cacert",)])
def test_every_usage_error_exits_2(args):
    usage_error(ckpt(*args))


def test_cacert_with_equals(source):
    src, _ = source
    p = ckpt("--cacert=/nonexistent-ca.pem", "ls", src)  # unused: a local source
    assert p.returncode == 0, p.stderr


def test_only_with_a_trailing_dot_selects_the_names_it_begins(source, tmp_path):
    src, tensors = source
    p = ckpt("convert", src, tmp_path / "o.safetensors", "--only", "model.")
    assert p.returncode == 0, p.stderr
    got = safetensors.torch.load_file(str(tmp_path / "o.safetensors"))
    assert set(got) == {n for n in tensors if n.startswith("model.")}
    p = ckpt("ls", "--json", tmp_path / "o.safetensors")
    assert {t["name"] for t in json.loads(p.stdout)["tensors"]} == set(got)


@pytest.fixture(scope="module")
def pickle_source(tmp_path_factory):
    """A torch.save checkpoint with values beside its tensors, and what torch.load gives."""
    path = tmp_path_factory.mktemp("cli-pt") / "x.pt"
    obj = {"model": {"h": {"0": {"ln_1": {"weight": torch.arange(6.0)}}}}, "epoch": 7,
           "name": "run-1"}
    torch.save(obj, path)
    return path, torch.load(path)


def test_cat_serves_values_as_the_mount_does(pickle_source, mount):
    path, loaded = pickle_source
    with mount(path) as m:
        for name in ("epoch", "name"):
            p = ckpt("cat", path, name)
            assert p.returncode == 0, p.stderr
            assert p.stdout == (m / name).read_bytes()
            assert p.stdout.decode().rstrip("\n") == str(loaded[name])


def test_cat_takes_a_mount_path(pickle_source):
    path, loaded = pickle_source
    want = loaded["model"]["h"]["0"]["ln_1"]["weight"].numpy().tobytes()
    for name in ("model.h.0.ln_1.weight", "model/h/0/ln_1/weight", "/model/h/0/ln_1/weight"):
        p = ckpt("cat", path, name)
        assert p.returncode == 0 and p.stdout == want, (name, p.stderr)


@pytest.mark.parametrize("name,hint", [
    ("model.h.0.ln_1.wieght", "(did you mean 'model.h.0.ln_1.weight'?)"),
    ("model.h", "(under it: 'model.h.0.ln_1.weight')"),
    ("model/h/0/ln_1/weigh", "(did you mean"),
    ("nothing.like.it.at.all", None)])
def test_cat_suggests_the_nearest_names(pickle_source, name, hint):
    path, _ = pickle_source
    p = ckpt("cat", path, name)
    assert p.returncode == 1 and p.stdout == b""
    line = p.stderr.decode()
    assert line.count("\n") == 1 and f"no tensor or value named '{name}'" in line, line
    assert (hint in line) if hint else "(" not in line.split("named", 1)[1], line


def one_line_failure(p, *says):
    assert p.returncode == 1 and p.stdout == b"", (p.returncode, p.stderr)
    line = p.stderr.decode()
    assert line.count("\n") == 1 and line.startswith("ckpt: "), line
    for s in says:
        assert s in line, (s, line)


def test_convert_into_a_directory_writes_model_safetensors(source, tmp_path):
    src, tensors = source
    for out, name in ((tmp_path, "model.safetensors"), (str(tmp_path) + "/", "model.safetensors")):
        p = ckpt("convert", src, out)
        assert p.returncode == 0, p.stderr
        assert set(safetensors.torch.load_file(str(tmp_path / name))) == set(tensors)
    p = ckpt("pack", src, tmp_path)
    assert p.returncode == 0, p.stderr
    assert ckpt("verify", tmp_path / "model.pack").returncode == 0


def test_convert_says_which_directory_is_missing(source, tmp_path):
    src, _ = source
    one_line_failure(ckpt("convert", src, f"{tmp_path}/new/"), "no such directory", "mkdir -p")
    one_line_failure(ckpt("convert", src, tmp_path / "a" / "b" / "m.safetensors"),
                     f"{tmp_path / 'a'} does not exist", f"mkdir -p {tmp_path / 'a' / 'b'}")
    one_line_failure(ckpt("pack", src, tmp_path / "x" / "m.pack"), f"{tmp_path / 'x'} does not")
    assert os.listdir(tmp_path) == []


def test_shards_into_a_non_empty_directory_need_force(source, tmp_path):
    src, tensors = source
    out = tmp_path / "hf"
    out.mkdir()
    (out / "old.safetensors").write_bytes(b"old")
    args = ("convert", src, out, "--max-shard-size", "1KB")
    one_line_failure(ckpt(*args), "not empty", "--force")
    assert os.listdir(out) == ["old.safetensors"]
    p = ckpt(*args, "--force")
    assert p.returncode == 0, p.stderr
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(tensors) and "old.safetensors" not in os.listdir(out)
    assert os.listdir(tmp_path) == ["hf"]
    (out / "sub").mkdir()  # more than files: --force will not remove what it did not write
    one_line_failure(ckpt(*args, "--force"), "more than files")
    afile = tmp_path / "afile"
    afile.write_bytes(b"x")
    one_line_failure(ckpt("convert", src, afile, "--max-shard-size", "1KB"), "not a directory",
                     "--force")
    assert ckpt("convert", src, afile, "--max-shard-size", "1KB", "--force").returncode == 0
    assert (afile / "model.safetensors.index.json").exists()


def test_only_writes_the_selected_total_size(source, tmp_path):
    src, tensors = source
    p = ckpt("convert", src, tmp_path / "hf", "--max-shard-size", "1KB", "--only", "model.")
    assert p.returncode == 0, p.stderr
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    want = sum(t.numel() * t.element_size() for n, t in tensors.items() if n.startswith("model."))
    assert index["metadata"]["total_size"] == want


def on_a_terminal(*args):
    """ckpt's stdout and stderr both a terminal: (status, what it shows)."""
    rc, shown, _ = run_on_a_terminal([ckpt_bin(), *args], stderr_too=True)
    return rc, shown


def test_ls_for_people_and_for_scripts(source):
    """A terminal gets a header and sizes as 12 B; a pipe the bare table in bytes;
    --bytes keeps bytes on a terminal."""
    src, tensors = source
    rc, shown = on_a_terminal("ls", src)
    lines = shown.splitlines()
    assert rc == 0 and lines[0].split("\t") == ["NAME", "DTYPE", "SHAPE", "SIZE", "OFFSET"], shown
    rows = {l.split("\t")[0]: l.split("\t") for l in lines[1:]}
    assert set(rows) == set(tensors)
    assert rows["model.a.w"][3] == "48 B"
    piped = ckpt("ls", src).stdout.decode().splitlines()
    assert {l.split("\t")[0] for l in piped} == set(tensors)
    assert {l.split("\t")[0]: l.split("\t")[3] for l in piped}["model.a.w"] == "48"
    rc, shown = on_a_terminal("ls", "--bytes", src)
    assert {l.split("\t")[0]: l.split("\t")[3] for l in shown.splitlines()[1:]}["model.a.w"] == "48"


def test_a_written_output_is_said_on_a_terminal_or_with_v(source, tmp_path):
    src, _ = source
    out = tmp_path / "o.safetensors"
    rc, shown = on_a_terminal("convert", src, out)
    assert rc == 0 and f"ckpt: {out}: written, " in shown, shown
    p = ckpt("convert", src, out)
    assert p.returncode == 0 and p.stderr == b"" and p.stdout == b""
    for v in ("-v", "--verbose"):
        p = ckpt("pack", v, src, tmp_path / "o.pack")
        assert p.returncode == 0 and p.stdout == b"", p.stderr
        assert p.stderr.decode().startswith(f"ckpt: {tmp_path / 'o.pack'}: written, "), p.stderr


def test_info_cuts_long_metadata_unless_full(tmp_path):
    """A GGUF vocabulary (gguf-py writes it) is its count and first tokens; --full all of it,
    as gguf-py reads it back."""
    import gguf
    import numpy as np
    path = tmp_path / "v.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    tokens = [f"tok{i}" for i in range(5000)]
    w.add_token_list(tokens)
    w.add_string("general.description", "d" * 1000)
    w.add_tensor("w", np.ones(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    p = ckpt("info", path)
    assert p.returncode == 0, p.stderr
    text = p.stdout.decode()
    assert 'tokenizer.ggml.tokens: [5000 strings: "tok0", "tok1", "tok2", \u2026]' in text, text
    line = next(l for l in text.splitlines() if "general.description" in l)
    assert line.endswith("\u2026 (1002 bytes; --full shows all)") and len(line) < 220, line
    full = ckpt("info", "--full", path).stdout.decode()
    shown = next(l for l in full.splitlines() if "tokenizer.ggml.tokens" in l)
    assert json.loads(shown.split(": ", 1)[1]) == tokens
    assert len(text) < 4000 < len(full)


def test_info_shows_metadata_exactly(tmp_path):
    """A UINT64 above 2^53 (gguf-py writes it) is its exact decimal in `ckpt info` and --json,
    as index.json has it: not a double's 1.8446744073709552e+19."""
    import gguf
    import numpy as np
    path = tmp_path / "u.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint64("test.big", 2**64 - 1)
    w.add_key_value("test.bigs", [2**53 + 1] * 5, gguf.GGUFValueType.ARRAY,
                    gguf.GGUFValueType.UINT64)
    w.add_tensor("w", np.ones(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    text = ckpt("info", path).stdout.decode().splitlines()
    assert f"  test.big: {2**64 - 1}" in text, text
    assert f"  test.bigs: [5 numbers: {2**53 + 1}, {2**53 + 1}, {2**53 + 1}, \u2026]" in text, text
    meta = json.loads(ckpt("info", path, "--json").stdout)["metadata"]
    assert meta["test.big"] == {"type": "UINT64", "value": 2**64 - 1}
    assert meta["test.bigs"]["value"] == [2**53 + 1] * 5


def test_stats_columns_line_up_on_a_terminal(source):
    src, tensors = source
    rc, shown = on_a_terminal("stats", src)
    assert rc == 0, shown
    lines = shown.splitlines()
    header = lines[0]
    rows = [l for l in lines[1:] if l.split() and l.split()[0] in tensors]
    assert len(rows) == len(tensors)
    for col in ("dtype", "count", "zero"):
        at = header.index(col)
        ends = {len(r[:at + len(col) + 1].rstrip()) for r in rows} if col != "dtype" else None
        if col == "dtype":
            assert all(r[at - 1] == " " and r[at] != " " for r in rows), (header, rows)
        else:  # numbers right-aligned under their header's last letter
            assert ends == {at + len(col)}, (col, header, rows)
