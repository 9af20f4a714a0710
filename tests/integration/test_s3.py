"""s3:// sources against a real S3 server (s3lab: Ceph's radosgw on a one-node cluster the tests
start on 127.0.0.1): an object and a shard-set prefix read by `ckpt`, mounted and loaded with
ckload, every tensor's bytes against the safetensors library's reading of the local file; the
credentials from the environment and from the shared files; S3's error codes in one line; a
changed object an error, never a mix; and what mounting costs, from radosgw's own log."""
import json
import os
from pathlib import Path

import pytest

import netlab
import s3lab
from ckptfs_testlib import (client_env, TORCH2, check_mount, ckpt_bin, library_view, need_torch2, run,
                            write_safetensors)

BUCKET = "ckpt-tests"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    d = tmp_path_factory.mktemp("s3")
    with s3lab.S3Server(d) as srv:
        srv.create_bucket(BUCKET)
        local = d / "local"
        local.mkdir()
        tensors = netlab.sample_tensors()
        write_safetensors(local / "model.safetensors", tensors)
        srv.put(BUCKET, "one/model.safetensors", local / "model.safetensors")
        half = len(tensors) // 2
        names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
        write_safetensors(local / names[0], tensors[:half])
        write_safetensors(local / names[1], tensors[half:])
        weight_map = {t[0]: names[0] for t in tensors[:half]}
        weight_map.update({t[0]: names[1] for t in tensors[half:]})
        index = json.dumps({"metadata": {}, "weight_map": weight_map}).encode()
        for n in names:
            srv.put(BUCKET, f"shards/{n}", local / n)
        srv.put(BUCKET, "shards/model.safetensors.index.json", index)
        srv.put(BUCKET, "shards/README.md", b"not a checkpoint")
        srv.local = local
        srv.home = d / "home"
        srv.home.mkdir()
        yield srv


def env_for(srv, **over):
    """The environment of a client of srv: its endpoint and region, the keys in the
    environment unless over says otherwise, a HOME of its own (no stray ~/.aws)."""
    return client_env(
        dict(AWS_ENDPOINT_URL=srv.endpoint, AWS_REGION=srv.region,
             AWS_ACCESS_KEY_ID=srv.access_key, AWS_SECRET_ACCESS_KEY=srv.secret_key,
             HOME=str(srv.home), AWS_EC2_METADATA_DISABLED="true"),  # never 169.254.169.254
        ("AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_SESSION_TOKEN",
         "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION"), over)


def ckpt(srv, *args, **over):
    return run([ckpt_bin(), *map(str, args)], timeout=120, env=env_for(srv, **over))


def want(srv, name):
    return library_view(srv.local / name)[0]


def test_an_object_is_read_with_its_bytes(s3):
    tensors = want(s3, "model.safetensors")
    loc = f"s3://{BUCKET}/one/model.safetensors"
    p = ckpt(s3, "ls", "--json", loc)
    assert p.returncode == 0, p.stderr
    assert {t["name"] for t in json.loads(p.stdout)["tensors"]} == set(tensors)
    for name, (_, _, data) in tensors.items():
        p = ckpt(s3, "cat", loc, name)
        assert p.returncode == 0 and p.stdout == data, (name, p.stderr)


def test_a_prefix_is_its_shard_set(s3):
    """Opened with one listing, and at most 3 requests per shard, under 1 MiB."""
    tensors = {}
    for n in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        tensors.update(want(s3, n))
    since = s3.mark()
    p = ckpt(s3, "ls", "--json", f"s3://{BUCKET}/shards/")
    assert p.returncode == 0, p.stderr
    seen = s3.access(since)
    listings = [r for r in seen if "list-type=2" in r["uri"]]
    assert len(listings) == 1 and len(seen) - 1 <= 3 * 2 + 1, seen  # + the index file
    assert sum(r["bytes"] for r in seen) < 1 << 20, seen
    listed = json.loads(p.stdout)
    assert listed["format"] == "safetensors-sharded"
    assert {t["name"] for t in listed["tensors"]} == set(tensors)
    name, (_, _, data) = next(iter(tensors.items()))
    p = ckpt(s3, "cat", f"s3://{BUCKET}/shards/", name)
    assert p.returncode == 0 and p.stdout == data, p.stderr


