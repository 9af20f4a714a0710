#!/usr/bin/env python3
"""Writes the fuzzers' seed inputs: tiny checkpoints of every format, one directory per target.

Seeds are generated at `make fuzz` time rather than stored: torch.save (zip and legacy),
pickle.dumps of every protocol, the safetensors library, and `ckpt pack` over those. The files
of --corpus (../shared/corpus, real checkpoints from public repositories) are added when that
directory exists; it is only read. Files bigger than --max-len are left out: libFuzzer would cut
them short, which drops a zip's central directory.
"""
import argparse
import collections
import io
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile

import numpy as np
import torch
from safetensors.torch import save as st_save

SEP = b"\0FZ\0"  # fuzz_dir_files (common.c) splits an input into files here
TARGETS = ["safetensors", "sharded", "zip", "pickle", "torch_zip", "torch_legacy", "packfile",
           "source", "plan", "npy", "gguf", "pt2", "dcp", "s3_list", "s3_creds", "gcs_list", "sharemsg",
           "shareclient"]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH2 = os.path.join(REPO, ".deps", "torch2", "bin", "python")
DCP_WRITER = os.path.join(REPO, "tests", "integration", "dcp_writer.py")
PLAN_SELECTORS = b"\x00\x01\x02\x07"  # fuzz_plan.c: no only, a prefix, a glob, another prefix


def tensors():
    """Small tensors of many dtypes and layouts."""
    g = torch.Generator().manual_seed(1)
    base = torch.randn(3, 4, generator=g)
    return {
        "f32": base,
        "f16": base.half(),
        "bf16": base.bfloat16(),
        "f64": torch.arange(5, dtype=torch.float64),
        "i8": torch.tensor([-1, 2, 3], dtype=torch.int8),
        "u8": torch.tensor([1, 2, 250], dtype=torch.uint8),
        "i64": torch.arange(6).reshape(2, 3),
        "bool": torch.tensor([True, False]),
        "c64": torch.tensor([1 + 2j], dtype=torch.complex64),
        "scalar": torch.tensor(7.5),
        "empty": torch.zeros(0, 3),
    }


def torch_objects():
    """Objects for torch.save: state dicts, nested containers, views, shared storages."""
    t = tensors()
    lin = torch.nn.Linear(3, 2)
    big = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    shared = torch.arange(8, dtype=torch.float32)
    objs = {
        "state_dict": lin.state_dict(),
        "dtypes": t,
        "views": {"t": big.transpose(0, 2), "step": big[:, ::2], "expand": shared[:1].expand(4, 3),
                  "narrow": shared[2:5], "cl": torch.zeros(1, 2, 2, 2).to(
                      memory_format=torch.channels_last)},
        "tied": {"a": shared, "b": shared, "c": shared.view(2, 4)},
        "single": big,
        "nested": {"model": lin.state_dict(), "epoch": 7, "lr": 0.001, "name": "run-1",
                   "flag": True, "none": None, "raw": b"\x00\x01", "steps": [1, 2, (3, "x")],
                   3: "int key", 1.5: "float key", None: "none key", "dtype": torch.float16,
                   "od": collections.OrderedDict(a=torch.ones(2))},
        "param": {"p": torch.nn.Parameter(torch.ones(2, 2))},
        "optim": torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9).state_dict(),
    }
    return objs


def save_torch(obj, legacy, protocol=2):
    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=not legacy, pickle_protocol=protocol)
    return buf.getvalue()


def plain_pickles():
    """pickle.dumps of plain values under every protocol: the VM's own opcodes."""
    vals = [None, True, 12, -3, 2**40, 2**70 - 1, 1.25, "text", "ünï", b"bytes", bytearray(b"ba"),
            [1, [2, [3]]], (1,), (1, 2), (1, 2, 3), (), {"a": 1, "b": [1.0]}, {1, 2},
            collections.OrderedDict(x=1)]
    out = []
    for proto in range(0, pickle.HIGHEST_PROTOCOL + 1):
        for v in vals:
            try:
                out.append(pickle.dumps(v, protocol=proto))
            except Exception:
                pass
        shared = [1, 2]
        out.append(pickle.dumps({"x": shared, "y": shared}, protocol=proto))
    return out


