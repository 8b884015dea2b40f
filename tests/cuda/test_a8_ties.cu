// The W·A8 reference's near-tie enumeration and per-element bound (tests/common/moe_ref.c,
// nf_moe_ref_token_a8), on the CPU: what test_sparse_moe holds the decode and small-token routes of
// k-quant / q8_0 banks to. Needs nvcc to build (the span arithmetic of spans_a8.cuh), no GPU to run
// (label cpu).
//
// 1. Crafted blocks (nf_moe_ref_a8_block): an intermediate within its interval of a rint tie is
//    enumerated a whole step away; one just outside is not; a block whose amax interval moves d
//    departs by |q| times d's range only; a one-step error of an element outside the enumerated set
//    exceeds its departure.
// 2. An emulated device on random banks: the routed gate/up and down in the kernels' own fp32
//    arithmetic (the span policies, lane order and butterflies of gemv_a8.cu and down_a8.cu, the
//    int8 quantiser of quant_a8.cuh; silu with the host's expf, which may differ from the device's
//    by 2 ulps, inside the intervals' slack), the router in the CUDA-core prefill router's fp32
//    order (the decode and small routes' cluster router adds on tensor cores, which no CPU repeats:
//    its bound, logit_err_cluster, is wider than this chain's), the shared gate in the cluster router's
//    order, the shared expert in fp32 in gemv.cu's shape at T = 1 (16-element pieces per lane and the
//    butterfly, over the CPU's dequantized weights rather than the codecs' exact piece layout) and from
//    two tokens as a routed expert (gemv_a8.cu, its intermediate quantised, the down by rows) where its
//    codecs have int8 spans. Every emulated intermediate must lie in the reference's interval, every emulated
//    quantisation in its enumerated set, every output element within 1.01 bound + 2^-8 |ref| (the
//    bf16 rounding). The emulation exhibits flips like the one that failed test_sparse_moe's wide
//    shared profile on the H200 (docs/sparse_moe.md, "W·A8 near ties").
//    The same for the mmq route (mmq.cu, moe_ref.h's route 1): gate/up and down rows as mmq.cuh's
//    policies take them (the staged slices, the groups' int8 words, scales and folds in element
//    order), the intermediate quantised per position, y in f32 and combine.cu's fmas in j order,
//    the shared expert's fma last; the shared expert runs the same int8 rows (its one expert) where
//    its codecs are mmq's (moe_ref.h's shared_a8).
// 3. Strength: planted errors on the emulated device fail the same allowance: a one-step flip of
//    an intermediate outside the enumerated set (the most visible one of each token), an
//    intermediate quantised with its neighbour block's scale, the largest and smallest routing
//    weights exchanged.
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <algorithm>
#include <vector>

#include "backend/cuda/sparse_moe/internal.cuh"
#include "backend/cuda/sparse_moe/mmq.cuh"
#include "backend/cuda/sparse_moe/spans_a8.cuh"

extern "C" {
#include "codec/codec.h"
#include "common/cuda_test_util.h"
#include "common/moe_ref.h"
}
#include "common/mmq_rowdot.h"
#include "nf_test.h"

