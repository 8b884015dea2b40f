// The int8-activation GEMV for k-quant, q8_0, q3_k, iq4_xs and iq4_nl weights (W3A8 .. W8A8): the sparse-MoE
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
#include "ptx.cuh"
#include "quant_a8.cuh"
#include "spans_a8.cuh"

namespace nf {

namespace {

constexpr int kWarps = 8; // output row pairs per CTA

// Quantises nt bf16 input rows (positions pos0.. through g) into xq (nt rows of cols int8, padded:
// quant_a8.cuh) and xd[t][cols / 32]. A thread takes 8 elements, four lanes a block; every lane of a
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
            const int row = input_row(g, pos);
            raw = *reinterpret_cast<const uint4 *>(in + (size_t)row * in_stride + (v % vecs) * 8);
        }
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int i = 0; i < 4; i++) f[2 * i] = __uint_as_float(w[i] << 16), f[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
        quant8_store(f, ok, v, cols, xq, xd);
    }
}

// The nt rows already quantised by launch_mmq_quant (padded: the staged layout) copied into xq/xd in
// 16-byte asynchronous copies (cp.async: every copy of the thread in flight at once, none held in
// registers: a register-staged copy raised the T = 2 .. 16 kernels' spills, ptxas). The caller's
// __syncthreads() publishes them to the CTA.
__device__ void copy_q8(const int8_t *pq, const float2 *pd, const Groups &g, int pos0, int nt, uint32_t cols,
                        int8_t *xq, float2 *xd)
{
    const uint32_t qv = a8_stride(cols) / 16, per = qv + cols / 64, total = (uint32_t)nt * per;
    for (uint32_t v = threadIdx.x; v < total; v += blockDim.x) {
        const uint32_t t = v / per, i = v % per;
        const size_t row = (size_t)input_row(g, pos0 + (int)t);
        if (i < qv) cp_async16(smem_u32(xq + (size_t)t * a8_stride(cols) + 16 * i), pq + row * a8_stride(cols) + 16 * i, 16);
        else cp_async16(smem_u32(xd + (size_t)t * (cols / 32) + 2 * (i - qv)), pd + row * (cols / 32) + 2 * (i - qv), 16);
    }
    cp_async_commit();
    cp_async_wait_all();
}

// A lane's spans s_begin, s_begin + step, ... of rows ra and rb of `expert`, NS of each row (32 apart)
// loaded before any is used, dotted with n tokens' staged activations (xt, dt) into a[] and b[].
template <class SP, int MAXT, int NS>
__device__ __forceinline__ void pair_spans(const DevMat &W, uint32_t expert, uint32_t ra, uint32_t rb, int s_begin,
                                           int step, int spans, const int8_t *xt, const float2 *dt, uint32_t cols, int n,
                                           float (&a)[MAXT], float (&b)[MAXT])
{
    for (int s0 = s_begin; s0 < spans; s0 += step) {
        typename SP::Raw wa[NS], wb[NS];
#pragma unroll
        for (int j = 0; j < NS; j++)
            if (s0 + 32 * j < spans) wa[j] = SP::load(W, expert, ra, s0 + 32 * j), wb[j] = SP::load(W, expert, rb, s0 + 32 * j);
#pragma unroll
        for (int j = 0; j < NS; j++)
            if (s0 + 32 * j < spans) {
                SP::template dot<MAXT>(wa[j], s0 + 32 * j, xt, dt, cols, n, a);
                SP::template dot<MAXT>(wb[j], s0 + 32 * j, xt, dt, cols, n, b);
            }
    }
}

// The KS warps of row pair `pair` (warps pair * KS ..) meet: named barrier 1 + pair, KS * 32 threads.
__device__ __forceinline__ void pair_sync(int pair, int ks)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(1 + pair), "r"(ks * 32) : "memory");
}

