"""Containers as users run them: the sidecar pattern Kubernetes uses for FUSE
(docs/CONTAINERS.md). A privileged sidecar container runs `ckptfs -f` and mounts the checkpoint
in a volume it has with mountPropagation Bidirectional; the application container, started
before the mount exists, has the volume with HostToContainer and sees the mount appear.

Both containers are the wheel's minbase root (wheelroot.Root: the wheel pip-installed, torch 2.x)
run in mount and PID namespaces of their own, podman being unable to start containers here. The
"node" is a mount namespace the test makes, where the volume's directory is a shared mount (as a
pod's volumes are on a node) and nothing else is: the host's own mounts never change.

The application loads through the mount with ckload: the source is not visible to it, so the
load reads the mount (its read_path says "mount"), and every byte is the safetensors library's
reading the source on the host. The sidecar stopping (SIGTERM, SIGKILL) gives the application
errors, within a bound, never a hang or a wrong byte; a restarted sidecar serves again. The stop
always lands in the middle of a load: the sidecar it stops reads the source from an HTTP server
of the test's on 127.0.0.1, which holds back every byte from early in the largest tensor on until
the daemon has taken the signal. The manifests docs/CONTAINERS.md shows parse, and say what this
test runs."""
import ctypes
import errno
import hashlib
import json
import os
import re
import select
import shlex
import signal
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch
import safetensors.torch
import yaml

import netlab
import wheelroot
from ckptfs_testlib import REPO, library_view, wait_until

DOC = REPO / "docs" / "CONTAINERS.md"
MODEL = "/vol/model"      # where the sidecar mounts the checkpoint (the manifests' command)
SOURCE = "/src/model.safetensors"  # the checkpoint, inside the sidecar only
REPLY_TIMEOUT = 120       # seconds any one step of the application may take (torch's import)
STOP_TIMEOUT = 30         # seconds the sidecar may take to exit once signalled
# Each thing the application does after the sidecar stopped runs in a thread of its own, given
# this long: one still waiting then is a hang, and the test says which one.
PROBE_TIMEOUT = 20


def dies_with_us():
    """Popen's preexec_fn: the child is killed when the test's process ends, however it ends
    (PR_SET_PDEATHSIG), so that no node or container outlives a killed test run."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def line_within(stream, seconds, what):
    """One line of a child's stdout, or the test fails (never waits longer than seconds)."""
    ready, _, _ = select.select([stream], [], [], seconds)
    assert ready, f"{what}: no answer within {seconds}s (hung?)"
    line = stream.readline()
    assert line, f"{what}: the process ended"
    return line


class Node:
    """A mount namespace of the test's own, held by a sleeping process: the volume's directory a
    shared mount there. Containers are started in it (nsenter); it ends with its holder, and
    with it every mount the containers left."""

    def __init__(self, volume):
        q = shlex.quote(str(volume))
        script = (f"mount --bind {q} {q} && mount --make-shared {q} && echo ready && "
                  "exec sleep 3600")
        self.proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private",
                                      "sh", "-c", script], stdout=subprocess.PIPE,
                                     preexec_fn=dies_with_us)
        assert line_within(self.proc.stdout, 30, "node") == b"ready\n"

    def enter(self, argv):
        return ["nsenter", f"--mount=/proc/{self.proc.pid}/ns/mnt", "--"] + argv

    def mounts(self, path):
        """The fuse.ckptfs mounts at path, as the node sees them (its mountinfo)."""
        return fuse_mounts(Path(f"/proc/{self.proc.pid}/mountinfo").read_text(), path)

    def close(self):
        self.proc.kill()
        self.proc.wait(timeout=30)


def fuse_mounts(mountinfo, path):
    """Lines of a mountinfo text that are fuse.ckptfs mounts at path."""
    return [line for line in mountinfo.splitlines()
            if line.split()[4] == path and " - fuse.ckptfs " in line]


