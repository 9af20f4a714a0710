"""The disk cache of URL sources (`-o cache_dir=DIR,cache_max=SIZE`, CKPTFS_CACHE_DIR and
CKPTFS_CACHE_MAX): mounts and loads by URL served by nginx on loopback, every tensor's bytes
against the safetensors library's reading of the local file, and what each mount cost from
nginx's own access log: a second mount reads from DIR, a changed object does not, a damaged
DIR is a miss, never wrong bytes, DIR stays within its bound, a presigned URL's signature
reaches no file in DIR, and a DIR that cannot be written still reads right.

The servers are netlab's (127.0.0.1 only); every read runs in a child process."""
import concurrent.futures
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

import netlab
from ckptfs_testlib import ckpt_bin, ckptfs_bin, library_view, read_index, write_safetensors

NAME = "model.safetensors"
OPEN_REQUESTS = 1  # a mount always asks for the head once: the size and validator to key by


@pytest.fixture
def served(tmp_path):
    """A served directory of the test's own (some tests replace its file): the ~12 MiB sample."""
    d = tmp_path / "served"
    d.mkdir()
    write_safetensors(d / NAME, netlab.sample_tensors())
    return d


@pytest.fixture
def server(served):
    with netlab.Nginx(served) as srv:
        yield srv


def want(path):
    """{tensor name: sha256} by the safetensors library."""
    tensors, _ = library_view(path)
    return {n: netlab.sha256(t[2]) for n, t in tensors.items()}


def read_all(mnt):
    """{tensor name: sha256} reading every tensor file of the mount (errors fail)."""
    paths = {t["name"]: mnt / t["path"] for t in read_index(mnt)["tensors"]}
    got = netlab.read_many(paths.values(), uncached=True)
    assert all(v[0] == "ok" for v in got.values()), got
    return {n: got[str(p)][1] for n, p in paths.items()}


def mounted_read(mount, server, url, options):
    """(every tensor's sha256, the requests the mount and its reads made)."""
    mark = server.mark()
    with mount(url, options=options) as mnt:
        got = read_all(mnt)
    return got, server.requests(since=mark)


def files(cache):
    return sorted(p for p in Path(cache).iterdir())


def dir_bytes(cache):
    return sum(p.stat().st_size for p in files(cache))


def test_second_mount_reads_from_disk(mount, server, served, tmp_path):
    cache = tmp_path / "cache"
    opts = [f"cache_dir={cache}"]
    first, reqs1 = mounted_read(mount, server, server.url(NAME), opts)
    assert first == want(served / NAME)
    assert len(reqs1) > OPEN_REQUESTS
    assert (cache.stat().st_mode & 0o777) == 0o700, "created private"
    assert files(cache), "blocks were stored"
    second, reqs2 = mounted_read(mount, server, server.url(NAME), opts)
    assert second == first
    assert len(reqs2) == OPEN_REQUESTS, reqs2


def test_ckpt_through_the_environment(server, served, tmp_path):
    cache = tmp_path / "cache"
    env = dict(os.environ, CKPTFS_CACHE_DIR=str(cache))
    tensors, _ = library_view(served / NAME)
    name = "embed.weight"
    for round_ in ("cold", "warm"):
        mark = server.mark()
        p = subprocess.run([str(ckpt_bin()), "cat", server.url(NAME), name], env=env,
                           capture_output=True, timeout=120)
        assert p.returncode == 0, p.stderr.decode()
        assert p.stdout == tensors[name][2], round_
        reqs = server.requests(since=mark)
        if round_ == "warm":
            assert len(reqs) == OPEN_REQUESTS, reqs


LOADER = """
import hashlib, json, sys, ckload, torch
got = ckload.load(sys.argv[1], device="cpu")
print(json.dumps({n: hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
                  .hexdigest() for n, t in got.items()}))
"""


