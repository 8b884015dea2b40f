#include "moe_ref.h"

#include <math.h>
#include <stdlib.h>

#include "codec/codec.h"
#include "codec/ggml_blocks.h"
#include "codec/nvfp4.h"
#include "cuda_test_util.h"

static double dot(const float *a, const float *x, uint32_t n)
{
    double s = 0;
    for (uint32_t i = 0; i < n; i++) s += (double)a[i] * (double)x[i];
    return s;
}

void nf_moe_ref_route(const nf_moe_ref *m, const float *x, int32_t *ids, double *weights, double *gap)
{
    double *l = malloc(sizeof(double) * m->E);
    double mx = -INFINITY, sum = 0;
    for (uint32_t e = 0; e < m->E; e++) {
        l[e] = dot(m->router + (size_t)e * m->H, x, m->H);
        if (l[e] > mx) mx = l[e];
    }
    for (uint32_t e = 0; e < m->E; e++) sum += exp(l[e] - mx);
    char *taken = calloc(m->E, 1);
    double psum = 0, kth = INFINITY;
    for (uint32_t j = 0; j < m->k; j++) {
        int best = -1;
        for (uint32_t e = 0; e < m->E; e++)
            if (!taken[e] && (best < 0 || l[e] > l[best])) best = (int)e;
        taken[best] = 1;
        ids[j] = best;
        weights[j] = exp(l[best] - mx) / sum;
        psum += weights[j];
        if (l[best] < kth) kth = l[best];
    }
    double next = -INFINITY;
    for (uint32_t e = 0; e < m->E; e++)
        if (!taken[e] && l[e] > next) next = l[e];
    *gap = kth - next;
    if (m->norm_topk)
        for (uint32_t j = 0; j < m->k; j++) weights[j] /= psum;
    free(taken);
    free(l);
}

/* down(silu(gate x) * up x) for one expert; gu is [2n][H], dn is [H][n]. */
static void expert(const float *gu, const float *dn, uint32_t H, uint32_t n, const float *x, double scale, double *out)
{
    double *ad = malloc(sizeof(double) * n);
    for (uint32_t r = 0; r < n; r++) {
        double g = dot(gu + (size_t)r * H, x, H), u = dot(gu + (size_t)(n + r) * H, x, H);
        ad[r] = g / (1.0 + exp(-g)) * u;
    }
    for (uint32_t h = 0; h < H; h++) {
        double s = 0;
        for (uint32_t r = 0; r < n; r++) s += (double)dn[(size_t)h * n + r] * ad[r];
        out[h] += scale * s;
    }
    free(ad);
}

void nf_moe_ref_token(const nf_moe_ref *m, const float *x, const int32_t *ids, const double *weights, double *out)
{
    for (uint32_t h = 0; h < m->H; h++) out[h] = 0;
    for (uint32_t j = 0; j < m->k; j++) {
        size_t e = (size_t)ids[j];
        expert(m->gate_up + e * 2 * m->I * m->H, m->down + e * m->H * m->I, m->H, m->I, x, weights[j], out);
    }
    if (m->S) {
        double sg = 1.0 / (1.0 + exp(-dot(m->sgate, x, m->H)));
        expert(m->sgate_up, m->sdown, m->H, m->S, x, sg, out);
    }
}

static double adot(const float *a, const float *x, uint32_t n)
{
    double s = 0;
    for (uint32_t i = 0; i < n; i++) s += fabs((double)a[i] * (double)x[i]);
    return s;
}

static void expert_bound(const float *gu, const float *dn, uint32_t H, uint32_t n, const float *x, double scale,
                         double wq, double ar, double yr, double *bound)
{
    double *a = malloc(sizeof(double) * n), *da = malloc(sizeof(double) * n);
    for (uint32_t r = 0; r < n; r++) {
        const float *wg = gu + (size_t)r * H, *wu = gu + (size_t)(n + r) * H;
        double g = dot(wg, x, H), u = dot(wu, x, H), sg = g / (1.0 + exp(-g));
        a[r] = sg * u;
        da[r] = wq * (1.1 * fabs(u) * adot(wg, x, H) + fabs(sg) * adot(wu, x, H)) + ar * fabs(a[r]);
    }
    for (uint32_t h = 0; h < H; h++) {
        double b = 0, y = 0;
        for (uint32_t r = 0; r < n; r++) {
            double w = fabs((double)dn[(size_t)h * n + r]);
            b += w * da[r] + wq * w * fabs(a[r]);
            y += (double)dn[(size_t)h * n + r] * a[r];
        }
        bound[h] += scale * (b + yr * fabs(y));
    }
    free(a);
    free(da);
}

void nf_moe_ref_bound(const nf_moe_ref *m, const float *x, const int32_t *ids, const double *weights, double wq,
                      double ar, double yr, double *bound)
{
    for (uint32_t h = 0; h < m->H; h++) bound[h] = 0;
    for (uint32_t j = 0; j < m->k; j++) {
        size_t e = (size_t)ids[j];
        expert_bound(m->gate_up + e * 2 * m->I * m->H, m->down + e * m->H * m->I, m->H, m->I, x, fabs(weights[j]), wq,
                     ar, yr, bound);
    }
    if (m->S) {
        double sg = 1.0 / (1.0 + exp(-dot(m->sgate, x, m->H)));
        expert_bound(m->sgate_up, m->sdown, m->H, m->S, x, sg, wq, ar, 0.0, bound);
    }
}

