"""vLLM's load format `ckload`: a model's weights read by libckload, from any source ckload reads.

The ckptfs wheel registers it through the entry point group vllm.general_plugins, which vLLM
imports in each of its processes; nothing is imported, and nothing costs, where vLLM is absent.

    vllm serve DIR --load-format ckload
    vllm serve DIR --load-format ckload --model-loader-extra-config '{"source": "s3://b/model/"}'
    LLM(model=DIR, load_format="ckload", model_loader_extra_config={"source": PATH})

DIR keeps the config and tokenizer; the weights come from `source` when given (a mount or its
.ckptfs/checkpoint.pack, a pack, .bin/.pt, safetensors one file or shards, a DCP directory,
http(s)://, s3://, hf://), else from DIR itself (hf://MODEL when MODEL is a Hub id, not a
directory). Other keys: `window`, the bytes held at once of what is streamed through
model.load_weights (ckload.stream: 1 GiB by default), `verify` (a pack's checksums; any other
source's files unchanged, true by default), and `attach`: the Unix socket of a `ckpt serve` keeper holding the weights on
this GPU (attach_into: no byte read; `source`, if given, is what it must have loaded). Each
tensor is read straight into the parameter memory the model's weight loaders copy it to (fill).
Any failure - a source that cannot be read or changed while read, a tensor vLLM refuses, a
parameter no tensor filled - raises ckload.Error with one line naming the source, so vLLM's
start fails with it and no partly loaded model serves.
"""
import os
import time

try:  # torch's dispatcher hook: the probes (Recorder) need it; without it, all is streamed
    from torch.utils._python_dispatch import TorchDispatchMode
except ImportError:
    TorchDispatchMode = None

LOAD_FORMAT = "ckload"
KEYS = {"source", "window", "verify", "attach"}
WHERE = "model_loader_extra_config"  # what a message about a key names


def checked_config(extra):
    """model_loader_extra_config (a mapping, or None) as the load format takes it, its keys
    checked before anything is read: unknown keys, and a `window` that is not an integer from 1
    to 2**62 (ckload.stream's own check: "1G", null or a list), each refused with one line
    (ValueError "ckload: model_loader_extra_config: what is wrong")."""
    import ckload
    extra = dict(extra or {})
    unknown = sorted(set(extra) - KEYS)
    if unknown:
        raise ValueError(f"ckload: {WHERE}: unknown keys {unknown} (known: {sorted(KEYS)})")
    if "window" in extra:
        ckload._window(WHERE, extra["window"])
    return extra


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


def tensor_parallel():
    """(rank, world_size) of this process in vLLM's tensor-parallel group; (0, 1) outside one."""
    try:
        from vllm.distributed import (get_tensor_model_parallel_rank,
                                      get_tensor_model_parallel_world_size)
        return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    except (ImportError, AssertionError):  # no vLLM, or its groups not made
        return 0, 1


def fill(model, source, window=1 << 30, verify=True):
    """Loads source's tensors into model, as model.load_weights would take them, and checks
    every parameter was filled; ckload.Error (one line) on any failure. Returns how many
    tensors were read straight into the model's memory, the bytes read for them (this rank's
    parts of those it shards), and how many tensors were not (streamed through
    model.load_weights, or not taken by the model).

    First model.load_weights is run on probes (meta tensors of the checkpoint's shapes): it
    reads no byte, and it records where the model's own weight loaders copy each tensor
    (Recorder). A tensor copied whole, or as the tensor-parallel part
    torch.chunk cuts for this rank, into contiguous memory of the model's, is then read by
    one ckload load straight into that memory (no staging copy); the rest (converted, split
    unlike torch.chunk, used in a computation) is streamed through model.load_weights in
    windows, as vLLM's own loaders feed it."""
    import ckload
    shown = ckload.shown(source)
    window = ckload._window(source, window)  # refused even where nothing is streamed
    device = device_of(model)
    order = ckload.entries(source, device=device)
    rank, world = tensor_parallel()
    plan = _probe(model, order, rank, world)
    # what load_weights says it loaded (None: a model that does not say; nothing is checked)
    loaded = set(plan.loaded) if plan and plan.loaded is not None else None
    read = 0
    if plan and plan.placed:
        with ckload.Load(source, device=device, verify=verify, slices=plan.slices, rank=rank,
                         world_size=world, _dest=plan.dest) as ld:
            ld.wait_all()
            read = ld.done_bytes()
        if plan.refused:
            raise ckload.Error(f"ckload: {shown}: {plan.refused}")
    rest = plan.streamed if plan else None
    if rest is None or rest:
        got = _take(model, ckload.stream(source, device=device, window=window, verify=verify,
                                         names=rest), shown)
        if got is not None and loaded is not None:
            loaded |= set(got)
        elif plan is None:
            loaded = got
    if loaded is not None:
        _check_filled(model, loaded, shown)
    placed = len(plan.placed) if plan else 0
    return placed, read, len(order) - placed


