// The decoder's batched forward (see decoder.h for the math), the captured decode-only graphs, and
// the host side of sampling.
#include <cuda_profiler_api.h>
#include <stdio.h>
#include <stdlib.h>
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

// The token mixer's input products into a.qkv's rows (Layer::in_cols, row stride `row`): one GEMV when
// they are one stacked matrix (a shared codec); at T <= 16 with int8 activations, the first up to
// kMaxA8Segs in one launch of segments when their codecs differ (the same bits as one launch each, kernel
// boundaries fewer); the rest one launch each, at 1 < T <= 16 all over one quantisation of the input.
Fail projections(nf_cuda_decoder *dec, uint32_t l, uint32_t T, uint32_t row)
{
    static const char *const attn_names[kMaxIn] = {"attn_q", "attn_k", "attn_v", "attn_gate"};
    static const char *const gdn_names[kMaxIn] = {"ssm_qkv", "ssm_z", "ssm_ba", ""};
    const Layer &L = dec->L[l];
    Acts &a = dec->a;
    cudaStream_t s = dec->stream;
    const char *const *names = L.is_linear ? gdn_names : attn_names;
    if (L.stacked.codec >= 0) {
        TRY(linear(L.stacked, dec->tab, a.xn, T, a.qkv, row, s), L.is_linear ? "ssm_in" : "attn_qkv", l);
        return Fail{nullptr, 0, cudaSuccess, nullptr};
    }
    // at small T the input is quantised once (by the segments' caller, or the first linear that takes
    // it quantised) for every matrix that takes it so (one cols: the hidden size)
    bool quantised = false;
    int done = 0;
    if (L.in[0].a8 && (T == 1 || linear_takes_quant(L.in[0], T))) {
        A8Seg seg[kMaxA8Segs];
        int n = L.n_in < kMaxA8Segs ? L.n_in : kMaxA8Segs;
        for (int i = 0; i < n; i++) seg[i] = A8Seg{L.in[i].m, L.in[i].codec, a.qkv + L.in_cols[i]};
        while (n > 1 && !gemv_a8_segs_supported(seg, n, T)) n--;
        if (n > 1) {
            quantised = T > 1;
            if (quantised) TRY(linear_quant(dec->tab, a.xn, T, L.in[0].m.cols, s), names[0], l);
            TRY(launch_gemv_a8_segs(seg, n, a.xn, T, dec->tab.xq, dec->tab.xd, row, true, s), names[0], l);
            done = n;
        }
    }
    for (int i = done; i < L.n_in; i++) {
        TRY(linear(L.in[i], dec->tab, a.xn, T, a.qkv + L.in_cols[i], row, s, quantised), names[i], l);
        quantised |= linear_takes_quant(L.in[i], T);
    }
    return Fail{nullptr, 0, cudaSuccess, nullptr};
}

// The grouped decode attention runs from kGqaMinTokens split-kernel tokens on, or when one of them
// sees kGqaMinKeys keys or more; below both, the per-head kernel (H100, docs/perf/kv_page_tokens.md:
// the grouped one is 1.5 - 10x faster from 8 tokens, 3x at one token of 8192 keys, 0.7x at one to
// four tokens of 512 keys).
constexpr uint32_t kGqaMinTokens = 8, kGqaMinKeys = 4096;

// The shape of one forward beyond T: S sequences, n_dec tokens for the split attention, n_tiles
// tiles for the tile attention; decode_only: every sequence has one token (T == S); all: the LM head
// over every token; R > 0: over the R tokens StepLayout::rows names (nf_batch.logit_rows, when it asks
// for neither every token nor one a sequence; else all, or the sequences' last tokens).
struct Shape {
    uint32_t T, S, n_dec, n_tiles;
    bool all, decode_only;
    bool long_keys; // a split-kernel token sees kGqaMinKeys keys or more
    uint32_t R;
};

// The device tables of a forward of this shape (StepLayout): fixed for a given (T, S).
Batch batch_view(const nf_cuda_decoder *dec, uint32_t T, uint32_t S)
{
    const StepLayout l = step_layout(T, S, dec->stride);
    int32_t *p = dec->step;
    return Batch{p + l.tokens, p + l.pos, p + l.seq, p + l.dtok, reinterpret_cast<const int4 *>(p + l.tiles),
                 p + l.last, reinterpret_cast<const uint32_t *>(p + l.pages), dec->stride, dec->pt_shift, p + l.slot};
}

