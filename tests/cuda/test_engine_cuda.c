/* The GPU engine against the CPU engine on the tiny checkpoints of tests/fixtures/models, every
 * recipe, and on a synthetic model whose LM head streams (label cuda; exits 77 = skipped without a
 * GPU). Data dir: $NF_TEST_DATA, else the source tree's tests/.
 *
 * Logits bounds. Both engines read the same artifact and the CPU keeps its KV cache in bf16 as the
 * GPU does. The GPU additionally rounds to bf16 (unit roundoff u = 2^-9) the input of every
 * product (the normed residual before attention and before the MLP, the attention output, the
 * SwiGLU intermediate) and the sparse-MoE block's output: about R = 6 rounding sites per layer plus
 * the final norm, R = 19 for L <= 3 layers. Each perturbs its vector by at most u in relative L2;
 * independent roundings add like a random walk, sqrt(R) u = 8.5e-3, and a product passes a relative
 * perturbation on with a gain of about one. Head dims 64 and 128 take the tensor-core prefill
 * attention (T >= 16; here qwen3_moe_256's chunks), which also rounds q and the softmax weights P to
 * bf16 (attention.cu): q's rounding is one more site of the kind above; P's makes the output the
 * exact weighted mean of V under weights bf16(p) / sum bf16(p), the softmax of scores each moved by
 * at most 1.002 u, which moves the output by about u |o| (at most 2.01 u max |v| per element), the
 * size of the attention output's own rounding: R = 8 per layer, R = 25, sqrt(R) u = 9.8e-3. So the
 * MEDIAN position must be within 1.5e-2 (either count). A single position can exceed that where the
 * residual stream nearly cancels (x = a + b with |a + b| << |a|: the error is relative to |a|):
 * measured up to 6.9e-2 (qwen3_moe_256, position 13, with identical routing on both engines, with
 * the CUDA-core attention; sqrt(25 / 19) = 1.15 times that, 7.9e-2, is the estimate with q and P
 * rounded). EVERY position must be within 1e-1: wrong kernels (a position off by
 * one in the rope, a wrong cache row, a wrong divisor) give errors of order one. f32 accumulation
 * order differences (~1e-6) are far below both.
 *
 * int8 activations. By default the GPU quantises the bf16 input of every k-quant / q8_0 product at
 * T <= 16 to int8 per 32 elements (d = max|x| / 127, q = rint(x / d); gemv_a8.cu, exact on those
 * inputs: test_gemv_a8), and in the sparse-MoE block up to T = 512 (the mmq route, mmq.cu: the
 * same quantisation of the routed experts' input and intermediate, test_mmq). So the bounds above hold for the GPU run with `no_a8` (bf16 inputs), and the
 * default run is held to that one: within a block |x - d q| <= d / 2 = max|x| / 254 per element, so
 * the block (and so the vector) moves by at most sqrt(32) / 254 = 2.2e-2 in relative L2 per
 * quantised input. With A such inputs (counted from the model's codecs: the attention input, the
 * attention output, the MLP or routed-expert input, the dense MLP or routed-expert intermediate
 * (down_a8.cu), per layer, and the LM head's input) the same random-walk argument gives a median bound of sqrt(A) * 2.2e-2; every
 * position must be within 0.5, far below the order-one errors of a wrong kernel yet above the
 * cancellation gain seen in the bf16 comparison (8x the median) applied to an int8 median.
 *
 * Routing: a near-tie of two experts' router logits that the roundings tip selects different
 * experts (both engines are right); from the first position whose expert sets differ at some layer
 * (both engines trace their routing) the sequences legitimately differ and are only reported.
 *
 * Also: greedy continuations (32 tokens decoded one at a time after a 64-token prompt prefilled in
 * chunks of 16) of the bf16-activation run identical to the CPU's for >= 16 tokens with bf16 and q8q8
 * (printed for every recipe and run) unless the
 * routing differed first or the CPU's two best logits are closer than the engines' logits differ; a decode
 * step replayed from the captured graph gives the same bits as stream launches; sampling from the
 * device's top-k gives the same tokens as the host sampler over the full logits (same seed), and so
 * does sampling with penalties applied on the device (check_penalized_sampling, and through the
 * scheduler in batches of 3: check_penalized_batch); 100
 * sessions in one process leave no device memory behind. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/cuda_backend.h"
#include "engine/engine.h"
#include "engine/npy.h"
#include "engine/sampler.h"
#include "engine/sched.h"
#include "nf_test.h"
#include "common/engine_fixture.h"
#include "common/cuda_fixture.h"
#include "convert/synth.h"

enum { P = 64, G = 32, CHUNK = 16 };

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One engine's outputs: prefill logits [P][V], greedy ids [G], the logits each greedy id came from [G][V]. */
typedef struct run_out {
    float *pre, *gl;
    int32_t greedy[G];
    int32_t *route; /* [P + G][layers][top_k]: each position's expert ids per layer (-1: dense layer) */
} run_out;

