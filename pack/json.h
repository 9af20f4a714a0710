/* json.h — integers in JSON, which cJSON holds as doubles: a double counts by one only below
 * 2^53, and cJSON prints a large one in exponent form (1.15292150460684698e+18).
 * Contract: ck_json_uint makes a number node from v's exact decimal text, never through a
 * double (NULL on out-of-memory; cJSON's adders then add nothing). ck_json_count reads a node
 * as a count only when a double holds it exactly, a whole number with 0 <= n < 2^53: 0, or -1
 * for anything else. A double cannot tell 2 from 2.0: a reader that must refuse the spelling
 * 2.0 checks the text.
 */
#ifndef CK_JSON_H
#define CK_JSON_H

#include <cjson/cJSON.h>
#include <stdint.h>

cJSON *ck_json_uint(uint64_t v);
int ck_json_count(const cJSON *v, uint64_t *out);

#endif
