"""Tensor names to paths: every tensor reachable at the path index.json gives, no path leaving
the mount, names recoverable from the xattr, and the escapes as views/tree.h specifies them.

The expected paths are computed here from the rules written in views/tree.h (an independent
implementation in Python; the over-long-name hash comes from the system libxxhash)."""
import json
import os
import re

import numpy as np
import pytest
import safetensors.numpy

from ckptfs_testlib import (VIRTUAL_FILES, check_mount, ckpt_bin, library_view, read_index, run,
                            write_safetensors, xxh3)

def escape_piece(piece, limit=255):
    """One '.'-free piece of a name (bytes) -> its path component, per views/tree.h; `limit` is
    254 for a file beside a directory of its name (room for the '%')."""
    if not piece:
        return b"%"
    units = []
    for ch in piece.decode("utf-8"):
        b = ch.encode("utf-8")
        if len(b) == 1 and (b in (b"%", b"/") or b[0] < 0x20 or b[0] == 0x7F):
            units.append(b"%%%02X" % b[0])
        else:
            units.append(b)
    full = b"".join(units)
    if len(full) <= limit:
        return full
    out = b""
    for u in units:
        if len(out) + len(u) > 236:
            break
        out += u
    return out + b"%%~%016x" % xxh3(piece)


def expected_paths(names):
    comps = {n: [escape_piece(p) for p in n.encode("utf-8").split(b".")] for n in names}
    dirs = {tuple(c[:i]) for c in comps.values() for i in range(1, len(c))}
    out = {}
    for n, c in comps.items():
        c = list(c)
        if tuple(c) in dirs:
            if len(c[-1]) == 255:
                c[-1] = escape_piece(n.encode("utf-8").split(b".")[-1], limit=254)
            c[-1] += b"%"
        out[n] = b"/".join(c).decode("utf-8")
    return out, {"/".join(x.decode("utf-8") for x in d) for d in dirs}


def unescape_path(path):
    """Inverse of the escapes for names without a hashed component."""
    pieces = []
    for comp in path.split("/"):
        if comp in ("%", "%%"):
            pieces.append(b"")
            continue
        if comp.endswith("%"):  # a lone trailing '%' marks a file renamed beside a directory
            comp = comp[:-1]
        b = comp.encode("utf-8")
        out, i = bytearray(), 0
        while i < len(b):
            if b[i:i + 1] == b"%":
                out.append(int(b[i + 1:i + 3], 16))
                i += 3
            else:
                out.append(b[i])
                i += 1
        pieces.append(bytes(out))
    return b".".join(pieces).decode("utf-8")


NASTY = [
    "../x", "..", ".", "a", "a.b", "a..b", ".a", "a.", "...", "%", "p%q", "50%.off",
    "x/y", "/abs", "dir/../etc/passwd", "ctl\x01\x02\x1f\x7f.end", "tab\there", "nl\nx",
    "ünï.cödé.日本語.🙂", "emoji🙂/slash", "sp ace.and,comma",
    "deep." + ".".join(f"l{i}" for i in range(60)),
    "long." + "é" * 150,                 # 300-byte piece of 2-byte characters
    "long.x" + "é" * 150,                # odd prefix: the cut must not split a character
    "long." + "x" * 300,
    "long." + "x" * 255,                 # exactly 255: kept as is
    "long." + "x" * 256,                 # one over: hashed
    "long." + "%" * 85,                  # 255 bytes once escaped
    "long." + "%" * 86,                  # 258 once escaped: cut keeps whole escapes
    "long." + "y" * 240 + "1",           # same first 236 bytes ...
    "long." + "y" * 240 + "2",           # ... different hash
    "h" + "z" * 300,                     # a hashed piece that is both a file ...
    "h" + "z" * 300 + ".child",          # ... and a directory
    "e" + "x" * 254,                     # a 255-byte piece that is a file ...
    "e" + "x" * 254 + ".kid",            # ... and a directory: hashed to make room for '%'
    "sib", "sib.", "sib..", "sib.%", "",
]


@pytest.fixture(scope="module")
def nasty_source(tmp_path_factory):
    rng = np.random.default_rng(7)
    arrays = {n: rng.integers(0, 1000, (i % 3 + 1,), dtype=np.int32)
              for i, n in enumerate(NASTY)}
    src = tmp_path_factory.mktemp("names") / "nasty.safetensors"
    safetensors.numpy.save_file(arrays, str(src))
    return src


def components(path):
    return path.split("/")


