"""Containers and permissions (docs/CONTAINERS.md): a mount inside a new mount
namespace, allow_other and the default owner-only access, a /dev/fuse descriptor mounted by a
privileged helper and passed as /dev/fd/N, `mount -t fuse.ckptfs` and an fstab line through the
installed mount.fuse.ckptfs helper, and mount(8)'s options."""
import ctypes
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
import safetensors.torch

from ckptfs_testlib import (REPO, build_dir, ckptfs_bin, ckptfs_pids, is_mounted, library_view,
                            mount_entry, read_index, run, unmount, wait_until)

NOBODY = 65534


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    src = tmp_path_factory.mktemp("containers") / "c.safetensors"
    safetensors.torch.save_file({"enc.w": torch.arange(300, dtype=torch.float32),
                                 "enc.b": torch.ones(7, dtype=torch.int16)}, str(src))
    return src


@pytest.fixture
def open_dir(fuse):
    """A folder under /tmp that every user may enter (pytest's own are 0700)."""
    d = Path(tempfile.mkdtemp(prefix="ckptfs-ct-", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    for mp in [d / n for n in os.listdir(d)]:
        if is_mounted(mp):
            unmount(mp)
    shutil.rmtree(d, ignore_errors=True)


def as_user(uid):
    def preexec():
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    return preexec


READ_AS = """
import os, sys
try:
    sys.stdout.buffer.write(open(sys.argv[1], "rb").read())
except OSError as e:
    sys.stderr.write(str(e.errno))
    sys.exit(3)
"""


def read_as(uid, path):
    """(bytes, errno or None) of reading path as uid."""
    p = run(["/usr/bin/python3", "-c", READ_AS, path], preexec_fn=as_user(uid))
    return (p.stdout, None) if p.returncode == 0 else (None, int(p.stderr))


# --- a new mount namespace ------------------------------------------------------------------------

def test_mount_in_a_new_mount_namespace(source, tmp_path, fuse):
    """ckptfs mounts and serves inside `unshare -m`; the mount never shows in the namespace the
    test runs in, and it goes away with the namespace."""
    lib, _ = library_view(source)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    out = tmp_path / "out"
    script = f"""
set -e
{ckptfs_bin()} {source} {mnt}
cat {mnt}/enc/w > {out}
grep -c ' {mnt} ' /proc/self/mountinfo > {out}.inside
grep -c ' {mnt} ' /proc/{os.getpid()}/mountinfo > {out}.outside || true
fusermount3 -u {mnt}
"""
    p = run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], timeout=60)
    assert p.returncode == 0, p.stderr
    assert out.read_bytes() == lib["enc.w"][2]
    assert (tmp_path / "out.inside").read_text().strip() == "1"
    assert (tmp_path / "out.outside").read_text().strip() == "0"
    assert not is_mounted(mnt)


# --- who may read -----------------------------------------------------------------------------

def test_only_the_mounting_user_by_default(source, open_dir, mount):
    mnt = open_dir / "m"
    mnt.mkdir()
    r = run([ckptfs_bin(), source, mnt])
    assert r.returncode == 0, r.stderr
    try:
        data, err = read_as(NOBODY, mnt / "enc" / "w")
        assert data is None and err == 13, (data, err)  # EACCES
        assert (mnt / "enc" / "w").read_bytes()  # root, who mounted, reads
    finally:
        unmount(mnt)


def test_allow_other(source, open_dir):
    lib, _ = library_view(source)
    mnt = open_dir / "m"
    mnt.mkdir()
    r = run([ckptfs_bin(), "-o", "allow_other", source, mnt])
    assert r.returncode == 0, r.stderr
    try:
        assert "allow_other" in mount_entry(mnt)[3]
        data, err = read_as(NOBODY, mnt / "enc" / "w")
        assert err is None and data == lib["enc.w"][2]
        data, err = read_as(NOBODY, mnt / ".ckptfs" / "index.json")
        assert err is None and data
    finally:
        unmount(mnt)


# --- /dev/fd/N --------------------------------------------------------------------------------------

MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4


