/* q4_k: super-blocks of 256 elements in 8 sub-blocks of 32 (ggml type 12, 144 bytes).
 * y = d*sc_j * q - dmin*m_j with q in [0, 15], sc_j and m_j six-bit (get_scale_min_k4 packing).
 * Decoding follows llama.cpp's dequantize_row_q4_K operation by operation (d1 = d*sc, m1 = dmin*m,
 * then d1*q - m1, two roundings), so the floats are identical. This file also holds the
 * scale-and-min sub-block search that q5_k shares. */
#include <math.h>

#include "codec/codec_simd.h"
#include "codec/ggml_blocks.h"

void nf_k4_pack_scales(const uint8_t sc[8], const uint8_t m[8], uint8_t out[12])
{
    for (int j = 0; j < 4; j++) {
        out[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        out[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        out[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
    }
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Least-squares scale s >= 0 and offset mn <= 0 for x ~ s*L + mn given L; returns the squared
 * error, or INFINITY when every L is equal (no scale can be fitted). */
static float refit_min(const float *x, const uint8_t *L, int n, float *s_out, float *mn_out)
{
    float sl = 0, sl2 = 0, sxl = 0, sx = 0;
    for (int i = 0; i < n; i++) {
        sl += L[i];
        sl2 += (float)L[i] * L[i];
        sxl += x[i] * L[i];
        sx += x[i];
    }
    float D = n * sl2 - sl * sl;
    if (!(D > 0)) return INFINITY;
    float s = (n * sxl - sx * sl) / D, mn = (sl2 * sx - sl * sxl) / D;
    if (mn > 0) { /* the offset must be >= 0 (min stored unsigned): constrain it to the boundary */
        mn = 0;
        s = sxl / sl2;
    }
    if (!(s > 0)) return INFINITY;
    float err = 0;
    for (int i = 0; i < n; i++) {
        float e = s * L[i] + mn - x[i];
        err += e * e;
    }
    *s_out = s;
    *mn_out = mn;
    return err;
}

float nf_kq_fit_min(const float *x, int n, int nmax, int nstep, float step, uint8_t *L, float *offset)
{
    float mn = x[0], mx = x[0];
    for (int i = 1; i < n; i++) {
        mn = fminf(mn, x[i]);
        mx = fmaxf(mx, x[i]);
    }
    if (mn > 0) mn = 0;
    *offset = -mn;
    for (int i = 0; i < n; i++) L[i] = 0;
    if (!(mx > mn)) return 0; /* constant sub-block: the offset alone represents it */

    /* Candidate inverse scales (nmax + t)/(max - min), t in [-step*nstep/2, +step*nstep/2]: each
     * gives levels L; the least-squares (scale, offset) for those levels is scored. */
    uint8_t Lc[NF_QK_K];
    float best = INFINITY, bs = (mx - mn) / nmax, bmn = mn;
    for (int is = 0; is <= nstep; is++) {
        float iscale = (nmax + step * (is - nstep * 0.5f)) / (mx - mn);
        for (int i = 0; i < n; i++) Lc[i] = (uint8_t)clampi(nf_round_int(iscale * (x[i] - mn)), 0, nmax);
        float s = 0, m = 0, err = refit_min(x, Lc, n, &s, &m);
        if (err < best) {
            best = err, bs = s, bmn = m;
            memcpy(L, Lc, (size_t)n);
        }
    }
    /* Alternate: levels nearest to the fitted grid, then refit, while the error drops. */
    for (int it = 0; it < 4 && best < INFINITY; it++) {
        for (int i = 0; i < n; i++) Lc[i] = (uint8_t)clampi(nf_round_int((x[i] - bmn) / bs), 0, nmax);
        float s = 0, m = 0, err = refit_min(x, Lc, n, &s, &m);
        if (!(err < best)) break;
        best = err, bs = s, bmn = m;
        memcpy(L, Lc, (size_t)n);
    }
    *offset = -bmn;
    return bs;
}

void nf_kq_encode_superblock(const float *x, int nmax, int nstep, float step, uint8_t *b, uint8_t L[NF_QK_K])
{
    float scales[8], mins[8], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        scales[j] = nf_kq_fit_min(x + 32 * j, 32, nmax, nstep, step, L + 32 * j, &mins[j]);
        max_scale = fmaxf(max_scale, scales[j]);
        max_min = fmaxf(max_min, mins[j]);
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)clampi(nf_round_int(inv_scale * scales[j]), 0, 63);
        lm[j] = (uint8_t)clampi(nf_round_int(inv_min * mins[j]), 0, 63);
    }
    nf_wr16(b, nf_f32_to_f16(max_scale / 63.f));
    nf_wr16(b + 2, nf_f32_to_f16(max_min / 63.f));
    nf_k4_pack_scales(ls, lm, b + 4);
    const float d = nf_rd_f16(b), dmin = nf_rd_f16(b + 2);
    for (int j = 0; j < 8; j++) {
        const float dd = d * ls[j], dm = dmin * lm[j];
        for (int i = 0; i < 32; i++)
            L[32 * j + i] = dd != 0.0f ? (uint8_t)clampi(nf_round_int((x[32 * j + i] + dm) / dd), 0, nmax) : 0;
    }
}

/* Search width: 21 candidates spaced 0.1 level apart around nmax (llama.cpp's make_qkx2_quants
 * uses 21 with step 0.1 from nmax - 1), then the alternation above. */
enum { Q4K_NSTEP = 20 };
#define Q4K_STEP 0.1f

static void q4_k_quantize(const float *x, void *dst, size_t n)
{
    uint8_t *b = dst, L[NF_QK_K];
    for (size_t i = 0; i < n / NF_QK_K; i++, x += NF_QK_K, b += NF_Q4_K_BYTES) {
        nf_kq_encode_superblock(x, 15, Q4K_NSTEP, Q4K_STEP, b, L);
        uint8_t *qs = b + 16;
        for (int j = 0; j < NF_QK_K; j += 64)
            for (int l = 0; l < 32; l++) qs[j / 2 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
}

static void block_dequantize(const uint8_t *b, float *y)
{
    const float d = nf_rd_f16(b), min = nf_rd_f16(b + 2);
    const uint8_t *sc = b + 4, *q = b + 16;
    for (int j = 0, is = 0; j < NF_QK_K; j += 64, is += 2, q += 32) {
        uint8_t s, m;
        nf_k4_scale_min(is, sc, &s, &m);
        const float d1 = d * s, m1 = min * m;
        nf_k4_scale_min(is + 1, sc, &s, &m);
        const float d2 = d * s, m2 = min * m;
        for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
    }
}

static void q4_k_dequantize(const void *src, float *y, size_t n)
{
    const uint8_t *b = src;
    for (size_t i = 0; i < n / NF_QK_K; i++) block_dequantize(b + i * NF_Q4_K_BYTES, y + i * NF_QK_K);
}

static float q4_k_dot(const void *w, const float *x, size_t n)
{
    const uint8_t *b = w;
    double s = 0;
    float v[NF_QK_K];
    for (size_t i = 0; i < n / NF_QK_K; i++, b += NF_Q4_K_BYTES, x += NF_QK_K) {
        block_dequantize(b, v);
        float bs = 0;
        for (int j = 0; j < NF_QK_K; j++) bs += v[j] * x[j];
        s += bs;
    }
    return (float)s;
}

static void q4_k_matvec(const void *w, size_t row_bytes, size_t rows, const float *x, float *y, size_t n)
{
    for (size_t r = 0; r < rows; r++) y[r] = q4_k_dot((const uint8_t *)w + r * row_bytes, x, n);
}

const nf_codec nf_codec_q4_k = {
    .id = NF_CODEC_Q4_K, .name = "q4_k", .ggml_type = 12, .block_elems = NF_QK_K,
    .block_bytes = NF_Q4_K_BYTES, .quantize_row = q4_k_quantize, .dequantize_row = q4_k_dequantize,
    .dot_row = q4_k_dot, .matvec_scalar = q4_k_matvec, .matvec_simd = nf_q4_k_matvec_avx2,
};
