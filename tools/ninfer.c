/* ninfer: the command-line entry point. It only dispatches: each subcommand lives in its own
 * cmd_*.c and is listed once in the table below. */
#include <stdio.h>
#include <string.h>

#include "commands.h"

static const nf_command commands[] = {
    {"version", "print version, build and GPU information", nf_cmd_version},
    {"inspect", "validate a .nf artifact and show its metadata and tensors", nf_cmd_inspect},
    {"convert", "convert a Hugging Face checkpoint or GGUF file into a .nf artifact", nf_cmd_convert},
    {"bench", "benchmarks: bench codec (CPU codecs), bench sparse-moe (CUDA operator), bench e2e (a model)", nf_cmd_bench},
    {"run", "generate text from a prompt (CUDA when a GPU is visible, else CPU; --device)", nf_cmd_run},
    {"chat", "interactive chat with the model's chat template (CUDA or CPU, as run)", nf_cmd_chat},
    {"eval", "run token ids as one prompt and write every position's logits (.npy; CPU unless --device)", nf_cmd_eval},
    {"perplexity", "perplexity of a text file (llama.cpp's windows)", nf_cmd_perplexity},
    {"serve", "serve the model over HTTP with OpenAI's API, a chat page and metrics", nf_cmd_serve},
    {"synth", "write a full-size model of a named geometry with random weights (no download)", nf_cmd_synth},
};

int main(int argc, char **argv)
{
    static const nf_dispatch d = {
        .prog = "ninfer",
        .noun = "command",
        .usage = "usage: ninfer <command> [options]\n       ninfer --version | --help\n",
        .heading = "commands",
        .footer = "'ninfer <command> --help' describes a command. NF_LOG=debug|info|warn|error sets the log level.",
        .table = commands,
        .n = sizeof commands / sizeof commands[0],
    };
    if (argc >= 2 && strcmp(argv[1], "--version") == 0) return nf_cmd_version(1, argv + 1);
    return nf_cli_dispatch(&d, argc, argv);
}
