"""No secret in any message of any entry point, whatever form the location carries it in: a URL's
userinfo (`https://user:S3CR3T@...`), a presigned query (`?X-Amz-Signature=...`), an hf://
location read with a token in the environment (HF_TOKEN), an s3:// location read with a secret
key in the environment (AWS_SECRET_ACCESS_KEY), a gs:// location read with an authorized_user's
refresh token and client secret in GOOGLE_APPLICATION_CREDENTIALS's file and the access token
they buy. The entry points: libckload (ctypes), `ckpt`
(every command that takes a source), the daemon `ckptfs` (its stderr, which is its log in the
foreground), the Python module (load, load_into, entries, stream, attach, serve: refused
arguments and failing sources) and the vLLM load format (its config check and fill). Every
server is the tests' own on 127.0.0.1: netlab's file server and Hub stand-in, s3lab's radosgw,
test_gcs's token and storage servers.
Each message must also still name the location as shown (ckload.shown, the C rule), so that a
message that names nothing cannot pass."""
import ctypes
import os
import subprocess
import time

import pytest
import torch

import ckload
import ckload_vllm
import netlab
import s3lab
from ckptfs_testlib import assert_refused, ckpt_bin, ckptfs_bin, is_mounted, library_view, unmount
from test_http_faults import NAME, sample, server, tensor_paths  # noqa: F401 (fixtures)

SECRET = "S3CR3T"
HUB_TOKEN = f"hf_{SECRET}_hub_token"
BUCKET = "secrets-bkt"
TIMEOUT = 120


@pytest.fixture(scope="module")
def hub(tmp_path_factory, sample):
    with netlab.HubServer(tmp_path_factory.mktemp("hub"), token=HUB_TOKEN) as h:
        h.add_repo("org/model", {"model.safetensors": sample[1].read_bytes()}, private=True)
        yield h


@pytest.fixture(scope="module")
def s3(tmp_path_factory, sample):
    with s3lab.S3Server(tmp_path_factory.mktemp("s3")) as srv:
        srv.create_bucket(BUCKET)
        srv.put(BUCKET, f"m/{NAME}", sample[1])
        yield srv


class Place:
    """One form of location: loc (served), bad (a location of that form that fails: a missing
    object, repository or key), env (what the client needs: the endpoints and secrets),
    secrets (what must never be shown)."""

    def __init__(self, loc, bad, env=None, secrets=(SECRET,), changing=None):
        self.loc, self.bad, self.env, self.secrets = loc, bad, env or {}, secrets
        self.changing = changing  # None, or () -> (a location of its own, a function changing it)

    def environ(self):
        env = dict(os.environ, **self.env)
        for k in ("HF_TOKEN_PATH", "HUGGING_FACE_HUB_TOKEN", "AWS_PROFILE", "AWS_SESSION_TOKEN",
                  "STORAGE_EMULATOR_HOST", "CLOUDSDK_CONFIG"):
            env.pop(k, None)
        return env

    def check(self, *texts, names=None):
        """No secret in any of texts; names (a location), when given, shown in the first."""
        for t in texts:
            t = t.decode(errors="replace") if isinstance(t, bytes) else str(t)
            for s in self.secrets:
                assert s not in t, f"{s!r} shown in {t!r}"
        if names is not None:
            first = texts[0].decode() if isinstance(texts[0], bytes) else str(texts[0])
            assert ckload.shown(names) in first, (ckload.shown(names), first)


def gs_place(request, sample, tmp_path):
    """gs://bkt/NAME on test_gcs's storage server, its token bought with a refresh token."""
    import json
    import test_gcs
    data = sample[1].read_bytes()
    state = {}
    store = test_gcs.Server(test_gcs.storage_route(data, objects={NAME: data}, state=state))
    tok = test_gcs.Server(test_gcs.token_route(
        lambda r: r["form"].get("refresh_token") == f"1//{SECRET}-refresh"))
    request.addfinalizer(store.close)
    request.addfinalizer(tok.close)
    key = tmp_path / "adc.json"
    key.write_text(json.dumps({"type": "authorized_user", "client_id": "cid",
                               "client_secret": f"{SECRET}-client", "token_uri": tok.url + "/t",
                               "refresh_token": f"1//{SECRET}-refresh"}))
    home = tmp_path / "home"
    home.mkdir()

    def changing():
        return "gs://bkt/m.safetensors", lambda: state.update(gen="8", data=changed(sample[1]))
    return Place(f"gs://bkt/{NAME}", "gs://bkt/missing.safetensors",
                 {"CKPTFS_GCS_ENDPOINT": store.url, "GOOGLE_APPLICATION_CREDENTIALS": str(key),
                  "HOME": str(home), "GCE_METADATA_HOST": f"127.0.0.1:{netlab.free_port()}"},
                 (SECRET, test_gcs.TOKEN), changing)


