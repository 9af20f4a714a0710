"""gs:// sources: Google Cloud Storage's JSON API against gcp-storage-emulator (PyPI), started by
the tests on 127.0.0.1, with google-cloud-storage (Google's own client) uploading and, as the
independent reader, downloading what ckptfs reads: an object, a prefix of safetensors shards, of
.bin shards and a DCP directory, read by `ckpt`, mounted and loaded with ckload; a replaced
object an error, never a mix. The credentials (a service account key: an RS256 JWT the tests'
token server verifies with the key's public half; an authorized_user's refresh token; the
metadata server) against small loopback servers of the tests' own, in front of a storage
server of their own that wants the token: the token goes to the storage origin alone, never
across a redirect, and no secret is ever in a message."""
import base64
import io
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import netlab
from ckptfs_testlib import (client_env, check_mount, ckpt_bin, library_view, need_module, run, torch_bytes,
                            write_safetensors)

need_module("gcp_storage_emulator")
storage = need_module("google.cloud.storage")

BUCKET = "ckpt-tests"
SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
BINS = ["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"]


class Emulator:
    def __init__(self, d):
        self.port = netlab.free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
             "--port", str(self.port), "--in-memory", "-q"], cwd=d,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        netlab.wait_listening("127.0.0.1", self.port, self.proc)
        from google.auth.credentials import AnonymousCredentials
        os.environ["STORAGE_EMULATOR_HOST"] = self.endpoint  # how the client finds it
        self.client = storage.Client(project="ckptfs", credentials=AnonymousCredentials())
        self.bucket = self.client.create_bucket(BUCKET)

    def put(self, name, data):
        blob = self.bucket.blob(name)
        if isinstance(data, Path):
            blob.upload_from_filename(str(data))
        else:
            blob.upload_from_string(data)

    def get(self, name):
        """The object's bytes as google-cloud-storage downloads them."""
        return self.bucket.blob(name).download_as_bytes()

    def close(self):
        os.environ.pop("STORAGE_EMULATOR_HOST", None)
        netlab.stop_process(self.proc)


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    d = tmp_path_factory.mktemp("gcs")
    em = Emulator(d)
    try:
        local = d / "local"
        local.mkdir()
        tensors = netlab.sample_tensors()
        write_safetensors(local / "model.safetensors", tensors)
        em.put("one/model.safetensors", local / "model.safetensors")
        half = len(tensors) // 2
        write_safetensors(local / SHARDS[0], tensors[:half])
        write_safetensors(local / SHARDS[1], tensors[half:])
        weight_map = {t[0]: SHARDS[0] for t in tensors[:half]}
        weight_map.update({t[0]: SHARDS[1] for t in tensors[half:]})
        for n in SHARDS:
            em.put(f"shards/{n}", local / n)
        em.put("shards/model.safetensors.index.json",
               json.dumps({"metadata": {}, "weight_map": weight_map}).encode())
        em.put("shards/README.md", b"not a checkpoint")
        em.put("shards/deeper/model.safetensors", local / "model.safetensors")
        em.local = local
        em.home = d / "home"
        em.home.mkdir()
        yield em
    finally:
        em.close()


def env_for(em, **over):
    """A client's environment: the emulator, a HOME of its own, no Google credentials."""
    return client_env(dict(STORAGE_EMULATOR_HOST=em.endpoint, HOME=str(em.home)),
                      ("GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG", "CKPTFS_GCS_ENDPOINT",
                       "GCE_METADATA_HOST"), over)


def ckpt(env, *args):
    return run([ckpt_bin(), *map(str, args)], timeout=120, env=env)


def downloaded(em, name, tmp):
    """What the safetensors library reads of the object as google-cloud-storage downloads it."""
    p = tmp / name.replace("/", "_")
    p.write_bytes(em.get(name))
    return library_view(p)


