"""setup.py — the ckload wheel's build step (pyproject.toml names setuptools): the module
(loader/python/ckload.py) becomes the package ckload, and libckload, compiled by the Makefile into
build/wheel, goes beside it under its soname, where ckload looks first after CKLOAD_LIB. The
version is the VERSION file's. The wheel is tagged for this platform, not for a Python version:
ckload reaches the library through ctypes."""
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


class BuildWithMake(build):
    """The package: ckload.py as its __init__, and the library the Makefile builds."""

    def run(self):
        super().run()
        # a plain build whatever make ran this (a sanitizer run passes SANITIZE down through
        # MAKEFLAGS): build/wheel's objects are then always the same kind, never a mix
        subprocess.check_call(["make", "-C", HERE, "BUILD=build/wheel", "SANITIZE=", "COVERAGE=",
                               "build/wheel/libckload.so"])
        pkg = os.path.join(self.build_lib, "ckload")
        os.makedirs(pkg, exist_ok=True)
        shutil.copyfile(os.path.join(HERE, "loader", "python", "ckload.py"),
                        os.path.join(pkg, "__init__.py"))
        shutil.copyfile(os.path.join(HERE, "build", "wheel", "libckload.so"),
                        os.path.join(pkg, soname()))


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
