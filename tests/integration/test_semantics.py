"""POSIX behaviour of a mount: read-only everywhere (EROFS), modes, owner, mtime, st_blocks and
du, mmap, direct_io, uid/gid options, statfs, readdir, lookups, xattrs, concurrent reads."""
import ctypes
import errno
import json
import mmap
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
import safetensors.torch

from ckptfs_testlib import (VIRTUAL_FILES, check_mount, ckptfs_bin, library_view, mount_entry, read_index, run)

MTIME_NS = 1_600_000_000_123_456_789  # set on the source before mounting


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    g = torch.Generator().manual_seed(11)
    tensors = {
        "model.embed.weight": torch.randn(300, 257, generator=g),           # ~300 KiB
        "model.layers.0.attn.q": torch.randn(64, 64, generator=g).to(torch.bfloat16),
        "model.layers.0.attn.k": torch.randint(-9, 9, (33, 7), generator=g, dtype=torch.int8),
        "model.layers.1.mlp.up": torch.randn(1000, generator=g, dtype=torch.float64),
        "model.layers.1.mlp.bias": torch.tensor(0.5),
        "model.norm": torch.ones(511, dtype=torch.float16),
        "empty": torch.zeros(0),
        "one_byte": torch.tensor([True]),
    }
    d = tmp_path_factory.mktemp("semantics")
    src = d / "model.safetensors"
    safetensors.torch.save_file(tensors, str(src), metadata={"format": "pt"})
    os.utime(src, ns=(MTIME_NS, MTIME_NS))
    return src


@pytest.fixture(scope="module")
def lib(source):
    return library_view(source)


@pytest.fixture(scope="module")
def mnt(mount, source):
    with mount(source) as m:
        yield m


@pytest.fixture(scope="module")
def index(mnt):
    return read_index(mnt)


def all_nodes(mnt):
    """Every path in the mount (root included), from a walk."""
    out = [Path(mnt)]
    for root, ds, fs in os.walk(mnt):
        out += [Path(root) / x for x in ds + fs]
    return out


def test_contents(mnt, lib):
    check_mount(mnt, lib[0], lib[1], "safetensors")


def test_mount_entry(mnt, source):
    src, mp, fstype, opts = mount_entry(mnt)
    assert fstype == "fuse.ckptfs"
    assert src == os.path.realpath(source)
    assert "ro" in opts.split(",")


# --- read-only --------------------------------------------------------------------------------

def _ops(mnt, index):
    f = mnt / index["tensors"][0]["path"]
    d = f.parent
    j = mnt / ".ckptfs" / "index.json"
    new = mnt / "new_file"
    return {
        "open_wronly": lambda: os.open(f, os.O_WRONLY),
        "open_rdwr": lambda: os.open(f, os.O_RDWR),
        "open_trunc": lambda: os.open(f, os.O_RDONLY | os.O_TRUNC),
        "open_append": lambda: os.open(f, os.O_WRONLY | os.O_APPEND),
        "open_wronly_index_json": lambda: os.open(j, os.O_WRONLY),
        "create": lambda: os.open(new, os.O_WRONLY | os.O_CREAT, 0o644),
        "create_excl": lambda: os.open(d / "x", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644),
        "create_in_vdir": lambda: os.open(mnt / ".ckptfs" / "y", os.O_WRONLY | os.O_CREAT),
        "mkdir": lambda: os.mkdir(mnt / "newdir"),
        "mkdir_existing_parent": lambda: os.mkdir(d / "newdir"),
        "rmdir": lambda: os.rmdir(d),
        "rmdir_vdir": lambda: os.rmdir(mnt / ".ckptfs"),
        "unlink": lambda: os.unlink(f),
        "unlink_index_json": lambda: os.unlink(j),
        "rename": lambda: os.rename(f, d / "renamed"),
        "rename_dir": lambda: os.rename(d, mnt / "renamed_dir"),
        "link": lambda: os.link(f, mnt / "hardlink"),
        "symlink": lambda: os.symlink("target", mnt / "symlink"),
        "mkfifo": lambda: os.mkfifo(mnt / "fifo"),
        "mknod": lambda: os.mknod(mnt / "node", stat.S_IFREG | 0o644),
        "setxattr": lambda: os.setxattr(f, "user.other", b"v"),
        "setxattr_ours": lambda: os.setxattr(f, "user.ckptfs.name", b"v"),
        "removexattr": lambda: os.removexattr(f, "user.ckptfs.name"),
        "truncate": lambda: os.truncate(f, 0),
        "chmod": lambda: os.chmod(f, 0o777),
        "chmod_dir": lambda: os.chmod(mnt, 0o777),
        "chown": lambda: os.chown(f, 1, 1),
        "utime": lambda: os.utime(f, (0, 0)),
        "utime_now": lambda: os.utime(f),
        "utime_dir": lambda: os.utime(d, (0, 0)),
    }


