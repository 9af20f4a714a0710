"""The wheel where users install it: `pip install` of `make wheel`'s manylinux
wheel into a minimal Debian root (wheelroot.Root: python3 and fuse3, no -dev package, no libcurl)
run as a container, and there, through the commands pip put on PATH:

  * `ckpt ls`, `cat` and `convert` of every format, the bytes checked against the host's own
    readers of the same file (torch, safetensors, numpy, gguf-py; torch 2.x for DCP and .pt2);
  * a mount as root with fusermount3 hidden, and as a user with it, read byte-exact;
  * ckload.load and load_into under torch 2.x;
  * http(s):// (nginx, TLS) and s3:// (radosgw) on 127.0.0.1 through the wheel's own libcurl;
  * the same on the host itself with libcjson, libxxhash, liburing and libcurl hidden;
  * the wheel before `auditwheel repair` failing the same check with the loader's missing-library
    message: what a library the wheel forgot looks like;
  * bad input: no /dev/fuse, a user without fusermount3, and a libc older than the wheel's tag
    (bullseye's glibc 2.31: pip refuses it), each one line that says what to install or pass."""
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import netlab
from ckptfs_testlib import (DTYPE_NAMES, TORCH2, build_dir, ckpt_bin, flatten, library_view,
                            run)
from test_gguf import expected as gguf_expected
from test_install import SYSTEM_PYTHON, clean_env
from wheelroot import TORCH2_SITE, Root, built_wheel

CORPUS = Path(os.environ.get("CKPTFS_CORPUS", "/work/shared/corpus"))
SRC = "/src"  # where the sources are, inside the root (read-only)
OUT = "/w/out"  # what the root's commands write, read back on the host
USER = "u"  # the root's user (uid 1000)
HIDDEN = ["libcjson.so.1", "libxxhash.so.0", "liburing.so.2", "libcurl.so.4"]
LIBDIR = "/usr/lib/x86_64-linux-gnu"
# what the dynamic loader (ld.so, dlopen) says of a library it cannot have
MISSING_LIB = re.compile(rb"lib(cjson|xxhash|uring|curl)[^:\s]*: (cannot open shared object "
                         rb"file|file too short)")

for need, what in ((TORCH2, "scripts/setup makes .deps/torch2 (torch 2.x for the root and for "
                    "DCP and .pt2)"), (CORPUS, "the real-checkpoint corpus (CKPTFS_CORPUS)"),
                   (Path(shutil.which("mmdebstrap") or "/nonexistent"), "mmdebstrap (apt-get "
                    "install mmdebstrap) makes the root filesystems")):
    if not need.exists():
        pytest.fail(f"{need} is missing: {what}", pytrace=False)

NP_DTYPES = {"<f2": "F16", "<f4": "F32", "<f8": "F64", "<i8": "I64", "<i4": "I32", "<i2": "I16",
             "|i1": "I8", "|u1": "U8", "|b1": "BOOL"}


def torch2(*argv, timeout=300):
    p = subprocess.run([str(TORCH2), *map(str, argv)], capture_output=True, timeout=timeout)
    assert p.returncode == 0, p.stderr.decode()[-3000:]


# --- the sources and what independent readers make of them ----------------------------------
# Each is {name: (dtype, shape, bytes)}; every file lies under the module's source directory.

def from_library(path):
    return library_view(path)[0]


def from_numpy(path):
    z = np.load(path)
    arrays = dict(z) if isinstance(z, np.lib.npyio.NpzFile) else {"": z}
    return {k: (NP_DTYPES[a.dtype.str], list(a.shape), np.ascontiguousarray(a).tobytes())
            for k, a in arrays.items()}


def from_torch(path):
    return {k: v[1:] for k, v in flatten(torch.load(path, map_location="cpu")).items()
            if v[0] == "tensor"}


def from_gguf(path):
    return {k: (v[0], v[1], v[3]) for k, v in gguf_expected([path])[0].items()}