def _probe(model, order, rank, world):
    """The placement plan (Plan) model.load_weights shows on probes, or None where it
    cannot run on them (then everything is streamed, and a refusal comes from real bytes)."""
    try:
        return Recorder(model, rank, world).plan(order)
    except Exception:  # noqa: BLE001: any failure on probes is retried on real tensors
        return None


def _take(model, tensors, shown):
    """model.load_weights(tensors), a failure as ckload's one line; its loaded set."""
    import ckload
    last = [None]

    def named():
        for name, t in tensors:
            last[0] = name
            yield name, t

    try:
        return model.load_weights(named())
    except ckload.Error:
        raise
    except (OSError, ValueError) as e:
        if str(e).startswith("ckload: "):  # ckload's own line (a source that cannot be read)
            raise
        raise _refused(shown, last[0], e) from e
    except Exception as e:  # vLLM's weight loaders assert shapes and names
        raise _refused(shown, last[0], e) from e


def _check_filled(model, loaded, shown):
    """ckload.Error naming the model's parameters no tensor filled, if any."""
    import ckload
    missing = sorted({n for n, _ in model.named_parameters()} - set(loaded))
    if missing:
        which = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3
                                          else "")
        raise ckload.Error(f"ckload: {shown}: no tensor for the model's {which}")


def attach_into(model, socket, source=None):
    """Fills model from the load another process serves on socket (`ckpt serve SOURCE --device
    cuda:N --socket SOCKET`): model.load_weights takes the served tensors, already on the GPU,
    and its weight loaders copy them device to device; nothing is read. source, when given, is
    the location the server must have loaded, unchanged. Returns the number of tensors; errors
    as fill's (a socket no server answers, another device, a changed source: ckload's line)."""
    import ckload
    tensors = ckload.attach(socket, device=device_of(model), source=source)
    loaded = _take(model, tensors.items(), ckload.shown(os.fspath(socket)))
    if loaded is not None:
        _check_filled(model, loaded, ckload.shown(os.fspath(socket)))
    return len(tensors)


def _refused(shown, name, e):
    import ckload
    why = str(e).splitlines()[0] if str(e) else type(e).__name__
    where = f"tensor '{name}'" if name else "the checkpoint"
    return ckload.Error(f"ckload: {shown}: {where}: refused by the model: {why}")


# --- where the model's weight loaders put each tensor -------------------------------------------

def _storage(t):
    """t's storage (views of one tensor share it), in torch 1.x and 2.x."""
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


def _storage_key(t):
    """What identifies t's storage."""
    return _storage(t)._cdata


def _span(t):
    """[start, end) of the bytes t covers in its memory."""
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _is_view(func):
    """Whether aten op func returns a view of an argument (it reads and writes no element)."""
    return any(r.alias_info is not None and not r.alias_info.is_write
               for r in func._schema.returns)


