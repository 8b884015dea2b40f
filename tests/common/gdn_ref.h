/* The Gated DeltaNet token mixer after the in_proj products, in double, written from the definitions
 * (docs/hybrid.md; transformers' torch_recurrent_gated_delta_rule, causal_conv1d_update and
 * RMSNormGated): the reference of tests/cpu/test_gdn.c (the CPU op) and tests/cuda/test_gdn_cuda.cu
 * (the device kernels). One sequence of n tokens from a given state:
 *   x = silu(causal depthwise conv of the q | k | v channels), the window's earlier inputs from cs;
 *   q, k l2-normalised per head (x / sqrt(sum x^2 + 1e-6)), q / sqrt(dk); v head h reads q/k head
 *   h / (hv / hk); decay = exp(-exp(A_log) softplus(a + dt_bias)), beta = sigmoid(b);
 *   S <- decay S ; S <- S + k (beta (v - S^T k))^T ; o = S^T q ;  out = o / rms(o) * w * silu(z). */
#ifndef NF_TESTS_GDN_REF_H
#define NF_TESTS_GDN_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct gdn_ref_shape {
    uint32_t hk, hv, dk, dv, K; /* q/k heads of dk, v heads of dv, conv taps */
} gdn_ref_shape;

/* Inputs of one sequence: row t's raw q | k | v channels at qkv + t * stride, its z (hv * dv) at
 * z + t * stride, its b | a (2 hv) at ba + t * stride. */
typedef struct gdn_ref_rows {
    const float *qkv, *z, *ba;
    size_t stride;
} gdn_ref_rows;

typedef struct gdn_ref_weights {
    const float *conv_w;           /* [conv_dim][K] */
    const float *dt_bias, *a_log;  /* [hv] */
    const float *norm_w;           /* [dv] */
    double eps;                    /* the output norm's */
} gdn_ref_weights;

static inline double gdn_ref_silu(double x) { return x / (1 + exp(-x)); }

/* cs [K-1][conv_dim] (the last K-1 raw inputs; zeros at a sequence's start) and S [hv][dk][dv] are
 * updated in place; out [n][hv * dv]. 0 when out of memory. */
static inline int gdn_ref_run(const gdn_ref_shape *g, const gdn_ref_weights *w, const gdn_ref_rows *in, uint32_t n,
                              double *cs, double *S, double *out)
{
    const uint32_t Kd = g->hk * g->dk, C = 2 * Kd + g->hv * g->dv, Vd = g->hv * g->dv, K = g->K;
    double *x = (double *)malloc(sizeof(double) * (C + 2 * g->dk + g->dv));
    if (!x) return 0;
    double *q = x + C, *k = q + g->dk, *o = k + g->dk;
    for (uint32_t t = 0; t < n; t++) {
        const float *r = in->qkv + (size_t)t * in->stride, *z = in->z + (size_t)t * in->stride;
        const float *ba = in->ba + (size_t)t * in->stride;
        for (uint32_t c = 0; c < C; c++) {
            double acc = (double)w->conv_w[(size_t)c * K + K - 1] * r[c];
            for (uint32_t j = 0; j + 1 < K; j++) acc += (double)w->conv_w[(size_t)c * K + j] * cs[(size_t)j * C + c];
            for (uint32_t j = 0; j + 2 < K; j++) cs[(size_t)j * C + c] = cs[(size_t)(j + 1) * C + c];
            cs[(size_t)(K - 2) * C + c] = r[c];
            x[c] = gdn_ref_silu(acc);
        }
        for (uint32_t h = 0; h < g->hv; h++) {
            const uint32_t kh = h / (g->hv / g->hk);
            double sq = 0, sk = 0;
            for (uint32_t i = 0; i < g->dk; i++) {
                q[i] = x[kh * g->dk + i], k[i] = x[Kd + kh * g->dk + i];
                sq += q[i] * q[i], sk += k[i] * k[i];
            }
            for (uint32_t i = 0; i < g->dk; i++) q[i] = q[i] / sqrt(sq + 1e-6) / sqrt((double)g->dk), k[i] /= sqrt(sk + 1e-6);
            const double av = (double)ba[g->hv + h] + w->dt_bias[h];
            const double decay = exp(-exp((double)w->a_log[h]) * (av > 20 ? av : log1p(exp(av))));
            const double beta = 1 / (1 + exp(-(double)ba[h]));
            double *Sh = S + (size_t)h * g->dk * g->dv, ss = 0;
            for (uint32_t j = 0; j < g->dv; j++) {
                double kv = 0;
                for (uint32_t i = 0; i < g->dk; i++) kv += (Sh[(size_t)i * g->dv + j] *= decay) * k[i];
                const double delta = beta * (x[2 * Kd + h * g->dv + j] - kv);
                o[j] = 0;
                for (uint32_t i = 0; i < g->dk; i++) o[j] += (Sh[(size_t)i * g->dv + j] += k[i] * delta) * q[i];
                ss += o[j] * o[j];
            }
            const double inv = 1 / sqrt(ss / g->dv + w->eps);
            for (uint32_t j = 0; j < g->dv; j++)
                out[(size_t)t * Vd + h * g->dv + j] = o[j] * inv * w->norm_w[j] * gdn_ref_silu(z[h * g->dv + j]);
        }
    }
    free(x);
    return 1;
}

#endif
