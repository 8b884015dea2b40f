/* AVX2+FMA+F16C matvec for q3_k. As q2_k, byte qs[32h + l] holds the low 2 bits of elements
 * 128h + 32j + l in bits 2j..2j+1; their high bit is bit 4h + j of hmask[l], and the level is
 * low - 4 when that bit is clear (q = low + 4*bit - 4, in [-4, 3]). One 8-byte load of qs and one
 * of hmask yield 8 lanes of four elements' levels; each 16-element sub-block's sum(q x) is one
 * 8-lane register, scaled into the row's accumulator by d * sc_i (as the decoder forms it). */
#include "codec/avx2_util.h"
#include "codec/codec_simd.h"
#include "codec/ggml_blocks.h"

/* levels of 8 elements: ((q >> 2j) & 3) | (((h >> hb) & 1) << 2), minus 4 (shift counts in registers:
 * the Debug build does not fold them into immediates) */
NF_INLINE __m256 levels8(__m256i q, __m256i h, int j, int hb)
{
    const __m256i m3 = _mm256_set1_epi32(3), one = _mm256_set1_epi32(1), m4 = _mm256_set1_epi32(4);
    const __m256i lo = _mm256_and_si256(_mm256_srl_epi32(q, _mm_cvtsi32_si128(2 * j)), m3);
    const __m256i hi = _mm256_slli_epi32(_mm256_and_si256(_mm256_srl_epi32(h, _mm_cvtsi32_si128(hb)), one), 2);
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_or_si256(lo, hi), m4));
}

NF_INLINE void rows_kernel(const uint8_t *w, size_t rb, int R, const float *x, float *y, size_t n)
{
    __m256 acc[NF_MV_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (size_t ib = 0; ib < n / NF_QK_K; ib++) {
        const float *xb = x + ib * NF_QK_K;
        for (int r = 0; r < R; r++) {
            const uint8_t *b = w + r * rb + ib * NF_Q3_K_BYTES;
            const float d = nf_f16_at(b + 108);
            for (int h = 0; h < 2; h++)
                for (int g = 0; g < 2; g++) { /* l in [16g, 16g + 16): sub-blocks 8h + 2j + g */
                    const uint8_t *qs = b + 32 + 32 * h + 16 * g, *hm = b + 16 * g;
                    const __m256i q0 = nf_load8_u8(qs), q1 = nf_load8_u8(qs + 8);
                    const __m256i h0 = nf_load8_u8(hm), h1 = nf_load8_u8(hm + 8);
                    const float *xl = xb + 128 * h + 16 * g;
                    for (int j = 0; j < 4; j++) {
                        __m256 s = _mm256_mul_ps(levels8(q0, h0, j, 4 * h + j), _mm256_loadu_ps(xl + 32 * j));
                        s = _mm256_fmadd_ps(levels8(q1, h1, j, 4 * h + j), _mm256_loadu_ps(xl + 32 * j + 8), s);
                        const float dl = d * (float)nf_q3_k_scale(b + 96, 8 * h + 2 * j + g);
                        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dl), s, acc[r]);
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
