"""libckload given a path inside a ckptfs mount (loader/mount.h): it reads the mount's source files
directly when it may (the bypass), and through the mount when it may not — the source hidden in
a mount namespace, unreadable to the loading user, or replaced or changed since mounting — or
when CKLOAD_BYPASS=0; the root, .ckptfs/checkpoint.pack, a directory and a tensor file stand for
the tensors under them. Byte-exact against torch.load and the safetensors library; a changed
source never yields its new bytes. A mount of a remote source has no sources a loader could
open: it is read through the mount, and its root names the URL without its secrets."""
import hashlib
import json
import os

import pytest
import torch
from safetensors.torch import save_file

import ckload
import netlab
from ckptfs_testlib import ckptfs_bin, library_view, run, unmount
from test_containers import NOBODY, open_dir  # noqa: F401 (a fixture)
from test_load import SOURCES, check_load, ckpt_load, expected_tensors, load_error
from test_pack import safetensors_source, torch_source


def load(path, **kw):
    """(read_path, {name: tensor}) of a host load of path."""
    with ckload.Load(path, device="cpu", **kw) as ld:
        ld.wait_all()
        return ld.read_path, {ld.name(i): ld.tensor(i) for i in range(len(ld))}


@pytest.fixture(params=["1", "0"], ids=["bypass", "no-bypass"])
def bypass(request, monkeypatch):
    """Each test twice: with the bypass, and with CKLOAD_BYPASS=0 (through the mount)."""
    monkeypatch.setenv("CKLOAD_BYPASS", request.param)
    return "bypass" if request.param == "1" else "mount"


@pytest.mark.parametrize("kind", SOURCES)
def test_whole_mount_byte_exact(tmp_path, mount, kind, bypass):
    src = SOURCES[kind](tmp_path)
    expected = expected_tensors(src)
    with mount(src) as mnt:
        for path in (mnt, mnt / ".ckptfs" / "checkpoint.pack"):
            how, sd = load(path, verify=True)
            assert how == bypass, path
            check_load(sd, expected)


def test_subtree_and_single_file(tmp_path, mount, bypass):
    """A directory loads the tensors under it, a tensor file that tensor; paths come from the
    mount's index.json, so names that need escaping are found as the mount shows them."""
    src = tmp_path / "s.safetensors"
    g = torch.Generator().manual_seed(8)
    save_file({"layers.0.w": torch.randn(5, generator=g), "layers.1.w": torch.randn(7, generator=g),
               "layers.10.b": torch.randn(3, generator=g), "odd..name/x": torch.randn(2, generator=g),
               "layers": torch.randn(4, generator=g), "head": torch.randn(6, generator=g)},
              str(src))
    expected = expected_tensors(src)
    with mount(src) as mnt:
        index = json.loads((mnt / ".ckptfs" / "index.json").read_text())
        path_of = {t["name"]: t["path"] for t in index["tensors"]}
        how, sd = load(mnt / "layers")
        assert how == bypass
        check_load(sd, {n: expected[n] for n in ("layers.0.w", "layers.1.w", "layers.10.b")})
        for name in expected:
            how, sd = load(mnt / path_of[name])
            assert how == bypass
            check_load(sd, {name: expected[name]})
        how, sd = load(mnt / "layers", only="layers.1*")
        check_load(sd, {n: expected[n] for n in ("layers.1.w", "layers.10.b")})
        p = ckpt_load(mnt / "layers" / "1", "--device", "cpu")
        assert p.returncode == 0, p.stderr
        words = ("read from the sources, bypassing the mount" if bypass == "bypass"
                 else "read through the mount")
        assert " 1 tensors, " in p.stdout.decode() and words in p.stdout.decode(), p.stdout


def test_a_value_file_holds_no_tensor(tmp_path, mount, bypass):
    src = torch_source(tmp_path)
    with mount(src) as mnt:
        index = json.loads((mnt / ".ckptfs" / "index.json").read_text())
        value = mnt / index["values"][0]["path"]
        assert load_error(value, device="cpu").endswith(": holds no tensor")


@pytest.mark.parametrize("change", ["replaced", "rewritten"])
def test_a_changed_source_never_yields_new_bytes(tmp_path, mount, change):
    """The source replaced by another file, or rewritten in place with other bytes of the same
    size, after mounting: the bypass refuses it (not the file the mount parsed) and the mount
    refuses to serve it, so the load fails rather than return the new bytes."""
    src = safetensors_source(tmp_path)
    old = expected_tensors(src)
    other = tmp_path / "other.safetensors"
    save_file({n: torch.full(list(shape), 7, dtype=torch.float32) if dtype == "F32" else
               torch.zeros(list(shape), dtype=torch.bfloat16 if dtype == "BF16" else torch.int64)
               for n, (dtype, shape, _) in old.items()}, str(other), metadata={"format": "pt",
                                                                                "note": "x"})
    assert os.path.getsize(other) == os.path.getsize(src)
    with mount(src) as mnt:
        if change == "replaced":
            os.replace(other, src)
        else:
            st = os.stat(src)
            with open(src, "r+b") as f:
                f.write(other.read_bytes())
            os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
        for env in ("1", "0"):
            os.environ["CKLOAD_BYPASS"] = env
            try:
                how, sd = load(mnt)
            except RuntimeError as e:
                assert str(e).startswith("ckload: "), e
                continue
            finally:
                del os.environ["CKLOAD_BYPASS"]
            check_load(sd, old)  # only the old bytes may come back


