/* AVX2 causal attention for up to 8 consecutive query tokens of one head (prefill; 16 where
 * AVX-512 computes the scores, attn_avx512.c), and for one (decoding: scores1, positions as lanes).
 *
 * The scalar kernel (ops.c) computes each score as a sequential f32 sum over the head dimension,
 * a chain of head_dim dependent adds per score. Here the 8 lanes are 8 queries: q is transposed
 * to qt[i][lane], each key element is broadcast, and lane j runs exactly the scalar's sequence
 * s = fma(q_j[i], k[i], s) for i = 0 .. head_dim - 1 (the scalar calls fmaf: one rounding per
 * term, so one instruction per lane and term). Eight positions are in flight to hide the FMA
 * latency. The weighted V sum runs 8 elements of the head dimension per vector, each element
 * summed over positions in order as the scalar does. The results are bit-identical to the
 * scalar kernel's for any token block or thread split. */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/attn_scores.h"

/* 8 consecutive k or v elements from idx as f32. */
static inline __m256 kv_at8(const nf_cpu_kv *kv, const void *base, size_t idx)
{
    if (!kv->bf16) return _mm256_loadu_ps((const float *)base + idx);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + idx));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* The 8-query scores (attn_scores.h). */
static NF_ATTN_SCORES(scores8, __m256, 8, _mm256)

/* o[i] = sum_p w[p] * v[p][i] over p < n in order, 8 elements of i per vector (hd % 8 == 0). Each
 * vector is a chain of dependent adds over the positions, so 64 elements (8 chains) go together
 * where the head has them: with 4 the adds' latency, not the loads, set the pace (perf: 12 % of
 * SmolLM2's prefill). */
static void weighted_v(const nf_cpu_kv *kv, const uint32_t *pages, const float *w, uint32_t n, uint32_t hd,
                       size_t kv_row, size_t koff, float *o)
{
    uint32_t i = 0;
    for (; i + 64 <= hd; i += 64) {
        __m256 a[8];
        for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_ps();
        for (uint32_t p = 0; p < n; p++) {
            const size_t base = nf_cpu_kv_row(kv, pages, p) * kv_row + koff + i;
            const __m256 wb = _mm256_set1_ps(w[p]);
            for (int k = 0; k < 8; k++) a[k] = _mm256_fmadd_ps(wb, kv_at8(kv, kv->v, base + 8 * (size_t)k), a[k]);
        }
        for (int k = 0; k < 8; k++) _mm256_storeu_ps(o + i + 8 * k, a[k]);
    }
    for (; i + 32 <= hd; i += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (uint32_t p = 0; p < n; p++) {
            const size_t base = nf_cpu_kv_row(kv, pages, p) * kv_row + koff + i;
            const __m256 wb = _mm256_set1_ps(w[p]);
            a0 = _mm256_fmadd_ps(wb, kv_at8(kv, kv->v, base), a0);
            a1 = _mm256_fmadd_ps(wb, kv_at8(kv, kv->v, base + 8), a1);
            a2 = _mm256_fmadd_ps(wb, kv_at8(kv, kv->v, base + 16), a2);
            a3 = _mm256_fmadd_ps(wb, kv_at8(kv, kv->v, base + 24), a3);
        }
        _mm256_storeu_ps(o + i, a0);
        _mm256_storeu_ps(o + i + 8, a1);
        _mm256_storeu_ps(o + i + 16, a2);
        _mm256_storeu_ps(o + i + 24, a3);
    }
    for (; i < hd; i += 8) {
        __m256 a = _mm256_setzero_ps();
        for (uint32_t p = 0; p < n; p++)
            a = _mm256_fmadd_ps(_mm256_set1_ps(w[p]), kv_at8(kv, kv->v, nf_cpu_kv_row(kv, pages, p) * kv_row + koff + i), a);
        _mm256_storeu_ps(o + i, a);
    }
}

