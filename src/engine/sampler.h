/* Token sampling from logits, llama.cpp's order:
 *   penalties over the last `repeat_last_n` tokens of the history, each distinct id once:
 *     repetition (llama.cpp: a positive logit divided by the penalty, a negative one multiplied), then
 *     presence and frequency (OpenAI: logit -= frequency * count + presence * (count > 0), count the
 *     id's occurrences in the window; the window is the history the caller passes, so a caller that
 *     wants OpenAI's "completion only" counts passes the generated ids)
 *   -> greedy when temp <= 0 (argmax, ties to the lower id) -> top-k ->
 *   softmax -> top-p (the smallest prefix, in descending probability, whose mass reaches top_p) ->
 *   min-p (keep p >= min_p * p_max) -> temperature on the kept logits -> softmax -> draw.
 * The generator is splitmix64 seeded by `seed`: the same seed and inputs give the same tokens. */
#ifndef NF_ENGINE_SAMPLER_H
#define NF_ENGINE_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

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
 * nf_sampler_device_k asked for. */
int32_t nf_sampler_sample_top(nf_sampler *s, const int32_t *ids, const float *vals, size_t k);

/* The probabilities the sampler draws from for these logits (0 outside the kept set); for tests. */
void nf_sampler_probs(nf_sampler *s, const float *logits, const int32_t *history, size_t n_hist, float *probs);

#endif
