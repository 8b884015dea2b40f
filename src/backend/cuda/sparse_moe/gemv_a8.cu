// The int8-activation GEMV for k-quant and q8_0 weights (W4A8 / W5A8 / W6A8 / W8A8): the sparse-MoE
// decode and small-token routes' gate/up (GLU: a warp owns a gate/up row pair) and the decoder's dense
// linear layers and LM head at small T (plain: a warp owns two consecutive rows).
//
// Why: with f32 activations every weight element costs a nibble extract, an int-to-float, a scale
// and an FMA (about 6 instructions), which keeps the f32 GEMV far from the DRAM rate at decode
// sizes. Here each CTA quantises its tokens' rows once, per 32-element block (the q4_k sub-block):
//     d = amax / 127,  q = rint(x / d),  so  |x - d q| <= d (1/2 + 2^-17)
// (the 2^-17 covers the f32 rounding of x / d, |x / d| <= 127), and a sub-block's dot is
//     sum_i (dw sc q4_i - dmin m) d q_i = dw sc d (sum_i q4_i q_i) - dmin m (d sum_i q_i)
// with the integer sum taken four products at a time by dp4a: about 0.6 instructions per weight
// element and row. The result is the exact dot with the quantised activations up to fp32 rounding;
// tests/cuda/test_sparse_moe.cu repeats the quantisation bit for bit in its reference.
//
// q5_k adds the fifth bit, q6_k has 16-element signed scales and an offset of 32 (taken inside the
// bytes, so dp4a sees q - 32), q8_0 is the same without the min term. A lane takes a span of 64
// (k-quants) or 32 (q8_0) elements of a row at a time (the span policies below), for each of its two
// rows, with every load of both rows issued before any use.
#include "internal.cuh"
#include "rowdot.cuh"

namespace nf {

namespace {

constexpr int kWarps = 8; // output row pairs per CTA

// Quantises nt bf16 input rows (positions pos0.. through g) into xq[t][cols] (int8) and
// xd[t][cols / 32] = (d, d * sum q). A thread takes 8 elements, four lanes a block; every lane of a
// warp runs the same iterations (the shuffles need them), cols % 32 == 0 keeps a block's lanes
// together.
__device__ void stage_q8(const uint16_t *in, uint32_t in_stride, const Groups &g, int pos0, int nt, uint32_t cols,
                         int8_t *xq, float2 *xd)
{
    const uint32_t vecs = cols / 8, total = (uint32_t)nt * vecs;
    for (uint32_t base = 0; base < total; base += blockDim.x) {
        const uint32_t v = base + threadIdx.x;
        const bool ok = v < total;
        float f[8];
        uint4 raw = make_uint4(0, 0, 0, 0);
        if (ok) {
            const int t = (int)(v / vecs), pos = pos0 + t;
            const int row = g.pos_entry ? g.pos_entry[pos] / (int)g.entry_div : pos;
            raw = *reinterpret_cast<const uint4 *>(in + (size_t)row * in_stride + (v % vecs) * 8);
        }
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
        float am = 0.f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
            am = fmaxf(am, fmaxf(fabsf(f[2 * i]), fabsf(f[2 * i + 1])));
        }
        am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 1));
        am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 2));
        const float d = am / 127.0f;
        int sum = 0;
        uint32_t packed[2] = {0, 0};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int q = am > 0.f ? __float2int_rn(f[i] / d) : 0;
            sum += q;
            packed[i / 4] |= (uint32_t)(q & 0xFF) << (8 * (i % 4));
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (ok) {
            *reinterpret_cast<uint2 *>(xq + (size_t)v * 8) = make_uint2(packed[0], packed[1]);
            if (v % 4 == 0) xd[v / 4] = make_float2(d, d * (float)sum);
        }
    }
}

