/* main.c — `ckptfs [options] SOURCE MOUNTPOINT`: parse SOURCE completely, then mount its view.
 *
 * Order matters: everything that can fail because of the checkpoint fails before the mount
 * exists, so a bad SOURCE never leaves a mountpoint behind; the command returns only once the
 * kernel has accepted the mount and its first request is answered, so `ckptfs ... && ls
 * MOUNTPOINT` works, and its exit status and message are the mount's.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../sources/http.h" /* http_config: -o cacert, cache_mem, cache_dir, cache_max */
#include "../checkpoint/open.h"
#include "ll.h"
#include "watch.h"
#include "options.h"
#include "preflight.h"
#include "tuning.h"
#include "daemon.h"

#ifndef CKPTFS_VERSION
#error "CKPTFS_VERSION comes from the Makefile (the VERSION file)"
#endif

/* Exit statuses: 0 mounted (or --help, --version), 1 anything else that failed, 2 the
 * command line itself (as ckpt's usage errors). */
enum { EXIT_FAILED = 1, EXIT_USAGE = 2 };

/* Root watches its own mount (watch.h): libfuse's auto_unmount would mount through fusermount3,
 * whose start costs a small checkpoint's mount many times what root's own mount(2) does
 * (BENCHMARKS.md, mount latency without fusermount3). Others keep libfuse's watcher, which
 * their mount needs anyway. The socket to the watcher, or -1 for libfuse's (or none). */
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

/* A line of the disk cache's, where the daemon's go (stderr, then syslog once detached). */
static void log_line(const char *line)
{
    char full[1100];
    snprintf(full, sizeof full, "ckptfs: %s", line);
    ck_ll_log(full);
}

/* One run of the command: what main makes, in order, and frees at the end, whatever happened. */
typedef struct run {
    struct fuse_args args;        /* what is left of the command line for libfuse */
    struct ck_opts o;
    struct fuse_cmdline_opts co;  /* co.mountpoint: MOUNTPOINT, canonical */
    int by_fd;                    /* MOUNTPOINT is /dev/fd/N: a mount another made */
    int auto_unmount;             /* ck_wants_auto_unmount */
    int watch;                    /* the socket to our own watcher (watch_unmount), or -1 */
    int ready;                    /* the pipe to the waiting command (ck_daemon_fork), or -1 */
    http_remote *remote;          /* every remote file's caches */
    ck_mount m;
    struct fuse_session *se;
    int mounted;
    char *arg_block;              /* the argument block, as the kernel shows it */
    size_t arg_block_len;
} run;

/* Parses the command line and checks it, everything said in our words: -1 to go on, else the
 * exit status (0 for --help and --version). */
static int parse_command_line(run *r, const char *prog)
{
    fuse_set_log_func(keep_libfuse_said);
    capturing = 1;
    int parsed = ck_opts_parse(&r->args, &r->o) == 0 &&
                 fuse_parse_cmdline(&r->args, &r->co) == 0;
    capturing = 0;
    if (!parsed) {
        say_refused("arguments", "malformed");
        return EXIT_USAGE;
    }
    if (r->co.show_help) {
        ck_opts_usage(stdout, prog);
        fuse_cmdline_help();
        fuse_lowlevel_help();
        return 0;
    }
    if (r->co.show_version) {
        printf("ckptfs %s (libfuse %s)\n", CKPTFS_VERSION, fuse_pkgversion());
        return 0;
    }
    if (!r->o.source || !r->o.mountpoint || r->o.extra) {
        char shown[CK_SHOWN_MAX]; /* the extra argument may be a URL with its secrets */
        if (r->o.extra)
            fprintf(stderr, "ckptfs: %s: one argument too many (usage: %s [options] SOURCE "
                    "MOUNTPOINT)\n", ck_location_shown(r->o.extra, shown, sizeof shown), prog);
        else
            fprintf(stderr, "ckptfs: need SOURCE and MOUNTPOINT (see %s --help)\n", prog);
        return EXIT_USAGE;
    }
    if (!libfuse_accepts(&r->args)) {
        say_refused("options", "not accepted by libfuse");
        return EXIT_USAGE;
    }
    return ck_opts_check(&r->o) == 0 ? -1 : EXIT_USAGE;
}

/* Forks the daemon (unless in the foreground), starts the watcher, parses SOURCE into the view:
 * 0, or -1 reported. */
