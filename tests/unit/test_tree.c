/* The directory tree: the escape rules of views/tree.h, lookups, paths, the virtual directory. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "helpers.h"

TestSuite(escape, .fini = tmp_cleanup);
TestSuite(tree, .fini = tmp_cleanup);

/* --- ck_escape_component ---------------------------------------------------------------- */

static const char *escaped(const char *s, size_t len)
{
    char out[CK_NAME_MAX + 1];
    memset(out, 'Z', sizeof out);
    size_t n = ck_escape_component(s, len, out);
    cr_assert_leq(n, CK_NAME_MAX);
    cr_assert_eq(out[n], 0, "not NUL-terminated");
    cr_assert_eq(strlen(out), n);
    return strf("%s", out);
}

/* "%~" and the 16 lowercase hex digits of the XXH3-64 of s. */
static const char *hash_tail(const char *s, size_t len)
{
    return strf("%%~%016llx", (unsigned long long)XXH3_64bits(s, len));
}

/* c repeated n times. */
static const char *rep(const char *c, size_t n)
{
    size_t l = strlen(c);
    char *s = malloc(n * l + 1);
    cr_assert_not_null(s);
    for (size_t i = 0; i < n; i++)
        memcpy(s + i * l, c, l);
    s[n * l] = 0;
    const char *r = strf("%s", s);
    free(s);
    return r;
}

Test(escape, empty_is_percent)
{
    cr_assert_str_eq(escaped("", 0), "%");
}

Test(escape, plain_and_utf8_unchanged)
{
    cr_assert_str_eq(escaped("weight", 6), "weight");
    cr_assert_str_eq(escaped("\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80", 9), "\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80");
    cr_assert_str_eq(escaped("a b_c-~!", 8), "a b_c-~!");
}

Test(escape, every_byte)
{
    for (unsigned b = 1; b < 256; b++) {
        if (b == '.')
            continue;
        char s[2] = {(char)b, 0};
        const char *want = (b == '%' || b == '/' || b < 0x20 || b == 0x7f) ? strf("%%%02X", b) : s;
        cr_assert_str_eq(escaped(s, 1), want, "byte 0x%02x", b);
    }
}

Test(escape, every_byte_at_every_place_of_a_long_component)
{
    /* Components are scanned eight bytes at a time: one byte that needs an escape must be found
     * wherever it falls in a word, and bytes that look like one to a careless word test (0x80
     * and up, ' ', '.') must not be escaped. */
    static const unsigned char bytes[] = {'%', '/', 0x01, 0x1f, 0x7f, 0x20, 0x80, 0xa5, 0xff,
                                          '0', 0x26, 0x2e, 0x30, 0x7e};
    for (size_t len = 1; len <= 40; len++)
        for (size_t at = 0; at < len; at++)
            for (size_t k = 0; k < sizeof bytes; k++) {
                unsigned b = bytes[k];
                char s[41];
                memset(s, 'x', len);
                s[at] = (char)b;
                int esc = b == '%' || b == '/' || b < 0x20 || b == 0x7f;
                const char *want = esc ? strf("%.*s%%%02X%.*s", (int)at, s, b,
                                              (int)(len - at - 1), s + at + 1)
                                       : strf("%.*s", (int)len, s);
                cr_assert_str_eq(escaped(s, len), want, "byte 0x%02x at %zu of %zu", b, at, len);
            }
}

Test(escape, uppercase_hex)
{
    cr_assert_str_eq(escaped("\x1f\x7f\x0a", 3), "%1F%7F%0A");
    cr_assert_str_eq(escaped("a/b%c", 5), "a%2Fb%25c");
}

Test(escape, up_to_255_bytes_kept_whole)
{
    const char *s = rep("a", 255);
    cr_assert_str_eq(escaped(s, 255), s);
    const char *p = rep("%", 85); /* 85 escapes of 3 bytes: 255 */
    cr_assert_str_eq(escaped(p, 85), rep("%25", 85));
}