static uint32_t top_k_of(const nf_model *m) { return m->cfg.top_k ? m->cfg.top_k : 1; }

/* Copies the last forward's routing ([layers][T][k]) to route rows pos0 .. pos0 + T - 1. */
static int keep_routing(nf_engine *eng, size_t pos0, size_t T, int32_t *route)
{
    const nf_model_config *c = &eng->model->cfg;
    if (!c->top_k) return 1;
    const size_t L = c->layers, k = c->top_k;
    int32_t *ids = malloc(L * T * k * sizeof *ids);
    nf_error e;
    int ok = ids && nf_engine_routing(eng, ids, &e) == NF_OK;
    for (size_t l = 0; ok && l < L; l++)
        for (size_t t = 0; t < T; t++) memcpy(route + ((pos0 + t) * L + l) * k, ids + (l * T + t) * k, k * 4);
    free(ids);
    return ok;
}

/* 1 on success; 0 on failure (a CHECK fails) or when the CUDA engine refuses a bank the operator
 * does not admit (a mixed bf16/quantized bank: tiny shared experts fall back to bf16), printed. */
static int run(const nf_model *m, const char *device, int no_graphs, int no_a8, const int32_t *prompt, run_out *o)
{
    nf_engine *eng;
    nf_error e;
    nf_engine_opts eo = {.device = device, .threads = 2, .ctx = P + G, .chunk = CHUNK, .kv_bf16 = 1,
                         .no_graphs = no_graphs, .no_a8 = no_a8, .trace_routing = 1};
    nf_status st = nf_engine_create(m, &eo, &eng, &e);
    if (st == NF_ERR_REFUSED && strstr(e.msg, "mixed")) {
        printf("  refused as the operator admits no such bank: %s\n", e.msg);
        return 0;
    }
    if (st) {
        CHECK_MSG(0, "%s engine: %s", device, e.msg);
        return 0;
    }
    const size_t V = m->cfg.vocab;
    int ok = 1;
    for (size_t p = 0; ok && p < P; p += CHUNK) /* one forward per call, so each chunk's routing is kept */
        ok = nf_engine_prefill(eng, prompt + p, CHUNK, o->pre + p * V, &e) == NF_OK && keep_routing(eng, p, CHUNK, o->route);
    for (size_t g = 0; ok && g < G; g++) {
        memcpy(o->gl + g * V, eng->logits, V * sizeof(float));
        o->greedy[g] = (int32_t)fx_argmax(eng->logits, V);
        if (g + 1 < G)
            ok = nf_engine_decode(eng, o->greedy[g], &e) == NF_OK && keep_routing(eng, P + g, 1, o->route);
    }
    CHECK_MSG(ok, "%s engine forward: %s", device, e.msg);
    nf_engine_free(eng);
    return ok;
}

