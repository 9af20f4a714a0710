/* main.c — `ckptfs [options] SOURCE MOUNTPOINT`: parse SOURCE completely, then mount its view.
 *
 * Order matters: everything that can fail because of the checkpoint fails before the mount
 * exists, so a bad SOURCE never leaves a mountpoint behind; the command returns only once the
 * kernel has accepted the mount and its first request is answered, so `ckptfs ... && ls
 * MOUNTPOINT` works, and its exit status and message are the mount's.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../sources/http.h" /* http_config: -o cacert, cache_mem, cache_dir, cache_max */
#include "../checkpoint/open.h"
#include "../base/size.h"
#include "ll.h"
#include "../views/mountinfo.h"
#include "watch.h"

#ifndef CKPTFS_VERSION
#error "CKPTFS_VERSION comes from the Makefile (the VERSION file)"
#endif

/* Command-line state that is ours rather than libfuse's. */
struct ck_opts {
    char *source;
    char *mountpoint;
    int direct_io;
    int npy;
    unsigned uid, gid;
    int uid_set, gid_set;
    double timeout;
    unsigned readahead_kb;
    int readahead_set;
    char *cache_mem;
    char *cacert;
    char *cache_dir;
    char *cache_max;
    int auto_unmount;    /* -o auto_unmount given */
    int no_auto_unmount; /* -o noauto_unmount given (mount.fuse.ckptfs: fstab's mounts) */
    int nonempty;        /* -o nonempty: mount over a ckptfs mount, or over SOURCE itself */
    int anonymous;       /* -o anonymous: s3:// requests unsigned (a public bucket) */
    char *extra;         /* the first argument after MOUNTPOINT: a usage error */
};

/* Exit statuses: 0 mounted (or --help, --version), 1 anything else that failed, 2 the
 * command line itself (as ckpt's usage errors). */
enum { EXIT_FAILED = 1, EXIT_USAGE = 2 };

#define CK_OPT(t, p) {t, offsetof(struct ck_opts, p), 1}
static const struct fuse_opt ck_opt_spec[] = {
    CK_OPT("direct_io", direct_io),
    CK_OPT("npy", npy),
    CK_OPT("uid=%u", uid),
    CK_OPT("uid=", uid_set),
    CK_OPT("gid=%u", gid),
    CK_OPT("gid=", gid_set),
    CK_OPT("timeout=%lf", timeout),
    CK_OPT("readahead=%u", readahead_kb),
    CK_OPT("readahead=", readahead_set),
    CK_OPT("cache_mem=%s", cache_mem),
    CK_OPT("cacert=%s", cacert),
    CK_OPT("cache_dir=%s", cache_dir),
    CK_OPT("cache_max=%s", cache_max),
    CK_OPT("auto_unmount", auto_unmount),
    CK_OPT("noauto_unmount", no_auto_unmount),
    CK_OPT("nonempty", nonempty),
    CK_OPT("anonymous", anonymous),
    FUSE_OPT_END,
};

static void usage(FILE *out, const char *prog)
{
    fprintf(out, "usage: %s [options] SOURCE MOUNTPOINT\n\n"
           "Mounts a checkpoint read-only, one file per tensor. SOURCE is a safetensors file,\n"
           "a directory of safetensors shards, a PyTorch checkpoint (torch.save: zip or\n"
           "legacy), a ckptfs pack, a GGUF file, or a NumPy .npy or .npz file; the format is\n"
           "detected by content. SOURCE may be an http:// or https:// URL (read lazily with\n"
           "range requests) or hf://ORG/REPO[@REVISION][/PATH] on the Hugging Face Hub. The mount also has .ckptfs/index.json (every tensor's name,\n"
           "path, dtype and shape) and the whole checkpoint as .ckptfs/checkpoint.pack and\n"
           ".ckptfs/checkpoint.safetensors; .ckptfs/status says \"ok\", or why reads fail.\n"
           "Unmount with `fusermount3 -u MOUNTPOINT`.\n\n"
           "ckptfs options:\n"
           "    -o direct_io           bypass the page cache: bigger reads, no shared mmap\n"
           "    -o npy                 also serve each tensor NAME as NAME.npy (NumPy header,\n"
           "                           then its bytes; np.load(..., mmap_mode='r') works)\n"
           "    -o uid=N,gid=N         owner of every file (default: the mounting user)\n"
           "    -o timeout=S           seconds the kernel caches names and attributes (86400)\n"
           "    -o readahead=KB        the mount's kernel readahead window, set when permitted\n"
           "                           (root); 0 keeps the kernel's 128 (default 4096)\n"
           "    -o cache_mem=SIZE      a URL source's block cache (e.g. 64M, 1G; default 256M)\n"
           "    -o cache_dir=DIR       keep a URL source's blocks in DIR, for later mounts and\n"
           "                           loads (created 0700; also CKPTFS_CACHE_DIR)\n"
           "    -o cache_max=SIZE      DIR's bound (default 10G; also CKPTFS_CACHE_MAX)\n"
           "    -o cacert=FILE         CA certificates (PEM) for https sources (default: the\n"
           "                           system's; also CKPTFS_CACERT)\n"
           "    -o allow_other         let other users in (needs user_allow_other in\n"
           "                           /etc/fuse.conf unless root)\n"
           "    -o nonempty            mount even over a ckptfs mount, or a directory that\n"
           "                           holds SOURCE (which the mount then hides)\n"
           "    -o anonymous           s3:// requests unsigned, whatever credentials are\n"
           "                           around (a public bucket; also CKPTFS_NO_SIGN_REQUEST=1)\n\n"
           "Exit status: 0 mounted, 1 refused or failed, 2 a usage error.\n\n",
           prog);
}

