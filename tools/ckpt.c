/* ckpt — the checkpoint tool: the same readers as the mount, without mounting anything.
 * This file is the command table and main: ckpt's own options, the dispatch to a command
 * (commands.h: one file per command) and the help the table makes. Every command prints one
 * line "ckpt: ..." on stderr and exits 1 on failure, 2 on bad usage.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/location.h"
#include "../checkpoint/open.h"
#include "commands.h"
#include "options.h"
#include "progress.h"

static const ck_command *find_command(const char *name);

/* Whether argv (a command's arguments) asks for help: -h or --help, before any "--". */
static int wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
            return 1;
    return 0;
}

static int cmd_help(int argc, char **argv, http_remote *remote);

static const ck_command ckpt_help = {"help", "ckpt help [COMMAND]", "Shows what a command does.",
                                     ck_no_options, cmd_help};

/* The commands, in the order ckpt --help lists them. */
static const ck_command *const commands[] = {
    &ckpt_ls,    &ckpt_cat,  &ckpt_pack, &ckpt_convert, &ckpt_verify, &ckpt_load,
    &ckpt_serve, &ckpt_diff, &ckpt_info, &ckpt_stats,   &ckpt_help,
};
enum { NCOMMANDS = sizeof commands / sizeof *commands };

/* ckpt's own options, before the COMMAND: --cacert FILE (or =FILE) and --no-sign-request
 * become the variables every opener reads (CKPTFS_CACERT, CKPTFS_NO_SIGN_REQUEST): `ckpt load`
 * opens its source in libckload too. --version stands alone. The one table of their names and
 * help: ckpt --help prints it, global_option parses by it, ckpt(1)'s OPTIONS is checked
 * against it. */
enum { OWN_CACERT, OWN_NO_SIGN_REQUEST, OWN_VERSION };
static const ck_option own_options[] = {
    {"cacert", "FILE", "CA certificates for https sources (also --cacert=FILE)", 0},
    {"no-sign-request", NULL, "s3:// and gs:// requests unsigned, whatever credentials are\n"
                              "around: a public bucket", 0},
    {"version", NULL, "the version, alone", 0},
    {NULL, NULL, NULL, 0}};

static void print_usage(FILE *out)
{
    fprintf(out, "usage: ckpt [--cacert FILE] [--no-sign-request] COMMAND [ARGS]   (SOURCE: a\n"
                 "       checkpoint file, a directory of shards or a DCP checkpoint, an http(s)://\n"
                 "       URL, hf://ORG/REPO[@REV][/PATH], s3://BUCKET/KEY[/] or gs://BUCKET/KEY[/])\n"
                 "       ckpt --version\n\n");
    for (int i = 0; i < NCOMMANDS; i++)
        fprintf(out, "  %s\n", commands[i]->usage);
    fprintf(out, "\nckpt COMMAND --help explains one command.\n");
    ck_opts_print_help(out, own_options);
}

static void print_command_help(const ck_command *c)
{
    printf("usage: %s\n\n%s\n", c->usage, c->help);
    ck_opts_print_help(stdout, c->options);
}

static int cmd_help(int argc, char **argv, http_remote *remote)
{
    (void)remote;
    const ck_command *c = argc > 1 ? find_command(argv[1]) : NULL;
    if (argc > 1 && !c)
        return ck_usage_error("help", "unknown command");
    if (c)
        print_command_help(c);
    else
        print_usage(stdout);
    return 0;
}

static const ck_command *find_command(const char *name)
{
    for (int i = 0; i < NCOMMANDS; i++)
        if (strcmp(commands[i]->name, name) == 0)
            return commands[i];
    return NULL;
}

/* Which of own_options arg is: its whole --NAME (no prefix), or --NAME=VALUE for one that
 * takes a value (*value then points at VALUE, else is NULL); -1 when none. */
static int own_option(const char *arg, const char **value)
{
    size_t n = strncmp(arg, "--", 2) == 0 ? strcspn(arg + 2, "=") : 0;
    for (int k = 0; n && own_options[k].name; k++) {
        const ck_option *o = &own_options[k];
        if (strlen(o->name) != n || strncmp(arg + 2, o->name, n) != 0 || (arg[2 + n] && !o->value))
            continue;
        *value = arg[2 + n] ? arg + 3 + n : NULL;
        return k;
    }
    return -1;
}

/* The option of ckpt's own at argv[1], applied: the arguments it used (0: argv[1] is none of
 * them), or -2 (usage, said), -1. */
static int global_option(int argc, char **argv)
{
    const char *value = NULL;
    int k = own_option(argv[1], &value), used = k == OWN_CACERT && !value ? 2 : 1;
    if (k != OWN_CACERT && k != OWN_NO_SIGN_REQUEST)
        return 0;
    if (argc < used + 2 || (value && !*value)) {
        fprintf(stderr, "ckpt: --%s needs %sa COMMAND (see ckpt --help)\n", own_options[k].name,
                k == OWN_CACERT ? "FILE and " : "");
        return -2;
    }
    if (setenv(k == OWN_CACERT ? "CKPTFS_CACERT" : "CKPTFS_NO_SIGN_REQUEST",
               k == OWN_CACERT ? (value ? value : argv[2]) : "1", 1) != 0)
        return fprintf(stderr, "ckpt: out of memory\n"), -1;
    return used;
}

int main(int argc, char **argv)
{
    /* A load, pack or convert runs long, and `ps` would show a URL SOURCE's secrets. */
    if (ck_location_hide_args(argc, argv) != 0) {
        fprintf(stderr, "ckpt: out of memory\n");
        return 1;
    }
    /* A descriptor per source file while a command reads them (a DCP job's file per rank),
     * besides its outputs and connections: all the hard limit allows. */
    ck_nofile_raise();
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        print_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? CK_USAGE : 0;
    }
    const char *value;
    if (own_option(argv[1], &value) == OWN_VERSION) {
        printf("ckpt %s\n", CKPTFS_VERSION);
        return 0;
    }
    int used;
    while ((used = global_option(argc, argv)) > 0) {
        argc -= used;
        argv += used;
    }
    if (used < 0)
        return used == -1 ? 1 : CK_USAGE;
    const ck_command *c = find_command(argv[1]);
    if (!c) {
        fprintf(stderr, "ckpt: unknown command '%s' (see ckpt --help)\n", argv[1]);
        return CK_USAGE;
    }
    if (wants_help(argc - 1, argv + 1)) {
        print_command_help(c);
        return 0;
    }
    /* What every source the command opens shares: one block cache, one disk cache (open.h). */
    http_remote *remote = ck_remote_new(&(http_config){0});
    if (!remote) {
        fprintf(stderr, "ckpt: out of memory\n");
        return 1;
    }
    int status = c->run(argc - 1, argv + 1, remote);
    http_remote_free(remote);
    ck_progress_die_if_interrupted(); /* what it was writing is gone: now die as asked */
    return status;
}
