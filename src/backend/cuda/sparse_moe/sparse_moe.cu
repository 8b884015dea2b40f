// Bind (admission, upload in the kernels' layout, workspace sizing) and the forward's orchestration.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "a4.cuh"
#include "bf16x3.cuh"
#include "internal.cuh"
#include "quant_a8.cuh"

extern "C" {
#include "base/arena.h"
#include "codec/codec.h"
#include "codec/nvfp4.h"
#include "sparse_moe.h"
}

using namespace nf;

// nf_codec_id values the device dispatch (internal.cuh) relies on.
static_assert(NF_CODEC_F32 == 0 && NF_CODEC_BF16 == 2 && NF_CODEC_Q8_0 == 3 && NF_CODEC_Q4_K == 4 &&
                  NF_CODEC_Q5_K == 5 && NF_CODEC_Q6_K == 6 && NF_CODEC_NVFP4 == 11 && NF_CODEC_Q2_K == 12 &&
                  NF_CODEC_Q3_K == 13 && NF_CODEC_IQ4_XS == 14 && NF_CODEC_IQ4_NL == 15,
              "codec ids changed: update dispatch_codec in internal.cuh");

struct nf_sparse_moe {
    nf_moe_bank bank;      // shapes and policies (host data pointers cleared)
    uint32_t max_tokens;   // the chunk
    DevMat m[6];           // router, gate_up, down, shared_gate_up, shared_down, shared_gate
    int codec[6];
    RouterPlanes rplanes;  // the router as bf16 planes (router_mma.cu): its own rows, or an f32 router's split
                           // (p NULL: an f32 router bound for slices below kRouterMmaFrom)
    int has_shared;
    uint8_t *dev;          // one allocation holding every matrix
    size_t dev_bytes;
    char profile[64];
    uint32_t decode_max, small_max;
    uint32_t mmq_max;          // slices above the small-token route (small_max, lowered to mmq_small_max
                               // while this is set) up to mmq_max tokens take the mmq route (mmq.cu);
                               // 0 where the bank cannot (mmq_ok) or a benchmark turned it off
    int mmq_ok;                // the routed bank can take the mmq route (codecs, shapes, A8 allowed)
    int sh_a8;                 // from two tokens the small-token route runs the shared expert on int8
                               // activations as a routed one (gemv_a8, the down by rows): its matrices
                               // allow int8 and its codecs have int8 spans; else its f32 GEMVs
    int sh_mmq;                // on the mmq route the shared expert runs the mmq kernels too (its gate/up
                               // and down allow int8 activations, codecs and shapes the kernel takes);
                               // else its f32 CUDA-core GEMVs
    int *counter;              // device [2 + E], 0 between forwards: the small router's grid-wide count, then
                               // the prefill work list's ticket and per-expert counts (Routing::wl_state)
    int a4;                    // nvfp4-w4a4: the prefill route runs W4A4 (a4.cuh)
    int tensor;                // the prefill route runs the tensor-core GEMMs (tensor_prefill), whose
                               // down writes the y plane in bf16; else the CUDA-core GEMVs' f32 plane
    uint32_t deq_from;         // k-quant / q8_0 routed bank: slices of this many tokens and more run their
                               // routed GEMMs on a bf16 copy of the active experts (dequant.cu); else UINT32_MAX
    const float *a4div;        // device [2 + E]: gate/up input divisor, shared down's, each expert's down
    const int32_t *forced_ids; // benchmarks: route by these ids (device, [max_tokens][k]) instead of the router's
    int tile_m;                // benchmarks: the prefill tile height (32, 64, 128), 0: chosen per slice
    // workspace layout (byte offsets)
    size_t o_logits, o_id, o_w, o_sg, o_slot, o_pos, o_ng, o_ge, o_gs, o_gc, o_sgrp, o_wlb, o_act, o_y, o_acts, o_ys;
    size_t o_tiles, o_acth, o_actsh; // prefill: tile tables; bf16 act planes (routed, shared)
    size_t o_xq, o_aq, o_saq;        // W4A4 prefill: nvfp4 planes of x, act, shared act (A4Plane)
    size_t o_deq;                    // dequant route: bf16 bank [E][rows][cols] of gate/up, then of down
    size_t o_mxq, o_mxd, o_maq, o_mad; // mmq route: x and act quantised (int8 planes and their (d, s))
    size_t o_sq8, o_sd8;               // small-token route: act quantised by gate/up for down_a8 (padded rows)
    size_t o_ssq8, o_ssd8;             // and the shared expert's (sh_a8), [pos][S]
    uint32_t max_tiles;              // tile-table capacity: ceil(T*k / kPrefillTileMinM) + E
    size_t ws_bytes;
};

enum { M_ROUTER, M_GATE_UP, M_DOWN, M_SGU, M_SDOWN, M_SGATE };
static const char *const mat_name[6] = {"router", "gate_up", "down", "shared_gate_up", "shared_down", "shared_gate"};

static nf_status refuse(nf_error *err, const char *fmt, const char *a, const char *b = "")
{
    return nf_error_set(err, NF_ERR_REFUSED, fmt, a, b);
}

// Shape check of one matrix against what the bank's dimensions require.
static nf_status check_shape(const nf_moe_matrix *mm, int idx, uint32_t experts, uint32_t rows, uint32_t cols,
                             nf_error *err)
{
    if (mm->experts != experts || mm->rows != rows || mm->cols != cols)
        return nf_error_set(err, NF_ERR_REFUSED,
                            "sparse_moe bind: %s is [%u][%u][%u], the bank's dimensions need [%u][%u][%u]",
                            mat_name[idx], mm->experts, mm->rows, mm->cols, experts, rows, cols);
    if (!mm->data) return nf_error_set(err, NF_ERR_REFUSED, "sparse_moe bind: %s has no data", mat_name[idx]);
    const nf_codec *c = nf_codec_get((nf_codec_id)mm->codec);
    if (!c) return nf_error_set(err, NF_ERR_REFUSED, "sparse_moe bind: %s has unknown codec %d", mat_name[idx], mm->codec);
    if (cols % c->block_elems)
        return nf_error_set(err, NF_ERR_REFUSED, "sparse_moe bind: %s row length %u is not a multiple of %s's block (%u)",
                            mat_name[idx], cols, c->name, c->block_elems);
    if (mm->codec != NF_CODEC_NVFP4 && mm->divisors != 1)
        return nf_error_set(err, NF_ERR_REFUSED, "sparse_moe bind: %s is %s with divisors = %u (only nvfp4 has divisors)",
                            mat_name[idx], c->name, mm->divisors);
    return NF_OK;
}

