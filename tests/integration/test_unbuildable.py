"""A source that mounts but whose pack cannot be built (tensors "" and "a": a pack allows the
empty name only for its one entry): .ckptfs/checkpoint.pack answers EIO to stat, open and read,
never an empty or short file; the daemon logs the line `ckpt pack` prints, once; everything
else in the mount is served as usual."""
import errno
import os
import subprocess

import numpy as np
import pytest
import safetensors.numpy
from safetensors import deserialize

from ckptfs_testlib import (ckpt_bin, ckptfs_bin, is_mounted, library_view, read_index, run,
                            unmount, wait_until)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    src = tmp_path_factory.mktemp("unbuildable") / "s.safetensors"
    safetensors.numpy.save_file({"": np.arange(4, dtype=np.float32),
                                 "a": np.arange(3, dtype=np.int16)}, str(src))
    return src


def pack_line(source, tmp_path):
    """What `ckpt pack` says about source, with ckptfs's name: the line the daemon logs."""
    p = run([ckpt_bin(), "pack", source, tmp_path / "out.pack"])
    err = p.stderr.decode()
    assert p.returncode == 1 and err.count("\n") == 1 and err.startswith("ckpt: "), err
    assert not (tmp_path / "out.pack").exists()
    return "ckptfs: " + err[len("ckpt: "):]


def expect_eio(fn, *args):
    with pytest.raises(OSError) as e:
        fn(*args)
    assert e.value.errno == errno.EIO, e.value


def check_mount(mnt, source):
    pack = mnt / ".ckptfs" / "checkpoint.pack"
    assert "checkpoint.pack" in os.listdir(mnt / ".ckptfs")
    for _ in range(3):
        expect_eio(os.stat, pack)
        expect_eio(os.open, pack, os.O_RDONLY)
        expect_eio(pack.read_bytes)
    # The tensors, index.json and the safetensors file still serve the right bytes.
    lib, _ = library_view(source)
    index = read_index(mnt)
    assert {t["name"] for t in index["tensors"]} == set(lib)
    for t in index["tensors"]:
        assert (mnt / t["path"]).read_bytes() == lib[t["name"]][2], t
    synth = dict(deserialize((mnt / ".ckptfs" / "checkpoint.safetensors").read_bytes()))
    assert {k: bytes(v["data"]) for k, v in synth.items()} == {k: v[2] for k, v in lib.items()}


def test_foreground_logs_the_line_once(source, tmp_path, mountpoint):
    p = subprocess.Popen([str(ckptfs_bin()), "-f", str(source), str(mountpoint)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_until(lambda: is_mounted(mountpoint) or p.poll() is not None)
        assert is_mounted(mountpoint), p.stderr.read()
        check_mount(mountpoint, source)
    finally:
        unmount(mountpoint)
        try:
            out, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            raise
    assert p.returncode == 0, err
    assert out == b""
    assert err.decode() == pack_line(source, tmp_path)  # exactly once, nothing else


def test_daemon_answers_eio(mount, source):
    with mount(source) as mnt:
        check_mount(mnt, source)
