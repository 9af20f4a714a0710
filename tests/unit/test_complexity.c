/* The pickle VM, the zip directory and the torch reader cost time linear in their input: each
 * test reads one input shape at two sizes, the second 10 times the first, and asserts that it
 * costs at most MAX_RATIO times as much CPU (the median of 3 runs each, measured here, one after
 * the other, in this process's CPU time), never a wall-clock threshold. A cost per item that
 * grows with the count (a linear search per key, member or memo index; names rebuilt per leaf)
 * makes the ratio about 100; linear code makes it about 10, plus noise. The inputs come from
 * Python: pickle, zipfile and torch.save. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../../index/index.h"
#include "../../checkpoint/open.h"
#include "../../index/pickle.h"
#include "../../sources/s3.h"
#include "../../index/zip.h"
#include "helpers.h"

TestSuite(complexity, .fini = tmp_cleanup, .timeout = 300);

#define MAX_RATIO 25.0

/* A file of the shape `make` (Python, given the path, the size n and the path of
 * pickle_cases.py) writes, for size n. */
static const char *input(const char *make, unsigned n)
{
    const char *here = __FILE__, *slash = strrchr(here, '/');
    const char *cases = strf("%.*s/pickle_cases.py", slash ? (int)(slash - here) : 1,
                             slash ? here : ".");
    const char *path = tmp_path_in(tmp_dir(), strf("in%u", n));
    run_python(make, path, strf("%u", n), cases, NULL);
    return path;
}

typedef void (*reader)(const char *path, unsigned n);

static double cpu_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median CPU time of 3 reads of path. */
static double median_cost(reader read, const char *path, unsigned n)
{
    double t[3];
    for (int i = 0; i < 3; i++) {
        double start = cpu_seconds();
        read(path, n);
        t[i] = cpu_seconds() - start;
    }
    qsort(t, 3, sizeof *t, by_value);
    return t[1];
}

/* Asserts that reading the shape at 10n costs at most MAX_RATIO times reading it at n. */
static void assert_linear(const char *make, reader read, unsigned n)
{
    const char *small = input(make, n), *big = input(make, 10 * n);
    read(small, n); /* warm: the first read pays for page faults and the file cache */
    double a = median_cost(read, small, n), b = median_cost(read, big, 10 * n);
    cr_log_info("%u -> %u: %.5f s -> %.5f s, ratio %.1f", n, 10 * n, a, b, b / a);
    cr_assert_leq(b, MAX_RATIO * a, "10x the input (%u -> %u) cost %.1fx the CPU time (%.5f s "
                  "-> %.5f s), more than %.0fx", n, 10 * n, b / a, a, b, MAX_RATIO);
}

/* --- the pickle VM --------------------------------------------------------------------- */

static void load_pickle(const char *path, unsigned n)
{
    (void)n;
    size_t len;
    unsigned char *data = read_whole(path, &len);
    pk_result r;
    ck_error err = {""};
    cr_assert_eq(pk_load(data, len, NULL, path, 0, &r, &err), 0, "%s", err.msg);
    pk_free(&r);
    free(data);
}

/* n str keys, n int keys, then n floats equal to the ints and n Trues and Falses set again:
 * every SETITEM looks its key up among all before it. */
Test(complexity, dict_keys)
{
    assert_linear("import pickle, runpy, sys\n"
                  "pc = runpy.run_path(sys.argv[3])\n"
                  "n = int(sys.argv[2])\n"
                  "pairs = [('key%d' % i, i) for i in range(n)] + [(i, i) for i in range(n)]\n"
                  "pairs += [(float(i), -i) for i in range(n)] + [(i % 2 == 0, i) for i in range(n)]\n"
                  "with open(sys.argv[1], 'wb') as f:\n"
                  "    pc['DupPickler'](f, protocol=4).dump(pc['Pairs'](pairs))\n",
                  load_pickle, 10000);
}

/* n memo indices, each read back once: a list of n strs, then a list of the same strs. */
Test(complexity, memo)
{
    assert_linear("import pickle, sys\n"
                  "s = ['s%d' % i for i in range(int(sys.argv[2]))]\n"
                  "open(sys.argv[1], 'wb').write(pickle.dumps([s, list(s)], protocol=2))\n",
                  load_pickle, 10000);
}