/* t[j] lane u = r[u] lane j: an 8 x 8 transpose of f32. */
static inline void transpose8(const __m256 *r, __m256 *t)
{
    __m256 a[8], b[8];
    for (int k = 0; k < 4; k++) {
        a[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        a[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    for (int k = 0; k < 2; k++) {
        const __m256 *x = a + 4 * k;
        b[4 * k] = _mm256_shuffle_ps(x[0], x[2], _MM_SHUFFLE(1, 0, 1, 0));
        b[4 * k + 1] = _mm256_shuffle_ps(x[0], x[2], _MM_SHUFFLE(3, 2, 3, 2));
        b[4 * k + 2] = _mm256_shuffle_ps(x[1], x[3], _MM_SHUFFLE(1, 0, 1, 0));
        b[4 * k + 3] = _mm256_shuffle_ps(x[1], x[3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int k = 0; k < 4; k++) {
        t[k] = _mm256_permute2f128_ps(b[k], b[k + 4], 0x20);
        t[k + 4] = _mm256_permute2f128_ps(b[k], b[k + 4], 0x31);
    }
}

/* One query (decoding): sc[p] = scale * sum_i q[i] k[p][i] for p < np with lane u = position p + u:
 * eight key rows are loaded and transposed 8 x 8 per 8 elements of the head, so each lane runs
 * the scalar's sequence s = fma(q[i], k[i], s) (same bits) on its own position. The 8-query form
 * above would leave 7 of its 8 lanes empty and transpose q for nothing. Positions past np read a
 * zero row and are not stored. */
static void scores1(const nf_cpu_kv *kv, const uint32_t *pages, const float *q, uint32_t hd, size_t kv_row,
                    size_t koff, uint32_t np, float scale, float *sc)
{
    static const float zero[NF_CPU_ATTN_MAX_HD];
    const __m256 vs = _mm256_set1_ps(scale);
    for (uint32_t p = 0; p < np; p += 8) {
        const uint32_t m = np - p < 8 ? np - p : 8;
        size_t base[8];
        for (uint32_t u = 0; u < m; u++) base[u] = nf_cpu_kv_row(kv, pages, p + u) * kv_row + koff;
        __m256 acc = _mm256_setzero_ps();
        for (uint32_t i0 = 0; i0 < hd; i0 += 8) {
            __m256 r[8], t[8];
            for (uint32_t u = 0; u < 8; u++) r[u] = u < m ? kv_at8(kv, kv->k, base[u] + i0) : _mm256_loadu_ps(zero + i0);
            transpose8(r, t);
            for (int j = 0; j < 8; j++) acc = _mm256_fmadd_ps(_mm256_set1_ps(q[i0 + j]), t[j], acc);
        }
        float o[8];
        _mm256_storeu_ps(o, _mm256_mul_ps(acc, vs));
        memcpy(sc + p, o, m * sizeof(float));
    }
}

/* Query j's weights: its n scores (column j of sct [np][lanes]) into w, softmaxed. */
static void query_weights(const float *sct, int lanes, uint32_t j, uint32_t n, float *w)
{
    for (uint32_t p = 0; p < n; p++) w[p] = sct[(size_t)p * lanes + j];
    nf_cpu_softmax(w, n);
}

void nf_cpu_attn_block_avx2(const nf_cpu_kv *kv, const uint32_t *pages, const float *q, size_t q_row, uint32_t kh,
                            uint32_t n0, uint32_t nq, float scale, float *sc, float *out, int lanes)
{
    const uint32_t hd = kv->head_dim;
    const size_t kv_row = (size_t)kv->kv_heads * hd, koff = (size_t)kh * hd;
    const int v512 = lanes == 16 && hd % 16 == 0; /* AVX-512 (the caller's lanes say it is known) */
    if (nq == 1) {
        scores1(kv, pages, q, hd, kv_row, koff, n0, scale, sc);
        nf_cpu_softmax(sc, n0);
        if (v512) {
            const float *w1[1] = {sc};
            float *o1[1] = {out};
            nf_cpu_weighted_v_avx512(kv, pages, w1, &n0, 1, kv_row, koff, o1);
        }
        else weighted_v(kv, pages, sc, n0, hd, kv_row, koff, out);
        return;
    }
    float qt[NF_CPU_ATTN_MAX_HD * 16]; /* [hd][lanes]: query lane j = token j, unused lanes zero */
    for (uint32_t i = 0; i < hd; i++)
        for (uint32_t j = 0; j < (uint32_t)lanes; j++) qt[(size_t)i * lanes + j] = j < nq ? q[j * q_row + i] : 0.0f;
    const uint32_t np = n0 + nq - 1; /* positions the last query sees */
    float *w = sc, *sct = sc + 4 * np; /* w [4][np]: four queries' weights; sct [np][lanes] */
    if (lanes == 16) nf_cpu_attn_scores16_avx512(kv, pages, qt, hd, kv_row, koff, np, scale, sct);
    else scores8(kv, pages, qt, hd, kv_row, koff, np, scale, sct);
    if (v512) { /* queries four at a time, each v row read once for those that see it */
        for (uint32_t j = 0; j < nq; j += 4) {
            const int m = nq - j < 4 ? (int)(nq - j) : 4;
            const float *wq[4];
            uint32_t nn[4];
            float *oq[4];
            for (int u = 0; u < m; u++) {
                nn[u] = n0 + j + (uint32_t)u;
                query_weights(sct, lanes, j + (uint32_t)u, nn[u], w + (size_t)u * np);
                wq[u] = w + (size_t)u * np, oq[u] = out + (j + (uint32_t)u) * q_row;
            }
            nf_cpu_weighted_v_avx512(kv, pages, wq, nn, m, kv_row, koff, oq);
        }
        return;
    }
    for (uint32_t j = 0; j < nq; j++) {
        const uint32_t n = n0 + j;
        query_weights(sct, lanes, j, n, w);
        weighted_v(kv, pages, w, n, hd, kv_row, koff, out + j * q_row);
    }
}
