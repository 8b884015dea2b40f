// The decoder's creation: weights uploaded in the kernels' layout (one allocation for the dense
// matrices and vectors, one per sparse-MoE bank), the bf16 KV page pool, and the chunk's buffers
// carved from one allocation.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "impl.cuh"
#include "rope.cuh"

extern "C" {
#include "base/arena.h"
#include "codec/codec.h"
}

using namespace nf;
using namespace nf::dec;

namespace {

size_t up256(size_t n) { return (n + 255) & ~(size_t)255; }

bool device_codec(int c)
{
    return c == NF_CODEC_BF16 || c == NF_CODEC_Q8_0 || c == NF_CODEC_Q4_K || c == NF_CODEC_Q5_K ||
           c == NF_CODEC_Q6_K || c == NF_CODEC_NVFP4 || c == NF_CODEC_Q2_K || c == NF_CODEC_Q3_K ||
           c == NF_CODEC_IQ4_XS || c == NF_CODEC_IQ4_NL;
}

// The dense weights in two passes over the same walk: sizing (dst == NULL) then upload.
struct Uploader {
    uint8_t *base;
    size_t off;
    nf_error *err;
    bool a8; // the desc's allow_a8

    nf_status matrix(const nf_moe_matrix *mm, const char *what, uint32_t layer, Linear *L)
    {
        char name[64];
        if (layer == UINT32_MAX) snprintf(name, sizeof name, "%s", what);
        else snprintf(name, sizeof name, "layer %u %s", layer, what);
        memset(L, 0, sizeof *L);
        L->codec = -1;
        if (mm->codec < 0) return NF_OK;
        if (!device_codec(mm->codec)) {
            const nf_codec *c = nf_codec_get((nf_codec_id)mm->codec);
            return nf_error_set(err, NF_ERR_UNSUPPORTED, "cuda decoder: %s is %s, which has no CUDA kernel "
                                "(bf16, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs, iq4_nl, nvfp4 have)", name, c ? c->name : "an unknown codec");
        }
        size_t bytes = 0;
        nf_status st = devmat_bytes(mm, name, &bytes, err);
        if (st) return st;
        if (base && (st = devmat_upload(mm, base + off, &L->m, name, err))) return st;
        L->codec = mm->codec;
        L->gemm = prefill_supported(L->m, L->m);
        L->a8 = a8;
        L->mmq = a8 && base && mmq_supported(L->codec, L->m, false);
        off += up256(bytes);
        return NF_OK;
    }

    // n matrices of one input as one stacked matrix: row codecs keep each row whole, so the uploads
    // laid one after another are the stacked matrix. Leaves L absent (codec -1) when they do not share
    // a codec.
    nf_status stacked(const nf_moe_matrix *const *m, const char *const *names, int n, uint32_t layer, Linear *L)
    {
        memset(L, 0, sizeof *L);
        L->codec = -1;
        for (int i = 0; i < n; i++)
            if (m[i]->codec != m[0]->codec || m[i]->cols != m[0]->cols || m[i]->experts != 1 ||
                !device_codec(m[i]->codec) || m[i]->codec == NF_CODEC_NVFP4)
                return NF_OK;
        size_t at = off;
        uint32_t rows = 0;
        for (int i = 0; i < n; i++) {
            char name[64];
            snprintf(name, sizeof name, "layer %u %s", layer, names[i]);
            size_t bytes = 0;
            DevMat d;
            nf_status st = devmat_bytes(m[i], name, &bytes, err);
            if (!st && base) st = devmat_upload(m[i], base + at, &d, name, err);
            if (st) return st;
            if (base && i == 0) L->m = d;
            at += bytes;
            rows += m[i]->rows;
        }
        L->m.rows = rows;
        L->codec = m[0]->codec;
        L->gemm = prefill_supported(L->m, L->m);
        L->a8 = a8;
        L->mmq = a8 && base && mmq_supported(L->codec, L->m, false);
        off = (at + 255) & ~(size_t)255;
        return NF_OK;
    }

