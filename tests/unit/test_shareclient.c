/* loader/share_client.h: warm attach's client up to the mapping, over socketpairs and a keeper
 * of another uid, with no CUDA: whom it trusts (SO_PEERCRED, before a byte is read), one
 * deadline for the whole message however the keeper dribbles it, a keeper's text kept to one
 * line, a table checked against the room the driver says the mapping has. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../loader/share.h"
#include "../../loader/share_client.h"
#include "../../loader/sharesock.h"

TestSuite(shareclient);

/* A table of one float32 tensor "t" of 2 elements in a block of 8 bytes, source "/s". */
static void table_message(unsigned char **msg, size_t *len)
{
    ck_plan_blob blob = {.dest_off = 0, .len = 8};
    ck_plan_tensor pt = {.blob = 0};
    ck_plan plan = {.tensors = &pt, .ntensors = 1, .blobs = &blob, .nblobs = 1};
    static const int64_t two[] = {2};
    ckl_tensor t = {.name = "t", .shape = two, .rank = 1, .nbytes = 8, .dtype_code = CK_F32};
    share_table tab = {.block_size = 8, .source = "/s", .plan = &plan, .tensors = &t};
    cr_assert_eq(share_encode_table(&tab, msg, len), 0);
}

/* What ckl_attach asks, the deadline wait_s from now. */
static share_ask ask_within(unsigned wait_s, long gid)
{
    share_ask a = share_ask_make(-1, NULL, gid);
    a.wait_s = wait_s;
    a.deadline = share_deadline(wait_s);
    return a;
}

/* A socketpair: [0] the client's end, [1] the keeper's (this very process: same uid). */
static void pair(int sv[2])
{
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
}

Test(shareclient, a_whole_table_from_a_keeper_of_this_uid)
{
    int sv[2];
    pair(sv);
    unsigned char *msg;
    size_t len;
    table_message(&msg, &len);
    cr_assert_eq(share_send_all(sv[1], msg, len), 0);
    share_ask ask = ask_within(5, -1);
    share_table t;
    char err[512] = "";
    cr_assert_eq(share_client_receive(sv[0], "S", &ask, &t, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(t.tensors[0].name, "t");
    cr_assert_eq(t.block_size, 8);
    cr_assert_eq(share_client_fits(&t, 8, "S", err, sizeof err), 0);
    cr_assert_eq(share_client_fits(&t, 7, "S", err, sizeof err), -1);
    cr_assert_eq(errno, EIO);
    cr_assert_str_eq(err, "S: the server's table claims a block of 8 bytes, more than its "
                          "mapping holds (7 bytes)");
    share_table_free(&t);
    free(msg);
    close(sv[0]);
    close(sv[1]);
}

/* Sends its message a byte every 100 ms, until the client hangs up. */
static void *dribble(void *arg)
{
    int fd = *(int *)arg;
    unsigned char *msg;
    size_t len;
    table_message(&msg, &len);
    for (size_t i = 0; i < len && share_send_all(fd, msg + i, 1) == 0; i++)
        usleep(100 * 1000);
    free(msg);
    return NULL;
}

Test(shareclient, a_dribbling_keeper_meets_one_deadline)
{
    int sv[2];
    pair(sv);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, dribble, &sv[1]), 0);
    share_ask ask = ask_within(1, -1); /* the message needs some 20 s at this rate */
    share_table t;
    char err[512] = "";
    cr_assert_eq(share_client_receive(sv[0], "S", &ask, &t, err, sizeof err), -1);
    cr_assert_eq(errno, EIO);
    unsigned came = 0;
    cr_assert_eq(sscanf(err, "S: the server's answer was not whole within 1 seconds (%u bytes "
                        "came)", &came), 1, "%s", err);
    unsigned char *msg;
    size_t len;
    table_message(&msg, &len);
    cr_assert_lt(came, len);
    free(msg);
    cr_assert_null(t.plan);
    close(sv[0]); /* the keeper's next byte fails: it ends */
    pthread_join(th, NULL);
    close(sv[1]);
}

Test(shareclient, a_keeper_that_closes_early)
{
    int sv[2];
    pair(sv);
    unsigned char *msg;
    size_t len;
    table_message(&msg, &len);
    cr_assert_eq(share_send_all(sv[1], msg, 30), 0);
    close(sv[1]);
    share_ask ask = ask_within(5, -1);
    share_table t;
    char err[512] = "";
    cr_assert_eq(share_client_receive(sv[0], "S", &ask, &t, err, sizeof err), -1);
    cr_assert_eq(errno, EIO);
    cr_assert_str_eq(err, "S: the server closed the connection before its answer was whole");
    free(msg);
    close(sv[0]);
}

