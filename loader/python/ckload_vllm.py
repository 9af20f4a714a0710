"""vLLM's load format `ckload`: a model's weights read by libckload, from any source ckload reads.

The ckptfs wheel registers it through the entry point group vllm.general_plugins, which vLLM
imports in each of its processes; nothing is imported, and nothing costs, where vLLM is absent.

    vllm serve DIR --load-format ckload
    vllm serve DIR --load-format ckload --model-loader-extra-config '{"source": "s3://b/model/"}'
    LLM(model=DIR, load_format="ckload", model_loader_extra_config={"source": PATH})

DIR keeps the config and tokenizer; the weights come from `source` when given (a mount or its
.ckptfs/checkpoint.pack, a pack, .bin/.pt, safetensors one file or shards, a DCP directory,
http(s)://, s3://, hf://), else from DIR itself (hf://MODEL when MODEL is a Hub id, not a
directory). Other keys: `window`, the bytes of the checkpoint held at once (ckload.stream:
1 GiB by default), and `verify` (a pack's checksums; any other source's files unchanged, true
by default). Tensors reach model.load_weights as they land, in pack order, on the model's device.
Any failure - a source that cannot be read or changed while read, a tensor vLLM refuses, a
parameter no tensor filled - raises ckload.Error with one line naming the source, so vLLM's
start fails with it and no partly loaded model serves.
"""
import os
import time

LOAD_FORMAT = "ckload"
KEYS = {"source", "window", "verify"}


def weights_source(model, revision, extra):
    """The location the weights are read from: extra's source, the model directory, or the Hub
    repository the model names."""
    if extra.get("source"):
        return str(extra["source"])
    if os.path.isdir(model):
        return model
    return f"hf://{model}" + (f"@{revision}" if revision else "")


def device_of(model):
    """Where the model's parameters are: the device ckload loads to."""
    for p in model.parameters():
        return "cpu" if p.device.type == "cpu" else f"{p.device.type}:{p.device.index or 0}"
    return "cpu"


def fill(model, source, window=1 << 30, verify=True):
    """Streams source's tensors into model.load_weights and checks every parameter was filled;
    ckload.Error (one line) on any failure."""
    import ckload
    last = [None]

    def tensors():
        for name, t in ckload.stream(source, device=device_of(model), window=window,
                                     verify=verify):
            last[0] = name
            yield name, t

    shown = ckload.shown(source)
    try:
        loaded = model.load_weights(tensors())
    except ckload.Error:
        raise
    except (OSError, ValueError) as e:
        if str(e).startswith("ckload: "):  # ckload's own line (a source that cannot be read)
            raise
        raise _refused(shown, last[0], e) from e
    except Exception as e:  # vLLM's weight loaders assert shapes and names
        raise _refused(shown, last[0], e) from e
    if loaded is not None:
        missing = sorted({n for n, _ in model.named_parameters()} - set(loaded))
        if missing:
            which = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3
                                              else "")
            raise ckload.Error(f"ckload: {shown}: no tensor for the model's {which}")


def _refused(shown, name, e):
    import ckload
    why = str(e).splitlines()[0] if str(e) else type(e).__name__
    where = f"tensor '{name}'" if name else "the checkpoint"
    return ckload.Error(f"ckload: {shown}: {where}: refused by the model: {why}")


def register():
    """vllm.general_plugins' entry point: registers the load format (once per process)."""
    from vllm.logger import init_logger
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader
    logger = init_logger("vllm.ckload")  # under "vllm", so that vLLM's logging shows it

    @register_model_loader(LOAD_FORMAT)
    class CkloadModelLoader(BaseModelLoader):
        def __init__(self, load_config):
            super().__init__(load_config)
            extra = dict(load_config.model_loader_extra_config or {})
            unknown = sorted(set(extra) - KEYS)
            if unknown:
                raise ValueError(f"ckload: model_loader_extra_config: unknown keys {unknown} "
                                 f"(known: {sorted(KEYS)})")
            self.extra = extra

        def download_model(self, model_config):
            """Nothing to fetch ahead: remote sources are read in place."""

        def load_weights(self, model, model_config):
            import ckload
            source = weights_source(model_config.model, model_config.revision, self.extra)
            start = time.perf_counter()
            fill(model, source, window=int(self.extra.get("window", 1 << 30)),
                 verify=bool(self.extra.get("verify", True)))
            # vLLM's own loaders' words, so that a log reads the same whichever loaded
            logger.info("Loading weights took %.2f seconds (ckload, from %s)",
                        time.perf_counter() - start, ckload.shown(source))
