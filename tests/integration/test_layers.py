"""make check-layers (scripts/check-layers): the folders are the layers of docs/LAYOUT.md's table,
and the check refuses what the table and the rules forbid: an include that goes up, or to a
sibling the table leaves out, one format including another, a loop of files or of modules, C
source in a folder that is no layer, a source naming a format, a comment citing an issue or
holding a measured figure. Each refusal is shown on a copy of the tree with one thing added: the
lines it adds to the check's output are exactly the refusal's."""
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def check_layers():
    """scripts/check-layers as a module, for the table of layers it reads from LAYOUT.md."""
    path = os.path.join(ROOT, "scripts", "check-layers")
    loader = importlib.machinery.SourceFileLoader("check_layers", path)
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader("check_layers", loader))
    loader.exec_module(mod)
    return mod


LAYERS = [row[0] for row in check_layers().layer_table(ROOT)]


def check(root):
    return subprocess.run([sys.executable, os.path.join(root, "scripts", "check-layers")],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def tree(tmp_path):
    for folder in LAYERS + ["scripts"]:
        shutil.copytree(os.path.join(ROOT, folder), tmp_path / folder,
                        ignore=shutil.ignore_patterns("python", "*.py"))
    (tmp_path / "docs").mkdir()
    shutil.copy(os.path.join(ROOT, "docs", "LAYOUT.md"), tmp_path / "docs")
    return tmp_path


def added(tree, change):
    """The check's exit status after change(tree), and the lines of its output change added
    (the tree as it stands may have findings of its own, which test_the_tree_as_committed_passes
    is about)."""
    before = check(str(tree)).stderr.splitlines()
    change(tree)
    r = check(str(tree))
    return r.returncode, [line for line in r.stderr.splitlines() if line not in before]


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


def write(path, text):
    path.write_text(text)


@pytest.mark.parametrize("path, header, why", [
    ("base/names.c", "../sources/source.h", "sources/ above base/"),
    ("formats/gguf.c", "../checkpoint/open.h", "checkpoint/ above formats/"),
    ("views/tree.c", "../loader/plan.h", "loader/ above views/"),
    ("loader/slice.c", "../fs/core.h", "fs/ above loader/"),
    ("tools/cli.c", "../fuzz/../tools/cli.h", None),
    ("fs/core.c", "../loader/plan.h", "fs/ may include views/ and below, not loader/"),
    ("fs/watch.h", "../loader/mount.h", "fs/ may include views/ and below, not loader/"),
    ("formats/npy.c", "safetensors.h", "one format includes another"),
    ("formats/torch.c", "dcp.h", "one format includes another"),
])
def test_a_refused_include_is_named_on_one_line(tree, path, header, why):
    rc, lines = added(tree, lambda t: add_include(t / path, header))
    target = os.path.normpath(os.path.join(os.path.dirname(path), header))
    if why is None:  # a path that only passes through another folder is its target's
        assert lines == []
        return
    assert rc == 1
    assert lines == [f"check-layers: {path}: includes {target} ({why})"]


@pytest.mark.parametrize("path, header", [
    ("formats/dcp.c", "torch.h"),            # a format built on torch
    ("tools/cli.c", "../fs/core.h"),         # tools/ may include everything below
    ("tools/cli.c", "../loader/plan.h"),
    ("fs/core.c", "../views/tree.h"),        # fs/ may include views/ and below
    ("fs/core.c", "../checkpoint/open.h"),
    ("loader/slice.c", "../views/mountinfo.h"),
])
def test_an_include_the_table_allows_passes(tree, path, header):
    assert added(tree, lambda t: add_include(t / path, header))[1] == []


def test_what_a_layer_may_include_is_read_from_layout_md(tree):
    """The doc is the check's source: a row that let fs/ include the layers above it would let
    fs/ include loader/; one the check cannot read, or that names a higher layer, is refused."""
    layout = tree / "docs" / "LAYOUT.md"
    text = layout.read_text()
    row = "| `views/` and below |"
    assert text.count(row) == 1
    layout.write_text(text.replace(row, "| the above |"))
    add_include(tree / "fs/core.c", "../loader/plan.h")
    assert check(str(tree)).stderr.count("fs/core.c") == 0
    layout.write_text(text.replace(row, "| `views/` or so |"))
    r = check(str(tree))
    assert (r.returncode, r.stderr) == (1, "check-layers: docs/LAYOUT.md: fs/ may include '`views/` "
                                           "or so': not one of 'nothing of ours', 'the above', "
                                           "'everything below', '`X/` and below', '`X/`, `Y/`'\n")
    layout.write_text(text.replace(row, "| `tools/` and below |"))
    r = check(str(tree))
    assert (r.returncode, r.stderr) == (1, "check-layers: docs/LAYOUT.md: fs/ may include tools/, "
                                           "which is no row above it\n")


def test_c_source_outside_the_layers_is_refused(tree):
    def change(t):
        (t / "cache").mkdir()
        write(t / "cache" / "lru.c", "int lru;\n")
    rc, lines = added(tree, change)
    assert rc == 1
    assert lines == ["check-layers: cache/: C source in no layer (docs/LAYOUT.md's table)"]


def test_two_headers_that_include_each_other_are_a_loop(tree):
    rc, lines = added(tree, lambda t: (add_include(t / "base/names.h", "utf8.h"),
                                       add_include(t / "base/utf8.h", "names.h")))
    assert rc == 1
    assert lines == ["check-layers: base/names.h: includes itself through base/utf8.h"]


def test_two_modules_that_include_each_other_are_a_loop(tree):
    """names.c includes utf8.h and utf8.c names.h: no file is on a loop, the two modules are."""
    rc, lines = added(tree, lambda t: (add_include(t / "base/names.c", "utf8.h"),
                                       add_include(t / "base/utf8.c", "names.h")))
    assert rc == 1
    assert lines == ["check-layers: base/names: the module (.c and .h) includes itself through "
                     "base/utf8"]


def test_a_part_of_a_module_may_include_its_whole(tree):
    """index/zip_x.c is a part of zip (as loader/backend_cpu.c is of backend): zip.c may include
    its header and it zip.h, as one file of a module may another's."""
    def change(t):
        write(t / "index" / "zip_x.h", "int zip_x(void);\n")
        write(t / "index" / "zip_x.c", '#include "zip_x.h"\n#include "zip.h"\nint zip_x(void) { return 0; }\n')
        add_include(t / "index" / "zip.c", "zip_x.h")
    assert added(tree, change)[1] == []


@pytest.mark.parametrize("string, name, owner", [
    ('"model.safetensors.index.json"', "model.safetensors.index.json", "checkpoint/choose.c"),
    ('"%s/x.safetensors"', ".safetensors", "checkpoint/choose.c"),
    ('"weights.bin"', ".bin", "checkpoint/choose.c"),
    ('".metadata"', ".metadata", "formats/dcp.h"),
    ('"a-00001-of-00002.gguf"', ".gguf", "checkpoint/choose.c"),
    ('"x" ".npy"', ".npy", "formats/npy.c"),
])
def test_a_source_that_names_a_format_is_refused(tree, string, name, owner):
    source = f"/* any name in a comment is free: .safetensors */\nstatic const char *f = {string};\n"
    rc, lines = added(tree, lambda t: write(t / "sources" / "lister.c", source))
    assert rc == 1
    assert lines == [f'check-layers: sources/lister.c: names a format, "{name}" (line 2; {owner} '
                     "spells it): a source lists files, checkpoint/ picks them"]


@pytest.mark.parametrize("string", [
    '"binary"', '"/usr/bin/x"', '"a.binx"', '"x.ptx"', '"metadata.google.internal"',
    '"application_default_credentials.json"', '"s3.amazonaws.com"', "'.'",
])
def test_a_source_may_spell_what_is_no_format(tree, string):
    source = f'#include "source.h"\nstatic const char *f = {string};\n'
    assert added(tree, lambda t: write(t / "sources" / "lister.c", source))[1] == []


@pytest.mark.parametrize("comment, found, kind", [
    ("fixed in issue 13", "issue 13", "cites an issue"),
    ("see Issues 2 and 3", "Issues 2", "cites an issue"),
    ("as #41 asked", "#41", "cites an issue"),
    ("reads at 3.2 GB/s", "3.2 GB/s", "holds a measured figure"),
    ("500 MiB/s at most", "500 MiB/s", "holds a measured figure"),
    ("a mount takes 12 ms", "12 ms", "holds a measured figure"),
    ("in 40 µs", "40 µs", "holds a measured figure"),
    ("loads in 1.5 s", "1.5 s", "holds a measured figure"),
    ("touched 0.7 MB", "0.7 MB", "holds a measured figure"),
    ("a tree takes ~100 MB", "~100 MB", "holds a measured figure"),
    ("~15 times as much", "~15 times", "holds a measured figure"),
    ("2.5x faster", "2.5x", "holds a measured figure"),
    ("saves 30% of the time", "30%", "holds a measured figure"),
])
def test_a_comment_with_an_issue_or_a_figure_is_refused(tree, comment, found, kind):
    source = f"int x; /* why:\n * {comment}. */\n"
    rc, lines = added(tree, lambda t: write(t / "base" / "why.c", source))
    assert rc == 1
    where = "say why, not when" if kind == "cites an issue" else "figures live in BENCHMARKS.md"
    assert lines == [f'check-layers: base/why.c: a comment {kind}, "{found}" (line 2): {where}']


@pytest.mark.parametrize("comment", [
    "2 MiB pages make faults 512 times fewer",   # constants and what follows from them
    "each asked with a 1 s budget, not again for 15 minutes",
    "a 64 KiB window, 8 bytes an entry, 2 × the pairs",
    'sizes for people: "812 B", "1.5 KiB"',      # an example of output, in quotes
    '(BENCHMARKS.md, "cold sources through 2 MiB bounce pages")',
    "the jitter is in [0.5, 1), retries 1, 2, 4, ...",
    "printf's %zu; a #define; an #include",
])
def test_a_comment_with_constants_passes(tree, comment):
    source = f"#define N 1 /* {comment} */\nconst char *s = \"12 ms, issue 3\"; // {comment}\n"
    assert added(tree, lambda t: write(t / "base" / "why.c", source))[1] == []


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