class Container:
    """A container in the node: the root, its own mount and PID namespaces, its volumes; fuse:
    its /dev (rootfs.py's: "device" as `--device /dev/fuse` gives it, None without)."""

    def __init__(self, node, root, argv, volumes, fuse, binds=(), env=None, log=None,
                 stdin=None):
        cmd = node.enter(wheelroot.container(root, argv, env=env, binds=binds, fuse=fuse,
                                             volumes=volumes))
        self.log = log
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=err,
                                         preexec_fn=dies_with_us)

    def init_pid(self):
        """The host's PID of the container's PID 1 (what kubelet signals): the child of the
        `unshare --pid --fork` the container was started with, once it is in a PID namespace
        of its own (the children before are the setup's mount commands)."""
        task = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        ours = os.readlink("/proc/self/ns/pid")

        def init():
            for kid in task.read_text().split():
                try:
                    if os.readlink(f"/proc/{kid}/ns/pid") != ours:
                        return int(kid)
                except OSError:
                    pass
            return None
        assert wait_until(lambda: init() or self.proc.poll() is not None), \
            f"the container never started: {self.stderr()}"
        pid = init()
        assert pid, f"the container ended: {self.stderr()}"
        return pid

    def pid_ns(self):
        return os.readlink(f"/proc/{self.init_pid()}/ns/pid")

    def stderr(self):
        return Path(self.log).read_text()

    def stop(self, sig=signal.SIGKILL):
        if self.proc.poll() is None:
            os.kill(self.init_pid(), sig)
        return self.wait()

    def wait(self):
        """The container's exit status, once it has ended (within STOP_TIMEOUT)."""
        self.proc.wait(timeout=STOP_TIMEOUT)
        return self.proc.returncode


def manifests():
    """Every YAML document of docs/CONTAINERS.md's ```yaml blocks."""
    blocks = re.findall(r"^```yaml\n(.*?)^```$", DOC.read_text(), re.S | re.M)
    assert blocks, f"{DOC}: no yaml block"
    return [d for b in blocks for d in yaml.safe_load_all(b)]


def container_of(spec, name):
    found = [c for c in spec["containers"] if c["name"] == name]
    assert len(found) == 1, (name, spec)
    return found[0]


def mounts_of(container):
    """A container's volumeMounts: {volume name: (mountPath, mountPropagation or None)}."""
    return {m["name"]: (m["mountPath"], m.get("mountPropagation"))
            for m in container["volumeMounts"]}


def the_pod():
    """The sidecar Pod of docs/CONTAINERS.md: (its ckptfs container, its app container)."""
    pods = [d for d in manifests() if d["kind"] == "Pod" and len(d["spec"]["containers"]) == 2]
    assert len(pods) == 1, pods
    spec = pods[0]["spec"]
    return container_of(spec, "ckptfs"), container_of(spec, "app")


def volumes(container, volume):
    """What rootfs.py's `volumes` makes of a container's propagated volumeMounts, the host's
    directory being `volume`."""
    return [(str(volume), at, how) for at, how in mounts_of(container).values() if how]


