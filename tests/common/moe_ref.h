/* CPU reference of the sparse-MoE operator for tests: double accumulation over dequantized weights.
 * Shapes as in src/backend/cuda/sparse_moe/sparse_moe.h; all weights given dequantized in f32. */
#ifndef NF_TEST_MOE_REF_H
#define NF_TEST_MOE_REF_H

#include <stddef.h>
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
 * dequantized weights to a format of unit roundoff wq (0: exact weights), the SwiGLU
 * intermediate to unit roundoff ar (0: kept in fp32) and the routed experts' down outputs y to unit
 * roundoff yr (0: kept in fp32; the shared expert's stay fp32), accumulating in fp32 (neglected
 * here; the caller adds a small absolute slack). Output rounding is the caller's. With g = w_g.x,
 * u = w_u.x, a = silu(g) u, |silu'| <= 1.1:
 *   |da_r| <= wq (1.1 |u_r| sum|w_g x| + |silu(g_r)| sum|w_u x|) + ar |a_r|
 *   |dy_h| <= sum_r |W_hr| |da_r| + wq sum_r |W_hr a_r| + yr |y_h|,
 *   bound_h = sum_j p_j |dy_jh| (+ shared, without the yr term). */
void nf_moe_ref_bound(const nf_moe_ref *m, const float *x, const int32_t *ids, const double *weights, double wq,
                      double ar, double yr, double *bound);

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
 * propagated through |down| (docs/sparse_moe.md, "W4A4"). yr: the unit roundoff of the format the
 * device stores the routed experts' down outputs in before the weighted sum (0: f32), added to the
 * bound; the shared expert's stay f32. */
void nf_moe_ref_token_a4(const nf_moe_ref *m, const nf_moe_ref_a4 *a, const float *x, const int32_t *ids,
                         const double *weights, double yr, double *out, double *bound);

/* The relative error bound used for a device dot product of length K (fp32 accumulation on tensor
 * cores, exact products; see moe_ref.c). */
double nf_moe_ref_acc_rel(uint32_t K);

/* ---- W·A8 (int8 activations), the decode and small-token routes of k-quant / q8_0 banks ----------
 * The device (gemv_a8.cu, down_a8.cu) quantises the routed experts' gate/up input x and their
 * SwiGLU intermediate to int8 per 32 elements (nf_test_quantize_a8: d = max|v| / 127 in f32,
 * q = rint(v / d)); its router and shared expert take x as it is, in fp32. x's quantisation is
 * repeated bit for bit (the same f32 operations on the same bf16 values); the intermediate's cannot
 * be: the device computes it in fp32, so one lying within that accumulation error of a rint tie
 * (v / d = n + 1/2), or a block whose amax (so d) moves, may quantise a step away. The reference
 * takes the device's operands exactly (moe_ref.c, "W·A8"): the routed weights must be the device's
 * own values (q4_k/q5_k: the caller checks that the CPU's fl(d_s q - m_s) is exact). */
typedef struct nf_moe_ref_a8 {
    int gate_up_codec; /* the routed gate/up's codec (nf_codec_id: q4_k, q5_k, q6_k, q8_0, q3_k,
                        * iq4_xs, iq4_nl: their weights are exact integer multiples of one f32
                        * scale per group, so the CPU decoders' values are the dots' own): the
                        * device's rounding chain of its dots (spans_a8.cuh's span policies) */
    /* Per 32-element sub-block of a routed row, the offset its codec subtracts (q4_k, q5_k:
     * m_s = dmin * m, w = d_s q - m_s): the device's dot takes d_s d_x sum q q~ and m_s d_x sum q~ as
     * terms of their own, which can exceed their difference. NULL: a codec without (q6_k, q8_0). */
    const float *gate_up_off; /* [E][2I][H/32] */
    const float *down_off;    /* [E][H][I/32] */
    /* The device's chains (the bound's order of roundings; the values are the same):
     * route 0: the decode and small-token routes (gemv_a8.cu, down_a8.cu, the cluster router on
     *    tensor cores: router_cluster.cu's cluster_logits_mma);
     * 1: the mmq route (mmq.cu: each dot's groups folded one after another in element order, y in
     *    f32, the combine), its router the CUDA-core one (T < 512: router_logits_kernel);
     * 2: the mmq route with the tensor-core router (router_mma.cu, T >= 512). */
    int route;
    /* shared_a8: the shared expert runs on int8 activations as a routed expert does on the route's
     * kernels (route 0 from two tokens: gemv_a8.cu and the down by rows; routes 1, 2: mmq.cu), x
     * quantised as the routed experts' and its intermediate like theirs; else it takes x in fp32
     * (gemv.cu). Its gate/up codec and, q4_k / q5_k, the offsets as above. */
    int shared_a8;
    int sgate_up_codec;
    const float *sgate_up_off; /* [2S][H/32] */
    const float *sdown_off;    /* [H][S/32] */
} nf_moe_ref_a8;

