/* The engine: a model on a backend, and one sequence's session over it.
 *
 * A backend is a table of functions (nf_backend_ops): create state for a model (weights bound, a
 * pool of KV pages, buffers for a forward of up to `chunk` tokens), run ONE batched forward over
 * the tokens of several sequences (nf_batch, base/batch.h: decode tokens and prefill chunks
 * concatenated, each sequence reading and appending its keys/values through its page table) and
 * return logits, destroy. The CPU backend (cpu_forward.c) is the reference; a CUDA backend slots in
 * with the same table (nf_engine_opts.device: cuda_forward.c over backend/cuda/decoder). A backend
 * that keeps logits on its device also offers `logits` and `topk`, so sampling moves k candidates
 * instead of the vocabulary (nf_engine_next), and may offer `penalize`, so that samplers with
 * repetition / presence / frequency penalties still need only k candidates.
 *
 * nf_engine is the single-sequence session: a batch of one whose sequence owns pages
 * 0 .. ceil(ctx / page_tokens) - 1 of the pool (the identity page table). Prefill runs the prompt
 * in forwards of `chunk` tokens; decode runs one token; positions are implicit (the session
 * appends). There is no second code path: the session builds an nf_batch and calls ops->forward.
 * A scheduler (sched.c) drives the same backend and pool with many sequences; the session and a
 * scheduler must not be used on one engine at once (both would write the same pages). */
#ifndef NF_ENGINE_ENGINE_H
#define NF_ENGINE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "base/batch.h"
#include "base/error.h"
#include "engine/sampler.h"
#include "model/model.h"

/* The KV page size in positions when nf_engine_opts.page_tokens is 0. Provisional: the CUDA
 * attention measures and may change it. */
#define NF_KV_PAGE_TOKENS 64

typedef struct nf_engine_opts {
    const char *device; /* "cpu", "cuda" or "auto" (cuda when a GPU is visible); NULL: cpu */
    int threads;        /* <= 0: all CPUs */
    uint32_t ctx;       /* the longest sequence in tokens (0: min(model.max_ctx, 4096)) */
    uint32_t chunk;     /* the most tokens of one forward, all sequences together (0: 256 on the CPU, 2048
                         * on CUDA; at most max_seqs * ctx) */
    uint32_t page_tokens; /* positions per KV page (0: NF_KV_PAGE_TOKENS) */
    uint32_t kv_pages;  /* pages in the KV pool (0: max_seqs * ceil(ctx / page_tokens)); at least one
                         * sequence of ctx tokens, which the single-sequence session needs */
    uint32_t max_seqs;  /* the most sequences of one forward (0: 1) */
    int kv_bf16;        /* KV cache elements in bf16 (else f32) */
    int reference;      /* CPU: dequantize + double dot for every product (tests) */
    int no_graphs;      /* CUDA: run decode steps as plain launches, not a replayed graph (tests) */
    int no_a8;          /* keep float activations into k-quant / q8_0 products (no int8 quantization:
                         * CUDA: bf16 at small T; CPU: f32 everywhere; slower, closer to the reference) */
    int trace_routing;  /* keep each MoE layer's expert choices of the last forward (nf_engine_routing) */
    uint32_t gdn_chunk; /* CPU, Gated DeltaNet hybrids: prefill runs of a sequence in the chunked form with
                         * chunks of this many tokens (<= 64; 0: the recurrent form, the reference) */
    uint32_t ep_sim_ranks; /* CPU: every MoE block through expert parallelism over this many simulated
                            * ranks (docs/dist.md; tests: the result must not change); 0 or 1: none */
    int mtp;            /* a model with an MTP block: load it (its weights, its own KV pages, the hidden states
                         * each forward keeps) for speculation with mtp:K; 0: the block stays in the file */
    uint32_t state_snaps; /* hybrids: state slots 2 max_seqs .. 2 max_seqs + state_snaps - 1 for the
                           * scheduler's prefix cache (snapshots of the state after a cached page), allocated
                           * at their first use (0: max_seqs) */
} nf_engine_opts;

/* What a backend holds on its device, for the bytes-per-token figures. */
typedef struct nf_backend_info {
    size_t weight_bytes, kv_bytes;
} nf_backend_info;

