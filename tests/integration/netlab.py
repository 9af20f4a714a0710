"""Loopback servers for the remote-source tests: Debian's nginx, plain and TLS.

Contract:
  * Everything listens on 127.0.0.1 (or another 127/8 address given explicitly) on a free port,
    runs as a child of the test process with every path (config, pid, temp, logs) in a temporary
    directory, and is stopped (and waited for, then killed) when its context manager exits.
  * `tls_material(dir)` makes a throwaway CA and a server certificate for 127.0.0.1, 127.0.0.2 and
    localhost (subjectAltName) with `openssl`; the client under test gets the CA file through
    `-o cacert=FILE` and nothing else: no insecure mode is ever needed.
  * `Nginx(root, tls=None)` serves `root` with nginx's own Range and ETag handling (static files:
    `ETag: "mtime-size"` in hex, `If-Match` answered 412 on mismatch, 206 for one range).
    Its access log is one JSON object a line: method, uri, status, range, if_match,
    if_unmodified_since, body_bytes, bytes (with headers), auth (whether an Authorization header
    came: never its value), host, conn (connection serial), proto, end (when it finished, epoch
    seconds) and seconds (how long it took). `requests()` parses it.
  * Nothing here knows what ckptfs does: the log is the server's account of what was asked.
"""
import email.utils
import gzip
import hashlib
import http.server
import json
import os
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from http import HTTPStatus
from pathlib import Path

START_TIMEOUT = 10  # seconds for a server to accept connections
STOP_TIMEOUT = 10  # seconds for a server to exit after it is told to


def plain_env():
    """Our environment without the sanitizer run's LD_PRELOAD (the ASan runtime, which `make
    test SANITIZE=...` preloads into python for libckload): nginx, openssl and the reader are
    not ours and need no sanitizer."""
    return {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}


def free_port(host="127.0.0.1"):
    """A TCP port nothing listens on right now at host (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_listening(host, port, proc=None, timeout=START_TIMEOUT):
    """Returns once (host, port) accepts a connection; raises if proc exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening on {host}:{port}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on {host}:{port} after {timeout}s")
            time.sleep(0.02)


def stop_process(proc, sig=signal.SIGTERM):
    """Sends sig, waits STOP_TIMEOUT, then SIGKILLs: a server never outlives its test."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT)


# --- TLS -----------------------------------------------------------------------------------

class TLS:
    """Paths of a throwaway CA (ca) and a server certificate (cert, key) it signed."""

    def __init__(self, ca, cert, key):
        self.ca, self.cert, self.key = Path(ca), Path(cert), Path(key)


def _openssl(*args, cwd):
    p = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, timeout=60, env=plain_env())
    if p.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)}: {p.stderr.decode(errors='replace')}")


def tls_material(directory, names=("127.0.0.1", "127.0.0.2", "localhost")):
    """Makes ca.pem (a CA valid one day), server.pem and server.key (signed by it, valid for
    `names`: IP addresses and DNS names) in directory. EC P-256: fast to make."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
             "-subj", "/CN=ckptfs netlab test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    _openssl("req", "-new", *ec, "-keyout", "server.key", "-out", "server.csr",
             "-subj", f"/CN={names[0]}", cwd=d)
    sans = ",".join(("IP:" if n[0].isdigit() else "DNS:") + n for n in names)
    (d / "server.ext").write_text(f"subjectAltName={sans}\n"
                                  "basicConstraints=CA:FALSE\n"
                                  "keyUsage=critical,digitalSignature\n"
                                  "extendedKeyUsage=serverAuth\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.pem", "-days", "1", "-extfile", "server.ext", cwd=d)
    return TLS(d / "ca.pem", d / "server.pem", d / "server.key")


def replace_file(path, data):
    """Swaps path's content for data atomically, with an mtime 2 s later, so that both nginx's
    ETag (mtime in seconds and size) and FileServer's change even for the same size."""
    path = Path(path)
    st = os.stat(path)
    tmp = path.with_name(path.name + ".netlab-new")
    tmp.write_bytes(data)
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    os.replace(tmp, path)


class Lifetime:
    """`with Server(...) as srv:` is start(), then stop() whatever happens."""

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class _Served(Lifetime):
    """What every server here has: host, port and tls, and the URLs they make."""

    @property
    def base(self):
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def url(self, rel=""):
        """The URL of root/rel."""
        return f"{self.base}/{str(rel).lstrip('/')}"


# --- nginx ---------------------------------------------------------------------------------

# One JSON object per request. $netlab_auth is 1 when an Authorization header came: the log
# records that it came, never what it said.
_LOG_FORMAT = ("'{\"method\":\"$request_method\",\"uri\":\"$request_uri\",\"status\":$status,"
               "\"range\":\"$http_range\",\"if_match\":\"$http_if_match\","
               "\"if_unmodified_since\":\"$http_if_unmodified_since\","
               "\"body_bytes\":$body_bytes_sent,\"bytes\":$bytes_sent,\"auth\":$netlab_auth,"
               "\"host\":\"$http_host\",\"conn\":$connection,\"proto\":\"$server_protocol\","
               "\"end\":$msec,\"seconds\":$request_time}'")


