/* Internal to src/backend/cpu: the query-lane score loop of the AVX2 (8 lanes) and AVX-512 (16 lanes)
 * attention, one body for both widths (the files are compiled with different ISA flags).
 *
 * NF_ATTN_SCORES(name, V, L, pfx) defines
 *   void name(kv, pages, qt, hd, kv_row, koff, np, scale, sct)
 * sct[p][lane] = scale * sum_i qt[i][lane] * k[p][i] for p < np, with V the vector type of L floats
 * and pfx the intrinsics' prefix (_mm256 / _mm512). Lane j runs the scalar's s = fma(q_j[i], k[i], s)
 * (one rounding per term: ops.c's bits, and one instruction where a mul and an add were two).
 * Positions 8 at a time through the page table (each
 * position's row looked up; a block of 8 may span two pages), eight in flight to hide the add
 * latency. */
#ifndef NF_CPU_ATTN_SCORES_H
#define NF_CPU_ATTN_SCORES_H

#include "backend/cpu/cpu_internal.h"

#define NF_ATTN_CAT(a, b) a##b
#define NF_ATTN_OP(pfx, op) NF_ATTN_CAT(pfx, op)

#define NF_ATTN_SCORES(name, V, L, pfx)                                                                     \
    void name(const nf_cpu_kv *kv, const uint32_t *pages, const float *qt, uint32_t hd, size_t kv_row,      \
              size_t koff, uint32_t np, float scale, float *sct)                                            \
    {                                                                                                       \
        const V vs = NF_ATTN_OP(pfx, _set1_ps)(scale);                                                      \
        uint32_t p = 0;                                                                                     \
        for (; p + 8 <= np && !kv->bf16; p += 8) { /* f32: row pointers, no branch per element */     \
            V acc[8];                                                                                       \
            const float *kp[8];                                                                             \
            for (int u = 0; u < 8; u++)                                                                     \
                acc[u] = NF_ATTN_OP(pfx, _setzero_ps)(),                                                    \
                kp[u] = (const float *)kv->k + nf_cpu_kv_row(kv, pages, p + (uint32_t)u) * kv_row + koff;  \
            for (uint32_t i = 0; i < hd; i++) {                                                             \
                const V qv = NF_ATTN_OP(pfx, _loadu_ps)(qt + (size_t)i * (L));                              \
                for (int u = 0; u < 8; u++)                                                                 \
                    acc[u] = NF_ATTN_OP(pfx, _fmadd_ps)(qv, NF_ATTN_OP(pfx, _set1_ps)(kp[u][i]), acc[u]);   \
            }                                                                                               \
            for (int u = 0; u < 8; u++)                                                                     \
                NF_ATTN_OP(pfx, _storeu_ps)(sct + (size_t)(p + u) * (L), NF_ATTN_OP(pfx, _mul_ps)(acc[u], vs)); \
        }                                                                                                   \
        for (; p + 8 <= np; p += 8) {                                                                       \
            V acc[8];                                                                                       \
            size_t base[8];                                                                                 \
            for (int u = 0; u < 8; u++)                                                                     \
                acc[u] = NF_ATTN_OP(pfx, _setzero_ps)(),                                                    \
                base[u] = nf_cpu_kv_row(kv, pages, p + (uint32_t)u) * kv_row + koff;                       \
            for (uint32_t i = 0; i < hd; i++) {                                                             \
                const V qv = NF_ATTN_OP(pfx, _loadu_ps)(qt + (size_t)i * (L));                              \
                for (int u = 0; u < 8; u++)                                                                 \
                    acc[u] = NF_ATTN_OP(pfx, _fmadd_ps)(                                                    \
                        qv, NF_ATTN_OP(pfx, _set1_ps)(nf_cpu_kv_at(kv, kv->k, base[u] + i)), acc[u]);       \
            }                                                                                               \
            for (int u = 0; u < 8; u++)                                                                     \
                NF_ATTN_OP(pfx, _storeu_ps)(sct + (size_t)(p + u) * (L), NF_ATTN_OP(pfx, _mul_ps)(acc[u], vs)); \
        }                                                                                                   \
        for (; p < np; p++) {                                                                               \
            V acc = NF_ATTN_OP(pfx, _setzero_ps)();                                                         \
            const size_t base = nf_cpu_kv_row(kv, pages, p) * kv_row + koff;                               \
            for (uint32_t i = 0; i < hd; i++)                                                               \
                acc = NF_ATTN_OP(pfx, _fmadd_ps)(NF_ATTN_OP(pfx, _loadu_ps)(qt + (size_t)i * (L)),          \
                                                 NF_ATTN_OP(pfx, _set1_ps)(nf_cpu_kv_at(kv, kv->k, base + i)), acc); \
            NF_ATTN_OP(pfx, _storeu_ps)(sct + (size_t)p * (L), NF_ATTN_OP(pfx, _mul_ps)(acc, vs));          \
        }                                                                                                   \
    }

#endif
