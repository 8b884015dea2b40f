/* The CUDA sparse-MoE operator: bind an expert bank once, then run forwards on chunks of tokens.
 *
 *   out[t] = sum_{j<k} w[t,j] * down_{e(t,j)}( silu(gate_e x[t]) * up_e x[t] )
 *          + sigmoid(shared_gate . x[t]) * down_s( silu(gate_s x[t]) * up_s x[t] )     (optional)
 *
 * Router: logits = W_router x[t] in fp32; softmax over all E experts in fp32; the k experts with the
 * largest logits (equivalently probabilities), ties to the lower expert index; w = p, renormalised
 * over the k when norm_topk is set.
 *
 * Bind uploads the bank to the device (in the kernels' layout, see docs/sparse_moe.md), admits it
 * under a profile or refuses it naming the reason, and sizes the workspace for the largest chunk.
 * Forward never allocates, never synchronises with the host and never reads routing results on the
 * host, so it can be captured in a CUDA graph; T larger than the bound chunk runs in slices.
 *
 * This header is plain C (streams are passed as void *), so host code needs no CUDA headers. */
#ifndef NF_CUDA_SPARSE_MOE_H
#define NF_CUDA_SPARSE_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One matrix of the bank as it lies in host memory (an artifact payload or a test's buffer).
 * A bank matrix stacks `experts` matrices of rows x cols (rows = output features, cols = input
 * features, row-major, each row encoded by `codec`); nvfp4 matrices are one plane set of
 * experts*rows rows with `divisors` divisor words (codec/nvfp4.h). */
typedef struct nf_moe_matrix {
    int codec;             /* nf_codec_id; -1 = absent */
    const void *data;      /* host payload, nf_codec_payload_bytes(experts*rows, cols, divisors) bytes */
    uint32_t experts;      /* leading dim (1 for the shared expert and router) */
    uint32_t rows, cols;   /* per expert */
    uint32_t divisors;     /* nvfp4: separately quantized sources stacked in this plane (else 1) */
    int allow_a4;          /* policy: this matrix's input may be quantized to four bits */
    int allow_a8;          /* policy: this matrix's input may be quantized to int8 per 32 elements
                            * (k-quant and q8_0 weights): the routed gate/up's x and the routed down's
                            * SwiGLU intermediate on the decode, small-token and mmq routes; the
                            * shared expert's on the mmq route (both its matrices must allow it) */
    /* nvfp4 W4A4: the activation divisor(s) of this input (compressed-tensors' input_global_scale).
     * n_input_divisors = 0: input_divisor is the one divisor (0 = none); 1: input_divisors[0];
     * = experts: input_divisors[e] is expert e's (a down bank: each expert's intermediate is its own
     * input). Bind copies them; the pointer need not outlive it. */
    float input_divisor;
    const float *input_divisors;
    uint32_t n_input_divisors;
} nf_moe_matrix;

/* A layer's bank.
 *   router         [E][H]         f32 or bf16
 *   gate_up        [E][2I][H]     rows 0..I-1 gate, I..2I-1 up, per expert
 *   down           [E][H][I]
 *   shared_gate_up [1][2S][H]     optional (codec -1): qwen2_moe's shared expert
 *   shared_down    [1][H][S]
 *   shared_gate    [1][1][H]      f32 or bf16: the sigmoid gate of the shared expert */
typedef struct nf_moe_bank {
    uint32_t hidden;      /* H */
    uint32_t experts;     /* E, up to 512 */
    uint32_t top_k;       /* k, up to 16 */
    uint32_t inter;       /* I */
    uint32_t shared_inter;/* S (0 without a shared expert) */
    int norm_topk;        /* renormalise the k routing weights to sum to 1 */
    nf_moe_matrix router, gate_up, down, shared_gate_up, shared_down, shared_gate;
} nf_moe_bank;

typedef struct nf_sparse_moe nf_sparse_moe;

