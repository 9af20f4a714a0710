/* loader/sharemsg.h: the warm-attach message written by the server and parsed by the client,
 * round trip, then every way a server's bytes can be wrong: cut short at every length, a
 * length beyond the bound, a failed checksum, counts that the bytes left cannot hold, a blob
 * outside the block, a tensor whose bytes are not its shape's. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "../../base/bytes.h"
#include "../../base/dtype.h"
#include "../../loader/sharemsg.h"

TestSuite(sharemsg);

static const int64_t SHAPE_W[] = {4, 2}, SHAPE_E[] = {0, 3};

/* A table of three tensors: two tied in blob 0, one empty; blob 1 a bf16 vector. */
static void encode(unsigned char **msg, size_t *len)
{
    ck_plan_blob blobs[2] = {{.dest_off = 0, .len = 32}, {.dest_off = 256, .len = 6}};
    ck_plan_tensor pt[4] = {{.blob = 0}, {.blob = 0}, {.blob = 1}, {.blob = CK_PLAN_NONE}};
    ck_plan plan = {.tensors = pt, .ntensors = 4, .blobs = blobs, .nblobs = 2};
    static const int64_t three[] = {3};
    ckl_tensor t[4] = {
        {.name = "a.w", .shape = SHAPE_W, .rank = 2, .nbytes = 32, .dtype_code = CK_F32},
        {.name = "b.tied", .shape = SHAPE_W, .rank = 2, .nbytes = 32, .dtype_code = CK_F32},
        {.name = "c", .shape = three, .rank = 1, .nbytes = 6, .dtype_code = CK_BF16},
        {.name = "empty", .shape = SHAPE_E, .rank = 2, .nbytes = 0, .dtype_code = CK_F32},
    };
    share_file f = {.path = "/m/x.safetensors", .dev = 1, .ino = 2, .size = 3,
                    .mtime_sec = -4, .mtime_nsec = 5};
    share_table tab = {.ordinal = 1, .block_size = 262, .source = "/m/x.safetensors",
                       .files = &f, .nfiles = 1, .plan = &plan, .tensors = t};
    memset(tab.handle, 0xab, sizeof tab.handle);
    cr_assert_eq(share_encode_table(&tab, msg, len), 0);
}

/* The length and checksum made right again after an edit. */
static void fix(unsigned char *msg, size_t len)
{
    put_le64(msg + 16, len);
    put_le64(msg + len - 8, XXH3_64bits(msg, len - 8));
}

static const char *refused(const unsigned char *msg, size_t len)
{
    static ck_error err;
    share_reply r;
    memset(&err, 0, sizeof err);
    cr_assert_eq(share_parse(msg, len, "S", &r, &err), -1);
    cr_assert(strncmp(err.msg, "S: ", 3) == 0, "%s", err.msg);
    cr_assert_null(strchr(err.msg, '\n'));
    return err.msg;
}

Test(sharemsg, round_trip)
{
    unsigned char *msg;
    size_t len;
    encode(&msg, &len);
    share_reply r;
    ck_error err = {{0}};
    cr_assert_eq(share_parse(msg, len, "S", &r, &err), 0, "%s", err.msg);
    share_table *t = &r.table;
    cr_assert_eq(r.refused, 0);
    cr_assert_eq(t->ordinal, 1);
    cr_assert_eq(t->block_size, 262);
    cr_assert_eq(t->handle[63], 0xab);
    cr_assert_str_eq(t->source, "/m/x.safetensors");
    cr_assert_eq(t->nfiles, 1);
    cr_assert_eq(t->files[0].mtime_sec, -4);
    cr_assert_eq(t->plan->ntensors, 4);
    cr_assert_str_eq(t->tensors[1].name, "b.tied");
    cr_assert_str_eq(t->tensors[2].dtype, "BF16");
    cr_assert_eq(t->tensors[0].shape[1], 2);
    cr_assert_eq(t->plan->tensors[3].blob, CK_PLAN_NONE);
    cr_assert_eq(t->plan->blobs[0].count, 2);
    cr_assert_str_eq(t->plan->blobs[0].name, "a.w");
    cr_assert_eq(t->plan->blob_tensors[t->plan->blobs[1].first], 2);
    share_table_free(t);
    free(msg);
}