/* Options that mount(8) and fstab pass along but that mean nothing to a FUSE mount: `defaults`
 * and the automount and ownership flags are mount(8)'s own, `_netdev`, `nofail` and `x-*` are
 * for systemd. Dropped, so that an fstab line cannot fail on them. `rw` and `ro` reach libfuse,
 * and every mount is made `ro` after them (add_mount_opts). */
static const char *const fstab_only[] = {
    "defaults", "auto", "noauto", "user", "nouser", "users", "owner", "group", "_netdev",
    "nofail", "comment=", "x-",
};

static int is_fstab_only(const char *arg)
{
    for (size_t k = 0; k < sizeof fstab_only / sizeof *fstab_only; k++) {
        size_t n = strlen(fstab_only[k]);
        int prefix = fstab_only[k][n - 1] == '=' || fstab_only[k][n - 1] == '-';
        if (prefix ? strncmp(arg, fstab_only[k], n) == 0 : strcmp(arg, fstab_only[k]) == 0)
            return 1;
    }
    return 0;
}

/* The first non-option argument is SOURCE, the second MOUNTPOINT, any other one too many: all
 * stay ours, so that a bad one is reported in our one-line form rather than by libfuse's
 * parser (which takes a third as its mountpoint). */
static int opt_proc(void *data, const char *arg, int key, struct fuse_args *outargs)
{
    (void)outargs;
    struct ck_opts *o = data;
    if (key == FUSE_OPT_KEY_NONOPT) {
        char **slot = !o->source ? &o->source : !o->mountpoint ? &o->mountpoint : &o->extra;
        if (!*slot && !(*slot = strdup(arg)))
            return -1;
        return 0;
    }
    if (key == FUSE_OPT_KEY_OPT && is_fstab_only(arg))
        return 0;
    return 1;
}

/* The fd N of a mountpoint "/dev/fd/N" (libfuse >= 3.3: a /dev/fuse descriptor that a
 * privileged helper has already mounted and passed down), or -1 for an ordinary path. */
static int mountpoint_fd(const char *mnt)
{
    unsigned fd;
    int end = 0;
    if (sscanf(mnt, "/dev/fd/%u%n", &fd, &end) != 1 || mnt[end] || fd > INT_MAX)
        return -1;
    return (int)fd;
}

/* Whether fusermount3, which libfuse runs to watch an auto_unmount mount, is on PATH. */
static int have_fusermount(void)
{
    const char *path = getenv("PATH");
    char dir[PATH_MAX];
    for (const char *p = path ? path : ""; *p;) {
        size_t n = strcspn(p, ":");
        if (n && n < sizeof dir - sizeof "/fusermount3") {
            snprintf(dir, sizeof dir, "%.*s/fusermount3", (int)n, p);
            if (access(dir, X_OK) == 0)
                return 1;
        }
        p += n + (p[n] == ':');
    }
    return 0;
}

/* Whether the mount is made with auto_unmount: a daemon that dies (kill -9, a crash) takes its
 * mount with it instead of leaving "Transport endpoint is not connected" behind. The default,
 * unless asked otherwise (noauto_unmount: mount.fuse.ckptfs's, fstab's mounts being the
 * administrator's), the mountpoint is another's (/dev/fd/N), or nobody can do the watching:
 * root's own watcher (watch_unmount), else fusermount3 (libfuse's), when it is not there (a
 * container without it). Then only when asked. */
