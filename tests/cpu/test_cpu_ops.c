/* CPU ops against naive double references written here from the formulas (HF modeling code):
 * gemm for every codec on the decode, prefill and reference paths, thread-count independence,
 * RMSNorm, SwiGLU, softmax, RoPE (default/linear/llama3 tables, rotation), GQA attention over f32
 * and bf16 caches, the router (ties, renormalisation) and the whole sparse-MoE block with a shared
 * expert. Tolerances: an f32 dot of n terms has error <= ~n * 2^-24 * sum|w x| in the worst case;
 * the SIMD kernels split it over 8..16 lanes, so we allow 4e-6 * sum|w x| + 1e-30 for n <= 512
 * (a quarter of the worst case, 20x the typical), and the reference path (double dot) 1e-6 relative.
 * These run with f32 activations (nf_cpu_set_a8 off). With int8 activations (the default) the
 * q8_0 / k-quant products must equal, bit for bit, the codec's integer kernel (token by token up to
 * NF_CPU_STEP_MAX tokens) or its repacked tile (more, where the ISA has one; codec/a8.h) run directly
 * on the quantised rows,
 * whatever the threads, row sub-view and batch (jobs sharing an input, which is quantised once; a
 * job's segments); the kernels' accuracy is test_codec_a8's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_internal.h"
#include "common/enc_weights.h"
#include "nf_test.h"

/* max over outputs of |y - ref| / (sum|w x|) */
static double gemm_err(const enc *e, const float *x, size_t n, const float *y, size_t r0)
{
    double worst = 0;
    const uint32_t cols = e->w.cols;
    for (size_t t = 0; t < n; t++)
        for (uint32_t r = 0; r < e->w.rows; r++) {
            double s = 0, a = 0;
            for (uint32_t i = 0; i < cols; i++) {
                double p = (double)e->deq[(r0 + r) * cols + i] * x[t * cols + i];
                s += p;
                a += fabs(p);
            }
            double d = fabs(y[t * e->w.rows + r] - s) / (a + 1e-30);
            if (d > worst) worst = d;
        }
    return worst;
}

/* The integer kernel run directly: y[t][r] for rows r0.. of e over n tokens of x. */
static void a8_direct(const enc *e, const float *x, size_t n, uint32_t r0, uint32_t rows, float *y)
{
    const uint32_t cols = e->w.cols;
    const size_t rb = nf_a8_row_bytes(cols);
    uint8_t *xa = malloc(n * rb);
    for (size_t t = 0; t < n; t++) nf_a8_quantize_row(x + t * cols, xa + t * rb, cols, nf_isa_selected());
    const nf_a8_tile_fn tile = nf_codec_a8_tile(e->w.codec, nf_isa_selected());
    const uint8_t *w = e->w.data + (size_t)r0 * e->w.row_bytes;
    const nf_a8_gemm_fn fn = nf_codec_a8_kernel(e->w.codec, nf_isa_selected());
    if (n > NF_CPU_STEP_MAX && tile) { /* many tokens: the repacked tile, 16 rows at a time (the gemm's row blocks) */
        void *scratch = malloc(nf_a8_tile_scratch(cols));
        for (uint32_t r = 0; r < rows; r += 16)
            tile(w + (size_t)r * e->w.row_bytes, e->w.row_bytes, rows - r < 16 ? rows - r : 16, xa, rb, n, y + r, rows,
                 cols, scratch, NULL); /* AMX without xt: the AVX-512 VNNI tile, whose bits the gemm's AMX tile
                                         * (reading xt) must give */
        free(scratch);
    } else if (n > NF_CPU_STEP_MAX) {
        fn(w, e->w.row_bytes, rows, xa, rb, n, y, rows, cols);
    } else { /* a few (a speculative verification): token by token, as decoding them */
        for (size_t t = 0; t < n; t++) fn(w, e->w.row_bytes, rows, xa + t * rb, rb, 1, y + t * rows, rows, cols);
    }
    free(xa);
}

