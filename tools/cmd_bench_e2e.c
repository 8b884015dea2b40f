/* `ninfer bench e2e -m model.nf -p 512 -n 128 -r 5`: llama-bench-style end-to-end speed of a model.
 * pp<P>: a prompt of P pseudo-random ids prefilled into an empty context; tg<N>: N tokens decoded one
 * at a time from an empty context, each the argmax of the previous step's logits (picked on the device
 * when the backend keeps logits there). Each test runs
 * --warmup times untimed, then -r times; tokens/s is reported as mean +- sample sd, with the device,
 * the profile (codecs of the expert banks and of the rest, by bytes) and the model's size.
 *
 * The bench knows nothing about devices: --device goes to nf_engine_opts.device and the engine picks
 * the backend. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timer.h"
#include "bench_info.h"
#include "gpu_bench.h"
#include "cli.h"
#include "commands.h"
#include "engine/engine.h"
#include "engine/sampler.h"

typedef struct result {
    char test[32];
    size_t tokens;
    double mean, sd;
    double *samples; /* [reps] tokens/s */
} result;


static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* One timed repetition: tokens/s, or a negative value on error (err filled). */
static double run_pp(nf_engine *e, const int32_t *ids, size_t n, nf_error *err)
{
    nf_engine_reset(e);
    uint64_t t0 = nf_time_ns();
    if (nf_engine_prefill(e, ids, n, NULL, err)) return -1;
    return (double)n / ((double)(nf_time_ns() - t0) * 1e-9);
}

/* Greedy decoding as `ninfer run --temp 0` does it: the logits stay on the device, the pick crosses. */
static double run_tg(nf_engine *e, nf_sampler *greedy, int32_t first, size_t n, nf_error *err)
{
    nf_engine_reset(e);
    int32_t tok = first;
    e->defer_logits = 1;
    uint64_t t0 = nf_time_ns();
    for (size_t i = 0; i < n; i++)
        if (nf_engine_decode(e, tok, err) || nf_engine_next(e, greedy, NULL, 0, &tok, err)) return -1;
    e->defer_logits = 0;
    return (double)n / ((double)(nf_time_ns() - t0) * 1e-9);
}

static void stats(result *r, size_t reps)
{
    double s = 0, q = 0;
    for (size_t i = 0; i < reps; i++) s += r->samples[i];
    r->mean = s / (double)reps;
    for (size_t i = 0; i < reps; i++) q += (r->samples[i] - r->mean) * (r->samples[i] - r->mean);
    r->sd = reps > 1 ? sqrt(q / (double)(reps - 1)) : 0.0;
}

static void print_results(const char *fmt, const nf_bench_info *in, const result *r, size_t nr, size_t reps, int threads)
{
    if (strcmp(fmt, "table") == 0) {
        char sz[32];
        nf_bench_size_str(in->file_bytes, sz, sizeof sz);
        printf("device: %s, %d threads | model: %s, %.3f B parameters, %.4f GB of weights per decoded token\n",
               in->device, threads, sz, (double)in->params * 1e-9, in->gb_per_token);
        if (in->synthetic)
            printf("note: synthetic model (random weights): random routers spread tokens near-uniformly over the "
                   "experts, unlike a trained model\n");
        printf("| model | size | params | profile | device | threads | test | t/s |\n");
        printf("| --- | ---: | ---: | --- | --- | ---: | ---: | ---: |\n");
        for (size_t i = 0; i < nr; i++)
            printf("| %s | %s | %.3f B | %s | %.24s | %d | %s | %.2f ± %.2f |\n", in->model, sz,
                   (double)in->params * 1e-9, in->profile, in->device, threads, r[i].test, r[i].mean, r[i].sd);
        return;
    }
    if (strcmp(fmt, "csv") == 0) {
        printf("model,file_bytes,params,profile,device,threads,test,n_tokens,reps,mean_tps,sd_tps,gb_per_token,synthetic,"
               "samples_tps\n");
        for (size_t i = 0; i < nr; i++) {
            printf("\"%s\",%llu,%llu,\"%s\",\"%s\",%d,%s,%zu,%zu,%.4f,%.4f,%.6f,%d,", in->model,
                   (unsigned long long)in->file_bytes, (unsigned long long)in->params, in->profile, in->device, threads,
                   r[i].test, r[i].tokens, reps, r[i].mean, r[i].sd, in->gb_per_token, in->synthetic);
            for (size_t k = 0; k < reps; k++) printf("%s%.4f", k ? ";" : "", r[i].samples[k]);
            printf("\n");
        }
        return;
    }
    printf("[\n");
    for (size_t i = 0; i < nr; i++) {
        printf("  {\"model\": ");
        nf_bench_json_str(stdout, in->model);
        printf(", \"file_bytes\": %llu, \"params\": %llu, \"profile\": ", (unsigned long long)in->file_bytes,
               (unsigned long long)in->params);
        nf_bench_json_str(stdout, in->profile);
        printf(", \"device\": ");
        nf_bench_json_str(stdout, in->device);
        printf(", \"threads\": %d, \"test\": \"%s\", \"n_tokens\": %zu, \"reps\": %zu, \"mean_tps\": %.4f, "
               "\"sd_tps\": %.4f, \"gb_per_token\": %.6f, \"synthetic\": %s, \"samples_tps\": [",
               threads, r[i].test, r[i].tokens, reps, r[i].mean, r[i].sd, in->gb_per_token,
               in->synthetic ? "true" : "false");
        for (size_t k = 0; k < reps; k++) printf("%s%.4f", k ? ", " : "", r[i].samples[k]);
        printf("]}%s\n", i + 1 < nr ? "," : "");
    }
    printf("]\n");
}