/* ---- W4A4 -------------------------------------------------------------------------------------- */

/* Relative accumulation error of the device's dot products of length K, |computed - exact| <=
 * acc_rel(K) sum|w x|. The products are exact (bf16 operands with <= 6 significant bits each), so
 * only the accumulation rounds: mma.sync accumulates each k16 step into fp32, and tensor cores
 * align the addends to the largest exponent and truncate (Fasi et al. 2021, "Numerical behavior of
 * NVIDIA tensor cores"), i.e. each of the K/16 steps may err by up to about 2^-23 of the magnitude
 * summed so far; we allow 2^-21 per step (4x that) plus 4 steps more for the epilogue's divisor
 * multiplications and the reference's own fp32 rounding of e4m3 / divisor (2^-24 relative each).
 * Its only use is to widen intervals: a loose value costs a slightly larger bound, never a miss. */
double nf_moe_ref_acc_rel(uint32_t K) { return ldexp((double)(K / 16 + 4), -21); }

void nf_moe_ref_encode_a4(const float *x, uint32_t n, float divisor, uint8_t *data, uint8_t *scales, double *deq)
{
    for (uint32_t b = 0; b < n / 16; b++) {
        const float *v = x + 16 * b;
        float amax = 0.0f;
        for (int i = 0; i < 16; i++) amax = fmaxf(amax, fabsf(v[i]));
        const uint8_t sb = nf_nvfp4_block_scale(amax, divisor);
        const float eff = nf_e4m3_to_f32(sb) / divisor;
        if (scales) scales[b] = sb;
        for (int i = 0; i < 16; i++) {
            const uint8_t q = nf_f32_to_e2m1(v[i] / eff);
            if (data) {
                if (i % 2 == 0) data[8 * b + i / 2] = q;
                else data[8 * b + i / 2] |= (uint8_t)(q << 4);
            }
            if (deq) deq[16 * b + i] = (double)nf_e2m1_to_f32(q) * (double)eff;
        }
    }
}

/* The encoding of value v under scale byte sb and divisor g, as a double. */
static double a4_value(float v, uint8_t sb, float g)
{
    const float eff = nf_e4m3_to_f32(sb) / g;
    return (double)nf_e2m1_to_f32(nf_f32_to_e2m1(v / eff)) * (double)eff;
}

/* The e4m3 code before the zero -> 0x20 fix, a monotone function of amax. */
static uint8_t a4_raw_code(float amax, float g)
{
    float s = amax / 6.0f;
    s = g * s;
    return nf_f32_to_e4m3(s);
}

/* One block of 16 intermediates a[i] (double) whose device values may lie anywhere in
 * [a - da, a + da]: q[i] = the encoding of (float)a[i] (what an exact device produces), dev[i] =
 * the largest |encoding - q[i]| over every device value and every scale the block amax allows. */
static void a4_block(const double *a, const double *da, float g, double *q, double *dev)
{
    float af[16], amax = 0.0f;
    double lo = 0, hi = 0;
    for (int i = 0; i < 16; i++) {
        af[i] = (float)a[i];
        amax = fmaxf(amax, fabsf(af[i]));
        lo = fmax(lo, fabs(a[i]) - da[i]);
        hi = fmax(hi, fabs(a[i]) + da[i]);
    }
    const uint8_t sb = nf_nvfp4_block_scale(amax, g);
    for (int i = 0; i < 16; i++) {
        q[i] = a4_value(af[i], sb, g);
        dev[i] = 0;
    }
    /* float interval endpoints rounded outwards: the device's values are floats inside them */
    const uint8_t c0 = a4_raw_code(nextafterf((float)lo, 0.0f), g), c1 = a4_raw_code(nextafterf((float)hi, INFINITY), g);
    for (unsigned c = c0; c <= c1; c++) {
        const uint8_t cb = c == 0 ? 0x20 : (uint8_t)c;
        for (int i = 0; i < 16; i++) {
            const float vl = nextafterf((float)(a[i] - da[i]), -INFINITY), vh = nextafterf((float)(a[i] + da[i]), INFINITY);
            dev[i] = fmax(dev[i], fmax(fabs(a4_value(vl, cb, g) - q[i]), fabs(a4_value(vh, cb, g) - q[i])));
        }
    }
}

/* One expert in W4A4: gu [2n][H], dn [H][n] dequantized; xq the encoded input; gd the down input
 * divisor; yr the unit roundoff of the format y is stored in (0: f32). Adds scale * y to out,
 * |scale| * (its bound) to bound and |scale y| to yabs (the combine's rounding is the caller's). */
