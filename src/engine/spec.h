/* Speculative decoding for the single-sequence session: model-free (`--spec ngram:K`, prompt lookup) and
 * with the hybrids' MTP block (`--spec mtp:K`, below).
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
 * DeltaNet hybrid's recurrent state cannot move back that way, so ngram refuses hybrids.
 *
 * MTP (docs/hybrid.md "MTP"): the drafts come from the MTP block's logits, chained: the block at
 * position p takes the main model's final hidden state at p and the token at p + 1 and predicts the
 * token at p + 2; the next draft feeds the block's own output and the draft just made, one position
 * on. Greedy: the argmax, a point mass, verified by nf_sampler_verify (the same tokens as without).
 * Under sampling (nf_spec_mtp_draft_q): each draft is drawn from q, the distribution the sampler gives
 * the block's logits, its row kept, and verified by nf_sampler_verify_q: accepted with probability
 * min(1, p/q), the first rejection drawing from max(0, p - q) normalised, the bonus token from p;
 * exact (sampler.h: the tokens are distributed as without speculation) and it accepts more than the
 * point mass would. Rollback of the recurrent state: the
 * slot is copied out before the verification forward; when a draft is rejected it is copied back and
 * the accepted tokens run again (one more forward of a + 1 tokens), which also gives their hidden
 * states. The MTP block's own keys and values: the block runs on every position once its next token
 * is final (its entries for rejected drafts are overwritten, as the main model's pages are); the
 * hidden states of positions whose next token is not final yet wait in `pending`. */
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

#define NF_SPEC_MTP_MAX_K 3 /* the most MTP drafts per step */

typedef enum nf_spec_mode { NF_SPEC_MODE_NGRAM = 0, NF_SPEC_MODE_MTP } nf_spec_mode;

/* NF_OK when the engine can speculate with k drafts per step: ngram 1 .. NF_SPEC_MAX_K (a hybrid on a
 * backend with the state slot copies);
 * mtp 1 .. NF_SPEC_MTP_MAX_K, a model with an MTP block on a backend that runs it. */
nf_status nf_spec_check(const nf_engine *e, nf_spec_mode mode, uint32_t k, nf_error *err);

/* Parses "ngram:K" or "mtp:K" into *mode and *k; NF_ERR_INVALID_ARG naming the accepted forms otherwise. */
nf_status nf_spec_parse(const char *spec, nf_spec_mode *mode, uint32_t *k, nf_error *err);

/* The index of the largest of l[n], ties to the lower one (greedy sampling's pick; the MTP drafts). */
size_t nf_spec_argmax(const float *l, size_t n);

/* Up to k drafts (draft[k]) for what follows seq[0..n): see above. Returns how many (0: no match). */
size_t nf_spec_draft(const int32_t *seq, size_t n, size_t k, int32_t *draft);

/* Verifies drafts: tokens[0..n) is the sequence (the sampler's history), ending with the last accepted
 * token, which the engine does not hold yet, and n_draft >= 1 drafts. Runs those n_draft + 1 tokens in
 * one forward (rows: room for [n_draft + 1][vocab] logits); out[0..*n_out) receives the accepted drafts
 * and then the token that follows them (not fed; out needs n_draft + 1 entries). Afterwards the engine
 * holds the tokens up to the last accepted draft and e->logits are that position's. A hybrid's state
 * slot is copied to its spare before the forward (backend slot_copy) and, after a rejection, restored
 * and the kept tokens run again (nf_spec_truncate). */
nf_status nf_spec_verify(nf_engine *e, nf_sampler *s, const int32_t *tokens, size_t n, size_t n_draft, float *rows,
                         int32_t *out, size_t *n_out, nf_error *err);
/* Forgets the session's tokens from position n on: nf_engine_truncate, except for a hybrid whose state
 * was copied before the last verification at a position <= n, which is restored and the tokens from
 * there to n run again (toks[i] is the token at position toks_pos + i). */
