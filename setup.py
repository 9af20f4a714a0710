"""setup.py — the ckptfs wheel's build step (pyproject.toml names setuptools), the programs
compiled by the Makefile into build/wheel:
  - ckload: the module (loader/python/ckload.py) as the package, libckload beside it under its
    soname, where ckload looks first after CKLOAD_LIB;
  - ckload_vllm: vLLM's load format `ckload` (its entry point: pyproject.toml);
  - ckptfs: the launcher of the `ckpt` and `ckptfs` commands (tools/python/ckptfs.py), the two
    programs in its bin/.
Each of the two directories also holds libckcurl.so, a library whose one dependency is libcurl,
so that `make wheel`'s auditwheel ships libcurl with the wheel; without libcurl's -dev files it
is left out and URL sources use the system's libcurl. The version is the VERSION file's. The
wheel is tagged for this platform, not for a Python version: nothing in it is an extension."""
import os
import re
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build import build

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))


def soname():
    header = open(os.path.join(HERE, "loader", "ckload.h")).read()
    return "libckload.so." + re.search(r"#define CKL_ABI_VERSION (\d+)", header).group(1)


def make(*targets):
    """make's targets in build/wheel, a plain build whatever make ran this (a sanitizer run
    passes SANITIZE down through MAKEFLAGS): build/wheel's objects are always the same kind."""
    return subprocess.call(["make", "-C", HERE, "BUILD=build/wheel", "SANITIZE=", "COVERAGE=",
                            *(f"build/wheel/{t}" for t in targets)])


class BuildWithMake(build):
    """The two packages, from the module, the launcher and the programs the Makefile builds."""

    def run(self):
        super().run()
        if make("libckload.so", "ckpt", "ckptfs"):
            raise SystemExit("setup.py: make failed (scripts/setup installs what it needs)")
        curl = make("libckcurl.so") == 0
        built = os.path.join(HERE, "build", "wheel")
        files = {"ckload/__init__.py": os.path.join(HERE, "loader", "python", "ckload.py"),
                 "ckload_vllm.py": os.path.join(HERE, "loader", "python", "ckload_vllm.py"),
                 f"ckload/{soname()}": os.path.join(built, "libckload.so"),
                 "ckptfs/__init__.py": os.path.join(HERE, "tools", "python", "ckptfs.py"),
                 "ckptfs/bin/ckpt": os.path.join(built, "ckpt"),
                 "ckptfs/bin/ckptfs": os.path.join(built, "ckptfs")}
        if curl:
            files["ckload/libckcurl.so"] = files["ckptfs/bin/libckcurl.so"] = \
                os.path.join(built, "libckcurl.so")
        for dest, src in files.items():
            dest = os.path.join(self.build_lib, dest)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copy(src, dest)  # with its mode: the programs stay executable


class WithLibrary(Distribution):
    """A distribution that holds a compiled library (so that it is installed, as platform
    files), though no extension module."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    """For any Python 3 of this platform: the library is reached through ctypes."""

    def get_tag(self):
        return ("py3", "none", super().get_tag()[2])


# setuptools' own scratch goes under build/setuptools, beside the Makefile's builds, not over them.
os.makedirs(os.path.join(HERE, "build", "setuptools"), exist_ok=True)
setup(version=open(os.path.join(HERE, "VERSION")).read().strip(), distclass=WithLibrary,
      packages=[], py_modules=[],  # no discovery: BuildWithMake makes the one package
      cmdclass={"build": BuildWithMake, "bdist_wheel": PlatformWheel},
      options={"build": {"build_base": "build/setuptools"},
               "egg_info": {"egg_base": "build/setuptools"}})
