"""ckptfs installed by pip: the `ckpt` and `ckptfs` commands pip puts on PATH run the programs
this package carries in bin/, with the libcurl the wheel brings (bin/libckcurl.so, found through
CKPTFS_LIBCURL unless that is set already) for http(s)://, hf://, s3:// and gs:// sources. What the
wheel cannot bring: fusermount3, setuid, from the system's fuse3 (mounts as a non-root user), and
a CUDA runtime (torch's, found at the first CUDA use). BIN is where the programs are, for a
script that would rather run them directly than through Python."""
import os
import sys

BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")
LIBCURL = os.path.join(BIN, "libckcurl.so")


def _run(name):
    if os.path.exists(LIBCURL):
        os.environ.setdefault("CKPTFS_LIBCURL", LIBCURL)
    path = os.path.join(BIN, name)
    try:
        os.execv(path, [name] + sys.argv[1:])
    except OSError as e:
        sys.exit(f"{name}: cannot run {path}: {e.strerror}")


def ckpt():
    _run("ckpt")


def ckptfs():
    _run("ckptfs")
