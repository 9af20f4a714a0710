"""Every file a DCP tensor's bytes come from is a source the reader checks.

A tensor gathered from DCP chunks reads the `.distcp` files of its chunks, not its entry's own
file (the `.metadata`): a `.distcp` rewritten in place (same size, new bytes, new mtime) under
descriptors opened before the change must fail their reads (EIO) for the tensor file, its
`.npy` view and the range of `checkpoint.safetensors` it fills; a new open of it fails with
ESTALE; and a load (verify, load_into with verify, the bypass of a mount, a load through the
mount) fails rather than hand out the new bytes (docs/SEMANTICS.md "When the source changes
while mounted"). The checkpoints are written by torch 2.x itself (dcp_writer.py: 2 gloo ranks
of FSDP2, each weight in two chunks of rows, one per rank's file), and the bytes compared
with torch's own reading of them."""
import errno
import json
import os
import shutil
import struct

import pytest

import ckload
from ckptfs_testlib import need_torch2, read_index, torch_bytes

need_torch2()
from test_dcp import expected_bytes, written  # noqa: E402  (its own import needs torch 2.x)

FAILED_READ = (errno.EIO, errno.ESTALE)
CHANGED = "__1_0.distcp"  # rank 1's file: the second chunk of every weight


@pytest.fixture(scope="module")
def fsdp2(tmp_path_factory):
    """2 ranks' FSDP2 checkpoint of one 64-wide block: each weight in 2 chunks of rows."""
    return written(tmp_path_factory, "model", 2, 1, 64)


@pytest.fixture
def copy(fsdp2, tmp_path):
    """A copy of the checkpoint of this test's own, to change."""
    d, manifest, exp = fsdp2
    shutil.copytree(d, tmp_path / "ckpt")
    return tmp_path / "ckpt", manifest, exp


def rewrite_in_place(path):
    """New bytes of the same size written over the file through a descriptor (the same inode),
    and a new mtime (moved on where a coarse clock gave the write the old one)."""
    before = os.stat(path)
    data = path.read_bytes()
    with open(path, "r+b") as f:
        f.write(bytes(b ^ 0xFF for b in data))
    st = os.stat(path)
    assert st.st_size == before.st_size and st.st_ino == before.st_ino
    if st.st_mtime_ns == before.st_mtime_ns:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def chunked_weight(manifest):
    """A weight of two chunks, one in each rank's file: the block's first projection."""
    return next(n for n in manifest["tensors"] if n.endswith("q_proj"))


def safetensors_range(fd, name):
    """[begin, end) of tensor name's bytes in a safetensors file open as fd."""
    n = struct.unpack("<Q", os.pread(fd, 8, 0))[0]
    header = json.loads(os.pread(fd, n, 8))
    begin, end = header[name]["data_offsets"]
    return 8 + n + begin, 8 + n + end