// Expert e's W4A4 input divisor (sparse_moe.h: input_divisor, or one word, or one per expert).
static float input_divisor_of(const nf_moe_matrix *mm, uint32_t e)
{
    if (mm->n_input_divisors == 0) return mm->input_divisor;
    if (!mm->input_divisors) return 0.0f;
    return mm->input_divisors[mm->n_input_divisors == 1 ? 0 : e];
}

// W4A4 divisors: a count the operator can read (0, 1 or one per expert), every one finite and > 0,
// one gate/up divisor for the whole chunk (the prefill route encodes x once), equal for the routed
// and the shared expert.
static nf_status admit_a4_divisors(const nf_moe_bank *b, int has_shared, nf_error *err)
{
    const nf_moe_matrix *ex[4] = {&b->gate_up, &b->down, &b->shared_gate_up, &b->shared_down};
    for (int i = 0; i < (has_shared ? 4 : 2); i++) {
        const nf_moe_matrix *mm = ex[i];
        if (mm->n_input_divisors > 1 && mm->n_input_divisors != mm->experts)
            return nf_error_set(err, NF_ERR_REFUSED,
                                "sparse_moe bind: %s has %u input divisors (W4A4 takes 1 or one per expert, %u)",
                                mat_name[1 + i], mm->n_input_divisors, mm->experts);
        for (uint32_t e = 0; e < mm->experts; e++) {
            const float d = input_divisor_of(mm, e);
            if (!(d > 0) || !isfinite(d))
                return nf_error_set(err, NF_ERR_REFUSED,
                                    "sparse_moe bind: %s allows A4 but the input divisor of expert %u is missing or "
                                    "not finite and > 0 (%g)",
                                    mat_name[1 + i], e, (double)d);
        }
    }
    for (uint32_t e = 1; e < b->gate_up.experts; e++)
        if (input_divisor_of(&b->gate_up, e) != input_divisor_of(&b->gate_up, 0))
            return nf_error_set(err, NF_ERR_REFUSED,
                                "sparse_moe bind: gate_up input divisors differ between experts (%g for 0, %g for %u); "
                                "the prefill route encodes the chunk once for all of them",
                                (double)input_divisor_of(&b->gate_up, 0), (double)input_divisor_of(&b->gate_up, e), e);
    if (has_shared && input_divisor_of(&b->shared_gate_up, 0) != input_divisor_of(&b->gate_up, 0))
        return nf_error_set(err, NF_ERR_REFUSED,
                            "sparse_moe bind: routed and shared gate/up activation divisors disagree (%g vs %g); "
                            "the prefill route encodes the chunk once for both",
                            (double)input_divisor_of(&b->gate_up, 0), (double)input_divisor_of(&b->shared_gate_up, 0));
    return NF_OK;
}

// The GGUF block codecs, mixed freely among themselves: k-quants, q8_0 and the import-only q2_k,
// q3_k, iq4_xs, iq4_nl (the device codecs of dev_codecs.cuh and dev_codecs_import.cuh).
static int is_gguf_codec(int c)
{
    switch (c) {
    case NF_CODEC_Q4_K: case NF_CODEC_Q5_K: case NF_CODEC_Q6_K: case NF_CODEC_Q8_0:
    case NF_CODEC_Q2_K: case NF_CODEC_Q3_K: case NF_CODEC_IQ4_XS: case NF_CODEC_IQ4_NL: return 1;
    default: return 0;
    }
}

// Admission: which profile the expert matrices form, or why none.
static nf_status admit(const nf_moe_bank *b, int has_shared, char *profile, size_t n, nf_error *err)
{
    const nf_moe_matrix *ex[4] = {&b->gate_up, &b->down, &b->shared_gate_up, &b->shared_down};
    const int nex = has_shared ? 4 : 2;
    int n_nvfp4 = 0, n_bf16 = 0, n_gguf = 0;
    for (int i = 0; i < nex; i++) {
        n_nvfp4 += ex[i]->codec == NF_CODEC_NVFP4;
        n_bf16 += ex[i]->codec == NF_CODEC_BF16;
        n_gguf += is_gguf_codec(ex[i]->codec);
    }
    const nf_codec *c0 = nf_codec_get((nf_codec_id)b->gate_up.codec), *c1 = nf_codec_get((nf_codec_id)b->down.codec);
    if (n_nvfp4 && n_nvfp4 != nex)
        return nf_error_set(err, NF_ERR_REFUSED,
                            "sparse_moe bind: mixed nvfp4/non-nvfp4 bank (gate_up %s, down %s%s): the nvfp4 profile "
                            "needs all expert matrices in nvfp4",
                            c0 ? c0->name : "?", c1 ? c1->name : "?", has_shared ? ", plus the shared expert" : "");
    if (n_bf16 && n_bf16 != nex)
        return nf_error_set(err, NF_ERR_REFUSED,
                            "sparse_moe bind: mixed bf16/quantized bank (gate_up %s, down %s): bf16 is a whole-bank profile",
                            c0 ? c0->name : "?", c1 ? c1->name : "?");
    if (n_nvfp4 == nex) {
        int a4 = 0;
        for (int i = 0; i < nex; i++) a4 += ex[i]->allow_a4 != 0;
        if (a4 && a4 != nex)
            return nf_error_set(err, NF_ERR_REFUSED,
                                "sparse_moe bind: W4A4 needs AllowA4 on every expert input, but only %d of %d have it",
                                a4, nex);
        if (a4) {
            nf_status s = admit_a4_divisors(b, has_shared, err);
            if (s) return s;
        }
        snprintf(profile, n, "nvfp4-%s", a4 ? "w4a4" : "w4a16");
        return NF_OK;
    }
    if (n_bf16 == nex) {
        snprintf(profile, n, "bf16");
        return NF_OK;
    }
    if (n_gguf != nex) {
        for (int i = 0; i < nex; i++)
            if (!is_gguf_codec(ex[i]->codec)) {
                const nf_codec *c = nf_codec_get((nf_codec_id)ex[i]->codec);
                return nf_error_set(err, NF_ERR_REFUSED,
                                    "sparse_moe bind: %s codec %s is not admitted (profiles: q2_k/q3_k/q4_k/q5_k/"
                                    "q6_k/q8_0/iq4_xs/iq4_nl combinations, bf16, nvfp4)",
                                    mat_name[1 + i], c ? c->name : "unknown");
            }
    }
    if (has_shared)
        snprintf(profile, n, "%s+%s/%s+%s", c0->name, c1->name, nf_codec_get((nf_codec_id)b->shared_gate_up.codec)->name,
                 nf_codec_get((nf_codec_id)b->shared_down.codec)->name);
    else
        snprintf(profile, n, "%s+%s", c0->name, c1->name);
    return NF_OK;
}