// Span policies: what a lane takes of a row at a time, its loads, and its dot with MAXT tokens'
// quantised activations (xq[t][cols] int8, xd[t][cols / 32] = (d, d sum q)).
//
// The dot of a q4_k / q5_k span (sub-blocks 2j and 2j + 1: values lo[8], hi[8] as bytes, scales d1,
// d2, mins mm1, mm2) with MAXT tokens' activations from element e0.
template <int MAXT>
__device__ __forceinline__ void k4_span_dot(const int lo_w[8], const int hi_w[8], float d1, float mm1, float d2,
                                            float mm2, uint32_t e0, const int8_t *xq, const float2 *xd,
                                            uint32_t cols, int nt, float *acc)
{
#pragma unroll
    for (int t = 0; t < MAXT; t++) {
        if (t >= nt) break;
        const int4 *xv = reinterpret_cast<const int4 *>(xq + (size_t)t * cols + e0);
        const int4 x0 = xv[0], x1 = xv[1], x2 = xv[2], x3 = xv[3];
        const int lo[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        const int hi[8] = {x2.x, x2.y, x2.z, x2.w, x3.x, x3.y, x3.z, x3.w};
        int sa = 0, sb = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) sa = __dp4a(lo_w[k], lo[k], sa), sb = __dp4a(hi_w[k], hi[k], sb);
        const float2 da = xd[(size_t)t * (cols / 32) + e0 / 32], db = xd[(size_t)t * (cols / 32) + e0 / 32 + 1];
        float a = acc[t];
        a = fmaf(d1 * da.x, (float)sa, a);
        a = fmaf(-mm1, da.y, a);
        a = fmaf(d2 * db.x, (float)sb, a);
        a = fmaf(-mm2, db.y, a);
        acc[t] = a;
    }
}

// q4_k: 32 bytes of the qs plane (block b = s / 4, j = s % 4) = sub-blocks 2j (low nibbles) and
// 2j+1 (high nibbles), elements b*256 + j*64 + [0, 64), plus the block's 12 scale bytes and d/dmin.
struct SpanQ4K {
    static constexpr uint32_t kSpanElems = 64; // a row has cols / kSpanElems spans
    struct Raw {
        uint4 qa, qb;
        uint32_t sc[3], dm;
    };
    __device__ static Raw load(const DevMat &W, uint32_t e, uint32_t r, int s)
    {
        const CQ4K::Row R = CQ4K::row(W, e, r);
        const int blk = s >> 2, j = s & 3;
        const uint4 *q = reinterpret_cast<const uint4 *>(R.qs + blk * 128 + j * 32);
        Raw w{q[0], q[1]};
        k4_load_scales(R.sc, R.dm, blk, w.sc, w.dm);
        return w;
    }
    template <int MAXT>
    __device__ static void dot(const Raw &w, int s, const int8_t *xq, const float2 *xd, uint32_t cols, int nt,
                               float *acc)
    {
        const int j = s & 3;
        float d1, mm1, d2, mm2;
        k4_sub_scales(w.sc, w.dm, j, d1, mm1, d2, mm2);
        const uint32_t q[8] = {w.qa.x, w.qa.y, w.qa.z, w.qa.w, w.qb.x, w.qb.y, w.qb.z, w.qb.w};
        int lo4[8], hi4[8];
#pragma unroll
        for (int k = 0; k < 8; k++) lo4[k] = (int)(q[k] & 0x0F0F0F0Fu), hi4[k] = (int)((q[k] >> 4) & 0x0F0F0F0Fu);
        k4_span_dot<MAXT>(lo4, hi4, d1, mm1, d2, mm2, (uint32_t)((s >> 2) * 256 + j * 64), xq, xd, cols, nt, acc);
    }
};

// q5_k: q4_k's span plus the block's 32 qh bytes (bit 2j of qh[l] tops element j*64 + l, bit 2j + 1
// tops element j*64 + 32 + l); the four spans of a block read the same qh bytes (one L1 line).
struct SpanQ5K {
    static constexpr uint32_t kSpanElems = 64; // a row has cols / kSpanElems spans
    struct Raw {
        uint4 qa, qb, ha, hb;
        uint32_t sc[3], dm;
    };
    __device__ static Raw load(const DevMat &W, uint32_t e, uint32_t r, int s)
    {
        const CQ5K::Row R = CQ5K::row(W, e, r);
        const int blk = s >> 2, j = s & 3;
        const uint4 *q = reinterpret_cast<const uint4 *>(R.qs + blk * 128 + j * 32);
        const uint4 *h = reinterpret_cast<const uint4 *>(R.qh + blk * 32);
        Raw w{q[0], q[1], h[0], h[1]};
        k4_load_scales(R.sc, R.dm, blk, w.sc, w.dm);
        return w;
    }
    template <int MAXT>
    __device__ static void dot(const Raw &w, int s, const int8_t *xq, const float2 *xd, uint32_t cols, int nt,
                               float *acc)
    {
        const int j = s & 3;
        const uint32_t e0 = (uint32_t)((s >> 2) * 256 + j * 64);
        float d1, mm1, d2, mm2;
        k4_sub_scales(w.sc, w.dm, j, d1, mm1, d2, mm2);
        const uint32_t q[8] = {w.qa.x, w.qa.y, w.qa.z, w.qa.w, w.qb.x, w.qb.y, w.qb.z, w.qb.w};
        const uint32_t h[8] = {w.ha.x, w.ha.y, w.ha.z, w.ha.w, w.hb.x, w.hb.y, w.hb.z, w.hb.w};
        int lo5[8], hi5[8];
#pragma unroll
        for (int k = 0; k < 8; k++) {
            lo5[k] = (int)((q[k] & 0x0F0F0F0Fu) | (((h[k] >> (2 * j)) & 0x01010101u) << 4));
            hi5[k] = (int)(((q[k] >> 4) & 0x0F0F0F0Fu) | (((h[k] >> (2 * j + 1)) & 0x01010101u) << 4));
        }
        k4_span_dot<MAXT>(lo5, hi5, d1, mm1, d2, mm2, e0, xq, xd, cols, nt, acc);
    }
};

