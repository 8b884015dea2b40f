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
    uint64_t rng_draft; /* nf_sampler_draft's own stream: drafting never moves rng */
    float *work;    /* [vocab] penalised logits */
    int32_t *cand;  /* [vocab] candidate ids, best first */
    float *prob;    /* [vocab] candidate probabilities */
    cand_pair *pairs;      /* [vocab] for a full sort */
    /* with penalties on: */
    uint32_t *tally;       /* [vocab] occurrences in the window, all zero between calls */
    int32_t *pen_ids;      /* [penalty_cap] the window's pairs (nf_sampler_penalty_pairs) */
    uint32_t *pen_counts;
};

nf_sampler_params nf_sampler_defaults(void)
{
    return (nf_sampler_params){.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1.0f,
                               .repeat_last_n = 64, .seed = 0};
}

/* No penalty can change a logit. */
static int penalties_off(const nf_sampler_params *p)
{
    return (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f) ||
           p->repeat_last_n <= 0;
}

/* The most distinct ids a window holds. */
static size_t penalty_cap(const nf_sampler_params *p, uint32_t vocab)
{
    if (penalties_off(p)) return 0;
    return (size_t)p->repeat_last_n < vocab ? (size_t)p->repeat_last_n : vocab;
}

/* The penalty buffers, only when a penalty is on (the others cost vocab-sized memory for nothing). */
static int alloc_penalty(nf_sampler *s)
{
    const size_t cap = penalty_cap(&s->p, s->vocab);
    if (!cap) return 1;
    s->tally = calloc(s->vocab, sizeof *s->tally);
    s->pen_ids = malloc(cap * sizeof *s->pen_ids);
    s->pen_counts = malloc(cap * sizeof *s->pen_counts);
    return s->tally && s->pen_ids && s->pen_counts;
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
        s->p = *p;
        s->vocab = vocab;
    }
    if (!s || !s->work || !s->cand || !s->prob || !s->pairs || !alloc_penalty(s)) {
        nf_sampler_free(s);
        return nf_error_set(err, NF_ERR_NOMEM, "sampler: out of memory");
    }
    s->rng = p->seed;
    s->rng_draft = p->seed ^ 0x6d74702064726166ULL; /* another stream of the same seed */
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
    free(s->tally);
    free(s->pen_ids);
    free(s->pen_counts);
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

nf_penalty nf_sampler_penalty(const nf_sampler *s)
{
    if (penalties_off(&s->p)) return (nf_penalty){1.0f, 0.0f, 0.0f};
    return (nf_penalty){s->p.repeat_penalty, s->p.presence_penalty, s->p.frequency_penalty};
}

size_t nf_sampler_penalty_max(const nf_sampler *s, size_t n_hist)
{
    const size_t cap = penalty_cap(&s->p, s->vocab);
    return n_hist < cap ? n_hist : cap;
}

size_t nf_sampler_penalty_pairs(nf_sampler *s, const int32_t *hist, size_t n_hist, int32_t *ids, uint32_t *counts)
{
    if (penalties_off(&s->p)) return 0;
    const size_t from = n_hist > (size_t)s->p.repeat_last_n ? n_hist - (size_t)s->p.repeat_last_n : 0;
    size_t n = 0;
    for (size_t i = from; i < n_hist; i++) {
        const int32_t id = hist[i];
        if (id >= 0 && (uint32_t)id < s->vocab && !s->tally[id]++) ids[n++] = id;
    }
    for (size_t j = 0; j < n; j++) { /* tally back to all zero */
        counts[j] = s->tally[ids[j]];
        s->tally[ids[j]] = 0;
    }
    return n;
}

/* One id's penalised logit; each step rounds to f32 on its own (no fused multiply-subtract), as the
 * device kernel does, so host and device agree to the bit. */
static float penalised(const nf_sampler_params *p, float l, uint32_t count)
{
    l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
    const float freq = p->frequency_penalty * (float)count;
    l -= freq;
    return l - p->presence_penalty;
}

