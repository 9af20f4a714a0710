/* options.c — the one option parser of every ckpt command (options.h). */
#include "options.h"

#include <string.h>

#include "../base/names.h"

enum { NAME_MAX_SHOWN = 64 }; /* an unknown option is shown up to this length */
#define HELP_INDENT "                          " /* where --help's descriptions start */

const ck_option ck_no_options[] = {{NULL, NULL, NULL, 0}};

void ck_opts_init(ck_opts *p, const char *cmd, const ck_option *table, int argc, char **argv)
{
    *p = (ck_opts){.cmd = cmd, .table = table, .argc = argc, .argv = argv, .next = 1};
}

int ck_usage_error(const char *cmd, const char *what)
{
    fprintf(stderr, "ckpt: %s: %s (see ckpt %s --help)\n", cmd, what, cmd);
    return CK_USAGE;
}

/* The table's name closest to name (len bytes), when close enough to be a typo: NULL if none. */
static const char *nearest(const ck_option *table, const char *name, size_t len)
{
    const char *best = NULL;
    size_t best_d = 3; /* a typo is at most 2 edits away */
    for (const ck_option *o = table; o->name; o++) {
        size_t d = ck_name_distance(name, len, o->name, strlen(o->name), 2);
        if (d < best_d && d < len)
            best_d = d, best = o->name;
    }
    return best;
}

static int unknown(const ck_opts *p, const char *arg, const char *name, size_t len)
{
    const char *guess = nearest(p->table, name, len);
    int shown = len > NAME_MAX_SHOWN ? NAME_MAX_SHOWN : (int)len;
    int dashes = (int)(name - arg);
    if (guess)
        fprintf(stderr, "ckpt: %s: unknown option '%.*s%.*s' (did you mean --%s?)\n", p->cmd,
                dashes, arg, shown, name, guess);
    else
        fprintf(stderr, "ckpt: %s: unknown option '%.*s%.*s' (see ckpt %s --help)\n", p->cmd,
                dashes, arg, shown, name, p->cmd);
    return CK_OPT_ERROR;
}

/* The option --name (len bytes): exact, else the one name it begins; -1 when none, -2 when it
 * begins several (the candidates printed). */
static int lookup(const ck_opts *p, const char *name, size_t len)
{
    int found = -1, count = 0;
    for (int k = 0; p->table[k].name; k++) {
        if (strncmp(p->table[k].name, name, len) != 0)
            continue;
        if (p->table[k].name[len] == '\0')
            return k;
        found = k;
        count++;
    }
    if (count <= 1)
        return found;
    fprintf(stderr, "ckpt: %s: option '--%.*s' is ambiguous:", p->cmd, (int)len, name);
    for (int k = 0; p->table[k].name; k++)
        if (strncmp(p->table[k].name, name, len) == 0)
            fprintf(stderr, " --%s", p->table[k].name);
    fputc('\n', stderr);
    return -2;
}

/* The option whose letter -L (arg) is; -1 when none. */
static int by_letter(const ck_opts *p, const char *arg)
{
    for (int k = 0; arg[1] && !arg[2] && p->table[k].name; k++)
        if (p->table[k].letter == arg[1])
            return k;
    return -1;
}

int ck_opts_next(ck_opts *p, const char **val)
{
    if (p->next >= p->argc)
        return CK_OPT_END;
    const char *arg = p->argv[p->next++];
    if (p->operands_only || arg[0] != '-' || arg[1] == '\0') {
        *val = arg;
        return CK_OPT_OPERAND;
    }
    if (strcmp(arg, "--") == 0) {
        p->operands_only = 1;
        return ck_opts_next(p, val);
    }
    const char *name = arg + 2, *eq = arg[1] == '-' ? strchr(name, '=') : NULL;
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    int k = arg[1] == '-' ? lookup(p, name, len) : by_letter(p, arg);
    if (arg[1] != '-' && k == -1) /* -x: ckpt's options are long, -h (main's) and a few letters */
        return unknown(p, arg, arg + 1, strlen(arg + 1));
    if (k == -1)
        return unknown(p, arg, name, len);
    if (k < 0)
        return CK_OPT_ERROR;
    const ck_option *o = &p->table[k];
    if (!o->value) {
        if (eq) {
            fprintf(stderr, "ckpt: %s: option '--%s' takes no value\n", p->cmd, o->name);
            return CK_OPT_ERROR;
        }
        *val = NULL;
        return k;
    }
    if (eq) {
        *val = eq + 1;
    } else if (p->next < p->argc) {
        *val = p->argv[p->next++];
    } else {
        fprintf(stderr, "ckpt: %s: option '--%s' needs a value (%s)\n", p->cmd, o->name,
                o->value);
        return CK_OPT_ERROR;
    }
    return k;
}

int ck_opts_bad_value(const ck_opts *p, int opt, const char *val, const char *what)
{
    fprintf(stderr, "ckpt: %s: --%s: '%s' is not %s\n", p->cmd, p->table[opt].name, val, what);
    return CK_USAGE;
}

void ck_opts_print_help(FILE *out, const ck_option *table)
{
    fprintf(out, "\noptions:\n");
    for (const ck_option *o = table; o->name; o++) {
        char head[64];
        char letter[8] = "";
        if (o->letter)
            snprintf(letter, sizeof letter, "-%c, ", o->letter);
        int n = snprintf(head, sizeof head, "%s--%s%s%s", letter, o->name, o->value ? " " : "",
                         o->value ? o->value : "");
        fprintf(out, "  %-24s%s", head, n > 23 ? "\n" HELP_INDENT : "");
        for (const char *h = o->help; *h; h++) { /* a help of several lines keeps its column */
            if (*h == '\n')
                fputs("\n" HELP_INDENT, out);
            else
                fputc(*h, out);
        }
        fputc('\n', out);
    }
    fprintf(out, "  %-24s%s\n", "-h, --help", "this help");
}
