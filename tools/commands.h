/* The subcommand table's entry type and every command's entry point. Each command parses its own
 * arguments with nf_cli_parse (argv[0] is the command name) and returns the process exit status:
 * 0 success, 1 failure at run time, 2 bad usage. */
#ifndef NF_TOOLS_COMMANDS_H
#define NF_TOOLS_COMMANDS_H

#include <stddef.h>

typedef struct nf_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
} nf_command;

/* "PROG <name> [args]" over a table of commands (tools/cli.c): --help/-h prints the listing and
 * returns 0; no name or an unknown one prints an error and the listing and returns 2; otherwise the
 * command runs with argv[0] = its name. */
typedef struct nf_dispatch {
    const char *prog;    /* "ninfer", "ninfer bench" */
    const char *noun;    /* "command", "benchmark" */
    const char *usage;   /* the usage lines */
    const char *heading; /* "commands", "benchmarks" */
    const char *footer;  /* a closing line */
    const nf_command *table;
    size_t n;
} nf_dispatch;
int nf_cli_dispatch(const nf_dispatch *d, int argc, char **argv);

int nf_cmd_version(int argc, char **argv);
int nf_cmd_inspect(int argc, char **argv); /* tools/cmd_inspect.c */
int nf_cmd_convert(int argc, char **argv); /* tools/cmd_convert.c */
int nf_cmd_bench(int argc, char **argv);       /* dispatcher: tools/cmd_bench.c */
int nf_cmd_bench_codec(int argc, char **argv); /* ninfer bench codec */
int nf_cmd_bench_sparse_moe(int argc, char **argv); /* ninfer bench sparse-moe */
int nf_cmd_run(int argc, char **argv);        /* tools/cmd_run.c */
int nf_cmd_chat(int argc, char **argv);       /* tools/cmd_chat.c */
int nf_cmd_eval(int argc, char **argv);       /* tools/cmd_eval.c */
int nf_cmd_perplexity(int argc, char **argv); /* tools/cmd_perplexity.c */
int nf_cmd_serve(int argc, char **argv);      /* tools/cmd_serve.c */
int nf_cmd_synth(int argc, char **argv);      /* tools/cmd_synth.c */
int nf_cmd_bench_e2e(int argc, char **argv);  /* ninfer bench e2e: tools/cmd_bench_e2e.c */
int nf_cmd_bench_serve(int argc, char **argv); /* ninfer bench serve: tools/cmd_bench_serve.c */
int nf_cmd_bench_batch(int argc, char **argv); /* ninfer bench batch: tools/cmd_bench_batch.c */

#endif
