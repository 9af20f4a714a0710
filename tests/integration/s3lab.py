"""A loopback S3 server for the `s3://` source tests: Debian's radosgw (Ceph 16.2).

Contract:
  * `S3Server(parent)` makes a one-node Ceph cluster of its own in a temporary directory under
    `parent`: one monitor, one OSD on Ceph's memory store (nothing on disk but its metadata), no
    mgr, every pool one replica, no cephx between the daemons (`auth ... required = none`), and
    radosgw's beast frontend on 127.0.0.1. Config, monitor store, OSD metadata, logs, admin
    sockets and pid files all live in that directory; the daemons run in the foreground as
    children of the test process and are stopped (SIGTERM, then SIGKILL), waited for and the
    directory removed when the context manager exits, even after a failed start.
  * It has one S3 user: `access_key`, `secret_key`. radosgw does not check the region of a SigV4
    credential scope (any region signs); `region` is "us-east-1", what AWS clients default to.
    Buckets are addressed path-style: `endpoint`/bucket/key (no DNS name is configured, so
    virtual-host addressing is not available).
  * `requests()` reads radosgw's ops log: one JSON object per request radosgw authenticated
    (operation, uri = "METHOD /path HTTP/1.1", http_status, error_code, bytes_sent,
    bytes_received, object_size, and http_x_headers: the Range, If-Match and
    x-amz-content-sha256 it was sent). A request refused for its signature is not in it; a
    query string is in its uri twice ("GET /b?list-type=2?list-type=2 HTTP/1.1": radosgw 16's
    way). `access()` reads the beast frontend's access lines from radosgw's log: every request,
    rejected ones too (method, uri with its query, status, bytes: body bytes sent plus
    received, range).
  * Nothing here knows what ckptfs does: the logs are the server's account of what was asked.
"""
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from netlab import Lifetime, free_port, plain_env, stop_process, wait_listening

START_TIMEOUT = 90  # seconds for the whole cluster and radosgw to come up
STEP_TIMEOUT = 60  # seconds for one ceph / radosgw-admin command
STOP_TIMEOUT = 15  # seconds for a daemon to exit after SIGTERM (the OSD tells the monitor first)

ACCESS_KEY = "S3LABACCESSKEY000001"
SECRET_KEY = "s3labSecretKey0000000000000000000000001"
REGION = "us-east-1"
# The SHA-256 of an empty payload: what a GET signs as x-amz-content-sha256 (see curl()).
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def _conf(d, mon_port):
    return f"""
[global]
fsid = {uuid.uuid4()}
mon host = [v2:127.0.0.1:{mon_port}]
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind msgr1 = false
ms bind ipv6 = false
auth cluster required = none
auth service required = none
auth client required = none
keyring = {d}/keyring
run dir = {d}/run
crash dir = {d}/crash
admin socket = {d}/run/$name.asok
pid file = {d}/run/$name.pid
log file = {d}/log/$name.log
log to stderr = false
err to stderr = true
mon cluster log file = {d}/log/cluster.log
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
mon max pg per osd = 1000
# The monitor commits each change (a pool, an OSD booting) 1 s after it is proposed by
# default: radosgw's first start makes a handful of pools, one after another.
paxos propose interval = 0.05
paxos min wait = 0.01
# A nearly full disk on the test machine must not stop the monitor.
mon data avail warn = 1
mon data avail crit = 0
[mon]
mon data = {d}/mon.$id
[osd]
osd data = {d}/osd.$id
osd objectstore = memstore
# What the OSD reports as its size: an accounting figure, nothing is allocated up front.
memstore device bytes = {16 << 30}
[client.rgw]
# radosgw's own defaults ask for a cephx-secured monitor connection.
ms mon client mode = crc
rgw data = {d}/rgw
rgw thread pool size = 32
rgw dynamic resharding = false
rgw enable lc threads = false
rgw enable gc threads = false
rgw run sync thread = false
rgw enable quota threads = false
debug rgw = 1
rgw enable ops log = true
rgw ops log rados = false
rgw ops log file path = {d}/log/ops.log
rgw log http headers = http_range, http_if_match, http_x_amz_content_sha256
"""


