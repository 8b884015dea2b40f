/* Sequences and the continuous-batching scheduler (docs/sched.md).
 *
 * A sequence is a prompt, the tokens generated after it, how many of those tokens have keys and
 * values in the KV cache (n_cached), a page table into the pool (kvpool.h), its own sampler (own
 * parameters and seed: its tokens never depend on what else is in the batch) and its stop conditions.
 * The uniform rule: a sequence feeds its uncached tokens; when the forward has consumed all of them,
 * the last token's logits are sampled and the new token becomes the one uncached token. Decode is the
 * case of one uncached token, prefill of many; a preempted sequence drops its pages (n_cached = 0) and
 * later re-prefills prompt and generated tokens alike (recompute), its sampler untouched.
 *
 * One nf_sched_step builds one batch (base/batch.h) and runs ONE forward:
 *   1. every active sequence with one uncached token (decode), oldest admission first, with its
 *      speculative drafts after it when it speculates (nf_seq_params.spec_k; docs/sched.md
 *      "Speculation"); when a decode token needs a page and none is left, the newest active sequence
 *      is preempted back to waiting;
 *   2. the rest of the token budget (chunk) goes to prefill chunks: active sequences partly
 *      prefilled, then waiting ones admitted in arrival order (a preempted one keeps its place);
 *      admission matches the longest cached prefix and needs the pages for the rest of its tokens free
 *      (or, with opts.reserve, for everything it may generate);
 *   3. the forward; full pages are published to the prefix cache; each sequence whose uncached tokens
 *      are all in samples its next token (on a device backend through topk when its sampler allows,
 *      after the batch's penalties are applied there when the backend has penalize);
 *      stops are checked and ended sequences return their pages at once.
 *
 * Events: each sampled token is reported to the sequence's emit callback with the text that became
 * printable (UTF-8-safe, stop strings held back) and, when asked, its log-probabilities, then exactly one final event (token -1, the last text,
 * end != NF_SEQ_RUNNING). A callback may cancel sequences; it must not add, remove or step. */
#ifndef NF_ENGINE_SCHED_H
#define NF_ENGINE_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "base/batch.h"
#include "base/error.h"
#include "engine/engine.h"
#include "engine/kvpool.h"
#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"

typedef enum nf_seq_end {
    NF_SEQ_RUNNING = 0, /* not ended */
    NF_SEQ_LENGTH,      /* max_new tokens generated */
    NF_SEQ_EOS,         /* an end-of-generation id (reported as a token, not as text) */
    NF_SEQ_STOP,        /* a stop string (not in the text) */
    NF_SEQ_CONTEXT,     /* the next token would pass the context */
    NF_SEQ_CANCELLED,   /* nf_sched_cancel */
    NF_SEQ_NO_PAGES     /* needs more KV pages than the whole pool holds */
} nf_seq_end;

const char *nf_seq_end_name(nf_seq_end e);

typedef struct nf_seq_event {
    uint64_t id;
    int32_t token;    /* the id sampled this step; -1 in the final event */
    const char *text; /* [len] text that became printable (valid UTF-8, not NUL-terminated; valid only
                       * during the call); empty without a tokenizer */
    size_t len;
    nf_seq_end end;   /* NF_SEQ_RUNNING, or why the sequence ended (final event) */
    /* Token events of a sequence that asked (nf_seq_params.logprobs), else 0 / NULL: the log-softmax of
     * the model's logits for this step (before penalties, temperature and truncation: the distribution
     * the model gave, as OpenAI and vLLM report it) at the sampled id, and the n_top best ids (best
     * first, ties to the lower id) with theirs; the arrays are valid only during the call. */
    float logprob;
    uint32_t n_top;
    const int32_t *top_ids;
    const float *top_lp;
} nf_seq_event;

/* The most alternatives a token event carries (OpenAI's top_logprobs limit). */
#define NF_SEQ_MAX_TOP_LOGPROBS 20

typedef void (*nf_seq_emit_fn)(void *ctx, const nf_seq_event *ev);