// q6_k: span s = (block s / 4, half n = (s / 2) % 2, l-range h = s % 2 of 16): 16 bytes of ql at l,
// 16 at l + 32, 16 of qh, i.e. four runs of 16 elements, b*256 + n*128 + 32m + 16h + [0, 16) for
// m = 0..3, with scales sc[n*8 + h + 2m]. The 6-bit values (0..63) become q - 32 per byte as
// (v + 0x60) ^ 0x80 (no carry leaves a byte: v + 0x60 <= 159), so dp4a takes them signed.
struct SpanQ6K {
    static constexpr uint32_t kSpanElems = 64; // a row has cols / kSpanElems spans
    struct Raw {
        uint4 qa, qb, qh;
        uint2 sc;
        uint16_t d;
    };
    __device__ static Raw load(const DevMat &W, uint32_t e, uint32_t r, int s)
    {
        const CQ6K::Row R = CQ6K::row(W, e, r);
        const int blk = s >> 2, n = (s >> 1) & 1, h = s & 1;
        const uint8_t *ql = R.ql + blk * 128 + n * 64 + h * 16;
        return Raw{*reinterpret_cast<const uint4 *>(ql), *reinterpret_cast<const uint4 *>(ql + 32),
                   *reinterpret_cast<const uint4 *>(R.qh + blk * 64 + n * 32 + h * 16),
                   *reinterpret_cast<const uint2 *>(R.sc + blk * 16 + n * 8),
                   *reinterpret_cast<const uint16_t *>(R.d + blk * 2)};
    }
    template <int MAXT>
    __device__ static void dot(const Raw &w, int s, const int8_t *xq, const float2 *xd, uint32_t cols, int nt,
                               float *acc)
    {
        const int h = s & 1;
        const uint32_t e0 = (uint32_t)((s >> 2) * 256 + ((s >> 1) & 1) * 128 + h * 16);
        const float d = h2f(w.d);
        // sc bytes h, h + 2 (word x) and h, h + 2 (word y) are runs m = 0..3
        const float sc[4] = {d * (float)(int8_t)(w.sc.x >> (8 * h)), d * (float)(int8_t)(w.sc.x >> (8 * h + 16)),
                             d * (float)(int8_t)(w.sc.y >> (8 * h)), d * (float)(int8_t)(w.sc.y >> (8 * h + 16))};
        const uint32_t a[4] = {w.qa.x, w.qa.y, w.qa.z, w.qa.w}, b[4] = {w.qb.x, w.qb.y, w.qb.z, w.qb.w},
                       hh[4] = {w.qh.x, w.qh.y, w.qh.z, w.qh.w};
        int v[4][4]; // [run m][word]
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint32_t lo[4] = {a[k] & 0x0F0F0F0Fu, b[k] & 0x0F0F0F0Fu, (a[k] >> 4) & 0x0F0F0F0Fu,
                                    (b[k] >> 4) & 0x0F0F0F0Fu};
#pragma unroll
            for (int m = 0; m < 4; m++)
                v[m][k] = (int)(((lo[m] | (((hh[k] >> (2 * m)) & 0x03030303u) << 4)) + 0x60606060u) ^ 0x80808080u);
        }
#pragma unroll
        for (int t = 0; t < MAXT; t++) {
            if (t >= nt) break;
            float acc_t = acc[t];
#pragma unroll
            for (int m = 0; m < 4; m++) {
                const int4 x = *reinterpret_cast<const int4 *>(xq + (size_t)t * cols + e0 + 32 * m);
                int sum = __dp4a(v[m][0], x.x, 0);
                sum = __dp4a(v[m][1], x.y, sum);
                sum = __dp4a(v[m][2], x.z, sum);
                sum = __dp4a(v[m][3], x.w, sum);
                acc_t = fmaf(sc[m] * xd[(size_t)t * (cols / 32) + (e0 + 32 * m) / 32].x, (float)sum, acc_t);
            }
            acc[t] = acc_t;
        }
    }
};

