/* The CUDA decoder: a whole decoder-only transformer (Llama / Qwen2-MoE / Qwen3-MoE) forward on one
 * GPU. The engine (src/engine/cuda_forward.c) describes the model in the backend's own terms (host
 * pointers into the mapped artifact, shapes) so this layer depends on codec and base only.
 *
 *   x = embed(tokens)                                         f32 residual stream [T][H]
 *   per layer:  xn = bf16(rmsnorm(x += delta))                 (the add is fused into the norm)
 *               q, k, v = Wq xn, Wk xn, Wv xn (+ bias)         f32
 *               q, k = rmsnorm per head (qk_norm), rope         k, v -> bf16 KV cache at pos0 + t
 *               delta = Wo attention(q, K, V)                   causal, GQA, online softmax
 *               xn = bf16(rmsnorm(x += delta))
 *               delta = sparse_moe(xn) (bf16) or Wdown bf16(silu(Wgate xn) * Wup xn)
 *   logits = Whead bf16(rmsnorm(x += delta))
 *
 * Linear layers read their weights in the codec they are stored in (the sparse-MoE operator's
 * device layout and kernels: CUDA-core GEMV for small T, tensor-core GEMM for prefill chunks).
 * A decode step (T = 1) is captured once as a CUDA graph and replayed: every kernel reads the
 * token ids and the position from device memory. This header is plain C. */
#ifndef NF_CUDA_DECODER_H
#define NF_CUDA_DECODER_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/sparse_moe/sparse_moe.h"
#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One layer (host pointers; vectors f32). Matrices are nf_moe_matrix with experts = 1. */
typedef struct nf_cuda_layer_desc {
    const float *attn_norm, *ffn_norm;     /* [H] */
    const float *q_bias, *k_bias, *v_bias; /* [heads*hd], [kv_heads*hd] x2, or NULL */
    const float *q_norm, *k_norm;          /* [hd] or NULL */
    nf_moe_matrix q, k, v, o;              /* [heads*hd][H], [kv*hd][H] x2, [H][heads*hd] */
    nf_moe_matrix gate, up, down;          /* dense MLP: [D][H] x2, [H][D]; codec -1 on MoE layers */
    const nf_moe_bank *moe;                /* the sparse-MoE block, or NULL on dense layers */
} nf_cuda_layer_desc;

typedef struct nf_cuda_decoder_desc {
    uint32_t hidden, layers, heads, kv_heads, head_dim, vocab;
    float rms_eps;
    nf_moe_matrix embd;              /* [vocab][H] */
    nf_moe_matrix head;              /* [vocab][H]; the same data as embd when tied (uploaded once) */
    const float *out_norm;           /* [H] */
    const nf_cuda_layer_desc *layer; /* [layers] */
    uint32_t ctx;                    /* KV cache length in tokens */
    uint32_t chunk;                  /* the most tokens one forward takes */
    int no_graphs;                   /* tests: run decode steps as plain stream launches */
    int allow_a8;                    /* dense layers at T <= 16 may quantize their bf16 input to int8
                                      * per 32 elements (k-quant and q8_0 weights; gemv_a8.cu) */
    int trace_routing;               /* keep each MoE layer's expert ids of the last forward */
} nf_cuda_decoder_desc;

typedef struct nf_cuda_decoder nf_cuda_decoder;

/* Uploads the weights, allocates the KV cache (bf16) and the chunk's buffers. Errors name the
 * tensor or the allocation that failed. */
nf_status nf_cuda_decoder_create(const nf_cuda_decoder_desc *d, nf_cuda_decoder **out, nf_error *err);
void nf_cuda_decoder_free(nf_cuda_decoder *dec);

/* The rotation table (inv_freq[hd / 2] and the cos/sin factor, as nf_rope_inv_freq computes them).
 * Must be set before the first forward; may change between forwards (dynamic scaling). */
nf_status nf_cuda_decoder_set_rope(nf_cuda_decoder *dec, const float *inv_freq, float attn_factor, nf_error *err);

/* tokens[T] (T <= chunk) at positions pos0 .. pos0 + T - 1 (pos0 + T <= ctx); their keys/values join
 * the cache. logits (host, may be NULL): [T][vocab] when all_logits, else the last token's [vocab].
 * Synchronous when logits is given. */
nf_status nf_cuda_decoder_forward(nf_cuda_decoder *dec, const int32_t *tokens, uint32_t T, uint32_t pos0,
                                  float *logits, int all_logits, nf_error *err);

/* The k best (id, logit) pairs of the last forward's last-token logits, best first, ties to the
 * lower id (1 <= k <= 256): sampling moves these k pairs to the host, not the vocabulary, and applies
 * the same sampler code as the CPU (engine/sampler.h), so one seed gives the same tokens. */
nf_status nf_cuda_decoder_topk(nf_cuda_decoder *dec, uint32_t k, int32_t *ids, float *vals, nf_error *err);
/* The last forward's last-token logits [vocab] to the host. */
nf_status nf_cuda_decoder_logits(nf_cuda_decoder *dec, float *logits, nf_error *err);

/* With trace_routing: the last forward's expert ids [layers][T][top_k] (-1 on dense layers). */
nf_status nf_cuda_decoder_routing(nf_cuda_decoder *dec, int32_t *ids, nf_error *err);

/* Device bytes held: weights (dense + every MoE bank) and the KV cache. */
size_t nf_cuda_decoder_weight_bytes(const nf_cuda_decoder *dec);
size_t nf_cuda_decoder_kv_bytes(const nf_cuda_decoder *dec);

#ifdef __cplusplus
}
#endif
#endif