class Response:
    """What curl got: status (int), headers ({lower-case name: value}) and body (bytes)."""

    def __init__(self, raw):
        head, _, self.body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1])
        self.headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()

    def xml(self):
        """The body as an ElementTree element, S3's namespace taken off the tags."""
        import xml.etree.ElementTree as ET
        root = ET.fromstring(self.body)
        for e in root.iter():
            e.tag = e.tag.rpartition("}")[2]
        return root

    def error_code(self):
        """<Error><Code> of an S3 error body."""
        return self.xml().findtext("Code")

    def __repr__(self):
        return f"<Response {self.status} {self.headers} {self.body[:300]!r}>"


class S3Server(Lifetime):
    """with S3Server(parent) as s3: s3.endpoint, s3.access_key, s3.secret_key, s3.region ...

    radosgw on a one-node Ceph cluster in a temporary directory under parent (None: the system
    temp directory). start() returns once radosgw answers S3 requests."""

    def __init__(self, parent=None, host="127.0.0.1"):
        self.parent, self.host = parent, host
        self.access_key, self.secret_key, self.region = ACCESS_KEY, SECRET_KEY, REGION
        self.dir = None
        self.port = None
        self.procs = {}  # name -> Popen, in start order
        self.startup_seconds = None

    @property
    def endpoint(self):
        return f"http://{self.host}:{self.port}"

    def url(self, bucket, key=""):
        """The path-style URL of bucket/key (key is not quoted: pass it quoted if it needs it)."""
        return f"{self.endpoint}/{bucket}/{key}" if key else f"{self.endpoint}/{bucket}"

    # --- start and stop ---

    def _run(self, *cmd, timeout=STEP_TIMEOUT):
        p = subprocess.run([*cmd], cwd=self.dir, capture_output=True, timeout=timeout,
                           env=self._env(), stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited with {p.returncode}: "
                               f"{p.stderr.decode(errors='replace')}\n{self.errors()}")
        return p.stdout.decode()

    def _env(self):
        env = plain_env()
        env["CEPH_CONF"] = str(self.dir / "ceph.conf")
        env.pop("CEPH_ARGS", None)
        return env

    def _ceph(self, *args):
        return self._run("ceph", "-c", str(self.dir / "ceph.conf"), "--connect-timeout",
                         str(STEP_TIMEOUT), *args)

    def _spawn(self, name, *cmd):
        with open(self.dir / "log" / f"{name}.stderr", "wb") as err:
            self.procs[name] = subprocess.Popen(
                [*cmd, "-f", "-c", str(self.dir / "ceph.conf")], cwd=self.dir,
                stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=self._env())
        return self.procs[name]

    def _start_mon(self):
        """ceph-mon a on a free port; a port taken between the pick and the bind: another."""
        for attempt in range(5):
            port = free_port(self.host)
            (self.dir / "ceph.conf").write_text(_conf(self.dir, port))
            shutil.rmtree(self.dir / "mon.a", ignore_errors=True)
            fsid = re.search(r"^fsid = (\S+)$", (self.dir / "ceph.conf").read_text(), re.M)[1]
            self._run("monmaptool", "--create", "--clobber", "--fsid", fsid,
                      "--addv", "a", f"[v2:{self.host}:{port}]", str(self.dir / "monmap"))
            self._run("ceph-mon", "-c", str(self.dir / "ceph.conf"), "--mkfs", "-i", "a",
                      "--monmap", str(self.dir / "monmap"))
            proc = self._spawn("mon.a", "ceph-mon", "-i", "a")
            try:
                wait_listening(self.host, port, proc, timeout=STEP_TIMEOUT)
                return
            except RuntimeError:
                stop_process(proc)
                del self.procs["mon.a"]
                if attempt == 4:
                    raise

    def _start_osd(self, deadline):
        osd_uuid = str(uuid.uuid4())
        osd_id = self._ceph("osd", "new", osd_uuid).strip()
        (self.dir / f"osd.{osd_id}").mkdir()
        self._run("ceph-osd", "-c", str(self.dir / "ceph.conf"), "-i", osd_id, "--mkfs",
                  "--osd-uuid", osd_uuid)
        proc = self._spawn(f"osd.{osd_id}", "ceph-osd", "-i", osd_id)
        while True:  # up: in the osdmap the monitor publishes
            if proc.poll() is not None:
                raise RuntimeError(f"ceph-osd exited with {proc.returncode}\n{self.errors()}")
            dump = json.loads(self._ceph("osd", "dump", "--format", "json"))
            if any(o["osd"] == int(osd_id) and o["up"] for o in dump["osds"]):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"osd.{osd_id} not up after {START_TIMEOUT}s\n{self.errors()}")
            time.sleep(0.2)

    def _start_rgw(self):
        # The user (and with it the default realm, zonegroup, zone and their pools) first:
        # radosgw-admin talks to RADOS directly, radosgw needs not be running.
        self._run("radosgw-admin", "-c", str(self.dir / "ceph.conf"), "-n", "client.rgw",
                  "user", "create", "--uid", "s3lab", "--display-name", "s3lab",
                  "--access-key", self.access_key, "--secret-key", self.secret_key)
        for attempt in range(5):
            self.port = free_port(self.host)
            proc = self._spawn("rgw", "radosgw", "-n", "client.rgw",
                               "--rgw-frontends", f"beast endpoint={self.host}:{self.port}")
            try:
                wait_listening(self.host, self.port, proc, timeout=START_TIMEOUT)
                return
            except RuntimeError:
                stop_process(proc)
                del self.procs["rgw"]
                if attempt == 4:
                    raise RuntimeError(f"radosgw did not start\n{self.errors()}")

    def start(self):
        t0 = time.monotonic()
        deadline = t0 + START_TIMEOUT
        self.dir = Path(tempfile.mkdtemp(prefix="s3lab-", dir=self.parent))
        try:
            for sub in ("run", "crash", "log", "rgw"):
                (self.dir / sub).mkdir()
            self._start_mon()
            self._start_osd(deadline)
            self._start_rgw()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def stop(self):
        # radosgw first, the monitor last: the OSD tells the monitor it is going.
        for name in reversed(list(self.procs)):
            try:
                stop_process(self.procs[name])
            except subprocess.TimeoutExpired:
                pass
        self.procs = {}
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def pids(self):
        """{name: pid} of the daemons running now."""
        return {n: p.pid for n, p in self.procs.items() if p.poll() is None}

    def errors(self, tail=4000):
        """The end of each daemon's stderr and log, for failure messages."""
        out = []
        if self.dir is not None:
            for f in sorted((self.dir / "log").glob("*")):
                try:
                    out.append(f"--- {f.name}\n" + f.read_text(errors="replace")[-tail:])
                except OSError:
                    pass
        return "\n".join(out)

    # --- S3 through boto3 (Debian's python3-boto3) ---

    def client(self, region=None, access_key=None, secret_key=None):
        """A boto3 S3 client for this server: path-style, SigV4, no retries."""
        import boto3
        from botocore.config import Config
        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name=region or self.region,
            aws_access_key_id=access_key or self.access_key,
            aws_secret_access_key=secret_key or self.secret_key,
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                          retries={"max_attempts": 1}, connect_timeout=10, read_timeout=60))

    def create_bucket(self, bucket):
        self.client().create_bucket(Bucket=bucket)

    def put(self, bucket, key, data):
        """Uploads data (bytes) or the file at a Path as bucket/key in one PUT; returns the
        ETag radosgw answered (with its quotes)."""
        if isinstance(data, (str, os.PathLike)):
            data = Path(data).read_bytes()
        return self.client().put_object(Bucket=bucket, Key=key, Body=data)["ETag"]

    def put_file(self, bucket, key, path):
        """Uploads the file at path with boto3's transfer manager (multipart above 8 MiB, as
        boto3 does by default); returns the object's ETag."""
        c = self.client()
        c.upload_file(str(path), bucket, key)
        return c.head_object(Bucket=bucket, Key=key)["ETag"]

    # --- S3 through curl's own SigV4 ---

    def curl(self, url, *args, region=None, user=None, payload_sha256=EMPTY_SHA256, timeout=60):
        """curl -sS with `--aws-sigv4 aws:amz:REGION:s3` and this server's keys; returns the
        CompletedProcess (stdout: bytes). curl 7.88 signs no x-amz-content-sha256 header on
        its own, and radosgw, as S3, wants one: this sends payload_sha256 (None: no header).
        curl signs the query string as written: it must be in SigV4's canonical form already
        (parameters sorted, values percent-encoded, "/" as %2F), or the signature is wrong."""
        user = user or f"{self.access_key}:{self.secret_key}"
        sha = ["-H", f"x-amz-content-sha256: {payload_sha256}"] if payload_sha256 else []
        return subprocess.run(
            ["curl", "-sS", "--max-time", str(timeout), "--aws-sigv4",
             f"aws:amz:{region or self.region}:s3", "--user", user, *sha, *args, url],
            capture_output=True, timeout=timeout + 10, env=plain_env())

    def get(self, url, *args, **kw):
        """A signed request by curl (see curl(); args: more curl options, e.g. "-r", "0-99" or
        "-I"): a Response with status, headers (lower-case names) and body."""
        head = [] if "-I" in args else ["-D", "-"]  # -I writes the headers to stdout itself
        p = self.curl(url, *head, *args, **kw)
        if p.returncode != 0:
            raise RuntimeError(f"curl {url}: {p.stderr.decode(errors='replace')}")
        return Response(p.stdout)

    # --- what radosgw was asked ---

    def _lines(self, name):
        try:
            return (self.dir / "log" / name).read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return []

    def _settled(self, read, settle, timeout, size=len):
        """read() once it has not grown for `settle` seconds (or `timeout` passed)."""
        deadline = time.monotonic() + timeout
        items = read()
        while time.monotonic() < deadline:
            time.sleep(settle)
            again = read()
            if size(again) == size(items):
                break
            items = again
        return items

    def mark(self, settle=0.3, timeout=10):
        """A position in the logs: requests(since=mark) and access(since=mark) are those
        logged after it. radosgw logs a request just after its client saw the answer: this
        waits until neither log has grown for `settle` seconds (at most `timeout`), so that
        what came before is before the mark."""
        both = self._settled(lambda: (self._ops(), self._access()), settle, timeout,
                             size=lambda b: (len(b[0]), len(b[1])))
        return (len(both[0]), len(both[1]))

    def _ops(self):
        out = []
        for line in self._lines("ops.log"):
            try:
                out.append(json.loads(line))
            except ValueError:  # a line being written
                break
        return out

    def requests(self, since=(0, 0), settle=0.3, timeout=10):
        """radosgw's ops log (dicts, oldest first) after `since` (a mark()): the requests it
        authenticated. This waits until the log has not grown for `settle` seconds (at most
        `timeout`): radosgw writes a line just after its client saw the answer."""
        return self._settled(self._ops, settle, timeout)[since[0]:]

    _ACCESS = re.compile(r' beast: \S+ (?P<addr>\S+) - (?P<user>\S+) \[[^\]]*\] '
                         r'"(?P<method>\S+) (?P<uri>\S+) (?P<proto>[^"]+)" (?P<status>\d+) '
                         r'(?P<bytes>\d+) - "[^"]*" (?P<range>\S+) latency=')

    def _access(self):
        out = []
        for line in self._lines("client.rgw.log"):
            m = self._ACCESS.search(line)
            if m:
                r = m.groupdict()
                r["status"], r["bytes"] = int(r["status"]), int(r["bytes"])
                r["range"] = "" if r["range"] == "-" else r["range"]
                out.append(r)
        return out

    def access(self, since=(0, 0), settle=0.3, timeout=10):
        """The beast frontend's access lines after `since` (a mark()): every request, with
        method, uri, status, bytes (body bytes sent plus received), range and user ("-": none
        authenticated, "anonymous": unsigned)."""
        return self._settled(self._access, settle, timeout)[since[1]:]

    def daemon_rss_kib(self):
        """{name: VmRSS in KiB} of the running daemons."""
        out = {}
        for name, pid in self.pids().items():
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    out[name] = int(line.split()[1])
        return out