OPS = list(_ops(Path("/m"), {"tensors": [{"path": "a/b"}]}))


@pytest.mark.parametrize("op", OPS)
def test_every_modification_is_erofs(mnt, index, lib, op):
    with pytest.raises(OSError) as e:
        fd = _ops(mnt, index)[op]()
        if isinstance(fd, int):
            os.close(fd)
    assert e.value.errno == errno.EROFS, (op, e.value)


def test_nothing_changed_after_modification_attempts(mnt, lib):
    for op in OPS:
        try:
            r = _ops(mnt, read_index(mnt))[op]()
            if isinstance(r, int):
                os.close(r)
        except OSError:
            pass
    check_mount(mnt, lib[0], lib[1], "safetensors")
    names = {p.name for p in all_nodes(mnt)}
    assert not names & {"new_file", "newdir", "renamed", "renamed_dir", "hardlink", "symlink",
                        "fifo", "node", "x", "y"}


def test_write_to_readonly_fd_fails(mnt, index):
    fd = os.open(mnt / index["tensors"][0]["path"], os.O_RDONLY)
    try:
        with pytest.raises(OSError) as e:
            os.write(fd, b"x")
        assert e.value.errno == errno.EBADF
    finally:
        os.close(fd)


# --- attributes -------------------------------------------------------------------------------

def test_modes_owner_mtime(mnt):
    nodes = all_nodes(mnt)
    assert len(nodes) > 10
    for p in nodes:
        st = os.lstat(p)
        if stat.S_ISDIR(st.st_mode):
            assert stat.S_IMODE(st.st_mode) == 0o555, p
        else:
            assert stat.S_ISREG(st.st_mode), p
            assert stat.S_IMODE(st.st_mode) == 0o444, p
        assert st.st_uid == os.getuid() and st.st_gid == os.getgid(), p
        assert st.st_mtime_ns == MTIME_NS, p


def test_sizes_and_blocks(mnt, index, lib):
    for ent in index["tensors"]:
        st = os.stat(mnt / ent["path"])
        n = len(lib[0][ent["name"]][2])
        assert st.st_size == n
        assert st.st_blocks == (n + 511) // 512, ent
    j = mnt / ".ckptfs" / "index.json"
    assert os.stat(j).st_size == len(j.read_bytes()) > 0
    assert os.stat(j).st_blocks == (os.stat(j).st_size + 511) // 512


def test_du_counts_the_real_bytes(mnt, lib):
    sizes = [len(v[2]) for v in lib[0].values()]
    sizes += [os.stat(mnt / f).st_size for f in VIRTUAL_FILES]
    p = run(["du", "-s", "-B1", mnt])
    assert p.returncode == 0, p.stderr
    assert int(p.stdout.split()[0]) == sum((n + 511) // 512 * 512 for n in sizes)
    p = run(["du", "-s", "-b", mnt])  # apparent size
    assert int(p.stdout.split()[0]) == sum(sizes)


def test_statfs(mnt, lib):
    sv = os.statvfs(mnt)
    assert sv.f_flag & os.ST_RDONLY
    assert sv.f_namemax == 255
    jlen = len((mnt / ".ckptfs" / "index.json").read_bytes())
    total = sum(len(v[2]) for v in lib[0].values()) + jlen
    assert sv.f_blocks * sv.f_frsize >= total
    assert sv.f_blocks * sv.f_frsize < total + sv.f_frsize
    assert sv.f_files == len(all_nodes(mnt))
    assert sv.f_bfree == 0 and sv.f_bavail == 0


def test_uid_gid_options(mount, source):
    with mount(source, options=("uid=4242", "gid=4343")) as m:
        for p in all_nodes(m):
            st = os.lstat(p)
            assert (st.st_uid, st.st_gid) == (4242, 4343), p
        # Root still reads everything; modes are unchanged.
        assert (m / ".ckptfs" / "index.json").read_bytes()


# --- reading --------------------------------------------------------------------------------

def test_mmap(mnt, index, lib):
    for ent in index["tensors"]:
        data = lib[0][ent["name"]][2]
        if not data:
            continue
        with open(mnt / ent["path"], "rb") as f:
            with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
                assert mm[:] == data, ent["name"]
    big = next(e for e in index["tensors"] if e["name"] == "model.embed.weight")
    data = lib[0][big["name"]][2]
    with open(mnt / big["path"], "rb") as f:
        with mmap.mmap(f.fileno(), len(data) - 4096, prot=mmap.PROT_READ,
                       offset=4096) as mm:
            assert mm[:] == data[4096:]
        with mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ) as mm:
            assert mm[:] == data
    # numpy.memmap over the tensor file gives the library's values.
    arr = np.memmap(mnt / big["path"], dtype=np.float32, mode="r", shape=tuple(big["shape"]))
    np.testing.assert_array_equal(arr, np.frombuffer(data, np.float32).reshape(big["shape"]))
    del arr


