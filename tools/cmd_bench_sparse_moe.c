/* `ninfer bench sparse-moe`: the operator benchmark (docs/bench.md). For each profile, routing
 * distribution and token count: the median, p10 and p90 of CUDA-event timings of one forward
 * (graph replay by default, L2 flushed before each repeat by default) on synthetic weights or one
 * layer of a model artifact (-m, --layer), the unique weight bytes the
 * routed experts make it read, GB/s and % of the DRAM read peak measured at start in the same run,
 * logical TFLOP/s and % of the cuBLAS bf16 GEMM rate measured at start, the arena bytes, and
 * optionally a null arm (the same row measured twice) and the peer arm (per-expert cuBLAS). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/sparse_moe/sparse_moe.h"
#include "cli.h"
#include "engine/moe_bank.h"
#include "codec/codec.h"
#include "commands.h"
#include "gpu_bench.h"
#include "moe_bench.h"

enum { MAX_T = 4096, MAX_PROFILES = 16, MAX_DISTS = 4 };

typedef struct opts {
    const char *codec, *geometry, *sweep, *tokens, *dist, *execution, *cache, *format, *out, *route, *model;
    long H, E, k, I, S, flush_mib, warmup, repeat, seed, chunk, layer, tile_height;
    int null_arm, peer, shared_f32;
} opts;

typedef struct row {
    const char *profile, *dist, *route;
    uint32_t T;
    double med, p10, p90, unique_mb, gbs, pct_dram, tflops, pct_gemm, null_delta, peer_us;
    size_t arena;
} row;

typedef struct moe_ctx {
    nf_sparse_moe *m;
    const uint16_t *x;
    uint16_t *out;
    void *ws;
    uint32_t T;
} moe_ctx;

static nf_status enqueue_moe(void *ctx, void *stream, nf_error *err)
{
    moe_ctx *c = ctx;
    return nf_sparse_moe_forward(c->m, c->x, c->T, c->out, c->ws, stream, err);
}

static void print_row(FILE *f, const char *fmt, const row *r, int first)
{
    if (strcmp(fmt, "csv") == 0) {
        if (first)
            fprintf(f, "profile,distribution,T,route,median_us,p10_us,p90_us,unique_MB,GBps,pct_dram,TFLOPs,pct_gemm,"
                       "arena_bytes,null_delta_pct,peer_us,peer_ratio\n");
        fprintf(f, "%s,%s,%u,%s,%.3f,%.3f,%.3f,%.3f,%.1f,%.1f,%.2f,%.1f,%zu,%.2f,%.3f,%.2f\n", r->profile, r->dist, r->T,
                r->route, r->med, r->p10, r->p90, r->unique_mb, r->gbs, r->pct_dram, r->tflops, r->pct_gemm, r->arena,
                r->null_delta, r->peer_us, r->peer_us > 0 ? r->peer_us / r->med : NAN);
    } else if (strcmp(fmt, "json") == 0) {
        fprintf(f,
                "%s{\"profile\":\"%s\",\"distribution\":\"%s\",\"T\":%u,\"route\":\"%s\",\"median_us\":%.3f,\"p10_us\":%.3f,"
                "\"p90_us\":%.3f,\"unique_MB\":%.3f,\"GBps\":%.1f,\"pct_dram\":%.1f,\"TFLOPs\":%.2f,\"pct_gemm\":%.1f,"
                "\"arena_bytes\":%zu,\"null_delta_pct\":%.2f,\"peer_us\":%.3f}",
                first ? "" : ",\n", r->profile, r->dist, r->T, r->route, r->med, r->p10, r->p90, r->unique_mb, r->gbs,
                r->pct_dram, r->tflops, r->pct_gemm, r->arena, isnan(r->null_delta) ? -1.0 : r->null_delta,
                r->peer_us > 0 ? r->peer_us : -1.0);
    } else {
        if (first)
            fprintf(f, "%-22s %-10s %5s %-11s %10s %10s %10s %9s %8s %6s %8s %6s %7s %9s\n", "profile", "dist", "T",
                    "route", "median_us", "p10_us", "p90_us", "uniq_MB", "GB/s", "%dram", "TFLOP/s", "%gemm", "null%",
                    "peer_x");
        fprintf(f, "%-22s %-10s %5u %-11s %10.3f %10.3f %10.3f %9.2f %8.1f %6.1f %8.2f %6.1f %7.2f %9.2f\n", r->profile,
                r->dist, r->T, r->route, r->med, r->p10, r->p90, r->unique_mb, r->gbs, r->pct_dram, r->tflops,
                r->pct_gemm, r->null_delta, r->peer_us > 0 ? r->peer_us / r->med : NAN);
    }
}

static nf_moe_matrix synth(int codec, uint32_t experts, uint32_t rows, uint32_t cols, uint32_t divisors, uint64_t seed,
                           void **keep)
{
    nf_moe_matrix m;
    memset(&m, 0, sizeof m);
    size_t bytes = 0;
    *keep = nf_bench_make_payload(codec, experts, rows, cols, codec == NF_CODEC_NVFP4 ? divisors : 1, seed, &bytes);
    m.codec = codec;
    m.data = *keep;
    m.experts = experts;
    m.rows = rows;
    m.cols = cols;
    m.divisors = codec == NF_CODEC_NVFP4 ? divisors : 1;
    return m;
}

/* Builds and binds a synthetic bank for profile p. keep[6] receives the host payloads. shared_a8: the
 * shared expert's matrices allow int8 activations (as the engine binds them). */
