/* AVX2+FMA f32 tile for prefill products: 4 rows of a dequantized block against one token at a
 * time, so each token vector load feeds four FMAs; 8-lane f32 accumulators, summed at the end,
 * with a scalar tail for cols % 8. */
#include <immintrin.h>

#include "backend/cpu/cpu_internal.h"

static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static void rows4(const float *w, size_t cols, const float *x, float *y)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 8 <= cols; i += 8) {
        __m256 xv = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), xv, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + cols + i), xv, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + 2 * cols + i), xv, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + 3 * cols + i), xv, a3);
    }
    float s[4] = {hsum8(a0), hsum8(a1), hsum8(a2), hsum8(a3)};
    for (; i < cols; i++)
        for (int r = 0; r < 4; r++) s[r] += w[r * cols + i] * x[i];
    for (int r = 0; r < 4; r++) y[r] = s[r];
}

static void row1(const float *w, size_t cols, const float *x, float *y)
{
    __m256 a = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= cols; i += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a);
    float s = hsum8(a);
    for (; i < cols; i++) s += w[i] * x[i];
    *y = s;
}

void nf_cpu_tile_avx2(const float *blk, size_t nb, size_t cols, const float *x, size_t ldx, size_t n, float *y,
                      size_t ldy)
{
    for (size_t t = 0; t < n; t++) {
        const float *xt = x + t * ldx;
        float *yt = y + t * ldy;
        size_t r = 0;
        for (; r + 4 <= nb; r += 4) rows4(blk + r * cols, cols, xt, yt + r);
        for (; r < nb; r++) row1(blk + r * cols, cols, xt, yt + r);
    }
}