def test_mountpoint_dev_fd(source, tmp_path, fuse):
    """The test plays the privileged helper: it opens /dev/fuse, mounts it with mount(2), and
    hands the descriptor to ckptfs as /dev/fd/N. Unmounting is the helper's job."""
    lib, _ = library_view(source)
    libc = ctypes.CDLL(None, use_errno=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    fd = os.open("/dev/fuse", os.O_RDWR)
    try:
        opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0,default_permissions".encode()
        rc = libc.mount(str(source).encode(), str(mnt).encode(), b"fuse.ckptfs",
                        MS_RDONLY | MS_NOSUID | MS_NODEV, opts)
        assert rc == 0, os.strerror(ctypes.get_errno())
        try:
            p = run([ckptfs_bin(), source, f"/dev/fd/{fd}"], pass_fds=[fd])
            assert p.returncode == 0 and p.stderr == b"", p.stderr
            os.close(fd)
            fd = -1
            assert {e["name"] for e in read_index(mnt)["tensors"]} == set(lib)
            assert (mnt / "enc" / "w").read_bytes() == lib["enc.w"][2]
        finally:
            assert libc.umount2(str(mnt).encode(), 0) == 0, os.strerror(ctypes.get_errno())
    finally:
        if fd >= 0:
            os.close(fd)
    assert not is_mounted(mnt)
    assert wait_until(lambda: not ckptfs_pids(source)), "ckptfs outlived its mount"






@pytest.mark.parametrize("which", ["closed", "not_fuse"])
def test_dev_fd_that_is_no_fuse_descriptor(source, tmp_path, which):
    with open(source, "rb") as f:
        n = f.fileno() if which == "not_fuse" else 99
        p = run([ckptfs_bin(), source, f"/dev/fd/{n}"], pass_fds=[f.fileno()])
    err = p.stderr.decode()
    assert p.returncode == 1 and err.count("\n") == 1, err
    assert err.startswith(f"ckptfs: /dev/fd/{n}: "), err


# --- mount(8), the helper and fstab ---------------------------------------------------------------

FSTAB_OPTS = "rw,nosuid,nodev,noatime,_netdev,nofail,noauto,user,defaults,x-systemd.automount"


def test_fstab_options_are_accepted(source, mount):
    """What mount(8) passes from an fstab line: ignored or applied, never an error; the mount
    stays read-only whatever `rw` says."""
    lib, _ = library_view(source)
    with mount(source, options=FSTAB_OPTS.split(",")) as m:
        opts = mount_entry(m)[3].split(",")
        assert "ro" in opts and "nosuid" in opts and "nodev" in opts, opts
        assert (m / "enc" / "b").read_bytes() == lib["enc.b"][2]


@pytest.fixture
def installed(tmp_path):
    """`make install DESTDIR=... PREFIX=/usr` of the binaries already built (-o all: nothing is
    rebuilt here)."""
    dest = tmp_path / "dest"
    p = run(["make", "-s", "-C", REPO, "-o", "all", "install", f"DESTDIR={dest}", "PREFIX=/usr",
             f"BUILD={build_dir()}"], timeout=120)
    assert p.returncode == 0, p.stderr
    for f in ("usr/bin/ckptfs", "usr/sbin/mount.fuse.ckptfs"):
        assert os.access(dest / f, os.X_OK), f
    return dest


def run_with_installed(dest, script):
    """Runs script in a new mount namespace whose /usr/bin and /usr/sbin also hold what was
    installed under dest (overlays), as if installed with PREFIX=/usr."""
    setup = "set -e\n" + "".join(
        f"mount -t overlay overlay -o lowerdir={dest}/usr/{d}:/usr/{d} /usr/{d}\n"
        for d in ("bin", "sbin"))
    return run(["unshare", "-m", "--propagation", "private", "sh", "-c", setup + script],
               timeout=60)


def test_mount_t_fuse_ckptfs(source, tmp_path, installed):
    lib, _ = library_view(source)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    out = tmp_path / "out"
    p = run_with_installed(installed, f"""
mount -t fuse.ckptfs -o {FSTAB_OPTS},allow_other {source} {mnt}
grep ' {mnt} ' /proc/self/mountinfo > {out}.entry
cat {mnt}/enc/w > {out}
for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" != fusermount3 ] || tr '\\0' ' ' <$p/cmdline; done > {out}.watcher 2>/dev/null
umount {mnt}
""")
    assert p.returncode == 0, p.stderr
    assert out.read_bytes() == lib["enc.w"][2]
    entry = (tmp_path / "out.entry").read_text()
    assert " fuse.ckptfs " in entry and f" {source} " in entry, entry
    assert "allow_other" in entry and " ro," in entry, entry
    # an fstab mount is the administrator's: no auto_unmount watcher (mount.fuse.ckptfs). Each
    # process's comm is read, and a cmdline only of a fusermount3: pgrep reads every cmdline,
    # the daemon's too, which can wait on the daemon's memory map (a hang under ASan)
    assert str(mnt) not in (tmp_path / "out.watcher").read_text()


def test_fstab_line(source, tmp_path, installed):
    """The fstab line docs/CONTAINERS.md documents, through `mount --fstab FILE MOUNTPOINT`."""
    lib, _ = library_view(source)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    fstab = tmp_path / "fstab"
    fstab.write_text(f"{source}  {mnt}  fuse.ckptfs  ro,allow_other,nofail,_netdev  0  0\n")
    out = tmp_path / "out"
    p = run_with_installed(installed, f"""
mount --fstab {fstab} {mnt}
cat {mnt}/enc/b > {out}
umount {mnt}
""")
    assert p.returncode == 0, p.stderr
    assert out.read_bytes() == lib["enc.b"][2]


def test_helper_with_a_bad_source(tmp_path, installed):
    """A bad source through mount(8): mount fails, the helper passes ckptfs's one line on."""
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\0" * 64)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    p = run_with_installed(installed, f"mount -t fuse.ckptfs {bad} {mnt}\n")
    assert p.returncode != 0
    assert p.stderr.decode().startswith(f"ckptfs: {bad}: "), p.stderr
    assert not is_mounted(mnt)