Test(sharemsg, cut_short_anywhere)
{
    unsigned char *msg;
    size_t len;
    encode(&msg, &len);
    for (size_t n = 0; n < len; n++) {
        const char *why = refused(msg, n); /* the header says otherwise */
        cr_assert(strstr(why, "cut short") || strstr(why, "not the"), "%zu: %s", n, why);
    }
    /* Cut and made whole again: the parse meets the end inside a field, never past it. */
    for (size_t n = SHARE_HEADER + 8; n < len; n++) {
        unsigned char *cut = malloc(n);
        memcpy(cut, msg, n - 8);
        fix(cut, n);
        refused(cut, n);
        free(cut);
    }
    free(msg);
}

Test(sharemsg, length_beyond_the_bound)
{
    unsigned char *msg;
    size_t len;
    encode(&msg, &len);
    put_le64(msg + 16, SHARE_MAX_MESSAGE + 1);
    ck_error err = {{0}};
    cr_assert_eq(share_message_length(msg, "S", &err), 0);
    cr_assert(strstr(err.msg, "claims 268435457 bytes"), "%s", err.msg);
    memcpy(msg, "CKLSHARX", 8);
    cr_assert_eq(share_message_length(msg, "S", &err), 0);
    cr_assert(strstr(err.msg, "not a ckload share server"), "%s", err.msg);
    free(msg);
}

Test(sharemsg, checksum)
{
    unsigned char *msg;
    size_t len;
    encode(&msg, &len);
    msg[SHARE_HEADER + 70] ^= 1; /* in the block size */
    cr_assert_str_eq(refused(msg, len), "S: the server's message fails its checksum");
    free(msg);
}

/* The offset of the u32 tensor count: after the last blob, which ends 8 bytes before the first
 * tensor's name length and its name "a.w". */
static size_t tensor_count_at(const unsigned char *msg, size_t len)
{
    const unsigned char *p = memmem(msg, len, "\x03\x00\x00\x00" "a.w", 7);
    cr_assert_not_null(p);
    return (size_t)(p - msg) - 4;
}

Test(sharemsg, counts_the_bytes_cannot_hold)
{
    unsigned char *msg;
    size_t len;
    encode(&msg, &len);
    size_t at = tensor_count_at(msg, len);
    put_le32(msg + at, UINT32_MAX);
    fix(msg, len);
    cr_assert(strstr(refused(msg, len), "claims 4294967295 tensors, more than its"));
    free(msg);
}

Test(sharemsg, blob_outside_the_block)
{
    unsigned char *msg;
    size_t len;
    encode(&msg, &len);
    size_t at = tensor_count_at(msg, len) - 16; /* the last blob's place */
    put_le64(msg + at, 257);                     /* 6 bytes at 257: past 262 */
    fix(msg, len);
    cr_assert(strstr(refused(msg, len), "blob 1 (6 bytes at 257) lies outside the block"));
    free(msg);
}

Test(sharemsg, bytes_not_the_shapes)
{
    unsigned char *msg;
    size_t len;
    encode(&msg, &len);
    size_t at = tensor_count_at(msg, len) + 4 + 4 + 3 + 2 + 16; /* a.w's nbytes */
    put_le64(msg + at, 31);
    fix(msg, len);
    cr_assert(strstr(refused(msg, len), "tensor 'a.w': its 31 bytes fit neither"));
    put_le64(msg + at, 64); /* its shape's, had it 8 elements more: more than its blob */
    fix(msg, len);
    refused(msg, len);
    free(msg);
}

/* A message written out field by field here, as sharemsg.h lays it out, not by the encoder:
 * one file, one blob, one float32 tensor "t" of 2 elements; the checksum is libxxhash's. */
#define LE32(v) (v) & 0xff, ((v) >> 8) & 0xff, ((v) >> 16) & 0xff, ((v) >> 24) & 0xff
#define LE64(v) LE32((v) & 0xffffffffu), LE32((uint64_t)(v) >> 32)
#define HANDLE8 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11
static unsigned char reference[] = {
    'C', 'K', 'L', 'S', 'H', 'A', 'R', 'E', LE32(1), LE32(0), LE64(211), /* header: table */
    HANDLE8, HANDLE8, HANDLE8, HANDLE8, HANDLE8, HANDLE8, HANDLE8, HANDLE8, /* the IPC handle */
    LE32(0), LE64(8),                                  /* device 0, a block of 8 bytes */
    LE32(2), '/', 's',                                 /* the source */
    LE32(1), LE32(2), '/', 's', LE64(1), LE64(2), LE64(3), LE64(-4), LE32(5), /* its file */
    LE32(1), LE64(0), LE64(8),                         /* one blob: 8 bytes at 0 */
    LE32(1), LE32(1), 't', 12, 1, LE64(2), LE64(8), LE32(0), /* "t": F32, [2], 8 bytes, blob 0 */
    LE64(0),                                           /* the XXH3, written by reference_fixed */
};

