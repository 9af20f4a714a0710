/* Directories of safetensors shards (checkpoint/shards.h, through ck_open): listed or named by
 * model.safetensors.index.json, and every way the two can disagree. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "../../checkpoint/open.h"
#include "helpers.h"

TestSuite(shards, .fini = tmp_cleanup);

#define INDEX_JSON "model.safetensors.index.json"

/* dir/file holding U8 tensors named by names (a NULL-terminated list), one byte each, holding
 * the first letter of their name. */
static void shard(const char *dir, const char *file, const char *const *names)
{
    const char *header = "{";
    char data[16];
    size_t n = 0;
    for (; names[n]; n++) {
        header = strf("%s%s%s", header, n ? "," : "", st_tensor(names[n], "U8", "[1]", n, n + 1));
        data[n] = names[n][0];
    }
    st_file_in(dir, file, strf("%s}", header), data, n);
}

static void index_json(const char *dir, const char *text)
{
    tmp_file_in(dir, INDEX_JSON, text, strlen(text));
}

#define NAMES(...) ((const char *const[]){__VA_ARGS__, NULL})

Test(shards, listed_in_name_order)
{
    const char *dir = tmp_dir();
    shard(dir, "b.safetensors", NAMES("y", "z"));
    shard(dir, "a.safetensors", NAMES("x"));
    tmp_file_in(dir, "notes.txt", "hi", 2);
    tmp_file_in(dir, ".hidden.safetensors", "junk", 4);
    tmp_file_in(dir, "a.safetensors.bak", "junk", 4);
    ck_index *ix = open_ok(dir);
    cr_assert_str_eq(ix->format, "safetensors-sharded");
    cr_assert_eq(ix->nfiles, 2);
    cr_assert_str_eq(ix->files[0].path, strf("%s/a.safetensors", dir));
    cr_assert_str_eq(ix->files[1].path, strf("%s/b.safetensors", dir));
    cr_assert_eq(ix->nentries, 3);
    static const char *const names[] = {"x", "y", "z"};
    static const uint32_t file[] = {0, 1, 1};
    for (size_t i = 0; i < 3; i++) {
        cr_assert_str_eq(ix->entries[i].name, names[i]);
        cr_assert_eq(ix->entries[i].ext.file, file[i]);
        char c = 0;
        cr_assert_eq(ck_entry_read(ix, &ix->entries[i], &c, 1, 0), 1);
        cr_assert_eq(c, names[i][0]);
    }
    ck_index_free(ix);
}

Test(shards, first_metadata_wins)
{
    const char *dir = tmp_dir();
    st_file_in(dir, "a.safetensors", "{\"__metadata__\":{\"k\":\"a\"}}", NULL, 0);
    st_file_in(dir, "b.safetensors", "{\"__metadata__\":{\"k\":\"b\",\"j\":\"b\"}}", NULL, 0);
    ck_index *ix = open_ok(dir);
    cr_assert_eq(ix->nmeta, 2);
    cr_assert_str_eq(ix->meta[0].key, "k");
    cr_assert_str_eq(ix->meta[0].value, "a");
    cr_assert_str_eq(ix->meta[1].key, "j");
    cr_assert_str_eq(ix->meta[1].value, "b");
    ck_index_free(ix);
}

