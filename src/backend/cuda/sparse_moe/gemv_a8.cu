// Gate/up of the decode and small-token routes for q4_k and q8_0 weights with int8 activations
// (W4A8 / W8A8).
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
// q8_0 is the same without the min term. A lane takes a 32-byte span of a row's qs plane (the span
// policies below), two 16-byte loads plus the scales, for each of the gate and up rows.
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
// q4_k: 32 bytes of the qs plane (block b = s / 4, j = s % 4) = sub-blocks 2j (low nibbles) and
// 2j+1 (high nibbles), elements b*256 + j*64 + [0, 64), plus the block's 12 scale bytes and d/dmin.
struct SpanQ4K {
    struct Raw {
        uint4 qa, qb;
        uint32_t sc0, sc1, sc2, dm;
    };
    __device__ static int spans(const DevMat &W) { return (int)W.nb * 4; }
    __device__ static Raw load(const DevMat &W, uint32_t e, uint32_t r, int s)
    {
        const CQ4K::Row R = CQ4K::row(W, e, r);
        const int blk = s >> 2, j = s & 3;
        const uint4 *q = reinterpret_cast<const uint4 *>(R.qs + blk * 128 + j * 32);
        const uint32_t *sc = reinterpret_cast<const uint32_t *>(R.sc + blk * 12);
        return Raw{q[0], q[1], sc[0], sc[1], sc[2], *reinterpret_cast<const uint32_t *>(R.dm + blk * 4)};
    }
    template <int MAXT>
    __device__ static void dot(const Raw &w, int s, const int8_t *xq, const float2 *xd, uint32_t cols, int nt,
                               float *acc)
    {
        const int j = s & 3;
        const uint32_t e0 = (uint32_t)((s >> 2) * 256 + j * 64);
        int s1, m1, s2, m2;
        k4_scale_min(w.sc0, w.sc1, w.sc2, 2 * j, s1, m1);
        k4_scale_min(w.sc0, w.sc1, w.sc2, 2 * j + 1, s2, m2);
        const float d = h2f((uint16_t)w.dm), dmin = h2f((uint16_t)(w.dm >> 16));
        const float d1 = d * (float)s1, d2 = d * (float)s2, mm1 = dmin * (float)m1, mm2 = dmin * (float)m2;
        const uint32_t q[8] = {w.qa.x, w.qa.y, w.qa.z, w.qa.w, w.qb.x, w.qb.y, w.qb.z, w.qb.w};
#pragma unroll
        for (int t = 0; t < MAXT; t++) {
            if (t >= nt) break;
            const int4 *xv = reinterpret_cast<const int4 *>(xq + (size_t)t * cols + e0);
            const int4 x0 = xv[0], x1 = xv[1], x2 = xv[2], x3 = xv[3];
            const int lo[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
            const int hi[8] = {x2.x, x2.y, x2.z, x2.w, x3.x, x3.y, x3.z, x3.w};
            int sa = 0, sb = 0;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                sa = __dp4a((int)(q[k] & 0x0F0F0F0Fu), lo[k], sa);
                sb = __dp4a((int)((q[k] >> 4) & 0x0F0F0F0Fu), hi[k], sb);
            }
            const float2 da = xd[(size_t)t * (cols / 32) + e0 / 32], db = xd[(size_t)t * (cols / 32) + e0 / 32 + 1];
            float a = acc[t];
            a = fmaf(d1 * da.x, (float)sa, a);
            a = fmaf(-mm1, da.y, a);
            a = fmaf(d2 * db.x, (float)sb, a);
            a = fmaf(-mm2, db.y, a);
            acc[t] = a;
        }
    }
};

