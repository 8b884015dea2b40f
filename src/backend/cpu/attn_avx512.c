/* AVX-512 scores for up to 16 consecutive query tokens of one head (prefill): attn_avx2.c's score
 * loop with 16 lanes (attn_scores.h), so each broadcast key element and each mul / add serves twice
 * the queries. Lane j runs exactly the scalar's s = s + q_j[i] * k[i] (separate mul and add), so the
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

/* C vectors (16 C elements of the head from i) of one or two queries' sums (cpu_internal.h). */
static inline __attribute__((always_inline)) void wv_part(const int C, const nf_cpu_kv *kv, const uint32_t *pages,
                                                          const float *w0, uint32_t n0, const float *w1, uint32_t n1,
                                                          size_t kv_row, size_t koff, uint32_t i, float *o0, float *o1)
{
    __m512 a0[4], a1[4];
    for (int c = 0; c < C; c++) a0[c] = a1[c] = _mm512_setzero_ps();
    uint32_t p = 0;
    if (w1)
        for (; p < n0; p++) {
            const size_t base = nf_cpu_kv_row(kv, pages, p) * kv_row + koff + i;
            const __m512 b0 = _mm512_set1_ps(w0[p]), b1 = _mm512_set1_ps(w1[p]);
            for (int c = 0; c < C; c++) {
                const __m512 v = v_at16(kv, base + 16 * (size_t)c);
                a0[c] = _mm512_add_ps(a0[c], _mm512_mul_ps(b0, v));
                a1[c] = _mm512_add_ps(a1[c], _mm512_mul_ps(b1, v));
            }
        }
    else
        for (; p < n0; p++) {
            const size_t base = nf_cpu_kv_row(kv, pages, p) * kv_row + koff + i;
            const __m512 b0 = _mm512_set1_ps(w0[p]);
            for (int c = 0; c < C; c++) a0[c] = _mm512_add_ps(a0[c], _mm512_mul_ps(b0, v_at16(kv, base + 16 * (size_t)c)));
        }
    for (int c = 0; c < C; c++) _mm512_storeu_ps(o0 + i + 16 * c, a0[c]);
    if (!w1) return;
    for (; p < n1; p++) {
        const size_t base = nf_cpu_kv_row(kv, pages, p) * kv_row + koff + i;
        const __m512 b1 = _mm512_set1_ps(w1[p]);
        for (int c = 0; c < C; c++) a1[c] = _mm512_add_ps(a1[c], _mm512_mul_ps(b1, v_at16(kv, base + 16 * (size_t)c)));
    }
    for (int c = 0; c < C; c++) _mm512_storeu_ps(o1 + i + 16 * c, a1[c]);
}

void nf_cpu_weighted_v_avx512(const nf_cpu_kv *kv, const uint32_t *pages, const float *w0, uint32_t n0, const float *w1,
                              uint32_t n1, size_t kv_row, size_t koff, float *o0, float *o1)
{
    const uint32_t hd = kv->head_dim;
    uint32_t i = 0;
    for (; i + 64 <= hd; i += 64) wv_part(4, kv, pages, w0, n0, w1, n1, kv_row, koff, i, o0, o1);
    for (; i < hd; i += 16) wv_part(1, kv, pages, w0, n0, w1, n1, kv_row, koff, i, o0, o1);
}
