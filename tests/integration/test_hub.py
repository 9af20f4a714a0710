"""hf:// against netlab's stand-in for the Hugging Face Hub (its revision/tree API and resolve,
written from huggingface_hub's documentation) with nginx on 127.0.0.2 as the CDN it redirects
to. The client learns the endpoint from HF_ENDPOINT and the token from HF_TOKEN or the token
file under HF_HOME. Checked: the bytes (against the safetensors library and torch on the local
files), the pinning of a branch to the commit the Hub reported, and the token: sent to the Hub,
never to the CDN, never printed, never in `mount` output."""
import json
import subprocess

import pytest
import torch

import netlab
from ckptfs_testlib import (assert_refused, check_torch_mount, ckpt_bin, ckptfs_pids,
                            library_view, mount_entries, read_index, write_safetensors)

TIMEOUT = 90


def sha_map(path):
    return {n: netlab.sha256(t[2]) for n, t in library_view(path)[0].items()}


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """The checkpoints the repos hold, written locally first (the independent readers read these)."""
    d = tmp_path_factory.mktemp("hubsrc")
    single = write_safetensors(d / "single.safetensors", netlab.sample_tensors(seed=1))
    changed = write_safetensors(d / "changed.safetensors", netlab.sample_tensors(seed=2))
    shards = d / "shards"
    shards.mkdir()
    tensors = netlab.sample_tensors(seed=3)
    weight_map = {}
    for i, part in enumerate((tensors[:4], tensors[4:])):
        name = f"model-0000{i + 1}-of-00002.safetensors"
        write_safetensors(shards / name, part)
        weight_map.update({t[0]: name for t in part})
    (shards / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": sum(len(t[3]) for t in tensors)},
                    "weight_map": weight_map}))
    pt = d / "pytorch_model.bin"
    torch.save({"w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
                "b": torch.ones(5, dtype=torch.bfloat16)}, pt)
    return {"single": single, "changed": changed, "shards": shards, "pt": pt}


@pytest.fixture(scope="module")
def hub(tmp_path_factory, local):
    store = tmp_path_factory.mktemp("hubstore")
    with netlab.Nginx(store, host="127.0.0.2") as cdn, netlab.HubServer(store, cdn) as hub:
        hub.cdn_server = cdn
        single = local["single"].read_bytes()
        hub.add_repo("org/single", {"model.safetensors": single, "config.json": b'{"a": 1}'})
        hub.add_repo("org/sharded", {p.name: p.read_bytes() for p in local["shards"].iterdir()})
        hub.add_repo("org/torch", {"pytorch_model.bin": local["pt"].read_bytes(),
                                   "config.json": b"{}"})
        hub.add_repo("org/private", {"model.safetensors": single}, private=True)
        hub.add_repo("org/empty", {"README.md": b"nothing here\n"})
        yield hub