static void expert_a4(const float *gu, const float *dn, uint32_t H, uint32_t n, const double *xq, float gd,
                      double scale, double yr, double *out, double *bound, double *yabs)
{
    double *a = malloc(sizeof(double) * n * 4), *da = a + n, *q = a + 2 * n, *dev = a + 3 * n;
    const double eh = nf_moe_ref_acc_rel(H), en = nf_moe_ref_acc_rel(n);
    for (uint32_t r = 0; r < n; r++) {
        const float *wg = gu + (size_t)r * H, *wu = gu + (size_t)(n + r) * H;
        double g = 0, u = 0, sg = 0, su = 0;
        for (uint32_t c = 0; c < H; c++) {
            g += (double)wg[c] * xq[c];
            u += (double)wu[c] * xq[c];
            sg += fabs((double)wg[c] * xq[c]);
            su += fabs((double)wu[c] * xq[c]);
        }
        const double dg = eh * sg, du = eh * su, s = g / (1.0 + exp(-g));
        a[r] = s * u;
        /* |silu'| <= 1.1; the fp32 evaluation of silu (expf, a division) and of the product: a few
         * ulps, covered by 2^-20 |a| */
        da[r] = 1.1 * fabs(u) * dg + fabs(s) * du + 1.1 * dg * du + ldexp(fabs(a[r]), -20);
    }
    for (uint32_t b = 0; b < n / 16; b++) a4_block(a + 16 * b, da + 16 * b, gd, q + 16 * b, dev + 16 * b);
    for (uint32_t h = 0; h < H; h++) {
        const float *w = dn + (size_t)h * n;
        double y = 0, yb = 0, ya = 0;
        for (uint32_t r = 0; r < n; r++) {
            y += (double)w[r] * q[r];
            yb += fabs((double)w[r]) * dev[r];
            ya += fabs((double)w[r]) * (fabs(q[r]) + dev[r]);
        }
        out[h] += scale * y;
        /* the stored y is within yb + en ya of y, and its rounding moves it by yr of its magnitude */
        bound[h] += fabs(scale) * (yb + en * ya + yr * (fabs(y) + yb + en * ya));
        yabs[h] += fabs(scale * y);
    }
    free(a);
}

void nf_moe_ref_token_a4(const nf_moe_ref *m, const nf_moe_ref_a4 *a, const float *x, const int32_t *ids,
                         const double *weights, double yr, double *out, double *bound)
{
    double *xq = malloc(sizeof(double) * m->H * 2), *yabs = xq + m->H;
    nf_moe_ref_encode_a4(x, m->H, a->in_div, NULL, NULL, xq);
    for (uint32_t h = 0; h < m->H; h++) out[h] = bound[h] = yabs[h] = 0;
    for (uint32_t j = 0; j < m->k; j++) {
        size_t e = (size_t)ids[j];
        expert_a4(m->gate_up + e * 2 * m->I * m->H, m->down + e * m->H * m->I, m->H, m->I, xq, a->down_div[e],
                  weights[j], yr, out, bound, yabs);
    }
    if (m->S) {
        double sg = 1.0 / (1.0 + exp(-dot(m->sgate, x, m->H)));
        expert_a4(m->sgate_up, m->sdown, m->H, m->S, xq, a->sdown_div, sg, 0.0, out, bound, yabs);
    }
    /* the combine sums k + 1 weighted terms in fp32 */
    for (uint32_t h = 0; h < m->H; h++) bound[h] += ldexp(yabs[h], -20);
    free(xq);
}

/* ---- W·A8 ---------------------------------------------------------------------------------------
 * Operands. The device's int8 dots are exact integer sums scaled in fp32, so the values it rounds
 * are sums of whole groups of products, and the reference takes its operands exactly as the device
 * does: x~ = d_x q~ and the intermediate's d q in double (not rounded to f32), and weights that
 * are the device's own (the caller checks it: q6_k (d sc) q and q8_0 d q are exact in f32 by their
 * bit counts; q4_k/q5_k's fl(d_s q - m_s) must equal d_s q - m_s, test_sparse_moe.cu verifies each).
 *
 * Terms. A device dot over a row is a sum of group terms, each the exact sum of its group's
 * products times one rounded scale product: q4_k/q5_k per 32-element sub-block d_s d_x sum q q~ =
 * sum (w + m) x~ and m d_x sum q~ = m sum x~ (two terms: they can far exceed their difference); q6_k
 * per 16-element run (d sc) d_x sum q q~ (q3_k the same); q8_0 per 32-block; iq4_xs / iq4_nl per
 * 32-element group (d ls) d_x sum kv q~ (two a span, no offset). An fp32 operation's rounding error is
 * at most u = 2^-24 of its result, so to first order |computed - exact| <= u (sum |term| + sum over
 * the additions and fmas of |exact partial sum|) (Higham, Accuracy and Stability of Numerical
 * Algorithms, 2nd ed., 3.1 and 4.2); the second-order remainder is below 64u of that, and 1.001 covers it.
 *
 * The gate/up dots (what decides an intermediate's interval, so how many near ties are enumerated)
 * take that sum along the device's own chain (a8_dot_err, gemv_a8.cu with spans_a8.cuh's span
 * policies): lane l takes spans l, l + 32, ... in order (64 elements; q8_0 32), each span's terms in
 * the policy's order onto the lane's partial (fma); then warp_sum's butterfly (xor 16, 8, 4, 2, 1),
 * whose additions of a lane that held no span are exact. So do the router's logits (logit_err:
 * router.cu's CUDA-core prefill router, 8-element chunks lane, lane + 32, ..., the same butterfly;
 * logit_err_cluster and logit_err_mma: its tensor-core forms), whose error scales every routing
 * weight. Other sums take the order-free form
 * gamma_n sum |term| (Higham 4.2: a term passes through at most n roundings), with n counted from the
 * kernels (a miscounted step moves a bound by 2^-24 of its terms' sum):
 *  down_a8.cu, one output element: chain_small_down (below); its group terms taken per 32 with
 *   offsets, else per 16.
 *  f32 dot (gemv.cu: the shared expert, f32 activations, every product-accumulate rounds): a lane
 *   takes pieces of at most 16 elements, pieces lane, lane + 32, ...: at most 16 ceil(c / 512)
 *   fmas, then 5 butterflies: chain_f32 = 16 ceil(c / 512) + 5 (the device decodes a weight with
 *   the CPU's operations: d_s q exact, one rounding of d_s q - m_s, the same value).
 *  router.cu's shared gate (gate_dot: elements lane, lane + 32, ...): ceil(H / 32) fmas a lane and
 *   5 butterflies. */

