/* AVX2+FMA+F16C matvec for iq4_nl and iq4_xs. A 16-byte run of qs holds 32 nibbles; each indexes
 * the 16-entry int8 table kvalues_iq4nl, which fits one SSE register, so one pshufb per 16 nibbles
 * turns indices into values (low nibbles: elements 0..15 of the 32, high nibbles: 16..31). The
 * int8 values are widened to f32 and multiplied with x into one 8-lane sum per 32 elements (4
 * FMAs), scaled into the row's accumulator by the block's d (iq4_nl) or the sub-block's d*ls
 * (iq4_xs, formed as the decoder forms it). */
#include "codec/avx2_util.h"
#include "codec/codec_simd.h"
#include "codec/ggml_blocks.h"

/* sum over the 32 elements of qs[0..16) of kv[nibble] * x[element], as one 8-lane vector */
NF_INLINE __m256 nibbles32_dot(const uint8_t *qs, __m128i table, const float *x)
{
    const __m128i q = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(0xF);
    const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(q, m4));
    const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
    __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), _mm256_loadu_ps(x));
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), _mm256_loadu_ps(x + 8), s);
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), _mm256_loadu_ps(x + 16), s);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), _mm256_loadu_ps(x + 24), s);
}

NF_INLINE void nl_kernel(const uint8_t *w, size_t rb, int R, const float *x, float *y, size_t n)
{
    const __m128i table = _mm_loadu_si128((const __m128i *)nf_iq4_values);
    __m256 acc[NF_MV_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (size_t ib = 0; ib < n / NF_QK_LEGACY; ib++) {
        const float *xb = x + ib * NF_QK_LEGACY;
        for (int r = 0; r < R; r++) {
            const uint8_t *b = w + r * rb + ib * NF_IQ4_NL_BYTES;
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(nf_f16_at(b)), nibbles32_dot(b + 2, table, xb), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) y[r] = nf_hsum8(acc[r]);
}

NF_INLINE void xs_kernel(const uint8_t *w, size_t rb, int R, const float *x, float *y, size_t n)
{
    const __m128i table = _mm_loadu_si128((const __m128i *)nf_iq4_values);
    __m256 acc[NF_MV_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (size_t ib = 0; ib < n / NF_QK_K; ib++) {
        const float *xb = x + ib * NF_QK_K;
        for (int r = 0; r < R; r++) {
            const uint8_t *b = w + r * rb + ib * NF_IQ4_XS_BYTES;
            const float d = nf_f16_at(b);
            for (int s = 0; s < 8; s++) {
                const float dl = d * (float)nf_iq4_xs_scale(b, s);
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dl), nibbles32_dot(b + 8 + 16 * s, table, xb + 32 * s), acc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) y[r] = nf_hsum8(acc[r]);
}

void nf_iq4_nl_matvec_avx2(const void *w, size_t rb, size_t rows, const float *x, float *y, size_t n)
{
    nf_matvec_rows(nl_kernel, w, rb, rows, x, y, n);
}

void nf_iq4_xs_matvec_avx2(const void *w, size_t rb, size_t rows, const float *x, float *y, size_t n)
{
    nf_matvec_rows(xs_kernel, w, rb, rows, x, y, n);
}