Test(shards, named_by_weight_map)
{
    const char *dir = tmp_dir();
    shard(dir, "b.safetensors", NAMES("y", "y2"));
    st_file_in(dir, "a.safetensors",
               strf("{\"__metadata__\":{\"name\":\"shard\",\"format\":\"pt\"},%s}",
                    st_tensor("x", "U8", "[1]", 0, 1)), "x", 1);
    tmp_file_in(dir, "c.safetensors", "junk that no one opens", 22);
    index_json(dir, "{\"metadata\":{\"total_size\":3,\"name\":\"m\",\"nested\":{\"a\":[1,2]}},"
                    "\"weight_map\":{\"y\":\"b.safetensors\",\"x\":\"a.safetensors\","
                    "\"y2\":\"b.safetensors\"}}");
    ck_index *ix = open_ok(dir);
    cr_assert_eq(ix->nfiles, 2);
    cr_assert_str_eq(ix->files[0].path, strf("%s/b.safetensors", dir)); /* first mentioned */
    cr_assert_str_eq(ix->files[1].path, strf("%s/a.safetensors", dir));
    cr_assert_eq(ix->nentries, 3);
    cr_assert_str_eq(ix->entries[0].name, "y");
    cr_assert_str_eq(ix->entries[1].name, "y2");
    cr_assert_str_eq(ix->entries[2].name, "x");
    cr_assert_eq(ix->entries[2].ext.file, 1);
    static const char *const meta[][2] = {
        {"total_size", "3"}, {"name", "m"}, {"nested", "{\"a\":[1,2]}"}, {"format", "pt"}};
    cr_assert_eq(ix->nmeta, 4);
    for (size_t i = 0; i < 4; i++) {
        cr_assert_str_eq(ix->meta[i].key, meta[i][0]);
        cr_assert_str_eq(ix->meta[i].value, meta[i][1]);
    }
    ck_index_free(ix);
}

Test(shards, tensor_in_two_listed_shards)
{
    const char *dir = tmp_dir();
    shard(dir, "a.safetensors", NAMES("w", "x"));
    shard(dir, "b.safetensors", NAMES("x", "y"));
    assert_open_fails(dir, "tensor 'x' is in two shards: ");
    ck_index *ix = NULL;
    ck_error err = {""};
    cr_assert_eq(ck_open(dir, &ix, &err), -1);
    cr_assert_null(ix);
    cr_assert_not_null(strstr(err.msg, strf("%s/a.safetensors", dir)), "%s", err.msg);
    cr_assert_not_null(strstr(err.msg, strf("%s/b.safetensors", dir)), "%s", err.msg);
}

Test(shards, tensor_in_two_indexed_shards)
{
    const char *dir = tmp_dir();
    shard(dir, "a.safetensors", NAMES("x"));
    shard(dir, "b.safetensors", NAMES("x", "z"));
    index_json(dir, "{\"weight_map\":{\"x\":\"a.safetensors\",\"z\":\"b.safetensors\"}}");
    assert_open_fails(dir, "tensor 'x' is in two shards");
}

Test(shards, weight_map_names_a_missing_file)
{
    const char *dir = tmp_dir();
    shard(dir, "a.safetensors", NAMES("x"));
    index_json(dir, "{\"weight_map\":{\"x\":\"a.safetensors\",\"y\":\"gone.safetensors\"}}");
    assert_open_fails(dir, strf("%s/gone.safetensors: cannot open shard: %s", dir, strerror(ENOENT)));
}

Test(shards, weight_map_names_no_plain_file)
{
    static const char *const bad[] = {"\"sub/a.safetensors\"", "\"../a.safetensors\"", "\".\"",
                                      "\"..\"", "\"\"", "5", "null", "\"/etc/passwd\""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *dir = tmp_dir();
        shard(dir, "a.safetensors", NAMES("x"));
        index_json(dir, strf("{\"weight_map\":{\"x\":\"a.safetensors\",\"y\":%s}}", bad[i]));
        assert_open_fails(dir, strf("%s/" INDEX_JSON ": weight_map entry 'y' does not name a file "
                                    "in this directory", dir));
    }
}

Test(shards, tensor_missing_from_weight_map)
{
    const char *dir = tmp_dir();
    shard(dir, "a.safetensors", NAMES("x", "y"));
    index_json(dir, "{\"weight_map\":{\"x\":\"a.safetensors\"}}");
    assert_open_fails(dir, strf("%s/" INDEX_JSON ": tensor 'y' of shard a.safetensors is missing "
                                "from weight_map", dir));
}

Test(shards, weight_map_puts_tensor_in_the_wrong_shard)
{
    const char *dir = tmp_dir();
    shard(dir, "a.safetensors", NAMES("x"));
    shard(dir, "b.safetensors", NAMES("y"));
    index_json(dir, "{\"weight_map\":{\"x\":\"b.safetensors\",\"y\":\"a.safetensors\"}}");
    assert_open_fails(dir, "weight_map puts tensor 'x' in b.safetensors, but it is in a.safetensors");
}

