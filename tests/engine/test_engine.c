/* The engine on small random artifacts (tests/model/synth.h) of every architecture, bf16 and q8_0
 * weights: the same sequence through different paths must give the same logits.
 *   - threads 1 vs 3: bit-identical (each output element is computed by one worker in a fixed order);
 *   - prefill in one chunk vs chunks of 3 vs one token at a time (decode path: SIMD matvec instead of
 *     dequantized f32 tiles): rel-L2 <= 1e-5 (the same products summed in another f32 order: at most
 *     ~n 2^-24 = 1.5e-5 of sum|w x| per dot in the worst case, typically 100x less);
 *   - the fast path vs the reference path (dequantize + double dot): rel-L2 <= 1e-5, same argument;
 *   (the four checks above with f32 activations, no_a8; with the default int8 activations into the
 *   q8_0 products the threads check stays bit-identical, and chunks of 3 / one token at a time stay
 *   within 1e-5 of one chunk: every token of a product runs the same integer kernel whatever the
 *   chunk, only the f32 router and attention round differently, which can move an activation
 *   across a rounding boundary of its quantisation; against the reference path the bound is
 *   sqrt(4 L + 1) sqrt(32) / 254 (L = 2 layers: at most 4 quantised inputs per layer and the head,
 *   each moved by at most sqrt(32) / 254 in relative L2: codec/a8.h, tests/engine/test_oracle_tiny.c);
 *   - errors: a sequence past the context and a token id outside the vocabulary are refused with
 *     the numbers in the message, and the session is still usable afterwards. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <unistd.h>

#include "backend/cuda/cuda_backend.h"
#include "engine/engine.h"
#include "model/synth.h"
#include "nf_test.h"

enum { N = 21 };

static double rel_l2(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += pow((double)a[i] - b[i], 2), den += (double)b[i] * b[i];
    return sqrt(num / den);
}

/* logits [N][V] of ids through an engine with these options; by_token: decode one at a time */
static int a8; /* the fast path's activations: int8 (1) or f32 (0) */

static void run(const nf_model *m, int threads, uint32_t chunk, int reference, int by_token, const int32_t *ids, float *out)
{
    nf_engine_opts o = {.threads = threads, .ctx = 64, .chunk = chunk, .reference = reference == 1, .no_a8 = !a8};
    nf_engine *e;
    nf_error err;
    CHECK(nf_engine_create(m, &o, &e, &err) == NF_OK);
    if (by_token)
        for (int t = 0; t < N; t++) {
            CHECK(nf_engine_decode(e, ids[t], &err) == NF_OK);
            memcpy(out + (size_t)t * SY_V, e->logits, SY_V * sizeof(float));
        }
    else
        CHECK(nf_engine_prefill(e, ids, N, out, &err) == NF_OK);
    nf_engine_free(e);
}

/* trace_routing: each MoE layer's choice of the last forward, k distinct experts in range per token,
 * -1 rows on dense layers; the same choice whether the tokens come as one chunk or in pieces (the
 * trace follows the forward, not the session); refused without the option. */