def test_an_object_is_read_with_the_bytes_google_downloads(gcs, tmp_path):
    tensors, _ = downloaded(gcs, "one/model.safetensors", tmp_path)
    loc = f"gs://{BUCKET}/one/model.safetensors"
    p = ckpt(env_for(gcs), "ls", "--json", loc)
    assert p.returncode == 0, p.stderr
    assert {t["name"] for t in json.loads(p.stdout)["tensors"]} == set(tensors)
    for name, (_, _, data) in tensors.items():
        p = ckpt(env_for(gcs), "cat", loc, name)
        assert p.returncode == 0 and p.stdout == data, (name, p.stderr)


def test_a_prefix_is_its_shard_set(gcs, tmp_path):
    tensors = {}
    for n in SHARDS:
        tensors.update(downloaded(gcs, f"shards/{n}", tmp_path)[0])
    p = ckpt(env_for(gcs), "ls", "--json", f"gs://{BUCKET}/shards/")
    assert p.returncode == 0, p.stderr
    listed = json.loads(p.stdout)
    assert listed["format"] == "safetensors-sharded"
    assert {t["name"] for t in listed["tensors"]} == set(tensors)
    for name, (_, _, data) in list(tensors.items())[:4]:
        p = ckpt(env_for(gcs), "cat", f"gs://{BUCKET}/shards/", name)
        assert p.returncode == 0 and p.stdout == data, p.stderr


def test_bin_shards_under_a_prefix(gcs, tmp_path, monkeypatch):
    """Hugging Face's .bin shards and their index, loaded as torch.load reads each shard that
    google-cloud-storage downloads."""
    import torch
    import ckload
    g = torch.Generator().manual_seed(5)
    parts = [{"a.weight": torch.randn(64, 32, generator=g), "a.bias": torch.randn(64, generator=g)},
             {"b.weight": torch.randn(16, 64, generator=g).to(torch.float16)}]
    weight_map = {}
    for n, sd in zip(BINS, parts):
        buf = io.BytesIO()
        torch.save(sd, buf)
        gcs.put(f"bins/{n}", buf.getvalue())
        weight_map.update({k: n for k in sd})
    gcs.put("bins/pytorch_model.bin.index.json",
            json.dumps({"metadata": {}, "weight_map": weight_map}).encode())
    want = {}
    for n in BINS:
        want.update(torch.load(io.BytesIO(gcs.get(f"bins/{n}"))))
    for k, v in env_for(gcs).items():
        monkeypatch.setenv(k, v)
    sd = ckload.load(f"gs://{BUCKET}/bins/", device="cpu")
    assert set(sd) == set(want)
    for name, t in want.items():
        assert sd[name].dtype == t.dtype and torch_bytes(sd[name]) == torch_bytes(t), name


def test_a_dcp_directory_under_a_prefix(gcs, tmp_path_factory):
    from ckptfs_testlib import need_torch2
    need_torch2()
    from test_dcp import expected_bytes, written
    d, manifest, exp = written(tmp_path_factory, "save")
    for f in d.iterdir():
        gcs.put(f"dcp/{f.name}", f)
    p = ckpt(env_for(gcs), "ls", "--json", f"gs://{BUCKET}/dcp/")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["format"] == "dcp"
    for name, t in list(manifest["tensors"].items())[:4]:
        p = ckpt(env_for(gcs), "cat", f"gs://{BUCKET}/dcp/", name)
        assert p.returncode == 0 and p.stdout == expected_bytes(exp, t), (name, p.stderr)


def test_mounted(gcs, mount, monkeypatch, tmp_path):
    tensors, metadata = downloaded(gcs, "one/model.safetensors", tmp_path)
    for k, v in env_for(gcs).items():
        monkeypatch.setenv(k, v)
    with mount(f"gs://{BUCKET}/one/model.safetensors") as m:
        check_mount(m, tensors, metadata, "safetensors")