def test_a_file_under_a_prefix_is_named_by_its_s3_location(s3, tmp_path, monkeypatch):
    """A shard that is not safetensors, a DCP checkpoint's .distcp that is missing: the line
    (ckpt's, ckload's) names that file as s3://BUCKET/KEY, as the prefix is named, never by the
    API's URL (the endpoint's address and the bucket's path on it)."""
    import subprocess
    import ckload
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    s3.put(BUCKET, f"badshard/{names[0]}", s3.local / names[0])
    (tmp_path / "junk").write_bytes(b"\x10" + b"\0" * 7 + b"not a safetensors header")
    s3.put(BUCKET, f"badshard/{names[1]}", tmp_path / "junk")
    weight_map = {t: n for n in names for t in want(s3, n)}
    s3.put(BUCKET, "badshard/model.safetensors.index.json",
           json.dumps({"metadata": {}, "weight_map": weight_map}).encode())
    torch2 = Path(__file__).parents[2] / ".deps" / "torch2" / "bin" / "python"
    d = tmp_path / "dcp"
    p = subprocess.run([str(torch2), str(Path(__file__).with_name("dcp_writer.py")), "save", d],
                       capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    distcp = sorted(f.name for f in d.iterdir() if f.suffix == ".distcp")
    for f in d.iterdir():
        if f.name != distcp[-1]:
            s3.put(BUCKET, f"dcp-lacking/{f.name}", f)
    for prefix, file in (("badshard/", names[1]), ("dcp-lacking/", distcp[-1])):
        named = f"s3://{BUCKET}/{prefix}{file}: "
        p = ckpt(s3, "ls", f"s3://{BUCKET}/{prefix}")
        line = p.stderr.decode()
        assert p.returncode == 1 and line.count("\n") == 1, line
        assert line.startswith("ckpt: " + named) and s3.endpoint not in line, line
        for k, v in env_for(s3).items():
            monkeypatch.setenv(k, v)
        with pytest.raises(RuntimeError) as e:
            ckload.load(f"s3://{BUCKET}/{prefix}", device="cpu")
        assert str(e.value).startswith("ckload: " + named), e.value
        assert s3.endpoint not in str(e.value)


def test_mounted(s3, mount, monkeypatch):
    tensors, metadata = library_view(s3.local / "model.safetensors")
    for k, v in env_for(s3).items():
        monkeypatch.setenv(k, v)
    before = s3.mark()
    with mount(f"s3://{BUCKET}/one/model.safetensors") as m:
        opened = s3.access(before)
        check_mount(m, tensors, metadata, "safetensors")
    assert len(opened) <= 3, opened  # a mount costs at most 3 requests per object


def test_ckload_loads_it(s3, monkeypatch):
    import ckload
    from ckptfs_testlib import torch_bytes
    for k, v in env_for(s3).items():
        monkeypatch.setenv(k, v)
    tensors = want(s3, "model.safetensors")
    sd = ckload.load(f"s3://{BUCKET}/one/model.safetensors", device="cpu")
    assert set(sd) == set(tensors)
    for name, (_, _, data) in tensors.items():
        assert torch_bytes(sd[name]) == data, name


def test_credentials_from_the_shared_files(s3, tmp_path):
    creds = tmp_path / "credentials"
    creds.write_text(f"[default]\naws_access_key_id = WRONG\naws_secret_access_key = WRONG\n"
                     f"[lab]\naws_access_key_id = {s3.access_key}\n"
                     f"aws_secret_access_key = {s3.secret_key}\n")
    loc = f"s3://{BUCKET}/one/model.safetensors"
    p = ckpt(s3, "ls", loc, AWS_ACCESS_KEY_ID=None, AWS_SECRET_ACCESS_KEY=None,
             AWS_SHARED_CREDENTIALS_FILE=str(creds), AWS_PROFILE="lab")
    assert p.returncode == 0, p.stderr
    p = ckpt(s3, "ls", loc, AWS_ACCESS_KEY_ID=None, AWS_SECRET_ACCESS_KEY=None,
             AWS_SHARED_CREDENTIALS_FILE=str(creds))
    assert p.returncode == 1 and p.stderr.count(b"\n") == 1, p.stderr
    assert b"InvalidAccessKeyId" in p.stderr or b"403" in p.stderr, p.stderr


@pytest.mark.parametrize("loc,over,says", [
    ("one/missing.safetensors", {}, "NoSuchKey"),
    ("one/model.safetensors", {"AWS_SECRET_ACCESS_KEY": "not-the-secret"},
     "403 (SignatureDoesNotMatch: check the secret key, the region and this machine's clock)"),
    ("shards-none/", {}, "holds no checkpoint file"),
])
def test_errors_say_s3s_code_in_one_line(s3, loc, over, says):
    p = ckpt(s3, "ls", f"s3://{BUCKET}/{loc}", **over)
    assert p.returncode == 1 and p.stdout == b"", p.stderr
    line = p.stderr.decode()
    assert line.count("\n") == 1 and line.startswith("ckpt: ") and says in line, line
    assert s3.secret_key not in line and "not-the-secret" not in line
    if not loc.endswith("/"):  # the object as it was named, not its API URL
        assert line.startswith(f"ckpt: s3://{BUCKET}/{loc}: "), line


def test_a_changed_object_is_an_error_never_a_mix(s3, mount, monkeypatch):
    for k, v in env_for(s3).items():
        monkeypatch.setenv(k, v)
    key = "changing/model.safetensors"
    s3.put(BUCKET, key, s3.local / "model.safetensors")
    tensors = want(s3, "model.safetensors")
    big = max(tensors, key=lambda n: len(tensors[n][2]))
    with mount(f"s3://{BUCKET}/{key}") as m:
        path = next(t["path"] for t in json.loads((m / ".ckptfs" / "index.json").read_text())
                    ["tensors"] if t["name"] == big)
        data = bytearray((s3.local / "model.safetensors").read_bytes())
        data[-1] ^= 0xFF  # same size, other bytes: another ETag
        s3.put(BUCKET, key, bytes(data))
        with pytest.raises(OSError):
            Path(m / path).read_bytes()


class CredentialEndpoint:
    """A loopback server in the wire formats AWS documents for credential providers: the
    container endpoint's JSON (ECS, EKS Pod Identity), IMDSv2's token, role and JSON, and STS
    AssumeRoleWithWebIdentity's XML,
    handing out the S3 server's keys; it records every request (path, query, headers)."""

    def __init__(self, s3, kind, expiration="2099-01-01T00:00:00Z", host="127.0.0.1",
                 redirect_to=None):
        import http.server
        import threading
        import urllib.parse
        self.requests, self.kind = [], kind
        keys = (s3.access_key, s3.secret_key)
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def answer(self, body, status=200):
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self):  # IMDSv2's session token
                outer.requests.append({"method": "PUT", "path": self.path,
                                       "headers": dict(self.headers)})
                ok = self.path == "/latest/api/token" and \
                    self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
                self.answer(b"imds-session-token" if ok else b"", 200 if ok else 400)

            def do_GET(self):
                url = urllib.parse.urlsplit(self.path)
                outer.requests.append({"method": "GET", "path": url.path,
                                       "query": dict(urllib.parse.parse_qsl(url.query)),
                                       "headers": dict(self.headers)})
                if redirect_to:  # every GET elsewhere (after IMDS's PUT, which is its own)
                    self.send_response(302)
                    self.send_header("Location", redirect_to + url.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if outer.kind == "imds":
                    if self.headers.get("X-aws-ec2-metadata-token") != "imds-session-token":
                        return self.answer(b"", 401)
                    base = "/latest/meta-data/iam/security-credentials/"
                    if url.path == base:
                        return self.answer(b"reader-role")
                    if url.path != base + "reader-role":
                        return self.answer(b"", 404)
                if outer.kind in ("container", "imds"):
                    body = json.dumps({"AccessKeyId": keys[0], "SecretAccessKey": keys[1],
                                       "Token": "container-session-token",
                                       "Expiration": expiration}).encode()
                else:
                    body = ("<AssumeRoleWithWebIdentityResponse xmlns=\"https://sts.amazonaws.com"
                            "/doc/2011-06-15/\"><AssumeRoleWithWebIdentityResult><Credentials>"
                            f"<AccessKeyId>{keys[0]}</AccessKeyId>"
                            f"<SecretAccessKey>{keys[1]}</SecretAccessKey>"
                            "<SessionToken>sts-session-token</SessionToken>"
                            "<Expiration>2099-01-01T00:00:00Z</Expiration></Credentials>"
                            "</AssumeRoleWithWebIdentityResult>"
                            "</AssumeRoleWithWebIdentityResponse>").encode()
                self.answer(body)

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://{host}:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(params=["container", "web_identity", "imds"])
def provider(request, s3, tmp_path):
    ep = CredentialEndpoint(s3, request.param)
    if request.param == "imds":
        over = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": ep.url, "AWS_EC2_METADATA_DISABLED": None}
    elif request.param == "container":
        token = tmp_path / "token"
        token.write_text("pod-identity-token\n")
        over = {"AWS_CONTAINER_CREDENTIALS_FULL_URI": ep.url + "/v1/credentials",
                "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": str(token)}
    else:
        jwt = tmp_path / "jwt"
        jwt.write_text("eyJhbGciOi.service-account.token")
        over = {"AWS_WEB_IDENTITY_TOKEN_FILE": str(jwt),
                "AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/reader",
                "AWS_ENDPOINT_URL_STS": ep.url}
    yield ep, dict(over, AWS_ACCESS_KEY_ID=None, AWS_SECRET_ACCESS_KEY=None)
    ep.close()


def test_temporary_credentials_from_an_endpoint(s3, provider):
    """The container endpoint (with its authorization token), STS web identity and EC2's
    instance metadata (IMDSv2: a session token first), in AWS's wire formats: the S3 server accepts what they hand out, and one process asks once for all
    its requests (the credentials are kept until shortly before they expire)."""
    ep, over = provider
    loc = f"s3://{BUCKET}/one/model.safetensors"
    tensors = want(s3, "model.safetensors")
    name, (_, _, data) = max(tensors.items(), key=lambda kv: len(kv[1][2]))
    p = ckpt(s3, "cat", loc, name, **over)
    assert p.returncode == 0 and p.stdout == data, p.stderr
    if ep.kind == "imds":  # a session token, the role, its credentials: once for all reads
        assert [(r["method"], r["path"]) for r in ep.requests] == [
            ("PUT", "/latest/api/token"), ("GET", "/latest/meta-data/iam/security-credentials/"),
            ("GET", "/latest/meta-data/iam/security-credentials/reader-role")], ep.requests
        assert ep.requests[0]["headers"]["X-aws-ec2-metadata-token-ttl-seconds"] == "21600"
        return
    assert len(ep.requests) == 1, ep.requests
    r = ep.requests[0]
    if ep.kind == "container":
        assert r["path"] == "/v1/credentials"
        assert r["headers"].get("Authorization") == "pod-identity-token"
    else:
        assert r["query"]["Action"] == "AssumeRoleWithWebIdentity"
        assert r["query"]["RoleArn"] == "arn:aws:iam::123456789012:role/reader"
        assert r["query"]["WebIdentityToken"] == "eyJhbGciOi.service-account.token"
        assert r["query"]["Version"] == "2011-06-15"
        assert "Authorization" not in r["headers"]


def test_a_credential_endpoint_that_fails_is_said(s3, tmp_path):
    over = {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None,
            "AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://10.1.2.3/creds"}
    p = ckpt(s3, "ls", f"s3://{BUCKET}/one/model.safetensors", **over)
    assert p.returncode == 1 and p.stderr.count(b"\n") == 1, p.stderr
    assert b"container credentials URL" in p.stderr, p.stderr


def no_keys(**over):
    return dict(over, AWS_ACCESS_KEY_ID=None, AWS_SECRET_ACCESS_KEY=None)


@pytest.fixture
def elsewhere(s3):
    """A second credential endpoint on 127.0.0.2, standing for another host: it hands out the
    S3 server's keys to anyone, so a request that reaches it would succeed; the tests check
    that none does, and that no token arrives there."""
    ep = CredentialEndpoint(s3, "container", host="127.0.0.2")
    yield ep
    ep.close()


@pytest.mark.parametrize("kind", ["container", "imds", "web_identity"])
def test_a_credential_request_follows_no_redirect(s3, tmp_path, elsewhere, kind):
    """A 302 from the credential endpoint to another origin (127.0.0.2): the container's
    Authorization token, IMDSv2's session token and STS's query never go there; the request
    fails in one line, as the SDKs do (they follow no redirect from these endpoints)."""
    ep = CredentialEndpoint(s3, kind, redirect_to=elsewhere.url)
    try:
        token = tmp_path / "token"
        token.write_text("pod-identity-token\n")
        jwt = tmp_path / "jwt"
        jwt.write_text("eyJhbGciOi.service-account.token")
        over = {"container": {"AWS_CONTAINER_CREDENTIALS_FULL_URI": ep.url + "/v1/credentials",
                              "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": str(token)},
                "imds": {"AWS_EC2_METADATA_SERVICE_ENDPOINT": ep.url,
                         "AWS_EC2_METADATA_DISABLED": None},
                "web_identity": {"AWS_WEB_IDENTITY_TOKEN_FILE": str(jwt),
                                 "AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/reader",
                                 "AWS_ENDPOINT_URL_STS": ep.url}}[kind]
        p = ckpt(s3, "ls", f"s3://{BUCKET}/one/model.safetensors", **no_keys(**over))
        assert ep.requests, "the endpoint was asked"
        assert elsewhere.requests == [], elsewhere.requests
        assert p.returncode == 1 and p.stderr.count(b"\n") == 1, p.stderr
        assert b"302" in p.stderr and b"redirect" in p.stderr, p.stderr
        assert b"pod-identity-token" not in p.stderr and b"imds-session" not in p.stderr
    finally:
        ep.close()


@pytest.mark.parametrize("full,relative", [
    ("http://127.0.0.1@{host}/creds", None),
    ("http://localhost:@{host}/creds", None),
    ("http://169.254.170.2:@{host}/creds", None),
    ("http://[::1]@{host}/creds", None),
    (None, ":@{host}/creds"),
    # a name, not an address, however it begins: DNS says where it goes (libcurl itself
    # sends *.localhost to 127.0.0.1, where `elsewhere` listens then, standing for DNS's answer)
    ("http://127.0.0.2.localhost:{port}/creds", None),
])
def test_a_container_url_is_judged_by_the_host_it_names(s3, tmp_path, full, relative):
    """The container credentials URL's host is the one libcurl connects to: userinfo that
    looks like the loopback, a relative URI that adds some, a name beginning "127." are each
    refused before any request, and the token goes nowhere."""
    elsewhere = CredentialEndpoint(s3, "container",
                                   host="127.0.0.1" if "localhost:{port}" in (full or "")
                                   else "127.0.0.2")
    try:
        check_refused(s3, tmp_path, elsewhere, full, relative)
    finally:
        elsewhere.close()


def check_refused(s3, tmp_path, elsewhere, full, relative):
    token = tmp_path / "token"
    token.write_text("pod-identity-token\n")
    host = f"127.0.0.2:{elsewhere.port}"
    over = {"AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": str(token)}
    if full:
        over["AWS_CONTAINER_CREDENTIALS_FULL_URI"] = full.format(host=host, port=elsewhere.port)
    else:
        over["AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"] = relative.format(host=host)
    p = ckpt(s3, "ls", f"s3://{BUCKET}/one/model.safetensors", **no_keys(**over))
    assert elsewhere.requests == [], elsewhere.requests
    assert p.returncode == 1 and p.stderr.count(b"\n") == 1, p.stderr
    assert b"container credentials" in p.stderr or b"RELATIVE_URI" in p.stderr, p.stderr


def test_a_container_url_on_the_loopback_by_its_address(s3, tmp_path):
    """What the SDKs allow still works: the loopback as an IP literal, and as localhost."""
    ep = CredentialEndpoint(s3, "container")
    try:
        for url in (f"http://127.0.0.1:{ep.port}/c", f"http://localhost:{ep.port}/c"):
            p = ckpt(s3, "ls", f"s3://{BUCKET}/one/model.safetensors",
                     **no_keys(AWS_CONTAINER_CREDENTIALS_FULL_URI=url))
            assert p.returncode == 0, (url, p.stderr)
    finally:
        ep.close()


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    """netlab's fault server as a path-style S3 endpoint (it ignores the signature): its root's
    BUCKET/model.safetensors is s3://BUCKET/model.safetensors."""
    root = tmp_path_factory.mktemp("faulty")
    (root / BUCKET).mkdir()
    path = write_safetensors(root / BUCKET / "model.safetensors", netlab.sample_tensors())
    with netlab.FileServer(root) as srv:
        yield srv, path


def faulty_ckpt(srv, *args):
    env = dict(os.environ, AWS_ENDPOINT_URL=srv.base, AWS_REGION="us-east-1",
               AWS_ACCESS_KEY_ID="AKIDEXAMPLE", AWS_SECRET_ACCESS_KEY="secret",
               CKPTFS_HTTP_BUDGET="5")
    return run([ckpt_bin(), *map(str, args)], timeout=120, env=env)


@pytest.mark.parametrize("code,s3_code", [(503, "SlowDown"), (500, "InternalError"),
                                          (503, "ServiceUnavailable")])
def test_s3s_transient_faults_are_retried_never_a_wrong_byte(faulty, code, s3_code):
    srv, path = faulty
    srv.clear()
    tensors = library_view(path)[0]
    name, (_, _, data) = max(tensors.items(), key=lambda kv: len(kv[1][2]))
    busy = srv.fault("status", code=code, s3_code=s3_code, times=2, methods=("GET",))
    p = faulty_ckpt(srv, "cat", f"s3://{BUCKET}/model.safetensors", name)
    assert p.returncode == 0 and p.stdout == data, p.stderr
    assert busy.hits == 2


@pytest.mark.parametrize("code,s3_code,says", [(503, "SlowDown", "503 (SlowDown)"),
                                               (400, "ExpiredToken", "400 (ExpiredToken: check the "
                                                "credentials: their session token has expired)")])
def test_s3s_lasting_faults_are_said_in_one_line(faulty, code, s3_code, says):
    """Throttling that never ends gives up within the bounded retries; an expired token is not
    retried; either says S3's code."""
    srv, _ = faulty
    srv.clear()
    srv.fault("status", code=code, s3_code=s3_code, methods=("GET",))
    p = faulty_ckpt(srv, "ls", f"s3://{BUCKET}/model.safetensors")
    assert p.returncode == 1 and p.stdout == b"", p.stderr
    line = p.stderr.decode()
    assert line.count("\n") == 1 and says in line, line
    assert line.startswith(f"ckpt: s3://{BUCKET}/model.safetensors: "), line


def test_a_public_object_unsigned(s3, tmp_path, mount, monkeypatch):
    """--no-sign-request (ckpt), -o anonymous (ckptfs): no signature whatever credentials are
    around, as a public bucket wants; radosgw serves a public-read object to anonymous
    requests and refuses them a private one."""
    s3.client().put_object(Bucket=BUCKET, Key="public/model.safetensors", ACL="public-read",
                           Body=(s3.local / "model.safetensors").read_bytes())
    wrong = {"AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    loc = f"s3://{BUCKET}/public/model.safetensors"
    assert ckpt(s3, "ls", loc, **wrong).returncode == 1  # signed with the wrong secret
    since = s3.mark()
    p = ckpt(s3, "--no-sign-request", "ls", loc, **wrong)
    assert p.returncode == 0, p.stderr
    assert all(r["user"] == "anonymous" for r in s3.access(since)), s3.access(since)
    p = ckpt(s3, "--no-sign-request", "ls", f"s3://{BUCKET}/one/model.safetensors", **wrong)
    assert p.returncode == 1 and b"AccessDenied" in p.stderr, p.stderr
    for k, v in env_for(s3, **wrong).items():
        monkeypatch.setenv(k, v)
    tensors, metadata = library_view(s3.local / "model.safetensors")
    with mount(loc, options=["anonymous"]) as m:
        check_mount(m, tensors, metadata, "safetensors")


def test_a_multipart_upload_reads_the_same(s3, monkeypatch):
    """boto3's transfer manager uploads in parts (an ETag "md5-N"): pinned and read as any."""
    etag = s3.put_file(BUCKET, "multipart/model.safetensors", s3.local / "model.safetensors")
    assert etag.strip('"').split("-")[-1].isdigit() and "-" in etag, etag
    tensors = want(s3, "model.safetensors")
    for name, (_, _, data) in list(tensors.items())[:4]:
        p = ckpt(s3, "cat", f"s3://{BUCKET}/multipart/model.safetensors", name)
        assert p.returncode == 0 and p.stdout == data, (name, p.stderr)


def test_credentials_about_to_expire_are_asked_again(s3, tmp_path):
    """Credentials that expire within the refresh margin (5 minutes) are not kept: each request
    that needs them asks the endpoint again, so a mount never signs with expired ones."""
    import datetime
    soon = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=2))
    ep = CredentialEndpoint(s3, "container", expiration=soon.strftime("%Y-%m-%dT%H:%M:%SZ"))
    try:
        over = {"AWS_CONTAINER_CREDENTIALS_FULL_URI": ep.url + "/creds",
                "AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None}
        tensors = want(s3, "model.safetensors")
        name, (_, _, data) = max(tensors.items(), key=lambda kv: len(kv[1][2]))
        p = ckpt(s3, "cat", f"s3://{BUCKET}/one/model.safetensors", name, **over)
        assert p.returncode == 0 and p.stdout == data, p.stderr
        assert len(ep.requests) >= 2, ep.requests  # the open and the read each asked
    finally:
        ep.close()


def test_the_disk_cache_keeps_an_objects_blocks(s3, tmp_path, mount, monkeypatch):
    """-o cache_dir: a second mount reads the blocks the first fetched from disk, asking
    radosgw for none of them (the key: the URL, which holds no secret, and the ETag)."""
    for k, v in env_for(s3).items():
        monkeypatch.setenv(k, v)
    cache = tmp_path / "cache"
    loc = f"s3://{BUCKET}/one/model.safetensors"
    tensors, metadata = library_view(s3.local / "model.safetensors")
    with mount(loc, options=[f"cache_dir={cache}"]) as m:
        check_mount(m, tensors, metadata, "safetensors")
    since = s3.mark()
    with mount(loc, options=[f"cache_dir={cache}"]) as m:
        check_mount(m, tensors, metadata, "safetensors")
    fetched = [r for r in s3.access(since) if r["range"] and r["range"] != "bytes=0-262143"]
    assert fetched == [], fetched
    names = " ".join(str(p) for p in cache.rglob("*"))
    assert s3.secret_key not in names and s3.access_key not in names


def test_a_prefix_holding_a_dcp_checkpoint(s3, tmp_path):
    """A torch.distributed.checkpoint directory uploaded under a prefix is read as one, with the
    bytes torch itself reads back."""
    import subprocess
    need_torch2()
    writer = Path(__file__).with_name("dcp_writer.py")
    d, exp = tmp_path / "dcp", tmp_path / "expect"
    for args in (("save", d), ("expect", d, exp)):
        p = subprocess.run([str(TORCH2), str(writer), *map(str, args)], capture_output=True,
                           timeout=300)
        assert p.returncode == 0, p.stderr.decode()[-2000:]
    for f in d.iterdir():
        s3.put(BUCKET, f"dcp/{f.name}", f)
    manifest = json.loads((exp / "manifest.json").read_text())
    p = ckpt(s3, "ls", "--json", f"s3://{BUCKET}/dcp/")
    assert p.returncode == 0, p.stderr
    listed = json.loads(p.stdout)
    assert listed["format"] == "dcp"
    assert {t["name"] for t in listed["tensors"]} == set(manifest["tensors"])
    for name, t in manifest["tensors"].items():
        p = ckpt(s3, "cat", f"s3://{BUCKET}/dcp/", name)
        assert p.returncode == 0 and p.stdout == (exp / t["file"]).read_bytes(), name


class ListingServer:
    """A loopback S3 endpoint (path-style, signatures ignored) whose ListObjectsV2 answers are
    page(n) for the n-th page asked (0 first), each carrying a continuation token until
    page(n) says it is the last; it counts the pages and bytes it served."""

    def __init__(self, page):
        import http.server
        import threading
        self.pages, self.bytes = 0, 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                body, last = page(outer.pages)
                outer.pages += 1
                head = "<IsTruncated>false</IsTruncated>" if last else \
                    f"<IsTruncated>true</IsTruncated><NextContinuationToken>t{outer.pages}" \
                    "</NextContinuationToken>"
                data = b"<ListBucketResult>" + head.encode() + body + b"</ListBucketResult>"
                outer.bytes += len(data)
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def ckpt_peak_rss(srv, *args):
    """`ckpt ARGS` against the listing server srv, and the child's peak RSS in KiB
    (getrusage's ru_maxrss, taken in a process of its own that runs nothing else)."""
    import subprocess
    import sys
    env = dict(os.environ, AWS_ENDPOINT_URL=srv.url, AWS_REGION="us-east-1",
               AWS_ACCESS_KEY_ID="AKIDEXAMPLE", AWS_SECRET_ACCESS_KEY="secret",
               AWS_EC2_METADATA_DISABLED="true", CKPTFS_HTTP_BUDGET="20")
    probe = ("import resource, subprocess, sys\n"
             "p = subprocess.run(sys.argv[1:], capture_output=True)\n"
             "sys.stdout.buffer.write(p.stderr)\n"
             "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    p = subprocess.run([sys.executable, "-c", probe, ckpt_bin(), *args], env=env,
                       capture_output=True, timeout=600)
    *stderr, last = p.stdout.decode().rstrip("\n").split("\n")
    rc, rss = map(int, last.split())
    return rc, "\n".join(stderr) + "\n", rss


KEY = b"<Contents><Key>p/k</Key><Size>1</Size></Contents>"
PAGE = S3_MAX_LISTING = 8 << 20  # s3.h: one page, at most


def test_a_huge_listing_is_refused_at_its_first_page_in_bounded_memory():
    """Pages of ~8 MiB holding 170,000 keys each: refused as the 100,001st key arrives, in the
    first page, not after many pages' time and memory, in one line
    that names the s3:// prefix; the client's peak RSS stays under 64 MiB."""
    srv = ListingServer(lambda n: (KEY * ((PAGE - 200) // len(KEY)), n == 19))
    try:
        rc, line, rss = ckpt_peak_rss(srv, "ls", f"s3://{BUCKET}/p/")
    finally:
        srv.close()
    assert rc == 1 and line.count("\n") == 1, line
    assert line == f"ckpt: s3://{BUCKET}/p/: lists more than 100000 objects\n", line
    assert srv.pages == 1, srv.pages
    assert rss < 64 << 10, f"peak RSS {rss} KiB"


def test_a_listings_bytes_are_bounded_across_its_pages():
    """Pages of 8 MiB holding one key each (the rest is a field S3 would keep short): the
    listing is refused once its pages pass 64 MiB in all, not after 100 of them (800 MiB)."""
    pad = b"<Owner><DisplayName>" + b"x" * (PAGE - 400) + b"</DisplayName></Owner>"
    srv = ListingServer(lambda n: (KEY + pad, n == 19))
    try:
        rc, line, rss = ckpt_peak_rss(srv, "ls", f"s3://{BUCKET}/p/")
    finally:
        srv.close()
    assert rc == 1 and line == f"ckpt: s3://{BUCKET}/p/: its listing is over 64 MiB\n", line
    assert srv.pages <= 9 and srv.bytes <= 72 << 20, (srv.pages, srv.bytes)
    assert rss < 64 << 10, f"peak RSS {rss} KiB"


def test_a_listing_that_fails_names_the_prefix(s3):
    p = ckpt(s3, "ls", "s3://no-such-bucket-39/p/")
    line = p.stderr.decode()
    assert p.returncode == 1 and line.count("\n") == 1, line
    assert line.startswith("ckpt: s3://no-such-bucket-39/p/: cannot list it (page 1): HTTP 404 "
                           "(NoSuchBucket)"), line


@pytest.mark.parametrize("length,says", [(900, "HTTP 404 (NoSuchKey)"),
                                         (10 << 10, "the key must")])
def test_a_long_keys_failure_names_it(s3, length, says):
    """A missing object whose key is 900 bytes (its API URL, encoded, is longer still): the line
    names s3://BUCKET/KEY whole (any S3 key fits, 1,024 bytes at most), then what is wrong; a
    10 KiB key s3:// refuses: named with its middle cut out, what is wrong after it."""
    key = "d/" + "%03d-" % 7 * (length // 4) + "end.safetensors"
    p = ckpt(s3, "ls", f"s3://{BUCKET}/{key}")
    line = p.stderr.decode()
    assert p.returncode == 1 and line.count("\n") == 1, line
    if length <= 1024:
        assert line.startswith(f"ckpt: s3://{BUCKET}/{key}: ") and says in line, line
        return
    head, _, rest = line.partition("...")
    assert head.startswith(f"ckpt: s3://{BUCKET}/d/007-007-"), line
    assert "end.safetensors: " in rest and says in rest, line