Test(escape, over_255_bytes_cut_and_hashed)
{
    const char *s = rep("a", 256);
    const char *want = strf("%s%s", rep("a", 236), hash_tail(s, 256));
    cr_assert_str_eq(escaped(s, 256), want);
    cr_assert_eq(strlen(want), 236 + 2 + 16);
    const char *l = rep("x", 1000);
    cr_assert_str_eq(escaped(l, 1000), strf("%s%s", rep("x", 236), hash_tail(l, 1000)));
}

Test(escape, over_255_bytes_after_escaping)
{
    const char *p = rep("%", 86); /* 258 bytes escaped: keeps the whole escapes within 236 */
    cr_assert_str_eq(escaped(p, 86), strf("%s%s", rep("%25", 236 / 3), hash_tail(p, 86)));
    const char *q = strf("%s%%%s", rep("a", 235), rep("b", 30)); /* the escape would end at 238 */
    cr_assert_str_eq(escaped(q, strlen(q)), strf("%s%s", rep("a", 235), hash_tail(q, strlen(q))));
}

/* Bytes of the longest run of whole characters of s (a UTF-8 string) within max bytes. */
static size_t whole_chars_within(const char *s, size_t max)
{
    size_t n = 0;
    for (;;) {
        unsigned char c = (unsigned char)s[n];
        size_t k = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        if (!c || n + k > max)
            return n;
        n += k;
    }
}

Test(escape, cut_never_splits_utf8)
{
    static const char *const chars[] = {"\xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f\x98\x80"};
    static const char *const leads[] = {"", "a", "ab", "abc"};
    for (size_t c = 0; c < 3; c++)
        for (size_t l = 0; l < 4; l++) {
            const char *s = strf("%s%s", leads[l], rep(chars[c], 200));
            size_t keep = whole_chars_within(s, 236);
            const char *want = strf("%.*s%s", (int)keep, s, hash_tail(s, strlen(s)));
            const char *got = escaped(s, strlen(s));
            cr_assert_str_eq(got, want, "char %zu, lead %zu", c, l);
            cr_assert_neq((unsigned char)s[keep] & 0xC0, 0x80, "cut inside a character");
        }
}

/* --- ck_tree_build and friends ---------------------------------------------------------- */

static const ck_tree_vfile vfiles[] = {{"index.json", CK_NODE_MEMFILE},
                                        {"other", CK_NODE_SYNTH}};

/* Checks what holds for every tree: no component empty, over 255 bytes, "." or "..", starting
 * with '.' or holding '/', save the virtual directory's own name; each entry's node is its. */
static void check_invariants(const ck_index *ix, const ck_tree *t, const char *vdir)
{
    for (uint32_t i = 1; i < t->nnodes; i++) {
        const ck_node *nd = &t->nodes[i];
        cr_assert_eq(strlen(nd->name), nd->name_len);
        cr_assert_gt(nd->name_len, 0);
        cr_assert_leq(nd->name_len, CK_NAME_MAX, "component '%s' is %u bytes", nd->name,
                      nd->name_len);
        cr_assert_null(strchr(nd->name, '/'), "component '%s' holds '/'", nd->name);
        if (vdir && nd->parent == 0 && strcmp(nd->name, vdir) == 0)
            continue;
        cr_assert_neq(nd->name[0], '.', "component '%s' starts with '.'", nd->name);
    }
    for (size_t i = 0; i < ix->nentries; i++) {
        cr_assert_eq(t->nodes[t->entry_node[i]].id, i);
        cr_assert_eq(t->nodes[t->entry_node[i]].kind,
                     ix->entries[i].kind == CK_TENSOR ? CK_NODE_TENSOR : CK_NODE_VALUE);
    }
}

static ck_tree *build_with(const ck_index *ix, const char *vdir, unsigned nvirtual)
{
    ck_tree *t = tree_ok(ix, vdir, vfiles, nvirtual);
    check_invariants(ix, t, vdir);
    return t;
}

static const char *path_of(const ck_tree *t, uint32_t node)
{
    char buf[4096];
    size_t n = ck_tree_path(t, node, buf, sizeof buf);
    cr_assert_lt(n, sizeof buf);
    cr_assert_eq(strlen(buf), n);
    return strf("%s", buf);
}