class Nginx(_Served):
    """with Nginx(root, tls=None, host="127.0.0.1", http2=False) as srv: srv.url("a/b") ...

    Debian's nginx serving the directory `root` (read from disk on every request, so a test may
    replace a file: give it a new mtime, since the ETag is mtime and size). With `tls` (a TLS),
    https on the same port."""

    def __init__(self, root, tls=None, host="127.0.0.1", http2=False, extra=""):
        self.root = Path(root).resolve()
        self.tls, self.host, self.http2, self.extra = tls, host, http2, extra
        self.port = None
        self.proc = None
        self.dir = None

    def _conf(self):
        listen = f"{self.host}:{self.port}"
        if self.tls:
            listen += " ssl" + (" http2" if self.http2 else "")
        tls = ""
        if self.tls:
            tls = (f"ssl_certificate {self.tls.cert}; ssl_certificate_key {self.tls.key};\n"
                   "        ssl_protocols TLSv1.2 TLSv1.3;\n")
        d = self.dir
        # Workers run as root only when we are root: the served tmp dirs are private to us.
        user = "user root root;" if os.geteuid() == 0 else ""
        return f"""
daemon off;
master_process on;
worker_processes 1;
{user}
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 256; }}
http {{
    default_type application/octet-stream;
    access_log off;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
    keepalive_timeout 60s;
    open_file_cache off;
    map $http_authorization $netlab_auth {{ default 1; "" 0; }}
    log_format netlab escape=json {_LOG_FORMAT};
    server {{
        listen {listen};
        server_name _;
        {tls}
        access_log {d}/access.log netlab;
        root {self.root};
        {self.extra}
        location / {{ }}
    }}
}}
"""

    def start(self):
        self.dir = Path(tempfile.mkdtemp(prefix="netlab-nginx-"))
        for attempt in range(5):  # a free port can be taken between the pick and nginx's bind
            self.port = free_port(self.host)
            (self.dir / "nginx.conf").write_text(self._conf())
            with open(self.dir / "stderr", "wb") as err:
                self.proc = subprocess.Popen(
                    ["nginx", "-p", str(self.dir), "-c", str(self.dir / "nginx.conf")],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=plain_env())
            try:
                wait_listening(self.host, self.port, self.proc)
                return self
            except RuntimeError:
                stop_process(self.proc)
                if attempt == 4:
                    raise RuntimeError("nginx did not start: " + self.errors())
        return self

    def stop(self):
        if self.proc is not None:
            stop_process(self.proc)  # SIGTERM: nginx's fast shutdown, workers included
            self.proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def replace(self, rel, data):
        replace_file(self.root / rel, data)

    def errors(self):
        """nginx's own stderr and error log, for failure messages."""
        out = []
        for name in ("stderr", "error.log"):
            try:
                out.append((self.dir / name).read_text(errors="replace"))
            except OSError:
                pass
        return "\n".join(out)

    # --- the access log ---

    def _log_lines(self):
        try:
            return (self.dir / "access.log").read_text().splitlines()
        except FileNotFoundError:
            return []

    def mark(self):
        """A position in the log: requests(since=mark) are those logged after it."""
        return len(self._log_lines())

    def requests(self, since=0, settle=0.3, timeout=10):
        """The logged requests (dicts, oldest first) after `since`. nginx writes a line when a
        request is finished, which can be just after the client saw its last byte: this waits
        until the log has not grown for `settle` seconds (at most `timeout`)."""
        deadline = time.monotonic() + timeout
        lines = self._log_lines()
        while time.monotonic() < deadline:
            time.sleep(settle)
            again = self._log_lines()
            if len(again) == len(lines):
                break
            lines = again
        return [json.loads(line) for line in lines[since:]]


def count(reqs, uri=None, method=None, status=None):
    """How many of the logged requests match (None: any)."""
    return sum(1 for r in reqs
               if (uri is None or r["uri"] == uri) and (method is None or r["method"] == method)
               and (status is None or r["status"] == status))


def body_bytes(reqs, uri=None):
    """Body bytes the server sent for the matching requests."""
    return sum(r["body_bytes"] for r in reqs if uri is None or r["uri"] == uri)


def busy(reqs):
    """(seconds during which at least one of nginx's logged requests was being served, the
    most served at once): how well a client keeps the server busy."""
    events = sorted([(r["end"] - r["seconds"], 1) for r in reqs] + [(r["end"], -1) for r in reqs])
    total, at_once, most, since = 0.0, 0, 0, None
    for when, step in events:
        if at_once and since is not None:
            total += when - since
        at_once += step
        most = max(most, at_once)
        since = when
    return total, most


# --- a file server of our own, with scripted faults ----------------------------------------

