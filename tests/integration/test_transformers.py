"""transformers, the client our users load with: small seeded models saved the way
the Hub's older checkpoints are (torch.save of the state_dict, pytorch_model.bin, with tied
weights sharing one storage, and config.json), then given to `from_pretrained` as
`ckpt convert` writes them (one file; shards with their index) and as a mount's virtual
`.ckptfs/checkpoint.safetensors` - through the default path, low_cpu_mem_usage=True,
device_map="cpu" and AutoModel for the base model. Every parameter and the logits must be
torch.equal to the original's, no key missing or unexpected, ties tied; `ckpt diff` of the
source and its conversion says they are the same. transformers 4.44.2 (scripts/setup), the last
that runs with Debian's torch 1.13."""
import os
import shutil
import subprocess

import pytest
import torch

from ckptfs_testlib import ckpt_bin, need_module

transformers = need_module("transformers")
need_module("accelerate")  # device_map and low_cpu_mem_usage

TINY = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4)


def configs():
    t = transformers
    return {
        "llama-tied": (t.LlamaConfig(**TINY, num_key_value_heads=2, tie_word_embeddings=True),
                       t.LlamaForCausalLM),
        "gpt2": (t.GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64),
                 t.GPT2LMHeadModel),
        "bert-mlm": (t.BertConfig(**TINY, max_position_embeddings=64), t.BertForMaskedLM),
        "t5": (t.T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                          num_heads=4, decoder_start_token_id=0), t.T5ForConditionalGeneration),
        "mistral-untied": (t.MistralConfig(**TINY, num_key_value_heads=2,
                                           tie_word_embeddings=False), t.MistralForCausalLM),
    }


MODELS = list(configs())
MODES = ["default", "low_cpu_mem_usage", "device_map", "base"]


def run(*args, timeout=120):
    return subprocess.run([str(a) for a in args], capture_output=True, timeout=timeout)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> (model, directory holding pytorch_model.bin and config.json)."""
    out = {}
    for name, (config, cls) in configs().items():
        torch.manual_seed(0)
        model = cls(config).eval()
        d = tmp_path_factory.mktemp(name)
        torch.save(model.state_dict(), d / "pytorch_model.bin")
        config.save_pretrained(d)
        out[name] = (model, d)
    return out


def inputs(model):
    ids = torch.arange(1, 9).reshape(1, 8) % model.config.vocab_size
    if model.config.is_encoder_decoder:
        return {"input_ids": ids, "decoder_input_ids": ids[:, :4]}
    return {"input_ids": ids}


def load(path, cls, mode):
    kw = {"output_loading_info": True}
    if mode == "low_cpu_mem_usage":
        kw["low_cpu_mem_usage"] = True
    if mode == "device_map":
        kw["device_map"] = "cpu"
    if mode == "base":
        return transformers.AutoModel.from_pretrained(path, **kw)
    return cls.from_pretrained(path, **kw)


def check(original, src, path, cls, mode):
    """path loaded as mode against transformers' own load of the original (src: the
    torch.save'd pytorch_model.bin) and the original model itself."""
    ref, ref_info = load(src, cls, mode)
    model, info = load(path, cls, mode)
    for k in ("missing_keys", "mismatched_keys"):
        assert sorted(info[k]) == sorted(ref_info[k]), (k, info[k], ref_info[k])
    # a base model of a checkpoint with a head: the head's names are unexpected in the original,
    # and of those a conversion keeps only the ones that own bytes
    assert set(info["unexpected_keys"]) <= set(ref_info["unexpected_keys"]), info
    if mode != "base":  # a base model of a head's checkpoint may lack its pooler, as ref does
        assert not info["missing_keys"] and not info["unexpected_keys"], info
        want = dict(original.named_parameters())
    else:
        prefix = ref.base_model_prefix + "."
        missing = {k[len(prefix):] if k.startswith(prefix) else k for k in ref_info["missing_keys"]}
        want = {n: p for n, p in ref.named_parameters() if n not in missing}
    got = dict(model.named_parameters())
    for name, p in want.items():
        assert got[name].device.type == "cpu", (name, got[name].device)
        assert torch.equal(got[name], p), name
    ref.eval(), model.eval()
    with torch.no_grad():  # [0]: logits, or a base model's last hidden state (not its pooler)
        assert torch.equal(ref(**inputs(ref))[0], model(**inputs(model))[0])
    if mode != "base" and original.config.tie_word_embeddings:
        assert model.get_output_embeddings().weight.data_ptr() == \
            model.get_input_embeddings().weight.data_ptr()


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("mode", MODES)
def test_convert_one_file(saved, tmp_path, name, mode):
    model, src = saved[name]
    out = tmp_path / "hf"
    out.mkdir()
    p = run(ckpt_bin(), "convert", src / "pytorch_model.bin", out / "model.safetensors")
    assert p.returncode == 0, p.stderr
    shutil.copy(src / "config.json", out)
    check(model, src, out, configs()[name][1], mode)


