/* AVX-512 scores for up to 16 consecutive query tokens of one head (prefill): scores8 of
 * attn_avx2.c with 16 lanes, so each broadcast key element and each mul / add serves twice the
 * queries. Lane j runs exactly the scalar's s = s + q_j[i] * k[i] (separate mul and add), so the
 * attention keeps ops.c's scalar bits for any block or thread split (tests/cpu/test_cpu_ops). */
#include <immintrin.h>

#include "backend/cpu/cpu_internal.h"

void nf_cpu_attn_scores16_avx512(const nf_cpu_kv *kv, const uint32_t *pages, const float *qt, uint32_t hd,
                                 size_t kv_row, size_t koff, uint32_t np, float scale, float *sct)
{
    const __m512 vs = _mm512_set1_ps(scale);
    uint32_t p = 0;
    for (; p + 8 <= np; p += 8) { /* eight positions in flight hide the add latency */
        __m512 acc[8];
        size_t base[8];
        for (int u = 0; u < 8; u++) acc[u] = _mm512_setzero_ps(), base[u] = nf_cpu_kv_row(kv, pages, p + (uint32_t)u) * kv_row + koff;
        for (uint32_t i = 0; i < hd; i++) {
            const __m512 qv = _mm512_loadu_ps(qt + (size_t)i * 16);
            for (int u = 0; u < 8; u++)
                acc[u] = _mm512_add_ps(acc[u], _mm512_mul_ps(qv, _mm512_set1_ps(nf_cpu_kv_at(kv, kv->k, base[u] + i))));
        }
        for (int u = 0; u < 8; u++) _mm512_storeu_ps(sct + (size_t)(p + u) * 16, _mm512_mul_ps(acc[u], vs));
    }
    for (; p < np; p++) {
        __m512 acc = _mm512_setzero_ps();
        const size_t base = nf_cpu_kv_row(kv, pages, p) * kv_row + koff;
        for (uint32_t i = 0; i < hd; i++)
            acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_loadu_ps(qt + (size_t)i * 16),
                                                   _mm512_set1_ps(nf_cpu_kv_at(kv, kv->k, base + i))));
        _mm512_storeu_ps(sct + (size_t)p * 16, _mm512_mul_ps(acc, vs));
    }
}
