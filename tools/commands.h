/* The subcommand table's entry type and every command's entry point. Each command parses its own
 * arguments with nf_cli_parse (argv[0] is the command name) and returns the process exit status:
 * 0 success, 1 failure at run time, 2 bad usage. */
#ifndef NF_TOOLS_COMMANDS_H
#define NF_TOOLS_COMMANDS_H

typedef struct nf_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
} nf_command;

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
int nf_cmd_synth(int argc, char **argv);      /* tools/cmd_synth.c */
int nf_cmd_bench_e2e(int argc, char **argv);  /* ninfer bench e2e: tools/cmd_bench_e2e.c */

#endif
