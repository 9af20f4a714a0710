"""The wheel where users install it: a minimal Debian root (scripts/rootfs.py's minbase: python3,
fuse3, no -dev package, no libcurl) with a venv that pip installed the wheel into, as a user
would, and the host's torch 2.x (scripts/setup's .deps/torch2, with the CUDA toolkit's libraries
it loads at import) bound in read-only rather than copied: the same wheel files setup downloaded.

The root runs as a container: its own mount and PID namespaces, the host's network (the test
servers on 127.0.0.1), /dev bound (for /dev/fuse). Made once per test session from the cached
tarball; tests add their files under `host(PATH)` and run commands with `run`."""
import importlib.util
import os
import shutil
import subprocess

from ckptfs_testlib import build_dir, run as run_host

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORCH2_SITE = os.path.join(REPO, ".deps", "torch2", "lib", "python3.11", "site-packages")
CUDA_LIB = "/usr/local/cuda-13.0/lib"
VENV = "/venv"


def rootfs():
    """scripts/rootfs.py as a module: the one owner of root filesystems."""
    spec = importlib.util.spec_from_file_location("rootfs", os.path.join(REPO, "scripts", "rootfs.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_wheel = None


def built_wheel():
    """`make wheel`'s manylinux wheel (built once per test session)."""
    global _wheel
    if _wheel is None:
        p = run_host(["make", "-s", "-C", REPO, f"BUILD={build_dir()}", "-o", "all", "wheel"],
                     timeout=900)
        assert p.returncode == 0, p.stderr.decode()[-3000:]
        found = sorted((build_dir() / "dist").glob("ckptfs-*-manylinux_*.whl"))
        assert len(found) == 1, found
        _wheel = str(found[0])
    return _wheel


class Root:
    """A fresh root NAME (scripts/rootfs.py's ROOTS) under `where`, a venv in it with the wheel
    installed (none when wheel is None: `install` says what pip makes of one)."""

    def __init__(self, where, wheel, torch=True, name="minbase"):
        self.dir = str(where)
        self.torch = torch
        rootfs().extract(name, self.dir)
        if wheel:
            p = self.install(wheel)
            assert p.returncode == 0, p.stderr.decode()

    def install(self, wheel, venv=VENV):
        """`pip install WHEEL` into a fresh venv of the root's python3, as a user would: the
        CompletedProcess (pip refuses a wheel whose tag the root's libc does not meet)."""
        os.makedirs(self.host("/w"), exist_ok=True)
        shutil.copy(wheel, self.host("/w"))
        name = os.path.basename(wheel)
        p = self.run(["sh", "-c", f"python3 -m venv {venv} && {venv}/bin/pip install -q "
                      f"--no-index --no-deps --disable-pip-version-check /w/{name}"],
                     timeout=300)
        if p.returncode == 0 and self.torch:
            site = self.run(["sh", "-c", f"echo {venv}/lib/python3*/site-packages"]).stdout
            with open(self.host(site.decode().strip() + "/torch2.pth"), "w") as f:
                f.write("/opt/torch2\n")
        return p

    def host(self, path):
        """The host's path of `path` inside the root."""
        return os.path.join(self.dir, path.lstrip("/"))

    def binds(self):
        if not self.torch:
            return []
        return [(TORCH2_SITE, "/opt/torch2", True), (CUDA_LIB, CUDA_LIB, True)]

    def env(self, extra=None):
        env = {"LD_LIBRARY_PATH": CUDA_LIB} if self.torch else {}
        env.update(extra or {})
        return env

    def run(self, argv, env=None, timeout=120, binds=(), fuse="host", **kw):
        """argv inside the root (PATH has the venv's bin first); CompletedProcess, bytes.
        fuse: which /dev (rootfs.command's: "host", "device" or None)."""
        return subprocess.run(container(self, argv, env=env, binds=binds, fuse=fuse),
                              capture_output=True, timeout=timeout, **kw)

    def python(self, code, *args, env=None, timeout=300):
        return self.run([f"{VENV}/bin/python", "-c", code, *args], env=env, timeout=timeout)


def container(root, argv, env=None, binds=(), fuse="host", volumes=()):
    """The command that runs argv in root (what Root.run runs), for a caller that starts it itself
    (a long-running container: Popen) or gives it volumes shared with other containers
    (scripts/rootfs.py's `command`: the volumes' host directories shared mounts in a mount
    namespace the caller made)."""
    env = root.env(env)
    env.setdefault("PATH", f"{VENV}/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return rootfs().command(root.dir, argv, env=env, binds=root.binds() + list(binds),
                            fuse=fuse, volumes=volumes)
