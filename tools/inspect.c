/* inspect.c — reading and decoding tensors for ckpt diff, info and stats (inspect.h). */
#include "inspect.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../views/view.h"
#include "../base/bytes.h"
#include "../base/json.h"
#include "../base/names.h"

/* Reads len bytes of e at off, all of them: a short read is trouble, said in err (stats'
 * threads each keep their own, so that one line is printed whoever failed). */
int inspect_read_chunk(const ck_index *ix, const ck_entry *e, void *buf, size_t len,
                       uint64_t off, ck_error *err)
{
    ssize_t n = ck_entry_read(ix, e, buf, len, off);
    if (n == (ssize_t)len)
        return 0;
    return ck_fail(err, ix->files[e->ext.file].path, "%s (reading tensor %.*s)",
                   n < 0 ? strerror((int)-n) : "ends early", (int)e->name_len, e->name);
}

/* The element size (ck_dtype_nbytes of one element) of a dtype decode_one reads, else 0. */
unsigned inspect_decoded_size(enum ck_dtype dt)
{
    uint64_t bytes;
    switch (dt) {
    case CK_BOOL: case CK_U8: case CK_I8: case CK_F8_E4M3: case CK_F8_E5M2:
    case CK_I16: case CK_U16: case CK_F16: case CK_BF16:
    case CK_I32: case CK_U32: case CK_F32: case CK_I64: case CK_U64: case CK_F64:
        return ck_dtype_nbytes(dt, 1, &bytes) == 0 ? (unsigned)bytes : 0;
    default:
        return 0;
    }
}

int inspect_is_float(enum ck_dtype dt)
{
    return dt == CK_F64 || dt == CK_F32 || dt == CK_F16 || dt == CK_BF16 || dt == CK_F8_E4M3 ||
           dt == CK_F8_E5M2;
}

/* An IEEE-style small float: sign, ebits exponent bits, mbits mantissa bits. With ieee, the
 * top exponent is Inf/NaN (F16, E5M2); without it only all-ones is NaN and there is no Inf
 * (E4M3, the "fn" variant torch and safetensors use). */
static double minifloat(unsigned v, unsigned ebits, unsigned mbits, int ieee)
{
    unsigned emax = (1u << ebits) - 1, mmask = (1u << mbits) - 1;
    unsigned e = (v >> mbits) & emax, m = v & mmask;
    int bias = (int)(emax >> 1);
    double x;
    if (e == emax && (ieee || m == mmask))
        x = ieee && m == 0 ? INFINITY : NAN;
    else if (e == 0)
        x = ldexp(m, 1 - bias - (int)mbits);
    else
        x = ldexp(m | (1u << mbits), (int)e - bias - (int)mbits);
    return v >> (ebits + mbits) ? -x : x;
}

static double decode_one(enum ck_dtype dt, const unsigned char *p)
{
    union { uint32_t u; float f; } f32;
    union { uint64_t u; double d; } f64;
    switch (dt) {
    case CK_BOOL: return p[0] != 0;
    case CK_U8: return p[0];
    case CK_I8: return (int8_t)p[0];
    case CK_F8_E4M3: return minifloat(p[0], 4, 3, 0);
    case CK_F8_E5M2: return minifloat(p[0], 5, 2, 1);
    case CK_I16: return (int16_t)get_le16(p);
    case CK_U16: return get_le16(p);
    case CK_F16: return minifloat(get_le16(p), 5, 10, 1);
    case CK_BF16: f32.u = (uint32_t)get_le16(p) << 16; return f32.f;
    case CK_I32: return (int32_t)get_le32(p);
    case CK_U32: return get_le32(p);
    case CK_F32: f32.u = get_le32(p); return f32.f;
    case CK_I64: return (double)(int64_t)get_le64(p);
    case CK_U64: return (double)get_le64(p);
    case CK_F64: f64.u = get_le64(p); return f64.d;
    default: return NAN; /* not reached: callers ask decoded_size first */
    }
}

void inspect_decode_batch(enum ck_dtype dt, const unsigned char *p, size_t n, double *out)
{
    unsigned w = inspect_decoded_size(dt);
    for (size_t i = 0; i < n; i++)
        out[i] = decode_one(dt, p + i * w);
}

uint64_t inspect_element_count(const ck_entry *e)
{
    uint64_t n = 1;
    for (unsigned i = 0; i < e->rank; i++)
        n *= (uint64_t)e->shape[i]; /* ck_open checked the product fits (ck_tensor_nbytes) */
    return n;
}

cJSON *inspect_shape_json(const ck_entry *e)
{
    char buf[1400];
    ck_view_shape_json(e, buf, sizeof buf);
    return cJSON_Parse(buf);
}

/* A double as JSON, exactly: %.17g round-trips, where cJSON's own printing may keep only 15
 * digits. JSON has no NaN or Inf: such a figure is the string "nan", "inf" or "-inf". */
cJSON *inspect_number_json(double v)
{
    char buf[32];
    if (!isfinite(v))
        return cJSON_CreateString(isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
    snprintf(buf, sizeof buf, "%.17g", v);
    return cJSON_CreateRaw(buf);
}

int inspect_print_json_doc(cJSON *doc)
{
    char *s = doc ? cJSON_PrintUnformatted(doc) : NULL;
    cJSON_Delete(doc);
    if (!s) {
        fprintf(stderr, "ckpt: out of memory\n");
        return -1;
    }
    puts(s);
    free(s);
    return 0;
}

/* Whether name is selected by any of the n patterns (none: every name). */
int inspect_selected(const ck_entry *e, const char *const *pats, int n)
{
    if (n == 0)
        return 1;
    for (int i = 0; i < n; i++)
        if (ck_name_selected(e->name, e->name_len, pats[i]))
            return 1;
    return 0;
}

cJSON *inspect_name_json(const ck_entry *e)
{
    return cJSON_CreateString(e->name); /* names are UTF-8 without NUL (index.h) */
}