static void routing(const nf_model *m)
{
    const nf_model_config *c = &m->cfg;
    const size_t L = c->layers, k = c->top_k, T = 5;
    nf_engine_opts o = {.threads = 2, .ctx = 32, .trace_routing = 1};
    nf_engine *e, *f;
    nf_error err;
    const int32_t ids[5] = {3, 1, 4, 1, 5};
    int32_t *r = malloc(L * T * k * sizeof *r), *r1 = malloc(L * k * sizeof *r1);
    CHECK(nf_engine_create(m, &o, &e, &err) == NF_OK && nf_engine_create(m, &o, &f, &err) == NF_OK);
    CHECK(nf_engine_prefill(e, ids, T, NULL, &err) == NF_OK && nf_engine_routing(e, r, &err) == NF_OK);
    int bad = 0, moe = 0;
    for (size_t l = 0; l < L; l++)
        for (size_t t = 0; t < T; t++) {
            const int32_t *x = r + (l * T + t) * k;
            moe += c->moe_layers[l];
            for (size_t i = 0; i < k; i++) {
                bad += c->moe_layers[l] ? x[i] < 0 || (uint32_t)x[i] >= c->experts : x[i] != -1;
                for (size_t j = 0; j < i; j++) bad += c->moe_layers[l] && x[j] == x[i];
            }
        }
    CHECK_MSG(bad == 0 && moe > 0, "routing trace: %d bad entries", bad);
    CHECK(nf_engine_prefill(f, ids, T - 1, NULL, &err) == NF_OK && nf_engine_decode(f, ids[T - 1], &err) == NF_OK);
    CHECK(nf_engine_routing(f, r1, &err) == NF_OK);
    for (size_t l = 0; l < L; l++) /* the last token's choice, decoded alone */
        CHECK(memcmp(r1 + l * k, r + (l * T + T - 1) * k, k * sizeof *r) == 0);
    nf_engine_free(e);
    nf_engine_free(f);
    o.trace_routing = 0;
    CHECK(nf_engine_create(m, &o, &e, &err) == NF_OK);
    CHECK(nf_engine_prefill(e, ids, T, NULL, &err) == NF_OK);
    CHECK(nf_engine_routing(e, r, &err) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(err.msg, "trace_routing");
    nf_engine_free(e);
    free(r), free(r1);
}

static void errors(const nf_model *m)
{
    nf_engine_opts o = {.threads = 2, .ctx = 16};
    nf_engine *e;
    nf_error err;
    CHECK(nf_engine_create(m, &o, &e, &err) == NF_OK);
    int32_t ids[20] = {0};
    CHECK(nf_engine_prefill(e, ids, 20, NULL, &err) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(err.msg, "20 tokens");
    CHECK_CONTAINS(err.msg, "context of 16 tokens");
    ids[3] = SY_V;
    CHECK(nf_engine_prefill(e, ids, 5, NULL, &err) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(err.msg, "token 3 is id 96, outside the vocabulary of 96");
    CHECK_EQ_INT(e->n_past, 0);
    ids[3] = 1;
    CHECK(nf_engine_prefill(e, ids, 16, NULL, &err) == NF_OK);
    CHECK(nf_engine_decode(e, 1, &err) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(err.msg, "after 16 already in the sequence");
    nf_engine_free(e);
    o.device = "tpu";
    CHECK(nf_engine_create(m, &o, &e, &err) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(err.msg, "unknown device 'tpu'");
    if (nf_cuda_device_count(NULL, 0) == 0) { /* no GPU: cuda is refused with the reason, auto is the CPU */
        o.device = "cuda";
        CHECK(nf_engine_create(m, &o, &e, &err) == NF_ERR_UNSUPPORTED);
        CHECK_CONTAINS(err.msg, "device 'cuda'");
        o.device = "auto";
        CHECK(nf_engine_create(m, &o, &e, &err) == NF_OK);
        CHECK(strcmp(e->ops->name, "cpu") == 0);
        nf_engine_free(e);
    }
}

int main(void)
{
    char path[] = "/tmp/nf_test_engine_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    const char *arch[] = {"llama", "qwen2_moe", "qwen3_moe"};
    const nf_codec_id codecs[] = {NF_CODEC_BF16, NF_CODEC_Q8_0};
    int32_t ids[N];
    for (int t = 0; t < N; t++) ids[t] = (t * 37 + 11) % SY_V;
    float *a = malloc(N * SY_V * sizeof(float)), *b = malloc(N * SY_V * sizeof(float));
    for (int i = 0; i < 3; i++)
        for (int c = 0; c < 2; c++) {
            synth_opts so = {.arch = arch[i], .codec = codecs[c], .seed = (uint32_t)(i * 2 + c)};
            CHECK(synth_write(path, &so));
            nf_model *m;
            nf_error err;
            if (nf_model_load(path, &m, &err)) {
                CHECK_MSG(0, "%s", err.msg);
                continue;
            }
            const char *cn = nf_codec_get(codecs[c])->name;
            for (a8 = 1; a8 >= 0; a8--) {
            run(m, 1, 64, 0, 0, ids, a);
            run(m, 3, 64, 0, 0, ids, b);
            CHECK_MSG(memcmp(a, b, N * SY_V * sizeof(float)) == 0, "%s %s: 1 and 3 threads differ", arch[i], cn);
            run(m, 2, 3, 0, 0, ids, b);
            double d = rel_l2(b, a, N * SY_V);
            CHECK_MSG(d <= 1e-5, "%s %s: chunks of 3 vs one chunk: rel-L2 %.3g", arch[i], cn, d);
            run(m, 2, 64, 0, 1, ids, b);
            d = rel_l2(b, a, N * SY_V);
            CHECK_MSG(d <= 1e-5, "%s %s: token by token vs one chunk: rel-L2 %.3g", arch[i], cn, d);
            run(m, 2, 64, 1, 0, ids, b);
            d = rel_l2(b, a, N * SY_V);
            const double bound = a8 && c == 1 ? sqrt(4.0 * SY_L + 1) * 5.656854 / 254 : 1e-5;
            CHECK_MSG(d <= bound, "%s %s%s: reference path vs fast: rel-L2 %.3g > %.3g", arch[i], cn,
                      a8 ? " (int8 activations)" : "", d, bound);
            if (a8 && c == 1) printf("%-10s %s: int8 activations vs reference path: rel-L2 %.2e (bound %.2e)\n", arch[i], cn, d, bound);
            }
            double mx = 0, sd = 0;
            for (int k = 0; k < N * SY_V; k++) mx = fmax(mx, fabs(a[k])), sd += a[k] * a[k];
            CHECK_MSG(mx > 0.5 && isfinite(sd), "%s %s: logits flat or not finite (max %g)", arch[i], cn, mx);
            if (c == 0) errors(m);
            if (c == 0 && m->cfg.experts) routing(m);
            nf_model_free(m);
        }
    unlink(path);
    free(a);
    free(b);
    return nf_test_report();
}
