/* share_keeper.c — warm attach's server (share.h): the socket, made where no other user can
 * swap it, and the thread that hands a load's block to the processes it admits, every
 * connection at its own pace. */
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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* Answers being sent at once (each holds only a descriptor and an offset: the table is shared),
 * and connections the kernel holds before the keeper takes them: a flood waits there, bounded,
 * rather than in the keeper's memory. */
#define SHARE_MAX_EXCHANGES 256
#define SHARE_BACKLOG 64
/* How long new connections wait when the keeper has no descriptor for one (EMFILE, ENFILE):
 * it tries again then, or as soon as a connection closes, never in a loop that spins. */
#define SHARE_BACKOFF_MS 100

/* A connection: its answer (the table, or a refusal) while it is being sent, then, for the
 * table, the attachment it holds until it closes. */
typedef struct conn {
    int fd;
    int counted;              /* given the table: an attachment, from its first byte on */
    const unsigned char *out; /* what is left to send */
    size_t left;
    unsigned char *own;       /* a refusal's bytes (NULL for the table) */
    int64_t deadline;         /* the whole exchange's, in CLOCK_MONOTONIC ms */
} conn;

struct ckl_server {
    ckl_load *l;             /* a reference of the server's own */
    const backend *be;
    char *socket;            /* as given */
    const char *name;        /* its last component, in dir_fd */
    int dir_fd;              /* the socket's directory, held: its name is removed only there */
    dev_t sock_dev;          /* the socket file made, removed only while it is still there */
    ino_t sock_ino;
    int listen_fd, wake[2];  /* wake: ckl_server_close stops the thread through it */
    uid_t uid;
    long gid;                /* -1: the server's uid only */
    unsigned char *table;    /* the message every admitted client gets */
    size_t table_len;
    share_file *files;       /* the source's identity, re-checked at each attach */
    uint32_t nfiles;
    char **paths;            /* files[].path, absolute, owned */
    int64_t wait_ms;         /* an exchange's whole time (share_wait_s) */
    pthread_t thread;
    pthread_mutex_t lock;    /* attached, closing */
    unsigned attached;       /* conns counted */
    int closing;             /* ckl_server_close decided: no table starts any more */
    conn *conns;             /* the thread's alone (and close's, once it has stopped) */
    struct pollfd *polls;    /* wake, the listening socket, then conns: cap + 2 */
    unsigned nconns, cap;
    int64_t backoff_until;   /* no accept before this (out of descriptors) */
};

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Whether the peer on fd may attach: the server's uid, or the group given as its primary or
 * one of its supplementary groups (as they were when it connected). */
static int admitted(const ckl_server *s, int fd, char *why, size_t len)
{
    struct ucred cred;
    int is = share_peer_is(fd, s->uid, s->gid, &cred);
    if (is < 0)
        snprintf(why, len, "cannot tell who connected (SO_PEERCRED: %s)", strerror(errno));
    else if (!is && s->gid >= 0)
        snprintf(why, len, "uid %u is not the server's (uid %u) and not in group %ld",
                 (unsigned)cred.uid, (unsigned)s->uid, s->gid);
    else if (!is)
        snprintf(why, len, "uid %u is not the server's (uid %u)", (unsigned)cred.uid,
                 (unsigned)s->uid);
    return is > 0;
}

/* Why the peer on fd is refused (its errno class, why set), or 0: it gets the table. */
static int refusal(const ckl_server *s, int fd, char *why, size_t len)
{
    long changed;
    if (!admitted(s, fd, why, len))
        return EACCES;
    if ((changed = share_files_changed(s->files, s->nfiles)) >= 0) {
        snprintf(why, len, "changed source: %s is no longer the file loaded (device, inode, "
                 "size or mtime)", s->files[changed].path);
        return EIO;
    }
    return 0;
}

/* Room for one more connection and its poll entry: 0, or -1 (out of memory). */
static int make_room(ckl_server *s)
{
    if (s->nconns < s->cap)
        return 0;
    unsigned cap = s->cap ? 2 * s->cap : 16;
    conn *c = realloc(s->conns, cap * sizeof *c);
    if (!c)
        return -1;
    s->conns = c;
    struct pollfd *p = realloc(s->polls, (cap + 2) * sizeof *p);
    if (!p)
        return -1;
    s->polls = p;
    s->cap = cap;
    return 0;
}

static void drop(ckl_server *s, unsigned k)
{
    conn *c = &s->conns[k];
    close(c->fd);
    free(c->own);
    pthread_mutex_lock(&s->lock);
    s->attached -= (unsigned)c->counted;
    pthread_mutex_unlock(&s->lock);
    s->conns[k] = s->conns[--s->nconns];
    s->backoff_until = 0; /* a descriptor is free again */
}

