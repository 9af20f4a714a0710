"""The ckptfs wheel (`make wheel`, `pip install .`): installed into a fresh venv beside a torch
(Debian's 1.13, and torch 2.x where scripts/setup made .deps/torch2), or with pip --target, it
loads a checkpoint from a directory outside the repository with no PYTHONPATH, CKLOAD_LIB or
LD_LIBRARY_PATH, through the libckload inside the package. Offline: pip is given the wheel
(or the tree) and the build tools this Python already has."""
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ckptfs_testlib import need_torch2, run, write_safetensors
from test_install import REPO, SONAME, SYSTEM_PYTHON, clean_env
from wheelroot import built_wheel

TORCH2 = REPO / ".deps" / "torch2"
CODE = ("import sys, ckload; sd = ckload.load(sys.argv[1], device='cpu'); "
        "print(ckload.__file__); print(ckload._lib_path()); "
        "print(sd['w'].numpy().tolist(), sd['b'].numpy().tolist())")


@pytest.fixture(scope="module")
def wheel(build):
    found = Path(built_wheel())
    version = (REPO / "VERSION").read_text().strip()
    assert found.name == f"ckptfs-{version}-py3-none-manylinux_2_34_x86_64.whl"
    return found


def checkpoint(d):
    return write_safetensors(d / "m.safetensors", [
        ("w", "F32", [2, 3], np.arange(6, dtype=np.float32).tobytes()),
        ("b", "I64", [4], np.arange(4, dtype=np.int64).tobytes())])


def venv(d, torch):
    """A fresh venv beside a torch: Debian's (the system site) or .deps/torch2's (a .pth)."""
    args = ["--system-site-packages"] if torch == "1.13" else []
    p = run([SYSTEM_PYTHON, "-m", "venv", *args, d], timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    if torch == "2.x":
        site = next((d / "lib").glob("python3*/site-packages"))
        (site / "torch2.pth").write_text(str(next(TORCH2.glob("lib/python3*/site-packages"))))
    return d / "bin" / "python"


def pip_install(python, *what):
    p = run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
             "--no-build-isolation", *what], timeout=600, env=clean_env(), cwd=REPO)
    assert p.returncode == 0, p.stderr.decode()


def check_load(python, where, tmp_path, env=None):
    """ckload, imported from where it was installed, loads a checkpoint from outside the repo."""
    src = checkpoint(tmp_path)
    p = subprocess.run([python, "-c", CODE, src], capture_output=True, cwd=tmp_path,
                       env=env or clean_env(), timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    mod, lib, values = p.stdout.decode().splitlines()
    assert Path(mod) == where / "ckload" / "__init__.py"
    assert Path(lib) == where / "ckload" / SONAME
    assert values == "[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] [0, 1, 2, 3]"


def site_of(python):
    p = run([python, "-c", "import sysconfig; print(sysconfig.get_path('platlib'))"])
    return Path(p.stdout.decode().strip())


@pytest.mark.parametrize("torch", ["1.13", "2.x"])
def test_wheel_in_a_fresh_venv(wheel, tmp_path, torch):
    if torch == "2.x":
        need_torch2()
    python = venv(tmp_path / "venv", torch)
    pip_install(python, wheel)
    check_load(python, site_of(python), tmp_path)
    p = run([python, "-c", "import torch; print(torch.__version__)"], env=clean_env())
    assert p.stdout.decode().startswith("1.13" if torch == "1.13" else "2."), p.stdout


def test_pip_install_of_the_tree(wheel, tmp_path):
    """`pip install .` builds the same package from the source tree."""
    python = venv(tmp_path / "venv", "1.13")
    pip_install(python, ".")
    check_load(python, site_of(python), tmp_path)


def test_pip_install_target(wheel, tmp_path):
    target = tmp_path / "target"
    pip_install(SYSTEM_PYTHON, "--target", target, wheel)
    check_load(SYSTEM_PYTHON, target, tmp_path, env={**clean_env(), "PYTHONPATH": str(target)})


def test_without_torch_the_import_says_so(wheel, tmp_path):
    python = venv(tmp_path / "venv", "none")
    pip_install(python, wheel)
    p = subprocess.run([python, "-c", "import ckload"], capture_output=True, cwd=tmp_path,
                       env=clean_env(), timeout=60)
    assert p.returncode == 1
    assert "ImportError: ckload needs torch" in p.stderr.decode(), p.stderr.decode()