/* Device top-k sampling against the host sampler over the fetched logits, 16 steps. */
static void check_sampling(const nf_model *m, const int32_t *prompt, const char *what)
{
    nf_engine *eng;
    nf_error e;
    nf_engine_opts eo = {.device = "cuda", .ctx = P + G, .chunk = CHUNK};
    if (nf_engine_create(m, &eo, &eng, &e)) return;
    nf_sampler_params sp = nf_sampler_defaults();
    sp.seed = 7;
    sp.temp = 1.5f; /* flat enough that the draw matters */
    nf_sampler *a, *b;
    nf_sampler_create(&sp, m->cfg.vocab, &a, &e);
    nf_sampler_create(&sp, m->cfg.vocab, &b, &e);
    int same = 0, ok = nf_engine_prefill(eng, prompt, 8, NULL, &e) == NF_OK;
    eng->defer_logits = 1;
    int32_t ta = prompt[8];
    for (int i = 0; ok && i < 16; i++) {
        ok = nf_engine_decode(eng, ta, &e) == NF_OK; /* logits stay on the device */
        if (ok) ok = nf_engine_next(eng, a, NULL, 0, &ta, &e) == NF_OK;
        const float *l = ok ? nf_engine_logits(eng, &e) : NULL;
        if (!l) break;
        same += nf_sampler_sample(b, l, NULL, 0) == ta;
    }
    printf("  %s: device top-k sampling = host sampling on %d/16 steps\n", what, same);
    CHECK_MSG(ok && same == 16, "%s: device top-k sampling differs from the host sampler (%d/16)", what, same);
    nf_sampler_free(a), nf_sampler_free(b);
    nf_engine_free(eng);
}

/* The repetition / presence / frequency rule on logits[V] over the window's counts, by hand. */
static void penalise_by_hand(const nf_sampler_params *p, const int32_t *hist, size_t n, float *l, size_t V)
{
    const size_t from = p->repeat_last_n > 0 && n > (size_t)p->repeat_last_n ? n - (size_t)p->repeat_last_n : 0;
    for (size_t i = from; p->repeat_last_n > 0 && i < n; i++) {
        int first = hist[i] >= 0 && (size_t)hist[i] < V;
        uint32_t c = 0;
        for (size_t j = from; j < n; j++) c += hist[j] == hist[i];
        for (size_t j = from; j < i; j++) first = first && hist[j] != hist[i];
        if (!first) continue;
        float x = l[hist[i]];
        x = x > 0 ? x / p->repeat_penalty : x * p->repeat_penalty;
        x -= p->frequency_penalty * (float)c;
        x -= p->presence_penalty;
        l[hist[i]] = x;
    }
}

/* Penalties applied on the device (nf_engine_next over the backend's penalize, then top-k) against
 * the host sampler over the raw logits, 16 decode steps each of three samplers: greedy with a
 * repetition penalty, sampled with all three (frequency 0.3: frequency * count is inexact, so a fused
 * multiply-subtract on either side would show), presence alone. Every step the same token, and the
 * device's penalised logits (read back after nf_engine_next) equal the raw ones penalised by hand, to
 * the bit; a second nf_engine_next on the same logits is refused (the penalties would apply twice). */
