"""Random reads through a URL mount: byte-exact against independent readers
of the local file (the safetensors library, torch.load) at offsets that cross the client's 4 MiB
blocks and the tensors' ends, and, from nginx's own access log, the sizes of what a random read
fetches: the pages around it within its tensor, not whole blocks.

The server is netlab's nginx on 127.0.0.1."""
import json
import os
import random

import pytest
import torch

import netlab
from ckptfs_testlib import flatten, library_view, write_safetensors

BLOCK = 4 << 20  # blockcache.h's BC_BLOCK: the cache's unit, which random reads do not fetch whole
PAGE = 64 << 10  # blockcache.h's BC_PAGE: a fetch ends at most this far past its tensor's end
READ = 64 << 10  # each random read


def tensors(seed):
    """(name, dtype, shape, bytes): tensors of 1-9 MiB and odd sizes, so that blocks hold the
    ends of several and tensors span blocks."""
    rng = random.Random(seed)
    out = []
    for i in range(8):
        rows = rng.randrange(300, 2300)
        out.append((f"layer.{i}.w", "F32", [rows, 1024 + i], rng.randbytes(rows * (1024 + i) * 4)))
        out.append((f"layer.{i}.b", "F16", [rows + i], rng.randbytes((rows + i) * 2)))
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("served")
    write_safetensors(d / "model.safetensors", tensors(17))
    gen = torch.Generator().manual_seed(17)
    sd = {f"w{i}": torch.randn(700 + 300 * i, 1031, generator=gen) for i in range(5)}
    sd["wt"] = torch.randn(1024, 1500, generator=gen).t()  # strided: a view of its storage
    sd["b"] = torch.randn(77, generator=gen)
    torch.save(sd, d / "model.pt")
    return d


@pytest.fixture(scope="module")
def server(served):
    with netlab.Nginx(served) as srv:
        yield srv


def expected(served, name):
    """{tensor name: its row-major bytes} from the independent reader of the local file."""
    if name.endswith(".safetensors"):
        return {n: v[2] for n, v in library_view(served / name)[0].items()}
    return {n: v[3] for n, v in flatten(torch.load(served / name, map_location="cpu", weights_only=False)).items()}


def pread(path, n, at):
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, n, at)
    finally:
        os.close(fd)


@pytest.mark.parametrize("name", ["model.safetensors", "model.pt"])
def test_random_reads_are_byte_exact(server, served, mount, name):
    want = expected(served, name)
    rng = random.Random(3)
    with mount(server.url(name)) as mnt:
        index = json.loads((mnt / ".ckptfs" / "index.json").read_bytes())
        paths = {t["name"]: mnt / t["path"] for t in index["tensors"]}
        assert set(paths) == set(want)
        names = sorted(want)
        for _ in range(300):
            n = rng.choice(names)
            data = want[n]
            size = rng.choice([1, 4095, READ, 300_000, 1 << 20, 5 << 20])
            at = rng.randrange(0, max(1, len(data)))
            assert pread(paths[n], size, at) == data[at:at + size], (n, at, size)
        # Every tensor's last and first bytes: where a fetch stops at the tensor's end.
        for n in names:
            data = want[n]
            tail = max(0, len(data) - 70_000)
            assert pread(paths[n], 70_000, tail) == data[tail:], n
            assert pread(paths[n], 5000, 0) == data[:5000], n


def header_end(path):
    with open(path, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


def test_random_reads_fetch_pages_not_blocks(server, served, mount):
    """Reads of 64 KiB far apart (random to the client) each fetch well under a block, and a read
    near a tensor's end fetches nothing past the page that holds the end."""
    src = served / "model.safetensors"
    base = header_end(src)
    with open(src, "rb") as f:
        f.seek(8)
        header = json.loads(f.read(base - 8))
    spans = sorted((base + v["data_offsets"][0], base + v["data_offsets"][1], k)
                   for k, v in header.items() if k != "__metadata__")
    big = [s for s in spans if s[1] - s[0] >= 2 << 20]
    rng = random.Random(5)
    with mount(server.url("model.safetensors")) as mnt:
        index = json.loads((mnt / ".ckptfs" / "index.json").read_bytes())
        rel = {t["name"]: t["path"] for t in index["tensors"]}
        mark = server.mark()
        # One read in the middle of every other large tensor: each more than a block from the last.
        picked = big[::2]
        for start, end, n in picked:
            at = rng.randrange(0, end - start - READ)
            assert len(pread(mnt / rel[n], READ, at)) == READ
        reqs = server.requests(since=mark)
        assert reqs, "the reads reached the server"
        assert all(r["body_bytes"] < BLOCK for r in reqs), reqs
        assert netlab.body_bytes(reqs) <= len(picked) * (1 << 20), reqs
    # Near a tensor's end, on a fresh mount: the fetch stops within a page of it (without the
    # tensors' boundaries it would run a floor's worth into the next tensor).
    start, end, n = big[1]
    with mount(server.url("model.safetensors")) as mnt:
        mark = server.mark()
        assert len(pread(mnt / rel[n], 4096, end - start - 8192)) == 4096
        reqs = server.requests(since=mark)
        assert len(reqs) == 1, reqs
        last = int(reqs[0]["range"].split("-")[1])
        assert last < (end + PAGE - 1) // PAGE * PAGE, (reqs, end)