@pytest.fixture(params=["userinfo", "presigned", "hf", "s3", "gs"])
def place(request, server, sample, tmp_path, monkeypatch):
    kind = request.param
    if kind in ("userinfo", "presigned"):
        good, bad = server.url(NAME), server.url("missing.safetensors")
        if kind == "userinfo":
            def spell(u):
                return u.replace("://", f"://user:{SECRET}@", 1)
        else:
            def spell(u):
                return u + (f"?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA{SECRET}"
                            f"%2F2026&X-Amz-Signature={SECRET}0123456789abcdef")

        def changing():
            name = f"changing-{kind}.safetensors"
            (server.root / name).write_bytes(sample[1].read_bytes())
            return spell(server.url(name)), lambda: server.replace(name, changed(sample[1]))
        p = Place(spell(good), spell(bad), changing=changing)
    elif kind == "hf":
        h = request.getfixturevalue("hub")
        home = tmp_path / "hf_home"
        home.mkdir()
        p = Place("hf://org/model", "hf://org/missing",
                  {"HF_ENDPOINT": h.base, "HF_TOKEN": HUB_TOKEN, "HF_HOME": str(home)},
                  (SECRET, HUB_TOKEN))
    elif kind == "gs":
        p = gs_place(request, sample, tmp_path)
    else:
        srv = request.getfixturevalue("s3")

        def changing():
            srv.put(BUCKET, "m/changing.safetensors", sample[1])
            return f"s3://{BUCKET}/m/changing.safetensors", \
                lambda: srv.put(BUCKET, "m/changing.safetensors", changed(sample[1]))
        home = tmp_path / "home"
        home.mkdir()
        p = Place(f"s3://{BUCKET}/m/{NAME}", f"s3://{BUCKET}/m/missing.safetensors",
                  {"AWS_ENDPOINT_URL": srv.endpoint, "AWS_REGION": srv.region,
                   "AWS_ACCESS_KEY_ID": srv.access_key, "AWS_SECRET_ACCESS_KEY": srv.secret_key,
                   "HOME": str(home), "AWS_EC2_METADATA_DISABLED": "true"},
                  (SECRET, srv.secret_key), changing)
    for k, v in p.environ().items():  # libckload, in this process, reads the environment too
        if os.environ.get(k) != v:
            monkeypatch.setenv(k, v)
    for k in set(os.environ) - set(p.environ()):
        monkeypatch.delenv(k)
    return p


def changed(path):
    """path's bytes with the last one flipped: the same size, another object."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    return bytes(data)


class Toy(torch.nn.Module):
    """A module whose load_weights copies each tensor whole into its parameter of that name
    (each NaN until then): everything placed, nothing streamed."""

    def __init__(self, shapes):
        super().__init__()
        for name, shape in shapes.items():
            self.register_parameter(name, torch.nn.Parameter(torch.full(shape, float("nan")),
                                                             requires_grad=False))

    def load_weights(self, weights):
        done = set()
        for name, w in weights:
            self.get_parameter(name).data.copy_(w)
            done.add(name)
        return done


def python_argument_errors(loc, sock):
    """Every call of the module that refuses an argument before a byte is read, each naming
    loc (or the socket): (what, callable, exception class)."""
    t = {"w": torch.zeros(1)}
    return [
        ("load threads", lambda: ckload.load(loc, threads=-1), ValueError),
        ("load device", lambda: ckload.load(loc, device="tpu"), ValueError),
        ("load cuda:N", lambda: ckload.load(loc, device="cuda:99999999999"), ValueError),
        ("load slices", lambda: ckload.load(loc, slices=[("w", 99)]), ValueError),
        ("load rank", lambda: ckload.load(loc, rank=5), ValueError),
        ("load world_size", lambda: ckload.load(loc, world_size=0), ValueError),
        ("load buffer_size", lambda: ckload.load(loc, buffer_size=1), ValueError),
        ("load buffers", lambda: ckload.load(loc, buffers=-1), ValueError),
        ("stream window", lambda: next(ckload.stream(loc, window=0)), ValueError),
        ("stream device", lambda: next(ckload.stream(loc, device="tpu")), ValueError),
        ("entries device", lambda: ckload.entries(loc, device="tpu"), ValueError),
        ("load_into threads", lambda: ckload.load_into(t, loc, threads=-1), ValueError),
        ("serve device", lambda: ckload.serve(loc, sock, device="tpu"), ValueError),
        ("fill window", lambda: ckload_vllm.fill(Toy({}), loc, window=-1), ValueError),
    ]


def test_python_argument_errors(place, tmp_path):
    sock = tmp_path / "no.sock"
    for what, call, cls in python_argument_errors(place.loc, sock):
        with pytest.raises(cls) as e:
            call()
        msg = e.value.args[0]
        assert msg.startswith("ckload: ") and "\n" not in msg, (what, msg)
        place.check(msg, names=place.loc)


def test_python_stream_names(place):
    """stream's names refused (TypeError, KeyError), the location named without its secrets."""
    for names, cls in (("ab", TypeError), ([1], TypeError), (["no.such"], KeyError)):
        with pytest.raises(cls) as e:
            next(ckload.stream(place.loc, device="cpu", names=names))
        place.check(e.value.args[0], names=place.loc)


