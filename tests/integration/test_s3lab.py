"""The loopback S3 server (s3lab: radosgw on a one-node Ceph cluster) and what it really does:
the facts the `s3://` client is written against. Requests are signed by curl's own
SigV4 (`--aws-sigv4`), objects are uploaded by boto3: neither is ckptfs's code."""
import hashlib
import os
import random
import subprocess
import urllib.parse
from pathlib import Path

import pytest

import s3lab
from netlab import plain_env

MiB = 1 << 20
BUCKET = "s3lab-smoke"


def _q(value):
    """A query value as SigV4's canonical query has it: everything but A-Za-z0-9-_.~ encoded."""
    return urllib.parse.quote(value, safe="-_.~")


@pytest.fixture(scope="module")
def bucket(s3server):
    s3server.create_bucket(BUCKET)
    return BUCKET


@pytest.fixture(scope="module")
def big(s3server, bucket, tmp_path_factory):
    """(key, bytes) of a 3 MiB object uploaded with boto3's upload_file (one PUT)."""
    data = random.Random(32).randbytes(3 * MiB)
    path = tmp_path_factory.mktemp("s3data") / "big.bin"
    path.write_bytes(data)
    etag = s3server.put_file(bucket, "dir/big.bin", path)
    assert etag == f'"{hashlib.md5(data).hexdigest()}"'
    return "dir/big.bin", data


def test_ranged_reads_with_curl_sigv4(s3server, big):
    key, data = big
    url = s3server.url(BUCKET, key)
    r = s3server.get(url, "-r", "0-99")
    assert r.status == 206, r
    assert r.headers["content-range"] == f"bytes 0-99/{len(data)}"
    assert r.headers["content-length"] == "100"
    assert r.headers["accept-ranges"] == "bytes"
    assert r.body == data[:100]
    # A range across the 1 MiB boundary, a suffix range, an open-ended one, the whole object.
    lo, hi = MiB - 5, 2 * MiB + 4
    r = s3server.get(url, "-r", f"{lo}-{hi}")
    assert (r.status, r.body) == (206, data[lo:hi + 1])
    r = s3server.get(url, "-r", "-100")
    assert (r.status, r.body) == (206, data[-100:])
    assert r.headers["content-range"] == f"bytes {len(data) - 100}-{len(data) - 1}/{len(data)}"
    r = s3server.get(url, "-r", f"{len(data) - 10}-")
    assert (r.status, r.body) == (206, data[-10:])
    r = s3server.get(url)
    assert r.status == 200 and r.headers["content-length"] == str(len(data))
    assert hashlib.sha256(r.body).digest() == hashlib.sha256(data).digest()
    # A range that ends past the end is cut to the object; one that starts past it is 416.
    r = s3server.get(url, "-r", f"{len(data) - 4}-{len(data) + 100}")
    assert (r.status, r.body) == (206, data[-4:])
    r = s3server.get(url, "-r", f"{len(data)}-{len(data) + 100}")
    assert (r.status, r.error_code()) == (416, "InvalidRange")


def test_multiple_ranges_get_the_first_only(s3server, big):
    # radosgw 16 answers a multi-range request with the first range alone, no multipart body.
    key, data = big
    r = s3server.get(s3server.url(BUCKET, key), "-r", "0-1,5-6")
    assert r.status == 206
    assert r.headers["content-range"] == f"bytes 0-1/{len(data)}"
    assert r.body == data[:2]


def test_presigned_url(s3server, big):
    # A query-signed URL (what boto3's generate_presigned_url makes) works without a header.
    key, data = big
    url = s3server.client().generate_presigned_url(
        "get_object", Params={"Bucket": BUCKET, "Key": key}, ExpiresIn=300)
    assert "X-Amz-Signature=" in url
    p = subprocess.run(["curl", "-sS", "--max-time", "30", "-D", "-", "-r", "10-19", url],
                       capture_output=True, timeout=40, env=plain_env())
    r = s3lab.Response(p.stdout)
    assert (r.status, r.body) == (206, data[10:20])
    # The signature covers the path: another key with it is refused.
    p = subprocess.run(["curl", "-sS", "--max-time", "30", "-D", "-",
                        url.replace(key, "other", 1)],
                       capture_output=True, timeout=40, env=plain_env())
    r = s3lab.Response(p.stdout)
    assert (r.status, r.error_code()) == (403, "SignatureDoesNotMatch"), r


def test_head_and_etag(s3server, big):
    key, data = big
    r = s3server.get(s3server.url(BUCKET, key), "-I")
    assert r.status == 200, r
    assert r.headers["content-length"] == str(len(data))
    # A single PUT's ETag is the quoted MD5 of the content.
    assert r.headers["etag"] == f'"{hashlib.md5(data).hexdigest()}"'
    assert r.headers["last-modified"].endswith(" GMT")
    assert r.body == b""