/* tg against the bandwidth bound: the weight bytes a decoded token reads over the DRAM read peak
 * measured now, so the figure is a share of this device's ceiling. */
static void print_bound(const nf_bench_info *in, const result *tg)
{
    const double peak = nf_gpu_bench_read_peak();
    if (!(peak > 0)) return;
    const double bound = peak / in->gb_per_token;
    printf("%s: %.1f tokens/s x %.4f GB = %.0f GB/s = %.1f%% of the %.0f GB/s measured DRAM read peak "
           "(bandwidth bound %.0f tokens/s; KV bytes not counted)\n",
           tg->test, tg->mean, in->gb_per_token, tg->mean * in->gb_per_token, 100 * tg->mean / bound, peak, bound);
}

/* Runs warm-ups and reps of one test into r; 0 or 1 (error printed). */
static int measure(nf_engine *e, int pp, const int32_t *ids, size_t n, long warmup, size_t reps, result *r)
{
    nf_error err;
    nf_sampler_params gp = nf_sampler_defaults();
    gp.temp = 0;
    nf_sampler *greedy = NULL;
    if (nf_sampler_create(&gp, e->model->cfg.vocab, &greedy, &err)) return nf_cli_fail("%s", err.msg);
    snprintf(r->test, sizeof r->test, "%s%zu", pp ? "pp" : "tg", n);
    r->tokens = n;
    r->samples = calloc(reps, sizeof *r->samples);
    int rc = r->samples ? 0 : nf_cli_fail("out of memory");
    for (long i = 0; !rc && i < warmup + (long)reps; i++) {
        double tps = pp ? run_pp(e, ids, n, &err) : run_tg(e, greedy, ids[0], n, &err);
        if (tps < 0) rc = nf_cli_fail("bench e2e: %s: %s", r->test, err.msg);
        else if (i >= warmup) r->samples[i - warmup] = tps;
    }
    nf_sampler_free(greedy);
    if (!rc) stats(r, reps);
    return rc;
}

