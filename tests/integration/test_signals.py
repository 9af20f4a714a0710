"""SIGTERM / SIGINT / SIGHUP end a mount cleanly: unmounted, exit status 0; the daemon goes
away when unmounted with fusermount3; a daemon killed outright (SIGKILL) takes its mount with it
(auto_unmount, the default: root's own ckptfs-watch process, else libfuse's fusermount3), or with
-o noauto_unmount leaves it for fusermount3 -u, as docs/SEMANTICS.md says."""
import errno
import os
import signal
import subprocess
import time

import pytest
import torch
import safetensors.torch

from ckptfs_testlib import (ckptfs_bin, ckptfs_pids, is_mounted, library_view, read_index, run,
                            unmount)

SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    src = tmp_path_factory.mktemp("signals") / "s.safetensors"
    safetensors.torch.save_file({"a.b": torch.arange(1000, dtype=torch.float32),
                                 "c": torch.ones(3, dtype=torch.int8)}, str(src))
    return src


def _default_signals():
    # A shell that started us in the background may have left SIGINT ignored; an ignored
    # signal stays ignored across exec, and libfuse then keeps it so.
    for s in SIGNALS:
        signal.signal(s, signal.SIG_DFL)


def wait_mounted(mnt, proc=None, timeout=15):
    deadline = time.monotonic() + timeout
    while not is_mounted(mnt):
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"ckptfs -f exited {proc.returncode} before mounting: "
                        f"{proc.stderr.read().decode(errors='replace')}")
        if time.monotonic() > deadline:
            pytest.fail(f"{mnt} not mounted after {timeout}s")
        time.sleep(0.02)


def start_foreground(src, mnt):
    p = subprocess.Popen([str(ckptfs_bin()), "-f", str(src), str(mnt)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, preexec_fn=_default_signals)
    try:
        wait_mounted(mnt, p)
    except BaseException:
        p.kill()
        p.wait()
        unmount(mnt)
        raise
    return p


def stop(p, mnt):
    if p.poll() is None:
        p.kill()
        p.wait()
    unmount(mnt)


def check_serving(mnt, src):
    lib, _ = library_view(src)
    for t in read_index(mnt)["tensors"]:
        assert (mnt / t["path"]).read_bytes() == lib[t["name"]][2]


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_signal_to_foreground_process(source, mountpoint, sig):
    p = start_foreground(source, mountpoint)
    try:
        check_serving(mountpoint, source)
        p.send_signal(sig)
        try:
            rc = p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pytest.fail(f"ckptfs -f still running 15 s after {sig.name}")
        out, err = p.communicate()
        assert rc == 0, (rc, err)
        assert not is_mounted(mountpoint)
        assert out == b"" and err == b"", err  # a clean run says nothing
        assert os.listdir(mountpoint) == []
    finally:
        stop(p, mountpoint)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_signal_with_open_files(source, mountpoint, sig):
    """Busy mount (an open file, a process inside a directory): still unmounted, exit 0."""
    p = start_foreground(source, mountpoint)
    fd = os.open(mountpoint / "a" / "b", os.O_RDONLY)
    sleeper = subprocess.Popen(["sleep", "30"], cwd=mountpoint / "a")
    try:
        assert os.pread(fd, 8, 0) == torch.arange(2, dtype=torch.float32).numpy().tobytes()
        p.send_signal(sig)
        rc = p.wait(timeout=15)
        assert rc == 0, p.stderr.read()
        assert not is_mounted(mountpoint)
    finally:
        sleeper.kill()
        sleeper.wait()
        os.close(fd)
        stop(p, mountpoint)




def wait_gone(mnt, timeout=15):
    deadline = time.monotonic() + timeout
    while ckptfs_pids(mnt) or is_mounted(mnt):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_signal_to_daemon(source, mountpoint, sig):
    p = subprocess.run([str(ckptfs_bin()), str(source), str(mountpoint)], capture_output=True,
                       timeout=30, preexec_fn=_default_signals)
    try:
        assert p.returncode == 0, p.stderr
        assert p.stdout == b"" and p.stderr == b""
        assert is_mounted(mountpoint)  # mounted when the command returns
        check_serving(mountpoint, source)
        pids = ckptfs_pids(mountpoint)
        assert len(pids) == 1, pids
        os.kill(pids[0], sig)
        assert wait_gone(mountpoint), f"daemon still there or still mounted after {sig.name}"
    finally:
        unmount(mountpoint)


def test_daemon_exits_after_fusermount(source, mountpoint):
    p = run([ckptfs_bin(), source, mountpoint])
    try:
        assert p.returncode == 0, p.stderr
        assert len(ckptfs_pids(mountpoint)) == 1
        r = run(["fusermount3", "-u", mountpoint])
        assert r.returncode == 0, r.stderr
        assert wait_gone(mountpoint), "daemon did not exit after fusermount3 -u"
    finally:
        unmount(mountpoint)


def killed(source, mountpoint, *options):
    """Mounts source with options, checks it serves, and kills the daemon outright."""
    p = run([ckptfs_bin(), *options, source, mountpoint])
    assert p.returncode == 0, p.stderr
    check_serving(mountpoint, source)
    pids = ckptfs_pids(mountpoint)
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)


