/* serve.c — `ckpt serve`: a source loaded onto a CUDA device and served to the processes that
 * attach to it, until told to stop (commands.h). */
#include <grp.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../base/location.h"
#include "../loader/ckload.h"
#include "commands.h"
#include "loading.h"
#include "progress.h"

enum { SERVE_DEVICE, SERVE_SOCKET, SERVE_GROUP, SERVE_ONLY, SERVE_VERIFY };
static const ck_option serve_options[] = {
    {"device", "D", "cuda or cuda:N (default cuda: cuda:0)", 0},
    {"socket", "PATH", "the Unix socket clients attach to (default $XDG_RUNTIME_DIR/ckload.sock, "
                       "else $TMPDIR/ckload-UID/ckload.sock)", 0},
    {"group", "G", "a group (name or gid) whose members may attach too", 0},
    {"only", "P", CK_ONLY_HELP, 0},
    {"verify", NULL, "as ckpt load --verify", 0},
    {NULL, NULL, NULL, 0}};

typedef struct serve_args {
    ckl_options o;
    const char *path, *socket;
    long gid;
} serve_args;

/* A group by name or number into a->gid; 0, or CK_USAGE after saying why. */
static int serve_group(const ck_opts *p, int k, const char *val, serve_args *a)
{
    char *end, buf[4096];
    struct group g, *found = NULL;
    long n = strtol(val, &end, 10);
    if (*val && !*end && n >= 0) {
        a->gid = n;
        return 0;
    }
    if (getgrnam_r(val, &g, buf, sizeof buf, &found) == 0 && found) {
        a->gid = (long)found->gr_gid;
        return 0;
    }
    return ck_opts_bad_value(p, k, val, "a group name or gid");
}

static int serve_parse(int argc, char **argv, serve_args *a)
{
    const char *val;
    int k, rc = 0;
    ck_opts p;
    ckl_default_options(&a->o);
    a->o.device = CKL_CUDA;
    a->gid = -1;
    ck_opts_init(&p, "serve", serve_options, argc, argv);
    while (rc == 0 && (k = ck_opts_next(&p, &val)) != CK_OPT_END) {
        if (k == CK_OPT_ERROR)
            return CK_USAGE;
        if (k == SERVE_DEVICE && (loading_parse_device(val, &a->o) != 0 || a->o.device != CKL_CUDA))
            rc = ck_opts_bad_value(&p, k, val, "cuda or cuda:N");
        else if (k == SERVE_SOCKET)
            a->socket = val;
        else if (k == SERVE_GROUP)
            rc = serve_group(&p, k, val, a);
        else if (k == SERVE_ONLY)
            a->o.only = val;
        else if (k == SERVE_VERIFY)
            a->o.verify = 1;
        else if (k == CK_OPT_OPERAND && a->path)
            rc = ck_usage_error("serve", "one SOURCE only");
        else if (k == CK_OPT_OPERAND)
            a->path = val;
    }
    if (rc == 0 && !a->path)
        rc = ck_usage_error("serve", "missing SOURCE");
    return rc;
}

/* Serves until SIGTERM, SIGINT or SIGHUP (blocked in every thread, taken here): with nothing
 * attached it closes at once; while attached (a client still receiving its table counts) it
 * says so and keeps serving until the last attachment closes, and a second signal closes
 * anyway (the attached processes' block is then the driver's to tear down: share.h). The
 * close itself decides whether anything is attached (EBUSY), so that no client slips in
 * between a count and the close. */
static void serve_until_told(ckl_server *s, const char *socket, const sigset_t *stop)
{
    char err[PATH_MAX + 512];
    int told = 0;
    for (;;) {
        struct timespec tick = {.tv_nsec = 200000000L};
        int sig = sigtimedwait(stop, NULL, &tick);
        unsigned n = ckl_server_attached(s);
        if (sig > 0 && told) {
            fprintf(stderr, "ckpt: %s: told twice: closing with %u attachment%s live\n", socket,
                    n, n == 1 ? "" : "s");
            ckl_server_close(s, 1, err, sizeof err);
            return;
        }
        if (sig <= 0 && !told)
            continue;
        if (ckl_server_close(s, 0, err, sizeof err) == 0)
            return;
        if (!told)
            fprintf(stderr, "ckpt: %s: %u attachment%s live: serving until %s, or a second "
                    "signal\n", socket, n, n == 1 ? "" : "s", n == 1 ? "it ends" : "they end");
        told = 1;
    }
}

