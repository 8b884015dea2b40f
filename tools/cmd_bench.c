/* `ninfer bench <what>`: a small dispatcher over the benchmarks, each in its own cmd_bench_*.c.
 * A benchmark is listed once in the table below. */
#include <stdio.h>
#include <string.h>

#include "commands.h"

static const nf_command benches[] = {
    {"codec", "dequantize and matvec throughput per codec (GB/s) next to memcpy", nf_cmd_bench_codec},
    {"sparse-moe", "the CUDA sparse-MoE operator: latency, GB/s and TFLOP/s against measured ceilings", nf_cmd_bench_sparse_moe},
    {"e2e", "llama-bench-style prompt (pp) and generation (tg) tokens/s of a model", nf_cmd_bench_e2e},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: ninfer bench <benchmark> [options]\n\nbenchmarks:\n");
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        fprintf(f, "  %-12s %s\n", benches[i].name, benches[i].summary);
    fprintf(f, "\n'ninfer bench <benchmark> --help' describes its options.\n");
}

int nf_cmd_bench(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "ninfer bench: error: no benchmark given\n");
        usage(stderr);
        return 2;
    }
    const char *what = argv[1];
    if (strcmp(what, "--help") == 0 || strcmp(what, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        if (strcmp(what, benches[i].name) == 0) return benches[i].run(argc - 1, argv + 1);
    fprintf(stderr, "ninfer bench: error: unknown benchmark '%s'\n", what);
    usage(stderr);
    return 2;
}
