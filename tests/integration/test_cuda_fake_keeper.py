"""Warm attach's keeper (loader/share_keeper.c, `ckpt serve`) against hostile and careless
peers, under the CUDA stand-in, as test_cuda_fake_share.py drives it: where the socket may be
made (never over a file, never in a directory another user can swap names in, by default in
a directory of the user's alone), one client that never reads or reads a byte at a time (the
others are served meanwhile; each exchange has a whole deadline, shortened here through
CKLOAD_SHARE_WAIT), a flood of connections past the keeper's descriptor limit (no busy loop),
and a signal while a table of 6,000 tensors is still being sent (the client counts as attached
from its first byte). The second uid is 65534 (nobody). Runs under `make test-cuda-fake`."""
import os
import resource
import select
import shutil
import signal
import socket
import stat
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from ckptfs_testlib import ckpt_bin
from test_load import expected_tensors
from test_pack import safetensors_source

FAKE_PATH = os.environ.get("CKPTFS_FAKECUDA")
if not FAKE_PATH:
    pytest.skip("runs under the CUDA stand-in only (make test-cuda-fake)", allow_module_level=True)

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import ckload  # noqa: E402  (after the skip: it needs the stand-in's environment)
from test_cuda_fake_share import LIVE, Proc, count, hexed, refused_uid, start_server, \
    wait_count  # noqa: E402

NOBODY = 65534
HEADER = struct.Struct("<8sIIQ")  # sharemsg.h: magic, version, kind, whole length


