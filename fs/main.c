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

/* Whether the mount is made with auto_unmount: a daemon that dies (kill -9, a crash) takes its
 * mount with it instead of leaving "Transport endpoint is not connected" behind. The default,
 * unless asked otherwise (noauto_unmount: mount.fuse.ckptfs's, fstab's mounts being the
 * administrator's), the mountpoint is another's (/dev/fd/N), or nobody can do the watching:
 * root's own watcher (watch_unmount), else fusermount3 (libfuse's), when it is not there (a
 * container without it). Then only when asked. */
static int wants_auto_unmount(const struct ck_opts *o, int by_fd)
{
    return o->auto_unmount ||
           (!o->no_auto_unmount && !by_fd && (geteuid() == 0 || ck_have_fusermount()));
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

int main(int argc, char **argv)
{
    if (argc < 2) { /* nothing asked: how to ask */
        ck_opts_usage(stderr, argc ? argv[0] : "ckptfs");
        return EXIT_USAGE;
    }
    /* the argument block, as the kernel shows it (hide_args below rewrites it in place) */
    char *arg_block = argv[0];
    size_t arg_block_len = (size_t)(argv[argc - 1] - argv[0]) + strlen(argv[argc - 1]) + 1;
    ck_keep_freed_memory();
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
    int parsed = fuse_opt_parse(&args, &o, ck_opt_spec, ck_opts_proc) == 0 &&
                 fuse_parse_cmdline(&args, &co) == 0;
    capturing = 0;
    if (!parsed) {
        say_refused("arguments", "malformed");
        status = EXIT_USAGE;
        goto out;
    }
    if (co.show_help) {
        ck_opts_usage(stdout, argv[0]);
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
    if (!ck_opts_valid(&o) || ck_opts_size("cache_mem", o.cache_mem, &cache_mem) != 0 ||
        ck_opts_size("cache_max", o.cache_max, &cache_max) != 0)
        goto out;
    status = EXIT_FAILED;
    if (ck_check_mountpoint(o.mountpoint) != 0)
        goto out;
    int by_fd = ck_mountpoint_fd(o.mountpoint) >= 0; /* the path stays as libfuse parses it */
    if (!(co.mountpoint = by_fd ? strdup(o.mountpoint) : realpath(o.mountpoint, NULL))) {
        fprintf(stderr, "ckptfs: %s: %s\n", o.mountpoint, strerror(errno));
        goto out;
    }
    if (!by_fd && (ck_check_fuse_device() != 0 || ck_check_fusermount() != 0 ||
                   ck_check_not_inside(o.mountpoint, co.mountpoint) ||
                   (!o.nonempty && ck_check_not_mounted(o.mountpoint, co.mountpoint) != 0)))
        goto out;
    if (!co.foreground && ck_daemon_fork(&ready) != 0) {
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
        ck_prefault_heap(o.source);
    if (build_view(&m, remote, o.source, &o) != 0 ||
        (!by_fd && !o.nonempty && ck_check_sources_outside(&m.fs, o.mountpoint, co.mountpoint)))
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
        ck_set_readahead(co.mountpoint, o.readahead_kb, o.readahead_set);
    int keep_stderr = co.foreground || ck_stderr_is_file();
    if (!co.foreground && ck_daemon_ready(ready, keep_stderr) != 0) {
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