static void test_gemm_a8(nf_cpu *c1, nf_cpu *c3)
{
    const nf_codec_id ids[] = {NF_CODEC_Q8_0, NF_CODEC_Q4_K, NF_CODEC_Q5_K, NF_CODEC_Q6_K};
    const uint32_t rows = 100, cols = 512;
    float *x = malloc(17 * cols * sizeof(float)), *y = malloc(17 * rows * sizeof(float)),
          *ye = malloc(17 * rows * sizeof(float)), *y2 = malloc(17 * rows * sizeof(float));
    for (size_t i = 0; i < 17 * cols; i++) x[i] = frand();
    nf_cpu_set_a8(c1, 1), nf_cpu_set_a8(c3, 1);
    enc e[4];
    for (size_t k = 0; k < 4; k++) {
        encode(&e[k], ids[k], rows, cols, 1);
        const size_t ns[] = {1, 3, 17};
        for (size_t j = 0; j < 3; j++) {
            a8_direct(&e[k], x, ns[j], 0, rows, ye);
            nf_cpu_gemm(c1, &e[k].w, x, cols, y, rows, ns[j]);
            CHECK_MSG(memcmp(y, ye, ns[j] * rows * sizeof(float)) == 0, "%s n=%zu: int8 gemm differs from its kernel",
                      e[k].w.codec->name, ns[j]);
            nf_cpu_gemm(c3, &e[k].w, x, cols, y, rows, ns[j]);
            CHECK_MSG(memcmp(y, ye, ns[j] * rows * sizeof(float)) == 0, "%s n=%zu: int8 gemm, 3 threads",
                      e[k].w.codec->name, ns[j]);
        }
        nf_cpu_weight sub = nf_cpu_weight_rows(&e[k].w, 37, 40);
        nf_cpu_gemm(c3, &sub, x, cols, y, 40, 3);
        a8_direct(&e[k], x, 3, 37, 40, ye);
        CHECK_MSG(memcmp(y, ye, 3 * 40 * sizeof(float)) == 0, "%s: int8 gemm on a sub-view", e[k].w.codec->name);
    }
    /* one batch: q8_0 and q4_k on the same 5 tokens (one quantisation), q6_k on other rows of x in
     * two segments, q5_k on one token, f32 beside them: each equal to its product alone */
    enc f;
    encode(&f, NF_CODEC_F32, rows, cols, 1);
    const uint32_t seg[3] = {0, 1, 4};
    nf_cpu_gemm_job jobs[5] = {
        {e[0].w, x, cols, y, rows, 5, NULL, 0, NULL},
        {e[1].w, x, cols, y + 5 * rows, rows, 5, NULL, 0, NULL},
        {e[3].w, x + 7 * cols, cols, y + 10 * rows, rows, 4, seg, 2, NULL},
        {e[2].w, x + 3 * cols, cols, y + 14 * rows, rows, 1, NULL, 0, NULL},
        {f.w, x, cols, y + 15 * rows, rows, 2, NULL, 0, NULL},
    };
    nf_cpu_gemm_batch(c3, jobs, 5);
    for (int j = 0; j < 5; j++) {
        nf_cpu_gemm_job alone = jobs[j];
        alone.y = y2;
        nf_cpu_gemm_batch(c1, &alone, 1);
        CHECK_MSG(memcmp(jobs[j].y, y2, jobs[j].n * rows * sizeof(float)) == 0, "batch job %d (%s) differs from alone", j,
                  jobs[j].w.codec->name);
    }
    for (size_t k = 0; k < 4; k++) enc_free(&e[k]);
    enc_free(&f);
    nf_cpu_set_a8(c1, 0), nf_cpu_set_a8(c3, 0);
    free(x), free(y), free(ye), free(y2);
}

static void test_gemm(nf_cpu *c1, nf_cpu *c3)
{
    const nf_codec_id ids[] = {NF_CODEC_F32, NF_CODEC_F16, NF_CODEC_BF16, NF_CODEC_Q8_0,
                               NF_CODEC_Q4_K, NF_CODEC_Q5_K, NF_CODEC_Q6_K, NF_CODEC_NVFP4,
                               NF_CODEC_Q2_K, NF_CODEC_Q3_K, NF_CODEC_IQ4_XS, NF_CODEC_IQ4_NL};
    const size_t ns[] = {1, 3, 17};
    const uint32_t rows = 256, cols = 512; /* nvfp4 with 2 divisors: 128-row shares */
    float *x = malloc(17 * cols * sizeof(float)), *y1 = malloc(17 * rows * sizeof(float)),
          *y3 = malloc(17 * rows * sizeof(float));
    for (size_t i = 0; i < 17 * cols; i++) x[i] = frand();
    for (size_t k = 0; k < sizeof ids / sizeof ids[0]; k++) {
        enc e;
        encode(&e, ids[k], rows, cols, ids[k] == NF_CODEC_NVFP4 ? 2 : 1);
        for (size_t j = 0; j < 3; j++) {
            size_t n = ns[j];
            nf_cpu_gemm(c1, &e.w, x, cols, y1, rows, n);
            nf_cpu_gemm(c3, &e.w, x, cols, y3, rows, n);
            double err = gemm_err(&e, x, n, y1, 0);
            CHECK_MSG(err < 4e-6, "%s n=%zu: error %.3g of sum|wx|", e.w.codec->name, n, err);
            CHECK_MSG(memcmp(y1, y3, n * rows * sizeof(float)) == 0, "%s n=%zu: 1 and 3 threads differ",
                      e.w.codec->name, n);
            nf_cpu_set_reference(c3, 1);
            nf_cpu_gemm(c3, &e.w, x, cols, y3, rows, n);
            nf_cpu_set_reference(c3, 0);
            err = gemm_err(&e, x, n, y3, 0);
            CHECK_MSG(err < 1e-7, "%s n=%zu reference path: error %.3g", e.w.codec->name, n, err);
        }
        /* a row sub-view (an expert of a bank): rows 160..199 cross into the second nvfp4 divisor */
        nf_cpu_weight sub = nf_cpu_weight_rows(&e.w, 160, 40);
        enc es = e;
        es.w = sub;
        nf_cpu_gemm(c3, &sub, x, cols, y1, 40, 3);
        double err = gemm_err(&es, x, 3, y1, 160);
        CHECK_MSG(err < 4e-6, "%s sub-view: error %.3g", e.w.codec->name, err);
        enc_free(&e);
    }
    free(x);
    free(y1);
    free(y3);
}