// q8_0: one block, 32 signed bytes and its f16 scale: sum_i dw qw_i d qx_i = dw d (sum qw qx).
struct SpanQ8 {
    struct Raw {
        uint4 qa, qb;
        uint16_t d;
    };
    __device__ static int spans(const DevMat &W) { return (int)W.nb; }
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

// grid: x = row blocks of kWarps row pairs, y = group slots. EARLY: one token whose input row is
// x[0] (the decode route), quantised before the grid-dependency wait (gemv.cu says why).
template <class SP, int MAXT, bool EARLY>
__global__ void __launch_bounds__(kWarps * 32, 2) gemv_a8_kernel(DevMat W, const uint16_t *in, uint32_t in_stride,
                                                                    Groups g, float *out, uint32_t out_stride,
                                                                    int tchunk, NextMat nx)
{
    extern __shared__ __align__(16) uint8_t smem[];
    const uint32_t cols = W.cols;
    int8_t *xq = reinterpret_cast<int8_t *>(smem);                  // [tchunk][cols]
    float2 *xd = reinterpret_cast<float2 *>(smem + (size_t)tchunk * cols); // [tchunk][cols / 32]
    if (EARLY) {
        const Groups g0{nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1};
        stage_q8(in, in_stride, g0, 0, 1, cols, xq, xd);
    }
    cudaGridDependencySynchronize();
    cudaTriggerProgrammaticLaunchCompletion();
    const int gi = blockIdx.y;
    if (gi >= *g.n) return;
    const int expert = g.expert[gi], start = g.start[gi], count = g.count[gi];
    const uint32_t out_rows = W.rows / 2;
    const uint32_t r = blockIdx.x * kWarps + threadIdx.x / 32;
    const bool live = r < out_rows;
    const int lane = threadIdx.x % 32;
    if (live) // the rows travel to L1 while the activations are quantised
        for (uint32_t off = lane * 128; off < W.row_stride; off += 32 * 128) {
            asm volatile("prefetch.global.L1 [%0];" ::"l"(row_ptr(W, expert, r) + off));
            asm volatile("prefetch.global.L1 [%0];" ::"l"(row_ptr(W, expert, r + out_rows) + off));
        }
    prefetch_expert(nx, (uint32_t)expert);
    const int spans = SP::spans(W);

    for (int c0 = 0; c0 < count; c0 += tchunk) {
        const int nt = min(tchunk, count - c0);
        if (!EARLY) {
            __syncthreads(); // the previous chunk's readers are done with xq
            stage_q8(in, in_stride, g, start + c0, nt, cols, xq, xd);
        }
        __syncthreads();
        if (!live) continue;
        for (int t0 = 0; t0 < nt; t0 += MAXT) {
            const int n = min(MAXT, nt - t0);
            float a[MAXT] = {}, b[MAXT] = {};
            const int8_t *xt = xq + (size_t)t0 * cols;
            const float2 *dt = xd + (size_t)t0 * (cols / 32);
            for (int s0 = lane; s0 < spans; s0 += 64) { // two spans per lane in flight (q8_0 rows of 2048)
                const int s1 = s0 + 32;
                typename SP::Raw wa0 = SP::load(W, expert, r, s0), wb0 = SP::load(W, expert, r + out_rows, s0), wa1,
                                 wb1;
                if (s1 < spans) wa1 = SP::load(W, expert, r, s1), wb1 = SP::load(W, expert, r + out_rows, s1);
                SP::template dot<MAXT>(wa0, s0, xt, dt, cols, n, a);
                SP::template dot<MAXT>(wb0, s0, xt, dt, cols, n, b);
                if (s1 < spans) {
                    SP::template dot<MAXT>(wa1, s1, xt, dt, cols, n, a);
                    SP::template dot<MAXT>(wb1, s1, xt, dt, cols, n, b);
                }
            }
#pragma unroll
            for (int t = 0; t < MAXT; t++) {
                if (t >= n) break;
                const float v = silu(warp_sum(a[t])) * warp_sum(b[t]);
                if (lane == 0) out[(size_t)(start + c0 + t0 + t) * out_stride + r] = v;
            }
        }
    }
}

template <class SP, int MAXT>
cudaError_t launch_t(const DevMat &W, const uint16_t *in, uint32_t in_stride, const Groups &g, float *out,
                     uint32_t out_stride, uint32_t max_tokens, const GemvLaunch &opt, cudaStream_t s)
{
    const uint32_t out_rows = W.rows / 2;
    const size_t per_token = (size_t)W.cols + W.cols / 32 * sizeof(float2);
    int tchunk = (int)((96 * 1024) / per_token);
    if (tchunk < 1) return cudaErrorInvalidValue;
    if (tchunk > 64) tchunk = 64;
    if (tchunk > (int)max_tokens) tchunk = (int)max_tokens;
    const size_t smem = (size_t)tchunk * per_token;
    const bool early = opt.rows_are_x0 && max_tokens == 1;
    void (*k)(DevMat, const uint16_t *, uint32_t, Groups, float *, uint32_t, int, NextMat) =
        early ? gemv_a8_kernel<SP, MAXT, true> : gemv_a8_kernel<SP, MAXT, false>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    return launch_pdl(k, dim3((out_rows + kWarps - 1) / kWarps, g.max_groups), dim3(kWarps * 32), smem, opt.pdl, s, W,
                      in, in_stride, g, out, out_stride, tchunk, opt.next);
}

template <class SP>
cudaError_t launch_sp(const DevMat &W, const uint16_t *in, uint32_t in_stride, const Groups &g, float *out,
                      uint32_t out_stride, uint32_t max_tokens, const GemvLaunch &opt, cudaStream_t s)
{
    if (max_tokens <= 1) return launch_t<SP, 1>(W, in, in_stride, g, out, out_stride, max_tokens, opt, s);
    if (max_tokens <= 4) return launch_t<SP, 4>(W, in, in_stride, g, out, out_stride, max_tokens, opt, s);
    return launch_t<SP, 8>(W, in, in_stride, g, out, out_stride, max_tokens, opt, s);
}

} // namespace

bool gemv_a8_supported(int codec, const DevMat &W)
{
    return (codec == 4 /* NF_CODEC_Q4_K */ && W.cols % 256 == 0) || (codec == 3 /* NF_CODEC_Q8_0 */ && W.cols % 32 == 0);
}

cudaError_t launch_gemv_a8(int codec, const DevMat &W, const uint16_t *in, uint32_t in_stride, const Groups &g,
                           float *out, uint32_t out_stride, uint32_t max_tokens, const GemvLaunch &opt, cudaStream_t s)
{
    if (codec == 4) return launch_sp<SpanQ4K>(W, in, in_stride, g, out, out_stride, max_tokens, opt, s);
    if (codec == 3) return launch_sp<SpanQ8>(W, in, in_stride, g, out, out_stride, max_tokens, opt, s);
    return cudaErrorInvalidValue;
}

} // namespace nf