Fail attention_block(nf_cuda_decoder *dec, uint32_t l, const Shape &sh, const Batch &bt)
{
    const uint32_t T = sh.T;
    const nf_cuda_decoder_desc &d = dec->d;
    const Layer &L = dec->L[l];
    Acts &a = dec->a;
    cudaStream_t s = dec->stream;
    const uint32_t qd = d.heads * d.head_dim, kvd = d.kv_heads * d.head_dim, S = a.row_att;
    Fail f = projections(dec, l, T, S);
    if (f.op) return f;
    const QkvArgs qa{a.qkv, S, L.q_bias, L.k_bias, L.v_bias, L.q_norm, L.k_norm, L.kc, L.vc, dec->rope_tab,
                     d.heads, d.kv_heads, d.head_dim, d.rms_eps, d.rope_dim};
    // From kGqaMinTokens split tokens on, the grouped kernel (one CTA per kv head: K/V read once per
    // group; docs/perf/kv_page_tokens.md); below, the per-head one. A decode-only step's per-head
    // attention does the qk norm + rope + cache store itself (one kernel fewer); with several tokens of
    // one sequence, a token's keys include others' new rows: stored first.
    const bool gqa = (sh.n_dec >= kGqaMinTokens || sh.long_keys) && attention_gqa_ok(d.head_dim, d.heads, d.kv_heads);
    const bool fused = sh.decode_only && !gqa;
    if (!fused) {
        qkv_rope_store(qa, bt, T, s);
        TRY(cudaGetLastError(), "qk norm + rope", l);
    }
    AttnArgs at{a.qkv, S, L.kc, L.vc, a.att, a.part, dec->ticket, d.heads, d.kv_heads, d.head_dim,
                sh.n_dec ? attention_splits(sh.n_dec, d.ctx, gqa ? d.kv_heads : d.heads) : 1, fused, qa};
    at.gqa = gqa;
    TRY(attention(at, bt, sh.n_dec, sh.n_tiles, s), "attention", l);
    if (L.gated) TRY(attn_gate(a.att, a.qkv + qd + 2 * kvd, S, T, qd, s), "attention gate", l);
    TRY(linear(L.o, dec->tab, a.att, T, a.delta, d.hidden, s), "attn_output", l);
    return Fail{nullptr, 0, cudaSuccess, nullptr};
}

// A Gated DeltaNet layer's token mixer (gdn.cuh): in_proj, conv + recurrence + gated norm on each
// sequence's state slot, out_proj.
Fail gdn_block(nf_cuda_decoder *dec, uint32_t l, const Shape &sh, const Batch &bt)
{
    const nf_cuda_gdn_shape &g = dec->d.gdn;
    const Layer &L = dec->L[l];
    Acts &a = dec->a;
    Fail f = projections(dec, l, sh.T, a.row_gdn);
    if (f.op) return f;
    const GdnArgs ga{a.qkv, a.row_gdn, L.conv_w, L.dt_bias, L.a_log, L.ssm_norm, dec->slots + L.state_off,
                     dec->slot_floats, g.k_heads, g.v_heads, g.k_dim, g.v_dim, g.conv_k, dec->d.rms_eps, a.att, a.gdn_ws};
    TRY(gdn_forward(ga, bt, sh.T, sh.S, dec->stream), "gated deltanet", l);
    TRY(linear(L.o, dec->tab, a.att, sh.T, a.delta, dec->d.hidden, dec->stream), "ssm_out", l);
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
        if (dec->trace && l < dec->d.layers) { // the workspace is shared by the layers: keep this layer's choice
            const int32_t *ids;
            const float *w;
            nf_sparse_moe_routing(L.moe, a.moe_ws, &ids, &w);
            TRY(cudaMemcpyAsync(dec->trace + (size_t)l * T * dec->top_k, ids, (size_t)T * dec->top_k * 4,
                                cudaMemcpyDeviceToDevice, s), "routing trace", l);
        }
        return Fail{nullptr, 0, cudaSuccess, nullptr};
    }
    if (dec->trace && l < dec->d.layers) TRY(cudaMemsetAsync(dec->trace + (size_t)l * T * dec->top_k, 0xff, (size_t)T * dec->top_k * 4, s), "routing trace", l);
    TRY(linear(L.gate, dec->tab, a.xn, T, a.g, dec->dense_inter, s), "ffn_gate", l);
    TRY(linear(L.up, dec->tab, a.xn, T, a.u, dec->dense_inter, s), "ffn_up", l);
    swiglu(a.g, a.u, (size_t)T * dec->dense_inter, a.act, s);
    TRY(linear(L.down, dec->tab, a.act, T, a.delta, dec->d.hidden, s), "ffn_down", l);
    *delta_bf16 = false;
    return Fail{nullptr, 0, cudaSuccess, nullptr};
}

// Layer l over the T tokens in a.x: its norm (adding the previous layer's delta unless first), token
// mixer, norm, MLP; its delta is left in a.delta or (MoE: *delta_bf16) a.moe_out.
Fail layer_step(nf_cuda_decoder *dec, uint32_t l, const Shape &sh, const Batch &bt, bool first, bool *delta_bf16)
{
    const nf_cuda_decoder_desc &d = dec->d;
    Acts &a = dec->a;
    const float *df = !first && !*delta_bf16 ? a.delta : nullptr;
    const uint16_t *db = !first && *delta_bf16 ? a.moe_out : nullptr;
    add_rmsnorm(a.x, df, db, dec->L[l].attn_norm, sh.T, d.hidden, d.rms_eps, a.xn, dec->stream);
    Fail f = dec->L[l].is_linear ? gdn_block(dec, l, sh, bt) : attention_block(dec, l, sh, bt);
    if (f.op) return f;
    add_rmsnorm(a.x, a.delta, nullptr, dec->L[l].ffn_norm, sh.T, d.hidden, d.rms_eps, a.xn, dec->stream);
    return mlp_block(dec, l, sh.T, delta_bf16);
}

