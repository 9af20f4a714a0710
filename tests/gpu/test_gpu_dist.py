"""ckload.load_distributed into CUDA memory: with two GPUs or more, NCCL, one rank per device;
with one, gloo moving CUDA tensors between two ranks on cuda:0 (the device path of the
protocol: broadcasts and sends straight into each rank's device block). Every rank's tensors
and parts byte-exact against the safetensors library and torch.chunk; each byte read by one
rank under "balanced"; rank0 with slices sends each rank its parts only."""
import pytest
import torch
from safetensors.torch import load_file

from ckptfs_testlib import torch_bytes
from test_distributed import model_file, spawn
from test_slices import dim_of, part

import ckload

RULES = [("*.q_proj.weight", 0), ("*.o_proj.weight", 1)]


def backend_and_world():
    n = torch.cuda.device_count()
    return ("nccl", min(n, 4)) if n >= 2 else ("gloo", 2)


def cuda_load(rank, world, path, plan, slices, backend):
    device = f"cuda:{rank}" if backend == "nccl" else "cuda:0"
    torch.cuda.set_device(device)
    with ckload.DistributedLoad(path, device=device, plan=plan, slices=slices) as ld:
        ld.wait_all()
        got = {ld.name(i): ld.tensor(i) for i in range(len(ld))}
        read, total = ld.bytes_read(), ld.total_bytes()
    for name, t in load_file(str(path)).items():
        d = dim_of(name) if slices else -1
        exp = t if d < 0 else part(t, d, rank, world)
        assert got[name].device == torch.device(device), name
        assert torch_bytes(got[name]) == torch_bytes(exp), name
    return read, total


@pytest.mark.parametrize("plan,slices", [("balanced", None), ("balanced", RULES),
                                         ("rank0", None), ("rank0", RULES)])
def test_distributed_to_cuda(tmp_path, plan, slices):
    backend, world = backend_and_world()
    path = model_file(tmp_path, n=8, numel=65536)
    res = spawn(world, cuda_load, path, plan, slices, backend, backend=backend)
    assert all(r[0] != "error" for r in res), res
    whole = sum(t.numel() * 4 for t in load_file(str(path)).values())
    if plan == "rank0":
        assert res[0][0] == whole and all(r[0] == 0 for r in res[1:])
    elif not slices:
        assert sum(r[0] for r in res) == res[0][1]
