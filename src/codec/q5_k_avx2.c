/* AVX2+FMA+F16C matvec for q5_k: the q4_k scheme (see q4_k_avx2.c) with the fifth bit of each
 * level taken from qh: for the sub-block pair p, bit 2p of qh[l] belongs to element 64p + l and
 * bit 2p+1 to element 64p + 32 + l. */
#include "codec/avx2_util.h"
#include "codec/codec_simd.h"
#include "codec/ggml_blocks.h"

NF_INLINE void rows_kernel(const uint8_t *w, size_t rb, int R, const float *x, float *y, size_t n)
{
    const __m256i lo4 = _mm256_set1_epi32(0xF), bit4 = _mm256_set1_epi32(0x10);
    __m256 acc[NF_MV_ROWS], macc[NF_MV_ROWS];
    for (int r = 0; r < R; r++) acc[r] = macc[r] = _mm256_setzero_ps();
    for (size_t ib = 0; ib < n / NF_QK_K; ib++) {
        const float *xb = x + ib * NF_QK_K;
        __m256 xs[8];
        for (int j = 0; j < 8; j++)
            xs[j] = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xb + 32 * j), _mm256_loadu_ps(xb + 32 * j + 8)),
                                  _mm256_add_ps(_mm256_loadu_ps(xb + 32 * j + 16), _mm256_loadu_ps(xb + 32 * j + 24)));
        for (int r = 0; r < R; r++) {
            const uint8_t *b = w + r * rb + ib * NF_Q5_K_BYTES;
            const float d = nf_f16_at(b), dmin = nf_f16_at(b + 2);
            const uint8_t *qh = b + 16, *qs = b + 48;
            for (int p = 0; p < 4; p++, qs += 32) {
                const float *xl = xb + 64 * p, *xh = xl + 32;
                /* move bit 2p to bit 4 (low half) and bit 2p+1 to bit 4 (high half) */
                const __m128i shl = _mm_cvtsi32_si128(2 * p), shh = _mm_cvtsi32_si128(2 * p + 1);
                __m256 sl = _mm256_setzero_ps(), sh = _mm256_setzero_ps();
                for (int k = 0; k < 32; k += 8) {
                    const __m256i q = nf_load8_u8(qs + k), h = _mm256_slli_epi32(nf_load8_u8(qh + k), 4);
                    const __m256i ql = _mm256_or_si256(_mm256_and_si256(q, lo4), _mm256_and_si256(_mm256_srl_epi32(h, shl), bit4));
                    const __m256i qu = _mm256_or_si256(_mm256_srli_epi32(q, 4), _mm256_and_si256(_mm256_srl_epi32(h, shh), bit4));
                    sl = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ql), _mm256_loadu_ps(xl + k), sl);
                    sh = _mm256_fmadd_ps(_mm256_cvtepi32_ps(qu), _mm256_loadu_ps(xh + k), sh);
                }
                nf_k4_apply_scales(b + 4, p, d, dmin, sl, sh, xs, &acc[r], &macc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) y[r] = nf_hsum8(_mm256_sub_ps(acc[r], macc[r]));
}

void nf_q5_k_matvec_avx2(const void *w, size_t rb, size_t rows, const float *x, float *y, size_t n)
{
    nf_matvec_rows(rows_kernel, w, rb, rows, x, y, n);
}
