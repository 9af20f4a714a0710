"""Hostile inputs, generated here: every one is refused by `ckptfs SOURCE MNT`, `ckpt ls SOURCE`
and `ckpt pack SOURCE OUT` alike, each run bounded in time (a subprocess timeout) and memory
(RLIMIT_AS of 1 GiB): exit 1, exactly one line on stderr, nothing on stdout, no mount left in
/proc/self/mountinfo, and no file created anywhere (the source's folder, the output folder and
the working directory stay as they were). Pickles that would run code aim it at a marker file,
which must never appear.

test_errors.py and test_torch.py already hold the first hostile safetensors and zip cases (bad
header lengths, one invalid JSON, overlaps, negative dims, unknown dtypes, os.system in a zip,
compressed archives, truncations); this file holds the rest.
Where a benign twin of a hand-built input is needed to show the builder is right, torch.load
reads it (test_builders_make_valid_checkpoints)."""
import io
import json
import os
import pickle
import random
import resource
import shutil
import struct
import tempfile
import zipfile
import zlib
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

from ckptfs_testlib import (check_torch_mount, ckpt_bin, ckptfs_bin, header_bytes, raw_file,
                            read_index, run, write_safetensors)

MEMORY_LIMIT = 1 << 30
TIMEOUT = 30  # seconds; a hang fails the test through run()


# --- running the three commands under limits -------------------------------------------------

def mountinfo_points():
    points = set()
    with open("/proc/self/mountinfo") as f:
        for line in f:
            points.add(line.split()[4].encode().decode("unicode_escape"))
    return points


def _sanitized():
    """ASan reserves terabytes of address space for its shadow memory, so an RLIMIT_AS cannot
    apply to a `make test SANITIZE=address` build; ASan bounds allocations itself."""
    with open(ckptfs_bin(), "rb") as f:
        return b"__asan_init" in f.read()


def limited(uid=None):
    asan = _sanitized()

    def preexec():
        if not asan:
            resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if uid is not None:  # drop root, whose reads ignore file modes
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
    return preexec


def snapshot(*dirs):
    """Every path (and its size) under dirs: a created, removed or grown file shows."""
    out = {}
    for d in dirs:
        for root, subdirs, files in os.walk(d):
            for n in subdirs + files:
                p = os.path.join(root, n)
                try:
                    out[p] = os.lstat(p).st_size if n in files else -1
                except OSError:
                    pass
    return out


def one_line(p, prefix):
    err = p.stderr.decode("utf-8", errors="replace")
    assert p.returncode == 1, f"exit {p.returncode}: {err!r}"
    assert p.stdout == b"", p.stdout[:200]
    assert err.endswith("\n") and err.count("\n") == 1, f"not exactly one line: {err!r}"
    assert err.startswith(prefix), f"{err!r} does not start with {prefix!r}"
    return err.rstrip("\n")


def assert_refused_everywhere(src, base, uid=None, bins=None):
    """ckptfs, ckpt ls and ckpt pack on src: each refuses, one line, nothing left behind.
    Returns the three lines. bins: (ckptfs, ckpt) where the built ones are not reachable."""
    src = Path(src)
    ckptfs, ckpt = bins or (ckptfs_bin(), ckpt_bin())
    mnt = Path(tempfile.mkdtemp(prefix="mnt-", dir=base))
    out = Path(tempfile.mkdtemp(prefix="out-", dir=base))
    cwd = Path(tempfile.mkdtemp(prefix="cwd-", dir=base))
    for d in (mnt, out, cwd):
        os.chmod(d, 0o777)
    # A device's directory (/dev) is the system's, changed by others at any time: not watched.
    ours = src.is_file() or src.is_dir()
    watched = [base] + ([src.parent] if src.parent != base and ours else [])
    before = snapshot(*watched)
    lines = []
    try:
        for cmd, prefix in (([ckptfs, src, mnt], "ckptfs: "),
                            ([ckpt, "ls", src], "ckpt: "),
                            ([ckpt, "pack", src, out / "out.pack"], "ckpt: ")):
            p = run(cmd, timeout=TIMEOUT, cwd=cwd, preexec_fn=limited(uid))
            mounted = str(mnt) in mountinfo_points()
            if mounted:
                run(["fusermount3", "-uz", mnt])
            assert not mounted, f"{cmd[0].name} left {mnt} mounted"
            lines.append(one_line(p, prefix))
            assert str(src) in lines[-1], lines[-1]
        assert snapshot(*watched) == before, "a file appeared, vanished or changed"
        assert not (base / "pwned").exists() and not Path("/tmp/ckptfs-pwned").exists()
    finally:
        for d in (mnt, out, cwd):
            shutil.rmtree(d, ignore_errors=True)
    return lines


# --- NumPy: .npy headers and .npz archives, by hand --------------------------------------------

def npy_bytes(header_text=None, data=None, version=1, hlen=None):
    """An .npy file: magic, version, header length (hlen: a lie), header text, data. The
    defaults are a valid <f4 (2, 3) array, so each case changes one thing."""
    if header_text is None:
        header_text = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
    text = header_text.encode()
    pre = 10 if version == 1 else 12
    text += b" " * (-(pre + len(text) + 1) % 64) + b"\n"
    size = struct.pack("<H" if version == 1 else "<I", len(text) if hlen is None else hlen)
    data = struct.pack("<6f", *range(6)) if data is None else data
    return b"\x93NUMPY" + bytes([version, 0]) + size + text + data


def zip_of(members):
    """A zip of members [{name, raw (the bytes stored), method, size, crc, at}], every field
    but name and raw defaulting to the honest value; `at` points the central directory at
    another member's local header (an overlap)."""
    out, central, offsets = bytearray(), bytearray(), []
    for m in members:
        name, raw = m["name"].encode(), m["raw"]
        method, size = m.get("method", 0), m.get("size", len(raw))
        crc = m.get("crc", zlib.crc32(m.get("plain", raw)))
        offsets.append(len(out))
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0, crc, len(raw),
                           size, len(name), 0) + name + raw
        at = offsets[m["at"]] if "at" in m else offsets[-1]
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0, crc,
                               len(raw), size, len(name), 0, 0, 0, 0, 0, at) + name
    cd_at = len(out)
    out += central + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members),
                                 len(central), cd_at, 0)
    return bytes(out)


def deflate(data):
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


def deflated_member(name, plain, **kw):
    return dict(name=name, raw=deflate(plain), method=8, size=len(plain), plain=plain, **kw)


BIG_NPY = npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (1000000,), }",
                    struct.pack("<1000000i", *range(1000000)))
BIG_DEFLATED = deflate(BIG_NPY)


def numpy_file(data, name):
    """A case: writes data to tmp/name and returns the path."""
    def build(tmp):
        (tmp / name).write_bytes(data)
        return tmp / name
    return build


def npy_case(header=None, **kw):
    return numpy_file(npy_bytes(header, **kw), "x.npy")


