/* sharemsg.h — the one message a warm-attach server (share.h) sends each client: the block's
 * IPC handle and the tensor table, or why the client is refused. No CUDA, no sockets: the
 * encoding and the client's bounded parse, which the unit tests and fuzz/fuzz_sharemsg.c drive.
 *
 * Contract:
 *  - A message is little-endian: "CKLSHARE", u32 version (1), u32 kind (table 0, refusal 1),
 *    u64 its whole length, the body, and an XXH3-64 of every byte before it. A refusal's body is
 *    u32 errno class and its text (u32 length, at most SHARE_MAX_TEXT). A table's body: the IPC
 *    handle (SHARE_HANDLE_SIZE bytes), u32 device ordinal, u64 block size, the source (u32
 *    length, at most SHARE_MAX_PATH: the served location, absolute), u32 files, each its path and
 *    u64 device, inode, size, mtime seconds (signed) and u32 nanoseconds; u32 blobs, each u64
 *    place in the block and length; u32 tensors, each name (u32 length, at most SHARE_MAX_NAME,
 *    no NUL), u8 dtype (enum ck_dtype), u8 rank (< CK_MAX_RANK + 1), rank i64 dims, u64 bytes,
 *    u32 blob (SHARE_NO_BLOB for an empty tensor).
 *  - share_parse trusts nothing: a message is data, never code. The whole length is at most
 *    SHARE_MAX_MESSAGE; every count is checked against the bytes left before anything is sized
 *    by it; every blob lies inside the block, every tensor's bytes are its dtype's for its shape
 *    (ck_tensor_nbytes) and fit its blob, every blob has a tensor; no two tensors share a name
 *    (a set whose hash is seeded, ck_hash_seed); nothing is left over. Time and memory are
 *    linear in the message. A refusal is one line "WHERE: what is wrong (byte N)".
 *  - The parsed table builds a plan (plan.h: blobs with their places, tensors with their blobs,
 *    blob_tensors) and ckl_tensors whose names and shapes live in the table's own strings; data
 *    is left NULL for the caller (the block's address is the importer's).
 *  - A source's identity is its files' (device, inode, size, mtime), compared by
 *    ck_file_matches: what the loader's verify and the mount check too.
 */
#ifndef CKL_SHAREMSG_H
#define CKL_SHAREMSG_H

#include <stddef.h>
#include <stdint.h>

#include "../base/error.h"
#include "ckload.h"
#include "plan.h"

#define SHARE_HANDLE_SIZE 64               /* cudaIpcMemHandle_t's CUDA_IPC_HANDLE_SIZE */
#define SHARE_MAX_MESSAGE ((uint64_t)256 << 20) /* a table of ~1M tensors with long names */
#define SHARE_MAX_PATH 4096u               /* PATH_MAX */
#define SHARE_MAX_NAME 65535u              /* a tensor's name */
#define SHARE_MAX_TEXT 1024u               /* a refusal's text */
#define SHARE_HEADER 24u                   /* magic, version, kind, length */
#define SHARE_NO_BLOB UINT32_MAX

typedef struct share_file {
    const char *path;
    uint64_t dev, ino, size;
    int64_t mtime_sec;
    uint32_t mtime_nsec;
} share_file;

typedef struct share_table {
    unsigned char handle[SHARE_HANDLE_SIZE];
    int ordinal;
    uint64_t block_size;
    const char *source;
    share_file *files;
    uint32_t nfiles;
    ck_plan *plan;           /* blobs (dest_off, len, first, count, name) and tensors' blobs */
    ckl_tensor *tensors;     /* plan->ntensors; names, dtypes and shapes point into strings */
    char *strings;           /* owned: every name and path, NUL-terminated */
    int64_t *dims;           /* owned: every shape */
} share_table;

typedef struct share_reply {
    int refused;             /* a refusal: code and text; else table */
    int code;                /* its errno class */
    char text[SHARE_MAX_TEXT + 1];
    share_table table;
} share_reply;

/* The length a message's header says (SHARE_HEADER bytes at h), or 0 when they are not a
 * message's header or the length is out of bounds (err says which, for where). */
uint64_t share_message_length(const unsigned char *h, const char *where, ck_error *err);

/* Parses the len bytes at msg (a whole message) into *out. 0, or -1 with err set ("WHERE: ...")
 * and nothing allocated. share_table_free frees a parsed table. */
int share_parse(const unsigned char *msg, size_t len, const char *where, share_reply *out,
                ck_error *err);
void share_table_free(share_table *t);

/* The message of t (its plan's blobs and tensors, tensors[i].nbytes, names, shapes), malloc'ed
 * into *msg, *len bytes. 0, or -1 when memory runs out. */
int share_encode_table(const share_table *t, unsigned char **msg, size_t *len);
/* A refusal of class code saying text (cut to SHARE_MAX_TEXT) into *msg, *len. 0, or -1. */
int share_encode_refusal(int code, const char *text, unsigned char **msg, size_t *len);

/* The first of n files that is not as described (stat by path, ck_file_matches), or -1. */
long share_files_changed(const share_file *files, uint32_t n);

#endif