class Fault:
    """One scripted misbehaviour. Applies to requests whose method is in `methods` and whose
    path starts with `path` (None: any), after `skip` such requests have passed untouched, for
    `times` requests (None: every one after that), or only every `every`-th of them. `hits`
    counts the requests it spoiled.

    kinds (params):
      status        code (503), retry_after (None: no header), s3_code (None): an error answer with
                    a small body; with s3_code, S3's XML error document with that <Code>
                    (SlowDown, InternalError, ExpiredToken...)
      drop          after (bytes, default half the body): correct headers, part of the body, then
                    a connection reset
      truncate      after: Content-Length says the whole body, `after` bytes come, then a clean close
      stall         after, seconds (30): part of the body, then nothing for `seconds`, then a close
      hold          at, until, reached, seconds (60): nothing of the file from byte `at` on until
                    `until` (a threading.Event) is set: a response reaching past `at` sends the
                    bytes before it, sets `reached` (an Event), waits, then sends the rest (a
                    close when `seconds` pass first); one that ends before `at` is whole at once
      slow          chunk (16384), delay (0.01 s): the right bytes, slowly
      bad_range     shift (1): a 206 whose Content-Range and body are `shift` bytes off the asked range
      long_body     extra (4096): the asked range and Content-Range, then `extra` more bytes
                    (Content-Length counts them)
      ignore_range  a 200 with the whole file to a ranged request
      wrong_total   delta (+1 MiB): Content-Range's total (and a HEAD's Content-Length) lie by delta
      endless_headers  limit (64 MiB): header lines until the client leaves or `limit` bytes went
      redirect      to (a base URL) : 302 to to + the same path (and query); to=None: to itself (a loop)
      gigantic      limit (8 GiB): Content-Length 2**50 and zeros until the client leaves or `limit`
      weak_etag     the right answer with a weak ETag (W/"..."), which If-Match never matches
      encoded       Content-Encoding: gzip, the range's bytes gzipped and the body cut or padded
                    to exactly the range's length (what a reader that ignores the header takes)
    """

    def __init__(self, kind, times=None, skip=0, path=None, methods=("GET", "HEAD"), every=1,
                 **params):
        self.kind, self.times, self.skip, self.path, self.methods = kind, times, skip, path, methods
        self.every = every
        self.params = params
        self.seen = 0
        self.hits = 0

    def take(self, method, path):
        """Whether this request is spoiled (counted under the server's lock): with every=k, only
        every k-th of the matching requests after `skip` is."""
        if method not in self.methods or (self.path is not None and not path.startswith(self.path)):
            return False
        self.seen += 1
        if self.seen <= self.skip or (self.times is not None and self.hits >= self.times) \
                or (self.seen - self.skip) % self.every:
            return False
        self.hits += 1
        return True


def parse_range(value, size):
    """(start, end inclusive) of a single `bytes=` range, 'bad' for one we cannot satisfy,
    None for none (or several: answered with the whole file, as RFC 9110 allows)."""
    if not value or not value.startswith("bytes=") or "," in value:
        return None
    first, _, last = value[6:].strip().partition("-")
    try:
        if first == "":
            n = int(last)
            return (max(size - n, 0), size - 1) if n > 0 and size else "bad"
        start = int(first)
        end = int(last) if last else size - 1
    except ValueError:
        return None
    if start >= size or end < start:
        return "bad"
    return start, min(end, size - 1)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 15  # an idle or stuck client connection is closed after this many seconds

    def log_message(self, *args):
        pass

    def setup(self):
        super().setup()
        with self.server.app.lock:
            self.server.app.conns.add(self.connection)

    def finish(self):
        with self.server.app.lock:
            self.server.app.conns.discard(self.connection)
        super().finish()

    def do_GET(self):
        self.server.app.handle(self, "GET")

    def do_HEAD(self):
        self.server.app.handle(self, "HEAD")