namespace {

uint64_t rng = 0x7A1E5C0FFEE1234Bull;
float nrand() { return nf_test_nrand(&rng); }

// ---- 1. crafted blocks --------------------------------------------------------------------------

void test_block()
{
    double a[32], da[32], v[32], dev[32];
    // element 0 holds the amax 1.27 (d = 1.27f / 127); element 1 sits 1e-7 steps above the tie 14.5,
    // element 2 at 14.3 steps, element 3 2e-5 steps above the tie 3.5, the rest spread below 1
    const float d = 1.27f / 127.0f;
    for (int i = 0; i < 32; i++) a[i] = 0.3 * sin(1.0 + i), da[i] = 1e-9;
    a[0] = 1.27f;
    a[1] = (double)d * (14.5 + 1e-7);
    a[2] = (double)d * 14.3;
    a[3] = (double)d * (3.5 + 2e-5);
    da[1] = 1e-7; // reaches the tie: 1e-7 > 1e-7 d
    da[3] = 1e-8; // does not: the tie is 2e-5 d = 2e-7 away
    uint32_t near = 0;
    nf_moe_ref_a8_block(a, da, v, dev, &near);
    printf("block: near %u; tie within reach: v %.9g dev %.3g (step %.3g); 14.3 steps: dev %.3g; tie out of reach: "
           "dev %.3g\n",
           near, v[1], dev[1], (double)d, dev[2], dev[3]);
    CHECK_MSG(v[1] == (double)d * 14.0 || v[1] == (double)d * 15.0, "tie element quantised to %.9g", v[1]);
    CHECK_MSG(dev[1] >= (double)d * (1 - 1e-6), "a tie within reach is enumerated a whole step away (dev %.3g)", dev[1]);
    CHECK_MSG(near == 1, "exactly one element near a tie (%u)", near);
    CHECK_MSG(dev[2] < 1e-4 * d && dev[3] < 1e-4 * d, "elements away from ties depart by ulps (%.3g, %.3g)", dev[2],
              dev[3]);
    // a one-step error of element 3 (outside the enumerated set) exceeds its departure by far
    CHECK(d > 1000 * dev[3]);
    // the amax element's interval moves d: every element departs by |q| times d's range, no step
    da[0] = 1e-6;
    near = 0;
    nf_moe_ref_a8_block(a, da, v, dev, &near);
    const double q2 = v[2] / d, ddr = 1e-6 / 127.0; // d's half-range, before the outward roundings
    printf("block with the amax moving by 1e-6: element 2 (q %.0f) departs %.3g (|q| x d's half-range %.3g)\n", q2,
           dev[2], fabs(q2) * ddr);
    CHECK_MSG(dev[2] >= 0.5 * fabs(q2) * ddr && dev[2] <= 2 * fabs(q2) * ddr, "d's range moves q d by |q| dd (%.3g)",
              dev[2]);
}

// ---- 2. the emulated device ---------------------------------------------------------------------

struct Mat {
    int codec = -1;
    uint32_t experts = 0, rows = 0, cols = 0;
    std::vector<uint8_t> payload, host;
    std::vector<float> deq, off; // off: q4_k/q5_k sub-block offsets m_s (w = d_s q - m_s) per 32
    nf::DevMat W;
    size_t inexact = 0; // weights whose CPU value fl(d_s q - m_s) is not d_s q - m_s
};

Mat make_mat(int codec, uint32_t experts, uint32_t rows, uint32_t cols, float sd)
{
    Mat m;
    m.codec = codec, m.experts = experts, m.rows = rows, m.cols = cols;
    const uint64_t R = (uint64_t)experts * rows;
    const nf_codec *c = nf_codec_get((nf_codec_id)codec);
    const size_t rb = nf_codec_row_bytes(c, cols);
    std::vector<float> w(cols);
    m.payload.resize(R * rb);
    m.deq.resize(R * cols);
    for (uint64_t r = 0; r < R; r++) {
        const float amp = 1.0f + 3.0f * (float)(r % 7) / 6.0f;
        for (uint32_t i = 0; i < cols; i++) w[i] = nrand() * sd * amp;
        c->quantize_row(w.data(), &m.payload[r * rb], cols);
        c->dequantize_row(&m.payload[r * rb], &m.deq[r * cols], cols);
    }
    if (codec == NF_CODEC_Q4_K || codec == NF_CODEC_Q5_K) {
        m.off.resize(R * cols / 32);
        m.inexact = nf_moe_ref_k4_offsets(codec, m.payload.data(), rb, m.deq.data(), R, cols, m.off.data());
    }
    if (codec != NF_CODEC_BF16) {
        nf_moe_matrix mm;
        memset(&mm, 0, sizeof mm);
        mm.codec = codec, mm.data = m.payload.data(), mm.experts = experts, mm.rows = rows, mm.cols = cols;
        mm.divisors = 1;
        size_t bytes = 0;
        nf_error err;
        CHECK(nf::devmat_bytes(&mm, "m", &bytes, &err) == NF_OK);
        m.host.assign(bytes, 0);
        CHECK_MSG(nf::devmat_host(&mm, m.host.data(), &m.W, &err) == NF_OK, "%s", err.msg);
    }
    return m;
}

// one span's dot (accumulated onto acc, as the kernels do)
void span_dot(int codec, const nf::DevMat &W, uint32_t e, uint32_t r, int s, const int8_t *xq, const float2 *xd,
              float *acc)
{
    const uint32_t c = W.cols;
    switch (codec) {
    case NF_CODEC_Q4_K: nf::SpanQ4K::dot<1>(nf::SpanQ4K::load(W, e, r, s), s, xq, xd, c, 1, acc); break;
    case NF_CODEC_Q5_K: nf::SpanQ5K::dot<1>(nf::SpanQ5K::load(W, e, r, s), s, xq, xd, c, 1, acc); break;
    case NF_CODEC_Q6_K: nf::SpanQ6K::dot<1>(nf::SpanQ6K::load(W, e, r, s), s, xq, xd, c, 1, acc); break;
    default: nf::SpanQ8::dot<1>(nf::SpanQ8::load(W, e, r, s), s, xq, xd, c, 1, acc); break;
    }
}
int spans_of(int codec, uint32_t cols) { return (int)(cols / (codec == NF_CODEC_Q8_0 ? 32 : 64)); }

// warp_sum's butterfly over 32 lane values; the value lane 0 ends with
float butterfly(float *v)
{
    for (int o = 16; o > 0; o >>= 1) {
        float n[32];
        for (int l = 0; l < 32; l++) n[l] = v[l] + v[l ^ o];
        memcpy(v, n, sizeof n);
    }
    return v[0];
}

// quant_a8.cuh's quantiser of one row: xq (padded layout), xd = (d, d sum q) per 32
void quantize_dev(const float *x, uint32_t n, std::vector<int8_t> &xq, std::vector<float2> &xd)
{
    xq.assign(nf::a8_stride(n), 0);
    xd.assign(n / 32, make_float2(0, 0));
    for (uint32_t b = 0; b < n / 32; b++) {
        float am = 0;
        for (int i = 0; i < 32; i++) am = fmaxf(am, fabsf(x[32 * b + i]));
        const float d = am / 127.0f;
        int sum = 0;
        for (int i = 0; i < 32; i++) {
            const int q = am > 0 ? (int)rintf(x[32 * b + i] / d) : 0;
            sum += q;
            xq[nf::a8_at(32 * b + i)] = (int8_t)q;
        }
        xd[b] = make_float2(d, d * (float)sum);
    }
}

// gemv_a8.cu's row dot: lane l takes spans l, l + 32, ... in order; then the butterfly
float a8_rowdot(int codec, const nf::DevMat &W, uint32_t e, uint32_t r, const int8_t *xq, const float2 *xd)
{
    float lane[32] = {};
    const int spans = spans_of(codec, W.cols);
    for (int s = 0; s < spans; s++) span_dot(codec, W, e, r, s, xq, xd, &lane[s % 32]);
    return butterfly(lane);
}

// an f32 dot in gemv.cu's shape (lane l takes 16-element pieces l, l + 32, ...; fma chains)
float f32_rowdot(const float *w, const float *x, uint32_t n)
{
    float lane[32] = {};
    for (uint32_t p = 0; p < n / 16; p++)
        for (int i = 0; i < 16; i++) lane[p % 32] = fmaf(w[16 * p + i], x[16 * p + i], lane[p % 32]);
    return butterfly(lane);
}

// quantize_dev's values in the plain layout mmq.cu's planes use
std::vector<int8_t> plain(const std::vector<int8_t> &padded, uint32_t n)
{
    std::vector<int8_t> v(n);
    for (uint32_t i = 0; i < n; i++) v[i] = padded[nf::a8_at(i)];
    return v;
}

struct Profile {
    const char *name;
    int gu, dn, sgu, sdn; // sgu < 0: no shared expert
    uint32_t E, K;
    int norm;
    uint32_t tokens;
};

struct Bank {
    uint32_t H = 256, I = 256, S = 256, E = 0, K = 0;
    Mat router, gu, dn, sgu, sdn, sg;
    bool shared = false;
    bool shared_a8 = false;      // the mmq route runs the shared expert on int8 activations (mmq codecs)
    bool shared_rows_a8 = false; // the small-token route does from two tokens (sparse_moe.cu's sh_a8)
    int norm = 1;
};

// A planted error of the emulated device (none: the device as the kernels compute).
enum Plant { NONE, NEIGHBOUR_SCALE, SWAPPED };

struct Emu {
    std::vector<float> out; // [H] before the bf16 rounding
    std::vector<int32_t> ids;
    std::vector<float> w;                 // [K] routing weights
    std::vector<std::vector<float>> act;  // [K][I] intermediates, by the reference's expert order
    std::vector<std::vector<int8_t>> aq;  // quantised, by the work list's group order (ascending id)
    std::vector<std::vector<float2>> ad;
    std::vector<int> order; // group g's entry j
};

// The kernels a token goes through: the decode route's (T = 1: gemv_a8.cu, down_a8_kernel), the
// small-token route's from two tokens (the same gate/up, down_rows_kernel's rows into y and the
// combine), or the mmq route's (the router is the same there below T = 512; the shared expert runs
// the mmq kernels too where its codecs allow: shared_a8).
enum Route { DECODE, ROWS, MMQ };
const char *route_name(Route r) { return r == DECODE ? "" : r == ROWS ? "rows " : "mmq "; }

// Whether a route runs the shared expert on int8 activations (the mmq kernels, or from two tokens
// the small-token route's gemv_a8 and down by rows) rather than in f32.
bool shared_on_int8(const Bank &b, Route route) { return route == MMQ ? b.shared_a8 : route == ROWS && b.shared_rows_a8; }

// down_rows_kernel's dot of one row: L lanes, lane i takes spans i, i + L, ... in order, the
// butterfly over the L lanes (xor L / 2, ..., 1)
float rows_rowdot(int codec, const nf::DevMat &W, uint32_t e, uint32_t r, const int8_t *xq, const float2 *xd)
{
    const int spans = spans_of(codec, W.cols), L = nf::down_rows_lanes(spans); // the kernel's lanes a row
    float lane[16] = {};
    for (int s = 0; s < spans; s++) span_dot(codec, W, e, r, s, xq, xd, &lane[s % L]);
    for (int o = L / 2; o > 0; o >>= 1) {
        float n[16];
        for (int l = 0; l < L; l++) n[l] = lane[l] + lane[l ^ o];
        memcpy(lane, n, sizeof n);
    }
    return lane[0];
}

// The shared expert on int8 activations (sh8), as a routed expert on the route's kernels: gate/up rows
// r, S + r of its one expert over x's int8 rows, SwiGLU, the intermediate quantised per 32, the down
// rows over it, ys in f32. mmq: mmq.cu's policies over the plain planes (xp); else the small-token
// route's from two tokens (gemv_a8.cu, the down by rows).
std::vector<float> shared_a8_ys(const Bank &b, bool mmq, const std::vector<int8_t> &xq, const std::vector<int8_t> &xp,
                                const std::vector<float2> &xd)
{
    const uint32_t H = b.H, S = b.S;
    auto gu = [&](uint32_t r) {
        return mmq ? mmq_rowdot(b.sgu.codec, b.sgu.W, 0, r, xp.data(), xd.data())
                   : a8_rowdot(b.sgu.codec, b.sgu.W, 0, r, xq.data(), xd.data());
    };
    std::vector<float> as(S), ys(H);
    for (uint32_t r = 0; r < S; r++) {
        const float g = gu(r), v = gu(r + S);
        as[r] = g / (1.0f + expf(-g)) * v;
    }
    std::vector<int8_t> aq;
    std::vector<float2> ad;
    quantize_dev(as.data(), S, aq, ad);
    const std::vector<int8_t> ap = plain(aq, S);
    for (uint32_t h = 0; h < H; h++)
        ys[h] = mmq ? mmq_rowdot(b.sdn.codec, b.sdn.W, 0, h, ap.data(), ad.data())
                    : rows_rowdot(b.sdn.codec, b.sdn.W, 0, h, aq.data(), ad.data());
    return ys;
}

Emu emulate(const Bank &b, const float *x, Plant plant, Route route)
{
    const bool mmq = route == MMQ;
    const uint32_t H = b.H, I = b.I, S = b.S, E = b.E, K = b.K;
    Emu u;
    // router.cu: logits by 8-element chunks per lane (bf16 products exact), butterfly; softmax_stats
    std::vector<float> lg(E);
    for (uint32_t e = 0; e < E; e++) {
        float lane[32] = {};
        for (uint32_t c = 0; c < H / 8; c++)
            for (int i = 0; i < 8; i++) lane[c % 32] = fmaf(b.router.deq[(size_t)e * H + 8 * c + i], x[8 * c + i], lane[c % 32]);
        lg[e] = butterfly(lane);
    }
    float mv[32], sv[32];
    for (int l = 0; l < 32; l++) {
        mv[l] = -INFINITY;
        for (uint32_t e = l; e < E; e += 32) mv[l] = fmaxf(mv[l], lg[e]);
    }
    for (int o = 16; o > 0; o >>= 1) {
        float n[32];
        for (int l = 0; l < 32; l++) n[l] = fmaxf(mv[l], mv[l ^ o]);
        memcpy(mv, n, sizeof n);
    }
    const float mx = mv[0];
    for (int l = 0; l < 32; l++) {
        sv[l] = 0;
        for (uint32_t e = l; e < E; e += 32) sv[l] += expf(lg[e] - mx);
    }
    const float sum = butterfly(sv);
    std::vector<char> taken(E, 0);
    float psum = 0;
    for (uint32_t j = 0; j < K; j++) {
        int best = -1;
        for (uint32_t e = 0; e < E; e++)
            if (!taken[e] && (best < 0 || lg[e] > lg[best])) best = (int)e;
        taken[best] = 1;
        u.ids.push_back(best);
        u.w.push_back(expf(lg[best] - mx) / sum);
        psum += u.w.back();
    }
    if (b.norm)
        for (float &p : u.w) p = p / psum;
    if (plant == SWAPPED) std::swap(u.w[0], u.w[K - 1]); // the largest and the smallest weight exchanged
    // the shared gate (lanes take elements lane, lane + 32, ...) and the shared expert in f32 (the
    // mmq route's int8 one below, once x is quantised)
    std::vector<float> ys(H, 0.0f);
    float sg = 0;
    if (b.shared) { // router_cluster.cu's cluster_gate_part: CTA c of 16 takes columns c H16 .. (H16 =
        // ceil(H / 16)), a thread columns tid, tid + 256, ..., each warp's butterfly, the 8 warps' sums, then the
        // 16 CTAs', in order
        const uint32_t h16 = (H + 15) / 16;
        float v = 0.0f;
        for (uint32_t c = 0; c < 16; c++) {
            float thr[256] = {}, part = 0.0f;
            for (uint32_t i = 0; i < h16 && c * h16 + i < H; i++) {
                const uint32_t h = c * h16 + i;
                thr[i % 256] = fmaf(b.sg.deq[h], x[h], thr[i % 256]);
            }
            for (int w = 0; w < 8; w++) part += butterfly(thr + 32 * w);
            v += part;
        }
        sg = 1.0f / (1.0f + expf(-v));
    }
    const bool sh8 = shared_on_int8(b, route);
    if (b.shared && !sh8) {
        std::vector<float> as(S);
        for (uint32_t r = 0; r < S; r++) {
            const float g = f32_rowdot(&b.sgu.deq[(size_t)r * H], x, H), v = f32_rowdot(&b.sgu.deq[(size_t)(S + r) * H], x, H);
            as[r] = g / (1.0f + expf(-g)) * v;
        }
        for (uint32_t h = 0; h < H; h++) ys[h] = f32_rowdot(&b.sdn.deq[(size_t)h * S], as.data(), S);
    }
    // gate/up (gemv_a8.cu) and the intermediate's quantisation (down_a8.cu's stage_act)
    std::vector<int8_t> xq;
    std::vector<float2> xd;
    quantize_dev(x, H, xq, xd);
    u.act.assign(K, std::vector<float>(I));
    const std::vector<int8_t> xp = plain(xq, H);
    if (sh8) ys = shared_a8_ys(b, mmq, xq, xp, xd);
    for (uint32_t j = 0; j < K; j++)
        for (uint32_t r = 0; r < I; r++) {
            const float g = mmq ? mmq_rowdot(b.gu.codec, b.gu.W, u.ids[j], r, xp.data(), xd.data())
                                : a8_rowdot(b.gu.codec, b.gu.W, u.ids[j], r, xq.data(), xd.data());
            const float v = mmq ? mmq_rowdot(b.gu.codec, b.gu.W, u.ids[j], r + I, xp.data(), xd.data())
                                : a8_rowdot(b.gu.codec, b.gu.W, u.ids[j], r + I, xq.data(), xd.data());
            u.act[j][r] = g / (1.0f + expf(-g)) * v; // rowdot.cuh's silu, then the product
        }
    u.order.resize(K);
    for (uint32_t j = 0; j < K; j++) u.order[j] = (int)j;
    std::sort(u.order.begin(), u.order.end(), [&](int p, int q) { return u.ids[p] < u.ids[q]; }); // groups by id
    u.aq.resize(K), u.ad.resize(K);
    for (uint32_t g = 0; g < K; g++) {
        quantize_dev(u.act[u.order[g]].data(), I, u.aq[g], u.ad[g]);
        if (plant == NEIGHBOUR_SCALE) { // every block quantised right, scaled by its neighbour's d
            std::vector<float2> d2 = u.ad[g];
            for (uint32_t blk = 0; blk < I / 32; blk++) u.ad[g][blk] = d2[blk ^ 1];
        }
    }
    // down_a8.cu: items g * spans + s over the lanes in order, each span's dot times its weight,
    // the butterfly, then the shared expert's fma
    const int spans = spans_of(b.dn.codec, I);
    u.out.resize(H);
    if (route != DECODE) { // y[position][h] in f32, then combine.cu: fmas in j (entry) order, the shared expert's last
        std::vector<std::vector<int8_t>> ap(K);
        for (uint32_t g = 0; g < K; g++) ap[g] = plain(u.aq[g], I);
        for (uint32_t h = 0; h < H; h++) {
            float a = 0.0f;
            for (uint32_t j = 0; j < K; j++) {
                const uint32_t g = (uint32_t)(std::find(u.order.begin(), u.order.end(), (int)j) - u.order.begin());
                const float y = mmq ? mmq_rowdot(b.dn.codec, b.dn.W, u.ids[j], h, ap[g].data(), u.ad[g].data())
                                    : rows_rowdot(b.dn.codec, b.dn.W, u.ids[j], h, u.aq[g].data(), u.ad[g].data());
                a = fmaf(u.w[j], y, a);
            }
            if (b.shared) a = fmaf(sg, ys[h], a);
            u.out[h] = a;
        }
        return u;
    }
    for (uint32_t h = 0; h < H; h++) {
        float lane[32] = {};
        for (int i = 0; i < (int)K * spans; i++) {
            const int g = i / spans, s = i % spans;
            float d = 0;
            span_dot(b.dn.codec, b.dn.W, u.ids[u.order[g]], h, s, u.aq[g].data(), u.ad[g].data(), &d);
            lane[i % 32] += u.w[u.order[g]] * d;
        }
        float v = butterfly(lane);
        if (b.shared) v = fmaf(sg, ys[h], v);
        u.out[h] = v;
    }
    return u;
}

Bank make_bank(const Profile &p)
{
    Bank b;
    b.E = p.E, b.K = p.K, b.norm = p.norm, b.shared = p.sgu >= 0;
    const float sdx = 1.0f / sqrtf((float)b.H), sdi = 1.0f / sqrtf((float)b.I);
    b.router = make_mat(NF_CODEC_BF16, 1, b.E, b.H, 3.0f * sdx);
    b.gu = make_mat(p.gu, b.E, 2 * b.I, b.H, sdx);
    b.dn = make_mat(p.dn, b.E, b.H, b.I, sdi);
    if (b.shared) {
        b.sgu = make_mat(p.sgu, 1, 2 * b.S, b.H, sdx);
        b.sdn = make_mat(p.sdn, 1, b.H, b.S, 1.0f / sqrtf((float)b.S));
        b.sg = make_mat(NF_CODEC_BF16, 1, 1, b.H, sdx);
        b.shared_a8 = nf::mmq_codec(p.sgu) && nf::mmq_codec(p.sdn);
        b.shared_rows_a8 = b.S % 64 == 0 && nf::gemv_a8_supported(p.sgu, b.sgu.W) && nf::gemv_a8_supported(p.sdn, b.sdn.W);
    }
    return b;
}

struct Verdict {
    size_t bad = 0;
    double worst = 0;
};

// the emulated output (f32, before rounding) against the reference's allowance
Verdict judge(const std::vector<float> &dev, const double *out, const double *bound, uint32_t H)
{
    Verdict v;
    for (uint32_t h = 0; h < H; h++) {
        const double g = nf_test_bf2f(nf_test_f2bf(dev[h])), lim = 1.01 * bound[h] + ldexp(fabs(out[h]), -8);
        const double d = fabs(g - out[h]);
        v.bad += !(d <= lim);
        v.worst = fmax(v.worst, d / lim);
    }
    return v;
}

void test_profile(const Profile &p, Route route)
{
    const bool mmq = route == MMQ;
    Bank b = make_bank(p);
    const uint32_t H = b.H, I = b.I, K = b.K;
    CHECK_MSG(b.gu.inexact == 0 && b.dn.inexact == 0, "%s: %zu + %zu k-quant weights whose CPU value is inexact", p.name,
              b.gu.inexact, b.dn.inexact);
    nf_moe_ref m = {H, b.E, K, I, b.shared ? b.S : 0, b.norm, b.router.deq.data(), b.gu.deq.data(), b.dn.deq.data(),
                    b.shared ? b.sgu.deq.data() : nullptr, b.shared ? b.sdn.deq.data() : nullptr,
                    b.shared ? b.sg.deq.data() : nullptr};
    const bool sh8 = shared_on_int8(b, route); // the reference's too
    CHECK_MSG(!sh8 || (b.sgu.inexact == 0 && b.sdn.inexact == 0), "%s: %zu + %zu shared k-quant weights whose CPU "
              "value is inexact", p.name, b.sgu.inexact, b.sdn.inexact);
    const nf_moe_ref_a8 a8 = {p.gu,
                              b.gu.off.empty() ? nullptr : b.gu.off.data(),
                              b.dn.off.empty() ? nullptr : b.dn.off.data(),
                              mmq ? 1 : 0,
                              sh8,
                              sh8 ? p.sgu : 0,
                              sh8 && !b.sgu.off.empty() ? b.sgu.off.data() : nullptr,
                              sh8 && !b.sdn.off.empty() ? b.sdn.off.data() : nullptr};
    std::vector<float> x(H);
    std::vector<double> out(H), bound(H), a(I), da(I), v(32), dev(32), w(K);
    std::vector<int32_t> ids(K);
    size_t routed_diff = 0, outside_interval = 0, not_enumerated = 0, bad = 0, flips = 0, step_tokens = 0,
           step_caught = 0, neighbour_caught = 0, swap_caught = 0;
    uint32_t near = 0;
    double worst = 0, worst_interval = 0, ratio_sum = 0, ratio_max = 0, l2_b = 0, l2_r = 0;
    for (uint32_t t = 0; t < p.tokens; t++) {
        for (uint32_t i = 0; i < H; i++) x[i] = nf_test_bf2f(nf_test_f2bf(nrand()));
        double gap;
        nf_moe_ref_route(&m, x.data(), ids.data(), w.data(), &gap);
        nf_moe_ref_token_a8(&m, &a8, x.data(), ids.data(), w.data(), out.data(), bound.data(), &near);
        Emu e = emulate(b, x.data(), NONE, route);
        if (e.ids != ids) { // a near-tie routing difference: not this test's subject
            routed_diff++;
            continue;
        }
        // the intermediates: inside their intervals; their quantisation inside the enumerated set
        int best_j = -1, best_r = 0;
        double best_vis = 0;
        for (uint32_t g = 0; g < K; g++) {
            const int j = e.order[g];
            nf_moe_ref_a8_inter(&m, &a8, x.data(), ids[j], a.data(), da.data());
            for (uint32_t blk = 0; blk < I / 32; blk++) {
                nf_moe_ref_a8_block(&a[32 * blk], &da[32 * blk], v.data(), dev.data(), nullptr);
                const float dd = e.ad[g][blk].x;
                for (int i = 0; i < 32; i++) {
                    const uint32_t r = 32 * blk + i;
                    const double dv = (double)dd * e.aq[g][nf::a8_at(r)], dep = fabs(dv - v[i]);
                    const double off = fabs((double)e.act[j][r] - a[r]);
                    worst_interval = fmax(worst_interval, off / da[r]);
                    outside_interval += !(off <= da[r]);
                    not_enumerated += !(dep <= dev[i]);
                    if (dep > 0.5 * dd) {
                        flips++;
                        printf("  %s token %u: expert %d intermediate %u quantises a step from the reference's (%.9g "
                               "vs %.9g; enumerated departure %.3g)\n",
                               p.name, t, ids[j], r, dv, v[i], dev[i]);
                    }
                    // the most visible one-step error outside the enumerated set (for part 3)
                    if (dev[i] < 0.5 * dd) {
                        double vis = 0;
                        for (uint32_t h = 0; h < H; h++)
                            vis = fmax(vis, fabs(w[j] * dd * b.dn.deq[((size_t)ids[j] * H + h) * I + r]) /
                                                (1.01 * bound[h] + ldexp(fabs(out[h]), -8)));
                        if (vis > best_vis) best_vis = vis, best_j = j, best_r = (int)r;
                    }
                }
            }
        }
        const Verdict vd = judge(e.out, out.data(), bound.data(), H);
        bad += vd.bad;
        worst = fmax(worst, vd.worst);
        for (uint32_t h = 0; h < H; h++) {
            l2_b += bound[h] * bound[h], l2_r += out[h] * out[h];
        }
        // 3. planted errors
        if (best_j >= 0) { // a one-step flip of the most visible intermediate outside the enumerated set
            std::vector<float> o = e.out;
            const float dd = e.ad[std::find(e.order.begin(), e.order.end(), best_j) - e.order.begin()][best_r / 32].x;
            for (uint32_t h = 0; h < H; h++)
                o[h] += (float)(w[best_j] * dd * b.dn.deq[((size_t)ids[best_j] * H + h) * I + best_r]);
            step_tokens++;
            step_caught += judge(o, out.data(), bound.data(), H).bad > 0;
        }
        neighbour_caught += judge(emulate(b, x.data(), NEIGHBOUR_SCALE, route).out, out.data(), bound.data(), H).bad > 0;
        swap_caught += judge(emulate(b, x.data(), SWAPPED, route).out, out.data(), bound.data(), H).bad > 0;
        // the old allowance (2^-8 |ref| + 1e-5 max|ref|, this token's max) against the new
        double mxr = 0;
        for (uint32_t h = 0; h < H; h++) mxr = fmax(mxr, fabs(out[h]));
        for (uint32_t h = 0; h < H; h++) {
            const double r = (1.01 * bound[h] + ldexp(fabs(out[h]), -8)) / (ldexp(fabs(out[h]), -8) + 1e-5 * mxr);
            ratio_sum += r, ratio_max = fmax(ratio_max, r);
        }
    }
    const uint32_t n = p.tokens - (uint32_t)routed_diff;
    printf("%s%s: E %u k %u, %u tokens (%zu with near-tie routing skipped): %.2f near-tie intermediates a token, %zu "
           "emulated flips; intermediates within %.3f of their interval; output worst %.3f of its allowance, %zu outside; "
           "rel-L2 limit %.3e (2^-8 = %.3e); allowance / old allowance mean %.2f max %.1f\n",
           route_name(route), p.name, b.E, K, p.tokens, routed_diff, (double)near / p.tokens, flips, worst_interval, worst, bad,
           (1.01 * sqrt(l2_b) + ldexp(sqrt(l2_r), -8)) / sqrt(l2_r), ldexp(1.0, -8), ratio_sum / ((double)n * H), ratio_max);
    printf("%s planted: one-step flip outside the enumerated set caught in %zu of %zu tokens; neighbour block's scale "
           "%zu of %u; largest and smallest routing weight exchanged %zu of %u\n",
           p.name, step_caught, step_tokens, neighbour_caught, n, swap_caught, n);
    CHECK_MSG(outside_interval == 0, "%s: %zu emulated intermediates outside the reference's interval (worst %.2f)",
              p.name, outside_interval, worst_interval);
    CHECK_MSG(not_enumerated == 0, "%s: %zu emulated quantisations outside the enumerated set", p.name, not_enumerated);
    CHECK_MSG(bad == 0, "%s: %zu emulated outputs outside their allowance (worst %.2f)", p.name, bad, worst);
    CHECK_MSG(step_caught == step_tokens, "%s: a one-step flip outside the enumerated set passed in %zu of %zu tokens",
              p.name, step_tokens - step_caught, step_tokens);
    CHECK_MSG(neighbour_caught == n, "%s: the neighbour block's scale passed in %zu tokens", p.name, n - neighbour_caught);
    CHECK_MSG(swap_caught == n, "%s: exchanged routing weights passed in %zu tokens", p.name, n - swap_caught);
}

} // namespace

int main(void)
{
    test_block();
    // gate/up and down codecs of test_sparse_moe's W·A8 profiles (q4_k and q5_k offsets on gate/up
    // and on down), with and without renormalisation and a shared expert
    const Profile profiles[] = {
        {"q4_k+q6_k/q4_k+q6_k", NF_CODEC_Q4_K, NF_CODEC_Q6_K, NF_CODEC_Q4_K, NF_CODEC_Q6_K, 64, 8, 1, 400},
        {"q5_k+q4_k/q8_0+q5_k", NF_CODEC_Q5_K, NF_CODEC_Q4_K, NF_CODEC_Q8_0, NF_CODEC_Q5_K, 32, 4, 0, 64},
        {"q8_0+q8_0", NF_CODEC_Q8_0, NF_CODEC_Q8_0, -1, -1, 16, 4, 1, 64},
    };
    for (Route r : {DECODE, ROWS, MMQ}) // each route's chains
        for (const Profile &p : profiles) test_profile(p, r);
    return nf_test_report();
}