/* Ragged shapes for the prefill tile (4 rows x 3 tokens of 8-float vectors): row counts that leave
 * 1-3 rows over, token counts that leave 1-2 over, and row lengths with a tail past the last full
 * 8-float vector (for the codecs whose block allows it). */
/* Segments (a batch of sequences): one job over 16 tokens cut into segments of 1, 3, 1, 11 equals,
 * bit for bit, each segment run as a product of its own (the kernel follows the segment's length:
 * matvec token by token up to NF_CPU_STEP_MAX, the tile for more), on 1 and 3 threads. */
static void test_gemm_segments(nf_cpu *c1, nf_cpu *c3)
{
    const nf_codec_id ids[] = {NF_CODEC_F32, NF_CODEC_BF16, NF_CODEC_Q8_0, NF_CODEC_Q4_K, NF_CODEC_Q5_K, NF_CODEC_Q6_K, NF_CODEC_NVFP4};
    const uint32_t rows = 40, cols = 256, seg[5] = {0, 1, 4, 5, 16};
    float x[16 * 256], yb[16 * 40], ys[16 * 40];
    for (size_t i = 0; i < 16 * cols; i++) x[i] = frand();
    for (size_t k = 0; k < sizeof ids / sizeof ids[0]; k++) {
        enc e;
        encode(&e, ids[k], rows, cols, 1);
        /* f32 and int8 activations (the tile of the last segment, 11 tokens from t0 = 5: the AMX tile
         * reads its tokens from the batch's regrouped rows at that offset) */
        for (int th = 0; th < 4; th++) {
            nf_cpu *c = th & 1 ? c3 : c1;
            nf_cpu_set_a8(c, th >= 2);
            const nf_cpu_gemm_job j = {e.w, x, cols, yb, rows, 16, seg, 4, NULL};
            nf_cpu_gemm_batch(c, &j, 1);
            for (int g = 0; g < 4; g++)
                nf_cpu_gemm(c, &e.w, x + seg[g] * cols, cols, ys + seg[g] * rows, rows, seg[g + 1] - seg[g]);
            CHECK_MSG(memcmp(yb, ys, sizeof yb) == 0, "%s: segments differ from separate products (threads %d, a8 %d)",
                      e.w.codec->name, th & 1 ? 3 : 1, th >= 2);
            nf_cpu_set_a8(c, 0);
        }
        enc_free(&e);
    }
}

