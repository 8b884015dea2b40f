#include "moe_ref.h"

#include <math.h>
#include <stdlib.h>

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
    float *a = malloc(sizeof(float) * n);
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
    free(a);
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
