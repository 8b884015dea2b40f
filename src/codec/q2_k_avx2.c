/* AVX2+FMA+F16C matvec for q2_k. The 32 bytes qs[32h .. 32h + 31] (half h = 0, 1) hold the 2-bit
 * levels of elements 128h + 32j + l in bits 2j..2j+1 of byte l (j = 0..3): per half one 32-byte
 * load gives, for each j, 32 levels by a shift and a mask, widened 8 at a time to f32. Sub-block i
 * (16 elements) decodes to d1*q - m1 (d1 = d * (scales[i] & 15), m1 = dmin * (scales[i] >> 4), as
 * the decoder forms them), hence
 *   sum w x = sum_i d1_i * sum(q x over i) - m1_i * sum(x over i).
 * Per super-block the 16 sub-block sums of x are formed once (8-lane vectors) and shared by the
 * rows of the group; per row each sub-block's sum(q x) is one 8-lane register. Shift counts are in
 * registers (see q3_k_avx2.c). */
#include "codec/avx2_util.h"
#include "codec/codec_simd.h"
#include "codec/ggml_blocks.h"

/* sum over 16 levels v (one 128-bit half, bytes 0..3) times x[0..16), as one 8-lane vector */
NF_INLINE __m256 dot16_u8(__m128i v, const float *x)
{
    const __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)), _mm256_loadu_ps(x));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8))), _mm256_loadu_ps(x + 8), s);
}

NF_INLINE void rows_kernel(const uint8_t *w, size_t rb, int R, const float *x, float *y, size_t n)
{
    const __m256i m3 = _mm256_set1_epi8(3);
    __m256 acc[NF_MV_ROWS], macc[NF_MV_ROWS];
    for (int r = 0; r < R; r++) acc[r] = macc[r] = _mm256_setzero_ps();
    for (size_t ib = 0; ib < n / NF_QK_K; ib++) {
        const float *xb = x + ib * NF_QK_K;
        __m256 xs[16]; /* sub-block i: lane l holds x[16i + l] + x[16i + 8 + l] */
        for (int i = 0; i < 16; i++) xs[i] = _mm256_add_ps(_mm256_loadu_ps(xb + 16 * i), _mm256_loadu_ps(xb + 16 * i + 8));
        for (int r = 0; r < R; r++) {
            const uint8_t *b = w + r * rb + ib * NF_Q2_K_BYTES, *sc = b;
            const float d = nf_f16_at(b + 80), dmin = nf_f16_at(b + 82);
            for (int h = 0; h < 2; h++) {
                const __m256i q = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * h));
                for (int j = 0; j < 4; j++) {
                    const __m256i v = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j)), m3);
                    const float *xl = xb + 128 * h + 32 * j;
                    const int i = 8 * h + 2 * j; /* sub-blocks i (l < 16) and i + 1 */
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)(sc[i] & 0xF)), dot16_u8(_mm256_castsi256_si128(v), xl), acc[r]);
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)(sc[i + 1] & 0xF)),
                                             dot16_u8(_mm256_extracti128_si256(v, 1), xl + 16), acc[r]);
                    macc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dmin * (float)(sc[i] >> 4)), xs[i], macc[r]);
                    macc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dmin * (float)(sc[i + 1] >> 4)), xs[i + 1], macc[r]);
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
