/* share_keeper.c — warm attach's server (share.h): the thread that hands a load's block to the
 * processes it admits. */
#include "share.h"
#include "backend.h"
#include "loadview.h"
#include "sharemsg.h"
#include "sharesock.h"

#include "../base/location.h"
#include "../index/index.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

struct ckl_server {
    ckl_load *l;             /* a reference of the server's own */
    const backend *be;
    char *socket;            /* as given */
    int listen_fd, wake[2];  /* wake: ckl_server_close stops the thread through it */
    uid_t uid;
    long gid;                /* -1: the server's uid only */
    unsigned char *table;    /* the message every admitted client gets */
    size_t table_len;
    share_file *files;       /* the source's identity, re-checked at each attach */
    uint32_t nfiles;
    char **paths;            /* files[].path, absolute, owned */
    pthread_t thread;
    pthread_mutex_t lock;
    int *clients;            /* the attachments: open connections */
    unsigned nclients, cap;
};

/* Whether the peer on fd may attach: the server's uid, or the group given as its primary or
 * one of its supplementary groups (as they were when it connected). */
static int admitted(const ckl_server *s, int fd, char *why, size_t len)
{
    struct ucred cred;
    socklen_t n = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &n) != 0) {
        snprintf(why, len, "cannot tell who connected (SO_PEERCRED: %s)", strerror(errno));
        return 0;
    }
    if (cred.uid == s->uid || (s->gid >= 0 && cred.gid == (gid_t)s->gid))
        return 1;
    gid_t groups[256];
    socklen_t glen = sizeof groups;
    if (s->gid >= 0 && getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &glen) == 0)
        for (size_t k = 0; k < glen / sizeof *groups; k++)
            if (groups[k] == (gid_t)s->gid)
                return 1;
    if (s->gid >= 0)
        snprintf(why, len, "uid %u is not the server's (uid %u) and not in group %ld",
                 (unsigned)cred.uid, (unsigned)s->uid, s->gid);
    else
        snprintf(why, len, "uid %u is not the server's (uid %u)", (unsigned)cred.uid,
                 (unsigned)s->uid);
    return 0;
}

static void refuse(int fd, int code, const char *why)
{
    unsigned char *msg;
    size_t len;
    if (share_encode_refusal(code, why, &msg, &len) == 0) {
        share_send_all(fd, msg, len);
        free(msg);
    }
    close(fd);
}

static void add_client(ckl_server *s, int fd)
{
    pthread_mutex_lock(&s->lock);
    if (s->nclients == s->cap) {
        unsigned cap = s->cap ? 2 * s->cap : 16;
        int *c = realloc(s->clients, cap * sizeof *c);
        if (!c) {
            pthread_mutex_unlock(&s->lock);
            close(fd); /* not attached: the client sees the connection end */
            return;
        }
        s->clients = c;
        s->cap = cap;
    }
    s->clients[s->nclients++] = fd;
    pthread_mutex_unlock(&s->lock);
}

/* One connection: refused with its reason, or given the table and kept as an attachment. */
static void accept_one(ckl_server *s)
{
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
        return;
    share_set_timeouts(fd);
    char why[SHARE_MAX_TEXT];
    long changed;
    if (!admitted(s, fd, why, sizeof why)) {
        refuse(fd, EACCES, why);
    } else if ((changed = share_files_changed(s->files, s->nfiles)) >= 0) {
        snprintf(why, sizeof why, "changed source: %s is no longer the file loaded (device, "
                 "inode, size or mtime)", s->files[changed].path);
        refuse(fd, EIO, why);
    } else if (share_send_all(fd, s->table, s->table_len) != 0) {
        close(fd);
    } else {
        add_client(s, fd);
    }
}

/* Client k's connection has something: anything it sends is ignored; its end drops it. */
static void poll_client(ckl_server *s, unsigned k)
{
    char buf[256];
    ssize_t n = recv(s->clients[k], buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR)))
        return;
    pthread_mutex_lock(&s->lock);
    close(s->clients[k]);
    s->clients[k] = s->clients[--s->nclients];
    pthread_mutex_unlock(&s->lock);
}

