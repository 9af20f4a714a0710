/* verify.c — `ckpt verify`: a pack's blobs against its checksum table (commands.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "../formats/packfile.h"
#include "../checkpoint/open.h"
#include "cli.h"
#include "commands.h"
#include "progress.h"

/* XXH3 of file bytes [off, off + len), read into buf (n bytes at a time); the bar counts them
 * into *done. 0, or -errno (-ECANCELED when a signal stops it). */
static int hash_range(const ck_file *f, uint64_t off, uint64_t len, unsigned char *buf, size_t n,
                      uint64_t *sum, ck_bar *bar, uint64_t *done, uint64_t total)
{
    XXH3_state_t *st = XXH3_createState();
    int rc = st ? 0 : -ENOMEM;
    if (st)
        XXH3_64bits_reset(st);
    for (uint64_t at = 0; at < len && rc == 0; at += n) {
        size_t k = len - at < n ? (size_t)(len - at) : n;
        rc = ck_file_read(f, buf, k, off + at);
        if (rc == 0)
            XXH3_64bits_update(st, buf, k);
        *done += k;
        if (rc == 0 && ck_progress_tick(bar, *done, total))
            rc = -ECANCELED;
    }
    if (rc == 0)
        *sum = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return rc;
}

/* Hashes the blobs where the pack's layout (checked at open) puts them, in file order, up to
 * the first whose sum is not the stored one: *bad is its number, or nblobs when all match.
 * 0, or -errno. */
static int first_mismatch(const ck_index *ix, const pack_layout *pl, const uint64_t *stored,
                          uint32_t *bad)
{
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = malloc(CHUNK);
    uint64_t total = 0, done = 0, sum = 0;
    for (uint32_t b = 0; b < pl->nblobs; b++)
        total += pl->blobs[b].length;
    int rc = buf ? 0 : -ENOMEM;
    ck_bar bar;
    ck_bar_start(&bar, "verify");
    for (*bad = 0; rc == 0 && *bad < pl->nblobs; ++*bad) {
        const pack_blob *blob = &pl->blobs[*bad];
        rc = hash_range(&ix->files[pl->file], blob->offset, blob->length, buf, CHUNK, &sum,
                        &bar, &done, total);
        if (rc == 0 && sum != stored[*bad])
            break;
    }
    ck_bar_end(&bar);
    free(buf);
    return rc;
}

/* Recomputes every blob checksum and names the first tensor whose bytes do not match; path is
 * the pack as shown. */
static int verify_pack(const ck_index *ix, const char *path)
{
    const pack_layout *pl = pack_layout_of(ix, 0);
    uint64_t *stored = malloc(((size_t)pl->nblobs + 1) * sizeof *stored);
    uint32_t bad = 0;
    int rc = stored ? pack_read_trailer(ix, pl->file, pl->nblobs, stored) : -ENOMEM;
    if (rc == -EBADMSG)
        fprintf(stderr, "ckpt: %s: the checksum table is corrupt\n", path);
    else if (rc != 0)
        fprintf(stderr, "ckpt: %s: cannot read the checksum table: %s\n", path, strerror(-rc));
    else if ((rc = first_mismatch(ix, pl, stored, &bad)) != 0)
        fprintf(stderr, "ckpt: %s: %s\n", path, rc == -ECANCELED ? "interrupted" : strerror(-rc));
    else if (bad < pl->nblobs) {
        fprintf(stderr, "ckpt: %s: tensor '%s': checksum mismatch (data at byte %llu)\n", path,
                ix->entries[pl->first_entry + pl->blob_entry[bad]].name,
                (unsigned long long)pl->blobs[bad].offset);
        rc = -1;
    } else {
        printf("%s: %u blobs, %zu entries: every checksum matches\n", path, pl->nblobs,
               ix->nentries);
    }
    free(stored);
    return rc;
}

static int cmd_verify(int argc, char **argv, http_remote *remote)
{
    const char *path = NULL, *val;
    int k;
    ck_opts p;
    ck_opts_init(&p, "verify", ck_no_options, argc, argv);
    while ((k = ck_opts_next(&p, &val)) != CK_OPT_END) {
        if (k == CK_OPT_ERROR)
            return CK_USAGE;
        if (path)
            return ck_usage_error("verify", "need one FILE.pack");
        path = val;
    }
    if (!path)
        return ck_usage_error("verify", "need one FILE.pack");
    ck_index *ix;
    if (cli_open_source(remote, path, &ix) != 0)
        return 1;
    char shown[CK_SHOWN_MAX];
    ck_location_shown(path, shown, sizeof shown);
    int rc = 1;
    if (!pack_layout_of(ix, 0)) {
        fprintf(stderr, "ckpt: %s: not a pack (it is %s)\n", shown, ix->format);
    } else {
        ck_progress_catch_signals();
        rc = verify_pack(ix, shown) != 0;
    }
    ck_index_free(ix);
    return rc;
}

const ck_command ckpt_verify = {
    "verify", "ckpt verify FILE.pack",
    "Recomputes every tensor's checksum. Names the first tensor that does not match and exits\n"
    "1; prints a summary and exits 0 when all match.",
    ck_no_options, cmd_verify};
