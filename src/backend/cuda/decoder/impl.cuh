// The decoder's state (shared by decoder.cu: create/upload, and forward.cu: forward/graph/sampling).
#pragma once
#include "gdn.cuh"

extern "C" {
#include "decoder.h"
}

namespace nf {
namespace dec {

// The token mixer's input matrices, one row buffer (a.qkv, row stride Acts::row) for their outputs side
// by side. Attention: q, k, v [, attn_gate] (q | k | v | gate); Gated DeltaNet: ssm_qkv, ssm_z, ssm_ba
// (q | k | v channels | z | b | a).
constexpr int kMaxIn = 4;
struct Layer {
    const float *attn_norm, *ffn_norm;     // device [H]
    const float *q_bias, *k_bias, *v_bias; // device or NULL
    const float *q_norm, *k_norm;          // device [hd] or NULL
    Linear stacked;                        // in[0 .. n_in) stacked (one GEMV) when they share a row codec, else absent
    Linear in[kMaxIn];                     // each alone (absent when stacked)
    uint32_t in_cols[kMaxIn];              // each one's first column in the row buffer
    int n_in;
    Linear o, gate, up, down;              // o: attn_output or ssm_out; gate/up/down: dense layers only
    nf_sparse_moe *moe;                    // MoE layers
    uint16_t *kc, *vc;                     // attention layers' K and V pools: [kv_pages][page_tokens][kv_heads * hd] bf16
    bool is_linear, gated;                 // a Gated DeltaNet layer; an attention layer with attn_gate
    const float *conv_w, *dt_bias, *a_log, *ssm_norm; // GDN: device [conv_dim][K], [Hv] x2, [dv]
    size_t state_off;                      // GDN: this layer's floats within a state slot
};

// Activations for a chunk of C tokens (device). Shapes: x, delta [C][H] f32; xn, moe_out [C][H] bf16;
// qkv [C][row] f32 (the token mixer's projections: Layer::in_cols); att [C][max(heads*hd, Vd)] bf16
// (the attention output, or the GDN's gated norm output); g, u [C][D] f32, act [C][D] bf16; logits
// [C][vocab] f32; part: attention split partials; xl [max_seqs][H] bf16: the sequences' last rows
// for the LM head. moe_out is free once the final norm has read it: the LM head's input rows of a
// forward with nf_batch.logit_rows are gathered there (up to T of them). With an MTP block: hf [C][H]
// f32 (the hidden rows: the block's input, its output, the `hidden` op's output), cat [C][2H] bf16
// (mtp.fc's input); else NULL. gdn_ws: the GDN chunked form's workspace (gdn.cuh gdn_ws_floats).
struct Acts {
    float *x, *delta, *qkv, *g, *u, *logits, *part, *hf, *gdn_ws;
    uint32_t row_att, row_gdn; // qkv's row stride for attention layers ([q | k | v | gate]) and for GDN layers
    uint16_t *xn, *moe_out, *att, *act, *xl, *cat;
    void *moe_ws; // the sparse-MoE workspace (one for all layers: they run one after another)
};

// Where the batch tables of a forward of T tokens and S sequences lie in the step buffer (int32
// units; the host staging and the device buffer share it). Only (T, S) decide the offsets, so a graph
// captured for a decode-only step of S sequences reads the right tables at every later such step.
// rows: the logits rows' tokens of a forward with nf_batch.logit_rows (up to T; after the pages, so the
// tables a decode graph reads keep their offsets).
struct StepLayout {
    size_t tokens, pos, seq, dtok, tiles, last, slot, pages, rows, total;
};
inline StepLayout step_layout(uint32_t T, uint32_t S, uint32_t stride)
{
    StepLayout l;
    l.tokens = 0, l.pos = T, l.seq = 2 * (size_t)T, l.dtok = 3 * (size_t)T;
    l.tiles = (4 * (size_t)T + 3) & ~(size_t)3;           // int4 alignment
    l.last = l.tiles + 4 * ((size_t)T / kAttnTileMin + S);  // tiles: at most T / 16 + S (each >= 16 rows but a sequence's last)
    l.slot = l.last + S;
    l.pages = l.slot + S;
    l.rows = l.pages + (size_t)S * stride;
    l.total = l.rows + T;
    return l;
}

} // namespace dec
} // namespace nf