typedef struct nf_backend_ops {
    const char *name;
    nf_status (*create)(const nf_model *m, const nf_engine_opts *o, void **state, nf_error *err);
    void (*destroy)(void *state);
    /* One forward of b (base/batch.h; T <= chunk, S <= max_seqs, every page id < kv_pages): writes
     * the tokens' keys and values into their page slots and returns logits: [T][vocab] when
     * b->all_logits, else [S][vocab], each sequence's last token; NULL (backends with `logits`
     * only): leave them on the device. A malformed batch is refused (NF_ERR_INVALID_ARG). */
    nf_status (*forward)(void *state, const nf_batch *b, float *logits, nf_error *err);
    /* Optional: the last forward's last-token logits of each sequence, out[S][vocab], to the host;
     * each sequence's k best (id, logit) pairs, ids[S][k] and vals[S][k], best first, ties to the
     * lower id (k <= 256). */
    nf_status (*logits)(void *state, float *out, nf_error *err);
    nf_status (*topk)(void *state, uint32_t k, int32_t *ids, float *vals, nf_error *err);
    /* Optional (with topk): penalises the last forward's last-token logits of each sequence in place,
     * so that the next topk / logits see them: pen[S]; sequence i's (id, count) pairs are start[i] ..
     * start[i + 1] - 1 of ids / counts (the shape of sampler.h nf_penalty_lists; empty lists for
     * sequences that do not sample). The rule is nf_sampler_sample's, to the bit. Ids outside the
     * vocabulary or lists that run backwards are refused (NF_ERR_INVALID_ARG). */
    nf_status (*penalize)(void *state, const nf_penalty *pen, const uint32_t *start, const int32_t *ids,
                          const uint32_t *counts, nf_error *err);
    /* Copies page src's keys and values (every layer) to page dst: copy-on-write of a shared
     * partial page before a sequence appends to it. */
    nf_status (*copy_page)(void *state, uint32_t dst, uint32_t src, nf_error *err);
    void (*describe)(void *state, nf_backend_info *info); /* optional */
    /* With trace_routing: the last forward's expert ids, [layers][T][top_k] (-1 on dense layers). */
    nf_status (*routing)(void *state, int32_t *ids, nf_error *err);
    /* MTP (docs/hybrid.md "MTP"; optional, models with an MTP block). hidden: the last forward's
     * final-normed hidden state of every token, out[T][H] (what the head reads). mtp: the MTP block over
     * b, where token t of b follows the position whose hidden state is hidden[t] ([T][H]: the main
     * model's, or a previous MTP step's hidden_out when drafting ahead) and sits at that position
     * (b->pos0) in the block's own KV pages, addressed by b's page table like the main model's; writes
     * logits and hidden_out (the block's normed output; NULL: not wanted) of every token ([T][vocab],
     * [T][H]) when b->all_logits, else of each sequence's last token ([S][...]). No state slots. */
    nf_status (*hidden)(void *state, float *out, nf_error *err);
    nf_status (*mtp)(void *state, const nf_batch *b, const float *hidden, float *logits, float *hidden_out,
                     nf_error *err);
    /* Optional (hybrids): copies state slot src's recurrent state and the position it holds to slot dst,
     * both below 2 max_seqs + state_snaps: slots from max_seqs on are spares that no batch names, each
     * group allocated at its first use. Speculation's rollback (engine/spec.h, sched_spec.c) copies slot i
     * to its spare i + max_seqs before a verification and back after a rejection; the prefix cache keeps
     * its snapshots in 2 max_seqs + j (kvpool.h). On the backend's own memory (a GPU's slot never crosses
     * PCIe). */
    nf_status (*slot_copy)(void *state, uint32_t dst, uint32_t src, nf_error *err);
    /* 1: forward honours nf_batch.logit_rows (several positions' logits of one sequence in a batch of
     * many: speculation in the scheduler, sched_spec.c); the scheduler refuses speculation otherwise. */
    int logit_rows;
    /* The fewest tokens of a prompt piece the scheduler cuts (nf_sched_opts.piece_min): the CPU's
     * NF_CPU_STEP_MAX + 1, below which a segment takes the per-token kernels; 0: no floor. */
    uint32_t prefill_min;
} nf_backend_ops;

extern const nf_backend_ops nf_cpu_backend;
extern const nf_backend_ops nf_cuda_backend;

