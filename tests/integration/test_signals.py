"""SIGTERM / SIGINT / SIGHUP end a mount cleanly: unmounted, exit status 0; the daemon goes
away when unmounted with fusermount3; a daemon killed outright (SIGKILL) takes its mount with it
(libfuse's auto_unmount, the default), or with -o noauto_unmount leaves it for fusermount3 -u,
as docs/SEMANTICS.md says."""
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
    """kill -9 left "Transport endpoint is not connected" until fusermount3 -u: with
    auto_unmount (the default) the mount goes with the daemon, and the directory is itself."""
    try:
        killed(source, mountpoint)
        assert wait_gone(mountpoint), "still mounted after the daemon was killed"
        assert os.listdir(mountpoint) == []
    finally:
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