static void test_gemm_ragged(nf_cpu *c1, nf_cpu *c3)
{
    const struct { nf_codec_id id; uint32_t cols; } shapes[] = {
        {NF_CODEC_F32, 517}, {NF_CODEC_F16, 517}, {NF_CODEC_BF16, 517}, {NF_CODEC_Q8_0, 544}, {NF_CODEC_Q4_K, 768},
    };
    const uint32_t row_counts[] = {250, 7, 1};
    const size_t ns[] = {2, 7, 10, 11, 13}; /* the tile from NF_CPU_STEP_MAX + 1 on */
    float *x = malloc(13 * 768 * sizeof(float)), *y1 = malloc(13 * 250 * sizeof(float)),
          *y3 = malloc(13 * 250 * sizeof(float));
    for (size_t i = 0; i < 13 * 768; i++) x[i] = frand();
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t r = 0; r < sizeof row_counts / sizeof row_counts[0]; r++) {
            enc e;
            encode(&e, shapes[s].id, row_counts[r], shapes[s].cols, 1);
            for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) {
                const size_t n = ns[j];
                nf_cpu_gemm(c1, &e.w, x, shapes[s].cols, y1, row_counts[r], n);
                nf_cpu_gemm(c3, &e.w, x, shapes[s].cols, y3, row_counts[r], n);
                const double err = gemm_err(&e, x, n, y1, 0), err3 = gemm_err(&e, x, n, y3, 0);
                CHECK_MSG(err < 4e-6 && err3 < 4e-6, "%s %u x %u, n=%zu: error %.3g / %.3g of sum|wx|", e.w.codec->name,
                          row_counts[r], shapes[s].cols, n, err, err3);
                CHECK_MSG(memcmp(y1, y3, n * row_counts[r] * sizeof(float)) == 0, "%s %u x %u, n=%zu: threads differ",
                          e.w.codec->name, row_counts[r], shapes[s].cols, n);
            }
            enc_free(&e);
        }
    free(x);
    free(y1);
    free(y3);
}

static void test_small_ops(void)
{
    float x[67], w[67], y[67];
    for (int i = 0; i < 67; i++) x[i] = frand() * 3, w[i] = 1 + frand() * 0.2f;
    nf_cpu_rmsnorm(y, x, w, 67, 1e-6f);
    double ss = 0;
    for (int i = 0; i < 67; i++) ss += (double)x[i] * x[i];
    double inv = 1 / sqrt(ss / 67 + 1e-6), worst = 0;
    for (int i = 0; i < 67; i++) worst = fmax(worst, fabs(y[i] - w[i] * x[i] * inv) / fabs(w[i] * x[i] * inv + 1e-30));
    CHECK_MSG(worst < 3e-7, "rmsnorm rel error %.3g", worst);

    float g[5] = {-30, -1, 0, 1, 20}, u[5] = {1, 2, 3, 4, 5}, o[5];
    nf_cpu_swiglu(o, g, u, 5);
    for (int i = 0; i < 5; i++) {
        double ref = g[i] / (1 + exp(-(double)g[i])) * u[i];
        CHECK_MSG(fabs(o[i] - ref) <= 1e-6 * fabs(ref) + 1e-12, "swiglu[%d] %g vs %g", i, o[i], ref);
    }
    float s[4] = {1000, 1001, 999, -1e30f};
    nf_cpu_softmax(s, 4);
    double z = 1 + exp(1) + exp(-1);
    CHECK(fabs(s[0] - 1 / z) < 1e-6 && fabs(s[1] - exp(1) / z) < 1e-6 && s[3] == 0);
}

/* nf_cpu_expf (vexp.h) against exp in double: within 2.0e-7 relative for normal results, plus 2^-149
 * absolute below 2^-126; +inf past 88.7228, 0 past -103.98, NaN kept. The AVX-512 forms of exp, softmax
 * and SwiGLU must give the scalar forms' bits (every ISA rounds alike). */
