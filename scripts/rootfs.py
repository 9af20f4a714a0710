#!/usr/bin/env python3
"""Foreign root filesystems, made with mmdebstrap from Debian's mirror and cached per machine:
the minimal systems the install tests use as "a machine that never saw our build".

    scripts/rootfs.py tar NAME          the cached tarball of NAME (made on first use), printed
    scripts/rootfs.py run NAME DIR CMD  extract NAME into DIR if DIR is empty, run CMD inside

A root is run as a container is: its own mount and PID namespaces, `/dev` bound from the host
(for `/dev/fuse`), its own `/proc`, the host's network (the test servers listen on 127.0.0.1).
The cache is $CKPTFS_ROOTFS_CACHE (default /var/tmp/ckptfs-rootfs); a tarball's name carries a
hash of what it was made from, so a changed recipe makes a new one and never reuses a stale one.
"""
import hashlib
import os
import shlex
import subprocess
import sys

MIRROR = "http://deb.debian.org/debian"

# name -> (suite, packages).
ROOTS = {
    # what a user's machine has: Python, FUSE's mount helper, no -dev package, no libcurl.
    "minbase": ("bookworm", ["python3", "python3-venv", "fuse3", "ca-certificates"]),
    # a libc older than the wheel's manylinux tag asks (glibc 2.31): pip must refuse the wheel.
    "oldlibc": ("bullseye", ["python3", "python3-venv"]),
}


def cache_dir():
    return os.environ.get("CKPTFS_ROOTFS_CACHE", "/var/tmp/ckptfs-rootfs")


def tarball(name):
    """The cached tarball of root NAME, made now if missing (about 45 s, once per machine)."""
    suite, packages = ROOTS[name]
    recipe = f"{suite} {MIRROR} {' '.join(sorted(packages))}"
    tag = hashlib.sha256(recipe.encode()).hexdigest()[:12]
    path = os.path.join(cache_dir(), f"{name}-{suite}-{tag}.tar")
    if not os.path.exists(path):
        os.makedirs(cache_dir(), exist_ok=True)
        part = path[:-len(".tar")] + ".part.tar"  # mmdebstrap picks the format by suffix
        subprocess.run(["mmdebstrap", "--quiet", "--variant=minbase",
                        "--include=" + ",".join(packages), suite, part, MIRROR], check=True)
        os.rename(part, path)
    return path


def extract(name, root):
    """root holds NAME's files (extracted unless it already has them)."""
    os.makedirs(root, exist_ok=True)
    if not os.listdir(root):
        subprocess.run(["tar", "-xf", tarball(name), "-C", root], check=True)
        # what a Debian system (systemd's tmpfiles) and container images have, and fusermount3
        # reads to unmount a user's mount; mmdebstrap's minbase has none
        mtab = os.path.join(root, "etc", "mtab")
        if not os.path.lexists(mtab):
            os.symlink("../proc/self/mounts", mtab)


# The devices a container has when it is given none (docker's and podman's default /dev).
PLAIN_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")


# Kubernetes' mountPropagation of a volume -> how its bind is made in the container's namespace:
# Bidirectional stays in the volume's peer group (mounts go both ways), HostToContainer becomes
# its slave (mounts come in, none goes out).
PROPAGATION = {"Bidirectional": None, "HostToContainer": "--make-rslave"}


def only_volumes_shared(hosts):
    """The shell step that fails, saying which, where a mount other than the volumes' (or
    mounts under them) is shared: a mount the container makes there would reach the caller's
    namespace, the host's own when the caller did not make one."""
    vols = shlex.quote(" ".join(hosts))
    return ("awk -v vols=" + vols + " 'BEGIN { n = split(vols, v, \" \") } / shared:/ { "
            "ok = 0; for (i = 1; i <= n; i++) ok = ok || $5 == v[i] || index($5, v[i] \"/\") == 1; "
            "if (!ok) { print \"rootfs.py: \" $5 \" is a shared mount: volumes need a mount "
            "namespace of their own where only they are shared\" > \"/dev/stderr\"; exit 1 } }' "
            "/proc/self/mountinfo")


def command(root, argv, env=None, binds=(), fuse="host", volumes=()):
    """argv run inside root as in a container. env: its variables (nothing else passes);
    binds: (host path, path inside, read-only) mounted for it, in its own namespace only (a file
    over a file: /dev/null over a program hides it). fuse: "host", the host's /dev bound;
    "device", a container's /dev (a tmpfs of PLAIN_DEVICES) with a /dev/fuse every user may
    open, as `--device /dev/fuse` gives it and udev makes it; None, a container's /dev without
    /dev/fuse (started without --device /dev/fuse).
    volumes: (host directory, path inside, mountPropagation) shared with other containers, the
    propagation one of PROPAGATION's. A volume's host directory must be a shared mount in a
    mount namespace the caller made (`mount --bind DIR DIR; mount --make-shared DIR` there),
    where nothing else is shared: with volumes the namespaces keep the propagation they find,
    so the command refuses to run where another mount is shared (the host's own namespace,
    under systemd), whose mounts it would otherwise reach."""
    env = env or {}
    inner = ["env", "-i", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
             "HOME=/root", "LANG=C.UTF-8"] + [f"{k}={v}" for k, v in env.items()] + list(argv)
    q = shlex.quote
    propagation = "unchanged" if volumes else "private"
    steps = [only_volumes_shared([host for host, _, _ in volumes])] if volumes else []
    dev = q(os.path.join(root, "dev"))
    if fuse == "host":
        steps += [f"mount --rbind /dev {dev}", f"mount --make-rslave {dev}"]
    else:
        steps += [f"mount -t tmpfs -o mode=755 tmpfs {dev}"]
        for d in PLAIN_DEVICES:
            steps += [f": >{dev}/{d}", f"mount --bind /dev/{d} {dev}/{d}"]
        if fuse == "device":
            st = os.stat("/dev/fuse")
            steps.append(f"mknod -m 666 {dev}/fuse c {os.major(st.st_rdev)} {os.minor(st.st_rdev)}")
    for host, inside, readonly in binds:
        at = q(os.path.join(root, inside.lstrip("/")))
        # a file is bound over a file (made empty if missing), a directory over a directory
        made = (f"mkdir -p {at}" if os.path.isdir(host)
                else f"mkdir -p $(dirname {at}) && {{ [ -e {at} ] || : >{at}; }}")
        steps += [made, f"mount --bind {q(host)} {at}"]
        if readonly:
            steps.append(f"mount -o remount,bind,ro {at}")
    for host, inside, how in volumes:
        at = q(os.path.join(root, inside.lstrip("/")))
        steps += [f"mkdir -p {at}", f"mount --rbind {q(host)} {at}"]
        if PROPAGATION[how]:
            steps.append(f"mount {PROPAGATION[how]} {at}")
    # --kill-child: the container (its PID 1, so all of it) dies with the process that runs it,
    # killed by a timeout or not, rather than outlive it
    steps.append(f"exec unshare --pid --fork --kill-child --propagation {propagation} "
                 f"--root={q(root)} --mount-proc " + " ".join(q(a) for a in inner))
    return ["unshare", "--mount", "--propagation", propagation, "sh", "-c", " && ".join(steps)]


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "tar":
        print(tarball(sys.argv[2]))
        return 0
    if len(sys.argv) >= 5 and sys.argv[1] == "run":
        extract(sys.argv[2], sys.argv[3])
        return subprocess.run(command(sys.argv[3], sys.argv[4:])).returncode
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