def test_a_rewritten_chunk_file_fails_reads_under_open_descriptors(copy, mount):
    """direct_io: every read reaches the daemon, which must check the chunk files the range's
    bytes come from, not only the tensor's entry's file (the .metadata, unchanged)."""
    d, manifest, exp = copy
    name = chunked_weight(manifest)
    want = expected_bytes(exp, manifest["tensors"][name])
    with mount(d, ("direct_io", "npy")) as m:
        path = m / {t["name"]: t["path"] for t in read_index(m)["tensors"]}[name]
        tensor = os.open(path, os.O_RDONLY)
        npy = os.open(f"{path}.npy", os.O_RDONLY)
        st = os.open(m / ".ckptfs" / "checkpoint.safetensors", os.O_RDONLY)
        try:
            assert os.pread(tensor, len(want), 0) == want  # served while the files are intact
            begin, end = safetensors_range(st, name)
            assert os.pread(st, end - begin, begin) == want
            npy_size = os.fstat(npy).st_size
            rewrite_in_place(d / CHANGED)
            # the whole tensor, its second half (rank 1's rows), the .npy view, and the tensor's
            # range in checkpoint.safetensors
            for fd, size, off in [(tensor, len(want), 0), (tensor, len(want) // 2, len(want) // 2),
                                  (npy, npy_size, 0), (st, end - begin, begin)]:
                with pytest.raises(OSError) as e:
                    os.pread(fd, size, off)
                assert e.value.errno in FAILED_READ, e.value
            # rank 0's rows, the first half, come from its file alone, intact: still served
            assert os.pread(tensor, len(want) // 2, 0) == want[:len(want) // 2]
            with pytest.raises(OSError) as e:
                open(path, "rb").close()
            assert e.value.errno == errno.ESTALE, e.value
            status = (m / ".ckptfs" / "status").read_text()
            assert status.startswith(f"source changed: {d / CHANGED} "), status
        finally:
            for fd in (tensor, npy, st):
                os.close(fd)


def rewrite_once(d):
    """A callback that rewrites the chunk file the first time it is called."""
    done = []

    def cb(*_):
        if not done:
            done.append(1)
            rewrite_in_place(d / CHANGED)
    return cb


def loaded(ld):
    with ld:
        ld.wait_all()
        return {ld.name(i): ld.tensor(i).clone() for i in range(len(ld))}


def test_load_with_verify_never_returns_a_rewritten_chunk_files_bytes(copy):
    """One reader thread: the first tensor's callback runs before the next tensor is read, and
    rewrites rank 1's file; every tensor after it reads new bytes there, which verify must see
    (its check of the files a gathered tensor read, not only its entry's)."""
    d, manifest, exp = copy
    with pytest.raises(RuntimeError, match=f"{CHANGED} changed while it was read"):
        loaded(ckload.Load(d, device="cpu", verify=True, threads=1, on_ready=rewrite_once(d)))


def test_load_into_with_verify_never_returns_a_rewritten_chunk_files_bytes(copy, monkeypatch):
    """load_into's targets are placed inside the load's start, before any byte is read: the
    file is rewritten there, and verify must fail the load."""
    import torch
    d, manifest, exp = copy
    finish, rewrite = ckload._Placement.finish, rewrite_once(d)

    def finish_then_rewrite(self):
        out = finish(self)
        rewrite()
        return out
    monkeypatch.setattr(ckload._Placement, "finish", finish_then_rewrite)
    target = {n: torch.zeros(t["shape"], dtype=getattr(torch, t["dtype"].split(".")[-1]))
              for n, t in manifest["tensors"].items()}
    with pytest.raises(RuntimeError, match=f"{CHANGED} changed while it was read"):
        ckload.load_into(target, d, verify=True, threads=1)


@pytest.mark.parametrize("bypass", ["1", "0"])
def test_a_load_from_a_mount_never_returns_a_rewritten_chunk_files_bytes(copy, mount, bypass,
                                                                         monkeypatch):
    """Through the bypass (the sources opened by the loader, checked after every blob) and
    through the mount's checkpoint.pack (the daemon checks every read; direct_io, so that no
    page the kernel read ahead before the change is served from its cache): the file rewritten
    after the first tensor lands."""
    d, manifest, exp = copy
    monkeypatch.setenv("CKLOAD_BYPASS", bypass)
    with mount(d, ("direct_io",)) as m:
        ld = ckload.Load(m, device="cpu", threads=1, on_ready=rewrite_once(d))
        assert ld.read_path == ("bypass" if bypass == "1" else "mount")
        with pytest.raises(RuntimeError) as e:
            loaded(ld)
        if bypass == "1":
            assert f"{CHANGED} changed while it was read" in str(e.value), e.value
        else:
            assert "Input/output error" in str(e.value) or "Stale" in str(e.value), e.value


# --- a descriptor per file: more files than the default soft limit ---------------------------

FILES = 1100  # a job of 1,100 ranks' files, past the usual soft limit of 1,024 open files
SOFT = 1024


@pytest.fixture(scope="module")
def many_files(tmp_path_factory):
    """FILES tensors, each in a .distcp file of its own (dcp_writer.py files), and torch's
    reading of them."""
    return written(tmp_path_factory, "files", FILES)


def soft_limit(soft):
    """A preexec_fn: the soft limit of open files at soft, the hard one as it is (above it)."""
    import resource

    def set_limit():
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return set_limit


@pytest.fixture
def hard_above_soft():
    import resource
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= FILES + 64:
        pytest.skip(f"the hard limit of open files ({hard}) leaves no room above {FILES} files")


def last_tensor(manifest, exp):
    name = f"layers.{FILES - 1}.w"
    return name, expected_bytes(exp, manifest["tensors"][name])


def test_ckpt_ls_and_cat_under_the_default_soft_limit(many_files, hard_above_soft):
    from ckptfs_testlib import ckpt_bin
    import subprocess
    d, manifest, exp = many_files
    name, want = last_tensor(manifest, exp)
    ls = subprocess.run([str(ckpt_bin()), "ls", str(d), "--json"], capture_output=True,
                        timeout=120, preexec_fn=soft_limit(SOFT))
    assert ls.returncode == 0, ls.stderr.decode(errors="replace")
    assert len(json.loads(ls.stdout)["tensors"]) == FILES
    cat = subprocess.run([str(ckpt_bin()), "cat", str(d), name], capture_output=True,
                         timeout=120, preexec_fn=soft_limit(SOFT))
    assert cat.returncode == 0, cat.stderr.decode(errors="replace")
    assert cat.stdout == want


def test_a_hard_limit_too_low_says_so_in_one_line(many_files):
    """Where even the hard limit is too low, the one line names the limit and how to raise it."""
    import resource
    import subprocess
    from ckptfs_testlib import ckpt_bin
    d, _, _ = many_files

    def both():
        resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT, SOFT))
    p = subprocess.run([str(ckpt_bin()), "ls", str(d)], capture_output=True, timeout=120,
                       preexec_fn=both)
    err = p.stderr.decode()
    assert p.returncode == 1 and err.count("\n") == 1, err
    assert err.startswith("ckpt: ") and f"Too many open files (RLIMIT_NOFILE allows {SOFT}: " \
        "raise its hard limit" in err, err