static void check_penalized_sampling(const nf_model *m, const int32_t *prompt, const char *what)
{
    const size_t V = m->cfg.vocab;
    nf_sampler_params sp[3] = {nf_sampler_defaults(), nf_sampler_defaults(), nf_sampler_defaults()};
    sp[0].temp = 0, sp[0].repeat_penalty = 1.3f;
    sp[1].temp = 1.5f, sp[1].seed = 3, sp[1].repeat_penalty = 1.2f, sp[1].presence_penalty = 0.5f;
    sp[1].frequency_penalty = 0.3f;
    sp[2].temp = 0, sp[2].presence_penalty = 0.7f, sp[2].repeat_last_n = 8;
    float *raw = malloc(V * sizeof *raw), *want = malloc(V * sizeof *want);
    for (int c = 0; raw && want && c < 3; c++) {
        nf_engine *eng;
        nf_error e;
        nf_engine_opts eo = {.device = "cuda", .ctx = P + G, .chunk = CHUNK};
        if (nf_engine_create(m, &eo, &eng, &e)) break;
        nf_sampler *a = NULL, *b = NULL;
        nf_sampler_create(&sp[c], (uint32_t)V, &a, &e);
        nf_sampler_create(&sp[c], (uint32_t)V, &b, &e);
        int32_t hist[P + G];
        size_t n = 16;
        memcpy(hist, prompt, n * sizeof *hist);
        hist[3] = hist[5] = hist[9] = hist[15]; /* repeats in the window */
        eng->defer_logits = 1;
        int ok = a && b && nf_engine_prefill(eng, hist, n, NULL, &e) == NF_OK, same = 0, exact = 0;
        for (int i = 0; ok && i < 16; i++) {
            int32_t tok = -1, again = -1;
            ok = eng->ops->logits(eng->state, raw, &e) == NF_OK && /* the device's logits stay as they are */
                 nf_engine_next(eng, a, hist, n, &tok, &e) == NF_OK;
            const float *pl = ok ? nf_engine_logits(eng, &e) : NULL;
            if (!pl) break;
            memcpy(want, raw, V * sizeof *want);
            penalise_by_hand(&sp[c], hist, n, want, V);
            exact += !memcmp(pl, want, V * sizeof *want);
            same += nf_sampler_sample(b, raw, hist, n) == tok;
            CHECK(nf_engine_next(eng, a, hist, n, &again, &e) == NF_ERR_INVALID_ARG);
            hist[n++] = tok;
            ok = nf_engine_decode(eng, tok, &e) == NF_OK;
        }
        printf("  %s, penalties %d: device-penalised sampling = host sampling on %d/16 steps, logits exact on %d/16\n",
               what, c, same, exact);
        CHECK_MSG(ok && same == 16 && exact == 16, "%s penalties %d: %d/16 tokens, %d/16 exact logits (%s)", what, c,
                  same, exact, ok ? "" : e.msg);
        nf_sampler_free(a), nf_sampler_free(b);
        nf_engine_free(eng);
    }
    free(raw), free(want);
}

/* Three sequences through the scheduler on the GPU (batches of up to 3: the penalize rows of a batch,
 * one sequence without penalties, so an empty list), with the backend's penalize and without it (the
 * penalised samplers then fetch the full logits and the host penalises): the same batches, so the
 * same forwards, and every token must be equal. */
static void run_sched(nf_engine *eng, int with_penalize, const int32_t *prompt, int32_t out[3][G / 2])
{
    const nf_backend_ops *ops = eng->ops;
    const nf_sched_backend be = {.state = eng->state, .forward = ops->forward, .logits = ops->logits, .topk = ops->topk,
                                 .copy_page = ops->copy_page, .penalize = with_penalize ? ops->penalize : NULL};
    nf_sched_opts so = {.vocab = eng->model->cfg.vocab, .ctx = eng->opts.ctx, .chunk = eng->opts.chunk,
                        .max_seqs = eng->opts.max_seqs, .page_tokens = eng->opts.page_tokens,
                        .kv_pages = eng->opts.kv_pages, .no_prefix_cache = 1};
    nf_sched *s = NULL;
    nf_error e;
    if (nf_sched_create(&be, &so, &s, &e)) {
        CHECK_MSG(0, "sched: %s", e.msg);
        return;
    }
    nf_sampler_params sp[3] = {nf_sampler_defaults(), nf_sampler_defaults(), nf_sampler_defaults()};
    sp[0].temp = 0, sp[0].repeat_penalty = 1.3f, sp[0].frequency_penalty = 0.3f;
    sp[1].temp = 1.5f, sp[1].seed = 5, sp[1].presence_penalty = 0.6f, sp[1].repeat_penalty = 0.9f;
    sp[2].temp = 1.2f, sp[2].seed = 6; /* no penalties */
    uint64_t id[3];
    for (int i = 0; i < 3; i++) {
        const nf_seq_params q = {.sampling = sp[i], .max_new = G / 2};
        CHECK(nf_sched_add(s, prompt + 4 * i, 12 + 5 * (size_t)i, &q, &id[i], &e) == NF_OK);
    }
    nf_sched_step_info info;
    for (int n = 0; !nf_sched_idle(s) && n < 200; n++)
        if (nf_sched_step(s, &info, &e)) {
            CHECK_MSG(0, "sched step: %s", e.msg);
            break;
        }
    for (int i = 0; i < 3; i++) {
        size_t np = 0, n = 0;
        const int32_t *t = nf_sched_tokens(s, id[i], &np, &n);
        CHECK(t && n == np + G / 2);
        if (t && n == np + G / 2) memcpy(out[i], t + np, G / 2 * sizeof *t);
    }
    nf_sched_free(s);
}

