/* CPU reference of the sparse-MoE operator for tests: double accumulation over dequantized weights.
 * Shapes as in src/backend/cuda/sparse_moe/sparse_moe.h; all weights given dequantized in f32. */
#ifndef NF_TEST_MOE_REF_H
#define NF_TEST_MOE_REF_H

#include <stdint.h>

typedef struct nf_moe_ref {
    uint32_t H, E, k, I, S; /* S = 0: no shared expert */
    int norm_topk;
    const float *router;    /* [E][H] */
    const float *gate_up;   /* [E][2I][H] */
    const float *down;      /* [E][H][I] */
    const float *sgate_up;  /* [2S][H] */
    const float *sdown;     /* [H][S] */
    const float *sgate;     /* [H] */
} nf_moe_ref;

/* Routing of one token: ids[k] by descending logit, ties to the lower index; weights[k]; gap = the
 * smallest difference between a selected and an unselected logit (how close the selection was to
 * flipping). x is [H] (already the bf16 values, as floats). */
void nf_moe_ref_route(const nf_moe_ref *m, const float *x, int32_t *ids, double *weights, double *gap);

/* out[H] for one token with the given routing (ids/weights of k experts). */
void nf_moe_ref_token(const nf_moe_ref *m, const float *x, const int32_t *ids, const double *weights, double *out);

/* A first-order bound on |computed - out| per element for a computation that rounds the
 * dequantized weights to a format of unit roundoff wq (0: exact weights) and the SwiGLU
 * intermediate to unit roundoff ar (0: kept in fp32), accumulating in fp32 (neglected here; the
 * caller adds a small absolute slack). Output rounding is the caller's. With g = w_g.x, u = w_u.x,
 * a = silu(g) u, |silu'| <= 1.1:
 *   |da_r| <= wq (1.1 |u_r| sum|w_g x| + |silu(g_r)| sum|w_u x|) + ar |a_r|
 *   |dy_h| <= sum_r |W_hr| |da_r| + wq sum_r |W_hr a_r|,  bound_h = sum_j p_j |dy_jh| (+ shared). */
void nf_moe_ref_bound(const nf_moe_ref *m, const float *x, const int32_t *ids, const double *weights, double wq,
                      double ar, double *bound);

#endif