def test_ckload_loads_it(gcs, monkeypatch, tmp_path):
    import ckload
    tensors, _ = downloaded(gcs, "one/model.safetensors", tmp_path)
    for k, v in env_for(gcs).items():
        monkeypatch.setenv(k, v)
    sd = ckload.load(f"gs://{BUCKET}/one/model.safetensors", device="cpu")
    assert set(sd) == set(tensors)
    for name, (_, _, data) in tensors.items():
        assert torch_bytes(sd[name]) == data, name


@pytest.mark.parametrize("loc,says", [
    ("one/missing.safetensors", "cannot open: HTTP 404"),
    ("none/", "holds no checkpoint file"),
    ("a/../b", "segments"),
])
def test_errors_in_one_line(gcs, loc, says):
    p = ckpt(env_for(gcs), "ls", f"gs://{BUCKET}/{loc}")
    assert p.returncode == 1 and p.stdout == b"", p.stderr
    line = p.stderr.decode()
    assert line.count("\n") == 1 and says in line, line
    assert line.startswith(f"ckpt: gs://{BUCKET}/{loc}: ") and gcs.endpoint not in line, line


def test_a_replaced_object_is_an_error_never_a_mix(gcs, mount, monkeypatch):
    """The emulator answers media reads whatever ifGenerationMatch says (real GCS answers 412):
    the object is replaced by one of another size, which the reads' Content-Range tells."""
    for k, v in env_for(gcs).items():
        monkeypatch.setenv(k, v)
    name = "changing/model.safetensors"
    gcs.put(name, gcs.local / "model.safetensors")
    tensors, _ = library_view(gcs.local / "model.safetensors")
    big = max(tensors, key=lambda n: len(tensors[n][2]))
    with mount(f"gs://{BUCKET}/{name}") as m:
        path = next(t["path"] for t in json.loads((m / ".ckptfs" / "index.json").read_text())
                    ["tensors"] if t["name"] == big)
        gcs.put(name, (gcs.local / "model.safetensors").read_bytes() + b"\0" * 4096)
        with pytest.raises(OSError):
            Path(m / path).read_bytes()


# --- credentials, against the tests' own servers -------------------------------------------

TOKEN = "ya29.ckptfs-test-access-token-never-printed"


class Server:
    """A loopback HTTP server whose handler is `route(self, handler)`; it records every
    request (method, path, query, headers, form)."""

    def __init__(self, route):
        self.requests, self.route = [], route
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def answer(self, status, body=b"", headers=()):
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def handle_any(self):
                url = urllib.parse.urlsplit(self.path)
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n).decode() if n else ""
                self.req = {"method": self.command, "path": urllib.parse.unquote(url.path),
                            "query": dict(urllib.parse.parse_qsl(url.query)),
                            "headers": dict(self.headers),
                            "form": dict(urllib.parse.parse_qsl(body)), "raw": body}
                outer.requests.append(self.req)
                outer.route(outer, self)

            do_GET = do_POST = handle_any

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def storage_route(data, cdn=None, objects=None, pages=None, state=None):
    """A JSON API wanting TOKEN: the object gs://bkt/m.safetensors (data, generation 7) and any
    of objects ({name: bytes}); media reads sent on to cdn when given (a redirect to another
    origin); a listing of pages ({prefix: [names of page 1, names of page 2, ...]}), page n+1
    asked with pageToken "page-n+1". state, when given, holds the generation ("gen") and the
    bytes ("data") of m.safetensors, which a test may replace while it is read."""
    objects = dict(objects or {}, **{"m.safetensors": data})
    state = state if state is not None else {}

    def route(srv, h):
        if h.headers.get("Authorization") != f"Bearer {TOKEN}" and srv is not cdn:
            return h.answer(401, json.dumps({"error": {"code": 401, "message": "Invalid",
                                                       "errors": [{"reason": "authError"}]}}
                                            ).encode())
        q, path = h.req["query"], h.req["path"]
        if path == "/storage/v1/b/bkt/o" and q.get("prefix") in (pages or {}):
            listed = pages[q["prefix"]]
            n = int(q.get("pageToken", "page-0").split("-")[1])
            body = {"kind": "storage#objects",
                    "items": [{"name": q["prefix"] + x, "generation": "7"} for x in listed[n]]}
            if n + 1 < len(listed):
                body["nextPageToken"] = f"page-{n + 1}"
            return h.answer(200, json.dumps(body).encode())
        name = path[len("/storage/v1/b/bkt/o/"):]
        if not path.startswith("/storage/v1/b/bkt/o/") or name not in objects:
            return h.answer(404)
        gen = state.get("gen", "7") if name == "m.safetensors" else "7"
        obj = state.get("data", objects[name]) if name == "m.safetensors" else objects[name]
        if q.get("alt") != "media":
            return h.answer(200, json.dumps({"name": name, "generation": gen,
                                             "size": str(len(obj))}).encode())
        if q.get("ifGenerationMatch", gen) != gen:  # as the JSON API answers a precondition
            return h.answer(412)
        if cdn and srv is not cdn:
            return h.answer(302, headers=[("Location", cdn.url + h.path)])
        first, last = netlab.parse_range(h.headers["Range"], len(obj))
        h.answer(206, obj[first:last + 1],
                 [("Content-Range", f"bytes {first}-{last}/{len(obj)}")])
    return route