static void reference_fixed(void)
{
    cr_assert_eq(sizeof reference, 211);
    put_le64(reference + 203, XXH3_64bits(reference, 203));
}

Test(sharemsg, reference_bytes)
{
    reference_fixed();
    share_reply r;
    ck_error err = {{0}};
    cr_assert_eq(share_parse(reference, sizeof reference, "S", &r, &err), 0, "%s", err.msg);
    share_table *t = &r.table;
    cr_assert_eq(r.refused, 0);
    cr_assert_eq(t->handle[0], 0x11);
    cr_assert_eq(t->handle[63], 0x11);
    cr_assert_eq(t->ordinal, 0);
    cr_assert_eq(t->block_size, 8);
    cr_assert_str_eq(t->source, "/s");
    cr_assert_eq(t->nfiles, 1);
    cr_assert_str_eq(t->files[0].path, "/s");
    cr_assert_eq(t->files[0].dev, 1);
    cr_assert_eq(t->files[0].ino, 2);
    cr_assert_eq(t->files[0].size, 3);
    cr_assert_eq(t->files[0].mtime_sec, -4);
    cr_assert_eq(t->files[0].mtime_nsec, 5);
    cr_assert_eq(t->plan->nblobs, 1);
    cr_assert_eq(t->plan->blobs[0].dest_off, 0);
    cr_assert_eq(t->plan->blobs[0].len, 8);
    cr_assert_eq(t->plan->ntensors, 1);
    cr_assert_str_eq(t->tensors[0].name, "t");
    cr_assert_str_eq(t->tensors[0].dtype, "F32");
    cr_assert_eq(t->tensors[0].rank, 1);
    cr_assert_eq(t->tensors[0].shape[0], 2);
    cr_assert_eq(t->tensors[0].nbytes, 8);
    cr_assert_eq(t->plan->tensors[0].blob, 0);
    unsigned char *again; /* and the encoder writes those very bytes */
    size_t len;
    cr_assert_eq(share_encode_table(t, &again, &len), 0);
    cr_assert_eq(len, sizeof reference);
    cr_assert_arr_eq(again, reference, len);
    free(again);
    share_table_free(t);
}

Test(sharemsg, reference_refusal)
{
    static unsigned char msg[] = {
        'C', 'K', 'L', 'S', 'H', 'A', 'R', 'E', LE32(1), LE32(1), LE64(42), /* a refusal */
        LE32(13), LE32(2), 'n', 'o', LE64(0),            /* EACCES, "no", the XXH3 */
    };
    put_le64(msg + 34, XXH3_64bits(msg, 34));
    share_reply r;
    ck_error err = {{0}};
    cr_assert_eq(share_parse(msg, sizeof msg, "S", &r, &err), 0, "%s", err.msg);
    cr_assert_eq(r.refused, 1);
    cr_assert_eq(r.code, 13);
    cr_assert_str_eq(r.text, "no");
    unsigned char *again;
    size_t len;
    cr_assert_eq(share_encode_refusal(13, "no", &again, &len), 0);
    cr_assert_eq(len, sizeof msg);
    cr_assert_arr_eq(again, msg, len);
    free(again);
}

Test(sharemsg, a_name_twice)
{
    reference_fixed();
    /* "t" again, as a second tensor of the one blob: a table two tensors share a blob in is
     * fine (tied), one naming two tensors alike is not */
    static const unsigned char again[] = {LE32(1), 't', 12, 1, LE64(2), LE64(8), LE32(0)};
    size_t len = sizeof reference + sizeof again;
    unsigned char *msg = malloc(len);
    memcpy(msg, reference, 172);
    put_le32(msg + 172, 2);                                   /* two tensors */
    memcpy(msg + 176, reference + 176, 27);
    memcpy(msg + 203, again, sizeof again);
    fix(msg, len);
    cr_assert_str_eq(refused(msg, len), "S: the server's table names tensor 't' twice (byte 203)");
    msg[207] = 'u';                                           /* tied, named apart: a table */
    fix(msg, len);
    share_reply r;
    ck_error err = {{0}};
    cr_assert_eq(share_parse(msg, len, "S", &r, &err), 0, "%s", err.msg);
    cr_assert_eq(r.table.plan->blobs[0].count, 2);
    share_table_free(&r.table);
    free(msg);
}