/* work = logits with the penalties applied to the window's pairs. */
static void penalise(nf_sampler *s, const float *logits, const int32_t *hist, size_t n_hist)
{
    memcpy(s->work, logits, s->vocab * sizeof(float));
    const size_t n = nf_sampler_penalty_pairs(s, hist, n_hist, s->pen_ids, s->pen_counts);
    for (size_t j = 0; j < n; j++) s->work[s->pen_ids[j]] = penalised(&s->p, s->work[s->pen_ids[j]], s->pen_counts[j]);
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

/* A draw from prob over cand[0..n) with cand[skip] left out (the others renormalised); n >= 2. */
static int32_t draw_without(nf_sampler *s, size_t n, size_t skip)
{
    double rest = 0;
    for (size_t i = 0; i < n; i++)
        if (i != skip) rest += s->prob[i];
    double u = uniform01(&s->rng) * rest, cum = 0;
    size_t last = skip ? 0 : 1; /* the fallback when rounding leaves u above the sum: any kept id but skip */
    for (size_t i = 0; i < n; i++) {
        if (i == skip) continue;
        last = i;
        cum += s->prob[i];
        if (u < cum) return s->cand[i];
    }
    return s->cand[last];
}

int nf_sampler_verify(nf_sampler *s, const float *logits, const int32_t *hist, size_t n_hist, int32_t draft, int32_t *id)
{
    penalise(s, logits, hist, n_hist);
    if (!(s->p.temp > 0)) {
        *id = argmax(s);
        return *id == draft;
    }
    const size_t n = candidates(s);
    size_t at = n; /* the draft's place among the kept candidates; n: not kept, p(draft) = 0 */
    for (size_t i = 0; i < n; i++)
        if (s->cand[i] == draft) at = i;
    if (at == n) {
        *id = draw(s, n);
        return 0;
    }
    if (uniform01(&s->rng) < s->prob[at]) { /* never true for p = 0, always for p = 1 (u < 1) */
        *id = draft;
        return 1;
    }
    *id = draw_without(s, n, at); /* n >= 2 here: a lone candidate has p = 1 */
    return 0;
}

/* On a rejection against q: a draw from the residual max(0, p - q) over the kept candidates (p is 0
 * elsewhere), normalised; when rounding leaves it empty (p <= q everywhere, so p = q up to rounding
 * and a rejection had probability ~0) a draw from p. */
static int32_t draw_residual(nf_sampler *s, size_t n, const float *q)
{
    double rest = 0;
    for (size_t i = 0; i < n; i++) rest += s->prob[i] > q[s->cand[i]] ? s->prob[i] - q[s->cand[i]] : 0;
    if (!(rest > 0)) return draw(s, n);
    const double u = uniform01(&s->rng) * rest;
    double cum = 0;
    size_t last = 0; /* the fallback when rounding leaves u above the sum: the last id with a residual */
    for (size_t i = 0; i < n; i++) {
        const double r = s->prob[i] > q[s->cand[i]] ? s->prob[i] - q[s->cand[i]] : 0;
        if (!(r > 0)) continue;
        last = i;
        cum += r;
        if (u < cum) return s->cand[i];
    }
    return s->cand[last];
}

int nf_sampler_verify_q(nf_sampler *s, const float *logits, const int32_t *hist, size_t n_hist, int32_t draft,
                        const float *q, int32_t *id)
{
    const int usable = q && draft >= 0 && (uint32_t)draft < s->vocab && q[draft] > 0 && q[draft] <= 1;
    if (!usable || !(s->p.temp > 0)) return nf_sampler_verify(s, logits, hist, n_hist, draft, id);
    penalise(s, logits, hist, n_hist);
    const size_t n = candidates(s);
    double pd = 0; /* p(draft): 0 when it is not kept */
    for (size_t i = 0; i < n; i++)
        if (s->cand[i] == draft) pd = s->prob[i];
    if (uniform01(&s->rng) * q[draft] < pd) { /* u < p / q: probability min(1, p / q) */
        *id = draft;
        return 1;
    }
    *id = draw_residual(s, n, q);
    return 0;
}

/* The penalty changes no logit: off, or no history in its window. */
static int penalty_idle(const nf_sampler *s, size_t n_hist)
{
    return penalties_off(&s->p) || n_hist == 0;
}

uint32_t nf_sampler_device_k(const nf_sampler *s, const int32_t *history, size_t n_hist)
{
    (void)history;
    return penalty_idle(s, n_hist) ? nf_sampler_device_k_penalized(s) : 0;
}

uint32_t nf_sampler_device_k_penalized(const nf_sampler *s)
{
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

/* probs[vocab] = the distribution the sampler draws from (0 outside the kept set), the candidates
 * left in cand / prob; returns how many (0 when greedy: probs is the argmax's point mass). */
static size_t probs_of(nf_sampler *s, const float *logits, const int32_t *hist, size_t n_hist, float *probs)
{
    penalise(s, logits, hist, n_hist);
    memset(probs, 0, s->vocab * sizeof(float));
    if (!(s->p.temp > 0)) {
        probs[argmax(s)] = 1;
        return 0;
    }
    const size_t n = candidates(s);
    for (size_t i = 0; i < n; i++) probs[s->cand[i]] = s->prob[i];
    return n;
}

void nf_sampler_probs(nf_sampler *s, const float *logits, const int32_t *hist, size_t n_hist, float *probs)
{
    (void)probs_of(s, logits, hist, n_hist, probs);
}

int nf_sampler_greedy(const nf_sampler *s) { return !(s->p.temp > 0); }

int32_t nf_sampler_draft(nf_sampler *s, const float *logits, const int32_t *hist, size_t n_hist, float *q)
{
    const size_t n = probs_of(s, logits, hist, n_hist, q);
    if (!n) return argmax(s);
    const uint64_t keep = s->rng; /* the draw below on the draft stream, the sampler's own untouched */
    s->rng = s->rng_draft;
    const int32_t id = draw(s, n);
    s->rng_draft = s->rng;
    s->rng = keep;
    return id;
}

void nf_penalty_lists_clear(nf_penalty_lists *l) { l->n_seqs = 0; }

/* Room for one more sequence of up to `pairs` pairs. */
static nf_status lists_reserve(nf_penalty_lists *l, size_t pairs, nf_error *err)
{
    if (l->n_seqs + 1 > l->seq_cap) {
        const size_t cap = l->seq_cap ? 2 * l->seq_cap : 8;
        nf_penalty *pen = realloc(l->pen, cap * sizeof *pen);
        if (pen) l->pen = pen;
        uint32_t *start = pen ? realloc(l->start, (cap + 1) * sizeof *start) : NULL;
        if (!start) return nf_error_set(err, NF_ERR_NOMEM, "sampler: out of memory for %zu penalty lists", cap);
        l->start = start;
        l->seq_cap = cap;
    }
    const size_t used = l->n_seqs ? l->start[l->n_seqs] : 0;
    if (used + pairs <= l->pair_cap) return NF_OK;
    const size_t cap = 2 * (used + pairs);
    int32_t *ids = realloc(l->ids, cap * sizeof *ids);
    if (ids) l->ids = ids;
    uint32_t *counts = ids ? realloc(l->counts, cap * sizeof *counts) : NULL;
    if (!counts) return nf_error_set(err, NF_ERR_NOMEM, "sampler: out of memory for %zu penalty pairs", cap);
    l->counts = counts;
    l->pair_cap = cap;
    return NF_OK;
}

nf_status nf_penalty_lists_add(nf_penalty_lists *l, nf_sampler *s, const int32_t *history, size_t n_hist, nf_error *err)
{
    const size_t max = s ? nf_sampler_penalty_max(s, n_hist) : 0;
    nf_status st = lists_reserve(l, max, err);
    if (st) return st;
    if (!l->n_seqs) l->start[0] = 0;
    const uint32_t at = l->start[l->n_seqs];
    const size_t n = max ? nf_sampler_penalty_pairs(s, history, n_hist, l->ids + at, l->counts + at) : 0;
    l->pen[l->n_seqs] = s ? nf_sampler_penalty(s) : (nf_penalty){1.0f, 0.0f, 0.0f};
    l->start[++l->n_seqs] = at + (uint32_t)n;
    return NF_OK;
}

void nf_penalty_lists_free(nf_penalty_lists *l)
{
    free(l->pen);
    free(l->start);
    free(l->ids);
    free(l->counts);
    *l = (nf_penalty_lists){0};
}
