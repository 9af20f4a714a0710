/* json.h — what ckptfs writes as JSON beside cJSON: strings, and integers exactly.
 * Contract: ck_json_string is the one JSON string writer (index.json, GGUF metadata): '"' and
 * '\\' escaped, the control bytes as \u00XX (or by name where they have one), everything else as
 * it is; unless the caller vouches the text is UTF-8, a byte that breaks UTF-8 becomes \ufffd
 * (JSON text cannot hold it). Integers: cJSON holds numbers as doubles, which
 * count by one only below 2^53 and print large in exponent form (1.15292150460684698e+18).
 * ck_json_uint makes a number node from v's exact decimal text, never through a
 * double (NULL on out-of-memory; cJSON's adders then add nothing). ck_json_count reads a node
 * as a count only when a double holds it exactly, a whole number with 0 <= n < 2^53: 0, or -1
 * for anything else. A double cannot tell 2 from 2.0: a reader that must refuse the spelling
 * 2.0 checks the text.
 * Reading: ck_json_parse is how a reader parses JSON it does not trust (a safetensors header, a
 * .pt2's configs): every number must be spelled as an integer, no string may hold \u0000 (cJSON
 * would cut it there), no raw control byte may appear (cJSON takes them as white space, or keeps
 * them in a string), and nothing but white space may follow the value.
 */
#ifndef CK_JSON_H
#define CK_JSON_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

/* Where ck_json_string writes: n bytes at s, to ctx. */
typedef void (*ck_json_put)(void *ctx, const char *s, size_t n);

/* How ck_json_string writes: CK_JSON_UTF8, s is known to be UTF-8 (nothing is replaced);
 * CK_JSON_NAMED, \b \f \n \r \t by name as cJSON prints them (else every control byte as
 * \u00XX, as the GGUF metadata's JSON has always been spelled). */
enum { CK_JSON_UTF8 = 1, CK_JSON_NAMED = 2 };

/* s (n bytes) as a JSON string, quotes included, through put. */
void ck_json_string(ck_json_put put, void *ctx, const char *s, size_t n, int how);

cJSON *ck_json_uint(uint64_t v);

/* The JSON text s (n bytes, not NUL-terminated), checked as above and parsed; what names the text
 * in messages ("header"), path the file. NULL with err set ("what is wrong (what byte N)"). The
 * caller frees the tree with cJSON_Delete. */
cJSON *ck_json_parse(const char *s, size_t n, const char *what, const char *path, ck_error *err);
int ck_json_count(const cJSON *v, uint64_t *out);

/* Walking a JSON text without a tree, for text ckptfs wrote itself (a GGUF key's typed JSON:
 * hundreds of megabytes for the longest arrays, and a cJSON tree of it many times as much). Nothing
 * is checked, and nothing past n is read: a text that is not JSON gives spans that mean nothing,
 * never a fault. ck_json_end: where the value that starts at s[i] ends (n when the text runs out
 * first). ck_json_space: the first byte from i on that is not white space. */
size_t ck_json_end(const char *s, size_t n, size_t i);
size_t ck_json_space(const char *s, size_t n, size_t i);

/* The value of member key (a plain name, no escapes) of the object at s[i], as [*from, *to):
 * 0, or -1 when s[i] is no object or has no such member. */
int ck_json_member(const char *s, size_t n, size_t i, const char *key, size_t *from, size_t *to);

/* A JSON object's members in order, with their keys (or, with values, their string values:
 * NULL for a value of another type) as texts to group (ck_names_grouped). */
typedef struct ck_json_members {
    const cJSON **node;
    const char **text;
    size_t n;
} ck_json_members;

/* obj's members into *m (ck_json_members_free releases them): 0, or -1 without memory. */
int ck_json_members_of(const cJSON *obj, int values, ck_json_members *m);
void ck_json_members_free(ck_json_members *m);

/* For each member of m, the member whose value its text takes, as json.loads reads a repeated
 * key: the text's last occurrence for its first one (where the key stands), SIZE_MAX for the
 * others. malloc'ed; NULL without memory. O(n log n). */
size_t *ck_json_winners(const ck_json_members *m);

#endif
