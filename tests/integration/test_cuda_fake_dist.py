"""Slices and read shares on libckload's CUDA branch, under the stand-in for the CUDA runtime
(tests/fakecuda, `make test-cuda-fake`): each rank's parts loaded to "cuda" (contiguous ranges
and strided gathers through the staging buffers) byte-exact against torch.chunk; and the
distributed protocol modelled in one process, as far as it can be without NCCL (this torch has
no CUDA): N loads on N ranks' shares, each blob one rank read copied into the others' device
blocks (cudaMemcpy, standing in for the broadcast) and put, every tensor then byte-exact on
every "rank", each byte read once. tests/gpu/test_gpu_dist.py runs the real thing over NCCL."""
import ctypes

import torch
from safetensors.torch import load_file, save_file

import ckload
from ckptfs_testlib import torch_bytes
from test_cuda_fake import fake, read_device, seeded  # noqa: F401 (a fixture)
from test_slices import RULES, dim_of, part, torch_src

cudaMemcpyHostToDevice = 1


def write_device(ptr, data, ordinal=0):
    was = ctypes.c_int()
    assert fake.cudaGetDevice(ctypes.byref(was)) == 0
    assert fake.cudaSetDevice(ordinal) == 0
    buf = ctypes.create_string_buffer(data, len(data))
    rc = fake.cudaMemcpy(ctypes.c_void_p(ptr), buf, len(data), cudaMemcpyHostToDevice)
    assert fake.cudaSetDevice(was.value) == 0
    assert rc == 0, f"cudaMemcpy: {rc}"


def check_parts(ld, want, rank, world):
    ld.wait_all()
    for i in range(len(ld)):
        name, _, shape, nbytes = ld.info(i)
        d = dim_of(name)
        exp = want[name] if d < 0 else part(want[name], d, rank, world)
        assert list(shape) == list(exp.shape), name
        assert read_device(ld.pointer(i), nbytes, 0) == torch_bytes(exp), name


def test_parts_to_cuda(tmp_path):
    path, read = torch_src(tmp_path)
    want = read(path)
    for world in (2, 3):
        for rank in range(world):
            with ckload.Load(path, device="cuda", slices=RULES, rank=rank, world_size=world,
                             buffer_size=4096) as ld:
                check_parts(ld, want, rank, world)


def test_shares_put_by_the_caller(tmp_path):
    g = torch.Generator().manual_seed(18)
    save_file({f"layers.{i}.w": torch.randn(64, 16, generator=g) for i in range(9)},
              str(tmp_path / "m.safetensors"))
    path, world = tmp_path / "m.safetensors", 3
    want = load_file(str(path))
    ready = [[] for _ in range(world)]
    loads = [ckload.Load(path, device="cuda", rank=r, world_size=world,
                         _read=ckload.READ_BALANCED, on_ready=ready[r].append)
             for r in range(world)]
    try:
        blobs = [ld.blobs() for ld in loads]
        for b, (_, n, owner, _) in enumerate(blobs[0]):
            assert 0 <= owner < world
            err = ctypes.create_string_buffer(512)
            assert loads[owner]._lib.ckl_blob_wait(loads[owner]._h, b, err, 512) == 0
            data = read_device(blobs[owner][b][0], n, 0)
            for r in range(world):
                if r != owner:  # the "broadcast"
                    write_device(blobs[r][b][0], data)
                    assert ckload.library().ckl_blob_put(loads[r]._h, b, err, 512) == 0, err.value
        assert sum(ld.done_bytes() for ld in loads) == loads[0].total_bytes()
        for r, ld in enumerate(loads):
            check_parts(ld, want, r, world)
            assert sorted(ready[r]) == list(range(len(ld)))
    finally:
        for ld in loads:
            ld.release()