// The last layer's delta added, then the final norm w: bf16 rows into a.xn (the LM head's input) and,
// with xf, the same rows in f32.
void final_norm(nf_cuda_decoder *dec, const float *w, uint32_t T, bool delta_bf16, float *xf)
{
    Acts &a = dec->a;
    add_rmsnorm(a.x, delta_bf16 ? nullptr : a.delta, delta_bf16 ? a.moe_out : nullptr, w, T, dec->d.hidden,
                dec->d.rms_eps, a.xn, dec->stream, 0, xf);
}

// The LM head over a.xn: every token; a decode-only step's tokens are its sequences' last ones; the R
// rows of logit_rows gathered into moe_out (read by the final norm, free now; tab re-counted for R rows:
// the layers' products are done); one sequence's last row is xn's last; else the S last rows gathered
// first.
Fail head(nf_cuda_decoder *dec, const Shape &sh, const Batch &bt)
{
    const nf_cuda_decoder_desc &d = dec->d;
    Acts &a = dec->a;
    cudaStream_t s = dec->stream;
    const uint32_t T = sh.T;
    if (sh.all || sh.decode_only) {
        TRY(linear(dec->head, dec->tab, a.xn, T, a.logits, d.vocab, s), "output", UINT32_MAX);
    } else if (sh.R) {
        prep_tables(dec->tab, sh.R, s);
        gather_rows(a.xn, dec->step + step_layout(T, sh.S, dec->stride).rows, sh.R, d.hidden, a.moe_out, s);
        TRY(linear(dec->head, dec->tab, a.moe_out, sh.R, a.logits, d.vocab, s), "output", UINT32_MAX);
    } else if (sh.S == 1) {
        TRY(linear(dec->head, dec->tab1, a.xn + (size_t)(T - 1) * d.hidden, 1, a.logits, d.vocab, s), "output",
            UINT32_MAX);
    } else {
        prep_tables(dec->tabS, sh.S, s);
        gather_rows(a.xn, bt.last, sh.S, d.hidden, a.xl, s);
        TRY(linear(dec->head, dec->tabS, a.xl, sh.S, a.logits, d.vocab, s), "output", UINT32_MAX);
    }
    return Fail{nullptr, 0, cudaSuccess, nullptr};
}

// Everything from the batch tables in dec->step to the logits: T tokens, the LM head over every token
// (all) or each sequence's last one.
Fail run(nf_cuda_decoder *dec, const Shape &sh)
{
    const nf_cuda_decoder_desc &d = dec->d;
    Acts &a = dec->a;
    const Batch bt = batch_view(dec, sh.T, sh.S);
    prep_tables(dec->tab, sh.T, dec->stream);
    TRY(embed(dec->embd, bt, sh.T, d.hidden, a.x, dec->stream), "token_embd", UINT32_MAX);
    bool delta_bf16 = false;
    for (uint32_t l = 0; l < d.layers; l++) { // not the MTP block's layer (L[layers])
        Fail f = layer_step(dec, l, sh, bt, l == 0, &delta_bf16);
        if (f.op) return f;
    }
    final_norm(dec, dec->out_norm, sh.T, delta_bf16, nullptr);
    return head(dec, sh, bt);
}

// The MTP block (decoder.h) over the batch tables in dec->step and the hidden rows in a.hf: mtp.fc over
// [rmsnorm_e(embed) | rmsnorm_h(hidden)] (two norms into the halves of one bf16 row of 2H), its layer
// L[layers] from x = that product as a model's first layer from the embedding, its output norm (bf16 for
// the head, f32 into a.hf for hidden_out), the model's LM head.
Fail run_mtp(nf_cuda_decoder *dec, const Shape &sh)
{
    const nf_cuda_decoder_desc &d = dec->d;
    Acts &a = dec->a;
    cudaStream_t s = dec->stream;
    const uint32_t T = sh.T, H = d.hidden, l = d.layers;
    const Batch bt = batch_view(dec, T, sh.S);
    prep_tables(dec->tab, T, s);
    TRY(embed(dec->embd, bt, T, H, a.x, s), "token_embd", l);
    add_rmsnorm(a.x, nullptr, nullptr, dec->mtp_norm_embd, T, H, d.rms_eps, a.cat, s, 2 * H);
    add_rmsnorm(a.hf, nullptr, nullptr, dec->mtp_norm_hidden, T, H, d.rms_eps, a.cat + H, s, 2 * H);
    TRY(linear(dec->mtp_fc, dec->tab, a.cat, T, a.x, H, s), "mtp.fc", l);
    bool delta_bf16 = false;
    Fail f = layer_step(dec, l, sh, bt, true, &delta_bf16);
    if (f.op) return f;
    final_norm(dec, dec->mtp_out_norm, T, delta_bf16, a.hf);
    return head(dec, sh, bt);
}

