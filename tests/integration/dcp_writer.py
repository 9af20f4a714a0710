"""Run by test_dcp.py under torch 2.x (.deps/torch2): writes DCP checkpoints with torch itself,
and what torch reads back from them, for the tests to compare ckptfs against.

  dcp_writer.py save DIR                 one process, a small transformer state dict + values
  dcp_writer.py views DIR                one process, a state dict of views saved as they are:
                                         a transposed weight, a permuted 3-d tensor, a column
                                         slice, and the weight itself
  dcp_writer.py sharded DIR WORLD        WORLD gloo ranks: DTensors Shard(0), Shard(1),
                                         Replicate, and an FSDP2 module with Adam's state
  dcp_writer.py model DIR WORLD LAYERS HIDDEN [DTYPE]
                                         WORLD gloo ranks save an FSDP2-sharded stack of LAYERS
                                         transformer-shaped blocks (HIDDEN wide, float32 or
                                         bfloat16): chunks of rows, one per rank and weight
  dcp_writer.py expect DIR OUT           torch's own reading of DIR (dcp_to_torch_save, then
                                         torch.load): OUT/manifest.json and one raw file per
                                         tensor (row-major, little-endian), values as str()
  dcp_writer.py hostile SRC DST KIND     DST: SRC's checkpoint with its .metadata changed
  dcp_writer.py files DIR N              one process, N small tensors, each in a .distcp file of
                                         its own (FileSystemWriter(single_file_per_rank=False))
  dcp_writer.py fields SRC DST           DST/FIELD-TYPE: SRC's checkpoint with one field of
                                         its .metadata set to a value of another type
                                         (object.__setattr__, as on a frozen dataclass)
  dcp_writer.py shared DIR N PAD         a DCP checkpoint of one [N, 4] tensor in N chunks of
                                         a row, every chunk's record naming one archive whose
                                         data.pkl holds PAD bytes of pushes and pops first
  dcp_writer.py shared_pt2 FILE N PAD    a .pt2 whose N use_pickle weights name one such
                                         archive (the records ckptfs reads, written by hand)
"""
import json, os, pickle, shutil, sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp


def small_state_dict():
    g = torch.Generator().manual_seed(0)
    return {
        "model.embed_tokens.weight": torch.randn(64, 16, generator=g),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(16, 16, generator=g).bfloat16(),
        "model.layers.0.mlp.conv": torch.randn(3, 4, 5, generator=g).half(),
        "model.layers.0.input_layernorm.weight": torch.ones(16),
        "model.position_ids": torch.arange(32, dtype=torch.int64),
        "step": 7, "name": "run-1", "opt": {"lr": 0.001, "betas": (0.9, 0.95)},
    }


def save(path):
    dcp.save(small_state_dict(), checkpoint_id=path)


def views(path):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(5, 7, generator=g)
    dcp.save({"w.t": w.t(), "cube.permuted": torch.randn(2, 3, 4, generator=g).permute(2, 0, 1),
              "cols": torch.arange(24.).reshape(4, 6)[:, 1:5], "w": w,
              "half.t": torch.randn(3, 5, generator=g).half().t()}, checkpoint_id=path)


def sharded_rank(rank, world, path, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.checkpoint.state_dict import get_state_dict
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)  # every rank makes the same full tensors, then keeps its part
    full = {"row": torch.randn(10, 6), "col": torch.randn(5, 9).bfloat16(),
            "rep": torch.randn(7), "cube": torch.randn(4, 6, 3)}
    sd = {"dt.row": distribute_tensor(full["row"], mesh, [Shard(0)]),
          "dt.col": distribute_tensor(full["col"], mesh, [Shard(1)]),
          "dt.rep": distribute_tensor(full["rep"], mesh, [Replicate()]),
          "dt.cube": distribute_tensor(full["cube"], mesh, [Shard(1)])}
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3))
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(5, 6)).sum().backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    sd.update({"model": msd, "optim": osd, "epoch": 3})
    dcp.save(sd, checkpoint_id=path)
    # every rank past its last collective before any tears its group down: gloo aborts a rank
    # whose peer has gone mid-exchange ("terminate called without an active exception")
    dist.barrier()
    dist.destroy_process_group()