def gguf_bytes(fill):
    """A GGUF file written by gguf-py's GGUFWriter, fill(writer) adding its keys and tensors."""
    import gguf
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "x.gguf")
        w = gguf.GGUFWriter(path, "llama")
        fill(w)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with open(path, "rb") as f:
            return f.read()


def gguf_seeds(corpus_files):
    """GGUF seeds: every key type and a tensor of several types; and each real GGUF file made
    small (arrays cut to 64 items, tensors to their first rows) with its own keys and types."""
    import gguf
    import numpy as np
    V, Q = gguf.GGUFValueType, gguf.GGMLQuantizationType

    def every_type(w):
        for i, vt in enumerate([V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.INT32, V.UINT64,
                                V.INT64]):
            w.add_key_value(f"k.int{i}", 7, vt)
            w.add_key_value(f"a.int{i}", [1, 2], V.ARRAY, sub_type=vt)
        w.add_key_value("k.f32", 0.5, V.FLOAT32)
        w.add_key_value("k.f64", 0.25, V.FLOAT64)
        w.add_key_value("k.bool", True, V.BOOL)
        w.add_key_value("k.str", "s", V.STRING)
        w.add_token_list(["a", "b", "\u00e9"])
        w.add_uint32("general.alignment", 64)
        w.add_tensor("blk.0.w", np.arange(12, dtype=np.float32).reshape(3, 4))
        w.add_tensor("h", np.arange(4, dtype=np.float16))
        w.add_tensor("q", gguf.quants.quantize(np.ones((2, 32), np.float32), Q.Q4_0),
                     raw_dtype=Q.Q4_0)
        w.add_tensor("k", np.zeros((1, 210), np.uint8), raw_dtype=Q.Q6_K)  # raw blocks
    out = {"gen_every_type.gguf": gguf_bytes(every_type)}
    for name, path in corpus_files:
        r = gguf.GGUFReader(path)

        def small(w, r=r):
            for f in r.fields.values():
                if f.name.startswith("GGUF.") or f.name == "general.architecture":
                    continue
                v = f.contents()
                if f.types[0] == V.ARRAY:
                    w.add_key_value(f.name, v[:64], V.ARRAY, sub_type=f.types[-1])
                else:
                    w.add_key_value(f.name, v, f.types[0])
            for t in r.tensors:
                w.add_tensor(t.name, np.ascontiguousarray(t.data[:2]), raw_dtype=t.tensor_type)
        out[f"corpus_{name}"] = gguf_bytes(small)
    return out


def pt2_seeds():
    """torch.export archives in the layout torch 2.x writes (tests/integration/test_pt2.py reads
    real ones; torch 1.13, which runs this, cannot export): a stored zip under one root folder,
    its configs naming each weight's record, dtype (ScalarType: 7 F32, 13 BF16, 5 I64), sizes,
    strides and storage offset."""
    def meta(dtype, sizes, strides, offset=0):
        return {"dtype": dtype, "sizes": [{"as_int": n} for n in sizes], "requires_grad": False,
                "device": {"type": "cpu", "index": None},
                "strides": [{"as_int": n} for n in strides],
                "storage_offset": {"as_int": offset}, "layout": 7}

    def archive(weights, constants):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
            z.writestr("m/archive_format", "pt2")
            z.writestr("m/byteorder", "little")
            for kind, items in (("weights", weights), ("constants", constants)):
                config = {}
                for i, (fqn, data, m) in enumerate(items):
                    path = f"{kind[:-1] if kind == 'weights' else 'tensor'}_{i}"
                    z.writestr(f"m/data/{kind}/{path}", data)
                    config[fqn] = {"path_name": path, "is_param": kind == "weights",
                                   "use_pickle": False, "tensor_meta": m}
                z.writestr(f"m/data/{kind}/model_{kind}_config.json",
                           json.dumps({"config": config}))
        return buf.getvalue()

    f32 = np.arange(12, dtype="<f4").tobytes()
    return {
        "gen_linear.pt2": archive(
            [("lin.weight", f32, meta(7, [3, 4], [4, 1])), ("lin.bias", f32[:12], meta(7, [3], [1])),
             ("t.weight", f32, meta(7, [4, 3], [1, 4])), ("bf", f32[:8], meta(13, [2, 2], [2, 1]))],
            [("c", np.arange(4, dtype="<i8").tobytes(), meta(5, [2], [1], 2))]),
        "gen_empty.pt2": archive([], []),
    }