def test_multipart_etag_is_not_an_md5_of_the_content(s3server, bucket, tmp_path):
    # boto3's upload_file goes multipart above 8 MiB (8 MiB parts): the ETag is then the MD5 of
    # the parts' MD5s, a dash and the number of parts.
    data = random.Random(5).randbytes(12 * MiB)
    path = tmp_path / "multi.bin"
    path.write_bytes(data)
    etag = s3server.put_file(bucket, "multi.bin", path)
    parts = [data[:8 * MiB], data[8 * MiB:]]
    want = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
    assert etag == f'"{want}-2"'
    r = s3server.get(s3server.url(bucket, "multi.bin"), "-r", f"{8 * MiB - 1}-{8 * MiB}")
    assert (r.status, r.body, r.headers["etag"]) == (206, data[8 * MiB - 1:8 * MiB + 1], etag)


def test_if_match(s3server, bucket):
    first, second = b"first version\n" * 100, b"second version\n" * 100
    etag = s3server.put(bucket, "cond.bin", first)
    url = s3server.url(bucket, "cond.bin")
    r = s3server.get(url, "-r", "0-4", "-H", f"If-Match: {etag}")
    assert (r.status, r.body) == (206, first[:5])
    # The ETag without its quotes matches as well.
    r = s3server.get(url, "-r", "0-4", "-H", f"If-Match: {etag.strip(chr(34))}")
    assert r.status == 206
    r = s3server.get(url, "-r", "0-4", "-H", 'If-Match: "0123456789abcdef0123456789abcdef"')
    assert (r.status, r.error_code()) == (412, "PreconditionFailed"), r
    assert r.headers["content-type"] == "application/xml"
    # radosgw 16 compares `*` as an ETag too: If-Match: * fails on an existing object.
    r = s3server.get(url, "-r", "0-4", "-H", "If-Match: *")
    assert r.status == 412
    r = s3server.get(url, "-H", f"If-None-Match: {etag}")
    assert (r.status, r.body) == (304, b"")
    # Replaced: the old ETag no longer matches, the new one does.
    new_etag = s3server.put(bucket, "cond.bin", second)
    assert new_etag != etag
    r = s3server.get(url, "-r", "0-4", "-H", f"If-Match: {etag}")
    assert (r.status, r.error_code()) == (412, "PreconditionFailed")
    r = s3server.get(url, "-r", "0-4", "-H", f"If-Match: {new_etag}")
    assert (r.status, r.body) == (206, second[:5])
    # HEAD answers 412 too (with no body).
    r = s3server.get(url, "-I", "-H", f"If-Match: {etag}")
    assert (r.status, r.body) == (412, b"")


def test_list_objects_v2_pagination(s3server, bucket):
    keys = ["list/a", "list/b", "list/c d", "list/e+f", "list/sub/g"]
    for k in keys + ["listing", "other/x"]:
        s3server.put(bucket, k, k.encode())
    base = s3server.url(bucket)
    got, pages, token = [], [], None
    for _ in range(10):  # bounded: 5 keys, 2 a page
        query = "list-type=2&max-keys=2&prefix=" + _q("list/")
        if token is not None:  # parameters in canonical (sorted) order: curl signs them as written
            query = "continuation-token=" + _q(token) + "&" + query
        r = s3server.get(f"{base}?{query}")
        assert r.status == 200, r
        x = r.xml()
        page = [c.findtext("Key") for c in x.findall("Contents")]
        assert int(x.findtext("KeyCount")) == len(page)
        assert x.findtext("MaxKeys") == "2" and x.findtext("Prefix") == "list/"
        # Sizes and ETags come with each key.
        assert [int(c.findtext("Size")) for c in x.findall("Contents")] == [len(k) for k in page]
        assert all(c.findtext("ETag").startswith('"') for c in x.findall("Contents"))
        got += page
        pages.append((len(page), x.findtext("IsTruncated")))
        token = x.findtext("NextContinuationToken")
        if x.findtext("IsTruncated") == "false":
            assert token is None
            break
        # radosgw's continuation token is the last key listed, in clear: opaque to a client all
        # the same, and it must be percent-encoded ("+", " ", "/") in the next request.
        assert token == page[-1]
    assert got == keys
    assert pages == [(2, "true"), (2, "true"), (1, "false")]
    # With a delimiter: the "directories" as CommonPrefixes.
    r = s3server.get(f"{base}?delimiter=%2F&list-type=2&prefix=" + _q("list/"))
    x = r.xml()
    assert [c.findtext("Key") for c in x.findall("Contents")] == keys[:4]
    assert [p.findtext("Prefix") for p in x.findall("CommonPrefixes")] == ["list/sub/"]


def test_curl_signs_the_query_as_written(s3server, bucket):
    # Not in SigV4's canonical order (or "/" not encoded): the signature curl computes is not
    # the one radosgw expects. A client built on libcurl's SigV4 must send canonical queries.
    base = s3server.url(bucket)
    assert s3server.get(f"{base}?list-type=2&max-keys=2&prefix=list%2F").status == 200
    r = s3server.get(f"{base}?max-keys=2&list-type=2&prefix=list%2F")
    assert (r.status, r.error_code()) == (403, "SignatureDoesNotMatch")
    r = s3server.get(f"{base}?list-type=2&max-keys=2&prefix=list/")
    assert (r.status, r.error_code()) == (403, "SignatureDoesNotMatch")


