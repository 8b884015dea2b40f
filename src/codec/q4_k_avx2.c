/* AVX2+FMA+F16C matvec for q4_k. For sub-block j of a super-block the decoded weights are
 * d1*q - m1 (d1 = d*sc_j, m1 = dmin*m_j, as dequantize computes them), so
 *   sum_i w_i x_i = d1 * sum_i q_i x_i - m1 * sum_i x_i.
 * Per super-block the 8 sub-block sums of x are formed once (8-lane vectors) and shared by the
 * rows of the group; per row and sub-block sum(q x) is one 8-lane register (4 FMAs), folded into
 * the row's accumulator with d1, and m1 * sum(x) into a second accumulator. y = hsum(acc - macc). */
#include "codec/avx2_util.h"
#include "codec/codec_simd.h"
#include "codec/ggml_blocks.h"

NF_INLINE void rows_kernel(const uint8_t *w, size_t rb, int R, const float *x, float *y, size_t n)
{
    const __m256i lo4 = _mm256_set1_epi32(0xF);
    __m256 acc[NF_MV_ROWS], macc[NF_MV_ROWS];
    for (int r = 0; r < R; r++) acc[r] = macc[r] = _mm256_setzero_ps();
    for (size_t ib = 0; ib < n / NF_QK_K; ib++) {
        const float *xb = x + ib * NF_QK_K;
        __m256 xs[8]; /* per sub-block: lane l holds x[32j + l] + x[32j + 8 + l] + ... */
        for (int j = 0; j < 8; j++)
            xs[j] = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xb + 32 * j), _mm256_loadu_ps(xb + 32 * j + 8)),
                                  _mm256_add_ps(_mm256_loadu_ps(xb + 32 * j + 16), _mm256_loadu_ps(xb + 32 * j + 24)));
        for (int r = 0; r < R; r++) {
            const uint8_t *b = w + r * rb + ib * NF_Q4_K_BYTES;
            const float d = nf_f16_at(b), dmin = nf_f16_at(b + 2);
            const uint8_t *qs = b + 16;
            for (int p = 0; p < 4; p++, qs += 32) {
                const float *xl = xb + 64 * p, *xh = xl + 32;
                __m256 sl = _mm256_setzero_ps(), sh = _mm256_setzero_ps();
                for (int k = 0; k < 32; k += 8) {
                    const __m256i q = nf_load8_u8(qs + k);
                    sl = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q, lo4)), _mm256_loadu_ps(xl + k), sl);
                    sh = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4)), _mm256_loadu_ps(xh + k), sh);
                }
                nf_k4_apply_scales(b + 4, p, d, dmin, sl, sh, xs, &acc[r], &macc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) y[r] = nf_hsum8(_mm256_sub_ps(acc[r], macc[r]));
}

void nf_q4_k_matvec_avx2(const void *w, size_t rb, size_t rows, const float *x, float *y, size_t n)
{
    nf_matvec_rows(rows_kernel, w, rb, rows, x, y, n);
}
