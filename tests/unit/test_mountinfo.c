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