    nf_status vec(const float *host, size_t n, const float **dev)
    {
        *dev = nullptr;
        if (!host) return NF_OK;
        if (base) {
            if (cudaMemcpy(base + off, host, n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
                return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: vector upload failed");
            *dev = (const float *)(base + off);
        }
        off += up256(n * sizeof(float));
        return NF_OK;
    }
};

// The token mixer's input matrices: stacked when they share a row codec, else one by one.
nf_status walk_inputs(Uploader &u, const nf_moe_matrix *const *m, const char *const *names, int n, uint32_t l, Layer *L)
{
    nf_status st = u.stacked(m, names, n, l, &L->stacked);
    L->n_in = n;
    for (int i = 0; !st && i < n; i++) {
        if (L->stacked.codec >= 0) memset(&L->in[i], 0, sizeof L->in[i]), L->in[i].codec = -1;
        else st = u.matrix(m[i], names[i], l, &L->in[i]);
    }
    return st;
}

// A Gated DeltaNet layer's token mixer: its vectors and matrices, its share of a state slot.
nf_status walk_gdn(Uploader &u, const nf_cuda_decoder_desc *d, uint32_t l, Layer *L, size_t *slot_floats)
{
    const nf_cuda_layer_desc *ld = &d->layer[l];
    const nf_cuda_gdn_shape &g = d->gdn;
    const uint32_t C = 2 * g.k_heads * g.k_dim + g.v_heads * g.v_dim, Vd = g.v_heads * g.v_dim;
    if (!ld->ssm_conv || !ld->ssm_dt_bias || !ld->ssm_a_log || !ld->ssm_norm)
        return nf_error_set(u.err, NF_ERR_INVALID_ARG, "cuda decoder: layer %u (Gated DeltaNet) lacks its conv, dt_bias, "
                            "A_log or norm vector", l);
    nf_status st;
    if ((st = u.vec(ld->ssm_conv, (size_t)C * g.conv_k, &L->conv_w)) || (st = u.vec(ld->ssm_dt_bias, g.v_heads, &L->dt_bias)) ||
        (st = u.vec(ld->ssm_a_log, g.v_heads, &L->a_log)) || (st = u.vec(ld->ssm_norm, g.v_dim, &L->ssm_norm)))
        return st;
    const nf_moe_matrix *const m[3] = {&ld->ssm_qkv, &ld->ssm_z, &ld->ssm_ba};
    static const char *const names[3] = {"ssm_qkv", "ssm_z", "ssm_ba"};
    const uint32_t cols[3] = {0, C, C + Vd};
    L->is_linear = true;
    memcpy(L->in_cols, cols, sizeof cols);
    L->state_off = *slot_floats;
    *slot_floats += gdn_state_floats(g.k_heads, g.v_heads, g.k_dim, g.v_dim, g.conv_k);
    if ((st = walk_inputs(u, m, names, 3, l, L))) return st;
    return u.matrix(&ld->ssm_out, "ssm_out", l, &L->o);
}

nf_status walk_layer(Uploader &u, const nf_cuda_decoder_desc *d, uint32_t l, Layer *L, size_t *slot_floats)
{
    const nf_cuda_layer_desc *ld = &d->layer[l];
    const size_t H = d->hidden, qd = (size_t)d->heads * d->head_dim, kvd = (size_t)d->kv_heads * d->head_dim;
    nf_status st;
    if ((st = u.vec(ld->attn_norm, H, &L->attn_norm)) || (st = u.vec(ld->ffn_norm, H, &L->ffn_norm)))
        return st;
    if (ld->is_linear) {
        if ((st = walk_gdn(u, d, l, L, slot_floats))) return st;
    } else {
        if ((st = u.vec(ld->q_bias, qd, &L->q_bias)) || (st = u.vec(ld->k_bias, kvd, &L->k_bias)) ||
            (st = u.vec(ld->v_bias, kvd, &L->v_bias)) || (st = u.vec(ld->q_norm, d->head_dim, &L->q_norm)) ||
            (st = u.vec(ld->k_norm, d->head_dim, &L->k_norm)))
            return st;
        const nf_moe_matrix *const m[4] = {&ld->q, &ld->k, &ld->v, &ld->attn_gate};
        static const char *const names[4] = {"attn_q", "attn_k", "attn_v", "attn_gate"};
        const uint32_t cols[4] = {0, (uint32_t)qd, (uint32_t)(qd + kvd), (uint32_t)(qd + 2 * kvd)};
        L->gated = ld->attn_gate.codec >= 0;
        memcpy(L->in_cols, cols, sizeof cols);
        if ((st = walk_inputs(u, m, names, L->gated ? 4 : 3, l, L))) return st;
        if ((st = u.matrix(&ld->o, "attn_output", l, &L->o))) return st;
    }
    if (ld->moe) return NF_OK;
    return (st = u.matrix(&ld->gate, "ffn_gate", l, &L->gate)) ? st
           : (st = u.matrix(&ld->up, "ffn_up", l, &L->up))     ? st
                                                                : u.matrix(&ld->down, "ffn_down", l, &L->down);
}

nf_status walk(Uploader &u, const nf_cuda_decoder_desc *d, nf_cuda_decoder *dec)
{
    nf_status st = u.matrix(&d->embd, "token_embd", UINT32_MAX, &dec->embd);
    if (st) return st;
    if (d->head.data == d->embd.data && d->head.codec == d->embd.codec) dec->head = dec->embd; // tied
    else if ((st = u.matrix(&d->head, "output", UINT32_MAX, &dec->head)))
        return st;
    if ((st = u.vec(d->out_norm, d->hidden, &dec->out_norm))) return st;
    dec->slot_floats = 0;
    for (uint32_t l = 0; l < dec->n_layers; l++) // with the MTP block's layer (d->layer has it last)
        if ((st = walk_layer(u, d, l, &dec->L[l], &dec->slot_floats))) return st;
    const nf_cuda_mtp_desc &m = d->mtp;
    if (!m.layer) return NF_OK; // no MTP block: the rest of the desc is not read
    if ((st = u.matrix(&m.fc, "mtp.fc", UINT32_MAX, &dec->mtp_fc))) return st;
    if ((st = u.vec(m.norm_embd, d->hidden, &dec->mtp_norm_embd)) || (st = u.vec(m.norm_hidden, d->hidden, &dec->mtp_norm_hidden)))
        return st;
    return u.vec(m.out_norm, d->hidden, &dec->mtp_out_norm);
}

nf_status check_desc(const nf_cuda_decoder_desc *d, nf_error *err)
{
    if (!d->hidden || !d->layers || !d->heads || !d->kv_heads || !d->vocab || !d->ctx || !d->chunk)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: a zero dimension (hidden %u, layers %u, heads %u, "
                            "kv heads %u, vocab %u, ctx %u, chunk %u)", d->hidden, d->layers, d->heads, d->kv_heads,
                            d->vocab, d->ctx, d->chunk);
    if (d->head_dim % 8 || d->head_dim > 256 || d->heads % d->kv_heads)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "cuda decoder: head_dim %u (needs a multiple of 8, <= 256) with %u "
                            "heads over %u kv heads (needs a whole number of q heads per kv head)",
                            d->head_dim, d->heads, d->kv_heads);
    const uint32_t rd = d->rope_dim ? d->rope_dim : d->head_dim;
    if (rd % 2 || rd > d->head_dim || d->head_dim - rd > 32 * (uint32_t)kRopeTail)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "cuda decoder: %u rotated dims of a %u-dim head (needs an even "
                            "count, at most %u dims unrotated)", rd, d->head_dim, 32 * kRopeTail);
    const nf_cuda_gdn_shape &g = d->gdn;
    bool linear = false;
    for (uint32_t l = 0; l < d->layers; l++) linear = linear || d->layer[l].is_linear;
    if (linear && (!g.k_heads || !g.v_heads || g.v_heads % g.k_heads || !gdn_supported(g.k_dim, g.v_dim, g.conv_k)))
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "cuda decoder: Gated DeltaNet with %u k heads of %u, %u v heads of "
                            "%u, a conv of %u taps (the kernels take dk 16, 32, 64 or 128, dv <= 256, %u taps, whole v "
                            "heads per k head)", g.k_heads, g.k_dim, g.v_heads, g.v_dim, g.conv_k, kGdnConvK);
    if (d->hidden % 8 || d->hidden > kNormMaxH)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "cuda decoder: hidden %u (needs a multiple of 8, <= %u)", d->hidden,
                            kNormMaxH);
    const uint32_t pt = d->page_tokens;
    if (pt & (pt - 1) || pt > 4096)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: page_tokens %u (needs a power of two <= 4096)", pt);
    if (d->max_seqs > d->chunk)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: max_seqs %u above the chunk %u (a sequence takes at "
                            "least one token of a forward)", d->max_seqs, d->chunk);
    const nf_cuda_mtp_desc &m = d->mtp;
    if (m.layer && (m.layer->is_linear || m.fc.codec < 0 || m.fc.rows != d->hidden || m.fc.cols != 2 * d->hidden ||
                    !m.norm_embd || !m.norm_hidden || !m.out_norm))
        return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: the MTP block needs an attention layer, mtp.fc of "
                            "[%u][%u] (got [%u][%u]) and its three norms", d->hidden, 2 * d->hidden, m.fc.rows, m.fc.cols);
    return NF_OK;
}