def dcp_seeds():
    """DCP checkpoints written by torch 2.x (.deps/torch2: this Python's torch has no DCP of
    that form), each as fuzz_dcp.c takes it: the .metadata, then "NAME\\n" + each .distcp
    file. The pickles of the .metadata alone go to the pickle target too. None without it."""
    if not os.path.exists(TORCH2):
        return {}
    seeds = {}
    with tempfile.TemporaryDirectory() as tmp:
        for how, args in [("save", []), ("views", []), ("shared", ["3", "0"]),
                          ("sharded", ["2"])]:
            d = os.path.join(tmp, how)
            subprocess.run([TORCH2, DCP_WRITER, how, d, *args], check=True,
                           capture_output=True, timeout=300)
            with open(os.path.join(d, ".metadata"), "rb") as f:
                pieces = [f.read()]
            for name in sorted(os.listdir(d)):
                if name.endswith(".distcp"):
                    with open(os.path.join(d, name), "rb") as f:
                        pieces.append(name.encode() + b"\n" + f.read())
            seeds[how] = SEP.join(pieces)
    return seeds


def gcs_seeds():
    """fuzz_gcs_list.c's PREFIX\nPAGE inputs: objects.list pages in the JSON API's documented
    shape (written by Python's json), with and without a nextPageToken."""
    out = {}

    def page(prefix, names, token=None):
        body = {"kind": "storage#objects", "prefixes": [prefix + "sub/"],
                "items": [{"kind": "storage#object", "name": n, "bucket": "bucket",
                           "generation": "1714564800000000", "size": str(i * 1000)}
                          for i, n in enumerate(names)]}
        if token:
            body["nextPageToken"] = token
        return json.dumps(body)

    shards = [f"m/model-{i:05d}-of-00003.safetensors" for i in range(1, 4)]
    for name, prefix, names, token in [
            ("shards", "m/", shards + ["m/model.safetensors.index.json", "m/"], None),
            ("dcp", "ck/step-1/", [f"ck/step-1/__{i}_0.distcp" for i in range(4)] +
             ["ck/step-1/.metadata"], "Cgpjay9zdGVwLTEv"),
            ("escaped", "", ["a\"b <c>.bin", "\u00e9t\u00e9.pt"], None),
            ("empty", "none/", [], None)]:
        out[("gcs_list", f"gen_{name}")] = (prefix + "\n" + page(prefix, names, token)).encode()
    return out


