"""The README's quickstart, run as it is written: each `$ COMMAND` line through bash in a fresh
directory, its output compared with the lines the README shows under it, byte for byte. The
README can then never go stale. `python3` is this test's Python (the one with torch), and the
build directory comes first on PATH, as after `make install`."""
import os
import re
import subprocess
from pathlib import Path

from ckptfs_testlib import build_dir, is_mounted, unmount

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


def test_readme_quickstart_runs_as_written(tmp_path, fuse):
    import sys
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
    finally:
        if is_mounted(work / "m"):
            unmount(work / "m")
