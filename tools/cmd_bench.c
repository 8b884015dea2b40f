/* `ninfer bench <what>`: a small dispatcher over the benchmarks, each in its own cmd_bench_*.c.
 * A benchmark is listed once in the table below. */
#include <stdio.h>
#include <string.h>

#include "commands.h"

static const nf_command benches[] = {
    {"codec", "dequantize and matvec throughput per codec (GB/s) next to memcpy", nf_cmd_bench_codec},
    {"sparse-moe", "the CUDA sparse-MoE operator: latency, GB/s and TFLOP/s against measured ceilings", nf_cmd_bench_sparse_moe},
    {"e2e", "llama-bench-style prompt (pp) and generation (tg) tokens/s of a model", nf_cmd_bench_e2e},
    {"serve", "load an OpenAI-compatible server: throughput, TTFT, TPOT, ITL (vllm bench serve's definitions)", nf_cmd_bench_serve},
    {"batch", "many sequences at once through the scheduler: aggregate t/s, step split, TTFT, KV pages", nf_cmd_bench_batch},
};

int nf_cmd_bench(int argc, char **argv)
{
    static const nf_dispatch d = {
        .prog = "ninfer bench",
        .noun = "benchmark",
        .usage = "usage: ninfer bench <benchmark> [options]\n",
        .heading = "benchmarks",
        .footer = "'ninfer bench <benchmark> --help' describes its options.",
        .table = benches,
        .n = sizeof benches / sizeof benches[0],
    };
    return nf_cli_dispatch(&d, argc, argv);
}
