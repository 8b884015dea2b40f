/* AVX2+FMA f32 tile for prefill products: a register tile of up to 4 rows of a dequantized block
 * x 3 tokens (12 8-lane f32 accumulators + 3 token vectors + 1 weight vector = the 16 ymm
 * registers), so each token vector load feeds four FMAs and each weight vector load three; the
 * 4x1 kernel it replaces fed four FMAs per token load but reloaded every weight row per token.
 *
 * Every output is still computed as one 8-lane accumulator over the columns in order, then hsum8,
 * then a scalar tail for cols % 8 in order: the per-output summation order does not depend on the
 * tile shape, the block split or the thread split, and the results are bit-identical to the 4x1
 * kernel's. */
#include <immintrin.h>

#include "backend/cpu/cpu_internal.h"

static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* y[t*ldy + r] = sum_i w[r*cols + i] * x[t*ldx + i] for r < R, t < T; R <= 4, T <= 3 are
 * compile-time constants at every call, so the loops unroll and acc stays in registers. */
static inline __attribute__((always_inline)) void tile(int R, int T, const float *w, size_t cols,
                                                        const float *x, size_t ldx, float *y, size_t ldy)
{
    __m256 acc[4][3];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= cols; i += 8) {
        __m256 xv[3];
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) xv[t] = _mm256_loadu_ps(x + t * ldx + i);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 wv = _mm256_loadu_ps(w + r * cols + i);
#pragma GCC unroll 3
            for (int t = 0; t < T; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    const size_t i0 = i;
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int t = 0; t < T; t++) {
            const float *wr = w + r * cols, *xt = x + t * ldx;
            float s = hsum8(acc[r][t]);
            for (i = i0; i < cols; i++) s += wr[i] * xt[i];
            y[t * ldy + r] = s;
        }
}

/* All nb rows against tokens [0, T) of x: rows in fours, then one at a time. */
static inline __attribute__((always_inline)) void tokens(int T, const float *blk, size_t nb, size_t cols,
                                                          const float *x, size_t ldx, float *y, size_t ldy)
{
    size_t r = 0;
    for (; r + 4 <= nb; r += 4) tile(4, T, blk + r * cols, cols, x, ldx, y + r, ldy);
    for (; r < nb; r++) tile(1, T, blk + r * cols, cols, x, ldx, y + r, ldy);
}

void nf_cpu_tile_avx2(const float *blk, size_t nb, size_t cols, const float *x, size_t ldx, size_t n, float *y,
                      size_t ldy)
{
    size_t t = 0;
    for (; t + 3 <= n; t += 3) tokens(3, blk, nb, cols, x + t * ldx, ldx, y + t * ldy, ldy);
    if (n - t == 2) tokens(2, blk, nb, cols, x + t * ldx, ldx, y + t * ldy, ldy);
    else if (n - t == 1) tokens(1, blk, nb, cols, x + t * ldx, ldx, y + t * ldy, ldy);
}