static void check_penalized_batch(const nf_model *m, const int32_t *prompt, const char *what)
{
    nf_engine *eng;
    nf_error e;
    nf_engine_opts eo = {.device = "cuda", .ctx = P + G, .chunk = CHUNK, .max_seqs = 3};
    if (nf_engine_create(m, &eo, &eng, &e)) return;
    int32_t dev[3][G / 2] = {{0}}, host[3][G / 2] = {{0}};
    run_sched(eng, 1, prompt, dev);
    run_sched(eng, 0, prompt, host);
    const int same = !memcmp(dev, host, sizeof dev);
    printf("  %s: scheduler with device penalties = host penalties: %s\n", what, same ? "yes" : "NO");
    CHECK_MSG(same, "%s: the scheduler's tokens with penalize differ from the host-penalised ones", what);
    nf_engine_free(eng);
}

/* The first position (prompt, then greedy steps: P + g) whose expert set differs between the two
 * engines at some layer; P + G when none. Sets, not orders: two near-equal logits may swap places
 * without changing the block's output beyond rounding. */
static size_t first_flip(const nf_model *m, const run_out *a, const run_out *b)
{
    const size_t L = m->cfg.layers, k = top_k_of(m);
    for (size_t p = 0; p < P + G; p++)
        for (size_t l = 0; l < L; l++) {
            const int32_t *x = a->route + (p * L + l) * k, *y = b->route + (p * L + l) * k;
            for (size_t i = 0; i < k; i++) {
                int found = 0;
                for (size_t j = 0; j < k; j++) found |= x[i] == y[j];
                if (!found) return p;
            }
        }
    return P + G;
}

/* A greedy choice either engine may make: the CPU's two best logits are closer than twice the largest
 * difference between the engines' logits at that step. */
static int logit_tie(const float *cpu, const float *gpu, size_t V)
{
    size_t a = 0, b = 1;
    if (cpu[b] > cpu[a]) a = 1, b = 0;
    double diff = 0;
    for (size_t v = 0; v < V; v++) {
        diff = fmax(diff, fabs((double)cpu[v] - gpu[v]));
        if (v < 2) continue;
        if (cpu[v] > cpu[a]) b = a, a = v;
        else if (cpu[v] > cpu[b]) b = v;
    }
    const double gap = (double)cpu[a] - cpu[b];
    printf("  greedy divergence: the CPU's top two logits differ by %.3g, the engines' logits by up to %.3g\n", gap, diff);
    return gap <= 2 * diff;
}

/* The bounds one comparison is held to (file header). */
typedef struct bounds {
    double median, each; /* rel-L2 of the median position and of every position (prefill and decode) */
    int greedy;          /* bf16 / q8q8: >= 16 identical greedy tokens (else reported only) */
} bounds;

/* `got` against `ref`. Positions before the first routing difference must be within the bounds; a
 * routing difference is a near-tie of two experts' router logits that the roundings tipped (both
 * runs are right): from there on the sequences legitimately differ and are only reported. Greedy
 * tokens must agree for 16 steps unless routing differed before the first disagreement. */