static size_t take(nf_arena *a, size_t bytes)
{
    size_t off = 0;
    nf_arena_take(a, bytes, 256, &off, NULL);
    return off;
}

// Whether the bank's prefill route runs the tensor-core GEMMs (their tile shapes): else the CUDA-core
// GEMVs with an f32 y plane.
static bool tensor_prefill(const nf_sparse_moe *m)
{
    return prefill_supported(m->m[M_GATE_UP], m->m[M_DOWN]) &&
           (!m->has_shared || prefill_supported(m->m[M_SGU], m->m[M_SDOWN]));
}

static void layout_workspace(nf_sparse_moe *m, size_t T)
{
    const size_t E = m->bank.experts, k = m->bank.top_k, H = m->bank.hidden,
                 I = m->bank.inter, S = m->bank.shared_inter;
    nf_arena a;
    nf_arena_sizing(&a);
    m->o_logits = take(&a, T * E * 4);
    m->o_id = take(&a, T * k * 4);
    m->o_w = take(&a, T * k * 4);
    m->o_sg = take(&a, T * 4);
    m->o_slot = take(&a, T * k * 4);
    m->o_pos = take(&a, T * k * 4);
    m->o_ng = take(&a, 4);
    m->o_ge = take(&a, E * 4);
    m->o_gs = take(&a, E * 4);
    m->o_gc = take(&a, E * 4);
    m->o_sgrp = take(&a, 16);
    m->o_wlb = take(&a, E * 4);
    const size_t max_tiles = (T * k + kPrefillTileMinM - 1) / kPrefillTileMinM + E;
    m->max_tiles = (uint32_t)max_tiles;
    m->o_tiles = take(&a, (2 * max_tiles + 1 + 2 * ((T + kPrefillTileMinM - 1) / kPrefillTileMinM) + 1) * 4);
    // the mmq route's y is f32 (the W·A8 reference's bound has no bf16 rounding of y) for slices of
    // up to kMmqMaxTokens
    const size_t Tm = m->mmq_ok ? (T < kMmqMaxTokens ? T : kMmqMaxTokens) : 0;
    const size_t ybytes = T * k * H * (m->tensor ? 2 : 4);
    m->o_y = take(&a, ybytes > Tm * k * H * 4 ? ybytes : Tm * k * H * 4);
    m->o_ys = m->has_shared ? take(&a, T * H * 4) : 0;
    // The intermediates are private to the route a slice takes, so the routes share one region
    // (sparse_moe.h, "Workspace"): the CUDA-core routes' fp32 planes, the W4A16 prefill's bf16
    // planes, the W4A4 prefill's nvfp4 planes of x and of the intermediates (a4.cuh).
    const size_t routes = nf_arena_mark(&a);
    m->o_act = take(&a, T * k * I * 4);
    m->o_acts = m->has_shared ? take(&a, T * S * 4) : 0;
    // the mmq route: x and act quantised per 32 (int8 planes, (d, d sum q) pairs)
    m->o_mxq = Tm ? take(&a, Tm * H) : 0;
    m->o_mxd = Tm ? take(&a, Tm * (H / 32) * 8) : 0;
    // the routed intermediate [slot][I], then (sh_mmq) the shared one [pos][S] in the same plane
    const size_t ai = m->sh_mmq && S > k * I ? S : k * I;
    m->o_maq = Tm ? take(&a, Tm * ai) : 0;
    m->o_mad = Tm ? take(&a, Tm * (ai / 32) * 8) : 0;
    const size_t Ts = T < kSmallRouteMax ? T : kSmallRouteMax;
    m->o_sq8 = take(&a, Ts * k * a8_stride(I));
    m->o_sd8 = take(&a, Ts * k * (I / 32) * 8);
    m->o_ssq8 = m->sh_a8 ? take(&a, Ts * a8_stride(S)) : 0;
    m->o_ssd8 = m->sh_a8 ? take(&a, Ts * (S / 32) * 8) : 0;
    nf_arena_reset(&a, routes);
    m->o_acth = m->a4 ? 0 : take(&a, T * k * I * 2);
    m->o_actsh = m->has_shared && !m->a4 ? take(&a, T * S * 2) : 0;
    m->o_xq = m->a4 ? take(&a, T * H / 2 + T * H / 16) : 0;
    m->o_aq = m->a4 ? take(&a, T * k * I / 2 + T * k * I / 16) : 0;
    m->o_saq = m->a4 && m->has_shared ? take(&a, T * S / 2 + T * S / 16) : 0;
    const size_t deq_elems = E * (2 * I * H > H * I ? 2 * I * H : H * I); // gate/up's, then down's
    m->o_deq = T >= m->deq_from ? take(&a, deq_elems * 2) : 0;
    m->ws_bytes = a.peak;
}

// An f32 router [E][H] as three bf16 planes [3][E][H], hi + mid + lo == each weight (bf16x3.cuh), at
// dst on the device: the tensor-core prefill router's operands, split once here rather than by every
// CTA of every forward.
static nf_status split_router(const nf_moe_matrix *r, uint32_t H, uint16_t *dst, nf_error *err)
{
    const size_t n = (size_t)r->rows * H;
    uint16_t *h = (uint16_t *)malloc(3 * n * sizeof(uint16_t));
    if (!h) return nf_error_set(err, NF_ERR_NOMEM, "sparse_moe bind: out of memory");
    const float *w = (const float *)r->data;
    for (size_t i = 0; i < n; i++) {
        uint16_t p[3];
        bf16x3(w[i], p);
        for (int j = 0; j < 3; j++) h[j * n + i] = p[j];
    }
    const cudaError_t ce = cudaMemcpy(dst, h, 3 * n * sizeof(uint16_t), cudaMemcpyHostToDevice);
    free(h);
    return ce == cudaSuccess ? NF_OK
                             : nf_error_set(err, NF_ERR_CUDA, "sparse_moe bind: cannot upload the router's planes");
}