/* --- the zip directory ----------------------------------------------------------------- */

/* Reads the directory and finds every member by name. */
static void find_members(const char *path, unsigned n)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    cr_assert(fd >= 0 && fstat(fd, &st) == 0);
    zip_archive z;
    ck_error err = {""};
    cr_assert_eq(zip_read_directory(&(ck_file){.path = path, .fd = fd}, (uint64_t)st.st_size,
                                    path, &z, &err), 0, "%s", err.msg);
    close(fd);
    cr_assert_eq(z.nentries, n);
    char name[32];
    for (unsigned i = 0; i < n; i++) {
        int len = snprintf(name, sizeof name, "a/m%u", i);
        cr_assert_not_null(zip_find(&z, name, (size_t)len));
    }
    zip_free(&z);
}

Test(complexity, zip_members)
{
    assert_linear("import sys, zipfile\n"
                  "with zipfile.ZipFile(sys.argv[1], 'w') as z:\n"
                  "    for i in range(int(sys.argv[2])):\n"
                  "        z.writestr('a/m%d' % i, b'x')\n",
                  find_members, 10000);
}

/* --- the torch reader ------------------------------------------------------------------ */

static void open_checkpoint(const char *path, unsigned n)
{
    (void)n;
    ck_index *ix = NULL;
    ck_error err = {""};
    cr_assert_eq(ck_open(path, &ix, &err), 0, "%s", err.msg);
    ck_index_free(ix);
}

/* n tensors in a state dict: n zip records found by name, n storages, n names. */
Test(complexity, torch_tensors)
{
    assert_linear("import collections, sys, torch\n"
                  "n = int(sys.argv[2])\n"
                  "torch.save(collections.OrderedDict(('layers.%d.weight' % i, torch.ones(2))\n"
                  "                                   for i in range(n)), sys.argv[1])\n",
                  open_checkpoint, 3000);
}

/* One dict of n keys listed at n places: n^2 entries, which the entries' budget cuts short. */
static void open_or_refuse(const char *path, unsigned n)
{
    ck_index *ix = NULL;
    ck_error err = {""};
    int rc = ck_open(path, &ix, &err);
    if (n > 1000) /* 9M entries, over 64 bytes per byte of the 200 KB pickle + 64 MiB */
        cr_assert(rc != 0 && strstr(err.msg, "plus 64 MiB"), "%d: %s", rc, err.msg);
    else
        cr_assert_eq(rc, 0, "%s", err.msg);
    ck_index_free(ix);
}

Test(complexity, torch_shared_containers)
{
    assert_linear("import sys, torch\n"
                  "n = int(sys.argv[2])\n"
                  "d = {'k' * 50 + str(i): i for i in range(n)}\n"
                  "torch.save([d] * n, sys.argv[1])\n",
                  open_or_refuse, 300);
}

/* --- an s3:// listing ------------------------------------------------------------------- */

static void parse_listing(const char *path, unsigned n)
{
    size_t len;
    char *page = (char *)read_whole(path, &len);
    ck_listing l = {0};
    char *token = NULL;
    ck_error err = {""};
    cr_assert_eq(s3_parse_listing(page, len, "p/", &l, &token, "s3://b/p/", &err), 0, "%s",
                 err.msg);
    cr_assert_eq(l.n, n);
    ck_listing_free(&l);
    free(token);
    free(page);
}

/* A ListObjectsV2 page in AWS's shape (keys escaped by Python's XML writer, one character
 * reference each): a decoder that scans the rest of the page per reference or per key
 * (sscanf's strlen, a search for <Key> past its <Contents>) is quadratic. */
Test(complexity, ck_listing_page)
{
    assert_linear("import sys\n"
                  "from xml.sax.saxutils import escape\n"
                  "n = int(sys.argv[2])\n"
                  "keys = ''.join('<Contents><Key>%s</Key><Size>%d</Size></Contents>'\n"
                  "               % (escape('p/a&b\\x7f%d.bin' % i, {'\\x7f': '&#127;'}), i)\n"
                  "               for i in range(n))\n"
                  "open(sys.argv[1], 'w').write('<ListBucketResult><IsTruncated>false'\n"
                  "                             '</IsTruncated>' + keys + '</ListBucketResult>')\n",
                  parse_listing, 2000);
}
