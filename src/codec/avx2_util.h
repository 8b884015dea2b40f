/* Internal to the *_avx2.c files (compiled with -mavx2 -mfma -mf16c): small vector helpers. */
#ifndef NF_CODEC_AVX2_UTIL_H
#define NF_CODEC_AVX2_UTIL_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

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

#endif
