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
    int quant_act;          /* 1: the routed experts' SwiGLU intermediate is rounded to f32 and
                             * quantised to int8 per 32 (nf_test_quantize_a8) before down, as the
                             * device's W·A8 down does (down_a8.cu); the shared expert's is not */
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

/* ---- W4A4 (nvfp4 activations), the device's prefill route for nvfp4-w4a4 banks ----------------
 * Encodes x[n] (n a multiple of 16) to nvfp4 with `divisor` exactly as compressed-tensors (and the
 * device, src/backend/cuda/sparse_moe/a4.cuh) encode an activation: per 16, scale byte
 * nf_nvfp4_block_scale(amax, divisor), eff = e4m3 / divisor in fp32, nibble nf_f32_to_e2m1(x / eff).
 * Any of the outputs may be NULL: data [n/2] (element 2i in the low nibble), scales [n/16],
 * deq [n] = e2m1 * eff (exact in double). */
void nf_moe_ref_encode_a4(const float *x, uint32_t n, float divisor, uint8_t *data, uint8_t *scales, double *deq);

typedef struct nf_moe_ref_a4 {
    float in_div;          /* gate/up activation divisor (routed and shared expert) */
    const float *down_div; /* [E]: each expert's down input divisor */
    float sdown_div;       /* the shared expert's down input divisor */
} nf_moe_ref_a4;

/* The W4A4 forward of one token, double accumulation: x encoded with in_div; gate/up over the
 * dequantized weights; SwiGLU; the intermediate rounded to fp32 (what the device holds) and encoded
 * per 16 with the expert's down divisor; down over the dequantized weights; weighted sum.
 * bound[H]: how far a device computing the same thing with fp32 (tensor-core) accumulation may be
 * from out, before its output's bf16 rounding. The accumulation errors themselves are tiny; what
 * the bound mainly carries is their effect through the intermediate's encoding: where an
 * intermediate (or a block's amax) lies within the device's accumulation error of an e2m1 (or
 * e4m3) rounding threshold, the device may legitimately encode it one step away; every encoding
 * reachable within those intervals is enumerated and the largest departure from out's is
 * propagated through |down| (docs/sparse_moe.md, "W4A4"). */
void nf_moe_ref_token_a4(const nf_moe_ref *m, const nf_moe_ref_a4 *a, const float *x, const int32_t *ids,
                         const double *weights, double *out, double *bound);

/* The relative error bound used for a device dot product of length K (fp32 accumulation on tensor
 * cores, exact products; see moe_ref.c). */
double nf_moe_ref_acc_rel(uint32_t K);

#endif
