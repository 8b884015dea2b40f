/* The AVX2 matvec kernels against the scalar reference dot_row, for every codec that has one, on
 * random matrices (1..9 rows so the 4-row groups and the single-row tail both run, several row
 * lengths, unaligned row starts).
 *
 * Tolerance. Both sides compute sum_i (a_i - b_i) x_i where a_i - b_i is the decoded weight
 * (b_i the offset term dmin*m of q4_k/q5_k/q2_k, else 0), in f32 with different summation orders. With
 * u = 2^-24 and T = sum_i (|a_i| + |b_i|) |x_i|, first-order error analysis bounds each side by
 * (k + 2) u T, k the longest chain of additions feeding the result: the reference rounds each
 * weight (2 roundings) and sums a block of B elements in f32 (k <= B; across blocks in double);
 * the kernel sums at most n/8 + 16 terms per lane (8-lane FMA chains, sub-block partial sums and
 * the final pairwise lane sum). So |simd - scalar| <= (B + n/8 + 20) u T. T is measured per row
 * from the decoded terms (decoding with the offset field zeroed gives a_i, with the scale field
 * zeroed -b_i). The reported figure is the worst ratio error / bound. */
#include <math.h>
#include <stdlib.h>

#include "codec/codec.h"
#include "nf_test.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return rng_state;
}
static float urand(void) { return (float)((rnd() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }
static float grand(void) /* rough Gaussian: sum of 4 uniforms */
{
    return (urand() + urand() + urand() + urand()) * 0.8660254f;
}

/* Offsets of the f16 scale and offset fields of the codecs with an offset term. */
static int offset_fields(const nf_codec *c, int *d_off, int *m_off)
{
    switch (c->id) {
    case NF_CODEC_Q4_K:
    case NF_CODEC_Q5_K: *d_off = 0, *m_off = 2; return 1;
    case NF_CODEC_Q2_K: *d_off = 80, *m_off = 82; return 1;
    default: return 0;
    }
}

/* T = sum_i (|a_i| + |b_i|) |x_i| for one row (see the header comment). */
static double term_magnitude(const nf_codec *c, const uint8_t *row, size_t rb, const float *x, size_t n)
{
    float *w = malloc(n * sizeof(float));
    double t = 0;
    int d_off, m_off;
    if (offset_fields(c, &d_off, &m_off)) {
        uint8_t *tmp = malloc(rb);
        float *v = malloc(n * sizeof(float));
        memcpy(tmp, row, rb);
        for (size_t b = 0; b < rb; b += c->block_bytes) memset(tmp + b + m_off, 0, 2);
        c->dequantize_row(tmp, w, n); /* a_i */
        memcpy(tmp, row, rb);
        for (size_t b = 0; b < rb; b += c->block_bytes) memset(tmp + b + d_off, 0, 2);
        c->dequantize_row(tmp, v, n); /* -b_i */
        for (size_t i = 0; i < n; i++) t += (fabs(w[i]) + fabs(v[i])) * fabs(x[i]);
        free(tmp);
        free(v);
    } else {
        c->dequantize_row(row, w, n);
        for (size_t i = 0; i < n; i++) t += fabs(w[i]) * fabs(x[i]);
    }
    free(w);
    return t;
}

static void check_codec(const nf_codec *c, size_t n, size_t rows, double *worst)
{
    size_t rb = nf_codec_row_bytes(c, n);
    uint8_t *buf = malloc(rows * rb + 1), *w = buf + 1; /* odd address: rows are not aligned */
    float *src = malloc(n * sizeof(float)), *x = malloc(n * sizeof(float));
    float *ys = malloc(rows * sizeof(float)), *yr = malloc(rows * sizeof(float));
    for (size_t r = 0; r < rows; r++) {
        float scale = 0.01f + (float)(rnd() % 1000) * 0.01f;
        for (size_t i = 0; i < n; i++) src[i] = grand() * scale + (r % 3 == 1 ? 0.5f * scale : 0.0f);
        if (c->quantize_row) {
            c->quantize_row(src, w + r * rb, n);
        } else { /* no quantizer (import-only): random levels and sub-scales, f16 scales around `scale`/64 */
            CHECK(nf_codec_fill_random(c, w + r * rb, rb / c->block_bytes, &rng_state, scale / 64) == 0);
        }
    }
    for (size_t i = 0; i < n; i++) x[i] = grand();
    c->matvec_simd(w, rb, rows, x, ys, n);
    c->matvec_scalar(w, rb, rows, x, yr, n);
    const double u = ldexp(1.0, -24);
    for (size_t r = 0; r < rows; r++) {
        double ref = c->dot_row(w + r * rb, x, n);
        CHECK_MSG(yr[r] == (float)ref, "%s: matvec_scalar row %zu differs from dot_row", c->name, r);
        double T = term_magnitude(c, w + r * rb, rb, x, n);
        double bound = ((double)c->block_elems + (double)n / 8 + 20) * u * T;
        double err = fabs((double)ys[r] - ref);
        CHECK_MSG(err <= bound, "%s n=%zu rows=%zu row %zu: simd %.9g scalar %.9g |diff| %.3g > bound %.3g", c->name, n,
                  rows, r, ys[r], ref, err, bound);
        CHECK_MSG(isfinite(ys[r]), "%s: non-finite result", c->name);
        if (bound > 0 && err / bound > *worst) *worst = err / bound;
    }
    free(buf), free(src), free(x), free(ys), free(yr);
}

int main(void)
{
    if (!nf_cpu_has_avx2_fma_f16c()) {
        printf("no AVX2+FMA+F16C on this CPU: the SIMD kernels cannot run here\n");
        return NF_TEST_SKIP;
    }
    int tested = 0;
    for (int id = 0; id < NF_CODEC_COUNT; id++) {
        const nf_codec *c = nf_codec_get((nf_codec_id)id);
        CHECK(c != NULL);
        if (!c || !c->matvec_simd) continue;
        CHECK_MSG(nf_codec_matvec(c) == c->matvec_simd || getenv("NF_NO_SIMD"), "%s: dispatch does not pick SIMD", c->name);
        double worst = 0;
        const size_t ns[] = {256, 512, 2048, 4096 + 256};
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
            for (size_t rows = 1; rows <= 9; rows += 2) check_codec(c, ns[k], rows, &worst);
        if (c->block_elems == 1) check_codec(c, 4096 + 13, 5, &worst); /* float codecs: scalar tail */
        printf("%-6s SIMD vs scalar: worst |diff| / bound = %.4f\n", c->name, worst);
        tested++;
    }
    CHECK_EQ_INT(tested, 11); /* f32 f16 bf16 q8_0 q4_k q5_k q6_k q2_k q3_k iq4_xs iq4_nl */
    return nf_test_report();
}