@pytest.fixture
def stored(tmp_path):
    tensors = netlab.sample_tensors()[:6]
    write_safetensors(tmp_path / "m.safetensors", tensors)
    data = (tmp_path / "m.safetensors").read_bytes()
    return data, library_view(tmp_path / "m.safetensors")[0]


def service_account(tmp_path, token_uri):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    f = tmp_path / "key.json"
    f.write_text(json.dumps({"type": "service_account", "project_id": "p",
                             "private_key_id": "kid-1", "private_key": pem,
                             "client_email": "reader@p.iam.gserviceaccount.com",
                             "token_uri": token_uri}))
    return f, key.public_key(), pem


def b64url(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def token_route(check):
    def route(srv, h):
        ok = h.req["method"] == "POST" and check(h.req)
        h.answer(200 if ok else 400, json.dumps({"access_token": TOKEN, "expires_in": 3599,
                                                 "token_type": "Bearer"} if ok else
                                                {"error": "invalid_grant"}).encode())
    return route


def verify_jwt(public_key, token_uri):
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    from cryptography.exceptions import InvalidSignature

    def check(req):
        f = req["form"]
        if f.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            return False
        head, claims, sig = f["assertion"].split(".")
        try:
            public_key.verify(b64url(sig), f"{head}.{claims}".encode(), padding.PKCS1v15(),
                              hashes.SHA256())
        except InvalidSignature:
            return False
        h, c = json.loads(b64url(head)), json.loads(b64url(claims))
        now = time.time()
        return (h == {"alg": "RS256", "typ": "JWT", "kid": "kid-1"} and
                c["iss"] == "reader@p.iam.gserviceaccount.com" and c["aud"] == token_uri and
                c["scope"] == "https://www.googleapis.com/auth/devstorage.read_only" and
                abs(c["iat"] - now) < 600 and c["exp"] - c["iat"] == 3600)
    return check


def google_env(home, endpoint, **over):
    env = dict(os.environ, HOME=str(home), CKPTFS_GCS_ENDPOINT=endpoint,
               GCE_METADATA_HOST=f"127.0.0.1:{netlab.free_port()}")  # never 169.254.169.254
    for k in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG"):
        env.pop(k, None)
    env.update({k: v for k, v in over.items() if v is not None})
    return env


def read_all(env, tensors):
    loc = "gs://bkt/m.safetensors"
    p = ckpt(env, "ls", "--json", loc)
    assert p.returncode == 0, p.stderr
    name, (_, _, data) = max(tensors.items(), key=lambda kv: len(kv[1][2]))
    p = ckpt(env, "cat", loc, name)
    assert p.returncode == 0 and p.stdout == data, p.stderr


def only_storage_saw_the_token(store, *others):
    assert store.requests and all(r["headers"].get("Authorization") == f"Bearer {TOKEN}"
                                  for r in store.requests), store.requests
    for o in others:
        assert all(TOKEN not in json.dumps(r) for r in o.requests), o.requests


def test_a_service_account_key_signs_a_jwt_for_its_token(stored, tmp_path):
    data, tensors = stored
    store = Server(storage_route(data))
    tok = Server(lambda srv, h: None)
    key, public, pem = service_account(tmp_path, tok.url + "/token")
    tok.route = token_route(verify_jwt(public, tok.url + "/token"))
    try:
        env = google_env(tmp_path, store.url, GOOGLE_APPLICATION_CREDENTIALS=str(key))
        read_all(env, tensors)
        assert [r["path"] for r in tok.requests] == ["/token", "/token"]  # once a process
        only_storage_saw_the_token(store, tok)
        # A wrong key: one line, no secret in it.
        (tmp_path / "o").mkdir()
        other, _, other_pem = service_account(tmp_path / "o", tok.url + "/token")
        p = ckpt(dict(env, GOOGLE_APPLICATION_CREDENTIALS=str(other)), "ls",
                 "gs://bkt/m.safetensors")
        line = p.stderr.decode()
        assert p.returncode == 1 and line.count("\n") == 1, line
        assert "no token from the key file" in line and "400" in line, line
        for secret in (TOKEN, pem.splitlines()[1], other_pem.splitlines()[1]):
            assert secret not in line
    finally:
        store.close()
        tok.close()


def test_an_authorized_user_refresh_token_from_gclouds_file(stored, tmp_path):
    data, tensors = stored
    store = Server(storage_route(data))
    tok = Server(token_route(lambda r: r["form"] == {
        "grant_type": "refresh_token", "client_id": "cid", "client_secret": "csecret-never",
        "refresh_token": "1//refresh-never-printed"}))
    cfg = tmp_path / "gcloud"
    cfg.mkdir()
    (cfg / "application_default_credentials.json").write_text(json.dumps({
        "type": "authorized_user", "client_id": "cid", "client_secret": "csecret-never",
        "refresh_token": "1//refresh-never-printed", "token_uri": tok.url + "/token"}))
    try:
        read_all(google_env(tmp_path, store.url, CLOUDSDK_CONFIG=str(cfg)), tensors)
        only_storage_saw_the_token(store, tok)
        # A refresh token the endpoint refuses: one line, neither secret in it.
        wrong = tmp_path / "wrong.json"
        wrong.write_text(json.dumps({
            "type": "authorized_user", "client_id": "cid", "client_secret": "csecret-never",
            "refresh_token": "1//refresh-other-never-printed", "token_uri": tok.url + "/token"}))
        p = ckpt(google_env(tmp_path, store.url, GOOGLE_APPLICATION_CREDENTIALS=str(wrong)),
                 "ls", "gs://bkt/m.safetensors")
        line = p.stderr.decode()
        assert p.returncode == 1 and line.count("\n") == 1, line
        assert "no token from the key file" in line and "400" in line, line
        for secret in ("csecret-never", "refresh-other-never-printed", TOKEN):
            assert secret not in line, line
    finally:
        store.close()
        tok.close()


def test_the_metadata_server_and_no_redirect_carries_the_token(stored, tmp_path):
    """GKE/GCE's metadata server (its header asked for), then media reads the storage server
    redirects to another origin: the token stays behind."""
    data, tensors = stored
    md = Server(lambda srv, h: h.answer(*(
        (200, json.dumps({"access_token": TOKEN, "expires_in": 3599}).encode())
        if h.req["path"] == "/computeMetadata/v1/instance/service-accounts/default/token" and
        h.headers.get("Metadata-Flavor") == "Google" else (403,))))
    cdn = Server(lambda srv, h: None)
    store = Server(storage_route(data, cdn))
    cdn.route = storage_route(data, cdn)
    try:
        env = google_env(tmp_path, store.url, GCE_METADATA_HOST=md.url[len("http://"):])
        read_all(env, tensors)
        assert cdn.requests, "the media reads went to the other origin"
        assert all("Authorization" not in r["headers"] for r in cdn.requests), cdn.requests
        assert all(TOKEN not in json.dumps(r) for r in cdn.requests)
        assert all(r["headers"].get("Authorization") == f"Bearer {TOKEN}"
                   for r in store.requests), store.requests
    finally:
        for s in (md, cdn, store):
            s.close()


def test_without_credentials_a_refusal_says_the_reason_and_no_secret(stored, tmp_path):
    """Nothing found (no key, no gcloud file, no metadata server): requests go without a token,
    and the storage server's refusal is one line with its reason."""
    data, _ = stored
    store = Server(storage_route(data))
    try:
        p = ckpt(google_env(tmp_path, store.url), "ls", "gs://bkt/m.safetensors")
        line = p.stderr.decode()
        assert p.returncode == 1 and line.count("\n") == 1, line
        assert "401 (authError)" in line and line.startswith("ckpt: gs://bkt/m.safetensors: "), line
        assert all("Authorization" not in r["headers"] for r in store.requests)
    finally:
        store.close()


def test_a_listing_over_pages_with_the_token(gcs, tmp_path):
    """A prefix listed over three pages (pageToken), every page and shard asked with the token
    the metadata server gave."""
    local = gcs.local
    objects = {f"p/{n}": (local / n).read_bytes() for n in SHARDS}
    tensors = {}
    for n in SHARDS:
        tensors.update(library_view(local / n)[0])
    md = Server(lambda srv, h: h.answer(200, json.dumps({"access_token": TOKEN,
                                                         "expires_in": 3599}).encode()))
    store = Server(storage_route(b"", objects=objects,
                                 pages={"p/": [[SHARDS[0]], ["README.md"], [SHARDS[1]]]}))
    try:
        env = google_env(tmp_path, store.url, GCE_METADATA_HOST=md.url[len("http://"):])
        p = ckpt(env, "ls", "--json", "gs://bkt/p/")
        assert p.returncode == 0, p.stderr
        listed = json.loads(p.stdout)
        assert listed["format"] == "safetensors-sharded"
        assert {t["name"] for t in listed["tensors"]} == set(tensors)
        lists = [r["query"].get("pageToken") for r in store.requests
                 if r["path"] == "/storage/v1/b/bkt/o"]
        assert lists == [None, "page-1", "page-2"], lists
        only_storage_saw_the_token(store, md)
    finally:
        md.close()
        store.close()


def test_a_new_generation_fails_the_read_never_a_mix(stored, tmp_path, mount, monkeypatch):
    """The object replaced by one of the same size, other bytes, a new generation, while
    mounted: the storage server answers the reads pinned to the old one with 412, as the JSON
    API does, and the read fails."""
    data, tensors = stored
    state = {}
    md = Server(lambda srv, h: h.answer(200, json.dumps({"access_token": TOKEN,
                                                         "expires_in": 3599}).encode()))
    store = Server(storage_route(data, state=state))
    try:
        env = google_env(tmp_path, store.url, GCE_METADATA_HOST=md.url[len("http://"):])
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        for k in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG"):
            monkeypatch.delenv(k, raising=False)
        big = max(tensors, key=lambda n: len(tensors[n][2]))
        with mount("gs://bkt/m.safetensors") as m:
            path = next(t["path"] for t in json.loads((m / ".ckptfs" / "index.json")
                                                      .read_text())["tensors"]
                        if t["name"] == big)
            state.update(gen="8", data=bytes(b ^ 0xFF for b in data))
            with pytest.raises(OSError):
                Path(m / path).read_bytes()
        assert any(r["query"].get("ifGenerationMatch") == "7" for r in store.requests)
    finally:
        md.close()
        store.close()