def npz_case(*members):
    return numpy_file(zip_of(list(members)), "x.npz")


SHAPE = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }"
NPY_CASES = {
    "npy-truncated-data": npy_case(data=b"\0" * 20),
    "npy-trailing-bytes": npy_case(data=b"\0" * 28),
    "npy-header-length-past-end": npy_case(hlen=5000),
    "npy-header-over-limit": npy_case(version=2, hlen=10 ** 6),
    "npy-version-4": npy_case(version=4),
    "npy-cut-in-preamble": numpy_file(b"\x93NUMPY\x01", "x.npy"),
    "npy-keys-reordered": npy_case("{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4', }"),
    "npy-extra-key": npy_case("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), "
                              "'x': 1, }"),
    "npy-no-newline": numpy_file(npy_bytes()[:-25] + b" " + npy_bytes()[-24:], "x.npy"),
    "npy-negative-dim": npy_case(SHAPE % "(-2, 3)"),
    "npy-leading-zero": npy_case(SHAPE % "(02, 3)"),
    "npy-dim-over-int64": npy_case(SHAPE % "(9223372036854775808, 1)"),
    "npy-shape-overflows": npy_case(SHAPE % "(4294967296, 4294967296, 4)"),
    "npy-rank-65": npy_case(SHAPE % ("(" + ", ".join(["1"] * 65) + ")")),
    "npy-one-dim-no-comma": npy_case(SHAPE % "(6)"),
    "npy-fortran-maybe": npy_case("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2, 3), }"),
    "npy-descr-unterminated": npy_case("{'descr': '<f4, 'fortran_order': False, 'shape': (6,), }"),
    "npy-nul-in-header": npy_case("{'descr': '<f4', 'fortran_order': False,\0'shape': (6,), }"),
    "npz-bomb-declares-beyond-ratio": npz_case(dict(deflated_member("a.npy", npy_bytes()),
                                                    size=0xFFFFFFF0)),
    "npz-bomb-inflates-past-size": npz_case(dict(
        deflated_member("a.npy", npy_bytes(data=b"\0" * 24) + b"\0" * (64 << 20)),
        size=len(npy_bytes()))),
    "npz-deflate-ends-early": npz_case(dict(deflated_member("a.npy", npy_bytes()),
                                            size=len(npy_bytes()) + 24)),
    "npz-deflate-bad-crc": npz_case(dict(deflated_member("a.npy", npy_bytes()), crc=1234)),
    "npz-deflate-junk-after-stream": npz_case(dict(
        deflated_member("a.npy", npy_bytes()), raw=deflate(npy_bytes()) + b"junk")),
    "npz-stored-size-lies": npz_case(dict(name="a.npy", raw=npy_bytes(), size=10 ** 9)),
    "npz-member-truncated-array": npz_case(dict(name="a.npy", raw=npy_bytes(data=b"\0" * 8))),
    "npz-bad-header-in-member": npz_case(dict(name="a.npy", raw=npy_bytes(SHAPE % "(2,3)"))),
    "npz-overlapping-members": npz_case(dict(name="a.npy", raw=npy_bytes()),
                                        dict(name="b.npy", raw=npy_bytes(), at=0)),
    "npz-method-bzip2": npz_case(dict(name="a.npy", raw=npy_bytes(), method=12)),
}

