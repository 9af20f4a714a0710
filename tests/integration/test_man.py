"""The man pages say what the programs do: a page for every command (ckptfs(1),
ckpt(1), mount.fuse.ckptfs(8), libckload(3)); every option a `--help` prints appears in its
page (ckpt's in the section of its command); ckpt(1) and ckpt's table (tools/ckpt.c: what
`ckpt --help` and `ckpt COMMAND --help` print) name the same commands and the same options,
each usage line the options of its table; every function libckload exports is in
libckload(3); and groff (scripts/setup installs it) formats each page without a warning."""
import re
import subprocess

import pytest

from ckptfs_testlib import REPO, build_dir, ckpt_bin, ckptfs_bin, run
from netlab import plain_env  # groff is not ours: no sanitizer runtime preloaded into it

MAN = REPO / "man"
PAGES = ["ckptfs.1", "ckpt.1", "mount.fuse.ckptfs.8", "libckload.3"]


def roff_text(page):
    """A page's source with roff's escapes for '-' and '\\' undone: what a reader searches."""
    return (MAN / page).read_text().replace("\\-", "-").replace("\\e", "\\")


def page_sections(text, level, title=r"\S+"):
    """{the rest of its heading line: its text} of each `.SH` or `.SS` (level) of text whose
    heading starts with title, its text ending at the next heading of that level or above."""
    heads = ".SH" if level == ".SH" else r"\.S[SH]"
    parts = re.split(rf"^(?={heads} )", text, flags=re.M)
    return {m.group(1): part for part in parts
            if (m := re.match(rf"{re.escape(level)} ({title}.*)\n", part))}


def page_commands():
    """The ckpt commands ckpt(1) describes, each with its `.SS` section."""
    commands = page_sections(roff_text("ckpt.1"), ".SH")["COMMANDS"]
    return {head.split()[1]: text for head, text in page_sections(commands, ".SS", "ckpt ").items()}


COMMANDS = list(page_commands())  # test_ckpt_commands_are_its_tables checks them against ckpt's


OPTION = re.compile(r"(?<![\w-])--?[A-Za-z][\w-]*")  # --name or -x, where text names one


def options_named(roff):
    """The options a line of a page names, its font escapes (\\fB...\\fR) left out."""
    return set(OPTION.findall(re.sub(r"\\f(?:[BIRP]|\(..)", "", roff)))


def help_items(text):
    """The options a --help lists at the start of its lines, a tuple per line ("-v", "--verbose")."""
    items = []
    for line in text.splitlines():
        m = re.match(r"\s+((?:-\w, )?--?[\w-]+|-o [\w_]+)", line)
        if m:
            items.append(tuple(re.findall(r"--?[\w-]+|-o [\w_]+", m.group(1))))
    return items


def options_in_help(text):
    """The --long and -x options a --help lists at the start of its lines."""
    return {o for item in help_items(text) for o in item}


def options_in_items(section):
    """The options a page's section lists as items (`.TP` and the option on its next line)."""
    return {o for item in re.findall(r"^\.TP\n(.*)$", section, flags=re.M)
            for o in options_named(item)}


def ckpt_help(*args):
    p = run([ckpt_bin(), *args, "--help"])
    assert p.returncode == 0, p.stderr
    return p.stdout.decode()


@pytest.mark.parametrize("page", PAGES)
def test_every_page_is_there(page):
    text = (MAN / page).read_text()
    assert text.startswith(".TH "), page
    for section in (".SH NAME", ".SH SYNOPSIS", ".SH DESCRIPTION", ".SH SEE ALSO"):
        assert section in text, (page, section)


def test_ckpt_commands_are_its_tables():
    """The commands `ckpt --help` lists (ckpt.c's table) are the page's COMMANDS, in order."""
    table = re.findall(r"^  ckpt (\S+)", ckpt_help(), flags=re.M)
    assert table == COMMANDS, "ckpt --help and ckpt(1)'s COMMANDS differ"


@pytest.mark.parametrize("cmd", COMMANDS)
def test_ckpt_options_are_in_their_commands_section(cmd):
    """A command's options (its `--help`, from the command's table) are the items of its
    section, and its heading names none other: an option in one and not the other fails."""
    opts = options_in_help(ckpt_help(cmd)) - {"-h", "--help"}
    section = page_commands()[cmd]
    assert options_in_items(section) == opts
    assert options_named(section.splitlines()[0]) <= opts, section.splitlines()[0]


def test_ckpt_own_options_are_its_pages():
    """ckpt's own options (before the COMMAND, and --version) are the page's OPTIONS items."""
    text = ckpt_help()
    opts = options_in_help(text)
    assert options_in_items(page_sections(roff_text("ckpt.1"), ".SH")["OPTIONS"]) == opts
    assert {"--cacert", "--no-sign-request", "--version", "--help"} <= opts
    usage = text[:text.index("\n\n")]
    assert set(OPTION.findall(usage)) <= opts, usage


@pytest.mark.parametrize("cmd", COMMANDS)
def test_ckpt_usage_lines_name_their_options(cmd):
    """A command's usage line names each option of its table (by its letter or its name), and
    none that is not in it."""
    text = ckpt_help(cmd)
    usage = text.splitlines()[0]
    assert usage.startswith(f"usage: ckpt {cmd}"), usage
    named = set(OPTION.findall(usage))
    items = [item for item in help_items(text) if "--help" not in item]
    assert named <= {o for item in items for o in item}, usage
    assert all(named & set(item) for item in items), (usage, items)


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