// The span policies (what a lane takes of a row at a time) are in spans_a8.cuh.
//
// A warp owns a pair of rows: GLU, gate row p and up row p + out_rows (output p = silu(gate) * up);
// plain, rows 2p and 2p + 1 (the second absent past an odd row count). A lane keeps NS spans of each
// row in flight: NS = 1 for rows of at most 32 spans (2048-wide k-quant rows), whose registers then
// leave room for a third CTA per SM at T = 1 (one wave fewer of the decode route's gate/up). A CTA
// owns kWarps pairs of a row block and walks blocks blockIdx.x, + gridDim.x, ... (plain: a grid of
// at most one wave, so the activations are quantised once per CTA, not once per block), prefetching
// its next block's rows into L2 so DRAM stays busy while it reduces and stores.
// grid: x = CTAs over row blocks, y = group slots. EARLY: one token whose input row is x[0] (the
// decode route), quantised before the grid-dependency wait (gemv.cu says why).
// aq (GLU, MAXT > 1; GemvLaunch::aq): CTA c walks the consecutive blocks 4c .. 4c + 3, whose 32
// outputs of a token are one quantisation block: they gather in shared memory (ys) and leave as
// int8 (aq, ad) instead of f32, so the small-token down copies its input instead of each of its
// CTAs quantising all T k rows of it again (ncu, H100, T = 8: a third of down_a8's instructions).
// KS (plain, T > 1, rows of more than 32 spans): KS warps share a row pair, warp part q taking the
// spans q * 32 NS .., a step of 32 NS KS, and part 0 adding the others' sums in part order (a named
// barrier per pair). At T = 8 the dense o_proj (4096 columns) ran one warp per pair, 8 warps an SM,
// each with all T tokens' dots of its two rows in a row: latency-bound at 12 % occupancy and 320
// GB/s (ncu, H100; docs/perf/moe_small_ncu_h100_2026-12-06.txt).
template <class SP, int MAXT, bool GLU, bool EARLY, int NS, int KS = 1>
__global__ void __launch_bounds__(kWarps * 32, MAXT == 1 && NS == 1 ? 3 : 2)
    gemv_a8_kernel(DevMat W, const uint16_t *in, uint32_t in_stride, Groups g, float *out, uint32_t out_stride,
                   int tchunk, NextMat nx, bool ready, const int8_t *pq, const float2 *pd, int8_t *aq, float2 *ad)
{
    extern __shared__ __align__(16) uint8_t smem[];
    const uint32_t cols = W.cols;
    int8_t *xq = reinterpret_cast<int8_t *>(smem);                                  // tchunk padded rows
    float2 *xd = reinterpret_cast<float2 *>(smem + (size_t)tchunk * a8_stride(cols)); // [tchunk][cols / 32]
    float *ys = reinterpret_cast<float *>(xd + (size_t)tchunk * (cols / 32));        // aq: [tchunk][32]
    const bool q8out = GLU && MAXT > 1 && aq;
    if (EARLY) {
        const Groups g0{nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1};
        stage_q8(in, in_stride, g0, 0, 1, cols, xq, xd);
    }
    const int gi = blockIdx.y;
    const uint32_t out_rows = GLU ? W.rows / 2 : W.rows;
    constexpr int PW = kWarps / KS; // row pairs a block
    const uint32_t pairs = GLU ? out_rows : (out_rows + 1) / 2, blocks = (pairs + PW - 1) / PW;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, part = warp % KS;
    float2 *red = reinterpret_cast<float2 *>(ys); // KS > 1: [PW][KS][MAXT] partial sums (gate or a, up or b)
    auto rows_of = [&](uint32_t blk, uint32_t &ra, uint32_t &rb, bool &has_b) {
        const uint32_t p = blk * PW + warp / KS;
        ra = GLU ? p : 2 * p;
        has_b = GLU || ra + 1 < out_rows;
        rb = GLU ? p + out_rows : has_b ? ra + 1 : ra;
        return p < pairs;
    };
    auto prefetch = [&](int expert, uint32_t blk, bool l1) { // the warp's two rows of block blk, 128 bytes a lane
        uint32_t ra, rb;
        bool hb;
        if (part || blk >= blocks || !rows_of(blk, ra, rb, hb)) return;
        for (uint32_t off = lane * 128; off < W.row_stride; off += 32 * 128) {
            const uint8_t *pa = row_ptr(W, expert, ra) + off, *pb = row_ptr(W, expert, rb) + off;
            prefetch_line(pa, l1);
            prefetch_line(pb, l1);
        }
    };
    // The first rows travel to L1 while the activations are quantised, or, when the group tables
    // are ready, while the predecessor still runs.
    const uint32_t b0 = q8out ? 4 * blockIdx.x : blockIdx.x, bstep = q8out ? 1 : gridDim.x;
    const uint32_t bend = q8out ? min(blocks, b0 + 4) : blocks;
    if (ready && gi < *g.n) prefetch(g.expert[gi], b0, true);
    cudaGridDependencySynchronize();
    cudaTriggerProgrammaticLaunchCompletion();
    const GroupEntry ge = group_entry(g, gi); // one round trip
    if (gi >= ge.live) return;
    const int expert = ge.expert, start = ge.start, count = ge.count;
    if (!ready) prefetch(expert, b0, true);
    prefetch_expert(nx, (uint32_t)expert);
    const int spans = (int)(cols / SP::kSpanElems);

    for (int c0 = 0; c0 < count; c0 += tchunk) {
        const int nt = min(tchunk, count - c0);
        if (!EARLY) {
            __syncthreads(); // the previous chunk's readers are done with xq
            if (MAXT > 1 && pq) copy_q8(pq, pd, g, start + c0, nt, cols, xq, xd);
            else stage_q8(in, in_stride, g, start + c0, nt, cols, xq, xd);
        }
        __syncthreads();
        for (uint32_t blk = b0; blk < bend; blk += bstep) {
            uint32_t ra, rb;
            bool has_b;
            if (!rows_of(blk, ra, rb, has_b)) break;
            prefetch(expert, blk + bstep, false); // q8out: past bend, the next CTA's first rows
            for (int t0 = 0; t0 < nt; t0 += MAXT) {
                const int n = min(MAXT, nt - t0);
                float a[MAXT] = {}, b[MAXT] = {};
                const int8_t *xt = xq + (size_t)t0 * a8_stride(cols);
                const float2 *dt = xd + (size_t)t0 * (cols / 32);
                pair_spans<SP, MAXT, NS>(W, (uint32_t)expert, ra, rb, lane + 32 * NS * part, 32 * NS * KS, spans, xt, dt,
                                         cols, n, a, b);
                if constexpr (KS > 1) { // part 0 adds the other parts' sums, in part order
                    float2 *rp = red + (size_t)(warp / KS) * KS * MAXT;
#pragma unroll
                    for (int t = 0; t < MAXT; t++) {
                        if (t >= n) break;
                        const float va = warp_sum(a[t]), vb = warp_sum(b[t]);
                        if (lane == 0) rp[part * MAXT + t] = make_float2(va, vb);
                    }
                    pair_sync(warp / KS, KS);
#pragma unroll
                    for (int t = 0; t < MAXT; t++) {
                        float va = rp[t].x, vb = rp[t].y;
                        for (int q = 1; q < KS; q++) va += rp[q * MAXT + t].x, vb += rp[q * MAXT + t].y;
                        a[t] = va, b[t] = vb; // the sums: part 0's lane 0 stores them below
                    }
                    pair_sync(warp / KS, KS); // rp is free for the next block
                    if (part) continue;
                }
#pragma unroll
                for (int t = 0; t < MAXT; t++) {
                    if (t >= n) break;
                    const float va = KS > 1 ? a[t] : warp_sum(a[t]), vb = KS > 1 ? b[t] : warp_sum(b[t]);
                    float *o = out + (size_t)(start + c0 + t0 + t) * out_stride;
                    if (lane == 0) {
                        if (q8out) ys[(t0 + t) * 32 + (blk - b0) * kWarps + warp] = silu(va) * vb;
                        else if (GLU) o[ra] = silu(va) * vb;
                        else {
                            o[ra] = va;
                            if (has_b) o[rb] = vb;
                        }
                    }
                }
            }
        }
        if (q8out) { // the chunk's tokens: warp w quantises tokens w, w + kWarps, ... (a lane an output)
            __syncthreads();
            const uint32_t I = out_rows;
            for (int t = warp; t < nt; t += kWarps) {
                int q, sum;
                float d;
                quant8_lane(ys[t * 32 + lane], q, d, sum);
                const size_t p = (size_t)(start + c0 + t);
                aq[p * a8_stride(I) + a8_at(32 * blockIdx.x + lane)] = (int8_t)q;
                if (lane == 0) ad[p * (I / 32) + blockIdx.x] = make_float2(d, d * (float)sum);
            }
        }
    }
}

