"""The README's quickstart, run as it is written: each `$ COMMAND` line through bash in a fresh
directory, its output compared with the lines the README shows under it, byte for byte. The
README can then never go stale; what `ckpt ls` shows is checked against torch besides.
`python3` is this test's Python (the one with torch), and the
build directory comes first on PATH, as after `make install`."""
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

from ckptfs_testlib import DTYPE_NAMES, build_dir, is_mounted, torch_bytes, unmount

README = Path(__file__).resolve().parents[2] / "README.md"


def quickstart():
    """[(command, expected output)] of the README's quickstart block."""
    text = README.read_text(encoding="utf-8")
    block = re.search(r"<!-- quickstart -->\n```\n(.*?)```\n<!-- /quickstart -->", text, re.S)
    assert block, "README.md has no quickstart block"
    steps = []
    for line in block.group(1).splitlines(keepends=True):
        if line.startswith("$ "):
            steps.append([line[2:].rstrip("\n"), ""])
        else:
            assert steps, "output before the first command"
            steps[-1][1] += line
    return steps


def check_ckpt_ls(shown, pt):
    """The README's `ckpt ls` lines against torch.load: each name's dtype, shape and byte count,
    and the file's bytes at the offset shown are the tensor's own."""
    sd = torch.load(pt, weights_only=False)
    lines = shown.splitlines()
    assert len(lines) == sum(torch.is_tensor(v) for v in sd.values())
    data = pt.read_bytes()
    for line in lines:
        name, dtype, shape, nbytes, offset = line.split("\t")
        t = sd[name]
        assert dtype == DTYPE_NAMES[t.dtype] and shape == str(list(t.shape)).replace(" ", "")
        want = torch_bytes(t)
        assert int(nbytes) == len(want)
        assert data[int(offset):int(offset) + len(want)] == want, line


def test_readme_quickstart_runs_as_written(tmp_path, fuse):
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "python3").symlink_to(sys.executable)
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PATH=f"{shim}:{build_dir()}:{os.environ['PATH']}",
               PYTHONPATH=os.pathsep.join([str(Path(build_dir()) / "python"),
                                           os.environ.get("PYTHONPATH", "")]))
    steps = quickstart()
    assert len(steps) >= 8
    try:
        for cmd, want in steps:
            p = subprocess.run(["bash", "-c", cmd], cwd=work, env=env, capture_output=True,
                               text=True, timeout=120)
            assert p.returncode == 0, (cmd, p.stderr)
            assert p.stdout == want, (cmd, p.stdout, want)
            if cmd.startswith("ckpt ls "):
                check_ckpt_ls(want, work / cmd.split()[-1])
    finally:
        if is_mounted(work / "m"):
            unmount(work / "m")