@pytest.fixture
def sock_dir():
    """A directory any uid can reach (the refused uid must hear the keeper), removed with
    whatever a test leaves in it."""
    d = Path(tempfile.mkdtemp(prefix="ckkeeper-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d)


def big_source(tmp_path):
    """6,000 tensors with long names: a table of about 1.2 MB, far more than a Unix socket
    buffers, so that a client that does not read holds its exchange open."""
    g = torch.Generator().manual_seed(5)
    t = {f"model.layers.{i:05d}.{'block.' * 25}weight": torch.randn(2, generator=g)
         for i in range(6000)}
    path = tmp_path / "big.safetensors"
    save_file(t, str(path))
    return path


def ckpt_serve(src, sock=None, env=None, stats=None):
    """`ckpt serve SRC [--socket SOCK]` started: (process, its first stdout line, "" when it
    exited without serving)."""
    env = dict(os.environ if env is None else env)
    if stats:
        env["FAKECUDA"] = f"stats={stats}"
    args = [ckpt_bin(), "serve", str(src)] + (["--socket", str(sock)] if sock else [])
    p = subprocess.Popen(args, env=env, text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    return p, p.stdout.readline()


def refused(src, sock, env=None):
    """`ckpt serve` at sock: its one stderr line, after checking that it did not serve."""
    p, line = ckpt_serve(src, sock, env)
    if line:  # it served: stop it, and fail
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
        pytest.fail(f"served on {sock}: {line!r}")
    assert p.wait(timeout=60) == 1
    err = p.stderr.read()
    assert err.count("\n") == 1, err
    return err.rstrip("\n")


def stop(p):
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == 0


def connected(sock):
    """A raw client: connected, reading nothing."""
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(str(sock))
    return c


def started(c):
    """Waits for the keeper's first bytes on c (its answer has begun)."""
    assert select.select([c], [], [], 60)[0], "the keeper sent nothing"


def read_message(c):
    """The whole message on c, as ckl_attach reads it: (kind, its length, the bytes read)."""
    got = b""
    while len(got) < HEADER.size:
        chunk = c.recv(65536)
        assert chunk, "the connection ended inside the header"
        got += chunk
    magic, _, kind, length = HEADER.unpack_from(got)
    assert magic == b"CKLSHARE"
    while len(got) < length:
        chunk = c.recv(65536)
        if not chunk:
            break
        got += chunk
    return kind, length, got


def honest_attach(tmp_path, sock, src):
    """An honest client attaches to sock and reads src's bytes back."""
    a = Proc(tmp_path, "a", "attach", sock, "-", src, "-")
    assert a.json()["tensors"] == hexed(expected_tensors(src))
    a.end()


def close_when_idle(server):
    """The keeper closed once nothing is attached, leaving nothing of the stand-in live."""
    wait_count(server, 0)
    server.say("close")
    assert server.line() == "closed"
    server.end()


def attach_then_close(tmp_path, server, sock, src):
    honest_attach(tmp_path, sock, src)
    close_when_idle(server)


def cpu_ticks(pid):
    """utime + stime of every thread of pid, in clock ticks (proc(5))."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def test_nothing_but_a_stale_socket_of_ours_is_replaced(tmp_path, sock_dir):
    """A file, a symlink, a directory or another uid's socket at the path stays as it was;
    `ckpt serve` says so in one line. A stale socket of this uid's (nobody answers) is replaced;
    a live one is not."""
    src = safetensors_source(tmp_path)
    notes = sock_dir / "notes.txt"
    notes.write_text("keep me\n")
    assert refused(src, notes) == f"ckpt: {notes}: exists and is not a socket: not replaced"
    assert notes.read_text() == "keep me\n"
    victim = tmp_path / "victim"
    victim.write_text("secret\n")
    victim.chmod(0o600)
    link = sock_dir / "link"
    link.symlink_to(victim)
    assert refused(src, link) == f"ckpt: {link}: exists and is not a socket: not replaced"
    assert link.is_symlink() and victim.read_text() == "secret\n"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    (sock_dir / "d").mkdir()
    assert refused(src, sock_dir / "d") == \
        f"ckpt: {sock_dir / 'd'}: exists and is not a socket: not replaced"
    theirs = sock_dir / "theirs"
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).bind(str(theirs))  # closed: stale
    os.chown(theirs, NOBODY, NOBODY)
    assert refused(src, theirs) == f"ckpt: {theirs}: a socket of uid {NOBODY} is there: not " \
                                   f"replaced"
    ours = sock_dir / "ours"
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).bind(str(ours))
    p, line = ckpt_serve(src, ours)
    assert line.endswith(f"served on {ours}\n"), line
    assert stat.S_IMODE(ours.lstat().st_mode) == 0o666  # the server decides who attaches
    assert refused(src, ours) == f"ckpt: {ours}: another server is serving there"
    stop(p)
    assert not ours.exists()
    assert sorted(x.name for x in sock_dir.iterdir()) == ["d", "link", "notes.txt", "theirs"]


def test_a_directory_others_can_write_is_refused(tmp_path):
    """The socket's directory must be this uid's or root's, writable by no one else unless
    sticky: else another user could swap the socket's name (for a symlink to a file of root's
    between the bind and the chmod, or for a socket of their own). Refused before anything is
    made there; a sticky directory such as /tmp is accepted."""
    src = safetensors_source(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("secret\n")
    victim.chmod(0o600)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    (theirs / "s").symlink_to(victim)  # what the attacker would swap in
    os.lchown(theirs / "s", NOBODY, NOBODY)
    assert refused(src, theirs / "s") == \
        f"ckpt: {theirs / 's'}: its directory {theirs} belongs to uid {NOBODY}, who could swap " \
        f"the socket: serve in a directory of yours (the default: $XDG_RUNTIME_DIR)"
    (theirs / "s").unlink()
    assert refused(src, theirs / "s").startswith(f"ckpt: {theirs / 's'}: its directory")
    assert list(theirs.iterdir()) == [] and stat.S_IMODE(victim.stat().st_mode) == 0o600
    for mode, who in ((0o777, "every user"), (0o775, "its group"), (0o757, "every user")):
        d = tmp_path / f"d{mode:o}"
        d.mkdir()
        d.chmod(mode)
        assert refused(src, d / "s") == \
            f"ckpt: {d / 's'}: its directory {d} is writable by {who} without the sticky bit " \
            f"(mode {mode:04o}), so another user could swap the socket: serve in a directory " \
            f"only you can write (the default: $XDG_RUNTIME_DIR)"
        assert list(d.iterdir()) == []
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    p, line = ckpt_serve(src, sticky / "s")
    assert line.endswith(f"served on {sticky / 's'}\n"), line
    assert [x.name for x in sticky.iterdir()] == ["s"]  # the private directory is gone
    stop(p)
    with pytest.raises(PermissionError, match=f"its directory {tmp_path / 'd777'} is writable"):
        ckload.serve(src, tmp_path / "d777" / "s", device="cuda")


def test_the_default_socket_is_in_a_directory_of_ours_alone(tmp_path):
    """No --socket: $XDG_RUNTIME_DIR/ckload.sock, else $TMPDIR/ckload-UID/ckload.sock in a
    directory made 0700; one that another uid made first is refused, never used."""
    src = safetensors_source(tmp_path)
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(run))
    p, line = ckpt_serve(src, env=env)
    assert line.endswith(f"served on {run}/ckload.sock\n"), line
    honest_attach(tmp_path, run / "ckload.sock", src)
    old_run = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = str(run)
    try:  # a client given no socket finds the keeper given none
        honest_attach(tmp_path, "-", src)
    finally:
        os.environ.pop("XDG_RUNTIME_DIR") if old_run is None else \
            os.environ.__setitem__("XDG_RUNTIME_DIR", old_run)
    stop(p)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    env["TMPDIR"] = str(tmp)
    mine = tmp / f"ckload-{os.geteuid()}"
    p, line = ckpt_serve(src, env=env)
    assert line.endswith(f"served on {mine}/ckload.sock\n"), line
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700 and mine.stat().st_uid == os.geteuid()
    stop(p)
    mine.rmdir()
    mine.mkdir(mode=0o700)
    os.chown(mine, NOBODY, NOBODY)  # squatted
    assert refused(src, None, env) == \
        f"ckpt: {mine}: not a directory of uid {os.geteuid()}'s alone (mode 0700): no socket " \
        f"goes there (set XDG_RUNTIME_DIR, or give a socket path)"
    assert list(mine.iterdir()) == []
    old = {k: os.environ.get(k) for k in ("XDG_RUNTIME_DIR", "TMPDIR")}
    try:  # Python's default is the same
        os.environ["XDG_RUNTIME_DIR"] = str(run)
        assert ckload.default_socket() == f"{run}/ckload.sock"
        del os.environ["XDG_RUNTIME_DIR"]
        os.environ["TMPDIR"] = str(tmp)
        with pytest.raises(PermissionError, match="not a directory of uid"):
            ckload.default_socket()
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def keeper_with_a_reader(tmp_path, sock_dir, monkeypatch, wait):
    """A keeper (share_proc.py serve) of big_source whose exchanges may take wait seconds, and
    a raw client it has begun to answer: (src, sock, server, client)."""
    monkeypatch.setenv("CKLOAD_SHARE_WAIT", str(wait))
    src = big_source(tmp_path)
    sock = sock_dir / "s"
    server = start_server(tmp_path, src, sock)
    c = connected(sock)
    started(c)
    return src, sock, server, c


def test_a_client_that_reads_nothing_holds_no_one_up(tmp_path, sock_dir, monkeypatch):
    """A client connects and reads nothing of a table far larger than the socket buffers: the
    keeper counts it (from its first byte), and meanwhile an honest client attaches and a
    refused uid hears why. Closing is refused while it counts; once it reads, it gets the whole
    table (its deadline is set far beyond what the test takes, however slow the machine)."""
    src, sock, server, staller = keeper_with_a_reader(tmp_path, sock_dir, monkeypatch, 600)
    assert count(server) == 1
    a = Proc(tmp_path, "a", "attach", sock, "cuda:0", src, "hold")
    got = a.json()
    assert got["tensors"] == hexed(expected_tensors(src))
    assert refused_uid(sock) == f"{sock}: refused by the server: uid {NOBODY} is not the " \
                                f"server's (uid 0)"
    assert count(server) == 2
    server.say("close")
    assert server.line() == f"error ckload: {sock}: 2 attachments live: not closed (force " \
                            f"closes it anyway)"
    kind, length, got = read_message(staller)
    assert kind == 0 and len(got) == length > 1 << 20
    staller.close()
    a.say("again")
    assert a.json()["tensors"] == hexed(expected_tensors(src))
    a.end()
    close_when_idle(server)


def test_an_exchange_has_a_whole_deadline(tmp_path, sock_dir, monkeypatch):
    """A client that reads its table 8 KiB every 0.1 s would take about 15 s; the keeper ends
    the exchange at its deadline (2 s here), not at a wait per byte: the client gets less than
    the table, then the end. An honest client attaches afterwards."""
    src, sock, server, slow = keeper_with_a_reader(tmp_path, sock_dir, monkeypatch, 2)
    got = slow.recv(HEADER.size, socket.MSG_WAITALL)
    length = HEADER.unpack(got)[3]
    while len(got) < length:
        chunk = slow.recv(8192)
        if not chunk:
            break
        got += chunk
        time.sleep(0.1)
    assert len(got) < length, "the keeper gave a slow reader all the time it took"
    wait_count(server, 0)
    slow.close()
    attach_then_close(tmp_path, server, sock, src)


def test_a_flood_past_the_descriptor_limit_does_not_spin(tmp_path, sock_dir):
    """The keeper at RLIMIT_NOFILE 64, flooded with connections it has no descriptor left to
    accept (EMFILE): it backs off instead of polling a listening socket it cannot take from,
    so it uses a small part of the CPU over the window (a busy loop takes all it gets); once the
    flood lets go, an honest client attaches."""
    src = safetensors_source(tmp_path)
    sock = sock_dir / "s"
    server = start_server(tmp_path, src, sock)
    pid = server.p.pid
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (64, 64))
    flood = []
    for _ in range(3000):  # until the keeper holds every descriptor it may, and its backlog
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # is full
        c.setblocking(False)
        try:
            c.connect(str(sock))
            flood.append(c)
            continue
        except BlockingIOError:
            c.close()
        if len(os.listdir(f"/proc/{pid}/fd")) == 64:
            break
        time.sleep(0.01)
    assert len(os.listdir(f"/proc/{pid}/fd")) == 64
    assert count(server) < len(flood)  # connections wait that it cannot accept
    tck = os.sysconf("SC_CLK_TCK")
    cpu0, t0 = cpu_ticks(pid), time.monotonic()
    time.sleep(3)
    cpu, wall = cpu_ticks(pid) - cpu0, (time.monotonic() - t0) * tck
    assert cpu * 10 < wall, f"{cpu} ticks of CPU in {wall:.0f} ticks: a busy loop"
    for c in flood:
        c.close()
    wait_count(server, 0)
    attach_then_close(tmp_path, server, sock, src)


def test_a_signal_while_a_table_is_sent(tmp_path, sock_dir, monkeypatch):
    """SIGTERM to `ckpt serve` while a client is still receiving a table of 6,000 tensors: the
    client counts as attached (one line says so), gets its whole table, and the keeper serves
    on until it lets go; never a whole table from a keeper that then exits."""
    monkeypatch.setenv("CKLOAD_SHARE_WAIT", "600")
    src = big_source(tmp_path)
    sock = sock_dir / "s"
    stats = tmp_path / "ckpt.stats"
    k, line = ckpt_serve(src, sock, stats=stats)
    assert line.endswith(f"served on {sock}\n"), line
    c = connected(sock)
    started(c)
    k.send_signal(signal.SIGTERM)
    assert k.stderr.readline() == f"ckpt: {sock}: 1 attachment live: serving until it ends, " \
                                  f"or a second signal\n"
    kind, length, got = read_message(c)
    assert kind == 0 and len(got) == length
    honest_attach(tmp_path, sock, src)  # still served
    assert k.poll() is None
    c.close()
    assert k.wait(timeout=60) == 0 and not sock.exists()
    got = dict(x.split() for x in stats.read_text().splitlines())
    assert {x: int(got[x]) for x in LIVE} == dict.fromkeys(LIVE, 0), got
