/* mountinfo.h — what a mount tells a loader about itself: where its virtual files are, and
 * which source files it parsed; and what the kernel's mount table says is mounted where.
 *
 * Contract: the root of every mount carries the xattr CK_SOURCES_XATTR: a list of
 * NUL-terminated strings. For a local SOURCE: SOURCE as mounted (made absolute), then one per
 * file of the index, in its order, "DEV INO SIZE SEC.NSEC PATH" (decimal; the device, inode,
 * size and mtime recorded when the file was parsed; PATH absolute). For a remote SOURCE (a URL,
 * base/location.h): the URL as ck_location_shown shows it (no userinfo, query or fragment: no
 * secret) and nothing else. The mount writes it (ck_sources_encode), a loader reads it
 * (ck_sources_parse) and opens the files itself only when they are still these very files; a
 * remote source it never opens (the credentials are the mount's, and not in the value): it
 * reads such a mount through its pack.
 * The virtual files live in CK_VDIR at the root: the pack is CK_VFILE_PACK_NAME there.
 */
#ifndef CK_MOUNTINFO_H
#define CK_MOUNTINFO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* dev_t */
#include <time.h>

#include "../index/index.h"

#define CK_VDIR ".ckptfs"
#define CK_VFILE_PACK_NAME "checkpoint.pack"
#define CK_SOURCES_XATTR "user.ckptfs.sources"

/* The xattr's value for source (absolute) and ix's files, opened as paths[i] (absolute), into
 * *v (malloc'ed, *len bytes); for a source that is a URL, the URL as shown, and ix and paths
 * are not read. 0, or -1 when memory runs out. */
int ck_sources_encode(const char *source, const ck_index *ix, const char *const *paths,
                      char **v, size_t *len);

/* One source file as the xattr tells it. */
typedef struct ck_source_file {
    const char *path;
    uint64_t dev, ino, size;
    struct timespec mtime;
} ck_source_file;

/* Parses a value of len bytes in place: *source and the paths of (*files)[0 .. *nfiles)
 * (malloc'ed; the caller frees it) point into v; a remote source's *source is its URL (as
 * shown), with *files NULL and *nfiles 0. 0, or -1 when the value is malformed (a URL not as
 * shown, or followed by records, among others) or memory runs out. */
int ck_sources_parse(char *v, size_t len, const char **source, ck_source_file **files,
                     size_t *nfiles);

/* What /proc/self/mountinfo says of the mount on top at a path (ck_mount_top). */
#define CK_MOUNTINFO "/proc/self/mountinfo"
typedef struct ck_mount_at {
    long id;               /* the mount ID */
    int shared;            /* it propagates to peers (optional field "shared:N") */
    char fstype[64];       /* "fuse.ckptfs" for a ckptfs mount */
    char source[4096];     /* as mounted (ckptfs: the fsname, SOURCE), unescaped */
} ck_mount_at;

/* The top mount (the last listed) at path (absolute, canonical) in table, a file in the format
 * of /proc/self/mountinfo (CK_MOUNTINFO): 1 with *at filled, 0 when nothing is mounted there,
 * -1 when table cannot be read or path is too long to look for. */
int ck_mount_top(const char *table, const char *path, ck_mount_at *at);

/* The mount of device dev (a file's st_dev: the file system that holds it) in table, the last
 * listed where several are (bind mounts): 1 with *at filled, 0 when none is listed, -1 when
 * table cannot be read. */
int ck_mount_of_dev(const char *table, dev_t dev, ck_mount_at *at);

/* Whether table lists the mount ID id: 1 or 0; -1 when table cannot be read. */
int ck_mount_listed(const char *table, long id);

#endif