typedef struct nf_seq_params {
    nf_sampler_params sampling;
    size_t max_new;               /* tokens to generate at most; 0: until the context ends */
    const int32_t *eos;           /* [n_eos] ids that end generation (copied) */
    size_t n_eos;
    const char *const *stops;     /* [n_stops] strings that end generation (copied; need a tokenizer) */
    size_t n_stops;
    nf_seq_emit_fn emit;          /* may be NULL */
    void *ctx;
    int logprobs;                 /* 1: token events carry log-probabilities (on a device backend every
                                   * step of this sequence then fetches the whole logits row: slower) */
    uint32_t top_logprobs;        /* with logprobs: this many best alternatives (<= NF_SEQ_MAX_TOP_LOGPROBS) */
    int penalty_reply_only;       /* 1: the penalties' history is the generated tokens alone (OpenAI's
                                   * presence / frequency count the reply: give sampling.repeat_last_n
                                   * room for all of it); 0: prompt and reply (llama.cpp's window) */
    uint32_t spec_k;              /* speculation: up to spec_k drafts verified per step (0: off; docs/sched.md) */
    int spec_mtp;                 /* the drafts come from the model's MTP block (K <= NF_SPEC_MTP_MAX_K), else
                                   * from the sequence's own history (prompt lookup, K <= NF_SPEC_MAX_K) */
    /* optional, with spec_k and not spec_mtp: the drafts come from here instead of prompt lookup (an
     * outside drafter; tests with right and wrong drafts by design): up to k ids into draft[k] for what
     * follows toks[n]; returns how many (at most k) */
    uint32_t (*draft)(void *ctx, const int32_t *toks, size_t n, uint32_t k, int32_t *draft);
    void *draft_ctx;
} nf_seq_params;

/* The backend as the scheduler drives it (the nf_backend_ops functions of the batch contract). */
typedef struct nf_sched_backend {
    void *state;
    /* logits: [S][vocab] (each sequence's last token; all_logits is never set), or with
     * nf_batch.logit_rows [rows][vocab]; NULL when the backend keeps them (logits/topk non-NULL) and the
     * batch has no drafts */
    nf_status (*forward)(void *state, const nf_batch *b, float *logits, nf_error *err);
    nf_status (*logits)(void *state, float *out, nf_error *err);                           /* [S][vocab]; optional */
    nf_status (*topk)(void *state, uint32_t k, int32_t *ids, float *vals, nf_error *err); /* [S][k]; optional */
    nf_status (*copy_page)(void *state, uint32_t dst, uint32_t src, nf_error *err);
    /* optional, with topk: penalties on the device (engine.h), so penalised samplers need only topk */
    nf_status (*penalize)(void *state, const nf_penalty *pen, const uint32_t *start, const int32_t *ids,
                          const uint32_t *counts, nf_error *err);
    /* speculation (engine.h says each): logit_rows 1 when forward takes nf_batch.logit_rows (needed for
     * any spec_k; a batch with drafts then gets host logits, [rows][vocab], also on a device backend);
     * the state slot copy (hybrids: slot i's spare is i + max_seqs); hidden and mtp (spec_mtp) */
    int logit_rows;
    nf_status (*slot_copy)(void *state, uint32_t dst, uint32_t src, nf_error *err);
    nf_status (*hidden)(void *state, float *out, nf_error *err);
    nf_status (*mtp)(void *state, const nf_batch *b, const float *hidden, float *logits, float *hidden_out,
                     nf_error *err);
} nf_sched_backend;

typedef struct nf_sched_opts {
    uint32_t vocab;
    uint32_t ctx;          /* positions per sequence */
    uint32_t chunk;        /* tokens per forward (the backend's chunk) */
    uint32_t max_seqs;     /* sequences per forward (the backend's max_seqs) */
    uint32_t page_tokens;  /* positions per KV page */
    uint32_t kv_pages;     /* pages the backend allocated */
    int no_prefix_cache;   /* 1: every prompt is computed in full, nothing is published */
    int reserve;           /* admission policy (docs/sched.md): 0 (default) admits against the pages of
                            * the tokens a sequence has and preempts the newest when decode growth runs
                            * the pool dry; 1 reserves, at admission, the pages of prompt + max_new
                            * (max_new 0: the context) and never preempts */
    const nf_tokenizer *tok; /* text for events and stop strings; NULL: none */
    int state_slots;       /* the backend keeps a recurrent state per sequence (Gated DeltaNet hybrids):
                            * every batch names each sequence's slot (nf_batch.state_slot), one of
                            * max_seqs, held from admission until the sequence ends or is preempted; the
                            * backend starts a slot afresh when its sequence feeds position 0 (admission,
                            * recompute after preemption). The state is not paged: with the prefix cache
                            * a hit restores a snapshot of it (state_snaps, below), so the cache needs the
                            * backend's slot_copy, state_snaps > 0 and pages on the piece_align grid
                            * (create refuses otherwise). */
    uint32_t state_snaps;  /* with state_slots and the cache: snapshots the backend keeps in slots 2 max_seqs
                            * + j (docs/sched.md "Recurrent state") */
    uint32_t mtp_hidden;   /* the hidden size when the model has an MTP block (spec_mtp), else 0 */
    /* Where a prompt may be cut (from the engine: nf_backend_ops.prefill_min, and the CPU's gdn_chunk
     * for hybrids; 0: anywhere). A prompt that does not fit the step's budget is cut at a multiple of
     * piece_align positions that leaves the piece and the rest at least piece_min tokens each, or waits
     * for a step with room for one. So a prompt token's segment runs the same path (the CPU's tile, not
     * the per-token kernels of NF_CPU_STEP_MAX-token segments) and a chunked recurrence the same chunks
     * whatever else the step holds: speculation, which changes the other sequences' share of a step,
     * leaves a sequence's bits as without it. */
    uint32_t piece_min, piece_align;
} nf_sched_opts;

