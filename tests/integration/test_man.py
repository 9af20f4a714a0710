"""The man pages say what the programs do: a page for every command (ckptfs(1),
ckpt(1), mount.fuse.ckptfs(8), libckload(3)); every option a `--help` prints appears in its
page (ckpt's in the section of its command); every function libckload exports is in
libckload(3); and groff (scripts/setup installs it) formats each page without a warning."""
import re
import subprocess

import pytest

from ckptfs_testlib import REPO, build_dir, ckpt_bin, ckptfs_bin, run
from netlab import plain_env  # groff is not ours: no sanitizer runtime preloaded into it

MAN = REPO / "man"
PAGES = ["ckptfs.1", "ckpt.1", "mount.fuse.ckptfs.8", "libckload.3"]
COMMANDS = ["ls", "cat", "pack", "convert", "verify", "load", "serve", "diff", "info", "stats"]


def roff_text(page):
    """A page's source with roff's escapes for '-' and '\\' undone: what a reader searches."""
    return (MAN / page).read_text().replace("\\-", "-").replace("\\e", "\\")


def options_in_help(text):
    """The --long and -x options a --help lists at the start of its lines."""
    found = set()
    for line in text.splitlines():
        m = re.match(r"\s+((?:-\w, )?--?[\w-]+|-o [\w_]+)", line)
        if m:
            found.update(o for o in re.findall(r"--?[\w-]+|-o [\w_]+", m.group(1)))
    return found


@pytest.mark.parametrize("page", PAGES)
def test_every_page_is_there(page):
    text = (MAN / page).read_text()
    assert text.startswith(".TH "), page
    for section in (".SH NAME", ".SH SYNOPSIS", ".SH DESCRIPTION", ".SH SEE ALSO"):
        assert section in text, (page, section)


@pytest.mark.parametrize("cmd", COMMANDS)
def test_ckpt_options_are_in_their_commands_section(cmd):
    p = run([ckpt_bin(), cmd, "--help"])
    assert p.returncode == 0
    opts = options_in_help(p.stdout.decode()) - {"-h", "--help"}
    text = roff_text("ckpt.1")
    start = text.index(f".SS ckpt {cmd} ")
    end = min(i for i in (text.find(".SS ", start + 4), text.find(".SH ", start)) if i > 0)
    section = text[start:end]
    for opt in opts:
        assert opt in section, (cmd, opt)


def test_ckpt_exit_statuses_are_in_its_page():
    text = roff_text("ckpt.1")
    exit_section = text[text.index(".SH EXIT STATUS"):]
    for status in ("0", "1", "2", "128+N"):
        assert f"\n{status}\n" in exit_section, status


def test_ckptfs_options_are_in_its_page():
    p = run([ckptfs_bin(), "--help"])
    opts = {o for o in options_in_help(p.stdout.decode() + p.stderr.decode())}
    ours = p.stdout.decode() + p.stderr.decode()
    ours = ours[ours.index("ckptfs options:"):ours.index("\n\n", ours.index("ckptfs options:"))]
    text = roff_text("ckptfs.1")
    for opt in options_in_help(ours):
        name = opt.split()[-1]
        assert name in text, opt
    assert opts


def test_every_exported_function_is_in_libckload_3():
    text = roff_text("libckload.3")
    lib = build_dir() / "libckload.so"
    nm = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True,
                        env=plain_env())
    assert nm.returncode == 0, nm.stderr
    exported = {line.split()[-1] for line in nm.stdout.splitlines() if " T " in line}
    assert exported and all(name.startswith("ckl_") for name in exported), exported
    for name in exported:
        assert re.search(rf"\b{name}\b", text), name


@pytest.mark.parametrize("page", PAGES)
def test_every_page_formats_without_warnings(page):
    p = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", str(MAN / page)],
                       capture_output=True, text=True, timeout=60, env=plain_env())
    assert p.returncode == 0 and p.stderr == "", p.stderr


def test_the_python_api_doc_is_its_docstrings():
    """docs/PYTHON.md is scripts/python-doc's rendering of ckload's docstrings, as committed."""
    p = run([REPO / "scripts" / "python-doc"])
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode() == (REPO / "docs" / "PYTHON.md").read_text(), \
        "docs/PYTHON.md is stale: scripts/python-doc > docs/PYTHON.md"