nf_status fail(nf_error *err, const Fail &f, uint32_t T)
{
    if (f.why) return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: layer %u (T = %u): %s", f.layer, T, f.why);
    if (f.layer == UINT32_MAX)
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: %s (T = %u): %s", f.op, T, cudaGetErrorString(f.e));
    return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: layer %u %s (T = %u): %s", f.layer, f.op, T,
                        cudaGetErrorString(f.e));
}

// The decode-only forward of S sequences as a graph, captured at the first such step and replayed
// at every later one (the tables it reads lie where step_layout(S, S) puts them); a second graph per
// S once a token sees kGqaMinKeys keys (the attention kernel differs).
nf_status decode_graph(nf_cuda_decoder *dec, const Shape &sh, nf_error *err)
{
    cudaGraphExec_t &ge = dec->graphs[sh.S + (sh.long_keys ? dec->d.max_seqs + 1 : 0)];
    if (ge) return cudaGraphLaunch(ge, dec->stream) == cudaSuccess
                       ? NF_OK
                       : nf_error_set(err, NF_ERR_CUDA, "cuda decoder: graph launch failed");
    cudaGraph_t g = nullptr;
    if (cudaStreamBeginCapture(dec->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: cannot begin graph capture");
    Fail f = run(dec, sh);
    cudaError_t e = cudaStreamEndCapture(dec->stream, &g);
    if (f.op) {
        if (g) cudaGraphDestroy(g);
        return fail(err, f, sh.T);
    }
    if (e == cudaSuccess) e = cudaGraphInstantiate(&ge, g, 0);
    if (g) cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        ge = nullptr;
        cudaGetLastError();
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: graph capture failed: %s", cudaGetErrorString(e));
    }
    return decode_graph(dec, sh, err);
}

// A batch the forward can run: counts, seq_start, positions and the page ids it touches.
// slots: the batch runs the model's GDN layers (the MTP block's has none, and takes no slots)
nf_status check_batch(const nf_cuda_decoder *dec, const nf_batch *b, bool slots, nf_error *err)
{
    const nf_cuda_decoder_desc &d = dec->d;
    const uint32_t T = b->n_tokens, S = b->n_seqs;
    if (!T || T > d.chunk || !S || S > d.max_seqs || !b->tokens || !b->seq_start || !b->pos0 || !b->pages)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: a batch of %u tokens of %u sequences (chunk %u, "
                            "max_seqs %u) or a missing table", T, S, d.chunk, d.max_seqs);
    if (b->seq_start[0] != 0 || b->seq_start[S] != T)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: seq_start runs %u .. %u, not 0 .. %u",
                            b->seq_start[0], b->seq_start[S], T);
    for (uint32_t i = 0; i < S; i++) {
        const uint32_t n = b->seq_start[i + 1] - b->seq_start[i], end = b->pos0[i] + n;
        if (b->seq_start[i + 1] <= b->seq_start[i] || b->seq_start[i + 1] > T || b->pos0[i] > d.ctx || end > d.ctx)
            return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: sequence %u: tokens %u .. %u at %u (context %u)", i,
                                b->seq_start[i], b->seq_start[i + 1], b->pos0[i], d.ctx);
        if (b->logit_rows && (!b->logit_rows[i] || b->logit_rows[i] > n))
            return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: sequence %u asks for %u logits rows of its %u "
                                "tokens", i, b->logit_rows[i], n);
        const uint32_t np = (end + d.page_tokens - 1) / d.page_tokens;
        if (np > b->page_stride && S > 1)
            return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: page_stride %u below the %u pages of sequence %u",
                                b->page_stride, np, i);
        for (uint32_t p = 0; p < np; p++)
            if (b->pages[(size_t)i * b->page_stride + p] >= d.kv_pages)
                return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: sequence %u page %u is %u (pool of %u)", i, p,
                                    b->pages[(size_t)i * b->page_stride + p], d.kv_pages);
    }
    nf_status st = dec->slots && slots ? nf_batch_check_slots(b, d.max_seqs, dec->slot_pos, "cuda decoder", err) : NF_OK;
    if (st) return st;
    for (uint32_t t = 0; t < T; t++)
        if (b->tokens[t] < 0 || (uint32_t)b->tokens[t] >= d.vocab)
            return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: token %u is id %d (vocabulary %u)", t, b->tokens[t],
                                d.vocab);
    return NF_OK;
}

struct TileSort {
    int32_t t0, rows, seq, pos;
};
// the most keys first: the longest CTAs start first and the short ones fill the tail
int tile_cmp(const void *x, const void *y)
{
    const TileSort *a = (const TileSort *)x, *b = (const TileSort *)y;
    const int32_t ka = a->pos + a->rows, kb = b->pos + b->rows;
    return ka != kb ? (ka < kb) - (ka > kb) : (a->t0 > b->t0) - (a->t0 < b->t0);
}

