"""libckload into cuda:0: byte-exact against torch.load and the safetensors library, from a pack
file and from a mount's virtual pack; subsets, readiness, staging variants; and the GPU error
paths, which must leave device memory as they found it (cudaMemGetInfo through torch)."""
import gc
import os

import pytest
import torch
from safetensors.torch import save_file

import ckload
from ckptfs_testlib import torch_bytes
from test_load import (SOURCES, TORCH_DTYPE, expected_tensors, flip_byte, ckpt_load,
                       sparse_safetensors)
from test_pack import pack, pack_header, safetensors_source


def check_cuda_load(sd, expected):
    assert set(sd) == set(expected)
    for name, (dtype, shape, data) in expected.items():
        t = sd[name]
        assert t.device == torch.device("cuda:0"), (name, t.device)
        assert (t.dtype, list(t.shape)) == (TORCH_DTYPE[dtype], list(shape)), name
        assert torch_bytes(t) == data, f"bytes of {name!r} differ"


def free_device_memory():
    """cudaMemGetInfo's free bytes once torch's allocator holds no cached block: what is left
    in use is what live tensors and the CUDA context hold."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(0)[0]


@pytest.fixture
def warm(tmp_path_factory):
    """One load first, so that what CUDA allocates once per context is not counted later."""
    d = tmp_path_factory.mktemp("warm")
    ckload.load(pack(safetensors_source(d), d / "w.pack"), device="cuda:0")
    return free_device_memory()


@pytest.mark.parametrize("where", ["file", "mount"])
@pytest.mark.parametrize("kind", ["zip", "legacy", "every-dtype", "safetensors", "sharded"])
def test_cuda_load_is_byte_exact(tmp_path, mount, kind, where):
    src = SOURCES[kind](tmp_path)
    if where == "file":
        check_cuda_load(ckload.load(pack(src, tmp_path / "o.pack"), device="cuda:0",
                                    verify=True), expected_tensors(src))
    else:
        with mount(src) as mnt:
            sd = ckload.load(mnt / ".ckptfs/checkpoint.pack", device="cuda")
        check_cuda_load(sd, expected_tensors(src))


def test_corpus_to_cuda(tmp_path, corpus, mount):
    for name in ["tinypellm_pytorch_model.bin", "peft_gpt2_adapter_model.safetensors"]:
        expected = expected_tensors(corpus / name)
        check_cuda_load(ckload.load(pack(corpus / name, tmp_path / f"{name}.pack"),
                                    device="cuda:0"), expected)
        with mount(corpus / name) as mnt:
            check_cuda_load(ckload.load(mnt / ".ckptfs/checkpoint.pack", device="cuda:0"),
                            expected)


@pytest.mark.parametrize("threads,buffers,size", [(1, 2, 4096), (3, 3, 5000), (16, 4, 1 << 20)])
def test_staging_variants(tmp_path, threads, buffers, size):
    g = torch.Generator().manual_seed(5)
    src = tmp_path / "s.safetensors"
    save_file({f"t.{i}": torch.randn(1000 + 7777 * i, generator=g) for i in range(24)}, str(src))
    ld = ckload.Load(pack(src, tmp_path / "o.pack"), device="cuda:0", threads=threads,
                     buffer_size=size, verify=True)
    ld.wait_all()
    check_cuda_load({ld.name(i): ld.tensor(i) for i in range(len(ld))}, expected_tensors(src))
    ld.release()


def test_subset_and_readiness(tmp_path):
    g = torch.Generator().manual_seed(4)
    src = tmp_path / "s.safetensors"
    save_file({f"layers.{i}.w": torch.randn(1 << 16, generator=g) for i in range(40)}, str(src))
    out = pack(src, tmp_path / "o.pack")
    expected = expected_tensors(src)
    sd = ckload.load(out, device="cuda:0", only="layers.3*")
    check_cuda_load(sd, {n: expected[n] for n in expected if n.startswith("layers.3")})
    seen = []
    ld = ckload.Load(out, device="cuda:0", threads=2, buffer_size=1 << 16, on_ready=seen.append)
    ld.wait(0)
    first = ld.tensor(0)  # usable while later layers are still on their way
    assert torch_bytes(first) == expected["layers.0.w"][2]
    ld.wait_all()
    assert sorted(seen) == list(range(len(ld)))
    ld.release()


def test_device_memory_goes_with_the_last_tensor(tmp_path, warm):
    out = pack(safetensors_source(tmp_path), tmp_path / "o.pack")
    sd = ckload.load(out, device="cuda:0")
    keep = sd["embed"]
    del sd
    assert free_device_memory() < warm
    del keep
    assert free_device_memory() == warm


def test_out_of_device_memory_leaves_nothing(tmp_path, mount, warm):
    total = torch.cuda.mem_get_info(0)[1]
    src = sparse_safetensors(tmp_path / "huge.safetensors", total + (1 << 30))
    with mount(src) as mnt:
        with pytest.raises(RuntimeError, match="out of memory|device memory"):
            ckload.load(mnt / ".ckptfs/checkpoint.pack", device="cuda:0")
        p = ckpt_load(mnt / ".ckptfs/checkpoint.pack", "--device", "cuda:0")
        assert p.returncode == 1 and p.stderr.count(b"\n") == 1, p.stderr
    assert free_device_memory() >= warm  # nothing kept (the driver may give back more)


def test_corrupt_pack_leaves_nothing(tmp_path, warm):
    out = pack(safetensors_source(tmp_path), tmp_path / "o.pack")
    flip_byte(out, pack_header(out)["data_offset"] + 1)
    with pytest.raises(RuntimeError, match="checksum"):
        ckload.load(out, device="cuda:0", verify=True)
    assert free_device_memory() >= warm
    os.truncate(out, pack_header(out)["data_offset"] + 10)
    with pytest.raises(RuntimeError):
        ckload.load(out, device="cuda:0")
    assert free_device_memory() >= warm


def test_no_such_device(tmp_path):
    out = pack(safetensors_source(tmp_path), tmp_path / "o.pack")
    with pytest.raises(RuntimeError, match="cuda:99|device 99"):
        ckload.load(out, device="cuda:99")


def test_ckpt_load_to_cuda(tmp_path):
    out = pack(safetensors_source(tmp_path), tmp_path / "o.pack")
    p = ckpt_load(out, "--device", "cuda:0", "--verify")
    assert p.returncode == 0, p.stderr
    assert " into cuda:0 in " in p.stdout.decode()


def test_load_into_cuda_parameters(tmp_path, warm):
    """load_into a CUDA module: each tensor lands in the module's own parameters (torch's
    allocator owns them all: memory_allocated grows by nothing), byte-exact against the
    safetensors library, ties filled once; the load's own block is one byte."""
    from test_load_into import fresh, safetensors_of, trained
    src = trained()
    path = safetensors_of(src, tmp_path / "m.safetensors")
    got = fresh().to("cuda:0")
    before = torch.cuda.memory_allocated(0)
    ptrs = {k: v.data_ptr() for k, v in got.state_dict().items()}
    assert ckload.load_into(got, path) == ([], [])
    assert torch.cuda.memory_allocated(0) == before
    assert {k: v.data_ptr() for k, v in got.state_dict().items()} == ptrs
    for k, v in src.state_dict().items():
        assert torch_bytes(got.state_dict()[k].cpu()) == torch_bytes(v), k
    assert got.head.weight.data_ptr() == got.wte.weight.data_ptr()
