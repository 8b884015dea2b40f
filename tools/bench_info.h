/* What the end-to-end benchmarks (bench e2e, bench batch) print about the model and the device. */
#ifndef NF_TOOLS_BENCH_INFO_H
#define NF_TOOLS_BENCH_INFO_H

#include <stdint.h>
#include <stdio.h>

#include "engine/engine.h"

typedef struct nf_bench_info {
    char model[128], profile[160], device[192];
    uint64_t file_bytes, params;
    double gb_per_token; /* weights read per decoded token */
    int synthetic;
} nf_bench_info;

/* The model's name ("arch NL (file or synth geometry)"), size, parameters, codec profile (expert
 * banks, then the rest by bytes) and the engine's device ("cpu: <model name>", "cuda: <GPU ...>"). */
void nf_bench_model_info(const nf_model *m, const nf_engine *e, nf_bench_info *in);
/* A JSON string literal of s (quotes and backslashes escaped, control characters dropped). */
void nf_bench_json_str(FILE *f, const char *s);
/* "17.69 GiB", or MiB below one GiB. */
const char *nf_bench_size_str(uint64_t b, char *buf, size_t cap);

#endif