// Writes the batch tables into the pinned staging (StepLayout) and returns the forward's shape.
Shape stage_batch(nf_cuda_decoder *dec, const nf_batch *b)
{
    const uint32_t T = b->n_tokens, S = b->n_seqs, pt = dec->d.page_tokens;
    const StepLayout l = step_layout(T, S, dec->stride);
    int32_t *h = dec->h_step;
    memcpy(h + l.tokens, b->tokens, T * sizeof(int32_t));
    const uint32_t R = attention_tile_rows(dec->d.head_dim, dec->a.row_att);
    Shape sh{T, S, 0, 0, b->all_logits != 0 && !b->logit_rows, T == S, false, 0};
    TileSort *tiles = reinterpret_cast<TileSort *>(h + l.tiles);
    for (uint32_t i = 0; i < S; i++) {
        const uint32_t t0 = b->seq_start[i], n = b->seq_start[i + 1] - t0, p0 = b->pos0[i];
        for (uint32_t j = 0; j < n; j++) h[l.pos + t0 + j] = (int32_t)(p0 + j), h[l.seq + t0 + j] = (int32_t)i;
        h[l.last + i] = (int32_t)(t0 + n - 1);
        h[l.slot + i] = b->state_slot ? (int32_t)b->state_slot[i] : 0;
        dec->h_last[i] = (int32_t)(t0 + n - 1);
        if (n >= kAttnTileMin) { // the tiles start at the sequence's first token: the bits of the chunk alone
            for (uint32_t j = 0; j < n; j += R)
                tiles[sh.n_tiles++] = TileSort{(int32_t)(t0 + j), (int32_t)(n - j < R ? n - j : R), (int32_t)i, (int32_t)(p0 + j)};
        } else {
            for (uint32_t j = 0; j < n; j++) h[l.dtok + sh.n_dec++] = (int32_t)(t0 + j);
            if (p0 + n >= kGqaMinKeys) sh.long_keys = true;
        }
        const uint32_t np = (p0 + n + pt - 1) / pt;
        memcpy(h + l.pages + (size_t)i * dec->stride, b->pages + (size_t)i * b->page_stride, np * sizeof(uint32_t));
    }
    if (sh.n_tiles > 1) qsort(tiles, sh.n_tiles, sizeof *tiles, tile_cmp);
    if (b->logit_rows) { // the last logit_rows[i] tokens of each sequence, in batch order
        uint32_t nr = 0;
        bool every = true;
        for (uint32_t i = 0; i < S; i++) {
            const uint32_t end = b->seq_start[i + 1], r = b->logit_rows[i];
            every = every && r == end - b->seq_start[i];
            for (uint32_t j = 0; j < r; j++) h[l.rows + nr + j] = (int32_t)(end - r + j);
            nr += r;
        }
        // nr == S: one row a sequence, the plain layout (a decode-only step stays a graph step); every
        // token: the all_logits layout (h_last as it is); else the gathered rows
        if (nr > S && every) {
            sh.all = true;
        } else if (nr > S) {
            sh.R = nr;
            for (uint32_t i = 0, r = 0; i < S; i++) r += b->logit_rows[i], dec->h_last[i] = (int32_t)(r - 1);
        }
    }
    return sh;
}

// The batch tables staged and uploaded (the previous step's copy must have read h_step before it is
// rewritten): the whole layout up to the last sequence's page row (the tables a captured graph reads),
// and the logits rows' tokens when there are any.
nf_status upload_batch(nf_cuda_decoder *dec, const nf_batch *b, Shape *sh, nf_error *err)
{
    if (cudaEventSynchronize(dec->step_copied) != cudaSuccess)
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: %s", cudaGetErrorString(cudaGetLastError()));
    *sh = stage_batch(dec, b);
    const StepLayout sl = step_layout(sh->T, sh->S, dec->stride);
    const size_t bytes = (sl.rows + sh->R) * 4;
    if (cudaMemcpyAsync(dec->step, dec->h_step, bytes, cudaMemcpyHostToDevice, dec->stream) != cudaSuccess ||
        cudaEventRecord(dec->step_copied, dec->stream) != cudaSuccess)
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: step upload failed");
    return NF_OK;
}

} // namespace

extern "C" nf_status nf_cuda_decoder_set_rope(nf_cuda_decoder *dec, const float *inv_freq, float attn_factor,
                                              nf_error *err)
{
    const uint32_t half = dec->d.rope_dim / 2;
    // on the decoder's stream: a pageable cudaMemcpy on the legacy stream may return before its DMA
    // lands, and rope_table (on the non-blocking stream) would race it
    if (cudaStreamSynchronize(dec->stream) != cudaSuccess ||
        cudaMemcpyAsync(dec->rope, inv_freq, half * sizeof(float), cudaMemcpyHostToDevice, dec->stream) != cudaSuccess ||
        cudaMemcpyAsync(dec->rope + half, &attn_factor, sizeof(float), cudaMemcpyHostToDevice, dec->stream) != cudaSuccess)
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: rope table upload failed");
    rope_table(dec->rope, dec->d.ctx, half, dec->rope_tab, dec->stream);
    if (cudaStreamSynchronize(dec->stream) != cudaSuccess)
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: rope table: %s", cudaGetErrorString(cudaGetLastError()));
    return NF_OK;
}