nf_status nf_spec_truncate(nf_engine *e, const int32_t *toks, uint32_t toks_pos, uint32_t n, nf_error *err);

/* MTP speculation over one session (see above). */
typedef struct nf_spec_mtp {
    nf_engine *e;
    uint32_t k;
    size_t H, V;
    float *ph;       /* [cap][H] pending: hidden states of positions pos0 .. pos0 + n_ph - 1 */
    int32_t *ptok;   /* [cap]: the tokens after positions pos0 .. pos0 + n_ph - 2 (the last one's is not final) */
    size_t n_ph, cap;
    uint32_t pos0;
    float *lg, *ho;  /* [V], [2][H]: the MTP block's last logits and hidden states (chained alternately) */
    float *q;        /* [k][V]: under sampling the last drafts' proposal distributions (nf_sampler_draft) */
    size_t n_q;      /* how many drafts have their q row (0: argmax drafts, point masses) */
    int snap;        /* hybrids: slot 0 goes to its spare (engine.h slot_copy) before each verification */
    uint32_t snap_pos; /* the positions the spare holds; UINT32_MAX: none */
} nf_spec_mtp;

nf_status nf_spec_mtp_init(nf_spec_mtp *m, nf_engine *e, uint32_t k, nf_error *err);
void nf_spec_mtp_free(nf_spec_mtp *m);
/* Appends tokens[n] to the session (nf_engine_prefill) keeping their hidden states pending. */
nf_status nf_spec_mtp_prefill(nf_spec_mtp *m, const int32_t *tokens, size_t n, nf_error *err);
/* Up to k drafts (draft[k]) for what follows id, the token that follows the last pending position:
 * runs the block over the pending positions, then chains. Returns how many in *n_draft. */
nf_status nf_spec_mtp_draft(nf_spec_mtp *m, int32_t id, size_t k, int32_t *draft, size_t *n_draft, nf_error *err);
/* The same for a sampler s over the sequence seq[0..n), which ends with id; the drafts go to seq[n ..
 * n + k) (room needed). Greedy s: nf_spec_mtp_draft's argmax drafts. Under sampling each draft is drawn
 * from the distribution s would sample from for the block's logits (its temperature, top-k, top-p,
 * min-p and penalties, the history being seq with the drafts before it), its row kept (m->q) for
 * nf_spec_mtp_verify's rule against a proposal (nf_sampler_verify_q). */
nf_status nf_spec_mtp_draft_q(nf_spec_mtp *m, nf_sampler *s, int32_t *seq, size_t n, size_t k, size_t *n_draft,
                              nf_error *err);
/* nf_spec_verify's contract, with the recurrent state rolled back past rejected drafts and the accepted
 * positions' hidden states pending. Drafts from nf_spec_mtp_draft_q under sampling (their q rows kept,
 * tokens' drafts being those) are verified against q (nf_sampler_verify_q), others as point masses;
 * the q rows are used once. */
nf_status nf_spec_mtp_verify(nf_spec_mtp *m, nf_sampler *s, const int32_t *tokens, size_t n, size_t n_draft,
                             float *rows, int32_t *out, size_t *n_out, nf_error *err);
/* One decode of id without drafts (its hidden state pending). */
nf_status nf_spec_mtp_decode(nf_spec_mtp *m, int32_t id, nf_error *err);
/* Forgets the session's tokens from position n on (nf_engine_truncate); for a hybrid, when n is not below
 * the position of the state saved before the last verification, by restoring it and running the tokens
 * from there to n again: toks[i] is the token at position toks_pos + i (covering those). */
nf_status nf_spec_mtp_truncate(nf_spec_mtp *m, const int32_t *toks, uint32_t toks_pos, uint32_t n, nf_error *err);
/* At the end of a generation: the pending positions whose next token is final go through the block; the
 * last one's hidden state stays with the engine (e->mtp_hidden) for the next call. */
nf_status nf_spec_mtp_finish(nf_spec_mtp *m, nf_error *err);

#endif
