"""A hostile warm-attach keeper for test_cuda_fake_client.py: `fake_keeper.py SPEC`, SPEC a JSON
object. It writes the message itself, byte by byte as loader/sharemsg.h documents it (struct,
and the XXH3 of libxxhash through ctypes: nothing of libckload's), with a device block of its
own that the CUDA stand-in can map: a memfd of `alloc` bytes, each float32 `fill`, named by a
handle in the stand-in's form (tests/fakecuda/fakecuda.c: magic, pid, fd, device, size, the
memfd's device and inode). Stdlib only: it runs as another uid (setpriv) too.

SPEC: socket (the path it listens on), clients (connections served, one at a time: default 1),
and either refusal [errno class, text] or a table: block (the block size it claims), source
(the served location), files ([path, [device, inode, size, mtime in ns]]: a file's identity,
which stat gives anyone who can see the file),
blobs ([place, length]), tensors ([name, dtype code, shape, bytes, blob]). Optional: rate
(seconds between bytes: a slow keeper), accept false (it listens, with a backlog of 0, and
never accepts). It prints "ready" once listening, then for each connection "sent N of M"
(bytes of its message) once the client hung up."""
import ctypes
import json
import os
import socket
import struct
import sys
import time

IPC_MAGIC = 0x43504946  # "FIPC": the stand-in's handle


def xxh3(b):
    lib = ctypes.CDLL("libxxhash.so.0")
    lib.XXH3_64bits.restype = ctypes.c_uint64
    lib.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return lib.XXH3_64bits(b, len(b))


def lstr(s):
    b = s.encode("utf-8", "surrogateescape")
    return struct.pack("<I", len(b)) + b


def message(kind, body):
    """Header (magic, version 1, kind, whole length), body, XXH3 of everything before it."""
    head = b"CKLSHARE" + struct.pack("<IIQ", 1, kind, 24 + len(body) + 8)
    return head + body + struct.pack("<Q", xxh3(head + body))


def block(alloc, fill):
    """The memfd (kept open: the stand-in's importer opens /proc/PID/fd/FD) and its handle."""
    fd = os.memfd_create("fake-keeper-block")
    os.write(fd, struct.pack("<f", fill) * (alloc // 4))
    st = os.fstat(fd)
    h = struct.pack("<IiiiQQQ", IPC_MAGIC, os.getpid(), fd, 0, alloc, st.st_dev, st.st_ino)
    return fd, h + bytes(64 - len(h))


def table(spec):
    _, handle = block(spec.get("alloc", 64), spec.get("fill", 666.0))
    body = handle + struct.pack("<IQ", 0, spec["block"]) + lstr(spec["source"])
    body += struct.pack("<I", len(spec["files"]))
    for path, (dev, ino, size, mtime_ns) in spec["files"]:
        body += lstr(path) + struct.pack("<QQQqI", dev, ino, size, mtime_ns // 10**9,
                                         mtime_ns % 10**9)
    body += struct.pack("<I", len(spec["blobs"]))
    body += b"".join(struct.pack("<QQ", *b) for b in spec["blobs"])
    body += struct.pack("<I", len(spec["tensors"]))
    for name, code, shape, nbytes, blob in spec["tensors"]:
        body += lstr(name) + struct.pack("<BB", code, len(shape))
        body += b"".join(struct.pack("<q", d) for d in shape) + struct.pack("<QI", nbytes, blob)
    return message(0, body)


def refusal(code, text):
    return message(1, struct.pack("<I", code) + lstr(text))


def serve(conn, msg, rate):
    """Sends msg (a byte at a time every rate seconds, if rate), then waits for the client to
    hang up; the bytes it took."""
    sent = 0
    try:
        if rate:
            for i in range(len(msg)):
                conn.sendall(msg[i:i + 1])
                sent += 1
                time.sleep(rate)
        else:
            conn.sendall(msg)
            sent = len(msg)
        while conn.recv(4096):
            pass
    except OSError:
        pass
    return sent


def main(spec):
    msg = refusal(*spec["refusal"]) if "refusal" in spec else table(spec)
    ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ls.bind(spec["socket"])
    ls.listen(0 if spec.get("accept") is False else 8)
    print("ready", flush=True)
    if spec.get("accept") is False:
        sys.stdin.read()  # until the test is done
        return
    for _ in range(spec.get("clients", 1)):
        conn, _ = ls.accept()
        with conn:
            print(f"sent {serve(conn, msg, spec.get('rate'))} of {len(msg)}", flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
