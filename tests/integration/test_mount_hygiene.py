"""Mount hygiene: every refusal in ckptfs's own one line (usage errors exit 2,
others 1, nothing mounted), no mount over a ckptfs mount or over the source itself, a daemon
that goes with the mount namespace it mounted in, SIGTERM that unmounts and releases the
source, and a changed source told once on stderr and in .ckptfs/status."""
import os
import re
from pathlib import Path
import signal
import subprocess

import pytest
import torch
import safetensors.torch

from ckptfs_testlib import (assert_refused, ckptfs_bin, ckptfs_pids, is_mounted, library_view,
                            mount_entries, run, unmount, wait_until)


@pytest.fixture
def source(tmp_path):
    src = tmp_path / "src" / "h.safetensors"
    src.parent.mkdir()
    safetensors.torch.save_file({"a.b": torch.arange(100, dtype=torch.float32),
                                 "c": torch.ones(3, dtype=torch.int8)}, str(src))
    return src


LIBFUSE_WORDS = re.compile(r"(^|\s)fuse: ")  # libfuse's prefix, as in "fuse: bad mount point"


def refused(args, status):
    """Runs ckptfs with args: exit status, exactly one line on stderr in ckptfs's form (never
    libfuse's "fuse: ..."), nothing on stdout. Returns the line."""
    p = run([ckptfs_bin(), *args], timeout=20)
    err = p.stderr.decode("utf-8", errors="replace")
    assert p.returncode == status, (p.returncode, err)
    assert p.stdout == b"", p.stdout
    assert err.count("\n") == 1 and err.startswith("ckptfs: "), err
    assert not LIBFUSE_WORDS.search(err), err
    return err.rstrip("\n")


def holders(path):
    """Processes that have path open."""
    out = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{d}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{d}/fd/{fd}") == str(path):
                    out.append(int(d))
            except OSError:
                pass
    return out


# --- the command line: ckptfs's words, exit 2 ------------------------------------------------

def test_no_arguments_is_a_usage_error():
    p = run([ckptfs_bin()])
    assert p.returncode == 2 and p.stdout == b""
    assert p.stderr.startswith(b"usage: ") and b"Exit status" in p.stderr, p.stderr


@pytest.mark.parametrize("args, says", [
    (["SRC", "MNT", "extra"], "ckptfs: extra: one argument too many"),
    (["SRC", "MNT", "extra", "more"], "ckptfs: extra: one argument too many"),
    (["-o", "bogus", "SRC", "MNT"], "ckptfs: -o bogus: unknown option"),
    (["-o", "ro,bogus,other", "SRC", "MNT"], "ckptfs: -o bogus,other: unknown option"),
    (["-o", "uid=abc", "SRC", "MNT"], "ckptfs: uid=abc: invalid parameter"),
    (["-o", "max_threads=x", "SRC", "MNT"], "ckptfs: max_threads=x: invalid parameter"),
    (["SRC", "MNT", "-o"], "ckptfs: -o: missing argument"),
    (["SRC"], "ckptfs: need SOURCE and MOUNTPOINT"),
])
def test_usage_errors_in_our_words(source, mountpoint, args, says):
    args = [str(source) if a == "SRC" else str(mountpoint) if a == "MNT" else a for a in args]
    assert refused(args, 2).startswith(says)
    assert not is_mounted(mountpoint)


@pytest.mark.parametrize("device", ["missing", "not_fuse"])
def test_fuse_device_unusable(source, tmp_path, fuse, device):
    """A machine (here a mount namespace) without a usable /dev/fuse: without one at all, one
    line naming /dev/fuse before SOURCE is parsed; with something else there, libfuse's failed
    mount, said in ckptfs's form. Exit 1, nothing mounted."""
    fake = tmp_path / "fake"
    fake.write_bytes(b"")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    setup = {"missing": "mount -t tmpfs none /dev",
             "not_fuse": f"mount --bind {fake} /dev/fuse"}[device]
    script = f"{setup} && exec {ckptfs_bin()} {source} {mnt}"
    p = run(["unshare", "-m", "--propagation", "private", "sh", "-c", script])
    err = p.stderr.decode()
    assert p.returncode == 1 and err.count("\n") == 1, (p.returncode, err)
    assert not LIBFUSE_WORDS.search(err), err
    if device == "missing":
        assert err.startswith("ckptfs: /dev/fuse: No such file or directory: FUSE is not "
                              "usable here"), err
    else:
        assert err == f"ckptfs: {mnt}: mount failed: Invalid argument\n", err
    assert not is_mounted(mnt)


# --- where not to mount ------------------------------------------------------------------------

def test_a_ckptfs_mount_is_not_mounted_over(source, mount, tmp_path):
    lib, _ = library_view(source)
    with mount(source) as mnt:
        line = refused([source, mnt], 1)
        assert line == (f"ckptfs: {mnt}: already a ckptfs mount of {source}; unmount it first "
                        f"(fusermount3 -u {mnt}), or mount over it with -o nonempty"), line
        assert [m for m in mount_entries() if m[1] == str(mnt)] != []
        assert len([m for m in mount_entries() if m[1] == str(mnt)]) == 1
        assert (mnt / "a" / "b").read_bytes() == lib["a.b"][2]  # the first still serves
        assert len(ckptfs_pids(mnt)) == 1


