/* The engine: one sequence's session over a loaded model on a backend.
 *
 * A backend is a table of three functions (nf_backend_ops): create state for a model (weights
 * bound, KV cache sized from the context length, buffers for a chunk of tokens), run a forward of
 * up to `chunk` tokens at given positions (appending their keys/values to the cache) and return
 * logits, destroy. The CPU backend (cpu_forward.c) is the reference; a CUDA backend slots in with
 * the same table (nf_engine_opts.device: cuda_forward.c over backend/cuda/decoder). A backend that
 * keeps logits on its device also offers `logits` and `topk`, so sampling moves k candidates
 * instead of the vocabulary (nf_engine_next).
 *
 * Prefill runs the prompt in chunks of `chunk` tokens (matrix-matrix products, experts grouped by
 * the tokens routed to them); decode runs one token. Positions are implicit: the session appends. */
#ifndef NF_ENGINE_ENGINE_H
#define NF_ENGINE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "model/model.h"

typedef struct nf_engine_opts {
    const char *device; /* "cpu", "cuda" or "auto" (cuda when a GPU is visible); NULL means cpu */
    int threads;        /* <= 0: all CPUs */
    uint32_t ctx;       /* context length in tokens (0: min(model.max_ctx, 4096)) */
    uint32_t chunk;     /* prefill chunk in tokens (0: 128 on the CPU, 2048 on CUDA; at most ctx) */
    int kv_bf16;        /* KV cache elements in bf16 (else f32) */
    int reference;      /* CPU: dequantize + double dot for every product (tests) */
    int no_graphs;      /* CUDA: run decode steps as plain launches, not a replayed graph (tests) */
    int no_a8;          /* CUDA: keep bf16 activations into k-quant / q8_0 products at small T (no int8
                         * quantization; slower decode, closer to the CPU reference) */
    int trace_routing;  /* keep each MoE layer's expert choices of the last forward (nf_engine_routing) */
} nf_engine_opts;

/* What a backend holds on its device, for the bytes-per-token figures. */
typedef struct nf_backend_info {
    size_t weight_bytes, kv_bytes;
} nf_backend_info;

typedef struct nf_backend_ops {
    const char *name;
    nf_status (*create)(const nf_model *m, const nf_engine_opts *o, void **state, nf_error *err);
    void (*destroy)(void *state);
    /* tokens[T] (T <= chunk, ids < vocab) at positions pos0 .. pos0 + T - 1 (pos0 + T <= ctx);
     * logits: [T][vocab] when all_logits, else [vocab] for the last token; NULL (backends with
     * `logits` only): leave them on the device. */
    nf_status (*forward)(void *state, const int32_t *tokens, size_t T, uint32_t pos0, float *logits, int all_logits,
                         nf_error *err);
    /* Optional: the last forward's last-token logits [vocab] to the host; their k best (id, logit)
     * pairs, best first, ties to the lower id (k <= 256). */
    nf_status (*logits)(void *state, float *out, nf_error *err);
    nf_status (*topk)(void *state, uint32_t k, int32_t *ids, float *vals, nf_error *err);
    void (*describe)(void *state, nf_backend_info *info); /* optional */
    /* With trace_routing: the last forward's expert ids, [layers][T][top_k] (-1 on dense layers). */
    nf_status (*routing)(void *state, int32_t *ids, nf_error *err);
} nf_backend_ops;

extern const nf_backend_ops nf_cpu_backend;
extern const nf_backend_ops nf_cuda_backend;

typedef struct nf_engine {
    const nf_model *model;
    const nf_backend_ops *ops;
    void *state;
    nf_engine_opts opts; /* with defaults filled in */
    uint32_t n_past;     /* tokens in the cache */
    float *logits;       /* [vocab]: the last token's logits after prefill/decode (see defer_logits) */
    int defer_logits;    /* set by the caller: forwards leave logits on the device; read them with
                          * nf_engine_logits or sample with nf_engine_next */
    int logits_stale;    /* e->logits does not hold the last forward's logits yet */
} nf_engine;

nf_status nf_engine_create(const nf_model *m, const nf_engine_opts *o, nf_engine **out, nf_error *err);
void nf_engine_free(nf_engine *e);
/* Forgets the cached tokens (a new sequence). */
void nf_engine_reset(nf_engine *e);

/* Appends tokens[n] to the sequence in chunks; e->logits holds the last token's logits. With
 * all_logits non-NULL it receives [n][vocab], every position's logits. A sequence that would pass
 * the context is refused (NF_ERR_INVALID_ARG, naming both lengths) before anything runs. */
nf_status nf_engine_prefill(nf_engine *e, const int32_t *tokens, size_t n, float *all_logits, nf_error *err);
/* One token: the same as prefill of 1. */
nf_status nf_engine_decode(nf_engine *e, int32_t token, nf_error *err);

/* The last token's logits (fetched from the device when deferred); NULL on error. */
const float *nf_engine_logits(nf_engine *e, nf_error *err);

/* With opts.trace_routing: the expert ids each MoE layer chose for the tokens of the last forward,
 * ids[layers][T][top_k] (T of that forward; -1 rows on dense layers). */
nf_status nf_engine_routing(nf_engine *e, int32_t *ids, nf_error *err);

struct nf_sampler;
/* The next token from the last forward's logits by the sampler (history: the ids so far). On a
 * device backend the sampler's candidates are selected on the device when it can (sampler.h). */
nf_status nf_engine_next(nf_engine *e, struct nf_sampler *s, const int32_t *history, size_t n_hist, int32_t *id,
                         nf_error *err);

#endif