# The application: one JSON request a line on stdin, one JSON answer a line on stdout.
APP = r"""
import errno, hashlib, json, os, sys, threading, time
import ckload, torch

MODEL = sys.argv[1]
held, inflight = {}, None

def mounts():
    with open("/proc/self/mountinfo") as f:
        return [l for l in f.read().splitlines()
                if l.split()[4] == MODEL and " - fuse.ckptfs " in l]

def data(b):
    return hashlib.sha256(b).hexdigest()

def tensor_data(ld, i):
    return data(ld.tensor(i).contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())

def load(path):
    with ckload.Load(path, device="cpu") as ld:
        ld.wait_all()
        out = {ld.name(i): tensor_data(ld, i) for i in range(len(ld))}
        return {"read_path": ld.read_path, "tensors": out}

def load_caught(path):
    # a load the sidecar's stop is to catch midway: its error and the tensors the failed load
    # still hands out (those that landed before the stop), or, had it finished, every tensor
    with ckload.Load(path, device="cpu") as ld:
        try:
            ld.wait_all()
        except Exception as e:
            handed = {}
            for i in range(len(ld)):
                try:
                    handed[ld.name(i)] = tensor_data(ld, i)
                except Exception:
                    pass
            return {"error": [type(e).__name__, str(e)], "handed": handed}
        return {"finished": {ld.name(i): tensor_data(ld, i) for i in range(len(ld))}}

def read(path):
    with open(path, "rb") as f:
        return data(f.read())

def start(fn, *args):
    # fn in a thread of its own, what it did to be told by finish
    box = {}
    def go():
        try:
            box["ok"] = fn(*args)
        except OSError as e:
            box["error"] = [type(e).__name__, e.errno and errno.errorcode.get(e.errno), str(e)]
        except Exception as e:
            box["error"] = [type(e).__name__, None, str(e)]
    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t, box

def finish(started):
    # what a started fn did, given a bound: its value, its error, or "hung"
    t, box = started
    t.join(float(os.environ["PROBE_TIMEOUT"]))
    return box if not t.is_alive() else {"hung": True}

def outcome(fn, *args):
    return finish(start(fn, *args))

for line in sys.stdin:
    req = json.loads(line)
    op, ans = req["op"], {}
    if op == "wait":
        # until the mounts at MODEL number req["n"] and, if one, it answers, or the bound
        # passes. A listing, as the application's wait in docs/CONTAINERS.md: it asks the
        # daemon, where a lookup can be answered from the kernel's cache of a dead mount
        def live():
            try:
                return bool(os.listdir(MODEL + "/.ckptfs"))
            except OSError:
                return False
        end = time.monotonic() + req["seconds"]
        while ((len(mounts()) != req["n"] or (req["n"] and not live())) and
               time.monotonic() < end):
            time.sleep(0.05)
        ans = {"mounts": mounts(), "live": live()}
    elif op == "visible":
        ans = {p: os.path.exists(p) for p in req["paths"]}
    elif op == "load":
        ans = outcome(load, MODEL)
    elif op == "start load":
        inflight = start(load_caught, req["path"])
    elif op == "hold":
        held[req["path"]] = os.open(req["path"], os.O_RDONLY)
        ans = {"ok": True}
    elif op == "probe":
        # everything the application may do once its sidecar stopped
        fd = held[req["path"]]
        ans = {"mounts": mounts(),
               "in-flight load": finish(inflight),
               "held fd": outcome(lambda: data(os.pread(fd, 1 << 24, 0))),
               "open": outcome(read, req["path"]),
               "stat": outcome(lambda: os.stat(MODEL).st_ino),
               "listdir": outcome(os.listdir, MODEL),
               "ckload": outcome(load, MODEL)}
    elif op == "drop":
        for fd in held.values():
            try:
                os.close(fd)
            except OSError:
                pass  # a dead mount's file: its close may fail (ENOTCONN); it is closed all the same
        held.clear()
    print(json.dumps(ans), flush=True)
"""


