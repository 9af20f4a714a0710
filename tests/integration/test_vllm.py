"""vLLM's load format `ckload` (loader/python/ckload_vllm.py) against the real vLLM: its CPU build,
in scripts/setup's .deps/vllm, with the ckptfs wheel installed beside it (pip --target), so that
vLLM finds the plugin through its entry point as it would after `pip install ckptfs`.

Tiny models made by transformers with fixed seeds (a Llama, and a Qwen2 whose lm_head is tied to
its embeddings): greedy tokens with load_format="ckload" equal load_format="auto"'s, from the
model directory and, through model_loader_extra_config's source, from every other kind of
source; through the OpenAI-compatible server; with tensor_parallel_size=2. Each refusal (a
tensor missing or mis-shaped, a source that cannot be read or was changed) fails vLLM's start
with ckload's one line, and no token is served. Each start is a fresh vLLM (20-40 s here): the
sources past the first are read into one running engine by vLLM's own reload_weights, fed by
ckload.stream after every parameter was zeroed, so a source that loaded nothing shows."""
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import netlab
from ckptfs_testlib import Mounter, build_dir, run
from wheelroot import REPO, built_wheel

VLLM_PY = Path(REPO) / ".deps" / "vllm" / "bin" / "python"
DRIVER = Path(__file__).with_name("vllm_driver.py")
START = 600  # seconds one vLLM start may take here, at most


@pytest.fixture(scope="module")
def vllm_env(tmp_path_factory):
    """The environment of a vLLM process: the wheel installed beside vLLM, nothing of the
    tests' own Python path, the KV cache small enough for this machine."""
    if not VLLM_PY.exists():
        pytest.fail(f"{VLLM_PY} is missing: scripts/setup makes the vLLM venv")
    target = tmp_path_factory.mktemp("plugin")
    p = run([VLLM_PY, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
             "--disable-pip-version-check", "--target", target, built_wheel()], timeout=300)
    assert p.returncode == 0, p.stderr.decode()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CKLOAD_"))}
    env.update(PYTHONPATH=str(target), VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1",
               VLLM_CPU_OMP_THREADS_BIND="0|1", TOKENIZERS_PARALLELISM="false")
    return env


def driver(env, *args, timeout=START, check=True):
    p = subprocess.run([str(VLLM_PY), str(DRIVER), *map(str, args)], capture_output=True,
                       env=env, timeout=timeout)
    out = p.stdout.decode()
    if check:
        assert p.returncode == 0, p.stderr.decode()[-6000:]
    return p, [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def generate(env, model, check=True, **spec):
    return driver(env, "generate", json.dumps({"model": str(model), **spec}), check=check)


@pytest.fixture(scope="module")
def llama(vllm_env, tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    driver(vllm_env, "make", d, "llama", timeout=300)
    return d


@pytest.fixture(scope="module")
def expected(vllm_env, llama):
    """vLLM's own load (load_format auto, its safetensors loader): the tokens to match."""
    _, lines = generate(vllm_env, llama)
    return lines[0]["tokens"]


def write_shards(src, d):
    """src's tensors as two safetensors shards and their index, as save_pretrained shards."""
    sd = load_file(src)
    names = list(sd)
    parts = {"model-00001-of-00002.safetensors": names[::2],
             "model-00002-of-00002.safetensors": names[1::2]}
    d.mkdir()
    for fname, keys in parts.items():
        save_file({k: sd[k] for k in keys}, d / fname, metadata={"format": "pt"})
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: f for f, ks in parts.items() for k in ks}}))
    return d