double nf_moe_ref_gamma(uint32_t n)
{
    const double nu = ldexp((double)n, -24);
    return nu / (1.0 - nu);
}

static uint32_t cdiv(uint32_t a, uint32_t b) { return (a + b - 1) / b; }
static uint32_t chain_f32(uint32_t c) { return 16 * cdiv(c, 512) + 5; }

/* The small-token route's down chain, one output element, the longer of its two kernels' (T = 1:
 * down_a8_kernel; T >= 2: down_rows_kernel, both in down_a8.cu):
 *  down_a8: the scale product (1), up to 4 fmas per span, the routing weight times the span's dot
 *   (1), the lane's sum over its items of this token (at most ceil(spans / 32) per expert whatever
 *   the work list's order: k ceil(I / 1024)), 5 butterflies, the shared expert's fma (1):
 *   12 + k ceil(I / 1024);
 *  down_rows: the scale product (1), a lane's fmas over its spans (L lanes a row as internal.cuh's
 *   down_rows_lanes chooses: up to 4 per 64-element k-quant span, 1 per 32-element q8_0 span),
 *   log2 L butterflies, y stored in f32, the combine's k fmas in j order and the shared expert's (1). */
static uint32_t rows_lanes(uint32_t spans) { return spans <= 12 ? 4 : spans <= 24 ? 8 : 16; }
static uint32_t chain_rows(uint32_t spans, uint32_t fmas, uint32_t k)
{
    const uint32_t L = rows_lanes(spans);
    return 1 + fmas * cdiv(spans, L) + (L == 4 ? 2 : L == 8 ? 3 : 4) + k + 1;
}
static uint32_t chain_small_down(uint32_t I, uint32_t k)
{
    const uint32_t a8 = 12 + k * cdiv(I, 1024), kq = chain_rows(I / 64, 4, k), q8 = chain_rows(I / 32, 1, k);
    const uint32_t rows = kq > q8 ? kq : q8;
    return a8 > rows ? a8 : rows;
}

static double ddot(const float *w, const double *x, uint32_t n)
{
    double s = 0;
    for (uint32_t i = 0; i < n; i++) s += (double)w[i] * x[i];
    return s;
}

/* The sum of |term| of an int8 dot of w[n] with x[n] (the groups above; off = the row's offsets per
 * 32, or NULL) */
static double a8_terms(const float *w, const float *off, const double *x, uint32_t n)
{
    const uint32_t G = off ? 32 : 16;
    double t = 0;
    for (uint32_t g = 0; g < n; g += G) {
        const double m = off ? (double)off[g / 32] : 0.0;
        double s = 0, sx = 0;
        for (uint32_t i = g; i < g + G; i++) s += ((double)w[i] + m) * x[i], sx += x[i];
        t += fabs(s) + fabs(m * sx);
    }
    return t;
}

/* warp_sum's butterfly (xor 16, 8, 4, 2, 1) over lane partials v[32] whose own bounds are e[32]:
 * each addition rounds (u of its result) unless one side is a lane that held nothing (live 0; the
 * addition of an exact 0 is exact). Returns lane 0's bound, times 1.001 (the second order). */
static double butterfly_err(double *v, double *e, int *live)
{
    for (int o = 16; o > 0; o >>= 1) {
        double nv[32], ne[32];
        int nl[32];
        for (int l = 0; l < 32; l++) {
            nv[l] = v[l] + v[l ^ o];
            ne[l] = e[l] + e[l ^ o] + (live[l] && live[l ^ o] ? fabs(nv[l]) : 0.0);
            nl[l] = live[l] || live[l ^ o];
        }
        for (int l = 0; l < 32; l++) v[l] = nv[l], e[l] = ne[l], live[l] = nl[l];
    }
    return 1.001 * ldexp(e[0], -24);
}

/* The first-order bound above on |fp32 dot - exact| for gemv_a8.cu's int8 dot of a row w[c] (codec's
 * span policy; off its offsets per 32 or NULL) with x[c], along the device's chain. */
