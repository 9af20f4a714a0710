#include "json.h"

#include <stdio.h>

#define MAX_EXACT_DOUBLE 9007199254740992.0 /* 2^53: above it a double no longer counts by one */

cJSON *ck_json_uint(uint64_t v)
{
    char s[24];
    snprintf(s, sizeof s, "%llu", (unsigned long long)v);
    return cJSON_CreateRaw(s);
}

int ck_json_count(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v))
        return -1;
    double d = v->valuedouble;
    if (!(d >= 0 && d < MAX_EXACT_DOUBLE) || d != (double)(uint64_t)d) /* NaN fails the first */
        return -1;
    *out = (uint64_t)d;
    return 0;
}
