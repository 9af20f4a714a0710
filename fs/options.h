/* options.h — ckptfs's own command-line options (-o NAME[=VALUE]), beside libfuse's.
 *
 * Contract: fuse_opt_parse(args, &opts, ck_opt_spec, ck_opts_proc) fills a struct ck_opts (its
 * strings malloc'ed, the caller's to free) and leaves libfuse's own options in args; fstab's
 * and mount(8)'s options that mean nothing to a mount are dropped. Nothing here prints but
 * the usage and the one line that says which option is wrong.
 */
#ifndef CK_OPTIONS_H
#define CK_OPTIONS_H

#include <stdint.h>
#include <stdio.h>
#include <fuse_opt.h>

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

extern const struct fuse_opt ck_opt_spec[];

/* The usage text, for prog, to out. */
void ck_opts_usage(FILE *out, const char *prog);

/* fuse_opt_parse's processing function (data: the struct ck_opts). */
int ck_opts_proc(void *data, const char *arg, int key, struct fuse_args *outargs);

/* Whether the numeric options are in bounds; else 0, with the line that says which is not. */
int ck_opts_valid(const struct ck_opts *o);

/* -o NAME=VALUE as a size into *v (0 when absent). 0, or -1 reported. */
int ck_opts_size(const char *name, const char *value, uint64_t *v);

#endif
