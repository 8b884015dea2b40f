// The decoder's forward (see decoder.h for the math), the captured decode graph, and the host side
// of sampling.
#include <stdio.h>
#include <string.h>

#include "impl.cuh"

using namespace nf;
using namespace nf::dec;

namespace {

// A failed step names the op and the layer (UINT32_MAX: none), and either the CUDA error or, for
// the sparse-MoE operator, its own message (why).
struct Fail {
    const char *op;
    uint32_t layer;
    cudaError_t e;
    const char *why;
};

#define TRY(expr, op_, layer_)                                                                                 \
    do {                                                                                                       \
        cudaError_t e_ = (expr);                                                                               \
        if (e_ == cudaSuccess) e_ = cudaGetLastError();                                                        \
        if (e_ != cudaSuccess) return Fail{op_, layer_, e_, nullptr};                                          \
    } while (0)

// q | k | v rows of a.qkv: one GEMV when they are one stacked matrix (a shared codec); at T = 1 with
// int8 activations, one launch of three segments when their codecs differ (the same bits as three
// launches, two kernel boundaries fewer); else three.
// qd, kvd: the q and the k (= v) widths; a row of a.qkv is qd + 2 kvd.
Fail qkv_projection(nf_cuda_decoder *dec, uint32_t l, uint32_t T, uint32_t qd, uint32_t kvd)
{
    const Layer &L = dec->L[l];
    Acts &a = dec->a;
    cudaStream_t s = dec->stream;
    const uint32_t S = qd + 2 * kvd;
    if (L.qkv.codec >= 0) {
        TRY(linear(L.qkv, dec->tab, a.xn, T, a.qkv, S, s), "attn_qkv", l);
        return Fail{nullptr, 0, cudaSuccess, nullptr};
    }
    const A8Seg seg[3] = {{L.q.m, L.q.codec, a.qkv}, {L.k.m, L.k.codec, a.qkv + qd}, {L.v.m, L.v.codec, a.qkv + qd + kvd}};
    if (T == 1 && L.q.a8 && gemv_a8_segs_supported(seg, 3)) {
        TRY(launch_gemv_a8_segs(seg, 3, a.xn, true, s), "attn_qkv", l);
        return Fail{nullptr, 0, cudaSuccess, nullptr};
    }
    TRY(linear(L.q, dec->tab, a.xn, T, a.qkv, S, s), "attn_q", l);
    TRY(linear(L.k, dec->tab, a.xn, T, a.qkv + qd, S, s), "attn_k", l);
    TRY(linear(L.v, dec->tab, a.xn, T, a.qkv + qd + kvd, S, s), "attn_v", l);
    return Fail{nullptr, 0, cudaSuccess, nullptr};
}

Fail attention_block(nf_cuda_decoder *dec, uint32_t l, uint32_t T)
{
    const nf_cuda_decoder_desc &d = dec->d;
    const Layer &L = dec->L[l];
    Acts &a = dec->a;
    cudaStream_t s = dec->stream;
    const uint32_t qd = d.heads * d.head_dim, kvd = d.kv_heads * d.head_dim, S = qd + 2 * kvd;
    Fail f = qkv_projection(dec, l, T, qd, kvd);
    if (f.op) return f;
    const QkvArgs qa{a.qkv, S, L.q_bias, L.k_bias, L.v_bias, L.q_norm, L.k_norm, L.kc, L.vc, dec->rope_tab,
                     d.heads, d.kv_heads, d.head_dim, d.rms_eps};
    // a decode step's attention does the qk norm + rope + cache store itself (one kernel fewer)
    const bool fused = T == 1;
    if (!fused) {
        qkv_rope_store(qa, dec->step, T, s);
        TRY(cudaGetLastError(), "qk norm + rope", l);
    }
    const AttnArgs at{a.qkv, S, L.kc, L.vc, a.att, a.part, dec->ticket, d.heads, d.kv_heads, d.head_dim,
                      attention_splits(T, d.ctx, d.heads), fused, qa};
    TRY(attention(at, dec->step, T, s), "attention", l);
    TRY(linear(L.o, dec->tab, a.att, T, a.delta, d.hidden, s), "attn_output", l);
    return Fail{nullptr, 0, cudaSuccess, nullptr};
}

Fail mlp_block(nf_cuda_decoder *dec, uint32_t l, uint32_t T, bool *delta_bf16)
{
    const Layer &L = dec->L[l];
    Acts &a = dec->a;
    cudaStream_t s = dec->stream;
    if (L.moe) {
        if (nf_sparse_moe_forward(L.moe, a.xn, T, a.moe_out, a.moe_ws, s, &dec->moe_err))
            return Fail{"sparse-MoE", l, cudaErrorUnknown, dec->moe_err.msg};
        *delta_bf16 = true;
        if (dec->trace) { // the workspace is shared by the layers: keep this layer's choice
            const int32_t *ids;
            const float *w;
            nf_sparse_moe_routing(L.moe, a.moe_ws, &ids, &w);
            TRY(cudaMemcpyAsync(dec->trace + (size_t)l * T * dec->top_k, ids, (size_t)T * dec->top_k * 4,
                                cudaMemcpyDeviceToDevice, s), "routing trace", l);
        }
        return Fail{nullptr, 0, cudaSuccess, nullptr};
    }
    if (dec->trace) TRY(cudaMemsetAsync(dec->trace + (size_t)l * T * dec->top_k, 0xff, (size_t)T * dec->top_k * 4, s), "routing trace", l);
    TRY(linear(L.gate, dec->tab, a.xn, T, a.g, dec->dense_inter, s), "ffn_gate", l);
    TRY(linear(L.up, dec->tab, a.xn, T, a.u, dec->dense_inter, s), "ffn_up", l);
    swiglu(a.g, a.u, (size_t)T * dec->dense_inter, a.act, s);
    TRY(linear(L.down, dec->tab, a.act, T, a.delta, dec->d.hidden, s), "ffn_down", l);
    *delta_bf16 = false;
    return Fail{nullptr, 0, cudaSuccess, nullptr};
}

// Everything from the token ids in dec->step to the logits: T tokens, the LM head over every token
// (all) or the last one.
Fail run(nf_cuda_decoder *dec, uint32_t T, bool all)
{
    const nf_cuda_decoder_desc &d = dec->d;
    Acts &a = dec->a;
    cudaStream_t s = dec->stream;
    const size_t H = d.hidden;
    prep_tables(dec->tab, T, s);
    TRY(embed(dec->embd, dec->step, T, d.hidden, a.x, s), "token_embd", UINT32_MAX);
    bool delta_bf16 = false;
    for (uint32_t l = 0; l < d.layers; l++) {
        const float *df = l && !delta_bf16 ? a.delta : nullptr;
        const uint16_t *db = l && delta_bf16 ? a.moe_out : nullptr;
        add_rmsnorm(a.x, df, db, dec->L[l].attn_norm, T, d.hidden, d.rms_eps, a.xn, s);
        Fail f = attention_block(dec, l, T);
        if (f.op) return f;
        add_rmsnorm(a.x, a.delta, nullptr, dec->L[l].ffn_norm, T, d.hidden, d.rms_eps, a.xn, s);
        if ((f = mlp_block(dec, l, T, &delta_bf16)).op) return f;
    }
    add_rmsnorm(a.x, delta_bf16 ? nullptr : a.delta, delta_bf16 ? a.moe_out : nullptr, dec->out_norm, T, d.hidden,
                d.rms_eps, a.xn, s);
    if (all) TRY(linear(dec->head, dec->tab, a.xn, T, a.logits, d.vocab, s), "output", UINT32_MAX);
    else TRY(linear(dec->head, dec->tab1, a.xn + (T - 1) * H, 1, a.logits, d.vocab, s), "output", UINT32_MAX);
    return Fail{nullptr, 0, cudaSuccess, nullptr};
}

nf_status fail(nf_error *err, const Fail &f, uint32_t T)
{
    if (f.why) return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: layer %u (T = %u): %s", f.layer, T, f.why);
    if (f.layer == UINT32_MAX)
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: %s (T = %u): %s", f.op, T, cudaGetErrorString(f.e));
    return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: layer %u %s (T = %u): %s", f.layer, f.op, T,
                        cudaGetErrorString(f.e));
}

