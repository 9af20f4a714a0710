"""libckload's boundary: the .so exports exactly the functions ckload.h declares; `make install`
puts the library, its header and a pkg-config file where a C program builds against them and
loads a pack byte-exact (against the safetensors library); ckload.py refuses a library whose ABI
version or struct layout differs from the structs it mirrors."""
import os
import re

import pytest
import torch
from safetensors.torch import save_file

import ckload
from ckptfs_testlib import REPO, build_dir, library_view, run
from test_pack import pack

HEADER = REPO / "loader" / "ckload.h"


def declared_functions():
    """The ckl_ functions ckload.h declares (its prototypes: a name followed by '(')."""
    return set(re.findall(r"\b(ckl_\w+)\(", HEADER.read_text()))


def test_only_the_api_is_exported():
    p = run(["nm", "-D", "--defined-only", build_dir() / "libckload.so"])
    assert p.returncode == 0, p.stderr
    exported = {line.split()[-1] for line in p.stdout.decode().splitlines() if line.strip()}
    assert exported == declared_functions(), exported ^ declared_functions()
    assert "ckl_to_dlpack" in exported


def test_soname_is_the_abi_version():
    p = run(["readelf", "-d", build_dir() / "libckload.so"])
    version = re.search(r"#define CKL_ABI_VERSION (\d+)", HEADER.read_text()).group(1)
    assert f"Library soname: [libckload.so.{version}]" in p.stdout.decode()


# --- make install, pkg-config, a C program -------------------------------------------------------