static void compare(const char *name, const char *recipe, const char *what, const nf_model *m, const run_out *ref,
                    const run_out *got, bounds b)
{
    const size_t V = m->cfg.vocab, flip = first_flip(m, ref, got);
    double wp = 0, wg = 0, err[P], sorted[P];
    size_t at = 0, n = 0;
    for (size_t t = 0; t < P; t++) {
        err[t] = fx_rel_l2(got->pre + t * V, ref->pre + t * V, V);
        if (t >= flip) continue;
        sorted[n++] = err[t];
        if (err[t] > wp) wp = err[t], at = t;
    }
    qsort(sorted, n, sizeof *sorted, cmp_double);
    const double median = n ? sorted[n / 2] : 0;
    if (getenv("NF_TEST_VERBOSE"))
        for (size_t t = 0; t < P; t++) printf("    position %zu: rel-L2 %.2e%s\n", t, err[t], t == flip ? " (routing differs)" : "");
    int same = 0;
    while (same < G && got->greedy[same] == ref->greedy[same]) same++;
    for (int t = 0; t < same && P + (size_t)t < flip; t++) wg = fmax(wg, fx_rel_l2(got->gl + t * V, ref->gl + t * V, V));
    char fl[48] = "none";
    if (flip < P + G) snprintf(fl, sizeof fl, flip < P ? "prompt position %zu" : "greedy step %zu", flip < P ? flip : flip - P);
    printf("%-14s %-5s %-17s: prefill rel-L2 median %.2e (bound %.2e), worst %.2e (position %zu), decode worst %.2e, "
           "greedy %d/%d equal, first routing difference: %s\n", name, recipe, what, median, b.median, wp, at, wg, same,
           G, fl);
    CHECK_MSG(median <= b.median, "%s %s %s: median prefill logits rel-L2 %.3g > %.3g", name, recipe, what, median,
              b.median);
    CHECK_MSG(wp <= b.each, "%s %s %s: prefill logits rel-L2 %.3g > %.3g at position %zu", name, recipe, what, wp,
              b.each, at);
    CHECK_MSG(wg <= b.each, "%s %s %s: decode logits rel-L2 %.3g > %.3g", name, recipe, what, wg, b.each);
    if (b.greedy && (!strcmp(recipe, "bf16") || !strcmp(recipe, "q8q8")))
        CHECK_MSG(same >= 16 || flip <= P + (size_t)same || logit_tie(ref->gl + same * V, got->gl + same * V, V),
                  "%s %s %s: greedy continuation diverges at token %d (< 16) with identical routing and no near-tie",
                  name, recipe, what, same);
}

/* Graph replay (g) against stream launches (s): the same bits. */
static void check_graph(const char *name, const char *recipe, size_t V, const run_out *g, const run_out *s)
{
    const int same = memcmp(g->gl, s->gl, G * V * 4) == 0 && memcmp(g->greedy, s->greedy, sizeof g->greedy) == 0 &&
                     memcmp(g->pre, s->pre, P * V * 4) == 0;
    printf("%-14s %-5s graph = stream: %s\n", name, recipe, same ? "yes" : "NO");
    CHECK_MSG(same, "%s %s: graph replay differs from stream execution", name, recipe);
}

/* The inputs the GPU quantises to int8 in a forward of <= 16 tokens (file header). */
static int a8_codec(const nf_tensor *t)
{
    const int c = t ? (int)t->desc.codec : -1;
    return c == NF_CODEC_Q4_K || c == NF_CODEC_Q5_K || c == NF_CODEC_Q6_K || c == NF_CODEC_Q8_0;
}
static unsigned a8_inputs(const nf_model *m)
{
    unsigned n = a8_codec(m->output);
    for (uint32_t l = 0; l < m->cfg.layers; l++) {
        const nf_model_layer *y = &m->layers[l];
        n += (a8_codec(y->attn_q) || a8_codec(y->attn_k) || a8_codec(y->attn_v)) + a8_codec(y->attn_output);
        n += y->is_moe ? a8_codec(y->ffn_gate_up_exps) + a8_codec(y->ffn_down_exps)
                       : (a8_codec(y->ffn_gate) || a8_codec(y->ffn_up)) + a8_codec(y->ffn_down);
    }
    return n;
}