template <class SP, int MAXT, bool GLU, int NS, int KS = 1>
cudaError_t launch_t(const DevMat &W, const uint16_t *in, uint32_t in_stride, const Groups &g, float *out,
                     uint32_t out_stride, uint32_t max_tokens, const GemvLaunch &opt, cudaStream_t s)
{
    const uint32_t out_rows = GLU ? W.rows / 2 : W.rows, pairs = GLU ? out_rows : (out_rows + 1) / 2;
    const uint32_t blocks = (pairs + kWarps / KS - 1) / (kWarps / KS);
    const size_t per_token = (size_t)a8_stride(W.cols) + W.cols / 32 * sizeof(float2);
    int tchunk = (int)((96 * 1024) / per_token);
    if (tchunk < 1) return cudaErrorInvalidValue;
    if (tchunk > 64) tchunk = 64;
    if (tchunk > (int)max_tokens) tchunk = (int)max_tokens;
    const bool q8out = GLU && max_tokens > 1 && opt.aq;
    if (q8out && (!opt.ad || out_rows % 32)) return cudaErrorInvalidValue;
    const size_t smem = (size_t)tchunk * (per_token + (q8out ? 32 * sizeof(float) : 0)) +
                        (KS > 1 ? kWarps * MAXT * sizeof(float2) : 0);
    const bool early = opt.rows_are_x0 && max_tokens == 1;
    void (*k)(DevMat, const uint16_t *, uint32_t, Groups, float *, uint32_t, int, NextMat, bool, const int8_t *,
              const float2 *, int8_t *, float2 *) =
        early ? gemv_a8_kernel<SP, MAXT, GLU, true, NS, KS> : gemv_a8_kernel<SP, MAXT, GLU, false, NS, KS>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    // GLU at T = 1 keeps a CTA per block: the decode gate/up quantises x before its grid-dependency
    // wait, so a CTA's chain is the weight loads, and walking two or four blocks a CTA measured the
    // same or slower. With more tokens each CTA quantises its group's rows after the wait, and a CTA
    // walking 4 blocks pays that once for all four: the small-token layer took 0.82 - 0.96x the
    // time at T = 4 .. 16 and 0.94 - 1.00x at T = 2 (four k-quant / q8_0 profiles; docs/sparse_moe.md,
    // "CUDA-core routes").
    // Plain (the dense layers, one group): at most one wave of CTAs, each walking several row blocks.
    uint32_t grid = GLU && max_tokens > 1 ? (blocks + 3) / 4 : blocks; // q8out: blocks % 4 == 0
    if constexpr (!GLU) {
        const int sms = sm_count();
        int per_sm = 0;
        if (e == cudaSuccess && !sms) e = cudaErrorInvalidDevice;
        if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kWarps * 32, smem);
        const uint32_t wave = (uint32_t)(sms * (per_sm > 0 ? per_sm : 1));
        if (blocks > wave) grid = wave;
    }
    if (e != cudaSuccess) return e;
    return launch_pdl(k, dim3(grid, g.max_groups), dim3(kWarps * 32), smem, opt.pdl, s, W, in, in_stride, g, out,
                      out_stride, tchunk, opt.next, opt.groups_ready, GLU ? nullptr : opt.xq, GLU ? nullptr : opt.xd,
                      q8out ? opt.aq : nullptr, q8out ? opt.ad : nullptr);
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
    if constexpr (!GLU) { // two warps a row pair (the kernel's KS): ~2 % on the N = 8 .. 16 step (docs/perf/batch.md)
        if (max_tokens <= 4) return launch_t<SP, 4, GLU, 1, 2>(W, in, in_stride, g, out, out_stride, max_tokens, opt, s);
        return launch_t<SP, 8, GLU, 1, 2>(W, in, in_stride, g, out, out_stride, max_tokens, opt, s);
    }
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