def test_python_failing_sources(place, tmp_path):
    """load, Load with verify, entries, stream, load_into, serve and fill of a location that
    fails: one line naming it, no secret."""
    bad, t = place.bad, {"w": torch.zeros(1)}
    calls = [lambda: ckload.load(bad, device="cpu"),
             lambda: ckload.Load(bad, device="cpu", verify=True),
             lambda: ckload.entries(bad, device="cpu"),
             lambda: next(ckload.stream(bad, device="cpu")),
             lambda: ckload.load_into(t, bad),
             lambda: ckload.serve(bad, tmp_path / "s.sock", device="cpu"),
             lambda: ckload_vllm.fill(Toy({}), bad)]
    for call in calls:
        with pytest.raises((RuntimeError, OSError, ValueError)) as e:
            call()
        place.check(str(e.value), names=bad)


def test_python_load_into_refusal(place):
    """load_into's own line (a target whose shape the checkpoint's tensor is not)."""
    name = ckload.entries(place.loc, device="cpu")[0].name
    with pytest.raises(RuntimeError) as e:
        ckload.load_into({name: torch.zeros(1)}, place.loc)
    place.check(str(e.value), names=place.loc)


def test_python_attach(place, tmp_path):
    """attach and Attached with a source that holds secrets: no server on the socket, a socket
    that is not one, a device refused: each names the socket, none shows the source's secret."""
    sock = tmp_path / "none.sock"
    for call in (lambda: ckload.attach(sock, source=place.loc),
                 lambda: ckload.Attached(sock, device="cuda:0", source=place.loc),
                 lambda: ckload.attach(sock, device="cpu", source=place.loc),
                 lambda: ckload.load_into({"w": torch.zeros(1)}, ckload.Attached(
                     sock, source=place.loc))):
        with pytest.raises((RuntimeError, OSError, ValueError)) as e:
            call()
        place.check(str(e.value), names=sock)


def test_libckload_through_ctypes(place):
    """The C API itself (no Python module in between): ckl_load_start's err of a failing
    location and of a refused option, and ckl_location_shown."""
    lib = ckload.library()
    o = ckload.Options()
    for loc, threads in ((place.bad, 0), (place.loc, 100000)):
        lib.ckl_default_options(ctypes.byref(o))
        o.device, o.threads = ckload.CKL_CPU, threads
        err = ctypes.create_string_buffer(len(loc) + ckload.ERR_ROOM)
        h = ctypes.c_void_p()
        assert lib.ckl_load_start(loc.encode(), ctypes.byref(o), ctypes.byref(h), err,
                                  len(err)) != 0
        place.check(err.value, names=loc)
    place.check(ckload.shown(place.loc))


def ckpt(place, *args):
    p = subprocess.run([str(ckpt_bin()), *map(str, args)], capture_output=True,
                       timeout=TIMEOUT, env=place.environ())
    place.check(p.stdout, p.stderr)
    return p


