#include "preflight.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../views/mountinfo.h"

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

/* A mountpoint that holds a source file would hide it, and every open would fail, as the core
 * checks each source file by its path. */
int ck_preflight_sources(const ck_fs *fs, const char *mnt, const char *real)
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

/* A directory, or an open /dev/fuse as /dev/fd/N. */
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

int ck_preflight_mountpoint(const char *mnt, int nonempty, char **real, int *by_fd)
{
    if (check_mountpoint(mnt) != 0)
        return -1;
    *by_fd = mountpoint_fd(mnt) >= 0; /* the path stays as libfuse parses it */
    if (!(*real = *by_fd ? strdup(mnt) : realpath(mnt, NULL))) {
        fprintf(stderr, "ckptfs: %s: %s\n", mnt, strerror(errno));
        return -1;
    }
    if (*by_fd) /* a mount made by someone else: where is not ours to judge */
        return 0;
    return check_fuse_device() != 0 || check_fusermount() != 0 || check_not_inside(mnt, *real) ||
                   (!nonempty && check_not_mounted(mnt, *real) != 0)
               ? -1
               : 0;
}

int ck_wants_auto_unmount(const struct ck_opts *o, int by_fd)
{
    return o->auto_unmount ||
           (!o->no_auto_unmount && !by_fd && (geteuid() == 0 || have_fusermount()));
}