// The desc with page_tokens, max_seqs and kv_pages defaulted (decoder.h); 0 when the pool's rows
// would not fit 32 bits (kv_slot's arithmetic).
int fill_defaults(nf_cuda_decoder_desc *d)
{
    if (!d->page_tokens) d->page_tokens = NF_CUDA_PAGE_TOKENS;
    if (!d->rope_dim) d->rope_dim = d->head_dim;
    if (!d->max_seqs) d->max_seqs = 1;
    const uint64_t per = (d->ctx + d->page_tokens - 1) / d->page_tokens;
    if (!d->kv_pages) {
        if (per * d->max_seqs > UINT32_MAX) return 0;
        d->kv_pages = (uint32_t)(per * d->max_seqs);
    }
    return (uint64_t)d->kv_pages * d->page_tokens <= UINT32_MAX;
}

size_t take(nf_arena *a, size_t bytes)
{
    size_t off = 0;
    nf_arena_take(a, bytes ? bytes : 1, 256, &off, NULL);
    return off;
}

// The split attention's partials (floats) and tickets (one per token and head), for the largest
// chunk that splits.
size_t part_floats(const nf_cuda_decoder_desc *d, size_t *tickets)
{
    size_t most = 0;
    *tickets = 0;
    for (uint32_t T = 1; T <= d->chunk && T <= 264; T++) {
        // the per-head split kernel's count, and the grouped kernel's (set by the kv heads)
        for (uint32_t s : {attention_splits(T, d->ctx, d->heads), attention_splits(T, d->ctx, d->kv_heads)}) {
            if (s > 1 && (size_t)T * d->heads * s > most) most = (size_t)T * d->heads * s;
            if (s > 1 && (size_t)T * d->heads > *tickets) *tickets = (size_t)T * d->heads;
        }
    }
    return most * (d->head_dim + 2);
}