def shards(d):
    """Two safetensors shards and transformers' index of them."""
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(3)
    parts = [{"model.embed.weight": torch.randn(8, 4, generator=g).half(),
              "model.norm": torch.ones(4, dtype=torch.bfloat16)},
             {"lm_head.weight": torch.randn(4, 8, generator=g),
              "steps": torch.arange(-2, 3, dtype=torch.int64)}]
    d.mkdir()
    weight_map = {}
    for i, sd in enumerate(parts, 1):
        name = f"model-0000{i}-of-00002.safetensors"
        save_file(sd, str(d / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(sd, name))
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return d


def dcp(d):
    """torch 2.x's DCP save, and torch's own reading of it (dcp_writer.py expect)."""
    writer = Path(__file__).with_name("dcp_writer.py")
    torch2(writer, "save", d / "ckpt")
    torch2(writer, "expect", d / "ckpt", d / "expect")
    manifest = json.loads((d / "expect" / "manifest.json").read_text())
    want = {name: (DTYPE_NAMES[getattr(torch, m["dtype"].split(".")[1])], m["shape"],
                   (d / "expect" / m["file"]).read_bytes())
            for name, m in manifest["tensors"].items()}
    return d / "ckpt", want


def pt2(d):
    """torch.export.save's archive, and torch.export.load's reading of it (test_pt2's WRITER)."""
    from test_pt2 import WRITER
    torch2("-c", WRITER, d)
    meta = json.loads((d / "expected.json").read_text())
    return d / "model.pt2", {n: (m["dtype"], m["shape"], (d / "expected" / m["file"]).read_bytes())
                             for n, m in meta.items()}


def pack(d):
    """`ckpt pack` (the build tree's) of a corpus safetensors file: the pack holds its bytes."""
    src = CORPUS / "candle_jfk_codes.safetensors"
    p = run([ckpt_bin(), "pack", src, d / "codes.pack"], timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    return d / "codes.pack", from_library(src)


def corpus(name, reader):
    return lambda d: (CORPUS / name, reader(CORPUS / name))


FORMATS = {
    "safetensors": corpus("peft_gpt2_adapter_model.safetensors", from_library),
    "safetensors-shards": lambda d: (shards(d / "shards"), from_library(d / "shards")),
    "gguf": corpus("ollama_llama2_tiny_random.gguf", from_gguf),
    "npy": corpus("candle_test.npy", from_numpy),
    "npz": corpus("whisper_mel_filters.npz", from_numpy),
    "torch-zip": corpus("candle_fortran_tensor_3d.pth", from_torch),
    "torch-legacy": corpus("graykode_mnist_cnn_legacy.pt", from_torch),
    "dcp": dcp,
    "pt2": pt2,
    "pack": pack,
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """{format: (path inside the root, expected)}; the files under one directory, bound
    read-only at SRC in every run."""
    top = tmp_path_factory.mktemp("wheel-src")
    out = {}
    for fmt, make in FORMATS.items():
        d = top / fmt
        d.mkdir()
        path, want = make(d)
        assert want, fmt
        if not str(path).startswith(str(top)):
            shutil.copy(path, d / path.name)
            path = d / path.name
        out[fmt] = (f"{SRC}/{path.relative_to(top)}", want)
    for d, _, files in os.walk(top):  # pytest's directories are 0700: the root's user reads too
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)
    out["_dir"] = top
    return out


@pytest.fixture(scope="module")
def wheel(build):
    return built_wheel()


@pytest.fixture(scope="module")
def root(wheel, sources, tmp_path_factory):
    """The minbase root with the wheel in /venv and a user; removed at the end."""
    where = tmp_path_factory.mktemp("wheel-root") / "root"
    r = Root(where, wheel)
    r.src = sources["_dir"]
    p = r.run(["useradd", "-m", "-u", "1000", USER], timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    yield r
    shutil.rmtree(where, ignore_errors=True)


def in_root(root, script, *args, env=None, binds=(), fuse="host", timeout=180):
    """sh -c SCRIPT ARGS... in the root with the sources at SRC and OUT fresh; (process, OUT
    on the host)."""
    out = Path(root.host(OUT))
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    os.chmod(out, 0o777)  # the user's runs write there too
    p = root.run(["sh", "-c", script, "sh", *map(str, args)], env=env, timeout=timeout,
                 binds=[(str(root.src), SRC, True), *binds], fuse=fuse)
    return p, out


def check_listing(listing, want):
    got = {t["name"]: (t["dtype"], t["shape"], t["nbytes"]) for t in listing["tensors"]}
    assert got == {n: (d, s, len(b)) for n, (d, s, b) in want.items()}


def check_tensors(got, want):
    """got: {name: (dtype, shape, bytes)} as the safetensors library read a file ckptfs wrote."""
    assert set(got) == set(want)
    for n, (dtype, shape, data) in want.items():
        assert got[n] == (dtype, shape, data), n


def a_few(want):
    """Three names (the first, the largest, the last), what `cat` reads."""
    names = list(want)
    return list(dict.fromkeys([names[0], max(names, key=lambda n: len(want[n][2])), names[-1]]))


# --- 1. ckpt ls / cat / convert of every format ---------------------------------------------

LS_CAT = """set -e
src=$1; shift
ckpt ls --json "$src" > /w/out/ls.json
i=0
for n; do ckpt cat "$src" "$n" > /w/out/cat.$i; i=$((i+1)); done
"""
LS_CAT_CONVERT = LS_CAT + 'ckpt convert "$src" /w/out/converted.safetensors\n'


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_ckpt_on_every_format(root, sources, fmt):
    src, want = sources[fmt]
    names = a_few(want)
    p, out = in_root(root, LS_CAT_CONVERT, src, *names)
    assert p.returncode == 0, p.stderr.decode()
    assert p.stderr == b"", p.stderr
    check_listing(json.loads((out / "ls.json").read_bytes()), want)
    for i, n in enumerate(names):
        assert (out / f"cat.{i}").read_bytes() == want[n][2], n
    check_tensors(from_library(out / "converted.safetensors"), want)


# --- 2. mounts: as root without fusermount3, as a user with it --------------------------------

# Mounts SRC at MNT, copies every tensor's file (index.json's paths) to OUT/N, unmounts.
MOUNT_READ = """set -e
src=$1 mnt=$2
mkdir -p "$mnt"
ckptfs "$src" "$mnt"
cp "$mnt/.ckptfs/index.json" /w/out/index.json
python3 - "$mnt" <<'EOF'
import json, shutil, sys
index = json.load(open(sys.argv[1] + "/.ckptfs/index.json"))
for i, t in enumerate(index["tensors"]):
    shutil.copyfile(sys.argv[1] + "/" + t["path"], f"/w/out/{i}")
EOF
grep -c " $mnt fuse.ckptfs " /proc/mounts > /w/out/mounted
fusermount3 -u "$mnt" 2>/dev/null || umount "$mnt"
"""


def check_mount_copy(out, want):
    index = json.loads((out / "index.json").read_bytes())
    check_listing(index, want)
    for i, t in enumerate(index["tensors"]):
        assert (out / str(i)).read_bytes() == want[t["name"]][2], t["name"]


NO_FUSERMOUNT = ("/dev/null", "/usr/bin/fusermount3", True)


def test_mount_as_root_without_fusermount3(root, sources):
    src, want = sources["safetensors"]
    # first that the bind hides it: the shell finds no fusermount3 to run
    p, _ = in_root(root, "command -v fusermount3", binds=[NO_FUSERMOUNT])
    assert p.returncode != 0 and p.stdout == b"", f"fusermount3 is still there: {p.stdout!r}"
    p, out = in_root(root, MOUNT_READ, src, "/mnt/ck", binds=[NO_FUSERMOUNT])
    assert p.returncode == 0, p.stderr.decode()
    assert (out / "mounted").read_text().strip() == "1"
    check_mount_copy(out, want)


def test_mount_as_a_user_with_fusermount3(root, sources):
    """The user's mount goes through the root's set-user-ID fusermount3; /dev/fuse is the
    container's, which every user may open (--device /dev/fuse)."""
    src, want = sources["torch-legacy"]
    p, out = in_root(root, f"exec setpriv --reuid={USER} --regid={USER} --init-groups "
                     f"sh -c {shlex.quote(MOUNT_READ)} sh \"$@\"", src, f"/home/{USER}/mnt",
                     fuse="device")
    assert p.returncode == 0, p.stderr.decode()
    assert (out / "mounted").read_text().strip() == "1"
    check_mount_copy(out, want)


# --- 3. ckload.load and load_into under torch 2.x ---------------------------------------------

# argv: SOURCE SPECS.json; loads SOURCE with load, then into fresh tensors of SPECS' dtypes and
# shapes with load_into, writing each tensor's bytes to OUT/load.N and OUT/into.N.
LOAD = """
import json, sys, ckload, torch
src, specs = sys.argv[1], json.load(open(sys.argv[2]))
DT = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
      "U8": torch.uint8, "BOOL": torch.bool}
raw = lambda t: t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
sd = ckload.load(src, device="cpu")
assert set(sd) == {n for n, _, _ in specs}, list(sd)
into = {n: torch.empty(shape, dtype=DT[d]) for n, d, shape in specs}
assert ckload.load_into(into, src) == ([], [])
for i, (n, _, _) in enumerate(specs):
    open(f"/w/out/load.{i}", "wb").write(raw(sd[n]))
    open(f"/w/out/into.{i}", "wb").write(raw(into[n]))
print(torch.__version__, ckload.__file__)
"""


def load_in_root(root, src, want, env=None, binds=()):
    specs = [[n, d, s] for n, (d, s, _) in want.items()]
    script = f"cat > /w/out/specs.json <<'EOF'\n{json.dumps(specs)}\nEOF\n" \
             f"exec /venv/bin/python -c {shlex.quote(LOAD)} \"$1\" /w/out/specs.json"
    p, out = in_root(root, script, src, env=env, binds=binds, timeout=300)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    version, module = p.stdout.decode().split()
    assert version.startswith("2."), version
    assert module.startswith("/venv/lib/"), module
    for i, (n, (_, _, data)) in enumerate(want.items()):
        assert (out / f"load.{i}").read_bytes() == data, n
        assert (out / f"into.{i}").read_bytes() == data, n


@pytest.mark.parametrize("fmt", ["safetensors", "torch-legacy", "pack"])
def test_ckload_load_and_load_into(root, sources, fmt):
    load_in_root(root, *sources[fmt])


# --- 4. http(s):// and s3:// through the wheel's libcurl ------------------------------------

@pytest.fixture(scope="module")
def https(sources, tmp_path_factory):
    tls = netlab.tls_material(tmp_path_factory.mktemp("wheel-tls"))
    with netlab.Nginx(sources["_dir"], tls=tls) as srv:
        yield srv, tls.ca


def remote_checks(root, url, want, env, binds=()):
    """ls, cat of a few tensors, a mount's read, ckload.load of url: all byte-exact."""
    names = a_few(want)
    p, out = in_root(root, LS_CAT, url, *names, env=env, binds=binds)
    assert p.returncode == 0, p.stderr.decode()
    check_listing(json.loads((out / "ls.json").read_bytes()), want)
    for i, n in enumerate(names):
        assert (out / f"cat.{i}").read_bytes() == want[n][2], n
    p, out = in_root(root, MOUNT_READ, url, "/mnt/remote", env=env, binds=binds)
    assert p.returncode == 0, p.stderr.decode()
    check_mount_copy(out, want)
    load_in_root(root, url, want, env=env, binds=binds)


def test_https_through_the_wheels_libcurl(root, sources, https):
    srv, ca = https
    src, want = sources["safetensors"]
    p = root.run(["sh", "-c", "ls /usr/lib/x86_64-linux-gnu/libcurl* /lib/x86_64-linux-gnu/"
                  "libcurl* 2>/dev/null; true"])
    assert p.stdout == b"", f"the root has a libcurl of its own: {p.stdout!r}"
    remote_checks(root, srv.url(src[len(SRC):]), want, env={"CKPTFS_CACERT": "/w/ca.pem"},
                  binds=[(str(ca), "/w/ca.pem", True)])


def test_s3_through_the_wheels_libcurl(root, sources, s3server):
    src, want = sources["safetensors-shards"]
    s3server.create_bucket("wheel")
    for f in sorted(Path(root.src, src[len(SRC) + 1:]).iterdir()):
        s3server.put_file("wheel", f"shards/{f.name}", f)
    env = {"AWS_ENDPOINT_URL": s3server.endpoint, "AWS_REGION": s3server.region,
           "AWS_ACCESS_KEY_ID": s3server.access_key,
           "AWS_SECRET_ACCESS_KEY": s3server.secret_key, "AWS_EC2_METADATA_DISABLED": "true"}
    remote_checks(root, "s3://wheel/shards/", want, env=env)


# --- 5. the host itself, the wheel's libraries hidden -----------------------------------------

@pytest.fixture(scope="module")
def host_venv(wheel, tmp_path_factory):
    """A venv of the host's python with the wheel installed and torch 2.x beside it."""
    d = tmp_path_factory.mktemp("wheel-host") / "venv"
    p = run([SYSTEM_PYTHON, "-m", "venv", d], timeout=120, env=clean_env())
    assert p.returncode == 0, p.stderr.decode()
    p = run([d / "bin" / "pip", "install", "-q", "--no-index", "--no-deps",
             "--disable-pip-version-check", wheel], timeout=300, env=clean_env())
    assert p.returncode == 0, p.stderr.decode()
    site = next((d / "lib").glob("python3*/site-packages"))
    (site / "torch2.pth").write_text(TORCH2_SITE + "\n")
    return d


def hidden(script, *args, env=None, timeout=300):
    """sh -c SCRIPT ARGS... on the host, in mount and PID namespaces of its own where /dev/null
    is bound over each of HIDDEN (as on a machine without Debian's packages of them)."""
    missing = [lib for lib in HIDDEN if not os.path.exists(f"{LIBDIR}/{lib}")]
    assert not missing, f"{missing}: the host lacks what this test hides (scripts/setup)"
    binds = " && ".join(f"mount --bind /dev/null {LIBDIR}/{lib}" for lib in HIDDEN)
    cmd = ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--mount-proc",
           "sh", "-c", f"{binds} && exec sh -c {shlex.quote(script)} sh \"$@\"", "sh",
           *map(str, args)]
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "HOME": "/root", "LANG": "C.UTF-8",
           **(env or {})}
    return subprocess.run(cmd, capture_output=True, timeout=timeout, env=env)


HOST_CHECKS = """set -e
venv=$1 src=$2 url=$3 specs=$4 out=$5
"$venv/bin/ckpt" ls --json "$src" > "$out/ls.json"
"$venv/bin/ckpt" cat "$url" "$6" > "$out/https"
mkdir -p "$out/mnt"
"$venv/bin/ckptfs" "$src" "$out/mnt"
cp "$out/mnt/$7" "$out/mounted"
fusermount3 -u "$out/mnt"
cd "$out" && "$venv/bin/python" -c "$8" "$src" "$specs"
"""


def test_on_the_host_without_its_libraries(host_venv, sources, https, tmp_path):
    srv, ca = https
    src, want = sources["safetensors"]
    host_src = Path(sources["_dir"], src[len(SRC) + 1:])
    # the control: the build tree's ckpt needs them, and does not start here
    p = hidden(f"exec {shlex.quote(str(ckpt_bin()))} ls \"$1\"", host_src)
    assert p.returncode != 0 and MISSING_LIB.search(p.stderr), p.stderr
    name = a_few(want)[1]
    index = json.loads(run([ckpt_bin(), "ls", "--json", host_src]).stdout)
    path = next(t["path"] for t in index["tensors"] if t["name"] == name)
    specs = tmp_path / "specs.json"
    specs.write_text(json.dumps([[n, d, s] for n, (d, s, _) in want.items()]))
    out = tmp_path / "out"
    out.mkdir()
    load = LOAD.replace("/w/out/", "")
    p = hidden(HOST_CHECKS, host_venv, host_src, srv.url(src[len(SRC):]), specs, out, name, path,
               load, env={"CKPTFS_CACERT": str(ca)})
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    check_listing(json.loads((out / "ls.json").read_bytes()), want)
    assert (out / "https").read_bytes() == want[name][2]
    assert (out / "mounted").read_bytes() == want[name][2]
    for i, (n, (_, _, data)) in enumerate(want.items()):
        assert (out / f"load.{i}").read_bytes() == data, n
        assert (out / f"into.{i}").read_bytes() == data, n


# --- 6. a library the wheel forgot ------------------------------------------------------------

def test_a_forgotten_library_fails_the_check(root, sources, wheel):
    """The wheel pip built, before auditwheel vendored its libraries: the same `ckpt ls` and
    ckload.load fail in the root with the dynamic loader's word for the missing library."""
    raw = sorted((build_dir() / "wheelhouse").glob("ckptfs-*-linux_x86_64.whl"))
    assert len(raw) == 1, f"make wheel leaves pip's wheel in build/wheelhouse: {raw}"
    p = root.install(raw[0], venv="/venv-raw")
    assert p.returncode == 0, p.stderr.decode()
    src, _ = sources["safetensors"]
    p, _ = in_root(root, "/venv-raw/bin/ckpt ls \"$1\"", src)
    assert p.returncode != 0 and MISSING_LIB.search(p.stderr), p.stderr
    p, _ = in_root(root, "exec /venv-raw/bin/python -c 'import sys, ckload; "
                   "ckload.load(sys.argv[1], device=\"cpu\")' \"$1\"", src)
    assert p.returncode != 0 and MISSING_LIB.search(p.stderr), p.stderr
    assert b"ckload: cannot load" in p.stderr, p.stderr


# --- 7. bad input: one line that says what to install or pass --------------------------------

def one_line(p):
    assert p.returncode != 0
    lines = p.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_no_dev_fuse_says_what_to_pass(root, sources):
    src, _ = sources["safetensors"]
    p, _ = in_root(root, "mkdir -p /mnt/x && ckptfs \"$1\" /mnt/x", src, fuse=None)
    assert one_line(p) == ("ckptfs: /dev/fuse: No such file or directory: FUSE is not usable "
                           "here (a container needs --device /dev/fuse)")


def test_a_user_without_fusermount3_is_told_to_install_it(root, sources):
    src, _ = sources["safetensors"]
    p, _ = in_root(root, f"exec setpriv --reuid={USER} --regid={USER} --init-groups sh -c "
                   f"'mkdir -p /home/{USER}/nofm && ckptfs \"$1\" /home/{USER}/nofm' sh \"$1\"", src, fuse="device",
                   binds=[NO_FUSERMOUNT])
    assert one_line(p) == ("ckptfs: fusermount3: not found on PATH: a user other than root "
                           "mounts through it (install fuse3, or mount as root)")


def test_a_libc_too_old_is_refused_by_pip(wheel, tmp_path):
    """bullseye (glibc 2.31) is older than the wheel's manylinux_2_34: pip refuses the wheel by
    its tag, in one line, and installs nothing."""
    old = Root(tmp_path / "oldlibc", None, torch=False, name="oldlibc")
    p = old.install(wheel)
    assert p.returncode != 0
    assert p.stderr.decode().strip() == (f"ERROR: {os.path.basename(wheel)} is not a supported "
                                         f"wheel on this platform."), p.stderr
    assert not os.path.exists(old.host("/venv/bin/ckpt"))
    p = old.run(["ldd", "--version"])
    assert b"2.31" in p.stdout.splitlines()[0], p.stdout
    shutil.rmtree(tmp_path / "oldlibc", ignore_errors=True)
