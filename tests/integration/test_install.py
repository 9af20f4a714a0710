"""`make install`: what it puts where, and that the installed pieces work from outside the
repository — `import ckload` in the system Python finds the installed libckload with no
PYTHONPATH, CKLOAD_LIB or LD_LIBRARY_PATH; the binaries and man pages tell the version the
VERSION file holds and the options --help names."""
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ckptfs_testlib import build_dir, run, write_safetensors

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"
# The soname's number: the ABI version ckload.h owns.
SONAME = "libckload.so." + re.search(r"#define CKL_ABI_VERSION (\d+)",
                                     (REPO / "loader/ckload.h").read_text()).group(1)


def clean_env():
    """The environment without anything that points Python or the loader at the build tree
    (the sanitizer run's LD_PRELOAD and ASAN_OPTIONS stay: the library needs them)."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "CKLOAD_LIB", "LD_LIBRARY_PATH", "CKPTFS_BUILD")}


def make_install(*args):
    """`make install` of the build under test (-o all: nothing is rebuilt)."""
    p = run(["make", "-s", "-C", REPO, "-o", "all", f"BUILD={build_dir()}", "install", *args],
            timeout=120)
    assert p.returncode == 0, p.stderr.decode()


def installed_module(root):
    found = list(Path(root).rglob("ckload.py"))
    assert len(found) == 1, found
    return found[0]


@pytest.fixture(scope="module")
def prefix(tmp_path_factory, build):
    pfx = tmp_path_factory.mktemp("prefix")
    make_install(f"PREFIX={pfx}")
    return pfx


def test_files_in_place(prefix):
    for f in ("bin/ckptfs", "bin/ckpt", "sbin/mount.fuse.ckptfs", "share/man/man1/ckptfs.1",
              "share/man/man1/ckpt.1", f"lib/{SONAME}", "lib/libckload.so",
              "include/ckload.h", "lib/pkgconfig/ckload.pc"):
        assert (prefix / f).exists(), f
    assert os.readlink(prefix / "lib/libckload.so") == SONAME
    assert f"prefix={prefix}" in (prefix / "lib/pkgconfig/ckload.pc").read_text()


def test_version_from_one_place(prefix):
    version = (REPO / "VERSION").read_text().strip()
    for exe in ("ckptfs", "ckpt"):
        p = run([prefix / "bin" / exe, "--version"])
        assert p.returncode == 0, p.stderr
        assert p.stdout.decode().startswith(f"{exe} {version}"), p.stdout


def test_import_from_anywhere(prefix, tmp_path):
    """The installed module, from a directory outside the repository, with only PREFIX's site
    directory added (what PREFIX=/usr/local or /usr gets from the system Python unasked: see
    test_site_dir_is_on_the_system_path), loads a checkpoint through the installed library."""
    src = write_safetensors(tmp_path / "m.safetensors", [
        ("w", "F32", [2, 3], np.arange(6, dtype=np.float32).tobytes()),
        ("b", "I64", [4], np.arange(4, dtype=np.int64).tobytes())])
    site = installed_module(prefix).parent
    code = ("import site, sys; site.addsitedir(sys.argv[1]); import ckload, numpy as np; "
            "sd = ckload.load(sys.argv[2], device='cpu'); "
            "print(ckload.__file__); print(ckload._lib_path()); "
            "print(sd['w'].numpy().tolist(), sd['b'].numpy().tolist())")
    p = subprocess.run([SYSTEM_PYTHON, "-c", code, site, src], capture_output=True,
                       cwd=tmp_path, env=clean_env(), timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    mod, lib, values = p.stdout.decode().splitlines()
    assert Path(mod) == site / "ckload.py"
    assert lib == f"{prefix}/lib/{SONAME}"
    assert values == "[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] [0, 1, 2, 3]"


@pytest.mark.parametrize("pfx", ["/usr/local", "/usr"])
def test_site_dir_is_on_the_system_path(pfx, tmp_path, build):
    """For the usual prefixes, the module lands in a directory the system Python searches by
    itself (checked with -I: no PYTHON* variables, no user site), and names the library's final
    path, not DESTDIR's."""
    dest = tmp_path / "dest"
    make_install(f"DESTDIR={dest}", f"PREFIX={pfx}")
    mod = installed_module(dest)
    final = Path("/") / mod.parent.relative_to(dest)
    p = subprocess.run([SYSTEM_PYTHON, "-I", "-c", "import sys; print('\\n'.join(sys.path))"],
                       capture_output=True, env=clean_env(), cwd=tmp_path)
    assert str(final) in p.stdout.decode().splitlines(), (final, p.stdout)
    assert f'_INSTALLED_LIB = "{pfx}/lib/{SONAME}"' in mod.read_text()


def test_man_pages_name_every_option_and_command(prefix):
    """ckptfs.1 has each -o option that --help lists; ckpt.1 each command ckpt --help lists."""
    help_fs = run([prefix / "bin/ckptfs", "--help"]).stdout.decode()
    ours = help_fs.split("ckptfs options:\n")[1].split("\n\n")[0]  # not libfuse's
    page = (prefix / "share/man/man1/ckptfs.1").read_text().replace("\\-", "-")
    for opt in re.findall(r"^\s+-o (\w+)", ours, re.M):
        assert re.search(rf"-o {opt}\b", page), opt
    for fmt in ("safetensors", "PyTorch", "pack", "GGUF", "NumPy"):
        assert fmt in help_fs and fmt in page, fmt
    help_ckpt = run([prefix / "bin/ckpt", "--help"]).stdout.decode()
    page = (prefix / "share/man/man1/ckpt.1").read_text().replace("\\-", "-")
    for cmd in re.findall(r"^  ckpt (\w+)", help_ckpt, re.M):
        assert f"ckpt {cmd}" in page, cmd
    for page_file in ("ckptfs.1", "ckpt.1"):
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # not the ASan run's
        p = run(["groff", "-man", "-ww", "-z", prefix / "share/man/man1" / page_file], env=env)
        assert p.returncode == 0 and not p.stderr, p.stderr
