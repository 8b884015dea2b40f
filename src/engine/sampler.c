/* The sampler (see sampler.h for the order of the steps). */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct cand_pair {
    float l;
    int32_t id;
} cand_pair;

struct nf_sampler {
    nf_sampler_params p;
    uint32_t vocab;
    uint64_t rng;
    float *work;    /* [vocab] penalised logits */
    int32_t *cand;  /* [vocab] candidate ids, best first */
    float *prob;    /* [vocab] candidate probabilities */
    cand_pair *pairs;      /* [vocab] for a full sort */
};

nf_sampler_params nf_sampler_defaults(void)
{
    return (nf_sampler_params){.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1.0f,
                               .repeat_last_n = 64, .seed = 0};
}

nf_status nf_sampler_create(const nf_sampler_params *p, uint32_t vocab, nf_sampler **out, nf_error *err)
{
    *out = NULL;
    if (!vocab) return nf_error_set(err, NF_ERR_INVALID_ARG, "sampler: empty vocabulary");
    if (!(p->repeat_penalty > 0))
        return nf_error_set(err, NF_ERR_INVALID_ARG, "sampler: repeat penalty %g must be > 0", (double)p->repeat_penalty);
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return nf_error_set(err, NF_ERR_INVALID_ARG, "sampler: presence/frequency penalty %g/%g is not finite",
                            (double)p->presence_penalty, (double)p->frequency_penalty);
    nf_sampler *s = calloc(1, sizeof *s);
    if (s) {
        s->work = malloc(vocab * sizeof(float));
        s->cand = malloc(vocab * sizeof(int32_t));
        s->prob = malloc(vocab * sizeof(float));
        s->pairs = malloc(vocab * sizeof *s->pairs);
    }
    if (!s || !s->work || !s->cand || !s->prob || !s->pairs) {
        nf_sampler_free(s);
        return nf_error_set(err, NF_ERR_NOMEM, "sampler: out of memory");
    }
    s->p = *p;
    s->vocab = vocab;
    s->rng = p->seed;
    *out = s;
    return NF_OK;
}

void nf_sampler_free(nf_sampler *s)
{
    if (!s) return;
    free(s->work);
    free(s->cand);
    free(s->prob);
    free(s->pairs);
    free(s);
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t *x) { return (double)(splitmix64(x) >> 11) * 0x1.0p-53; }

/* No penalty can change a logit. */
static int penalties_off(const nf_sampler_params *p)
{
    return (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f) ||
           p->repeat_last_n <= 0;
}

/* work = logits with the penalties applied; cand is scratch for the counts (all zero again after). */
static void penalise(nf_sampler *s, const float *logits, const int32_t *hist, size_t n_hist)
{
    memcpy(s->work, logits, s->vocab * sizeof(float));
    if (penalties_off(&s->p)) return;
    size_t from = n_hist > (size_t)s->p.repeat_last_n ? n_hist - (size_t)s->p.repeat_last_n : 0;
    memset(s->cand, 0, s->vocab * sizeof(int32_t));
    for (size_t i = from; i < n_hist; i++)
        if (hist[i] >= 0 && (uint32_t)hist[i] < s->vocab) s->cand[hist[i]]++;
    for (size_t i = from; i < n_hist; i++) {
        int32_t id = hist[i];
        if (id < 0 || (uint32_t)id >= s->vocab || !s->cand[id]) continue;
        const float count = (float)s->cand[id];
        s->cand[id] = 0; /* each distinct id once */
        float *l = &s->work[id];
        *l = *l > 0 ? *l / s->p.repeat_penalty : *l * s->p.repeat_penalty;
        *l -= s->p.frequency_penalty * count + s->p.presence_penalty;
    }
}

/* a before b: higher logit, then lower id */
static int better(const float *w, int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); }

/* cand[0..k) = the k best ids in order (insertion into a sorted prefix; k is small or the sort
 * is one-off for k = vocab). */
static size_t top_candidates(nf_sampler *s, size_t k)
{
    const float *w = s->work;
    size_t n = 0;
    for (uint32_t id = 0; id < s->vocab; id++) {
        if (n == k && !better(w, (int32_t)id, s->cand[n - 1])) continue;
        size_t i = n < k ? n++ : n - 1;
        while (i > 0 && better(w, (int32_t)id, s->cand[i - 1])) {
            s->cand[i] = s->cand[i - 1];
            i--;
        }
        s->cand[i] = (int32_t)id;
    }
    return n;
}


