// Gated DeltaNet on the device (gdn.cu): transformers' Qwen3NextGatedDeltaNet after the in_proj
// products, per sequence on its state slot, as the CPU reference (src/backend/cpu/gdn.c) computes it:
//
//   qkv = silu(causal depthwise conv(qkv)), K taps, the window carried in the slot
//   q, k = l2norm per head (q / sqrt(dk)); v head h reads q/k head h / (Hv / Hk)
//   g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)
//   S <- exp(g) S ; S <- S + k (beta (v - S^T k))^T ; o = S^T q           per v head, S [dk][dv] f32
//   out = bf16(rmsnorm(o) * w * silu(z))                                   the out_proj's input
//
// The recurrence is the per-token step for prefill chunks too (the definition; the chunked form on
// tensor cores is not done). The columns of S are independent (each column j needs only v_j and the
// whole k and q), so a warp owns 8 columns of one (sequence, head), 4 lanes a column, each lane
// dk / 4 of its rows in registers: S is read once and written once per forward, whatever the
// sequence's token count, and a decode step spreads Hv * dv / 8 warps a sequence over the GPU.
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
};

constexpr uint32_t kGdnConvK = 4;                       // the conv's taps (every published model)
bool gdn_supported(uint32_t dk, uint32_t dv, uint32_t K); // the shapes gdn_forward takes
// Floats of one layer's state in a slot.
inline size_t gdn_state_floats(uint32_t k_heads, uint32_t v_heads, uint32_t dk, uint32_t dv, uint32_t K)
{
    return (size_t)(K - 1) * (2 * k_heads * dk + v_heads * dv) + (size_t)v_heads * dk * dv;
}

// The layer over the batch: S sequences (b.last, b.pos, b.slot), T tokens.
cudaError_t gdn_forward(const GdnArgs &g, const Batch &b, uint32_t T, uint32_t S, cudaStream_t s);

// Gated attention: att[t][i] = bf16(att[t][i] * sigmoid(gate[t * stride + i])), i < width.
cudaError_t attn_gate(uint16_t *att, const float *gate, uint32_t stride, uint32_t T, uint32_t width, cudaStream_t s);

} // namespace dec
} // namespace nf
