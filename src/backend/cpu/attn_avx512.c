/* AVX-512 scores for up to 16 consecutive query tokens of one head (prefill): attn_avx2.c's score
 * loop with 16 lanes (attn_scores.h), so each broadcast key element and each mul / add serves twice
 * the queries. Lane j runs exactly the scalar's s = fma(q_j[i], k[i], s), so the
 * attention keeps ops.c's scalar bits for any block or thread split (tests/cpu/test_cpu_ops). */
#include <immintrin.h>

#include "backend/cpu/attn_scores.h"

NF_ATTN_SCORES(nf_cpu_attn_scores16_avx512, __m512, 16, _mm512)

/* 16 consecutive v elements from idx as f32 (bf16 widens exactly). */
static inline __m512 v_at16(const nf_cpu_kv *kv, size_t idx)
{
    if (!kv->bf16) return _mm512_loadu_ps((const float *)kv->v + idx);
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)kv->v + idx));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Positions p .. p + (returned) - 1 (< n) lie in one page, at rows *row0, *row0 + 1, ...: the V sums
 * walk such runs so that no position pays nf_cpu_kv_row's division (perf: with a 32-bit div per
 * position against 8 FMAs, the two-query loop waited on it; 8 % of SmolLM2's prefill). */
static inline uint32_t page_run(const nf_cpu_kv *kv, const uint32_t *pages, uint32_t p, uint32_t n, size_t *row0)
{
    const uint32_t run = kv->page_tokens - p % kv->page_tokens;
    *row0 = nf_cpu_kv_row(kv, pages, p);
    return run < n - p ? run : n - p;
}

/* Q queries' sums over C vectors (16 C elements of the head from i) (cpu_internal.h): the positions
 * all Q see (p < n[0]) with each v vector loaded once for all Q, then each query's own last positions
 * alone, so every query's chain runs over its positions in order, the scalar's sequence. Four queries
 * per pass: with two, each position's 256 bytes of v (SmolLM2, from L2: a head's v over 256 positions
 * is 64 KB) fed only 8 FMAs and the loads, not the FMAs, set the pace (perf: 8 % of its prefill). */
static inline __attribute__((always_inline)) void wv_part(const int Q, const int C, const nf_cpu_kv *kv,
                                                          const uint32_t *pages, const float *const *w,
                                                          const uint32_t *n, size_t kv_row, size_t koff, uint32_t i,
                                                          float *const *o)
{
    __m512 a[4][4];
    for (int q = 0; q < Q; q++)
        for (int c = 0; c < C; c++) a[q][c] = _mm512_setzero_ps();
    for (uint32_t p = 0; p < n[0];) {
        size_t row;
        const uint32_t end = p + page_run(kv, pages, p, n[0], &row);
        for (size_t base = row * kv_row + koff + i; p < end; p++, base += kv_row) {
            __m512 b[4];
            for (int q = 0; q < Q; q++) b[q] = _mm512_set1_ps(w[q][p]);
            for (int c = 0; c < C; c++) {
                const __m512 v = v_at16(kv, base + 16 * (size_t)c);
                for (int q = 0; q < Q; q++) a[q][c] = _mm512_fmadd_ps(b[q], v, a[q][c]);
            }
        }
    }
    for (int q = 0; q < Q; q++) {
        for (uint32_t p = n[0]; p < n[q];) {
            size_t row;
            const uint32_t end = p + page_run(kv, pages, p, n[q], &row);
            for (size_t base = row * kv_row + koff + i; p < end; p++, base += kv_row) {
                const __m512 b = _mm512_set1_ps(w[q][p]);
                for (int c = 0; c < C; c++) a[q][c] = _mm512_fmadd_ps(b, v_at16(kv, base + 16 * (size_t)c), a[q][c]);
            }
        }
        for (int c = 0; c < C; c++) _mm512_storeu_ps(o[q] + i + 16 * c, a[q][c]);
    }
}

/* The head in parts of 64 elements (4 vectors), then 16, for Q queries. */
static inline __attribute__((always_inline)) void wv_head(const int Q, const nf_cpu_kv *kv, const uint32_t *pages,
                                                          const float *const *w, const uint32_t *n, size_t kv_row,
                                                          size_t koff, float *const *o)
{
    const uint32_t hd = kv->head_dim;
    uint32_t i = 0;
    for (; i + 64 <= hd; i += 64) wv_part(Q, 4, kv, pages, w, n, kv_row, koff, i, o);
    for (; i < hd; i += 16) wv_part(Q, 1, kv, pages, w, n, kv_row, koff, i, o);
}

void nf_cpu_weighted_v_avx512(const nf_cpu_kv *kv, const uint32_t *pages, const float *const *w, const uint32_t *n,
                              int nq, size_t kv_row, size_t koff, float *const *o)
{
    switch (nq) {
    case 1: wv_head(1, kv, pages, w, n, kv_row, koff, o); break;
    case 2: wv_head(2, kv, pages, w, n, kv_row, koff, o); break;
    case 3: wv_head(3, kv, pages, w, n, kv_row, koff, o); break;
    default: wv_head(4, kv, pages, w, n, kv_row, koff, o); break;
    }
}
