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


def test_two_headers_that_include_each_other_are_a_loop(tree):
    add_include(tree / "base/names.h", "utf8.h")
    add_include(tree / "base/utf8.h", "names.h")
    r = check(str(tree))
    assert r.returncode == 1
    assert r.stderr == "check-layers: base/names.h: includes itself through base/utf8.h\n"


def compile_to(build, path, source):
    obj = build / "obj" / (path[:-2] + ".o")
    obj.parent.mkdir(parents=True, exist_ok=True)
    src = build / os.path.basename(path)
    src.write_text(source)
    subprocess.run(["cc", "-c", str(src), "-o", str(obj)], check=True)


def test_two_files_that_call_each_other_are_a_loop(tmp_path):
    compile_to(tmp_path, "base/a.c", "void b_back(void); void a_go(void) { b_back(); }\n")
    compile_to(tmp_path, "base/b.c", "void a_go(void); void b_back(void) {}\n"
                                     "void b_start(void) { a_go(); }\n")
    compile_to(tmp_path, "tools/c.c", "void a_go(void); int main(void) { a_go(); return 0; }\n")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "check-calls"),
                        str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr == ("check-calls: base/a.c: calls itself through base/b.c "
                        "(a_go in base/a.c, b_back in base/b.c)\n")