/* Workspace: one arena carved at bind (byte offsets, 256-byte aligned), laid out by lifetime within
 * a slice of T <= max_tokens tokens:
 *   whole slice       routing (logits [T][E] f32, top-k ids/weights [T][k], shared gate [T]), the
 *                     work list (slot and position maps [T*k], groups [E], each expert's first
 *                     position [E], prefill tile tables), and
 *                     the per-position down output y [T*k][H] (bf16 where the tensor-core prefill serves
 *                     the bank, else f32; f32 on the mmq route) (+ shared ys [T][H] f32)
 *   one route only    the intermediates, in ONE region the routes share (a slice takes one route,
 *                     and slices, like layers using one workspace, run one after another):
 *                       decode / small-token / CUDA-core: act [T*k][I] f32 (+ shared [T][S] f32)
 *                       mmq (k-quant / q8_0, T up to 1024): x [T][H] and act [T*k][I] in int8 with
 *                       their (d, d sum q) pairs; its y plane is f32 (the y plane is sized for the
 *                       larger of the routes' needs)
 *                       W4A16 prefill: act [T*k][I] bf16 (+ shared [T][S] bf16)
 *                       W4A4 prefill: x, act (+ shared act) as nvfp4 planes
 *                       k-quant / q8_0 prefill from 512 tokens (q8_0 gate/up: 1536): act bf16 and a
 *                       bf16 copy of the routed bank, gate/up's then down's [E][rows][cols] (dequant.cu)
 * qwen3-30b-a3b geometry (the device printed these at 07bdca4; with the y plane in f32 they were
 * 32 768 and 134 217 728 bytes more): 62 976 bytes at T = 1 for every profile; at T = 4096,
 * 237 531 904 (bf16, nvfp4: the fp32 route planes are the largest) and 992 506 624 (k-quant and q8_0
 * banks: the bf16 copy of gate/up, 805 MB, is the largest). A k-quant bank bound for chunks below its
 * threshold has no copy in its workspace.
 *
 * Admits and uploads `bank` for chunks of up to max_tokens tokens; *workspace_bytes receives the
 * device workspace a forward needs. Refusals are NF_ERR_REFUSED with the reason. */
nf_status nf_sparse_moe_bind(const nf_moe_bank *bank, uint32_t max_tokens, nf_sparse_moe **out,
                             size_t *workspace_bytes, nf_error *err);
void nf_sparse_moe_free(nf_sparse_moe *m);

/* The profile the bank was admitted under ("q4_k+q6_k/q8_0+q8_0", "bf16", "nvfp4-w4a4", ...). */
const char *nf_sparse_moe_profile(const nf_sparse_moe *m);
/* Workspace bytes a chunk of `tokens` (<= the bound chunk) needs: the arena figure per profile. */
size_t nf_sparse_moe_workspace_bytes(const nf_sparse_moe *m, uint32_t tokens);
/* Device bytes of the bound weights (all matrices, the kernels' layout). */
size_t nf_sparse_moe_weight_bytes(const nf_sparse_moe *m);

/* Routes: which one a forward of T tokens takes. */
typedef enum nf_moe_route { NF_MOE_ROUTE_DECODE = 0, NF_MOE_ROUTE_SMALL, NF_MOE_ROUTE_PREFILL, NF_MOE_ROUTE_MMQ } nf_moe_route;
nf_moe_route nf_sparse_moe_route(const nf_sparse_moe *m, uint32_t tokens);
const char *nf_moe_route_name(nf_moe_route r);
/* Overrides the thresholds (tokens <= decode_max: decode; <= small_max: small-token; <= the mmq
 * route's end, where the bank has it: mmq; else prefill).
 * For benchmarks and the sweep; bind sets the recorded per-profile values. */
void nf_sparse_moe_set_thresholds(nf_sparse_moe *m, uint32_t decode_max, uint32_t small_max);
/* Overrides the mmq route's upper end (k-quant and q8_0 banks with int8 activations allowed: tokens
 * above small_max and up to mmq_max take the int8 tensor-core GEMMs, mmq.cu); 0 turns the route off
 * (those slices take the small-token route up to its own frontier, which the mmq route lowers, and
 * the prefill route above it, as before the route existed). Clamped to the route's limit (1024);
 * ignored for banks the route cannot take. For benchmarks and the sweep. */
void nf_sparse_moe_set_mmq_max(nf_sparse_moe *m, uint32_t mmq_max);
/* Benchmarks only: the prefill route's tile height (positions per tile: 32, 64 or 128; anything
 * else: chosen per slice from the positions an expert gets on average, the default). */
void nf_sparse_moe_set_tile_height(nf_sparse_moe *m, uint32_t height);

/* x [T][H] bf16 (device), out [T][H] bf16 (device), workspace of the bound size (device, 256-byte
 * aligned), stream a cudaStream_t (NULL = default stream). Asynchronous. */
nf_status nf_sparse_moe_forward(const nf_sparse_moe *m, const uint16_t *x, uint32_t tokens, uint16_t *out,
                                void *workspace, void *stream, nf_error *err);

/* Debug/test access to the routing of the last slice a forward computed (device pointers into the
 * workspace): ids [T][k] int32 and weights [T][k] f32 for the first min(T, max_tokens) tokens. */
void nf_sparse_moe_routing(const nf_sparse_moe *m, void *workspace, const int32_t **ids, const float **weights);

/* Benchmarks only: route every slice by `ids` (device, [max_tokens][k] int32, each row k distinct
 * experts) instead of the router's choice; the router still runs, so its cost is measured, and the
 * combine uses the router's weights. NULL restores normal routing. */
void nf_sparse_moe_force_routing(nf_sparse_moe *m, const int32_t *ids);

#ifdef __cplusplus
}
#endif
#endif
