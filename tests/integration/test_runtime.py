"""Faults while mounted: the source changing under the mount, many concurrent readers, signals
and unmounts under load, a full disk under `ckpt pack`.

docs/SEMANTICS.md "Guarantees": a source that is modified, truncated, replaced (renamed over) or removed
while mounted makes reads fail with EIO or ESTALE, and opens fail with ESTALE; a read never
returns short or changed bytes."""
import errno
import os
import random
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import safetensors.torch
from safetensors import deserialize

from ckptfs_testlib import (check_torch_mount, ckpt_bin, ckptfs_bin, ckptfs_pids, flatten,
                            is_mounted, library_view, read_index, run, unmount, wait_until)

FAILED_READ = (errno.EIO, errno.ESTALE)


def save_safetensors(path, n=6, numel=50_000):
    g = torch.Generator().manual_seed(3)
    safetensors.torch.save_file({f"layer.{k}.w": torch.randn(numel, generator=g)
                                 for k in range(n)}, str(path))
    return Path(path)


def bump_mtime_if_unchanged(path, before):
    """Coarse file system clocks can give a write the same mtime as the mount's stat: then move
    it on, as any later write would."""
    st = os.stat(path)
    if st.st_mtime_ns == before.st_mtime_ns:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def change(kind, src, tmp):
    before = os.stat(src)
    if kind == "modified":  # same size, one byte of tensor data flipped in place
        with open(src, "r+b") as f:
            f.seek(before.st_size - 100)
            b = f.read(1)
            f.seek(before.st_size - 100)
            f.write(bytes([b[0] ^ 0xFF]))
        bump_mtime_if_unchanged(src, before)
    elif kind == "truncated":
        os.truncate(src, before.st_size // 2)
    elif kind == "appended":
        with open(src, "ab") as f:
            f.write(b"\0" * 64)
    elif kind == "replaced":  # a valid file of the same size and names renamed over it
        other = save_safetensors(tmp / "other.safetensors")
        os.rename(other, src)
    elif kind == "removed":
        os.unlink(src)


@pytest.mark.parametrize("kind", ["modified", "truncated", "appended", "replaced", "removed"])
def test_source_changed_while_mounted(tmp_path, mount, kind):
    src = save_safetensors(tmp_path / "s.safetensors")
    lib, _ = library_view(src)
    with mount(src) as m:
        index = read_index(m)
        paths = [m / e["path"] for e in index["tensors"]]
        first = paths[0].read_bytes()  # served while the source is intact
        assert first == lib[index["tensors"][0]["name"]][2]
        fd = os.open(paths[-1], os.O_RDONLY)  # opened before, never read: nothing cached
        try:
            change(kind, src, tmp_path)
            with pytest.raises(OSError) as e:
                os.pread(fd, 4096, 0)
            assert e.value.errno in FAILED_READ, e.value
            for p in paths[1:] + [m / ".ckptfs" / "index.json",
                                  m / ".ckptfs" / "checkpoint.safetensors"]:
                with pytest.raises(OSError) as e:
                    open(p, "rb").close()
                assert e.value.errno == errno.ESTALE, (p, e.value)
        finally:
            os.close(fd)


def read_direct(fd, n, off):
    """n bytes at off through an O_DIRECT descriptor, into a page-aligned buffer."""
    import mmap
    buf = mmap.mmap(-1, n)
    got = os.preadv(fd, [buf], off)
    return buf[:got]


@pytest.mark.parametrize("kind", ["modified", "truncated", "replaced", "removed"])
def test_shard_changed_under_the_virtual_pack(tmp_path, mount, kind):
    """A read of the virtual pack checks the shards its bytes come from: after one shard
    changes, the other's tensors still read whole and exact (O_DIRECT, as libckload reads: every
    read reaches the daemon), while the changed shard's bytes and the header fail."""
    d = tmp_path / "shards"
    d.mkdir()
    a, b = save_safetensors(d / "a.safetensors", n=2), tmp_path / "b.safetensors"
    g = torch.Generator().manual_seed(4)
    safetensors.torch.save_file({"other.w": torch.randn(50_000, generator=g)}, str(b))
    os.rename(b, d / "b.safetensors")
    lib, _ = library_view(d)
    with mount(d) as m:
        fd = os.open(m / ".ckptfs/checkpoint.pack", os.O_RDONLY | os.O_DIRECT)
        try:
            whole = read_direct(fd, os.fstat(fd).st_size, 0)
            at_a, at_b = whole.find(lib["layer.0.w"][2]), whole.find(lib["other.w"][2])
            assert at_a > 0 and at_b > 0
            change(kind, a, tmp_path)
            n = len(lib["other.w"][2])
            assert read_direct(fd, n, at_b) == lib["other.w"][2]
            for off in (at_a, 0):
                with pytest.raises(OSError) as e:
                    read_direct(fd, 4096, off)
                assert e.value.errno in FAILED_READ, (off, e.value)
        finally:
            os.close(fd)


@pytest.mark.parametrize("kind", ["modified", "replaced"])
def test_torch_source_changed_while_mounted(tmp_path, mount, kind):
    """A strided tensor (gathered from its storage at read time) fails the same way."""
    src = tmp_path / "t.pt"
    torch.save({"t": torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64).t()}, src)
    with mount(src) as m:
        fd = os.open(m / "t", os.O_RDONLY)
        try:
            if kind == "modified":
                before = os.stat(src)
                with open(src, "r+b") as f:
                    f.seek(0)
                    f.write(b"PK")
                bump_mtime_if_unchanged(src, before)
            else:
                torch.save({"t": torch.zeros(64, 64)}, tmp_path / "n.pt")
                os.rename(tmp_path / "n.pt", src)
            with pytest.raises(OSError) as e:
                os.pread(fd, 1 << 16, 0)
            assert e.value.errno in FAILED_READ
        finally:
            os.close(fd)


