/* AVX2+FMA+F16C matvec for q3_k. The 32 bytes qs[32h .. 32h + 31] (half h = 0, 1) hold the low 2
 * bits of elements 128h + 32j + l in bits 2j..2j+1 of byte l (j = 0..3), and bit 4h + j of
 * hmask[l] is their high bit; the level is low - 4 when that bit is clear (in [-4, 3]). So per half
 * one 32-byte load of qs and of hmask give, for each j, 32 int8 levels in a few byte operations
 * (shift, mask, compare, subtract); they are widened 8 at a time to f32 and multiplied with x
 * into one 8-lane sum per 16-element sub-block, scaled into the row's accumulator by d * sc_i (as
 * the decoder forms it). Shift counts are in registers: the Debug build does not make immediates
 * of loop variables. */
#include "codec/avx2_util.h"
#include "codec/codec_simd.h"
#include "codec/ggml_blocks.h"

/* sum over 16 int8 levels v (one 128-bit half) times x[0..16), as one 8-lane vector */
NF_INLINE __m256 dot16_i8(__m128i v, const float *x)
{
    const __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), _mm256_loadu_ps(x));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))), _mm256_loadu_ps(x + 8), s);
}

NF_INLINE void rows_kernel(const uint8_t *w, size_t rb, int R, const float *x, float *y, size_t n)
{
    const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4), zero = _mm256_setzero_si256();
    __m256 acc[NF_MV_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (size_t ib = 0; ib < n / NF_QK_K; ib++) {
        const float *xb = x + ib * NF_QK_K;
        for (int r = 0; r < R; r++) {
            const uint8_t *b = w + r * rb + ib * NF_Q3_K_BYTES;
            const float d = nf_f16_at(b + 108);
            const __m256i hm = _mm256_loadu_si256((const __m256i *)b);
            for (int h = 0; h < 2; h++) {
                const __m256i q = _mm256_loadu_si256((const __m256i *)(b + 32 + 32 * h));
                for (int j = 0; j < 4; j++) {
                    const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j)), m3);
                    const __m256i clear = _mm256_cmpeq_epi8(_mm256_and_si256(hm, _mm256_set1_epi8((char)(1 << (4 * h + j)))), zero);
                    const __m256i v = _mm256_sub_epi8(lo, _mm256_and_si256(clear, four));
                    const float *xl = xb + 128 * h + 32 * j;
                    const int i = 8 * h + 2 * j; /* sub-blocks i (l < 16) and i + 1 */
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)nf_q3_k_scale(b + 96, i)),
                                             dot16_i8(_mm256_castsi256_si128(v), xl), acc[r]);
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)nf_q3_k_scale(b + 96, i + 1)),
                                             dot16_i8(_mm256_extracti128_si256(v, 1), xl + 16), acc[r]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++) y[r] = nf_hsum8(acc[r]);
}

void nf_q3_k_matvec_avx2(const void *w, size_t rb, size_t rows, const float *x, float *y, size_t n)
{
    nf_matvec_rows(rows_kernel, w, rb, rows, x, y, n);
}
