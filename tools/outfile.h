/* outfile.h — how ckpt commands write what they make: whole or not at all.
 * Contract: ck_out_file streams a synthesized file into a temp file beside OUT, fsyncs it and
 * renames it over OUT. A directory output is built the same way: ck_out_dir_begin makes a temp
 * directory beside OUT, each ck_out_dir_add writes one fsynced file in it, ck_out_dir_commit
 * syncs and renames it to OUT (which must not exist as a non-empty directory). On any failure,
 * or Ctrl-C (progress.h), the temp file or directory is removed, one line "ckpt: OUT: why" is
 * printed, and -1 returned. A progress bar over all the bytes is drawn on a terminal. Temp
 * names are OUT.ckpt-tmp-PID-XXXXXX; one whose process is gone (killed before it could clean
 * up) is removed by the next output to OUT. An OUT named as a URL is refused ("ckpt: URL: an
 * output is a local path, not a URL"), the URL shown without its secrets.
 */
#ifndef CK_TOOLS_OUTFILE_H
#define CK_TOOLS_OUTFILE_H

#include <stdint.h>

#include "../checkpoint/synth.h"
#include "progress.h"

/* How an output is written: CK_OUT_FORCE replaces what is there (a directory output's), and
 * CK_OUT_SAY prints "ckpt: OUT: written, SIZE in T s (RATE)" on success (what a terminal gets
 * anyway: ck_out_say_default). */
enum { CK_OUT_FORCE = 1, CK_OUT_SAY = 2 };
int ck_out_say_default(void);

int ck_out_file(ck_synth *sy, const char *out, const char *label, int flags);

/* Where a file output given as out goes: out, or out/name when out is a directory (as cp puts
 * a file in one). NULL after one line saying why not: out ends in '/' but is no directory, or
 * a directory above it is missing (the shallowest named). The caller frees it. */
char *ck_out_file_path(const char *out, const char *name);

/* Whether writing out leaves every local file of ix's source in place: out is none of them (as a
 * file, through any symlink or spelling: `cp a a`'s "are the same file"), and as a directory
 * output (dir) does not hold one (--force replaces a directory of files). 0, or -1 after one
 * line saying which source file the output would replace. */
int ck_out_spares_sources(const char *out, int dir, const ck_index *ix);

typedef struct ck_out_dir {
    const char *out;
    char *tmp;              /* the temp directory */
    int dirfd;
    uint64_t done, total;   /* bytes, for the bar */
    ck_bar bar;
    int flags;              /* CK_OUT_* */
} ck_out_dir;

/* Fails (said) when out is a non-empty directory or not a directory, unless CK_OUT_FORCE, which
 * replaces a directory of files or a file at the commit; or when its parent is missing. */
int ck_out_dir_begin(ck_out_dir *d, const char *out, uint64_t total, const char *label,
                     int flags);
/* Writes sy as file name in the directory (removes the directory on failure). */
int ck_out_dir_add(ck_out_dir *d, const char *name, ck_synth *sy);
/* Writes n bytes as file name in the directory (removes the directory on failure). */
int ck_out_dir_add_bytes(ck_out_dir *d, const char *name, const void *p, size_t n);
int ck_out_dir_commit(ck_out_dir *d);
/* Removes the directory, printing nothing: for a failure the caller has reported. */
void ck_out_dir_abort(ck_out_dir *d);

#endif
