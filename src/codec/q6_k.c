/* q6_k: super-blocks of 256 elements in 16 sub-blocks of 16 (ggml type 14, 210 bytes).
 * y = d * sc_j * (q - 32), q in [0, 63], sc_j int8, d f16. In each half of 128 elements
 * (ql advancing 64 bytes, qh 32), element l (l < 32) is the low nibble of ql[l], l+32 the low
 * nibble of ql[l+32], l+64 the high nibble of ql[l], l+96 the high nibble of ql[l+32]; their top
 * two bits are bits 0-1, 2-3, 4-5, 6-7 of qh[l]. Decoding follows llama.cpp's
 * dequantize_row_q6_K operation by operation ((d * sc) * q). */
#include <math.h>

#include "codec/codec_simd.h"
#include "codec/ggml_blocks.h"

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* For fixed levels l the least-squares scale is sum(x l)/sum(l^2) and the squared error drops by
 * sum(x l)^2/sum(l^2): the search keeps the levels that maximise that. */
static float score_sym(const float *x, const int *l, int n, float *scale)
{
    float slx = 0, sl2 = 0;
    for (int i = 0; i < n; i++) {
        slx += x[i] * l[i];
        sl2 += (float)l[i] * l[i];
    }
    if (!(sl2 > 0)) return -1;
    *scale = slx / sl2;
    return slx * slx / sl2;
}

float nf_kq_fit_sym(const float *x, int n, int nmax, int nstep, float step, uint8_t *L)
{
    float amax = 0, max = 0;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]), max = x[i];
    }
    for (int i = 0; i < n; i++) L[i] = (uint8_t)nmax;
    if (!(amax > 1e-30f)) return 0;
    /* Candidates: the element of largest magnitude on level -(nmax + t) or +(nmax - 1 + t),
     * t in [-step*nstep, step*nstep]; then the alternation levels <-> scale. */
    int lc[NF_QK_K];
    float best = -1, scale = 0;
    for (int k = 0; k < 2 * (2 * nstep + 1); k++) {
        /* first pass: max on the negative side (nmax levels); second: positive (nmax - 1) */
        const int is = k % (2 * nstep + 1) - nstep;
        float iscale = k <= 2 * nstep ? -(nmax + step * is) / max : (nmax - 1 + step * is) / max, s = 0;
        for (int i = 0; i < n; i++) lc[i] = clampi(nf_round_int(iscale * x[i]), -nmax, nmax - 1);
        float sc = score_sym(x, lc, n, &s);
        if (sc > best) {
            best = sc, scale = s;
            for (int i = 0; i < n; i++) L[i] = (uint8_t)(lc[i] + nmax);
        }
    }
    for (int it = 0; it < 4 && scale != 0; it++) {
        float s = 0;
        for (int i = 0; i < n; i++) lc[i] = clampi(nf_round_int(x[i] / scale), -nmax, nmax - 1);
        float sc = score_sym(x, lc, n, &s);
        if (!(sc > best)) break;
        best = sc, scale = s;
        for (int i = 0; i < n; i++) L[i] = (uint8_t)(lc[i] + nmax);
    }
    return scale;
}

enum { Q6K_NSTEP = 9 };
#define Q6K_STEP 0.1f

static void q6_k_quantize(const float *x, void *dst, size_t n)
{
    uint8_t *b = dst, L[NF_QK_K];
    for (size_t i = 0; i < n / NF_QK_K; i++, x += NF_QK_K, b += NF_Q6_K_BYTES) {
        float scales[16], max_scale = 0, max_abs = 0;
        for (int j = 0; j < 16; j++) {
            scales[j] = nf_kq_fit_sym(x + 16 * j, 16, 32, Q6K_NSTEP, Q6K_STEP, L + 16 * j);
            if (fabsf(scales[j]) > max_abs) max_abs = fabsf(scales[j]), max_scale = scales[j];
        }
        memset(b, 0, NF_Q6_K_BYTES);
        if (!(max_abs > 0)) continue; /* all-zero block: d = 0, every scale 0 */
        /* The largest scale maps to -128 (int8 has one more negative level), d = 1/iscale in f16. */
        const float iscale = -128.f / max_scale;
        nf_wr16(b + 208, nf_f32_to_f16(1 / iscale));
        int8_t *sc = (int8_t *)(b + 192);
        for (int j = 0; j < 16; j++) sc[j] = (int8_t)clampi(nf_round_int(iscale * scales[j]), -128, 127);
        const float d = nf_rd_f16(b + 208);
        for (int j = 0; j < 16; j++) {
            const float dd = d * sc[j];
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = dd != 0.0f ? (uint8_t)(clampi(nf_round_int(x[16 * j + l] / dd), -32, 31) + 32) : 32;
        }
        uint8_t *ql = b, *qh = b + 128;
        for (int j = 0; j < NF_QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; l++) {
                const uint8_t *q = L + j + l;
                ql[l] = (uint8_t)((q[0] & 0xF) | ((q[64] & 0xF) << 4));
                ql[l + 32] = (uint8_t)((q[32] & 0xF) | ((q[96] & 0xF) << 4));
                qh[l] = (uint8_t)((q[0] >> 4) | ((q[32] >> 4) << 2) | ((q[64] >> 4) << 4) | ((q[96] >> 4) << 6));
            }
        }
    }
}

static void block_dequantize(const uint8_t *b, float *y)
{
    const float d = nf_rd_f16(b + 208);
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    for (int n = 0; n < NF_QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
        for (int l = 0; l < 32; l++) {
            const int is = l / 16;
            const int8_t q1 = (int8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int8_t q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int8_t q3 = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l + 0] = d * sc[is + 0] * q1;
            y[l + 32] = d * sc[is + 2] * q2;
            y[l + 64] = d * sc[is + 4] * q3;
            y[l + 96] = d * sc[is + 6] * q4;
        }
    }
}

static void q6_k_dequantize(const void *src, float *y, size_t n)
{
    const uint8_t *b = src;
    for (size_t i = 0; i < n / NF_QK_K; i++) block_dequantize(b + i * NF_Q6_K_BYTES, y + i * NF_QK_K);
}

static float q6_k_dot(const void *w, const float *x, size_t n)
{
    const uint8_t *b = w;
    double s = 0;
    float v[NF_QK_K];
    for (size_t i = 0; i < n / NF_QK_K; i++, b += NF_Q6_K_BYTES, x += NF_QK_K) {
        block_dequantize(b, v);
        float bs = 0;
        for (int j = 0; j < NF_QK_K; j++) bs += v[j] * x[j];
        s += bs;
    }
    return (float)s;
}

static void q6_k_matvec(const void *w, size_t row_bytes, size_t rows, const float *x, float *y, size_t n)
{
    for (size_t r = 0; r < rows; r++) y[r] = q6_k_dot((const uint8_t *)w + r * row_bytes, x, n);
}

const nf_codec nf_codec_q6_k = {
    .id = NF_CODEC_Q6_K, .name = "q6_k", .ggml_type = 14, .block_elems = NF_QK_K,
    .block_bytes = NF_Q6_K_BYTES, .quantize_row = q6_k_quantize, .dequantize_row = q6_k_dequantize,
    .dot_row = q6_k_dot, .matvec_scalar = q6_k_matvec, .matvec_simd = nf_q6_k_matvec_avx2,
};