Test(shards, weight_map_names_a_tensor_in_no_shard)
{
    const char *dir = tmp_dir();
    shard(dir, "a.safetensors", NAMES("x"));
    index_json(dir, "{\"weight_map\":{\"x\":\"a.safetensors\",\"z\":\"a.safetensors\"}}");
    assert_open_fails(dir, "weight_map names tensor 'z', which is in no shard (a.safetensors)");
}

Test(shards, index_json_not_json)
{
    const char *dir = tmp_dir();
    shard(dir, "a.safetensors", NAMES("x"));
    index_json(dir, "{\"weight_map\":");
    assert_open_fails(dir, strf("%s/" INDEX_JSON ": not valid JSON", dir));
}

Test(shards, index_json_without_weight_map)
{
    static const char *const bad[] = {"{\"metadata\":{}}", "{\"weight_map\":[]}", "[]",
                                      "{\"weight_map\":\"a.safetensors\"}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *dir = tmp_dir();
        shard(dir, "a.safetensors", NAMES("x"));
        index_json(dir, bad[i]);
        assert_open_fails(dir, strf("%s/" INDEX_JSON ": no \"weight_map\" object", dir));
    }
}

Test(shards, index_json_is_a_directory)
{
    const char *dir = tmp_dir();
    cr_assert_eq(mkdir(tmp_path_in(dir, INDEX_JSON), 0700), 0);
    assert_open_fails(dir, "not a regular file");
}

Test(shards, index_json_cannot_be_opened)
{
    /* A socket exists, so the index is there, but open() refuses it. */
    const char *dir = tmp_dir();
    const char *path = tmp_path_in(dir, INDEX_JSON);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    cr_assert_lt(strlen(path), sizeof a.sun_path);
    strcpy(a.sun_path, path);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    cr_assert_geq(s, 0);
    cr_assert_eq(bind(s, (struct sockaddr *)&a, sizeof a), 0);
    close(s);
    assert_open_fails(dir, strf("%s: cannot open: %s", path, strerror(ENXIO)));
}

Test(shards, empty_directory)
{
    assert_open_fails(tmp_dir(), "holds no checkpoint file (*.safetensors, *.bin, *.pt, *.gguf, "
                                 "an index of shards or a DCP .metadata)");
}

Test(shards, directory_without_shards)
{
    const char *dir = tmp_dir();
    tmp_file_in(dir, "notes.txt", "hi", 2);
    st_file_in(dir, ".a.safetensors", "{}", NULL, 0);
    st_file_in(dir, "model.safetensors.bak", "{}", NULL, 0);
    assert_open_fails(dir, "holds no checkpoint file");
}

Test(shards, shard_that_is_a_directory)
{
    const char *dir = tmp_dir();
    cr_assert_eq(mkdir(tmp_path_in(dir, "x.safetensors"), 0700), 0);
    assert_open_fails(dir, strf("%s/x.safetensors: not a regular file", dir));
}

Test(shards, bad_shard_is_named)
{
    const char *dir = tmp_dir();
    shard(dir, "a.safetensors", NAMES("x"));
    st_file_in(dir, "b.safetensors", "{}", "abc", 3);
    assert_open_fails(dir, strf("%s/b.safetensors: 3 trailing bytes after the last tensor", dir));
}

/* dir/file: torch.save (Debian's torch) of U8 tensors named by names, one byte each holding the
 * first letter of their name; legacy: the pre-1.6 layout. */
static void torch_shard(const char *dir, const char *file, const char *names, int legacy)
{
    run_python("import sys, torch\n"
               "sd = {n: torch.tensor([ord(n[0])], dtype=torch.uint8) for n in sys.argv[2].split()}\n"
               "torch.save(sd, sys.argv[1], _use_new_zipfile_serialization=sys.argv[3] == '0')\n",
               tmp_path_in(dir, file), names, legacy ? "1" : "0", NULL);
}