extern "C" nf_status nf_sparse_moe_bind(const nf_moe_bank *b, uint32_t max_tokens, nf_sparse_moe **out,
                                        size_t *workspace_bytes, nf_error *err)
{
    *out = NULL;
    if (b->experts < 1 || b->experts > 512)
        return nf_error_set(err, NF_ERR_REFUSED, "sparse_moe bind: %u experts (supported: 1..512)", b->experts);
    if (b->top_k < 1 || b->top_k > 16 || b->top_k > b->experts)
        return nf_error_set(err, NF_ERR_REFUSED, "sparse_moe bind: top-k %u (supported: 1..min(16, experts = %u))",
                            b->top_k, b->experts);
    if (b->hidden == 0 || b->inter == 0 || max_tokens == 0)
        return nf_error_set(err, NF_ERR_REFUSED, "sparse_moe bind: hidden %u, inter %u, max_tokens %u must be > 0",
                            b->hidden, b->inter, max_tokens);
    if (b->hidden % 8)
        return nf_error_set(err, NF_ERR_REFUSED, "sparse_moe bind: hidden %u is not a multiple of 8 (router rows are read "
                            "in 16-byte pieces)", b->hidden);
    const int has_shared = b->shared_gate_up.codec >= 0;
    const uint32_t E = b->experts, H = b->hidden, I = b->inter, S = b->shared_inter;
    struct {
        const nf_moe_matrix *mm;
        uint32_t e, r, c;
    } want[6] = {{&b->router, 1, E, H},          {&b->gate_up, E, 2 * I, H}, {&b->down, E, H, I},
                 {&b->shared_gate_up, 1, 2 * S, H}, {&b->shared_down, 1, H, S}, {&b->shared_gate, 1, 1, H}};
    const int nmat = has_shared ? 6 : 3;
    if (has_shared && S == 0) return refuse(err, "sparse_moe bind: %s present but shared_inter is 0", "shared_gate_up");
    if (!has_shared && (b->shared_down.codec >= 0 || b->shared_gate.codec >= 0))
        return refuse(err, "sparse_moe bind: shared_down/shared_gate given without %s", "shared_gate_up");
    for (int i = 0; i < nmat; i++) {
        nf_status s = check_shape(want[i].mm, i, want[i].e, want[i].r, want[i].c, err);
        if (s) return s;
    }
    for (int i : {M_ROUTER, M_SGATE}) {
        if (i == M_SGATE && !has_shared) continue;
        if (want[i].mm->codec != NF_CODEC_F32 && want[i].mm->codec != NF_CODEC_BF16)
            return refuse(err, "sparse_moe bind: %s must be f32 or bf16 (the router computes fp32 logits)", mat_name[i]);
    }
    char profile[64];
    nf_status s = admit(b, has_shared, profile, sizeof profile, err);
    if (s) return s;

    nf_sparse_moe *m = (nf_sparse_moe *)calloc(1, sizeof *m);
    if (!m) return nf_error_set(err, NF_ERR_NOMEM, "sparse_moe bind: out of memory");
    m->bank = *b;
    m->max_tokens = max_tokens;
    m->has_shared = has_shared;
    snprintf(m->profile, sizeof m->profile, "%s", profile);
    m->decode_max = 1;
    m->small_max = small_route_max(b->gate_up.codec);

    size_t off[6] = {}, total = 0;
    for (int i = 0; i < nmat; i++) {
        size_t bytes = 0;
        if ((s = devmat_bytes(want[i].mm, mat_name[i], &bytes, err)) != NF_OK) {
            free(m);
            nf_error_prefix(err, "sparse_moe bind");
            return s;
        }
        off[i] = total;
        total += (bytes + 255) & ~(size_t)255;
        m->codec[i] = want[i].mm->codec;
    }
    for (int i = nmat; i < 6; i++) m->codec[i] = -1;
    // an f32 router's three bf16 planes, for the tensor-core router: only if a slice can reach it
    const bool split = b->router.codec == NF_CODEC_F32 && max_tokens >= kRouterMmaFrom;
    const size_t planes_off = total;
    if (split) total += (3 * sizeof(uint16_t) * E * H + 255) & ~(size_t)255;
    const size_t state_off = total;
    const size_t zeroed = (4 * (2 + (size_t)E) + 255) & ~(size_t)255;
    total += zeroed + 4 * (2 + (size_t)E); // operator state: the counters (zeroed); W4A4 divisors
    if (cudaMalloc(&m->dev, total) != cudaSuccess) {
        free(m);
        cudaGetLastError();
        return nf_error_set(err, NF_ERR_CUDA, "sparse_moe bind: cannot allocate %zu bytes of device memory", total);
    }
    m->dev_bytes = total;
    m->counter = (int *)(m->dev + state_off);
    if (cudaMemset(m->counter, 0, zeroed) != cudaSuccess) {
        nf_sparse_moe_free(m);
        return nf_error_set(err, NF_ERR_CUDA, "sparse_moe bind: cannot clear the operator state");
    }
    m->a4 = strcmp(profile, "nvfp4-w4a4") == 0;
    if (m->a4) {
        float *h = (float *)calloc(2 + E, sizeof(float));
        if (!h) {
            nf_sparse_moe_free(m);
            return nf_error_set(err, NF_ERR_NOMEM, "sparse_moe bind: out of memory");
        }
        h[0] = input_divisor_of(&b->gate_up, 0);
        h[1] = has_shared ? input_divisor_of(&b->shared_down, 0) : 1.0f;
        for (uint32_t e = 0; e < E; e++) h[2 + e] = input_divisor_of(&b->down, e);
        m->a4div = (const float *)(m->dev + state_off + zeroed);
        const cudaError_t ce = cudaMemcpy((void *)m->a4div, h, 4 * (2 + (size_t)E), cudaMemcpyHostToDevice);
        free(h);
        if (ce != cudaSuccess) {
            nf_sparse_moe_free(m);
            return nf_error_set(err, NF_ERR_CUDA, "sparse_moe bind: cannot upload the W4A4 divisors");
        }
    }
    for (int i = 0; i < nmat; i++) {
        s = devmat_upload(want[i].mm, m->dev + off[i], &m->m[i], mat_name[i], err);
        if (s) {
            nf_error_prefix(err, "sparse_moe bind");
            nf_sparse_moe_free(m);
            return s;
        }
    }
    m->rplanes = {b->router.codec == NF_CODEC_BF16 ? (const uint16_t *)m->m[M_ROUTER].data : nullptr, 1};
    if (split) {
        uint16_t *planes = (uint16_t *)(m->dev + planes_off);
        if ((s = split_router(&b->router, H, planes, err)) != NF_OK) {
            nf_sparse_moe_free(m);
            return s;
        }
        m->rplanes = {planes, 3};
    }
    m->tensor = tensor_prefill(m);
    m->deq_from = !m->a4 && isfinite(prefill_wg_tall_from(2 /* bf16 */))
                      ? dequant_from(m->codec[M_GATE_UP], m->codec[M_DOWN])
                      : UINT32_MAX;
    // the mmq route: k-quant / q8_0 routed gate/up and down that allow int8 activations (the W·A8
    // pair the small-token route runs), in shapes its kernel takes
    m->mmq_ok = !m->a4 && b->gate_up.allow_a8 && b->down.allow_a8 &&
                mmq_supported(m->codec[M_GATE_UP], m->m[M_GATE_UP], true) &&
                mmq_supported(m->codec[M_DOWN], m->m[M_DOWN], false) && H % 32 == 0 && I % 32 == 0;
    m->mmq_max = m->mmq_ok ? mmq_route_max(m->codec[M_GATE_UP]) : 0;
    m->sh_mmq = m->mmq_ok && has_shared && b->shared_gate_up.allow_a8 && b->shared_down.allow_a8 &&
                mmq_supported(m->codec[M_SGU], m->m[M_SGU], true) &&
                mmq_supported(m->codec[M_SDOWN], m->m[M_SDOWN], false);
    // the small-token route's shared expert on int8 activations: matrices that allow them, codecs with
    // int8 spans, whole 64-element spans of the intermediate (the gate/up's quantised output and the
    // down by rows)
    m->sh_a8 = has_shared && b->shared_gate_up.allow_a8 && b->shared_down.allow_a8 && S % 64 == 0 &&
               gemv_a8_supported(m->codec[M_SGU], m->m[M_SGU]) && gemv_a8_supported(m->codec[M_SDOWN], m->m[M_SDOWN]);
    layout_workspace(m, max_tokens);
    // the uploads and the counters' memset ran on the legacy stream (a pageable cudaMemcpy may return
    // before its DMA lands); a caller's non-blocking stream would not wait for them
    if (cudaDeviceSynchronize() != cudaSuccess) {
        nf_sparse_moe_free(m);
        return nf_error_set(err, NF_ERR_CUDA, "sparse_moe bind: %s", cudaGetErrorString(cudaGetLastError()));
    }
    *workspace_bytes = m->ws_bytes;
    *out = m;
    return NF_OK;
}