static int wants_auto_unmount(const struct ck_opts *o, int by_fd)
{
    return o->auto_unmount ||
           (!o->no_auto_unmount && !by_fd && (geteuid() == 0 || have_fusermount()));
}

/* Root watches its own mount (watch.h): libfuse's auto_unmount would mount through fusermount3,
 * whose start costs a small checkpoint's mount many times what root's own mount(2) does
 * (BENCHMARKS.md, "Issue 28: mount latency without fusermount3; where a first read through the
 * mount goes"). Others keep libfuse's watcher, which their mount needs anyway. The socket to
 * the watcher, or -1 for libfuse's (or none). */
static int watch_unmount(int auto_unmount, int by_fd, const char *mountpoint, char *args,
                         size_t args_len)
{
    return auto_unmount && !by_fd && geteuid() == 0
               ? ck_watch_start(mountpoint, args, args_len)
               : -1;
}

/* Mount options every ckptfs mount carries; fsname shows SOURCE in `mount` and `df`, as
 * ck_location_shown has it (a URL without its userinfo and query: they are secrets). */
static int add_mount_opts(struct fuse_args *args, const char *source, int auto_unmount)
{
    char *opts = NULL, *fsname = NULL, shown[CK_SHOWN_MAX];
    int rc = asprintf(&fsname, "fsname=%s", ck_location_shown(source, shown, sizeof shown)) < 0 ||
             fuse_opt_add_opt(&opts, "ro,default_permissions,subtype=ckptfs") ||
             (auto_unmount && fuse_opt_add_opt(&opts, "auto_unmount")) ||
             fuse_opt_add_opt_escaped(&opts, fsname) || /* a ',' in SOURCE stays in the name */
             fuse_opt_add_arg(args, "-o") || fuse_opt_add_arg(args, opts);
    free(fsname);
    free(opts);
    return rc;
}

/* FUSE readahead is the kernel's default 128 KiB, which caps buffered reads at 128 KiB
 * requests; a larger window brings 1 MiB requests and a faster first read (BENCHMARKS.md,
 * "Issue 2: the safetensors mount"). Only root may write the knob: for others, and when asked
 * for 0, the kernel's default stays. An explicit -o readahead that cannot be applied is
 * reported, not fatal. */
static void set_readahead(const char *mnt, unsigned kb, int explicit)
{
    /* The mount's device, without asking the mount itself (that would wait on this very
     * process, which is not serving yet): AT_STATX_DONT_SYNC takes the attributes the kernel
     * has, and the device is the superblock's. */
    struct statx stx;
    char knob[96];
    if (kb == 0 || statx(AT_FDCWD, mnt, AT_STATX_DONT_SYNC, 0, &stx) != 0)
        return;
    snprintf(knob, sizeof knob, "/sys/class/bdi/%u:%u/read_ahead_kb", stx.stx_dev_major,
             stx.stx_dev_minor);
    FILE *f = fopen(knob, "we");
    int ok = f && fprintf(f, "%u\n", kb) > 0;
    ok = f && fclose(f) == 0 && ok;
    if (!ok && explicit)
        fprintf(stderr, "ckptfs: %s: cannot set readahead (%s): %s\n", mnt, knob,
                strerror(errno));
}

/* What libfuse says (fuse_log) while the main thread is `capturing` (in libfuse's parsers and
 * its mount), kept so that it is reported in ckptfs's one-line form (say_refused), never in
 * libfuse's words; every other line (the core's, on any thread) goes to stderr as libfuse's
 * default would. Once the mount serves, ck_ll_log_start takes over. */
static _Thread_local int capturing;
static char libfuse_said[1024];

static void keep_libfuse_said(enum fuse_log_level level, const char *fmt, va_list ap)
{
    size_t n = capturing ? strlen(libfuse_said) : 0;
    if (!capturing)
        vfprintf(stderr, fmt, ap);
    else if (level <= FUSE_LOG_ERR && n + 1 < sizeof libfuse_said)
        vsnprintf(libfuse_said + n, sizeof libfuse_said - n, fmt, ap);
}

/* Reports what libfuse refused, as one line: its "fuse: what is wrong `WHAT'[...]" becomes
 * "ckptfs: WHAT: what is wrong[...]", anything else "ckptfs: about: what it said", and
 * nothing said "ckptfs: about: otherwise". */
static void say_refused(const char *about, const char *otherwise)
{
    char *s = libfuse_said + (strncmp(libfuse_said, "fuse: ", 6) == 0 ? 6 : 0);
    s[strcspn(s, "\n")] = '\0';
    char *open = strchr(s, '`'), *close = open ? strchr(open + 1, '\'') : NULL;
    if (close) {
        *open = *close = '\0';
        for (char *e = open; e > s && strchr(" :", e[-1]); e--)
            e[-1] = '\0';
        fprintf(stderr, "ckptfs: %s: %s%s\n", open + 1, s, close + 1);
    } else {
        fprintf(stderr, "ckptfs: %s: %s\n", about, *s ? s : otherwise);
    }
    libfuse_said[0] = '\0';
}

