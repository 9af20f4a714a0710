/* fuzz.h — what every libFuzzer harness in fuzz/ shares.
 *
 * Each harness (one per parser) defines LLVMFuzzerTestOneInput. It is linked either with
 * libFuzzer (clang -fsanitize=fuzzer, `make fuzz`) or with replay.c, a plain main that feeds it
 * files, so `make test` can replay every input that once crashed (tests/regress/TARGET/) with
 * gcc and no fuzzer runtime.
 *
 * The parsers read from file descriptors, so the input is served from a memfd: a regular file
 * with no disk behind it. A broken invariant (a failure with no message, a message with a
 * newline, an index that points outside its file) aborts, so the fuzzer reports it as a crash.
 */
#ifndef CK_FUZZ_H
#define CK_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#include "../index/index.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A memfd holding the input, positioned at 0. Aborts if the kernel refuses one: that is the
 * harness's problem, not the parser's. */
int fuzz_memfd(const uint8_t *data, size_t size);

/* A fresh index whose file 0 is a memfd holding the input. */
ck_index *fuzz_index(const uint8_t *data, size_t size);

/* Runs read (a reader of a zip whose directory the opener read: pt_read_zip, pt2_read_zip) on
 * the input as file 0, after the directory, and checks the result (fuzz_check). */
struct zip_archive;
typedef int (*fuzz_zip_reader)(ck_index *ix, uint32_t file, const struct zip_archive *z,
                               ck_error *err);
void fuzz_zip_reader_run(const uint8_t *data, size_t size, fuzz_zip_reader read);

/* Splits the input into the files of a directory, one per process (under $TMPDIR, else
 * /dev/shm or /tmp), and returns its path. The pieces lie between each FUZZ_SEP ("\0FZ\0",
 * 4 bytes no seed holds by chance), at most 16; each is "NAME\nCONTENTS", and one whose name
 * is not made of [A-Za-z0-9._-], starts with '.', or is longer than 64 bytes is dropped. When
 * first_name is not NULL, the first piece is all contents, written as first_name (which may
 * start with '.'). gen_seeds.py writes seeds in this form. fuzz_dir_clear removes the files,
 * after each input. */
const char *fuzz_dir_files(const uint8_t *data, size_t size, const char *first_name);
void fuzz_dir_clear(void);

/* For a pack in data (size bytes, writable): sets the header's index_xxh3 to the XXH3 of the
 * index, when the header's index_length fits. Almost every mutation of the index breaks that
 * checksum, so without this the fuzzer would never get past it; comparing a checksum needs no
 * fuzzing, and the unit tests cover a wrong one. */
void fuzz_fix_pack_xxh3(uint8_t *data, size_t size);

/* Checks a parser's result: rc 0 leaves a sane error-free index; rc != 0 leaves a one-line
 * message in err. ix may be NULL for parsers that build none. Reads the start and the end of every entry: a validated index over an
 * unchanged file never fails a read. Frees nothing. */
void fuzz_check(int rc, const ck_index *ix, const ck_error *err);

/* Aborts with a message when cond is false (assert() would vanish under -DNDEBUG). */
#define FUZZ_REQUIRE(cond) ((cond) ? (void)0 : fuzz_fail(#cond, __FILE__, __LINE__))
void fuzz_fail(const char *what, const char *file, int line) __attribute__((noreturn));

#endif