/* The tree of names (n of them) maps names[i] to paths[i], in this order and reversed. */
static void expect_paths(const char *const *names, const char *const *paths, size_t n)
{
    for (int reversed = 0; reversed < 2; reversed++) {
        const char **order = malloc(n * sizeof *order);
        cr_assert_not_null(order);
        for (size_t i = 0; i < n; i++)
            order[i] = names[reversed ? n - 1 - i : i];
        ck_index *ix = index_of_names(order, n);
        ck_tree *t = build_with(ix, NULL, 0);
        for (size_t i = 0; i < n; i++) {
            size_t k = reversed ? n - 1 - i : i;
            cr_assert_str_eq(path_of(t, t->entry_node[i]), paths[k], "name '%s'%s", names[k],
                             reversed ? " (reversed)" : "");
            cr_assert_eq(tree_find(t, paths[k]), t->entry_node[i], "lookup of '%s'", paths[k]);
        }
        ck_tree_free(t);
        ck_index_free(ix);
        free(order);
    }
}

Test(tree, dots_make_directories)
{
    static const char *const names[] = {"a.b.c", "a.b.d", "a.e", "f"};
    static const char *const paths[] = {"a/b/c", "a/b/d", "a/e", "f"};
    expect_paths(names, paths, 4);
    ck_index *ix = index_of_names(names, 4);
    ck_tree *t = build_with(ix, NULL, 0);
    cr_assert_eq(t->nodes[tree_find(t, "a")].kind, CK_NODE_DIR);
    cr_assert_eq(t->nodes[tree_find(t, "a/b")].kind, CK_NODE_DIR);
    cr_assert_eq(t->nodes[tree_find(t, "a")].nchild, 2);
    cr_assert_eq(t->nodes[tree_find(t, "a/b")].nchild, 2);
    cr_assert_eq(t->nodes[0].nchild, 2);
    cr_assert_eq(t->nnodes, 1 + 2 + 4);
    ck_tree_free(t);
    ck_index_free(ix);
}

Test(tree, dots_counted_at_every_place)
{
    /* The tree is sized by counting dots eight bytes at a time: names of nothing but dots, and
     * dots at every offset of a long name, must all fit (the sanitizer build checks the
     * bound), and make the directories they name. */
    for (size_t len = 1; len <= 24; len++) {
        const char *names[2] = {rep(".", len), NULL};
        char *one = malloc(len + 2);
        cr_assert_not_null(one);
        memset(one, 'a', len + 1);
        one[len + 1] = 0;
        for (size_t at = 1; at < len; at++) {
            one[at] = '.';
            names[1] = strf("%s", one);
            ck_index *ix = index_of_names(names, 2);
            ck_tree *t = build_with(ix, NULL, 0);
            /* each '.' a '/', each empty piece "%" */
            char want[64];
            size_t n = 0;
            for (size_t i = 0; i <= len; i++) {
                int empty = one[i] == '.' || one[i] == 0;
                if (empty && (i == 0 || one[i - 1] == '.'))
                    want[n++] = '%';
                if (one[i])
                    want[n++] = one[i] == '.' ? '/' : one[i];
            }
            want[n] = 0;
            cr_assert_str_eq(path_of(t, t->entry_node[1]), want);
            cr_assert_str_eq(path_of(t, t->entry_node[0]), strf("%s%%", rep("%/", len)));
            ck_tree_free(t);
            ck_index_free(ix);
        }
        free(one);
    }
}

Test(tree, empty_pieces)
{
    static const char *const names[] = {"../x", ".a", "a.", "a..b", ".", "", "...", ".hidden"};
    static const char *const paths[] = {"%/%/%2Fx", "%/a", "a/%", "a/%/b", "%/%", "%", "%/%/%/%",
                                        "%/hidden"};
    for (size_t i = 0; i < 8; i++)
        expect_paths(&names[i], &paths[i], 1);
}