def test_direct_io(mount, source, lib):
    with mount(source, options=("direct_io",)) as m:
        check_mount(m, lib[0], lib[1], "safetensors")
        # The option takes effect: no shared mmap (as --help says), private mmap still reads.
        big = next(e for e in read_index(m)["tensors"] if e["name"] == "model.embed.weight")
        with open(m / big["path"], "rb") as f:
            with pytest.raises(OSError):
                mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
            with mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ) as mm:
                assert mm[:] == lib[0][big["name"]][2]
        for ent in read_index(m)["tensors"]:
            data = lib[0][ent["name"]][2]
            fd = os.open(m / ent["path"], os.O_RDONLY)
            try:
                for chunk in (1, 7, 4096, 100000, 1 << 20):
                    for off in (0, 3, len(data) // 3, len(data)):
                        assert os.pread(fd, chunk, off) == data[off:off + chunk]
            finally:
                os.close(fd)


def test_o_direct_opens(mnt, index, lib):
    """An opener asking for O_DIRECT (as libckload does when the data is cold) gets it: the
    kernel sends its reads to the daemon as they are, bypassing the page cache, aligned or not,
    byte-exact; the virtual pack reads the same as through the page cache."""
    aligned = mmap.mmap(-1, 1 << 20)  # page-aligned, as O_DIRECT elsewhere needs
    for ent in index["tensors"]:
        data = lib[0][ent["name"]][2]
        fd = os.open(mnt / ent["path"], os.O_RDONLY | os.O_DIRECT)
        try:
            for off in (0, 4096):
                n = os.preadv(fd, [aligned], off)
                assert aligned[:n] == data[off:off + (1 << 20)], ent["name"]
            for chunk, off in ((1, 0), (7, 3), (100001, len(data) // 3), (10, len(data))):
                assert os.pread(fd, chunk, off) == data[off:off + chunk], ent["name"]
        finally:
            os.close(fd)
    pack = mnt / ".ckptfs/checkpoint.pack"
    want = pack.read_bytes()
    fd = os.open(pack, os.O_RDONLY | os.O_DIRECT)
    try:
        got = bytearray()
        while n := os.preadv(fd, [aligned], len(got)):
            got += aligned[:n]
        assert got == want
        assert os.pread(fd, 1001, 77) == want[77:1078]
    finally:
        os.close(fd)


def test_timeout_option(mount, source, lib):
    with mount(source, options=("timeout=0",)) as m:
        check_mount(m, lib[0], lib[1], "safetensors")
        check_mount(m, lib[0], lib[1], "safetensors")


def test_concurrent_reads(mnt, index, lib):
    jobs = [(e["path"], lib[0][e["name"]][2]) for e in index["tensors"]] * 8
    errors = []

    def read_one(job):
        path, want = job
        with open(mnt / path, "rb", buffering=0) as f:
            got = b""
            while True:
                b = f.read(7919)
                if not b:
                    break
                got += b
        if got != want:
            errors.append(path)

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(read_one, jobs))
    assert not errors


def test_reads_past_end(mnt, index, lib):
    ent = index["tensors"][0]
    n = len(lib[0][ent["name"]][2])
    fd = os.open(mnt / ent["path"], os.O_RDONLY)
    try:
        assert os.pread(fd, 10, n) == b""
        assert os.pread(fd, 10, n + 12345) == b""
        assert os.pread(fd, 10, n - 3) == lib[0][ent["name"]][2][-3:]
    finally:
        os.close(fd)


# --- directories, lookups, xattrs -----------------------------------------------------------

def test_readdir(mnt, index):
    assert ".ckptfs" in os.listdir(mnt)
    assert os.listdir(mnt / ".ckptfs") == sorted(os.path.basename(f) for f in VIRTUAL_FILES)
    inodes = {}
    for root, ds, fs in os.walk(mnt):
        with os.scandir(root) as it:
            for de in it:
                st = os.lstat(de.path)
                # d_type and d_ino from readdir agree with stat.
                assert de.is_dir(follow_symlinks=False) == stat.S_ISDIR(st.st_mode)
                assert de.is_file(follow_symlinks=False) == stat.S_ISREG(st.st_mode)
                assert de.inode() == st.st_ino, de.path
                assert st.st_ino not in inodes, (de.path, inodes.get(st.st_ino))
                inodes[st.st_ino] = de.path
    # Every tensor's directory lists exactly its children.
    want = {}
    for e in index["tensors"]:
        parts = e["path"].split("/")
        for i in range(1, len(parts) + 1):
            want.setdefault("/".join(parts[:i - 1]), set()).add(parts[i - 1])
    for d, children in want.items():
        listed = set(os.listdir(mnt / d)) - ({".ckptfs"} if d == "" else set())
        assert listed == children, d
    assert os.stat(mnt).st_nlink >= 2


def test_lookup_errors(mnt, index):
    f = mnt / index["tensors"][0]["path"]
    with pytest.raises(FileNotFoundError):
        os.stat(mnt / "no_such_tensor")
    with pytest.raises(FileNotFoundError):
        os.stat(mnt / ".ckptfs" / "nope.json")
    with pytest.raises(NotADirectoryError):
        os.stat(f / "child")
    with pytest.raises(NotADirectoryError):
        os.listdir(f)
    with pytest.raises(IsADirectoryError):
        with open(f.parent, "rb") as fh:
            fh.read()
    fd = os.open(f.parent, os.O_RDONLY | os.O_DIRECTORY)  # opening a directory is fine
    os.close(fd)


def test_xattrs(mnt, index, lib):
    for e in index["tensors"]:
        p = mnt / e["path"]
        assert sorted(os.listxattr(p)) == sorted(["user.ckptfs.name", "user.ckptfs.dtype",
                                                  "user.ckptfs.shape"])
        dtype, shape, _ = lib[0][e["name"]]
        assert os.getxattr(p, "user.ckptfs.name") == e["name"].encode()
        assert os.getxattr(p, "user.ckptfs.dtype") == dtype.encode()
        assert json.loads(os.getxattr(p, "user.ckptfs.shape")) == shape
        with pytest.raises(OSError) as ex:
            os.getxattr(p, "user.other")
        assert ex.value.errno == errno.ENODATA
    # The size query (a NULL buffer) and a short buffer, as getfattr and C callers use them.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.getxattr.restype = libc.listxattr.restype = ctypes.c_ssize_t
    for e in index["tensors"]:
        p = os.fsencode(mnt / e["path"])
        for name in (b"user.ckptfs.name", b"user.ckptfs.dtype", b"user.ckptfs.shape"):
            value = os.getxattr(p, name)
            assert libc.getxattr(p, name, None, ctypes.c_size_t(0)) == len(value)
            if len(value) > 1:
                buf = ctypes.create_string_buffer(len(value) - 1)
                assert libc.getxattr(p, name, buf, ctypes.c_size_t(len(value) - 1)) == -1
                assert ctypes.get_errno() == errno.ERANGE
        names = b"".join(n.encode() + b"\0" for n in os.listxattr(p))
        assert libc.listxattr(p, None, ctypes.c_size_t(0)) == len(names)
        buf = ctypes.create_string_buffer(5)
        assert libc.listxattr(p, buf, ctypes.c_size_t(5)) == -1
        assert ctypes.get_errno() == errno.ERANGE
    assert os.listxattr(mnt) == ["user.ckptfs.sources"]  # for loaders (docs/SEMANTICS.md "The mount")
    for p in (mnt, mnt / "model", mnt / ".ckptfs", mnt / ".ckptfs" / "index.json"):
        assert p == mnt or os.listxattr(p) == []
        with pytest.raises(OSError) as ex:
            os.getxattr(p, "user.ckptfs.name")
        assert ex.value.errno == errno.ENODATA


# --- command line ---------------------------------------------------------------------------

def test_help_and_version():
    p = run([ckptfs_bin(), "--help"])
    assert p.returncode == 0
    assert b"SOURCE" in p.stdout and b"MOUNTPOINT" in p.stdout
    # Every format SOURCE may be, and the mount's own files.
    text = b" ".join(p.stdout.split())
    for words in (b"safetensors file", b"directory of safetensors shards", b"PyTorch",
                  b"zip", b"legacy", b"ckptfs pack", b".ckptfs/index.json",
                  b".ckptfs/checkpoint.pack", b".ckptfs/checkpoint.safetensors"):
        assert words in text, words
    p = run([ckptfs_bin(), "--version"])
    assert p.returncode == 0 and p.stdout.startswith(b"ckptfs ")


def test_fuse_device_usable():
    """Fails (never skips) where /dev/fuse cannot be used, so a green run means real mounts."""
    from ckptfs_testlib import fuse_problem
    assert fuse_problem() is None, fuse_problem()