static void *serve(void *arg)
{
    ckl_server *s = arg;
    for (;;) {
        unsigned n = s->nclients; /* only this thread changes it */
        struct pollfd *p = calloc(n + 2, sizeof *p);
        if (!p) {
            sleep(1);
            continue;
        }
        p[0] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        p[1] = (struct pollfd){.fd = s->listen_fd, .events = POLLIN};
        for (unsigned k = 0; k < n; k++)
            p[k + 2] = (struct pollfd){.fd = s->clients[k], .events = POLLIN};
        int rc = poll(p, n + 2, -1);
        int stop = rc > 0 && p[0].revents;
        /* From the last, so that dropping one (the last moves into its place) skips none. */
        for (unsigned k = n; rc > 0 && !stop && k-- > 0;)
            if (p[k + 2].revents)
                poll_client(s, k);
        if (rc > 0 && !stop && p[1].revents)
            accept_one(s);
        free(p);
        if (stop)
            return NULL;
    }
}

/* The served location as an absolute path, and each source file's identity as loaded, by its
 * absolute path. -1 with err set for a URL (nothing to re-check) or out of memory. */
static int identify(ckl_server *s, const load_view *v, char **source, char *err,
                    size_t errlen)
{
    const ck_index *ix = v->ix;
    if (ck_location_scheme(v->path) != CK_SCHEME_PATH) {
        snprintf(err, errlen, "%s: a remote source cannot be served (its files cannot be "
                 "re-checked at each attach)", v->path);
        return share_fail(EINVAL);
    }
    s->files = calloc(ix->nfiles ? ix->nfiles : 1, sizeof *s->files);
    s->paths = calloc(ix->nfiles ? ix->nfiles : 1, sizeof *s->paths);
    if (!s->files || !s->paths || !(*source = realpath(v->path, NULL))) {
        snprintf(err, errlen, "%s: %s", v->path,
                 s->files && s->paths ? strerror(errno) : "out of memory");
        return share_fail(errno == ENOMEM ? ENOMEM : EIO);
    }
    for (uint32_t f = 0; f < ix->nfiles; f++) {
        const ck_file *cf = &ix->files[f];
        if (!(s->paths[f] = realpath(cf->path, NULL))) {
            snprintf(err, errlen, "%s: %s: %s", v->path, cf->path, strerror(errno));
            return share_fail(EIO);
        }
        s->files[f] = (share_file){.path = s->paths[f], .dev = (uint64_t)cf->dev,
                                   .ino = (uint64_t)cf->ino, .size = cf->size,
                                   .mtime_sec = (int64_t)cf->mtime.tv_sec,
                                   .mtime_nsec = (uint32_t)cf->mtime.tv_nsec};
        s->nfiles++;
    }
    long changed = share_files_changed(s->files, s->nfiles);
    if (changed >= 0) {
        snprintf(err, errlen, "%s: changed source: %s is no longer the file loaded", v->path,
                 s->files[changed].path);
        return share_fail(EIO);
    }
    return 0;
}

/* The table every admitted client gets. */
static int make_table(ckl_server *s, const load_view *v, char *err, size_t errlen)
{
    share_table t = {.ordinal = v->ordinal, .block_size = v->block_size, .files = s->files,
                     .nfiles = s->nfiles, .plan = (ck_plan *)v->plan,
                     .tensors = (ckl_tensor *)ckl_get(s->l, 0)};
    char why[256], *source = NULL;
    for (size_t b = 0; b < v->plan->nblobs; b++)
        if (v->plan->blobs[b].elsewhere) {
            snprintf(err, errlen, "%s: tensors placed in the caller's memory cannot be served",
                     v->path);
            return share_fail(EINVAL);
        }
    if (identify(s, v, &source, err, errlen) != 0)
        return -1;
    t.source = source;
    int code = 0;
    if (s->be->share((void *)v->block, t.handle, sizeof t.handle, why, sizeof why) != 0) {
        snprintf(err, errlen, "%s: %s", v->path, why);
        code = EIO;
    } else if (share_encode_table(&t, &s->table, &s->table_len) != 0) {
        snprintf(err, errlen, "%s: out of memory", v->path);
        code = ENOMEM;
    }
    free(source);
    return code ? share_fail(code) : 0;
}