/* The comparisons above on the artifact at `out` (removed at the end). */
static void check_artifact(const char *name, const char *recipe, const char *out)
{
    nf_model *m;
    nf_error e;
    if (nf_model_load(out, &m, &e)) {
        CHECK_MSG(0, "%s", e.msg);
        return;
    }
    const size_t V = m->cfg.vocab;
    int32_t prompt[P];
    for (int i = 0; i < P; i++) prompt[i] = (int32_t)((i * 7919u + 13u) % V);
    const size_t RK = (P + G) * m->cfg.layers * top_k_of(m);
    /* c: CPU with f32 activations (its default quantises k-quant / q8_0 inputs to int8 since docs/cpu.md,
     * which the bf16-act bound does not cover); x: GPU with bf16 activations; g, s: GPU as it runs by
     * default, graphs and stream */
    run_out r[4];
    for (int i = 0; i < 4; i++) r[i] = (run_out){malloc(P * V * 4), malloc(G * V * 4), {0}, calloc(RK, 4)};
    run_out *c = &r[0], *x = &r[1], *g = &r[2], *s = &r[3];
    if (run(m, "cpu", 0, 1, prompt, c) && run(m, "cuda", 0, 1, prompt, x) && run(m, "cuda", 0, 0, prompt, g) &&
        run(m, "cuda", 1, 0, prompt, s)) {
        compare(name, recipe, "bf16-act vs cpu", m, c, x, (bounds){1.5e-2, 1e-1, 1});
        const unsigned A = a8_inputs(m);
        if (A) compare(name, recipe, "int8-act vs bf16", m, x, g, (bounds){sqrt(A) * sqrt(32.0) / 254, 0.5, 0});
        else CHECK_MSG(!memcmp(x->pre, g->pre, P * V * 4), "%s %s: no int8 inputs, yet no_a8 changed the logits", name, recipe);
        check_graph(name, recipe, V, g, s);
        if (!strcmp(recipe, "q8q8")) {
            check_sampling(m, prompt, name);
            check_penalized_sampling(m, prompt, name);
            check_penalized_batch(m, prompt, name);
        }
    }
    for (int i = 0; i < 4; i++) free(r[i].route), free(r[i].pre), free(r[i].gl);
    nf_model_free(m);
    remove(out);
}

static void check_model(const char *name, const char *recipe, const char *tmp)
{
    char dir[1024], out[1200];
    snprintf(dir, sizeof dir, "%s/fixtures/models/%s", fx_data_dir(), name);
    snprintf(out, sizeof out, "%s/%s-%s.nf", tmp, name, recipe);
    if (fx_convert(dir, recipe, out)) check_artifact(name, recipe, out);
}

/* A GGUF in the import-only codecs (tests/fixtures/gguf/qwen3moe_lowbit.gguf: q2_k expert gate/up,
 * iq4_nl expert down, iq4_xs / q3_k attention, q3_k embedding, q6_k head), carried over as it is
 * (recipe source): the comparisons above, so the device's q2_k / q3_k / iq4 decoders in the dense
 * layers, the embedding and the sparse-MoE bank against the CPU engine. */
static void check_lowbit(const char *tmp)
{
    char src[1024], out[1200];
    snprintf(src, sizeof src, "%s/fixtures/gguf/qwen3moe_lowbit.gguf", fx_data_dir());
    snprintf(out, sizeof out, "%s/qwen3moe_lowbit-source.nf", tmp);
    if (fx_convert(src, "source", out)) check_artifact("qwen3moe_lowbit", "source", out);
}