class App(Container):
    """The application container: its volumeMounts from the manifest (the volume as
    HostToContainer), no /dev/fuse, no sight of the source; the driver APP answers ask()."""

    def __init__(self, node, root, spec, volume, log):
        # CKLOAD_BYPASS=0: the HTTP source the first sidecar reads is on the network the
        # containers share here, where ckload would read it itself; in a pod it reads the mount
        super().__init__(node, root, [f"{wheelroot.VENV}/bin/python", "-c", APP, MODEL],
                         volumes=volumes(spec, volume), fuse=None,
                         env={"PROBE_TIMEOUT": str(PROBE_TIMEOUT), "CKLOAD_BYPASS": "0"},
                         log=log, stdin=subprocess.PIPE)

    def ask(self, op, timeout=REPLY_TIMEOUT, **kw):
        self.proc.stdin.write((json.dumps({"op": op, **kw}) + "\n").encode())
        self.proc.stdin.flush()
        try:
            return json.loads(line_within(self.proc.stdout, timeout, f"the application's {op}"))
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.stderr()}") from None


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return wheelroot.Root(tmp_path_factory.mktemp("sidecar") / "root", wheelroot.built_wheel())


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A checkpoint of several dtypes, 32 MiB: what the daemon's workers can hold of it past the
    point where the server holds the load (held_from) is far less than the rest."""
    d = tmp_path_factory.mktemp("sidecar-src")
    g = torch.Generator().manual_seed(7)
    safetensors.torch.save_file({
        "enc.w": torch.randn(256, 257, generator=g),
        "enc.b": torch.randn(1000, generator=g).to(torch.bfloat16),
        "head.ids": torch.randint(-2**40, 2**40, (999,), generator=g),
        "head.mask": torch.rand(333, generator=g) > 0.5,
        "big": torch.randn(8 << 20, generator=g)}, str(d / "model.safetensors"))
    return d / "model.safetensors"


def held_from(source):
    """The byte of the source from which the HTTP server holds the stopped sidecar's reads back:
    one MiB into the largest tensor, so that a load has begun it when it waits there, and what
    the daemon's workers have asked of the rest when the stop comes is far less than the rest."""
    with open(source, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return 8 + n + header["big"]["data_offsets"][0] + (1 << 20)


def has_taken(pid, sig):
    """Whether process pid has taken the signal sig sent to it: gone, or sig no longer pending
    (a thread has run its handler: libfuse's marks the session as ending, after which a worker
    that answers the request it holds takes no other)."""
    try:
        status = dict(line.split(":", 1) for line in
                      Path(f"/proc/{pid}/status").read_text().splitlines())
    except OSError:
        return True
    pending = int(status["ShdPnd"], 16) | int(status["SigPnd"], 16)
    return status["State"].split()[0] in ("Z", "X") or not pending >> (sig - 1) & 1


def tensor_file(name):
    """The mount's file of a tensor (docs/SEMANTICS.md: a dot in a name is a directory)."""
    return f"{MODEL}/" + name.replace(".", "/")


def digest(b):
    """What the application answers for bytes it read (their SHA-256)."""
    return hashlib.sha256(b).hexdigest()


def assert_exact(loaded, lib):
    """A load read through the mount, every tensor's bytes the safetensors library's."""
    assert loaded["read_path"] == "mount", loaded["read_path"]
    assert loaded["tensors"] == {k: digest(v[2]) for k, v in lib.items()}


def no_wrong_bytes(outcome, lib, what):
    """A probe after the sidecar stopped: an error, or the right bytes; never a hang."""
    assert "hung" not in outcome, f"{what} hung"
    if "ok" in outcome and what in ("held fd", "open"):
        assert outcome["ok"] == digest(lib["enc.w"][2]), f"{what}: wrong bytes"
    if "ok" in outcome and what == "ckload":
        assert_exact(outcome["ok"], lib)


def processes_in(pid_ns):
    """Host PIDs of the processes left in a PID namespace (a container's, once stopped)."""
    left = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and os.readlink(d / "ns" / "pid") == pid_ns:
                left.append(int(d.name))
        except OSError:
            pass
    return left


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_sidecar(root, source, tmp_path, sig, fuse):
    lib, _ = library_view(source)
    sidecar_spec, app_spec = the_pod()
    volume = tmp_path / "volume"
    volume.mkdir()
    node = Node(volume)
    sidecars, app = [], None
    src_bind = [(str(source.parent), mounts_of(sidecar_spec)["models"][0], True)]
    on_node = str(volume / os.path.relpath(MODEL, mounts_of(sidecar_spec)["vol"][0]))
    release, reached = threading.Event(), threading.Event()
    server = netlab.FileServer(source.parent).start()
    server.fault("hold", at=held_from(source), until=release, reached=reached)
    try:
        app = App(node, root, app_spec, volume, tmp_path / "app.log")
        # started before the mount exists: nothing at MODEL yet, and the source out of sight
        assert app.ask("wait", n=0, seconds=0) == {"mounts": [], "live": False}
        assert app.ask("visible", paths=[SOURCE, str(source), "/dev/fuse"]) == {
            SOURCE: False, str(source): False, "/dev/fuse": False}

        def start_sidecar(command=sidecar_spec["command"]):
            c = Container(node, root, command,
                          volumes=volumes(sidecar_spec, volume), fuse="device", binds=src_bind,
                          log=tmp_path / f"sidecar{len(sidecars)}.log")
            sidecars.append((c, c.pid_ns()))
            seen = app.ask("wait", n=1, seconds=60)
            assert len(seen["mounts"]) == 1 and seen["live"], (seen, c.stderr())
            # Bidirectional: the node (the host, in Kubernetes) sees it too
            assert len(node.mounts(on_node)) == 1
            return c

        def served():
            loaded = app.ask("load")
            assert "ok" in loaded, (loaded, sidecars[-1][0].stderr())
            assert_exact(loaded["ok"], lib)
            return loaded

        # the Pod's command with the source read over HTTP, so that the server holds the
        # load below where the stop is to catch it
        sh, c, script = sidecar_spec["command"]
        sidecar = start_sidecar([sh, c, script.replace(SOURCE, server.url(source.name))])
        app.ask("hold", path=tensor_file("enc.w"))
        # the mount's pack, named: a mount of a URL does not publish its sources, so ckload takes
        # the mount's root for a plain directory
        app.ask("start load", path=f"{MODEL}/.ckptfs/checkpoint.pack")
        assert reached.wait(REPLY_TIMEOUT), f"the load never reached the held bytes: {app.stderr()}"
        daemon = sidecar.init_pid()

        # the sidecar stops, a load of the application's under way: kubelet's SIGTERM (ckptfs
        # unmounts, the unmount propagates) or SIGKILL (the daemon and its watcher die with the
        # PID namespace; the mount goes or stays, dead, as below). The held bytes go once the
        # daemon has taken the signal: then only the reads its workers hold are answered, far
        # less than the load still needs
        os.kill(daemon, sig)
        assert wait_until(lambda: has_taken(daemon, sig)), "the daemon never took the signal"
        release.set()
        status = sidecar.wait()
        report = app.ask("probe", path=tensor_file("enc.w"))
        print(sig.name, status, json.dumps({k: v if k in ("mounts", "in-flight load") else
                                            v.get("error", "ok") for k, v in report.items()}))
        assert len(node.mounts(on_node)) == len(report["mounts"])
        for what in ("held fd", "open", "stat", "listdir", "ckload"):
            no_wrong_bytes(report[what], lib, what)
        # the load the stop caught fails in one line, and what it still hands out is only what
        # landed whole before the stop, byte-exact: never the tensor it was reading
        caught = report["in-flight load"]
        assert "hung" not in caught and "ok" in caught, caught
        assert "error" in caught["ok"], "the load finished before the stop"
        kind, msg = caught["ok"]["error"]
        assert kind == "Error" and re.fullmatch(
            rf"ckload: {MODEL}/\.ckptfs/checkpoint\.pack: .*: ({os.strerror(errno.ENOTCONN)}|"
            rf"{os.strerror(errno.ECONNABORTED)})", msg), msg
        handed = caught["ok"]["handed"]
        assert "big" not in handed, sorted(handed)
        assert handed == {k: digest(lib[k][2]) for k in handed}
        assert "error" in report["ckload"], report["ckload"]
        # a file the application held fails with ENOTCONN, whatever happened to the mount
        assert report["held fd"]["error"][1] == "ENOTCONN", report["held fd"]
        if sig == signal.SIGTERM:
            assert status == 0, sidecars[-1][0].stderr()  # ckptfs unmounted and exited
        if report["mounts"] == []:
            # the mount went, in the application too, an empty directory again: after SIGTERM
            # ckptfs's own unmount; after SIGKILL, when its watcher (ckptfs-watch) saw the
            # daemon end and detached the mount before the PID namespace's end killed it too
            assert report["listdir"] == {"ok": []}, report
            assert report["open"]["error"][1] == "ENOENT", report["open"]
            assert "holds no checkpoint file" in report["ckload"]["error"][2], report["ckload"]
        else:
            # SIGKILL, the watcher killed first: the mount stays, dead, and what needs the
            # daemon fails with ENOTCONN (the mountpoint's own stat may be answered from the
            # kernel's attribute cache, `-o timeout`)
            assert sig == signal.SIGKILL and len(report["mounts"]) == 1, report
            for what in ("open", "listdir"):
                assert report[what]["error"][1] == "ENOTCONN", (what, report[what])
            assert report["stat"].get("error", [0, "ENOTCONN"])[1] == "ENOTCONN", report["stat"]
            assert "not connected" in report["ckload"]["error"][2], report["ckload"]
        app.ask("drop")

        # a new sidecar serves again (a new mount, not the dead one), and the application
        # reads again
        start_sidecar()
        served()
        sidecars[-1][0].stop(signal.SIGTERM)
        assert app.ask("wait", n=0, seconds=30) == {"mounts": [], "live": False}
    finally:
        release.set()
        for c, _ in sidecars:
            if c.proc.poll() is None:
                c.stop(signal.SIGKILL)
        if app:
            app.stop(signal.SIGKILL)
        node.close()
        server.stop()
    # nothing left: no process of any sidecar (ckptfs, its watcher), no mount of the volume
    for c, ns in sidecars:
        assert processes_in(ns) == [], f"left in a sidecar: {processes_in(ns)}"
    p = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, timeout=30)
    assert p.stdout == b"", p.stdout
    assert str(volume) not in Path("/proc/self/mountinfo").read_text()


