/* fuzz_shareclient.c — warm attach's client against a hostile keeper (share_client.h): whatever
 * bytes the keeper sends, through a socketpair, into the client's whole path up to the mapping:
 * the peer's credentials, the read within the deadline, share_parse, a refusal, the device and
 * source asked (acceptable(): realpath, the files' identities by stat). The mapping itself is
 * CUDA's, absent here; share_client_fits stands for the check made on it.
 *
 * The input is one selector byte, then what the keeper sends. Selector bits: 1, its length and
 * checksum fixed up first (as fuzz_sharemsg.c does); 2, the client asks for cuda:0 (else any
 * device); 4, it expects source "/" (a location every machine has, so a table may name it and
 * reach the files' check). A failure must be one line "fuzz: ..." with no control byte, of an
 * errno ckload.h names; a table must fit a mapping of its own size and not one a byte short. */
#include "../base/bytes.h"
#include "../loader/share_client.h"
#include "../loader/sharesock.h"
#include "fuzz.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxhash.h>

typedef struct keeper {
    int fd;
    const unsigned char *p;
    size_t n;
} keeper;

/* Sends it all (the socket's buffer may hold less than the input), then ends its side. */
static void *keeper_sends(void *arg)
{
    keeper *k = arg;
    share_send_all(k->fd, k->p, k->n);
    shutdown(k->fd, SHUT_WR);
    return NULL;
}

static void check_failure(const char *err)
{
    FUZZ_REQUIRE(strncmp(err, "fuzz: ", 6) == 0);
    for (const char *c = err; *c; c++)
        FUZZ_REQUIRE((unsigned char)*c >= 0x20 && *c != 0x7f);
    FUZZ_REQUIRE(errno == EACCES || errno == EIO || errno == EINVAL || errno == ENODEV ||
                 errno == ENOMEM);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t len = size - 1;
    unsigned char *msg = malloc(len ? len : 1);
    int sv[2];
    if (!msg || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        abort(); /* the harness's problem, not the client's */
    memcpy(msg, data + 1, len);
    if ((data[0] & 1) && len >= SHARE_HEADER + 8) {
        put_le64(msg + 16, len);
        put_le64(msg + len - 8, XXH3_64bits(msg, len - 8));
    }
    keeper k = {.fd = sv[1], .p = msg, .n = len};
    pthread_t th;
    if (pthread_create(&th, NULL, keeper_sends, &k) != 0)
        abort();
    share_ask ask = share_ask_make(data[0] & 2 ? 0 : -1, data[0] & 4 ? "/" : NULL, -1);
    share_table t;
    char err[2048] = "";
    if (share_client_receive(sv[0], "fuzz", &ask, &t, err, sizeof err) != 0) {
        check_failure(err);
    } else {
        FUZZ_REQUIRE(share_client_fits(&t, (size_t)t.block_size, "fuzz", err, sizeof err) == 0);
        FUZZ_REQUIRE(t.block_size == 0 ||
                     share_client_fits(&t, (size_t)t.block_size - 1, "fuzz", err,
                                       sizeof err) != 0);
        share_table_free(&t);
    }
    close(sv[0]); /* a keeper still sending stops: its peer is gone */
    pthread_join(th, NULL);
    close(sv[1]);
    free(msg);
    return 0;
}