// Lays out (base == NULL: sizes) the chunk buffers; returns the bytes.
size_t layout_buffers(nf_cuda_decoder *dec, uint8_t *base, size_t moe_ws)
{
    const nf_cuda_decoder_desc *d = &dec->d;
    const size_t C = d->chunk, H = d->hidden, qd = (size_t)d->heads * d->head_dim;
    const size_t D = dec->dense_inter, V = d->vocab;
    const size_t row = dec->a.row_att > dec->a.row_gdn ? dec->a.row_att : dec->a.row_gdn;
    const size_t Vd = (size_t)d->gdn.v_heads * d->gdn.v_dim, att = qd > Vd ? qd : Vd;
    nf_arena ar;
    nf_arena_sizing(&ar);
    size_t o[26];
    int n = 0;
    o[n++] = take(&ar, C * H * 4);     // x
    o[n++] = take(&ar, C * H * 4);     // delta
    o[n++] = take(&ar, C * row * 4);   // qkv
    o[n++] = take(&ar, C * D * 4);     // g
    o[n++] = take(&ar, C * D * 4);     // u
    o[n++] = take(&ar, C * V * 4);     // logits
    size_t tickets = 0;
    o[n++] = take(&ar, part_floats(d, &tickets) * 4);
    o[n++] = take(&ar, C * H * 2);     // xn
    o[n++] = take(&ar, C * H * 2);     // moe_out
    o[n++] = take(&ar, C * att * 2);   // att
    o[n++] = take(&ar, C * D * 2);     // act
    o[n++] = take(&ar, moe_ws);        // moe workspace
    const size_t MS = d->max_seqs;
    auto tab_bytes = [](size_t rows) { return dense_tables_ints(rows) * 4; };
    o[n++] = take(&ar, tab_bytes(C)); // tab
    o[n++] = take(&ar, tab_bytes(1)); // tab1
    o[n++] = take(&ar, step_layout(d->chunk, d->max_seqs, dec->stride).total * 4);
    o[n++] = take(&ar, MS * (topk_scratch_floats() * 8 + kSampleMaxK * 8));
    o[n++] = take(&ar, d->trace_routing ? (size_t)d->layers * C * dec->top_k * 4 : 0);
    o[n++] = take(&ar, (size_t)d->ctx * (d->head_dim / 2) * sizeof(float2));
    o[n++] = take(&ar, tickets * 4);
    o[n++] = take(&ar, tab_bytes(MS));        // tabS
    o[n++] = take(&ar, MS * H * 2);           // xl
    // the dense layers' quantised input (ops.cuh kDenseMmqMax): rows of the widest input (mtp.fc's 2H
    // with an MTP block), unpadded for the mmq path, padded (a quarter more) for the GEMV's at most
    // kGemvMaxT rows
    const bool mtp = dec->mtp_fc.codec >= 0;
    const size_t MC0 = H > att ? (H > D ? H : D) : (att > D ? att : D), MC = mtp && 2 * H > MC0 ? 2 * H : MC0;
    const size_t MR = C < kDenseMmqMax ? (C > kGemvMaxT ? C : kGemvMaxT) : kDenseMmqMax;
    o[n++] = take(&ar, MR * (MC + MC / 4));   // xq
    o[n++] = take(&ar, MR * (MC / 32) * 8);   // xd
    o[n++] = take(&ar, mtp ? C * H * 4 : 0);     // hf
    o[n++] = take(&ar, mtp ? C * 2 * H * 2 : 0); // cat
    o[n++] = take(&ar, gdn_ws_floats((uint32_t)C, d->gdn.v_heads, d->gdn.k_dim) * 4); // gdn_ws (0 without GDN layers)
    if (!base) return ar.peak;
    Acts &a = dec->a;
    float **f[] = {&a.x, &a.delta, &a.qkv, &a.g, &a.u, &a.logits, &a.part};
    for (int i = 0; i < 7; i++) *f[i] = (float *)(base + o[i]);
    uint16_t **h[] = {&a.xn, &a.moe_out, &a.att, &a.act};
    for (int i = 0; i < 4; i++) *h[i] = (uint16_t *)(base + o[7 + i]);
    a.moe_ws = base + o[11];
    DenseTables *tb[] = {&dec->tab, &dec->tab1, &dec->tabS};
    const size_t rows[] = {C, 1, MS};
    const int at[] = {12, 13, 19};
    for (int i = 0; i < 3; i++)
        *tb[i] = dense_tables_at((int32_t *)(base + o[at[i]]), rows[i], (int8_t *)(base + o[21]), (float2 *)(base + o[22]));
    dec->step = (int32_t *)(base + o[14]);
    float *t = (float *)(base + o[15]);
    const size_t sc = MS * topk_scratch_floats();
    dec->tk = TopK{(int32_t *)(t + 2 * sc + MS * kSampleMaxK), t + 2 * sc, t, (int32_t *)(t + sc)};
    a.xl = (uint16_t *)(base + o[20]);
    dec->trace = d->trace_routing ? (int32_t *)(base + o[16]) : nullptr;
    dec->rope_tab = (float2 *)(base + o[17]);
    dec->ticket = (unsigned *)(base + o[18]);
    a.hf = mtp ? (float *)(base + o[23]) : nullptr;
    a.cat = mtp ? (uint16_t *)(base + o[24]) : nullptr;
    a.gdn_ws = (float *)(base + o[25]);
    return ar.peak;
}

