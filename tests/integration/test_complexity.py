"""No superlinear parse: every parser and every synthesized view costs O(input).

Each case builds the same input shape at two sizes, SMALL and 10x SMALL items (keys, tensors,
members, weight_map entries), with the libraries that write those formats (numpy, gguf-py) or
byte by byte where a hostile shape is the point (repeated keys), and runs the same `ckpt`
command on both: `ls --json` (the parser, the tree and index.json), `convert` to safetensors
(the synthesized safetensors header: the mount's checkpoint.safetensors) and `pack` (the
synthesized pack). The cost is the child's CPU time (user + system, from getrusage), the median
of three runs, the sizes measured in the same test; 10x the input may cost at most RATIO times
as much. A quadratic path costs ~100x; process start-up only lowers a ratio, so the bound holds
on a busy machine. No wall-clock threshold anywhere."""
import json
import os
import resource
import statistics
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ckptfs_testlib import TORCH2, ckpt_bin, header_bytes, need_torch2, raw_file

RATIO = 20  # 10x the input: at most this many times the cost (linear: ~10; quadratic: ~100)
RUNS = 3
SMALL_FILL = 2000  # tensors of the smaller model in test_vllm_placement_of_many_tensors


def cpu_seconds(args, timeout=300):
    """Median CPU time (children's user + system) of `ckpt ARGS`, which must succeed."""
    times = []
    for _ in range(RUNS):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run([ckpt_bin(), *map(str, args)], capture_output=True, timeout=timeout)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert p.returncode == 0, p.stderr.decode(errors="replace")
        times.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(times)


def assert_linear(tmp_path, make, small, commands=("ls",)):
    """make(dir, n) -> source path; each command's cost at 10 * small within RATIO x small's."""
    for cmd in commands:
        costs = []
        for n in (small, 10 * small):
            d = tmp_path / f"{cmd}-{n}"
            d.mkdir()
            src = make(d, n)
            args = {"ls": ["ls", src, "--json"],
                    "convert": ["convert", src, d / "out.safetensors", "--skip-unsupported"],
                    "pack": ["pack", src, d / "out.pack"]}[cmd]
            costs.append(cpu_seconds(args))
            for out in d.glob("out.*"):
                out.unlink()
        ratio = costs[1] / max(costs[0], 1e-3)
        assert ratio <= RATIO, f"{cmd}: {small} items {costs[0]:.3f} s, 10x {costs[1]:.3f} s: " \
                               f"{ratio:.1f}x"


# --- sources ----------------------------------------------------------------------------------

def tiny_tensors(n):
    """n one-element F32 tensors, header and data (names with digits, as layers have)."""
    header, at = {}, 0
    for i in range(n):
        header[f"layers.{i}.w"] = {"dtype": "F32", "shape": [1], "data_offsets": [at, at + 4]}
        at += 4
    return header, bytes(at)


def metadata_text(n):
    """A __metadata__ object of n keys as JSON text, a tenth of them repeated (the last value
    stands, json.loads says): written by hand, since json.dumps writes a key once."""
    pairs = [f'"key.{i}": "value {i}"' for i in range(n)]
    pairs += [f'"key.{i}": "again {i}"' for i in range(0, n, 10)]
    return "{" + ",".join(pairs) + "}"


def safetensors_with_metadata(d, n):
    text = '{"__metadata__": ' + metadata_text(n) + \
           ', "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}'
    return raw_file(d / "m.safetensors", text + " " * (-len(text) % 8), bytes(8))


def safetensors_with_tensors(d, n):
    header, data = tiny_tensors(n)
    h = header_bytes(header)
    p = d / "t.safetensors"
    p.write_bytes(struct.pack("<Q", len(h)) + h + data)
    return p


