"""Run inside scripts/setup's vLLM venv by test_vllm.py (and scripts/bench-vllm): one vLLM engine,
greedy tokens out as JSON lines on stdout.

    vllm_driver.py make DIR KIND           a tiny model of KIND (llama, qwen2-tied), fixed seeds
    vllm_driver.py tokenizer DIR           a word-level tokenizer into DIR: word "tN" is token N
    vllm_driver.py generate SPEC_JSON      SPEC: {"model", "load_format", "extra", "tp", "dtype"
                                           (float32 if absent), "reload": [sources]}: LLM(...)
                                           then greedy tokens; then, per reload source, the
                                           weights read again in place by ckload.stream (vLLM's
                                           reload_weights) and the tokens again
Lines: {"source": S, "tokens": [[...], ...]}; {"loaded_s": seconds} from vLLM's own log is left
to the caller. A failure is vLLM's own exception, its traceback on stderr."""
import json
import sys

PROMPTS = [[1, 5, 9, 33], [7, 100, 200], [42]]


def make(where, kind):
    import torch
    torch.manual_seed(0)
    if kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                          max_position_embeddings=128)
        model = LlamaForCausalLM(cfg)
    else:
        from transformers import Qwen2Config, Qwen2ForCausalLM
        cfg = Qwen2Config(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                          max_position_embeddings=128, tie_word_embeddings=True)
        model = Qwen2ForCausalLM(cfg)
    model.to(torch.float32).save_pretrained(where)


def tokenizer(where):
    """A word-level tokenizer whose word "tN" is token N, so that text maps to known ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(512)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0").save_pretrained(where)


def reload_from(worker, source):
    """On each worker: every parameter zeroed (a source that loaded nothing then shows), then
    the model's weights read again from source, in place."""
    import ckload
    import torch
    runner = worker.model_runner
    with torch.no_grad():
        for p in runner.get_model().parameters():
            p.zero_()
    device = "cpu" if runner.device.type == "cpu" else str(runner.device)
    runner.reload_weights(weights_iterator=ckload.stream(source, device=device, verify=True))


def generate(spec):
    import os
    if spec.get("reload"):  # reload_from, the driver's own function, goes to the workers
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    llm = LLM(model=spec["model"], dtype=spec.get("dtype", "float32"), max_model_len=64,
              enforce_eager=True, load_format=spec.get("load_format", "auto"),
              model_loader_extra_config=spec.get("extra") or {},
              tensor_parallel_size=spec.get("tp", 1), skip_tokenizer_init=True, seed=0)
    params = SamplingParams(temperature=0, max_tokens=8, detokenize=False)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in PROMPTS]

    def tokens():
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]

    print(json.dumps({"source": spec.get("load_format", "auto"), "tokens": tokens()}), flush=True)
    for source in spec.get("reload", []):
        llm.collective_rpc(reload_from, args=(source,))
        print(json.dumps({"source": source, "tokens": tokens()}), flush=True)


if __name__ == "__main__":  # vLLM spawns its engine: nothing may run on import
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "tokenizer":
        tokenizer(sys.argv[2])
    else:
        generate(json.loads(sys.argv[2]))
