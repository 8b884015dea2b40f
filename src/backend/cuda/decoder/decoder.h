/* The CUDA decoder: a whole decoder-only transformer (Llama / Qwen2-MoE / Qwen3-MoE) forward on one
 * GPU. The engine (src/engine/cuda_forward.c) describes the model in the backend's own terms (host
 * pointers into the mapped artifact, shapes) so this layer depends on codec and base only.
 *
 *   x = embed(tokens)                                         f32 residual stream [T][H]
 *   per layer:  xn = bf16(rmsnorm(x += delta))                 (the add is fused into the norm)
 *               q, k, v = Wq xn, Wk xn, Wv xn (+ bias)         f32
 *               q, k = rmsnorm per head (qk_norm), rope         k, v -> bf16 KV pages at their slots
 *               delta = Wo attention(q, K, V)                   causal, GQA, online softmax
 *               xn = bf16(rmsnorm(x += delta))
 *               delta = sparse_moe(xn) (bf16) or Wdown bf16(silu(Wgate xn) * Wup xn)
 *   logits = Whead bf16(rmsnorm(x += delta))
 *
 * Gated DeltaNet hybrids (qwen3_next, qwen3_5_moe; docs/hybrid.md): a linear layer's token mixer is
 *   qkv | z | ba = W xn ; qkv = silu(causal conv(qkv)) ; o = gated delta rule over the sequence's state
 *   slot ; delta = Wout bf16(rmsnorm(o) * silu(z))                                     (gdn.cu)
 * and the attention layers are gated (att *= sigmoid(Wgate xn)) with partial rotary (rope_dim). Each
 * sequence's recurrent state lives in the device slot nf_batch.state_slot names (max_seqs slots); a
 * sequence at position 0 starts from zeros, one past it continues its slot exactly.
 *
 * Linear layers read their weights in the codec they are stored in (the sparse-MoE operator's
 * device layout and kernels: CUDA-core GEMV for small T, tensor-core GEMM for prefill chunks).
 *
 * One forward is a batch (base/batch.h nf_batch): the tokens of S sequences concatenated, decode
 * tokens and prefill chunks mixed. Every product runs once over all T tokens (the sparse-MoE operator
 * routes by T); attention runs per sequence through its page table. The KV cache is a pool of pages:
 * per layer, K and V are each [kv_pages][page_tokens][kv_heads * head_dim] bf16 (docs/gpu_engine.md
 * "Paged KV cache"). A decode-only step (every sequence one token) of S sequences is captured once
 * as a CUDA graph per S and replayed: every kernel reads the token ids, positions and page tables
 * from device memory (a batch whose logit_rows ask for more than one row of a sequence has a sequence
 * of several tokens: never a graph step). This header is plain C. */
#ifndef NF_CUDA_DECODER_H
#define NF_CUDA_DECODER_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/sparse_moe/sparse_moe.h"
#include "base/batch.h"
#include "base/error.h"

/* Positions per KV page when the desc leaves page_tokens 0 (docs/perf/kv_page_tokens.md). */
#define NF_CUDA_PAGE_TOKENS 64