static int build(run *r)
{
    const struct ck_opts *o = &r->o;
    if (!r->co.foreground && ck_daemon_fork(&r->ready) != 0) {
        fprintf(stderr, "ckptfs: cannot fork the daemon: %s\n", strerror(errno));
        return -1;
    }
    r->auto_unmount = ck_wants_auto_unmount(o, r->by_fd);
    r->watch = watch_unmount(r->auto_unmount, r->by_fd, r->co.mountpoint, r->arg_block,
                             r->arg_block_len);
    r->remote = ck_remote_new(&(http_config){.cacert = o->cacert, .anonymous = o->anonymous,
                                             .cache_mem = o->cache_mem_bytes,
                                             .cache_dir = o->cache_dir,
                                             .cache_max = o->cache_max_bytes, .log = log_line});
    if (!r->remote) {
        fprintf(stderr, "ckptfs: out of memory\n");
        return -1;
    }
    if (!ck_location_is_url(o->source)) /* a URL's parse waits on the network, not on faults */
        ck_prefault_heap(o->source);
    return build_view(&r->m, r->remote, o->source, o) != 0 ||
                   (!r->by_fd && !o->nonempty &&
                    ck_preflight_sources(&r->m.fs, o->mountpoint, r->co.mountpoint) != 0)
               ? -1
               : 0;
}

/* Mounts the view and answers the kernel's first request, detaches the daemon and lets the
 * command end: 0, or -1 reported. */
static int mount_view(run *r)
{
    const struct ck_opts *o = &r->o;
    char abs[PATH_MAX];
    const char *source = !ck_location_is_url(o->source) && realpath(o->source, abs) ? abs
                                                                                    : o->source;
    if (add_mount_opts(&r->args, source, r->auto_unmount && r->watch < 0) != 0 ||
        pthread_key_create(&r->m.read_buf, free) != 0) {
        fprintf(stderr, "ckptfs: out of memory\n");
        return -1;
    }
    capturing = 1;
    r->se = fuse_session_new(&r->args, &ck_ll_ops, sizeof ck_ll_ops, &r->m);
    int started = r->se && fuse_set_signal_handlers(r->se) == 0;
    r->mounted = started && fuse_session_mount(r->se, r->co.mountpoint) == 0;
    capturing = 0;
    if (!r->mounted) {
        /* a user's mount is fusermount3's, which says why on stderr itself */
        say_refused(started ? o->mountpoint : "libfuse",
                    started ? "mount failed (fusermount3 says why)" : "no session (out of memory)");
        return -1;
    }
    if (r->watch >= 0)
        ck_watch_arm(r->watch);
    if (serve_init(r->se) != 0)
        return -1;
    if (!r->by_fd) /* a mount made by someone else: its path is not ours to know */
        ck_set_readahead(r->co.mountpoint, o->readahead_kb, o->readahead_set);
    int keep_stderr = r->co.foreground || ck_stderr_is_file();
    if (!r->co.foreground && ck_daemon_ready(r->ready, keep_stderr) != 0) {
        fprintf(stderr, "ckptfs: cannot detach the daemon: %s\n", strerror(errno));
        return -1;
    }
    ck_ll_log_start(keep_stderr);
    if (!r->by_fd) /* not when the mount is another's (/dev/fd/N): its namespace is theirs */
        (void)ck_watch_namespace(r->co.mountpoint);
    return 0;
}

static void run_free(run *r)
{
    if (r->se) {
        if (r->mounted)
            fuse_session_unmount(r->se);
        if (r->mounted && r->watch >= 0)
            ck_watch_disarm(r->watch);
        fuse_remove_signal_handlers(r->se);
        fuse_session_destroy(r->se);
    }
    ck_fs_free(&r->m.fs);
    http_remote_free(r->remote); /* after the files opened through it */
    free(r->co.mountpoint);
    ck_opts_free(&r->o);
    fuse_opt_free_args(&r->args);
}

int main(int argc, char **argv)
{
    if (argc < 2) { /* nothing asked: how to ask */
        ck_opts_usage(stderr, argc ? argv[0] : "ckptfs");
        return EXIT_USAGE;
    }
    ck_keep_freed_memory();
    run r = {
        .args = FUSE_ARGS_INIT(argc, argv), .o = CK_OPTS_INIT, .watch = -1, .ready = -1,
        /* read before ck_location_hide_args rewrites the block in place */
        .arg_block = argv[0],
        .arg_block_len = (size_t)(argv[argc - 1] - argv[0]) + strlen(argv[argc - 1]) + 1,
    };
    /* Before anything else: the daemon lives long, and `ps` would show SOURCE's secrets. */
    if (ck_location_hide_args(argc, argv) != 0) {
        fprintf(stderr, "ckptfs: out of memory\n");
        return EXIT_FAILED;
    }
    /* A descriptor per source file for the mount's life (a DCP job's file per rank), besides
     * FUSE's and remote connections': as servers do, all the hard limit allows. */
    ck_nofile_raise();
    int status = parse_command_line(&r, argv[0]);
    if (status < 0) /* the command line is good: what fails now is no usage error */
        status = ck_preflight_mountpoint(r.o.mountpoint, r.o.nonempty, &r.co.mountpoint,
                                         &r.by_fd) != 0 ||
                         build(&r) != 0 || mount_view(&r) != 0
                     ? EXIT_FAILED
                     : serve(r.se, &r.co) < 0;
    run_free(&r);
    return status;
}