static void test_exp(void)
{
    enum { N = 1 << 20 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    static const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 88.72283f, 88.7229f, 88.5f, 89.0f, 100.0f, -87.33f,
                                    -87.34f, -100.0f, -103.97f, -103.98f, -104.0f, -150.0f, 1e-30f, -1e-30f,
                                    0x1p-149f, 0.34657359f, -0.34657359f, 0.5f * 0.6931472f, 1e30f, -1e30f};
    const size_t ns = sizeof special / sizeof special[0];
    for (size_t i = 0; i < N; i++) x[i] = i < ns ? special[i] : frand() * 100.0f - 5.0f * (float)(i % 3 == 0);
    x[ns] = INFINITY, x[ns + 1] = -INFINITY, x[ns + 2] = NAN;
    int bad = 0, bad_sp = 0;
    double worst = 0;
    for (size_t i = 0; i < N; i++) {
        y[i] = nf_cpu_expf(x[i]);
        const double ref = exp((double)x[i]);
        int ok;
        if (isnan(x[i])) ok = isnan(y[i]);
        else if (ref > 3.4028234663852886e38) ok = isinf(y[i]) && y[i] > 0;
        else if (ref >= 0x1p-126) {
            const double rel = fabs(y[i] - ref) / ref;
            worst = rel > worst ? rel : worst;
            ok = rel <= 2.0e-7;
        } else ok = fabs(y[i] - ref) <= 2.0e-7 * ref + 0x1p-149;
        if (!ok && bad++ < 5) fprintf(stderr, "exp(%.9g) = %.9g, exp in double %.9g\n", x[i], y[i], ref);
    }
    CHECK_MSG(bad == 0, "nf_cpu_expf outside its bound on %d of %d values (worst normal rel %.3g)", bad, N, worst);
    CHECK(nf_cpu_expf(0.0f) == 1.0f && nf_cpu_expf(-0.0f) == 1.0f && nf_cpu_expf(-110.0f) == 0.0f && isinf(nf_cpu_expf(89.0f)));
    printf("nf_cpu_expf: worst relative error %.3g over %d values (bound 2.0e-7)\n", worst, N);
    if (nf_isa_detect() >= NF_ISA_AVX512VNNI) {
        float *yv = malloc(N * sizeof(float));
        nf_cpu_exp_avx512(x, yv, N);
        for (size_t i = 0; i < N; i++) bad_sp += memcmp(&y[i], &yv[i], 4) != 0 && !(isnan(y[i]) && isnan(yv[i]));
        CHECK_MSG(bad_sp == 0, "AVX-512 exp differs from the scalar form on %d of %d values", bad_sp, N);
        /* softmax and SwiGLU, every length 1 .. 70 (partial 16-lane blocks) and one long row */
        float a[400], b[400], c[400], g[400], u[400], o1[400], o2[400];
        int sm_bad = 0, sw_bad = 0, acc_bad = 0;
        double sm_worst = 0;
        for (size_t n = 1; n <= 400; n = n < 70 ? n + 1 : n + 330) { /* 1 .. 70, then 400 */
            for (size_t i = 0; i < n; i++) a[i] = frand() * 30.0f, g[i] = frand() * 12.0f, u[i] = frand();
            if (n > 5) a[3] = -1e30f, g[2] = -100.0f, g[4] = 95.0f;
            memcpy(b, a, n * sizeof(float));
            memcpy(c, a, n * sizeof(float));
            nf_cpu_softmax_scalar(a, n);
            nf_cpu_softmax_avx512(b, n);
            sm_bad += memcmp(a, b, n * sizeof(float)) != 0;
            double mx = c[0], z = 0;
            for (size_t i = 1; i < n; i++) mx = c[i] > mx ? c[i] : mx;
            for (size_t i = 0; i < n; i++) z += exp((double)c[i] - mx);
            for (size_t i = 0; i < n; i++) { /* the exp's 2.0e-7 and the f32 subtraction, sum and scaling */
                const double ref = exp((double)c[i] - mx) / z, err = fabs(a[i] - ref);
                if (ref >= 1e-30) sm_worst = err / ref > sm_worst ? err / ref : sm_worst;
                acc_bad += ref >= 1e-30 ? err > 5e-7 * ref + 1.2e-7 * ref * fabs((double)c[i] - mx) : err > 1e-37;
            }
            nf_cpu_swiglu_scalar(o1, g, u, n);
            nf_cpu_swiglu_avx512(o2, g, u, n);
            sw_bad += memcmp(o1, o2, n * sizeof(float)) != 0;
        }
        CHECK_MSG(acc_bad == 0, "softmax off exp in double on %d entries (worst rel %.3g)", acc_bad, sm_worst);
        CHECK_MSG(sm_bad == 0, "AVX-512 softmax differs from the scalar form at %d lengths", sm_bad);
        CHECK_MSG(sw_bad == 0, "AVX-512 SwiGLU differs from the scalar form at %d lengths", sw_bad);
        free(yv);
    }
    free(x);
    free(y);
}

