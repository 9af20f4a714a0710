/* replay.c — a main for one harness without libFuzzer: runs LLVMFuzzerTestOneInput on each file
 * named, and on each regular file in each directory named (not recursively). A missing
 * directory holds no inputs. `make test` runs it over tests/regress/TARGET, built with gcc and,
 * under SANITIZE, the sanitizers, so every input that once crashed a parser stays a test. */
#include "fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    unsigned char *data = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? 2 * cap : 65536;
            unsigned char *p = realloc(data, cap);
            if (!p) {
                fprintf(stderr, "replay: %s: out of memory\n", path);
                free(data);
                fclose(f);
                return -1;
            }
            data = p;
        }
        size_t n = fread(data + len, 1, cap - len, f);
        len += n;
        if (n == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        fprintf(stderr, "replay: %s: read error\n", path);
        free(data);
        return -1;
    }
    LLVMFuzzerTestOneInput(data, len);
    free(data);
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Runs every regular file in dir, in name order so a failure is reproducible. */
static int run_dir(const char *dir, unsigned *count)
{
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? 0 : (fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno)), -1);
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (struct dirent *de; rc == 0 && (de = readdir(d));) {
        if (de->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **p = realloc(names, cap * sizeof *p);
            if (!p) {
                rc = -1;
                break;
            }
            names = p;
        }
        size_t l = strlen(dir) + strlen(de->d_name) + 2;
        if (!(names[n] = malloc(l)))
            rc = -1;
        else
            snprintf(names[n++], l, "%s/%s", dir, de->d_name);
    }
    closedir(d);
    if (n)
        qsort(names, n, sizeof *names, by_name);
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (rc == 0 && stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) {
            rc = run_file(names[i]);
            ++*count;
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    unsigned count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        int rc = stat(argv[i], &st) == 0 && S_ISREG(st.st_mode)
                     ? (count++, run_file(argv[i]))
                     : run_dir(argv[i], &count);
        if (rc)
            return 1;
    }
    printf("replay: %u inputs, no failure\n", count);
    return 0;
}
