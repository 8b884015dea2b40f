/* Model-free speculative decoding (`--spec ngram:K`, prompt lookup) for the single-sequence session.
 *
 * Drafting: the most recent earlier occurrence of the sequence's last NF_SPEC_NGRAM tokens (then of
 * fewer, down to NF_SPEC_NGRAM_MIN) and up to K of the tokens that followed it. Not down to one token:
 * on ordinary text a single repeated token rarely predicts the next ones, and each such draft costs
 * verification (SmolLM2 on the CPU, docs/perf/spec_ngram_cpu.txt: 180 drafts of which 5% were accepted
 * and -25% tokens/s with single-token matches, 35 drafts and no loss without; a repetitive prompt
 * speeds up about the same either way). Verification: one forward of the
 * last accepted token and the drafts with every position's logits; draft i is checked against the
 * logits of the position before it with nf_sampler_verify (sampler.h: exact for greedy, and with
 * temperature the rejection rule for a point-mass proposal, so the tokens are distributed as without
 * speculation); the first rejected draft is replaced by the sampler's pick, and when all are accepted
 * the last position's logits give one more token. The keys and values of rejected drafts stay in their
 * pages and are overwritten later: the session's n_past moves back (nf_engine_truncate). A Gated
 * DeltaNet hybrid's recurrent state cannot move back that way, so hybrids are refused. */
#ifndef NF_ENGINE_SPEC_H
#define NF_ENGINE_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "engine/engine.h"
#include "engine/sampler.h"

#define NF_SPEC_MAX_K 8 /* the most drafts per step */
#define NF_SPEC_NGRAM 3     /* the longest suffix looked up */
#define NF_SPEC_NGRAM_MIN 2 /* the shortest */

/* NF_OK when the engine can speculate with k drafts per step (1 .. NF_SPEC_MAX_K, not a hybrid). */
nf_status nf_spec_check(const nf_engine *e, uint32_t k, nf_error *err);

/* Parses "ngram:K" into *k; NF_ERR_INVALID_ARG naming the accepted forms otherwise. */
nf_status nf_spec_parse(const char *spec, uint32_t *k, nf_error *err);

/* Up to k drafts (draft[k]) for what follows seq[0..n): see above. Returns how many (0: no match). */
size_t nf_spec_draft(const int32_t *seq, size_t n, size_t k, int32_t *draft);

/* Verifies drafts: tokens[0..n) is the sequence (the sampler's history), ending with the last accepted
 * token, which the engine does not hold yet, and n_draft >= 1 drafts. Runs those n_draft + 1 tokens in
 * one forward (rows: room for [n_draft + 1][vocab] logits); out[0..*n_out) receives the accepted drafts
 * and then the token that follows them (not fed; out needs n_draft + 1 entries). Afterwards the engine
 * holds the tokens up to the last accepted draft and e->logits are that position's. */
nf_status nf_spec_verify(nf_engine *e, nf_sampler *s, const int32_t *tokens, size_t n, size_t n_draft, float *rows,
                         int32_t *out, size_t *n_out, nf_error *err);

#endif
