"""Reads of a URL mount answered in place, straight from the daemon's cached blocks:
exact bytes wherever a read falls against the 4 MiB blocks (inside one, across two, several,
the object's head), many readers at once through a cache of two blocks (blocks held by replies
are never evicted under them), and a changed object failing reads even of blocks already
cached. Every byte is compared with the file nginx serves, read locally.

The servers are netlab's (127.0.0.1 only); every read runs in a child process with a timeout."""
import json
import os
import random
import subprocess
import sys

import pytest

import netlab
from ckptfs_testlib import read_index, write_safetensors

NAME = "model.safetensors"
BLOCK = 4 << 20  # blockcache.h BC_BLOCK: where the daemon's cache cuts the object
PAGE = 64 << 10  # blockcache.h BC_PAGE: a block's unit of fill
FLOOR = 256 << 10  # blockcache.h BC_FLOOR: a random miss's fetch, at least
READ_TIMEOUT = 120

# A child process: reads (path, offset, length) spans with pread on THREADS threads, each span
# ROUNDS times, and prints {"i": [sha256 hex or errno name, ...]} (one entry per round).
_PREADER = r"""
import concurrent.futures, errno, hashlib, json, os, sys
spans, threads, rounds = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def one(i):
    path, off, n = spans[i]
    out = []
    for _ in range(rounds):
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                data = os.pread(fd, n, off)
            finally:
                os.close(fd)
            out.append(hashlib.sha256(data).hexdigest())
        except OSError as e:
            out.append(errno.errorcode.get(e.errno, str(e.errno)))
    return out
with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    print(json.dumps(dict(zip(map(str, range(len(spans))), pool.map(one, range(len(spans)))))))
"""