/* Whether libfuse takes the options left to it (args): a session made and dropped at once,
 * before anything is forked or parsed, so that an option nobody knows is a usage error
 * reported before the work starts, in our words (the session made to mount would find it
 * only after SOURCE is parsed). A session holds no descriptor until it is mounted. */
static int libfuse_accepts(const struct fuse_args *args)
{
    struct fuse_args copy = FUSE_ARGS_INIT(0, NULL);
    int ok = 1;
    for (int i = 0; i < args->argc && ok; i++)
        ok = fuse_opt_add_arg(&copy, args->argv[i]) == 0;
    capturing = 1;
    struct fuse_session *se = ok ? fuse_session_new(&copy, &ck_ll_ops, sizeof ck_ll_ops, NULL)
                                 : NULL;
    capturing = 0;
    ok = se != NULL;
    if (se)
        fuse_session_destroy(se);
    fuse_opt_free_args(&copy);
    return ok;
}

/* FUSE's device, opened first so that a machine (a container) without it is told so in one
 * line before SOURCE is parsed; libfuse opens it again to mount. A user who may not open it
 * may still mount through fusermount3 (set-user-ID root), which is then left to try. */
static int check_fuse_device(void)
{
    int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (fd >= 0) {
        close(fd);
        return 0;
    }
    if (geteuid() != 0 && (errno == EACCES || errno == EPERM))
        return 0;
    fprintf(stderr, "ckptfs: /dev/fuse: %s: FUSE is not usable here (a container needs "
            "--device /dev/fuse)\n", strerror(errno));
    return -1;
}

/* A user other than root mounts through fusermount3 (set-user-ID root, from the system's fuse3,
 * which no pip install can bring): without it libfuse's attempt ends in two lines that name
 * neither the package nor the way around it, so it is looked for first, where have_fusermount
 * looks. */
static int check_fusermount(void)
{
    if (geteuid() == 0 || have_fusermount())
        return 0;
    fprintf(stderr, "ckptfs: fusermount3: not found on PATH: a user other than root mounts "
            "through it (install fuse3, or mount as root)\n");
    return -1;
}

/* Refuses a mountpoint that is already a ckptfs mount (at real, its canonical path): the new
 * mount would hide the old one, whose daemon would then serve nobody until both are
 * unmounted. */
static int check_not_mounted(const char *mnt, const char *real)
{
    ck_mount_at at;
    if (ck_mount_top(CK_MOUNTINFO, real, &at) != 1 || strcmp(at.fstype, "fuse.ckptfs") != 0)
        return 0;
    fprintf(stderr, "ckptfs: %s: already a ckptfs mount of %s; unmount it first (fusermount3 "
            "-u %s), or mount over it with -o nonempty\n", mnt, at.source, mnt);
    return -1;
}

/* Refuses a mountpoint (real: canonical) inside a ckptfs mount: the new mount would keep the
 * outer one busy, so that it could not be unmounted while the inner one lives. The directory
 * that holds real says (real itself may be a mount, which check_not_mounted judges). */
static int check_not_inside(const char *mnt, const char *real)
{
    char *copy = strdup(real);
    struct stat st;
    ck_mount_at at;
    int inside = copy && stat(dirname(copy), &st) == 0 &&
                 ck_mount_of_dev(CK_MOUNTINFO, st.st_dev, &at) == 1 &&
                 strcmp(at.fstype, "fuse.ckptfs") == 0;
    free(copy);
    if (!inside)
        return 0;
    fprintf(stderr, "ckptfs: %s: inside a ckptfs mount of %s, which could then not be unmounted; "
            "mount elsewhere\n", mnt, at.source);
    return -1;
}

/* Whether path lies at or under dir (both canonical). */
static int is_under(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    return strncmp(path, dir, n) == 0 && (path[n] == '/' || path[n] == '\0' || dir[n - 1] == '/');
}

/* Refuses a mountpoint (real: canonical) that holds one of the source files: the mount would
 * hide it, and every open would fail, as the core checks each source file by its path. */
