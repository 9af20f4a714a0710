/* source.c — ck_open: what kind of checkpoint a path holds, decided by content alone. */
#include "gguf.h"
#include "index.h"
#include "npy.h"
#include "packfile.h"
#include "safetensors.h"
#include "torch.h"
#include "zip.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A zip is an .npz when its first member is an .npy file (np.savez writes nothing else), and a
 * PyTorch checkpoint when its first record lies in a folder (torch.save's "archive/..."); any
 * other is named for what it holds. */
static int read_zip(ck_index *ix, uint32_t id, const unsigned char *head, size_t n,
                    ck_error *err)
{
    size_t len;
    const char *first = zip_first_name(head, n, &len);
    if (npz_probe(head, n)) {
        ix->format = "npz";
        return npz_read_file(ix, id, err);
    }
    if (!first || memchr(first, '/', len)) {
        ix->format = "pytorch-zip";
        return pt_read_zip(ix, id, err);
    }
    return ck_fail(err, ix->files[id].path, "a zip archive, but neither an .npz (its first "
                   "member '%.*s' is not an .npy file) nor a PyTorch checkpoint (whose records "
                   "lie in one folder)", (int)(len < 200 ? len : 200), first);
}

static int open_file(const char *source, int fd, ck_index **out, ck_error *err)
{
    /* Enough for every probe: a zip's first member name included. */
    unsigned char head[NPY_PROBE_BYTES > PT_PROBE_BYTES ? NPY_PROBE_BYTES : PT_PROBE_BYTES];
    ck_index *ix = ck_index_new(NULL);
    if (!ix) {
        close(fd);
        return ck_fail(err, source, "out of memory");
    }
    int id = ck_index_add_file(ix, source, fd, err);
    if (id < 0)
        goto fail;
    const ck_file *f = &ix->files[id];
    size_t n = f->size < sizeof head ? (size_t)f->size : sizeof head;
    int rc = ck_pread(f->fd, head, n, 0);
    if (rc) {
        ck_fail(err, source, "cannot read: %s", strerror(-rc));
        goto fail;
    }
    if (n == 0) {
        ck_fail(err, source, "empty file");
        goto fail;
    }
    /* Content decides, never the file name. */
    int rc_read;
    if (pack_probe(head, n)) {
        ix->format = "pack";
        rc_read = pack_read_file(ix, (uint32_t)id, err);
    } else if (st_probe(head, n)) {
        ix->format = "safetensors";
        rc_read = st_read_file(ix, (uint32_t)id, err);
    } else if (npy_probe(head, n)) {
        ix->format = "npy";
        rc_read = npy_read_file(ix, (uint32_t)id, err);
    } else if (gguf_probe(head, n)) {
        ix->format = "gguf";
        rc_read = gguf_read_file(ix, (uint32_t)id, err);
    } else if (zip_probe(head, n)) {
        rc_read = read_zip(ix, (uint32_t)id, head, n, err);
    } else if (pt_probe_legacy(head, n)) {
        ix->format = "pytorch-legacy";
        rc_read = pt_read_legacy(ix, (uint32_t)id, err);
    } else {
        char hex[3 * sizeof head + 1] = "";
        for (size_t i = 0, k = 0; i < n && i < 8; i++)
            k += (size_t)snprintf(hex + k, sizeof hex - k, "%s%02x", i ? " " : "", head[i]);
        ck_fail(err, source, "not a checkpoint format ckptfs knows (first bytes %s)", hex);
        goto fail;
    }
    if (rc_read != 0)
        goto fail;
    *out = ix;
    return 0;
fail:
    ck_index_free(ix);
    return -1;
}

int ck_open(const char *source, ck_index **out, ck_error *err)
{
    *out = NULL;
    /* O_NONBLOCK: opening a FIFO must not wait for a writer. */
    int fd = open(source, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return ck_fail(err, source, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return ck_fail(err, source, "cannot stat: %s", strerror(e));
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        /* The one place a directory's kind is decided: GGUF splits, else safetensors shards. */
        return gguf_dir_probe(source) ? gguf_open_dir(source, out, err)
                                      : st_open_dir(source, out, err);
    }
    return open_file(source, fd, out, err);
}