def test_every_name_reachable_and_contained(nasty_source, mount):
    lib, meta = library_view(nasty_source)
    assert set(lib) == set(NASTY)
    with mount(nasty_source) as m:
        index = check_mount(m, lib, meta, "safetensors")  # bytes + xattr name for every path
        real_root = os.path.realpath(m)
        for ent in index["tensors"]:
            path = ent["path"]
            assert not path.startswith("/")
            for c in components(path):
                assert c not in ("", ".", ".."), path
                assert not c.startswith("."), path
                assert len(c.encode("utf-8")) <= 255, path
            real = os.path.realpath(m / path)
            assert real.startswith(real_root + "/"), (ent["name"], path)
            assert os.getxattr(m / path, "user.ckptfs.name").decode("utf-8") == ent["name"]
        # Nothing is in the tree but the tensors and the mount's own files.
        files, dirs = set(), set()
        for root, ds, fs in os.walk(m):
            rel = os.path.relpath(root, m)
            for d in ds:
                dirs.add(os.path.normpath(os.path.join(rel, d)))
            for f in fs:
                files.add(os.path.normpath(os.path.join(rel, f)))
        assert files == {e["path"] for e in index["tensors"]} | VIRTUAL_FILES
        want_paths, want_dirs = expected_paths(NASTY)
        assert dirs == want_dirs | {".ckptfs"}


def test_paths_follow_the_escape_rules(nasty_source, mount):
    want, _ = expected_paths(NASTY)
    with mount(nasty_source) as m:
        got = {e["name"]: e["path"] for e in read_index(m)["tensors"]}
    assert got == want
    # Spot checks of the rules themselves (independent of the helper above).
    assert want["a"] == "a%" and want["a.b"] == "a/b"
    assert want["../x"] == "%/%/%2Fx"
    assert want["x/y"] == "x%2Fy" and want["p%q"] == "p%25q"
    assert want[".a"] == "%/a" and want["a..b"] == "a/%/b"
    assert want["long." + "x" * 255] == "long/" + "x" * 255
    hashed = want["long." + "x" * 256].split("/")[1]
    assert re.fullmatch("x{236}%~[0-9a-f]{16}", hashed)
    cut = want["long.x" + "é" * 150].split("/")[1]
    assert cut.startswith("x" + "é" * 117 + "%~")           # 235 bytes: no half character
    pct = want["long." + "%" * 86].split("/")[1]
    assert pct.startswith("%25" * 78 + "%~")                 # 234 bytes: whole escapes only
    assert want["long." + "y" * 240 + "1"] != want["long." + "y" * 240 + "2"]
    assert len(want["h" + "z" * 300].encode()) == 255 and want["h" + "z" * 300].endswith("%")
    assert re.fullmatch("ex{235}%~[0-9a-f]{16}%", want["e" + "x" * 254])
    assert want["e" + "x" * 254 + ".kid"] == "e" + "x" * 254 + "/kid"


def test_names_recoverable(nasty_source, mount):
    with mount(nasty_source) as m:
        for ent in read_index(m)["tensors"]:
            x = os.getxattr(m / ent["path"], "user.ckptfs.name")
            assert x == ent["name"].encode("utf-8")
            if "%~" not in ent["path"]:
                assert unescape_path(ent["path"]) == ent["name"], ent


def test_readdir_sorted_bytewise(nasty_source, mount):
    with mount(nasty_source) as m:
        for root, ds, fs in os.walk(os.fsencode(m)):
            listed = os.listdir(root)
            assert listed == sorted(listed), root
            assert len(listed) == len(set(listed))


def test_unescaped_forms_do_not_resolve(nasty_source, mount):
    with mount(nasty_source) as m:
        assert not (m / "x" / "y").exists()
        assert not (m / "x%2fy").exists()          # escapes are uppercase only
        assert (m / "x%2Fy").is_file()
        assert os.path.realpath(m / "%" / "%" / "%2Fx").startswith(os.path.realpath(m) + "/")


@pytest.mark.parametrize("order", [["a", "a.b"], ["a.b", "a"]])
def test_file_and_directory_of_one_name_any_order(tmp_path, mount, order):
    tensors = [("a", "U8", [3], b"\x01\x02\x03"), ("a.b", "U8", [2], b"\x04\x05")]
    src = write_safetensors(tmp_path / "ab.safetensors", tensors, order=order)
    with mount(src) as m:
        check_mount(m, {n: (d, s, b) for n, d, s, b in tensors}, {}, "safetensors")
        assert (m / "a%").read_bytes() == b"\x01\x02\x03"
        assert (m / "a" / "b").read_bytes() == b"\x04\x05"


def test_ckpt_ls_json_paths_match_the_mount(nasty_source, mount):
    p = run([ckpt_bin(), "ls", nasty_source, "--json"])
    assert p.returncode == 0, p.stderr
    listed = json.loads(p.stdout)
    with mount(nasty_source) as m:
        index = read_index(m)
    assert {t["name"]: t["path"] for t in listed["tensors"]} == \
        {t["name"]: t["path"] for t in index["tensors"]}
