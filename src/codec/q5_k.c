/* q5_k: super-blocks of 256 elements in 8 sub-blocks of 32 (ggml type 13, 176 bytes).
 * y = d*sc_j * q - dmin*m_j with q in [0, 31]: the low 4 bits as in q4_k (qs), the 5th bit of
 * element 64*p + l (l < 32) is bit 2p of qh[l], of element 64*p + 32 + l bit 2p+1.
 * Decoding follows llama.cpp's dequantize_row_q5_K operation by operation. */
#include "codec/codec_simd.h"
#include "codec/ggml_blocks.h"

enum { Q5K_NSTEP = 20 };
#define Q5K_STEP 0.1f

static void q5_k_quantize(const float *x, void *dst, size_t n)
{
    uint8_t *b = dst, L[NF_QK_K];
    for (size_t i = 0; i < n / NF_QK_K; i++, x += NF_QK_K, b += NF_Q5_K_BYTES) {
        nf_kq_encode_superblock(x, 31, Q5K_NSTEP, Q5K_STEP, b, L);
        uint8_t *qh = b + 16, *ql = b + 48;
        memset(qh, 0, 32);
        uint8_t m1 = 1, m2 = 2;
        for (int j = 0; j < NF_QK_K; j += 64, m1 <<= 2, m2 <<= 2) {
            for (int l = 0; l < 32; l++) {
                int l1 = L[j + l], l2 = L[j + l + 32];
                if (l1 > 15) l1 -= 16, qh[l] |= m1;
                if (l2 > 15) l2 -= 16, qh[l] |= m2;
                ql[j / 2 + l] = (uint8_t)(l1 | (l2 << 4));
            }
        }
    }
}

static void block_dequantize(const uint8_t *b, float *y)
{
    const float d = nf_rd_f16(b), min = nf_rd_f16(b + 2);
    const uint8_t *sc = b + 4, *qh = b + 16, *ql = b + 48;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < NF_QK_K; j += 64, is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
        uint8_t s, m;
        nf_k4_scale_min(is, sc, &s, &m);
        const float d1 = d * s, m1 = min * m;
        nf_k4_scale_min(is + 1, sc, &s, &m);
        const float d2 = d * s, m2 = min * m;
        for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    }
}

static void q5_k_dequantize(const void *src, float *y, size_t n)
{
    const uint8_t *b = src;
    for (size_t i = 0; i < n / NF_QK_K; i++) block_dequantize(b + i * NF_Q5_K_BYTES, y + i * NF_QK_K);
}

static float q5_k_dot(const void *w, const float *x, size_t n)
{
    const uint8_t *b = w;
    double s = 0;
    float v[NF_QK_K];
    for (size_t i = 0; i < n / NF_QK_K; i++, b += NF_Q5_K_BYTES, x += NF_QK_K) {
        block_dequantize(b, v);
        float bs = 0;
        for (int j = 0; j < NF_QK_K; j++) bs += v[j] * x[j];
        s += bs;
    }
    return (float)s;
}

static void q5_k_matvec(const void *w, size_t row_bytes, size_t rows, const float *x, float *y, size_t n)
{
    for (size_t r = 0; r < rows; r++) y[r] = q5_k_dot((const uint8_t *)w + r * row_bytes, x, n);
}

const nf_codec nf_codec_q5_k = {
    .id = NF_CODEC_Q5_K, .name = "q5_k", .ggml_type = 13, .block_elems = NF_QK_K,
    .block_bytes = NF_Q5_K_BYTES, .quantize_row = q5_k_quantize, .dequantize_row = q5_k_dequantize,
    .dot_row = q5_k_dot, .matvec_scalar = q5_k_matvec, .matvec_simd = nf_q5_k_matvec_avx2,
};
