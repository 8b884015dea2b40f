/* AVX2+FMA+F16C matvec for f32, f16 and bf16 weights (f32 activations). Each row accumulates in
 * two 8-lane f32 registers (elements 16k..16k+7 and 16k+8..16k+15), summed at the end with
 * nf_hsum8; a tail of n % 16 elements is added in scalar order after the vector sum. */
#include "codec/avx2_util.h"
#include "codec/codec.h"
#include "codec/codec_simd.h"

/* 8 weights at element i of a row, as f32. KIND: 0 f32, 1 f16, 2 bf16. */
NF_INLINE __m256 load_w(const uint8_t *row, size_t i, int kind)
{
    if (kind == 0) return _mm256_loadu_ps((const float *)(const void *)(row + 4 * i));
    __m128i h = _mm_loadu_si128((const __m128i *)(row + 2 * i));
    if (kind == 1) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

NF_INLINE float scalar_w(const uint8_t *row, size_t i, int kind)
{
    if (kind == 0) {
        float v;
        memcpy(&v, row + 4 * i, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, row + 2 * i, 2);
    return kind == 1 ? nf_f16_to_f32(h) : nf_bf16_to_f32(h);
}

NF_INLINE void rows_kernel(const uint8_t *w, size_t rb, int R, const float *x, float *y, size_t n, int kind)
{
    __m256 a0[NF_MV_ROWS], a1[NF_MV_ROWS];
    for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
        for (int r = 0; r < R; r++) {
            a0[r] = _mm256_fmadd_ps(load_w(w + r * rb, i, kind), x0, a0[r]);
            a1[r] = _mm256_fmadd_ps(load_w(w + r * rb, i + 8, kind), x1, a1[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        float s = nf_hsum8(_mm256_add_ps(a0[r], a1[r]));
        for (size_t j = i; j < n; j++) s += scalar_w(w + r * rb, j, kind) * x[j];
        y[r] = s;
    }
}

NF_INLINE void matvec(const void *w, size_t rb, size_t rows, const float *x, float *y, size_t n, int kind)
{
    const uint8_t *p = w;
    size_t r = 0;
    for (; r + NF_MV_ROWS <= rows; r += NF_MV_ROWS) rows_kernel(p + r * rb, rb, NF_MV_ROWS, x, y + r, n, kind);
    for (; r < rows; r++) rows_kernel(p + r * rb, rb, 1, x, y + r, n, kind);
}

void nf_f32_matvec_avx2(const void *w, size_t rb, size_t rows, const float *x, float *y, size_t n)
{
    matvec(w, rb, rows, x, y, n, 0);
}

void nf_f16_matvec_avx2(const void *w, size_t rb, size_t rows, const float *x, float *y, size_t n)
{
    matvec(w, rb, rows, x, y, n, 1);
}

void nf_bf16_matvec_avx2(const void *w, size_t rb, size_t rows, const float *x, float *y, size_t n)
{
    matvec(w, rb, rows, x, y, n, 2);
}
