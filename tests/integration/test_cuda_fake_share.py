"""Warm attach (loader/share.h) across processes under the CUDA stand-in, whose cudaIpc*MemHandle
map one process's device memory into another's: a server process (share_proc.py serve, the
library's ckl_serve; `ckpt serve`) and client processes that attach, read the tensors back
through cudaMemcpy and compare them with what the safetensors library reads from the source.
Refusals (another uid, a changed source, another device, no server) and lifetimes (a client
killed while attached, a server that will not close while attached, a killed server). Every
process leaves nothing of the stand-in's live and no violation. Runs under `make
test-cuda-fake` only."""
import json
import os
import signal
import subprocess
import sys
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

import ckload  # noqa: E402  (after the skip: it needs the stand-in's environment)

PROC = str(Path(__file__).with_name("share_proc.py"))
LIVE = ("device_allocs", "pinned_allocs", "streams", "events", "ipc_imports", "violations")


class Proc:
    """A share_proc.py process with a stand-in of its own configuration and stats file."""

    def __init__(self, tmp, tag, *args, fake=""):
        self.stats = Path(tmp) / f"{tag}.stats"
        env = dict(os.environ, FAKECUDA=f"{fake} stats={self.stats}".strip())
        self.p = subprocess.Popen([sys.executable, PROC, *map(str, args)], env=env, text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def line(self):
        out = self.p.stdout.readline()
        assert out, f"process ended (rc {self.p.poll()})"
        return out.strip()

    def json(self):
        return json.loads(self.line())

    def say(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()

    def end(self):
        """Waits for a clean exit; its stand-in must have nothing live and no violation."""
        self.p.stdin.close()
        assert self.p.wait(timeout=60) == 0
        got = dict(line.split() for line in self.stats.read_text().splitlines())
        assert {k: int(got[k]) for k in LIVE} == dict.fromkeys(LIVE, 0), got


def hexed(expected):
    return {k: [d, list(s), b.hex()] for k, (d, s, b) in expected.items()}


@pytest.fixture
def sock_dir():
    """A directory any uid can reach (pytest's tmp_path is root's alone): the refused uid must
    hear the server, not the file system."""
    d = tempfile.mkdtemp(prefix="ckshare-")
    os.chmod(d, 0o755)
    yield Path(d)
    for f in Path(d).iterdir():
        f.unlink()
    os.rmdir(d)


def start_server(tmp_path, src, sock, fake=""):
    s = Proc(tmp_path, "server", "serve", src, sock, fake=fake)
    assert s.line() == "ready"
    return s


def count(server):
    server.say("count")
    return int(server.line())


def wait_count(server, n):
    """The server's count once it is n (it drops when the server's thread sees a connection
    end, soon after the client's process does)."""
    for _ in range(500):
        if count(server) == n:
            return
        time.sleep(0.02)
    assert count(server) == n


def test_attached_bytes_are_the_sources(tmp_path, sock_dir):
    src = safetensors_source(tmp_path)
    sock = sock_dir / "s"
    server = start_server(tmp_path, src, sock)
    a = Proc(tmp_path, "a", "attach", sock, "cuda:0", src, "hold")
    got = a.json()
    assert got["read_path"] == "attach"
    assert got["tensors"] == hexed(expected_tensors(src))
    assert count(server) == 1
    a.say("again")
    assert a.json()["tensors"] == hexed(expected_tensors(src))
    a.end()
    wait_count(server, 0)
    server.say("close")
    assert server.line() == "closed"
    server.end()
    assert not sock.exists()


def test_an_npz_of_inflated_copies_is_served(tmp_path, sock_dir):
    """An .npz whose Fortran-ordered compressed arrays are gathered from inflated copies (files
    of the index with no identity of their own: their archive's, ck_file_origin) is served, and
    an attached client reads np.load's bytes."""
    from test_numpy import expected, fortran_npz
    src = fortran_npz(tmp_path)
    sock = sock_dir / "s"
    server = start_server(tmp_path, src, sock)
    got = attach_once(tmp_path, sock, "cuda:0", src)
    assert got.get("read_path") == "attach", got
    assert got["tensors"] == hexed(expected(src))
    server.say("close")
    assert server.line() == "closed"
    server.end()


def attach_once(tmp_path, sock, device="-", source="-", fake=""):
    c = Proc(tmp_path, "c", "attach", sock, device, source, "-", fake=fake)
    got = c.json()
    c.end()
    return got


def refused_uid(sock):
    """ckl_attach from a forked child as uid 65534 (nobody): its error line."""
    lib = ckload.library()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 1
        try:
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            err = ckload._c.create_string_buffer(4096)
            h = ckload._c.c_void_p()
            lib.ckl_attach(os.fsencode(sock), -1, None, -1, ckload._c.byref(h), err, len(err))
            os.write(w, err.value)
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    line = os.read(r, 4096).decode()
    os.close(r)
    assert os.waitpid(pid, 0)[1] == 0
    return line


def test_refusals(tmp_path, sock_dir):
    src = safetensors_source(tmp_path)
    sock = sock_dir / "s"
    server = start_server(tmp_path, src, sock, fake="devices=2")
    line = refused_uid(sock)
    assert line == f"{sock}: refused by the server: uid 65534 is not the server's (uid 0)"
    got = attach_once(tmp_path, sock, device="cuda:1", fake="devices=2")
    assert got == {"error": "ValueError",
                   "line": f"ckload: {sock}: the served block is on cuda:0, not cuda:1"}
    other = tmp_path / "other.safetensors"
    other.write_bytes(src.read_bytes())
    got = attach_once(tmp_path, sock, source=other, fake="devices=2")
    assert got["line"] == f"ckload: {sock}: changed source: it serves {src}, not {other}"
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))  # the same bytes, touched
    for source in ("-", src):  # the server re-checks; so does a client that names the source
        got = attach_once(tmp_path, sock, source=source, fake="devices=2")
        assert got["error"] == "Error" and "changed source" in got["line"], got
        assert str(src) in got["line"]
    import torch
    with pytest.raises(ValueError, match="device='cpu': an attached block is on a CUDA device"):
        ckload.load_into({"c": torch.zeros(3)}, sock)  # load_into from a served block: CUDA
    assert count(server) == 0
    server.say("close")
    assert server.line() == "closed"
    server.end()
    got = attach_once(tmp_path, sock)
    assert got["error"] == "FileNotFoundError"
    assert got["line"].startswith(f"ckload: {sock}: no server is serving there (")


