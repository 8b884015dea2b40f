/* `ninfer eval -m model.nf --tokens 1,2,3 | --tokens-file F.npy [--logits-out L.npy]`: runs the ids
 * as one prompt and writes every position's logits as float32 [T][vocab] (numpy .npy), so any
 * outside tool can compare ninfer with another implementation. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timer.h"
#include "cli.h"
#include "commands.h"
#include "engine/engine.h"
#include "engine/npy.h"

/* "1,2,3" -> ids; returns 0 on a malformed list. */
static int parse_ids(const char *s, int32_t **ids, size_t *n)
{
    size_t cap = 16;
    *n = 0;
    *ids = malloc(cap * sizeof **ids);
    while (*ids && *s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > INT32_MAX || (*end && *end != ',')) return 0;
        if (*n == cap) {
            int32_t *p = realloc(*ids, (cap *= 2) * sizeof **ids);
            if (!p) return 0;
            *ids = p;
        }
        (*ids)[(*n)++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    return *ids && *n > 0;
}

static int ids_from_npy(const char *path, int32_t **ids, size_t *n)
{
    nf_npy a;
    nf_error e;
    if (nf_npy_read(path, &a, &e)) return nf_cli_fail("%s", e.msg);
    if (a.descr[1] != 'i' && a.descr[1] != 'u') {
        nf_npy_free(&a);
        return nf_cli_fail("%s: token ids must be an integer array, got dtype %s", path, a.descr);
    }
    *n = (size_t)a.count;
    *ids = malloc((*n ? *n : 1) * sizeof **ids);
    if (!*ids) {
        nf_npy_free(&a);
        return nf_cli_fail("out of memory");
    }
    for (size_t i = 0; i < *n; i++) {
        double v = nf_npy_get_f64(&a, i);
        if (v < 0 || v > INT32_MAX) {
            nf_npy_free(&a);
            return nf_cli_fail("%s: element %zu is %g, not a token id", path, i, v);
        }
        (*ids)[i] = (int32_t)v;
    }
    nf_npy_free(&a);
    if (!*n) return nf_cli_fail("%s holds no token ids", path);
    return 0;
}

int nf_cmd_eval(int argc, char **argv)
{
    const char *model_path = NULL, *tokens = NULL, *tokens_file = NULL, *out_path = NULL, *device = "cpu";
    long threads = 0, ctx = 0, chunk = 0;
    int reference = 0, kv_bf16 = 0;
    const nf_opt opts[] = {
        {"--model", 'm', NF_OPT_STRING, &model_path, "FILE", "the .nf model (required)", 0, 0},
        {"--tokens", 0, NF_OPT_STRING, &tokens, "IDS", "comma-separated token ids", 0, 0},
        {"--tokens-file", 0, NF_OPT_STRING, &tokens_file, "F.npy", "token ids as an integer .npy array", 0, 0},
        {"--logits-out", 'o', NF_OPT_STRING, &out_path, "L.npy", "write float32 [T][vocab] logits here", 0, 0},
        {"--threads", 't', NF_OPT_INT, &threads, "N", "worker threads (default: all CPUs)", 0, 1024},
        {"--ctx", 'c', NF_OPT_INT, &ctx, "N", "context length (default: the number of tokens)", 0, 1 << 24},
        {"--chunk", 0, NF_OPT_INT, &chunk, "N", "prefill chunk in tokens (default: the engine's, cpu 256, cuda 2048)", 0, 1 << 20},
        {"--kv-bf16", 0, NF_OPT_FLAG, &kv_bf16, NULL, "keep the KV cache in bf16 (default f32)", 0, 0},
        {"--reference", 0, NF_OPT_FLAG, &reference, NULL, "dequantize + double dot for every product (slow)", 0, 0},
        {"--device", 0, NF_OPT_STRING, &device, "DEV", "cpu (default: the reference), cuda or auto", 0, 0},
    };
    const nf_cmd_usage u = {
        .name = "eval",
        .synopsis = "-m MODEL (--tokens IDS | --tokens-file F.npy) [--logits-out L.npy]",
        .description = "Run the token ids as one prompt (on the CPU reference unless --device cuda|auto) and write the\n"
                       "logits of every position as a float32 [T][vocab] .npy file; prints the argmax of each\n"
                       "position when no output is given.",
        .opts = opts,
        .n_opts = NF_CLI_COUNT(opts),
    };
    int npos, r = nf_cli_parse(&u, argc, argv, NULL, &npos);
    if (r) return r == NF_CLI_HELP ? 0 : 2;
    if (!model_path || (!tokens == !tokens_file)) {
        fprintf(stderr, "ninfer: error: eval needs -m MODEL and exactly one of --tokens / --tokens-file\n");
        nf_cli_print_help(&u, stderr);
        return 2;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    if (tokens && !parse_ids(tokens, &ids, &n)) {
        free(ids);
        fprintf(stderr, "ninfer: error: --tokens '%s' is not a comma-separated list of ids\n", tokens);
        return 2;
    }
    if (tokens_file && (r = ids_from_npy(tokens_file, &ids, &n))) {
        free(ids);
        return r;
    }
    nf_error e;
    nf_model *m;
    nf_engine *eng = NULL;
    float *logits = NULL;
    int rc = 0;
    if (nf_model_load(model_path, &m, &e)) {
        free(ids);
        return nf_cli_fail("%s", e.msg);
    }
    nf_engine_opts eo = {.device = device, .threads = (int)threads, .ctx = (uint32_t)(ctx ? ctx : (long)n), .chunk = (uint32_t)chunk,
                         .kv_bf16 = kv_bf16, .reference = reference};
    const size_t V = m->cfg.vocab;
    logits = malloc(n * V * sizeof(float));
    if (!logits) rc = nf_cli_fail("out of memory for %zu x %zu logits", n, V);
    else if (nf_engine_create(m, &eo, &eng, &e)) rc = nf_cli_fail("%s", e.msg);
    uint64_t t0 = nf_time_ns();
    if (!rc && nf_engine_prefill(eng, ids, n, logits, &e)) rc = nf_cli_fail("%s", e.msg);
    double dt = (double)(nf_time_ns() - t0) * 1e-9;
    if (!rc) {
        fprintf(stderr, "eval: %zu tokens in %.3f s (%.1f tokens/s)\n", n, dt, (double)n / dt);
        uint64_t shape[2] = {n, V};
        if (out_path && nf_npy_write_f32(out_path, logits, shape, 2, &e)) rc = nf_cli_fail("%s", e.msg);
        if (!out_path)
            for (size_t t = 0; t < n; t++) {
                size_t best = 0;
                for (size_t v = 1; v < V; v++)
                    if (logits[t * V + v] > logits[t * V + best]) best = v;
                printf("%zu\t%d\t%zu\t%.6f\n", t, ids[t], best, (double)logits[t * V + best]);
            }
    }
    nf_engine_free(eng);
    nf_model_free(m);
    free(logits);
    free(ids);
    return rc;
}
