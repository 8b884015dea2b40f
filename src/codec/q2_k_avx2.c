/* AVX2+FMA+F16C matvec for q2_k. Byte qs[32h + l] (half h = 0, 1; l < 32) holds the 2-bit levels of
 * elements 128h + 32j + l in bits 2j..2j+1 (j = 0..3), so one 8-byte load yields 8 lanes of four
 * elements' levels. Sub-block i (16 elements) decodes to d1*q - m1 (d1 = d * (scales[i] & 15),
 * m1 = dmin * (scales[i] >> 4), as the decoder forms them), hence
 *   sum w x = sum_i d1_i * sum(q x over i) - m1_i * sum(x over i).
 * Per super-block the 16 sub-block sums of x are formed once (8-lane vectors) and shared by the
 * rows of the group; per row each sub-block's sum(q x) is one 8-lane register. */
#include "codec/avx2_util.h"
#include "codec/codec_simd.h"
#include "codec/ggml_blocks.h"

NF_INLINE void rows_kernel(const uint8_t *w, size_t rb, int R, const float *x, float *y, size_t n)
{
    const __m256i m3 = _mm256_set1_epi32(3);
    __m256 acc[NF_MV_ROWS], macc[NF_MV_ROWS];
    for (int r = 0; r < R; r++) acc[r] = macc[r] = _mm256_setzero_ps();
    for (size_t ib = 0; ib < n / NF_QK_K; ib++) {
        const float *xb = x + ib * NF_QK_K;
        __m256 xs[16]; /* sub-block i: lane l holds x[16i + l] + x[16i + 8 + l] */
        for (int i = 0; i < 16; i++) xs[i] = _mm256_add_ps(_mm256_loadu_ps(xb + 16 * i), _mm256_loadu_ps(xb + 16 * i + 8));
        for (int r = 0; r < R; r++) {
            const uint8_t *b = w + r * rb + ib * NF_Q2_K_BYTES, *sc = b;
            const float d = nf_f16_at(b + 80), dmin = nf_f16_at(b + 82);
            for (int h = 0; h < 2; h++)
                for (int g = 0; g < 2; g++) { /* l in [16g, 16g + 16): sub-blocks 8h + 2j + g */
                    const __m256i q0 = nf_load8_u8(b + 16 + 32 * h + 16 * g), q1 = nf_load8_u8(b + 24 + 32 * h + 16 * g);
                    const float *xl = xb + 128 * h + 16 * g;
                    for (int j = 0; j < 4; j++) {
                        const __m128i c = _mm_cvtsi32_si128(2 * j); /* a register count: see q3_k_avx2.c */
                        __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srl_epi32(q0, c), m3)),
                                                 _mm256_loadu_ps(xl + 32 * j));
                        s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srl_epi32(q1, c), m3)),
                                            _mm256_loadu_ps(xl + 32 * j + 8), s);
                        const int i = 8 * h + 2 * j + g;
                        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)(sc[i] & 0xF)), s, acc[r]);
                        macc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dmin * (float)(sc[i] >> 4)), xs[i], macc[r]);
                    }
                }
        }
    }
    for (int r = 0; r < R; r++) y[r] = nf_hsum8(_mm256_sub_ps(acc[r], macc[r]));
}

void nf_q2_k_matvec_avx2(const void *w, size_t rb, size_t rows, const float *x, float *y, size_t n)
{
    nf_matvec_rows(rows_kernel, w, rb, rows, x, y, n);
}
