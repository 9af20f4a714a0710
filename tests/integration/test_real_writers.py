"""Files that other writers really produce, read as their own libraries read them (issue 26):
MLX's `"__metadata__": null`, numpy's Python 2 `L` dims, big-endian `.npy`, and `.npz`
archives with members that are not tensors. Each fixture is made by its writer where it runs
here (numpy), or byte by byte per the spec where it does not (MLX)."""
import json
import subprocess

from ckptfs_testlib import ckpt_bin, library_view, raw_file, read_index


def ckpt_json(src):
    p = subprocess.run([ckpt_bin(), "ls", src, "--json"], capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_null_metadata_as_mlx_writes_it(tmp_path, mount):
    """MLX writes "__metadata__": null when it is given no metadata; the safetensors library
    reads such a file (metadata() is None), and so does ckptfs."""
    text = '{"__metadata__":null,"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    src = raw_file(tmp_path / "mlx.safetensors", text + " " * (-len(text) % 8),
                   bytes(range(8)))
    from safetensors import safe_open
    with safe_open(str(src), framework="numpy") as f:
        assert f.metadata() is None
    tensors, _ = library_view(src)
    got = ckpt_json(src)
    assert got["metadata"] == {}
    assert [t["name"] for t in got["tensors"]] == list(tensors)
    with mount(src) as mnt:
        assert (mnt / "w").read_bytes() == tensors["w"][2]
        assert read_index(mnt)["metadata"] == {}