/* Sends what the socket takes now of c's answer, never waiting: 0 while it is being sent or
 * held (a table sent whole), -1 once it is over (an error, or a refusal sent whole). */
static int pump(conn *c)
{
    while (c->left) {
        ssize_t k = send(c->fd, c->out, c->left, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (k <= 0)
            return -1;
        c->out += k;
        c->left -= (size_t)k;
    }
    return c->own ? -1 : 0;
}

/* A new connection: its answer decided and its first bytes sent. The table counts as an
 * attachment from here, under the lock that ckl_server_close decides under, so that no table
 * starts once the server is closing and none is sent that the server does not count. */
static void accept_one(ckl_server *s, int64_t now)
{
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
            s->backoff_until = now + SHARE_BACKOFF_MS;
        return;
    }
    conn c = {.fd = fd, .out = s->table, .left = s->table_len, .deadline = now + s->wait_ms};
    char why[SHARE_MAX_TEXT];
    int code = refusal(s, fd, why, sizeof why);
    if ((code && share_encode_refusal(code, why, &c.own, &c.left) != 0) || make_room(s) != 0) {
        close(fd); /* the client sees the connection end */
        free(c.own);
        return;
    }
    c.out = code ? c.own : c.out;
    pthread_mutex_lock(&s->lock);
    int closing = s->closing;
    c.counted = !code && !closing;
    s->attached += (unsigned)c.counted;
    pthread_mutex_unlock(&s->lock);
    if (!code && closing) {
        close(fd);
        return;
    }
    s->conns[s->nconns++] = c;
    if (pump(&s->conns[s->nconns - 1]) != 0)
        drop(s, s->nconns - 1);
}

/* Connection k has something: its answer goes on; a held attachment's bytes are ignored, and
 * its end drops it. */
static void serve_conn(ckl_server *s, unsigned k)
{
    conn *c = &s->conns[k];
    if (c->left) {
        if (pump(c) != 0)
            drop(s, k);
        return;
    }
    char buf[256];
    ssize_t n = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR)))
        return;
    drop(s, k);
}

/* The poll set: wake, the listening socket while another exchange may start and descriptors
 * are not short, every connection (its answer's room, or its end). Answers past their
 * deadline are dropped first; *timeout is the wait until the next deadline or the end of a
 * back-off. Returns the connections polled. */
static unsigned plan_poll(ckl_server *s, int64_t now, int *timeout)
{
    unsigned exchanges = 0;
    int64_t next = now < s->backoff_until ? s->backoff_until : INT64_MAX;
    for (unsigned k = s->nconns; k-- > 0;) { /* from the last: drop moves the last into k */
        if (!s->conns[k].left)
            continue;
        if (s->conns[k].deadline <= now) {
            drop(s, k);
            continue;
        }
        exchanges++;
        next = s->conns[k].deadline < next ? s->conns[k].deadline : next;
    }
    int listening = exchanges < SHARE_MAX_EXCHANGES && now >= s->backoff_until;
    s->polls[0] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
    s->polls[1] = (struct pollfd){.fd = listening ? s->listen_fd : -1, .events = POLLIN};
    for (unsigned k = 0; k < s->nconns; k++)
        s->polls[k + 2] = (struct pollfd){.fd = s->conns[k].fd,
                                          .events = s->conns[k].left ? POLLOUT : POLLIN};
    *timeout = next == INT64_MAX ? -1 : next - now > INT_MAX ? INT_MAX : (int)(next - now);
    return s->nconns;
}

static void *serve(void *arg)
{
    ckl_server *s = arg;
    for (;;) {
        int timeout;
        unsigned n = plan_poll(s, now_ms(), &timeout);
        int rc = poll(s->polls, n + 2, timeout);
        if (rc > 0 && s->polls[0].revents)
            return NULL;
        /* From the last, so that dropping one (the last moves into its place) skips none. */
        for (unsigned k = n; rc > 0 && k-- > 0;)
            if (s->polls[k + 2].revents)
                serve_conn(s, k);
        if (rc > 0 && s->polls[1].revents)
            accept_one(s, now_ms());
    }
}

/* The served location as an absolute path, and each source file's identity as loaded, by its
 * absolute path. -1 with err set for a URL (nothing to re-check) or out of memory. */
