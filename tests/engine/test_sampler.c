/* The sampler: greedy (ties to the lower id), the kept sets and probabilities of top-k / top-p /
 * min-p / temperature against values computed here from the definitions, the repetition penalty,
 * the presence / frequency penalties (OpenAI's formula applied here by hand), determinism per seed, and the empirical distribution of 200000 draws against the softmax
 * (chi-square with 4 degrees of freedom < 30: p < 1e-5 for a correct sampler; the draws are seeded,
 * so the test is deterministic); the device path (top-k pairs in, the same draws out). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"
#include "nf_test.h"

static nf_sampler *mk(float temp, int top_k, float top_p, float min_p, float rep, uint64_t seed, uint32_t V)
{
    nf_sampler_params p = {temp, top_k, top_p, min_p, rep, 64, seed, 0, 0};
    nf_sampler *s = NULL;
    CHECK(nf_sampler_create(&p, V, &s, NULL) == NF_OK);
    return s;
}

static void softmax_d(const float *l, int n, double temp, double *p)
{
    double mx = l[0], z = 0;
    for (int i = 1; i < n; i++) mx = fmax(mx, l[i]);
    for (int i = 0; i < n; i++) z += (p[i] = exp((l[i] - mx) / temp));
    for (int i = 0; i < n; i++) p[i] /= z;
}

/* The k best (id, logit) of l[V], best first, ties to the lower id: what a device selects. */
static void top_pairs(const float *l, int V, int k, int32_t *ids, float *vals)
{
    for (int j = 0; j < k; j++) {
        int b = -1;
        for (int i = 0; i < V; i++) {
            int taken = 0;
            for (int q = 0; q < j; q++) taken |= ids[q] == i;
            if (!taken && (b < 0 || l[i] > l[b])) b = i;
        }
        ids[j] = b, vals[j] = l[b];
    }
}

/* Sampling from a device's top-k pairs draws exactly what the host sampler draws from all logits
 * (same seed), step after step; nf_sampler_device_k asks for the pairs only when they suffice. */
static void check_device_path(void)
{
    enum { V = 500, K = 40 };
    float l[V];
    int32_t ids[K];
    float vals[K];
    const int32_t hist[2] = {3, 4};
    nf_sampler *a = mk(0.8f, K, 0.95f, 0.05f, 1, 11, V), *b = mk(0.8f, K, 0.95f, 0.05f, 1, 11, V);
    int same = 0;
    for (int step = 0; step < 200; step++) {
        for (int i = 0; i < V; i++) l[i] = (float)(((i * 7919 + step * 104729) % 1000) / 250.0);
        top_pairs(l, V, K, ids, vals);
        same += nf_sampler_sample(a, l, NULL, 0) == nf_sampler_sample_top(b, ids, vals, K);
    }
    CHECK_EQ_INT(same, 200);
    CHECK_EQ_INT((int)nf_sampler_device_k(a, hist, 2), K);
    nf_sampler_free(a), nf_sampler_free(b);
    nf_sampler *g = mk(0, K, 1, 0, 1, 0, V), *all = mk(1, 0, 1, 0, 1, 0, V), *wide = mk(1, 300, 1, 0, 1, 0, V);
    nf_sampler *pen = mk(1, K, 1, 0, 1.3f, 0, V);
    CHECK_EQ_INT((int)nf_sampler_device_k(g, NULL, 0), 1);      /* greedy: the best id alone */
    CHECK_EQ_INT((int)nf_sampler_device_k(all, NULL, 0), 0);    /* top-k 0: every logit */
    CHECK_EQ_INT((int)nf_sampler_device_k(wide, NULL, 0), 0);   /* more than the device selects */
    CHECK_EQ_INT((int)nf_sampler_device_k(pen, hist, 2), 0);    /* the penalty rewrites logits */
    CHECK_EQ_INT((int)nf_sampler_device_k(pen, NULL, 0), K);    /* ... but not without history */
    top_pairs(l, V, 1, ids, vals);
    CHECK_EQ_INT(nf_sampler_sample_top(g, ids, vals, 1), nf_sampler_sample(g, l, NULL, 0));
    nf_sampler_free(g), nf_sampler_free(all), nf_sampler_free(wide), nf_sampler_free(pen);
}