static double a8_dot_err(int codec, const float *w, const float *off, const double *x, uint32_t c)
{
    const uint32_t S = codec == NF_CODEC_Q8_0 ? 32 : 64, spans = c / S;
    double v[32] = {0}, e[32] = {0};
    int live[32] = {0};
    for (uint32_t s = 0; s < spans; s++) {
        const int l = (int)(s % 32);
        uint32_t g0[4], gn = 0, G = 16;
        if (codec == NF_CODEC_Q4_K || codec == NF_CODEC_Q5_K) { /* sub-blocks 2j, 2j + 1 of block s / 4 */
            G = 32, gn = 2;
            g0[0] = (s / 4) * 256 + (s % 4) * 64, g0[1] = g0[0] + 32;
        } else if (codec == NF_CODEC_IQ4_XS || codec == NF_CODEC_IQ4_NL) { /* two 32-groups, no offsets */
            G = 32, gn = 2;
            g0[0] = 64 * s, g0[1] = g0[0] + 32;
        } else if (codec == NF_CODEC_Q6_K || codec == NF_CODEC_Q3_K) { /* runs m: b 256 + n 128 + 16 h + 32 m */
            gn = 4;
            for (uint32_t m = 0; m < 4; m++) g0[m] = (s / 4) * 256 + ((s / 2) % 2) * 128 + (s % 2) * 16 + 32 * m;
        } else { /* q8_0: the span's block */
            G = 32, gn = 1, g0[0] = 32 * s;
        }
        for (uint32_t g = 0; g < gn; g++) {
            const double m = off ? (double)off[g0[g] / 32] : 0.0;
            double t1 = 0, sx = 0;
            for (uint32_t i = g0[g]; i < g0[g] + G; i++) t1 += ((double)w[i] + m) * x[i], sx += x[i];
            v[l] += t1; /* fma(fl(d_s d_x), sum q q~, partial) */
            e[l] += fabs(t1) + fabs(v[l]);
            if (off) { /* fma(-m_s, fl(d_x sum q~), partial) */
                v[l] -= m * sx;
                e[l] += fabs(m * sx) + fabs(v[l]);
            }
        }
        live[l] = 1;
    }
    return butterfly_err(v, e, live);
}

/* The same bound along mmq.cu's chain: one thread folds a row's groups in element order (mmq.cuh's
 * mmq_fold: fma(fl(d_s d_x), sum q q~, acc), then fma(-m_s, s_x, acc) with offsets), 16-element
 * groups for q6_k (its MMA is m16n8k16, one scale a group), 32 for the others; no butterfly. */
static double a8_dot_err_seq(int codec, const float *w, const float *off, const double *x, uint32_t c)
{
    const uint32_t G = codec == NF_CODEC_Q6_K ? 16 : 32;
    double v = 0, e = 0;
    for (uint32_t g0 = 0; g0 < c; g0 += G) {
        const double m = off ? (double)off[g0 / 32] : 0.0;
        double t1 = 0, sx = 0;
        for (uint32_t i = g0; i < g0 + G; i++) t1 += ((double)w[i] + m) * x[i], sx += x[i];
        v += t1;
        e += fabs(t1) + fabs(v);
        if (off) {
            v -= m * sx;
            e += fabs(m * sx) + fabs(v);
        }
    }
    return 1.001 * ldexp(e, -24);
}

/* The tensor-core router's logit (router_mma.cu): the f32 row split into bf16 planes hi + mid + lo
 * (exactly), for each k16 step of H the three planes' mma.m16n8k16 in that order onto one fp32
 * accumulator; the bf16 products are exact in fp32. How the tensor core adds a step's 16 products
 * and the accumulator is not IEEE (it aligns the addends to the largest and truncates): bounded here
 * as if each of the 17 addends lost up to 2u of the step's largest magnitude and the result rounded
 * once more, i.e. 40u (|accumulator| + sum |products|) a step, summed over the steps. A plane's
 * products are at most (1 + 2^-7) |w x| each (hi is w rounded to bf16; mid, lo far smaller), and the
 * accumulator before a plane's step is at most the exact sum of the earlier k16 steps plus the
 * earlier planes' products of this step: |v| + 2.02 sum |w x| bounds both. */
static double logit_err_mma(const float *w, const float *x, uint32_t H)
{
    double v = 0, e = 0;
    for (uint32_t k0 = 0; k0 < H; k0 += 16)
        for (int plane = 0; plane < 3; plane++) {
            double p = 0, ap = 0;
            for (uint32_t i = k0; i < k0 + 16 && i < H; i++) {
                p += (double)w[i] * (double)x[i];
                ap += fabs((double)w[i] * (double)x[i]);
            }
            e += 40.0 * (fabs(v) + 3.03 * ap);
            if (plane == 2) v += p;
        }
    return 1.001 * ldexp(e, -24);
}

/* The cluster router's logit (router_cluster.cu, cluster_logits_mma: the decode and small-token routes): warp w
 * of 8 takes the 32-column blocks w, w + 8, ... onto its own accumulator, a block two k16 steps
 * (columns 32 b + 8 c + 0 .. 3 for c = 0 .. 3, then + 4 .. 7), each step the three planes' MMAs
 * bounded as logit_err_mma's; then the 8 accumulators added in warp order. */
static double logit_err_cluster(const float *w, const float *x, uint32_t H)
{
    double v[8] = {0}, e = 0;
    for (uint32_t b = 0; 32 * b < H; b++)
        for (uint32_t s = 0; s < 2; s++) {
            double p = 0, ap = 0;
            for (uint32_t c = 0; c < 4; c++)
                for (uint32_t i = 0; i < 4; i++) {
                    const uint32_t h = 32 * b + 8 * c + 4 * s + i;
                    if (h >= H) continue;
                    p += (double)w[h] * (double)x[h];
                    ap += fabs((double)w[h] * (double)x[h]);
                }
            for (int plane = 0; plane < 3; plane++) e += 40.0 * (fabs(v[b % 8]) + 3.03 * ap);
            v[b % 8] += p;
        }
    double sum = v[0];
    for (int i = 1; i < 8; i++) sum += v[i], e += fabs(sum);
    return 1.001 * ldexp(e, -24);
}