def test_nonempty_mounts_over_a_ckptfs_mount(source, mount, tmp_path):
    other = tmp_path / "other.safetensors"
    safetensors.torch.save_file({"z": torch.zeros(2)}, str(other))
    with mount(source) as mnt:
        p = run([ckptfs_bin(), "-o", "nonempty", other, mnt])
        try:
            assert p.returncode == 0, p.stderr
            assert os.listdir(mnt) == [".ckptfs", "z"]
        finally:
            unmount(mnt)  # the one on top; the fixture unmounts the first
        assert wait_until(lambda: len(ckptfs_pids(other)) == 0)


def test_a_mountpoint_inside_a_ckptfs_mount_is_refused(source, mount, tmp_path):
    """A mount on a directory of a ckptfs mount kept the outer one busy: it could not be
    unmounted while the inner one lived. Refused, -o nonempty or not, and through the mount(8)
    helper, which runs ckptfs; a source inside a mount (reading its files) still mounts."""
    other = tmp_path / "other.safetensors"
    safetensors.torch.save_file({"z": torch.zeros(2)}, str(other))
    helper = tmp_path / "sbin" / "mount.fuse.ckptfs"
    helper.parent.mkdir()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "ckptfs").symlink_to(ckptfs_bin())
    helper.write_bytes((Path(__file__).parents[2] / "tools" / "mount.fuse.ckptfs").read_bytes())
    helper.chmod(0o755)
    with mount(source) as mnt:
        inner = mnt / "a"
        assert inner.is_dir()
        for args in ([other, inner], ["-o", "nonempty", other, inner]):
            line = refused(args, 1)
            assert line == (f"ckptfs: {inner}: inside a ckptfs mount of {source}, which could "
                            f"then not be unmounted; mount elsewhere"), line
        p = run([helper, other, inner], timeout=20)
        assert p.returncode == 1 and p.stderr.decode().startswith(
            f"ckptfs: {inner}: inside a ckptfs mount of {source}"), p.stderr
        assert not [m for m in mount_entries() if m[1] == str(inner)]
        assert not ckptfs_pids(other)
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        p = run([ckptfs_bin(), mnt / ".ckptfs" / "checkpoint.safetensors", elsewhere])
        try:
            assert p.returncode == 0, p.stderr
            assert sorted(os.listdir(elsewhere)) == [".ckptfs", "a", "c"]
        finally:
            unmount(elsewhere)
    assert not is_mounted(mnt)


@pytest.mark.parametrize("how", ["file_inside", "directory_itself", "symlink_into"])
def test_a_mountpoint_holding_the_source_is_refused(source, tmp_path, how, fuse):
    d = source.parent
    link = tmp_path / "link.safetensors"
    link.symlink_to(source)
    src = {"file_inside": source, "directory_itself": d, "symlink_into": link}[how]
    before = sorted(os.listdir(d))
    line = assert_refused(src, d, prefix=d)
    assert line == (f"ckptfs: {d}: holds the source {source}, which the mount would hide "
                    f"(-o nonempty mounts anyway)"), line
    assert sorted(os.listdir(d)) == before
    assert wait_until(lambda: not ckptfs_pids(d))


def test_nonempty_over_the_source_mounts_and_status_says_why_reads_fail(source, fuse):
    d = source.parent
    p = run([ckptfs_bin(), "-o", "nonempty", source, d])
    try:
        assert p.returncode == 0, p.stderr
        status = (d / ".ckptfs" / "status").read_text()
        assert status == (f"source changed: {source} (it was replaced or removed since it was "
                          f"mounted); remount to read it\n"), status
        with pytest.raises(OSError) as e:
            (d / "c").read_bytes()
        assert e.value.errno == 116  # ESTALE
    finally:
        unmount(d)
    assert source.exists()


# --- the daemon follows its mount namespace ----------------------------------------------------

def test_daemon_goes_with_its_mount_namespace(source, tmp_path, fuse):
    """`unshare -m sh -c 'ckptfs SRC MNT && ...'`: while the shell lives the daemon serves; once
    the shell (the namespace's last process) is gone, the daemon unmounts, exits and lets go
    of the source."""
    lib, _ = library_view(source)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    out = tmp_path / "out"
    script = f"{ckptfs_bin()} {source} {mnt} && cat {mnt}/a/b > {out} && echo ok && read x || true"
    p = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"ok\n", p.stderr.read()
        assert out.read_bytes() == lib["a.b"][2]
        (daemon,) = ckptfs_pids(mnt)
        assert daemon in holders(source)
        assert not is_mounted(mnt)  # it is the namespace's, not ours
        p.stdin.close()
        assert p.wait(timeout=30) == 0, p.stderr.read()
        assert wait_until(lambda: not ckptfs_pids(mnt), timeout=30), "it outlived its namespace"
        assert wait_until(lambda: not holders(source), timeout=30), "the source is still held"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for pid in ckptfs_pids(mnt):
            os.kill(pid, signal.SIGKILL)


