"""Loopback servers for the remote-source tests (issue 17): Debian's nginx, plain and TLS.

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
    came: never its value), host, conn (connection serial), proto. `requests()` parses it.
  * Nothing here knows what ckptfs does: the log is the server's account of what was asked.
"""
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

START_TIMEOUT = 10  # seconds for a server to accept connections
STOP_TIMEOUT = 10  # seconds for a server to exit after it is told to


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
    p = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, timeout=60)
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


# --- nginx ---------------------------------------------------------------------------------

# One JSON object per request. $netlab_auth is 1 when an Authorization header came: the log
# records that it came, never what it said.
_LOG_FORMAT = ("'{\"method\":\"$request_method\",\"uri\":\"$request_uri\",\"status\":$status,"
               "\"range\":\"$http_range\",\"if_match\":\"$http_if_match\","
               "\"if_unmodified_since\":\"$http_if_unmodified_since\","
               "\"body_bytes\":$body_bytes_sent,\"bytes\":$bytes_sent,\"auth\":$netlab_auth,"
               "\"host\":\"$http_host\",\"conn\":$connection,\"proto\":\"$server_protocol\"}'")


class Nginx:
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

    @property
    def scheme(self):
        return "https" if self.tls else "http"

    @property
    def base(self):
        return f"{self.scheme}://{self.host}:{self.port}"

    def url(self, rel=""):
        """The URL of root/rel."""
        return f"{self.base}/{str(rel).lstrip('/')}"

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
            self.proc = subprocess.Popen(["nginx", "-p", str(self.dir), "-c", str(self.dir / "nginx.conf")],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=open(self.dir / "stderr", "wb"))
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

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

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


@contextlib.contextmanager
def nginx(root, **kw):
    """Function form of `with Nginx(...)`."""
    srv = Nginx(root, **kw)
    with srv:
        yield srv