// q8_0: one block, 32 signed bytes and its f16 scale: sum_i dw qw_i d qx_i = dw d (sum qw qx).
struct SpanQ8 {
    static constexpr uint32_t kSpanElems = 32; // a row has cols / kSpanElems spans
    struct Raw {
        uint4 qa, qb;
        uint16_t d;
    };
    __device__ static Raw load(const DevMat &W, uint32_t e, uint32_t r, int s)
    {
        const CQ8::Row R = CQ8::row(W, e, r);
        const uint4 *q = reinterpret_cast<const uint4 *>(R.qs + s * 32);
        return Raw{q[0], q[1], *reinterpret_cast<const uint16_t *>(R.d + s * 2)};
    }
    template <int MAXT>
    __device__ static void dot(const Raw &w, int s, const int8_t *xq, const float2 *xd, uint32_t cols, int nt,
                               float *acc)
    {
        const float d = h2f(w.d);
        const int q[8] = {(int)w.qa.x, (int)w.qa.y, (int)w.qa.z, (int)w.qa.w,
                          (int)w.qb.x, (int)w.qb.y, (int)w.qb.z, (int)w.qb.w};
#pragma unroll
        for (int t = 0; t < MAXT; t++) {
            if (t >= nt) break;
            const int4 *xv = reinterpret_cast<const int4 *>(xq + (size_t)t * cols + s * 32);
            const int4 x0 = xv[0], x1 = xv[1];
            const int xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
            int sum = 0;
#pragma unroll
            for (int k = 0; k < 8; k++) sum = __dp4a(q[k], xw[k], sum);
            acc[t] = fmaf(d * xd[(size_t)t * (cols / 32) + s].x, (float)sum, acc[t]);
        }
    }
};

