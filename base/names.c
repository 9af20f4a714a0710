/* names.c — the order and the selection of tensor names (names.h). */
#include "names.h"

#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

int ck_natural_cmp(const char *a, size_t alen, const char *b, size_t blen)
{
    size_t i = 0, j = 0;
    while (i < alen && j < blen) {
        if (is_digit(a[i]) && is_digit(b[j])) {
            size_t i0 = i, j0 = j;
            while (i0 < alen && a[i0] == '0')
                i0++;
            while (j0 < blen && b[j0] == '0')
                j0++;
            size_t ie = i0, je = j0;
            while (ie < alen && is_digit(a[ie]))
                ie++;
            while (je < blen && is_digit(b[je]))
                je++;
            if (ie - i0 != je - j0) /* more significant digits: the larger number */
                return ie - i0 < je - j0 ? -1 : 1;
            int c = memcmp(a + i0, b + j0, ie - i0);
            if (c)
                return c;
            if (ie - i != je - j) /* equal values: fewer leading zeros first */
                return ie - i < je - j ? -1 : 1;
            i = ie, j = je;
            continue;
        }
        if (a[i] != b[j])
            return (unsigned char)a[i] < (unsigned char)b[j] ? -1 : 1;
        i++, j++;
    }
    return (alen - i > 0) - (blen - j > 0);
}

int ck_name_selected(const char *name, size_t len, const char *only)
{
    if (!only)
        return 1;
    size_t n = strlen(only);
    /* "model" and "model." both select model.* (and "model." nothing else) */
    if (len >= n && memcmp(name, only, n) == 0 &&
        (len == n || name[n] == '.' || (n && only[n - 1] == '.')))
        return 1;
    return fnmatch(only, name, 0) == 0;
}

size_t ck_name_distance(const char *a, size_t alen, const char *b, size_t blen, size_t max)
{
    if (alen > CK_DISTANCE_MAX_LEN || blen > CK_DISTANCE_MAX_LEN ||
        (alen > blen ? alen - blen : blen - alen) > max)
        return max + 1;
    size_t row[CK_DISTANCE_MAX_LEN + 1];
    for (size_t j = 0; j <= blen; j++)
        row[j] = j;
    for (size_t i = 1; i <= alen; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= blen; j++) {
            size_t up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[blen] <= max ? row[blen] : max + 1;
}

static int by_key_then_index(const void *a, const void *b, void *keys)
{
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    int c = strcmp(((const char *const *)keys)[i], ((const char *const *)keys)[j]);
    return c ? c : (i > j) - (i < j);
}

size_t *ck_names_grouped(const char *const *keys, size_t n)
{
    size_t *order = malloc((n ? n : 1) * sizeof *order);
    if (!order)
        return NULL;
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    qsort_r(order, n, sizeof *order, by_key_then_index, (void *)keys);
    return order;
}

unsigned char *ck_names_repeated(const char *const *keys, size_t n)
{
    size_t *order = ck_names_grouped(keys, n);
    unsigned char *later = order ? calloc(n ? n : 1, 1) : NULL;
    for (size_t i = 1; later && i < n; i++)
        later[order[i]] = strcmp(keys[order[i - 1]], keys[order[i]]) == 0;
    free(order);
    return later;
}