def test_truncation_while_reading_never_gives_a_short_file(tmp_path, mount):
    """A reader streaming a tensor when the source is cut gets an error, never a clean end of
    file at a smaller size."""
    src = save_safetensors(tmp_path / "s.safetensors", n=2, numel=1 << 20)
    with mount(src, options=("direct_io",)) as m:  # every read reaches ckptfs
        ent = read_index(m)["tensors"][-1]
        with open(m / ent["path"], "rb", buffering=0) as f:
            got = f.read(1 << 16)
            os.truncate(src, os.path.getsize(src) - (1 << 20))
            with pytest.raises(OSError) as e:
                while f.read(1 << 16):
                    pass
            assert e.value.errno in FAILED_READ
        assert len(got) == 1 << 16


# --- 64 concurrent readers --------------------------------------------------------------------

@pytest.fixture(scope="module")
def busy_source(tmp_path_factory):
    """A torch checkpoint with contiguous, strided and tied tensors and values, and what
    torch.load says every file of its mount must hold."""
    d = tmp_path_factory.mktemp("busy")
    g = torch.Generator().manual_seed(11)
    base = torch.randn(256, 384, generator=g)
    obj = {f"block.{k}": {"w": torch.randn(128, 257, generator=g).to(torch.bfloat16),
                          "wt": base.t()[k::7], "b": torch.arange(k, k + 300)}
           for k in range(12)}
    obj["tied"] = [base, base]
    obj["step"] = 1234
    src = d / "busy.pt"
    torch.save(obj, src)
    return src


def expected_files(m, src):
    """{path under the mount: bytes} for every file, from torch.load and the safetensors
    library (for the synthesized safetensors file)."""
    index = check_torch_mount(m, src, "pytorch-zip")
    flat = flatten(torch.load(src, weights_only=False))
    want = {e["path"]: flat[e["name"]][-1] for e in index["tensors"] + index.get("values", [])}
    want[".ckptfs/index.json"] = (m / ".ckptfs" / "index.json").read_bytes()
    return want


def read_all(path, rng):
    chunk = rng.choice([4096, 65536, 1 << 20, 7919])
    out = []
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(chunk)
            if not b:
                return b"".join(out)
            out.append(b)


def check_synth_safetensors(m, want_by_name):
    data = (m / ".ckptfs" / "checkpoint.safetensors").read_bytes()
    got = {name: bytes(v["data"]) for name, v in deserialize(data)}
    assert got == want_by_name


def test_64_reader_threads(busy_source, mount):
    with mount(busy_source) as m:
        want = expected_files(m, busy_source)
        index = read_index(m)
        by_name = {e["name"]: want[e["path"]] for e in index["tensors"]}
        errors = []

        def reader(k):
            rng = random.Random(k)
            paths = list(want)
            rng.shuffle(paths)
            for p in paths:
                if read_all(m / p, rng) != want[p]:
                    errors.append(p)
            if k % 16 == 0:
                check_synth_safetensors(m, by_name)

        with ThreadPoolExecutor(64) as ex:
            for f in [ex.submit(reader, k) for k in range(64)]:
                f.result(timeout=300)
        assert not errors, sorted(set(errors))[:5]