/* Presence and frequency (OpenAI): logit -= frequency * count + presence * (count > 0) over the
 * window, combined with the repetition penalty applied first; the probabilities equal the softmax of
 * logits penalised here by hand. */
static void check_presence_frequency(void)
{
    const float l[6] = {1.0f, 2.5f, -0.5f, 3.0f, 0.0f, 1.5f};
    const int32_t hist[7] = {3, 3, 1, 9, 3, 5, -1}; /* out-of-range ids are ignored */
    const float pres = 0.4f, freq = 0.3f, rep = 1.25f;
    float want[6];
    memcpy(want, l, sizeof want);
    const int count[6] = {0, 1, 0, 3, 0, 1};
    for (int i = 0; i < 6; i++) {
        if (!count[i]) continue;
        want[i] = want[i] > 0 ? want[i] / rep : want[i] * rep;
        want[i] -= freq * (float)count[i] + pres;
    }
    double ref[6];
    softmax_d(want, 6, 1, ref);
    nf_sampler_params p = {1, 0, 1, 0, rep, 64, 0, pres, freq};
    nf_sampler *s = NULL;
    CHECK(nf_sampler_create(&p, 6, &s, NULL) == NF_OK);
    float pr[6];
    nf_sampler_probs(s, l, hist, 7, pr);
    for (int i = 0; i < 6; i++) CHECK_MSG(fabs(pr[i] - ref[i]) < 1e-6, "pres/freq: p[%d] %g vs %g", i, pr[i], ref[i]);
    CHECK_EQ_INT((int)nf_sampler_device_k(s, hist, 7), 0); /* needs every logit */
    nf_sampler_free(s);
    /* the window: repeat_last_n 2 sees {5, -1} only, so id 3 (count 3 before) is untouched */
    p.repeat_last_n = 2;
    p.repeat_penalty = 1;
    CHECK(nf_sampler_create(&p, 6, &s, NULL) == NF_OK);
    nf_sampler_probs(s, l, hist, 7, pr);
    memcpy(want, l, sizeof want);
    want[5] -= freq + pres;
    softmax_d(want, 6, 1, ref);
    for (int i = 0; i < 6; i++) CHECK_MSG(fabs(pr[i] - ref[i]) < 1e-6, "window: p[%d] %g vs %g", i, pr[i], ref[i]);
    nf_sampler_free(s);
    p.presence_penalty = NAN;
    nf_error e;
    CHECK(nf_sampler_create(&p, 6, &s, &e) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(e.msg, "presence/frequency");
}

int main(void)
{
    check_device_path();
    check_presence_frequency();
    const float l[5] = {1.0f, 3.0f, 3.0f, 0.5f, 2.0f}; /* sorted: 1, 2, 4, 0, 3 */
    float pr[5];
    double ref[5];

    nf_sampler *s = mk(0, 0, 1, 0, 1, 0, 5);
    CHECK_EQ_INT(nf_sampler_sample(s, l, NULL, 0), 1); /* tie between 1 and 2: the lower id */
    int32_t hist[1] = {1};
    nf_sampler_free(s);
    s = mk(0, 0, 1, 0, 2.0f, 0, 5);
    CHECK_EQ_INT(nf_sampler_sample(s, l, hist, 1), 2); /* 3.0 / 2 = 1.5 < 3.0 */
    float neg[5] = {-1.0f, -0.6f, -3.0f, -3.0f, -3.0f};
    int32_t h0[1] = {1};
    CHECK_EQ_INT(nf_sampler_sample(s, neg, h0, 1), 0); /* -0.6 * 2 = -1.2 < -1.0 (multiplied when negative) */
    nf_sampler_free(s);

    /* plain softmax at temperature 0.7 */
    s = mk(0.7f, 0, 1, 0, 1, 0, 5);
    nf_sampler_probs(s, l, NULL, 0, pr);
    softmax_d(l, 5, 0.7, ref);
    for (int i = 0; i < 5; i++) CHECK_MSG(fabs(pr[i] - ref[i]) < 1e-6, "temp: p[%d] %g vs %g", i, pr[i], ref[i]);
    nf_sampler_free(s);

    /* top-k 2: ids 1 and 2 only, renormalised */
    s = mk(1, 2, 1, 0, 1, 0, 5);
    nf_sampler_probs(s, l, NULL, 0, pr);
    CHECK(fabs(pr[1] - 0.5) < 1e-6 && fabs(pr[2] - 0.5) < 1e-6 && pr[0] == 0 && pr[3] == 0 && pr[4] == 0);
    nf_sampler_free(s);

    /* top-p: the softmax at T=1 is {.0524,.3868,.3868,.0317,.1423} (ids 1,2 sum to .7737): p=0.75 keeps 2 */
    softmax_d(l, 5, 1, ref);
    s = mk(1, 0, 0.75f, 0, 1, 0, 5);
    nf_sampler_probs(s, l, NULL, 0, pr);
    CHECK(pr[1] > 0 && pr[2] > 0 && pr[0] == 0 && pr[3] == 0 && pr[4] == 0);
    nf_sampler_free(s);
    s = mk(1, 0, 0.85f, 0, 1, 0, 5); /* .7737 < .85 -> id 4 joins (.916 >= .85) */
    nf_sampler_probs(s, l, NULL, 0, pr);
    CHECK(pr[4] > 0 && pr[0] == 0 && pr[3] == 0);
    double z = ref[1] + ref[2] + ref[4];
    CHECK(fabs(pr[4] - ref[4] / z) < 1e-6);
    nf_sampler_free(s);

    /* min-p 0.2: keep p >= 0.2 * 0.3868 = 0.0774 -> ids 1, 2, 4 */
    s = mk(1, 0, 1, 0.2f, 1, 0, 5);
    nf_sampler_probs(s, l, NULL, 0, pr);
    CHECK(pr[1] > 0 && pr[2] > 0 && pr[4] > 0 && pr[0] == 0 && pr[3] == 0);
    nf_sampler_free(s);

    /* determinism: the same seed gives the same draws, another seed another sequence */
    int32_t a[64], b[64], c[64];
    nf_sampler *s1 = mk(1, 0, 1, 0, 1, 42, 5), *s2 = mk(1, 0, 1, 0, 1, 42, 5), *s3 = mk(1, 0, 1, 0, 1, 43, 5);
    for (int i = 0; i < 64; i++) {
        a[i] = nf_sampler_sample(s1, l, NULL, 0);
        b[i] = nf_sampler_sample(s2, l, NULL, 0);
        c[i] = nf_sampler_sample(s3, l, NULL, 0);
    }
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);
    nf_sampler_free(s2);
    nf_sampler_free(s3);

    /* the empirical distribution */
    enum { N = 200000 };
    long cnt[5] = {0};
    for (int i = 0; i < N; i++) cnt[nf_sampler_sample(s1, l, NULL, 0)]++;
    double chi2 = 0;
    for (int i = 0; i < 5; i++) chi2 += pow(cnt[i] - N * ref[i], 2) / (N * ref[i]);
    CHECK_MSG(chi2 < 30, "chi-square %.2f over 4 degrees of freedom", chi2);
    nf_sampler_free(s1);

    /* a large vocabulary with top-k 0 (full sort path) still returns the argmax under temp -> 0+ */
    enum { V = 3000 };
    float *big = malloc(V * sizeof(float));
    for (int i = 0; i < V; i++) big[i] = (float)((i * 7919) % V) / V;
    big[1234] = 5;
    s = mk(1e-3f, 0, 1, 0, 1, 7, V);
    CHECK_EQ_INT(nf_sampler_sample(s, big, NULL, 0), 1234);
    nf_sampler_free(s);
    free(big);

    nf_sampler_params bad = {1, 0, 1, 0, 0, 64, 0, 0, 0};
    nf_error e;
    CHECK(nf_sampler_create(&bad, 5, &s, &e) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(e.msg, "repeat penalty");
    return nf_test_report();
}