/* router.cu's logit of a bf16 row w[H] with x[H] (exact products in fp32): lane l takes 8-element
 * chunks l, l + 32, ..., an fma per element, then the butterfly. The first-order bound as above. */
static double logit_err(const float *w, const float *x, uint32_t H)
{
    double v[32] = {0}, e[32] = {0};
    int live[32] = {0};
    for (uint32_t c = 0; c < H / 8; c++) {
        const int l = (int)(c % 32);
        for (uint32_t i = 8 * c; i < 8 * c + 8; i++) {
            v[l] += (double)w[i] * (double)x[i];
            e[l] += fabs(v[l]);
        }
        live[l] = 1;
    }
    return butterfly_err(v, e, live);
}

/* sum_i |w_i x_i| */
static double f32_terms(const float *w, const double *x, uint32_t n)
{
    double t = 0;
    for (uint32_t i = 0; i < n; i++) t += fabs((double)w[i] * x[i]);
    return t;
}

/* One expert's SwiGLU intermediate a[n] over x (gu [2n][H]; off its offsets [2n][H / 32] or NULL;
 * codec >= 0: gemv_a8.cu's int8 dots of that codec, -1: gemv.cu's f32 dots) and da[n], how far a
 * device evaluating it in fp32 may be from a: |g' - g| <= dg (the dot's bound), |u' - u| <= du,
 * |silu'| <= 1.1 (mean value theorem), so |a' - a| <= 1.1 dg (|u| + du) + |silu(g)| du; silu's
 * evaluation (expf: at most 2 ulps (CUDA's accuracy table), 4u relative, which 1 + e keeps; the
 * addition's and the division's roundings) and the product's rounding cost at most 7u |a| to first
 * order: 2^-21 |a| covers it. */
static void swiglu(const float *gu, const float *off, uint32_t H, uint32_t n, const double *x, int codec, int seq,
                   double *a, double *da)
{
    const double gm = nf_moe_ref_gamma(chain_f32(H));
    const uint32_t nb = H / 32;
    for (uint32_t r = 0; r < n; r++) {
        const float *wg = gu + (size_t)r * H, *wu = gu + (size_t)(n + r) * H;
        const float *og = off ? off + (size_t)r * nb : NULL, *ou = off ? off + (size_t)(n + r) * nb : NULL;
        const double g = ddot(wg, x, H), u = ddot(wu, x, H), s = g / (1.0 + exp(-g));
        const double dg = codec < 0 ? gm * f32_terms(wg, x, H)
                          : seq     ? a8_dot_err_seq(codec, wg, og, x, H)
                                    : a8_dot_err(codec, wg, og, x, H);
        const double du = codec < 0 ? gm * f32_terms(wu, x, H)
                          : seq     ? a8_dot_err_seq(codec, wu, ou, x, H)
                                    : a8_dot_err(codec, wu, ou, x, H);
        a[r] = s * u;
        da[r] = 1.1 * dg * (fabs(u) + du) + fabs(s) * du + ldexp(fabs(a[r]), -21);
    }
}

/* x quantised as the device does (nf_test_quantize_a8's d and q), the values d q exact in double */
static void quantize_exact(const float *x, uint32_t n, double *xq)
{
    for (uint32_t b = 0; b < n; b += 32) {
        float am = 0.f;
        for (uint32_t i = b; i < b + 32; i++) am = fmaxf(am, fabsf(x[i]));
        const float d = am / 127.0f;
        for (uint32_t i = b; i < b + 32; i++) xq[i] = am > 0.f ? (double)d * rintf(x[i] / d) : 0.0;
    }
}

void nf_moe_ref_a8_inter(const nf_moe_ref *m, const nf_moe_ref_a8 *a8, const float *x, int32_t e, double *a,
                         double *da)
{
    const uint32_t H = m->H, I = m->I;
    double *xq = malloc(sizeof(double) * H);
    quantize_exact(x, H, xq);
    swiglu(m->gate_up + (size_t)e * 2 * I * H, a8->gate_up_off ? a8->gate_up_off + (size_t)e * 2 * I * (H / 32) : NULL,
           H, I, xq, a8->gate_up_codec, a8->route != 0, a, da);
    free(xq);
}

void nf_moe_ref_a8_block(const double *a, const double *da, double *v, double *dev, uint32_t *n_near)
{
    float af[32];
    double lo = 0, hi = 0;
    for (int i = 0; i < 32; i++) {
        af[i] = (float)a[i];
        lo = fmax(lo, fabs(a[i]) - da[i]);
        hi = fmax(hi, fabs(a[i]) + da[i]);
    }
    quantize_exact(af, 32, v);
    /* The device's amax is a float in [lo, hi] and its d = amax / 127 (f32) is monotone in amax, so
     * d lies in [ds[0], ds[1]] (interval ends rounded outwards to floats). Each element's device
     * value is a float in [vl, vh], and rint(value / d) is monotone in both, so the integers it can
     * take run between the four corners' (IEEE divisions, as the device's); d q is linear in d for
     * a fixed q, so the largest departure is at a corner too. */
    const float al = lo > 0 ? nextafterf((float)lo, 0.0f) : 0.0f, ah = nextafterf((float)hi, INFINITY);
    const float ds[2] = {al / 127.0f, ah / 127.0f};
    for (int i = 0; i < 32; i++) {
        if (!(ds[0] > 0.0f)) { /* every element within its error of 0: the device's block is anything in [-hi, hi] */
            dev[i] = fabs(v[i]) + 1.01 * hi;
            if (n_near) (*n_near)++;
            continue;
        }
        const float vl = nextafterf((float)(a[i] - da[i]), -INFINITY), vh = nextafterf((float)(a[i] + da[i]), INFINITY);
        float qlo = INFINITY, qhi = -INFINITY;
        for (int j = 0; j < 2; j++) {
            const float q0 = rintf(vl / ds[j]), q1 = rintf(vh / ds[j]);
            qlo = fminf(qlo, fminf(q0, q1));
            qhi = fmaxf(qhi, fmaxf(q0, q1));
        }
        double e = 0;
        for (int j = 0; j < 2; j++)
            e = fmax(e, fmax(fabs((double)ds[j] * qlo - v[i]), fabs((double)ds[j] * qhi - v[i])));
        dev[i] = e;
        if (n_near && qlo != qhi) (*n_near)++;
    }
}