Test(shards, pytorch_shards_by_their_index)
{
    const char *dir = tmp_dir();
    torch_shard(dir, "pytorch_model-00001-of-00002.bin", "x y", 0);
    torch_shard(dir, "pytorch_model-00002-of-00002.bin", "z", 1);
    tmp_file_in(dir, "training_args.bin", "junk", 4);
    const char *json = "{\"metadata\":{\"total_size\":3},\"weight_map\":{"
                       "\"z\":\"pytorch_model-00002-of-00002.bin\","
                       "\"x\":\"pytorch_model-00001-of-00002.bin\","
                       "\"y\":\"pytorch_model-00001-of-00002.bin\"}}";
    tmp_file_in(dir, "pytorch_model.bin.index.json", json, strlen(json));
    ck_index *ix = open_ok(dir);
    cr_assert_str_eq(ix->format, "pytorch-sharded");
    cr_assert_eq(ix->nfiles, 2, "the shards, in order of first mention");
    cr_assert_str_eq(ix->files[0].path, strf("%s/pytorch_model-00002-of-00002.bin", dir));
    for (const char *n = "zxy"; *n; n++) {
        const ck_entry *e = ck_index_find(ix, (char[]){*n, 0});
        cr_assert_not_null(e, "%c", *n);
        char c = 0;
        cr_assert_eq(ck_entry_read(ix, e, &c, 1, 0), 1);
        cr_expect_eq(c, *n);
    }
    ck_index_free(ix);
    /* The index file named as the source opens the same set. */
    ix = open_ok(strf("%s/pytorch_model.bin.index.json", dir));
    cr_expect_str_eq(ix->format, "pytorch-sharded");
    ck_index_free(ix);
}

Test(shards, pytorch_bin_files_listed_when_there_is_no_index)
{
    const char *dir = tmp_dir();
    torch_shard(dir, "b.bin", "y", 0);
    torch_shard(dir, "a.bin", "x", 0);
    torch_shard(dir, "optimizer.bin", "o", 0);
    ck_index *ix = open_ok(dir);
    cr_expect_str_eq(ix->format, "pytorch-sharded");
    cr_assert_eq(ix->nfiles, 2, "optimizer.bin holds no weights");
    cr_expect_str_eq(ix->files[0].path, strf("%s/a.bin", dir));
    ck_index_free(ix);
    /* safetensors first, by name; what a file holds, by content: here torch.save's */
    torch_shard(dir, "model.safetensors", "s", 0);
    ix = open_ok(dir);
    cr_expect_str_eq(ix->format, "pytorch-zip");
    cr_expect(ix->nfiles == 1 && ix->nentries == 1 && strcmp(ix->entries[0].name, "s") == 0);
    ck_index_free(ix);
}

Test(shards, a_set_holds_one_family)
{
    const char *dir = tmp_dir();
    torch_shard(dir, "a.bin", "x", 0);
    run_python("import sys, numpy as np\n"
               "np.save(open(sys.argv[1], 'wb'), np.zeros(1, np.uint8))\n",
               tmp_path_in(dir, "b.bin"), NULL);
    assert_open_fails(dir, strf("%s/b.bin: a shard must be a safetensors or PyTorch file, "
                                "not npy", dir));
    const char *mixed = tmp_dir();
    torch_shard(mixed, "a.bin", "x", 0);
    shard(mixed, "b.bin", NAMES("y"));
    assert_open_fails(mixed, strf("%s/b.bin: a safetensors shard in a set of pytorch ones (%s/a.bin)",
                                  mixed, mixed));
}

Test(shards, an_index_naming_an_index)
{
    const char *dir = tmp_dir();
    tmp_file_in(dir, "inner.json", "{\"weight_map\":{}}", 17);
    tmp_file_in(dir, "pytorch_model.bin.index.json", "{\"weight_map\":{\"x\":\"inner.json\"}}",
                34);
    assert_open_fails(dir, strf("%s/inner.json: an index of shards, not a shard", dir));
}
