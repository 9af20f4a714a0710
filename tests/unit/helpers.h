/* helpers.h — shared fixtures for the unit tests: temporary files, safetensors files, indexes
 * built by hand, and the checks every error test makes.
 *
 * Every path made here lives under /tmp and is removed by tmp_cleanup, which each suite runs as
 * its .fini (and which also runs at exit). Strings returned by the tmp_ and st_ functions stay
 * valid until then.
 */
#ifndef CK_TEST_HELPERS_H
#define CK_TEST_HELPERS_H

#include <stddef.h>
#include <stdint.h>

#include "../../views/tree.h"
#include "../../index/index.h"

/* --- temporary paths --------------------------------------------------------------------- */

/* A new file (mkstemp under /tmp) holding len bytes of data; its path. */
const char *tmp_file(const void *data, size_t len);
/* A new empty directory (mkdtemp under /tmp); its path. */
const char *tmp_dir(void);
/* dir/name, registered for removal; nothing is created. */
const char *tmp_path_in(const char *dir, const char *name);
/* The file dir/name holding len bytes of data; its path. */
const char *tmp_file_in(const char *dir, const char *name, const void *data, size_t len);
/* Replaces the contents of the file at path with len bytes of data. */
void tmp_rewrite(const char *path, const void *data, size_t len);
/* Removes every registered path, newest first. */
void tmp_cleanup(void);

/* --- bytes and strings ------------------------------------------------------------------- */

/* n deterministic pseudo-random bytes for seed: a byte that lands in the wrong place shows. */
void fill_bytes(void *buf, size_t n, uint32_t seed);
/* A malloc'ed, formatted string that tmp_cleanup frees. */
const char *strf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* --- files and other programs ------------------------------------------------------------ */

/* The whole file at path, malloc'ed (the caller frees); *len gets its size. */
unsigned char *read_whole(const char *path, size_t *len);
/* Runs /usr/bin/python3 -c script with the arguments that follow (up to 12, then NULL) and
 * asserts that it exits 0; what it wrote to stdout, NUL-terminated, which tmp_cleanup frees. */
const char *run_python(const char *script, ...) __attribute__((sentinel));

/* --- safetensors files ------------------------------------------------------------------- */

/* One tensor's header JSON: "name":{"dtype":..,"shape":..,"data_offsets":[begin,end]}. */
const char *st_tensor(const char *name, const char *dtype, const char *shape,
                      unsigned long long begin, unsigned long long end);
/* The bytes of a safetensors file: header length (8 bytes, little-endian), header, data. Malloc'ed;
 * *len gets the size. */
unsigned char *st_bytes(const char *header, const void *data, size_t data_len, size_t *len);
/* A temporary safetensors file; its path. data may be NULL for data_len zero bytes. */
const char *st_file(const char *header, const void *data, size_t data_len);
/* The same, as dir/name. */
const char *st_file_in(const char *dir, const char *name, const char *header, const void *data,
                       size_t data_len);
/* A file whose length field says hlen, followed by rest (rest_len bytes). */
const char *st_file_hlen(uint64_t hlen, const void *rest, size_t rest_len);

/* --- packs (docs/PACK.md), built byte by byte ----------------------------------------- */
/* Written from FORMAT.md alone, sharing no code with the product's reader or writer. */

/* A growing byte buffer; free(b.p) when done. */
typedef struct bytebuf {
    unsigned char *p;
    size_t len, cap;
} bytebuf;

void buf_put(bytebuf *b, const void *data, size_t n);
void buf_u8(bytebuf *b, uint8_t v);
void buf_u32(bytebuf *b, uint32_t v);
void buf_u64(bytebuf *b, uint64_t v);
/* Little-endian fields in place. */
void put_le32(unsigned char *p, uint32_t v);
void put_le64(unsigned char *p, uint64_t v);
uint64_t get_le64(const unsigned char *p);

/* Index records. pk_str: a u32 length and the bytes; pk_meta: a key and a value (strlen);
 * pk_head: an entry up to its reserved byte (name_len bytes of name); pk_tensor and pk_value:
 * whole entries (names by strlen). */