# A deflated member is decoded, and its stream checked, as far as reads need it (zip.h): one
# whose fault lies past its .npy header lists, and the read that reaches the fault fails.
NPZ_FOUND_WHEN_READ = {
    "npz-truncated-deflate": npz_case(dict(deflated_member("a.npy", BIG_NPY),
                                           raw=BIG_DEFLATED[:len(BIG_DEFLATED) // 2])),
    "npz-corrupt-deflate": npz_case(dict(deflated_member("a.npy", BIG_NPY), raw=(
        BIG_DEFLATED[:len(BIG_DEFLATED) // 2] + b"\xff" * 64 +
        BIG_DEFLATED[len(BIG_DEFLATED) // 2 + 64:]))),
    "npz-deflate-bad-crc-deep": npz_case(dict(deflated_member("a.npy", BIG_NPY), crc=1234)),
}
FOUND_SAYS = {"npz-truncated-deflate": "truncated", "npz-corrupt-deflate": "corrupt",
              "npz-deflate-bad-crc-deep": "CRC-32"}


@pytest.mark.parametrize("case", sorted(NPZ_FOUND_WHEN_READ))
def test_npz_deflate_fault_found_by_the_read(tmp_path, mount, case):
    """np.load refuses the member; ckptfs and ckpt ls list it from its header alone, and every
    reader of its bytes gets an error, never the bytes decoded before the fault as the whole:
    a read of the tensor file through the mount (EIO, then on every later read, its start's
    too: the member is known bad), ckpt cat, ckpt pack and ckload, each failing (cat and ckload
    saying what is wrong with the stream)."""
    import errno
    src = NPZ_FOUND_WHEN_READ[case](tmp_path)
    with pytest.raises(Exception):
        with np.load(src) as z:
            z["a"]
    ls = run([ckpt_bin(), "ls", src], timeout=TIMEOUT)
    assert ls.returncode == 0 and b"a" in ls.stdout, ls.stderr
    with mount(src) as m:
        assert [t["name"] for t in read_index(m)["tensors"]] == ["a"]
        for _ in range(2):
            with pytest.raises(OSError) as e:
                (m / "a").read_bytes()
            assert e.value.errno == errno.EIO, e.value
        import mmap
        fd = os.open(m / "a", os.O_RDONLY | os.O_DIRECT)  # past the page cache: the daemon's
        try:
            with pytest.raises(OSError) as e:
                os.preadv(fd, [mmap.mmap(-1, 4096)], 0)  # the start, which decoded
            assert e.value.errno == errno.EIO, e.value
        finally:
            os.close(fd)
    cat = run([ckpt_bin(), "cat", src, "a"], timeout=TIMEOUT)
    err = cat.stderr.decode(errors="replace")
    assert cat.returncode == 1 and err.count("\n") == 1 and "cannot read tensor 'a'" in err, err
    assert FOUND_SAYS[case] in err, err
    assert len(cat.stdout) < len(BIG_NPY) - 128, "the whole tensor was written"
    one_line(run([ckpt_bin(), "pack", src, tmp_path / "out.pack"], timeout=TIMEOUT), "ckpt: ")
    assert not (tmp_path / "out.pack").exists()
    import ckload
    with pytest.raises(ckload.Error) as e:
        with ckload.Load(str(src), device="cpu") as ld:
            ld.wait_all()
    assert "tensor 'a'" in str(e.value) and FOUND_SAYS[case] in str(e.value), e.value


# Members that hold no tensor are left out of an .npz, the rest served: never run,
# never followed, listed with their reason in index.json.
NPZ_OMITTED = {
    "npz-not-npy-member": (npz_case(dict(name="a.npy", raw=npy_bytes()),
                                    dict(name="b.txt", raw=b"hello")), "b.txt", "not an .npy"),
    "npz-member-is-pickle": (npz_case(dict(name="b.npy", raw=npy_bytes(
        "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", data=pickle.dumps([1]))),
        dict(name="a.npy", raw=npy_bytes())), "b", "allow_pickle"),
}


@pytest.mark.parametrize("case", sorted(NPZ_OMITTED))
def test_npz_member_with_no_tensor_is_left_out(tmp_path, mount, case):
    make, name, why = NPZ_OMITTED[case]
    src = make(tmp_path)
    with mount(src) as m:
        index = read_index(m)
        assert [t["name"] for t in index["tensors"]] == ["a"]
        assert [o["name"] for o in index["omitted"]] == [name] and why in index["omitted"][0]["reason"]


def test_npz_builder_makes_valid_archives(tmp_path, mount):
    """zip_of and npy_bytes are right: np.load and ckptfs read their honest output."""
    src = numpy_file(zip_of([dict(name="a.npy", raw=npy_bytes()),
                             deflated_member("b/c.npy", BIG_NPY)]), "ok.npz")(tmp_path)
    with np.load(src) as z:
        want = {k: np.ascontiguousarray(z[k]).tobytes() for k in z.files}
    assert want["a"] == struct.pack("<6f", *range(6))
    with mount(src) as m:
        index = read_index(m)
        assert {t["name"]: (m / t["path"]).read_bytes() for t in index["tensors"]} == want


@pytest.mark.parametrize("case", sorted(NPY_CASES))
def test_hostile_numpy(tmp_path, fuse, case):
    src = NPY_CASES[case](tmp_path)
    assert_refused_everywhere(src, tmp_path)


# --- pickle bytes, by hand -------------------------------------------------------------------

PROTO2 = b"\x80\x02"
MARK, STOP, TUPLE, REDUCE, DICT0, SETITEMS, LIST0, APPEND, APPENDS = \
    b"(", b".", b"t", b"R", b"}", b"u", b"]", b"a", b"e"
NEWFALSE, BINPERSID, NONE = b"\x89", b"Q", b"N"


def s(text):
    b = text.encode()
    return b"X" + struct.pack("<I", len(b)) + b  # BINUNICODE


def i(n):
    if -(1 << 31) <= n < 1 << 31:
        return b"J" + struct.pack("<i", n)  # BININT
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw  # LONG1


def glob(module, name):
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def stack_glob(module, name):
    return s(module) + s(name) + b"\x93"


def tup(*items):
    return MARK + b"".join(items) + TUPLE


# A legacy file's persistent ids carry a sixth item (view metadata, None); make_pickles sets it.
LEGACY_PID = [False]


def storage_pid(key, numel, cls="FloatStorage"):
    return tup(s("storage"), glob("torch", cls), s(key), s("cpu"), i(numel),
               *([NONE] if LEGACY_PID[0] else [])) + BINPERSID


def tensor(key, numel, offset, size, stride, cls="FloatStorage", pid=None):
    args = tup(pid if pid is not None else storage_pid(key, numel, cls), i(offset),
               tup(*map(i, size)), tup(*map(i, stride)), NEWFALSE,
               glob("collections", "OrderedDict") + tup() + REDUCE)
    return glob("torch._utils", "_rebuild_tensor_v2") + args + REDUCE


def root(*pairs):
    """A pickled dict {name: value-bytes}, protocol 2."""
    body = b"".join(s(k) + v for k, v in pairs)
    return PROTO2 + DICT0 + MARK + body + SETITEMS + STOP


MARKER = "/tmp/ckptfs-pwned"


def call(module, name, *args, stack=False):
    g = stack_glob(module, name) if stack else glob(module, name)
    return g + tup(*args) + REDUCE


# --- containers for a pickle: a torch zip and a legacy file -----------------------------------

F32_10 = struct.pack("<10f", *range(10))


def torch_zip(path, data_pkl, records=None):
    """A torch.save-style zip: archive/data.pkl, version, byteorder and data/<key> records."""
    records = {"0": F32_10} if records is None else records
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", data_pkl)
        z.writestr("archive/byteorder", "little")
        for key, data in records.items():
            z.writestr(f"archive/data/{key}", data)
        z.writestr("archive/version", "3\n")
    return Path(path)


def legacy_file(path, data_pkl, storages=None, keys=None, little=True, version=1001):
    """A legacy torch file: magic, protocol version, sys_info, the object, the storage keys,
    then each storage as an 8-byte element count and its bytes."""
    storages = {"0": (10, F32_10)} if storages is None else storages
    head = pickle.dumps(0x1950a86a20f9469cfc6c, protocol=2)
    head += pickle.dumps(version, protocol=2)
    head += pickle.dumps({"protocol_version": 1001, "little_endian": little,
                          "type_sizes": {"short": 2, "int": 4, "long": 4}}, protocol=2)
    tail = pickle.dumps(list(storages) if keys is None else keys, protocol=2)
    for numel, data in storages.values():
        tail += struct.pack("<q", numel) + data
    Path(path).write_bytes(head + data_pkl + tail)
    return Path(path)


def good():
    return root(("w", tensor("0", 10, 0, [10], [1])), ("v", tensor("0", 10, 2, [2, 3], [1, 2])))


GOOD = good()


@pytest.mark.parametrize("kind", ["zip", "legacy"])
def test_builders_make_valid_checkpoints(tmp_path, mount, kind):
    """The hand-built containers and pickles are right: torch.load and ckptfs agree on them.
    So when a hostile twin is refused, it is for its one hostile part."""
    build = torch_zip if kind == "zip" else legacy_file
    src = build(tmp_path / f"good.{kind}", PICKLES[kind]["good"])
    w = torch.load(src, weights_only=True)
    assert torch.equal(w["w"], torch.arange(10, dtype=torch.float32))
    with mount(src) as m:
        check_torch_mount(m, src, "pytorch-zip" if kind == "zip" else "pytorch-legacy")


# --- the pickles -----------------------------------------------------------------------------

def nested_lists(depth):
    return PROTO2 + LIST0 * depth + APPEND * (depth - 1) + STOP


def laughs(levels):
    """l[k+1] = [l[k], l[k]]: a few hundred bytes whose walk has 2**levels leaves."""
    out = PROTO2 + LIST0 + b"q\x00"
    for k in range(levels):
        out += LIST0 + MARK + b"h" + bytes([k]) + b"h" + bytes([k]) + APPENDS + b"q" + bytes([k + 1])
    return PROTO2 + DICT0 + s("x") + out[2:] + b"s" + STOP


def make_pickles(legacy):
    LEGACY_PID[0] = legacy
    try:
        return _pickles()
    finally:
        LEGACY_PID[0] = False


def _pickles():
    return {
        "good": good(),
        # Code. Every one of these is what a malicious checkpoint would use to run something.
        "global_os_system": root(("x", call("os", "system", s(f"touch {MARKER}")))),
        "stack_global_posix_system": b"\x80\x04" + DICT0 + s("x") + call(
            "posix", "system", s(f"touch {MARKER}"), stack=True) + b"s" + STOP,
        "builtins_eval": root(("x", call("builtins", "eval", s(f"open('{MARKER}','w')")))),
        "builtins_exec": root(("x", call("builtins", "exec", s("import os")))),
        "builtins_getattr": root(("x", call("builtins", "getattr", glob("os", "path"), s("join")))),
        "builtins_import": root(("x", call("builtins", "__import__", s("os")))),
        "subprocess_popen": root(("x", call("subprocess", "Popen", tup(s("touch"), s(MARKER))))),
        "allowed_name_attribute_walk": root(("x", glob("torch._utils",
                                                       "_rebuild_tensor_v2.__globals__"))),
        "inst_opcode": PROTO2 + DICT0 + s("x") + MARK + s(f"touch {MARKER}") + b"ios\nsystem\n" +
        b"s" + STOP,
        "obj_opcode": PROTO2 + DICT0 + s("x") + MARK + glob("os", "system") + s("id") + b"o" +
        b"s" + STOP,
        "newobj_disallowed_class": PROTO2 + DICT0 + s("x") + glob("subprocess", "Popen") +
        tup(s("id")) + b"\x81" + b"s" + STOP,
        "ext1_registry": PROTO2 + DICT0 + s("x") + b"\x82\x01" + b"s" + STOP,
        "build_on_allowed": root(("x", glob("collections", "OrderedDict") + tup() + REDUCE +
                                  DICT0 + s("__setstate__") + glob("os", "system") + b"s" + b"b")),
        # Resource bombs.
        "deep_lists": nested_lists(200_000),
        "deep_tuples": PROTO2 + MARK * 5000 + TUPLE * 5000 + STOP,
        "mark_bomb": PROTO2 + MARK * 1_000_000 + STOP,
        "stack_bomb": PROTO2 + NONE * 3_000_000 + STOP,
        "billion_laughs": laughs(80),
        "memo_put_huge": PROTO2 + NONE + b"r\xff\xff\xff\xff" + STOP,
        "memo_get_huge": PROTO2 + b"j\xff\xff\xff\xff" + STOP,
        "memo_text_put_huge": b"N" + b"p99999999999999999999\n" + STOP,
        "memo_get_unset": PROTO2 + NONE + b"q\x00" + b"h\x05" + STOP,
        "long4_past_end": PROTO2 + b"\x8b" + struct.pack("<i", 1 << 30) + STOP,
        "int_over_64_bits": root(("x", i(1 << 100))),
        "unicode_length_past_end": PROTO2 + b"X" + struct.pack("<I", 0xFFFFFFF0) + b"ab" + STOP,
        "bytes8_length_huge": b"\x80\x04" + b"\x8e" + struct.pack("<Q", 1 << 62) + STOP,
        "frame_length_huge": b"\x80\x04" + b"\x95" + struct.pack("<Q", 1 << 62) + NONE + STOP,
        "unknown_opcode": PROTO2 + b"\xff" + STOP,
        "no_stop": PROTO2 + DICT0,
        "protocol_99": b"\x80\x63" + NONE + STOP,
        # Storages and tensors.
        "missing_storage_record": root(("w", tensor("7", 10, 0, [10], [1]))),
        "storage_key_escapes": root(("w", tensor("../../../../etc/passwd", 4, 0, [4], [1]))),
        "storage_key_absolute": root(("w", tensor("/etc/passwd", 4, 0, [4], [1]))),
        "offset_past_storage": root(("w", tensor("0", 10, 8, [5], [1]))),
        "stride_past_storage": root(("w", tensor("0", 10, 0, [5], [3]))),
        "negative_offset": root(("w", tensor("0", 10, -1, [2], [1]))),
        "negative_size": root(("w", tensor("0", 10, 0, [-2], [1]))),
        "negative_stride": root(("w", tensor("0", 10, 9, [5], [-1]))),
        "offset_overflows": root(("w", tensor("0", 10, (1 << 63) - 1, [2], [1]))),
        "stride_overflows": root(("w", tensor("0", 10, 0, [3], [1 << 62]))),
        "size_product_overflows": root(("w", tensor("0", 10, 0, [1 << 32, 1 << 32, 4], [0, 0, 0]))),
        "storage_numel_overflows": root(("w", tensor("0", 1 << 62, 0, [10], [1], cls="DoubleStorage"))),
        "storage_bigger_than_record": root(("w", tensor("0", 1000, 0, [10], [1]))),
        "unknown_storage_class": root(("w", tensor("0", 10, 0, [10], [1], cls="EvilStorage"))),
        "storage_class_is_code": root(("w", tensor("0", 10, 0, [10], [1], pid=tup(
            s("storage"), glob("os", "system"), s("0"), s("cpu"), i(10)) + BINPERSID))),
        "persistent_id_too_short": root(("w", tensor("0", 10, 0, [10], [1],
                                                     pid=tup(s("storage")) + BINPERSID))),
        "persistent_id_not_storage": root(("w", tensor("0", 10, 0, [10], [1], pid=tup(
            s("module"), glob("torch", "FloatStorage"), s("0"), s("cpu"), i(10)) + BINPERSID))),
        "rebuild_with_bad_args": root(("w", glob("torch._utils", "_rebuild_tensor_v2") +
                                       tup(s("x"), s("y")) + REDUCE)),
        "rank_65": root(("w", tensor("0", 10, 0, [1] * 65, [1] * 65))),
    }


PICKLES = {"zip": make_pickles(False), "legacy": make_pickles(True)}


@pytest.mark.parametrize("kind", ["zip", "legacy"])
@pytest.mark.parametrize("case", [c for c in PICKLES["zip"] if c != "good"])
def test_hostile_pickle(tmp_path, fuse, case, kind):
    data = PICKLES[kind][case]
    src = (torch_zip if kind == "zip" else legacy_file)(tmp_path / f"{case}.{kind}", data)
    assert_refused_everywhere(src, tmp_path)
    assert not Path(MARKER).exists()


# --- safetensors -------------------------------------------------------------------------------

def t(dtype, shape, a, b):
    return {"dtype": dtype, "shape": shape, "data_offsets": [a, b]}


def st(tmp, header, data=b"\0" * 12, hlen=None):
    text = header if isinstance(header, (bytes, str)) else header_bytes(header)
    return raw_file(tmp / "h.safetensors", text, data, hlen=hlen)


def deep_json(n):
    return '{"a":' + "[" * n + "]" * n + "}"


SAFETENSORS = {
    "header_length_zero": lambda tmp: st(tmp, b"", hlen=0),
    "header_length_u64_max": lambda tmp: st(tmp, header_bytes({}), hlen=(1 << 64) - 1),
    "header_length_over_100MB_with_the_bytes": lambda tmp: st(
        tmp, b"{}" + b" " * 100_000_000, hlen=100_000_002),
    "trailing_comma": lambda tmp: st(tmp, '{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},}'),
    "single_quotes": lambda tmp: st(tmp, "{'a':{'dtype':'F32','shape':[3],'data_offsets':[0,12]}}"),
    "nan_literal": lambda tmp: st(tmp, '{"a":{"dtype":"F32","shape":[NaN],"data_offsets":[0,12]}}'),
    "byte_order_mark": lambda tmp: st(tmp, b"\xef\xbb\xbf" + header_bytes({"a": t("F32", [3], 0, 12)})),
    "lone_surrogate_name": lambda tmp: st(tmp, '{"\\ud800":{"dtype":"F32","shape":[3],'
                                               '"data_offsets":[0,12]}}'),
    "deep_json_nesting": lambda tmp: st(tmp, deep_json(100_000)),
    "reversed_offsets": lambda tmp: st(tmp, {"a": t("F32", [3], 12, 0)}),
    "negative_offsets": lambda tmp: st(tmp, {"a": t("F32", [3], -12, 0)}),
    "offset_past_u64": lambda tmp: st(tmp, {"a": t("U8", [0], 1 << 64, 1 << 64)}),
    "offset_past_2_63": lambda tmp: st(tmp, {"a": t("U8", [12], (1 << 63) + 0, (1 << 63) + 12)}),
    "three_offsets": lambda tmp: st(tmp, {"a": {"dtype": "F32", "shape": [3],
                                                "data_offsets": [0, 12, 24]}}),
    "offsets_as_strings": lambda tmp: st(tmp, {"a": {"dtype": "F32", "shape": [3],
                                                     "data_offsets": ["0", "12"]}}),
    "identical_extents": lambda tmp: st(tmp, {"a": t("F32", [3], 0, 12),
                                              "b": t("F32", [3], 0, 12)}),
    "dim_float": lambda tmp: st(tmp, {"a": t("F32", [3.0], 0, 12)}),
    "dim_fraction": lambda tmp: st(tmp, {"a": t("F32", [2.5], 0, 12)}),
    "dim_string": lambda tmp: st(tmp, {"a": t("F32", ["3"], 0, 12)}),
    "dim_bool": lambda tmp: st(tmp, {"a": t("F32", [True, 3], 0, 12)}),
    "dim_null": lambda tmp: st(tmp, {"a": t("F32", [None], 0, 12)}),
    "dim_nested": lambda tmp: st(tmp, {"a": t("F32", [[3]], 0, 12)}),
    "dim_2_63": lambda tmp: st(tmp, {"a": t("U8", [1 << 63], 0, 12)}),
    "dim_2_64_times_0": lambda tmp: st(tmp, {"a": t("U8", [0, 1 << 64], 0, 0)}, b""),
    # The product wraps to exactly 0 in 64 bits: a reader that multiplies without checking
    # would accept an empty extent for an enormous tensor.
    "product_wraps_to_zero": lambda tmp: st(tmp, {"a": t("U8", [1 << 62, 4], 0, 0)}, b""),
    "bytes_wrap_to_zero": lambda tmp: st(tmp, {"a": t("F32", [1 << 62], 0, 0)}, b""),
    "product_wraps_to_twelve": lambda tmp: st(tmp, {"a": t("U8", [(1 << 62) + 3, 4], 0, 12)}),
    "dtype_lowercase": lambda tmp: st(tmp, {"a": t("f32", [3], 0, 12)}),
    "dtype_padded": lambda tmp: st(tmp, {"a": t("F32 ", [3], 0, 12)}),
    "dtype_empty": lambda tmp: st(tmp, {"a": t("", [3], 0, 12)}),
    "dtype_torch_spelling": lambda tmp: st(tmp, {"a": t("float32", [3], 0, 12)}),
    "duplicate_name_by_escape": lambda tmp: st(
        tmp, b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
             b'"\\u0061":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"\x01\x02"),
    "duplicate_metadata": lambda tmp: st(
        tmp, b'{"__metadata__":{"a":"b"},"__metadata__":{"c":"d"},'
             b'"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01"),
    "nul_escape_in_name": lambda tmp: st(tmp, {"a\u0000/../b": t("F32", [3], 0, 12)}),
    "tensor_is_array": lambda tmp: st(tmp, {"a": [1, 2, 3]}),
    "random_after_8": lambda tmp: st(tmp, random.Random(1).randbytes(64), hlen=64),
}


@pytest.mark.parametrize("case", list(SAFETENSORS))
def test_hostile_safetensors(tmp_path, fuse, case):
    src = SAFETENSORS[case](tmp_path)
    assert_refused_everywhere(src, tmp_path)


# --- sharded directories -------------------------------------------------------------------------

def shard_dir(tmp, weight_map, extra=None):
    d = tmp / "model"
    d.mkdir()
    write_safetensors(d / "a.safetensors", [("x", "U8", [1], b"\x01")])
    write_safetensors(tmp / "outside.safetensors", [("y", "U8", [1], b"\x02")])
    for name, data in (extra or {}).items():
        (d / name).write_bytes(data)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return d


SHARDS = {
    "shard_name_dotdot": {"x": "a.safetensors", "y": "../outside.safetensors"},
    "shard_name_absolute": {"x": "a.safetensors", "y": "/etc/passwd"},
    "shard_name_subdir": {"x": "a.safetensors", "y": "sub/a.safetensors"},
    "shard_name_dot": {"x": "a.safetensors", "y": "."},
    "shard_name_nul": {"x": "a.safetensors", "y": "a.safetensors\u0000x"},
    "shard_name_not_string": {"x": "a.safetensors", "y": 7},
    "weight_map_names_a_missing_tensor": {"x": "a.safetensors", "z": "a.safetensors"},
    "weight_map_not_object": ["a.safetensors"],
}


@pytest.mark.parametrize("case", list(SHARDS))
def test_hostile_shard_directory(tmp_path, fuse, case):
    src = shard_dir(tmp_path, SHARDS[case])
    if case == "shard_name_subdir":
        (src / "sub").mkdir()
        shutil.copy(src / "a.safetensors", src / "sub" / "a.safetensors")
    assert_refused_everywhere(src, tmp_path)


def test_bad_index_json_in_shard_directory(tmp_path, fuse):
    d = tmp_path / "model"
    d.mkdir()
    write_safetensors(d / "a.safetensors", [("x", "U8", [1], b"\x01")])
    (d / "model.safetensors.index.json").write_text('{"weight_map": {"x": "a.safetensors"')
    assert_refused_everywhere(d, tmp_path)


# --- zip archives whose central directory lies ------------------------------------------------

def real_zip(tmp):
    """A real torch.save archive of {"w": arange(10) as float32}."""
    p = tmp / "real.pt"
    torch.save({"w": torch.arange(10, dtype=torch.float32)}, p)
    return p.read_bytes()


def eocd_at(data):
    return data.rindex(b"PK\x05\x06")


def zip64_at(data):
    at = data.rindex(b"PK\x06\x06")
    assert struct.unpack_from("<I", data, eocd_at(data) - 20)[0] == 0x07064b50
    return at


def patch(data, at, fmt, value):
    b = bytearray(data)
    struct.pack_into(fmt, b, at, value)
    return bytes(b)


def central_records(data):
    """Offsets of every central directory header."""
    out, at = [], data.find(b"PK\x01\x02")
    while at >= 0:
        out.append(at)
        at = data.find(b"PK\x01\x02", at + 4)
    return out


def central_named(data, suffix):
    for at in central_records(data):
        n = struct.unpack_from("<H", data, at + 28)[0]
        if data[at + 46:at + 46 + n].endswith(suffix):
            return at
    raise AssertionError(suffix)


def zip_case(fn):
    def build(tmp):
        p = tmp / "lie.pt"
        p.write_bytes(fn(real_zip(tmp)))
        return p
    return build


ZIPS = {
    "count_too_high": lambda d: patch(patch(d, eocd_at(d) + 8, "<H", 999), eocd_at(d) + 10, "<H", 999),
    "count_too_low": lambda d: patch(patch(d, eocd_at(d) + 8, "<H", 1), eocd_at(d) + 10, "<H", 1),
    "disk_counts_disagree": lambda d: patch(d, eocd_at(d) + 8, "<H", 1),
    "multi_disk": lambda d: patch(d, eocd_at(d) + 4, "<H", 1),
    "cd_size_past_eof": lambda d: patch(d, eocd_at(d) + 12, "<I", 0x7FFFFFFF),
    "cd_size_too_small": lambda d: patch(d, eocd_at(d) + 12, "<I", 46),
    "cd_offset_past_eof": lambda d: patch(d, eocd_at(d) + 16, "<I", len(d) + 1000),
    "cd_offset_zero": lambda d: patch(d, eocd_at(d) + 16, "<I", 0),
    "cd_offset_off_by_one": lambda d: patch(
        d, eocd_at(d) + 16, "<I", struct.unpack_from("<I", d, eocd_at(d) + 16)[0] + 1),
    "comment_length_past_eof": lambda d: patch(d, eocd_at(d) + 20, "<H", 1000),
    # torch writes zip64 records: their counts, sizes and offsets lie too.
    "zip64_markers_without_zip64": lambda d: patch(patch(patch(
        d, eocd_at(d) + 8, "<H", 0xFFFF), eocd_at(d) + 10, "<H", 0xFFFF),
        eocd_at(d) - 20, "<I", 0),
    "zip64_count_lies": lambda d: patch(patch(d, zip64_at(d) + 24, "<Q", 1 << 40),
                                        zip64_at(d) + 32, "<Q", 1 << 40),
    "zip64_cd_size_lies": lambda d: patch(d, zip64_at(d) + 40, "<Q", 1 << 62),
    "zip64_cd_offset_lies": lambda d: patch(d, zip64_at(d) + 48, "<Q", (1 << 64) - 1),
    "zip64_locator_past_eof": lambda d: patch(d, eocd_at(d) - 20 + 8, "<Q", len(d) * 2),
    "zip64_locator_disks": lambda d: patch(d, eocd_at(d) - 20 + 16, "<I", 7),
    "local_offset_past_eof": lambda d: patch(d, central_named(d, b"data/0") + 42, "<I", len(d)),
    "local_offset_into_data": lambda d: patch(d, central_named(d, b"data/0") + 42, "<I", 10),
    "local_offset_to_other_record": lambda d: patch(
        d, central_named(d, b"data/0") + 42, "<I",
        struct.unpack_from("<I", d, central_named(d, b"data.pkl") + 42)[0]),
    "record_size_past_eof": lambda d: patch(patch(d, central_named(d, b"data/0") + 20, "<I",
                                                  0x7FFFFFF0),
                                            central_named(d, b"data/0") + 24, "<I", 0x7FFFFFF0),
    "sizes_disagree": lambda d: patch(d, central_named(d, b"data/0") + 20, "<I", 4),
    "pickle_size_past_eof": lambda d: patch(patch(d, central_named(d, b"data.pkl") + 20, "<I",
                                                  0x7FFFFFF0),
                                            central_named(d, b"data.pkl") + 24, "<I", 0x7FFFFFF0),
    "storage_marked_deflated": lambda d: patch(d, central_named(d, b"data/0") + 10, "<H", 8),
    "pickle_marked_deflated": lambda d: patch(d, central_named(d, b"data.pkl") + 10, "<H", 8),
    "storage_marked_encrypted": lambda d: patch(d, central_named(d, b"data/0") + 8, "<H", 1),
    "name_length_past_cd": lambda d: patch(d, central_named(d, b"data/0") + 28, "<H", 0xFFFF),
    "extra_length_past_cd": lambda d: patch(d, central_named(d, b"data/0") + 30, "<H", 0xFFFF),
    "local_name_length_past_eof": lambda d: patch(
        d, struct.unpack_from("<I", d, central_named(d, b"data/0") + 42)[0] + 26, "<H", 0xFFFF),
    "no_end_record": lambda d: d[:eocd_at(d)],
    "only_end_record": lambda d: b"PK\x03\x04" + d[eocd_at(d):],
}


def duplicate_pickle(tmp):
    p = torch_zip(tmp / "dup.pt", GOOD)
    with zipfile.ZipFile(p, "a") as z, pytest.warns(UserWarning):
        z.writestr("archive/data.pkl", PICKLES["zip"]["global_os_system"])
    return p


def escaping_record(tmp):
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w") as z:
        z.writestr("archive/data.pkl", GOOD)
        z.writestr("archive/data/../../../etc/0", F32_10)
    p = tmp / "slip.pt"
    p.write_bytes(data.getvalue())
    return p


def compressed_storage(tmp):
    p = tmp / "deflated.pt"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("archive/data.pkl", GOOD)
        z.writestr("archive/data/0", F32_10, compress_type=zipfile.ZIP_DEFLATED)
        z.writestr("archive/version", "3\n")
    return p


ZIP_BUILDERS = {**{k: zip_case(v) for k, v in ZIPS.items()},
                "duplicate_record_names": duplicate_pickle,
                "record_name_escapes_the_folder": escaping_record,
                "compressed_storage_only": compressed_storage}


@pytest.mark.parametrize("case", list(ZIP_BUILDERS))
def test_zip_that_lies(tmp_path, fuse, case):
    src = ZIP_BUILDERS[case](tmp_path)
    assert_refused_everywhere(src, tmp_path)


# --- legacy files whose own structure lies -------------------------------------------------------

LEGACY = {
    "version_not_1001": lambda tmp: legacy_file(tmp / "l.pt", GOOD, version=1000),
    "big_endian": lambda tmp: legacy_file(tmp / "l.pt", GOOD, little=False),
    "storage_count_past_eof": lambda tmp: legacy_file(tmp / "l.pt", GOOD,
                                                      storages={"0": (1 << 40, F32_10)}),
    "storage_count_negative": lambda tmp: legacy_file(tmp / "l.pt", GOOD,
                                                      storages={"0": (-1, F32_10)}),
    "storage_count_disagrees": lambda tmp: legacy_file(tmp / "l.pt", GOOD,
                                                       storages={"0": (9, F32_10[:36])}),
    "key_list_names_unknown": lambda tmp: legacy_file(tmp / "l.pt", GOOD, keys=["0", "9"]),
    "key_listed_twice": lambda tmp: legacy_file(tmp / "l.pt", GOOD, keys=["0", "0"]),
    "key_list_not_list": lambda tmp: legacy_file(tmp / "l.pt", GOOD, keys={"0": 1}),
    "key_list_missing": lambda tmp: Path(legacy_file(tmp / "l.pt", GOOD)).write_bytes(
        Path(tmp / "l.pt").read_bytes().split(GOOD)[0] + GOOD) and tmp / "l.pt",
    "magic_then_nothing": lambda tmp: (tmp / "l.pt").write_bytes(
        pickle.dumps(0x1950a86a20f9469cfc6c, protocol=2)) and tmp / "l.pt",
}


@pytest.mark.parametrize("case", list(LEGACY))
def test_legacy_that_lies(tmp_path, fuse, case):
    assert_refused_everywhere(LEGACY[case](tmp_path), tmp_path)


# --- files that are no checkpoint at all ---------------------------------------------------------

def rnd(n, seed=5):
    return random.Random(seed).randbytes(n)


def file_with(data, name="x.bin"):
    def build(tmp):
        p = tmp / name
        p.write_bytes(data)
        return p
    return build


def fifo(tmp):
    p = tmp / "fifo.pt"
    os.mkfifo(p)
    return p


def directory_of_junk(tmp):
    d = tmp / "junk"
    d.mkdir()
    (d / "sub").mkdir()
    (d / "weights.bin").write_bytes(rnd(100))
    return d


OTHER = {
    "empty": file_with(b""),
    "one_byte": file_with(b"P"),
    "random": file_with(rnd(1 << 16)),
    "random_after_zip_magic": file_with(b"PK\x03\x04" + rnd(4096)),
    "random_after_legacy_magic": file_with(pickle.dumps(0x1950a86a20f9469cfc6c, protocol=2) +
                                           rnd(4096)),
    "random_after_pack_magic": file_with(b"CKPTPACK" + rnd(4096)),
    "zeros": file_with(b"\0" * 4096),
    "plain_pickle": file_with(pickle.dumps({"w": [1, 2, 3]})),
    "numpy_npy": file_with(b"\x93NUMPY\x01\x00v\x00" + rnd(200)),
    "directory_of_junk": directory_of_junk,
    "fifo": fifo,
    "char_device": lambda tmp: Path("/dev/zero"),
}


@pytest.mark.parametrize("case", list(OTHER))
def test_not_a_checkpoint(tmp_path, fuse, case):
    lines = assert_refused_everywhere(OTHER[case](tmp_path), tmp_path)
    if case == "empty":
        assert all("empty" in line for line in lines), lines


def truncated_pack(tmp, cut):
    src = write_safetensors(tmp / "s.safetensors", [("a", "F32", [64], b"\1" * 256)])
    p = tmp / "p.pack"
    r = run([ckpt_bin(), "pack", src, p])
    assert r.returncode == 0, r.stderr
    data = p.read_bytes()
    p.write_bytes(data[:cut])
    src.unlink()
    return p


@pytest.mark.parametrize("cut", [8, 63, 64, 200, 4096])
def test_truncated_pack(tmp_path, fuse, cut):
    assert_refused_everywhere(truncated_pack(tmp_path, cut), tmp_path)


def test_unreadable_file(tmp_path, fuse):
    """chmod 000 means nothing to root, so the commands run as nobody, from copies of the
    binaries in a folder that nobody may enter (the build folder may not be)."""
    base = Path(tempfile.mkdtemp(prefix="ckptfs-unreadable-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        bins = []
        for b in (ckptfs_bin(), ckpt_bin()):
            bins.append(base / b.name)
            shutil.copy(b, bins[-1])
        src = base / "secret.safetensors"
        write_safetensors(src, [("x", "U8", [2], b"\x01\x02")])
        os.chmod(src, 0)
        nobody = 65534
        lines = assert_refused_everywhere(src, base, uid=nobody, bins=bins)
        assert all(os.strerror(13) in line for line in lines), lines
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --- names: escaping is accepted and contained, as docs/SEMANTICS.md "Names to paths" decides ---------------

ESCAPING = ["../../etc/passwd", "/abs", "..", ".", "a/../../b", "%2F", "..%2F", "a\\b", "~"]


@pytest.mark.parametrize("kind", ["zip", "legacy"])
def test_escaping_torch_keys_stay_inside(tmp_path, mount, kind):
    """Dict keys that look like paths are names like any other: each becomes escaped path
    components under the mount, the original name stays in index.json, and `ckpt pack` keeps
    it. Nothing appears outside the mount."""
    obj = OrderedDict((k, torch.full((2,), float(n))) for n, k in enumerate(ESCAPING))
    src = tmp_path / f"names.{kind}"
    torch.save(obj, src, _use_new_zipfile_serialization=kind == "zip")
    before = snapshot(tmp_path)
    with mount(src) as m:
        index = check_torch_mount(m, src, "pytorch-zip" if kind == "zip" else "pytorch-legacy")
        root_real = os.path.realpath(m)
        for ent in index["tensors"]:
            p = os.path.realpath(m / ent["path"])
            assert p.startswith(root_real + "/"), ent
            assert not any(c in (".", "..", "") for c in ent["path"].split("/")), ent
    assert snapshot(tmp_path) == before
    out = tmp_path / "n.pack"
    assert run([ckpt_bin(), "pack", src, out]).returncode == 0
    p = run([ckpt_bin(), "ls", "--json", out])
    names = [e["name"] for e in json.loads(p.stdout)["tensors"]]
    assert sorted(names) == sorted(ESCAPING)


def test_empty_name_beside_others(tmp_path, mount):
    """torch allows the key "" beside others; the mount shows it as the file '%'. FORMAT.md
    allows the empty name only for a pack's one entry, so `ckpt pack` refuses such a source
    (one line, no file) instead of writing a pack that its reader would refuse."""
    src = tmp_path / "e.pt"
    torch.save({"": torch.ones(2), "a": torch.zeros(3)}, src)
    with mount(src) as m:
        check_torch_mount(m, src, "pytorch-zip")
        assert (m / "%").read_bytes() == torch.ones(2).numpy().tobytes()
    p = run([ckpt_bin(), "pack", src, tmp_path / "e.pack"])
    assert one_line(p, f"ckpt: {src}: ") and "empty name" in p.stderr.decode()
    assert sorted(os.listdir(tmp_path)) == ["e.pt"]


def test_decorated_names_mount(tmp_path, mount):
    """Harmless decorations (spaces, unicode, '%', a trailing '.') are kept, not refused."""
    names = ["model. weight", "ünï.cödé", "100%", "bias.", "a b\tc"]
    src = write_safetensors(tmp_path / "d.safetensors",
                            [(n, "U8", [1], bytes([k])) for k, n in enumerate(names)])
    with mount(src) as m:
        got = {e["name"]: (m / e["path"]).read_bytes() for e in read_index(m)["tensors"]}
    assert got == {n: bytes([k]) for k, n in enumerate(names)}


# --- GGUF files that lie ----------------------------------------------------------------------
# Built byte by byte from the GGUF spec (ggml's docs/gguf.md), so nothing here depends on a
# writer that would refuse to write them.

def g_str(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def g_kv(key, vtype, payload):
    return g_str(key) + struct.pack("<I", vtype) + payload


def g_info(name, ne, gtype=0, offset=0):
    return (g_str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<q", d) for d in ne)
            + struct.pack("<IQ", gtype, offset))


def g_file(kvs=(), infos=(), data=b"", version=3, ntensors=None, nkv=None, align=32,
           magic=b"GGUF", vfmt="<I"):
    head = (magic + struct.pack(vfmt, version) +
            struct.pack("<QQ", len(infos) if ntensors is None else ntensors,
                        len(kvs) if nkv is None else nkv))
    body = head + b"".join(kvs) + b"".join(infos)
    return body + b"\0" * (-len(body) % align) + data


def gguf_case(**kw):
    return file_with(g_file(**kw), "x.gguf")


ONE_F32 = [g_info("w", [4])]
GGUF_HOSTILE = {
    "tensor_count_lies": gguf_case(infos=ONE_F32, data=bytes(16), ntensors=1 << 40),
    "key_count_lies": gguf_case(infos=ONE_F32, data=bytes(16), nkv=(1 << 63) - 1),
    "huge_string": gguf_case(kvs=[g_kv("k", 8, struct.pack("<Q", 1 << 62))]),
    "string_past_eof": gguf_case(kvs=[g_kv("k", 8, struct.pack("<Q", 4096) + b"x")]),
    "huge_array": gguf_case(kvs=[g_kv("k", 9, struct.pack("<IQ", 10, 1 << 26))]),
    "array_count_over_limit": gguf_case(kvs=[g_kv("k", 9, struct.pack("<IQ", 0, 1 << 40))]),
    "array_of_arrays": gguf_case(kvs=[g_kv("k", 9, struct.pack("<IIQ", 9, 0, 1))]),
    "unknown_value_type": gguf_case(kvs=[g_kv("k", 13, b"\0" * 8)]),
    "empty_key": gguf_case(kvs=[g_kv("", 0, b"\1")]),
    "duplicate_key": gguf_case(kvs=[g_kv("k", 0, b"\1"), g_kv("k", 0, b"\2")]),
    "bool_of_7": gguf_case(kvs=[g_kv("k", 7, b"\7")]),
    "offset_past_eof": gguf_case(infos=[g_info("w", [1 << 20])], data=bytes(64)),
    "offset_misaligned": gguf_case(infos=[g_info("a", [1]), g_info("b", [1], offset=4)],
                                   data=bytes(64)),
    "offset_overlaps": gguf_case(infos=[g_info("a", [16]), g_info("b", [16], offset=32)],
                                 data=bytes(128)),
    "offset_huge": gguf_case(infos=[g_info("w", [4], offset=(1 << 64) - 32)], data=bytes(16)),
    "alignment_not_power_of_two": gguf_case(
        kvs=[g_kv("general.alignment", 4, struct.pack("<I", 24))], infos=ONE_F32, data=bytes(16)),
    "alignment_huge": gguf_case(
        kvs=[g_kv("general.alignment", 4, struct.pack("<I", 1 << 31))], infos=ONE_F32,
        data=bytes(16)),
    "duplicate_tensor": gguf_case(infos=[g_info("w", [4]), g_info("w", [4], offset=32)],
                                  data=bytes(64)),
    "dims_overflow": gguf_case(infos=[g_info("w", [1 << 40, 1 << 40])], data=bytes(16)),
    "negative_dim": gguf_case(infos=[g_info("w", [-4])], data=bytes(16)),
    "five_dims": gguf_case(infos=[g_info("w", [1, 1, 1, 1, 1])], data=bytes(16)),
    "unknown_tensor_type": gguf_case(infos=[g_info("w", [32], gtype=4)], data=bytes(64)),
    "row_not_whole_blocks": gguf_case(infos=[g_info("w", [33], gtype=2)], data=bytes(64)),
    "name_in_metadata_dir": gguf_case(infos=[g_info("__metadata__.x", [4])], data=bytes(16)),
    "name_not_utf8": gguf_case(infos=[g_info(b"\xff\xfe", [4])], data=bytes(16)),
    "big_endian": gguf_case(infos=ONE_F32, data=bytes(16), vfmt=">I"),
    "version_1": gguf_case(version=1),
    "truncated_in_infos": lambda tmp: file_with(g_file(infos=ONE_F32, data=bytes(16))[:40],
                                                "x.gguf")(tmp),
    "split_without_siblings": gguf_case(
        kvs=[g_kv("split.no", 2, struct.pack("<H", 0)), g_kv("split.count", 2,
                                                             struct.pack("<H", 3))]),
    "later_split_alone": gguf_case(
        kvs=[g_kv("split.no", 2, struct.pack("<H", 1)), g_kv("split.count", 2,
                                                             struct.pack("<H", 3))]),
}


def test_gguf_builder_makes_valid_files(tmp_path):
    """The benign twin, read by gguf-py's GGUFReader: the builder above writes real GGUF."""
    import gguf
    path = file_with(g_file(kvs=[g_kv("k", 4, struct.pack("<I", 7))], infos=ONE_F32,
                            data=struct.pack("<4f", 1, 2, 3, 4)), "x.gguf")(tmp_path)
    r = gguf.GGUFReader(str(path))
    assert r.fields["k"].contents() == 7
    assert r.tensors[0].data.tolist() == [1, 2, 3, 4]
    p = run([ckpt_bin(), "cat", path, "w"])
    assert p.returncode == 0 and p.stdout == struct.pack("<4f", 1, 2, 3, 4)


@pytest.mark.parametrize("case", list(GGUF_HOSTILE))
def test_gguf_that_lies(tmp_path, fuse, case):
    lines = assert_refused_everywhere(GGUF_HOSTILE[case](tmp_path), tmp_path)
    if case == "big_endian":
        assert all("byte-swapped (big-endian)" in line for line in lines), lines
