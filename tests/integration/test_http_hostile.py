"""A hostile server is hostile input: lying lengths and ranges, endless headers, redirect loops,
gigantic bodies, bad certificates. What must hold: one-line errors (`ckpt: ...`, `ckptfs: ...`),
exit 1, bounded memory and requests, no hang (every command runs under a timeout), and never a
wrong byte: a read gives the bytes the safetensors library reads from the local file, or EIO."""
import os
import subprocess
import tempfile

import pytest

import netlab
from test_http_faults import NAME, sample, server, srv  # noqa: F401 (fixtures shared)
from ckptfs_testlib import assert_refused, ckpt_bin, ckptfs_bin, library_view, read_index, \
    write_safetensors

HOSTILE_TIMEOUT = 90  # seconds any command may take against a hostile server
RSS_BOUND_KIB = 128 * 1024  # peak RSS of a command fed hundreds of MiB of hostile bytes


@pytest.fixture(autouse=True)
def two_tries(monkeypatch):
    """Two tries per request: the retry bound and its default are test_http_faults' subject;
    here they would only make each persistent fault cost seconds of backoff."""
    monkeypatch.setenv("CKPTFS_HTTP_TRIES", "2")


def timed(cmd, env=None):
    """(CompletedProcess, peak RSS in KiB) of cmd under GNU time, which writes its figure to
    a file of its own (-o), so the command's stderr is its own."""
    with tempfile.NamedTemporaryFile("r") as out:
        p = subprocess.run(["/usr/bin/time", "-o", out.name, "-f", "%M", *map(str, cmd)],
                           capture_output=True, timeout=HOSTILE_TIMEOUT, env=env)
        return p, int(out.read().split()[-1])


def assert_one_line_failure(p, program="ckpt"):
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 1, (p.returncode, err)
    assert err.startswith(program + ": ") and err.count("\n") == 1, repr(err)
    assert p.stdout == b""
    return err


def ckpt_fails(*args):
    p, rss = timed([ckpt_bin(), *args])
    err = assert_one_line_failure(p)
    assert rss <= RSS_BOUND_KIB, f"ckpt peaked at {rss} KiB: {err}"
    return err


@pytest.mark.parametrize("kind, params", [
    ("endless_headers", {"limit": 512 << 20}),
    ("gigantic", {"limit": 4 << 30}),
    ("redirect", {}),  # to itself, forever
    ("redirect", {"to": "file://"}),  # Location: file:///model.safetensors
    ("redirect", {"to": "ftp://127.0.0.2:21"}),
    ("truncate", {}),
    ("drop", {}),
    ("status", {"code": 500}),
    ("status", {"code": 404}),
    ("bad_range", {}),
    ("long_body", {"extra": 64 << 20}),
    ("ignore_range", {}),  # no Range support: the whole object would come, every time
    ("encoded", {}),  # gzip'ed bodies of exactly the range's length
])
def test_hostile_from_the_first_request(srv, mountpoint, kind, params):
    """Every answer is hostile: `ckpt ls` and `ckptfs` fail with one line, within bounded
    memory and requests, and nothing is mounted."""
    srv.fault(kind, **params)
    url = srv.url(NAME)
    ckpt_fails("ls", url)
    assert len(srv.requests()) <= 50, f"{len(srv.requests())} requests for one ls"
    srv.clear()
    srv.fault(kind, **params)
    assert_refused(url, mountpoint, prefix=url)
    assert len(srv.requests()) <= 50


@pytest.mark.parametrize("kind, params", [
    ("bad_range", {}),
    ("bad_range", {"shift": -4096}),
    ("long_body", {}),
    ("ignore_range", {}),
    ("truncate", {}),
    ("gigantic", {"limit": 2 << 30}),
    ("encoded", {}),
])
def test_hostile_after_mounting(mount, srv, sample, kind, params):
    """The mount went well, then every answer is hostile: each read gives the right bytes or
    EIO, never other bytes; the daemon's memory stays bounded; `ckpt cat` fails in one line
    or prints the right bytes."""
    tensors = library_view(sample[1])[0]
    with mount(srv.url(NAME)) as mnt:
        srv.fault(kind, **params)
        paths = {t["name"]: mnt / t["path"] for t in read_index(mnt)["tensors"]}
        got = netlab.read_many(paths.values())
        eio = 0
        for name, p in paths.items():
            res = got[str(p)]
            if res[0] == "ok":
                assert res[1] == netlab.sha256(tensors[name][2]), f"{name}: WRONG BYTES"
            else:
                assert res == ("err", "EIO"), (name, res)
                eio += 1
        if kind != "ignore_range":  # a 200 with the whole object may rightly be used
            assert eio >= 1
        assert netlab.daemon_peak_rss_kib(mnt) <= RSS_BOUND_KIB
    p, rss = timed([ckpt_bin(), "cat", srv.url(NAME), "embed.weight"])
    assert rss <= RSS_BOUND_KIB + 16 * 1024
    if p.returncode == 0:
        assert p.stdout == tensors["embed.weight"][2]
    else:
        assert_one_line_failure(p)


