/* location.h — how a checkpoint's location is named and shown.
 *
 * Contract:
 *  - A location is a path, or a URL: http:// or https:// (any case, as RFC 3986 has schemes),
 *    or SCHEME:// with a scheme name in lowercase (a letter, then letters, digits, '+', '-',
 *    '.'). Which schemes ckptfs reads, and how, is sources/schemes.h's table: a URL of a scheme
 *    it does not know fails there, by name, rather than as a missing file.
 *  - A location is shown (in messages, `mount`, a process's command line) only through
 *    ck_location_shown: a URL's userinfo ("user:password@"), query (a presigned URL's signature)
 *    and fragment are secrets, never printed.
 *  - Pure string functions: no I/O, no state.
 */
#ifndef CK_LOCATION_H
#define CK_LOCATION_H

#include <stddef.h>

/* Whether loc is an http:// or https:// URL. */
int ck_location_is_http(const char *loc);

/* Whether loc is a URL (above) rather than a path. */
int ck_location_is_url(const char *loc);

/* Room for a shown location: a local path (PATH_MAX) whole; a longer URL is cut. */
#define CK_SHOWN_MAX 4096

/* loc as it may be shown, into buf (cap > 0 bytes, cut to fit): a URL without its userinfo,
 * query and fragment ("http://u:pw@h/m?sig#f" -> "http://h/m"); anything else as is. Returns
 * buf, so that it goes straight into a printf. */
char *ck_location_shown(const char *loc, char *buf, size_t cap);

/* Hides the secrets of argv's URL arguments from `ps` and /proc/PID/cmdline: each such argv[i]
 * is pointed at a heap copy (what the program goes on to read), and the original, in the
 * process's argument block, is rewritten in place to its shown form, NUL-padded. 0, or -1 when
 * memory runs out (the arguments from the one it ran out on stay as they were). */
int ck_location_hide_args(int argc, char **argv);

#endif