extern "C" nf_status nf_cuda_decoder_forward_batch(nf_cuda_decoder *dec, const nf_batch *b, float *logits, nf_error *err)
{
    const nf_cuda_decoder_desc &d = dec->d;
    dec->has_logits = dec->has_x = 0; // until this forward has finished: a failed one leaves none to sample
    nf_status st = check_batch(dec, b, true, err);
    if (st) return st;
    Shape sh;
    if ((st = upload_batch(dec, b, &sh, err))) return st;
    // NF_PROFILE_FORWARD=k: the profiler API's range around forward k (0-based) of the process, so
    // `ncu --profile-from-start off` (or nsys --capture-range=cudaProfilerApi) sees one step's kernels
    // after a long prefill (docs/gpu_engine.md, "Profiling one step")
    static const long profile_at = getenv("NF_PROFILE_FORWARD") ? atol(getenv("NF_PROFILE_FORWARD")) : -1;
    static long forwards = 0;
    const bool profiled = forwards++ == profile_at;
    if (profiled) cudaProfilerStart();
    if (sh.decode_only && !sh.all && !sh.R && !d.no_graphs) {
        st = decode_graph(dec, sh, err);
    } else {
        Fail f = run(dec, sh);
        if (f.op) st = fail(err, f, sh.T);
    }
    if (profiled) cudaStreamSynchronize(dec->stream), cudaProfilerStop();
    if (st) return st;
    for (uint32_t i = 0; dec->slots && i < sh.S; i++)
        dec->slot_pos[b->state_slot[i]] = b->pos0[i] + (b->seq_start[i + 1] - b->seq_start[i]);
    dec->has_logits = dec->has_x = 1;
    dec->last_rows = sh.all || sh.R;
    dec->last_T = sh.T;
    dec->last_S = sh.S;
    if (!logits) return NF_OK;
    const size_t n = (size_t)(sh.R ? sh.R : sh.all ? sh.T : sh.S) * d.vocab;
    if (cudaMemcpyAsync(logits, dec->a.logits, n * sizeof(float), cudaMemcpyDeviceToHost, dec->stream) != cudaSuccess ||
        cudaStreamSynchronize(dec->stream) != cudaSuccess)
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: forward of %u tokens of %u sequences: %s", sh.T, sh.S,
                            cudaGetErrorString(cudaGetLastError()));
    return NF_OK;
}