/* One expert on int8 activations: its SwiGLU intermediate a[n] over xq (x quantised) along the
 * device's gate/up chain (gu [2n][H], goff its offsets or NULL, codec, seq as swiglu's), da[n] its
 * interval, each block's reachable quantisations enumerated (v[n] the reference's values, dev[n] the
 * largest departure), then its down (dn [H][n], doff [H][n / 32] or NULL) over v: y[H], the
 * quantisation's reach f[H] = sum_r |W_hr| dev_r, and t[H] the down dot's |terms| (the group terms
 * and their growth where the device's values depart) for the caller's gamma. */
static void a8_expert(const float *gu, const float *goff, const float *dn, const float *doff, uint32_t H, uint32_t n,
                      int codec, int seq, const double *xq, double *a, double *da, double *v, double *dev, double *y,
                      double *f, double *t, uint32_t *n_near)
{
    const uint32_t nb = n / 32;
    swiglu(gu, goff, H, n, xq, codec, seq, a, da);
    for (uint32_t b = 0; b < nb; b++) nf_moe_ref_a8_block(a + 32 * b, da + 32 * b, v + 32 * b, dev + 32 * b, n_near);
    for (uint32_t h = 0; h < H; h++) {
        const float *w = dn + (size_t)h * n, *o = doff ? doff + (size_t)h * nb : NULL;
        double fh = 0, th = 0;
        for (uint32_t r = 0; r < n; r++) {
            const double wr = fabs((double)w[r]) + (o ? 2.0 * fabs((double)o[r / 32]) : 0.0);
            fh += fabs((double)w[r]) * dev[r];
            th += wr * dev[r]; /* the terms' growth where the device's values depart */
        }
        y[h] = ddot(w, v, n);
        f[h] = fh;
        t[h] = a8_terms(w, o, v, n) + th;
    }
}