Test(tree, empty_piece_that_is_also_a_directory)
{
    static const char *const names[] = {"a.", "a..b", "", ".x"};
    static const char *const paths[] = {"a/%%", "a/%/b", "%%", "%/x"};
    expect_paths(names, paths, 4);
}

Test(tree, file_that_is_also_a_directory)
{
    static const char *const names[] = {"a", "a.b"};
    static const char *const paths[] = {"a%", "a/b"};
    expect_paths(names, paths, 2);
    static const char *const deeper[] = {"x.y", "x.y.z", "x", "x.y.z.w"};
    static const char *const deeper_paths[] = {"x/y%", "x/y/z%", "x%", "x/y/z/w"};
    expect_paths(deeper, deeper_paths, 4);
}

Test(tree, literal_percent_is_not_the_suffix)
{
    static const char *const names[] = {"a%", "a", "a.b", "%"};
    static const char *const paths[] = {"a%25", "a%", "a/b", "%25"};
    expect_paths(names, paths, 4);
}

Test(tree, escapes_in_paths)
{
    static const char *const names[] = {"a\x01.b%c\x7f.d/e", "\x1f", "sp ace.\xc3\xa9"};
    static const char *const paths[] = {"a%01/b%25c%7F/d%2Fe", "%1F", "sp ace/\xc3\xa9"};
    expect_paths(names, paths, 3);
}

Test(tree, long_components_in_paths)
{
    const char *piece = rep("a", 300);
    const char *cut = strf("%s%s", rep("a", 236), hash_tail(piece, 300));
    const char *names[] = {strf("x.%s.y", piece), strf("%s", piece)};
    const char *paths[] = {strf("x/%s/y", cut), cut};
    expect_paths(names, paths, 2);
}

Test(tree, long_file_that_is_also_a_directory)
{
    /* A 255-byte file component that meets a directory of its name has no room for the '%':
     * it takes the hashed form first. */
    const char *piece = rep("q", 255);
    const char *names[] = {piece, strf("%s.b", piece)};
    const char *paths[] = {strf("%s%s%%", rep("q", 236), hash_tail(piece, 255)),
                           strf("%s/b", piece)};
    expect_paths(names, paths, 2);
}

Test(tree, order_does_not_matter)
{
    static const char *const names[] = {"a", "a.b", "a.b.c", "a.c", "b", ".x", "x.", "a%", "b.a"};
    static const char *const paths[] = {"a%", "a/b%", "a/b/c", "a/c", "b%", "%/x", "x/%", "a%25",
                                        "b/a"};
    enum { N = 9 };
    for (size_t rot = 0; rot < N; rot++) {
        const char *n2[N], *p2[N];
        for (size_t i = 0; i < N; i++) {
            n2[i] = names[(i + rot) % N];
            p2[i] = paths[(i + rot) % N];
        }
        expect_paths(n2, p2, N);
    }
}