extern "C" nf_status nf_cuda_decoder_topk(nf_cuda_decoder *dec, uint32_t k, int32_t *ids, float *vals, nf_error *err)
{
    if (!dec->has_logits) return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: no forward has run");
    if (k < 1 || k > kSampleMaxK || k > dec->d.vocab)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: top-k of %u (1..%u)", k, kSampleMaxK);
    const uint32_t S = dec->last_S;
    const size_t V = dec->d.vocab;
    cudaError_t e = cudaSuccess;
    if (!dec->last_rows) {
        e = topk(dec->a.logits, dec->d.vocab, V, S, k, dec->tk, dec->stream);
    } else { // each sequence's last row of the [T][vocab] or [R][vocab] logits, one row at a time
        for (uint32_t i = 0; i < S && e == cudaSuccess; i++) {
            const TopK t{dec->tk.ids + (size_t)i * k, dec->tk.vals + (size_t)i * k, dec->tk.cand_vals, dec->tk.cand_ids};
            e = topk(dec->a.logits + (size_t)dec->h_last[i] * V, dec->d.vocab, V, 1, k, t, dec->stream);
        }
    }
    if (e == cudaSuccess) e = cudaMemcpyAsync(dec->h_ids, dec->tk.ids, (size_t)S * k * 4, cudaMemcpyDeviceToHost, dec->stream);
    if (e == cudaSuccess) e = cudaMemcpyAsync(dec->h_vals, dec->tk.vals, (size_t)S * k * 4, cudaMemcpyDeviceToHost, dec->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(dec->stream);
    if (e != cudaSuccess) return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: top-k: %s", cudaGetErrorString(e));
    memcpy(ids, dec->h_ids, (size_t)S * k * 4);
    memcpy(vals, dec->h_vals, (size_t)S * k * 4);
    return NF_OK;
}

extern "C" nf_status nf_cuda_decoder_logits(nf_cuda_decoder *dec, float *logits, nf_error *err)
{
    if (!dec->has_logits) return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: no forward has run");
    const size_t V = dec->d.vocab;
    cudaError_t e = cudaSuccess;
    if (!dec->last_rows) // the rows are the sequences'
        e = cudaMemcpyAsync(logits, dec->a.logits, dec->last_S * V * sizeof(float), cudaMemcpyDeviceToHost, dec->stream);
    for (uint32_t i = 0; dec->last_rows && i < dec->last_S && e == cudaSuccess; i++)
        e = cudaMemcpyAsync(logits + i * V, dec->a.logits + (size_t)dec->h_last[i] * V, V * sizeof(float),
                            cudaMemcpyDeviceToHost, dec->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(dec->stream);
    if (e != cudaSuccess) return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: logits copy: %s", cudaGetErrorString(e));
    return NF_OK;
}

static_assert(sizeof(nf_penalty) == sizeof(Penalty), "the C and device penalty records are one layout");

extern "C" nf_status nf_cuda_decoder_penalize(nf_cuda_decoder *dec, const nf_penalty *pen, const uint32_t *start,
                                               const int32_t *ids, const uint32_t *counts, nf_error *err)
{
    if (!dec->has_logits) return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: no forward has run");
    const uint32_t S = dec->last_S, V = dec->d.vocab;
    if (start[0] != 0)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: penalty pairs start at %u, not 0", start[0]);
    for (uint32_t i = 0; i < S; i++)
        if (start[i + 1] < start[i])
            return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: penalty pairs of sequence %u run backwards", i);
    const size_t n = start[S];
    for (size_t j = 0; j < n; j++)
        if (ids[j] < 0 || (uint32_t)ids[j] >= V)
            return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: penalty pair %zu names id %d (vocabulary %u)", j,
                                ids[j], V);
    // one upload: start [S + 1], rows [S], penalties [S][3], ids [n], counts [n] (int32 words)
    const size_t o_rows = S + 1, o_pen = o_rows + S, o_ids = o_pen + 3 * (size_t)S, o_cnt = o_ids + n, words = o_cnt + n;
    if (words > dec->pen_words) {
        cudaFree(dec->pen);
        dec->pen = nullptr, dec->pen_words = 0;
        if (cudaMalloc(&dec->pen, words * 4) != cudaSuccess) {
            cudaGetLastError();
            return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: cannot allocate %zu penalty pairs", n);
        }
        dec->pen_words = words;
    }
    int32_t *h = (int32_t *)malloc(words * 4);
    if (!h) return nf_error_set(err, NF_ERR_NOMEM, "cuda decoder: out of host memory");
    memcpy(h, start, (S + 1) * 4);
    for (uint32_t i = 0; i < S; i++) h[o_rows + i] = dec->last_rows ? dec->h_last[i] : (int32_t)i;
    memcpy(h + o_pen, pen, (size_t)S * sizeof *pen);
    memcpy(h + o_ids, ids, n * 4);
    memcpy(h + o_cnt, counts, n * 4);
    // from pageable memory: the copy has read h when it returns
    cudaError_t e = cudaMemcpyAsync(dec->pen, h, words * 4, cudaMemcpyHostToDevice, dec->stream);
    free(h);
    const int32_t *d = dec->pen;
    if (e == cudaSuccess)
        e = penalize(dec->a.logits, V, S, d + o_rows, reinterpret_cast<const uint32_t *>(d),
                     reinterpret_cast<const Penalty *>(d + o_pen), d + o_ids, reinterpret_cast<const uint32_t *>(d + o_cnt),
                     V, dec->stream);
    if (e != cudaSuccess) return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: penalties: %s", cudaGetErrorString(e));
    return NF_OK;
}

extern "C" nf_status nf_cuda_decoder_copy_page(nf_cuda_decoder *dec, uint32_t dst, uint32_t src, nf_error *err)
{
    const nf_cuda_decoder_desc &d = dec->d;
    if (dst >= d.kv_pages || src >= d.kv_pages)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: copy of page %u to %u (pool of %u)", src, dst, d.kv_pages);
    if (dst == src) return NF_OK;
    // [attention layer][K, V] pools of kv_pages pages: 2 * attention layers rows of one page each, a pool apart
    const size_t page = (size_t)d.page_tokens * d.kv_heads * d.head_dim * 2, pitch = page * d.kv_pages;
    if (!dec->attn_layers) return NF_OK;
    if (cudaMemcpy2DAsync(dec->kv + dst * page, pitch, dec->kv + src * page, pitch, page, 2 * (size_t)dec->attn_layers,
                          cudaMemcpyDeviceToDevice, dec->stream) != cudaSuccess)
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: page copy: %s", cudaGetErrorString(cudaGetLastError()));
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

// Slot i's floats on the device: the forward's, a spare (max_seqs ..) or a snapshot (2 max_seqs ..); each
// group of spares allocated at the first use of one of them.
static nf_status slot_at(nf_cuda_decoder *dec, uint32_t i, float **out, nf_error *err)
{
    const size_t n = dec->d.max_seqs, ns = dec->d.state_snaps, sf = dec->slot_floats;
    if (!dec->slots) return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: this model has no state slots");
    if (i >= 2 * n + ns)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: state slot %u is not below 2 max_seqs + "
                            "state_snaps = %zu", i, 2 * n + ns);
    float **group = i < n ? &dec->slots : i < 2 * n ? &dec->spares : &dec->snaps;
    const size_t first = i < n ? 0 : i < 2 * n ? n : 2 * n, count = i < 2 * n ? n : ns;
    if (!*group && cudaMalloc(group, count * sf * sizeof(float)) != cudaSuccess) {
        cudaGetLastError();
        *group = nullptr;
        return nf_error_set(err, NF_ERR_NOMEM, "cuda decoder: cannot allocate %zu MiB for %zu spare state slots",
                            count * sf * sizeof(float) >> 20, count);
    }
    *out = *group + (i - first) * sf;
    return NF_OK;
}

extern "C" nf_status nf_cuda_decoder_slot_copy(nf_cuda_decoder *dec, uint32_t dst, uint32_t src, nf_error *err)
{
    float *d = nullptr, *f = nullptr;
    nf_status st = slot_at(dec, dst, &d, err);
    if (st || (st = slot_at(dec, src, &f, err))) return st;
    // ordered on the stream before the next forward, which is all a rollback needs: nothing waits here
    if (d != f && cudaMemcpyAsync(d, f, dec->slot_floats * sizeof(float), cudaMemcpyDeviceToDevice, dec->stream) != cudaSuccess)
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: state slot %u to %u: %s", src, dst,
                            cudaGetErrorString(cudaGetLastError()));
    dec->slot_pos[dst] = dec->slot_pos[src];
    return NF_OK;
}