// ---- several matrices of one input in one launch (the decoder's q, k and v at small T) -----------
// When their codecs differ they cannot be one stacked matrix; three launches would cost two more
// kernel boundaries (and at T = 1 two more quantisations of the same row). Here the CTAs are dealt
// out to the segments (cta0), each walks its own segment's row blocks exactly as gemv_a8_kernel<SP,
// MAXT, false, false, NS> does for that matrix alone: the same spans per lane, sums and reduction, so
// the same bits. One token is quantised by each CTA; T > 1 tokens come quantised (launch_mmq_quant,
// padded) and are copied.

struct SegsArg {
    A8Seg s[kMaxA8Segs];
    uint32_t cta0[kMaxA8Segs + 1]; // first CTA of each segment; cta0[n] = the grid
    int n;
    uint32_t out_stride; // floats between a segment's output rows of consecutive tokens
};

// A warp's rows of block blk (rows 2p, 2p + 1 of pair p), false past the end.
__device__ __forceinline__ bool pair_rows(uint32_t rows, uint32_t blk, uint32_t &ra, uint32_t &rb, bool &has_b)
{
    const uint32_t p = blk * kWarps + threadIdx.x / 32;
    ra = 2 * p;
    has_b = ra + 1 < rows;
    rb = has_b ? ra + 1 : ra;
    return ra < rows;
}