def _part(probe, src, rank, world):
    """How src, a view of probe (a contiguous tensor) that a weight loader copies from, is
    ckload's to read: None for the whole tensor, the dim torch.chunk(probe, world, dim)[rank]
    cuts it along, or False (neither)."""
    if src.storage_offset() == 0 and src.numel() == probe.numel() and src.is_contiguous():
        return None
    if src.dim() != probe.dim() or src.stride() != probe.stride():
        return False
    dims = [d for d in range(probe.dim()) if src.shape[d] != probe.shape[d]]
    if len(dims) != 1 or world < 2:
        return False
    d, n = dims[0], probe.shape[dims[0]]
    size = -(-n // world)
    start = rank * size
    if src.storage_offset() != start * probe.stride(d) or src.shape[d] != max(0, min(size, n - start)):
        return False
    return d


class Plan:
    """Where one load puts each tensor: placed {name: (address, bytes)} read straight into the
    model's memory, slices [(name, dim)] (those read as this rank's part), streamed (the names
    model.load_weights takes itself), loaded (what model.load_weights said it loaded). dest is
    ckl_options.dest for the load of the placed ones; refused, the line of a tensor whose bytes
    were not what the probe had."""

    def __init__(self, placed, slices, streamed, loaded):
        self.placed, self.slices, self.streamed, self.loaded = placed, slices, streamed, loaded
        self.refused = None

    def dest(self, ctx, tp, at):
        import ckload
        if not tp:
            return ckload.DEST_REFUSE if self.refused else ckload.DEST_BLOCK
        c = tp.contents
        name = c.name.decode("utf-8", "surrogateescape")
        where = self.placed.get(name)
        if where is None:
            return ckload.DEST_SKIP
        if c.nbytes != where[1]:
            self.refused = (f"tensor '{name}': {c.nbytes} bytes, where the model's loader "
                            f"copies {where[1]}")
            return ckload.DEST_SKIP
        at[0] = where[0] if c.nbytes else None
        return ckload.DEST_AT


class Recorder(TorchDispatchMode if TorchDispatchMode else object):
    """model.load_weights run on probes: meta tensors of the checkpoint's dtypes and shapes.
    Every aten op its weight loaders run passes here. A copy_ from a probe (or a view of one)
    into the model's memory is recorded and not done; an op that computes with a probe (a
    conversion, a concatenation) marks its tensor streamed, as does any later op that touches
    memory a recorded copy targets (the loader reads or changes what it copied: that must
    happen to real bytes); every other op runs as it would (a loader zeroing padding rows)."""

    def __init__(self, model, rank, world):
        super().__init__()
        self.model, self.rank, self.world = model, rank, world
        self.memory = {}  # the model's storages: data_ptr -> end
        for t in list(model.parameters()) + list(model.buffers()):
            if not t.is_meta:
                base = _storage(t)
                self.memory[base.data_ptr()] = base.data_ptr() + base.nbytes()
        self.owner = {}     # storage key -> the names of the probes it holds or came from
        self.probes = {}    # name -> probe
        self.copies = {}    # name -> [(address, bytes, part)]
        self.regions = []   # (start, end, name) of every recorded copy
        self.streamed = set()

    def plan(self, order):
        import torch
        names = sorted(e.name for e in order)
        for e in order:
            if e.torch_dtype is None:
                continue  # a dtype this torch lacks: streamed, as its bytes
            p = torch.empty(e.shape, dtype=e.torch_dtype, device="meta")
            self.probes[e.name] = p
            self.owner[_storage_key(p)] = {e.name}
        with self:
            loaded = self.model.load_weights((n, p) for n, p in self.probes.items())
        if any(t.is_meta for t in list(self.model.parameters()) + list(self.model.buffers())):
            raise ValueError("a weight loader kept a probe")
        placed, slices = {}, []
        streamed = {e.name for e in order if e.torch_dtype is None} | self.streamed
        for name, copies in self.copies.items():
            if name in streamed:
                continue
            if len(copies) != 1 or (copies[0][2] is not None and not self._sliceable(name, names)):
                streamed.add(name)
                continue
            at, n, part = copies[0]
            placed[name] = (at, n)
            if part is not None:
                slices.append((name, part))
        return Plan(placed, slices, streamed, loaded)

    @staticmethod
    def _sliceable(name, names):
        """Whether a slice rule naming name selects it alone (ckl_selected: a glob, or the name
        and those continuing it with '.')."""
        import bisect
        if any(ch in name for ch in "*?["):
            return False
        i = bisect.bisect_left(names, name + ".")
        return i == len(names) or not names[i].startswith(name + ".")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        import torch
        from torch.utils._pytree import tree_flatten
        kwargs = kwargs or {}
        tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        names = set()
        for t in tensors:
            if t.is_meta:
                names |= self.owner.get(_storage_key(t), set())
        if func is torch.ops.aten.copy_.default and names:
            self._copy(args[0], args[1], names)
            return args[0]
        view = _is_view(func)
        if not view:
            for t in tensors:
                if not t.is_meta:
                    self._touch(t)
        out = func(*args, **kwargs)
        if names and not view:
            self.streamed |= names
            for o in tree_flatten(out)[0]:
                if isinstance(o, torch.Tensor) and o.is_meta:
                    self.owner.setdefault(_storage_key(o), set()).update(names)
        return out

    def _touch(self, t):
        """t's memory is read or written: the copies recorded into it must be real. Whether
        there were any."""
        start, end = _span(t)
        hit = {name for s, e, name in self.regions if s < end and start < e}
        self.streamed |= hit
        return bool(hit)

    def _copy(self, dst, src, names):
        name = next(iter(names)) if len(names) == 1 else None
        if dst.is_meta or name is None or name in self.streamed:
            self.streamed |= names
            if not dst.is_meta:
                self._touch(dst)
            return
        start, end = _span(dst)
        base = _storage(dst).data_ptr()
        part = _part(self.probes[name], src, self.rank, self.world) \
            if _storage_key(src) == _storage_key(self.probes[name]) else False
        inside = base in self.memory and end <= self.memory[base]
        overlaps = self._touch(dst)
        if overlaps or part is False or not inside or not dst.is_contiguous() \
                or dst.dtype != src.dtype or dst.numel() != src.numel():
            self.streamed.add(name)
        self.regions.append((start, end, name))
        self.copies.setdefault(name, []).append((start, end - start, part))


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
            self.extra = checked_config(load_config.model_loader_extra_config)

        def download_model(self, model_config):
            """Nothing to fetch ahead: remote sources are read in place."""

        def load_weights(self, model, model_config):
            import ckload
            start = time.perf_counter()
            if self.extra.get("attach"):
                socket = str(self.extra["attach"])
                n = attach_into(model, socket, self.extra.get("source"))
                logger.info("Loading weights took %.2f seconds (ckload, attached to %s: %d "
                            "tensors)", time.perf_counter() - start, socket, n)
                return
            source = weights_source(model_config.model, model_config.revision, self.extra)
            placed, read, other = fill(model, source,
                                       window=self.extra.get("window", 1 << 30),
                                       verify=bool(self.extra.get("verify", True)))
            # vLLM's own loaders' words, so that a log reads the same whichever loaded
            logger.info("Loading weights took %.2f seconds (ckload, from %s: %d tensors read "
                        "into place, %d bytes; %d through load_weights or not taken)",
                        time.perf_counter() - start, ckload.shown(source), placed, read, other)