nf_status bind_moe(nf_cuda_decoder *dec, size_t *ws, nf_error *err)
{
    *ws = 0;
    for (uint32_t l = 0; l < dec->n_layers; l++) {
        const nf_moe_bank *b = dec->d.layer[l].moe;
        if (!b) continue;
        size_t w = 0;
        nf_status st = nf_sparse_moe_bind(b, dec->d.chunk, &dec->L[l].moe, &w, err);
        if (st) return nf_error_prefix(err, "cuda decoder: layer %u", l);
        dec->moe_bytes += nf_sparse_moe_weight_bytes(dec->L[l].moe);
        if (b->top_k > dec->top_k) dec->top_k = b->top_k;
        if (w > *ws) *ws = w;
    }
    return NF_OK;
}

nf_status cuda_fail(nf_error *err, const char *what, size_t bytes)
{
    cudaGetLastError();
    return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: cannot allocate %zu MiB for %s", bytes >> 20, what);
}

nf_status create_memory(nf_cuda_decoder *dec, const nf_cuda_decoder_desc *d, nf_error *err)
{
    Uploader u{nullptr, 0, err, d->allow_a8 != 0};
    nf_status st = walk(u, d, dec);
    if (st) return st;
    dec->weight_bytes = u.off + up256((d->head_dim / 2 + 1) * sizeof(float));
    if (cudaMalloc(&dec->weights, dec->weight_bytes) != cudaSuccess) return cuda_fail(err, "the dense weights", dec->weight_bytes);
    u = Uploader{dec->weights, 0, err, d->allow_a8 != 0};
    if ((st = walk(u, d, dec))) return st;
    dec->rope = (float *)(dec->weights + u.off);
    size_t ws = 0;
    if ((st = bind_moe(dec, &ws, err))) return st;
    // the pool: [attention layer][K, V][kv_pages][page_tokens][kv_heads * hd] (copy_page is one 2D copy
    // of 2 * attention layers rows of one page each); GDN layers have none
    const size_t kvd = (size_t)d->kv_heads * d->head_dim, per = (size_t)d->kv_pages * d->page_tokens * kvd * 2;
    dec->attn_layers = 0;
    for (uint32_t l = 0; l < dec->n_layers; l++) dec->attn_layers += !dec->L[l].is_linear;
    dec->kv_bytes = (size_t)(dec->attn_layers ? dec->attn_layers : 1) * 2 * per;
    if (cudaMalloc(&dec->kv, dec->kv_bytes) != cudaSuccess) return cuda_fail(err, "the KV page pool", dec->kv_bytes);
    for (uint32_t l = 0, a = 0; l < dec->n_layers; l++) {
        if (dec->L[l].is_linear) continue;
        dec->L[l].kc = (uint16_t *)(dec->kv + 2 * a * per);
        dec->L[l].vc = (uint16_t *)(dec->kv + (2 * a + 1) * per);
        a++;
    }
    // the state slots (hybrids): every slot's state is defined by the kernels before it is read (a
    // sequence at position 0 reads zeros, not its slot), so they need no clearing
    const size_t slot_bytes = dec->slot_floats * d->max_seqs * sizeof(float);
    if (slot_bytes && cudaMalloc(&dec->slots, slot_bytes) != cudaSuccess) return cuda_fail(err, "the state slots", slot_bytes);
    if (slot_bytes && !(dec->slot_pos = (uint32_t *)calloc(2 * (size_t)d->max_seqs + d->state_snaps, sizeof *dec->slot_pos)))
        return nf_error_set(err, NF_ERR_NOMEM, "cuda decoder: out of host memory");
    dec->buffer_bytes = layout_buffers(dec, nullptr, ws);
    if (cudaMalloc(&dec->buffers, dec->buffer_bytes) != cudaSuccess) return cuda_fail(err, "the chunk buffers", dec->buffer_bytes);
    layout_buffers(dec, dec->buffers, ws);
    // zero: the split attention's tickets start at zero (and stale reads of any buffer are repeatable).
    // Then the whole device is waited for: the memset and the weight uploads before it (a pageable
    // cudaMemcpy may return before its DMA lands) ran on the legacy stream, which the decoder's
    // non-blocking stream does not follow; a late memset wiped the LM head's tables (prep_tables, in
    // create) -- all-zero logits whenever other GPU work delayed it (test_batch_cuda under load)
    if (cudaMemset(dec->buffers, 0, dec->buffer_bytes) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: clearing the chunk buffers: %s",
                            cudaGetErrorString(cudaGetLastError()));
    return NF_OK;
}