/* gamma_n = n u / (1 - n u), u = 2^-24: |computed - exact| <= gamma_n sum |terms| for a sum whose
 * terms each pass through at most n fp32 roundings (Higham, Accuracy and Stability of Numerical
 * Algorithms, 2nd ed., 3.1 and 4.2). */
double nf_moe_ref_gamma(uint32_t n);

/* q4_k / q5_k rows (ggml blocks: d, dmin, 12 bytes of scales and mins, then the quants) of `rows` x
 * `cols` in `payload` (row_bytes each), deq their CPU dequantisation: each 32-element sub-block's
 * offset m_s into off [rows][cols / 32] (w = d_s q - m_s), and the count of weights whose CPU value
 * fl(d_s q - m_s) is not d_s q - m_s exactly (the W·A8 reference takes them as the device's int8 dots'
 * exact values, so it needs 0). */
size_t nf_moe_ref_k4_offsets(int codec, const uint8_t *payload, size_t row_bytes, const float *deq, uint64_t rows,
                             uint32_t cols, float *off);

/* Routed expert e's SwiGLU intermediate over x quantised as the device does, a[I] in double, and
 * da[I]: how far the device's fp32 value may lie from it (its gate/up dots' rounding along the
 * device's chain, silu, the product). */
void nf_moe_ref_a8_inter(const nf_moe_ref *m, const nf_moe_ref_a8 *a8, const float *x, int32_t e, double *a,
                         double *da);

/* One block of 32 SwiGLU intermediates whose device (fp32) values lie in [a - da, a + da]: v[32] =
 * the reference's values d q (the quantisation of (float)a, exact in double), dev[32] = the largest
 * |device's d' q' - v| over every value in those intervals and every block scale d' their amax
 * allows: a few ulps of v where no tie is within reach, a whole step d (or more) where one is.
 * n_near (may be NULL) += how many elements can quantise to another integer. */
void nf_moe_ref_a8_block(const double *a, const double *da, double *v, double *dev, uint32_t *n_near);

/* The W·A8 forward of one token (routed gate/up and down quantise as above, the shared expert's too
 * with shared_a8; router and (else) shared expert take x) in double, and bound[H]: how far a device doing it in fp32 may be from out before its
 * output's bf16 rounding (moe_ref.c, "W·A8", argues each part):
 *   quantisation: sum_j p_j sum_r |W_hr| dev_jr (nf_moe_ref_a8_block over each expert's
 *            intermediate, whose interval is the fp32 error of its int8 gate/up dots along the
 *            device's chain, through silu and the product): near ties a whole step, d's range;
 *   down:    gamma_nd (sum_j p_j terms of its row's int8 dot + sg |ys_h|), nd down_a8.cu's longest chain;
 *   router:  sum_j eps_j p_j |y_jh|, eps_j the relative error of the fp32 softmax weight;
 *   shared:  sg |dys_h| + |dsg| |ys_h| through the f32 gate/up, SwiGLU and down (gemv.cu), or
 *            (shared_a8) its quantisation's reach and down chain as a routed expert's, weight sg.
 * a8 (not NULL) gives the routed gate/up's codec and the offsets. n_near (may be NULL) += the
 * routed intermediates that can quantise a step away. */
void nf_moe_ref_token_a8(const nf_moe_ref *m, const nf_moe_ref_a8 *a8, const float *x, const int32_t *ids,
                         const double *weights, double *out, double *bound, uint32_t *n_near);

#endif