def test_a_mount_under_the_default_soft_limit(many_files, mount, hard_above_soft):
    """ckptfs started with the soft limit at 1,024 (as a login shell has it) mounts all the
    files and serves the last tensor."""
    import resource
    d, manifest, exp = many_files
    name, want = last_tensor(manifest, exp)
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT, before[1]))  # the daemon inherits it
    try:
        with mount(d) as m:
            resource.setrlimit(resource.RLIMIT_NOFILE, before)
            path = {t["name"]: t["path"] for t in read_index(m)["tensors"]}[name]
            assert (m / path).read_bytes() == want
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


LOAD_CHILD = """
import json, sys
import ckload
d, exp = sys.argv[1], sys.argv[2]
manifest = json.load(open(exp + "/manifest.json"))
sd = ckload.load(d, device="cpu")
bad = [n for n, t in manifest["tensors"].items()
       if sd[n].contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes()
       != open(exp + "/" + t["file"], "rb").read()]
print(json.dumps({"loaded": len(sd), "differ": bad}))
"""


def test_ckload_under_the_default_soft_limit(many_files, hard_above_soft):
    """libckload in a process whose soft limit is 1,024: the load raises it toward the hard
    limit only when a source would not open otherwise, and every tensor is torch's."""
    import subprocess
    import sys
    d, manifest, exp = many_files
    p = subprocess.run([sys.executable, "-c", LOAD_CHILD, str(d), str(exp)],
                       capture_output=True, timeout=300, preexec_fn=soft_limit(SOFT))
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-2000:]
    assert json.loads(p.stdout) == {"loaded": FILES, "differ": []}