@pytest.fixture(scope="module")
def sources(llama, tmp_path_factory, vllm_env):
    """The llama's weights as every kind of local source ckload reads, each written by an
    independent writer (torch, safetensors, ckpt pack from the safetensors file)."""
    d = tmp_path_factory.mktemp("sources")
    st = llama / "model.safetensors"
    out = {"safetensors": st, "shards": write_shards(st, d / "shards")}
    torch.save(load_file(st), d / "pytorch_model.bin")
    out["bin"] = d / "pytorch_model.bin"
    p = run([build_dir() / "ckpt", "pack", st, d / "model.pack"], timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    out["pack"] = d / "model.pack"
    code = ("import sys, torch.distributed.checkpoint as dcp; from safetensors.torch import "
            "load_file; dcp.save(load_file(sys.argv[1]), checkpoint_id=sys.argv[2])")
    p = run([VLLM_PY, "-c", code, st, d / "dcp"], timeout=300, env=vllm_env)
    assert p.returncode == 0, p.stderr.decode()
    out["dcp"] = d / "dcp"
    return out


def test_tokens_equal_autos_from_every_source(vllm_env, llama, expected, sources,
                                              tmp_path, s3server):
    """--load-format ckload from the model directory, then the weights read again from a pack,
    .bin, shards, DCP, a mount and its checkpoint.pack, s3:// and hf://: auto's tokens each time."""
    s3server.create_bucket("models")
    s3server.put_file("models", "llama/model.safetensors", sources["safetensors"])
    env = {**{k: v for k, v in vllm_env.items() if not k.startswith("AWS_")},
           "AWS_ENDPOINT_URL": s3server.endpoint, "AWS_REGION": s3server.region,
           "AWS_ACCESS_KEY_ID": s3server.access_key, "AWS_SECRET_ACCESS_KEY": s3server.secret_key,
           "AWS_EC2_METADATA_DISABLED": "true"}  # never 169.254.169.254
    store = tmp_path / "hub"
    with netlab.HubServer(store) as hub, Mounter(tmp_path)(llama) as mnt:
        hub.add_repo("org/llama", {"model.safetensors": sources["safetensors"].read_bytes()})
        env["HF_ENDPOINT"] = hub.base
        reload = [str(sources[k]) for k in ("pack", "bin", "shards", "dcp")] + [
            str(mnt), str(mnt / ".ckptfs" / "checkpoint.pack"),
            "s3://models/llama/model.safetensors", "hf://org/llama"]
        p, lines = generate(env, llama, load_format="ckload", reload=reload)
    # in vLLM's log, its loaders' words; every tensor read straight into its parameter
    count = len(load_file(sources["safetensors"]))
    assert "Loading weights took" in p.stdout.decode() and \
        f"(ckload, from {llama}: {count} tensors read into place, " in p.stdout.decode() and \
        "; 0 through load_weights" in p.stdout.decode()
    assert [line["source"] for line in lines] == ["ckload"] + reload
    for line in lines:
        assert line["tokens"] == expected, line["source"]


def test_a_tied_lm_head_loads_as_autos(vllm_env, tmp_path):
    qwen = tmp_path / "qwen2"
    driver(vllm_env, "make", qwen, "qwen2-tied", timeout=300)
    assert "lm_head.weight" not in load_file(qwen / "model.safetensors")
    _, auto = generate(vllm_env, qwen)
    _, mine = generate(vllm_env, qwen, load_format="ckload",
                       extra={"source": str(qwen / "model.safetensors")})
    assert mine[0]["tokens"] == auto[0]["tokens"]


def test_tensor_parallel_2(vllm_env, llama, expected, sources):
    """Each rank reads its part of each tensor vLLM shards (as torch.chunk cuts it) straight
    into its parameters, no tensor through load_weights: across the two ranks every byte is
    read once, but those of the tensors each rank holds whole (the norms), read by each."""
    p, lines = generate(vllm_env, llama, load_format="ckload", tp=2,
                        extra={"source": str(sources["pack"])})
    assert lines[0]["tokens"] == expected
    sd = load_file(sources["safetensors"])
    total = sum(t.numel() * t.element_size() for t in sd.values())
    whole = sum(t.numel() * t.element_size() for k, t in sd.items() if "norm" in k)
    found = re.findall(rf"{len(sd)} tensors read into place, (\d+) bytes; 0 through load_weights",
                       p.stdout.decode())
    assert len(found) == 2, p.stdout.decode()[-3000:]
    assert sum(map(int, found)) == total + whole


def test_the_openai_server_serves_with_ckload(vllm_env, llama, expected, tmp_path):
    model = tmp_path / "served"
    shutil.copytree(llama, model)
    driver(vllm_env, "tokenizer", model, timeout=300)
    port = netlab.free_port()
    server = subprocess.Popen(
        [str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
         "--load-format", "ckload", "--dtype", "float32", "--max-model-len", "64",
         "--enforce-eager", "--host", "127.0.0.1", "--port", str(port)],
        env=vllm_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + START
        body = json.dumps({"model": str(model), "prompt": "t1 t5 t9 t33", "max_tokens": 8,
                           "temperature": 0}).encode()
        while True:
            assert server.poll() is None, server.stderr.read().decode()[-4000:]
            assert time.monotonic() < deadline, "the server did not answer in time"
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                             {"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=60) as r:
                    answer = json.load(r)
                break
            except OSError:
                time.sleep(1)
        words = answer["choices"][0]["text"].split()
        assert [int(w[1:]) for w in words] == expected[0]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)


def refused(vllm_env, llama, source, *needles):
    p, lines = generate(vllm_env, llama, check=False, load_format="ckload",
                        extra={"source": str(source)})
    err = p.stdout.decode() + p.stderr.decode()  # vLLM logs to stdout
    assert p.returncode != 0 and lines == [], "a model that failed to load served tokens"
    mine = [line for line in err.splitlines() if "ckload: " in line]
    assert mine, err[-4000:]
    for needle in needles:
        assert any(needle in line for line in mine), mine


def test_a_missing_tensor_fails_the_start(vllm_env, llama, tmp_path):
    sd = load_file(llama / "model.safetensors")
    del sd["model.norm.weight"]
    save_file(sd, tmp_path / "short.safetensors")
    refused(vllm_env, llama, tmp_path / "short.safetensors",
            f"ckload: {tmp_path / 'short.safetensors'}: no tensor for the model's model.norm.weight")


def test_a_misshaped_tensor_fails_the_start(vllm_env, llama, tmp_path):
    sd = load_file(llama / "model.safetensors")
    sd["model.norm.weight"] = torch.zeros(7)
    save_file(sd, tmp_path / "bad.safetensors")
    refused(vllm_env, llama, tmp_path / "bad.safetensors",
            f"ckload: {tmp_path / 'bad.safetensors'}: tensor 'model.norm.weight': refused by the model")


def test_an_unreadable_source_fails_the_start(vllm_env, llama, tmp_path):
    refused(vllm_env, llama, tmp_path / "nowhere.safetensors", str(tmp_path / "nowhere.safetensors"))


def test_a_changed_pack_fails_the_start(vllm_env, llama, sources, tmp_path):
    """A pack whose bytes changed after it was written: its checksums (verify) refuse it."""
    bad = tmp_path / "changed.pack"
    shutil.copy(sources["pack"], bad)
    data = bytearray(bad.read_bytes())
    data[-100] ^= 0xFF  # a byte of the last blob's data
    bad.write_bytes(bytes(data))
    refused(vllm_env, llama, bad, str(bad))


WINDOWS = """
import ckload_vllm
from vllm.config import LoadConfig
from vllm.model_executor.model_loader import get_model_loader
ckload_vllm.register()
for w in ("1G", None, [1 << 20], -1, True):
    try:
        get_model_loader(LoadConfig(load_format="ckload", model_loader_extra_config={
            "window": w, "source": "https://user:S3CR3T@127.0.0.1:9/m.safetensors"}))
        print("accepted", repr(w))
    except ValueError as e:
        print(str(e))
get_model_loader(LoadConfig(load_format="ckload", model_loader_extra_config={"window": 4096}))
"""


def test_the_registered_format_refuses_a_bad_window(vllm_env):
    """vLLM's own get_model_loader on the registered format (no engine started): a `window`
    that is not an integer from 1 to 2**62 is one line naming the key, as an unknown key is."""
    p = subprocess.run([str(VLLM_PY), "-c", WINDOWS], capture_output=True, env=vllm_env,
                       timeout=START)
    assert p.returncode == 0, p.stderr.decode()[-4000:]
    want = [f"ckload: model_loader_extra_config: window={w!r}: not an integer from 1 to {1 << 62}"
            for w in ("1G", None, [1 << 20], -1, True)]
    assert p.stdout.decode().splitlines() == want, p.stdout.decode()


PULLED = """
import sys, types, torch
import ckload_vllm
from safetensors.torch import load_file
from vllm.config import LoadConfig
from vllm.model_executor.model_loader import get_model_loader
ckload_vllm.register()


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(4, 6), requires_grad=False)

    def load_weights(self, weights):
        for name, t in weights:
            getattr(self, name).copy_(t)
        return {"w"}


tiny = Tiny()
config = types.SimpleNamespace(model=sys.argv[1], model_weights=sys.argv[2], revision=None)
with torch.no_grad():
    get_model_loader(LoadConfig(load_format="ckload")).load_weights(tiny, config)
assert torch.equal(tiny.w, load_file(sys.argv[2] + "/model.safetensors")["w"])
"""


def test_the_weights_of_a_model_vllm_pulled_are_read_where_they_are(vllm_env, tmp_path):
    """A model named by an object-storage URI: vLLM pulls its config files into a local
    directory (model_config.model) and keeps the URI in model_config.model_weights. ckload
    reads the weights from the URI (here a directory stands in for it), not from the local
    directory, which holds none."""
    pulled, weights = tmp_path / "pulled", tmp_path / "weights"
    pulled.mkdir()
    weights.mkdir()
    (pulled / "config.json").write_text("{}")
    save_file({"w": torch.arange(24, dtype=torch.float32).reshape(4, 6)},
              weights / "model.safetensors")
    p = subprocess.run([str(VLLM_PY), "-c", PULLED, str(pulled), str(weights)],
                       capture_output=True, env=vllm_env, timeout=START)
    assert p.returncode == 0, p.stderr.decode()[-4000:]