def s3_seeds():
    """fuzz_s3_list.c's PREFIX\\nPAGE inputs, ListObjectsV2 pages in AWS's documented shape
    (keys escaped by Python's XML writer), and fuzz_s3_creds.c's inputs (a selector byte, then
    the container endpoint's JSON, STS's XML, an INI written by configparser, a URL)."""
    import configparser
    from xml.sax.saxutils import escape
    out = {}

    def page(prefix, keys, token=None):
        contents = "".join(
            f"<Contents><Key>{escape(k)}</Key><LastModified>2024-05-01T12:00:00.000Z"
            "</LastModified><ETag>&quot;9b2cf535f27731c974343645a3985328&quot;</ETag>"
            f"<Size>{i * 1000}</Size><StorageClass>STANDARD</StorageClass></Contents>"
            for i, k in enumerate(keys))
        more = (f"<IsTruncated>true</IsTruncated><NextContinuationToken>{escape(token)}"
                "</NextContinuationToken>" if token else "<IsTruncated>false</IsTruncated>")
        return (f'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns='
                f'"http://s3.amazonaws.com/doc/2006-03-01/"><Name>bucket</Name><Prefix>'
                f"{escape(prefix)}</Prefix><KeyCount>{len(keys)}</KeyCount><MaxKeys>1000"
                f"</MaxKeys><Delimiter>/</Delimiter>{more}{contents}<CommonPrefixes><Prefix>"
                f"{escape(prefix)}sub/</Prefix></CommonPrefixes></ListBucketResult>")

    shards = [f"m/model-{i:05d}-of-00003.safetensors" for i in range(1, 4)]
    for name, prefix, keys, token in [
            ("shards", "m/", shards + ["m/model.safetensors.index.json", "m/README.md"], None),
            ("dcp", "ck/step-1/", [f"ck/step-1/__{i}_0.distcp" for i in range(4)] +
             ["ck/step-1/.metadata"], "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM="),
            ("escaped", "", ["a&b <c>.bin", "it's \"q\".pt"], None),
            ("empty", "none/", [], None)]:
        out[("s3_list", f"gen_{name}")] = (prefix + "\n" + page(prefix, keys, token)).encode()
    creds = {"AccessKeyId": "ASIAIOSFODNN7EXAMPLE",
             "SecretAccessKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
             "Token": "IQoJb3JpZ2luX2VjEXAMPLE//////////wEaCXVzLWVhc3QtMSJHMEUCIQ==",
             "Expiration": "2024-05-01T18:00:00Z"}
    out[("s3_creds", "gen_container.json")] = b"\0" + json.dumps(creds).encode()
    out[("s3_creds", "gen_imds.json")] = b"\4" + json.dumps(
        dict(creds, Code="Success", LastUpdated="2024-05-01T12:00:00Z", Type="AWS-HMAC")).encode()
    sts = ("<AssumeRoleWithWebIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">"
           "<AssumeRoleWithWebIdentityResult><SubjectFromWebIdentityToken>system:serviceaccount:"
           "ns:sa</SubjectFromWebIdentityToken><Credentials>"
           f"<SessionToken>{creds['Token']}</SessionToken>"
           f"<SecretAccessKey>{creds['SecretAccessKey']}</SecretAccessKey>"
           f"<Expiration>{creds['Expiration']}</Expiration>"
           f"<AccessKeyId>{creds['AccessKeyId']}</AccessKeyId></Credentials>"
           "</AssumeRoleWithWebIdentityResult><ResponseMetadata><RequestId>ad4156e9</RequestId>"
           "</ResponseMetadata></AssumeRoleWithWebIdentityResponse>")
    out[("s3_creds", "gen_sts.xml")] = b"\1" + sts.encode()
    ini = configparser.ConfigParser()
    ini["default"] = {"aws_access_key_id": creds["AccessKeyId"],
                      "aws_secret_access_key": creds["SecretAccessKey"], "region": "us-west-2"}
    ini["profile lab"] = {"aws_access_key_id": "AKIDLAB", "aws_secret_access_key": "s",
                          "aws_session_token": creds["Token"]}
    buf = io.StringIO()
    ini.write(buf)
    for pick in range(8):
        out[("s3_creds", f"gen_ini_{pick}")] = b"\2" + bytes([pick]) + buf.getvalue().encode()
    for i, url in enumerate(["http://169.254.170.2/v2/credentials/5a6f", "http://[fd00:ec2::23]/",
                             "http://127.0.0.1:9911/creds", "http://127.0.0.1@10.0.0.1/",
                             "https://creds.example.com/x?y#z"]):
        out[("s3_creds", f"gen_url_{i}")] = b"\3" + url.encode()
    return out