__device__ __forceinline__ void prefetch_pair(const DevMat &W, uint32_t blk, bool l1)
{
    uint32_t ra, rb;
    bool hb;
    if (!pair_rows(W.rows, blk, ra, rb, hb)) return;
    for (uint32_t off = (threadIdx.x % 32) * 128; off < W.row_stride; off += 32 * 128) {
        const uint8_t *pa = row_ptr(W, 0, ra) + off, *pb = row_ptr(W, 0, rb) + off;
        prefetch_line(pa, l1);
        prefetch_line(pb, l1);
    }
}

// One segment's row blocks blk0, blk0 + stride, ... against the T staged tokens, MAXT at a time.
template <class SP, int NS, int MAXT>
__device__ void seg_rows(const A8Seg &S, uint32_t blk0, uint32_t stride, const int8_t *xq, const float2 *xd, int T,
                         uint32_t out_stride)
{
    const DevMat &W = S.W;
    const uint32_t cols = W.cols, blocks = ((W.rows + 1) / 2 + kWarps - 1) / kWarps;
    const int lane = threadIdx.x % 32, spans = (int)(cols / SP::kSpanElems);
    for (uint32_t blk = blk0; blk < blocks; blk += stride) {
        uint32_t ra, rb;
        bool has_b;
        if (!pair_rows(W.rows, blk, ra, rb, has_b)) break;
        if (blk + stride < blocks) prefetch_pair(W, blk + stride, false);
        for (int t0 = 0; t0 < T; t0 += MAXT) {
            const int n = min(MAXT, T - t0);
            float a[MAXT] = {}, b[MAXT] = {};
            const int8_t *xt = xq + (size_t)t0 * a8_stride(cols);
            const float2 *dt = xd + (size_t)t0 * (cols / 32);
            pair_spans<SP, MAXT, NS>(W, 0, ra, rb, lane, 32 * NS, spans, xt, dt, cols, n, a, b);
#pragma unroll
            for (int t = 0; t < MAXT; t++) {
                if (t >= n) break;
                const float va = warp_sum(a[t]), vb = warp_sum(b[t]);
                float *o = S.out + (size_t)(t0 + t) * out_stride;
                if (lane == 0) {
                    o[ra] = va;
                    if (has_b) o[rb] = vb;
                }
            }
        }
    }
}

