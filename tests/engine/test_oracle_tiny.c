/* The CPU engine against transformers on the tiny random checkpoints of tests/fixtures/models
 * (written by tests/oracle/tiny_models.py: bf16-rounded weights, float32 reference logits).
 *
 * bf16 recipe (the artifact holds exactly the oracle's weights; ninfer computes in f32):
 *   - the logits of every prompt position within rel-L2 <= 1e-4 of transformers' (per position),
 *     prefilled in chunks of 16 tokens (several chunks, attention across chunk boundaries);
 *   - the 32-token greedy continuation identical, each step decoded one token at a time, its
 *     logits within rel-L2 <= 1e-4 of transformers' at that step.
 * Quantized recipes (q8q8, q4q6; on these 64-wide rows the K-quant codecs fall back to q8_0 where
 * a row is not a multiple of 256): the fast kernels (SIMD matvec for decode, dequantized f32 tiles
 * for prefill) against ninfer's reference path on the same artifact (every product = dequantize
 * the row to f32, then a double dot). Both see the same weights, so they differ only by f32
 * accumulation order: per dot at most ~n * 2^-24 relative to sum|w x| (n <= 128 here: 7.6e-6),
 * compounded over 2-3 layers of about six products and the attention softmax; rel-L2 <= 1e-4 per
 * position is ten times that worst case. The distance to transformers is printed for the note.
 *
 * The Gated DeltaNet hybrids (tests/oracle/hybrid_models.py: qwen3_next with the packed in_proj
 * dialect, qwen3_5_moe_text with the split one, and qwen3_5_moe, the same weights in the multimodal
 * layout; qwen3_next_moe, qwen3_next with every layer sparse, the HF side of test_gguf_hybrid) have a
 * 130-token prompt: three of transformers' 64-token GDN chunks, the last ragged; the
 * engine prefills it in forwards of 16 tokens, so the conv and delta-rule states carry across 9
 * forwards before the 32 decode steps. q4q5 joins their quantized recipes (their GDN projections
 * take the attention codecs).
 *
 * NVFP4 checkpoints of a hybrid (tests/oracle/hybrid_nvfp4_fixture.py: a Qwen3.5-MoE text model whose
 * routed and shared experts and gated-attention projections are NVFP4, its GDN projections, routers and
 * head bf16 by the ignore list; compressed-tensors NVFP4A16 and the same bytes as ModelOpt W4A4),
 * converted keeping their codecs: the reference is transformers in fp32 on compressed-tensors' own
 * dequantization of every NVFP4 matrix, so the engine (which decodes the same values exactly and
 * computes in f32; the CPU has no four-bit activations, W4A4 weights run W4A16) is held to the bf16
 * recipe's bounds: every position and greedy step within rel-L2 1e-4, greedy 32/32. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/npy.h"
#include "nf_test.h"
#include "common/engine_fixture.h"

static int load_npy(const char *dir, const char *name, nf_npy *a)
{
    char path[1100];
    snprintf(path, sizeof path, "%.1024s/%.64s", dir, name);
    nf_error e;
    if (nf_npy_read(path, a, &e)) {
        CHECK_MSG(0, "%s", e.msg);
        return 0;
    }
    return 1;
}

typedef struct refs {
    nf_npy prompt, logits, greedy, glogits;
} refs;

/* sqrt(32) / 254: the largest relative L2 change int8 quantisation makes to a 32-element block
 * (|x - d q| <= amax / 254 per element, ||x_b|| >= amax). */
#define A8_REL (5.656854 / 254)

static uint32_t artifact_layers(const char *path)
{
    nf_model *m;
    nf_error e;
    if (nf_model_load(path, &m, &e)) return 0;
    const uint32_t l = m->cfg.layers;
    nf_model_free(m);
    return l;
}