uint32_t dense_inter_of(const nf_cuda_decoder_desc *d, uint32_t n_layers)
{
    uint32_t D = 0;
    for (uint32_t l = 0; l < n_layers; l++)
        if (!d->layer[l].moe && d->layer[l].gate.rows > D) D = d->layer[l].gate.rows;
    return D;
}

} // namespace

extern "C" nf_status nf_cuda_decoder_create(const nf_cuda_decoder_desc *d, nf_cuda_decoder **out, nf_error *err)
{
    *out = nullptr;
    nf_cuda_decoder_desc dd = *d;
    nf_status st = check_desc(d, err);
    if (st) return st;
    if (!fill_defaults(&dd))
        return nf_error_set(err, NF_ERR_INVALID_ARG, "cuda decoder: a KV pool of %u pages of %u positions is too large",
                            dd.kv_pages, dd.page_tokens);
    // the MTP block's layer as layer `layers` of one array: the walks below then take it with the rest
    const uint32_t n_layers = d->layers + (d->mtp.layer != nullptr);
    nf_cuda_layer_desc *all = (nf_cuda_layer_desc *)malloc(n_layers * sizeof *all);
    nf_cuda_decoder *dec = all ? (nf_cuda_decoder *)calloc(1, sizeof *dec) : nullptr;
    if (!dec || !(dec->L = (Layer *)calloc(n_layers, sizeof(Layer)))) {
        free(dec);
        free(all);
        return nf_error_set(err, NF_ERR_NOMEM, "cuda decoder: out of host memory");
    }
    memcpy(all, d->layer, d->layers * sizeof *all);
    if (d->mtp.layer) all[d->layers] = *d->mtp.layer;
    dd.layer = all;
    d = &dd;
    dec->d = *d;
    dec->n_layers = n_layers;
    dec->mtp_fc.codec = -1; // until walk uploads it
    dec->dense_inter = dense_inter_of(d, n_layers);
    dec->stride = (d->ctx + d->page_tokens - 1) / d->page_tokens;
    bool gated = false;
    for (uint32_t l = 0; l < n_layers; l++) gated = gated || d->layer[l].attn_gate.codec >= 0;
    const uint32_t qd = d->heads * d->head_dim, kvd = d->kv_heads * d->head_dim, Vd = d->gdn.v_heads * d->gdn.v_dim;
    dec->a.row_att = qd + 2 * kvd + (gated ? qd : 0);
    dec->a.row_gdn = 2 * d->gdn.k_heads * d->gdn.k_dim + Vd + Vd + 2 * d->gdn.v_heads;
    while ((1u << dec->pt_shift) < d->page_tokens) dec->pt_shift++;
    st = create_memory(dec, d, err);
    dec->d.layer = nullptr; // host pointers are not kept past create
    dec->d.mtp = nf_cuda_mtp_desc{};
    free(all);
    if (!st && (cudaStreamCreateWithFlags(&dec->stream, cudaStreamNonBlocking) != cudaSuccess ||
                cudaEventCreateWithFlags(&dec->step_copied, cudaEventDisableTiming) != cudaSuccess ||
                cudaMallocHost(&dec->h_step, step_layout(d->chunk, d->max_seqs, dec->stride).total * 4) != cudaSuccess ||
                cudaMallocHost(&dec->h_ids, (size_t)d->max_seqs * kSampleMaxK * 8) != cudaSuccess))
        st = nf_error_set(err, NF_ERR_CUDA, "cuda decoder: cannot create its stream, event or pinned buffers");
    if (!st && (!(dec->graphs = (cudaGraphExec_t *)calloc(2 * (d->max_seqs + 1), sizeof *dec->graphs)) ||
                !(dec->h_last = (int32_t *)malloc(d->max_seqs * sizeof *dec->h_last))))
        st = nf_error_set(err, NF_ERR_NOMEM, "cuda decoder: out of host memory");
    if (st) {
        nf_cuda_decoder_free(dec);
        return st;
    }
    dec->h_vals = (float *)(dec->h_ids + (size_t)d->max_seqs * kSampleMaxK);
    prep_tables(dec->tab1, 1, dec->stream);
    // the legacy-stream work (weight uploads, memsets) was waited for in create_memory
    if (cudaStreamSynchronize(dec->stream) != cudaSuccess) {
        nf_cuda_decoder_free(dec);
        return nf_error_set(err, NF_ERR_CUDA, "cuda decoder: %s", cudaGetErrorString(cudaGetLastError()));
    }
    *out = dec;
    return NF_OK;
}

