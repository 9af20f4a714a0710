"""vLLM's load format `ckload` against its own `auto`, parameter by parameter: tiny seeded models
of nine architectures whose weight loaders differ (Llama; Qwen2 with its head tied to the
embeddings; GPT-2's Conv1D, transposed; Phi-3's fused qkv and gate_up; Mixtral's and Qwen2-MoE's
experts; Mistral's own names and rotary layout; GPT-NeoX's fused query_key_value; Gemma), in
float32 and bfloat16, each written by transformers 4.44 under Debian's torch 1.13 (the last
transformers that writes `.bin`) in every directory layout vLLM loads: one model.safetensors,
safetensors shards with their index, one pytorch_model.bin, `.bin` shards with
pytorch_model.bin.index.json (and a Trainer's training_args.bin), a `*.pt` (and an
optimizer.pt), two kinds side by side (the first in vLLM's order holds the model, the other
another model's weights), and Mistral's consolidated.safetensors (alone, and beside Hugging Face
shards, as Mistral's repositories ship both).

One engine per architecture starts with load_format="ckload" from one layout's directory alone
(no source key). A vLLM plugin of the test's (vllm_matrix_plugin.py) hashes every parameter in
each worker right after that load; then, in the same model, zeroes every parameter and loads it
again with `auto` and with `ckload` from every layout's directory, hashing after each. Every
hash must be auto's from model.safetensors, on every rank (one architecture at
tensor_parallel_size=2): tokens alone would hide a wrong weight. Where `auto` finds no weights
(a `*.pt` for the models vLLM reads none for, its MoE models; a directory of none, or of two
unrelated checkpoint files), it says so; ckload loads the first and refuses the others in one
line naming what it found."""
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ckptfs_testlib import need_module
from test_vllm import driver, vllm_env  # noqa: F401: vllm_env is a fixture used here

transformers = need_module("transformers")

PLUGIN = "vllm_matrix_plugin"
BASE = "safetensors"  # auto's load of this layout is what every other load must equal
REFUSALS_IN = "llama"  # the engine that also tries directories neither loader takes
TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=512, max_position_embeddings=128)


def configs():
    """name: (config, model class, the layout the engine starts from, dtype, tensor parallel)."""
    t = transformers
    return {
        "llama": (t.LlamaConfig(**TINY), t.LlamaForCausalLM, "bin", torch.float32, 1),
        "qwen2-tied": (t.Qwen2Config(**TINY, tie_word_embeddings=True), t.Qwen2ForCausalLM,
                       "bin-shards", torch.float32, 2),
        "gpt2": (t.GPT2Config(n_embd=128, n_layer=2, n_head=4, vocab_size=512, n_positions=128),
                 t.GPT2LMHeadModel, "safetensors-shards", torch.float32, 1),
        "phi3": (t.Phi3Config(**TINY, pad_token_id=0, bos_token_id=1, eos_token_id=2),
                 t.Phi3ForCausalLM, "safetensors", torch.bfloat16, 1),
        "mixtral": (t.MixtralConfig(**TINY, num_local_experts=4, num_experts_per_tok=2),
                    t.MixtralForCausalLM, "bin-shards", torch.float32, 1),
        "mistral": (t.MistralConfig(**TINY, sliding_window=None), t.MistralForCausalLM,
                    "consolidated", torch.float32, 1),
        "qwen2-moe": (t.Qwen2MoeConfig(**TINY, moe_intermediate_size=64, num_experts=4,
                                       num_experts_per_tok=2, shared_expert_intermediate_size=128),
                      t.Qwen2MoeForCausalLM, "safetensors-beside-bin", torch.float32, 1),
        "gpt-neox": (t.GPTNeoXConfig(**TINY), t.GPTNeoXForCausalLM, "pt", torch.float32, 1),
        "gemma": (t.GemmaConfig(**TINY, head_dim=32), t.GemmaForCausalLM, "bin-beside-pt",
                  torch.bfloat16, 1),
    }


