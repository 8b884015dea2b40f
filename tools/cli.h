/* Command-line parsing shared by every ninfer subcommand, so that flags, --help and errors behave
 * the same everywhere: an unknown flag or a bad value prints one error line and the usage, and
 * the command exits with status 2. */
#ifndef NF_TOOLS_CLI_H
#define NF_TOOLS_CLI_H

#include <stdio.h>

typedef enum nf_opt_kind {
    NF_OPT_FLAG,   /* int*: set to 1 */
    NF_OPT_INT,    /* long*: decimal, range-checked against [min, max] */
    NF_OPT_FLOAT,  /* double*: range-checked against [min, max] */
    NF_OPT_STRING, /* const char**: the argument as given */
} nf_opt_kind;

typedef struct nf_opt {
    const char *name;  /* "--threads" */
    char short_name;   /* 't' for -t, or 0 */
    nf_opt_kind kind;
    void *dest;
    const char *metavar; /* "N" in "--threads N"; NULL for flags */
    const char *help;    /* one line; mention the default */
    double min, max;     /* for INT and FLOAT; min == max == 0 means unbounded */
} nf_opt;

typedef struct nf_cmd_usage {
    const char *name;        /* "inspect" */
    const char *synopsis;    /* "FILE [--json]" */
    const char *description; /* a few lines */
    const nf_opt *opts;
    int n_opts;
    int min_pos, max_pos;    /* positional argument count bounds */
} nf_cmd_usage;

enum { NF_CLI_OK = 0, NF_CLI_HELP = 1, NF_CLI_ERROR = 2 };

/* Parses argv[1..argc) (argv[0] is the command name). Positional arguments are returned in
 * pos[0..*npos). Returns NF_CLI_HELP after printing help to stdout for --help/-h, NF_CLI_ERROR after
 * printing an error and the usage to stderr. Callers: `if (r) return r == NF_CLI_HELP ? 0 : 2;` */
int nf_cli_parse(const nf_cmd_usage *u, int argc, char **argv, char **pos, int *npos);

void nf_cli_print_help(const nf_cmd_usage *u, FILE *f);

/* Prints "ninfer: error: ..." to stderr; returns 1 so commands can `return nf_cli_fail(...)`. */
int nf_cli_fail(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

#define NF_CLI_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

#endif