#ifdef __cplusplus
extern "C" {
#endif

/* One layer (host pointers; vectors f32). Matrices are nf_moe_matrix with experts = 1. A Gated DeltaNet
 * layer (is_linear) has the ssm_* fields instead of the attention's. */
typedef struct nf_cuda_layer_desc {
    const float *attn_norm, *ffn_norm;     /* [H] */
    const float *q_bias, *k_bias, *v_bias; /* [heads*hd], [kv_heads*hd] x2, or NULL */
    const float *q_norm, *k_norm;          /* [hd] or NULL */
    nf_moe_matrix q, k, v, o;              /* [heads*hd][H], [kv*hd][H] x2, [H][heads*hd] */
    nf_moe_matrix attn_gate;               /* gated attention: [heads*hd][H] (att *= sigmoid(gate)); codec -1: none */
    nf_moe_matrix gate, up, down;          /* dense MLP: [D][H] x2, [H][D]; codec -1 on MoE layers */
    const nf_moe_bank *moe;                /* the sparse-MoE block, or NULL on dense layers */
    int is_linear;                         /* Gated DeltaNet (docs/hybrid.md) */
    nf_moe_matrix ssm_qkv, ssm_z, ssm_ba;  /* [conv_dim][H] (q | k | v channels), [Vd][H], [2 Hv][H] (b, then a) */
    nf_moe_matrix ssm_out;                 /* [H][Vd] */
    const float *ssm_conv;                 /* [conv_dim][K] */
    const float *ssm_dt_bias, *ssm_a_log;  /* [Hv] */
    const float *ssm_norm;                 /* [dv]: the gated output norm's plain weight */
} nf_cuda_layer_desc;

/* The Gated DeltaNet shapes (all zero without such layers): Hk q/k heads of dk, Hv v heads of dv
 * (Hv % Hk == 0), a causal conv of conv_k taps over conv_dim = 2 Hk dk + Hv dv channels. */
typedef struct nf_cuda_gdn_shape {
    uint32_t k_heads, v_heads, k_dim, v_dim, conv_k;
} nf_cuda_gdn_shape;

/* The MTP block of a hybrid (docs/hybrid.md "MTP"; layer NULL without one, the rest then unread): x = fc
 * [rmsnorm_e(embed(t)) | rmsnorm_h(h)], then `layer` (an attention layer with its MLP) over its own KV
 * pages, then out_norm; the LM head is the model's. */
typedef struct nf_cuda_mtp_desc {
    const nf_cuda_layer_desc *layer;
    nf_moe_matrix fc;                             /* [H][2H] */
    const float *norm_embd, *norm_hidden, *out_norm; /* [H] */
} nf_cuda_mtp_desc;

typedef struct nf_cuda_decoder_desc {
    uint32_t hidden, layers, heads, kv_heads, head_dim, vocab;
    uint32_t rope_dim;               /* rotated dims at the start of a head (0: head_dim; fewer: partial rotary) */
    nf_cuda_gdn_shape gdn;           /* hybrids: the linear layers' shapes */
    float rms_eps;
    nf_moe_matrix embd;              /* [vocab][H] */
    nf_moe_matrix head;              /* [vocab][H]; the same data as embd when tied (uploaded once) */
    const float *out_norm;           /* [H] */
    const nf_cuda_layer_desc *layer; /* [layers] */
    nf_cuda_mtp_desc mtp;            /* optional */
    uint32_t ctx;                    /* the longest sequence in tokens (the rope table's length) */
    uint32_t chunk;                  /* the most tokens one forward takes, all sequences together */
    uint32_t page_tokens;            /* positions per KV page, a power of two (0: NF_CUDA_PAGE_TOKENS) */
    uint32_t kv_pages;               /* pages in the pool (0: max_seqs * ceil(ctx / page_tokens)) */
    uint32_t max_seqs;               /* the most sequences of one forward (0: 1; at most chunk) */
    uint32_t state_snaps;            /* hybrids: snapshot slots 2 max_seqs .. for slot_copy (prefix cache) */
    int no_graphs;                   /* tests: run decode steps as plain stream launches */
    int allow_a8;                    /* dense layers at T <= 16 may quantize their bf16 input to int8
                                      * per 32 elements (k-quant and q8_0 weights; gemv_a8.cu) */
    int trace_routing;               /* keep each MoE layer's expert ids of the last forward */
} nf_cuda_decoder_desc;

typedef struct nf_cuda_decoder nf_cuda_decoder;

/* Uploads the weights, allocates the KV page pool (bf16) and the chunk's buffers. Errors name the
 * tensor or the allocation that failed. */
nf_status nf_cuda_decoder_create(const nf_cuda_decoder_desc *d, nf_cuda_decoder **out, nf_error *err);
void nf_cuda_decoder_free(nf_cuda_decoder *dec);

/* The rotation table (inv_freq[rope_dim / 2] and the cos/sin factor, as nf_rope_inv_freq computes them).
 * Must be set before the first forward; may change between forwards (dynamic scaling). */
nf_status nf_cuda_decoder_set_rope(nf_cuda_decoder *dec, const float *inv_freq, float attn_factor, nf_error *err);

/* One forward of b (base/batch.h): T <= chunk tokens of S <= max_seqs sequences; each token's key and
 * value go to its page slot, then it attends to its sequence's positions 0 .. its own. logits (host,
 * may be NULL: they stay on the device for topk / logits): with b->logit_rows the last logit_rows[i]
 * tokens of each sequence, [sum][vocab] in batch order (the final norm's rows gathered, one LM head
 * product over them: speculation's verification positions beside other sequences' tokens); else
 * [T][vocab] when b->all_logits, else [S][vocab], each sequence's last token. Synchronous when logits
 * is given. A malformed batch (counts,
 * seq_start, positions past ctx, a page id >= kv_pages among those the forward touches, a token id
 * >= vocab) is refused with NF_ERR_INVALID_ARG before anything runs. */
nf_status nf_cuda_decoder_forward_batch(nf_cuda_decoder *dec, const nf_batch *b, float *logits, nf_error *err);

/* Each sequence's k best (id, logit) pairs of the last forward's last-token logits, ids[S][k] and
 * vals[S][k], best first, ties to the lower id (1 <= k <= 256): sampling moves these k pairs to the
 * host, not the vocabulary, and applies the same sampler code as the CPU (engine/sampler.h), so one
 * seed gives the same tokens. */
nf_status nf_cuda_decoder_topk(nf_cuda_decoder *dec, uint32_t k, int32_t *ids, float *vals, nf_error *err);
/* The last forward's last-token logits of each sequence, [S][vocab], to the host. */
nf_status nf_cuda_decoder_logits(nf_cuda_decoder *dec, float *logits, nf_error *err);

/* Penalises (pen[S]: base/batch.h nf_penalty) each sequence's last-token logits of the last forward on the device, in place, so that
 * the next topk (or logits) sees them: sequence i's pairs are start[i] .. start[i + 1] - 1 of
 * ids / counts (a token id and how often it occurs in the sequence's penalty window; each id at most
 * once per sequence, counts > 0): l = l > 0 ? l / repetition : l * repetition (the CPU sampler's
 * rule, to the bit), then l -= frequency * count, then l -= presence. Host arrays; start[S] pairs in
 * all. Sampling with penalties then needs k pairs from the device, not the vocabulary. */
nf_status nf_cuda_decoder_penalize(nf_cuda_decoder *dec, const nf_penalty *pen, const uint32_t *start,
                                   const int32_t *ids, const uint32_t *counts, nf_error *err);

/* Page src's keys and values of every layer to page dst (copy-on-write of a shared partial page),
 * ordered before the next forward on the decoder's stream. */
nf_status nf_cuda_decoder_copy_page(nf_cuda_decoder *dec, uint32_t dst, uint32_t src, nf_error *err);

/* With trace_routing: the last forward's expert ids [layers][T][top_k] (-1 on dense layers). */
nf_status nf_cuda_decoder_routing(nf_cuda_decoder *dec, int32_t *ids, nf_error *err);

/* Hybrids: state slot src's recurrent state and the positions it has absorbed copied to slot dst on the
 * device, ordered on the decoder's stream (speculation's rollback, the prefix cache's snapshots; engine.h
 * slot_copy). Slots below max_seqs are the forward's; max_seqs .. 2 max_seqs - 1 are spares and 2 max_seqs
 * .. 2 max_seqs + state_snaps - 1 snapshots that no batch names, each group allocated at the first copy
 * that touches one of it. */
nf_status nf_cuda_decoder_slot_copy(nf_cuda_decoder *dec, uint32_t dst, uint32_t src, nf_error *err);

/* With an MTP block: the last forward's final-normed hidden states, out[T][H] f32 (rmsnorm(x) * out_norm
 * of the f32 residual stream, the rows the LM head reads before their bf16 rounding). Refused once the
 * MTP block has run since (it reuses the buffers). */
nf_status nf_cuda_decoder_hidden(nf_cuda_decoder *dec, float *out, nf_error *err);

/* The MTP block over b (engine.h's `mtp` contract): token t of b at position pos0 + t of its sequence
 * reads hidden[t] ([T][H] host f32) and writes its keys and values to the block's own pages; logits
 * [T][vocab] and hidden_out [T][H] (may be NULL) when b->all_logits, else each sequence's last row
 * ([S][...]); synchronous. No state slots, no graph, no logit_rows. It overwrites the device logits:
 * topk / logits / penalize then refuse until the next forward. */
nf_status nf_cuda_decoder_mtp(nf_cuda_decoder *dec, const nf_batch *b, const float *hidden, float *logits,
                              float *hidden_out, nf_error *err);

/* Device bytes held: weights (dense + every MoE bank) and the KV page pool. */
size_t nf_cuda_decoder_weight_bytes(const nf_cuda_decoder *dec);
size_t nf_cuda_decoder_kv_bytes(const nf_cuda_decoder *dec);

#ifdef __cplusplus
}
#endif
#endif