def sharded(path, world):
    spawn_ranks(sharded_rank, world, path)


def spawn_ranks(fn, world, *args):
    """fn(rank, world, *args, port) on world processes of one gloo group on 127.0.0.1. Once
    more, on another port, where a rank dies in the group's setup: on a loaded machine gloo's
    rendezvous sometimes aborts a rank ("terminate called without an active exception"), or
    the free port found is taken before rank 0 listens on it. The files are written again
    whole, under the same names."""
    import socket
    import torch.multiprocessing as mp
    for attempt in (1, 2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            mp.spawn(fn, args=(world, *args, port), nprocs=world, join=True)
            return
        except mp.ProcessExitedException:
            if attempt == 2:
                raise


def model_rank(rank, world, path, layers, hidden, dtype, port):
    """Built on the meta device and sharded before any memory is taken: each rank holds and
    fills only its rows (seeded by rank), so a 2 GiB model costs each rank its share."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    mesh = init_device_mesh("cpu", (world,))
    h, nn = hidden, torch.nn

    def block():
        b = nn.Module()
        for name, shape in (("q_proj", (h, h)), ("k_proj", (h, h)), ("v_proj", (h, h)),
                            ("o_proj", (h, h)), ("up_proj", (4 * h, h)),
                            ("down_proj", (h, 4 * h))):
            b.register_parameter(name, nn.Parameter(torch.empty(shape, dtype=dtype)))
        b.register_parameter("norm", nn.Parameter(torch.empty(h, dtype=dtype)))
        return b
    with torch.device("meta"):
        model = nn.Module()
        model.layers = nn.ModuleList(block() for _ in range(layers))
        model.embed = nn.Parameter(torch.empty(1024, h, dtype=dtype))
    for b in model.layers:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    g = torch.Generator().manual_seed(1000 + rank)
    with torch.no_grad():
        for p in model.parameters():
            local = p.to_local()
            local.copy_(torch.randn(local.shape, generator=g).to(dtype))
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=path)
    dist.barrier()
    dist.destroy_process_group()


def model(path, world, layers, hidden, dtype="float32"):
    spawn_ranks(model_rank, int(world), path, int(layers), int(hidden), getattr(torch, dtype))


def flatten(obj, prefix, out):
    if isinstance(obj, dict):
        for k, v in obj.items():
            flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(obj, (list, tuple)) and not isinstance(obj, torch.Size):
        for i, v in enumerate(obj):
            flatten(v, f"{prefix}.{i}", out)
    else:
        out[prefix] = obj
    return out


def expect(path, out):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    os.makedirs(out, exist_ok=True)
    pt = os.path.join(out, "all.pt")
    dcp_to_torch_save(path, pt)
    sd = torch.load(pt, weights_only=False)
    os.unlink(pt)
    manifest = {"tensors": {}, "values": {}}
    for i, (name, v) in enumerate(flatten(sd, "", {}).items()):
        if isinstance(v, torch.Tensor):
            v = v.contiguous()
            flat = v.reshape(-1)
            raw = flat.view(torch.uint8) if v.dtype != torch.bool else flat.to(torch.uint8)
            with open(os.path.join(out, f"t{i}"), "wb") as f:
                f.write(raw.numpy().tobytes())
            manifest["tensors"][name] = {"file": f"t{i}", "shape": list(v.shape),
                                         "dtype": str(v.dtype)}
        else:
            manifest["values"][name] = str(v)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f)


def hostile(src, dst, kind):
    shutil.copytree(src, dst)
    with open(os.path.join(dst, ".metadata"), "rb") as f:
        md = pickle.load(f)
    tensors = [(k, v) for k, v in md.state_dict_metadata.items() if hasattr(v, "chunks")]
    name, tm = next((k, v) for k, v in tensors if len(v.chunks) > 1)
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
    c0, c1 = tm.chunks[0], tm.chunks[1]
    if kind == "overlap":  # the second chunk starts one row early
        off = list(c1.offsets)
        off[0 if c1.offsets[0] else 1] -= 1
        tm.chunks[1] = ChunkStorageMetadata(offsets=torch.Size(off), sizes=c1.sizes)
    elif kind == "gap":
        del tm.chunks[1]
    elif kind == "no_chunks":
        tm.chunks = []
    elif kind == "past_file":
        info = next(v for k, v in md.storage_data.items() if k.fqn == name)
        info.length = os.path.getsize(os.path.join(dst, info.relative_path)) + 1000
    elif kind == "dtype":
        tm.properties.dtype = torch.float64
    elif kind == "size":
        tm.size = torch.Size([tm.size[0] + 1] + list(tm.size[1:]))
    elif kind == "class":  # a class outside the list
        import collections
        md.planner_data = collections.Counter("abc")
    elif kind == "not_zip":
        info = next(v for k, v in md.storage_data.items() if k.fqn == name)
        with open(os.path.join(dst, info.relative_path), "r+b") as f:
            f.seek(info.offset)
            f.write(b"\0" * min(info.length, 64))
    with open(os.path.join(dst, ".metadata"), "wb") as f:
        pickle.dump(md, f)


def files(path, n):
    """As many files as a job of n ranks writes, from one process: each item its own file."""
    sd = {f"layers.{i}.w": torch.full((4,), float(i)) for i in range(int(n))}
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(path, single_file_per_rank=False))
# Where each field is, in a metadata md: the object that holds it (FIELDS), and the values of a
# wrong type put in it (WRONG).
FIELDS = {
    "index.fqn": lambda md, name, key, info, tm: (key, "fqn"),
    "index.offset": lambda md, name, key, info, tm: (key, "offset"),
    "info.relative_path": lambda md, name, key, info, tm: (info, "relative_path"),
    "info.offset": lambda md, name, key, info, tm: (info, "offset"),
    "info.length": lambda md, name, key, info, tm: (info, "length"),
    "info.transform_descriptors":
        lambda md, name, key, info, tm: (info, "transform_descriptors"),
    "chunk.offsets": lambda md, name, key, info, tm: (tm.chunks[0], "offsets"),
    "chunk.sizes": lambda md, name, key, info, tm: (tm.chunks[0], "sizes"),
    "tensor.chunks": lambda md, name, key, info, tm: (tm, "chunks"),
    "tensor.properties": lambda md, name, key, info, tm: (tm, "properties"),
    "tensor.size": lambda md, name, key, info, tm: (tm, "size"),
    "properties.dtype": lambda md, name, key, info, tm: (tm.properties, "dtype"),
    "properties.layout": lambda md, name, key, info, tm: (tm.properties, "layout"),
    "metadata.state_dict_metadata": lambda md, name, key, info, tm: (md, "state_dict_metadata"),
    "metadata.storage_data": lambda md, name, key, info, tm: (md, "storage_data"),
}
WRONG = {"str": lambda: "x" * 40, "float": lambda: 1.5, "bytes": lambda: b"\x01" * 40,
         "dtype": lambda: torch.float32, "strs": lambda: ("a", "b")}


def fields(src, dst):
    """Every FIELD-TYPE of FIELDS x WRONG whose value is of another type than torch wrote, and
    properties.state-short and -empty: TensorProperties' state tuple cut to (dtype,) and ()."""
    from torch.distributed.checkpoint.metadata import TensorProperties
    for kind, state in {"short": lambda p: (p.dtype,), "empty": lambda p: ()}.items():
        with open(os.path.join(src, ".metadata"), "rb") as f:
            md = pickle.load(f)
        out = os.path.join(dst, f"properties.state-{kind}")
        shutil.copytree(src, out)
        was, TensorProperties.__getstate__ = TensorProperties.__getstate__, state
        try:
            with open(os.path.join(out, ".metadata"), "wb") as f:
                pickle.dump(md, f)
        finally:
            TensorProperties.__getstate__ = was
    for field, where in FIELDS.items():
        for kind, value in WRONG.items():
            with open(os.path.join(src, ".metadata"), "rb") as f:
                md = pickle.load(f)
            name, tm = next((k, v) for k, v in md.state_dict_metadata.items()
                            if hasattr(v, "chunks") and len(v.chunks) > 1)
            key, info = next((k, v) for k, v in md.storage_data.items()
                             if k.fqn == name and k.offset == tm.chunks[0].offsets)
            obj, attr = where(md, name, key, info, tm)
            v = value()
            if type(v) is type(getattr(obj, attr)):
                continue
            object.__setattr__(obj, attr, v)
            if isinstance(obj, TensorProperties):  # its state is __getstate__'s tuple
                assert TensorProperties.__getstate__(obj)[0 if attr == "dtype" else 1] is v
            out = os.path.join(dst, f"{field}-{kind}")
            shutil.copytree(src, out)
            with open(os.path.join(out, ".metadata"), "wb") as f:
                pickle.dump(md, f)


def padded_archive(pad):
    """torch.save of a [1, 4] tensor, its data.pkl PAD bytes longer: pushes of 1 and pops
    (BININT1 1, POP) after its PROTO, which pickle.load runs and forgets."""
    import io, zipfile
    raw = io.BytesIO()
    torch.save(torch.arange(4, dtype=torch.float32).reshape(1, 4), raw)
    out = io.BytesIO()
    with zipfile.ZipFile(raw) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith("/data.pkl"):
                data = data[:2] + b"K\x010" * (int(pad) // 3) + data[2:]
            zout.writestr(info.filename, data, zipfile.ZIP_STORED)
    return out.getvalue()


def shared(path, n, pad):
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata, Metadata, MetadataIndex, TensorProperties,
        TensorStorageMetadata)
    n = int(n)
    os.makedirs(path)
    archive = padded_archive(pad)
    with open(os.path.join(path, "a.distcp"), "wb") as f:
        f.write(archive)
    chunks = [ChunkStorageMetadata(offsets=torch.Size([i, 0]), sizes=torch.Size([1, 4]))
              for i in range(n)]
    md = Metadata(
        state_dict_metadata={"w": TensorStorageMetadata(
            properties=TensorProperties(dtype=torch.float32), size=torch.Size([n, 4]),
            chunks=chunks)},
        storage_data={MetadataIndex("w", c.offsets): _StorageInfo("a.distcp", 0, len(archive))
                      for c in chunks})
    with open(os.path.join(path, ".metadata"), "wb") as f:
        pickle.dump(md, f)


def shared_pt2(path, n, pad):
    import zipfile
    config = {f"w{i}": {"path_name": "shared", "use_pickle": True} for i in range(int(n))}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("model/archive_format", "pt2")
        z.writestr("model/byteorder", "little")
        z.writestr("model/data/weights/model_weights_config.json",
                   json.dumps({"config": config}))
        z.writestr("model/data/constants/model_constants_config.json",
                   json.dumps({"config": {}}))
        z.writestr("model/data/weights/shared", padded_archive(pad))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"save": lambda: save(*args),
     "sharded": lambda: sharded(args[0], int(args[1])),
     "views": lambda: views(*args),
     "model": lambda: model(*args),
     "expect": lambda: expect(*args),
     "hostile": lambda: hostile(*args),
     "files": lambda: files(*args),
     "fields": lambda: fields(*args),
     "shared": lambda: shared(*args),
     "shared_pt2": lambda: shared_pt2(*args)}[cmd]()