def test_daemon_stays_when_the_command_s_shell_is_gone(source, mountpoint):
    """In the namespace it shares with others (ours), the daemon stays after the shell that
    ran ckptfs has ended."""
    lib, _ = library_view(source)
    p = run(["sh", "-c", f"{ckptfs_bin()} {source} {mountpoint}"])
    try:
        assert p.returncode == 0, p.stderr
        assert len(ckptfs_pids(mountpoint)) == 1
        assert (mountpoint / "a" / "b").read_bytes() == lib["a.b"][2]
        assert run(["sh", "-c", "true"]).returncode == 0  # another process in it comes and goes
        assert (mountpoint / "c").read_bytes() == lib["c"][2]
        assert len(ckptfs_pids(mountpoint)) == 1
    finally:
        unmount(mountpoint)


# --- SIGTERM -----------------------------------------------------------------------------------

def test_sigterm_unmounts_exits_and_releases_the_source(source, mountpoint):
    p = run([ckptfs_bin(), source, mountpoint])
    try:
        assert p.returncode == 0, p.stderr
        (daemon,) = ckptfs_pids(mountpoint)
        assert daemon in holders(source)
        os.kill(daemon, signal.SIGTERM)
        assert wait_until(lambda: not ckptfs_pids(mountpoint) and not is_mounted(mountpoint))
        assert not holders(source)
        assert os.listdir(mountpoint) == []
    finally:
        unmount(mountpoint)


def watchers():
    """Live ckptfs-watch processes (root's auto_unmount watchers)."""
    out = set()
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm, state = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2]
        if comm == "ckptfs-watch" and state != "Z":
            out.add(int(d))
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="root's own watcher: run as root")
def test_a_remount_right_after_sigterm_stays(source, mountpoint):
    """The kernel reuses a mount ID as soon as it is free, so the next mount on the same
    directory often has the ID the watcher of the one before recorded: a daemon that unmounted
    itself tells its watcher, which then leaves the new mount alone. The old watcher is held
    (SIGSTOP) until the new mount exists, the worst order."""
    lib, _ = library_view(source)
    before = watchers()
    assert run([ckptfs_bin(), source, mountpoint]).returncode == 0
    try:
        (old,) = watchers() - before
        (daemon,) = ckptfs_pids(mountpoint)
        os.kill(old, signal.SIGSTOP)
        os.kill(daemon, signal.SIGTERM)
        assert wait_until(lambda: not is_mounted(mountpoint) and not ckptfs_pids(mountpoint))
        p = run([ckptfs_bin(), source, mountpoint])
        assert p.returncode == 0, p.stderr
        os.kill(old, signal.SIGCONT)
        assert wait_until(lambda: old not in watchers()), "the old watcher did not end"
        assert is_mounted(mountpoint), "the old watcher took the new mount down"
        assert (mountpoint / "a" / "b").read_bytes() == lib["a.b"][2]
    finally:
        unmount(mountpoint)


# --- a source changed under the mount ----------------------------------------------------------

def change(path):
    """Moves path's mtime, as `touch` would, keeping its bytes."""
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def expect_stale(mnt, times=3):
    for _ in range(times):
        with pytest.raises(OSError) as e:
            (mnt / "a" / "b").read_bytes()
        assert e.value.errno == 116  # ESTALE: open refuses


def status_of(mnt):
    f = mnt / ".ckptfs" / "status"
    text = f.read_text()
    assert os.stat(f).st_size == len(text)
    return text


CHANGED = "its size or mtime differ from when it was mounted"


def test_changed_source_told_once_on_stderr_and_in_status(source, mountpoint):
    p = subprocess.Popen([str(ckptfs_bin()), "-f", str(source), str(mountpoint)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_until(lambda: is_mounted(mountpoint) or p.poll() is not None)
        assert status_of(mountpoint) == "ok\n"
        change(source)
        expect_stale(mountpoint)
        want = f"source changed: {source} ({CHANGED}); remount to read it\n"
        assert status_of(mountpoint) == want
        expect_stale(mountpoint)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
        err = p.stderr.read().decode()
        assert err == (f"ckptfs: {source}: source changed ({CHANGED}); reads fail until it is "
                       f"mounted again\n"), err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        unmount(mountpoint)


def test_a_daemon_whose_stderr_is_a_file_writes_there(source, mountpoint, tmp_path):
    log = tmp_path / "ckptfs.log"
    with open(log, "ab") as f:
        p = subprocess.run([str(ckptfs_bin()), str(source), str(mountpoint)], stderr=f,
                           timeout=30)
    try:
        assert p.returncode == 0
        assert log.read_bytes() == b""
        change(source)
        expect_stale(mountpoint)
        assert status_of(mountpoint).startswith(f"source changed: {source} ")
        assert log.read_text() == (f"ckptfs: {source}: source changed ({CHANGED}); reads fail "
                                   f"until it is mounted again\n")
    finally:
        unmount(mountpoint)
    assert wait_until(lambda: not ckptfs_pids(mountpoint))