template <int NS, int MAXT>
__global__ void __launch_bounds__(kWarps * 32, NS == 1 && MAXT == 1 ? 3 : 2)
    gemv_a8_segs_kernel(SegsArg sg, const uint16_t *in, const int8_t *pq, const float2 *pd, int T)
{
    extern __shared__ __align__(16) uint8_t smem[];
    // this CTA's segment, picked with constant indices (no local copy of the parameter array)
    A8Seg S = sg.s[0];
    uint32_t first = 0, end = sg.cta0[1];
#pragma unroll
    for (int j = 1; j < kMaxA8Segs; j++)
        if (j < sg.n && blockIdx.x >= sg.cta0[j]) S = sg.s[j], first = sg.cta0[j], end = sg.cta0[j + 1];
    const uint32_t cols = S.W.cols, ctas = end - first, blk0 = blockIdx.x - first;
    int8_t *xq = reinterpret_cast<int8_t *>(smem);                             // T padded rows (quant_a8.cuh)
    float2 *xd = reinterpret_cast<float2 *>(smem + (size_t)T * a8_stride(cols)); // [T][cols / 32]
    prefetch_pair(S.W, blk0, true); // weights: ready before the predecessor ends
    cudaGridDependencySynchronize();
    cudaTriggerProgrammaticLaunchCompletion();
    const Groups g0{nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1};
    if (MAXT == 1) T = 1; // a constant for the compiler: the one-token kernel keeps its registers
    if (MAXT == 1) stage_q8(in, cols, g0, 0, 1, cols, xq, xd);
    else copy_q8(pq, pd, g0, 0, T, cols, xq, xd);
    __syncthreads();
    switch (S.codec) { // the segment's codec: uniform over the CTA
    case 3: seg_rows<SpanQ8, NS, MAXT>(S, blk0, ctas, xq, xd, T, sg.out_stride); break;
    case 4: seg_rows<SpanQ4K, NS, MAXT>(S, blk0, ctas, xq, xd, T, sg.out_stride); break;
    case 5: seg_rows<SpanQ5K, NS, MAXT>(S, blk0, ctas, xq, xd, T, sg.out_stride); break;
    case 6: seg_rows<SpanQ6K, NS, MAXT>(S, blk0, ctas, xq, xd, T, sg.out_stride); break;
    case 13: seg_rows<SpanQ3K, NS, MAXT>(S, blk0, ctas, xq, xd, T, sg.out_stride); break;
    case 14: seg_rows<SpanIQ4XS, NS, MAXT>(S, blk0, ctas, xq, xd, T, sg.out_stride); break;
    default: seg_rows<SpanIQ4NL, NS, MAXT>(S, blk0, ctas, xq, xd, T, sg.out_stride); break;
    }
}

// Lanes' spans in flight for one codec at these columns: gemv_a8_kernel's choice (launch_sp).
int seg_ns(int codec, uint32_t cols) { return cols / (codec == 3 ? 32u : 64u) <= 32 ? 1 : 2; }

using SegsKernel = void (*)(SegsArg, const uint16_t *, const int8_t *, const float2 *, int);

// The kernel for T tokens (launch_sp's token tiers); two spans in flight only at one token: with more,
// the seven codecs' paths in one kernel spill hundreds of bytes (ptxas), so those layers keep one launch
// a matrix.
SegsKernel segs_kernel(int ns, uint32_t T)
{
    if (ns == 2) return gemv_a8_segs_kernel<2, 1>;
    return T <= 1 ? gemv_a8_segs_kernel<1, 1> : T <= 4 ? gemv_a8_segs_kernel<1, 4> : gemv_a8_segs_kernel<1, 8>;
}

} // namespace