static int check_sources_outside(const ck_fs *fs, const char *mnt, const char *real)
{
    for (uint32_t i = 0; i < fs->ix->nfiles; i++) {
        char buf[PATH_MAX];
        const char *p = realpath(fs->src_path[i], buf) ? buf : fs->src_path[i];
        if (ck_file_is_local(&fs->ix->files[i]) && is_under(p, real)) {
            fprintf(stderr, "ckptfs: %s: holds the source %s, which the mount would hide "
                    "(-o nonempty mounts anyway)\n", mnt, p);
            return -1;
        }
    }
    return 0;
}

static int check_mountpoint(const char *mnt)
{
    struct stat st;
    int fd = mountpoint_fd(mnt);
    if (fd >= 0) { /* must be an open /dev/fuse; libfuse takes it over */
        if (fstat(fd, &st) != 0 || !S_ISCHR(st.st_mode)) {
            fprintf(stderr, "ckptfs: %s: %s\n", mnt,
                    errno == EBADF ? "no such open descriptor" : "not a /dev/fuse descriptor");
            return -1;
        }
        return 0;
    }
    if (stat(mnt, &st) != 0) {
        fprintf(stderr, "ckptfs: %s: %s\n", mnt, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "ckptfs: %s: not a directory\n", mnt);
        return -1;
    }
    return 0;
}

/* Parses SOURCE (its remote files opened through remote) and builds the immutable view over
 * it. */
static int build_view(ck_mount *m, http_remote *remote, const char *source,
                      const struct ck_opts *o)
{
    ck_error err;
    ck_index *ix;
    if (ck_open_through(remote, source, &ix, &err) != 0 ||
        ck_fs_init(&m->fs, ix, o->uid_set ? o->uid : getuid(), o->gid_set ? o->gid : getgid(),
                   ck_ll_log, &err) != 0 ||
        ck_fs_publish_sources(&m->fs, source, &err) != 0) {
        fprintf(stderr, "ckptfs: %s\n", err.msg);
        return -1;
    }
    ck_fs_prepare(&m->fs); /* index.json, while the mount is made */
    m->fs.npy = o->npy;
    m->direct_io = o->direct_io;
    m->timeout = o->timeout;
    return 0;
}

/* Answers the kernel's first request, FUSE_INIT, here rather than in the loop: once it is
 * answered the kernel has fixed the connection's parameters (its INIT handling would shrink a
 * readahead window set earlier), and the mount is usable when this process returns. */
static int serve_init(struct fuse_session *se)
{
    struct fuse_buf buf = {0};
    int rc;
    do
        rc = fuse_session_receive_buf(se, &buf);
    while (rc == -EINTR);
    if (rc > 0)
        fuse_session_process_buf(se, &buf);
    free(buf.mem);
    if (rc <= 0)
        fprintf(stderr, "ckptfs: no FUSE_INIT from the kernel: %s\n", strerror(rc ? -rc : EIO));
    return rc > 0 ? 0 : -1;
}

/* Forks the daemon while this process is still small, and returns in it with *ready the pipe
 * to tell the command it may end (daemon_ready); the command itself waits here and exits with
 * the daemon's verdict: 0 once it is ready, else its exit status, after it has printed why.
 * Forking before the checkpoint is parsed rather than after (as fuse_daemonize would): the
 * daemon then owns every page it touches, instead of copying each on first write, and the
 * command exits with nothing to tear down. -1 when the fork fails. */
static int daemon_fork(int *ready)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        close(p[0]);
        *ready = p[1];
        return 0;
    }
    close(p[1]);
    char ok;
    ssize_t n;
    while ((n = read(p[0], &ok, 1)) < 0 && errno == EINTR)
        ;
    if (n == 1)
        _exit(0);
    int st; /* the daemon ended without being ready: its status is ours */
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    _exit(WIFEXITED(st) && WEXITSTATUS(st) ? WEXITSTATUS(st) : 1);
}

/* Whether stderr is a file (`2>>ckptfs.log`), where the daemon may go on writing. A terminal,
 * a pipe or a socket is the command's, and a reader of a pipe waits for its end. */
static int stderr_is_file(void)
{
    struct stat st;
    return fstat(2, &st) == 0 && S_ISREG(st.st_mode);
}

/* Detaches the daemon (its own session, "/" as its directory, /dev/null as stdin, stdout and
 * stderr, unless keep_stderr) and lets the waiting command end. */
static int daemon_ready(int ready, int keep_stderr)
{
    int null = open("/dev/null", O_RDWR);
    int rc = setsid() < 0 || chdir("/") != 0 || null < 0 || dup2(null, 0) < 0 ||
             dup2(null, 1) < 0 || (!keep_stderr && dup2(null, 2) < 0);
    if (null > 2)
        close(null);
    if (rc)
        return -1;
    rc = write(ready, "", 1) == 1 ? 0 : -1;
    close(ready);
    return rc;
}