Test(shareclient, a_keepers_refusal_on_one_line)
{
    int sv[2];
    pair(sv);
    unsigned char *msg;
    size_t len;
    cr_assert_eq(share_encode_refusal(EACCES, "no\n\033[2J\r", &msg, &len), 0);
    cr_assert_eq(share_send_all(sv[1], msg, len), 0);
    share_ask ask = ask_within(5, -1);
    share_table t;
    char err[512] = "";
    cr_assert_eq(share_client_receive(sv[0], "S", &ask, &t, err, sizeof err), -1);
    cr_assert_eq(errno, EACCES);
    cr_assert_str_eq(err, "S: refused by the server: no??[2J?");
    free(msg);
    close(sv[0]);
    close(sv[1]);
}

Test(shareclient, the_peer_is_the_kernels_word)
{
    int sv[2];
    pair(sv);
    struct ucred who;
    uid_t other = getuid() + 1;
    cr_assert_eq(share_peer_is(sv[0], getuid(), -1, &who), 1);
    cr_assert_eq(who.pid, getpid());
    cr_assert_eq(share_peer_is(sv[0], other, -1, &who), 0);
    cr_assert_eq(share_peer_is(sv[0], other, (long)getgid(), &who), 1); /* its group */
    cr_assert_eq(share_peer_is(sv[0], other, (long)getgid() + 4242, &who), 0);
    close(sv[0]);
    close(sv[1]);
}

Test(shareclient, the_deadline_from_the_environment)
{
    cr_assert_eq(unsetenv("CKLOAD_ATTACH_WAIT"), 0);
    cr_assert_eq(share_ask_make(-1, NULL, -1).wait_s, SHARE_WAIT_S);
    const char *bad[] = {"0", "-1", "3601", "x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv("CKLOAD_ATTACH_WAIT", bad[i], 1);
        cr_assert_eq(share_ask_make(-1, NULL, -1).wait_s, SHARE_WAIT_S, "%s", bad[i]);
    }
    setenv("CKLOAD_ATTACH_WAIT", "7", 1);
    share_ask a = share_ask_make(0, "/s", 5);
    cr_assert_eq(a.wait_s, 7);
    cr_assert_eq(a.gid, 5);
    cr_assert_eq(share_ask_make(0, "/s", -9).gid, -1);
    unsetenv("CKLOAD_ATTACH_WAIT");
}

/* A keeper of uid and gid 65534 listening on an abstract socket (no file to own), sending a
 * refusal "from nobody" to whoever connects; the client's end, connected. */
static int connect_to_nobody(pid_t *child)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "ckl-shareclient-%d", (int)getpid());
    int ready[2];
    cr_assert_eq(pipe(ready), 0);
    if ((*child = fork()) == 0) {
        int ls = -1;
        if (setresgid(65534, 65534, 65534) == 0 && setresuid(65534, 65534, 65534) == 0)
            ls = socket(AF_UNIX, SOCK_STREAM, 0);
        if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 1) != 0)
            _exit(1);
        if (write(ready[1], "r", 1) != 1)
            _exit(1);
        int c = accept(ls, NULL, NULL);
        unsigned char *msg;
        size_t len;
        if (share_encode_refusal(EINVAL, "from nobody", &msg, &len) == 0)
            share_send_all(c, msg, len);
        pause();
        _exit(0);
    }
    char r;
    cr_assert_eq(read(ready[0], &r, 1), 1);
    close(ready[0]);
    close(ready[1]);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

Test(shareclient, a_keeper_of_another_uid)
{
    if (geteuid() != 0)
        cr_skip_test("needs root, to run a keeper as uid 65534");
    pid_t child;
    int fd = connect_to_nobody(&child);
    share_ask ask = ask_within(5, -1);
    share_table t;
    char err[512] = "";
    cr_assert_eq(share_client_receive(fd, "S", &ask, &t, err, sizeof err), -1);
    cr_assert_eq(errno, EACCES);
    cr_assert_str_eq(err, "S: the server there runs as uid 65534, neither this process's uid "
                          "(0) nor root: not trusted");
    /* not a byte was read: the refusal it sent is all there still */
    unsigned char head[8];
    cr_assert_eq(recv(fd, head, sizeof head, MSG_PEEK), (ssize_t)sizeof head);
    cr_assert_arr_eq(head, "CKLSHARE", 8);
    ask = ask_within(5, 4242);
    cr_assert_eq(share_client_receive(fd, "S", &ask, &t, err, sizeof err), -1);
    cr_assert_str_eq(err, "S: the server there runs as uid 65534, neither this process's uid "
                          "(0) nor root, and is not in group 4242: not trusted");
    ask = ask_within(5, 65534); /* its group trusted: its message is read */
    cr_assert_eq(share_client_receive(fd, "S", &ask, &t, err, sizeof err), -1);
    cr_assert_eq(errno, EINVAL);
    cr_assert_str_eq(err, "S: refused by the server: from nobody");
    close(fd);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
}