class _Req:
    """What app handlers need of a request, and the log entry it becomes."""

    def __init__(self, h, method):
        self.h, self.method = h, method
        self.uri = h.path
        self.path = urllib.parse.urlsplit(h.path).path
        self.headers = h.headers
        self.entry = {"method": method, "uri": h.path, "status": None,
                      "range": h.headers.get("Range", ""), "if_match": h.headers.get("If-Match", ""),
                      "if_unmodified_since": h.headers.get("If-Unmodified-Since", ""),
                      "auth": int("Authorization" in h.headers), "host": h.headers.get("Host", ""),
                      "body_bytes": 0, "fault": None, "start": time.monotonic()}

    def write(self, data):
        try:
            self.h.wfile.write(data)
            self.h.wfile.flush()
        except OSError:  # the client left: that is its right
            self.h.close_connection = True
            return False
        return True

    def head(self, status, headers, reason=None):
        """Status line and headers (a list of (name, value))."""
        self.entry["status"] = status
        if reason is None:
            try:
                reason = HTTPStatus(status).phrase
            except ValueError:
                reason = "Unknown"
        lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in headers]
        return self.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    def body(self, data):
        if self.method == "HEAD":
            return True
        ok = self.write(data)
        if ok:
            self.entry["body_bytes"] += len(data)
        return ok

    def simple(self, status, body=b"", headers=()):
        body = body if isinstance(body, bytes) else body.encode()
        self.head(status, [("Content-Length", len(body)), *headers])
        self.body(body)

    def close(self, reset=False):
        """Ends the connection after this response: a FIN, or with reset an RST at once (an
        abortive close: SO_LINGER 0, then close with no shutdown first)."""
        self.h.close_connection = True
        try:
            if reset:
                self.h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.h.connection.close()
            else:
                self.h.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class FileServer(_Served):
    """with FileServer(root, host="127.0.0.1", tls=None) as srv: srv.url("a.safetensors") ...

    A threaded HTTP/1.1 server of our own on loopback serving `root` like nginx does (one Range,
    206/416, `ETag: "mtime_ns-size"`, If-Match -> 412, Last-Modified, HEAD, keep-alive), plus
    the scripted faults in `self.faults` (see Fault), consulted in order, the first that takes a
    request spoils it. `replace(rel, data)` swaps a file under the server (a new ETag). `log` is
    the list of requests (dicts like Nginx.requests() plus `fault`). Every socket has a timeout;
    every fault is bounded in bytes and seconds; stop() closes the listener and waits for the
    handler threads (a spoiled response ends within its bounds)."""

    def __init__(self, root, host="127.0.0.1", tls=None):
        self.root = Path(root).resolve()
        self.host, self.tls = host, tls
        self.faults = []
        self.log = []
        self.conns = set()  # open client connections, closed by stop()
        self.stopping = threading.Event()  # ends every fault that holds a connection
        self.lock = threading.Lock()
        self.httpd = None
        self.thread = None
        self.port = None

    # --- lifecycle ---

    def start(self):
        self.httpd = http.server.ThreadingHTTPServer((self.host, 0), _Handler)
        self.httpd.daemon_threads = False
        self.httpd.block_on_close = True
        self.httpd.app = self
        if self.tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(self.tls.cert, self.tls.key)
            # The handshake happens in the connection's own thread, at its first read, so a
            # client that never completes one cannot stall the accepting thread.
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True,
                                                do_handshake_on_connect=False)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()
        return self

    def stop(self):
        if self.httpd is not None:
            self.stopping.set()
            self.httpd.shutdown()
            # A keep-alive connection's thread waits for the next request: end them all now,
            # as a server going away does, rather than after their idle timeout.
            with self.lock:
                for c in self.conns:
                    try:
                        c.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
            self.httpd.server_close()  # joins the handler threads (block_on_close)
            self.thread.join(timeout=STOP_TIMEOUT)
            self.httpd = None

    # --- scripting ---

    def fault(self, kind, **kw):
        f = Fault(kind, **kw)
        with self.lock:
            self.faults.append(f)
        return f

    def clear(self):
        with self.lock:
            self.faults.clear()
            self.log.clear()

    def requests(self, settle=0.2, timeout=10):
        """The logged requests in the order they arrived, once the log has not grown for `settle`
        seconds (a handler logs a request just after its last byte went, which the client may
        already have seen: the next request, on another connection's thread, can log first)."""
        deadline = time.monotonic() + timeout
        with self.lock:
            n = len(self.log)
        while time.monotonic() < deadline:
            time.sleep(settle)
            with self.lock:
                if len(self.log) == n:
                    break
                n = len(self.log)
        with self.lock:
            return sorted(self.log, key=lambda e: e["start"])

    def replace(self, rel, data):
        replace_file(self.root / rel, data)

    # --- serving ---

    def handle(self, h, method):
        req = _Req(h, method)
        t0 = time.monotonic()
        try:
            with self.lock:
                fault = next((f for f in self.faults if f.take(method, req.path)), None)
            if fault is not None:
                req.entry["fault"] = fault.kind
            self.route(req, fault)
        finally:
            req.entry["end"], req.entry["seconds"] = time.time(), time.monotonic() - t0
            with self.lock:
                self.log.append(req.entry)

    def route(self, req, fault):
        """Dispatch; subclasses add endpoints and fall back to this."""
        if fault is not None and self.early_fault(req, fault):
            return
        self.serve_file(req, self.file_for(req.path), fault)

    def file_for(self, path):
        """The file under root a URL path names, or None (never outside root)."""
        rel = urllib.parse.unquote(path).lstrip("/")
        p = (self.root / rel).resolve()
        if rel == "" or not p.is_relative_to(self.root) or not p.is_file():
            return None
        return p

    def early_fault(self, req, fault):
        """Faults that answer before any file is looked at; True when one did."""
        p = fault.params
        if fault.kind == "status":
            extra = [("Retry-After", p["retry_after"])] if p.get("retry_after") is not None else []
            body = b"netlab: scripted failure\n"
            if p.get("s3_code"):  # as S3 and radosgw write one (tests/integration/s3lab.py)
                body = ('<?xml version="1.0" encoding="UTF-8"?><Error><Code>' + p["s3_code"]
                        + "</Code><Message>netlab: scripted</Message><RequestId>netlab"
                        "</RequestId></Error>").encode()
                extra.append(("Content-Type", "application/xml"))
            req.simple(p.get("code", 503), body, extra)
            return True
        if fault.kind == "redirect":
            to = p.get("to") or self.base
            req.simple(302, b"", [("Location", to.rstrip("/") + req.uri)])
            return True
        if fault.kind == "endless_headers":
            self._endless_headers(req, p.get("limit", 64 << 20))
            return True
        if fault.kind == "gigantic":
            self._gigantic(req, p.get("limit", 8 << 30))
            return True
        return False

    def _endless_headers(self, req, limit):
        req.entry["status"] = 200
        sent, line = 0, b"X-Netlab-Pad: " + b"a" * 1000 + b"\r\n"
        deadline = time.monotonic() + 60
        if not req.write(b"HTTP/1.1 200 OK\r\n"):
            return
        while sent < limit and time.monotonic() < deadline and not self.stopping.is_set() \
                and req.write(line * 64):
            sent += len(line) * 64
        req.close()

    def _gigantic(self, req, limit):
        req.head(200, [("Content-Length", 1 << 50), ("ETag", '"gigantic"')])
        block, sent = bytes(1 << 20), 0
        deadline = time.monotonic() + 60
        while sent < limit and time.monotonic() < deadline and not self.stopping.is_set() \
                and req.body(block):
            sent += len(block)
        req.close()

    def serve_file(self, req, path, fault, extra_headers=(), etag=None):
        if path is None:
            req.simple(404, b"not found\n")
            return
        with open(path, "rb") as f:  # one open file: a replace() mid-answer does not mix contents
            st = os.fstat(f.fileno())
            size = st.st_size
            kind = fault.kind if fault else None
            p = fault.params if fault else {}
            etag = etag or f'"{st.st_mtime_ns:x}-{size:x}"'
            if kind == "weak_etag":
                etag = "W/" + etag
            base = [("ETag", etag), ("Last-Modified", email.utils.formatdate(
                st.st_mtime, usegmt=True)), ("Accept-Ranges", "bytes"), *extra_headers]
            if not self._preconditions_hold(req, etag, st.st_mtime):
                req.simple(412, b"precondition failed\n", base)
                return
            rng = parse_range(req.headers.get("Range"), size)
            if rng == "bad":
                req.simple(416, b"", [("Content-Range", f"bytes */{size}"), *base])
                return
            total = size + p.get("delta", 1 << 20) if kind == "wrong_total" else size
            if rng is None or kind == "ignore_range":
                start, end, status, cr = 0, size - 1, 200, []
            else:
                start, end = rng
                status = 206
                if kind == "bad_range":
                    shift = p.get("shift", 1)
                    start, end = (start + shift, min(end + shift, size - 1)) if start + shift < size \
                        else (start - shift, end - shift)
                cr = [("Content-Range", f"bytes {start}-{end}/{total}")]
            n = end - start + 1 if size else 0
            length = n
            if kind == "long_body":
                length = n + p.get("extra", 4096)
            if status == 200 and kind == "wrong_total":
                length = total
            if kind == "encoded":
                body = gzip.compress(os.pread(f.fileno(), n, start))[:n].ljust(n, b"\0")
                req.head(status, [("Content-Length", n), ("Content-Encoding", "gzip"), *cr, *base])
                if req.method != "HEAD":
                    req.body(body)
                return
            req.head(status, [("Content-Length", length), *cr, *base])
            if req.method == "HEAD":
                return
            self._send_body(req, f, start, n, length, kind, p)

    @staticmethod
    def _preconditions_hold(req, etag, mtime):
        """If-Match (strong comparison, RFC 9110 13.1.1: a weak tag never matches) and
        If-Unmodified-Since (whole seconds, as Last-Modified has them)."""
        im = req.headers.get("If-Match")
        if im is not None and im.strip() != "*":
            tags = [t.strip() for t in im.split(",")]
            if etag.startswith("W/") or etag not in tags:
                return False
        ius = req.headers.get("If-Unmodified-Since")
        if ius is not None:
            try:
                when = email.utils.parsedate_to_datetime(ius).timestamp()
            except (TypeError, ValueError):
                return True  # an invalid date is ignored (RFC 9110 13.1.4)
            if int(mtime) > when:
                return False
        return True

    def _send_body(self, req, f, start, n, length, kind, p):
        cut = p.get("after", n // 2) if kind in ("drop", "truncate", "stall") else n
        if kind == "hold":
            cut = max(p["at"] - start, 0)
        cut = min(cut, n)
        chunk = p.get("chunk", 16384) if kind == "slow" else 1 << 20
        pos = 0
        while pos < cut:
            m = min(chunk, cut - pos)
            if not req.body(os.pread(f.fileno(), m, start + pos)):
                return
            pos += m
            if kind == "slow":
                time.sleep(p.get("delay", 0.01))
        if kind == "drop":
            req.close(reset=True)
        elif kind == "truncate":
            req.close()
        elif kind == "stall":
            self.stopping.wait(p.get("seconds", 30))
            req.close()
        elif kind == "hold" and cut < n:
            p["reached"].set()
            deadline = time.monotonic() + p.get("seconds", 60)
            while not p["until"].wait(0.05) and not self.stopping.is_set() \
                    and time.monotonic() < deadline:
                pass
            if not p["until"].is_set():
                req.close()
                return
            while cut < n and req.body(os.pread(f.fileno(), min(1 << 20, n - cut), start + cut)):
                cut += min(1 << 20, n - cut)
        elif kind == "long_body":
            req.body(b"\xee" * (length - n))
        elif kind == "wrong_total" and length > n:
            req.close()  # a 200 claiming the lying size ends where the file does


# --- a stand-in for the Hugging Face Hub ---------------------------------------------------

# What the Hub stores through git-lfs by default (its stock .gitattributes): these resolve to a
# 302 to the CDN; anything else (config.json, the index) is answered by the Hub itself.
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".npy", ".npz", ".h5",
                ".msgpack", ".onnx", ".pkl", ".zip")


