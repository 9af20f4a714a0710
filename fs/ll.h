/* ll.h — the FUSE lowlevel handlers: each one asks the filesystem core (core.h) and turns its
 * answer into a reply; what to serve is decided there, not here.
 * Contract: every reply may be cached by the kernel for as long as it likes (nothing changes
 * after mount): entries and attributes for `timeout` seconds, file pages and directory
 * listings for good (keep_cache, cache_readdir); but a volatile file's (ck_fs_is_volatile:
 * .ckptfs/status) attributes and pages are never cached. Every handler that would modify
 * answers EROFS. Handlers are safe to run on many threads at once.
 */
#ifndef CK_LL_H
#define CK_LL_H

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>
#include <pthread.h>

#include "core.h"

/* The session's user data: the core and what only the replies need. */
typedef struct ck_mount {
    ck_fs fs;
    int direct_io;
    double timeout;             /* seconds the kernel may cache entries and attributes */
    pthread_key_t read_buf;     /* each worker thread's read buffer */
} ck_mount;

extern const struct fuse_lowlevel_ops ck_ll_ops;

/* The core's log (ck_fs_log): one line through fuse_log, which writes to stderr until
 * ck_ll_log_start is called, once the mount serves: from then on every line goes to stderr
 * when to_stderr (the foreground, or a daemon whose stderr is a file), and to syslog (facility
 * daemon, ident ckptfs) when not, and when it is an error. */
void ck_ll_log(const char *line);
void ck_ll_log_start(int to_stderr);

#endif