def test_error_bodies(s3server, bucket, big):
    key, _ = big
    r = s3server.get(s3server.url(bucket, "no/such/key"))
    assert r.status == 404 and r.headers["content-type"] == "application/xml"
    x = r.xml()
    assert (x.tag, x.findtext("Code"), x.findtext("BucketName")) == ("Error", "NoSuchKey", bucket)
    assert x.findtext("RequestId") == r.headers["x-amz-request-id"]
    r = s3server.get(s3server.url(bucket, "no/such/key"), "-I")
    assert (r.status, r.body) == (404, b"")  # HEAD: the status only
    r = s3server.get(s3server.url("no-such-bucket", "k"))
    assert (r.status, r.error_code()) == (404, "NoSuchBucket")
    url = s3server.url(bucket, key)
    r = s3server.get(url, user=f"{s3server.access_key}:wrong-secret")
    assert (r.status, r.error_code()) == (403, "SignatureDoesNotMatch"), r
    r = s3server.get(url, user="NOSUCHACCESSKEY00000:wrong-secret")
    assert (r.status, r.error_code()) == (403, "InvalidAccessKeyId")
    # Signed, but without x-amz-content-sha256 (what curl 7.88 sends unless told): refused.
    r = s3server.get(url, payload_sha256=None)
    assert (r.status, r.error_code()) == (403, "SignatureDoesNotMatch")
    # The payload hash may also be UNSIGNED-PAYLOAD.
    assert s3server.get(url, "-r", "0-0", payload_sha256="UNSIGNED-PAYLOAD").status == 206
    # Unsigned: anonymous, and the object is private.
    p = subprocess.run(["curl", "-sS", "--max-time", "30", "-D", "-", url],
                       capture_output=True, timeout=40, env=plain_env())
    r = s3lab.Response(p.stdout)
    assert (r.status, r.error_code()) == (403, "AccessDenied")


def test_any_region_signs(s3server, big):
    # radosgw takes the region from the credential scope it is sent, whatever it is.
    key, data = big
    for region in ("us-east-1", "eu-west-1", "default"):
        r = s3server.get(s3server.url(BUCKET, key), "-r", "0-9", region=region)
        assert (r.status, r.body) == (206, data[:10]), region


def test_requests_are_logged(s3server, big):
    key, data = big
    url = s3server.url(BUCKET, key)
    m = s3server.mark()
    for lo, hi in ((0, 99), (MiB, 2 * MiB - 1)):
        assert s3server.get(url, "-r", f"{lo}-{hi}").status == 206
    assert s3server.get(s3server.url(BUCKET, "missing")).status == 404
    assert s3server.get(url, user=f"{s3server.access_key}:wrong-secret").status == 403
    ops = s3server.requests(since=m)
    # The ops log has the requests radosgw authenticated: not the one with a bad signature.
    assert [(o["operation"], o["uri"], o["http_status"]) for o in ops] == [
        ("get_obj", f"GET /{BUCKET}/{key} HTTP/1.1", "206"),
        ("get_obj", f"GET /{BUCKET}/{key} HTTP/1.1", "206"),
        ("get_obj", f"GET /{BUCKET}/missing HTTP/1.1", "404")]
    assert [o["bytes_sent"] for o in ops[:2]] == [100, MiB]
    assert all(o["object_size"] == len(data) for o in ops[:2])
    assert ops[2]["error_code"] == "NoSuchKey"
    assert {"HTTP_RANGE": "bytes=0-99"} in ops[0]["http_x_headers"]
    # The beast frontend's lines count every request, the one with a bad signature too.
    acc = s3server.access(since=m)
    assert [(a["method"], a["uri"], a["status"], a["range"]) for a in acc] == [
        ("GET", f"/{BUCKET}/{key}", 206, "bytes=0-99"),
        ("GET", f"/{BUCKET}/{key}", 206, f"bytes={MiB}-{2 * MiB - 1}"),
        ("GET", f"/{BUCKET}/missing", 404, ""),
        ("GET", f"/{BUCKET}/{key}", 403, "")]
    assert [a["bytes"] for a in acc[:2]] == [100, MiB]


def test_daemons_are_ours(s3server):
    # Children of this process, every socket they listen on on 127.0.0.1.
    pids = s3server.pids()
    assert set(pids) == {"mon.a", "osd.0", "rgw"}
    inodes = {}
    for name, pid in pids.items():
        stat = Path(f"/proc/{pid}/stat").read_text()
        assert int(stat[stat.rindex(")") + 2:].split()[1]) == os.getpid()
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes[link[8:-1]] = name
    listening = {}
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # LISTEN
                listening.setdefault(inodes[f[9]], []).append((table, f[1]))
    assert set(listening) == {"mon.a", "osd.0", "rgw"}, listening
    for name, socks in listening.items():
        assert all(t == "tcp" and a.startswith("0100007F:") for t, a in socks), (name, socks)
    assert ("tcp", f"0100007F:{s3server.port:04X}") in listening["rgw"]
