/* main.c — `ckptfs [options] SOURCE MOUNTPOINT`: parse SOURCE completely, then mount its view.
 *
 * Order matters: everything that can fail because of the checkpoint fails before the mount
 * exists, so a bad SOURCE never leaves a mountpoint behind; the process daemonizes only after
 * the kernel has accepted the mount, so `ckptfs ... && ls MOUNTPOINT` works.
 */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ll.h"
#include "view.h"

#define CKPTFS_VERSION "0.1.0"

/* Command-line state that is ours rather than libfuse's. */
struct ck_opts {
    char *source;
    int direct_io;
    unsigned uid, gid;
    int uid_set, gid_set;
    double timeout;
};

#define CK_OPT(t, p) {t, offsetof(struct ck_opts, p), 1}
static const struct fuse_opt ck_opt_spec[] = {
    CK_OPT("direct_io", direct_io),
    CK_OPT("uid=%u", uid),
    CK_OPT("uid=", uid_set),
    CK_OPT("gid=%u", gid),
    CK_OPT("gid=", gid_set),
    CK_OPT("timeout=%lf", timeout),
    FUSE_OPT_END,
};

static void usage(const char *prog)
{
    printf("usage: %s [options] SOURCE MOUNTPOINT\n\n"
           "Mounts a checkpoint (a safetensors file or a directory of shards) read-only, one\n"
           "file per tensor. Unmount with `fusermount3 -u MOUNTPOINT`.\n\n"
           "ckptfs options:\n"
           "    -o direct_io           bypass the page cache: bigger reads, no shared mmap\n"
           "    -o uid=N,gid=N         owner of every file (default: the mounting user)\n"
           "    -o timeout=S           seconds the kernel caches names and attributes (86400)\n"
           "    -o allow_other         let other users in (needs user_allow_other in\n"
           "                           /etc/fuse.conf unless root)\n\n",
           prog);
}

/* The first non-option argument is SOURCE; the second, the mountpoint, goes on to libfuse. */
static int opt_proc(void *data, const char *arg, int key, struct fuse_args *outargs)
{
    (void)outargs;
    struct ck_opts *o = data;
    if (key == FUSE_OPT_KEY_NONOPT && !o->source) {
        o->source = strdup(arg);
        return 0;
    }
    return 1;
}

/* Mount options every ckptfs mount carries; fsname shows SOURCE in `mount` and `df`. */
static int add_mount_opts(struct fuse_args *args, const char *source)
{
    char *opts = NULL, *fsname = NULL;
    int rc = asprintf(&fsname, "fsname=%s", source) < 0 ||
             fuse_opt_add_opt(&opts, "ro,default_permissions,subtype=ckptfs") ||
             fuse_opt_add_opt_escaped(&opts, fsname) || /* a ',' in SOURCE stays in the name */
             fuse_opt_add_arg(args, "-o") || fuse_opt_add_arg(args, opts);
    free(fsname);
    free(opts);
    return rc;
}

static int check_mountpoint(const char *mnt)
{
    struct stat st;
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

/* Builds the immutable view: index, tree and the .ckptfs files. */
static int build_view(ck_fs *fs, const char *source, const struct ck_opts *o)
{
    ck_error err;
    ck_index *ix;
    ck_tree *tree;
    if (ck_open(source, &ix, &err) != 0 ||
        ck_tree_build(ix, CK_VDIR, ck_vfile_names, CK_VFILE_COUNT, &tree, &err) != 0) {
        fprintf(stderr, "ckptfs: %s\n", err.msg);
        return -1;
    }
    fs->ix = ix;
    fs->tree = tree;
    fs->vdata[CK_VFILE_INDEX_JSON] = ck_view_index_json(ix, tree, 0, &fs->vlen[CK_VFILE_INDEX_JSON]);
    if (!fs->vdata[CK_VFILE_INDEX_JSON]) {
        fprintf(stderr, "ckptfs: %s: out of memory\n", source);
        return -1;
    }
    fs->uid = o->uid_set ? o->uid : getuid();
    fs->gid = o->gid_set ? o->gid : getgid();
    fs->direct_io = o->direct_io;
    fs->timeout = o->timeout;
    fs->mtime = ix->files[0].mtime;
    return 0;
}

static void free_view(ck_fs *fs)
{
    for (int k = 0; k < CK_VFILE_COUNT; k++)
        free(fs->vdata[k]);
    ck_tree_free((ck_tree *)fs->tree);
    ck_index_free((ck_index *)fs->ix);
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
    fuse_loop_cfg_set_idle_threads(cfg, co->max_idle_threads);
    int rc = fuse_session_loop_mt(se, cfg);
    fuse_loop_cfg_destroy(cfg);
    return rc;
}

int main(int argc, char **argv)
{
    struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
    struct ck_opts o = {.timeout = 86400};
    struct fuse_cmdline_opts co = {0};
    ck_fs fs = {0};
    struct fuse_session *se = NULL;
    int status = 1, mounted = 0;

    if (fuse_opt_parse(&args, &o, ck_opt_spec, opt_proc) != 0 ||
        fuse_parse_cmdline(&args, &co) != 0)
        goto out;
    if (co.show_help) {
        usage(argv[0]);
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
    if (!o.source || !co.mountpoint) {
        fprintf(stderr, "ckptfs: need SOURCE and MOUNTPOINT (see %s --help)\n", argv[0]);
        goto out;
    }
    if (check_mountpoint(co.mountpoint) != 0 || build_view(&fs, o.source, &o) != 0)
        goto out;
    char abs[PATH_MAX];
    if (add_mount_opts(&args, realpath(o.source, abs) ? abs : o.source) != 0 ||
        pthread_key_create(&fs.read_buf, free) != 0) {
        fprintf(stderr, "ckptfs: out of memory\n");
        goto out;
    }
    se = fuse_session_new(&args, &ck_ll_ops, sizeof ck_ll_ops, &fs);
    if (!se || fuse_set_signal_handlers(se) != 0)
        goto out;
    if (fuse_session_mount(se, co.mountpoint) != 0)
        goto out;
    mounted = 1;
    if (fuse_daemonize(co.foreground) != 0)
        goto out;
    status = serve(se, &co) < 0;
out:
    if (se) {
        if (mounted)
            fuse_session_unmount(se);
        fuse_remove_signal_handlers(se);
        fuse_session_destroy(se);
    }
    free_view(&fs);
    free(co.mountpoint);
    free(o.source);
    fuse_opt_free_args(&args);
    return status;
}
