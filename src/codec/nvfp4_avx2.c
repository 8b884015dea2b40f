/* NVFP4 matrix-vector product with AVX2+FMA (compiled with -mavx2 -mfma -mf16c; called only after
 * the run-time check in nf_nvfp4_matvec).
 *
 * Per block of 16: the 8 data bytes are split into nibbles and re-interleaved so element order is
 * kept (low nibble = even element), a pshufb table turns each nibble into 2*e2m1 as int8 (exact),
 * widened to two vectors of 8 floats; the block sum of q*x is scaled by e4m3 / 2 and the row's sum
 * divided by its divisor once at the end. Four rows are done
 * at once so every x vector loaded feeds four rows; rows r and r+1 read their scales from one
 * 32-byte sector of the swizzled plane (16 bytes apart). */
#include <immintrin.h>
#include <string.h>

#include "codec/nvfp4.h"

#if defined(__AVX2__) && defined(__FMA__)

/* 2 * e2m1 value of each nibble, as int8: {0, 1, 2, 3, 4, 6, 8, 12} and their negatives. */
static __m128i lut_2q(void) { return _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12); }

/* The 16 values of one block, as 2*q in two float vectors (elements 0-7 and 8-15). */
static inline void decode_block(const uint8_t *d, __m128i lut, __m256 *lo, __m256 *hi)
{
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)d);
    __m128i n = _mm_unpacklo_epi8(_mm_and_si128(b, m4), _mm_and_si128(_mm_srli_epi16(b, 4), m4));
    __m128i q = _mm_shuffle_epi8(lut, n);
    *lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
    *hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
}

static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Swizzled offset of (row r, scale column 0); column group kg adds kg * 512. */
static inline uint64_t row_scale_base(uint64_t r, uint64_t kt)
{
    return (r / 128) * kt * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4;
}

/* The factors e4m3 / 2 of the 4 blocks of one column group, whose scale bytes are 4 consecutive
 * bytes of the swizzled plane (padding past the last column is read, never used).
 * e4m3 -> f32: the byte's exponent and mantissa bits placed in an fp32 (e, m<<20) and multiplied
 * by 2^120 rebias 7 -> 127 exactly; e = 0 lands on an fp32 subnormal, which is m * 2^-9 after the
 * multiply. A NaN byte (0x7f) would read as 480: validated planes have none. */
static inline void group_factors(const uint8_t *s, float f[4])
{
    uint32_t w;
    memcpy(&w, s, 4);
    __m128i b = _mm_cvtepu8_epi32(_mm_cvtsi32_si128((int)w));
    __m128i bits = _mm_or_si128(_mm_slli_epi32(_mm_and_si128(b, _mm_set1_epi32(0x80)), 24),
                                _mm_slli_epi32(_mm_and_si128(b, _mm_set1_epi32(0x7f)), 20));
    _mm_storeu_ps(f, _mm_mul_ps(_mm_castsi128_ps(bits), _mm_set1_ps(0x1p119f))); /* 2^120 / 2 */
}

/* NR rows (a constant after inlining, so acc[] lives in registers) starting at r, all blocks.
 * Row j accumulates sum_k e4m3_k * (block sum of q*x) and divides by its divisor once at the end,
 * as the GPU epilogue does; the scalar reference divides per block (same value up to rounding). */
static inline __attribute__((always_inline)) void rows_dot(const nf_nvfp4_planes *p, uint64_t r, const int NR,
                                                             const float *x, float *y)
{
    uint64_t cols = p->layout.cols, nb = cols / 16, kt = (nb + 3) / 4;
    const __m128i lut = lut_2q();
    const uint8_t *d[4], *s[4];
    __m256 acc[4];
    for (int j = 0; j < NR; j++) {
        d[j] = p->data + (r + j) * (cols / 2);
        s[j] = p->scales + row_scale_base(r + j, kt);
        acc[j] = _mm256_setzero_ps();
    }
    for (uint64_t kg = 0; kg < kt; kg++) {
        int nk = nb - kg * 4 < 4 ? (int)(nb - kg * 4) : 4;
        float f[4][4];
        for (int j = 0; j < NR; j++) group_factors(s[j] + kg * 512, f[j]);
        for (int kk = 0; kk < nk; kk++) {
            uint64_t k = kg * 4 + kk;
            __m256 x0 = _mm256_loadu_ps(x + k * 16), x1 = _mm256_loadu_ps(x + k * 16 + 8);
            for (int j = 0; j < NR; j++) {
                __m256 q0, q1;
                decode_block(d[j] + k * 8, lut, &q0, &q1);
                __m256 bs = _mm256_fmadd_ps(q1, x1, _mm256_mul_ps(q0, x0));
                acc[j] = _mm256_fmadd_ps(bs, _mm256_broadcast_ss(&f[j][kk]), acc[j]);
            }
        }
    }
    for (int j = 0; j < NR; j++) y[j] = hsum(acc[j]) / nf_nvfp4_row_divisor(p, r + j);
}

void nf_nvfp4_matvec_avx2(const nf_nvfp4_planes *p, uint64_t row0, uint64_t rows, const float *x, float *y)
{
    uint64_t i = 0;
    for (; i + 4 <= rows; i += 4) rows_dot(p, row0 + i, 4, x, y + i);
    for (; i < rows; i++) rows_dot(p, row0 + i, 1, x, y + i);
}

#else

void nf_nvfp4_matvec_avx2(const nf_nvfp4_planes *p, uint64_t row0, uint64_t rows, const float *x, float *y)
{
    nf_nvfp4_matvec_scalar(p, row0, rows, x, y);
}

#endif
