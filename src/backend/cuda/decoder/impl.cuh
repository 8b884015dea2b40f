// The decoder's state (shared by decoder.cu: create/upload, and forward.cu: forward/graph/sampling).
#pragma once
#include "ops.cuh"

extern "C" {
#include "decoder.h"
}

namespace nf {
namespace dec {

struct Layer {
    const float *attn_norm, *ffn_norm;     // device [H]
    const float *q_bias, *k_bias, *v_bias; // device or NULL
    const float *q_norm, *k_norm;          // device [hd] or NULL
    Linear qkv;                            // q, k, v stacked (one GEMV) when they share a row codec, else absent
    Linear q, k, v, o, gate, up, down;     // gate/up/down: dense layers only
    nf_sparse_moe *moe;                    // MoE layers
    uint16_t *kc, *vc;                     // [ctx][kv_heads * hd] bf16
};

// Activations for a chunk of C tokens (device). Shapes: x, delta [C][H] f32; xn, moe_out [C][H] bf16;
// qkv [C][heads*hd + 2*kv*hd] f32; att [C][heads*hd] bf16; g, u [C][D] f32, act [C][D] bf16; logits
// [C][vocab] f32; part: attention split partials.
struct Acts {
    float *x, *delta, *qkv, *g, *u, *logits, *part;
    uint16_t *xn, *moe_out, *att, *act;
    void *moe_ws; // the sparse-MoE workspace (one for all layers: they run one after another)
};

} // namespace dec
} // namespace nf

struct nf_cuda_decoder {
    nf_cuda_decoder_desc d; // shapes (host pointers are not kept)
    uint32_t dense_inter;   // D (0 without dense MLP layers)
    nf::dec::Layer *L;      // [layers]
    nf::dec::Linear embd, head;
    const float *out_norm;  // device [H]
    float *rope;            // device: inv_freq [hd / 2], attn_factor (set_rope's input)
    float2 *rope_tab;       // device [ctx][hd / 2]: the rotations (ops.cuh rope_table)
    unsigned *ticket;       // device: the split attention's tickets (AttnArgs.ticket)
    nf::dec::Acts a;
    nf::dec::DenseTables tab, tab1; // count = T of the forward; count = 1 (the LM head of the last token)
    nf::dec::Step *step;            // device
    nf::dec::Step *h_step;          // pinned host staging for step
    nf::dec::TopK tk;               // device
    int32_t *h_ids;                 // pinned [kSampleMaxK]
    float *h_vals;                  // pinned [kSampleMaxK]
    cudaEvent_t step_copied;        // h_step may be rewritten once this has fired
    cudaStream_t stream;
    cudaGraphExec_t graph;          // the T = 1 forward, captured on first use
    const float *last_logits;       // device row of the last forward's last token
    int32_t *trace;                 // device [layers][T][top_k] with trace_routing, else NULL
    uint32_t top_k, last_T;
    nf_error moe_err;               // the sparse-MoE operator's message when its forward fails
    uint8_t *weights, *buffers, *kv; // the three device allocations
    size_t weight_bytes, moe_bytes, buffer_bytes, kv_bytes;
};
