/* Causal GQA attention in double for the attention tests (test_attn_mma on the host,
 * test_attention_cuda on the GPU), and the bound the kernels are held to.
 *
 * Data (the decoder's layouts, src/backend/cuda/decoder/ops.cuh AttnArgs):
 *   q   [T][q_stride] f32, head h at h * hd
 *   kc  [pos0 + T][kv_heads * hd] bf16, vc the same; query t sees keys 0 .. pos0 + t
 *   out [T][heads][hd]
 *
 * Bound (attention.cu's numerics; u = 2^-8, the unit roundoff of bf16's 8-bit significand): with the
 * reference's q rounded to bf16 as the tensor-core kernel rounds it, its output is the weighted mean
 * of V under weights bf16(p_j) / sum bf16(p_j) = w_j (1 + d_j) / (1 + dbar), |d_j| <= u, dbar the
 * w-weighted mean of the d_j; the change sum w_j (d_j - dbar) v_j / (1 + dbar) is at most
 * 2 u max_j |v_j| (the weights of (d_j - dbar) sum to zero), so per element |o - ref| <= 2.01 u
 * max_j |v_j| (p_bf16), plus the bf16 rounding of the output (u |o|) and f32 accumulation and exp
 * (~1e-6 relative; 2^-14 max_j |v_j| of room). The CUDA-core kernels keep q and p in f32
 * (p_bf16 = 0, the reference's q unrounded). A fragment mistake (a P register paired with the wrong
 * keys, V read untransposed, a wrong key block or kv head) or a split merged wrongly moves
 * outputs by a sizeable fraction of |v|: tens of times the bound. */
#ifndef NF_TESTS_ATTN_REF_H
#define NF_TESTS_ATTN_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "cuda_test_util.h"

typedef struct attn_case {
    uint32_t hd, heads, kv_heads, T, pos0, q_stride;
} attn_case;

/* ref[T][heads][hd] in double; q rounded to bf16 first when q_bf16. */
static inline void attn_reference(const attn_case *c, const float *q, const uint16_t *kc, const uint16_t *vc,
                                  int q_bf16, double *ref)
{
    const uint32_t hd = c->hd, kvd = c->kv_heads * hd, group = c->heads / c->kv_heads;
    const uint32_t n = c->pos0 + c->T;
    double *sc = (double *)malloc(n * sizeof *sc), *qd = (double *)malloc(hd * sizeof *qd);
    for (uint32_t t = 0; t < c->T; t++)
        for (uint32_t h = 0; h < c->heads; h++) {
            const float *qh = q + (size_t)t * c->q_stride + h * hd;
            const uint32_t kvh = h / group, nk = c->pos0 + t + 1;
            for (uint32_t i = 0; i < hd; i++) qd[i] = q_bf16 ? nf_test_bf2f(nf_test_f2bf(qh[i])) : qh[i];
            double m = -INFINITY, l = 0;
            for (uint32_t j = 0; j < nk; j++) {
                double d = 0;
                for (uint32_t i = 0; i < hd; i++) d += qd[i] * nf_test_bf2f(kc[(size_t)j * kvd + kvh * hd + i]);
                sc[j] = d / sqrt((double)hd);
                m = fmax(m, sc[j]);
            }
            for (uint32_t j = 0; j < nk; j++) l += (sc[j] = exp(sc[j] - m));
            double *o = ref + ((size_t)t * c->heads + h) * hd;
            for (uint32_t i = 0; i < hd; i++) o[i] = 0;
            for (uint32_t j = 0; j < nk; j++)
                for (uint32_t i = 0; i < hd; i++) o[i] += sc[j] / l * nf_test_bf2f(vc[(size_t)j * kvd + kvh * hd + i]);
        }
    free(sc), free(qd);
}

/* The worst |got - ref| / bound over outputs [T][heads][hd] (bf16), the bound as in the header with
 * max_j |v_j| taken over the keys query t sees; NaN (or an unwritten 0xFFFF) gives +inf. */
static inline double attn_worst(const attn_case *c, const uint16_t *got, const double *ref, const uint16_t *vc,
                                int p_bf16)
{
    const uint32_t hd = c->hd, kvd = c->kv_heads * hd, group = c->heads / c->kv_heads;
    const double u = ldexp(1.0, -8);
    double worst = 0;
    for (uint32_t h = 0; h < c->heads; h++)
        for (uint32_t i = 0; i < hd; i++) {
            const uint16_t *v = vc + (h / group) * hd + i;
            double vmax = 0; /* over keys 0 .. pos0 + t, grown with t */
            for (uint32_t j = 0; j < c->pos0; j++) vmax = fmax(vmax, fabs(nf_test_bf2f(v[(size_t)j * kvd])));
            for (uint32_t t = 0; t < c->T; t++) {
                vmax = fmax(vmax, fabs(nf_test_bf2f(v[(size_t)(c->pos0 + t) * kvd])));
                const size_t k = ((size_t)t * c->heads + h) * hd + i;
                const double g = nf_test_bf2f(got[k]), r = ref[k];
                const double bound = (p_bf16 ? 2.01 * u * vmax : 0.0) + u * fabs(r) + ldexp(vmax, -14);
                worst = fmax(worst, isfinite(g) ? fabs(g - r) / bound : INFINITY);
            }
        }
    return worst;
}

#endif
