/* The mount table readers (views/mountinfo.h) on tables written here: which mount is on top at a
 * path, its type, source (unescaped) and propagation (ck_mount_top); whether a table lists a
 * mount ID (ck_mount_listed). */
#include <criterion/criterion.h>
#include <string.h>
#include <sys/sysmacros.h>

#include "helpers.h"
#include "../../views/mountinfo.h"

TestSuite(mountinfo, .fini = tmp_cleanup);

static const char table[] =
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    "40 22 0:40 / /mnt/a\\040b rw,nosuid - fuse.ckptfs /src/x\\040y.safetensors ro\n"
    "41 22 0:41 / /mnt/c ro,nosuid shared:7 master:2 - fuse.ckptfs /src/c rw\n"
    "42 41 0:42 / /mnt/c rw - tmpfs none rw\n"
    "43 22 0:43 / /mnt/cc rw - fuse.ckptfs /src/cc rw\n";

static int top(const char *path, ck_mount_at *at)
{
    return ck_mount_top(tmp_file(table, sizeof table - 1), path, at);
}

Test(mountinfo, the_mount_at_a_path_unescaped)
{
    ck_mount_at at;
    cr_assert_eq(top("/mnt/a b", &at), 1);
    cr_assert_eq(at.id, 40);
    cr_assert_str_eq(at.fstype, "fuse.ckptfs");
    cr_assert_str_eq(at.source, "/src/x y.safetensors");
    cr_assert_not(at.shared);
    cr_assert_eq(top("/", &at), 1);
    cr_assert(at.shared);
    cr_assert_str_eq(at.fstype, "ext4");
}

Test(mountinfo, the_top_of_a_stack_is_the_last_listed)
{
    ck_mount_at at;
    cr_assert_eq(top("/mnt/c", &at), 1);
    cr_assert_eq(at.id, 42);
    cr_assert_str_eq(at.fstype, "tmpfs");
    cr_assert_not(at.shared, "the tmpfs's own fields, not the mount under it");
}

Test(mountinfo, nothing_mounted_there)
{
    ck_mount_at at;
    cr_assert_eq(top("/mnt", &at), 0);
    cr_assert_eq(top("/mnt/a", &at), 0, "a prefix of a mountpoint is not it");
    cr_assert_eq(top("/mnt/a\\040b", &at), 0, "the path is matched as written, not escaped");
}

Test(mountinfo, the_mount_of_a_device)
{
    ck_mount_at at;
    const char *t = tmp_file(table, sizeof table - 1);
    cr_assert_eq(ck_mount_of_dev(t, makedev(0, 40), &at), 1);
    cr_assert_eq(at.id, 40);
    cr_assert_str_eq(at.fstype, "fuse.ckptfs");
    cr_assert_str_eq(at.source, "/src/x y.safetensors");
    cr_assert_eq(ck_mount_of_dev(t, makedev(8, 1), &at), 1);
    cr_assert_str_eq(at.fstype, "ext4");
    cr_assert_eq(ck_mount_of_dev(t, makedev(0, 4), &at), 0, "0:4 is not 0:40");
    cr_assert_eq(ck_mount_of_dev(t, makedev(40, 0), &at), 0);
    cr_assert_eq(ck_mount_of_dev("/nonexistent/mountinfo", makedev(0, 40), &at), -1);
}

Test(mountinfo, unreadable_table)
{
    ck_mount_at at;
    cr_assert_eq(ck_mount_top("/nonexistent/mountinfo", "/", &at), -1);
}

Test(mountinfo, this_process_root_is_a_mount)
{
    ck_mount_at at;
    cr_assert_eq(ck_mount_top(CK_MOUNTINFO, "/", &at), 1);
    cr_assert_gt(at.id, 0);
}

Test(mountinfo, listed_by_mount_id)
{
    const char *t = tmp_file(table, sizeof table - 1);
    cr_assert_eq(ck_mount_listed(t, 41), 1);
    cr_assert_eq(ck_mount_listed(t, 22), 1);
    cr_assert_eq(ck_mount_listed(t, 4), 0, "an ID is the first field, not a part of one");
    cr_assert_eq(ck_mount_listed(t, 1), 0, "nor another field");
    cr_assert_eq(ck_mount_listed("/nonexistent/mountinfo", 22), -1);
}

/* --- the root's user.ckptfs.sources of a remote source -------------------------------------- */

Test(mountinfo, a_remote_source_shown_without_secrets_or_records)
{
    /* ix and paths are not read for a URL: there are no files a loader could open. */
    static const char url[] = "HTTPS://user:S3CR3T@h:8/d/m.safetensors?X-Amz-Signature=S3CR3T#f";
    char *v;
    size_t len;
    cr_assert_eq(ck_sources_encode(url, NULL, NULL, &v, &len), 0);
    static const char want[] = "HTTPS://h:8/d/m.safetensors";
    cr_assert_eq(len, sizeof want);
    cr_assert_eq(memcmp(v, want, sizeof want), 0, "%.*s", (int)len, v);
    cr_assert_null(memmem(v, len, "S3CR3T", 6));
    const char *source;
    ck_source_file *files = (ck_source_file *)v;
    size_t nfiles = 7;
    cr_assert_eq(ck_sources_parse(v, len, &source, &files, &nfiles), 0);
    cr_assert_str_eq(source, want);
    cr_assert_null(files);
    cr_assert_eq(nfiles, 0);
    free(v);
    char hub[] = "hf://org/model", s3[] = "s3://bkt/m/x.safetensors";
    cr_assert_eq(ck_sources_parse(hub, sizeof hub, &source, &files, &nfiles), 0);
    cr_assert_str_eq(source, "hf://org/model");
    cr_assert_eq(ck_sources_parse(s3, sizeof s3, &source, &files, &nfiles), 0);
    cr_assert_str_eq(source, "s3://bkt/m/x.safetensors");
    /* A URL not as shown, or with records after it, is malformed. */
    static const struct {
        const char *v;
        size_t len;
    } bad[] = {
        {"http://h/m\0" "1 2 3 4.5 /f\0", 24},  /* a URL has no file records */
        {"http://u:pw@h/m\0", 16},              /* not as shown: userinfo */
        {"http://h/m?sig=x\0", 17},             /* not as shown: a query */
        {"http://h/m", 10},                     /* not NUL-terminated */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char b[64];
        memcpy(b, bad[i].v, bad[i].len);
        files = (ck_source_file *)b;
        nfiles = 7;
        cr_assert_eq(ck_sources_parse(b, bad[i].len, &source, &files, &nfiles), -1, "%zu", i);
        cr_assert_null(files);
        cr_assert_eq(nfiles, 0);
    }
}