def preads(spans, threads=1, rounds=1):
    """[[sha256 or errno name] * rounds] for each (path, offset, length) span."""
    p = subprocess.run([sys.executable, "-S", "-c", _PREADER,
                        json.dumps([(str(a), o, n) for a, o, n in spans]), str(threads),
                        str(rounds)], env=netlab.plain_env(), capture_output=True,
                       timeout=READ_TIMEOUT)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    got = json.loads(p.stdout)
    return [got[str(i)] for i in range(len(spans))]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(served directory, {tensor name: (absolute offset, bytes)}): a small tensor, then one of
    13 MiB + 3 bytes starting at an offset no block boundary shares, then a small one in its
    last block: reads of the big one cross three block boundaries."""
    d = tmp_path_factory.mktemp("served")
    rng = random.Random(17)
    tensors = [("a.small", "U8", [4099], rng.randbytes(4099)),
               ("b.big", "U8", [(13 << 20) + 3], rng.randbytes((13 << 20) + 3)),
               ("c.tail", "U8", [777], rng.randbytes(777))]
    path = write_safetensors(d / NAME, tensors)
    data = path.read_bytes()
    body = 8 + int.from_bytes(data[:8], "little")
    header = json.loads(data[8:body])
    return d, {n: (body + header[n]["data_offsets"][0],
                   data[body + header[n]["data_offsets"][0]:body + header[n]["data_offsets"][1]])
               for n in header if n != "__metadata__"}


@pytest.fixture(scope="module")
def server(served):
    with netlab.Nginx(served[0]) as srv:
        yield srv


def spans_around_blocks(path, start, data):
    """(path, offset, length) reads of a tensor file whose bytes start at absolute offset start:
    at, just before and just after every block boundary inside it, of sizes from one byte to
    more than two blocks, the ends included."""
    out = []
    for k in range(start // BLOCK + 1, (start + len(data)) // BLOCK + 1):
        edge = k * BLOCK - start
        for n in (1, 4096, 65536, 1 << 20, 3 << 20, 2 * BLOCK + 5):
            for off in (edge - n, edge - n // 2, edge - 1, edge, edge + 1):
                if 0 <= off < len(data):
                    out.append((path, off, n))
    out += [(path, 0, len(data)), (path, len(data) - 1, 10), (path, len(data), 10)]
    return out


def want(data, spans):
    return [netlab.sha256(data[off:off + n]) for _, off, n in spans]


@pytest.mark.parametrize("options", [["direct_io"], []], ids=["direct_io", "page-cache"])
def test_reads_across_blocks_are_exact(server, served, mount, options):
    """Through the mount with direct_io (the daemon answers each read as asked: one block, two,
    several) and through the page cache (the kernel's own request sizes): every span's bytes
    are the file's."""
    _, tensors = served
    with mount(server.url(NAME), options=options) as mnt:
        paths = {t["name"]: mnt / t["path"] for t in read_index(mnt)["tensors"]}
        spans, expect = [], []
        for name, (start, data) in tensors.items():
            s = spans_around_blocks(paths[name], start, data)
            spans += s
            expect += want(data, s)
        got = preads(spans)
    assert [g[0] for g in got] == expect


def test_many_readers_through_a_two_block_cache(server, served, mount):
    """Eight threads at once, each span read three times, through `-o cache_mem=8M` (two blocks):
    the replies hold blocks while others are fetched and evicted around them; every read still
    gives the file's bytes, and the daemon lives on."""
    _, tensors = served
    start, data = tensors["b.big"]
    rng = random.Random(5)
    with mount(server.url(NAME), options=["cache_mem=8M", "direct_io"]) as mnt:
        path = next(mnt / t["path"] for t in read_index(mnt)["tensors"] if t["name"] == "b.big")
        spans = []
        for _ in range(96):
            n = rng.choice([1, 4096, 1 << 20, (1 << 20) + 7, BLOCK + 1])
            spans.append((path, rng.randrange(0, len(data) - n + 1), n))
        got = preads(spans, threads=8, rounds=3)
        assert got == [[h] * 3 for h in want(data, spans)]
        assert preads([(path, 0, 16)]) == [[netlab.sha256(data[:16])]]


def test_changed_object_fails_reads_of_cached_blocks(served, mount, tmp_path):
    """The object replaced after a read cached its blocks: once a request sees the change,
    reads fail with EIO, those the cache could still answer from the old bytes included."""
    d = tmp_path / "served"
    d.mkdir()
    (d / NAME).write_bytes((served[0] / NAME).read_bytes())
    start, data = served[1]["b.big"]
    with netlab.Nginx(d) as srv, mount(srv.url(NAME), options=["direct_io"]) as mnt:
        path = next(mnt / t["path"] for t in read_index(mnt)["tensors"] if t["name"] == "b.big")
        # One child, the file open throughout (a new open would fail with ESTALE): it reads
        # the span on each line of its input.
        child = subprocess.Popen([sys.executable, "-S", "-c", _STEPS, str(path)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 env=netlab.plain_env())
        try:
            def step(off, n):
                child.stdin.write(f"{off} {n}\n")
                child.stdin.flush()
                return child.stdout.readline().strip()

            assert step(0, 1 << 20) == netlab.sha256(data[:1 << 20])  # cached, and ahead
            whole = (d / NAME).read_bytes()
            netlab.replace_file(d / NAME, whole[:start] + bytes(b ^ 0x5A for b in whole[start:]))
            # Past the readahead: a new request, which sees the change.
            assert step(len(data) - 4096, 4096) == "EIO"
            assert step(0, 1 << 20) == "EIO"
            assert step(4096, 4096) == "EIO"
        finally:
            child.stdin.close()
            child.wait(timeout=READ_TIMEOUT)


# A child process: opens argv[1], then for each input line "OFFSET LENGTH" prints the sha256 of
# that pread, or its errno name.
_STEPS = r"""
import errno, hashlib, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
for line in sys.stdin:
    off, n = map(int, line.split())
    try:
        print(hashlib.sha256(os.pread(fd, n, off)).hexdigest(), flush=True)
    except OSError as e:
        print(errno.errorcode.get(e.errno, str(e.errno)), flush=True)
"""


def test_random_read_across_two_blocks_fetches_those_two(server, served, mount):
    """A read far from the last, across a block boundary, is random: it is lent a block at a
    time, and its second piece must not pass for a sequential read and start a readahead. Two
    requests, not three: the first block's last page, and the second block's pages up to the
    random floor (256 KiB from the read's start, the tensor going on past it)."""
    _, tensors = served
    start, data = tensors["b.big"]
    with mount(server.url(NAME), options=["direct_io"]) as mnt:
        path = next(mnt / t["path"] for t in read_index(mnt)["tensors"] if t["name"] == "b.big")
        edge = 2 * BLOCK - start  # a block boundary with a block of the object after the next
        mark = server.mark()
        got = preads([(path, edge - 4096, 8192)])
        reqs = server.requests(since=mark)
    floor = (edge - 4096 + start + FLOOR + PAGE - 1) // PAGE * PAGE  # whole pages
    assert {r["range"] for r in reqs} == {f"bytes={2 * BLOCK - PAGE}-{2 * BLOCK - 1}",
                                          f"bytes={2 * BLOCK}-{floor - 1}"}, reqs
    assert len(reqs) == 2, reqs
    assert got == [[netlab.sha256(data[edge - 4096:edge + 4096])]]