static int serve(struct fuse_session *se, const struct fuse_cmdline_opts *co)
{
    if (co->singlethread)
        return fuse_session_loop(se);
    struct fuse_loop_config *cfg = fuse_loop_cfg_create();
    if (!cfg)
        return -ENOMEM;
    fuse_loop_cfg_set_clone_fd(cfg, (unsigned)co->clone_fd);
    fuse_loop_cfg_set_max_threads(cfg, co->max_threads);
    if (co->max_idle_threads != UINT_MAX) /* "unset": libfuse 3.14 would log it as invalid */
        fuse_loop_cfg_set_idle_threads(cfg, co->max_idle_threads);
    int rc = fuse_session_loop_mt(se, cfg);
    fuse_loop_cfg_destroy(cfg);
    return rc;
}

/* -o NAME=VALUE as a size into *v (0 when absent). 0, or -1 reported. */
/* The numeric options' bounds. sscanf reads "-5" as a huge unsigned and "nan" or "1e400" as
 * doubles that libfuse would turn into undefined timeouts: each is refused, named. */
enum { MAX_READAHEAD_KB = 1 << 20 }; /* 1 GiB */
#define MAX_TIMEOUT_S 4294967295.0

static int options_valid(const struct ck_opts *o)
{
    const char *why = !(o->timeout >= 0 && o->timeout <= MAX_TIMEOUT_S)
                          ? "-o timeout: not a number of seconds from 0 to 4294967295"
                      : o->readahead_set && o->readahead_kb > MAX_READAHEAD_KB
                          ? "-o readahead: not a number of KiB from 0 to 1048576"
                      : (o->uid_set && o->uid == ~0u) || (o->gid_set && o->gid == ~0u)
                          ? "-o uid, gid: -1 (4294967295) names no user or group"
                          : NULL;
    if (why)
        fprintf(stderr, "ckptfs: %s\n", why);
    return !why;
}

static int option_size(const char *name, const char *value, uint64_t *v)
{
    *v = value ? ck_parse_size(value, 0) : 0;
    if (value && !*v) {
        fprintf(stderr, "ckptfs: -o %s=%s: not a size (e.g. 64M, 1G)\n", name, value);
        return -1;
    }
    return 0;
}

/* A line of the disk cache's, where the daemon's go (stderr, then syslog once detached). */
static void log_line(const char *line)
{
    char full[1100];
    snprintf(full, sizeof full, "ckptfs: %s", line);
    ck_ll_log(full);
}

/* Memory the parse frees is what the tree, index.json and the serving threads then use: in a
 * VM a page the process touches for the first time is dear, and a mount of many small tensors
 * touches many (BENCHMARKS.md, "Issue 13: mount latency"), so blocks up to HEAP_REUSE stay in
 * the one heap that every thread shares, and are not handed back to the kernel between uses.
 * What stays is bounded: blocks above it still come from and go back to the kernel. */
enum { HEAP_REUSE = 32 << 20 };

static void keep_freed_memory(void)
{
    mallopt(M_MMAP_THRESHOLD, HEAP_REUSE);
    mallopt(M_TRIM_THRESHOLD, HEAP_REUSE);
    mallopt(M_ARENA_MAX, 1);
}

/* The heap the parse is about to grow into, faulted in by a helper thread on the other core
 * while the parse runs: a large checkpoint's parse, tree and index.json touch hundreds of fresh
 * pages, one after another on the thread the mount waits for (BENCHMARKS.md, "Issue 13, fifth
 * round: mount latency"). The window is added to the heap by allocating and freeing it (it
 * stays, as keep_freed_memory says); MADV_POPULATE_WRITE (Linux 5.14) maps its pages without
 * writing them, so it may run while malloc hands the same pages out. Where the window did not
 * come from the brk heap (another allocator, such as the sanitizers'), or the advice is
 * refused, nothing is done: the faults stay on the parse's thread. With one CPU to run on, the
 * helper would only take turns with the parse, and fault pages the parse never uses. The
 * window's size (prefault_size) is what such a parse's heap reaches anyway. */
enum {
    HEAP_PREFAULT = 4 << 20,  /* the most: what a 5,000-tensor .pt's parse and tree take */
    PREFAULT_PER_BYTE = 3,    /* bytes of heap per byte of a file, as that .pt's parse takes */
    PREFAULT_STEP = 256 << 10 /* also the least: a smaller parse is not worth a thread */
};

typedef struct heap_window {
    char *start;
    size_t len;
} heap_window;