def test_lifetimes(tmp_path, sock_dir):
    src = safetensors_source(tmp_path)
    want = hexed(expected_tensors(src))
    sock = sock_dir / "s"
    server = start_server(tmp_path, src, sock)
    a = Proc(tmp_path, "a", "attach", sock, "-", "-", "hold")
    b = Proc(tmp_path, "b", "attach", sock, "-", "-", "hold")
    assert a.json()["tensors"] == want and b.json()["tensors"] == want
    assert count(server) == 2
    a.p.kill()  # a crash while attached: only its own attachment goes
    a.p.wait()
    wait_count(server, 1)
    server.say("close")  # refused while b is attached
    assert server.line() == f"error ckload: {sock}: 1 attachment live: not closed (force " \
                            f"closes it anyway)"
    b.say("again")  # b reads once more, then lets go and exits
    assert b.json()["tensors"] == want
    b.end()
    wait_count(server, 0)
    server.say("close")
    assert server.line() == "closed"
    server.end()
    killed = start_server(tmp_path, src, sock)
    killed.p.kill()  # a killed server: the next attach fails, one line
    killed.p.wait()
    got = attach_once(tmp_path, sock)
    assert got["error"] == "FileNotFoundError"
    assert got["line"].startswith(f"ckload: {sock}: no server is serving there (")


def test_ckpt_serve_keeps_serving_while_attached(tmp_path, sock_dir):
    """`ckpt serve`: one ready line; a signal with nothing attached exits 0 and removes the
    socket; one while attached says how many and keeps serving until the last attachment
    ends; a second one exits anyway."""
    src = safetensors_source(tmp_path)
    sock = sock_dir / "s"
    stats = tmp_path / "ckpt.stats"

    def keeper():
        p = subprocess.Popen([ckpt_bin(), "serve", str(src), "--socket", str(sock)],
                             env=dict(os.environ, FAKECUDA=f"stats={stats}"), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        n = len(expected_tensors(src))
        assert p.stdout.readline() == f"{src}: {n} tensors, {src_bytes(p)} bytes on cuda:0, " \
                                      f"served on {sock}\n"
        return p

    def src_bytes(p):
        with ckload.Load(src, device="cpu") as ld:
            return ld.total_bytes()

    k = keeper()
    k.send_signal(signal.SIGTERM)
    assert k.wait(timeout=30) == 0 and k.stderr.read() == "" and not sock.exists()
    k = keeper()
    a = Proc(tmp_path, "a", "attach", sock, "-", "-", "hold")
    assert a.json()["tensors"] == hexed(expected_tensors(src))
    k.send_signal(signal.SIGTERM)
    assert k.stderr.readline() == f"ckpt: {sock}: 1 attachment live: serving until it ends, " \
                                  f"or a second signal\n"
    a.say("again")  # still served, still the bytes
    assert a.json()["tensors"] == hexed(expected_tensors(src))
    a.end()
    assert k.wait(timeout=30) == 0 and not sock.exists()
    k = keeper()
    b = Proc(tmp_path, "b", "attach", sock, "-", "-", "hold")
    assert b.json()["tensors"] == hexed(expected_tensors(src))
    k.send_signal(signal.SIGINT)
    assert k.stderr.readline() == f"ckpt: {sock}: 1 attachment live: serving until it ends, " \
                                  f"or a second signal\n"
    k.send_signal(signal.SIGINT)
    assert k.stderr.readline() == f"ckpt: {sock}: told twice: closing with 1 attachment live\n"
    assert k.wait(timeout=30) == 0 and not sock.exists()
    got = dict(line.split() for line in stats.read_text().splitlines())
    assert {x: int(got[x]) for x in LIVE} == dict.fromkeys(LIVE, 0), got
    b.p.kill()  # its block's exporter is gone: nothing it reads now is promised (share.h)
    b.p.wait()


def test_a_changed_source_refusal_shows_no_secret(tmp_path, sock_dir):
    """A client naming as source a URL with secrets (userinfo, a presigned query), which is not
    what the server loaded: refused, "changed source", the URL shown without its secrets
    (ckload.shown, the one rule), through the library and through the Python module."""
    src = safetensors_source(tmp_path)
    sock = sock_dir / "s"
    server = start_server(tmp_path, src, sock)
    for url in ("https://user:S3CR3T@127.0.0.1:9/m.safetensors",
                "http://127.0.0.1:9/m.safetensors?X-Amz-Signature=S3CR3T&X-Amz-Credential=K"):
        got = attach_once(tmp_path, sock, source=url)
        assert got["line"] == (f"ckload: {sock}: changed source: it serves {src}, not "
                               f"{ckload.shown(url)}"), got
        assert "S3CR3T" not in got["line"]
    server.say("close")
    assert server.line() == "closed"
    server.end()