PROGRAM = r"""
#include <ckload.h>
#include <stdio.h>

/* Prints each tensor as "name dtype hex-bytes", or libckload's message (prefixed "prog: "). */
int main(int argc, char **argv)
{
    if (argc != 2 || ckl_abi_version() != CKL_ABI_VERSION ||
        ckl_layout("ckl_tensor") != (long)sizeof(ckl_tensor) ||
        ckl_layout("ckl_options.pool") != (long)offsetof(ckl_options, pool))
        return 3;
    ckl_options o;
    ckl_default_options(&o);
    o.device = CKL_CPU;
    o.verify = 1;
    char err[4096];
    ckl_load *l;
    if (ckl_load_start(argv[1], &o, &l, err, sizeof err) != 0) {
        fprintf(stderr, "prog: %s\n", err);
        return 1;
    }
    if (ckl_wait_all(l, err, sizeof err) != 0) {
        fprintf(stderr, "prog: %s\n", err);
        ckl_release(l);
        return 1;
    }
    for (size_t i = 0; i < ckl_count(l); i++) {
        const ckl_tensor *t = ckl_get(l, i);
        printf("%s %s ", t->name, t->dtype);
        for (uint64_t k = 0; k < t->nbytes; k++)
            printf("%02x", ((const unsigned char *)t->data)[k]);
        printf("\n");
    }
    ckl_release(l);
    return 0;
}
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """`make install DESTDIR=... PREFIX=/usr` of this build. `-o all`: the tree is built already
    (by whatever make variables built it), so only the install recipe runs."""
    dest = tmp_path_factory.mktemp("destdir")
    p = run(["make", "-s", "-C", REPO, "-o", "all", "install", f"DESTDIR={dest}", "PREFIX=/usr",
             f"BUILD={os.path.relpath(build_dir(), REPO)}"], timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    return dest


def test_install_lays_out_library_header_and_pkgconfig(installed):
    lib = installed / "usr/lib"
    version = re.search(r"#define CKL_ABI_VERSION (\d+)", HEADER.read_text()).group(1)
    assert os.readlink(lib / "libckload.so") == f"libckload.so.{version}"
    built = (build_dir() / "libckload.so").read_bytes()
    assert (lib / f"libckload.so.{version}").read_bytes() == built
    assert (installed / "usr/include/ckload.h").read_bytes() == HEADER.read_bytes()
    pc = (lib / "pkgconfig/ckload.pc").read_text()
    assert "prefix=/usr\n" in pc and f"Version: {version}\n" in pc and "@" not in pc


def test_c_program_builds_with_pkg_config_and_loads(installed, tmp_path):
    env = dict(os.environ, PKG_CONFIG_SYSROOT_DIR=str(installed),
               PKG_CONFIG_LIBDIR=str(installed / "usr/lib/pkgconfig"))
    flags = run(["pkg-config", "--cflags", "--libs", "ckload"], env=env)
    assert flags.returncode == 0, flags.stderr.decode()
    assert str(installed) in flags.stdout.decode()  # found there, not in a system directory
    (tmp_path / "prog.c").write_text(PROGRAM)
    cc = run(["cc", "-std=c11", "-Wall", "-Werror", tmp_path / "prog.c", "-o", tmp_path / "prog",
              *flags.stdout.decode().split()], timeout=120)
    assert cc.returncode == 0, cc.stderr.decode()

    g = torch.Generator().manual_seed(3)
    src = tmp_path / "s.safetensors"
    save_file({"b": torch.randn(7, 5, generator=g), "a.2": torch.arange(300, dtype=torch.int16),
               "a.10": torch.randn(3, generator=g).to(torch.bfloat16)}, str(src))
    out = pack(src, tmp_path / "s.pack")
    run_env = dict(os.environ, LD_LIBRARY_PATH=str(installed / "usr/lib"))
    p = run([tmp_path / "prog", out], env=run_env)
    assert p.returncode == 0, p.stderr.decode()
    got = [line.split(" ") for line in p.stdout.decode().splitlines()]
    want = library_view(src)[0]
    assert [name for name, _, _ in got] == ["a.2", "a.10", "b"]  # pack (natural) order
    for name, dtype, data in got:
        assert (dtype, bytes.fromhex(data)) == (want[name][0], want[name][2]), name

    missing = tmp_path / "none.pack"
    p = run([tmp_path / "prog", missing], env=run_env)
    err = p.stderr.decode()
    assert p.returncode == 1 and err.startswith(f"prog: {missing}: ") and "ckload" not in err, err


# --- the ABI check in ckload.py ------------------------------------------------------------------

def test_mirrors_match_the_library():
    lib = ckload.library()
    assert ckload._abi_mismatch(lib) is None
    assert lib.ckl_abi_version() == ckload.ABI_VERSION
    assert lib.ckl_layout(b"ckl_tensor.no_such_field") == -1


def refused(monkeypatch):
    monkeypatch.setattr(ckload, "_lib", None)  # load it again (restored after the test)
    with pytest.raises(RuntimeError) as e:
        ckload.library()
    msg = str(e.value)
    assert msg.startswith(f"ckload: {ckload._lib_path()}: does not match this ckload.py: "), msg
    assert "\n" not in msg and ckload._lib is None
    return msg


def test_another_abi_version_is_refused(monkeypatch):
    monkeypatch.setattr(ckload, "ABI_VERSION", ckload.ABI_VERSION + 1)
    assert refused(monkeypatch).endswith(
        f"ABI version {ckload.ABI_VERSION - 1}, this ckload.py expects {ckload.ABI_VERSION}")


def test_another_struct_layout_is_refused(monkeypatch):
    class Tensor(ckload._c.Structure):  # rank one byte wider than the library's
        _fields_ = [(n, ckload._c.c_uint16 if n == "rank" else t)
                    for n, t in ckload.Tensor._fields_]
    monkeypatch.setitem(ckload.MIRRORS, "ckl_tensor", Tensor)
    msg = refused(monkeypatch)
    assert msg.endswith("ckl_tensor.dtype_code: offset 41 in the library, 42 in ckload.py"), msg


def test_a_struct_of_another_size_is_refused(monkeypatch):
    class Options(ckload._c.Structure):  # a field the library does not have
        _fields_ = ckload.Options._fields_ + [("extra", ckload._c.c_void_p)]
    monkeypatch.setitem(ckload.MIRRORS, "ckl_options", Options)
    size = ckload._c.sizeof(ckload.Options)
    assert refused(monkeypatch).endswith(
        f"ckl_options: size {size} in the library, {size + 8} in ckload.py")