typedef struct nf_engine {
    const nf_model *model;
    const nf_backend_ops *ops;
    void *state;
    nf_engine_opts opts; /* with defaults filled in */
    uint32_t n_past;     /* tokens in the cache */
    uint32_t *pages;     /* [ceil(ctx / page_tokens)]: the session's page table, page i = i */
    float *logits;       /* [vocab]: the last token's logits after prefill/decode (see defer_logits) */
    int defer_logits;    /* set by the caller: forwards leave logits on the device; read them with
                          * nf_engine_logits or sample with nf_engine_next */
    int logits_stale;    /* e->logits does not hold the last forward's logits yet */
    int logits_penalized; /* nf_engine_next penalised the last forward's logits on the device */
    float *mtp_hidden;   /* [H] or NULL: MTP speculation (spec.h) left position mtp_hidden_pos - 1's hidden state */
    uint32_t mtp_hidden_pos;
    uint32_t spec_snap_pos; /* a hybrid's slot 0 copied to its spare before the last ngram verification (spec.h):
                             * the positions the copy holds; UINT32_MAX: none */
} nf_engine;

nf_status nf_engine_create(const nf_model *m, const nf_engine_opts *o, nf_engine **out, nf_error *err);
/* The engine runs the model's MTP block (the model has one and nf_engine_opts.mtp loaded it). */
static inline int nf_engine_has_mtp(const nf_engine *e) { return e->opts.mtp && e->model->mtp && e->ops->mtp; }
/* ceil(ctx / page_tokens): the pages one sequence of the full context needs (opts with defaults). */
uint32_t nf_engine_pages_per_seq(const nf_engine_opts *o);
/* Checks b against the engine's limits (opts with defaults) and a vocabulary of `vocab`: counts,
 * seq_start increasing with at least one token per sequence, positions within ctx, the page ids a
 * forward touches below kv_pages, token ids below vocab. For backends, before they touch memory. */
nf_status nf_batch_check(const nf_batch *b, const nf_engine_opts *o, uint32_t vocab, nf_error *err);
void nf_engine_free(nf_engine *e);
/* Forgets the cached tokens (a new sequence). */
void nf_engine_reset(nf_engine *e);

/* Appends tokens[n] to the sequence in chunks; e->logits holds the last token's logits. With
 * all_logits non-NULL it receives [n][vocab], every position's logits. A sequence that would pass
 * the context is refused (NF_ERR_INVALID_ARG, naming both lengths) before anything runs. */
nf_status nf_engine_prefill(nf_engine *e, const int32_t *tokens, size_t n, float *all_logits, nf_error *err);
/* The same, and with hidden non-NULL (a backend with `hidden`) [n][H]: every position's final-normed hidden
 * state, the MTP block's input. */
nf_status nf_engine_prefill_hidden(nf_engine *e, const int32_t *tokens, size_t n, float *all_logits, float *hidden,
                                   nf_error *err);
/* The MTP block (backend `mtp`) over n tokens at positions pos0 .. pos0 + n - 1 of the session, in forwards of
 * up to `chunk`: tokens[i] follows the position whose hidden state is hidden[i]; with all, logits [n][vocab]
 * and hidden_out [n][H] (may be NULL), else only the last position's ([vocab], [H]: a prompt's rows would
 * not fit a large vocabulary). A model without an MTP block is refused (NF_ERR_UNSUPPORTED). */
nf_status nf_engine_mtp(nf_engine *e, const int32_t *tokens, const float *hidden, size_t n, uint32_t pos0, int all,
                        float *logits, float *hidden_out, nf_error *err);
/* One token: the same as prefill of 1. */
nf_status nf_engine_decode(nf_engine *e, int32_t token, nf_error *err);

/* The last token's logits (fetched from the device when deferred); NULL on error. */
const float *nf_engine_logits(nf_engine *e, nf_error *err);

/* With opts.trace_routing: the expert ids each MoE layer chose for the tokens of the last forward,
 * ids[layers][T][top_k] (T of that forward; -1 rows on dense layers). */
nf_status nf_engine_routing(nf_engine *e, int32_t *ids, nf_error *err);

struct nf_sampler;
/* The next token from the last forward's logits by the sampler (history: the ids so far). On a
 * device backend the sampler's candidates are selected on the device when it can (sampler.h); with
 * `penalize` its penalties are applied there too, in place: nf_engine_logits afterwards returns the
 * penalised logits, and a second nf_engine_next with penalties on the same forward is refused
 * (NF_ERR_INVALID_ARG: they would apply twice). */
nf_status nf_engine_next(nf_engine *e, struct nf_sampler *s, const int32_t *history, size_t n_hist, int32_t *id,
                         nf_error *err);

#endif
