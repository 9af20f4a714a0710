"""libckload into cuda:0 straight from a source, with no pack made, and from a mount with and
without the bypass: every source kind, strided PyTorch views gathered chunk by chunk through the
pinned staging buffers, tied tensors loaded once and shared, real checkpoints of the corpus, a
mount's subtree; byte-exact against torch.load and the safetensors library."""
import pytest

import ckload
from test_gpu_load import check_cuda_load
from test_load import SOURCES, expected_tensors
from test_load_source import strided_source


def load_cuda(src, **kw):
    with ckload.Load(src, device="cuda:0", **kw) as ld:
        assert ld.read_path == "source"
        ld.wait_all()
        return {ld.name(i): ld.tensor(i) for i in range(len(ld))}


@pytest.mark.parametrize("kind", SOURCES)
def test_source_to_cuda_is_byte_exact(tmp_path, kind):
    src = SOURCES[kind](tmp_path)
    check_cuda_load(load_cuda(src, verify=True), expected_tensors(src))


@pytest.mark.parametrize("threads,size", [(1, 4096), (3, 5000), (8, 1 << 20)])
def test_strided_tensors_are_gathered_through_staging(tmp_path, threads, size):
    src = strided_source(tmp_path)
    sd = load_cuda(src, threads=threads, buffer_size=size)
    check_cuda_load(sd, expected_tensors(src))
    assert sd["tied.a"].data_ptr() == sd["tied.b"].data_ptr()


def test_corpus_source_to_cuda(corpus):
    for name in ["tinypellm_pytorch_model.bin", "peft_gpt2_adapter_model.safetensors",
                 "graykode_mnist_cnn_legacy.pt"]:
        check_cuda_load(load_cuda(corpus / name), expected_tensors(corpus / name))


@pytest.mark.parametrize("bypass", ["1", "0"])
@pytest.mark.parametrize("kind", ["zip", "safetensors", "sharded"])
def test_mount_to_cuda_with_and_without_the_bypass(tmp_path, mount, monkeypatch, kind, bypass):
    src = SOURCES[kind](tmp_path)
    expected = expected_tensors(src)
    monkeypatch.setenv("CKLOAD_BYPASS", bypass)
    with mount(src) as mnt:
        with ckload.Load(mnt, device="cuda:0") as ld:
            assert ld.read_path == ("bypass" if bypass == "1" else "mount")
            ld.wait_all()
            check_cuda_load({ld.name(i): ld.tensor(i) for i in range(len(ld))}, expected)
        sub = sorted(expected)[-1].split(".")[0]
        names = {n for n in expected if n == sub or n.startswith(sub + ".")}
        with ckload.Load(mnt / sub, device="cuda:0") as ld:
            ld.wait_all()
            check_cuda_load({ld.name(i): ld.tensor(i) for i in range(len(ld))},
                            {n: expected[n] for n in names})
