/* options.h — the one option parser of every ckpt command (getopt_long's conventions).
 *
 * Contract:
 *  - `--name value` and `--name=value` for an option that takes a value, `--name` alone for a
 *    flag; a unique prefix of a name stands for it (`--dep` for `--depth`), as getopt_long
 *    allows; `-h` is `--help`, and an option with a letter has `-L` too (`-v`). Options and operands mix in any order; `--` ends the options
 *    (what follows is operands, a tensor name that begins with '-' included); `-` alone is an
 *    operand.
 *  - On a usage error ck_opts_next prints one line, `ckpt: CMD: unknown option '--jsn' (did
 *    you mean --json?)`, `... option '--depth' needs a value`, `... option '--json' takes no
 *    value`, and the command exits 2 (CK_USAGE), as for every usage error of ckpt and ckptfs.
 *  - Values are the command's to check; ck_opts_bad_value says what is wrong with one the same
 *    way everywhere: `ckpt: load: --threads: 'abc' is not a count from 1 to 64`.
 */
#ifndef CK_OPTIONS_H
#define CK_OPTIONS_H

#include <stdio.h>

enum { CK_USAGE = 2 }; /* the exit status of a usage error */

typedef struct ck_option {
    const char *name;  /* without the leading "--" */
    const char *value; /* the value's name in --help ("SIZE"), NULL for a flag */
    const char *help;  /* what it does, for --help: a line or two */
    char letter;       /* its one-letter form (-v), or 0 */
} ck_option;

typedef struct ck_opts {
    const char *cmd;         /* the command, for messages */
    const ck_option *table;  /* ends with {NULL} */
    int argc;
    char **argv;
    int next;                /* argv index of what comes next */
    int operands_only;       /* after "--" */
} ck_opts;

/* The table of a command without options (verify, help). */
extern const ck_option ck_no_options[];

/* The help of every --only (pack, convert, load, diff): one selection rule, names.h's. */
#define CK_ONLY_HELP                                                                           \
    "the entries named P or under P. (P ending in '.': the names it\n"                          \
    "begins), or matching the glob P"

/* What ck_opts_next found, when not an option of the table (whose index it returns). */
enum { CK_OPT_OPERAND = -1, CK_OPT_END = -2, CK_OPT_ERROR = -3 };

/* Parses argv[1..argc) (argv[0] the command's name) for cmd by table. */
void ck_opts_init(ck_opts *p, const char *cmd, const ck_option *table, int argc, char **argv);

/* The next argument: an option's index in the table (its value in *val, NULL for a flag), an
 * operand (CK_OPT_OPERAND, itself in *val), CK_OPT_END, or CK_OPT_ERROR once the usage error
 * is printed. */
int ck_opts_next(ck_opts *p, const char **val);

/* Prints `ckpt: CMD: --NAME: 'VAL' is not WHAT` and returns CK_USAGE. */
int ck_opts_bad_value(const ck_opts *p, int opt, const char *val, const char *what);

/* Prints `ckpt: CMD: WHAT (see ckpt CMD --help)` and returns CK_USAGE. */
int ck_usage_error(const char *cmd, const char *what);

/* The table's options for --help, a line (or more) each. */
void ck_opts_print_help(FILE *out, const ck_option *table);

#endif