/* Bytewise order: memcmp, then the shorter first. */
static int bytewise(const ck_node *x, const ck_node *y)
{
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    for (size_t i = 0; i < n; i++)
        if (x->name[i] != y->name[i])
            return (unsigned char)x->name[i] < (unsigned char)y->name[i] ? -1 : 1;
    return (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

Test(tree, children_sorted_bytewise)
{
    static const char *const names[] = {
        "b", "a", "B", "\xc3\xa9", "z", "a%", "\x01", "_", "ab", "a.z", "a.A", "a.\xf0\x9f\x98\x80",
        "a.0", "~", "Z.q", "\x7f", " ", "aa", "a.zz", "a.z0",
    };
    ck_index *ix = index_of_names(names, sizeof names / sizeof *names);
    ck_tree *t = build_with(ix, ".ckptfs", 2);
    size_t checked = 0;
    for (uint32_t i = 0; i < t->nnodes; i++) {
        const ck_node *nd = &t->nodes[i];
        for (uint32_t k = 0; k < nd->nchild; k++) {
            const ck_node *c = &t->nodes[t->children[nd->child0 + k]];
            cr_assert_eq(c->parent, i);
            if (k > 0) {
                const ck_node *prev = &t->nodes[t->children[nd->child0 + k - 1]];
                cr_assert_lt(bytewise(prev, c), 0, "'%s' before '%s'", prev->name, c->name);
            }
            checked++;
        }
    }
    cr_assert_eq(checked, t->nnodes - 1, "every node but the root is someone's child");
    ck_tree_free(t);
    ck_index_free(ix);
}

Test(tree, lookup_finds_every_node)
{
    static const char *const names[] = {"m.l.k", "m.l", "m", "n.o", "\xc3\xa9.x", "p%q"};
    ck_index *ix = index_of_names(names, 6);
    ck_tree *t = build_with(ix, ".ckptfs", 2);
    for (uint32_t i = 1; i < t->nnodes; i++) {
        const ck_node *nd = &t->nodes[i];
        cr_assert_eq(ck_tree_lookup(t, nd->parent, nd->name, nd->name_len), i, "'%s'", nd->name);
    }
    ck_tree_free(t);
    ck_index_free(ix);
}

Test(tree, lookup_misses_absent_names)
{
    static const char *const names[] = {"ab.cd", "ef"};
    ck_index *ix = index_of_names(names, 2);
    ck_tree *t = build_with(ix, NULL, 0);
    uint32_t ab = tree_find(t, "ab"), ef = tree_find(t, "ef");
    cr_assert_neq(ab, CK_NO_NODE);
    cr_assert_neq(ef, CK_NO_NODE);
    cr_assert_eq(ck_tree_lookup(t, 0, "zz", 2), CK_NO_NODE);
    cr_assert_eq(ck_tree_lookup(t, 0, "ab", 1), CK_NO_NODE);   /* a prefix */
    cr_assert_eq(ck_tree_lookup(t, 0, "abc", 3), CK_NO_NODE);  /* longer */
    cr_assert_eq(ck_tree_lookup(t, 0, "cd", 2), CK_NO_NODE);   /* wrong parent */
    cr_assert_eq(ck_tree_lookup(t, ef, "cd", 2), CK_NO_NODE);  /* under a file */
    cr_assert_eq(ck_tree_lookup(t, 0, "", 0), CK_NO_NODE);
    cr_assert_eq(ck_tree_lookup(t, 0, "ab.cd", 5), CK_NO_NODE);
    cr_assert_eq(ck_tree_lookup(t, 0, ".ckptfs", 7), CK_NO_NODE);
    cr_assert_eq(tree_find(t, "ab/cd/x"), CK_NO_NODE);
    ck_tree_free(t);
    ck_index_free(ix);
}

Test(tree, path_of_root_and_truncation)
{
    static const char *const names[] = {"abc.de.f"};
    ck_index *ix = index_of_names(names, 1);
    ck_tree *t = build_with(ix, NULL, 0);
    char buf[16];
    cr_assert_eq(ck_tree_path(t, 0, buf, sizeof buf), 0);
    cr_assert_str_eq(buf, "");
    uint32_t f = t->entry_node[0];
    size_t full = strlen("abc/de/f");
    cr_assert_eq(ck_tree_path(t, f, buf, full + 1), full);
    cr_assert_str_eq(buf, "abc/de/f");
    memset(buf, 'Z', sizeof buf);
    cr_assert_eq(ck_tree_path(t, f, buf, full), full); /* no room for the NUL */
    cr_assert_eq(buf[0], 0);
    memset(buf, 'Z', sizeof buf);
    cr_assert_eq(ck_tree_path(t, f, buf, 0), full);
    cr_assert_eq(buf[0], 'Z');
    ck_tree_free(t);
    ck_index_free(ix);
}

Test(tree, virtual_directory)
{
    static const char *const names[] = {"ckptfs", ".ckptfs", "index.json", ".ckptfs.index.json"};
    ck_index *ix = index_of_names(names, 4);
    ck_tree *t = build_with(ix, ".ckptfs", 2);
    uint32_t v = ck_tree_lookup(t, 0, ".ckptfs", 7);
    cr_assert_neq(v, CK_NO_NODE);
    cr_assert_eq(t->nodes[v].kind, CK_NODE_DIR);
    cr_assert_eq(t->nodes[v].nchild, 2);
    for (unsigned k = 0; k < 2; k++) {
        uint32_t f = ck_tree_lookup(t, v, vfiles[k].name, strlen(vfiles[k].name));
        cr_assert_neq(f, CK_NO_NODE, "%s", vfiles[k].name);
        cr_assert_eq(t->nodes[f].kind, vfiles[k].kind);
        cr_assert_eq(t->nodes[f].id, k);
        cr_assert_str_eq(path_of(t, f), strf(".ckptfs/%s", vfiles[k].name));
    }
    /* The tensors named like it live elsewhere. */
    cr_assert_str_eq(path_of(t, t->entry_node[0]), "ckptfs");
    cr_assert_str_eq(path_of(t, t->entry_node[1]), "%/ckptfs%");
    cr_assert_str_eq(path_of(t, t->entry_node[2]), "index/json");
    cr_assert_str_eq(path_of(t, t->entry_node[3]), "%/ckptfs/index/json");
    cr_assert_eq(t->nodes[0].nchild, 4); /* "%", ".ckptfs", "ckptfs", "index" */
    ck_tree_free(t);
    ck_index_free(ix);
}

Test(tree, no_virtual_directory_without_vdir)
{
    static const char *const names[] = {"a"};
    ck_index *ix = index_of_names(names, 1);
    ck_tree *t = build_with(ix, NULL, 0);
    cr_assert_eq(t->nnodes, 2);
    cr_assert_eq(ck_tree_lookup(t, 0, ".ckptfs", 7), CK_NO_NODE);
    ck_tree_free(t);
    ck_index_free(ix);
}

Test(tree, empty_index)
{
    ck_index *ix = ck_index_new("x");
    ck_tree *t = build_with(ix, NULL, 0);
    cr_assert_eq(t->nnodes, 1);
    cr_assert_eq(t->nodes[0].nchild, 0);
    ck_tree_free(t);
    t = build_with(ix, ".ckptfs", 1);
    cr_assert_eq(t->nnodes, 3);
    ck_tree_free(t);
    ck_index_free(ix);
}

Test(tree, hostile_names_stay_inside)
{
    static const char *const names[] = {".", "..", "...", "./x", "../../etc/passwd", "a/../b",
                                        "/abs", "a./.b", "%2E", ".ckptfs", "..ckptfs", "\x01.\x02"};
    ck_index *ix = index_of_names(names, sizeof names / sizeof *names);
    ck_tree *t = build_with(ix, ".ckptfs", 1); /* check_invariants does the checking */
    for (size_t i = 0; i < ix->nentries; i++) {
        const char *p = path_of(t, t->entry_node[i]);
        cr_assert_neq(p[0], '.', "'%s' gives '%s'", names[i], p);
        cr_assert_null(strstr(p, "/."), "'%s' gives '%s'", names[i], p);
    }
    ck_tree_free(t);
    ck_index_free(ix);
}

static void expect_clash(ck_index *ix, const char *source, const char *what)
{
    ck_tree sentinel, *t = &sentinel;
    ck_error err = {""};
    cr_assert_eq(ck_tree_build(ix, ".ckptfs", vfiles, 1, &t, &err), -1);
    cr_assert_null(t);
    assert_error(&err, source, what);
}

Test(tree, two_entries_one_path)
{
    static const char *const names[] = {"a.b", "c", "a.b"};
    ck_index *ix = index_of_names(names, 3);
    expect_clash(ix, "?", "tensors 'a.b' and 'a.b' map to one path");
    ck_index_free(ix);
}

Test(tree, two_entries_one_path_names_the_source)
{
    ck_index *ix = index_over("xy", 2);
    add_contig(ix, "w.x", CK_U8, 0, NULL, 0, 1);
    add_contig(ix, "w", CK_U8, 0, NULL, 1, 1);
    add_contig(ix, "w.x", CK_U8, 0, NULL, 1, 1);
    expect_clash(ix, ix->files[0].path, "tensors 'w.x' and 'w.x' map to one path");
    ck_index_free(ix);
}
