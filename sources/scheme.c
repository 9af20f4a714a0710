/* scheme.c — what a location names, released (scheme.h). */
#include "scheme.h"

#include <stdlib.h>

void ck_located_free(ck_located *t)
{
    for (size_t i = 0; i < t->n; i++)
        free(t->names[i]);
    free(t->names);
    free(t->url);
    *t = (ck_located){0};
}
