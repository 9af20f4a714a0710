"""make check-layers (scripts/check-layers): the folders are the layers of docs/LAYOUT.md, and the
check refuses an include that goes up, one format including another, and C source in a folder
that is no layer. Each refusal is shown on a copy of the tree with one include added."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAYERS = ["base", "sources", "index", "formats", "checkpoint", "views", "loader", "fs", "tools"]


def check(root):
    return subprocess.run([sys.executable, os.path.join(root, "scripts", "check-layers")],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def tree(tmp_path):
    for folder in LAYERS + ["scripts"]:
        shutil.copytree(os.path.join(ROOT, folder), tmp_path / folder,
                        ignore=shutil.ignore_patterns("python", "*.py"))
    return tmp_path


def add_include(path, header):
    text = path.read_text()
    path.write_text(f'#include "{header}"\n' + text)


def test_the_tree_as_committed_passes():
    r = check(ROOT)
    assert r.returncode == 0, r.stderr


def test_the_folders_are_the_layers_of_the_tree():
    tops = {e for e in os.listdir(ROOT) if os.path.isdir(os.path.join(ROOT, e))
            and any(f.endswith((".c", ".h")) for f in os.listdir(os.path.join(ROOT, e)))}
    assert tops == set(LAYERS) | {"fuzz"}


@pytest.mark.parametrize("path, header, why", [
    ("base/names.c", "../sources/source.h", "sources/ above base/"),
    ("formats/gguf.c", "../checkpoint/open.h", "checkpoint/ above formats/"),
    ("views/tree.c", "../loader/plan.h", "loader/ above views/"),
    ("loader/slice.c", "../fs/core.h", "fs/ above loader/"),
    ("formats/npy.c", "safetensors.h", "one format includes another"),
    ("formats/torch.c", "dcp.h", "one format includes another"),
])
def test_a_refused_include_is_named_on_one_line(tree, path, header, why):
    add_include(tree / path, header)
    r = check(str(tree))
    assert r.returncode == 1
    target = os.path.normpath(os.path.join(os.path.dirname(path), header))
    assert r.stderr == f"check-layers: {path}: includes {target} ({why})\n"


def test_a_format_built_on_torch_may_include_it(tree):
    add_include(tree / "formats/dcp.c", "torch.h")
    assert check(str(tree)).returncode == 0


def test_c_source_outside_the_layers_is_refused(tree):
    (tree / "cache").mkdir()
    (tree / "cache" / "lru.c").write_text("int lru;\n")
    r = check(str(tree))
    assert r.returncode == 1
    assert r.stderr == "check-layers: cache/: C source in no layer (scripts/check-layers FOLDERS)\n"