/* Full sort by (logit desc, id asc): pairs carry the logit so the comparator needs no context. */
static int cmp_pairs(const void *pa, const void *pb)
{
    const cand_pair *a = pa, *b = pb;
    if (a->l != b->l) return a->l > b->l ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

static size_t all_candidates(nf_sampler *s)
{
    for (uint32_t i = 0; i < s->vocab; i++) s->pairs[i] = (cand_pair){s->work[i], (int32_t)i};
    qsort(s->pairs, s->vocab, sizeof *s->pairs, cmp_pairs);
    for (uint32_t i = 0; i < s->vocab; i++) s->cand[i] = s->pairs[i].id;
    return s->vocab;
}

static void softmax_of(nf_sampler *s, size_t n, float inv_temp)
{
    const float mx = s->work[s->cand[0]];
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        s->prob[i] = expf((s->work[s->cand[i]] - mx) * inv_temp);
        sum += s->prob[i];
    }
    for (size_t i = 0; i < n; i++) s->prob[i] = (float)(s->prob[i] / sum);
}

/* Applies top-p, min-p and the temperature to the k candidates in cand[0..n) (best first, their
 * logits in work): leaves the kept ones with their final probabilities in prob; returns how many. */
static size_t keep_candidates(nf_sampler *s, size_t n)
{
    softmax_of(s, n, 1.0f);
    if (s->p.top_p < 1.0f) {
        double cum = 0;
        size_t keep = n;
        for (size_t i = 0; i < n; i++) {
            cum += s->prob[i];
            if (cum >= s->p.top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (s->p.min_p > 0) {
        size_t keep = 1;
        while (keep < n && s->prob[keep] >= s->p.min_p * s->prob[0]) keep++;
        n = keep;
    }
    softmax_of(s, n, 1.0f / s->p.temp);
    return n;
}

static size_t top_k_of(const nf_sampler *s)
{
    return s->p.top_k > 0 && (uint32_t)s->p.top_k < s->vocab ? (size_t)s->p.top_k : s->vocab;
}

/* Leaves the kept candidates in cand[0..n) with their final probabilities in prob. */
static size_t candidates(nf_sampler *s)
{
    size_t k = top_k_of(s);
    size_t n = k < 256 ? top_candidates(s, k) : all_candidates(s);
    return keep_candidates(s, n > k ? k : n);
}

static int32_t argmax(const nf_sampler *s)
{
    int32_t best = 0;
    for (uint32_t i = 1; i < s->vocab; i++)
        if (s->work[i] > s->work[best]) best = (int32_t)i;
    return best;
}

static int32_t draw(nf_sampler *s, size_t n)
{
    double u = uniform01(&s->rng), cum = 0;
    for (size_t i = 0; i < n; i++) {
        cum += s->prob[i];
        if (u < cum) return s->cand[i];
    }
    return s->cand[n - 1];
}

int32_t nf_sampler_sample(nf_sampler *s, const float *logits, const int32_t *hist, size_t n_hist)
{
    penalise(s, logits, hist, n_hist);
    if (!(s->p.temp > 0)) return argmax(s);
    return draw(s, candidates(s));
}

/* The penalty changes no logit: off, or no history in its window. */
static int penalty_idle(const nf_sampler *s, size_t n_hist)
{
    return penalties_off(&s->p) || n_hist == 0;
}

uint32_t nf_sampler_device_k(const nf_sampler *s, const int32_t *history, size_t n_hist)
{
    (void)history;
    if (!penalty_idle(s, n_hist)) return 0;
    if (!(s->p.temp > 0)) return 1;
    const size_t k = top_k_of(s);
    return k <= NF_SAMPLER_DEVICE_MAX_K ? (uint32_t)k : 0;
}

int32_t nf_sampler_sample_top(nf_sampler *s, const int32_t *ids, const float *vals, size_t k)
{
    if (!(s->p.temp > 0)) return ids[0];
    for (size_t i = 0; i < k; i++) {
        s->cand[i] = ids[i];
        s->work[ids[i]] = vals[i];
    }
    return draw(s, keep_candidates(s, k));
}

void nf_sampler_probs(nf_sampler *s, const float *logits, const int32_t *hist, size_t n_hist, float *probs)
{
    penalise(s, logits, hist, n_hist);
    memset(probs, 0, s->vocab * sizeof(float));
    if (!(s->p.temp > 0)) {
        probs[argmax(s)] = 1;
        return;
    }
    size_t n = candidates(s);
    for (size_t i = 0; i < n; i++) probs[s->cand[i]] = s->prob[i];
}