// The T = 1 forward as a graph, captured at the first decode step.
nf_status decode_graph(nf_cuda_decoder *dec, nf_error *err)
{
    if (dec->graph) return cudaGraphLaunch(dec->graph, dec->stream) == cudaSuccess
                               ? NF_OK
                               : nf_error_set(err, NF_ERR_CUDA, "cuda decoder: graph launch failed");
    cudaGraph_t g = nullptr;
    if (cudaStreamBeginCapture(dec->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: cannot begin graph capture");
    Fail f = run(dec, 1, false);
    cudaError_t e = cudaStreamEndCapture(dec->stream, &g);
    if (f.op) {
        if (g) cudaGraphDestroy(g);
        return fail(err, f, 1);
    }
    if (e == cudaSuccess) e = cudaGraphInstantiate(&dec->graph, g, 0);
    if (g) cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        dec->graph = nullptr;
        cudaGetLastError();
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: graph capture failed: %s", cudaGetErrorString(e));
    }
    return decode_graph(dec, err);
}

} // namespace

extern "C" nf_status nf_cuda_decoder_set_rope(nf_cuda_decoder *dec, const float *inv_freq, float attn_factor,
                                              nf_error *err)
{
    const uint32_t half = dec->d.head_dim / 2;
    if (cudaStreamSynchronize(dec->stream) != cudaSuccess ||
        cudaMemcpy(dec->rope, inv_freq, half * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(dec->rope + half, &attn_factor, sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: rope table upload failed");
    rope_table(dec->rope, dec->d.ctx, half, dec->rope_tab, dec->stream);
    if (cudaStreamSynchronize(dec->stream) != cudaSuccess)
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: rope table: %s", cudaGetErrorString(cudaGetLastError()));
    return NF_OK;
}

extern "C" nf_status nf_cuda_decoder_forward(nf_cuda_decoder *dec, const int32_t *tokens, uint32_t T, uint32_t pos0,
                                             float *logits, int all_logits, nf_error *err)
{
    const nf_cuda_decoder_desc &d = dec->d;
    if (T == 0 || T > d.chunk || pos0 + T > d.ctx)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: forward of %u tokens at %u (chunk %u, context %u)",
                            T, pos0, d.chunk, d.ctx);
    // the previous step's copy must have read h_step before it is rewritten
    if (cudaEventSynchronize(dec->step_copied) != cudaSuccess)
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: %s", cudaGetErrorString(cudaGetLastError()));
    dec->h_step->pos0 = (int32_t)pos0;
    dec->h_step->T = (int32_t)T;
    memcpy(dec->h_step->tokens, tokens, T * sizeof(int32_t));
    if (cudaMemcpyAsync(dec->step, dec->h_step, sizeof(Step) + T * 4, cudaMemcpyHostToDevice, dec->stream) != cudaSuccess ||
        cudaEventRecord(dec->step_copied, dec->stream) != cudaSuccess)
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: step upload failed");
    nf_status st = NF_OK;
    if (T == 1 && !all_logits && !d.no_graphs) {
        st = decode_graph(dec, err);
    } else {
        Fail f = run(dec, T, all_logits != 0);
        if (f.op) st = fail(err, f, T);
    }
    if (st) return st;
    dec->last_logits = dec->a.logits + (all_logits ? (size_t)(T - 1) * d.vocab : 0);
    dec->last_T = T;
    if (!logits) return NF_OK;
    const size_t n = (all_logits ? (size_t)T : 1) * d.vocab;
    if (cudaMemcpyAsync(logits, dec->a.logits, n * sizeof(float), cudaMemcpyDeviceToHost, dec->stream) != cudaSuccess ||
        cudaStreamSynchronize(dec->stream) != cudaSuccess)
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: forward of %u tokens at %u: %s", T, pos0,
                            cudaGetErrorString(cudaGetLastError()));
    return NF_OK;
}

extern "C" nf_status nf_cuda_decoder_topk(nf_cuda_decoder *dec, uint32_t k, int32_t *ids, float *vals, nf_error *err)
{
    if (!dec->last_logits) return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: no forward has run");
    if (k < 1 || k > kSampleMaxK || k > dec->d.vocab)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: top-k of %u (1..%u)", k, kSampleMaxK);
    cudaError_t e = topk(dec->last_logits, dec->d.vocab, k, dec->tk, dec->stream);
    if (e == cudaSuccess) e = cudaMemcpyAsync(dec->h_ids, dec->tk.ids, k * 4, cudaMemcpyDeviceToHost, dec->stream);
    if (e == cudaSuccess) e = cudaMemcpyAsync(dec->h_vals, dec->tk.vals, k * 4, cudaMemcpyDeviceToHost, dec->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(dec->stream);
    if (e != cudaSuccess) return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: top-k: %s", cudaGetErrorString(e));
    memcpy(ids, dec->h_ids, k * 4);
    memcpy(vals, dec->h_vals, k * 4);
    return NF_OK;
}

extern "C" nf_status nf_cuda_decoder_logits(nf_cuda_decoder *dec, float *logits, nf_error *err)
{
    if (!dec->last_logits) return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: no forward has run");
    if (cudaMemcpyAsync(logits, dec->last_logits, dec->d.vocab * sizeof(float), cudaMemcpyDeviceToHost, dec->stream) !=
            cudaSuccess ||
        cudaStreamSynchronize(dec->stream) != cudaSuccess)
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: logits copy: %s", cudaGetErrorString(cudaGetLastError()));
    return NF_OK;
}

extern "C" nf_status nf_cuda_decoder_routing(nf_cuda_decoder *dec, int32_t *ids, nf_error *err)
{
    if (!dec->trace || !dec->top_k) return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: no routing trace");
    const size_t n = (size_t)dec->d.layers * dec->last_T * dec->top_k;
    if (cudaMemcpyAsync(ids, dec->trace, n * 4, cudaMemcpyDeviceToHost, dec->stream) != cudaSuccess ||
        cudaStreamSynchronize(dec->stream) != cudaSuccess)
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: routing copy: %s", cudaGetErrorString(cudaGetLastError()));
    return NF_OK;
}