/* Faults in the window arg points at, and frees that description. */
static void *prefault_run(void *arg)
{
    heap_window w = *(heap_window *)arg;
    free(arg);
    /* In steps: while it populates, the advice holds the address space's lock for reading,
     * and a step lets a writer (the parse's brk or mmap) in between. */
    for (size_t off = 0; off < w.len; off += PREFAULT_STEP) {
        size_t n = w.len - off < PREFAULT_STEP ? w.len - off : PREFAULT_STEP;
        if (madvise(w.start + off, n, MADV_POPULATE_WRITE) != 0)
            break;
    }
    return NULL;
}

/* Bytes of heap worth faulting ahead of the parse of SOURCE (a local path): a file's size
 * bounds its metadata, so a small file gets a small window (or none); a directory of shards, or
 * a file that cannot be looked at here (ck_open will say why), the largest. */
static size_t prefault_size(const char *source)
{
    struct stat st;
    if (stat(source, &st) != 0 || !S_ISREG(st.st_mode) ||
        (uint64_t)st.st_size >= HEAP_PREFAULT / PREFAULT_PER_BYTE)
        return HEAP_PREFAULT;
    size_t n = (size_t)st.st_size * PREFAULT_PER_BYTE;
    return n < PREFAULT_STEP ? 0 : n;
}

static void prefault_heap(const char *source)
{
    cpu_set_t cpus;
    size_t size = prefault_size(source);
    if (!size || sched_getaffinity(0, sizeof cpus, &cpus) != 0 || CPU_COUNT(&cpus) < 2)
        return;
    char *start = sbrk(0);
    void *volatile window = malloc(size); /* volatile: the pair is not optimised out */
    free(window);
    char *end = sbrk(0);
    if (start == (char *)-1 || end == (char *)-1 || end <= start)
        return;
    heap_window *w = malloc(sizeof *w); /* the thread's to free */
    if (!w)
        return;
    *w = (heap_window){start, (size_t)(end - start)};
    pthread_t t;
    if (pthread_create(&t, NULL, prefault_run, w) == 0)
        pthread_detach(t);
    else
        free(w);
}