extern "C" void nf_sparse_moe_free(nf_sparse_moe *m)
{
    if (!m) return;
    cudaFree(m->dev);
    free(m);
}

extern "C" const char *nf_sparse_moe_profile(const nf_sparse_moe *m) { return m->profile; }
extern "C" size_t nf_sparse_moe_weight_bytes(const nf_sparse_moe *m) { return m->dev_bytes; }

extern "C" nf_moe_route nf_sparse_moe_route(const nf_sparse_moe *m, uint32_t tokens)
{
    if (tokens <= m->decode_max) return NF_MOE_ROUTE_DECODE;
    // where the mmq route runs, it takes over from the small-token route at its own frontier
    uint32_t mmq_small = m->mmq_max ? mmq_small_max(m->codec[M_GATE_UP]) : UINT32_MAX;
    const nf_moe_bank &b = m->bank;
    if (m->mmq_max && m->sh_mmq && 2 * b.shared_inter >= b.top_k * b.inter)
        mmq_small = mmq_small_max_big_shared(m->codec[M_GATE_UP]);
    const uint32_t small_max = m->small_max < mmq_small ? m->small_max : mmq_small;
    if (tokens <= small_max) return NF_MOE_ROUTE_SMALL;
    if (tokens <= m->mmq_max) return NF_MOE_ROUTE_MMQ;
    return NF_MOE_ROUTE_PREFILL;
}

extern "C" const char *nf_moe_route_name(nf_moe_route r)
{
    static const char *const names[] = {"decode", "small-token", "prefill", "mmq"};
    return (unsigned)r < 4 ? names[r] : "unknown";
}

extern "C" void nf_sparse_moe_set_tile_height(nf_sparse_moe *m, uint32_t height)
{
    m->tile_m = height == 32 || height == 64 || height == 128 ? (int)height : 0;
}

extern "C" void nf_sparse_moe_set_thresholds(nf_sparse_moe *m, uint32_t decode_max, uint32_t small_max)
{
    if (small_max > kSmallRouteMax) small_max = kSmallRouteMax;
    if (decode_max > small_max) decode_max = small_max;
    m->decode_max = decode_max;
    m->small_max = small_max;
}

extern "C" void nf_sparse_moe_set_mmq_max(nf_sparse_moe *m, uint32_t mmq_max)
{
    m->mmq_max = !m->mmq_ok ? 0 : mmq_max > kMmqMaxTokens ? kMmqMaxTokens : mmq_max;
}

static Routing routing_at(const nf_sparse_moe *m, uint8_t *ws)
{
    Routing r;
    r.logits = (float *)(ws + m->o_logits);
    r.topk_id = (int32_t *)(ws + m->o_id);
    r.topk_w = (float *)(ws + m->o_w);
    r.shared_g = (float *)(ws + m->o_sg);
    r.slot = (int32_t *)(ws + m->o_slot);
    r.pos_entry = (int32_t *)(ws + m->o_pos);
    r.n_groups = (int32_t *)(ws + m->o_ng);
    r.g_expert = (int32_t *)(ws + m->o_ge);
    r.g_start = (int32_t *)(ws + m->o_gs);
    r.g_count = (int32_t *)(ws + m->o_gc);
    r.shared_group = (int32_t *)(ws + m->o_sgrp);
    r.wl_base = (int32_t *)(ws + m->o_wlb);
    r.wl_state = m->counter + 1;
    int32_t *tiles = (int32_t *)(ws + m->o_tiles);
    r.n_tiles = tiles;
    r.tile_group = tiles + 1;
    r.tile_m0 = r.tile_group + m->max_tiles;
    r.sh_n_tiles = r.tile_m0 + m->max_tiles;
    r.sh_tile_group = r.sh_n_tiles + 1;
    r.sh_tile_m0 = r.sh_tile_group + (m->max_tokens + kPrefillTileMinM - 1) / kPrefillTileMinM;
    r.tile_m = r.sh_tile_m = kPrefillTileM;
    return r;
}