def ckload_load(url, cache):
    """ckload.load(url) in a process of its own (the cache is configured on the first URL a
    process opens), with CKPTFS_CACHE_DIR=cache: {name: sha256}."""
    env = dict(os.environ, CKPTFS_CACHE_DIR=str(cache))
    p = subprocess.run(["/usr/bin/python3", "-c", LOADER, url], env=env, capture_output=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr.decode()
    return json.loads(p.stdout)


def test_ckload_load_cold_then_warm(server, served, tmp_path):
    cache = tmp_path / "cache"
    expect = want(served / NAME)
    assert ckload_load(server.url(NAME), cache) == expect
    mark = server.mark()
    assert ckload_load(server.url(NAME), cache) == expect
    assert len(server.requests(since=mark)) == OPEN_REQUESTS


def test_changed_object_does_not_use_old_blocks(mount, server, served, tmp_path):
    cache = tmp_path / "cache"
    opts = [f"cache_dir={cache}"]
    old, _ = mounted_read(mount, server, server.url(NAME), opts)
    data = (served / NAME).read_bytes()
    body = 8 + int.from_bytes(data[:8], "little")
    server.replace(NAME, data[:body] + bytes(b ^ 0x5A for b in data[body:]))  # new ETag
    new, reqs = mounted_read(mount, server, server.url(NAME), opts)
    assert new == want(served / NAME) and new != old
    assert len(reqs) > OPEN_REQUESTS, "the new object's blocks were fetched"


@pytest.mark.parametrize("damage", ["flip", "truncate", "swap"])
def test_damaged_cache_files_are_misses(mount, server, served, tmp_path, damage):
    cache = tmp_path / "cache"
    opts = [f"cache_dir={cache}"]
    first, _ = mounted_read(mount, server, server.url(NAME), opts)
    blocks = [p for p in files(cache) if not p.name.startswith(".")]
    assert len(blocks) >= 2
    for i, p in enumerate(blocks):
        b = bytearray(p.read_bytes())
        if damage == "flip":
            b[len(b) // 2 + i] ^= 1
            p.write_bytes(b)
        elif damage == "truncate":
            p.write_bytes(b[:len(b) // 3])
    if damage == "swap":  # each file holds another block's (whole, well-formed) contents
        contents = [p.read_bytes() for p in blocks]
        for p, c in zip(blocks, contents[1:] + contents[:1]):
            p.write_bytes(c)
    again, reqs = mounted_read(mount, server, server.url(NAME), opts)
    assert again == first == want(served / NAME)
    assert len(reqs) > OPEN_REQUESTS, "the damaged blocks were fetched again"
    third, reqs = mounted_read(mount, server, server.url(NAME), opts)
    assert third == first and len(reqs) == OPEN_REQUESTS, "and stored whole again"


BLOCK = 4 << 20  # blockcache.h's BC_BLOCK: the unit a file in DIR holds
PIECE = 64 << 10  # a random read, blockcache.h's BC_PAGE: a random miss fetches pages, not blocks


def random_reads(mnt, expect, rng, count=None):
    """Reads PIECE bytes at offsets of every tensor file (all its pieces shuffled, or count at
    random), each against the library's bytes of the local file."""
    paths = {t["name"]: mnt / t["path"] for t in read_index(mnt)["tensors"]}
    pieces = [(n, at) for n in sorted(expect) for at in range(0, len(expect[n]), PIECE)]
    rng.shuffle(pieces)
    for name, at in pieces[:count]:
        fd = os.open(paths[name], os.O_RDONLY)
        try:
            got = os.pread(fd, PIECE, at)
        finally:
            os.close(fd)
        assert got == expect[name][at:at + PIECE], (name, at)


def test_random_reads_fill_pages_from_disk(mount, server, served, tmp_path):
    """A stored block serves a random read's pages (the file's checksum checked): no request."""
    cache = tmp_path / "cache"
    opts = [f"cache_dir={cache}"]
    expect = {n: t[2] for n, t in library_view(served / NAME)[0].items()}
    mounted_read(mount, server, server.url(NAME), opts)  # sequential: every block stored
    mark = server.mark()
    with mount(server.url(NAME), options=opts) as mnt:
        random_reads(mnt, expect, random.Random(5), count=200)
    assert len(server.requests(since=mark)) == OPEN_REQUESTS


def test_a_block_read_at_random_is_stored_when_whole(mount, server, served, tmp_path):
    """Random reads fetch pages, not blocks; a block is stored once its pages have all been
    read, so a second mount asks only for what lies in the blocks that never became whole (the
    first: its first bytes came with the open and were never fetched into it)."""
    cache = tmp_path / "cache"
    opts = [f"cache_dir={cache}"]
    expect = {n: t[2] for n, t in library_view(served / NAME)[0].items()}
    mark = server.mark()
    with mount(server.url(NAME), options=opts) as mnt:
        random_reads(mnt, expect, random.Random(6))
    reqs = server.requests(since=mark)
    sizes = [r["body_bytes"] for r in reqs[OPEN_REQUESTS:]]
    assert max(sizes) < BLOCK, "random misses fetched pages, not whole blocks"
    stored = len(files(cache))
    blocks = -(-(served / NAME).stat().st_size // BLOCK)
    assert stored == blocks - 1, files(cache)
    again, reqs = mounted_read(mount, server, server.url(NAME), opts)
    assert again == want(served / NAME)
    assert all(int(r["range"].split("=")[1].split("-")[0]) < BLOCK
               for r in reqs[OPEN_REQUESTS:]), reqs


def test_two_concurrent_mounts_share_the_directory(mount, server, served, tmp_path):
    cache = tmp_path / "cache"
    opts = [f"cache_dir={cache}"]
    expect = want(served / NAME)
    with mount(server.url(NAME), options=opts) as a, mount(server.url(NAME), options=opts) as b:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            got = list(pool.map(read_all, [a, b, a, b]))
    assert all(g == expect for g in got)
    third, reqs = mounted_read(mount, server, server.url(NAME), opts)
    assert third == expect and len(reqs) == OPEN_REQUESTS
    assert not [p for p in files(cache) if p.name.startswith(".")], "no temporary file is left"


def test_cache_max_is_honoured(mount, server, served, tmp_path):
    cache = tmp_path / "cache"
    limit = 9 << 20  # two blocks' files: less than the ~12 MiB object
    assert (served / NAME).stat().st_size > limit
    opts = [f"cache_dir={cache}", f"cache_max={limit}"]
    for _ in range(2):
        got, _ = mounted_read(mount, server, server.url(NAME), opts)
        assert got == want(served / NAME)
        assert 0 < dir_bytes(cache) <= limit


def test_presigned_query_hits_and_stays_out_of_the_directory(mount, server, served, tmp_path):
    cache = tmp_path / "cache"
    opts = [f"cache_dir={cache}"]
    secrets = ["SIGNATUREaaaa1111", "SIGNATUREbbbb2222"]
    url = server.url(NAME) + "?X-Amz-Credential=KEYID&X-Amz-Signature="
    first, _ = mounted_read(mount, server, url + secrets[0], opts)
    second, reqs = mounted_read(mount, server, url + secrets[1], opts)
    assert first == second == want(served / NAME)
    assert len(reqs) == OPEN_REQUESTS, "another signature, the same object: a hit"
    for p in files(cache):
        for s in [*secrets, "KEYID", "X-Amz", "127.0.0.1", NAME]:
            assert s not in p.name
            assert s.encode() not in p.read_bytes(), (p, s)


@pytest.fixture
def small_fs(tmp_path):
    """mount_fs(options): a tmpfs at a new directory, unmounted afterwards."""
    made = []

    def mount_fs(options):
        d = tmp_path / f"fs{len(made)}"
        d.mkdir()
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(d)],
                           capture_output=True)
        if p.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs: {p.stderr.decode().strip()}")
        made.append(d)
        return d
    yield mount_fs
    for d in made:
        subprocess.run(["umount", str(d)], capture_output=True)


@pytest.mark.parametrize("fs", ["ro,mode=0700", "size=64k,mode=0700"])
def test_unwritable_directory_still_reads(mount, server, served, small_fs, fs):
    cache = small_fs(fs)  # read-only: EROFS; 64 KiB: ENOSPC on every block
    opts = [f"cache_dir={cache}"]
    for _ in range(2):
        got, reqs = mounted_read(mount, server, server.url(NAME), opts)
        assert got == want(served / NAME)
        assert len(reqs) > OPEN_REQUESTS
    assert dir_bytes(cache) <= 64 << 10
    assert not [p for p in files(cache) if p.name.startswith(".")], "no temporary file is left"


def test_unwritable_directory_is_reported_once(server, small_fs):
    cache = small_fs("ro,mode=0700")
    p = subprocess.run([str(ckpt_bin()), "cat", server.url(NAME), "embed.weight"],
                       env=dict(os.environ, CKPTFS_CACHE_DIR=str(cache)), capture_output=True,
                       timeout=120)
    assert p.returncode == 0
    err = p.stderr.decode()
    assert err.count("disk cache") == 1 and str(cache) in err, err


def test_a_directory_others_may_write_is_not_used(mount, server, served, tmp_path):
    cache = tmp_path / "shared"
    cache.mkdir(mode=0o777)
    cache.chmod(0o777)
    got, reqs = mounted_read(mount, server, server.url(NAME), [f"cache_dir={cache}"])
    assert got == want(served / NAME)
    assert files(cache) == [], "nothing written where others could forge it"
    p = subprocess.run([str(ckpt_bin()), "ls", server.url(NAME)], capture_output=True,
                       env=dict(os.environ, CKPTFS_CACHE_DIR=str(cache)), timeout=60)
    assert p.returncode == 0 and "not private" in p.stderr.decode(), p.stderr.decode()


def test_a_file_as_the_directory_is_refused(server, mountpoint, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    p = subprocess.run([str(ckptfs_bin()), "-o", f"cache_dir={f}", server.url(NAME),
                        str(mountpoint)], capture_output=True, timeout=60)
    assert p.returncode != 0
    err = p.stderr.decode()
    assert err.count("\n") == 1 and "not a directory" in err and str(f) in err, err
    p = subprocess.run([str(ckpt_bin()), "ls", server.url(NAME)], capture_output=True,
                       env=dict(os.environ, CKPTFS_CACHE_MAX="lots",
                                CKPTFS_CACHE_DIR=str(f.parent)), timeout=60)
    assert p.returncode != 0 and "CKPTFS_CACHE_MAX" in p.stderr.decode()


@pytest.fixture
def faulty(served):
    """The fault-injecting FileServer over the test's own served directory."""
    with netlab.FileServer(served) as srv:
        yield srv


def test_weak_etag_keys_by_last_modified(mount, faulty, served, tmp_path):
    faulty.fault("weak_etag")  # If-Match cannot use it: the date pins and keys the object
    opts = [f"cache_dir={tmp_path / 'cache'}"]
    for round_ in ("cold", "warm"):
        before = len(faulty.requests())
        with mount(faulty.url(NAME), options=opts) as mnt:
            assert read_all(mnt) == want(served / NAME)
        reqs = faulty.requests()[before:]
        assert round_ == "cold" or len(reqs) == OPEN_REQUESTS, reqs


@pytest.mark.parametrize("kind", ["bad_range", "truncate", "long_body"])
def test_a_failed_fetch_is_not_stored(mount, faulty, served, tmp_path, kind):
    """A block whose response was wrong is asked again or fails its read (EIO), and never
    reaches DIR: the next mount, the server healed, reads every byte right."""
    cache = tmp_path / "cache"
    opts = [f"cache_dir={cache}"]
    f = faulty.fault(kind, skip=1, every=2)  # the open passes, then every other one is spoiled
    with mount(faulty.url(NAME), options=opts) as mnt:
        paths = {t["name"]: mnt / t["path"] for t in read_index(mnt)["tensors"]}
        got = netlab.read_many(paths.values(), uncached=True)
    expect = want(served / NAME)
    results = {n: got[str(p)] for n, p in paths.items()}
    assert all(v == ("ok", expect[n]) or v == ("err", "EIO") for n, v in results.items()), got
    assert f.hits > 0, "responses were spoiled"
    faulty.clear()
    with mount(faulty.url(NAME), options=opts) as mnt:
        assert read_all(mnt) == expect