@pytest.mark.parametrize("name", MODELS)
def test_convert_shards(saved, tmp_path, name):
    model, src = saved[name]
    out = tmp_path / "hf"
    p = run(ckpt_bin(), "convert", src / "pytorch_model.bin", out, "--max-shard-size", "20KB")
    assert p.returncode == 0, p.stderr
    assert len(list(out.glob("model-*.safetensors"))) > 1
    shutil.copy(src / "config.json", out)
    for mode in MODES:
        check(model, src, out, configs()[name][1], mode)


@pytest.mark.parametrize("name", MODELS)
def test_mounts_virtual_safetensors(saved, tmp_path, mount, name):
    model, src = saved[name]
    with mount(src / "pytorch_model.bin") as mnt:
        hf = tmp_path / "hf"
        hf.mkdir()
        shutil.copy(src / "config.json", hf)
        os.symlink(mnt / ".ckptfs" / "checkpoint.safetensors", hf / "model.safetensors")
        for mode in MODES:
            check(model, src, hf, configs()[name][1], mode)


@pytest.mark.parametrize("name", MODELS)
def test_diff_of_a_source_and_its_conversion_is_clean(saved, tmp_path, name):
    """The names a conversion drops are recorded aliases: ckpt diff reads them and says the two
    are the same (exit 0), naming how many it dropped."""
    _, src = saved[name]
    out = tmp_path / "model.safetensors"
    assert run(ckpt_bin(), "convert", src / "pytorch_model.bin", out).returncode == 0
    p = run(ckpt_bin(), "diff", src / "pytorch_model.bin", out)
    assert p.returncode == 0, p.stdout.decode() + p.stderr.decode()


def test_untied_config_drops_nothing(saved, tmp_path):
    """config.json says tie_word_embeddings: false, and the state_dict shares a storage anyway:
    every name is written, its bytes copied."""
    model, src = saved["llama-tied"]
    d = tmp_path / "src"
    shutil.copytree(src, d)
    cfg = (d / "config.json").read_text().replace('"tie_word_embeddings": true',
                                                  '"tie_word_embeddings": false')
    (d / "config.json").write_text(cfg)
    out = tmp_path / "model.safetensors"
    assert run(ckpt_bin(), "convert", d / "pytorch_model.bin", out).returncode == 0
    from safetensors import safe_open
    with safe_open(str(out), framework="pt") as f:
        assert set(f.keys()) == set(model.state_dict())


def test_diff_still_reports_a_dropped_alias_whose_bytes_differ(saved, tmp_path):
    _, src = saved["gpt2"]
    out = tmp_path / "model.safetensors"
    assert run(ckpt_bin(), "convert", src / "pytorch_model.bin", out).returncode == 0
    from safetensors import safe_open
    from safetensors.torch import save_file
    with safe_open(str(out), framework="pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    assert meta["lm_head.weight"] == "transformer.wte.weight"
    tensors["transformer.wte.weight"][0, 0] += 1
    save_file(tensors, str(tmp_path / "changed.safetensors"), metadata=meta)
    p = run(ckpt_bin(), "diff", src / "pytorch_model.bin", tmp_path / "changed.safetensors")
    text = p.stdout.decode()
    assert p.returncode == 1, text
    assert "differs: lm_head.weight (dropped in B as an alias of transformer.wte.weight)" in text
    assert "differs: transformer.wte.weight" in text
    assert text.splitlines()[-1].endswith("0 only in A, 0 only in B")


@pytest.mark.parametrize("name", MODELS)
def test_aliases_are_visible_and_counted_once(saved, mount, name):
    """The names that share a storage in the state_dict: index.json and ckpt ls say which they
    are an alias of, the mount's xattr too, du counts their bytes once (st_blocks 0), and
    ckpt info counts parameters once per storage, as transformers' num_parameters() does."""
    import json
    model, src = saved[name]
    sd = model.state_dict()
    owner = {}  # storage -> first name in state_dict order
    want = {}
    for n, t in sd.items():
        key = (t.data_ptr(), t.dtype, tuple(t.shape))
        if key in owner:
            want[n] = owner[key]
        else:
            owner[key] = n
    p = run(ckpt_bin(), "ls", src / "pytorch_model.bin", "--json")
    got = {t["name"]: t["alias_of"] for t in json.loads(p.stdout)["tensors"] if "alias_of" in t}
    assert got == want
    lines = run(ckpt_bin(), "ls", src / "pytorch_model.bin").stdout.decode().splitlines()
    assert {ln.split("\t")[0]: ln.split("\talias of ")[1] for ln in lines if "\talias of " in ln} \
        == want
    info = json.loads(run(ckpt_bin(), "info", src / "pytorch_model.bin", "--json").stdout)
    assert info["parameters"] == model.num_parameters() and info["aliases"] == len(want)
    with mount(src / "pytorch_model.bin") as mnt:
        paths = {t["name"]: mnt / t["path"] for t in json.loads(
            (mnt / ".ckptfs" / "index.json").read_bytes())["tensors"]}
        for n, t in sd.items():
            st = os.stat(paths[n])
            assert st.st_size == t.numel() * t.element_size()
            assert (st.st_blocks == 0) == (n in want), n
            if n in want:
                assert os.getxattr(paths[n], "user.ckptfs.alias_of").decode() == want[n]