bool gemv_a8_segs_supported(const A8Seg *s, int n, uint32_t T)
{
    if (n < 1 || n > kMaxA8Segs || T < 1 || T > kMaxSegsTokens) return false;
    if (T > 1 && (s[0].W.cols % 64 || seg_ns(s[0].codec, s[0].W.cols) != 1)) return false; // segs_kernel says why
    // all T tokens staged at once, within the plain kernel's shared-memory budget (no chunk loop here)
    if ((size_t)T * (a8_stride(s[0].W.cols) + s[0].W.cols / 32 * sizeof(float2)) > 96 * 1024) return false;
    for (int i = 0; i < n; i++)
        if (!gemv_a8_supported(s[i].codec, s[i].W) || s[i].W.cols != s[0].W.cols ||
            !s[i].W.rows || seg_ns(s[i].codec, s[i].W.cols) != seg_ns(s[0].codec, s[0].W.cols))
            return false;
    return true;
}

cudaError_t launch_gemv_a8_segs(const A8Seg *s, int n, const uint16_t *in, uint32_t T, const int8_t *xq,
                                const float2 *xd, uint32_t out_stride, bool pdl, cudaStream_t st)
{
    if (!gemv_a8_segs_supported(s, n, T) || (T > 1 && (!xq || !xd))) return cudaErrorInvalidValue;
    const SegsKernel k = segs_kernel(seg_ns(s[0].codec, s[0].W.cols), T);
    const size_t smem = (size_t)T * (a8_stride(s[0].W.cols) + s[0].W.cols / 32 * sizeof(float2));
    const int sms = sm_count();
    int per_sm = 0;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e == cudaSuccess && !sms) e = cudaErrorInvalidDevice;
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kWarps * 32, smem);
    if (e != cudaSuccess) return e;
    // A CTA per row block while they fit one wave (the plain kernel's rule); past it, the wave dealt
    // out in proportion to the blocks, at least one CTA a segment.
    const uint64_t wave = (uint64_t)sms * (per_sm > 0 ? per_sm : 1);
    uint32_t blocks[kMaxA8Segs];
    uint64_t total = 0;
    for (int i = 0; i < n; i++) total += blocks[i] = ((s[i].W.rows + 1) / 2 + kWarps - 1) / kWarps;
    SegsArg a{};
    uint32_t grid = 0;
    for (int i = 0; i < n; i++) {
        uint64_t c = total <= wave ? blocks[i] : blocks[i] * wave / total;
        a.s[i] = s[i];
        a.cta0[i] = grid;
        grid += (uint32_t)(c ? c : 1);
    }
    a.cta0[n] = grid;
    a.n = n;
    a.out_stride = out_stride;
    return launch_pdl(k, dim3(grid), dim3(kWarps * 32), smem, pdl, st, a, in, xq, xd, (int)T);
}

bool gemv_a8_supported(int codec, const DevMat &W)
{
    switch (codec) {
    case 3 /* NF_CODEC_Q8_0 */: return W.cols % 32 == 0;
    case 4 /* NF_CODEC_Q4_K */:
    case 5 /* NF_CODEC_Q5_K */:
    case 6 /* NF_CODEC_Q6_K */:
    case 13 /* NF_CODEC_Q3_K */:
    case 14 /* NF_CODEC_IQ4_XS */: return W.cols % 256 == 0;
    case 15 /* NF_CODEC_IQ4_NL */: return W.cols % 64 == 0; // its span is two 32-element blocks
    default: return false; // q2_k: no span policy yet (its per-16 min needs per-16 activation sums)
    }
}

cudaError_t launch_gemv_a8(int codec, bool glu, const DevMat &W, const uint16_t *in, uint32_t in_stride, const Groups &g,
                           float *out, uint32_t out_stride, uint32_t max_tokens, const GemvLaunch &opt, cudaStream_t s)
{
    return dispatch_span(codec, [&](auto sp) {
        return launch_glu<decltype(sp)>(glu, W, in, in_stride, g, out, out_stride, max_tokens, opt, s);
    });
}

} // namespace nf