@pytest.fixture
def env(hub, monkeypatch, tmp_path):
    """The client's environment: HF_ENDPOINT at the stand-in, no token anywhere (an empty
    HF_HOME), and the returned hub with its logs cleared."""
    for var in ("HF_TOKEN", "HF_TOKEN_PATH", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", hub.base)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    (tmp_path / "hf_home").mkdir()
    hub.clear()
    hub.cdn_server.mark_now = hub.cdn_server.mark()
    return hub


def cdn_requests(hub):
    return hub.cdn_server.requests(since=hub.cdn_server.mark_now)


def assert_mount_matches(mnt, want):
    paths = {t["name"]: mnt / t["path"] for t in read_index(mnt)["tensors"]}
    assert set(paths) == set(want)
    got = netlab.read_many(paths.values())
    assert {n: got[str(p)] for n, p in paths.items()} == {n: ("ok", h) for n, h in want.items()}


def assert_hf_refused(source, mountpoint):
    """ckptfs refuses source in one line (assert_refused's contract) that names the source or
    the Hub URL it resolved to: either way, the repository."""
    repo = source[len("hf://"):].split("@")[0].split("/")
    err = assert_refused(source, mountpoint, prefix="")
    assert "/".join(repo[:2]) in err, err
    return err


def ckpt(*args):
    return subprocess.run([str(ckpt_bin()), *map(str, args)], capture_output=True, timeout=TIMEOUT)


def test_file_url(mount, env, local):
    want = sha_map(local["single"])
    with mount("hf://org/single/model.safetensors") as mnt:
        assert_mount_matches(mnt, want)
    resolves = [r for r in env.requests() if "/resolve/" in r["uri"]]
    assert resolves and all(r["status"] == 302 for r in resolves)
    assert cdn_requests(env) and all(r["status"] in (200, 206) for r in cdn_requests(env))
    p = ckpt("cat", "hf://org/single/model.safetensors", "head.weight")
    assert p.returncode == 0, p.stderr
    assert p.stdout == library_view(local["single"])[0]["head.weight"][2]


def test_repo_mounts_its_weights(mount, env, local):
    """hf://ORG/REPO: the revision API names the files; the one .safetensors is mounted, and
    every later request names the commit the API reported, not the branch."""
    want = sha_map(local["single"])
    sha = env.repos["org/single"]["refs"]["main"]
    with mount("hf://org/single") as mnt:
        assert_mount_matches(mnt, want)
    api = [r for r in env.requests() if r["uri"].startswith("/api/")]
    assert api, env.requests()
    for r in env.requests():
        if "/resolve/" in r["uri"]:
            assert f"/resolve/{sha}/" in r["uri"], r
    assert all(sha in r["uri"] for r in cdn_requests(env))


def test_repo_with_an_index_mounts_every_shard(mount, env, local):
    tensors, _ = library_view(local["shards"])
    with mount("hf://org/sharded") as mnt:
        assert_mount_matches(mnt, {n: netlab.sha256(t[2]) for n, t in tensors.items()})


def test_repo_with_one_torch_checkpoint(mount, env, local):
    with mount("hf://org/torch") as mnt:
        check_torch_mount(mnt, local["pt"], "pytorch-zip")


def test_branch_is_pinned_to_its_commit(mount, env, local):
    """A mount of @main keeps the commit main had when mounting: a commit pushed while mounted
    changes nothing in it; a new mount sees the new commit."""
    old = env.add_repo("org/moving", {"model.safetensors": local["single"].read_bytes()}, tags=["v1"])
    with mount("hf://org/moving@main") as mnt:
        new = env.add_repo("org/moving", {"model.safetensors": local["changed"].read_bytes()})
        assert new != old
        assert_mount_matches(mnt, sha_map(local["single"]))
    with mount("hf://org/moving") as mnt:
        assert_mount_matches(mnt, sha_map(local["changed"]))
    with mount("hf://org/moving@v1") as mnt:
        assert_mount_matches(mnt, sha_map(local["single"]))
    with mount(f"hf://org/moving@{old}/model.safetensors") as mnt:
        assert_mount_matches(mnt, sha_map(local["single"]))


def test_file_at_a_branch_is_pinned_to_its_commit(mount, local, tmp_path, monkeypatch):
    """hf://ORG/REPO@BRANCH/PATH keeps the commit the branch named at mount: after a push to the
    branch, reads (which go back to the Hub: this stand-in has no CDN, its resolve serves the
    bytes) still get the old commit's bytes, every one of them asked at that commit."""
    store = tmp_path / "store"
    store.mkdir()
    with netlab.HubServer(store) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.base)
        monkeypatch.setenv("HF_HOME", str(tmp_path))
        old = hub.add_repo("org/moving", {"model.safetensors": local["single"].read_bytes()})
        with mount("hf://org/moving@main/model.safetensors") as mnt:
            new = hub.add_repo("org/moving", {"model.safetensors": local["changed"].read_bytes()})
            assert new != old
            assert_mount_matches(mnt, sha_map(local["single"]))
        resolves = [r for r in hub.requests() if "/resolve/" in r["uri"]]
        assert len(resolves) > 1 and all(f"/resolve/{old}/" in r["uri"] for r in resolves), resolves
        with mount("hf://org/moving@main/model.safetensors") as mnt:
            assert_mount_matches(mnt, sha_map(local["changed"]))


def _token_nowhere(hub, *texts):
    for t in texts:
        assert hub.token not in (t.decode(errors="replace") if isinstance(t, bytes) else t)
    for src, mp, fstype, opts in mount_entries():
        assert hub.token not in src + mp + fstype + opts


def test_private_repo_needs_the_token(mount, env, local, mountpoint, monkeypatch):
    """Without a token: one line, nothing mounted, and the Hub saw no Authorization. With
    HF_TOKEN: mounted; the Hub got the token, the CDN on another host never did; the token is
    in no output, no /proc/mounts line and no daemon command line."""
    p = ckpt("ls", "hf://org/private")
    assert p.returncode == 1 and p.stderr.count(b"\n") == 1 and p.stderr.startswith(b"ckpt: "), p.stderr
    assert_hf_refused("hf://org/private", mountpoint)
    assert all(r["auth"] == 0 for r in env.requests())

    monkeypatch.setenv("HF_TOKEN", env.token)
    env.clear()
    want = sha_map(local["single"])
    p = ckpt("ls", "hf://org/private")
    assert p.returncode == 0, p.stderr
    with mount("hf://org/private") as mnt:
        assert_mount_matches(mnt, want)
        (pid,) = ckptfs_pids(mnt)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        _token_nowhere(env, p.stdout, p.stderr, cmdline)
    hub_reqs = env.requests()
    assert hub_reqs and all(r["auth"] == 1 for r in hub_reqs), hub_reqs
    cdn = cdn_requests(env)
    assert cdn and all(r["auth"] == 0 for r in cdn), cdn


def test_token_file_under_hf_home(mount, env, local, tmp_path, monkeypatch):
    """The token file huggingface_hub writes ($HF_HOME/token) when HF_TOKEN is unset; and
    HF_TOKEN, when set, wins over it."""
    (tmp_path / "hf_home" / "token").write_text(env.token + "\n")
    with mount("hf://org/private") as mnt:
        assert_mount_matches(mnt, sha_map(local["single"]))
    (tmp_path / "hf_home" / "token").write_text("hf_wrong_token\n")
    monkeypatch.setenv("HF_TOKEN", env.token)
    with mount("hf://org/private/model.safetensors") as mnt:
        assert_mount_matches(mnt, sha_map(local["single"]))