/* A socket bound at path and listening; a stale one (no server answers) replaced. */
static int listen_at(const char *path, char *err, size_t errlen)
{
    struct sockaddr_un a;
    if (share_socket_address(path, &a, err, errlen) != 0)
        return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int rc = fd < 0 ? -1 : bind(fd, (struct sockaddr *)&a, sizeof a);
    if (rc != 0 && errno == EADDRINUSE) {
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int live = probe >= 0 && connect(probe, (struct sockaddr *)&a, sizeof a) == 0;
        if (probe >= 0)
            close(probe);
        if (live) {
            close(fd);
            snprintf(err, errlen, "%s: another server is serving there", path);
            return share_fail(EINVAL);
        }
        rc = unlink(path) == 0 ? bind(fd, (struct sockaddr *)&a, sizeof a) : -1;
    }
    if (rc == 0 && chmod(path, 0666) == 0 && listen(fd, 64) == 0)
        return fd;
    snprintf(err, errlen, "%s: cannot serve there: %s", path, strerror(errno));
    if (fd >= 0)
        close(fd);
    return share_fail(EIO);
}

static void free_server(ckl_server *s)
{
    for (uint32_t f = 0; s->paths && f < s->nfiles; f++)
        free(s->paths[f]);
    free(s->paths);
    free(s->files);
    free(s->table);
    free(s->clients);
    free(s->socket);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* The load's block, its table and identity, ready to serve: 0, or -1 with err and errno. */
static int prepare_server(ckl_server *s, char *err, size_t errlen)
{
    load_view v;
    if (ckl_wait_all(s->l, err, errlen) != 0)
        return -1;
    load_view_of(s->l, &v);
    if (v.device != CKL_CUDA || !s->be || !s->be->share) {
        snprintf(err, errlen, "%s: only a load on a CUDA device can be served (%s)", v.path,
                 v.device != CKL_CUDA ? "this one is in host memory"
                                      : "this libckload was built without CUDA");
        return share_fail(ENODEV);
    }
    return make_table(s, &v, err, errlen);
}

int ckl_serve(ckl_load *l, const char *socket_path, long gid, ckl_server **out, char *err,
              size_t errlen)
{
    *out = NULL;
    ckl_server *s = calloc(1, sizeof *s);
    if (!s || !(s->socket = strdup(socket_path))) {
        free(s);
        snprintf(err, errlen, "%s: out of memory", socket_path);
        return share_fail(ENOMEM);
    }
    pthread_mutex_init(&s->lock, NULL);
    s->l = l;
    s->be = ckl_device_of(l) == CKL_CUDA ? backend_cuda : NULL;
    s->uid = getuid();
    s->gid = gid < 0 ? -1 : gid;
    s->listen_fd = s->wake[0] = s->wake[1] = -1;
    if (prepare_server(s, err, errlen) != 0 ||
        (s->listen_fd = listen_at(socket_path, err, errlen)) < 0) {
        int code = errno;
        free_server(s);
        return share_fail(code);
    }
    if (pipe2(s->wake, O_CLOEXEC) != 0 || pthread_create(&s->thread, NULL, serve, s) != 0) {
        snprintf(err, errlen, "%s: cannot start the server thread", socket_path);
        for (int k = 0; k < 2; k++)
            if (s->wake[k] >= 0)
                close(s->wake[k]);
        close(s->listen_fd);
        unlink(socket_path);
        free_server(s);
        return share_fail(EIO);
    }
    ckl_retain(l);
    *out = s;
    return 0;
}

unsigned ckl_server_attached(ckl_server *s)
{
    pthread_mutex_lock(&s->lock);
    unsigned n = s->nclients;
    pthread_mutex_unlock(&s->lock);
    return n;
}

int ckl_server_close(ckl_server *s, int force, char *err, size_t errlen)
{
    unsigned n = ckl_server_attached(s);
    if (n && !force) {
        snprintf(err, errlen, "%s: %u attachment%s live: not closed (force closes it anyway)",
                 s->socket, n, n == 1 ? "" : "s");
        return share_fail(EBUSY);
    }
    while (write(s->wake[1], "x", 1) < 0 && errno == EINTR)
        ;
    pthread_join(s->thread, NULL);
    for (unsigned k = 0; k < s->nclients; k++)
        close(s->clients[k]);
    close(s->listen_fd);
    close(s->wake[0]);
    close(s->wake[1]);
    unlink(s->socket);
    ckl_release(s->l);
    free_server(s);
    return 0;
}
