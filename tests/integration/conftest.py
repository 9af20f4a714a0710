"""Fixtures for the ckptfs integration tests: real mounts through /dev/fuse.

These tests never skip for a missing FUSE: a machine without a usable /dev/fuse fails them,
loudly, so that a green run always means the mounts were really exercised.
"""
import ctypes
import os
import signal
import time
from pathlib import Path

import pytest

from ckptfs_testlib import (Mounter, build_dir, ckpt_bin, ckptfs_bin, fuse_problem, is_mounted,
                            mount_entries, unmount)


def pytest_terminal_summary(terminalreporter):
    """Appends this run's skips, one line each (test: reason), to CKPTFS_SKIP_LOG when it is set:
    `make test` counts them across its pytest runs."""
    log = os.environ.get("CKPTFS_SKIP_LOG")
    if not log:
        return
    with open(log, "a") as f:
        for report in terminalreporter.stats.get("skipped", []):
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
            f.write(f"{report.nodeid}: {str(reason).removeprefix('Skipped: ')}\n")


@pytest.fixture(scope="session")
def build():
    """The build directory (CKPTFS_BUILD, else <repo>/build) holding ckptfs and ckpt."""
    d = build_dir()
    for exe in (ckptfs_bin(), ckpt_bin()):
        if not os.access(exe, os.X_OK):
            pytest.fail(f"{exe} is missing or not executable: run `make` first "
                        f"(CKPTFS_BUILD={os.environ.get('CKPTFS_BUILD')!r})")
    return d


@pytest.fixture(scope="session")
def fuse(build):
    problem = fuse_problem()
    if problem:
        pytest.fail(f"FUSE IS NOT USABLE HERE: {problem}. The ckptfs integration tests mount "
                    f"real filesystems and do not skip; run them where /dev/fuse works "
                    f"(e.g. a container started with --device /dev/fuse --cap-add SYS_ADMIN).")
    return True


def _ckptfs_children():
    """{pid: state} of our child processes named ckptfs or ckptfs-watch (daemons and root's
    auto_unmount watchers, once their parent exited, are reparented to us: see the subreaper
    below)."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat_line = (d / "stat").read_text()
        except OSError:
            continue
        comm = stat_line[stat_line.index("(") + 1:stat_line.rindex(")")]
        state, ppid = stat_line[stat_line.rindex(")") + 2:].split()[:2]
        if comm in ("ckptfs", "ckptfs-watch") and int(ppid) == os.getpid():
            out[int(d.name)] = state
    return out


@pytest.fixture(scope="session")
def mount_base(tmp_path_factory):
    """A directory holding every mountpoint of this session. At the end, anything still mounted
    under it is unmounted, and the session fails for leaking a mount or a live daemon."""
    # Become the subreaper of the daemons we start, so that they are reaped here (and counted)
    # rather than left as zombies where PID 1 does not reap.
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    base = tmp_path_factory.mktemp("mounts")
    yield base
    leaked = [mp for _, mp, _, _ in mount_entries() if mp.startswith(str(base) + "/")]
    for mp in leaked:
        unmount(mp)
    deadline = time.monotonic() + 10
    alive = {}
    while True:
        alive = {}
        for pid, state in _ckptfs_children().items():
            if state == "Z":
                os.waitpid(pid, os.WNOHANG)
            else:
                alive[pid] = state
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not leaked, f"mounts left behind: {leaked}"
    assert not alive, f"ckptfs daemons still running after every unmount: {sorted(alive)}"


@pytest.fixture(scope="session")
def mount(fuse, mount_base):
    """mount(source, options=(), cwd=None) -> context manager yielding the mountpoint Path.
    Runs the daemonizing `ckptfs [-o options] SOURCE MOUNTPOINT` on a fresh directory and
    always unmounts (fusermount3 -u, then -uz) and removes the directory afterwards."""
    return Mounter(mount_base)


@pytest.fixture
def mountpoint(fuse, mount_base):
    """A fresh empty directory for tests that run ckptfs themselves; unmounted if they leak."""
    mp = Mounter(mount_base).new_mountpoint()
    yield mp
    if is_mounted(mp):
        unmount(mp)
        pytest.fail(f"{mp} was left mounted")
    try:
        mp.rmdir()
    except OSError:
        pass


@pytest.fixture(scope="session")
def corpus():
    """The real-checkpoint corpus: ../shared/corpus, or CKPTFS_CORPUS (a copy of it, where the
    tests run on another machine: scripts/gpu-run)."""
    d = Path(os.environ.get("CKPTFS_CORPUS", "/work/shared/corpus"))
    if not d.is_dir():
        pytest.fail(f"{d} (the real-checkpoint corpus) is missing")
    return d


@pytest.fixture(scope="session")
def s3server(tmp_path_factory):
    """radosgw on a one-node Ceph cluster of its own (s3lab.S3Server), shared by the session's
    S3 tests, since it takes seconds to start. Stopped at the end of the session; a daemon of
    it still running after that, or its directory left behind, fails the session."""
    import s3lab
    with s3lab.S3Server(tmp_path_factory.mktemp("s3")) as s3:
        pids, d = s3.pids(), s3.dir
        yield s3
    alive = [f"{name} ({pid})" for name, pid in pids.items() if Path(f"/proc/{pid}").exists()]
    assert not alive, f"s3lab daemons outlived their server: {alive}"
    assert not d.exists(), f"{d} was left behind"