def test_wrong_token_is_one_line(env, mountpoint, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_wrong_token_also_secret")
    p = ckpt("ls", "hf://org/private")
    assert p.returncode == 1 and p.stderr.count(b"\n") == 1, p.stderr
    assert b"hf_wrong_token_also_secret" not in p.stderr + p.stdout
    err = assert_hf_refused("hf://org/private", mountpoint)
    assert "hf_wrong_token_also_secret" not in err


@pytest.mark.parametrize("source", ["hf://org/nosuch", "hf://org/single@nosuch",
                                    "hf://org/single/nosuch.safetensors", "hf://org/empty"])
def test_missing_things_are_one_line(env, mountpoint, source):
    p = ckpt("ls", source)
    assert p.returncode == 1 and p.stderr.count(b"\n") == 1 and p.stderr.startswith(b"ckpt: "), p.stderr
    assert_hf_refused(source, mountpoint)


def test_hub_busy_then_fine(mount, env, local):
    """The Hub answers 503 with Retry-After to the first two requests: retried, then mounted."""
    busy = env.fault("status", code=503, retry_after=1, times=2)
    with mount("hf://org/single") as mnt:
        assert_mount_matches(mnt, sha_map(local["single"]))
    assert busy.hits == 2
    assert len(env.requests()) <= 10


@pytest.mark.parametrize("cdn_host", ["127.0.0.1", "127.0.0.2"])
def test_token_stays_with_the_hub_over_tls(mount, local, tmp_path, monkeypatch, cdn_host):
    """The Hub and its CDN over https with a private CA (-o cacert): a private repo mounts, and
    the CDN, on another host or only on another port of the same host (another origin either
    way), never receives the Authorization header."""
    tls = netlab.tls_material(tmp_path / "tls")
    store = tmp_path / "store"
    store.mkdir()
    with netlab.FileServer(store, host=cdn_host, tls=tls) as cdn, \
            netlab.HubServer(store, cdn, tls=tls) as hub:
        hub.add_repo("org/private", {"model.safetensors": local["single"].read_bytes()}, private=True)
        monkeypatch.setenv("HF_ENDPOINT", hub.base)
        monkeypatch.setenv("HF_TOKEN", hub.token)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
        with mount("hf://org/private", options=[f"cacert={tls.ca}"]) as mnt:
            assert_mount_matches(mnt, sha_map(local["single"]))
        assert hub.requests() and all(r["auth"] == 1 for r in hub.requests())
        assert cdn.requests() and all(r["auth"] == 0 for r in cdn.requests())


@pytest.mark.parametrize("shard", ["../model.safetensors", "/etc/passwd", "sub/model.safetensors",
                                   "OTHER"])
def test_index_naming_a_shard_elsewhere_is_refused(env, local, sample_other, shard):
    """A hostile repository's index.json names a shard outside its directory (a parent, an
    absolute path, a subdirectory, a URL on another host): refused in one line, and nothing is
    asked of the other host."""
    other, other_url = sample_other
    name = other_url if shard == "OTHER" else shard
    single = local["single"].read_bytes()
    env.add_repo("org/hostile-index", {
        "model.safetensors.index.json": json.dumps(
            {"metadata": {}, "weight_map": {"embed.weight": name}}).encode(),
        "model.safetensors": single, "sub/model.safetensors": single})
    p = ckpt("ls", "hf://org/hostile-index")
    assert p.returncode == 1 and p.stderr.count(b"\n") == 1 and p.stderr.startswith(b"ckpt: "), p.stderr
    assert other.requests() == []


@pytest.fixture
def sample_other(local):
    """A server on another host (127.0.0.2) holding a checkpoint, and its URL."""
    with netlab.FileServer(local["single"].parent, host="127.0.0.2") as other:
        yield other, other.url(local["single"].name)


def test_sibling_with_a_parent_path_is_not_followed(env, local):
    """The revision API lists a file `../../escape.safetensors`: not a name to resolve."""
    sha = env.add_repo("org/escape", {"model.safetensors": local["single"].read_bytes()})
    env.repos["org/escape"]["commits"][sha] = ["../../escape.safetensors"]
    p = ckpt("ls", "hf://org/escape")
    assert p.returncode == 1 and p.stderr.count(b"\n") == 1, p.stderr
    assert not [r for r in env.requests() if "escape.safetensors" in r["uri"]]


def test_gigantic_api_answer_is_one_line_in_bounded_memory(env):
    env.fault("gigantic", path="/api/", limit=1 << 30)
    p = subprocess.run(["/usr/bin/time", "-f", "%M", str(ckpt_bin()), "ls", "hf://org/single"],
                       capture_output=True, timeout=TIMEOUT)
    err = p.stderr.decode(errors="replace").splitlines()
    assert p.returncode == 1 and err[0].startswith("ckpt: "), err
    assert int(err[-1]) <= 128 * 1024, f"peak RSS {err[-1]} KiB"