def git_blob_oid(data):
    """The git object id of a blob (what the Hub reports as a file's oid)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubServer(FileServer):
    """with HubServer(store, cdn) as hub: hub.add_repo("org/name", {"model.safetensors": b...})

    The parts of the Hugging Face Hub a client of `hf://` uses, as huggingface_hub's
    `hf_hub_url`, `get_hf_file_metadata`, `HfApi.model_info` and `HfApi.list_repo_tree`
    document and call them (endpoint = self.base, what HF_ENDPOINT names):

      GET  /api/models/{org}/{name}[/revision/{rev}]  JSON {id, modelId, sha, private,
           lastModified, siblings: [{rfilename}]}; rev is a branch, a tag or a 40-hex commit,
           percent-encoded (refs%2Fpr%2F1)
      GET  /api/models/{org}/{name}/tree/{rev}[/{dir}][?recursive=true]  JSON list of
           {type: file|directory, oid, size, path, lfs?: {oid, size, pointerSize}}
      GET|HEAD /{org}/{name}/resolve/{rev}/{path}  for an LFS file: 302 to the CDN
           (cdn.url("{org}/{name}/{commit}/{path}") plus a presigned-looking query) with
           X-Repo-Commit, ETag and X-Linked-Etag (the quoted sha256), X-Linked-Size; for another
           file: 200 (Range honoured) with X-Repo-Commit and ETag (the quoted git blob oid)

    Checked by hand against huggingface_hub 0.26.5 itself (HF_ENDPOINT at this server):
    model_info, list_repo_tree, get_hf_file_metadata, hf_hub_download (public, private with
    and without token), EntryNotFound/RevisionNotFound/RepositoryNotFound errors all as on the Hub.

    Errors as the Hub answers them: a private repo (or an unknown one) without
    `Authorization: Bearer <token>` -> 401 with X-Error-Code: RepoNotFound; a wrong token -> 401;
    unknown revision -> 404 RevisionNotFound; unknown file -> 404 EntryNotFound.
    The files of commit C of repo R live in store/R/C/ so that the CDN (an Nginx or FileServer
    on another address, given as `cdn`) serves them by path. The request log records whether an
    Authorization header came, never its value."""

    def __init__(self, store, cdn=None, token="hf_netlab_TOKEN_never_printed", host="127.0.0.1", tls=None):
        super().__init__(store, host=host, tls=tls)
        self.cdn, self.token = cdn, token
        self.repos = {}  # repo_id -> {"private": bool, "refs": {name: sha}, "commits": {sha: [paths]}}

    def add_repo(self, repo_id, files, branch="main", private=False, tags=()):
        """Commits files ({path: bytes}) as the new head of branch (the whole tree: no parent's
        files carry over) and returns the commit sha; tags name the same commit."""
        repo = self.repos.setdefault(repo_id, {"private": private, "refs": {}, "commits": {}})
        repo["private"] = private
        h = hashlib.sha1(f"{repo_id}\0{branch}\0{len(repo['commits'])}".encode())
        for path in sorted(files):
            h.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
        sha = h.hexdigest()
        for path, data in files.items():
            dest = self.root / repo_id / sha / path
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        with self.lock:
            repo["commits"][sha] = sorted(files)
            repo["refs"][branch] = sha
            for t in tags:
                repo["refs"][t] = sha
        return sha

    # --- routing ---

    def route(self, req, fault):
        if fault is not None and self.early_fault(req, fault):
            return
        parts = req.path.split("/")
        if len(parts) >= 5 and parts[1:3] == ["api", "models"]:
            self._api(req, parts[3:])
        elif len(parts) >= 6 and parts[3] == "resolve":
            repo_id = "/".join(parts[1:3])
            rev = urllib.parse.unquote(parts[4])
            self._resolve(req, fault, repo_id, rev, urllib.parse.unquote("/".join(parts[5:])))
        else:
            self._error(req, 404, "NotFound", "Not found")

    def _error(self, req, status, code, message):
        req.simple(status, json.dumps({"error": message}).encode(),
                   [("Content-Type", "application/json"), ("X-Error-Code", code)])

    def _json(self, req, obj):
        req.simple(200, json.dumps(obj).encode(), [("Content-Type", "application/json")])

    def _commit(self, req, repo_id, rev):
        """(repo, sha) after the Hub's checks, or None once an error was answered."""
        repo = self.repos.get(repo_id)
        auth = req.headers.get("Authorization")
        if auth is not None and auth != f"Bearer {self.token}":
            self._error(req, 401, "InvalidCredentials", "Invalid credentials in Authorization header")
            return None
        if repo is None or (repo["private"] and auth is None):
            self._error(req, 401, "RepoNotFound", "Repository not found")
            return None
        sha = rev if rev in repo["commits"] else repo["refs"].get(rev)
        if sha is None:
            self._error(req, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return None
        return repo, sha

    def _api(self, req, rest):
        # rest: [org, name] or [org, name, "revision", rev] or [org, name, "tree", rev, *dir]
        repo_id = "/".join(rest[:2])
        if len(rest) == 2:
            what, rev, sub = "revision", "main", []
        elif len(rest) >= 4 and rest[2] in ("revision", "tree"):
            what, rev, sub = rest[2], urllib.parse.unquote(rest[3]), rest[4:]
        else:
            self._error(req, 404, "NotFound", "Not found")
            return
        found = self._commit(req, repo_id, rev)
        if found is None:
            return
        repo, sha = found
        paths = repo["commits"][sha]
        if what == "revision":
            self._json(req, {"_id": sha[:24], "id": repo_id, "modelId": repo_id, "sha": sha,
                             "private": repo["private"], "lastModified": "2026-01-01T00:00:00.000Z",
                             "siblings": [{"rfilename": p} for p in paths]})
            return
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(req.uri).query)
        recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
        self._json(req, self._tree(repo_id, sha, paths, "/".join(sub).strip("/"), recursive))

    def _tree(self, repo_id, sha, paths, prefix, recursive):
        out, dirs = [], set()
        for p in paths:
            if prefix and not p.startswith(prefix + "/"):
                continue
            rel = p[len(prefix) + 1:] if prefix else p
            segs = rel.split("/")
            for i in range(1, len(segs) if recursive else min(len(segs), 2)):
                d = "/".join(([prefix] if prefix else []) + segs[:i])
                if d not in dirs:
                    dirs.add(d)
                    out.append({"type": "directory", "oid": git_blob_oid(d.encode()), "size": 0, "path": d})
            if len(segs) > 1 and not recursive:
                continue
            data = (self.root / repo_id / sha / p).read_bytes()
            ent = {"type": "file", "oid": git_blob_oid(data), "size": len(data), "path": p}
            if p.endswith(LFS_SUFFIXES):
                ent["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            out.append(ent)
        return out

    def _resolve(self, req, fault, repo_id, rev, path):
        found = self._commit(req, repo_id, rev)
        if found is None:
            return
        repo, sha = found
        if path not in repo["commits"][sha]:
            self._error(req, 404, "EntryNotFound", f"{path} does not exist at {rev}")
            return
        local = self.root / repo_id / sha / path
        commit = [("X-Repo-Commit", sha)]
        if path.endswith(LFS_SUFFIXES) and self.cdn is not None:
            h = hashlib.sha256()
            with open(local, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            etag = f'"{h.hexdigest()}"'
            # Presigned-looking, as the Hub's CDN URLs are: the signature is in the query.
            loc = (self.cdn.url(f"{repo_id}/{sha}/{urllib.parse.quote(path)}")
                   + "?X-Amz-Expires=3600&X-Amz-Signature=" + h.hexdigest()[:32])
            req.simple(302, b"", [*commit, ("ETag", etag), ("X-Linked-Etag", etag),
                                  ("X-Linked-Size", local.stat().st_size), ("Location", loc)])
            return
        self.serve_file(req, local, fault, commit, etag=f'"{git_blob_oid(local.read_bytes())}"')


# --- the client side: what the tests need around a mount of a URL ---------------------------

# Reads files in a separate process, so that a hung read is a failed test and not a hung
# session: for each path, its sha256 or the errno name the read (or open) failed with.
_READER = r"""
import errno, hashlib, json, os, sys
out = {}
uncached = sys.argv[1] == "uncached"
for p in sys.argv[2:]:
    try:
        with open(p, "rb") as f:
            if uncached:  # what the kernel holds of it goes: the read asks the daemon
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            h = hashlib.sha256()
            while True:
                b = f.read(1 << 20)
                if not b:
                    break
                h.update(b)
        out[p] = ["ok", h.hexdigest()]
    except OSError as e:
        out[p] = ["err", errno.errorcode.get(e.errno, str(e.errno))]
print(json.dumps(out))
"""

READ_TIMEOUT = 120  # seconds for a batch of reads through a mount (a hang fails the test)


def read_many(paths, timeout=READ_TIMEOUT, uncached=False):
    """{str(path): ("ok", sha256 hex) | ("err", "EIO"/"ESTALE"/...)} read by a child process;
    uncached: each file's pages are dropped from the page cache first (POSIX_FADV_DONTNEED)."""
    p = subprocess.run([sys.executable, "-S", "-c", _READER, "uncached" if uncached else "cached",
                        *map(str, paths)], env=plain_env(),
                       capture_output=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"reader failed: {p.stderr.decode(errors='replace')}")
    return {k: tuple(v) for k, v in json.loads(p.stdout).items()}


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def sample_tensors(seed=17):
    """(name, dtype, shape, bytes) of a small transformer-like checkpoint, random bytes,
    about 12 MiB: tensors from a few bytes to several MiB, so reads cross the client's
    block boundaries and some tensors share a block."""
    import random
    rng = random.Random(seed)
    specs = [("embed.weight", "F32", [1024, 1024]),
             ("layers.0.attn.q.weight", "BF16", [1024, 1024]),
             ("layers.0.attn.k.weight", "BF16", [256, 1024]),
             ("layers.0.norm.weight", "F32", [1024]),
             ("layers.0.mlp.up.weight", "F16", [1536, 1024]),
             ("layers.0.mlp.down.weight", "F16", [1024, 1536]),
             ("layers.1.norm.bias", "F32", [3]),
             ("layers.1.scale", "I64", []),
             ("head.weight", "F32", [512, 1000])]
    # Imported here, not at the top: scripts/bench-http imports this module without pytest
    # and torch, which ckptfs_testlib needs.
    from ckptfs_testlib import numel, DTYPE_BITS
    return [(n, d, s, rng.randbytes(numel(s) * DTYPE_BITS[d] // 8)) for n, d, s in specs]


def daemon_peak_rss_kib(mnt, field="VmHWM"):
    """VmHWM (peak resident set, KiB) of the ckptfs daemon serving mnt; field="VmRSS": now."""
    from ckptfs_testlib import ckptfs_pids  # (see sample_tensors)
    pids = ckptfs_pids(mnt)
    assert len(pids) == 1, f"daemons for {mnt}: {pids}"
    for line in Path(f"/proc/{pids[0]}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field}")


def sanitized():
    """Whether the ckptfs under test is an ASan build (whose shadow memory and quarantine make
    its resident set no measure of what the code keeps)."""
    from ckptfs_testlib import ckptfs_bin  # (see sample_tensors)
    return b"__asan_init" in ckptfs_bin().read_bytes()


# --- added latency without netem -----------------------------------------------------------

class DelayRelay(Lifetime):
    """with DelayRelay(port, delay=0.010) as relay: relay.port ...

    A TCP relay on 127.0.0.1 that forwards each connection to 127.0.0.1:port and delivers
    every chunk, in both directions, `delay` seconds after it arrived: a round trip `2 * delay`
    longer, for kernels without `tc netem`. Each direction buffers at most QUEUE_BYTES in flight
    (then stops reading: backpressure), so memory is bounded; an idle connection is closed after
    IDLE seconds; stop() closes everything and joins the threads."""

    QUEUE_BYTES = 64 << 20
    IDLE = 120

    def __init__(self, port, delay=0.010, host="127.0.0.1"):
        self.target, self.delay, self.host = ("127.0.0.1", port), delay, host
        self.port = None
        self.threads, self.socks = [], []
        self.stopping = threading.Event()

    def start(self):
        self.listener = socket.create_server((self.host, 0))
        self.listener.settimeout(0.1)
        self.port = self.listener.getsockname()[1]
        self._spawn(self._accept)
        return self

    def _spawn(self, fn, *args):
        t = threading.Thread(target=fn, args=args, daemon=True)
        t.start()
        self.threads.append(t)

    def _accept(self):
        while not self.stopping.is_set():
            try:
                a, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                b = socket.create_connection(self.target, timeout=10)
            except OSError:
                a.close()
                continue
            for s in (a, b):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.settimeout(1)
            self.socks += [a, b]
            self._pipe(a, b)
            self._pipe(b, a)

    def _pipe(self, src, dst):
        import collections
        q = collections.deque()
        cv = threading.Condition()
        state = {"bytes": 0, "eof": False}

        def reader():
            idle = 0
            while not self.stopping.is_set():
                with cv:
                    while state["bytes"] >= self.QUEUE_BYTES and not self.stopping.is_set():
                        cv.wait(0.1)
                try:
                    data = src.recv(1 << 18)
                except socket.timeout:
                    idle += 1
                    if idle > self.IDLE:
                        break
                    continue
                except OSError:
                    break
                idle = 0
                with cv:
                    if not data:
                        break
                    q.append((time.monotonic() + self.delay, data))
                    state["bytes"] += len(data)
                    cv.notify_all()
            with cv:
                state["eof"] = True
                cv.notify_all()

        def writer():
            while not self.stopping.is_set():
                with cv:
                    while not q and not state["eof"] and not self.stopping.is_set():
                        cv.wait(0.1)
                    if not q:
                        if state["eof"] or self.stopping.is_set():
                            break
                        continue
                    due, data = q[0]
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                try:
                    dst.sendall(data)
                except OSError:
                    break
                with cv:
                    q.popleft()
                    state["bytes"] -= len(data)
                    cv.notify_all()
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

        self._spawn(reader)
        self._spawn(writer)

    def stop(self):
        self.stopping.set()
        self.listener.close()
        for s in self.socks:
            try:
                s.close()
            except OSError:
                pass
        for t in self.threads:
            t.join(timeout=STOP_TIMEOUT)