def test_manifests():
    """docs/CONTAINERS.md's manifests parse, and say what test_sidecar runs: the Pod's sidecar
    mounts the source read-only, the volume Bidirectional and privileged, the application has it
    HostToContainer at the same path; the DaemonSet runs the same command with the same mounts
    over hostPath volumes, its consumer Pod the same application mount; the docker line runs the
    same command with the same propagation."""
    docs = manifests()
    assert sorted(d["kind"] for d in docs) == ["DaemonSet", "Pod", "Pod"], docs
    sidecar, app = the_pod()
    assert sidecar["command"][:2] == ["sh", "-c"], sidecar["command"]
    assert sidecar["command"][2].endswith(f"exec ckptfs -f {SOURCE} {MODEL}"), sidecar["command"]
    assert sidecar["securityContext"]["privileged"] is True
    assert mounts_of(sidecar) == {"models": (os.path.dirname(SOURCE), None),
                                  "vol": ("/vol", "Bidirectional")}
    assert [m.get("readOnly") for m in sidecar["volumeMounts"]] == [True, None]
    assert mounts_of(app) == {"vol": ("/vol", "HostToContainer")}
    assert "securityContext" not in app

    ds = [d for d in docs if d["kind"] == "DaemonSet"][0]["spec"]["template"]["spec"]
    node_sidecar = container_of(ds, "ckptfs")
    assert node_sidecar["command"] == sidecar["command"]
    assert mounts_of(node_sidecar) == mounts_of(sidecar)
    assert node_sidecar["securityContext"] == sidecar["securityContext"]
    consumer = [d for d in docs if d["kind"] == "Pod" and len(d["spec"]["containers"]) == 1][0]
    assert mounts_of(container_of(consumer["spec"], "app")) == mounts_of(app)
    paths = {v["name"]: v["hostPath"]["path"] for v in ds["volumes"]}
    assert consumer["spec"]["volumes"][0]["hostPath"]["path"] == paths["vol"]

    text = DOC.read_text()
    assert f"sh -c {shlex.quote(sidecar['command'][2])}" in text
    assert "-v /var/lib/ckptfs:/vol:rshared" in text and "-v /var/lib/ckptfs:/vol:rslave" in text
    assert "--device /dev/fuse --cap-add SYS_ADMIN" in text