extern "C" void nf_sparse_moe_routing(const nf_sparse_moe *m, void *workspace, const int32_t **ids,
                                      const float **weights)
{
    Routing r = routing_at(m, (uint8_t *)workspace);
    *ids = r.topk_id;
    *weights = r.topk_w;
}

// The slice's tile tables as the prefill GEMMs read them (the work list cut them at these heights).
static TileList routed_tiles(const Routing &r, uint32_t T, uint32_t k, const Groups &g)
{
    const uint32_t h = (uint32_t)r.tile_m;
    return TileList{r.n_tiles, r.tile_group, r.tile_m0, (T * k + h - 1) / h + g.max_groups, r.tile_m};
}
// The shared expert's one group of every position (the four ints of the routing's shared_group), as
// the routes' GEMMs and GEMVs read it.
static Groups shared_groups(const Routing &r)
{
    return Groups{r.shared_group, r.shared_group + 1, r.shared_group + 2, r.shared_group + 3, nullptr, 1, 1};
}
static TileList shared_tiles(const Routing &r, uint32_t T)
{
    const uint32_t h = (uint32_t)r.sh_tile_m;
    return TileList{r.sh_n_tiles, r.sh_tile_group, r.sh_tile_m0, (T + h - 1) / h, r.sh_tile_m};
}

// The W4A4 prefill slice (nvfp4-w4a4): x encoded once with the gate/up input divisor; the gate/up
// GEMMs write the intermediate encoded with each expert's down input divisor (the shared expert's:
// shared_down's); the down GEMMs write y (bf16; the shared expert's ys f32) with both divisors
// applied; the combine weights it.
static cudaError_t prefill_slice_a4(const nf_sparse_moe *m, const uint16_t *x, uint32_t T, uint16_t *out,
                                    uint8_t *ws, const Routing &r, Groups g, cudaStream_t s)
{
    const nf_moe_bank &b = m->bank;
    const uint32_t k = b.top_k, H = b.hidden, I = b.inter, S = b.shared_inter;
    const A4Plane xq = a4_plane(ws + m->o_xq, T, H), aq = a4_plane(ws + m->o_aq, (size_t)T * k, I);
    void *y = ws + m->o_y;
    const TileList tl = routed_tiles(r, T, k, g), sl = shared_tiles(r, T);
    const float *ga = m->a4div, *gsd = m->a4div + 1, *gd = m->a4div + 2;
    cudaError_t e = launch_a4_encode(x, T, H, ga, xq, s);
    if (e == cudaSuccess) e = launch_prefill_gemm_a4(true, m->m[M_GATE_UP], A4Args{xq, ga, 0, aq, gd}, g, tl, nullptr, 0, false, s);
    g.pos_entry = nullptr;
    if (e == cudaSuccess)
        e = launch_prefill_gemm_a4(false, m->m[M_DOWN], A4Args{aq, gd, 1, A4Plane{}, nullptr}, g, tl, y, H, true, s);
    float *ys = nullptr;
    if (e == cudaSuccess && m->has_shared) {
        const A4Plane saq = a4_plane(ws + m->o_saq, T, S);
        ys = (float *)(ws + m->o_ys);
        const Groups sg = shared_groups(r);
        // the shared group is expert 0, so gsd[0] is shared_down's divisor
        e = launch_prefill_gemm_a4(true, m->m[M_SGU], A4Args{xq, ga, 0, saq, gsd}, sg, sl, nullptr, 0, false, s);
        if (e == cudaSuccess)
            e = launch_prefill_gemm_a4(false, m->m[M_SDOWN], A4Args{saq, gsd, 1, A4Plane{}, nullptr}, sg, sl, ys, H, false, s);
    }
    if (e != cudaSuccess) return e;
    launch_combine(r, y, true, ys, T, H, k, out, s);
    return cudaGetLastError();
}

// The prefill route's slice: tensor-core grouped GEMMs for gate/up (SwiGLU epilogue, bf16 act) and
// down (bf16 y per position; the shared expert's ys f32), the same for the shared expert over all T
// tokens, then the combine.
static cudaError_t prefill_slice(const nf_sparse_moe *m, const uint16_t *x, uint32_t T, uint16_t *out, uint8_t *ws,
                                 const Routing &r, Groups g, cudaStream_t s)
{
    if (m->a4) return prefill_slice_a4(m, x, T, out, ws, r, g, s);
    const nf_moe_bank &b = m->bank;
    const uint32_t k = b.top_k, H = b.hidden, I = b.inter, S = b.shared_inter;
    uint16_t *acth = (uint16_t *)(ws + m->o_acth);
    void *y = ws + m->o_y;
    const TileList tl = routed_tiles(r, T, k, g), sl = shared_tiles(r, T);
    // the dequant route: each routed GEMM on a bf16 copy of its active experts (one scratch, reused)
    const bool deq = T >= m->deq_from;
    uint16_t *scratch = (uint16_t *)(ws + m->o_deq);
    DevMat gu = m->m[M_GATE_UP], dn = m->m[M_DOWN]; // the bank's, or (deq) the copy's descriptors
    const int cgu = deq ? 2 /* bf16 */ : m->codec[M_GATE_UP], cdn = deq ? 2 : m->codec[M_DOWN];
    cudaError_t e = cudaSuccess;
    if (deq) e = launch_dequant_bf16(m->codec[M_GATE_UP], m->m[M_GATE_UP], g, scratch, &gu, s);
    if (e == cudaSuccess) e = launch_prefill_gemm(cgu, true, gu, x, H, g, tl, acth, I, false, s);
    if (e != cudaSuccess) return e;
    g.pos_entry = nullptr;
    if (deq) e = launch_dequant_bf16(m->codec[M_DOWN], m->m[M_DOWN], g, scratch, &dn, s);
    if (e == cudaSuccess) e = launch_prefill_gemm(cdn, false, dn, acth, I, g, tl, y, H, true, s);
    float *ys = nullptr;
    if (e == cudaSuccess && m->has_shared) {
        uint16_t *actsh = (uint16_t *)(ws + m->o_actsh);
        ys = (float *)(ws + m->o_ys);
        const Groups sg = shared_groups(r);
        e = launch_prefill_gemm(m->codec[M_SGU], true, m->m[M_SGU], x, H, sg, sl, actsh, S, false, s);
        if (e == cudaSuccess) e = launch_prefill_gemm(m->codec[M_SDOWN], false, m->m[M_SDOWN], actsh, S, sg, sl, ys, H, false, s);
    }
    if (e != cudaSuccess) return e;
    launch_combine(r, y, true, ys, T, H, k, out, s);
    return cudaGetLastError();
}

