"""The processes of test_cuda_fake_share.py and test_cuda_fake_client.py, each under the CUDA
stand-in (the caller's LD_LIBRARY_PATH): `serve SRC SOCKET [DEVICE]`, a server that takes
commands on stdin (count, close, force) and answers each with one line; `attach SOCKET DEVICE
SOURCE HOLD [GROUP]`, a client that attaches (SOCKET, DEVICE, SOURCE and GROUP "-" for none, a
socket of none being ckload's default; GROUP a gid it trusts), prints its tensors as one JSON line {name: [dtype, shape, hex of the bytes read
back through cudaMemcpy]} or the error's class and line, then, with HOLD, waits for a line on
stdin (holding the attachment) before it reads again and exits. Both leave their stand-in's
counters in the file FAKECUDA's stats= names."""
import ctypes
import json
import os
import sys

import ckload

fake = ctypes.CDLL(os.environ["CKPTFS_FAKECUDA"])
fake.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
fake.cudaSetDevice.argtypes = [ctypes.c_int]


def read_back(a):
    """{name: [dtype, shape, hex]} of an attached load, read through cudaMemcpy."""
    out = {}
    ordinal = int(a.device[5:])
    assert fake.cudaSetDevice(ordinal) == 0
    for i in range(len(a)):
        name, dtype, shape, n = a.info(i)
        buf = ctypes.create_string_buffer(max(n, 1))
        if n:
            assert fake.cudaMemcpy(buf, a.pointer(i), n, 2) == 0
        out[name] = [dtype, list(shape), buf.raw[:n].hex()]
    return out


def serve(src, sock, device="cuda"):
    server = ckload.serve(src, sock, device=device)
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        try:
            if cmd == "count":
                print(server.attached(), flush=True)
            elif cmd in ("close", "force"):
                server.close(force=cmd == "force")
                with ckload._lib_lock:  # the module's pool of pinned buffers, given back
                    ckload.library().ckl_pool_free(ckload._pool)
                    ckload._pool = None
                print("closed", flush=True)
                return
        except ckload.Error as e:
            print(f"error {e}", flush=True)


def attach(sock, device, source, hold, group="-"):
    try:
        a = ckload.Attached(None if sock == "-" else sock, device=None if device == "-" else device,
                            source=None if source == "-" else source,
                            **({} if group == "-" else {"group": int(group)}))
    except Exception as e:
        print(json.dumps({"error": type(e).__name__, "line": str(e)}), flush=True)
        return
    with a:
        print(json.dumps({"read_path": a.read_path, "tensors": read_back(a)}), flush=True)
        if hold == "hold":
            sys.stdin.readline()
            print(json.dumps({"tensors": read_back(a)}), flush=True)


if __name__ == "__main__":
    {"serve": serve, "attach": attach}[sys.argv[1]](*sys.argv[2:])
