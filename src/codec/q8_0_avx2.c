/* AVX2+FMA+F16C matvec for q8_0. Per block of 32 and row: the 32 int8 values are widened to f32
 * and multiplied with x into one 8-lane register (4 FMAs, element j in lane j % 8), which is then
 * scaled by the block's d into the row's 8-lane accumulator (d * sum(q x) instead of
 * sum((d q) x): the same products, one rounding of the scale moved). */
#include "codec/avx2_util.h"
#include "codec/codec_simd.h"
#include "codec/ggml_blocks.h"

NF_INLINE void rows_kernel(const uint8_t *w, size_t rb, int R, const float *x, float *y, size_t n)
{
    __m256 acc[NF_MV_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (size_t ib = 0; ib < n / NF_QK_LEGACY; ib++) {
        const float *xb = x + ib * NF_QK_LEGACY;
        const __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8);
        const __m256 x2 = _mm256_loadu_ps(xb + 16), x3 = _mm256_loadu_ps(xb + 24);
        for (int r = 0; r < R; r++) {
            const uint8_t *b = w + r * rb + ib * NF_Q8_0_BYTES;
            __m256 s = _mm256_mul_ps(nf_load8_i8_ps(b + 2), x0);
            s = _mm256_fmadd_ps(nf_load8_i8_ps(b + 10), x1, s);
            s = _mm256_fmadd_ps(nf_load8_i8_ps(b + 18), x2, s);
            s = _mm256_fmadd_ps(nf_load8_i8_ps(b + 26), x3, s);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(nf_f16_at(b)), s, acc[r]);
        }
    }
    for (int r = 0; r < R; r++) y[r] = nf_hsum8(acc[r]);
}

void nf_q8_0_matvec_avx2(const void *w, size_t rb, size_t rows, const float *x, float *y, size_t n)
{
    nf_matvec_rows(rows_kernel, w, rb, rows, x, y, n);
}