// A warp owns a pair of rows: GLU, gate row p and up row p + out_rows (output p = silu(gate) * up);
// plain, rows 2p and 2p + 1 (the second absent past an odd row count). A lane keeps NS spans of each
// row in flight: NS = 1 for rows of at most 32 spans (2048-wide k-quant rows), whose registers then
// leave room for a third CTA per SM at T = 1 (one wave fewer of the decode route's gate/up). A CTA owns kWarps pairs of a
// row block and walks blocks blockIdx.x, + gridDim.x, ... (a grid of at most one wave: the
// activations are quantised once per CTA, not once per block), prefetching its next block's rows
// into L2 so DRAM stays busy while it reduces and stores.
// grid: x = CTAs over row blocks, y = group slots. EARLY: one token whose input row is x[0] (the
// decode route), quantised before the grid-dependency wait (gemv.cu says why).
template <class SP, int MAXT, bool GLU, bool EARLY, int NS>
__global__ void __launch_bounds__(kWarps * 32, MAXT == 1 && NS == 1 ? 3 : 2) gemv_a8_kernel(DevMat W, const uint16_t *in, uint32_t in_stride,
                                                                    Groups g, float *out, uint32_t out_stride,
                                                                    int tchunk, NextMat nx, bool ready)
{
    extern __shared__ __align__(16) uint8_t smem[];
    const uint32_t cols = W.cols;
    int8_t *xq = reinterpret_cast<int8_t *>(smem);                  // [tchunk][cols]
    float2 *xd = reinterpret_cast<float2 *>(smem + (size_t)tchunk * cols); // [tchunk][cols / 32]
    if (EARLY) {
        const Groups g0{nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1};
        stage_q8(in, in_stride, g0, 0, 1, cols, xq, xd);
    }
    const int gi = blockIdx.y;
    const uint32_t out_rows = GLU ? W.rows / 2 : W.rows;
    const uint32_t pairs = GLU ? out_rows : (out_rows + 1) / 2, blocks = (pairs + kWarps - 1) / kWarps;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    auto rows_of = [&](uint32_t blk, uint32_t &ra, uint32_t &rb, bool &has_b) {
        const uint32_t p = blk * kWarps + warp;
        ra = GLU ? p : 2 * p;
        has_b = GLU || ra + 1 < out_rows;
        rb = GLU ? p + out_rows : has_b ? ra + 1 : ra;
        return p < pairs;
    };
    auto prefetch = [&](int expert, uint32_t blk, bool l1) { // the warp's two rows of block blk, 128 bytes a lane
        uint32_t ra, rb;
        bool hb;
        if (blk >= blocks || !rows_of(blk, ra, rb, hb)) return;
        for (uint32_t off = lane * 128; off < W.row_stride; off += 32 * 128) {
            const uint8_t *pa = row_ptr(W, expert, ra) + off, *pb = row_ptr(W, expert, rb) + off;
            if (l1) {
                asm volatile("prefetch.global.L1 [%0];" ::"l"(pa));
                asm volatile("prefetch.global.L1 [%0];" ::"l"(pb));
            } else {
                asm volatile("prefetch.global.L2 [%0];" ::"l"(pa));
                asm volatile("prefetch.global.L2 [%0];" ::"l"(pb));
            }
        }
    };
    // The first rows travel to L1 while the activations are quantised, or, when the group tables
    // are ready, while the predecessor still runs.
    if (ready && gi < *g.n) prefetch(g.expert[gi], blockIdx.x, true);
    cudaGridDependencySynchronize();
    cudaTriggerProgrammaticLaunchCompletion();
    if (gi >= *g.n) return;
    const int expert = g.expert[gi], start = g.start[gi], count = g.count[gi];
    if (!ready) prefetch(expert, blockIdx.x, true);
    prefetch_expert(nx, (uint32_t)expert);
    const int spans = (int)(cols / SP::kSpanElems);

    for (int c0 = 0; c0 < count; c0 += tchunk) {
        const int nt = min(tchunk, count - c0);
        if (!EARLY) {
            __syncthreads(); // the previous chunk's readers are done with xq
            stage_q8(in, in_stride, g, start + c0, nt, cols, xq, xd);
        }
        __syncthreads();
        for (uint32_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
            uint32_t ra, rb;
            bool has_b;
            if (!rows_of(blk, ra, rb, has_b)) break;
            prefetch(expert, blk + gridDim.x, false);
            for (int t0 = 0; t0 < nt; t0 += MAXT) {
                const int n = min(MAXT, nt - t0);
                float a[MAXT] = {}, b[MAXT] = {};
                const int8_t *xt = xq + (size_t)t0 * cols;
                const float2 *dt = xd + (size_t)t0 * (cols / 32);
                for (int s0 = lane; s0 < spans; s0 += 32 * NS) {
                    typename SP::Raw wa[NS], wb[NS];
#pragma unroll
                    for (int j = 0; j < NS; j++)
                        if (s0 + 32 * j < spans)
                            wa[j] = SP::load(W, expert, ra, s0 + 32 * j), wb[j] = SP::load(W, expert, rb, s0 + 32 * j);
#pragma unroll
                    for (int j = 0; j < NS; j++)
                        if (s0 + 32 * j < spans) {
                            SP::template dot<MAXT>(wa[j], s0 + 32 * j, xt, dt, cols, n, a);
                            SP::template dot<MAXT>(wb[j], s0 + 32 * j, xt, dt, cols, n, b);
                        }
                }
#pragma unroll
                for (int t = 0; t < MAXT; t++) {
                    if (t >= n) break;
                    const float va = warp_sum(a[t]), vb = warp_sum(b[t]);
                    float *o = out + (size_t)(start + c0 + t0 + t) * out_stride;
                    if (lane == 0) {
                        if (GLU) o[ra] = silu(va) * vb;
                        else {
                            o[ra] = va;
                            if (has_b) o[rb] = vb;
                        }
                    }
                }
            }
        }
    }
}

