/* fuzz_sharemsg.c — the client's parse of a warm-attach server's message (share_parse): a server
 * is data, never code.
 *
 * The input is one selector byte, then a message. With the selector's low bit set, its length
 * and checksum are fixed up first (as fuzz_packfile fixes a pack's index checksum), so that the
 * fuzzer reaches the table behind them. A message the parser accepts must keep sharemsg.h's
 * promises: every blob inside the block and with a tensor, each tensor's blob holding its bytes,
 * the blobs' tensors listed once, ascending, no name twice; and written again
 * (share_encode_table), it must be the very bytes parsed. A refusal must name a class and a
 * line. */
#include "../base/bytes.h"
#include "../loader/sharemsg.h"
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static int by_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void check_table(const share_table *t, const uint8_t *msg, size_t len)
{
    const ck_plan *p = t->plan;
    const char **names = malloc((p->ntensors ? p->ntensors : 1) * sizeof *names);
    FUZZ_REQUIRE(names != NULL);
    for (size_t i = 0; i < p->ntensors; i++)
        names[i] = t->tensors[i].name;
    qsort(names, p->ntensors, sizeof *names, by_name);
    for (size_t i = 1; i < p->ntensors; i++)
        FUZZ_REQUIRE(strcmp(names[i - 1], names[i]) != 0);
    free(names);
    for (size_t b = 0; b < p->nblobs; b++) {
        const ck_plan_blob *bl = &p->blobs[b];
        FUZZ_REQUIRE(bl->len <= t->block_size && bl->dest_off <= t->block_size - bl->len);
        FUZZ_REQUIRE(bl->count > 0 && bl->name == t->tensors[p->blob_tensors[bl->first]].name);
        for (uint32_t k = 0; k < bl->count; k++) {
            uint32_t i = p->blob_tensors[bl->first + k];
            FUZZ_REQUIRE(i < p->ntensors && p->tensors[i].blob == b);
            FUZZ_REQUIRE(k == 0 || i > p->blob_tensors[bl->first + k - 1]);
        }
    }
    for (size_t i = 0; i < p->ntensors; i++) {
        uint32_t b = p->tensors[i].blob;
        FUZZ_REQUIRE(b == CK_PLAN_NONE ? t->tensors[i].nbytes == 0
                                       : b < p->nblobs && t->tensors[i].nbytes <= p->blobs[b].len);
    }
    unsigned char *again;
    size_t n;
    FUZZ_REQUIRE(share_encode_table(t, &again, &n) == 0);
    FUZZ_REQUIRE(n == len && memcmp(again, msg, n) == 0);
    free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t len = size - 1;
    unsigned char *msg = malloc(len ? len : 1);
    if (!msg)
        return 0;
    memcpy(msg, data + 1, len);
    if ((data[0] & 1) && len >= SHARE_HEADER + 8) {
        put_le64(msg + 16, len);
        put_le64(msg + len - 8, XXH3_64bits(msg, len - 8));
    }
    share_reply r;
    ck_error err = {{0}};
    if (share_parse(msg, len, "fuzz", &r, &err) != 0) {
        FUZZ_REQUIRE(strncmp(err.msg, "fuzz: ", 6) == 0 && !strchr(err.msg, '\n'));
    } else if (r.refused) {
        FUZZ_REQUIRE(r.code != 0);
    } else {
        check_table(&r.table, msg, len);
        share_table_free(&r.table);
    }
    free(msg);
    return 0;
}
