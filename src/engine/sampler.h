/* Token sampling from logits, llama.cpp's order:
 *   penalties over the last `repeat_last_n` tokens of the history, each distinct id once:
 *     repetition (llama.cpp: a positive logit divided by the penalty, a negative one multiplied), then
 *     frequency and presence (OpenAI: logit -= frequency * count, then logit -= presence, count the
 *     id's occurrences in the window; two f32 subtractions, the device kernel's order, so both round
 *     alike; the window is the history the caller passes, so a caller that wants OpenAI's
 *     "completion only" counts passes the generated ids)
 *   -> greedy when temp <= 0 (argmax, ties to the lower id) -> top-k ->
 *   softmax -> top-p (the smallest prefix, in descending probability, whose mass reaches top_p) ->
 *   min-p (keep p >= min_p * p_max) -> temperature on the kept logits -> softmax -> draw.
 * The generator is splitmix64 seeded by `seed`: the same seed and inputs give the same tokens. */
#ifndef NF_ENGINE_SAMPLER_H
#define NF_ENGINE_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "base/batch.h"
#include "base/error.h"

typedef struct nf_sampler_params {
    float temp;           /* <= 0: greedy */
    int top_k;            /* <= 0: all */
    float top_p;          /* >= 1: off */
    float min_p;          /* <= 0: off */
    float repeat_penalty; /* 1: off */
    int repeat_last_n;    /* tokens of history the penalties look at */
    uint64_t seed;
    float presence_penalty;  /* 0: off; OpenAI range -2 .. 2 (after seed: older positional initializers keep their meaning) */
    float frequency_penalty; /* 0: off; OpenAI range -2 .. 2 */
} nf_sampler_params;

/* temp 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1.0, presence/frequency 0, last 64, seed 0 */
nf_sampler_params nf_sampler_defaults(void);

typedef struct nf_sampler nf_sampler;

nf_status nf_sampler_create(const nf_sampler_params *p, uint32_t vocab, nf_sampler **out, nf_error *err);
void nf_sampler_free(nf_sampler *s);

/* Picks the next id from logits[vocab] (not modified) given the ids so far (history[n_hist]). */
int32_t nf_sampler_sample(nf_sampler *s, const float *logits, const int32_t *history, size_t n_hist);

/* Device-side selection (engine.h nf_engine_next): how many best (id, logit) pairs a device must
 * select for the sampler to decide from them alone: 1 when greedy, top_k when 1 <= top_k <= 256 and
 * no penalty changes anything (all off, or an empty window); 0 when it needs every logit. */
#define NF_SAMPLER_DEVICE_MAX_K 256
uint32_t nf_sampler_device_k(const nf_sampler *s, const int32_t *history, size_t n_hist);
/* The same draw as nf_sampler_sample from the k best pairs (best first, ties to the lower id) that
 * nf_sampler_device_k (or, of penalised logits, nf_sampler_device_k_penalized) asked for. */
int32_t nf_sampler_sample_top(nf_sampler *s, const int32_t *ids, const float *vals, size_t k);

/* Penalties on a device (engine.h nf_backend_ops.penalize). A sampler's penalty is its params
 * (repetition 1, presence 0, frequency 0: off) and its pairs: each distinct id of the window (the
 * last repeat_last_n ids of the history, out-of-vocabulary ids skipped) once, in order of first
 * occurrence, with how often it occurs there. The host path (nf_sampler_sample) penalises exactly
 * these pairs, so logits penalised on a device by the same rule give the same draw. */
nf_penalty nf_sampler_penalty(const nf_sampler *s);
/* The most pairs nf_sampler_penalty_pairs can return for a history of n_hist ids (0 when the penalties
 * are off). */
size_t nf_sampler_penalty_max(const nf_sampler *s, size_t n_hist);
/* Writes the window's pairs to ids / counts (room for nf_sampler_penalty_max) and returns how many. */
size_t nf_sampler_penalty_pairs(nf_sampler *s, const int32_t *history, size_t n_hist, int32_t *ids, uint32_t *counts);

/* How many best pairs a device must select for the sampler to decide from them alone once it has
 * applied this sampler's penalties (nf_sampler_penalty_pairs) to the logits: 1 when greedy, top_k
 * when 1 <= top_k <= 256, else 0. nf_sampler_sample_top then draws from those penalised pairs as
 * they are (it applies no penalty itself). */