extern "C" void nf_cuda_decoder_free(nf_cuda_decoder *dec)
{
    if (!dec) return;
    if (dec->stream) cudaStreamSynchronize(dec->stream);
    for (uint32_t i = 0; dec->graphs && i < 2 * (dec->d.max_seqs + 1); i++)
        if (dec->graphs[i]) cudaGraphExecDestroy(dec->graphs[i]);
    free(dec->graphs);
    free(dec->h_last);
    for (uint32_t l = 0; dec->L && l < dec->n_layers; l++) nf_sparse_moe_free(dec->L[l].moe);
    cudaFree(dec->weights);
    cudaFree(dec->kv);
    cudaFree(dec->buffers);
    cudaFree(dec->pen);
    cudaFree(dec->slots);
    cudaFree(dec->spares);
    cudaFree(dec->snaps);
    free(dec->slot_pos);
    if (dec->h_step) cudaFreeHost(dec->h_step);
    if (dec->h_ids) cudaFreeHost(dec->h_ids);
    if (dec->step_copied) cudaEventDestroy(dec->step_copied);
    if (dec->stream) cudaStreamDestroy(dec->stream);
    free(dec->L);
    free(dec);
}

extern "C" size_t nf_cuda_decoder_weight_bytes(const nf_cuda_decoder *dec) { return dec->weight_bytes + dec->moe_bytes; }
extern "C" size_t nf_cuda_decoder_kv_bytes(const nf_cuda_decoder *dec) { return dec->kv_bytes; }