static int identify(ckl_server *s, const load_view *v, char **source, char *err,
                    size_t errlen)
{
    const ck_index *ix = v->ix;
    if (ck_location_is_url(v->path)) {
        snprintf(err, errlen, "%s: a remote source cannot be served (its files cannot be "
                 "re-checked at each attach)", v->path);
        return share_fail(EINVAL);
    }
    s->files = calloc(ix->nfiles ? ix->nfiles : 1, sizeof *s->files);
    s->paths = calloc(ix->nfiles ? ix->nfiles : 1, sizeof *s->paths);
    if (!s->files || !s->paths || !(*source = realpath(v->path, NULL))) {
        int code = s->files && s->paths ? errno : ENOMEM;
        snprintf(err, errlen, "%s: %s", v->path,
                 s->files && s->paths ? strerror(code) : "out of memory");
        return share_fail(code == ENOMEM ? ENOMEM : EIO);
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

/* The socket's directory, opened, into s->dir_fd (and the socket's name in it into s->name):
 * refused unless no other user can swap a name there, since the socket is placed there and
 * later removed by name. That is a directory of this user's or root's, writable by no one
 * else unless sticky (where only a file's owner may rename or remove it). */
static int open_parent(ckl_server *s, char *err, size_t errlen)
{
    const char *path = s->socket, *slash = strrchr(path, '/');
    s->name = slash ? slash + 1 : path;
    char *dir = !slash ? strdup(".") : slash == path ? strdup("/")
                                                    : strndup(path, (size_t)(slash - path));
    struct stat st;
    int code = 0;
    if (!*s->name) {
        snprintf(err, errlen, "%s: not a socket path (it ends in '/')", path);
        code = EINVAL;
    } else if (!dir) {
        snprintf(err, errlen, "%s: out of memory", path);
        code = ENOMEM;
    } else if ((s->dir_fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0 ||
               fstat(s->dir_fd, &st) != 0) {
        code = errno == EACCES || errno == ENOENT ? errno : EIO;
        snprintf(err, errlen, "%s: cannot serve there: %s: %s", path, dir, strerror(errno));
    } else if (st.st_uid != geteuid() && st.st_uid != 0) {
        snprintf(err, errlen, "%s: its directory %s belongs to uid %u, who could swap the "
                 "socket: serve in a directory of yours (the default: $XDG_RUNTIME_DIR)", path,
                 dir, (unsigned)st.st_uid);
        code = EACCES;
    } else if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX)) {
        snprintf(err, errlen, "%s: its directory %s is writable by %s without the sticky bit "
                 "(mode %04o), so another user could swap the socket: serve in a directory "
                 "only you can write (the default: $XDG_RUNTIME_DIR)", path, dir,
                 st.st_mode & S_IWOTH ? "every user" : "its group",
                 (unsigned)(st.st_mode & 07777));
        code = EACCES;
    }
    free(dir);
    return code ? share_fail(code) : 0;
}

/* Whether what is at the socket's name may be replaced: a socket of this user's that no
 * server answers. 0, or -1 with err saying what is there (a file, another user's socket, a
 * live server: each stays). */
static int stale(const ckl_server *s, char *err, size_t errlen)
{
    struct stat st;
    struct sockaddr_un a;
    if (fstatat(s->dir_fd, s->name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return errno == ENOENT ? 0 : -1; /* gone meanwhile: the name is free */
    if (!S_ISSOCK(st.st_mode))
        snprintf(err, errlen, "%s: exists and is not a socket: not replaced", s->socket);
    else if (st.st_uid != geteuid())
        snprintf(err, errlen, "%s: a socket of uid %u is there: not replaced", s->socket,
                 (unsigned)st.st_uid);
    if (!S_ISSOCK(st.st_mode) || st.st_uid != geteuid())
        return share_fail(EINVAL);
    if (share_socket_address(s->socket, &a, err, errlen) != 0)
        return -1;
    /* Non-blocking: a server whose backlog is full (EAGAIN) is as live as one that accepts. */
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int live = probe >= 0 && (connect(probe, (struct sockaddr *)&a, sizeof a) == 0 ||
                              errno == EAGAIN || errno == EINPROGRESS);
    if (probe >= 0)
        close(probe);
    if (live) {
        snprintf(err, errlen, "%s: another server is serving there", s->socket);
        return share_fail(EINVAL);
    }
    return unlinkat(s->dir_fd, s->name, 0) == 0 || errno == ENOENT ? 0 : -1;
}

/* A fresh directory of this user's alone in the socket's directory, *priv its name and the
 * opened directory returned: where the socket is made and its mode set, by a name no one else
 * can change, before it moves to its own. -1 on failure (errno). */
static int private_dir(const ckl_server *s, char priv[32])
{
    for (int tries = 0; tries < 8; tries++) {
        uint64_t r = 0;
        if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
            return -1;
        snprintf(priv, 32, ".ckload-%016llx", (unsigned long long)r);
        if (mkdirat(s->dir_fd, priv, 0700) == 0)
            return openat(s->dir_fd, priv, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (errno != EEXIST)
            return -1;
    }
    return -1;
}

/* The listening socket, mode 0666, made in a private directory (bound through the directory
 * held open, so that no path another user can change is followed) and moved to its name
 * without replacing anything but a stale socket of this user's. Into s->listen_fd; 0, or -1
 * with err. */
static int bind_socket(ckl_server *s, char *err, size_t errlen)
{
    char priv[32];
    struct stat st;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    *err = 0; /* set only where stale() says what is at the path */
    int pfd = private_dir(s, priv);
    int fd = pfd < 0 ? -1 : socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    snprintf(a.sun_path, sizeof a.sun_path, "/proc/self/fd/%d/s", pfd);
    int rc = fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
                     fchmodat(pfd, "s", 0666, 0) != 0 ||
                     fstatat(pfd, "s", &st, AT_SYMLINK_NOFOLLOW) != 0 ||
                     listen(fd, SHARE_BACKLOG) != 0 ? -1 : 0;
    if (rc == 0 && renameat2(pfd, "s", s->dir_fd, s->name, RENAME_NOREPLACE) != 0) {
        rc = errno == EEXIST && stale(s, err, errlen) == 0
                     ? renameat2(pfd, "s", s->dir_fd, s->name, RENAME_NOREPLACE)
                     : -1;
    }
    int code = errno;
    if (rc != 0 && !*err)
        snprintf(err, errlen, "%s: cannot serve there: %s", s->socket, strerror(code));
    if (pfd >= 0) {
        unlinkat(pfd, "s", 0);
        unlinkat(s->dir_fd, priv, AT_REMOVEDIR);
        close(pfd);
    }
    if (rc != 0) {
        if (fd >= 0)
            close(fd);
        return share_fail(code == EINVAL || code == EACCES ? code : EIO);
    }
    s->listen_fd = fd;
    s->sock_dev = st.st_dev;
    s->sock_ino = st.st_ino;
    return 0;
}

/* The socket's name removed, if it is still the socket this server made. */
static void remove_socket(const ckl_server *s)
{
    struct stat st;
    if (fstatat(s->dir_fd, s->name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        st.st_dev == s->sock_dev && st.st_ino == s->sock_ino)
        unlinkat(s->dir_fd, s->name, 0);
}

static void free_server(ckl_server *s)
{
    for (uint32_t f = 0; s->paths && f < s->nfiles; f++)
        free(s->paths[f]);
    for (unsigned k = 0; k < s->nconns; k++) {
        close(s->conns[k].fd);
        free(s->conns[k].own);
    }
    int fds[] = {s->listen_fd, s->wake[0], s->wake[1], s->dir_fd};
    for (size_t k = 0; k < sizeof fds / sizeof *fds; k++)
        if (fds[k] >= 0)
            close(fds[k]);
    free(s->paths);
    free(s->files);
    free(s->table);
    free(s->conns);
    free(s->polls);
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

/* The server's socket and thread: 0, or -1 with err and errno. */
static int start_server(ckl_server *s, char *err, size_t errlen)
{
    struct sockaddr_un a;
    if (share_socket_address(s->socket, &a, err, errlen) != 0 ||
        open_parent(s, err, errlen) != 0 || prepare_server(s, err, errlen) != 0 ||
        bind_socket(s, err, errlen) != 0)
        return -1;
    if (!(s->polls = malloc(2 * sizeof *s->polls)) || pipe2(s->wake, O_CLOEXEC) != 0 ||
        pthread_create(&s->thread, NULL, serve, s) != 0) {
        snprintf(err, errlen, "%s: cannot start the server thread", s->socket);
        remove_socket(s);
        return share_fail(EIO);
    }
    return 0;
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
    s->wait_ms = (int64_t)share_wait_s("CKLOAD_SHARE_WAIT") * 1000;
    s->listen_fd = s->wake[0] = s->wake[1] = s->dir_fd = -1;
    if (start_server(s, err, errlen) != 0) {
        int code = errno;
        free_server(s);
        return share_fail(code);
    }
    ckl_retain(l);
    *out = s;
    return 0;
}

unsigned ckl_server_attached(ckl_server *s)
{
    pthread_mutex_lock(&s->lock);
    unsigned n = s->attached;
    pthread_mutex_unlock(&s->lock);
    return n;
}

int ckl_server_close(ckl_server *s, int force, char *err, size_t errlen)
{
    pthread_mutex_lock(&s->lock);
    unsigned n = s->attached;
    s->closing = force || !n; /* decided with the count: no table starts from here */
    pthread_mutex_unlock(&s->lock);
    if (n && !force) {
        snprintf(err, errlen, "%s: %u attachment%s live: not closed (force closes it anyway)",
                 s->socket, n, n == 1 ? "" : "s");
        return share_fail(EBUSY);
    }
    while (write(s->wake[1], "x", 1) < 0 && errno == EINTR)
        ;
    pthread_join(s->thread, NULL);
    ckl_load *l = s->l;
    remove_socket(s);
    free_server(s); /* every connection closed before the block may go */
    ckl_release(l);
    return 0;
}
