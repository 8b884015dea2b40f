/* Internal to the *_avx2.c files (compiled with -mavx2 -mfma -mf16c): small vector helpers. */
#ifndef NF_CODEC_AVX2_UTIL_H
#define NF_CODEC_AVX2_UTIL_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "codec/ggml_blocks.h"

#define NF_INLINE static inline __attribute__((always_inline))

/* Sum of the 8 lanes: pairwise, (0+4, 1+5, 2+6, 3+7), then (01, 23), then the last pair. */
NF_INLINE float nf_hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 unsigned bytes at p, widened to 8 int32 lanes. */
NF_INLINE __m256i nf_load8_u8(const uint8_t *p)
{
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

/* 8 signed bytes at p as 8 floats. */
NF_INLINE __m256 nf_load8_i8_ps(const uint8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* The f16 at p as f32 (F16C; exact, the same value as nf_f16_to_f32 for every non-NaN input). */
NF_INLINE float nf_f16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* Rows are processed NF_MV_ROWS at a time, interleaved block by block, so several weight streams
 * are in flight and each slice of x is loaded into L1 once per group. */
#define NF_MV_ROWS 4

/* q4_k and q5_k: sub-blocks 2p and 2p+1 of a block (scales at `scales`, 12 bytes) contribute
 * d*sc*(q . x) to acc and dmin*m*sum(x) to macc, given their q . x sums sl, sh and the x sums xs. */
NF_INLINE void nf_k4_apply_scales(const uint8_t *scales, int p, float d, float dmin, __m256 sl, __m256 sh,
                                  const __m256 *xs, __m256 *acc, __m256 *macc)
{
    uint8_t s0, m0, s1, m1;
    nf_k4_scale_min(2 * p, scales, &s0, &m0);
    nf_k4_scale_min(2 * p + 1, scales, &s1, &m1);
    *acc = _mm256_fmadd_ps(_mm256_set1_ps(d * s0), sl, *acc);
    *acc = _mm256_fmadd_ps(_mm256_set1_ps(d * s1), sh, *acc);
    *macc = _mm256_fmadd_ps(_mm256_set1_ps(dmin * m0), xs[2 * p], *macc);
    *macc = _mm256_fmadd_ps(_mm256_set1_ps(dmin * m1), xs[2 * p + 1], *macc);
}

/* A codec's kernel over R <= NF_MV_ROWS consecutive rows rb bytes apart. */
typedef void (*nf_rows_kernel)(const uint8_t *w, size_t rb, int R, const float *x, float *y, size_t n);

/* The matvec every row codec shares: groups of NF_MV_ROWS rows, then the remainder one at a time.
 * Inlined with a constant kernel, so each codec keeps its own specialised loop. */
NF_INLINE void nf_matvec_rows(nf_rows_kernel kernel, const void *w, size_t rb, size_t rows, const float *x, float *y,
                              size_t n)
{
    const uint8_t *p = w;
    size_t r = 0;
    for (; r + NF_MV_ROWS <= rows; r += NF_MV_ROWS) kernel(p + r * rb, rb, NF_MV_ROWS, x, y + r, n);
    for (; r < rows; r++) kernel(p + r * rb, rb, 1, x, y + r, n);
}

/* Levels of the 64 elements 64 p .. 64 p + 63 of a q4_k / q5_k super-block (qs: its 128 nibble bytes):
 * *lo the first 32 (low nibbles), *hi the next 32 (high nibbles); q5 adds the fifth bits from *hb
 * (the 32 qh bytes, shifted right by 2 per p: call with p = 0, 1, 2, 3 in turn). */
NF_INLINE void nf_k45_levels(int q5, const uint8_t *qs, int p, __m256i *hb, __m256i *lo, __m256i *hi)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * p));
    *lo = _mm256_and_si256(v, m4), *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    if (q5) {
        *lo = _mm256_or_si256(*lo, _mm256_slli_epi16(_mm256_and_si256(*hb, _mm256_set1_epi8(1)), 4));
        *hi = _mm256_or_si256(*hi, _mm256_slli_epi16(_mm256_and_si256(*hb, _mm256_set1_epi8(2)), 3));
        *hb = _mm256_srli_epi16(*hb, 2);
    }
}

#endif