def share_seeds():
    """Warm-attach messages (loader/sharemsg.h) behind selector byte 1, which has fuzz_sharemsg.c
    and fuzz_shareclient.c fix up their length and checksum (left 0 here): tables of a few
    tensors (tied, empty, each dtype code of a few), and a refusal; one table serves "/" with
    its identity on this machine, which fuzz_shareclient.c's selector 4 expects."""
    def s(b):
        return struct.pack("<I", len(b)) + b

    def message(kind, body):
        return b"\x01" + b"CKLSHARE" + struct.pack("<IIQ", 1, kind, 0) + body + bytes(8)

    def table(tensors, blobs, block, source=b"/models/m.safetensors",
              identity=(2049, 77, 4096, 1700000000, 5)):
        body = bytes(range(64)) + struct.pack("<IQ", 0, block) + s(source)
        body += struct.pack("<I", 1) + s(source) + struct.pack("<QQQqI", *identity)
        body += struct.pack("<I", len(blobs)) + b"".join(struct.pack("<QQ", *b) for b in blobs)
        body += struct.pack("<I", len(tensors))
        for name, code, shape, nbytes, blob in tensors:
            body += s(name) + struct.pack("<BB", code, len(shape))
            body += b"".join(struct.pack("<q", d) for d in shape) + struct.pack("<QI", nbytes, blob)
        return message(0, body)

    none = 0xFFFFFFFF
    yield "table", table([(b"a.w", 12, [4, 2], 32, 0), (b"b.tied", 12, [8], 32, 0),
                          (b"c", 9, [3], 6, 1), (b"empty", 12, [0, 2], 0, none)],
                         [(0, 32), (256, 6)], 262)
    yield "scalar", table([(b"s", 13, [], 8, 0)], [(0, 8)], 8)
    yield "refusal", message(1, struct.pack("<I", 13) + s(b"uid 65534 is not the server's"))
    root = os.stat("/")
    yield "root", table([(b"s", 13, [], 8, 0)], [(0, 8)], 8, b"/",
                        (root.st_dev, root.st_ino, root.st_size, root.st_mtime_ns // 10**9,
                         root.st_mtime_ns % 10**9))