extern "C" nf_status nf_cuda_decoder_hidden(nf_cuda_decoder *dec, float *out, nf_error *err)
{
    const nf_cuda_decoder_desc &d = dec->d;
    if (!dec->a.hf)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "cuda decoder: hidden states are kept for models with an MTP "
                            "block only");
    if (!dec->has_x)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: no forward's hidden states (none ran, or the MTP "
                            "block ran since)");
    add_rmsnorm(dec->a.x, nullptr, nullptr, dec->out_norm, dec->last_T, d.hidden, d.rms_eps, nullptr, dec->stream, 0,
                dec->a.hf);
    if (cudaMemcpyAsync(out, dec->a.hf, (size_t)dec->last_T * d.hidden * sizeof(float), cudaMemcpyDeviceToHost,
                        dec->stream) != cudaSuccess ||
        cudaStreamSynchronize(dec->stream) != cudaSuccess)
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: hidden states: %s", cudaGetErrorString(cudaGetLastError()));
    return NF_OK;
}

// The MTP block's outputs to the host: logits rows 0 .. n - 1 (as a forward's), hidden_out every token's
// row of a.hf (all) or each sequence's last.
static cudaError_t mtp_results(nf_cuda_decoder *dec, const Shape &sh, float *logits, float *hidden_out)
{
    const bool all = sh.all;
    const size_t H = dec->d.hidden, n = all ? sh.T : sh.S;
    cudaError_t e = cudaMemcpyAsync(logits, dec->a.logits, n * dec->d.vocab * sizeof(float), cudaMemcpyDeviceToHost,
                                    dec->stream);
    if (hidden_out && all && e == cudaSuccess)
        e = cudaMemcpyAsync(hidden_out, dec->a.hf, n * H * sizeof(float), cudaMemcpyDeviceToHost, dec->stream);
    for (size_t i = 0; hidden_out && !all && i < n && e == cudaSuccess; i++)
        e = cudaMemcpyAsync(hidden_out + i * H, dec->a.hf + (size_t)dec->h_last[i] * H, H * sizeof(float),
                            cudaMemcpyDeviceToHost, dec->stream);
    return e == cudaSuccess ? cudaStreamSynchronize(dec->stream) : e;
}

extern "C" nf_status nf_cuda_decoder_mtp(nf_cuda_decoder *dec, const nf_batch *b, const float *hidden, float *logits,
                                         float *hidden_out, nf_error *err)
{
    const nf_cuda_decoder_desc &d = dec->d;
    if (dec->mtp_fc.codec < 0) return nf_error_set(err, NF_ERR_UNSUPPORTED, "cuda decoder: this model has no MTP block");
    if (!hidden || !logits || b->logit_rows)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: the MTP block needs hidden states and a logits "
                            "buffer, and takes all_logits or each sequence's last row (no logit_rows)");
    nf_status st = check_batch(dec, b, false, err);
    if (st) return st;
    // the block's buffers are the forward's: its logits and residual stream are gone from here on
    dec->has_logits = dec->has_x = 0;
    Shape sh;
    if ((st = upload_batch(dec, b, &sh, err))) return st;
    // from pageable memory: the copy has read `hidden` when it returns
    if (cudaMemcpyAsync(dec->a.hf, hidden, (size_t)sh.T * d.hidden * sizeof(float), cudaMemcpyHostToDevice,
                        dec->stream) != cudaSuccess)
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: MTP hidden upload: %s", cudaGetErrorString(cudaGetLastError()));
    const Fail f = run_mtp(dec, sh);
    if (f.op) {
        st = fail(err, f, sh.T);
        nf_error_prefix(err, "MTP block");
        return st;
    }
    const cudaError_t e = mtp_results(dec, sh, logits, hidden_out);
    if (e != cudaSuccess)
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: MTP block over %u tokens of %u sequences: %s", sh.T, sh.S,
                            cudaGetErrorString(e));
    return NF_OK;
}