template <class SP, int MAXT, bool GLU, int NS>
cudaError_t launch_t(const DevMat &W, const uint16_t *in, uint32_t in_stride, const Groups &g, float *out,
                     uint32_t out_stride, uint32_t max_tokens, const GemvLaunch &opt, cudaStream_t s)
{
    const uint32_t out_rows = GLU ? W.rows / 2 : W.rows, pairs = GLU ? out_rows : (out_rows + 1) / 2;
    const uint32_t blocks = (pairs + kWarps - 1) / kWarps;
    const size_t per_token = (size_t)W.cols + W.cols / 32 * sizeof(float2);
    int tchunk = (int)((96 * 1024) / per_token);
    if (tchunk < 1) return cudaErrorInvalidValue;
    if (tchunk > 64) tchunk = 64;
    if (tchunk > (int)max_tokens) tchunk = (int)max_tokens;
    const size_t smem = (size_t)tchunk * per_token;
    const bool early = opt.rows_are_x0 && max_tokens == 1;
    void (*k)(DevMat, const uint16_t *, uint32_t, Groups, float *, uint32_t, int, NextMat, bool) =
        early ? gemv_a8_kernel<SP, MAXT, GLU, true, NS> : gemv_a8_kernel<SP, MAXT, GLU, false, NS>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    // plain (the dense layers, one group): at most one wave of CTAs, each walking several row blocks
    int dev = 0, sms = 0, per_sm = 0;
    if (e == cudaSuccess) e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kWarps * 32, smem);
    if (e != cudaSuccess) return e;
    // (GLU keeps a CTA per block: the routed gate/up of a decode step has ~1.5 waves of blocks, and its
    // measured time is that of one CTA's latency chain, which looping would double.)
    const uint32_t wave = (uint32_t)(sms * (per_sm > 0 ? per_sm : 1));
    const uint32_t grid = GLU || blocks < wave ? blocks : wave;
    return launch_pdl(k, dim3(grid, g.max_groups), dim3(kWarps * 32), smem, opt.pdl, s, W, in, in_stride, g, out,
                      out_stride, tchunk, opt.next, opt.groups_ready);
}

template <class SP, bool GLU>
cudaError_t launch_sp(const DevMat &W, const uint16_t *in, uint32_t in_stride, const Groups &g, float *out,
                      uint32_t out_stride, uint32_t max_tokens, const GemvLaunch &opt, cudaStream_t s)
{
    if (W.cols / SP::kSpanElems <= 32) {
        if (max_tokens <= 1) return launch_t<SP, 1, GLU, 1>(W, in, in_stride, g, out, out_stride, max_tokens, opt, s);
        if (max_tokens <= 4) return launch_t<SP, 4, GLU, 1>(W, in, in_stride, g, out, out_stride, max_tokens, opt, s);
        return launch_t<SP, 8, GLU, 1>(W, in, in_stride, g, out, out_stride, max_tokens, opt, s);
    }
    if (max_tokens <= 1) return launch_t<SP, 1, GLU, 2>(W, in, in_stride, g, out, out_stride, max_tokens, opt, s);
    if (max_tokens <= 4) return launch_t<SP, 4, GLU, 2>(W, in, in_stride, g, out, out_stride, max_tokens, opt, s);
    return launch_t<SP, 8, GLU, 2>(W, in, in_stride, g, out, out_stride, max_tokens, opt, s);
}

template <class SP>
cudaError_t launch_glu(bool glu, const DevMat &W, const uint16_t *in, uint32_t in_stride, const Groups &g, float *out,
                       uint32_t out_stride, uint32_t max_tokens, const GemvLaunch &opt, cudaStream_t s)
{
    return glu ? launch_sp<SP, true>(W, in, in_stride, g, out, out_stride, max_tokens, opt, s)
               : launch_sp<SP, false>(W, in, in_stride, g, out, out_stride, max_tokens, opt, s);
}

} // namespace

bool gemv_a8_supported(int codec, const DevMat &W)
{
    switch (codec) {
    case 3 /* NF_CODEC_Q8_0 */: return W.cols % 32 == 0;
    case 4 /* NF_CODEC_Q4_K */:
    case 5 /* NF_CODEC_Q5_K */:
    case 6 /* NF_CODEC_Q6_K */: return W.cols % 256 == 0;
    default: return false;
    }
}

cudaError_t launch_gemv_a8(int codec, bool glu, const DevMat &W, const uint16_t *in, uint32_t in_stride, const Groups &g,
                           float *out, uint32_t out_stride, uint32_t max_tokens, const GemvLaunch &opt, cudaStream_t s)
{
    switch (codec) {
    case 3: return launch_glu<SpanQ8>(glu, W, in, in_stride, g, out, out_stride, max_tokens, opt, s);
    case 4: return launch_glu<SpanQ4K>(glu, W, in, in_stride, g, out, out_stride, max_tokens, opt, s);
    case 5: return launch_glu<SpanQ5K>(glu, W, in, in_stride, g, out, out_stride, max_tokens, opt, s);
    case 6: return launch_glu<SpanQ6K>(glu, W, in, in_stride, g, out, out_stride, max_tokens, opt, s);
    default: return cudaErrorInvalidValue;
    }
}

} // namespace nf
