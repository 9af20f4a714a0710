"""The Debian package (`make deb`) where users install it: a fresh minimal Debian root
(scripts/rootfs.py's minbase: python3, fuse3, no -dev package, no libcurl), run as a container is,
with the host's network. `apt-get install ./ckptfs_*.deb` resolves its dependencies from Debian's
mirror; then, in that one root, in order: the commands tell VERSION, `man` shows the pages, an
/etc/fstab line mounts a checkpoint through mount.fuse.ckptfs with `mount -a` and the tensors'
bytes are the safetensors library's, Debian's python3 imports ckload and loads the checkpoint
through the package's libckload, and `apt-get remove --purge` leaves nothing of the package.
A second fresh root installs it without Recommends: local checkpoints work, a URL says in one
line what to install. And lintian finds no error in the package.

Nothing here skips: no mmdebstrap, no lintian or no route to Debian's mirror fails with one line.
"""
import os
import shutil
import subprocess

import pytest
import safetensors.numpy
import numpy as np

from ckptfs_testlib import library_view, run
from test_install import REPO, SONAME
from wheelroot import CUDA_LIB, TORCH2_SITE, rootfs

VERSION = (REPO / "VERSION").read_text().strip()
MULTIARCH = "/usr/lib/x86_64-linux-gnu"
# The libraries the programs link, beyond libc and zlib (the package's Depends, which
# dpkg-shlibdeps computes). The minbase root has libfuse3-3 (fuse3's) and libxxhash0 (apt's),
# not libcJSON, liburing or libcurl: apt-get must bring those from the mirror.
LINKED = ("libcjson1", "libfuse3-3", "liburing2", "libxxhash0")
FROM_MIRROR = ("libcjson1", "liburing2", "libcurl4")
TORCH_AT = "/opt/torch2"
# Paths a root changes by running at all (apt's and dpkg's state, caches, logs, mount(8)'s
# /run/mount) or that the test makes (its files, the binds' mountpoints): left out of the
# before/after comparison. dpkg's own record of the package is checked separately.
VOLATILE = ("var/cache/", "var/log/", "var/lib/apt/", "var/lib/dpkg/", "tmp/", "run/", "data/",
            "out/", TORCH_AT[1:] + "/", os.path.dirname(CUDA_LIB)[1:] + "/")