int nf_cmd_bench_e2e(int argc, char **argv)
{
    const char *model_path = NULL, *device = "auto", *format = "table";
    long n_prompt = 512, n_gen = 128, reps = 5, warmup = 1, threads = 0, chunk = 0, seed = 0;
    int kv_bf16 = 0, no_graphs = 0;
    const nf_opt opts[] = {
        {"--model", 'm', NF_OPT_STRING, &model_path, "FILE", "the .nf model (required)", 0, 0},
        {"--n-prompt", 'p', NF_OPT_INT, &n_prompt, "N", "prompt tokens of the pp test; 0 = no pp test (default 512)", 0, 1 << 20},
        {"--n-gen", 'n', NF_OPT_INT, &n_gen, "N", "generated tokens of the tg test; 0 = no tg test (default 128)", 0, 1 << 20},
        {"--repetitions", 'r', NF_OPT_INT, &reps, "N", "timed repetitions of each test (default 5)", 1, 10000},
        {"--warmup", 0, NF_OPT_INT, &warmup, "N", "untimed runs before the timed ones (default 1)", 0, 1000},
        {"--device", 0, NF_OPT_STRING, &device, "DEV", "cpu, cuda or auto (default: cuda when a GPU is visible)", 0, 0},
        {"--threads", 't', NF_OPT_INT, &threads, "N", "CPU worker threads (default: all CPUs)", 0, 4096},
        {"--chunk", 0, NF_OPT_INT, &chunk, "N", "prefill chunk in tokens (default: the engine's: cpu 256, cuda 2048)", 0, 1 << 20},
        {"--kv-bf16", 0, NF_OPT_FLAG, &kv_bf16, NULL, "keep the KV cache in bf16 (default f32)", 0, 0},
        {"--no-graphs", 0, NF_OPT_FLAG, &no_graphs, NULL, "CUDA: decode steps as plain launches, not a replayed graph (for profilers; slower)", 0, 0},
        {"--seed", 's', NF_OPT_INT, &seed, "S", "seed of the prompt's pseudo-random ids (default 0)", 0, 9.0e15},
        {"--format", 'o', NF_OPT_STRING, &format, "F", "table (default), csv or json, on stdout", 0, 0},
    };
    const nf_cmd_usage u = {
        "bench e2e", "-m MODEL [-p 512] [-n 128] [-r 5] [--device auto] [--threads N] [--format table|csv|json]",
        "llama-bench-style prompt processing (pp: -p pseudo-random ids into an empty context) and text\n"
        "generation (tg: -n tokens decoded one by one from an empty context, greedy) tokens/s, mean +- sd\n"
        "over -r repetitions after --warmup untimed runs, with the device, the model's profile (codecs of\n"
        "the expert banks and of the rest) and size.",
        opts, NF_CLI_COUNT(opts), 0, 0};
    int npos = 0;
    int r = nf_cli_parse(&u, argc, argv, NULL, &npos);
    if (r) return r == NF_CLI_HELP ? 0 : 2;
    if (!model_path) {
        fprintf(stderr, "ninfer: error: bench e2e needs -m MODEL\n");
        nf_cli_print_help(&u, stderr);
        return 2;
    }
    if (strcmp(format, "table") && strcmp(format, "csv") && strcmp(format, "json")) {
        fprintf(stderr, "ninfer: error: --format '%s' is not table, csv or json\n", format);
        return 2;
    }
    if (!n_prompt && !n_gen) {
        fprintf(stderr, "ninfer: error: -p 0 and -n 0 leave nothing to measure\n");
        return 2;
    }
    nf_error err;
    nf_model *m;
    if (nf_model_load(model_path, &m, &err)) return nf_cli_fail("%s", err.msg);
    const size_t ctx = (size_t)(n_prompt > n_gen ? n_prompt : n_gen);
    nf_engine_opts eo = {.device = device, .threads = (int)threads, .ctx = (uint32_t)ctx, .chunk = (uint32_t)chunk,
                         .kv_bf16 = kv_bf16, .no_graphs = no_graphs};
    nf_engine *e = NULL;
    int32_t *ids = malloc(ctx * sizeof *ids);
    result res[2] = {0};
    size_t nr = 0;
    int rc = 0;
    if (!ids) rc = nf_cli_fail("out of memory");
    else if (nf_engine_create(m, &eo, &e, &err)) rc = nf_cli_fail("%s", err.msg);
    uint64_t s = (uint64_t)seed;
    for (size_t i = 0; !rc && i < ctx; i++) ids[i] = (int32_t)(splitmix(&s) % m->cfg.vocab);
    if (!rc && n_prompt) rc = measure(e, 1, ids, (size_t)n_prompt, warmup, (size_t)reps, &res[nr++]);
    if (!rc && n_gen) rc = measure(e, 0, ids, (size_t)n_gen, warmup, (size_t)reps, &res[nr++]);
    if (!rc) {
        nf_bench_info in;
        nf_bench_model_info(m, e, &in);
        print_results(format, &in, res, nr, (size_t)reps, e->opts.threads);
        if (n_gen && !strcmp(format, "table") && !strcmp(e->ops->name, "cuda")) print_bound(&in, &res[nr - 1]);
    }
    for (size_t i = 0; i < 2; i++) free(res[i].samples);
    free(ids);
    nf_engine_free(e);
    nf_model_free(m);
    return rc;
}
