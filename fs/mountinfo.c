/* mountinfo.c — what a mount tells a loader about itself (mountinfo.h). */
#include "mountinfo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ck_sources_encode(const char *source, const ck_index *ix, const char *const *paths,
                      char **v, size_t *len)
{
    *v = NULL;
    *len = 0;
    FILE *f = open_memstream(v, len);
    if (!f)
        return -1;
    fprintf(f, "%s%c", source, 0);
    for (uint32_t i = 0; i < ix->nfiles; i++) {
        const ck_file *cf = &ix->files[i];
        fprintf(f, "%llu %llu %llu %lld.%09ld %s%c", (unsigned long long)cf->dev,
                (unsigned long long)cf->ino, (unsigned long long)cf->size,
                (long long)cf->mtime.tv_sec, cf->mtime.tv_nsec, paths[i], 0);
    }
    int bad = ferror(f);
    bad |= fclose(f) != 0;
    if (bad) {
        free(*v);
        *v = NULL;
    }
    return bad ? -1 : 0;
}

/* One "DEV INO SIZE SEC.NSEC PATH" record of user.ckptfs.sources. */
static int parse_source_file(char *s, ck_source_file *f)
{
    unsigned long long dev, ino, size;
    long long sec;
    long nsec;
    int at = -1;
    if (sscanf(s, "%llu %llu %llu %lld.%9ld %n", &dev, &ino, &size, &sec, &nsec, &at) != 5 ||
        at < 1 || s[at - 1] != ' ' || s[at] != '/' || nsec < 0)
        return -1;
    *f = (ck_source_file){.path = s + at, .dev = dev, .ino = ino, .size = size,
                          .mtime = {.tv_sec = (time_t)sec, .tv_nsec = nsec}};
    return 0;
}

int ck_sources_parse(char *v, size_t len, const char **source, ck_source_file **files,
                     size_t *nfiles)
{
    *files = NULL;
    *nfiles = 0;
    if (len == 0 || v[len - 1] != 0 || v[0] != '/')
        return -1;
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += v[i] == 0;
    *source = v;
    if (!(*files = calloc(n, sizeof **files)))
        return -1;
    for (char *s = v + strlen(v) + 1; s < v + len; s += strlen(s) + 1)
        if (parse_source_file(s, &(*files)[(*nfiles)++]) != 0) {
            free(*files);
            *files = NULL;
            *nfiles = 0;
            return -1;
        }
    return 0;
}
