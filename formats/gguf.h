/* gguf.h — GGUF files (llama.cpp, ggml, ollama): one file, or a split set of them.
 *
 * Contract: a file is accepted only if it is GGUF version 2 or 3, little-endian (a byte-swapped
 * file is refused saying so), and passes every check ggml's own reader (ggml/src/gguf.cpp)
 * makes, plus ours: every read within the file; strings at most GGUF_MAX_STRING bytes and
 * arrays at most GGUF_MAX_ARRAY items, each fitting in what is left of the file; keys non-empty,
 * UTF-8, without NUL and unique; value types among the 13 (arrays of arrays refused, as ggml
 * does); booleans 0 or 1; general.alignment a UINT32 power of two up to 1 MiB (default 32);
 * tensor names UTF-8 without NUL, under 64 bytes (ggml's GGML_MAX_NAME), unique, and never in
 * the metadata directory (GGUF_META_DIR "."); n_dims at most 4; dims non-negative with an
 * element count that fits in int64; a known ggml type whose block size divides ne[0]; data at
 * the first multiple of the alignment after the tensor infos; each tensor at exactly the aligned
 * end of the one before (ggml's rule, which makes offsets aligned and overlaps impossible); and
 * every tensor's bytes inside the file. The first broken rule is reported in one line, naming
 * the key or tensor and the file byte.
 *
 * What enters the index: each tensor under its GGUF name, shape row-major (ne reversed), dtype
 * the plain type or ggml's block type (dtype.h), its bytes one extent of its file. Each key
 * becomes index metadata holding a JSON text {"type", "value"} (arrays add "item_type"), and a
 * value entry GGUF_META_DIR "." KEY whose text is the value and a newline (strings raw, numbers
 * and booleans as JSON spells them, arrays as a JSON array). A split set (split.count > 1) is
 * read from its first file, which names the others (PREFIX-0000K-of-0000N.gguf beside it).
 */
#ifndef CK_GGUF_H
#define CK_GGUF_H

#include "../index/index.h"

#define GGUF_MAX_STRING (64u << 20) /* ggml's GGUF_MAX_STRING_LENGTH */
#define GGUF_MAX_ARRAY (64u << 20)  /* ggml's GGUF_MAX_ARRAY_ELEMENTS */
#define GGUF_MAX_NAME 64            /* ggml's GGML_MAX_NAME: a name is shorter */
#define GGUF_META_DIR "__metadata__"

/* True when head (the first n bytes of a file) starts with the GGUF magic. */
int gguf_probe(const unsigned char *head, size_t n);

/* Parses file `file` of ix (already added) and appends its tensors and keys; when it is the
 * first of a split set, opens and parses the others too. */
int gguf_read_file(ck_index *ix, uint32_t file, ck_error *err);

#endif