def write(dirpath, name, data):
    os.makedirs(dirpath, exist_ok=True)
    with open(os.path.join(dirpath, name), "wb") as f:
        f.write(data)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--corpus", default="")
    ap.add_argument("--max-len", type=int, default=262144)
    a = ap.parse_args()
    seeds = {t: {} for t in TARGETS}

    def add(targets, name, data):
        if len(data) <= a.max_len:
            for t in targets:
                seeds[t][name] = data

    # safetensors, alone and as shard directories
    t = tensors()
    st_files = {
        "all": st_save({k: v.contiguous() for k, v in t.items() if k != "c64"},
                       metadata={"format": "pt", "k": "v"}),
        "one": st_save({"w": torch.ones(2, 2)}),
        "nometa": st_save({"a.b": torch.zeros(3, dtype=torch.int32), "a.c": torch.zeros(1)}),
    }
    for k, v in st_files.items():
        add(["safetensors", "source"], f"gen_{k}.safetensors", v)
    s1 = st_save({"layer.0.w": torch.ones(2), "layer.0.b": torch.zeros(1)})
    s2 = st_save({"layer.1.w": torch.ones(3, dtype=torch.float16)}, metadata={"format": "pt"})
    idx = (b'{"metadata": {"total_size": 14, "n": 1}, "weight_map": {'
           b'"layer.0.w": "model-00001-of-00002.safetensors", '
           b'"layer.0.b": "model-00001-of-00002.safetensors", '
           b'"layer.1.w": "model-00002-of-00002.safetensors"}}')
    add(["sharded"], "indexed", SEP.join([
        b"model.safetensors.index.json\n" + idx,
        b"model-00001-of-00002.safetensors\n" + s1,
        b"model-00002-of-00002.safetensors\n" + s2]))
    add(["sharded"], "listed", SEP.join([b"a.safetensors\n" + s1, b"b.safetensors\n" + s2]))
    add(["sharded"], "single", b"x.safetensors\n" + st_files["one"])

    # torch: zip and legacy, several pickle protocols
    for name, obj in torch_objects().items():
        for proto in (2, 4):
            z = save_torch(obj, legacy=False, protocol=proto)
            add(["torch_zip", "zip", "source"], f"gen_{name}_p{proto}.pt", z)
            with zipfile.ZipFile(io.BytesIO(z)) as zf:
                pkl = [n for n in zf.namelist() if n.endswith("data.pkl")][0]
                add(["pickle"], f"gen_{name}_p{proto}.pkl", zf.read(pkl))
        leg = save_torch(obj, legacy=True)
        add(["torch_legacy", "pickle", "source"], f"gen_{name}_legacy.pt", leg)
    for i, p in enumerate(plain_pickles()):
        add(["pickle"], f"plain_{i:03d}.pkl", p)

    # numpy: .npy of each format version and order, .npz stored and compressed
    arrays = {"f": np.arange(12, dtype="<f4").reshape(3, 4),
              "F": np.asfortranarray(np.arange(24, dtype="<i2").reshape(2, 3, 4)),
              "s": np.array(1.5), "e": np.zeros((0, 2), "|b1"), "c": np.ones(3, "<c16")}
    for k, arr in arrays.items():
        for version in ((1, 0), (2, 0), (3, 0)):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, arr, version=version)
            add(["npy", "source"], f"gen_{k}_v{version[0]}.npy", buf.getvalue())
    for save in (np.savez, np.savez_compressed):  # compressed: C order (Fortran is refused)
        buf = io.BytesIO()
        save(buf, **{("a/" + k if k == "F" else k):
                     v if save is np.savez else np.ascontiguousarray(v)
                     for k, v in arrays.items()}, big=np.arange(70000, dtype="<i4") % 251)
        add(["npy", "zip", "source"], f"gen_{save.__name__}.npz", buf.getvalue())

    # the real files
    if a.corpus and os.path.isdir(a.corpus):
        for name in sorted(os.listdir(a.corpus)):
            path = os.path.join(a.corpus, name)
            if not os.path.isfile(path) or name.endswith(".md"):
                continue
            with open(path, "rb") as f:
                data = f.read()
            targets = ["source"] + (["npy"] if name.endswith((".npy", ".npz")) else [])
            if data[:4] == b"PK\3\4":
                targets += ["zip", "torch_zip"]
                try:
                    with zipfile.ZipFile(io.BytesIO(data)) as zf:
                        for n in zf.namelist():
                            if n.endswith("data.pkl"):
                                add(["pickle"], f"corpus_{name}.pkl", zf.read(n))
                except zipfile.BadZipFile:
                    pass
            elif name.endswith(".safetensors"):
                targets += ["safetensors"]
                add(["sharded"], f"corpus_{name}", name.encode() + b"\n" + data)
            elif data[:1] == b"\x80":
                targets += ["torch_legacy", "pickle"]
            add(targets, f"corpus_{name}", data)

    # GGUF: written by gguf-py, and the corpus's files made small
    corpus_gguf = [(n, os.path.join(a.corpus, n)) for n in
                   (sorted(os.listdir(a.corpus)) if a.corpus and os.path.isdir(a.corpus) else [])
                   if n.endswith(".gguf")]
    for name, data in gguf_seeds(corpus_gguf).items():
        add(["gguf", "source"], name, data)

    for name, data in pt2_seeds().items():
        add(["pt2", "zip", "source"], name, data)

    for name, data in dcp_seeds().items():
        add(["dcp"], f"gen_{name}", data)
        add(["pickle"], f"gen_dcp_{name}.pkl", data.split(SEP)[0])
    for (target, name), data in {**s3_seeds(), **gcs_seeds()}.items():
        add([target], name, data)

    # packs of some of the above, written by our own tool
    with tempfile.TemporaryDirectory() as tmp:
        srcs = {k: v for k, v in seeds["source"].items() if k.startswith("gen_")}
        for name, data in sorted(srcs.items()):
            src = os.path.join(tmp, name)
            with open(src, "wb") as f:
                f.write(data)
            out = os.path.join(tmp, name + ".pack")
            p = subprocess.run([a.ckpt, "pack", src, out], capture_output=True)
            if p.returncode == 0:
                with open(out, "rb") as f:
                    packed = f.read()
                add(["packfile", "source"], name + ".pack", packed)
                for sel in PLAN_SELECTORS:
                    add(["plan"], f"{name}.{sel}.pack", bytes([sel]) + packed)
            else:
                print(f"gen_seeds: ckpt pack {name}: {p.stderr.decode().strip()}", file=sys.stderr)

    for name, data in share_seeds():
        add(["sharemsg"], name, data)
        for sel in (1, 3, 5, 7):  # fuzz_shareclient.c: fixed up; cuda:0; source "/"
            add(["shareclient"], f"{name}.{sel}", bytes([sel]) + data[1:])
    if os.path.isdir(a.out):
        shutil.rmtree(a.out)
    for target, files in seeds.items():
        for name, data in files.items():
            write(os.path.join(a.out, target), name, data)
        print(f"gen_seeds: {target}: {len(files)} seeds")


if __name__ == "__main__":
    main()
