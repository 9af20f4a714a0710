"""Shared by the benchmark scripts: sample checkpoints, mounting, the machine's description, and
the raw runs for scripts/plot-bench (record)."""
import json, os, platform, struct, subprocess, sys, tempfile, time

BUILD = os.environ.get("CKPTFS_BUILD", "build")


def write_safetensors(path, tensors):
    """tensors: list of (name, dtype, shape, nbytes). Data is a repeating byte pattern written
    in 64 MiB blocks, so a multi-GiB file costs no RAM."""
    header, off = {}, 0
    for name, dt, shape, n in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    block = bytes(range(251)) * (64 * 1024 * 1024 // 251 + 1)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        left = off
        while left:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n
    return len(h) + 8


class Mount:
    def __init__(self, work, source, *opts):
        self.mnt = tempfile.mkdtemp(dir=work, prefix="mnt.")
        args = [os.path.join(BUILD, "ckptfs")]
        for o in opts:
            args += ["-o", o]
        subprocess.run(args + [source, self.mnt], check=True)

    def daemon_pid(self):
        out = subprocess.run(["pgrep", "-f", "ckptfs .*" + self.mnt], capture_output=True, text=True)
        return int(out.stdout.split()[0])

    def close(self):
        subprocess.run(["fusermount3", "-u", self.mnt], check=True)
        os.rmdir(self.mnt)


def timed_rss(cmd):
    """Wall time, and peak RSS in KiB from GNU time (a small C parent, so the figure is the
    command's own, not a forked Python's)."""
    t0 = time.perf_counter()
    err = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], check=True, capture_output=True,
                         text=True).stderr
    return time.perf_counter() - t0, int(err.split()[-1])


def transformer_layout(total_bytes, head=False):
    """A realistic mix: embeddings, then layers of attention / MLP matrices and small norms
    (Hugging Face Llama names); with head, a whole Llama checkpoint: at least one layer, and the
    final norm and lm_head after the layers (so more than total_bytes, by those)."""
    hidden, vocab = 2048, 32000
    out = [("model.embed_tokens.weight", "BF16", [vocab, hidden], vocab * hidden * 2)]
    layer = 0
    while sum(t[3] for t in out) < total_bytes or (head and not layer):
        p = f"model.layers.{layer}."
        for name, shape in [("self_attn.q_proj.weight", [hidden, hidden]),
                            ("self_attn.k_proj.weight", [hidden // 4, hidden]),
                            ("self_attn.v_proj.weight", [hidden // 4, hidden]),
                            ("self_attn.o_proj.weight", [hidden, hidden]),
                            ("mlp.gate_proj.weight", [5632, hidden]),
                            ("mlp.up_proj.weight", [5632, hidden]),
                            ("mlp.down_proj.weight", [hidden, 5632]),
                            ("input_layernorm.weight", [hidden]),
                            ("post_attention_layernorm.weight", [hidden])]:
            n = 2
            for d in shape:
                n *= d
            out.append((p + name, "BF16", shape, n))
        layer += 1
    if head:
        out += [("model.norm.weight", "BF16", [hidden], hidden * 2),
                ("lm_head.weight", "BF16", [vocab, hidden], vocab * hidden * 2)]
    return out


def machine():
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    fuse = subprocess.run(["fusermount3", "-V"], capture_output=True, text=True).stdout.strip()
    return (f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, Linux {platform.release()}, "
            f"{fuse}")


CHUNK = 64 << 20


def evict(path):
    """Drops path from the page cache (written back first: dirty pages cannot be dropped)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm(path):
    """Reads path once, so that its pages are in the page cache."""
    buf = bytearray(CHUNK)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


class Owned(dict):
    """A peer's tensors, and what must be closed once they are no longer used."""
    def __init__(self, tensors, close):
        super().__init__(tensors)
        self.close = close


def release(out):
    """Frees what a load returned that the garbage collector does not (a peer's own buffers)."""
    getattr(out, "close", lambda: None)()


def _commit():
    """This checkout's commit (short), or None outside git."""
    here = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True,
                       text=True)
    return p.stdout.strip() or None


def record(chart, row, series, runs, **about):
    """With BENCH_JSON=PATH set, appends one JSON line to PATH: every run's figure (so that
    scripts/plot-bench draws the median and the min-max) of row in series of chart, with about
    (title, unit, better: "higher" or "lower") and where it came from (the script, the commit,
    the date, the machine). Appended, so that a bench's child processes add theirs to the same
    file; the tables on stdout stay as they are."""
    path = os.environ.get("BENCH_JSON")
    if not path:
        return
    rec = {"chart": chart, "row": row, "series": series, "runs": [float(x) for x in runs],
           "command": os.path.basename(sys.argv[0]), "commit": _commit(),
           "date": time.strftime("%Y-%m-%d", time.gmtime()), "machine": machine(), **about}
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")