void pk_counts(bytebuf *ix, uint64_t nentries, uint64_t nblobs, uint32_t nmeta,
               uint32_t reserved);
void pk_str(bytebuf *ix, const void *s, uint32_t len);
void pk_meta(bytebuf *ix, const char *key, const char *value);
void pk_head(bytebuf *ix, const char *name, size_t name_len, uint8_t kind, uint8_t type,
             uint8_t rank, uint8_t reserved);
void pk_tensor(bytebuf *ix, const char *name, enum ck_dtype dt, unsigned rank,
               const int64_t *dims, uint64_t blob);
void pk_value(bytebuf *ix, const char *name, enum ck_value_type t, const char *text,
              size_t len);

/* A blob: its bytes (NULL: zeros) and its place in the data region. */
typedef struct pk_blob {
    const void *data;
    uint64_t offset, length;
} pk_blob;

/* Places blobs as FORMAT.md says: each at the first multiple of 256 at or after the end of
 * the one before, the first at 0. */
void pk_place(pk_blob *blobs, size_t n);
/* The blob table of the index. */
void pk_blobs(bytebuf *ix, const pk_blob *blobs, size_t n);
/* A whole pack: the header (index_xxh3 computed), the index, zeros up to the next multiple of
 * 4096, the data region (each blob at its offset, zeros around, length a multiple of 4096),
 * the trailer (XXH3 of each blob, then of those). Malloc'ed; *len gets its size. */
unsigned char *pk_bytes(const bytebuf *ix, const pk_blob *blobs, size_t n, size_t *len);
/* The same as a temporary file; its path. */
const char *pk_file(const bytebuf *ix, const pk_blob *blobs, size_t n);
/* Sets index_xxh3 of the pack in memory to the XXH3 of its index (as index_length says). */
void pk_fix_xxh3(unsigned char *pack);

/* --- opening ----------------------------------------------------------------------------- */

/* Asserts that ck_open(path) fails: -1, *out NULL, and a one-line message that starts with path
 * and contains what. */
void assert_open_fails(const char *path, const char *what);
/* Asserts that msg (from a failed call about path) starts with path and contains what. */
void assert_error(const ck_error *err, const char *path, const char *what);
/* ck_open(path), asserted to succeed. */
ck_index *open_ok(const char *path);

/* --- indexes built by hand --------------------------------------------------------------- */

/* An index whose file 0 is a temporary file holding data. */
ck_index *index_over(const void *data, size_t len);
/* Appends a tensor whose bytes are nbytes at offset of file 0, in one extent. */
ck_entry *add_contig(ck_index *ix, const char *name, enum ck_dtype dt, unsigned rank,
                     const int64_t *shape, uint64_t offset, uint64_t nbytes);
/* An index without files holding one rank-0 U8 tensor per name (names[i] of strlen bytes). */
ck_index *index_of_names(const char *const *names, size_t n);

/* --- what a test needs of the machine ----------------------------------------------------- */

/* Whether CI runs the tests (CI=true or 1 in the environment, as .ci/run sets it): that machine
 * has what a test may find missing elsewhere (io_uring, O_DIRECT under /tmp, the corpus), so
 * there a missing one is a failure that a skip would hide. tests/integration's `need` reads
 * CI the same way. */
int on_ci(void);
/* The test cannot run here, for the reason formatted: skipped, or failed on CI (on_ci). */
#define CANNOT_RUN_HERE(...)                                                                     \
    do {                                                                                         \
        if (on_ci())                                                                             \
            cr_assert_fail(__VA_ARGS__);                                                         \
        cr_skip_test(__VA_ARGS__);                                                               \
    } while (0)

/* --- trees ------------------------------------------------------------------------------- */

/* ck_tree_build(ix, vdir, vfiles, nvirtual), asserted to succeed. */
ck_tree *tree_ok(const ck_index *ix, const char *vdir, const ck_tree_vfile *vfiles,
                 unsigned nvirtual);
/* The node at path ("a/b/c", "" for the root), or CK_NO_NODE. */
uint32_t tree_find(const ck_tree *t, const char *path);

#endif
