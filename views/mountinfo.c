/* mountinfo.c — what a mount tells a loader about itself (mountinfo.h). */
#include "mountinfo.h"
#include "../base/location.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h> /* major, minor */

int ck_sources_encode(const char *source, const ck_index *ix, const char *const *paths,
                      char **v, size_t *len)
{
    *v = NULL;
    *len = 0;
    FILE *f = open_memstream(v, len);
    if (!f)
        return -1;
    char shown[CK_SHOWN_MAX];
    int remote = ck_location_is_url(source);
    fprintf(f, "%s%c", remote ? ck_location_shown(source, shown, sizeof shown) : source, 0);
    for (uint32_t i = 0; !remote && i < ix->nfiles; i++) {
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

/* Whether v (len bytes, NUL-terminated) is a remote source's value: its URL as shown, and no
 * record after it. */
static int remote_value(const char *v, size_t len)
{
    char shown[CK_SHOWN_MAX];
    return strlen(v) + 1 == len && strcmp(ck_location_shown(v, shown, sizeof shown), v) == 0;
}

int ck_sources_parse(char *v, size_t len, const char **source, ck_source_file **files,
                     size_t *nfiles)
{
    *files = NULL;
    *nfiles = 0;
    if (len == 0 || v[len - 1] != 0)
        return -1;
    *source = v;
    if (ck_location_is_url(v))
        return remote_value(v, len) ? 0 : -1;
    if (v[0] != '/')
        return -1;
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += v[i] == 0;
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

/* path as mountinfo writes it: space, tab, newline and backslash as \ooo. */
static int escaped_path(const char *path, char *out, size_t cap)
{
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
        if (cap - n < 5)
            return -1;
        if (strchr(" \t\n\\", *p))
            n += (size_t)snprintf(out + n, cap - n, "\\%03o", *p);
        else
            out[n++] = (char)*p;
    }
    out[n] = '\0';
    return 0;
}

/* Undoes escaped_path in place. */
static void unescape(char *s)
{
    char *o = s;
    while (*s)
        if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
            s[3] >= '0' && s[3] <= '7') {
            *o++ = (char)((s[1] - '0') << 6 | (s[2] - '0') << 3 | (s[3] - '0'));
            s += 4;
        } else {
            *o++ = *s++;
        }
    *o = '\0';
}

/* One line of the table, into *at when it is a mount at the escaped path (or, escaped NULL, of
 * the device majmin, "MAJ:MIN"): 1, else 0. */
static int mount_line(char *line, const char *escaped, const char *majmin, ck_mount_at *at)
{
    /* ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER */
    char *save = NULL, *id = strtok_r(line, " ", &save), *dev = NULL;
    for (int i = 0; i < 3 && id; i++) {
        char *field = strtok_r(NULL, " ", &save);
        dev = i == 1 ? field : dev;
    }
    char *point = id ? strtok_r(NULL, " ", &save) : NULL;
    char *tail = point ? strstr(save, " - ") : NULL;
    if (!tail || strcmp(escaped ? point : dev, escaped ? escaped : majmin) != 0)
        return 0;
    *tail = '\0';
    at->id = strtol(id, NULL, 10);
    at->shared = strstr(save, " shared:") != NULL;
    at->fstype[0] = at->source[0] = '\0';
    (void)sscanf(tail + 3, "%63s %4095s", at->fstype, at->source);
    unescape(at->source);
    return 1;
}

/* The last line of the table that mount_line finds for path (escaped) or majmin into *at: 1
 * found, 0 not, -1 the table unreadable. */
static int mount_scan(const char *table, const char *escaped, const char *majmin,
                      ck_mount_at *at)
{
    FILE *f = fopen(table, "re");
    if (!f)
        return -1;
    char *line = NULL;
    size_t cap = 0;
    int found = 0;
    while (getline(&line, &cap, f) > 0)
        found |= mount_line(line, escaped, majmin, at);
    free(line);
    fclose(f);
    return found;
}

int ck_mount_top(const char *table, const char *path, ck_mount_at *at)
{
    char escaped[4 * PATH_MAX + 1];
    if (escaped_path(path, escaped, sizeof escaped) != 0)
        return -1;
    return mount_scan(table, escaped, NULL, at);
}

int ck_mount_of_dev(const char *table, dev_t dev, ck_mount_at *at)
{
    char majmin[48];
    snprintf(majmin, sizeof majmin, "%u:%u", major(dev), minor(dev));
    return mount_scan(table, NULL, majmin, at);
}

int ck_mount_listed(const char *table, long id)
{
    FILE *f = fopen(table, "re");
    if (!f)
        return -1;
    char *line = NULL;
    size_t cap = 0;
    int found = 0;
    while (!found && getline(&line, &cap, f) > 0)
        found = strtol(line, NULL, 10) == id;
    free(line);
    fclose(f);
    return found;
}