def mistral_named(sd, cfg):
    """sd (Hugging Face's names and rotary layout) as Mistral's consolidated.safetensors holds
    it: its names, and q and k with each head's rotary pairs interleaved (vLLM's
    maybe_remap_mistral undoes it)."""
    def unpermute(w, heads):
        return w.view(heads, 2, w.shape[0] // heads // 2, w.shape[1]).transpose(1, 2) \
            .reshape(w.shape).contiguous()

    names = {"self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk",
             "self_attn.v_proj": "attention.wv", "self_attn.o_proj": "attention.wo",
             "mlp.gate_proj": "feed_forward.w1", "mlp.down_proj": "feed_forward.w2",
             "mlp.up_proj": "feed_forward.w3", "input_layernorm": "attention_norm",
             "post_attention_layernorm": "ffn_norm"}
    out = {}
    for name, t in sd.items():
        if name == "model.embed_tokens.weight":
            out["tok_embeddings.weight"] = t
        elif name == "model.norm.weight":
            out["norm.weight"] = t
        elif name == "lm_head.weight":
            out["output.weight"] = t
        else:
            _, _, i, module, rest = name.split(".", 4)
            if module != "mlp" and module.endswith("norm"):
                new = f"layers.{i}.{names[module]}.{rest}"
            else:
                part, leaf = rest.rsplit(".", 1)
                new = f"layers.{i}.{names[module + '.' + part]}.{leaf}"
            if name.endswith("q_proj.weight"):
                t = unpermute(t, cfg.num_attention_heads)
            elif name.endswith("k_proj.weight"):
                t = unpermute(t, cfg.num_key_value_heads)
            out[new] = t
    return out


def layouts(name, where):
    """{layout: its directory}: the seeded model of configs()[name] saved in each layout vLLM
    loads, each directory with the model's config.json."""
    cfg, cls, _, dtype, _ = configs()[name]
    torch.manual_seed(0)
    model = cls(cfg).to(dtype)
    third = sum(t.numel() * t.element_size() for t in model.state_dict().values()) // 3
    out = {lay: where / lay for lay in ("safetensors", "safetensors-shards", "bin", "bin-shards",
                                         "pt")}
    model.save_pretrained(out["safetensors"])
    model.save_pretrained(out["safetensors-shards"], max_shard_size=third)
    model.save_pretrained(out["bin"], safe_serialization=False)
    model.save_pretrained(out["bin-shards"], safe_serialization=False, max_shard_size=third)
    out["pt"].mkdir()
    shutil.copy(out["bin"] / "config.json", out["pt"])
    shutil.copy(out["bin"] / "pytorch_model.bin", out["pt"] / "model.pt")  # torch.save's file
    # what a Trainer leaves beside the weights, which neither loader may read
    torch.save(transformers.TrainingArguments(output_dir=str(where), report_to=[]),
               out["bin-shards"] / "training_args.bin")
    optimizer = torch.optim.AdamW(model.parameters())
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()  # its state: a tensor or two per parameter
    torch.save(optimizer.state_dict(), out["pt"] / "optimizer.pt")
    for lay in ("safetensors-shards", "bin-shards"):
        assert len(list(out[lay].glob("*-of-*"))) >= 2, sorted(out[lay].iterdir())
    # two kinds in one directory: the first in vLLM's order is read; the other holds another
    # model's weights, so that reading it shows
    torch.manual_seed(1)
    other = cls(cfg).to(dtype).state_dict()
    for lay, first, decoy in (("safetensors-beside-bin", "safetensors", "pytorch_model.bin"),
                              ("bin-beside-pt", "bin", "model.pt")):
        out[lay] = where / lay
        shutil.copytree(out[first], out[lay])
        torch.save(other, out[lay] / decoy)
    if name == "mistral":
        sd = load_file(out["safetensors"] / "model.safetensors")
        consolidated = mistral_named(sd, cfg)
        out["consolidated"] = where / "consolidated"
        out["consolidated"].mkdir()
        shutil.copy(out["bin"] / "config.json", out["consolidated"])
        save_file(consolidated, out["consolidated"] / "consolidated.safetensors")
        out["consolidated-and-shards"] = where / "consolidated-and-shards"
        shutil.copytree(out["safetensors-shards"], out["consolidated-and-shards"])
        save_file(consolidated, out["consolidated-and-shards"] / "consolidated.safetensors")
    return out


def refusals(where):
    """{label: (a directory, the start of ckload's line on it)}: directories with no checkpoint
    vLLM's `auto` loads, each refused by ckload naming what it found."""
    empty, two = where / "empty", where / "two-files"
    for d in (empty, two):
        d.mkdir()
        (d / "config.json").write_text("{}")
    for name in ("model.pth", "model.ckpt"):
        torch.save({"w": torch.zeros(2)}, two / name)
    return {"empty": (empty, f"ckload: {empty}: holds no checkpoint file (*.safetensors, "),
            "two-files": (two, f"ckload: {two}: holds several checkpoint files (model.ckpt, "
                               f"model.pth, ...): name one, {two}/FILE")}


@pytest.fixture(scope="module")
def matrix_env(vllm_env, tmp_path_factory):
    """vllm_env with the test's plugin installed beside the wheel (a module and its dist-info,
    whose entry point vLLM's plugin loader finds in each process)."""
    d = tmp_path_factory.mktemp("matrix-plugin")
    shutil.copy(Path(__file__).with_name(f"{PLUGIN}.py"), d)
    info = d / "ckptfs_vllm_matrix-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ckptfs-vllm-matrix\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[vllm.general_plugins]\nmatrix = {PLUGIN}:register\n")
    return {**vllm_env, "PYTHONPATH": f"{vllm_env['PYTHONPATH']}:{d}",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


@pytest.mark.parametrize("arch", list(configs()))
def test_every_layout_loads_as_autos(matrix_env, arch, tmp_path):
    _, _, start, dtype, tp = configs()[arch]
    dirs = layouts(arch, tmp_path)
    refused = refusals(tmp_path) if arch == REFUSALS_IN else {}
    places = {**dirs, **{lay: d for lay, (d, _) in refused.items()}}
    runs = [[fmt, f"{fmt} {lay}", str(d)]
            for fmt in ("auto", "ckload") for lay, d in places.items()]
    out = tmp_path / "hashes"
    out.mkdir()
    env = {**matrix_env, "CKPTFS_VLLM_MATRIX": json.dumps({"out": str(out), "runs": runs})}
    driver(env, "generate", json.dumps({"model": str(dirs[start]), "load_format": "ckload",
                                        "tp": tp, "dtype": str(dtype).removeprefix("torch.")}))
    wrong = []
    for rank in range(tp):
        got = json.loads((out / f"rank{rank}.json").read_text())
        want = got[f"auto {BASE}"]
        assert "error" not in want and want, want
        auto_finds_none = list(refused)
        if not got.pop("fall_back_to_pt"):  # auto, as the model says, reads no *.pt
            auto_finds_none.append("pt")
        for lay in auto_finds_none:
            assert got.pop(f"auto {lay}") == {
                "error": f"RuntimeError: Cannot find any model weights with `{places[lay]}`"}
        for lay, (_, words) in refused.items():
            line = got.pop(f"ckload {lay}").get("error", "")
            assert line.startswith(f"Error: {words}") and "\n" not in line, line  # one line
        for label, hashes in got.items():
            if "error" in hashes:
                wrong.append(f"rank {rank}: {label}: {hashes['error']}")
                continue
            differ = sorted(n for n in set(want) | set(hashes) if want.get(n) != hashes.get(n))
            if differ:
                wrong.append(f"rank {rank}: {label}: {len(differ)} parameters differ from auto's: "
                             f"{differ[:4]}")
    assert not wrong, "\n".join(wrong)