def test_64_reader_processes(busy_source, mount):
    with mount(busy_source) as m:
        want = expected_files(m, busy_source)
        pids = []
        for k in range(64):
            pid = os.fork()
            if pid == 0:  # the child only reads and compares: no torch, no pytest
                code = 1
                try:
                    rng = random.Random(1000 + k)
                    paths = list(want)
                    rng.shuffle(paths)
                    code = 0 if all(read_all(m / p, rng) == want[p] for p in paths) else 2
                finally:
                    os._exit(code)
            pids.append(pid)
        codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
        assert codes == [0] * 64, codes


# --- signals and unmounts under load ----------------------------------------------------------

def _default_signals():
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, signal.SIG_DFL)


def wait_mounted(mnt, proc, timeout=20):
    deadline = time.monotonic() + timeout
    while not is_mounted(mnt):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "not mounted"
        time.sleep(0.02)


READER = """
import os, sys
paths = sys.argv[1:]
n = 0
while True:
    for p in paths:
        try:
            with open(p, "rb", buffering=0) as f:
                while f.read(65536):
                    n += 1
        except OSError as e:
            print(e.errno, flush=True)
            sys.exit(0)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_signal_under_read_load(tmp_path, mountpoint, sig):
    """Readers hammering the mount when ckptfs gets the signal: it unmounts and exits 0, and
    each reader gets an error (it is not left hanging)."""
    src = save_safetensors(tmp_path / "s.safetensors", n=8, numel=1 << 18)
    p = subprocess.Popen([str(ckptfs_bin()), "-f", "-o", "direct_io", str(src), str(mountpoint)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=_default_signals)
    readers = []
    try:
        wait_mounted(mountpoint, p)
        paths = [str(mountpoint / e["path"]) for e in read_index(mountpoint)["tensors"]]
        readers = [subprocess.Popen(["/usr/bin/python3", "-c", READER, *paths],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                   for _ in range(8)]
        time.sleep(0.5)  # let them get going; nothing is asserted about how far they got
        p.send_signal(sig)
        rc = p.wait(timeout=30)
        assert rc == 0, p.stderr.read()
        assert not is_mounted(mountpoint)
        for r in readers:
            out, err = r.communicate(timeout=30)
            assert r.returncode == 0, err
            assert out.strip(), "a reader ended without an error"
    finally:
        for r in readers:
            if r.poll() is None:
                r.kill()
                r.wait()
        if p.poll() is None:
            p.kill()
            p.wait()
        unmount(mountpoint)






def test_fusermount_while_files_are_open(tmp_path, mountpoint):
    """`fusermount3 -u` refuses a busy mount and leaves it serving; `-uz` detaches it at once,
    open files keep reading the right bytes, and the daemon exits when the last one closes."""
    src = save_safetensors(tmp_path / "s.safetensors")
    lib, _ = library_view(src)
    r = run([ckptfs_bin(), src, mountpoint])
    assert r.returncode == 0, r.stderr
    try:
        index = read_index(mountpoint)
        ent = index["tensors"][1]
        fd = os.open(mountpoint / ent["path"], os.O_RDONLY)
        try:
            busy = run(["fusermount3", "-u", mountpoint])
            assert busy.returncode != 0 and is_mounted(mountpoint)
            assert os.pread(fd, 1 << 20, 0) == lib[ent["name"]][2]
            lazy = run(["fusermount3", "-uz", mountpoint])
            assert lazy.returncode == 0, lazy.stderr
            assert not is_mounted(mountpoint)
            assert os.listdir(mountpoint) == []
            want = lib[ent["name"]][2]
            assert os.pread(fd, 1 << 20, 0) == want  # still served
            assert len(ckptfs_pids(mountpoint)) == 1
        finally:
            os.close(fd)
        assert wait_until(lambda: not ckptfs_pids(mountpoint)), "daemon outlived the last file"
    finally:
        unmount(mountpoint)


# --- a full disk under ckpt pack ----------------------------------------------------------------

def test_pack_into_a_full_file_system(tmp_path):
    src = save_safetensors(tmp_path / "s.safetensors", n=4, numel=1 << 18)  # 4 MiB
    small = tmp_path / "small"
    small.mkdir()
    r = run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", small])
    assert r.returncode == 0, r.stderr
    try:
        p = run([ckpt_bin(), "pack", src, small / "out.pack"], timeout=60)
        err = p.stderr.decode()
        assert p.returncode == 1, err
        assert err.startswith("ckpt: ") and err.count("\n") == 1 and err.endswith("\n"), err
        assert os.strerror(errno.ENOSPC) in err, err
        assert p.stdout == b""
        assert os.listdir(small) == []
        assert os.statvfs(small).f_bfree == os.statvfs(small).f_blocks  # nothing kept open
    finally:
        run(["umount", small])