// The mmq route's slice (mmq.cu): x quantised once per 32 elements, the routed gate/up on int8 tensor
// cores with SwiGLU and the intermediate's quantisation in its epilogue, the routed down (y f32), the
// shared expert the same way over all T positions (sh_mmq: its one group's tiles; the routed down has
// consumed the intermediate plane, so the shared one reuses it; ys f32) or, where its matrices do not
// allow int8 activations, as on the small-token route (f32 CUDA-core GEMVs), then the combine.
static cudaError_t mmq_slice(const nf_sparse_moe *m, const uint16_t *x, uint32_t T, uint16_t *out, uint8_t *ws,
                             const Routing &r, Groups g, cudaStream_t s)
{
    const nf_moe_bank &b = m->bank;
    const uint32_t k = b.top_k, H = b.hidden, S = b.shared_inter;
    int8_t *xq = (int8_t *)(ws + m->o_mxq), *aq = (int8_t *)(ws + m->o_maq);
    float2 *xd = (float2 *)(ws + m->o_mxd), *ad = (float2 *)(ws + m->o_mad);
    float *y = (float *)(ws + m->o_y);
    const TileList tl = routed_tiles(r, T, k, g);
    cudaError_t e = launch_mmq_quant(x, true, T, H, xq, xd, s);
    if (e == cudaSuccess)
        e = launch_mmq(m->codec[M_GATE_UP], true, m->m[M_GATE_UP], xq, xd, g, tl, nullptr, 0, aq, ad, s);
    g.pos_entry = nullptr;
    if (e == cudaSuccess) e = launch_mmq(m->codec[M_DOWN], false, m->m[M_DOWN], aq, ad, g, tl, y, H, nullptr, nullptr, s);
    float *ys = nullptr;
    if (e == cudaSuccess && m->has_shared) {
        ys = (float *)(ws + m->o_ys);
        const Groups sg = shared_groups(r);
        if (m->sh_mmq) {
            const TileList sl = shared_tiles(r, T);
            e = launch_mmq(m->codec[M_SGU], true, m->m[M_SGU], xq, xd, sg, sl, nullptr, 0, aq, ad, s);
            if (e == cudaSuccess)
                e = launch_mmq(m->codec[M_SDOWN], false, m->m[M_SDOWN], aq, ad, sg, sl, ys, H, nullptr, nullptr, s);
        } else {
            float *acts = (float *)(ws + m->o_acts);
            e = launch_gemv(m->codec[M_SGU], true, m->m[M_SGU], x, true, H, sg, acts, S, T, s);
            if (e == cudaSuccess) e = launch_gemv(m->codec[M_SDOWN], false, m->m[M_SDOWN], acts, false, S, sg, ys, H, T, s);
        }
    }
    if (e != cudaSuccess) return e;
    launch_combine(r, y, false, ys, T, H, k, out, s);
    return cudaGetLastError();
}

// The shared expert's mmq tile height: 64 positions where that still gives gate/up a CTA an SM (its
// 2S / 128 row blocks times the tiles), else 32, whose twice as many CTAs fill the SMs at the
// route's small-T end (S = 512, T = 512: 64 CTAs of 64 positions against 132 SMs). Every output is
// its row's fold over K whichever tile holds its position, so the height changes no bit.
static int shared_mmq_tile(const nf_sparse_moe *m, uint32_t T)
{
    if (m->tile_m == 32 || m->tile_m == 64) return m->tile_m;
    const uint64_t ctas64 = (uint64_t)(2 * m->bank.shared_inter / 128) * ((T + 63) / 64);
    return ctas64 >= (uint64_t)sm_count() ? 64 : 32;
}

// Whether gate/up prefetches the routed experts' down bytes into L2 (NextMat): at one token it is
// latency-bound with DRAM to spare, and 8 experts' down (~10 MB at qwen3-30b-a3b q6_k) stay in L2 for
// the down launch. With more tokens the active experts' down outgrows the L2 (T = 8: ~52 experts,
// ~65 MB against an H100's 50 MB): the prefetched lines are evicted before down reads them, and
// gate/up's DRAM time carries them (ncu, H100, T = 8: gate/up read ~150 MB for ~92 MB of its own
// weights). So only while they fit half the L2.
static bool prefetch_down(uint32_t groups, uint64_t expert_bytes)
{
    return groups * expert_bytes <= (uint64_t)device_attr<cudaDevAttrL2CacheSize>() / 2;
}