static void test_model(const char *name, const char *tmp)
{
    char dir[1024], refdir[1024], out[1200];
    snprintf(dir, sizeof dir, "%s/fixtures/models/%s", NF_TEST_DATA, name);
    /* the fused-key variant holds qwen3_moe's weights and uses its reference data */
    snprintf(refdir, sizeof refdir, "%s/fixtures/models/%s", NF_TEST_DATA,
             strcmp(name, "qwen3_moe_fused") == 0 ? "qwen3_moe"
             : strcmp(name, "qwen3_5_moe") == 0  ? "qwen3_5_moe_text"
                                                 : name);
    const int hybrid = strncmp(name, "qwen3_next", 10) == 0 || strncmp(name, "qwen3_5", 7) == 0;
    refs r;
    if (!load_npy(refdir, "ref_prompt.npy", &r.prompt) || !load_npy(refdir, "ref_logits.npy", &r.logits) ||
        !load_npy(refdir, "ref_greedy.npy", &r.greedy) || !load_npy(refdir, "ref_greedy_logits.npy", &r.glogits))
        return;
    const size_t P = r.prompt.count, G = r.greedy.count, V = r.logits.shape[1];
    float *pre = malloc(P * V * sizeof(float)), *gl = malloc(G * V * sizeof(float));
    float *pre_ref = malloc(P * V * sizeof(float)), *gl_ref = malloc(G * V * sizeof(float));
    int32_t *greedy = malloc(G * sizeof(int32_t)), *greedy_ref = malloc(G * sizeof(int32_t));
    int32_t *ids = malloc(P * sizeof(int32_t));
    for (size_t i = 0; i < P; i++) ids[i] = (int32_t)nf_npy_get_f64(&r.prompt, i);

    snprintf(out, sizeof out, "%s/%s-bf16.nf", tmp, name);
    if (fx_convert(dir, "bf16", out)) {
        fx_run_greedy(out, 0, 16, ids, P, G, pre, greedy, gl);
        double wp = fx_worst_rows(pre, r.logits.data, P, V), wg = fx_worst_rows(gl, r.glogits.data, G, V);
        size_t same = 0;
        while (same < G && greedy[same] == (int32_t)nf_npy_get_f64(&r.greedy, same)) same++;
        printf("%-16s bf16: prefill rel-L2 (worst position) %.2e, decode %.2e, greedy %zu/%zu tokens equal\n", name,
               wp, wg, same, G);
        CHECK_MSG(wp <= 1e-4, "%s bf16 prefill logits rel-L2 %.3g > 1e-4", name, wp);
        CHECK_MSG(wg <= 1e-4, "%s bf16 greedy-step logits rel-L2 %.3g > 1e-4", name, wg);
        CHECK_MSG(same == G, "%s bf16: greedy continuation differs from transformers at token %zu", name, same);
        remove(out);
    }
    const char *recipes[] = {"q8q8", "q4q6", "q4q5"};
    for (int k = 0; k < (hybrid ? 3 : 2); k++) {
        snprintf(out, sizeof out, "%s/%s-%s.nf", tmp, name, recipes[k]);
        if (!fx_convert(dir, recipes[k], out)) continue;
        fx_run_greedy(out, FX_FAST_F32, 16, ids, P, G, pre, greedy, gl);
        fx_run_greedy(out, FX_REFERENCE, 16, ids, P, G, pre_ref, greedy_ref, gl_ref);
        double wp = fx_worst_rows(pre, pre_ref, P, V), wg = fx_worst_rows(gl, gl_ref, G, V);
        size_t same = 0;
        while (same < G && greedy[same] == greedy_ref[same]) same++;
        printf("%-16s %s: fast vs reference path: prefill %.2e, decode %.2e, greedy %zu/%zu equal; vs transformers: "
               "prefill rel-L2 %.2e\n",
               name, recipes[k], wp, wg, same, G, fx_worst_rows(pre, r.logits.data, P, V));
        CHECK_MSG(wp <= 1e-4, "%s %s: prefill fast vs reference rel-L2 %.3g > 1e-4", name, recipes[k], wp);
        CHECK_MSG(wg <= 1e-4, "%s %s: decode fast vs reference rel-L2 %.3g > 1e-4", name, recipes[k], wg);
        /* int8 activations (the default fast path): see the header for the bound */
        fx_run_greedy(out, FX_FAST, 16, ids, P, G, pre, greedy, gl);
        const uint32_t layers = artifact_layers(out);
        const double a8_med = fx_median_rows(pre, pre_ref, P, V), a8_bound = sqrt(4.0 * layers + 1) * A8_REL;
        same = 0;
        while (same < G && greedy[same] == greedy_ref[same]) same++;
        printf("%-16s %s: int8 activations vs reference path: prefill median position %.2e (bound %.2e), worst %.2e, "
               "greedy %zu/%zu equal\n",
               name, recipes[k], a8_med, a8_bound, fx_worst_rows(pre, pre_ref, P, V), same, G);
        CHECK_MSG(a8_med <= a8_bound, "%s %s: int8-activation prefill median rel-L2 %.3g > %.3g", name, recipes[k], a8_med,
                  a8_bound);
        remove(out);
    }
    free(pre), free(gl), free(pre_ref), free(gl_ref), free(greedy), free(greedy_ref), free(ids);
    nf_npy_free(&r.prompt), nf_npy_free(&r.logits), nf_npy_free(&r.greedy), nf_npy_free(&r.glogits);
}