def plain_env():
    """This environment without a sanitizer run's preloads or the calling make's flags: nothing
    here is instrumented (`make deb` builds its own tree), and the root's commands must not be
    told to preload a library the root lacks."""
    return {k: v for k, v in os.environ.items() if k not in (
        "LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}


def need(program, why):
    if not shutil.which(program):
        pytest.fail(f"{program} IS MISSING ({why}): scripts/setup installs it")


@pytest.fixture(scope="module")
def deb():
    need("dpkg-deb", "make deb builds the package with it")
    p = run(["make", "-s", "-C", REPO, "deb"], timeout=600, env=plain_env())
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    path = REPO / "build" / f"ckptfs_{VERSION}_amd64.deb"
    assert p.stdout.decode().split() == [str(path.relative_to(REPO))], p.stdout
    return path


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    src = tmp_path_factory.mktemp("deb") / "m.safetensors"
    safetensors.numpy.save_file({"enc.w": np.arange(300, dtype=np.float32),
                                 "enc.b": np.arange(-3, 4, dtype=np.int16)}, str(src))
    return src


class System:
    """A fresh extraction of the minbase root under `where`, with Debian's package lists, the
    checkpoint at /data/m.safetensors and the package at /data/; commands run in it with `sh`."""

    def __init__(self, where, deb, source):
        need("mmdebstrap", "the minimal Debian root is made with it, once per machine")
        self.dir = str(where)
        rootfs().extract("minbase", self.dir)
        os.makedirs(self.host("/data"))
        os.makedirs(self.host("/out"))
        os.makedirs(self.host("/mnt/ckpt"))
        shutil.copy(deb, self.host("/data"))
        shutil.copy(source, self.host("/data/m.safetensors"))
        self.deb = "/data/" + deb.name
        p = self.sh("apt-get update -qq", timeout=300)
        if p.returncode != 0:
            last = (p.stderr.decode().strip().splitlines() or ["no output"])[-1]
            pytest.fail(f"NO ROUTE TO DEBIAN'S MIRROR: apt-get update in the root failed ({last}); "
                        f"the .deb test installs the package's dependencies from it")

    def host(self, path):
        return os.path.join(self.dir, path.lstrip("/"))

    def sh(self, script, timeout=120, env=None, binds=()):
        env = {"DEBIAN_FRONTEND": "noninteractive", **(env or {})}
        cmd = rootfs().command(self.dir, ["sh", "-ec", script], env=env, binds=binds)
        return run(cmd, timeout=timeout, env=plain_env())

    def ok(self, script, **kw):
        p = self.sh(script, **kw)
        assert p.returncode == 0, (script, p.stdout.decode()[-2000:], p.stderr.decode()[-2000:])
        return p.stdout.decode()

    def installed(self):
        out = self.ok("dpkg-query -W -f '${Package} ${db:Status-Abbrev}\\n'")
        return {line.split()[0] for line in out.splitlines() if line.split()[1:] == ["ii"]}

    def files(self):
        """Every path in the root but the volatile ones, relative to it."""
        found = set()
        for top, dirs, names in os.walk(self.dir):
            rel = os.path.relpath(top, self.dir)
            for n in dirs + names:
                path = n if rel == "." else f"{rel}/{n}"
                if not (path + "/").startswith(VOLATILE):
                    found.add(path)
        return found


@pytest.fixture(scope="module")
def system(tmp_path_factory, deb, source):
    """The root the install checks share, in this file's order: man-db first (for `man`), the
    file list then, the package after."""
    where = tmp_path_factory.mktemp("debroot")
    s = System(where, deb, source)
    s.ok("apt-get install -y -q --no-install-recommends man-db", timeout=300)
    s.before, s.before_pkgs = s.files(), s.installed()
    assert not s.before_pkgs & {"ckptfs", *FROM_MIRROR}, sorted(s.before_pkgs)
    s.ok(f"apt-get install -y -q {s.deb}", timeout=300)
    yield s
    shutil.rmtree(where, ignore_errors=True)


def test_install_resolves_dependencies(system):
    """Every library the programs link came from the mirror, and libcurl4 as the Recommends."""
    assert {"ckptfs", "fuse3", *LINKED, *FROM_MIRROR} <= system.installed()
    control = system.ok("dpkg-query -W -f '${Depends}\\n${Recommends}\\n' ckptfs").splitlines()
    depends = {d.split()[0] for d in control[0].split(", ")}
    assert depends == {"libc6", "zlib1g", "fuse3", *LINKED}, control
    assert control[1] == "libcurl4", control


def test_commands_tell_the_version(system):
    for exe in ("ckpt", "ckptfs"):
        assert system.ok(f"{exe} --version").startswith(f"{exe} {VERSION}")


def man_name(page):
    """The NAME line of man/PAGE, as man renders it: the words after the dash."""
    lines = (REPO / "man" / page).read_text().splitlines()
    return lines[lines.index(".SH NAME") + 1].split(r"\- ", 1)[1]


@pytest.mark.parametrize("section,page", [("1", "ckpt"), ("1", "ckptfs"),
                                          ("8", "mount.fuse.ckptfs"), ("3", "libckload")])
def test_man(system, section, page):
    """`man PAGE` (man-db, from the compressed page the package installed)."""
    out = system.ok(f"man {section} {page}", env={"MANPAGER": "cat", "MANWIDTH": "100"})
    assert man_name(f"{page}.{section}") in " ".join(out.split()), out[:500]
    assert os.path.exists(system.host(f"/usr/share/man/man{section}/{page}.{section}.gz"))


def test_fstab_line_mounts_with_mount_a(system, source):
    """mount(8) looks for /sbin/mount.fuse.ckptfs for a fuse.ckptfs line; /sbin is /usr/sbin on
    Debian (merged /usr), where the package puts it. The daemon is the helper's (its added
    noauto_unmount, not fuse3's generic mount.fuse), the bytes are the safetensors library's."""
    out = system.ok("""
readlink -f /sbin/mount.fuse.ckptfs > /out/helper
echo '/data/m.safetensors /mnt/ckpt fuse.ckptfs allow_other,nofail 0 0' >> /etc/fstab
mount -a
grep ' /mnt/ckpt ' /proc/self/mountinfo > /out/entry
for f in /proc/[0-9]*/comm; do
    if [ "$(cat "$f")" = ckptfs ]; then tr '\\0' ' ' < "${f%comm}cmdline" > /out/cmdline; fi
done
cat /mnt/ckpt/enc/w > /out/enc.w
cat /mnt/ckpt/enc/b > /out/enc.b
umount /mnt/ckpt
""")

    def read(name):
        with open(system.host("/out/" + name), "rb") as f:
            return f.read()
    assert read("helper").decode().strip() == "/usr/sbin/mount.fuse.ckptfs"
    assert " fuse.ckptfs /data/m.safetensors " in read("entry").decode(), read("entry")
    assert read("cmdline").decode().split() == [
        "/usr/sbin/../bin/ckptfs", "-o", "rw,allow_other,nofail,noauto_unmount",
        "/data/m.safetensors", "/mnt/ckpt"], read("cmdline")
    lib, _ = library_view(source)
    assert read("enc.w") == lib["enc.w"][2]
    assert read("enc.b") == lib["enc.b"][2]
    assert out == ""


LOAD = """
import sys, ckload
sd = ckload.load("/data/m.safetensors", device="cpu")
print(ckload.__file__); print(ckload._lib_path())
for name in ("enc.w", "enc.b"):
    open("/out/load." + name, "wb").write(sd[name].numpy().tobytes())
"""


def test_debian_python_loads_through_the_package(system, source):
    """Debian's python3 finds ckload in /usr/lib/python3/dist-packages and it loads through the
    package's libckload (Debian's libraries only); torch is the host's 2.x, bound in read-only."""
    if not os.path.isdir(TORCH2_SITE):
        pytest.fail(f"{TORCH2_SITE} IS MISSING: scripts/setup installs torch 2.x there")
    binds = [(TORCH2_SITE, TORCH_AT, True)]
    env = {"PYTHONPATH": TORCH_AT}
    if os.path.isdir(CUDA_LIB):  # the CUDA libraries torch 2.x's wheel loads at import
        binds.append((CUDA_LIB, CUDA_LIB, True))
        env["LD_LIBRARY_PATH"] = CUDA_LIB
    with open(system.host("/data/load.py"), "w") as f:
        f.write(LOAD)
    out = system.ok("cd / && python3 /data/load.py", binds=binds, env=env, timeout=300).split()
    assert out == ["/usr/lib/python3/dist-packages/ckload.py", f"{MULTIARCH}/{SONAME}"], out
    lib, _ = library_view(source)
    for name in ("enc.w", "enc.b"):
        assert open(system.host("/out/load." + name), "rb").read() == lib[name][2]


def test_library_header_and_pkg_config_file(system):
    """libckload in the linker's cache after the install (lintian checks that the package
    triggers ldconfig: its dependencies' triggers would run it here anyway), its build link,
    header and pkg-config file where that file says."""
    cache = system.ok("ldconfig -p")
    assert f"\t{SONAME} (libc6,x86-64) => " in cache, cache
    with open(system.host(f"{MULTIARCH}/pkgconfig/ckload.pc")) as f:
        pc = f.read()
    assert f"libdir={MULTIARCH}\n" in pc and "prefix=/usr\n" in pc, pc
    assert os.path.exists(system.host("/usr/include/ckload.h"))
    assert os.readlink(system.host(f"{MULTIARCH}/libckload.so")) == SONAME


def test_remove_purge_leaves_nothing(system):
    """Last: it removes the package from the shared root. After `apt-get remove --purge` no file
    the package had (nor the bytecode of ckload that its postinst and imports made) is left;
    after autoremove of its dependencies the root's file list is what it was before install."""
    owned = system.ok("dpkg -L ckptfs").split()
    assert "/usr/lib/python3/dist-packages/ckload.py" in owned
    system.ok("apt-get remove -y -q --purge ckptfs", timeout=300)
    assert "ckptfs" not in system.installed()
    left = [p for p in owned if os.path.lexists(system.host(p)) and
            not os.path.isdir(system.host(p))]
    assert left == []
    new = system.files() - system.before
    assert [p for p in new if "ckptfs" in p or "ckload" in p] == [], sorted(new)
    assert not [n for n in os.listdir(system.host("/var/lib/dpkg/info")) if "ckptfs" in n]
    system.ok("apt-get autoremove -y -q --purge", timeout=300)
    assert system.installed() == system.before_pkgs
    after = system.files()
    assert (sorted(after - system.before), sorted(system.before - after)) == ([], [])


def test_without_recommends_local_files_work_and_a_url_says_what_to_install(tmp_path, deb,
                                                                             source):
    """A fresh root, `--no-install-recommends` (as container images install): no libcurl, a
    local checkpoint lists, and a URL source fails with one line naming Debian's package."""
    s = System(tmp_path / "root", deb, source)
    try:
        s.ok(f"apt-get install -y -q --no-install-recommends {s.deb}", timeout=300)
        assert "libcurl4" not in s.installed()
        assert "enc.w" in s.ok("ckpt ls /data/m.safetensors")
        p = s.sh("ckpt ls http://127.0.0.1:9/m.safetensors")
        err = p.stderr.decode()
        assert p.returncode == 1 and p.stdout == b"", (p.returncode, p.stdout, err)
        assert err == ("ckpt: http://127.0.0.1:9/m.safetensors: cannot load libcurl.so.4 "
                       "(Debian: libcurl4)\n"), err
    finally:
        shutil.rmtree(tmp_path / "root", ignore_errors=True)


def test_lintian_finds_no_error(deb):
    """lintian's errors fixed; the warnings kept are docs/DEBIAN.md's, and only those."""
    need("lintian", "it checks the package against Debian's policy")
    p = run(["lintian", "--no-tag-display-limit", "--color", "never", deb], timeout=300,
            env=plain_env())
    tags = sorted({line.split()[2] for line in p.stdout.decode().splitlines()
                   if line[:2] in ("E:", "W:")})
    assert tags == ["link-to-shared-library-in-wrong-package",
                    "package-name-doesnt-match-sonames"], p.stdout.decode()
