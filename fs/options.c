#include "options.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/size.h"

#define CK_OPT(t, p) {t, offsetof(struct ck_opts, p), 1}
static const struct fuse_opt spec[] = {
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

void ck_opts_usage(FILE *out, const char *prog)
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
           "    -o anonymous           s3:// and gs:// requests unsigned, whatever credentials\n"
           "                           are around (a public bucket; also\n"
           "                           CKPTFS_NO_SIGN_REQUEST=1)\n\n"
           "Exit status: 0 mounted, 1 refused or failed, 2 a usage error.\n\n",
           prog);
}

/* Options that mount(8) and fstab pass along but that mean nothing to a FUSE mount: `defaults`
 * and the automount and ownership flags are mount(8)'s own, `_netdev`, `nofail` and `x-*` are
 * for systemd. Dropped, so that an fstab line cannot fail on them. `rw` and `ro` reach libfuse,
 * and every mount is made `ro` after them (main.c). */
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

int ck_opts_parse(struct fuse_args *args, struct ck_opts *o)
{
    return fuse_opt_parse(args, o, spec, opt_proc);
}

/* The numeric options' bounds. sscanf reads "-5" as a huge unsigned and "nan" or "1e400" as
 * doubles that libfuse would turn into undefined timeouts: each is refused, named. */
enum { MAX_READAHEAD_KB = 1 << 20 }; /* 1 GiB */
#define MAX_TIMEOUT_S 4294967295.0

static int numbers_valid(const struct ck_opts *o)
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

/* -o NAME=VALUE as a size into *v (0 when absent). 0, or -1 reported. */
static int option_size(const char *name, const char *value, uint64_t *v)
{
    *v = value ? ck_parse_size(value, 0) : 0;
    if (value && !*v) {
        fprintf(stderr, "ckptfs: -o %s=%s: not a size (e.g. 64M, 1G)\n", name, value);
        return -1;
    }
    return 0;
}

int ck_opts_check(struct ck_opts *o)
{
    return numbers_valid(o) && option_size("cache_mem", o->cache_mem, &o->cache_mem_bytes) == 0 &&
                   option_size("cache_max", o->cache_max, &o->cache_max_bytes) == 0
               ? 0
               : -1;
}

void ck_opts_free(struct ck_opts *o)
{
    free(o->source);
    free(o->mountpoint);
    free(o->extra);
    free(o->cacert);
    free(o->cache_mem);
    free(o->cache_dir);
    free(o->cache_max);
}