uint32_t nf_sampler_device_k_penalized(const nf_sampler *s);

/* The penalty lists of a batch of sequences, in the shape nf_backend_ops.penalize takes: sequence i's
 * pairs are start[i] .. start[i + 1] - 1 of ids / counts. The buffers grow as needed and are kept
 * across batches (zero-initialise the struct; nf_penalty_lists_free at the end). */
typedef struct nf_penalty_lists {
    nf_penalty *pen;  /* [n_seqs] */
    uint32_t *start;  /* [n_seqs + 1] */
    int32_t *ids;     /* [start[n_seqs]] */
    uint32_t *counts; /* [start[n_seqs]] */
    uint32_t n_seqs;
    size_t seq_cap, pair_cap;
} nf_penalty_lists;

/* Starts a new batch (n_seqs 0). */
void nf_penalty_lists_clear(nf_penalty_lists *l);
/* Appends a sequence: s's penalty and pairs over history[n_hist]; s NULL: an empty list (a sequence
 * that does not sample this step). */
nf_status nf_penalty_lists_add(nf_penalty_lists *l, nf_sampler *s, const int32_t *history, size_t n_hist, nf_error *err);
void nf_penalty_lists_free(nf_penalty_lists *l);

/* Speculative verification of a draft proposed with certainty (a point-mass proposal q = [draft]):
 * the standard rejection rule min(1, p/q) reduces to accepting the draft with probability p(draft)
 * under the distribution nf_sampler_sample draws from; on rejection the token is drawn from p with
 * the draft removed and renormalised (the residual max(0, p - q) normalised). The result is then
 * distributed exactly as nf_sampler_sample's: P(draft) = p(draft), P(x) = (1 - p(draft)) p(x) /
 * (1 - p(draft)) = p(x) for x != draft. Greedy (temp <= 0): accepted when the draft is the argmax.
 * Returns 1 when the draft is accepted (*id = draft), else 0 with *id the token to use instead. The
 * number of generator steps differs from nf_sampler_sample's, so a seed gives other (equally
 * distributed) tokens than without speculation. */
int nf_sampler_verify(nf_sampler *s, const float *logits, const int32_t *history, size_t n_hist, int32_t draft,
                      int32_t *id);

/* Speculative verification against a proposal distribution q[vocab] (a draft model's: the MTP block's,
 * nf_sampler_draft), the standard speculative-sampling rule (Leviathan et al. 2023, Chen et al. 2023):
 * the draft x was drawn from q; it is accepted with probability min(1, p(x) / q(x)), p the
 * distribution nf_sampler_sample draws from for these logits; on rejection the token is drawn from the
 * residual r = max(0, p - q), normalised. Exact: P(emit y) = q(y) min(1, p(y)/q(y)) + P(reject) r(y) /
 * sum r, where q(y) min(1, p(y)/q(y)) = min(p, q)(y), P(reject) = 1 - sum min(p, q) = sum max(0, p - q)
 * = sum r (p and q both sum to 1), so P(emit y) = min(p, q)(y) + max(0, p - q)(y) = p(y). It needs the
 * draft drawn from q independently of this verification's generator (nf_sampler_draft's own stream).
 * q NULL, a draft with q(draft) = 0 (it was not drawn from q) or greedy (temp <= 0): nf_sampler_verify,
 * the point-mass rule (greedy: accepted when the draft is the argmax). Returns 1 when accepted (*id =
 * draft), else 0 with *id the token to use instead. */
int nf_sampler_verify_q(nf_sampler *s, const float *logits, const int32_t *history, size_t n_hist, int32_t draft,
                        const float *q, int32_t *id);

/* A draft from the distribution the sampler draws from for these (a draft model's) logits, written to
 * q[vocab] (nf_sampler_probs) for nf_sampler_verify_q, and drawn with a generator of its own (seeded
 * from the seed, apart from the one nf_sampler_sample and the verification use, which it leaves as it
 * was). Greedy: the argmax of the penalised logits, q its point mass. */
int32_t nf_sampler_draft(nf_sampler *s, const float *logits, const int32_t *history, size_t n_hist, float *q);

/* 1 when the sampler is greedy (temp <= 0). */
int nf_sampler_greedy(const nf_sampler *s);

/* The probabilities the sampler draws from for these logits (0 outside the kept set); for tests. */
void nf_sampler_probs(nf_sampler *s, const float *logits, const int32_t *history, size_t n_hist, float *probs);

#endif
