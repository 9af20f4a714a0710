"""A URL's secrets are never shown: a presigned URL's query (its signature) and a URL's
userinfo (`user:password@`) appear in no message on stdout or stderr, in no `/proc/mounts` line,
and, once the program has read them, not in its own command line (`ps`, /proc/PID/cmdline) --
for `ckptfs`, every `ckpt` command that takes a source, and ckload.load, on their success and
error paths. Each check also looks at what still works: bytes are compared with what the
safetensors library reads from the served file."""
import hashlib
import os
import subprocess
import time
from pathlib import Path

import pytest

from test_http_faults import NAME, sample, server, srv, tensor_paths  # noqa: F401 (fixtures)
from ckptfs_testlib import assert_refused, ckpt_bin, ckptfs_pids, library_view, mount_entries

SECRETS = ("netlabUSER", "netlabPW", "netlab_SIG_SECRET")
HANG_BOUND = 60  # seconds: a command that takes longer has hung


@pytest.fixture(params=["presigned", "userinfo"])
def url(request, srv):
    """The served sample under a URL that holds secrets (the server ignores both)."""
    if request.param == "presigned":
        return srv.url(NAME) + "?X-Amz-Expires=60&X-Amz-Signature=netlab_SIG_SECRET#frag"
    return srv.url(NAME).replace("://", "://netlabUSER:netlabPW@", 1)


def assert_no_secret(*texts):
    for t in texts:
        t = t.decode(errors="replace") if isinstance(t, bytes) else str(t)
        for s in SECRETS:
            assert s not in t, f"{s!r} shown in {t!r}"


def ckpt(*args, ok=True):
    p = subprocess.run([str(ckpt_bin()), *map(str, args)], capture_output=True,
                       timeout=HANG_BOUND)
    if ok:
        assert p.returncode == 0, p.stderr
    else:
        assert p.returncode != 0 and p.stderr.startswith(b"ckpt: "), (p.returncode, p.stderr)
        assert p.stderr.count(b"\n") == 1, p.stderr
    assert_no_secret(p.stdout, p.stderr)
    return p


def test_mount_line_and_daemon_command_line(url, sample, mount):
    """The mount works (every tensor's bytes are the library's); its /proc/mounts line, the
    daemon's command line, the mount's index.json and its root's user.ckptfs.sources (what a
    loader reads) hold no secret, but still name the object."""
    _, _, want = sample
    with mount(url) as mnt:
        got = {n: hashlib.sha256(p.read_bytes()).hexdigest() for n, p in tensor_paths(mnt).items()}
        assert got == want
        (pid,) = ckptfs_pids(mnt)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        (line,) = [e for e in mount_entries() if e[1] == str(mnt)]
        sources = os.getxattr(mnt, "user.ckptfs.sources")
        assert_no_secret(cmdline, *line, Path("/proc/self/mountinfo").read_text(),
                         (mnt / ".ckptfs" / "index.json").read_bytes(), sources)
        assert line[0].endswith("/" + NAME), line
        assert sources.endswith(f"/{NAME}\0".encode()), sources
        assert f"/{NAME}".encode() in cmdline, cmdline


def test_refused_mount(url, srv, mountpoint):
    srv.fault("status", code=404)
    assert_no_secret(assert_refused(url, mountpoint, prefix=""))


def test_ckpt_success_paths(url, sample, tmp_path):
    """ls, info, cat, stats, diff against the local file, convert, pack and load: each works
    and shows no secret."""
    _, path, _ = sample
    tensors, _ = library_view(path)
    name = "layers.0.norm.weight"
    assert len(ckpt("ls", url).stdout.splitlines()) == len(tensors)
    assert ckpt("info", url).stdout.startswith(b"source: ")
    assert ckpt("cat", url, name).stdout == tensors[name][2]
    ckpt("stats", url, name)
    ckpt("diff", url, path)
    ckpt("convert", url, tmp_path / "out.safetensors")
    assert library_view(tmp_path / "out.safetensors")[0] == tensors
    ckpt("pack", url, tmp_path / "out.pack")
    ckpt("verify", tmp_path / "out.pack")
    ckpt("load", url, "--device", "cpu")


def test_ckpt_error_paths(url, srv, sample, tmp_path):
    """Messages that name the source: a tensor or pattern it lacks, a source that is not a pack;
    then every command on a source that answers 404."""
    _, path, _ = sample
    ckpt("cat", url, "no.such.tensor", ok=False)
    ckpt("stats", url, "no.such.*", ok=False)
    ckpt("verify", url, ok=False)
    srv.fault("status", code=404)
    for args in (["ls", url], ["info", url], ["cat", url, "x"], ["stats", url],
                 ["diff", path, url], ["convert", url, tmp_path / "o.safetensors"],
                 ["pack", url, tmp_path / "o.pack"], ["load", url, "--device", "cpu"]):
        ckpt(*args, ok=False)


@pytest.mark.parametrize("args", [["load", "{url}", "--device", "cpu"],
                                  ["pack", "{url}", "{out}/o.pack"],
                                  ["convert", "{url}", "{out}/o.safetensors"],
                                  ["ls", "{url}"]])
def test_ckpt_command_line(url, srv, tmp_path, args):
    """While a command runs (held by a server that stalls its first answer), its command line
    holds the URL without its secrets."""
    stall = srv.fault("stall", after=0, seconds=HANG_BOUND, times=1)
    p = subprocess.Popen([str(ckpt_bin()), *(a.format(url=url, out=tmp_path) for a in args)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + HANG_BOUND
        while not stall.hits and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stall.hits and p.poll() is None, "the command never reached the server"
        with open(f"/proc/{p.pid}/cmdline", "rb") as f:
            cmdline = f.read()
    finally:
        p.kill()
        p.communicate()
    assert_no_secret(cmdline)
    assert f"/{NAME}".encode() in cmdline, cmdline


def test_ckload_load(url, srv, sample):
    """ckload.load(URL) gives the library's bytes; its error names the object, not the secret."""
    import ckload
    import torch
    _, path, _ = sample
    tensors, _ = library_view(path)
    got = ckload.load(url, device="cpu")
    assert {n: t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            for n, t in got.items()} == {n: t[2] for n, t in tensors.items()}
    srv.fault("status", code=404)
    with pytest.raises(RuntimeError) as e:
        ckload.load(url, device="cpu")
    assert f"/{NAME}" in str(e.value)
    assert_no_secret(str(e.value))

