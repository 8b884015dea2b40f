// Gated DeltaNet on the device (gdn.cu): transformers' Qwen3NextGatedDeltaNet after the in_proj
// products, per sequence on its state slot, as the CPU reference (src/backend/cpu/gdn.c) computes it:
//
//   qkv = silu(causal depthwise conv(qkv)), K taps, the window carried in the slot
//   q, k = l2norm per head (q / sqrt(dk)); v head h reads q/k head h / (Hv / Hk)
//   g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)
//   S <- exp(g) S ; S <- S + k (beta (v - S^T k))^T ; o = S^T q           per v head, S [dk][dv] f32
//   out = bf16(rmsnorm(o) * w * silu(z))                                   the out_proj's input
//
// The columns of S are independent (each column j needs only v_j and the whole k and q). A sequence
// with fewer than kGdnChunkFrom tokens in the batch (decode, speculative verification, short pieces)
// takes the per-token steps: a warp owns 8 columns of one (sequence, head), 4 lanes a column, each
// lane dk / 4 of its rows in registers, and a decode step spreads Hv * dv / 8 warps a sequence over
// the GPU. A longer one takes the chunked form (chunks of 32 tokens, gdn.cu): a prep pass over every
// chunk at once does what does not depend on S (the triangular solve), then a CTA owns 32 columns of
// one (sequence, head) in registers and carries them from chunk to chunk. Either way S is read
// once and written once per forward, whatever the sequence's token count.
#pragma once
#include "ops.cuh"

namespace nf {
namespace dec {

struct GdnArgs {
    float *row;            // [T][stride] f32: q | k | v (conv_dim) | z (Vd) | b | a (2 Hv), the in_proj's rows;
                           // the conv output replaces q | k | v, then o replaces v
    uint32_t stride;
    const float *conv_w;   // [conv_dim][K]
    const float *dt_bias, *a_log, *norm; // [Hv], [Hv], [dv]
    float *state;          // the layer's state in slot 0: conv window [K-1][conv_dim], then S [Hv][dk][dv];
    size_t slot_floats;    // slot s's at state + s * slot_floats
    uint32_t k_heads, v_heads, dk, dv, K;
    float eps;             // the output norm's
    uint16_t *out;         // [T][Vd] bf16
    float *ws;             // [T][Hv][dk + kGdnChunk] f32: the chunked form's W and Aqk rows (gdn_ws_floats)
};

constexpr uint32_t kGdnConvK = 4;                       // the conv's taps (every published model)
constexpr uint32_t kGdnChunk = 32;                      // the chunked form's tokens a chunk
// Floats of the workspace (GdnArgs::ws) for up to T tokens a forward.
inline size_t gdn_ws_floats(uint32_t T, uint32_t v_heads, uint32_t dk) { return (size_t)T * v_heads * (dk + kGdnChunk); }
bool gdn_supported(uint32_t dk, uint32_t dv, uint32_t K); // the shapes gdn_forward takes
// Floats of one layer's state in a slot.
inline size_t gdn_state_floats(uint32_t k_heads, uint32_t v_heads, uint32_t dk, uint32_t dv, uint32_t K)
{
    return (size_t)(K - 1) * (2 * k_heads * dk + v_heads * dv) + (size_t)v_heads * dk * dv;
}

// The fewest tokens of a sequence in one forward that take the chunked form. Below it the per-token
// steps, because (1) a speculative verification of up to NF_SPEC_MAX_K + 1 = 9 tokens must give the
// bits decoding them one at a time gives (the chunked form sums in another order), as on the CPU
// (NF_CPU_STEP_MAX); (2) a chunked piece costs about the same whatever its token count up to a chunk
// (four launches, a chunk's fixed chain), while a per-token step is a dependent chain of loads, three
// shuffle reductions, exps and two 8-deep FMA chains: measured (test_gdn_cuda --bench, H100,
// docs/perf/hybrid_h100_2026-12-07e.md) they meet at 24 - 32 tokens (one sequence of 24 tokens: the per-token form 37.9 us
// against the chunked 36.9, of 32 tokens 57.8 against 37.6; eight sequences of 16: 108.8 against
// 128.8); 32 keeps a piece below a full chunk on the kernel that wastes nothing on padding.
constexpr uint32_t kGdnChunkFrom = 32;

// The layer over the batch: S sequences (b.last, b.pos, b.slot), T tokens.
cudaError_t gdn_forward(const GdnArgs &g, const Batch &b, uint32_t T, uint32_t S, cudaStream_t s);
// The same with the threshold given: a sequence of chunk_from tokens or more takes the chunked form
// (1: every sequence; UINT32_MAX: none). For the tests and the microbenchmark.
cudaError_t gdn_forward_split(const GdnArgs &g, const Batch &b, uint32_t T, uint32_t S, uint32_t chunk_from,
                              cudaStream_t s);

// Gated attention: att[t][i] = bf16(att[t][i] * sigmoid(gate[t * stride + i])), i < width.
cudaError_t attn_gate(uint16_t *att, const float *gate, uint32_t stride, uint32_t T, uint32_t width, cudaStream_t s);

} // namespace dec
} // namespace nf
