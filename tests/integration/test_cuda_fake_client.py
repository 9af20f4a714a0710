"""Warm attach's client (loader/share_client.c) against hostile keepers, under the CUDA
stand-in: fake_keeper.py writes its message byte by byte as sharemsg.h documents it, with a
device block of its own the stand-in maps. A keeper of another uid with the real file's
identity; a table claiming more than the mapping; a keeper that sends a byte a second, or
never takes the connection; a refusal or a path with a newline and ESC; a table naming a tensor
twice. Each is refused with one line, before any byte of the keeper's is trusted, and every
client process leaves nothing of the stand-in's live and no violation. Runs under `make
test-cuda-fake` only."""
import json
import os
import re
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from test_cuda_fake_share import Proc, sock_dir  # noqa: F401  (sock_dir: a fixture)
from test_pack import safetensors_source

if not os.environ.get("CKPTFS_FAKECUDA"):
    pytest.skip("runs under the CUDA stand-in only (make test-cuda-fake)", allow_module_level=True)

KEEPER = str(Path(__file__).with_name("fake_keeper.py"))
NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
F32 = 12  # enum ck_dtype


class Keeper:
    """fake_keeper.py on sock, as root or (as_nobody) as uid and gid 65534 (made through the
    keepers fixture, which ends them)."""

    def __init__(self, sock, as_nobody=False, **spec):
        spec["socket"] = str(sock)
        self.p = subprocess.Popen((NOBODY if as_nobody else []) +
                                  [sys.executable, KEEPER, json.dumps(spec)], text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.p.stdout.readline() == "ready\n"

    def sent(self):
        """(bytes sent, bytes of its message) for the next connection, once it ended."""
        m = re.fullmatch(r"sent (\d+) of (\d+)\n", self.p.stdout.readline())
        return int(m[1]), int(m[2])

    def end(self):
        self.p.stdin.close()
        self.p.stdout.close()
        self.p.kill()
        self.p.wait()


def honest_table(src, **over):
    """What a keeper of src would claim: its real path and identity, one float32 tensor "w" of
    4 elements in a block of 64 bytes."""
    real = os.path.realpath(src)
    st = os.stat(real)
    spec = dict(block=64, alloc=64, source=real,
                files=[[real, [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]]],
                blobs=[[0, 16]], tensors=[["w", F32, [4], 16, 0]])
    spec.update(over)
    return spec


@pytest.fixture
def keepers():
    """Keeper(...) made here, each ended after the test however it went."""
    made = []

    def make(*args, **kw):
        made.append(Keeper(*args, **kw))
        return made[-1]
    yield make
    for k in made:
        k.end()


def attach(tmp_path, sock, source="-", group="-", timeout=None, fake=""):
    """One client process (share_proc.py attach, on cuda:0): its JSON answer."""
    c = Proc(tmp_path, "c", "attach", sock, "cuda:0", source, "-", group, fake=fake)
    try:
        c.p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        c.p.kill()
        c.p.wait()
        pytest.fail(f"the client still waits after {timeout} s")
    got = c.json()
    c.end()
    return got


@pytest.fixture
def nobodys_dir(sock_dir):
    """sock_dir, where uid 65534 may create its socket."""
    os.chown(sock_dir, 65534, 65534)
    return sock_dir


def test_a_keeper_of_another_uid_is_not_trusted(tmp_path, nobodys_dir, keepers):
    """The attack: uid 65534 serving on the path a root client was given, with the real file's
    identity (public: stat) and its own block of 666.0. Refused before the table is read;
    trusted when the client names the keeper's group."""
    src = safetensors_source(tmp_path)
    sock = nobodys_dir / "s"
    keepers(sock, as_nobody=True, clients=2, **honest_table(src))
    got = attach(tmp_path, sock, source=src)
    assert got == {"error": "PermissionError",
                   "line": f"ckload: {sock}: the server there runs as uid 65534, neither this "
                           f"process's uid (0) nor root: not trusted"}
    got = attach(tmp_path, sock, source=src, group="4242")
    assert got == {"error": "PermissionError",
                   "line": f"ckload: {sock}: the server there runs as uid 65534, neither this "
                           f"process's uid (0) nor root, and is not in group 4242: not trusted"}
    other = nobodys_dir / "t"
    keepers(other, as_nobody=True, **honest_table(src))
    got = attach(tmp_path, other, source=src, group="65534")  # told to trust nogroup
    assert got == {"read_path": "attach",
                   "tensors": {"w": ["F32", [4], struct.pack("<4f", *[666.0] * 4).hex()]}}


def test_a_table_beyond_the_mapping_is_refused(tmp_path, sock_dir, keepers):
    """1 MiB claimed over an allocation of 64 bytes: the driver says how much is mapped."""
    src = safetensors_source(tmp_path)
    sock = sock_dir / "s"
    mib = 1 << 20
    keepers(sock, **honest_table(src, block=mib, blobs=[[0, mib]],
                                    tensors=[["w", F32, [mib // 4], mib, 0]]))
    got = attach(tmp_path, sock)
    assert got == {"error": "Error",
                   "line": f"ckload: {sock}: the server's table claims a block of 1048576 "
                           f"bytes, more than its mapping holds (64 bytes)"}


def test_a_mapping_the_driver_cannot_size_is_refused(tmp_path, sock_dir, keepers):
    """The driver's word is the proof: without it, no table is believed (and the mapping made
    is closed again: the client's stand-in ends with no import live)."""
    src = safetensors_source(tmp_path)
    sock = sock_dir / "s"
    keepers(sock, **honest_table(src))
    got = attach(tmp_path, sock, fake="fail=cudaGetDriverEntryPointByVersion:1")
    assert got == {"error": "Error",
                   "line": f"ckload: {sock}: cannot ask the driver how large the mapping is "
                           f"(cuMemGetAddressRange through cudaGetDriverEntryPoint: invalid "
                           f"argument)"}


def test_a_slow_keeper_meets_the_total_deadline(tmp_path, sock_dir, keepers, monkeypatch):
    """A byte a second: the client gives up at its deadline for the whole exchange
    (CKLOAD_ATTACH_WAIT), not 30 s after each byte. The timeout only keeps a client that
    waits on (today's per-byte wait) from hanging the suite."""
    src = safetensors_source(tmp_path)
    sock = sock_dir / "s"
    k = keepers(sock, rate=1, **honest_table(src))
    monkeypatch.setenv("CKLOAD_ATTACH_WAIT", "2")
    got = attach(tmp_path, sock, timeout=100)
    sent, whole = k.sent()
    assert sent < whole
    assert got["error"] == "Error"
    assert re.fullmatch(rf"ckload: {re.escape(str(sock))}: the server's answer was not whole "
                        rf"within 2 seconds \(\d+ bytes came\)", got["line"]), got


def test_a_keeper_that_never_takes_the_connection(tmp_path, sock_dir, keepers, monkeypatch):
    """A backlog of 0 taken by another connection: connect itself would wait."""
    src = safetensors_source(tmp_path)
    sock = sock_dir / "s"
    keepers(sock, accept=False, **honest_table(src))
    monkeypatch.setenv("CKLOAD_ATTACH_WAIT", "2")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as first:
        first.connect(str(sock))  # fills the backlog
        got = attach(tmp_path, sock, timeout=100)
    assert got == {"error": "Error",
                   "line": f"ckload: {sock}: the server did not take the connection within "
                           f"2 seconds"}


EVIL = "no\n\x1b[31mEVIL\x1b[0m\r"
SHOWN = "no??[31mEVIL?[0m?"  # each control byte a '?', as base/error.h shows untrusted text


def test_the_peers_text_never_breaks_the_line(tmp_path, sock_dir, keepers):
    """A refusal's text, the served location and a file's path, each with a newline and ESC
    sequences: one line, each control byte shown as '?'."""
    src = safetensors_source(tmp_path)
    sock = sock_dir / "s"
    keepers(sock, refusal=[13, EVIL])
    got = attach(tmp_path, sock)
    assert got == {"error": "PermissionError",
                   "line": f"ckload: {sock}: refused by the server: {SHOWN}"}
    keepers(sock.with_name("t"), **honest_table(src, source="/m/" + EVIL))
    got = attach(tmp_path, sock.with_name("t"), source=src)
    assert got == {"error": "Error",
                   "line": f"ckload: {sock.with_name('t')}: changed source: it serves "
                           f"/m/{SHOWN}, not {os.path.realpath(src)}"}
    keepers(sock.with_name("u"), **honest_table(src, files=[["/m/" + EVIL, [0, 0, 0, 0]]]))
    got = attach(tmp_path, sock.with_name("u"), source=src)
    assert got == {"error": "Error",
                   "line": f"ckload: {sock.with_name('u')}: changed source: /m/{SHOWN} is no "
                           f"longer the file the server loaded"}


def test_a_table_naming_a_tensor_twice_is_refused(tmp_path, sock_dir, keepers):
    src = safetensors_source(tmp_path)
    sock = sock_dir / "s"
    keepers(sock, **honest_table(src, blobs=[[0, 16], [16, 16]],
                                    tensors=[["w", F32, [4], 16, 0], ["w", F32, [4], 16, 1]]))
    got = attach(tmp_path, sock)
    assert got["error"] == "Error"
    assert re.fullmatch(rf"ckload: {re.escape(str(sock))}: the server's table names tensor "
                        rf"'w' twice \(byte \d+\)", got["line"]), got