def test_body_stalled_for_good_fails_within_the_budget(mount, srv, sample, monkeypatch):
    """After the mount, every answer sends half its body and then nothing for a minute: with
    CKPTFS_HTTP_BUDGET=2 (seconds for one request, retries included) a read fails with EIO
    and `ckpt cat` in one line, long before the server would give up."""
    monkeypatch.setenv("CKPTFS_HTTP_BUDGET", "2")
    with mount(srv.url(NAME)) as mnt:
        srv.fault("stall", seconds=60)
        paths = {t["name"]: mnt / t["path"] for t in read_index(mnt)["tensors"]}
        got = netlab.read_many([paths["head.weight"]], timeout=45)
        assert got[str(paths["head.weight"])] == ("err", "EIO")
    srv.clear()
    srv.fault("stall", skip=1, seconds=60)
    p = subprocess.run([ckpt_bin(), "cat", srv.url(NAME), "head.weight"], capture_output=True,
                       timeout=45)
    assert_one_line_failure(p)


def test_size_that_changes_between_answers(mount, srv, sample):
    """After the mount, an answer says the object is 1 MiB longer than it was: the object
    changed under the mount, so that read fails with EIO and the file is stale from then on
    (reads EIO, opens ESTALE); the right bytes (from before) or an error, never other bytes."""
    tensors = library_view(sample[1])[0]
    with mount(srv.url(NAME)) as mnt:
        srv.fault("wrong_total", times=1, delta=1 << 20)
        paths = {t["name"]: mnt / t["path"] for t in read_index(mnt)["tensors"]}
        got = netlab.read_many(paths.values())
        for name, p in paths.items():
            res = got[str(p)]
            assert res in (("err", "EIO"), ("err", "ESTALE"),
                           ("ok", netlab.sha256(tensors[name][2]))), (name, res)
        assert ("err", "EIO") in got.values()


def test_lying_size_covers_a_truncated_file(mount, tmp_path):
    """A file whose header promises a tensor past its real end, served by a server that claims
    the promised size: the mount accepts the header (its first answer is consistent), the read
    past the real end fails with EIO, `ckpt cat` of it fails in one line, and the small first
    tensor (inside the mount's first answer) is right."""
    d = tmp_path / "lying"
    d.mkdir()
    good, mid = os.urandom(1 << 16), os.urandom(1 << 20)
    full = write_safetensors(d / "full.safetensors", [("good", "U8", [1 << 16], good),
                                                      ("mid", "U8", [1 << 20], mid),
                                                      ("gone", "U8", [1 << 20], os.urandom(1 << 20))])
    data = full.read_bytes()
    (d / NAME).write_bytes(data[:len(data) - (1 << 20)])
    with netlab.FileServer(d) as srv:
        srv.fault("wrong_total", delta=1 << 20)
        with mount(srv.url(NAME)) as mnt:
            paths = {t["name"]: mnt / t["path"] for t in read_index(mnt)["tensors"]}
            got = netlab.read_many(paths.values())
            assert got[str(paths["good"])] == ("ok", netlab.sha256(good))
            assert got[str(paths["gone"])] in (("err", "EIO"), ("err", "ESTALE"))
            assert got[str(paths["mid"])] in (("err", "EIO"), ("err", "ESTALE"),
                                              ("ok", netlab.sha256(mid)))
        ckpt_fails("cat", srv.url(NAME), "gone")


def test_nothing_listening(mountpoint):
    url = f"http://127.0.0.1:{netlab.free_port()}/{NAME}"
    ckpt_fails("ls", url)
    assert_refused(url, mountpoint, prefix=url)


def test_tls_refused_without_the_ca(sample, mountpoint, tmp_path):
    """A certificate from an unknown CA is refused (there is no insecure default), and so is
    one that does not name the address connected to (127.0.0.3 is not in its SANs)."""
    tls = netlab.tls_material(tmp_path / "tls", names=("127.0.0.1", "localhost"))
    with netlab.Nginx(sample[0], tls=tls) as srv:
        err = ckpt_fails("ls", srv.url(NAME))
        assert "\n" not in err.rstrip("\n")
        assert_refused(srv.url(NAME), mountpoint, prefix=srv.url(NAME))
    with netlab.Nginx(sample[0], tls=tls, host="127.0.0.3") as srv:
        url = srv.url(NAME)
        p = subprocess.run([ckptfs_bin(), "-o", f"cacert={tls.ca}", url, mountpoint],
                           capture_output=True, timeout=HOSTILE_TIMEOUT)
        assert_one_line_failure(p, "ckptfs")
        env = dict(os.environ, CKPTFS_CACERT=str(tls.ca))
        p, _ = timed([ckpt_bin(), "ls", url], env=env)
        assert_one_line_failure(p)
        assert srv.requests() == []  # the handshake failed: no request was made


def test_presigned_signature_is_never_shown(srv, mount, mountpoint):
    """A presigned URL's query is its credential: it is in no message (`ckpt ls` of a 404,
    `ckpt cat` of a name the checkpoint lacks, a refused mount) and not in the `mount` line."""
    secret = "X-Amz-Signature=netlab_SIG_SECRET"
    url = srv.url(NAME) + f"?X-Amz-Expires=60&{secret}"
    with mount(url) as mnt:
        assert secret not in open("/proc/self/mountinfo").read()
        assert read_index(mnt)["tensors"]
    p = subprocess.run([ckpt_bin(), "cat", url, "no.such.tensor"], capture_output=True, timeout=60)
    assert_one_line_failure(p)
    assert b"netlab_SIG_SECRET" not in p.stderr, p.stderr
    srv.fault("status", code=404)
    p = subprocess.run([ckpt_bin(), "ls", url], capture_output=True, timeout=60)
    assert_one_line_failure(p)
    assert b"netlab_SIG_SECRET" not in p.stderr, p.stderr
    err = assert_refused(url, mountpoint, prefix="")
    assert "netlab_SIG_SECRET" not in err