/* SIGINT, SIGTERM and SIGHUP into *stop, blocked in this thread (and those it starts after):
 * serve_until_told takes them. */
static void block_stop_signals(sigset_t *stop)
{
    sigemptyset(stop);
    sigaddset(stop, SIGINT);
    sigaddset(stop, SIGTERM);
    sigaddset(stop, SIGHUP);
    pthread_sigmask(SIG_BLOCK, stop, NULL);
}

static int cmd_serve(int argc, char **argv, http_remote *remote)
{
    (void)remote; /* libckload opens SOURCE itself */
    serve_args a = {0};
    int rc = serve_parse(argc, argv, &a);
    if (rc != 0)
        return rc;
    char err[2 * PATH_MAX + 512], socket[PATH_MAX];
    ckl_load *l;
    ckl_server *s = NULL;
    if (!a.socket && ckl_default_socket(socket, sizeof socket, err, sizeof err) != 0) {
        fprintf(stderr, "ckpt: %s\n", err);
        return 1;
    }
    a.socket = a.socket ? a.socket : socket;
    if (ckl_load_start(a.path, &a.o, &l, err, sizeof err) != 0) {
        fprintf(stderr, "ckpt: %s\n", err);
        return 1;
    }
    ck_progress_catch_signals();
    if (loading_finish(l) != 0) {
        ckl_release(l);
        return 1;
    }
    sigset_t stop;
    block_stop_signals(&stop); /* before the server's thread starts: it inherits the mask */
    rc = ckl_serve(l, a.socket, a.gid, &s, err, sizeof err);
    if (rc == 0) {
        char shown[CK_SHOWN_MAX];
        printf("%s: %zu tensors, %llu bytes on cuda:%d, served on %s\n",
               ck_location_shown(a.path, shown, sizeof shown), ckl_count(l),
               (unsigned long long)ckl_total_bytes(l), ckl_cuda_ordinal(l), a.socket);
        fflush(stdout);
    } else {
        fprintf(stderr, "ckpt: %s\n", err);
    }
    ckl_release(l); /* the server holds its own reference */
    if (rc != 0)
        return 1;
    serve_until_told(s, a.socket, &stop);
    return 0;
}

const ck_command ckpt_serve = {
    "serve", "ckpt serve SOURCE [--socket PATH] [--device cuda:N] [--group G] [--only P] "
             "[--verify]",
    "Loads SOURCE onto a CUDA device (as ckpt load) and keeps it there, served on the Unix\n"
    "socket PATH to the processes of this machine that attach to it (ckload.attach in\n"
    "Python, ckl_attach in C): they map the same device memory through CUDA IPC instead of\n"
    "loading it again. PATH by default: $XDG_RUNTIME_DIR/ckload.sock, else\n"
    "$TMPDIR/ckload-UID/ckload.sock (/tmp without TMPDIR; the directory made 0700). PATH's\n"
    "directory must be yours or root's and writable by no one else unless sticky; nothing\n"
    "there is replaced but a stale socket of yours. A process attaches if its uid is this\n"
    "one's or it is in group G (a name or gid), and while SOURCE's files are still those\n"
    "loaded; others are refused with one line. Prints one line once serving. SIGTERM, SIGINT\n"
    "or SIGHUP: with nothing attached it exits 0 and removes the socket; while attached (a\n"
    "client still receiving counts) it says how many and keeps serving until the last\n"
    "attachment ends (then exits 0), and a second signal exits anyway (the attached\n"
    "processes' tensors are then no longer safe to use).",
    serve_options, cmd_serve};