static void test_rope(void)
{
    float inv[32], af;
    nf_rope_config rc = {NF_ROPE_NONE, 1e6, 1, 0, 1, 4, 64};
    nf_rope_inv_freq(&rc, 0, inv, &af);
    for (int i = 0; i < 32; i++) CHECK(fabs(inv[i] - pow(1e6, -2.0 * i / 64)) <= 1e-6 * pow(1e6, -2.0 * i / 64));
    CHECK(af == 1);
    rc.kind = NF_ROPE_LINEAR;
    rc.factor = 4;
    float lin[32];
    nf_rope_inv_freq(&rc, 0, lin, &af);
    for (int i = 0; i < 32; i++) CHECK(fabs(lin[i] * 4 - inv[i]) <= 1e-6 * inv[i]);
    /* llama3 (Llama 3.1: theta 500000, factor 8, low 1, high 4, original 8192), from HF's formula */
    rc = (nf_rope_config){NF_ROPE_LLAMA3, 500000, 8, 8192, 1, 4, 128};
    float l3[64];
    nf_rope_inv_freq(&rc, 0, l3, &af);
    for (int i = 0; i < 64; i++) {
        double f = pow(500000, -2.0 * i / 128), wl = 2 * 3.14159265358979323846 / f, ref;
        if (wl < 8192 / 4.0) ref = f;
        else if (wl > 8192 / 1.0) ref = f / 8;
        else {
            double sm = (8192 / wl - 1) / (4 - 1);
            ref = (1 - sm) * f / 8 + sm * f;
        }
        CHECK_MSG(fabs(l3[i] - ref) <= 2e-6 * ref, "llama3 inv_freq[%d] %g vs %g", i, l3[i], ref);
    }
    /* rotation: (v[i], v[i+d/2]) turned by pos * inv_freq[i]; two heads */
    float v[128], v0[128];
    for (int i = 0; i < 128; i++) v0[i] = v[i] = frand();
    nf_cpu_rope(v, 2, 64, 37, inv, 1);
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 32; i++) {
            double a = 37.0 * inv[i], x0 = v0[h * 64 + i], x1 = v0[h * 64 + i + 32];
            CHECK(fabs(v[h * 64 + i] - (x0 * cos(a) - x1 * sin(a))) < 2e-6);
            CHECK(fabs(v[h * 64 + i + 32] - (x1 * cos(a) + x0 * sin(a))) < 2e-6);
        }
}

static void test_attention(nf_cpu *c, int bf16)
{
    /* positions through a scattered page table: 3 pages of 4 positions out of a pool of 5, a
     * store that straddles pages; the reference indexes positions directly */
    enum { HQ = 4, HK = 2, D = 16, CTX = 12, P0 = 4, T = 5, PT = 4, NP = 5 };
    float k[CTX * HK * D], v[CTX * HK * D], q[T * HQ * D], out[T * HQ * D];
    for (int i = 0; i < CTX * HK * D; i++) k[i] = frand(), v[i] = frand();
    for (int i = 0; i < T * HQ * D; i++) q[i] = frand() * 2;
    static uint8_t kb[NP * PT * HK * D * 4], vb[NP * PT * HK * D * 4];
    const uint32_t pages[3] = {3, 0, 4};
    nf_cpu_kv kv = {kb, vb, bf16, PT, NP, HK, D};
    nf_cpu_kv_store(&kv, pages, 0, P0 - 1, k, v);
    nf_cpu_kv_store(&kv, pages, P0 - 1, T + 1, k + (P0 - 1) * HK * D, v + (P0 - 1) * HK * D);
    const nf_cpu_attn_seq seq = {pages, P0, 0, T};
    nf_cpu_attention(c, &kv, &seq, 1, q, HQ, 0.25f, out);
    double worst = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < HQ; h++) {
            double sc[CTX], mx = -1e300, sum = 0;
            int n = P0 + t + 1, kh = h / (HQ / HK);
            for (int p = 0; p < n; p++) {
                double s = 0;
                for (int i = 0; i < D; i++) {
                    float kk = k[(p * HK + kh) * D + i];
                    if (bf16) kk = nf_bf16_to_f32(nf_f32_to_bf16(kk));
                    s += (double)q[(t * HQ + h) * D + i] * kk;
                }
                sc[p] = s * 0.25;
                mx = fmax(mx, sc[p]);
            }
            for (int p = 0; p < n; p++) sum += (sc[p] = exp(sc[p] - mx));
            for (int i = 0; i < D; i++) {
                double o = 0;
                for (int p = 0; p < n; p++) {
                    float vv = v[(p * HK + kh) * D + i];
                    if (bf16) vv = nf_bf16_to_f32(nf_f32_to_bf16(vv));
                    o += sc[p] / sum * vv;
                }
                worst = fmax(worst, fabs(out[(t * HQ + h) * D + i] - o));
            }
        }
    CHECK_MSG(worst < 2e-6, "attention (bf16 cache %d): max abs error %.3g", bf16, worst);
}

/* The AVX2 attention (one query: positions as lanes; several: queries as lanes) must give ops.c's
 * scalar bits: the same f32 sequence s = fma(q[i], k[i], s), softmax, o = fma(w, v, o), written out here.
 * One token at every context length 4 .. 37 (partial blocks of 8, page boundaries), and 20, 19, 18, 17
 * tokens (a whole block of 16 and a partial one, or blocks of 8; the AVX-512 V sum's groups of four
 * queries whole and partial) after 0, 1, 2 and 3 positions; SmolLM2's
 * geometry (9 query heads on 3 kv heads, head_dim 64). */