static nf_status bind_synthetic(const nf_moe_geometry *g, const nf_moe_profile *p, uint32_t chunk, uint64_t seed,
                                int shared_a8, nf_sparse_moe **m, size_t *ws, void **keep, nf_error *err)
{
    nf_moe_bank b;
    memset(&b, 0, sizeof b);
    b.hidden = g->H, b.experts = g->E, b.top_k = g->k, b.inter = g->I, b.norm_topk = 1;
    b.router = synth(NF_CODEC_BF16, 1, g->E, g->H, 1, seed + 1, &keep[0]);
    /* nvfp4: gate and up of each expert quantized apart (2E divisors), down per expert (E) */
    b.gate_up = synth(p->gu, g->E, 2 * g->I, g->H, 2 * g->E, seed + 2, &keep[1]);
    b.down = synth(p->dn, g->E, g->H, g->I, g->E, seed + 3, &keep[2]);
    b.gate_up.allow_a8 = b.down.allow_a8 = 1; /* as the engine binds it */
    b.shared_gate_up.codec = b.shared_down.codec = b.shared_gate.codec = -1;
    if (g->S && p->sgu >= 0) {
        b.shared_inter = g->S;
        b.shared_gate_up = synth(p->sgu, 1, 2 * g->S, g->H, 2, seed + 4, &keep[3]);
        b.shared_down = synth(p->sdn, 1, g->H, g->S, 1, seed + 5, &keep[4]);
        b.shared_gate = synth(NF_CODEC_BF16, 1, 1, g->H, 1, seed + 6, &keep[5]);
        b.shared_gate_up.allow_a8 = b.shared_down.allow_a8 = shared_a8;
    }
    for (int i = 0; i < 6; i++)
        if ((i < 3 || b.shared_inter) && !keep[i]) return nf_error_set(err, NF_ERR_NOMEM, "bench: cannot build synthetic weights");
    return nf_sparse_moe_bind(&b, chunk, m, ws, err);
}

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int nf_cmd_bench_sparse_moe(int argc, char **argv)
{
    opts o = {.codec = "q4_k+q6_k", .geometry = "qwen3-30b-a3b", .dist = "trace-like", .execution = "graph",
              .cache = "cold", .format = "table", .route = "auto", .flush_mib = 256, .warmup = 5, .repeat = 20, .seed = 1, .chunk = 4096,
              .S = -1 /* --shared-I not given: the geometry's */};
    const nf_opt table[] = {
        {"--model", 'm', NF_OPT_STRING, &o.model, "FILE", "take the bank from this artifact (with --layer) instead of synthetic weights", 0, 0},
        {"--layer", 0, NF_OPT_INT, &o.layer, "N", "the MoE layer of --model (default 0)", 0, 1 << 20},
        {"--codec", 0, NF_OPT_STRING, &o.codec, "P", "profiles, comma-separated (q4_k+q6_k, q8_0+q8_0, q3_k+q5_k, iq4_xs+q6_k, bf16, nvfp4, ...[/shared]) or all (the sweep's eight: q4_k+q6_k, q4_k+q5_k, q4_k+q4_k, q5_k+q6_k, q6_k+q6_k, q8_0+q8_0, bf16, nvfp4)", 0, 0},
        {"--geometry", 0, NF_OPT_STRING, &o.geometry, "G", "qwen3-30b-a3b (default), qwen3.5-35b-a3b, qwen2-57b-a14b, tiny", 0, 0},
        {"-H", 0, NF_OPT_INT, &o.H, "N", "hidden size (overrides the geometry)", 1, 65536},
        {"-E", 0, NF_OPT_INT, &o.E, "N", "experts", 1, 512},
        {"-k", 0, NF_OPT_INT, &o.k, "N", "experts per token", 1, 16},
        {"-I", 0, NF_OPT_INT, &o.I, "N", "expert intermediate size", 1, 65536},
        {"--shared-I", 0, NF_OPT_INT, &o.S, "N", "shared expert intermediate size (0: none)", 0, 65536},
        {"--sweep", 0, NF_OPT_STRING, &o.sweep, "A:B", "every T from A to B", 0, 0},
        {"--tokens", 0, NF_OPT_STRING, &o.tokens, "LIST", "token counts, e.g. 1,2,4,8 (default 1,8,64,512,4096)", 0, 0},
        {"--distribution", 0, NF_OPT_STRING, &o.dist, "D", "trace-like (default), same, uniform, file:PATH; comma list", 0, 0},
        {"--execution", 0, NF_OPT_STRING, &o.execution, "X", "graph (default) or stream", 0, 0},
        {"--cache", 0, NF_OPT_STRING, &o.cache, "C", "cold (default: L2 flushed before each repeat by a read) or warm", 0, 0},
        {"--flush-mib", 0, NF_OPT_INT, &o.flush_mib, "N", "L2 flush buffer, read before each repeat (default 256)", 1, 65536},
        {"--warmup", 0, NF_OPT_INT, &o.warmup, "N", "untimed runs first (default 5)", 0, 10000},
        {"--repeat", 0, NF_OPT_INT, &o.repeat, "N", "timed runs (default 20)", 1, 100000},
        {"--null-arm", 0, NF_OPT_FLAG, &o.null_arm, NULL, "measure every row twice and report |delta|", 0, 0},
        {"--peer", 0, NF_OPT_FLAG, &o.peer, NULL, "also time per-expert cuBLAS bf16 GEMMs (the naive way)", 0, 0},
        {"--shared-f32", 0, NF_OPT_FLAG, &o.shared_f32, NULL, "the shared expert keeps f32 activations (its allow_a8 off; the engine allows int8)", 0, 0},
        {"--chunk", 0, NF_OPT_INT, &o.chunk, "N", "the operator's bound chunk (default 4096)", 1, 65536},
        {"--route", 0, NF_OPT_STRING, &o.route, "R", "auto (the profile's thresholds), no-mmq (them without the mmq route), small (decode/small-token up to 16), prefill or mmq (up to 1024)", 0, 0},
        {"--tile-height", 0, NF_OPT_INT, &o.tile_height, "N", "prefill tile height 32, 64 or 128 (default 0: chosen per T)", 0, 128},
        {"--seed", 0, NF_OPT_INT, &o.seed, "N", "weights and routing seed (default 1)", 0, 0},
        {"--format", 0, NF_OPT_STRING, &o.format, "F", "table (default), csv, json", 0, 0},
        {"--out", 0, NF_OPT_STRING, &o.out, "FILE", "write the rows there (stdout otherwise)", 0, 0},
    };
    const nf_cmd_usage u = {
        .name = "bench sparse-moe",
        .synopsis = "[--codec P|all] [--geometry G] [--sweep A:B | --tokens LIST] [--distribution D] [options]",
        .description = "Times the CUDA sparse-MoE operator on synthetic weights with routing from a chosen\n"
                       "distribution, against ceilings measured in the same run (docs/bench.md).",
        .opts = table, .n_opts = NF_CLI_COUNT(table), .min_pos = 0, .max_pos = 0};
    char *pos[1];
    int npos;
    int r = nf_cli_parse(&u, argc, argv, pos, &npos);
    if (r) return r == NF_CLI_HELP ? 0 : 2;

    nf_error err;
    nf_moe_geometry g;
    const nf_moe_geometry *gp = nf_bench_geometry(o.geometry);
    if (!gp) return nf_cli_fail("--geometry: unknown '%s' (qwen3-30b-a3b, qwen3.5-35b-a3b, qwen2-57b-a14b, tiny)", o.geometry) * 2;
    g = *gp;
    if (o.H) g.H = (uint32_t)o.H;
    if (o.E) g.E = (uint32_t)o.E;
    if (o.k) g.k = (uint32_t)o.k;
    if (o.I) g.I = (uint32_t)o.I;
    /* --shared-I, 0 included, replaces the geometry's; a geometry changed by -H/-E/-k/-I has none unless given */
    if (o.S >= 0) g.S = (uint32_t)o.S;
    else if (o.H || o.E || o.k || o.I) g.S = 0;
    if (g.k > g.E) return nf_cli_fail("-k %u exceeds -E %u", g.k, g.E) * 2;
    if (strcmp(o.execution, "graph") && strcmp(o.execution, "stream"))
        return nf_cli_fail("--execution: '%s' is not graph or stream", o.execution) * 2;
    if (strcmp(o.cache, "cold") && strcmp(o.cache, "warm")) return nf_cli_fail("--cache: '%s' is not cold or warm", o.cache) * 2;
    if (o.tile_height && o.tile_height != 32 && o.tile_height != 64 && o.tile_height != 128)
        return nf_cli_fail("--tile-height: %ld is not 32, 64 or 128 (or 0: chosen per T)", o.tile_height) * 2;
    if (strcmp(o.route, "auto") && strcmp(o.route, "no-mmq") && strcmp(o.route, "small") && strcmp(o.route, "prefill") &&
        strcmp(o.route, "mmq"))
        return nf_cli_fail("--route: '%s' is not auto, no-mmq, small, prefill or mmq", o.route) * 2;
    if (strcmp(o.format, "table") && strcmp(o.format, "csv") && strcmp(o.format, "json"))
        return nf_cli_fail("--format: '%s' is not table, csv or json", o.format) * 2;

    nf_moe_profile profiles[MAX_PROFILES];
    int nprof = 0;
    nf_model *model = NULL;
    nf_moe_bank real;
    if (o.model) { /* a real layer: its geometry and codecs replace --geometry and --codec */
        if (nf_model_load(o.model, &model, &err) != NF_OK) return nf_cli_fail("%s", err.msg);
        if (nf_moe_bank_of_layer(model, (uint32_t)o.layer, &real, &err) != NF_OK) {
            nf_model_free(model);
            return nf_cli_fail("%s: %s", o.model, err.msg);
        }
        real.gate_up.allow_a8 = real.down.allow_a8 = 1; /* as the engine binds it */
        real.shared_gate_up.allow_a8 = real.shared_down.allow_a8 = !o.shared_f32;
        g = (nf_moe_geometry){o.model, real.hidden, real.experts, real.top_k, real.inter, real.shared_inter};
        profiles[0] = (nf_moe_profile){.gu = real.gate_up.codec, .dn = real.down.codec,
                                       .sgu = real.shared_gate_up.codec, .sdn = real.shared_down.codec};
        snprintf(profiles[0].name, sizeof profiles[0].name, "layer %ld", o.layer);
        nprof = 1;
    } else if (strcmp(o.codec, "all") == 0) {
        nprof = nf_bench_all_profiles(g.S != 0, profiles, MAX_PROFILES);
    } else {
        char buf[512];
        snprintf(buf, sizeof buf, "%s", o.codec);
        for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
            if (nprof == MAX_PROFILES) return nf_cli_fail("--codec: at most %d profiles", MAX_PROFILES) * 2;
            if (nf_bench_parse_profile(tok, g.S != 0, &profiles[nprof], &err) != NF_OK) return nf_cli_fail("%s", err.msg) * 2;
            nprof++;
        }
    }
    static uint32_t Ts[1 << 16];
    int nT = 0;
    if (o.sweep && nf_bench_parse_tokens(o.sweep, 1, Ts, &nT, 1 << 16, &err) != NF_OK) return nf_cli_fail("%s", err.msg) * 2;
    if (o.tokens && nf_bench_parse_tokens(o.tokens, 0, Ts, &nT, 1 << 16, &err) != NF_OK) return nf_cli_fail("%s", err.msg) * 2;
    if (nT == 0) nf_bench_parse_tokens("1,8,64,512,4096", 0, Ts, &nT, 1 << 16, &err);
    nf_moe_dist dists[MAX_DISTS];
    int ndist = 0;
    {
        char buf[1024];
        snprintf(buf, sizeof buf, "%s", o.dist);
        for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
            if (ndist == MAX_DISTS) return nf_cli_fail("--distribution: at most %d", MAX_DISTS) * 2;
            if (nf_bench_parse_dist(tok, g.E, g.k, &dists[ndist], &err) != NF_OK) return nf_cli_fail("%s", err.msg) * 2;
            ndist++;
        }
    }

    char why[256];
    if (nf_gpu_bench_devices(why, sizeof why) == 0) {
        fprintf(stderr, "ninfer bench sparse-moe: error: needs a CUDA GPU, and none is visible (%s)\n", why);
        return 2;
    }
    nf_gpu_bench *gb;
    if (nf_gpu_bench_create((size_t)o.flush_mib << 20, &gb, &err) != NF_OK) return nf_cli_fail("%s", err.msg);
    FILE *out = o.out ? fopen(o.out, "w") : stdout;
    if (!out) return nf_cli_fail("--out %s: cannot open", o.out);

    uint32_t maxT = 0;
    for (int i = 0; i < nT; i++) maxT = Ts[i] > maxT ? Ts[i] : maxT;
    const uint32_t chunk = maxT < (uint32_t)o.chunk ? maxT : (uint32_t)o.chunk;
    const int graph = strcmp(o.execution, "graph") == 0, cold = strcmp(o.cache, "cold") == 0;

    double dram = nf_gpu_bench_dram_read(gb, (size_t)2 << 30, 10);
    char gwhy[256] = "";
    double gemm = nf_gpu_bench_gemm_peak(gb, 8192, 10, gwhy, sizeof gwhy);
    double res = nf_gpu_bench_event_resolution_us(gb);
    fprintf(stderr, "device: %s\n", nf_gpu_bench_device_name(gb));
    fprintf(stderr, "geometry: H %u, E %u, top-%u, I %u, shared I %u; chunk %u; %s, %s L2 (flush %ld MiB), warmup %ld, "
                    "repeat %ld, seed %ld\n",
            g.H, g.E, g.k, g.I, g.S, chunk, o.execution, o.cache, o.flush_mib, o.warmup, o.repeat, o.seed);
    fprintf(stderr, "ceilings (this run): DRAM read %.1f GB/s (2 GiB streaming read, median of 10); bf16 GEMM %s",
            dram, gemm > 0 ? "" : "unavailable: ");
    if (gemm > 0) fprintf(stderr, "%.1f TFLOP/s (cuBLAS 8192^3, median of 10)", gemm);
    else fprintf(stderr, "%s", gwhy);
    fprintf(stderr, "; event resolution %.3f us\n", res);

    /* device buffers shared by every profile: input, output, forced routing */
    uint16_t *dx = nf_gpu_alloc((size_t)maxT * g.H * 2, &err), *dout = nf_gpu_alloc((size_t)maxT * g.H * 2, &err);
    int32_t *dids = nf_gpu_alloc((size_t)chunk * g.k * 4, &err);
    int32_t *ids = malloc((size_t)chunk * g.k * 4);
    double *samples = malloc(sizeof(double) * (size_t)o.repeat), *nulls = malloc(sizeof(double) * 65536 * 4);
    if (!dx || !dout || !dids || !ids || !samples || !nulls) return nf_cli_fail("bench: %s", err.msg);
    nf_gpu_fill_bf16(dx, (size_t)maxT * g.H, 7, 1.0f);

    nf_gpu_peer *peer = NULL;
    double *peer_us = NULL;
    if (o.peer) {
        if (nf_gpu_peer_create(gb, g.H, g.E, g.k, g.I, maxT, &peer, &err) != NF_OK) {
            fprintf(stderr, "ninfer: warn: peer arm off: %s\n", err.msg);
            peer = NULL;
        } else {
            /* the peer does not depend on the profile: time it once per (distribution, T) */
            peer_us = calloc((size_t)ndist * nT, sizeof(double));
            int32_t *pid = malloc((size_t)maxT * g.k * 4);
            for (int d = 0; d < ndist && pid; d++)
                for (int i = 0; i < nT; i++) {
                    nf_bench_route(&dists[d], Ts[i], g.E, g.k, (uint64_t)o.seed, 0, pid);
                    if (nf_gpu_peer_prepare(peer, pid, Ts[i], dx, &err) != NF_OK ||
                        nf_gpu_bench_time(gb, nf_gpu_peer_enqueue, peer, graph, cold, (int)o.warmup, (int)o.repeat,
                                          samples, &err) != NF_OK) {
                        fprintf(stderr, "ninfer: warn: peer arm T=%u: %s\n", Ts[i], err.msg);
                        continue;
                    }
                    peer_us[d * nT + i] = nf_bench_quantile(samples, (int)o.repeat, 0.5);
                }
            free(pid);
        }
    }

    int first = 1, nnull = 0, rc = 0;
    if (strcmp(o.format, "json") == 0) fprintf(out, "[\n");
    for (int pi = 0; pi < nprof && rc == 0; pi++) {
        void *keep[6] = {0};
        nf_sparse_moe *m = NULL;
        size_t ws_bytes = 0;
        nf_status bst = model ? nf_sparse_moe_bind(&real, chunk, &m, &ws_bytes, &err)
                              : bind_synthetic(&g, &profiles[pi], chunk, (uint64_t)o.seed, !o.shared_f32, &m, &ws_bytes, keep, &err);
        if (bst != NF_OK) {
            fprintf(stderr, "ninfer: error: %s: %s\n", profiles[pi].name, err.msg);
            rc = 1;
        }
        for (int i = 0; i < 6; i++) free(keep[i]);
        if (rc) break;
        void *ws = nf_gpu_alloc(ws_bytes, &err);
        if (!ws) {
            rc = nf_cli_fail("%s", err.msg);
            break;
        }
        fprintf(stderr, "profile %s: weights %.1f MB on device, arena %zu bytes at T=1, %zu at T=%u\n",
                nf_sparse_moe_profile(m), nf_sparse_moe_weight_bytes(m) / 1e6, nf_sparse_moe_workspace_bytes(m, 1),
                ws_bytes, chunk);
        nf_sparse_moe_force_routing(m, dids);
        if (strcmp(o.route, "small") == 0) nf_sparse_moe_set_thresholds(m, 1, 16); /* the frontier sweep's arms */
        if (strcmp(o.route, "prefill") == 0 || strcmp(o.route, "mmq") == 0) nf_sparse_moe_set_thresholds(m, 0, 0);
        /* the routes before mmq existed (the A arm); mmq: every T up to its limit where the bank has it */
        if (strcmp(o.route, "auto") != 0) nf_sparse_moe_set_mmq_max(m, strcmp(o.route, "mmq") == 0 ? 1024 : 0);
        nf_sparse_moe_set_tile_height(m, (uint32_t)o.tile_height);
        for (int d = 0; d < ndist && rc == 0; d++)
            for (int i = 0; i < nT && rc == 0; i++) {
                const uint32_t T = Ts[i], slice = T < chunk ? T : chunk;
                nf_bench_route(&dists[d], slice, g.E, g.k, (uint64_t)o.seed, 0, ids);
                nf_gpu_upload(dids, ids, (size_t)slice * g.k * 4, &err);
                moe_ctx c = {m, dx, dout, ws, T};
                row rw = {.profile = profiles[pi].name, .dist = nf_bench_dist_name(&dists[d]), .T = T,
                          .route = nf_moe_route_name(nf_sparse_moe_route(m, slice)), .null_delta = NAN};
                if (nf_gpu_bench_time(gb, enqueue_moe, &c, graph, cold, (int)o.warmup, (int)o.repeat, samples, &err) !=
                    NF_OK) {
                    rc = nf_cli_fail("%s T=%u: %s", profiles[pi].name, T, err.msg);
                    break;
                }
                rw.med = nf_bench_quantile(samples, (int)o.repeat, 0.5);
                rw.p10 = nf_bench_quantile(samples, (int)o.repeat, 0.1);
                rw.p90 = nf_bench_quantile(samples, (int)o.repeat, 0.9);
                if (o.null_arm &&
                    nf_gpu_bench_time(gb, enqueue_moe, &c, graph, cold, (int)o.warmup, (int)o.repeat, samples, &err) ==
                        NF_OK) {
                    double again = nf_bench_quantile(samples, (int)o.repeat, 0.5);
                    rw.null_delta = 100.0 * fabs(again - rw.med) / rw.med;
                    if (nnull < 65536 * 4) nulls[nnull++] = rw.null_delta;
                }
                /* slices beyond the first re-read the same experts: bytes scale with the slices */
                const double slices = ceil((double)T / slice);
                rw.unique_mb = nf_bench_unique_bytes(&g, &profiles[pi], ids, slice) * slices / 1e6;
                rw.gbs = rw.unique_mb * 1e6 / (rw.med * 1e-6) / 1e9;
                rw.pct_dram = 100.0 * rw.gbs / dram;
                rw.tflops = nf_bench_flops(&g, T) / (rw.med * 1e-6) / 1e12;
                rw.pct_gemm = gemm > 0 ? 100.0 * rw.tflops / gemm : NAN;
                rw.arena = nf_sparse_moe_workspace_bytes(m, slice);
                rw.peer_us = peer_us ? peer_us[d * nT + i] : 0;
                print_row(out, o.format, &rw, first);
                first = 0;
                fflush(out);
            }
        nf_gpu_free(ws);
        nf_sparse_moe_free(m);
    }
    if (strcmp(o.format, "json") == 0) fprintf(out, "\n]\n");
    if (nnull) {
        qsort(nulls, (size_t)nnull, sizeof *nulls, cmp_dbl);
        fprintf(stderr, "null arm over %d rows: |delta| p50 %.2f %%, p90 %.2f %%, max %.2f %%\n", nnull,
                nulls[nnull / 2], nulls[(int)(0.9 * (nnull - 1))], nulls[nnull - 1]);
    }
    if (out != stdout) fclose(out);
    for (int d = 0; d < ndist; d++) nf_bench_dist_free(&dists[d]);
    nf_model_free(model);
    nf_gpu_peer_destroy(peer);
    free(peer_us);
    nf_gpu_free(dx);
    nf_gpu_free(dout);
    nf_gpu_free(dids);
    free(ids);
    free(samples);
    free(nulls);
    nf_gpu_bench_destroy(gb);
    return rc;
}