def test_a_killed_daemon_takes_its_mount_with_it(source, mountpoint):
    """kill -9 leaves no "Transport endpoint is not connected" behind: with auto_unmount (the
    default) the mount goes with the daemon, and the directory is itself."""
    try:
        killed(source, mountpoint)
        assert wait_gone(mountpoint), "still mounted after the daemon was killed"
        assert os.listdir(mountpoint) == []
    finally:
        unmount(mountpoint)


def watcher_pids():
    """Live ckptfs-watch processes (comm and command line both say so)."""
    out = set()
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().rstrip(b"\0").split(b"\0")
        except (OSError, ValueError):
            continue
        comm, state = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2]
        if comm == "ckptfs-watch" and state != "Z":
            assert argv == [b"ckptfs-watch"], argv
            out.add(int(d))
    return out


def fusermount_of(mnt):
    """fusermount3 processes that name mnt: libfuse's auto_unmount watchers."""
    pids = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"fusermount3") and str(mnt).encode() in argv:
            pids.append(int(d))
    return pids


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="root's own watcher: run as root")


@root_only
def test_root_watches_its_mount_itself(source, mountpoint):
    """As root the mount is made with mount(2), not through fusermount3 (a sixth of a small
    mount's time), and auto_unmount's watcher is a ckptfs-watch process: told from the daemon
    by pgrep and pkill, holding no file (no source, no mountpoint: /dev/null and its socket), in
    "/" and its own session; it ends with the mount."""
    before = watcher_pids()
    p = run([ckptfs_bin(), source, mountpoint])
    try:
        assert p.returncode == 0, p.stderr
        (w,) = watcher_pids() - before
        assert not fusermount_of(mountpoint)
        assert os.readlink(f"/proc/{w}/cwd") == "/"
        assert os.getsid(w) == w
        fds = {os.readlink(f"/proc/{w}/fd/{fd}") for fd in os.listdir(f"/proc/{w}/fd")}
        assert len(fds) == 2 and "/dev/null" in fds, fds  # and its socket to the daemon
        assert all(f == "/dev/null" or f.startswith("socket:") for f in fds), fds
        assert len(ckptfs_pids(mountpoint)) == 1  # the daemon alone
        r = run(["fusermount3", "-u", mountpoint])
        assert r.returncode == 0, r.stderr
        assert wait_gone(mountpoint)
        deadline = time.monotonic() + 15
        while w in watcher_pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert w not in watcher_pids(), "the watcher outlived its mount"
    finally:
        unmount(mountpoint)


def wait_not_watching(pid, timeout=15):
    deadline = time.monotonic() + timeout
    while pid in watcher_pids():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@root_only
def test_a_watcher_leaves_a_mount_made_over_its_own(source, mountpoint):
    """The watcher detaches only the mount it watched: when something else is mounted over it
    (here a tmpfs), a killed daemon's watcher leaves the top mount alone, and the dead mount
    under it for fusermount3 -u, as with noauto_unmount."""
    before = watcher_pids()
    p = run([ckptfs_bin(), source, mountpoint])
    assert p.returncode == 0, p.stderr
    over = False
    try:
        (w,) = watcher_pids() - before
        (daemon,) = ckptfs_pids(mountpoint)
        over = run(["mount", "-t", "tmpfs", "none", mountpoint]).returncode == 0
        assert over
        (mountpoint / "mine").write_bytes(b"x")
        os.kill(daemon, signal.SIGKILL)
        assert wait_not_watching(w), "the watcher outlived its daemon"
        assert (mountpoint / "mine").read_bytes() == b"x"
    finally:
        if over:
            run(["umount", mountpoint])
        unmount(mountpoint)


def test_noauto_unmount_leaves_a_dead_mount_that_fusermount_clears(source, mountpoint):
    try:
        killed(source, mountpoint, "-o", "noauto_unmount")
        time.sleep(0.5)
        assert is_mounted(mountpoint)
        with pytest.raises(OSError) as e:
            os.listdir(mountpoint)
        assert e.value.errno == errno.ENOTCONN
        r = run(["fusermount3", "-u", mountpoint])
        assert r.returncode == 0, r.stderr
        assert not is_mounted(mountpoint) and os.listdir(mountpoint) == []
    finally:
        unmount(mountpoint)