def shards_with_index(d, n):
    """Two shards of n/2 tensors each and an index naming all n, some twice."""
    header, _ = tiny_tensors(n)
    names = list(header)
    weight_map = {}
    for s, part in enumerate((names[: n // 2], names[n // 2:])):
        sub, at = {}, 0
        for name in part:
            sub[name] = {"dtype": "F32", "shape": [1], "data_offsets": [at, at + 4]}
            at += 4
            weight_map[name] = f"model-{s}.safetensors"
        h = header_bytes(sub)
        (d / f"model-{s}.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + bytes(at))
    index = {"metadata": {"total_size": 4 * n}, "weight_map": weight_map}
    p = d / "model.safetensors.index.json"
    p.write_text(json.dumps(index))
    return p


def gguf_file(d, keys, tensors):
    import gguf
    w = gguf.GGUFWriter(str(d / "m.gguf"), "llama")
    for i in range(keys):
        w.add_string(f"test.key.{i}", f"value {i}")
    for i in range(tensors):
        w.add_tensor(f"blk.{i}.w", np.zeros(1, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return d / "m.gguf"


def npz_file(d, n):
    p = d / "m.npz"
    np.savez(p, **{f"a{i}": np.zeros(1, dtype=np.float32) for i in range(n)})
    return p


# --- the cases --------------------------------------------------------------------------------

def test_safetensors_metadata_keys(tmp_path):
    """Many __metadata__ keys: comparing each with every earlier one would be quadratic."""
    assert_linear(tmp_path, safetensors_with_metadata, 20000, ("ls", "convert", "pack"))


def test_safetensors_tensors(tmp_path):
    assert_linear(tmp_path, safetensors_with_tensors, 10000, ("ls", "convert", "pack"))


def test_shard_index_weight_map(tmp_path):
    """Many weight_map entries: a linear lookup per tensor would be quadratic."""
    assert_linear(tmp_path, shards_with_index, 10000, ("ls", "convert", "pack"))


def test_gguf_keys(tmp_path):
    """1M GGUF keys made the synthesized safetensors header hang (a lookup per key)."""
    assert_linear(tmp_path, lambda d, n: gguf_file(d, n, 1), 10000, ("ls", "convert", "pack"))


def test_gguf_tensors(tmp_path):
    assert_linear(tmp_path, lambda d, n: gguf_file(d, 1, n), 5000, ("ls", "convert", "pack"))


def test_npz_members(tmp_path):
    assert_linear(tmp_path, npz_file, 2000, ("ls", "pack"))


DCP_WRITER = Path(__file__).with_name("dcp_writer.py")


def shared_archive(how, name):
    """make(dir, n) for dcp_writer.py HOW: n records naming one torch.save archive whose
    data.pkl grows with them (500 bytes a record), so the input is 10x at 10x the records."""
    def make(d, n):
        out = d / name
        subprocess.run([str(a) for a in (TORCH2, DCP_WRITER, how, out, n, 500 * n)], check=True,
                       capture_output=True, timeout=300)
        return out
    return make


@pytest.mark.parametrize("how,name", [("shared", "dcp"), ("shared_pt2", "m.pt2")])
def test_records_naming_one_archive(tmp_path, how, name):
    """DCP chunk records, or .pt2 use_pickle weights, that all name one archive: it is parsed
    once, not once per record."""
    need_torch2()
    assert_linear(tmp_path, shared_archive(how, name), 200, ("ls", "convert"))


def test_pack_entries(tmp_path):
    def pack_of(d, n):
        subprocess.run([ckpt_bin(), "pack", safetensors_with_tensors(d, n), d / "m.pack"],
                       check=True, capture_output=True)
        return d / "m.pack"
    assert_linear(tmp_path, pack_of, 10000, ("ls", "convert"))


@pytest.mark.parametrize("shape", ["metadata", "index"])
def test_a_repeated_key_keeps_its_last_value_as_json_loads(tmp_path, shape):
    """A key written twice in __metadata__ (or in an index file's metadata or weight_map) reads
    as json.loads reads it: the last value, where the key first appears."""
    if shape == "metadata":
        text = '{"__metadata__": {"a": "1", "b": "2", "a": "3", "c": "4", "b": "5"}, ' \
               '"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}'
        src = raw_file(tmp_path / "m.safetensors", text + " " * (-len(text) % 8), bytes(8))
        want = json.loads(text)["__metadata__"]
    else:
        header, _ = tiny_tensors(4)
        for s, names in enumerate((list(header)[:2], list(header)[2:])):
            sub = {k: dict(header[k], data_offsets=[4 * i, 4 * i + 4])
                   for i, k in enumerate(names)}
            h = header_bytes(sub)
            (tmp_path / f"s{s}.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + bytes(8))
        # layers.0.w named twice: first in the wrong shard, last in its own
        text = '{"metadata": {"x": "1", "x": "2"}, "weight_map": {' \
               '"layers.0.w": "s1.safetensors", "layers.1.w": "s0.safetensors", ' \
               '"layers.2.w": "s1.safetensors", "layers.3.w": "s1.safetensors", ' \
               '"layers.0.w": "s0.safetensors"}}'
        src = tmp_path / "model.safetensors.index.json"
        src.write_text(text)
        want = json.loads(text)["metadata"]
    p = subprocess.run([ckpt_bin(), "ls", src, "--json"], capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)["metadata"]
    assert got == want and list(got) == list(want), (got, want)


# --- the daemon's memory: per tensor, per metadata byte ----------------------------------------

def daemon_kib(mnt):
    import netlab
    return netlab.daemon_peak_rss_kib(mnt, "VmRSS")


def mounted_costs(mount, src):
    """(KiB resident after the mount and index.json, KiB after both virtual files too)."""
    with mount(src) as mnt:
        (mnt / ".ckptfs" / "index.json").read_bytes()
        after_mount = daemon_kib(mnt)
        for name in ("checkpoint.safetensors", "checkpoint.pack"):
            (mnt / ".ckptfs" / name).stat()
        return after_mount, daemon_kib(mnt)


@pytest.fixture
def unsanitized():
    import netlab
    if netlab.sanitized():
        pytest.skip("an ASan build's shadow memory and quarantine are not the daemon's")


def test_daemon_memory_per_tensor(tmp_path, mount, unsanitized):
    """docs/SEMANTICS.md, "Memory": at most 512 bytes per tensor once mounted (index entry,
    name, tree, index.json) and 1,024 with both virtual files made; measured as the slope
    between two sizes, so that what every mount holds anyway cancels out. The parse's JSON
    tree (several times the header) is given back: 1M tensors held 884 MiB."""
    small, big = 20000, 100000
    costs = []
    for n in (small, big):
        d = tmp_path / str(n)
        d.mkdir()
        costs.append(mounted_costs(mount, safetensors_with_tensors(d, n)))
    per_tensor = [(costs[1][k] - costs[0][k]) * 1024 / (big - small) for k in (0, 1)]
    print(f"bytes per tensor: {per_tensor}")
    assert per_tensor[0] <= 512, per_tensor
    assert per_tensor[1] <= 1024, per_tensor


def test_gguf_metadata_is_held_once(tmp_path, mount, unsanitized):
    """A GGUF key's JSON text is held once (its metadata and its value file share it) plus once
    as index.json's text: the mount's memory grows by at most 2.5 bytes per byte of that text
    (a copy of its own for the value file would take it to 3)."""
    import gguf
    texts, costs = [], []
    for n in (1 << 19, 5 << 19):
        d = tmp_path / str(n)
        d.mkdir()
        w = gguf.GGUFWriter(str(d / "m.gguf"), "llama")
        w.add_array("test.flags", [i % 3 == 0 for i in range(n)])
        w.add_tensor("w", np.zeros(4, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        p = subprocess.run([ckpt_bin(), "ls", d / "m.gguf", "--json"], capture_output=True,
                           timeout=120, check=True)
        texts.append(len(p.stdout))  # the key's JSON text, and a little that both sizes share
        costs.append(mounted_costs(mount, d / "m.gguf")[0])
    per_byte = (costs[1] - costs[0]) * 1024 / (texts[1] - texts[0])
    print(f"bytes per text byte: {per_byte:.2f}")
    assert per_byte <= 2.5, per_byte


# --- files per checkpoint: the source checks of a mount ---------------------------------------

STAT_CALLS = ("fstat", "newfstatat", "statx", "stat", "lstat")


def dcp_of_files(d, n):
    """A DCP checkpoint of n tensors, each in a .distcp file of its own, written by torch 2.x
    (dcp_writer.py files: what a job of n ranks leaves, from one process)."""
    need_torch2()
    from test_dcp import WRITER
    subprocess.run([str(TORCH2), str(WRITER), "files", str(d / "ckpt"), str(n)], check=True,
                   capture_output=True, timeout=600)
    return d / "ckpt"


def stat_calls_reading_every_tensor(src, mnt, log):
    """The stat-family system calls (strace -c -f counts them) of a foreground daemon mounting
    src on mnt, serving an open and a read of every tensor file, and unmounting."""
    import shutil
    from ckptfs_testlib import ckptfs_bin, is_mounted, unmount, wait_until
    assert shutil.which("strace"), "strace is missing (scripts/setup installs it)"
    p = subprocess.Popen(["strace", "-f", "-c", "-o", str(log), "-e",
                          "trace=" + ",".join(STAT_CALLS), str(ckptfs_bin()), "-f", str(src),
                          str(mnt)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert wait_until(lambda: is_mounted(mnt) or p.poll() is not None, timeout=120)
        index = json.loads((mnt / ".ckptfs" / "index.json").read_text())
        for t in index["tensors"]:
            (mnt / t["path"]).read_bytes()
    finally:
        unmount(mnt)
        try:
            p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    assert p.returncode == 0, p.stderr.read().decode(errors="replace")
    # strace's table, written once the daemon it traced is gone: "% time, seconds,
    # usecs/call, calls, [errors,] syscall" a row
    return sum(int(row.split()[3]) for row in log.read_text().splitlines()
               if row.split() and row.split()[-1] in STAT_CALLS)


def test_dcp_files_read_through_a_mount(tmp_path, mountpoint):
    """An open and a read check only the files that tensor's bytes come from, not every source
    file (which would make reading every tensor of an N-file DCP cost 2N^2 fstat and stat
    calls): 10x the files, at most RATIO x the calls (counted, not timed)."""
    counts = []
    for n in (30, 300):
        d = tmp_path / str(n)
        d.mkdir()
        counts.append(stat_calls_reading_every_tensor(dcp_of_files(d, n), mountpoint,
                                                      d / "strace.txt"))
    ratio = counts[1] / max(counts[0], 1)
    print(f"stat calls: {counts}")
    assert ratio <= RATIO, f"stat calls: 30 files {counts[0]}, 300 files {counts[1]}: {ratio:.1f}x"


def big_bool_gguf(d, flags):
    """A GGUF (gguf-py) whose one key is the bool array flags."""
    import gguf
    w = gguf.GGUFWriter(str(d / "m.gguf"), "llama")
    w.add_array("test.flags", flags)
    w.add_tensor("w", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return d / "m.gguf"


# Runs ARGV and prints its peak resident KiB: a small process of its own, as a child forked from
# the test's (large) one would report the test's peak as its own.
PEAK_OF = """import os, resource, subprocess, sys
with open(sys.argv[1], "wb") as out:
    rc = subprocess.run(sys.argv[2:], stdout=out).returncode
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"""


def peak_kib_of(args, out):
    """Peak resident KiB of `ckpt ARGS` (stdout into out), which must succeed."""
    import sys
    p = subprocess.run([sys.executable, "-c", PEAK_OF, str(out), ckpt_bin(), *map(str, args)],
                       capture_output=True, text=True, check=True)
    rc, peak = map(int, p.stdout.split())
    assert rc == 0, p.stderr
    return peak


def big_bool_case(tmp_path):
    """Issue 39's hostile GGUF (one 16 Mi-item bool array: a 16.8 MB file whose key is ~95 MB
    of JSON text), its flags, and the memory bound: 8x the file + 64 MiB, in KiB."""
    flags = [i % 3 == 0 for i in range(16 << 20)]
    src = big_bool_gguf(tmp_path, flags)
    return src, flags, (8 * src.stat().st_size + (64 << 20)) // 1024


def test_gguf_metadata_memory_is_bounded_by_the_file(tmp_path, mount, unsanitized):
    """A 16.8 MB GGUF of one 16 Mi-item bool array, whose key renders as ~95 MB of JSON text:
    the text is written once into the index and index.json lends it, so the daemon's peak
    (VmHWM) doing what a user does (ls -R, cat index.json, cat the key's value file), and
    `ckpt ls --json`'s, stay within 8x the file + 64 MiB. The values are the ones gguf-py
    wrote."""
    import netlab
    src, flags, bound_kib = big_bool_case(tmp_path)
    peak = peak_kib_of(["ls", src, "--json"], tmp_path / "ls.json")
    assert peak <= bound_kib, f"ckpt ls --json: peak {peak} KiB, bound {bound_kib} KiB"
    assert json.loads((tmp_path / "ls.json").read_bytes())["metadata"]["test.flags"] == \
        {"type": "ARRAY", "item_type": "BOOL", "value": flags}
    with mount(src) as mnt:
        subprocess.run(["ls", "-R", str(mnt)], check=True, capture_output=True)
        index = json.loads((mnt / ".ckptfs" / "index.json").read_bytes())
        assert index["metadata"]["test.flags"]["value"] == flags
        del index
        assert json.loads((mnt / "__metadata__" / "test" / "flags").read_bytes()) == flags
        peak = netlab.daemon_peak_rss_kib(mnt)
    assert peak <= bound_kib, f"the daemon: peak {peak} KiB, bound {bound_kib} KiB"


def test_gguf_metadata_in_the_virtual_files_is_lent(tmp_path, mount, unsanitized):
    """Issue 39: the virtual safetensors and pack of that GGUF carry the key's JSON text in their
    headers; built as one copy each, stat and a read of both peaked the daemon at 466 MiB. Their
    headers now lend the index's text: stat and a full read of each stay within 8x the file +
    64 MiB. The safetensors file is read by the safetensors library (the metadata's value is
    the key's typed JSON, holding the flags gguf-py wrote); the pack is the bytes `ckpt pack`
    writes, which stays within the bound as well."""
    import netlab
    from safetensors import safe_open
    src, flags, bound_kib = big_bool_case(tmp_path)
    peak = peak_kib_of(["pack", src, tmp_path / "m.pack"], tmp_path / "pack.out")
    assert peak <= bound_kib, f"ckpt pack: peak {peak} KiB, bound {bound_kib} KiB"
    with mount(src) as mnt:
        for name in ("checkpoint.safetensors", "checkpoint.pack"):
            (mnt / ".ckptfs" / name).stat()
        with safe_open(str(mnt / ".ckptfs" / "checkpoint.safetensors"), "np") as f:
            assert json.loads(f.metadata()["test.flags"])["value"] == flags
            assert f.get_tensor("w").tolist() == [0.0] * 4
        assert (mnt / ".ckptfs" / "checkpoint.pack").read_bytes() == \
            (tmp_path / "m.pack").read_bytes()
        peak = netlab.daemon_peak_rss_kib(mnt)
    assert peak <= bound_kib, f"the daemon: peak {peak} KiB, bound {bound_kib} KiB"


def test_gguf_metadata_memory_of_info_and_convert(tmp_path, unsanitized):
    """Issue 39: `ckpt info` parsed each metadata value into a cJSON tree (~1.4 GB for that
    GGUF's 16 Mi bools). Now it reads the held text: the text shows the array's count, kind and
    first items, --json the value exactly as index.json has it; `ckpt convert` to safetensors
    (the virtual file's header) as well. Each within 8x the file + 64 MiB."""
    from safetensors import safe_open
    src, flags, bound_kib = big_bool_case(tmp_path)
    shown = "[16777216 booleans: true, false, false, \u2026]"
    for args, out in ((["info", src], "info.txt"), (["info", src, "--json"], "info.json"),
                      (["convert", src, tmp_path / "m.safetensors"], "convert.out")):
        peak = peak_kib_of(args, tmp_path / out)
        assert peak <= bound_kib, f"ckpt {args[0]}: peak {peak} KiB, bound {bound_kib} KiB"
    assert f"  test.flags: {shown}" in (tmp_path / "info.txt").read_text().splitlines()
    info = json.loads((tmp_path / "info.json").read_bytes())
    assert info["metadata"]["test.flags"] == {"type": "ARRAY", "item_type": "BOOL", "value": flags}
    with safe_open(str(tmp_path / "m.safetensors"), "np") as f:
        assert json.loads(f.metadata()["test.flags"])["value"] == flags



# --- deflated .npz members: what opening one costs ---------------------------------------------

SAME_INPUT_RATIO = 3  # the same compressed input, 128x its output: at most this many times the cost
EMPTY_STORED = b"\x00\x00\x00\xff\xff"  # an empty stored block, from a byte boundary: 5 bytes
EMPTY_FIXED_THEN_STORED = b"\x02\x00\x00\x00\xff\xff"  # an empty fixed-code block, then one
EMPTY_FINAL = b"\x03\x00"  # an empty fixed-code block that ends the stream


def zero_head(nbytes):
    """The .npy header of nbytes zeros, float32 (the data not included)."""
    from test_hostile import npy_bytes
    return npy_bytes(f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({nbytes // 4},), }}",
                     b"")


def zero_stream(head, nzeros):
    """head then nzeros zero bytes, deflated raw by zlib and flushed to a byte boundary."""
    import zlib
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    out, chunk, left = [c.compress(head)], bytes(1 << 20), nzeros
    while left:
        out.append(c.compress(chunk[:min(left, len(chunk))]))
        left -= min(left, len(chunk))
    return b"".join(out) + c.flush(zlib.Z_SYNC_FLUSH)


def npz_of_zeros(d, members, nbytes, csize):
    """An .npz of `members` members, each an .npy of nbytes zeros deflated into exactly csize
    bytes, through test_hostile's zip writer: zero_stream, then empty blocks (no output: 5 or 6
    bytes each) and an empty last block. Two such archives of different output sizes differ
    only in their streams' ends, past every header."""
    import zlib
    from test_hostile import zip_of
    head = zero_head(nbytes)
    crc, left, chunk = zlib.crc32(head), nbytes, bytes(1 << 24)
    while left:
        crc = zlib.crc32(chunk[:min(left, len(chunk))], crc)
        left -= min(left, len(chunk))
    body = zero_stream(head, nbytes)
    pad = csize - len(body) - len(EMPTY_FINAL)
    sixes = next(b for b in range(5) if pad - 6 * b >= 0 and (pad - 6 * b) % 5 == 0)
    raw = body + EMPTY_FIXED_THEN_STORED * sixes + EMPTY_STORED * ((pad - 6 * sixes) // 5) + \
        EMPTY_FINAL
    assert len(raw) == csize
    p = d / "m.npz"
    p.write_bytes(zip_of([dict(name=f"w{i}.npy", raw=raw, method=8, size=len(head) + nbytes,
                               crc=crc) for i in range(members)]))
    return p


def daemon_costs(src, mnt):
    """(CPU seconds, peak resident KiB) of a foreground daemon that mounts src on mnt, serves
    index.json and a stat of every tensor file, and unmounts: its own rusage (wait4) and its
    VmHWM (ru_maxrss would count the test's memory, which the child had before its exec)."""
    from ckptfs_testlib import ckptfs_bin, is_mounted, unmount, wait_until
    p = subprocess.Popen([str(ckptfs_bin()), "-f", str(src), str(mnt)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert wait_until(lambda: is_mounted(mnt) or p.poll() is not None, timeout=300)
        index = json.loads((mnt / ".ckptfs" / "index.json").read_bytes())
        for t in index["tensors"]:
            (mnt / t["path"]).stat()
        status = Path(f"/proc/{p.pid}/status").read_text()
        peak = next(int(line.split()[1]) for line in status.splitlines()
                    if line.startswith("VmHWM:"))
    finally:
        unmount(mnt)
    _, rc, ru = os.wait4(p.pid, 0)
    assert rc == 0, p.stderr.read().decode(errors="replace")
    return ru.ru_utime + ru.ru_stime, peak


def test_npz_deflated_members_cost_their_input_not_their_output(tmp_path, mountpoint):
    """Opening an .npz reads each deflated member's header, not its whole stream: two archives
    of the same compressed size, whose members inflate to 2 MiB and to 256 MiB of zeros (the
    second 128x the first), cost the same to list (`ckpt ls --json`, `ckpt info`) and to
    mount (the daemon's CPU time and peak memory: no seek point made before a read needs it).
    A pass over every stream at open costs ~128x, and its seek points ~1 MiB a member."""
    small, big = 2 << 20, 256 << 20
    csize = len(zero_stream(zero_head(big), big)) + 64  # room for either stream
    srcs = []
    for n in (small, big):
        d = tmp_path / str(n)
        d.mkdir()
        srcs.append(npz_of_zeros(d, 4, n, csize))
    assert srcs[0].stat().st_size == srcs[1].stat().st_size
    with np.load(srcs[0]) as z:  # the builder writes what numpy reads
        assert all(not z[k].any() and z[k].nbytes == small for k in z.files)
    for args in (["ls", "--json"], ["info"]):
        costs = [cpu_seconds([args[0], src, *args[1:]]) for src in srcs]
        ratio = costs[1] / max(costs[0], 1e-3)
        assert ratio <= SAME_INPUT_RATIO, f"ckpt {args[0]}: {costs}: {ratio:.1f}x"
    mounted = [[daemon_costs(src, mountpoint) for _ in range(RUNS)] for src in srcs]
    cpu = [statistics.median(c for c, _ in runs) for runs in mounted]
    peak = [statistics.median(k for _, k in runs) for runs in mounted]
    print(f"daemon CPU {cpu} s, peak {peak} KiB")
    assert cpu[1] / max(cpu[0], 1e-3) <= SAME_INPUT_RATIO, cpu
    assert peak[1] - peak[0] <= 1024, f"peak KiB {peak}: seek points made at open?"


FILL_CHILD = r"""
import sys
import time
import torch
import ckload_vllm
n, path = int(sys.argv[1]), sys.argv[2]

class Flat(torch.nn.Module):
    # n parameters, each copied whole from its tensor: every one is placed, and each copy asks
    # the recorder which copies before it the target overlaps
    def __init__(self):
        super().__init__()
        self.ps = torch.nn.ParameterList(torch.nn.Parameter(torch.empty(16)) for _ in range(n))

    def load_weights(self, weights):
        done = set()
        for name, w in weights:
            self.ps[int(name[1:])].data.copy_(w)
            done.add(f"ps.{name[1:]}")
        return done

m = Flat()
t = time.process_time()
placed, _, streamed = ckload_vllm.fill(m, path)
assert (placed, streamed) == (n, 0), (placed, streamed)
print(time.process_time() - t)
"""


def test_vllm_placement_of_many_tensors(tmp_path):
    """The vLLM format's recorder (ckload_vllm.fill) on a model of n parameters, each copied
    whole: 10x the tensors costs at most RATIO times the CPU time of the fill (measured in the
    child, after its imports). A scan of every recorded copy at each op is quadratic (a
    DeepSeek-V3-sized model has 92k tensors)."""
    from safetensors.torch import save_file
    import torch
    cost = {}
    for n in (SMALL_FILL, 10 * SMALL_FILL):
        path = tmp_path / f"m{n}.safetensors"
        save_file({f"w{i}": torch.full((16,), float(i)) for i in range(n)}, str(path))
        times = []
        for _ in range(RUNS):
            p = subprocess.run([sys.executable, "-c", FILL_CHILD, str(n), str(path)],
                               capture_output=True, text=True, timeout=600)
            assert p.returncode == 0, p.stderr
            times.append(float(p.stdout.split()[-1]))
        cost[n] = statistics.median(times)
    assert cost[10 * SMALL_FILL] <= RATIO * cost[SMALL_FILL], cost