# --- the bypass refused: the loader cannot see or read the source -------------------------------

CHILD = """
import hashlib, json, sys
import ckload
with ckload.Load(sys.argv[1], device="cpu") as ld:
    ld.wait_all()
    print(json.dumps({"read_path": ld.read_path,
                      "sha": {ld.name(i): hashlib.sha256(ld.tensor(i).numpy().tobytes()).hexdigest()
                              for i in range(len(ld))}}))
"""


def child_env():
    return dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", ""))


def expected_sha(src):
    return {n: hashlib.sha256(data).hexdigest() for n, (_, _, data) in library_view(src)[0].items()}


def plain_source(d):
    d.mkdir(parents=True, exist_ok=True)
    src = d / "m.safetensors"
    save_file({"enc.w": torch.arange(300, dtype=torch.float32),
               "enc.b": torch.ones(7, dtype=torch.int16)}, str(src))
    return src


def child_result(p):
    assert p.returncode == 0, p.stderr.decode()
    return json.loads(p.stdout)


def test_source_hidden_in_a_mount_namespace(tmp_path, mount):
    """A container that sees the mount but not its source (a tmpfs over the source's
    directory, `unshare -m`): the load goes through the mount, byte-exact."""
    src = plain_source(tmp_path / "src")
    with mount(src) as mnt:
        script = (f"mount -t tmpfs tmpfs {tmp_path / 'src'} && test ! -e {src} && "
                  f"exec /usr/bin/python3 -c '{CHILD}' {mnt}")
        p = run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], timeout=60,
                env=child_env())
        got = child_result(p)
        assert got["read_path"] == "mount"
        assert got["sha"] == expected_sha(src)
        # Outside that namespace the same mount is bypassed.
        p = run(["/usr/bin/python3", "-c", CHILD, mnt], timeout=60, env=child_env())
        assert child_result(p)["read_path"] == "bypass"


def test_source_unreadable_to_the_loading_user(open_dir):
    """An allow_other mount of a source that only root may read: `nobody` reads the mount, but
    the bypass would open the source with nobody's credentials and is refused; the load goes
    through the mount. Nothing is gained in privilege."""
    src = plain_source(open_dir / "src")
    os.chmod(src, 0o600)
    mnt = open_dir / "m"
    mnt.mkdir()
    r = run([ckptfs_bin(), "-o", "allow_other", src, mnt])
    assert r.returncode == 0, r.stderr
    try:
        p = run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                 "/usr/bin/python3", "-c", CHILD, mnt], timeout=60, env=child_env())
        got = child_result(p)
        assert got["read_path"] == "mount"
        assert got["sha"] == expected_sha(src)
        p = run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                 "/usr/bin/python3", "-c", CHILD, src], timeout=60, env=child_env())
        assert p.returncode != 0 and b"Permission denied" in p.stderr  # not readable directly
        assert load(mnt)[0] == "bypass"  # root may read the source
    finally:
        unmount(mnt)


# --- a remote source: nothing to bypass the mount with ------------------------------------------

SECRET = "S3CR3T"


@pytest.fixture
def served(tmp_path):
    """(server, file): a safetensors file written by the safetensors library, served by netlab's
    nginx on 127.0.0.1."""
    d = tmp_path / "served"
    d.mkdir()
    g = torch.Generator().manual_seed(12)
    save_file({"enc.w": torch.randn(300, generator=g), "enc.b": torch.arange(7, dtype=torch.int16),
               "dec.w": torch.randn(4, 5, generator=g).to(torch.bfloat16)},
              str(d / "m.safetensors"))
    with netlab.Nginx(d) as srv:
        yield srv, d / "m.safetensors"


def test_remote_source_loads_through_the_mount(served, mount, bypass):
    """A mount of an http:// source whose URL carries userinfo (what a sidecar mounting a remote
    checkpoint beside a loader gives it): the root, the pack, a directory and `ckpt load` read
    through the mount, byte-exact against the safetensors library, whatever CKLOAD_BYPASS says;
    the root's user.ckptfs.sources names the URL without its userinfo."""
    srv, src = served
    url = srv.url("m.safetensors").replace("://", f"://user:{SECRET}@", 1)
    expected = expected_tensors(src)
    with mount(url) as mnt:
        for path in (mnt, mnt / ".ckptfs" / "checkpoint.pack"):
            how, sd = load(path, verify=True)
            assert how == "mount", path
            check_load(sd, expected)
        how, sd = load(mnt / "enc")
        assert how == "mount"
        check_load(sd, {n: expected[n] for n in ("enc.w", "enc.b")})
        assert set(ckload.load(mnt, device="cpu")) == set(expected)
        p = ckpt_load(mnt / "dec", "--device", "cpu")
        assert p.returncode == 0, p.stderr
        assert " 1 tensors, " in p.stdout.decode(), p.stdout
        assert "read through the mount" in p.stdout.decode(), p.stdout
        assert SECRET.encode() not in p.stdout + p.stderr
        sources = os.getxattr(mnt, "user.ckptfs.sources")
        assert SECRET.encode() not in sources and b"user" not in sources, sources
        assert sources == srv.url("m.safetensors").encode() + b"\0", sources  # no file records
