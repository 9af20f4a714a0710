"""Bad sources and bad mountpoints: exit 1, exactly one stderr line "ckptfs: SOURCE: ...",
nothing mounted, and the mountpoint left as it was. Where the safetensors library is given the
same bytes, it must refuse them too (the file really is bad), except where noted."""
import json
import os
import random
from pathlib import Path

import pytest
import torch
import safetensors.torch
from safetensors import deserialize

from ckptfs_testlib import (assert_refused, ckpt_bin, ckptfs_bin, header_bytes, is_mounted,
                            raw_file, run, write_safetensors)


def valid_bytes(tmp):
    p = tmp / "valid_template.safetensors"
    safetensors.torch.save_file({"a": torch.arange(12, dtype=torch.float32),
                                 "b.c": torch.ones(3, 4, dtype=torch.int64)}, str(p))
    return p.read_bytes()


def hdr(obj):
    return header_bytes(obj)


def t(dtype, shape, a, b):
    return {"dtype": dtype, "shape": shape, "data_offsets": [a, b]}


# name -> (builder(tmp) -> source path, does the safetensors library refuse it too?)
def _random(tmp, brace):
    data = bytearray(random.Random(8).randbytes(4096))
    data[8] = ord("{") if brace else 0
    return raw_bytes(tmp, bytes(data))


def raw_bytes(tmp, data, name="bad.safetensors"):
    p = tmp / name
    p.write_bytes(data)
    return p


def _truncated(tmp, keep):
    v = valid_bytes(tmp)
    return raw_bytes(tmp, v[:keep] if keep >= 0 else v[:keep])


def _fifo(tmp):
    p = tmp / "fifo.safetensors"
    os.mkfifo(p)
    return p


def _dir(tmp, files):
    d = tmp / "shards"
    d.mkdir()
    for name, content in files.items():
        if content is None:
            os.mkfifo(d / name)
        elif content == "dir":
            (d / name).mkdir()
        else:
            (d / name).write_bytes(content)
    return d


F32x3 = b"\x00" * 12