// One slice of T <= max_tokens tokens.
static cudaError_t forward_slice(const nf_sparse_moe *m, const uint16_t *x, uint32_t T, uint16_t *out, uint8_t *ws,
                                 cudaStream_t s)
{
    const nf_moe_bank &b = m->bank;
    const uint32_t E = b.experts, k = b.top_k, H = b.hidden, I = b.inter, S = b.shared_inter;
    const nf_moe_route route = nf_sparse_moe_route(m, T);
    const bool small = (route == NF_MOE_ROUTE_DECODE || route == NF_MOE_ROUTE_SMALL) && T <= kSmallRouteMax;
    const bool mmq = route == NF_MOE_ROUTE_MMQ;
    Routing r = routing_at(m, ws);
    // W4A4 runs prefill.cu's kernel: no wide tile (prefill_tile_height)
    const int wg_gu = m->a4 ? -1 : T >= m->deq_from ? 2 : m->codec[M_GATE_UP];
    const int wg_sgu = m->a4 ? -1 : m->codec[M_SGU];
    r.tile_m = m->tile_m ? m->tile_m : prefill_tile_height((double)T * k / E, wg_gu);
    // the mmq kernel's position tiles: 32 or 64 (a tile's dead n-tiles of 8 cost no MMAs, so the
    // taller tile only pays where the groups fill it: from 24 positions an expert on average)
    if (mmq) r.tile_m = m->tile_m == 32 || m->tile_m == 64 ? m->tile_m : (double)T * k / E > 24 ? 64 : 32;
    r.sh_tile_m = mmq && m->sh_mmq ? shared_mmq_tile(m, T) : m->tile_m ? m->tile_m : prefill_tile_height(T, wg_sgu);
    launch_routing(m->m[M_ROUTER], m->codec[M_ROUTER], m->rplanes, m->has_shared ? &m->m[M_SGATE] : nullptr,
                   m->codec[M_SGATE], x, T, H, E, k, b.norm_topk, r, m->forced_ids, m->counter, small, s);
    float *act = (float *)(ws + m->o_act), *y = (float *)(ws + m->o_y);
    const uint32_t max_groups = T * k < E ? T * k : E;
    Groups g{r.n_groups, r.g_expert, r.g_start, r.g_count, r.pos_entry, k, max_groups};
    if (mmq) return mmq_slice(m, x, T, out, ws, r, g, s);
    if (!small && m->tensor)
        return prefill_slice(m, x, T, out, ws, r, g, s);
    // decode/small-token: gate/up waits for the router on the device (programmatic dependent
    // launch), prefetches the routed experts' down bytes into L2 for the fused down kernel and
    // may quantise the activations to int8 (gate/up codecs with int8 spans: gemv_a8.cu)
    const DevMat &dn = m->m[M_DOWN];
    const bool pf = small && prefetch_down(max_groups, (uint64_t)dn.rows * dn.row_stride);
    // the down quantises its input to int8 only where gate/up took int8 activations too (the W·A8
    // pair test_sparse_moe's reference models: every codec with int8 spans, spans_a8.cuh); behind a
    // gate/up without them (q2_k) it stays f32 whatever its own codec. From two tokens on gate/up
    // hands it the intermediate already quantised.
    const bool gu_a8 = b.gate_up.allow_a8 && gemv_a8_supported(m->codec[M_GATE_UP], m->m[M_GATE_UP]);
    const bool dn_a8 = small && gu_a8 && b.down.allow_a8 && down_a8_supported(m->codec[M_DOWN], dn, T, k);
    const bool q8act = dn_a8 && T > 1 && I % 64 == 0;
    int8_t *aq = q8act ? (int8_t *)(ws + m->o_sq8) : nullptr;
    float2 *ad = q8act ? (float2 *)(ws + m->o_sd8) : nullptr;
    const GemvLaunch gl{pf ? NextMat{dn.data, (uint64_t)dn.rows * dn.row_stride} : NextMat{nullptr, 0}, small,
                        T == 1, small && b.gate_up.allow_a8, false, nullptr, nullptr, aq, ad};
    cudaError_t e = launch_gemv_ex(m->codec[M_GATE_UP], true, m->m[M_GATE_UP], x, true, H, g, act, I, T, gl, s);
    float *ys = nullptr;
    if (e == cudaSuccess && m->has_shared) {
        ys = (float *)(ws + m->o_ys);
        const Groups sg = shared_groups(r);
        if (q8act && m->sh_a8) {
            // as a routed expert: its intermediate quantised by gate/up, the down by rows into ys
            int8_t *saq = (int8_t *)(ws + m->o_ssq8);
            float2 *sad = (float2 *)(ws + m->o_ssd8);
            const GemvLaunch sgl{NextMat{nullptr, 0}, true, false, true, false, nullptr, nullptr, saq, sad};
            e = launch_gemv_ex(m->codec[M_SGU], true, m->m[M_SGU], x, true, H, sg, nullptr, S, T, sgl, s);
            if (e == cudaSuccess) e = launch_down_rows_a8(m->codec[M_SDOWN], m->m[M_SDOWN], saq, sad, sg, T, ys, true, s);
        } else {
            float *acts = (float *)(ws + m->o_acts);
            e = launch_gemv(m->codec[M_SGU], true, m->m[M_SGU], x, true, H, sg, acts, S, T, s);
            if (e == cudaSuccess) e = launch_gemv(m->codec[M_SDOWN], false, m->m[M_SDOWN], acts, false, S, sg, ys, H, T, s);
        }
    }
    if (e != cudaSuccess) return e;
    if (q8act && T >= kDownRowsFrom) { // the down by rows into y, then the combine (down_a8.cu says why)
        g.pos_entry = nullptr;
        e = launch_down_rows_a8(m->codec[M_DOWN], dn, aq, ad, g, T, y, true, s);
        return e == cudaSuccess ? launch_combine(r, y, false, ys, T, H, k, out, s, true) : e;
    }
    if (dn_a8) return launch_down_a8(m->codec[M_DOWN], dn, act, aq, ad, r, T, k, ys, out, true, s);
    if (small && down_mma_supported(m->codec[M_DOWN], dn, T, k)) // nvfp4 and bf16 on tensor cores
        return launch_down_mma(m->codec[M_DOWN], dn, act, r, T, k, ys, out, true, s);
    if (small) return launch_down_combine(m->codec[M_DOWN], dn, act, r, T, k, max_groups, ys, out, true, s);
    g.pos_entry = nullptr;
    e = launch_gemv(m->codec[M_DOWN], false, m->m[M_DOWN], act, false, I, g, y, H, T, s);
    if (e != cudaSuccess) return e;
    launch_combine(r, y, false, ys, T, H, k, out, s);
    return cudaGetLastError();
}

extern "C" nf_status nf_sparse_moe_forward(const nf_sparse_moe *m, const uint16_t *x, uint32_t tokens, uint16_t *out,
                                           void *workspace, void *stream, nf_error *err)
{
    if ((uintptr_t)workspace % 256)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "sparse_moe forward: workspace %p is not 256-byte aligned", workspace);
    const uint32_t H = m->bank.hidden;
    for (uint32_t t0 = 0; t0 < tokens; t0 += m->max_tokens) {
        const uint32_t T = tokens - t0 < m->max_tokens ? tokens - t0 : m->max_tokens;
        cudaError_t e = forward_slice(m, x + (size_t)t0 * H, T, out + (size_t)t0 * H, (uint8_t *)workspace,
                                      (cudaStream_t)stream);
        if (e != cudaSuccess)
            return nf_error_set(err, NF_ERR_CUDA, "sparse_moe forward (%s, T = %u): %s", m->profile, T,
                                cudaGetErrorString(e));
    }
    return NF_OK;
}

extern "C" void nf_sparse_moe_force_routing(nf_sparse_moe *m, const int32_t *ids) { m->forced_ids = ids; }

extern "C" size_t nf_sparse_moe_workspace_bytes(const nf_sparse_moe *m, uint32_t tokens)
{
    nf_sparse_moe probe = *m; // the layout is a function of the shapes and the chunk only
    layout_workspace(&probe, tokens < m->max_tokens ? tokens : m->max_tokens);
    return probe.ws_bytes;
}