static void test_attention_bits(nf_cpu *c, int bf16)
{
    enum { HQ = 9, HK = 3, D = 64, CTX = 40, PT = 16, NP = 3 };
    static float k[CTX * HK * D], v[CTX * HK * D], q[20 * HQ * D], out[20 * HQ * D];
    static uint8_t kb[NP * PT * HK * D * 4], vb[NP * PT * HK * D * 4];
    for (int i = 0; i < CTX * HK * D; i++) k[i] = frand(), v[i] = frand();
    for (int i = 0; i < 20 * HQ * D; i++) q[i] = frand() * 2;
    const uint32_t pages[NP] = {2, 0, 1};
    nf_cpu_kv kv = {kb, vb, bf16, PT, NP, HK, D};
    nf_cpu_kv_store(&kv, pages, 0, CTX, k, v);
    int wrong = 0;
    for (uint32_t n0 = 1; n0 + 3 <= CTX; n0++) {
        const uint32_t T = n0 <= 4 ? 21 - n0 : 1; /* 20 .. 17: the last group of four queries full or 3, 2, 1 */
        const nf_cpu_attn_seq seq = {pages, n0 - 1, 0, T};
        nf_cpu_attention(c, &kv, &seq, 1, q, HQ, 0.125f, out);
        for (uint32_t t = 0; t < T; t++)
            for (int h = 0; h < HQ; h++) {
                const int kh = h / (HQ / HK);
                const uint32_t n = n0 + t;
                float sc[CTX], o[D] = {0};
                for (uint32_t p = 0; p < n; p++) {
                    float sum = 0;
                    for (int i = 0; i < D; i++) {
                        float kk = k[(p * HK + kh) * D + i];
                        if (bf16) kk = nf_bf16_to_f32(nf_f32_to_bf16(kk));
                        sum = fmaf(q[(t * HQ + h) * D + i], kk, sum);
                    }
                    sc[p] = sum * 0.125f;
                }
                nf_cpu_softmax(sc, n);
                for (uint32_t p = 0; p < n; p++)
                    for (int i = 0; i < D; i++) {
                        float vv = v[(p * HK + kh) * D + i];
                        if (bf16) vv = nf_bf16_to_f32(nf_f32_to_bf16(vv));
                        o[i] = fmaf(sc[p], vv, o[i]);
                    }
                wrong += memcmp(o, out + (t * HQ + h) * D, sizeof o) != 0;
            }
    }
    CHECK_MSG(wrong == 0, "attention (bf16 cache %d): %d heads differ from the scalar bits", bf16, wrong);
}

static void test_route(void)
{
    float l[6] = {0.5f, 2.0f, 2.0f, -1.0f, 2.0f, 0.1f};
    int32_t ids[3];
    float w[3];
    nf_cpu_route(l, 6, 3, 0, ids, w);
    CHECK(ids[0] == 1 && ids[1] == 2 && ids[2] == 4); /* three-way tie: lower index first */
    double z = 0;
    for (int e = 0; e < 6; e++) z += exp(l[e] - 2.0);
    CHECK(fabs(w[0] - 1 / z) < 1e-7 && fabs(w[2] - 1 / z) < 1e-7);
    float l2[4] = {3, -2, 1, 0};
    nf_cpu_route(l2, 4, 2, 1, ids, w);
    CHECK(ids[0] == 0 && ids[1] == 2);
    CHECK(fabs(w[0] - 1 / (1 + exp(-2.0))) < 1e-7 && fabs(w[0] + w[1] - 1) < 1e-7);
}

