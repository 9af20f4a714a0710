"""Warm attach on a real GPU: `ckpt serve` keeps a pack on cuda:0, fresh client processes attach
through CUDA IPC and see the source's bytes (safetensors' own reading, compared on the device);
load_into copies an attached block device to device into a module's tensors; a client killed
while attached leaves the keeper serving the others; the keeper, told to stop, keeps serving
while attached. The protocol and its refusals are test_cuda_fake_share.py's, under the stand-in."""
import os
import signal
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import save_file

from ckptfs_testlib import build_dir, run

CLIENT = """
import sys, torch, ckload
from safetensors.torch import load_file
sd = ckload.attach(sys.argv[1], device="cuda:0")
want = load_file(sys.argv[2], device="cuda:0")
assert sorted(sd) == sorted(want), (sorted(sd), sorted(want))
for k, t in sd.items():
    assert t.dtype == want[k].dtype and torch.equal(t, want[k]), k
target = {k: torch.empty_like(v) for k, v in want.items()}
import ckload as c
c.load_into(target, sys.argv[1])
for k, t in target.items():
    assert torch.equal(t, want[k]), k
print("OK", len(sd), flush=True)
if len(sys.argv) > 3:  # stay attached until killed
    sys.stdin.read()
"""


def keeper(pack, sock):
    p = subprocess.Popen([build_dir() / "ckpt", "serve", pack, "--device", "cuda:0", "--socket",
                          sock], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready = p.stdout.readline()
    assert f"served on {sock}" in ready, p.stderr.read()
    return p


def client(sock, st, *stay, **kw):
    return subprocess.Popen([sys.executable, "-c", CLIENT, sock, st, *stay],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.PIPE, text=True, **kw)


def test_attach_across_processes_on_the_device(tmp_path):
    torch.manual_seed(0)
    st = tmp_path / "model.safetensors"
    save_file({f"layers.{i}.w": torch.randn(256, 512).to(torch.bfloat16) for i in range(8)}
              | {"norm": torch.randn(512)}, st)
    pack = tmp_path / "model.pack"
    assert run([build_dir() / "ckpt", "pack", st, pack], timeout=60).returncode == 0
    sock = os.path.join(tempfile.mkdtemp(dir="/tmp"), "k.sock")  # a socket's path is short
    k = keeper(pack, sock)
    try:
        stays = client(sock, str(st), "stay")
        assert stays.stdout.readline().startswith("OK 9"), stays.stderr.read()
        k.send_signal(signal.SIGTERM)  # attached: it keeps serving
        again = client(sock, str(st))
        out, err = again.communicate(timeout=120)
        assert again.returncode == 0 and out.startswith("OK 9"), err
        stays.kill()  # the last attachment ends: the keeper exits on its own
        stays.wait(timeout=30)
        assert k.wait(timeout=60) == 0
        assert not os.path.exists(sock)
    finally:
        if k.poll() is None:
            k.kill()
            k.wait()
