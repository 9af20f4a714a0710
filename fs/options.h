/* options.h — ckptfs's own command-line options (-o NAME[=VALUE], SOURCE, MOUNTPOINT), beside
 * libfuse's, and the usage text that describes them.
 *
 * Contract: ck_opts_parse fills a struct ck_opts, set to CK_OPTS_INIT first (the defaults the
 * usage states), and leaves libfuse's own options in args for libfuse; the options that mount(8)
 * and fstab pass along but that mean nothing to a FUSE mount are dropped. ck_opts_check refuses
 * a value out of bounds with one line `ckptfs: -o NAME...: what is wrong` on stderr. The
 * strings are malloc'ed: ck_opts_free.
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
    uint64_t cache_mem_bytes, cache_max_bytes; /* cache_mem, cache_max: ck_opts_check's (0: unset) */
    int auto_unmount;    /* -o auto_unmount given */
    int no_auto_unmount; /* -o noauto_unmount given (mount.fuse.ckptfs: fstab's mounts) */
    int nonempty;        /* -o nonempty: mount over a ckptfs mount, or over SOURCE itself */
    int anonymous;       /* -o anonymous: s3:// requests unsigned (a public bucket) */
    char *extra;         /* the first argument after MOUNTPOINT: a usage error */
};

#define CK_OPTS_INIT {.timeout = 86400, .readahead_kb = 4096}

/* The usage text, naming the command prog, to out. */
void ck_opts_usage(FILE *out, const char *prog);

/* Takes ckptfs's options and arguments out of args into *o: fuse_opt_parse's answer (0, or -1
 * when libfuse's parser refused, having said why through fuse_log). */
int ck_opts_parse(struct fuse_args *args, struct ck_opts *o);

/* Whether the numbers are in bounds, and the sizes sizes (cache_mem_bytes, cache_max_bytes set):
 * 0, or -1 reported. */
int ck_opts_check(struct ck_opts *o);

void ck_opts_free(struct ck_opts *o);

#endif