/* A synthetic 2-layer model (synth's tiny geometry) with a 20 000-row bf16 LM head: 1250 tiles of 16
 * rows, more than one wave of the 4-warp tensor-core GEMV (132 SMs x at most 8), so the decoder's
 * head streams (gemv_stream.cu), which the fixtures' small vocabularies never reach. */
static void check_streamed_head(const char *tmp)
{
    char out[1200];
    snprintf(out, sizeof out, "%s/synth-tiny-bf16.nf", tmp);
    const nf_synth_opts o = {.geometry = "tiny", .recipe = "bf16", .seed = 1, .vocab = 20000, .quiet = 1};
    nf_synth_stats st;
    nf_error e;
    if (nf_synth_write(out, &o, &st, &e) != NF_OK) {
        CHECK_MSG(0, "synth: %s", e.msg);
        return;
    }
    check_artifact("synth-tiny", "bf16", out);
}

/* 100 sessions (create, prefill, two graph decode steps, free): device memory back where it was. A
 * leak of any per-session allocation (weights, KV cache, buffers: each >= 256 KiB here) would show
 * as >= 25 MiB over 100 sessions; 2 MiB of slack covers the driver's own bookkeeping. */
static void check_sessions(const char *tmp)
{
    char dir[1024], out[1200];
    snprintf(dir, sizeof dir, "%s/fixtures/models/qwen3_moe", fx_data_dir());
    snprintf(out, sizeof out, "%s/sessions.nf", tmp);
    nf_model *m;
    nf_error e;
    if (!fx_convert(dir, "q8q8", out) || nf_model_load(out, &m, &e)) return;
    size_t before = 0, after = 0, total;
    const int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int ok = 1;
    for (int i = 0; ok && i <= 100; i++) {
        if (i == 1) nf_cuda_mem_info(&before, &total); /* after one session: the context is up */
        nf_engine *eng;
        nf_engine_opts eo = {.device = "cuda", .ctx = 64, .chunk = CHUNK};
        ok = nf_engine_create(m, &eo, &eng, &e) == NF_OK;
        if (ok) ok = nf_engine_prefill(eng, ids, 8, NULL, &e) == NF_OK && nf_engine_decode(eng, 9, &e) == NF_OK &&
                     nf_engine_decode(eng, 10, &e) == NF_OK;
        if (eng) nf_engine_free(eng);
    }
    nf_cuda_mem_info(&after, &total);
    printf("100 sessions: device free memory %.1f MiB before, %.1f MiB after\n", before / 1048576.0, after / 1048576.0);
    CHECK_MSG(ok, "sessions: %s", e.msg);
    CHECK_MSG(after + (2u << 20) >= before, "100 sessions left %.1f MiB of device memory behind",
              (before - after) / 1048576.0);
    nf_model_free(m);
    remove(out);
}

int main(void)
{
    const int ready = fx_cuda_ready("qwen3_moe");
    if (ready >= 0) return ready;
    char tmp[] = "/tmp/nf_engine_cuda_XXXXXX";
    if (!mkdtemp(tmp)) return 1;
    /* nvfp4 needs 128-row expert shares: the 32-row tiny MoE banks refuse it */
    static const struct {
        const char *name;
        int nvfp4;
    } models[] = {{"qwen3_moe", 0}, {"qwen2_moe", 0}, {"qwen2_moe_nobias", 0}, {"llama", 1}, {"qwen3_moe_256", 1}};
    const char *recipes[] = {"bf16", "q8q8", "q4q6", "q4q5", "nvfp4"};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
        for (int r = 0; r < 5; r++)
            if (r < 4 || models[i].nvfp4) check_model(models[i].name, recipes[r], tmp);
    check_lowbit(tmp);
    check_streamed_head(tmp);
    check_sessions(tmp);
    rmdir(tmp);
    return nf_test_report();
}
