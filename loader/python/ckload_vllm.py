"""vLLM's load format `ckload`: a model's weights read by libckload, from any source ckload reads.

The ckptfs wheel registers it through the entry point group vllm.general_plugins, which vLLM
imports in each of its processes; nothing is imported, and nothing costs, where vLLM is absent.

    vllm serve DIR --load-format ckload
    vllm serve DIR --load-format ckload --model-loader-extra-config '{"source": "s3://b/model/"}'
    LLM(model=DIR, load_format="ckload", model_loader_extra_config={"source": PATH})

DIR keeps the config and tokenizer; the weights come from `source` when given (a mount or its
.ckptfs/checkpoint.pack, a pack, .bin/.pt, safetensors or .bin one file or shards, a DCP
directory, http(s)://, s3://, gs://, hf://), else from DIR itself, whatever layout its file names make
it (docs/VLLM.md, "Layouts"; hf://MODEL when MODEL is a Hub id, not a directory; the URI itself
when vLLM pulled the config files of a model named by an object-storage URI into a local DIR).
Other keys: `window`, the bytes held at once of what is streamed through
model.load_weights (ckload.stream: 1 GiB by default), `verify` (a pack's checksums; any other
source's files unchanged, true by default), and `attach`: the Unix socket of a `ckpt serve` keeper holding the weights on
this GPU (attach_into: no byte read; `source`, if given, is what it must have loaded). Each
tensor is read straight into the parameter memory the model's weight loaders copy it to (fill).
Any failure - a source that cannot be read or changed while read, a tensor vLLM refuses, a
parameter no tensor filled - raises ckload.Error with one line naming the source, so vLLM's
start fails with it and no partly loaded model serves.
"""
import bisect
import mmap
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
    checked before anything is read: unknown keys, a `window` that is not an integer from 1
    to 2**62 (ckload.stream's own check: "1G", null or a list), a `verify` that is not true or
    false, a `source` or `attach` that is not a non-empty string, each refused with one line
    (ValueError "ckload: model_loader_extra_config: what is wrong"); null is no source or
    attach."""
    import ckload
    extra = dict(extra or {})
    unknown = sorted(set(extra) - KEYS)
    if unknown:
        raise ValueError(f"ckload: {WHERE}: unknown keys {unknown} (known: {sorted(KEYS)})")
    if "window" in extra:
        ckload._window(WHERE, extra["window"])
    if not isinstance(extra.get("verify", True), bool):
        raise ValueError(f"ckload: {WHERE}: verify={extra['verify']!r}: expected true or false")
    for key in ("source", "attach"):
        v = extra.get(key)
        if v is not None and not (isinstance(v, str) and v):
            # a string here is empty: nothing of a location (or its secrets) is shown
            raise ValueError(f"ckload: {WHERE}: {key}={v!r}: expected a path or URL")
    return extra


def weights_source(model, revision, extra, pulled=""):
    """The location the weights are read from: extra's source; else pulled, the object-storage
    URI vLLM pulled the model's config files from into the local directory `model`, which
    holds no weights (model_config.model_weights); else the model directory, or the Hub
    repository the model names."""
    if extra.get("source"):
        return str(extra["source"])
    if pulled:
        return pulled
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
    (Recorder). A tensor copied whole, or as the tensor-parallel part torch.chunk cuts for
    this rank, byte for byte into contiguous memory of the model's and left alone there, is
    placed: read by one ckload load straight into that memory (no staging copy). If any
    tensor is not (converted, viewed otherwise, split unlike torch.chunk, used in a
    computation, copied twice, its copy touched afterwards), model.load_weights runs once
    more on the whole sequence, the streamed tensors real (read in windows, as vLLM's own
    loaders feed them) and the placed ones as probes again, so that every loader sees what
    one call would show it; the placed ones are read after it, as their copies would have
    landed. Where that run does not do what the probes showed, everything is streamed
    through one model.load_weights call instead."""
    import ckload
    shown = ckload.shown(source)
    window = ckload._window(source, window)  # refused even where nothing is streamed
    device = device_of(model)
    order = ckload.entries(source, device=device)
    rank, world = tensor_parallel()
    recorder = _probe(model, order, rank, world)
    plan = recorder.plan if recorder else None
    # what load_weights says it loaded (None: a model that does not say; nothing is checked)
    loaded = plan.loaded if plan else None
    if plan and plan.streamed:
        try:
            loaded = recorder.replay(order, ckload.stream(
                source, device=device, window=window, verify=verify, names=plan.streamed), shown)
        except _Diverged:
            plan = None
    if plan is None:
        loaded = _take(model, ckload.stream(source, device=device, window=window,
                                            verify=verify), shown)
    read = _place(plan, source, device, verify, rank, world, shown) if plan else 0
    if loaded is not None:
        _check_filled(model, loaded, shown)
    placed = len(plan.placed) if plan else 0
    return placed, read, len(order) - placed


def _probe(model, order, rank, world):
    """The Recorder that ran model.load_weights on probes (its plan), or None where the model
    cannot run on them (then everything is streamed, and a refusal comes from real bytes)."""
    try:
        recorder = Recorder(model, rank, world)
        recorder.record(order)
        return recorder
    except Exception:  # noqa: BLE001: any failure on probes is retried on real tensors
        return None


def _place(plan, source, device, verify, rank, world, shown):
    """One ckload load of plan's placed tensors straight into the model's memory; the bytes it
    read. ckload.Error where a tensor's bytes are not what its probe had, or a placed tensor
    was not written exactly once (the source changed since it was listed)."""
    import ckload
    if not plan.placed:
        return 0
    if device.startswith("cuda"):  # what torch queued into the model's memory lands before
        import torch
        torch.cuda.synchronize(device)
    with ckload.Load(source, device=device, verify=verify, slices=plan.slices, rank=rank,
                     world_size=world, _dest=plan.dest) as ld:
        ld.wait_all()
        read = ld.done_bytes()
    if plan.refused:
        raise ckload.Error(f"ckload: {shown}: {plan.refused}")
    for name in plan.placed:
        if plan.written.get(name) != 1:
            raise ckload.Error(f"ckload: {shown}: tensor {ckload._quoted(name)}: read into the model "
                               f"{plan.written.get(name, 0)} times, not once (the source "
                               f"changed since it was listed)")
    return read


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
    except (ckload.Error, _Diverged):
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
    where = f"tensor {ckload._quoted(name)}" if name else "the checkpoint"
    return ckload.Error(f"ckload: {shown}: {where}: refused by the model: {why}")


# --- where the model's weight loaders put each tensor -------------------------------------------

# The byte a placed region holds from its recorded copy until ckload writes it: a change made
# there without torch's dispatcher (numpy, ctypes) shows as another byte. Only so many elements
# of a region, spread evenly, hold it: filling and checking every byte of every placed tensor
# would cost about what reading it does. A page of the host's anonymous memory wholly inside a
# region that nothing backs yet (never written) holds none of them: any write to it backs it,
# which mincore shows. So the probes leave the parameters' fresh pages alone and the read is
# their first touch: the kernel zeroes each page just before ckload's copy fills it, where a
# probe's fill would have zeroed every page in a pass of its own.
_UNWRITTEN = 0xA5
_SAMPLES = 4096
_PAGE = mmap.PAGESIZE

class _Diverged(Exception):
    """The run of model.load_weights with the streamed tensors did not do what the probes
    showed: the placement is dropped and everything streamed."""


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


def _anonymous_memory():
    """[(start, end)] of this process's private mappings of no file (the heap, what torch's
    host allocator maps), sorted: where a page nothing backs reads as absent to mincore until
    a write backs it."""
    spans = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            path = fields[5] if len(fields) > 5 else ""
            if fields[1][3] == "p" and fields[4] == "0" and path in ("", "[heap]"):
                start, end = fields[0].split("-")
                spans.append((int(start, 16), int(end, 16)))
    return spans


_LIBC = []  # the C library, with mincore's signature, once looked up


def _unbacked(first, n):
    """Per page of the n from address first (page aligned), whether nothing backs it (a bool
    tensor); None where mincore cannot say."""
    import ctypes
    import torch
    if not _LIBC:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        _LIBC.append(libc)
    vec = (ctypes.c_ubyte * n)()
    if _LIBC[0].mincore(first, n * _PAGE, vec) != 0:
        return None
    return (torch.frombuffer(vec, dtype=torch.uint8) & 1) == 0


class _Watch:
    """What shows a change made to t's memory (t contiguous) after it is marked: the bytes of
    t's elements that hold _UNWRITTEN (every element up to _SAMPLES, else _SAMPLES spread evenly,
    and the last: a change of more than 1/_SAMPLES of t in one piece covers one), but for those
    in pages wholly inside t that nothing backed, in anonymous host memory (the mappings
    anonymous lists, as _anonymous_memory): a write anywhere in such a page backs it."""

    def __init__(self, t, anonymous):
        import torch
        rows = t.detach().reshape(-1).view(torch.uint8).view(-1, t.element_size())
        n, size, step = rows.shape[0], t.element_size(), max(1, -(-rows.shape[0] // _SAMPLES))
        self.rows, self.idx, self.unbacked = rows, None, None
        self.views = [rows[::step], rows[-1:]]
        start, end = _span(t)
        self.first = -(-start // _PAGE) * _PAGE
        pages = (end // _PAGE * _PAGE - self.first) // _PAGE
        i = bisect.bisect_right(anonymous, (start, float("inf"))) - 1
        if t.device.type == "cpu" and pages > 0 and i >= 0 and end <= anonymous[i][1]:
            unbacked = _unbacked(self.first, pages)
            if unbacked is not None and bool(unbacked.any()):
                idx = torch.cat([torch.arange(0, n, step), torch.tensor([n - 1])])
                at = [start + idx * size, start + idx * size + size - 1]  # an element's ends
                page = [(a - self.first).div(_PAGE, rounding_mode="floor") for a in at]
                left = torch.zeros_like(idx, dtype=torch.bool)
                for p in page:
                    left |= (p < 0) | (p >= pages) | ~unbacked[p.clamp(0, pages - 1)]
                self.idx, self.unbacked, self.views = idx[left], unbacked, []
                rows.index_fill_(0, self.idx, _UNWRITTEN)
        for v in self.views:
            v.fill_(_UNWRITTEN)

    def intact(self):
        """Whether the marked bytes still hold _UNWRITTEN (read on the host: the fills before
        are done on a GPU too when this returns) and the unbacked pages are still unbacked."""
        import torch
        marked = self.views if self.idx is None else [self.rows.index_select(0, self.idx)]
        for b in marked:
            if b.numel() and any(int(v) != _UNWRITTEN for v in torch.aminmax(b)):
                return False
        if self.unbacked is None:
            return True
        now = _unbacked(self.first, len(self.unbacked))
        return now is not None and not bool((self.unbacked & ~now).any())


def _is_view(func):
    """Whether aten op func returns a view of an argument (it reads and writes no element)."""
    return any(r.alias_info is not None and not r.alias_info.is_write
               for r in func._schema.returns)


def _plain_copy(dst, src, probe):
    """Whether dst.copy_(src) writes the elements src views, as the probe stores them, byte for
    byte into dst's contiguous memory: both strided with no lazy conjugation or negation, one
    dtype (the probe's), as many elements, src's shape broadcasting to dst's (else the copy
    fails). How src cuts the probe is _part's to say."""
    import torch
    for t in (dst, src):
        if t.layout != torch.strided or t.is_conj() or t.is_neg():
            return False
    if not (src.dtype == dst.dtype == probe.dtype and dst.is_contiguous()
            and src.numel() == dst.numel()):
        return False
    try:
        return tuple(torch.broadcast_shapes(src.shape, dst.shape)) == tuple(dst.shape)
    except RuntimeError:
        return False


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
    were not what the probe had; written, how many times each name was read into place."""

    def __init__(self, placed, slices, streamed, loaded):
        self.placed, self.slices, self.streamed, self.loaded = placed, slices, streamed, loaded
        self.refused = None
        self.written = {}

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
            self.refused = (f"tensor {ckload._quoted(name)}: {c.nbytes} bytes, where the model's loader "
                            f"copies {where[1]}")
            return ckload.DEST_SKIP
        self.written[name] = self.written.get(name, 0) + 1
        at[0] = where[0] if c.nbytes else None
        return ckload.DEST_AT


class Recorder(TorchDispatchMode if TorchDispatchMode else object):
    """model.load_weights run on probes: meta tensors of the checkpoint's dtypes and shapes.
    Every aten op its weight loaders run passes here. record: a copy_ from a probe (or a view
    of one) into the model's memory is recorded and not done, its target watched (_Watch:
    sampled bytes filled with _UNWRITTEN, fresh pages left unbacked); a tensor is placed only
    if its one copy writes its bytes unchanged (_plain_copy, _part) and nothing touches that
    memory afterwards: any other op on a probe (a conversion, a concatenation, an in-place
    change) marks its tensor streamed, as does any later op that reads or writes memory a
    recorded copy targets, or a change that bypassed the dispatcher (the watch saw it); every
    other op runs as it would (a loader zeroing padding rows). replay: the same run with the streamed tensors real; it must do what record showed
    (each placed tensor copied once, to the same place, its memory untouched after), or
    _Diverged."""

    def __init__(self, model, rank, world):
        super().__init__()
        self.model, self.rank, self.world = model, rank, world
        self.memory = {}  # the model's storages: data_ptr -> end
        for t in list(model.parameters()) + list(model.buffers()):
            if not t.is_meta:
                base = _storage(t)
                self.memory[base.data_ptr()] = base.data_ptr() + base.nbytes()
        self.owner = {}     # storage key -> the names of the probes it holds or came from
        self.kept = []      # tensors computed from probes, kept so that no key is reused
        self.probes = {}    # name -> probe
        self.copies = {}    # name -> [(address, bytes, part) or None, its target's _Watch]
        self.regions = []   # (start, end, name) of every recorded copy (replay: landed), sorted
        self.longest = 0    # the longest region's bytes: how far below a span one may start
        self.streamed = set()
        self.plan = None
        self.landed = None  # replay: name -> its copy's target's _Watch
        self.anonymous = _anonymous_memory()
        self.diverged = False

    def record(self, order):
        """Runs model.load_weights on probes of order's tensors; self.plan, what it showed."""
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
        if self._kept_a_probe():
            raise ValueError("a weight loader kept a probe")
        placed, slices = {}, []
        streamed = {e.name for e in order if e.torch_dtype is None} | self.streamed
        for name, copies in self.copies.items():
            if name in streamed:
                continue
            where, watch = copies[0] if len(copies) == 1 else (None, None)
            if where is None or (where[2] is not None and not self._sliceable(name, names)) \
                    or not watch.intact():
                streamed.add(name)
                continue
            placed[name] = where[:2]
            if where[2] is not None:
                slices.append((name, where[2]))
        self.plan = Plan(placed, slices, streamed,
                         None if loaded is None else set(loaded))

    def replay(self, order, stream, shown):
        """model.load_weights once more on order's whole sequence: the streamed tensors from
        stream (ckload.stream of their names), every other one its probe again. What it says
        it loaded; _Diverged where it did not do what record showed."""
        import ckload
        self.regions, self.longest, self.landed, self.diverged = [], 0, {}, False

        def fed():
            for e in order:
                if e.name not in self.plan.streamed:
                    yield e.name, self.probes[e.name]
                    continue
                name, t = next(stream, (None, None))
                if name != e.name:
                    raise ckload.Error(f"ckload: {shown}: the source changed since it was "
                                       f"listed (tensor {ckload._quoted(e.name)})")
                yield name, t

        try:
            with self:
                loaded = _take(self.model, fed(), shown)
        finally:
            stream.close()
        if self.diverged or set(self.landed) != set(self.plan.placed) or self._kept_a_probe() \
                or not all(w.intact() for w in self.landed.values()):
            raise _Diverged()
        return None if loaded is None else set(loaded)

    def _kept_a_probe(self):
        return any(t.is_meta for t in list(self.model.parameters()) + list(self.model.buffers()))

    @staticmethod
    def _sliceable(name, names):
        """Whether a slice rule naming name selects it alone (ckl_selected: a glob, or the name
        and those continuing it with '.')."""
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
        copy = func is torch.ops.aten.copy_.default and bool(names)
        view = _is_view(func)
        if self.landed is not None:
            self._check(copy, view, args, names, tensors)
        elif copy:
            self._copy(args[0], args[1], names)
        elif not view:
            for t in tensors:
                if not t.is_meta:
                    self._touch(t)
        if copy:
            return args[0]
        out = func(*args, **kwargs)
        if names and not view:
            self.streamed |= names
            for o in tree_flatten(out)[0]:
                if isinstance(o, torch.Tensor) and o.is_meta:
                    self.kept.append(o)
                    self.owner.setdefault(_storage_key(o), set()).update(names)
        return out

    def _region(self, t, name):
        """A copy of name's recorded (replay: landed) into t's memory."""
        start, end = _span(t)
        bisect.insort(self.regions, (start, end, name))
        self.longest = max(self.longest, end - start)

    def _hits(self, t):
        """The names of the copies recorded (replay: landed) into memory t overlaps: only the
        regions that start less than the longest one's bytes below t are looked at, so that an
        op costs the regions near it, not every one (a model of 92k tensors)."""
        start, end = _span(t)
        lo = bisect.bisect_left(self.regions, (start - self.longest,))
        hi = bisect.bisect_left(self.regions, (end,))
        return {name for s, e, name in self.regions[lo:hi] if s < end and start < e}

    def _touch(self, t):
        """t's memory is read or written: the copies recorded into it must be real. Whether
        there were any."""
        hit = self._hits(t)
        self.streamed |= hit
        return bool(hit)

    def _where(self, dst, src, name):
        """(address, bytes, part) of dst.copy_(src), src a view of name's probe, where ckload
        can make it (a plain copy into the model's memory, of the whole probe or this rank's
        torch.chunk part); else None."""
        probe = self.probes[name]
        start, end = _span(dst)
        base = _storage(dst).data_ptr()
        if _storage_key(src) != _storage_key(probe) or not _plain_copy(dst, src, probe) \
                or base not in self.memory or end > self.memory[base]:
            return None
        part = _part(probe, src, self.rank, self.world)
        return None if part is False else (start, end - start, part)

    def _copy(self, dst, src, names):
        name = next(iter(names)) if len(names) == 1 else None
        if dst.is_meta or name is None or name in self.streamed:
            self.streamed |= names
            if not dst.is_meta:
                self._touch(dst)
            return
        where, watch = self._where(dst, src, name), None
        if self._touch(dst) or where is None:
            self.streamed.add(name)
        else:
            watch = _Watch(dst, self.anonymous)
        self._region(dst, name)
        self.copies.setdefault(name, []).append((where, watch))

    def _check(self, copy, view, args, names, tensors):
        """replay's rule for one op: a probe's only op is its tensor's recorded copy, once;
        nothing else touches that memory after it lands."""
        name = next(iter(names)) if len(names) == 1 else None
        touches = not view and any(self._hits(t) for t in tensors if not t.is_meta)
        if touches or (names and not view and not copy) or (copy and (
                name not in self.plan.placed or name in self.landed or args[0].is_meta
                or self._where(args[0], args[1], name) != self.copies[name][0][0])):
            self.diverged = True  # even if a loader swallows the exception
            raise _Diverged()
        if copy:
            self._region(args[0], name)
            self.landed[name] = _Watch(args[0], self.anonymous)


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
            source = weights_source(model_config.model, model_config.revision, self.extra,
                                    getattr(model_config, "model_weights", ""))
            placed, read, other = fill(model, source,
                                       window=self.extra.get("window", 1 << 30),
                                       verify=self.extra.get("verify", True))
            # vLLM's own loaders' words, so that a log reads the same whichever loaded
            logger.info("Loading weights took %.2f seconds (ckload, from %s: %d tensors read "
                        "into place, %d bytes; %d through load_weights or not taken)",
                        time.perf_counter() - start, ckload.shown(source), placed, read, other)