void nf_moe_ref_token_a8(const nf_moe_ref *m, const nf_moe_ref_a8 *a8, const float *x, const int32_t *ids,
                         const double *weights, double *out, double *bound, uint32_t *n_near)
{
    const uint32_t H = m->H, I = m->I, S = m->S, E = m->E, k = m->k, n = I > S ? I : S;
    const double u = ldexp(1.0, -24);
    double *xq = malloc(sizeof(double) * (2 * (size_t)H + 4 * (size_t)n + 7 * (size_t)H + 2 * (size_t)E));
    double *xd = xq + H, *a = xd + H, *da = a + n, *v = da + n, *dev = v + n;
    double *qdep = dev + n, *sum = qdep + H, *rt = sum + H, *sh = rt + H, *l = sh + H, *al = l + E;
    double *y = al + E, *f = y + H, *t = f + H;
    for (uint32_t h = 0; h < H; h++) out[h] = qdep[h] = sum[h] = rt[h] = sh[h] = 0, xd[h] = x[h];
    quantize_exact(x, H, xq);

    /* Routing weights: the device's logit e is off by at most dl_e (logit_err); its softmax
     * subtracts the max (rounding: u |l_e - max|), takes expf (2 ulps: 4u) and divides by the sum of
     * all E, a factor common to every weight; renormalised, that factor cancels and only the k
     * selected terms' errors, psum's k additions and the divisions remain. alpha_e = dl_e +
     * u |l_e - max| + 5u bounds the relative error of the device's exp(l_e - max). */
    double mx = -INFINITY, amax_all = 0, amax_top = 0;
    for (uint32_t e = 0; e < E; e++) {
        l[e] = dot(m->router + (size_t)e * H, x, H);
        const float *we = m->router + (size_t)e * H;
        al[e] = a8->route == 2 ? logit_err_mma(we, x, H) : a8->route == 1 ? logit_err(we, x, H) : logit_err_cluster(we, x, H);
        mx = fmax(mx, l[e]);
    }
    for (uint32_t e = 0; e < E; e++) {
        al[e] += u * fabs(l[e] - mx) + 5 * u;
        amax_all = fmax(amax_all, al[e]);
    }
    for (uint32_t j = 0; j < k; j++) amax_top = fmax(amax_top, al[ids[j]]);

    /* the down's chain: down_a8.cu's (above), or mmq.cu's: a term's scale product (1), the fold's
     * fmas after it (at most I / 16: two a 32-group with offsets, one a 16-group for q6_k; the shared
     * expert's on int8 activations: S / 16), y stored f32, the combine's k fmas in j order and the
     * shared expert's (1), with 2 to spare */
    const uint32_t nf = a8->shared_a8 && S > I ? S : I;
    /* (route 0 with shared_a8: the shared expert's down by rows too, S wide: the longer chain) */
    const uint32_t c0 = chain_small_down(I, k), cs = a8->shared_a8 ? chain_small_down(S, k) : 0;
    const double gd = nf_moe_ref_gamma(a8->route ? 1 + nf / 16 + k + 3 : c0 > cs ? c0 : cs);
    const uint32_t ib = I / 32, hb = H / 32;
    for (uint32_t j = 0; j < k; j++) {
        const size_t e = (size_t)ids[j];
        const double p = weights[j], ap = fabs(p);
        const double eps = al[e] + (m->norm_topk ? amax_top + (k + 3) * u : amax_all + (cdiv(E, 32) + 8) * u);
        const float *gu = m->gate_up + e * 2 * I * H, *dn = m->down + e * H * I;
        const float *goff = a8->gate_up_off ? a8->gate_up_off + e * 2 * I * hb : NULL;
        const float *doff = a8->down_off ? a8->down_off + e * H * ib : NULL;
        a8_expert(gu, goff, dn, doff, H, I, a8->gate_up_codec, a8->route != 0, xq, a, da, v, dev, y, f, t, n_near);
        for (uint32_t h = 0; h < H; h++) {
            out[h] += p * y[h];
            qdep[h] += ap * f[h];
            sum[h] += ap * t[h];
            rt[h] += eps * ap * fabs(y[h]);
        }
    }
    if (S) {
        /* the shared expert in fp32 (gemv.cu; or, shared_a8, as a routed expert): its intermediate's
         * error propagates through |down|, and its sigmoid gate's (|sigma'| = sg (1 - sg); expf, an
         * addition and a division: 6u) */
        /* (the tensor-core router's shared gate, route 2, is an fp32 fma chain in its own order:
         * H + 5 roundings bound any order; the cluster router's, route 0, a thread's columns of its
         * CTA's H / 16, the butterfly, 8 warps' and 16 CTAs' partials added in order) */
        const uint32_t gchain = a8->route == 2 ? H + 5 : a8->route == 1 ? cdiv(H, 32) + 5 : cdiv(cdiv(H, 16), 256) + 5 + 8 + 16;
        const double s = dot(m->sgate, x, H), ds = nf_moe_ref_gamma(gchain) * adot(m->sgate, x, H);
        const double sg = 1.0 / (1.0 + exp(-s)), dsg = sg * (1.0 - sg) * ds + 6 * u * sg;
        if (a8->shared_a8) { /* int8 activations as a routed expert's, on the route's chains */
            a8_expert(m->sgate_up, a8->sgate_up_off, m->sdown, a8->sdown_off, H, S, a8->sgate_up_codec, a8->route != 0, xq, a, da, v,
                      dev, y, f, t, n_near);
            for (uint32_t h = 0; h < H; h++) {
                out[h] += sg * y[h];
                sh[h] = sg * f[h] + dsg * fabs(y[h]);
                sum[h] += sg * t[h];
            }
        } else {
            const double gs = nf_moe_ref_gamma(chain_f32(S));
            swiglu(m->sgate_up, NULL, H, S, xd, -1, 0, a, da);
            for (uint32_t h = 0; h < H; h++) {
                const float *w = m->sdown + (size_t)h * S;
                double dd = 0, tt = 0;
                for (uint32_t r = 0; r < S; r++) {
                    dd += fabs((double)w[r]) * da[r];
                    tt += fabs((double)w[r]) * (fabs(a[r]) + da[r]);
                }
                const double ys = ddot(w, a, S);
                out[h] += sg * ys;
                sh[h] = sg * (dd + gs * tt) + dsg * fabs(ys);
                sum[h] += sg * fabs(ys); /* the down's last fma adds sg ys */
            }
        }
    }
    for (uint32_t h = 0; h < H; h++) bound[h] = qdep[h] + gd * sum[h] + rt[h] + sh[h];
    free(xq);
}

size_t nf_moe_ref_k4_offsets(int codec, const uint8_t *payload, size_t row_bytes, const float *deq, uint64_t rows,
                             uint32_t cols, float *off)
{
    const size_t bs = nf_codec_row_bytes(nf_codec_get(codec), 256);
    size_t inexact = 0;
    for (uint64_t r = 0; r < rows; r++)
        for (uint32_t b = 0; b < cols / 256; b++) {
            const uint8_t *blk = payload + r * row_bytes + b * bs;
            const float d = nf_rd_f16(blk), dmin = nf_rd_f16(blk + 2);
            for (int s = 0; s < 8; s++) {
                uint8_t sc, mn;
                nf_k4_scale_min(s, blk + 4, &sc, &mn);
                const float d1 = d * sc, m1 = dmin * mn;
                off[r * (cols / 32) + b * 8 + s] = m1;
                for (uint32_t i = b * 256 + 32 * s; i < b * 256 + 32 * s + 32; i++) {
                    const double wv = deq[r * cols + i], q = d1 != 0 ? rint((wv + m1) / d1) : 0;
                    inexact += (double)d1 * q - m1 != wv;
                }
            }
        }
    return inexact;
}