def test_ckpt_every_command(place, sample, tmp_path):
    """Each command that takes a source, on the served location (what it prints) and on a
    failing one (its one line, naming the location)."""
    loc, bad, local = place.loc, place.bad, sample[1]
    name = next(iter(library_view(local)[0]))
    for args in (["ls", loc], ["info", loc], ["cat", loc, name], ["stats", loc],
                 ["diff", loc, local], ["convert", loc, tmp_path / "o.safetensors"],
                 ["pack", loc, tmp_path / "o.pack"], ["load", loc, "--device", "cpu"]):
        p = ckpt(place, *args)
        assert p.returncode == 0, (args, p.stderr)
    sock = tmp_path / "s.sock"
    for named, args in ((bad, ["ls", bad]), (bad, ["info", bad]), (bad, ["cat", bad, name]),
                        (bad, ["stats", bad]), (bad, ["diff", local, bad]),
                        (bad, ["convert", bad, tmp_path / "x.safetensors"]),
                        (bad, ["pack", bad, tmp_path / "x.pack"]),
                        (bad, ["load", bad, "--device", "cpu"]), (bad, ["verify", bad]),
                        (loc, ["verify", loc]), (loc, ["cat", loc, "no.such.tensor"]),
                        (bad, ["serve", bad, "--device", "cuda:0", "--socket", sock]),
                        (loc, ["serve", loc, "--device", "cuda:0", "--socket", sock]),
                        (loc, ["convert", local, loc]), (loc, ["pack", local, loc]),
                        (loc + "/", ["convert", local, loc + "/"])):
        p = ckpt(place, *args)
        line = p.stderr.decode()
        assert p.returncode != 0 and line.count("\n") == 1 and line.startswith("ckpt: "), \
            (args, line)
        place.check(line, names=named)


def test_daemon_refused_and_its_log(place, mountpoint):
    """ckptfs refusing a failing location (its stderr); then, in the foreground (its log on
    stderr), a mount (its root's user.ckptfs.sources, what a loader reads, names the object
    without its secrets) whose object changes under it (not for hf://, pinned to a commit): a
    read fails and the log says so, naming the object without its secrets."""
    place.check(assert_refused(place.bad, mountpoint, prefix=""), names=place.bad)
    loc, change = place.changing() if place.changing else (place.loc, None)
    d = subprocess.Popen([str(ckptfs_bin()), "-f", loc, str(mountpoint)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=place.environ())
    try:
        deadline = time.monotonic() + TIMEOUT
        while not is_mounted(mountpoint) and d.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert is_mounted(mountpoint), "not mounted"
        with open(f"/proc/{d.pid}/cmdline", "rb") as f:
            place.check(f.read())
        place.check(os.getxattr(mountpoint, "user.ckptfs.sources"), names=loc)
        if change:
            change()
            with pytest.raises(OSError):
                for t in tensor_paths(mountpoint).values():
                    t.read_bytes()
            status = (mountpoint / ".ckptfs" / "status").read_text()  # the mount's own word
            assert status.startswith("source changed: "), status
            place.check(status, names=loc)
    finally:
        if is_mounted(mountpoint):
            unmount(mountpoint)
        out, err = d.communicate(timeout=TIMEOUT)
    place.check(err, out, names=loc if change else None)
    assert not change or b"source changed" in err, err


@pytest.mark.parametrize("window", ["1G", None, [1 << 20], -1, 0, True, 1.5])
def test_vllm_config_window(window):
    """The load format's `window` key checked before anything is read: one line naming the key,
    as for an unknown key."""
    with pytest.raises(ValueError) as e:
        ckload_vllm.checked_config({"window": window, "source": f"https://u:{SECRET}@h/m"})
    assert e.value.args[0] == (f"ckload: model_loader_extra_config: window={window!r}: not an "
                               f"integer from 1 to {1 << 62}")
    assert ckload_vllm.checked_config({"window": 4096}) == {"window": 4096}


def test_vllm_window_refused_where_nothing_streams(tmp_path):
    """fill with window -1 on a model whose every tensor is placed (nothing streamed) is
    refused all the same, before a byte is read; window 1 fills it as safetensors reads it."""
    from safetensors.torch import load_file, save_file
    src = tmp_path / "m.safetensors"
    save_file({"a": torch.randn(4), "b": torch.randn(2, 3)}, str(src))
    want = load_file(str(src))
    m = Toy({n: t.shape for n, t in want.items()})
    with pytest.raises(ValueError) as e:
        ckload_vllm.fill(m, src, window=-1)
    assert e.value.args[0] == f"ckload: {src}: window=-1: not an integer from 1 to {1 << 62}"
    assert all(p.isnan().all() for p in m.parameters())  # nothing read
    placed, _, rest = ckload_vllm.fill(m, src, window=1)
    assert placed == len(want) and rest == 0
    for name, w in want.items():
        assert torch.equal(m.get_parameter(name), w), name