/* What one step did. */
typedef struct nf_sched_step_info {
    uint32_t n_tokens, n_seqs; /* the batch */
    uint32_t n_decode;         /* sequences that fed one token */
    uint32_t n_sampled, n_ended, n_preempted, n_admitted;
    uint32_t pages_used;       /* held by sequences after the step */
    uint32_t n_verified;       /* sequences that verified drafts */
    uint32_t n_drafted, n_accepted; /* their drafts, and those accepted */
    uint64_t forward_ns;       /* inside the backend: forward and the logits / top-k fetch */
    uint64_t total_ns;         /* the whole step (host scheduling = total - forward) */
} nf_sched_step_info;

typedef struct nf_sched nf_sched;

nf_status nf_sched_create(const nf_sched_backend *be, const nf_sched_opts *o, nf_sched **out, nf_error *err);
/* The scheduler over an engine's backend and its whole KV pool: vocab, ctx, chunk, max_seqs,
 * page_tokens and kv_pages come from the engine, the rest (tok, no_prefix_cache, reserve) from o
 * (NULL: defaults). A model with Gated DeltaNet layers gets state_slots and the engine's state_snaps
 * (the cache is off where the backend cannot copy slots or the pages are off the GDN chunk grid). The engine's own session (nf_engine_prefill / decode) must not run while the
 * scheduler lives: both would write the same pages. */
nf_status nf_sched_create_engine(nf_engine *e, const nf_sched_opts *o, nf_sched **out, nf_error *err);
/* Frees every sequence (no events) and the pool. */
void nf_sched_free(nf_sched *s);

/* NF_OK when sequences with p's speculation (spec_k, spec_mtp) can run here, else why not: K out of
 * range, a backend without nf_batch.logit_rows or without the state slot copies a hybrid's rollback
 * needs, mtp without an MTP block. nf_sched_add checks the same. */
nf_status nf_sched_check_spec(const nf_sched *s, const nf_seq_params *p, nf_error *err);
/* Queues a sequence (prompt[n] copied, 1 <= n <= ctx); *id names it from now on. */
nf_status nf_sched_add(nf_sched *s, const int32_t *prompt, size_t n, const nf_seq_params *p, uint64_t *id,
                       nf_error *err);
/* Ends a sequence now (waiting or active): its pages go back, its final event is NF_SEQ_CANCELLED.
 * Ended sequences are left alone. NF_ERR_INVALID_ARG for an unknown id. */
nf_status nf_sched_cancel(nf_sched *s, uint64_t id, nf_error *err);
/* One batch, one forward (see above); a step with nothing to run returns NF_OK with n_tokens 0. */
nf_status nf_sched_step(nf_sched *s, nf_sched_step_info *info, nf_error *err);
/* Nothing waiting or active. */
int nf_sched_idle(const nf_sched *s);
/* Sequences waiting (queued or preempted) and active (admitted, holding pages), for gauges. */
void nf_sched_count(const nf_sched *s, size_t *waiting, size_t *active);

/* A sequence's tokens, prompt first (n_prompt of them), valid until the next step; NULL when unknown. */
const int32_t *nf_sched_tokens(const nf_sched *s, uint64_t id, size_t *n_prompt, size_t *n);
nf_seq_end nf_sched_end(const nf_sched *s, uint64_t id);
/* Forgets a sequence (cancelling it first when it has not ended). */
void nf_sched_remove(nf_sched *s, uint64_t id);

nf_kvpool *nf_sched_pool(nf_sched *s);
/* 1 when the prefix cache runs (not asked off, and not forced off: nf_sched_create_engine). */
int nf_sched_prefix_cache(const nf_sched *s);

#endif