CASES = {
    "abuse_corpus_file": (lambda tmp: Path("/work/shared/corpus/"
                                           "safetensors_cpp_abuse_attempt_1.safetensors"), True),
    "random_bytes": (lambda tmp: _random(tmp, False), True),
    "random_bytes_brace_at_8": (lambda tmp: _random(tmp, True), True),
    "empty_file": (lambda tmp: raw_bytes(tmp, b""), True),
    "seven_bytes": (lambda tmp: raw_bytes(tmp, b"\x02\x00\x00\x00\x00\x00\x00"), True),
    "missing_file": (lambda tmp: tmp / "does_not_exist.safetensors", None),
    "dev_null": (lambda tmp: Path("/dev/null"), True),
    "fifo": (_fifo, None),
    "truncated_data": (lambda tmp: _truncated(tmp, -10), True),
    "truncated_in_header": (lambda tmp: _truncated(tmp, 40), True),
    "truncated_to_length_field": (lambda tmp: _truncated(tmp, 8), True),
    "header_length_past_eof": (lambda tmp: raw_file(tmp / "h.safetensors", hdr({}), b"",
                                                    hlen=1000), True),
    "header_length_2_63": (lambda tmp: raw_file(tmp / "h.safetensors", hdr({}), b"",
                                                hlen=1 << 63), True),
    "header_length_over_100MB": (lambda tmp: raw_file(tmp / "h.safetensors", hdr({}), b"",
                                                      hlen=100_000_001), True),
    "data_offsets_past_eof": (lambda tmp: raw_file(tmp / "d.safetensors", hdr(
        {"a": t("F32", [25], 0, 100)}), b"\x00" * 40), True),
    "trailing_bytes": (lambda tmp: raw_bytes(tmp, valid_bytes(tmp) + b"junk"), True),
    "hole": (lambda tmp: raw_file(tmp / "d.safetensors", hdr(
        {"a": t("F32", [1], 0, 4), "b": t("F32", [1], 8, 12)}), b"\x00" * 12), True),
    "hole_at_start": (lambda tmp: raw_file(tmp / "d.safetensors", hdr(
        {"a": t("F32", [1], 4, 8)}), b"\x00" * 8), True),
    "overlap": (lambda tmp: raw_file(tmp / "d.safetensors", hdr(
        {"a": t("F32", [2], 0, 8), "b": t("F32", [2], 4, 12)}), b"\x00" * 12), True),
    "invalid_json": (lambda tmp: raw_file(tmp / "j.safetensors", b'{"a": {"dtype": "F32",   ',
                                          F32x3), True),
    "not_utf8": (lambda tmp: raw_file(tmp / "j.safetensors", b'{"\xff\xfe": ' + json.dumps(
        t("F32", [3], 0, 12)).encode() + b"}", F32x3), True),
    "json_then_junk": (lambda tmp: raw_file(tmp / "j.safetensors", hdr(
        {"a": t("F32", [3], 0, 12)}) + b"xy", F32x3), True),
    "float_offset": (lambda tmp: raw_file(tmp / "j.safetensors",
                                          b'{"a":{"dtype":"F32","shape":[3],'
                                          b'"data_offsets":[0,12.0]}}', F32x3), True),
    "negative_dim": (lambda tmp: raw_file(tmp / "j.safetensors", hdr(
        {"a": t("F32", [-3], 0, 12)}), F32x3), True),
    "unknown_dtype": (lambda tmp: raw_file(tmp / "j.safetensors", hdr(
        {"a": t("F128", [1], 0, 12)}), F32x3), True),
    "dtype_not_string": (lambda tmp: raw_file(tmp / "j.safetensors", hdr(
        {"a": {"dtype": 7, "shape": [3], "data_offsets": [0, 12]}}), F32x3), True),
    "missing_shape": (lambda tmp: raw_file(tmp / "j.safetensors", hdr(
        {"a": {"dtype": "F32", "data_offsets": [0, 12]}}), F32x3), True),
    "size_mismatch": (lambda tmp: raw_file(tmp / "j.safetensors", hdr(
        {"a": t("F32", [2], 0, 12)}), F32x3), True),
    "shape_overflow": (lambda tmp: raw_file(tmp / "j.safetensors", hdr(
        {"a": t("F32", [1 << 40, 1 << 40, 1 << 40], 0, 12)}), F32x3), True),
    "f4_not_whole_bytes": (lambda tmp: raw_file(tmp / "j.safetensors", hdr(
        {"a": t("F4", [3], 0, 2)}), b"\x00\x00"), True),
    "duplicate_name": (lambda tmp: raw_file(tmp / "j.safetensors",
                                            b'{"a":{"dtype":"U8","shape":[1],"data_offsets":'
                                            b'[0,1]},"a":{"dtype":"U8","shape":[1],'
                                            b'"data_offsets":[1,2]}}', b"\x01\x02"), None),
    # The library accepts a NUL inside a name; ckptfs refuses it (a path could not hold it).
    "nul_in_name": (lambda tmp: raw_file(tmp / "j.safetensors", hdr(
        {"a\u0000b": t("U8", [1], 0, 1)}), b"\x01"), False),
    "rank_65": (lambda tmp: raw_file(tmp / "j.safetensors", hdr(
        {"a": t("U8", [1] * 65, 0, 1)}), b"\x01"), None),
    "metadata_value_not_string": (lambda tmp: raw_file(tmp / "j.safetensors", hdr(
        {"__metadata__": {"k": 1}, "a": t("U8", [1], 0, 1)}), b"\x01"), True),
    "metadata_not_object": (lambda tmp: raw_file(tmp / "j.safetensors", hdr(
        {"__metadata__": "x", "a": t("U8", [1], 0, 1)}), b"\x01"), True),
    "header_not_object": (lambda tmp: raw_file(tmp / "j.safetensors", b'["a"]     ', b""), True),
    "empty_dir": (lambda tmp: _dir(tmp, {}), None),
    "dir_without_shards": (lambda tmp: _dir(tmp, {"README.md": b"hi", "config.json": b"{}",
                                                  "pytorch_model.bin": b"\x00" * 64}), None),
    "dir_with_bad_shard": (lambda tmp: _dir(tmp, {
        "a.safetensors": write_safetensors(tmp / "ok", [("x", "U8", [1], b"\x01")]).read_bytes(),
        "b.safetensors": b"\x00" * 40}), None),
    "dir_with_fifo_shard": (lambda tmp: _dir(tmp, {"a.safetensors": None}), None),
    "dir_with_directory_shard": (lambda tmp: _dir(tmp, {"a.safetensors": "dir"}), None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_source_refused(tmp_path, mountpoint, case):
    builder, library_refuses = CASES[case]
    src = builder(tmp_path)
    line = assert_refused(src, mountpoint)
    assert line.startswith(f"ckptfs: {src}: ") or line.startswith(f"ckptfs: {src}/"), line
    assert len(line) > len(f"ckptfs: {src}: ") + 3, line
    assert os.listdir(mountpoint) == []  # the mountpoint is untouched
    if library_refuses is not None and src.is_file():
        data = src.read_bytes()
        if library_refuses:
            with pytest.raises(Exception):
                deserialize(data)
        else:
            deserialize(data)
    # The checkpoint tool refuses it the same way.
    p = run([ckpt_bin(), "ls", src], timeout=20)
    err = p.stderr.decode("utf-8", errors="replace")
    assert p.returncode == 1, err
    assert err.count("\n") == 1 and err.startswith(f"ckpt: {src}"), err
    assert p.stdout == b""


def test_fifo_does_not_hang(tmp_path, mountpoint):
    """Without a writer, opening a FIFO for reading would block forever unless done right."""
    src = _fifo(tmp_path)
    assert_refused(src, mountpoint)  # run() fails the test after 20 s if ckptfs blocks


def test_error_lines_name_what_is_wrong(tmp_path, mountpoint):
    """Spot checks that the one line is about the actual fault, not a generic message."""
    src = CASES["empty_file"][0](tmp_path)
    assert "empty" in assert_refused(src, mountpoint)
    src = CASES["missing_file"][0](tmp_path)
    assert os.strerror(2) in assert_refused(src, mountpoint)
    src = raw_file(tmp_path / "dt.safetensors", hdr({"zz": t("F128", [1], 0, 4)}), b"\0" * 4)
    line = assert_refused(src, mountpoint)
    assert "zz" in line and "F128" in line


def test_control_characters_in_names_stay_on_one_line(tmp_path, mountpoint):
    src = raw_file(tmp_path / "ctl.safetensors", hdr(
        {"evil\nname\r\x1b[31m": t("F128", [1], 0, 4)}), b"\0" * 4)
    line = assert_refused(src, mountpoint)
    assert "\x1b" not in line and "\r" not in line


@pytest.mark.parametrize("kind", ["missing", "regular_file", "under_a_file"])
def test_bad_mountpoint(tmp_path, kind):
    src = write_safetensors(tmp_path / "ok.safetensors", [("x", "U8", [2], b"\x01\x02")])
    f = tmp_path / "plain_file"
    f.write_bytes(b"x")
    mnt = {"missing": tmp_path / "no_such_dir", "regular_file": f,
           "under_a_file": f / "sub"}[kind]
    assert_refused(src, mnt, prefix=mnt)
    assert not is_mounted(mnt)
    assert f.read_bytes() == b"x"


def test_no_arguments_prints_usage(tmp_path):
    """A usage error (exit 2, as ckpt's): the usage on stderr, nothing on stdout."""
    p = run([ckptfs_bin()])
    assert p.returncode == 2 and p.stdout == b"", p.stdout
    assert p.stderr.startswith(b"usage: ") and b"SOURCE MOUNTPOINT" in p.stderr, p.stderr


def test_missing_mountpoint(tmp_path):
    src = write_safetensors(tmp_path / "ok.safetensors", [("x", "U8", [2], b"\x01\x02")])
    p = run([ckptfs_bin(), src])
    assert p.returncode == 2
    err = p.stderr.decode()
    assert err.count("\n") == 1 and err.startswith("ckptfs: "), err


def test_unknown_option_mounts_nothing(tmp_path, mountpoint):
    src = write_safetensors(tmp_path / "ok.safetensors", [("x", "U8", [2], b"\x01\x02")])
    p = run([ckptfs_bin(), "-o", "no_such_option_xyz", src, mountpoint])
    assert p.returncode == 2
    assert p.stderr.decode() == "ckptfs: -o no_such_option_xyz: unknown option(s)\n"
    assert not is_mounted(mountpoint)


def run_leak_checked(cmd):
    """Runs cmd with a full leak check: under valgrind, or with LeakSanitizer where ckptfs is
    built with ASan (valgrind cannot run those). A leak makes it exit 99."""
    if b"__asan_init" in ckptfs_bin().read_bytes():
        env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:exitcode=99",
                   LSAN_OPTIONS="exitcode=99")
        return run(cmd, env=env)
    return run(["valgrind", "-q", "--leak-check=full", "--error-exitcode=99",
                "--errors-for-leak-kinds=definite,possible", *cmd], timeout=120)


def test_refused_after_parsing_frees_everything(tmp_path, mountpoint):
    """A source that parses but cannot be made a tree (keys 1 and "1" both name "1"): the
    parsed index is freed with the rest, and the one line is the whole of stderr."""
    src = tmp_path / "dup.pt"
    torch.save({1: torch.ones(2), "1": torch.zeros(3)}, src)
    p = run_leak_checked([ckptfs_bin(), src, mountpoint])
    err = p.stderr.decode("utf-8", errors="replace")
    assert p.returncode == 1, err
    assert err == f"ckptfs: {src}: tensors '1' and '1' map to one path\n", err
    assert not is_mounted(mountpoint)


@pytest.mark.parametrize("option, says", [
    ("timeout=-1", "-o timeout: not a number of seconds"),
    ("timeout=nan", "-o timeout: not a number of seconds"),
    ("timeout=1e400", "-o timeout: not a number of seconds"),
    ("readahead=-5", "-o readahead: not a number of KiB"),  # sscanf's %u read it as 2**32-5
    ("readahead=4294967295", "-o readahead: not a number of KiB"),
    ("uid=-1", "-o uid, gid: -1"),
    ("gid=4294967295", "-o uid, gid: -1"),
    ("cache_mem=0", "-o cache_mem=0: not a size"),
])
def test_an_option_out_of_bounds_is_refused(tmp_path, mountpoint, option, says):
    """A number libfuse would turn into an undefined timeout, a readahead of 4 TiB or an owner
    of -1 is refused in one line, as a usage error (2), and nothing is mounted."""
    src = tmp_path / "s.safetensors"
    safetensors.torch.save_file({"a": torch.ones(2)}, str(src))
    p = run([ckptfs_bin(), "-o", option, src, mountpoint], timeout=20)
    assert not is_mounted(mountpoint) and p.returncode == 2 and p.stdout == b"", p.stderr
    assert p.stderr.count(b"\n") == 1 and p.stderr.startswith(f"ckptfs: {says}".encode())