int main(int argc, char **argv)
{
    if (argc < 2) { /* nothing asked: how to ask */
        usage(stderr, argc ? argv[0] : "ckptfs");
        return EXIT_USAGE;
    }
    /* the argument block, as the kernel shows it (hide_args below rewrites it in place) */
    char *arg_block = argv[0];
    size_t arg_block_len = (size_t)(argv[argc - 1] - argv[0]) + strlen(argv[argc - 1]) + 1;
    keep_freed_memory();
    struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
    struct ck_opts o = {.timeout = 86400, .readahead_kb = 4096};
    struct fuse_cmdline_opts co = {0};
    ck_mount m = {0};
    struct fuse_session *se = NULL;
    http_remote *remote = NULL; /* every remote file's caches */
    int status = EXIT_FAILED, mounted = 0, ready = -1, watch = -1;
    uint64_t cache_mem, cache_max;

    /* Before anything else: the daemon lives long, and `ps` would show SOURCE's secrets. */
    if (ck_location_hide_args(argc, argv) != 0) {
        fprintf(stderr, "ckptfs: out of memory\n");
        return EXIT_FAILED;
    }
    /* A descriptor per source file for the mount's life (a DCP job's file per rank), besides
     * FUSE's and remote connections': as servers do, all the hard limit allows. */
    ck_nofile_raise();
    fuse_set_log_func(keep_libfuse_said);
    capturing = 1;
    int parsed = fuse_opt_parse(&args, &o, ck_opt_spec, opt_proc) == 0 &&
                 fuse_parse_cmdline(&args, &co) == 0;
    capturing = 0;
    if (!parsed) {
        say_refused("arguments", "malformed");
        status = EXIT_USAGE;
        goto out;
    }
    if (co.show_help) {
        usage(stdout, argv[0]);
        fuse_cmdline_help();
        fuse_lowlevel_help();
        status = 0;
        goto out;
    }
    if (co.show_version) {
        printf("ckptfs %s (libfuse %s)\n", CKPTFS_VERSION, fuse_pkgversion());
        status = 0;
        goto out;
    }
    status = EXIT_USAGE; /* until the command line is known good */
    if (!o.source || !o.mountpoint || o.extra) {
        char shown[CK_SHOWN_MAX]; /* the extra argument may be a URL with its secrets */
        if (o.extra)
            fprintf(stderr, "ckptfs: %s: one argument too many (usage: %s [options] SOURCE "
                    "MOUNTPOINT)\n", ck_location_shown(o.extra, shown, sizeof shown), argv[0]);
        else
            fprintf(stderr, "ckptfs: need SOURCE and MOUNTPOINT (see %s --help)\n", argv[0]);
        goto out;
    }
    if (!libfuse_accepts(&args)) {
        say_refused("options", "not accepted by libfuse");
        goto out;
    }
    if (!options_valid(&o) || option_size("cache_mem", o.cache_mem, &cache_mem) != 0 ||
        option_size("cache_max", o.cache_max, &cache_max) != 0)
        goto out;
    status = EXIT_FAILED;
    if (check_mountpoint(o.mountpoint) != 0)
        goto out;
    int by_fd = mountpoint_fd(o.mountpoint) >= 0; /* the path stays as libfuse parses it */
    if (!(co.mountpoint = by_fd ? strdup(o.mountpoint) : realpath(o.mountpoint, NULL))) {
        fprintf(stderr, "ckptfs: %s: %s\n", o.mountpoint, strerror(errno));
        goto out;
    }
    if (!by_fd && (check_fuse_device() != 0 || check_fusermount() != 0 ||
                   check_not_inside(o.mountpoint, co.mountpoint) ||
                   (!o.nonempty && check_not_mounted(o.mountpoint, co.mountpoint) != 0)))
        goto out;
    if (!co.foreground && daemon_fork(&ready) != 0) {
        fprintf(stderr, "ckptfs: cannot fork the daemon: %s\n", strerror(errno));
        goto out;
    }
    int auto_unmount = wants_auto_unmount(&o, by_fd);
    watch = watch_unmount(auto_unmount, by_fd, co.mountpoint, arg_block, arg_block_len);
    remote = ck_remote_new(&(http_config){.cacert = o.cacert, .anonymous = o.anonymous,
                                          .cache_mem = cache_mem, .cache_dir = o.cache_dir,
                                          .cache_max = cache_max,
                                          .log = log_line});
    if (!remote) {
        fprintf(stderr, "ckptfs: out of memory\n");
        goto out;
    }
    if (!ck_location_is_url(o.source)) /* a URL's parse waits on the network, not on faults */
        prefault_heap(o.source);
    if (build_view(&m, remote, o.source, &o) != 0 ||
        (!by_fd && !o.nonempty && check_sources_outside(&m.fs, o.mountpoint, co.mountpoint)))
        goto out;
    char abs[PATH_MAX];
    if (add_mount_opts(&args, !ck_location_is_url(o.source) && realpath(o.source, abs)
                                  ? abs : o.source, auto_unmount && watch < 0) != 0 ||
        pthread_key_create(&m.read_buf, free) != 0) {
        fprintf(stderr, "ckptfs: out of memory\n");
        goto out;
    }
    capturing = 1;
    se = fuse_session_new(&args, &ck_ll_ops, sizeof ck_ll_ops, &m);
    int started = se && fuse_set_signal_handlers(se) == 0;
    mounted = started && fuse_session_mount(se, co.mountpoint) == 0;
    capturing = 0;
    if (!mounted) {
        /* a user's mount is fusermount3's, which says why on stderr itself */
        say_refused(started ? o.mountpoint : "libfuse",
                    started ? "mount failed (fusermount3 says why)" : "no session (out of memory)");
        goto out;
    }
    if (watch >= 0)
        ck_watch_arm(watch);
    if (serve_init(se) != 0)
        goto out;
    if (!by_fd) /* a mount made by someone else: its path is not ours to know */
        set_readahead(co.mountpoint, o.readahead_kb, o.readahead_set);
    int keep_stderr = co.foreground || stderr_is_file();
    if (!co.foreground && daemon_ready(ready, keep_stderr) != 0) {
        fprintf(stderr, "ckptfs: cannot detach the daemon: %s\n", strerror(errno));
        goto out;
    }
    ck_ll_log_start(keep_stderr);
    if (!by_fd) /* not when the mount is another's (/dev/fd/N): its namespace is theirs */
        (void)ck_watch_namespace(co.mountpoint);
    status = serve(se, &co) < 0;
out:
    if (se) {
        if (mounted)
            fuse_session_unmount(se);
        if (mounted && watch >= 0)
            ck_watch_disarm(watch);
        fuse_remove_signal_handlers(se);
        fuse_session_destroy(se);
    }
    ck_fs_free(&m.fs);
    http_remote_free(remote); /* after the files opened through it */
    free(co.mountpoint);
    free(o.mountpoint);
    free(o.source);
    free(o.extra);
    free(o.cacert);
    free(o.cache_mem);
    free(o.cache_dir);
    free(o.cache_max);
    fuse_opt_free_args(&args);
    return status;
}
