"""ckload.load_distributed / DistributedLoad on torch.distributed's gloo backend, 2 and 4 processes
on this machine (torch.multiprocessing spawn, a TCP store on 127.0.0.1, timeouts): every rank's
tensors (and parts, with slice rules) byte-exact against the safetensors library, torch.chunk
and torch.load; each rank's bytes read from storage, by the loader's count and by the kernel's
(/proc/self/io read_bytes of a cold file read O_DIRECT), within its share: 1/N of the checkpoint
plus one blob under "balanced", all on rank 0 under "rank0"; on_ready once per tensor on every
rank; and a failing rank (a missing file, a corrupt blob, a bad rule, another checkpoint) fails
every rank with its message, no rank left hanging."""
import datetime
import functools
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

import ckload
from ckptfs_testlib import torch_bytes
from test_pack import pack
from test_slices import RULES, dim_of, part

TIMEOUT = 60  # seconds: the process group's, for every collective


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, fn, args, q, backend):
    import torch.distributed as dist
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=TIMEOUT))
    try:
        q.put((rank, fn(rank, world, *args)))
    except Exception as e:  # the test asserts on it
        q.put((rank, ("error", type(e).__name__, str(e))))
    finally:
        dist.destroy_process_group()


def spawn(world, fn, *args, backend="gloo"):
    """fn(rank, world, *args) on world processes of one group: their results by rank."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, fn, args, q, backend))
             for r in range(world)]
    for p in procs:
        p.start()
    out = {}
    try:
        for _ in range(world):
            rank, res = q.get(timeout=3 * TIMEOUT)
            out[rank] = res
    finally:
        for p in procs:
            p.join(TIMEOUT)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0] * world
    return [out[r] for r in range(world)]


def model_file(d, n=16, numel=65536):
    """A safetensors checkpoint of n tensors of numel F32 (256 KiB each: a blob each), written
    through to the disk so that each rank can drop it from the page cache."""
    g = torch.Generator().manual_seed(18)
    t = {f"layers.{i}.q_proj.weight": torch.randn(numel // 64, 64, generator=g)
         for i in range(n // 2)}
    t.update({f"layers.{i}.o_proj.weight": torch.randn(64, numel // 64, generator=g)
              for i in range(n // 2)})
    t["layers.0.norm"] = torch.randn(64, generator=g)
    path = d / "m.safetensors"
    save_file(t, str(path))
    with open(path, "rb") as f:
        os.fsync(f.fileno())
    return path


def read_bytes():
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("read_bytes:")).split()[1])


def cold(path):
    """path out of the page cache (its pages are clean: written through)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def load_and_check(rank, world, path, plan, slices, expected_from):
    """This rank's distributed load of path, checked: (bytes by the loader, by the kernel,
    total, largest blob, on_ready calls per tensor)."""
    import torch.distributed as dist
    os.environ["CKLOAD_DIRECT"] = "1"  # O_DIRECT: the kernel counts exactly what is read
    cold(path)
    dist.barrier()
    ready = []
    before = read_bytes()
    with ckload.DistributedLoad(path, device="cpu", plan=plan, slices=slices,
                                on_ready=ready.append) as ld:
        ld.wait_all()
        kernel = read_bytes() - before
        got = {ld.name(i): ld.tensor(i) for i in range(len(ld))}
        blobs = max(ld.info(i)[3] for i in range(len(ld)))
        counts = sorted(ready) == list(range(len(ld)))
        loader, total = ld.bytes_read(), ld.total_bytes()
    want = expected_from(path)
    assert set(got) == set(want)
    for name, t in want.items():
        d = dim_of(name) if slices else -1
        exp = t if d < 0 else part(t, d, rank, world)
        assert list(got[name].shape) == list(exp.shape), name
        assert torch_bytes(got[name]) == torch_bytes(exp), name
    return loader, kernel, total, blobs, counts


def safetensors_tensors(path, src=None):
    """The tensors of src (path's safetensors source), or of path, by the safetensors library."""
    return load_file(str(src or path))


