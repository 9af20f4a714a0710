"""docs/TESTING.md's map of which tests cover each module says what the tree holds: every module
of every layer (docs/LAYOUT.md's table, as scripts/check-layers reads it) has a row under its
folder, and every module and test a row names is a file of the tree."""
import glob
import importlib.machinery
import importlib.util
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAP_TITLE = "## Which tests cover each module"
FOLDER = re.compile(r"^\*\*`([a-z_]+)/`\*\*$")
TICKED = re.compile(r"`([^`]+)`")
INLINE_CODE = re.compile(r"^static inline\b", re.M)


def layers():
    path = os.path.join(ROOT, "scripts", "check-layers")
    loader = importlib.machinery.SourceFileLoader("check_layers", path)
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader("check_layers", loader))
    loader.exec_module(mod)
    return [row[0] for row in mod.layer_table(ROOT)]


def the_map():
    """{folder: [row's cells]}: the tables of TESTING.md's map, under their folders' headings."""
    with open(os.path.join(ROOT, "docs", "TESTING.md"), encoding="utf-8") as f:
        text = f.read()
    assert MAP_TITLE in text
    section = text.split(MAP_TITLE, 1)[1].split("\n## ", 1)[0]
    rows, folder = {}, None
    for line in section.splitlines():
        heading = FOLDER.match(line)
        if heading:
            folder = heading.group(1)
            rows[folder] = []
        elif folder and line.startswith("| ") and not line.startswith("| module "):
            rows[folder].append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def modules(folder):
    """A folder's modules: each NAME.c, and each NAME.h with no NAME.c that holds code (inline
    functions: base/cursor.h)."""
    out = {os.path.basename(p) for p in glob.glob(os.path.join(ROOT, folder, "*.c"))}
    for h in glob.glob(os.path.join(ROOT, folder, "*.h")):
        with open(h, encoding="utf-8") as f:
            if not os.path.exists(h[:-2] + ".c") and INLINE_CODE.search(f.read()):
                out.add(os.path.basename(h))
    return out


def test_every_module_of_the_layers_has_a_row():
    rows = the_map()
    missing = []
    for folder in layers():
        named = {n for cells in rows.get(folder, []) for n in TICKED.findall(cells[0])}
        missing += [f"{folder}/{m}" for m in sorted(modules(folder) - named)]
    assert missing == [], f"docs/TESTING.md's map has no row for {', '.join(missing)}"


def exists(*parts):
    return os.path.exists(os.path.join(ROOT, *parts))


def stale_names(folder, cells):
    """What a row names that is no file: its modules (names with a '.' or '/'), unit suites'
    files (test_NAME: tests/unit/test_NAME.c), pytest and GPU files (test_NAME.py:
    tests/integration/ or tests/gpu/) and fuzz targets (NAME: fuzz/fuzz_NAME.c)."""
    module, unit, integration, fuzz = (TICKED.findall(c) for c in cells[:4])
    return ([f"{folder}/{n}" for n in module if re.search(r"[./]", n) and not exists(folder, n)]
            + [n for n in unit if re.fullmatch(r"test_\w+", n)
               and not exists("tests/unit", n + ".c")]
            + [n for n in integration if re.fullmatch(r"(tests/gpu/)?test_\w+\.py", n)
               and not any(exists("tests", d, os.path.basename(n)) for d in ("integration", "gpu"))]
            + [f"fuzz target {n}" for n in fuzz if re.fullmatch(r"\w+", n)
               and not exists("fuzz", f"fuzz_{n}.c")])


def test_every_module_and_test_the_map_names_is_a_file():
    stale = [n for folder, rows in the_map().items() for cells in rows
             for n in stale_names(folder, cells)]
    assert stale == [], f"docs/TESTING.md's map names what is no file: {', '.join(stale)}"