/* The MoE block against a per-token double reference on the dequantized weights. */
static void test_moe(nf_cpu *c, nf_codec_id codec, int shared, int norm)
{
    enum { H = 256, E = 8, K = 3, I = 256, S = 256, T = 9 };
    enc router, gu, dn, sgu, sdn, sg;
    encode(&router, NF_CODEC_F32, E, H, 1);
    for (size_t i = 0; i < (size_t)E * H; i++) ((float *)router.buf)[i] = router.deq[i] *= 4; /* sharper routing */
    encode(&gu, codec, E * 2 * I, H, codec == NF_CODEC_NVFP4 ? 2 * E : 1);
    encode(&dn, codec, E * H, I, codec == NF_CODEC_NVFP4 ? E : 1);
    encode(&sgu, codec, 2 * S, H, 1);
    encode(&sdn, codec, H, S, 1);
    encode(&sg, NF_CODEC_BF16, 1, H, 1);
    nf_cpu_moe m = {H, E, K, I, shared ? S : 0, norm, router.w, gu.w, dn.w, sgu.w, sdn.w, sg.w};
    if (!shared) m.shared_gate_up.rows = 0;
    nf_cpu_moe_ws *ws;
    CHECK(nf_cpu_moe_ws_create(&m, T, &ws, NULL) == NF_OK);
    float *x = malloc(T * H * sizeof(float)), *out = malloc(T * H * sizeof(float)), w[T * K];
    int32_t ids[T * K];
    for (int i = 0; i < T * H; i++) x[i] = frand();
    double worst = 0;
    for (size_t T_run = 1; T_run <= T; T_run += T - 1) { /* decode and prefill paths */
        nf_cpu_moe_forward(c, &m, ws, x, T_run, NULL, 0, out, ids, w);
        for (size_t t = 0; t < T_run; t++) {
            const float *xt = x + t * H;
            double lg[E], ref[H] = {0};
            float lf[E];
            for (int e = 0; e < E; e++) {
                lg[e] = 0;
                for (int i = 0; i < H; i++) lg[e] += (double)router.deq[e * H + i] * xt[i];
                lf[e] = (float)lg[e];
            }
            int32_t rid[K];
            float rw[K];
            nf_cpu_route(lf, E, K, norm, rid, rw); /* routing itself is checked in test_route */
            for (int j = 0; j < K; j++) CHECK(rid[j] == ids[t * K + j]);
            for (int j = 0; j < K; j++) {
                int e = rid[j];
                double act[I];
                for (int i = 0; i < I; i++) {
                    double g = 0, u = 0;
                    for (int h = 0; h < H; h++) {
                        g += (double)gu.deq[((size_t)e * 2 * I + i) * H + h] * xt[h];
                        u += (double)gu.deq[((size_t)e * 2 * I + I + i) * H + h] * xt[h];
                    }
                    act[i] = g / (1 + exp(-g)) * u;
                }
                for (int h = 0; h < H; h++) {
                    double d = 0;
                    for (int i = 0; i < I; i++) d += (double)dn.deq[((size_t)e * H + h) * I + i] * act[i];
                    ref[h] += rw[j] * d;
                }
            }
            if (shared) {
                double gl = 0, act[S];
                for (int h = 0; h < H; h++) gl += (double)sg.deq[h] * xt[h];
                for (int i = 0; i < S; i++) {
                    double g = 0, u = 0;
                    for (int h = 0; h < H; h++) {
                        g += (double)sgu.deq[(size_t)i * H + h] * xt[h];
                        u += (double)sgu.deq[(size_t)(S + i) * H + h] * xt[h];
                    }
                    act[i] = g / (1 + exp(-g)) * u;
                }
                for (int h = 0; h < H; h++) {
                    double d = 0;
                    for (int i = 0; i < S; i++) d += (double)sdn.deq[(size_t)h * S + i] * act[i];
                    ref[h] += d / (1 + exp(-gl));
                }
            }
            double num = 0, den = 0;
            for (int h = 0; h < H; h++) num += pow(out[t * H + h] - ref[h], 2), den += ref[h] * ref[h];
            worst = fmax(worst, sqrt(num / den));
        }
    }
    CHECK_MSG(worst < 2e-5, "moe %s shared=%d norm=%d: rel-L2 %.3g", nf_codec_get(codec)->name, shared, norm, worst);
    nf_cpu_moe_ws_free(ws);
    free(x);
    free(out);
    enc_free(&router), enc_free(&gu), enc_free(&dn), enc_free(&sgu), enc_free(&sdn), enc_free(&sg);
}

int main(void)
{
    nf_cpu *c1, *c3;
    CHECK(nf_cpu_create(1, 768, 64, &c1, NULL) == NF_OK); /* max_cols: the widest row test_gemm_ragged uses */
    CHECK(nf_cpu_create(3, 768, 64, &c3, NULL) == NF_OK);
    CHECK(nf_cpu_a8(c1) && nf_cpu_a8(c3)); /* on by default; the f32-activation bounds below need it off */
    nf_cpu_set_a8(c1, 0), nf_cpu_set_a8(c3, 0);
    test_gemm_a8(c1, c3);
    test_gemm(c1, c3);
    test_gemm_ragged(c1, c3);
    test_gemm_segments(c1, c3);
    test_small_ops();
    test_exp();
    test_rope();
    test_attention(c3, 0);
    test_attention(c3, 1);
    test_attention_bits(c3, 0);
    test_attention_bits(c3, 1);
    test_route();
    test_moe(c3, NF_CODEC_BF16, 1, 0);
    test_moe(c3, NF_CODEC_Q4_K, 0, 1);
    test_moe(c3, NF_CODEC_Q8_0, 1, 1);
    test_moe(c3, NF_CODEC_NVFP4, 0, 1);
    nf_cpu_free(c1);
    nf_cpu_free(c3);
    return nf_test_report();
}
