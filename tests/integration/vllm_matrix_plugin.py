"""A vLLM general plugin of test_vllm_matrix.py's, installed beside the ckptfs wheel in the
engine's environment: in each worker, once the engine's own loader has filled the model and
before vLLM turns its weights into kernel form (its CPU build then drops each linear layer's
weight), every parameter's bytes are hashed; then, in that same model, every parameter is
zeroed and filled again by each loader of the spec from each directory, and hashed after each.

The spec is the JSON of the environment variable CKPTFS_VLLM_MATRIX: {"out": DIR, "runs":
[[FORMAT, LABEL, MODEL_DIR], ...]}; FORMAT is a load format vLLM's get_model_loader knows
("auto", "ckload"), given MODEL_DIR as the model (the format's own rule picks the files). Each
rank writes DIR/rankN.json: {"engine": HASHES, LABEL: HASHES or {"error": LINE},
"fall_back_to_pt": whether the model lets `auto` read *.pt (vLLM's MoE models do not)}, HASHES
{parameter name: "dtype shape sha256"}. Without the variable the plugin does nothing."""
import hashlib
import json
import os

SPEC = "CKPTFS_VLLM_MATRIX"


def register():
    """vllm.general_plugins' entry point (vLLM calls it more than once per process)."""
    if not os.environ.get(SPEC):
        return
    from vllm.model_executor.model_loader import base_loader
    original = base_loader.process_weights_after_loading
    if getattr(original, "matrix", False):
        return

    def hooked(model, model_config, target_device):
        _matrix(json.loads(os.environ[SPEC]), model, model_config)
        return original(model, model_config, target_device)

    hooked.matrix = True
    base_loader.process_weights_after_loading = hooked


class _At:
    """model_config with another model directory: what a loader reads the weights from."""

    def __init__(self, config, model):
        self._config, self.model = config, model

    def __getattr__(self, name):
        return getattr(self._config, name)


def _hashes(model):
    import torch
    out = {}
    for name, p in model.named_parameters():
        t = p.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        out[name] = f"{p.dtype} {tuple(p.shape)} {hashlib.sha256(t.numpy().tobytes()).hexdigest()}"
    return out


def _matrix(spec, model, model_config):
    import torch
    from vllm.config import LoadConfig
    from vllm.distributed import get_tensor_model_parallel_rank
    from vllm.model_executor.model_loader import get_model_loader
    results = {"engine": _hashes(model),
               "fall_back_to_pt": getattr(model, "fall_back_to_pt_during_load", True)}
    for load_format, label, where in spec["runs"]:
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        try:
            get_model_loader(LoadConfig(load_format=load_format)).load_weights(
                model, _At(model_config, where))
            results[label] = _hashes(model)
        except Exception as e:  # noqa: BLE001: the test names each run's failure
            results[label] = {"error": f"{type(e).__name__}: {e}"}
    path = os.path.join(spec["out"], f"rank{get_tensor_model_parallel_rank()}.json")
    with open(path, "w") as f:
        json.dump(results, f)
