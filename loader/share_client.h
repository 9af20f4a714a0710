/* share_client.h — warm attach's client (share.h) up to the mapping: whom it trusts, the keeper's
 * message read within one deadline, parsed and checked against what the caller asked, and the
 * table checked against the mapping the driver made. No CUDA and no load: the unit tests and
 * fuzz/fuzz_shareclient.c drive it over socketpairs; share_attach.c (ckl_attach) maps the block
 * and makes the load.
 *
 * Contract:
 *  - share_ask_make: what the caller asked (device, source, the group it trusts) and the deadline
 *    of the whole exchange, connect and message: CKLOAD_ATTACH_WAIT seconds from now (1 to
 *    3600), else SHARE_WAIT_S.
 *  - share_client_connect: a connected socket, or -1: ENOENT (no server there), EACCES, EIO (no
 *    connection taken by the deadline).
 *  - share_client_receive: before it reads a byte, the keeper (SO_PEERCRED) must run as this
 *    process's effective uid, as root, or be in the group asked (its primary group or another
 *    of its groups); else EACCES. Then the whole message by the deadline (EIO), share_parse
 *    (EIO), a refusal (its class), the device and source asked (acceptable()). 0 with *t the
 *    table, or -1 with errno, err one line and *t empty. Every text of the keeper's (a refusal,
 *    a path) reaches err with each control byte shown as '?' (ck_one_line).
 *  - share_client_fits: the table's block (so every blob, sharemsg.h) lies within the room bytes
 *    the driver says the mapping holds from its address on; else -1, EIO, err one line.
 */
#ifndef CKL_SHARE_CLIENT_H
#define CKL_SHARE_CLIENT_H

#include <stddef.h>
#include <time.h>

#include "sharemsg.h"

typedef struct share_ask {
    int cuda_device;          /* -1: whichever the block is on */
    const char *source;       /* NULL: any */
    long gid;                 /* trusted besides this uid and root; -1: none */
    unsigned wait_s;          /* the whole exchange's seconds */
    struct timespec deadline; /* CLOCK_MONOTONIC */
} share_ask;

share_ask share_ask_make(int cuda_device, const char *source, long gid);
int share_client_connect(const char *path, const share_ask *ask, char *err, size_t errlen);
int share_client_receive(int fd, const char *path, const share_ask *ask, share_table *t,
                         char *err, size_t errlen);
int share_client_fits(const share_table *t, size_t room, const char *path, char *err,
                      size_t errlen);

#endif