def torch_tensors(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def header_slack(d):
    """What reading the index may cost a rank in the kernel's count: the header is read through
    the page cache, and the kernel reads ahead of it as far as the device allows (read_ahead_kb,
    8 MiB on some virtio disks), the more so for the rank that reads it first; at least 512 KiB.
    The blobs are read O_DIRECT, counted exactly."""
    st = os.stat(d)
    dev = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    for q in (f"{dev}/queue/read_ahead_kb", f"{dev}/../queue/read_ahead_kb"):
        try:
            with open(q) as f:
                return max(512 << 10, int(f.read()) << 10)
        except (OSError, ValueError):
            continue
    return 512 << 10


BLOB = 256 << 10  # model_file's tensors


@pytest.mark.parametrize("world", [2, 4])
def test_balanced_reads_each_byte_once(tmp_path, world):
    slack = header_slack(tmp_path)
    # Big enough that a rank reading more than its share is seen past the slack: with two
    # ranks, half the file plus a blob plus the slack stays below the whole file.
    path = model_file(tmp_path, n=16 + 2 * (slack // BLOB))
    res = spawn(world, load_and_check, path, "balanced", None, safetensors_tensors)
    assert all(r[0] != "error" for r in res), res
    total, blob = res[0][2], res[0][3]
    assert blob == BLOB and total / 2 + blob + slack < total
    assert sum(r[0] for r in res) == total  # each blob read by one rank
    for loader, kernel, _, _, on_ready in res:
        assert on_ready
        assert loader <= total / world + blob, (loader, total, world)
        assert kernel <= total / world + blob + slack, (kernel, total, world)


def test_rank0_reads_all(tmp_path):
    slack = header_slack(tmp_path)
    path = model_file(tmp_path, n=6 + 2 * (slack // BLOB))
    res = spawn(2, load_and_check, path, "rank0", None, safetensors_tensors)
    assert all(r[0] != "error" for r in res), res
    assert res[0][0] == res[0][2] and res[1][0] == 0
    assert res[1][1] <= slack < res[0][2]  # rank 1 read the index only


@pytest.mark.parametrize("world", [2, 4])
def test_balanced_with_slices(tmp_path, world):
    """Each rank reads its own parts (disjoint bytes, nothing sent) and its share of the whole
    tensors."""
    path = model_file(tmp_path, n=8)
    rules = [("*.q_proj.weight", 0), ("*.o_proj.weight", 1)]
    res = spawn(world, load_and_check, path, "balanced", rules, safetensors_tensors)
    assert all(r[0] != "error" for r in res), res
    whole = load_file(str(path))
    parts = sum(t.numel() * 4 for n, t in whole.items() if "proj" in n) // world
    norm = whole["layers.0.norm"].numel() * 4
    assert sorted(r[0] for r in res) == sorted([parts + norm] + [parts] * (world - 1))


@pytest.mark.parametrize("world", [2, 3])
def test_rank0_with_slices(tmp_path, world):
    """Rank 0 reads everything, each rank's parts included, and sends each rank its own."""
    path = model_file(tmp_path, n=6, numel=4096)
    rules = [("*.q_proj.weight", 0), ("*.o_proj.weight", 1)]
    res = spawn(world, load_and_check, path, "rank0", rules, safetensors_tensors)
    assert all(r[0] != "error" for r in res), res
    whole = sum(t.numel() * 4 for t in load_file(str(path)).values())
    assert res[0][0] == whole and all(r[0] == 0 for r in res[1:])
    assert all(r[2] < whole for r in res[1:])  # a rank holds its parts only


def test_pack_and_pt_sources(tmp_path):
    src = model_file(tmp_path, n=4, numel=4096)
    packed = pack(src, tmp_path / "m.pack")
    res = spawn(2, load_and_check, packed, "balanced", None,
                functools.partial(safetensors_tensors, src=src))
    assert all(r[0] != "error" for r in res), res
    pt = tmp_path / "m.pt"
    m = load_file(str(src))
    m["layers.0.o_proj.weight"] = m["layers.0.o_proj.weight"].t().contiguous().t()
    torch.save(m, pt)
    res = spawn(2, load_and_check, pt, "balanced", RULES, torch_tensors)
    assert all(r[0] != "error" for r in res), res


def load_on(rank, world, paths, kw):
    """A distributed load of paths[rank] (each rank its own path: one may be wrong)."""
    return {k: v.shape for k, v in ckload.load_distributed(paths[rank], device="cpu",
                                                              **kw[rank]).items()}


def all_fail_with(res, rank, cls, *words):
    """Every rank failed with rank rank's message, holding words, as exception class cls (the
    failing rank's: ckload.Error is a RuntimeError)."""
    for r in res:
        assert r[0] == "error" and r[1] == cls, res
        assert r[2].startswith(f"ckload: rank {rank}: "), r
        assert all(w in r[2] for w in words), (r, words)


def test_a_missing_file_fails_every_rank(tmp_path):
    path = model_file(tmp_path, n=4, numel=4096)
    missing = tmp_path / "gone.safetensors"
    res = spawn(2, load_on, [path, missing], [{}, {}])
    all_fail_with(res, 1, "FileNotFoundError", str(missing), os.strerror(2))


def test_a_bad_rule_on_one_rank_fails_every_rank(tmp_path):
    path = model_file(tmp_path, n=4, numel=4096)
    res = spawn(2, load_on, [path, path], [{}, {"slices": [("layers.0.norm", 3)]}])
    all_fail_with(res, 1, "ValueError", "tensor 'layers.0.norm' has 1 dimensions: no dimension 3")


def test_another_checkpoint_fails_every_rank(tmp_path):
    a = model_file(tmp_path, n=4, numel=4096)
    (tmp_path / "b").mkdir()
    b = model_file(tmp_path / "b", n=2, numel=4096)
    res = spawn(2, load_on, [a, b], [{}, {}])
    all_fail_with(res, 0, "Error", "checkpoints differ")


def test_a_corrupt_blob_fails_every_rank(tmp_path):
    """A flipped byte in the pack's first blob, which rank 0 reads (the first blob goes to the
    rank that has read least: rank 0), fails every rank with rank 0's checksum mismatch."""
    src = model_file(tmp_path, n=4, numel=4096)
    packed = pack(src, tmp_path / "m.pack")
    with ckload.Load(packed, device="cpu") as ld:
        first = min(range(len(ld)), key=ld.pointer)
        name = ld.name(first)
    import struct
    with open(packed, "r+b") as f:
        data_offset = struct.unpack("<8sIIQQQ", f.read(40))[5]
        f.seek(data_offset + 5)
        byte = f.read(1)
        f.seek(data_offset + 5)
        f.write(bytes([byte[0] ^ 1]))
    res = spawn(2, load_on, [packed, packed], [{"verify": True}, {"verify": True}])
    all_fail_with(res, 0, "Error", f"tensor '{name}': checksum mismatch")
