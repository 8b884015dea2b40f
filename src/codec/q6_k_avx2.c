/* AVX2+FMA+F16C matvec for q6_k. Per half super-block (128 elements: ql 64 bytes, qh 32) and
 * 8-element step k, one load of ql[k], ql[k+32] and qh[k] yields the levels of elements k, k+32,
 * k+64, k+96 (four sub-blocks); q - 32 is formed in integers, converted and multiplied with x into
 * four 8-lane sums, which are scaled by d*sc (as dequantize forms it) into the row's accumulator
 * at the end of each 16-element sub-block. */
#include "codec/avx2_util.h"
#include "codec/codec_simd.h"
#include "codec/ggml_blocks.h"

NF_INLINE void rows_kernel(const uint8_t *w, size_t rb, int R, const float *x, float *y, size_t n)
{
    const __m256i lo4 = _mm256_set1_epi32(0xF), m30 = _mm256_set1_epi32(0x30), c32 = _mm256_set1_epi32(32);
    __m256 acc[NF_MV_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (size_t ib = 0; ib < n / NF_QK_K; ib++) {
        const float *xb = x + ib * NF_QK_K;
        for (int r = 0; r < R; r++) {
            const uint8_t *b = w + r * rb + ib * NF_Q6_K_BYTES;
            const float d = nf_f16_at(b + 208);
            const int8_t *sc = (const int8_t *)(b + 192);
            for (int half = 0; half < 2; half++) {
                const uint8_t *ql = b + 64 * half, *qh = b + 128 + 32 * half;
                const float *xh = xb + 128 * half;
                for (int s = 0; s < 2; s++) { /* sub-blocks 8*half + s + {0, 2, 4, 6} */
                    __m256 s1 = _mm256_setzero_ps(), s2 = s1, s3 = s1, s4 = s1;
                    for (int k = 16 * s; k < 16 * s + 16; k += 8) {
                        const __m256i a = nf_load8_u8(ql + k), c = nf_load8_u8(ql + k + 32), h = nf_load8_u8(qh + k);
                        const __m256i q1 = _mm256_or_si256(_mm256_and_si256(a, lo4), _mm256_and_si256(_mm256_slli_epi32(h, 4), m30));
                        const __m256i q2 = _mm256_or_si256(_mm256_and_si256(c, lo4), _mm256_and_si256(_mm256_slli_epi32(h, 2), m30));
                        const __m256i q3 = _mm256_or_si256(_mm256_srli_epi32(a, 4), _mm256_and_si256(h, m30));
                        const __m256i q4 = _mm256_or_si256(_mm256_srli_epi32(c, 4), _mm256_and_si256(_mm256_srli_epi32(h, 2), m30));
                        s1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q1, c32)), _mm256_loadu_ps(xh + k), s1);
                        s2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q2, c32)), _mm256_loadu_ps(xh + k + 32), s2);
                        s3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q3, c32)), _mm256_loadu_ps(xh + k + 64), s3);
                        s4 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q4, c32)), _mm256_loadu_ps(xh + k + 96), s4);
                    }
                    const int8_t *scs = sc + 8 * half + s;
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * scs[0]), s1, acc[r]);
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * scs[2]), s2, acc[r]);
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * scs[4]), s3, acc[r]);
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * scs[6]), s4, acc[r]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++) y[r] = nf_hsum8(acc[r]);
}

void nf_q6_k_matvec_avx2(const void *w, size_t rb, size_t rows, const float *x, float *y, size_t n)
{
    nf_matvec_rows(rows_kernel, w, rb, rows, x, y, n);
}