struct nf_cuda_decoder {
    nf_cuda_decoder_desc d; // shapes (host pointers are not kept)
    uint32_t dense_inter;   // D (0 without dense MLP layers)
    // [n_layers]: the model's layers, then the MTP block's (L[layers], when there is one): one more
    // attention layer with its own KV pool, so the per-layer code (upload, attention, MoE, copy_page)
    // serves it unchanged and only run() stops before it
    nf::dec::Layer *L;
    uint32_t n_layers;
    nf::dec::Linear mtp_fc;                               // the MTP block's, codec -1 without one
    const float *mtp_norm_embd, *mtp_norm_hidden, *mtp_out_norm; // device [H]
    nf::dec::Linear embd, head;
    const float *out_norm;  // device [H]
    float *rope;            // device: inv_freq [hd / 2], attn_factor (set_rope's input)
    float2 *rope_tab;       // device [ctx][hd / 2]: the rotations (ops.cuh rope_table)
    unsigned *ticket;       // device: the split attention's tickets (AttnArgs.ticket)
    nf::dec::Acts a;
    // count = T of the forward; count = 1 (a single sequence's last token); count = S (the LM head
    // over S > 1 sequences' last tokens)
    nf::dec::DenseTables tab, tab1, tabS;
    uint32_t pt_shift;              // log2(page_tokens)
    uint32_t stride;                // page-table entries a sequence has: ceil(ctx / page_tokens)
    int32_t *step;                  // device: the batch tables (StepLayout)
    int32_t *h_step;                // pinned host staging for step
    nf::dec::TopK tk;               // device
    int32_t *h_ids;                 // pinned [max_seqs][kSampleMaxK]
    float *h_vals;                  // pinned [max_seqs][kSampleMaxK]
    cudaEvent_t step_copied;        // h_step may be rewritten once this has fired
    cudaStream_t stream;
    cudaGraphExec_t *graphs;        // [2][max_seqs + 1]: the decode-only forward of S sequences (short, long
                                    // keys: forward.cu kGqaMinKeys), captured on first use
    int32_t *h_last;                // host [max_seqs]: each sequence's last-token row of a.logits (last_rows)
    int has_logits;                 // a forward has run
    int has_x;                      // a.x holds the last forward's final residual stream (`hidden`)
    int last_rows;                  // it kept more rows than one per sequence (all_logits, logit_rows): the
                                    // sequences' last-token rows are h_last's, not 0 .. S - 1
    int32_t *trace;                 // device [layers][T][top_k] with trace_routing, else NULL
    int32_t *pen;                   // device: penalize's tables (grown on demand), pen_words int32 words
    size_t pen_words;
    uint32_t top_k, last_T, last_S;
    nf_error moe_err;               // the sparse-MoE operator's message when its forward fails
    uint8_t *weights, *buffers, *kv; // the three device allocations
    size_t weight_bytes, moe_bytes, buffer_bytes, kv_bytes;
    uint32_t attn_layers;           // layers with KV pools (all but the GDN layers)
    float *slots;                   // device [max_seqs][slot_floats]: GDN layers' states (hybrids), else NULL
    float *spares;                  // device [max_seqs][slot_floats]: slot_copy's slots max_seqs.., at first use
    float *snaps;                   // device [state_snaps][slot_floats]: slots 2 max_seqs.. (prefix cache), at first use
    size_t slot_floats;
    uint32_t *slot_pos;             // host [2 max_seqs + state_snaps]: the positions each slot (and spare) has absorbed
};
