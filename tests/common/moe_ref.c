#include "moe_ref.h"

#include <math.h>
#include <stdlib.h>

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

/* down(silu(gate x) * up x) for one expert; gu is [2n][H], dn is [H][n]. quant: the intermediate
 * is rounded to f32 and quantised to int8 per 32 first (n % 32 == 0). */
static void expert(const float *gu, const float *dn, uint32_t H, uint32_t n, const float *x, double scale, int quant,
                   double *out)
{
    float *a = malloc(sizeof(float) * n);
    double *ad = malloc(sizeof(double) * n);
    for (uint32_t r = 0; r < n; r++) {
        double g = dot(gu + (size_t)r * H, x, H), u = dot(gu + (size_t)(n + r) * H, x, H);
        ad[r] = g / (1.0 + exp(-g)) * u;
    }
    if (quant) {
        for (uint32_t r = 0; r < n; r++) a[r] = (float)ad[r];
        nf_test_quantize_a8(a, n, a);
        for (uint32_t r = 0; r < n; r++) ad[r] = a[r];
    }
    for (uint32_t h = 0; h < H; h++) {
        double s = 0;
        for (uint32_t r = 0; r < n; r++) s += (double)dn[(size_t)h * n + r] * ad[r];
        out[h] += scale * s;
    }
    free(a);
    free(ad);
}

void nf_moe_ref_token(const nf_moe_ref *m, const float *x, const int32_t *ids, const double *weights, double *out)
{
    for (uint32_t h = 0; h < m->H; h++) out[h] = 0;
    for (uint32_t j = 0; j < m->k; j++) {
        size_t e = (size_t)ids[j];
        expert(m->gate_up + e * 2 * m->I * m->H, m->down + e * m->H * m->I, m->H, m->I, x, weights[j], m->quant_act,
               out);
    }
    if (m->S) {
        double sg = 1.0 / (1.0 + exp(-dot(m->sgate, x, m->H)));
        expert(m->sgate_up, m->sdown, m->H, m->S, x, sg, 0, out);
    }
}

static double adot(const float *a, const float *x, uint32_t n)
{
    double s = 0;
    for (uint32_t i = 0; i < n; i++) s += fabs((double)a[i] * (double)x[i]);
    return s;
}

static void expert_bound(const float *gu, const float *dn, uint32_t H, uint32_t n, const float *x, double scale,
                         double wq, double ar, double *bound)
{
    double *a = malloc(sizeof(double) * n), *da = malloc(sizeof(double) * n);
    for (uint32_t r = 0; r < n; r++) {
        const float *wg = gu + (size_t)r * H, *wu = gu + (size_t)(n + r) * H;
        double g = dot(wg, x, H), u = dot(wu, x, H), sg = g / (1.0 + exp(-g));
        a[r] = sg * u;
        da[r] = wq * (1.1 * fabs(u) * adot(wg, x, H) + fabs(sg) * adot(wu, x, H)) + ar * fabs(a[r]);
    }
    for (uint32_t h = 0; h < H; h++) {
        double b = 0;
        for (uint32_t r = 0; r < n; r++) {
            double w = fabs((double)dn[(size_t)h * n + r]);
            b += w * da[r] + wq * w * fabs(a[r]);
        }
        bound[h] += scale * b;
    }
    free(a);
    free(da);
}

void nf_moe_ref_bound(const nf_moe_ref *m, const float *x, const int32_t *ids, const double *weights, double wq,
                      double ar, double *bound)
{
    for (uint32_t h = 0; h < m->H; h++) bound[h] = 0;
    for (uint32_t j = 0; j < m->k; j++) {
        size_t e = (size_t)ids[j];
        expert_bound(m->gate_up + e * 2 * m->I * m->H, m->down + e * m->H * m->I, m->H, m->I, x, fabs(weights[j]), wq,
                     ar, bound);
    }
    if (m->S) {
        double sg = 1.0 / (1.0 + exp(-dot(m->sgate, x, m->H)));
        expert_bound(m->sgate_up, m->sdown, m->H, m->S, x, sg, wq, ar, bound);
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
 * divisor. Adds scale * y to out and |scale| * (its bound) to bound; returns sum_h |y_h|-weighted
 * nothing (the combine's rounding is the caller's). */
static void expert_a4(const float *gu, const float *dn, uint32_t H, uint32_t n, const double *xq, float gd,
                      double scale, double *out, double *bound, double *yabs)
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
        bound[h] += fabs(scale) * (yb + en * ya);
        yabs[h] += fabs(scale * y);
    }
    free(a);
}

void nf_moe_ref_token_a4(const nf_moe_ref *m, const nf_moe_ref_a4 *a, const float *x, const int32_t *ids,
                         const double *weights, double *out, double *bound)
{
    double *xq = malloc(sizeof(double) * m->H * 2), *yabs = xq + m->H;
    nf_moe_ref_encode_a4(x, m->H, a->in_div, NULL, NULL, xq);
    for (uint32_t h = 0; h < m->H; h++) out[h] = bound[h] = yabs[h] = 0;
    for (uint32_t j = 0; j < m->k; j++) {
        size_t e = (size_t)ids[j];
        expert_a4(m->gate_up + e * 2 * m->I * m->H, m->down + e * m->H * m->I, m->H, m->I, xq, a->down_div[e],
                  weights[j], out, bound, yabs);
    }
    if (m->S) {
        double sg = 1.0 / (1.0 + exp(-dot(m->sgate, x, m->H)));
        expert_a4(m->sgate_up, m->sdown, m->H, m->S, xq, a->sdown_div, sg, out, bound, yabs);
    }
    /* the combine sums k + 1 weighted terms in fp32 */
    for (uint32_t h = 0; h < m->H; h++) bound[h] += ldexp(yabs[h], -20);
    free(xq);
}
