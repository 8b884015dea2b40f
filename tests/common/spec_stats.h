/* The statistics the speculation tests share (tests/engine/test_spec.c, test_mtp.c): the top-k
 * distribution a sampler draws from, and a chi-square of observed counts against expected ones. */
#pragma once

#include <math.h>
#include <stdint.h>

/* softmax(l / temp) over the k best of V logits (ties to the lower id): ids[k] and p[k], best first. */
static inline void top_probs(const float *l, uint32_t V, double temp, int k, int32_t *ids, double *p)
{
    double z = 0;
    for (int j = 0; j < k; j++) {
        int32_t b = -1;
        for (uint32_t i = 0; i < V; i++) {
            int taken = 0;
            for (int q = 0; q < j; q++) taken |= ids[q] == (int32_t)i;
            if (!taken && (b < 0 || l[i] > l[b])) b = (int32_t)i;
        }
        ids[j] = b;
    }
    for (int j = 0; j < k; j++) z += p[j] = exp((l[ids[j]] - l[ids[0]]) / temp);
    for (int j = 0; j < k; j++) p[j] /= z;
}

/* Pearson's chi-square of cnt[cells] against expected[cells]: cells expected fewer than 5 times are
 * pooled into one (kept when it reaches 5 itself); *df = cells used - 1. */
static inline double pooled_chi2(const long *cnt, const double *expected, int cells, int *df)
{
    double chi2 = 0, pooled_e = 0;
    long pooled_n = 0;
    *df = -1;
    for (int c = 0; c < cells; c++) {
        if (expected[c] < 5) {
            pooled_e += expected[c], pooled_n += cnt[c];
            continue;
        }
        chi2 += (cnt[c] - expected[c]) * (cnt[c] - expected[c]) / expected[c], ++*df;
    }
    if (pooled_e >= 5) chi2 += (pooled_n - pooled_e) * (pooled_n - pooled_e) / pooled_e, ++*df;
    return chi2;
}