static void test_nvfp4_hybrid(const char *name, const char *tmp)
{
    char dir[1024], refdir[1024], out[1200];
    snprintf(dir, sizeof dir, "%s/fixtures/convert/%s", NF_TEST_DATA, name);
    snprintf(refdir, sizeof refdir, "%s/fixtures/convert/ct_nvfp4_hybrid", NF_TEST_DATA);
    snprintf(out, sizeof out, "%s/%s.nf", tmp, name);
    refs r;
    if (!load_npy(refdir, "ref_prompt.npy", &r.prompt) || !load_npy(refdir, "ref_logits.npy", &r.logits) ||
        !load_npy(refdir, "ref_greedy.npy", &r.greedy) || !load_npy(refdir, "ref_greedy_logits.npy", &r.glogits) ||
        !fx_convert(dir, NULL, out))
        return;
    const size_t P = r.prompt.count, G = r.greedy.count, V = r.logits.shape[1];
    float *pre = malloc(P * V * sizeof(float)), *gl = malloc(G * V * sizeof(float));
    int32_t *greedy = malloc(G * sizeof(int32_t)), *ids = malloc(P * sizeof(int32_t));
    for (size_t i = 0; i < P; i++) ids[i] = (int32_t)nf_npy_get_f64(&r.prompt, i);
    const int modes[2] = {FX_FAST, FX_REFERENCE};
    for (int k = 0; k < 2; k++) {
        fx_run_greedy(out, modes[k], 16, ids, P, G, pre, greedy, gl);
        const double wp = fx_worst_rows(pre, r.logits.data, P, V), wg = fx_worst_rows(gl, r.glogits.data, G, V);
        size_t same = 0;
        while (same < G && greedy[same] == (int32_t)nf_npy_get_f64(&r.greedy, same)) same++;
        printf("%-22s %s path: prefill rel-L2 (worst position) %.2e, decode %.2e, greedy %zu/%zu tokens equal\n", name,
               k ? "reference" : "fast", wp, wg, same, G);
        CHECK_MSG(wp <= 1e-4, "%s: prefill logits rel-L2 %.3g > 1e-4", name, wp);
        CHECK_MSG(wg <= 1e-4, "%s: greedy-step logits rel-L2 %.3g > 1e-4", name, wg);
        CHECK_MSG(same == G, "%s: greedy continuation differs from transformers at token %zu", name, same);
    }
    remove(out);
    free(pre), free(gl), free(greedy), free(ids);
    nf_npy_free(&r.prompt), nf_npy_free(&r.logits), nf_npy_free(&r.greedy), nf_npy_free(&r.glogits);
}

int main(void)
{
    char tmp[] = "/tmp/nf_oracle_tiny_XXXXXX";
    if (!mkdtemp(tmp)) {
        fprintf(stderr, "mkdtemp failed\n");
        return 1;
    }
    /* qwen2_moe_nobias: "qkv_bias": false, no q/k/v biases in the checkpoint */
    const char *models[] = {"qwen3_moe", "qwen3_moe_fused", "qwen2_moe",  "qwen2_moe_nobias",
                            "llama",     "qwen3_next",      "qwen3_5_moe_text", "qwen3_5_moe",
                            "qwen3_next_moe"};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) test_model(models[i], tmp);
    test_nvfp4_hybrid("ct_nvfp4_hybrid", tmp);
    test_nvfp4_hybrid("modelopt_nvfp4_hybrid", tmp);
    rmdir(tmp);
    return nf_test_report();
}
