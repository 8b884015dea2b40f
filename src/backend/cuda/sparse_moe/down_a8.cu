// Down projection and weighted combine with int8 activations, for the decode and small-token routes
// of k-quant, q8_0, q3_k, iq4_xs and iq4_nl down banks whose down matrix allows A8 (the engine's default; ggml quantises the
// intermediate the same way for its MUL_MAT_ID down).
//
// Why: decode.cu's f32 form spends most of its instructions on each weight (decode to f32, an FMA
// per element, per-piece routing lookups with integer divisions): ncu put the q6_k down of one
// Qwen3-30B-A3B layer at 60 % of the SM's issue rate and 10 % of DRAM. Here each CTA quantises the
// whole SwiGLU intermediate once per forward (T * k positions of I elements; quant_a8.cuh) and a
// warp owns one output row h: its lanes spread over the (expert, span) items of the row across all
// active experts, take integer dots four products at a time (the span policies of spans_a8.cuh),
// and weight each span's dot by its position's router weight. Per token the sum over experts
// happens in registers and a warp sum, in a fixed order: deterministic.
//
// Under programmatic dependent launch the kernel starts while its predecessor (gate/up, or the shared
// expert's down) runs: the routing was complete before any launch after the router passed its own
// wait (each releases its successor only after that wait), so the weight rows of the first items are
// loaded before the wait; the intermediate (and ys) are read after it.
#include "internal.cuh"
#include "ptx.cuh"
#include "quant_a8.cuh"
#include "rowdot.cuh"
#include "spans_a8.cuh"

namespace nf {

namespace {

constexpr int kWarps = 8; // output rows per CTA

// Shared memory: xq (P padded rows of I int8, quant_a8.cuh), xd [P][I / 32] (d, d * sum q), then per
// position its router weight and token.
struct DownSmem {
    size_t xd, pw, pt, bytes;
    __host__ __device__ DownSmem(uint32_t P, uint32_t I)
    {
        xd = (size_t)P * a8_stride(I); // a multiple of 16
        pw = xd + (size_t)P * (I / 32) * sizeof(float2);
        pt = pw + (size_t)P * sizeof(float);
        bytes = pt + (size_t)P * sizeof(int);
    }
};

// Quantises the P rows of act ([P][I] f32) into xq/xd and gathers each position's weight and token.
// A thread's kStageU vectors are all loaded before any is quantised: the intermediate comes from L2,
// and at T = 8 (P = 64, I = 768) a CTA of 256 threads would otherwise wait on 24 round trips in a row.
// The quantiser sees the same values in the same groups of four lanes: the same bits.
constexpr uint32_t kStageU = 4;
__device__ void stage_act(const float *act, uint32_t P, uint32_t I, const Routing &r, uint32_t k, int8_t *xq,
                          float2 *xd, float *pw, int *pt)
{
    const uint32_t vecs = P * I / 8; // I % 32 == 0: a block's four lanes stay in one iteration
    for (uint32_t base = 0; base < vecs; base += kStageU * blockDim.x) {
        float4 a[kStageU], b[kStageU];
#pragma unroll
        for (uint32_t u = 0; u < kStageU; u++) {
            const uint32_t v = base + u * blockDim.x + threadIdx.x;
            a[u] = b[u] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (v < vecs) {
                a[u] = *reinterpret_cast<const float4 *>(act + (size_t)v * 8);
                b[u] = *reinterpret_cast<const float4 *>(act + (size_t)v * 8 + 4);
            }
        }
#pragma unroll
        for (uint32_t u = 0; u < kStageU; u++) {
            const uint32_t v = base + u * blockDim.x + threadIdx.x;
            const float f[8] = {a[u].x, a[u].y, a[u].z, a[u].w, b[u].x, b[u].y, b[u].z, b[u].w};
            quant8_store(f, v < vecs, v, I, xq, xd);
        }
    }
    for (uint32_t p = threadIdx.x; p < P; p += blockDim.x) {
        const int entry = r.pos_entry[p];
        pw[p] = r.topk_w[entry];
        pt[p] = entry / (int)k;
    }
}

// Rows start .. start + n - 1 of the quantised intermediate (aq, ad: the staged layout; consecutive
// positions, so one contiguous piece of each) into xq/xd, 16 bytes a thread at a time with cp.async
// (nothing through registers), committed; the caller waits (cp_async_wait_all) and publishes them.
__device__ void copy_rows(const int8_t *aq, const float2 *ad, int start, int n, uint32_t I, int8_t *xq, float2 *xd)
{
    const uint32_t qv = (uint32_t)n * a8_stride(I) / 16, dv = (uint32_t)n * (I / 32) / 2; // I % 64 == 0
    const int8_t *q = aq + (size_t)start * a8_stride(I);
    const float2 *d = ad + (size_t)start * (I / 32);
    for (uint32_t v = threadIdx.x; v < qv + dv; v += blockDim.x) {
        if (v < qv) cp_async16(smem_u32(xq + 16 * v), q + 16 * (size_t)v, 16);
        else cp_async16(smem_u32(xd + 2 * (v - qv)), d + 2 * (size_t)(v - qv), 16);
    }
    cp_async_commit();
}

// All P rows gate/up already quantised copied (copy_rows), and while they fly the positions' weights
// and tokens gathered.
__device__ void copy_act(const int8_t *aq, const float2 *ad, uint32_t P, uint32_t I, const Routing &r, uint32_t k,
                         int8_t *xq, float2 *xd, float *pw, int *pt)
{
    copy_rows(aq, ad, 0, (int)P, I, xq, xd);
    for (uint32_t p = threadIdx.x; p < P; p += blockDim.x) {
        const int entry = r.pos_entry[p];
        pw[p] = r.topk_w[entry];
        pt[p] = entry / (int)k;
    }
    cp_async_wait_all();
}

template <class SP, int MAXT>
__global__ void __launch_bounds__(kWarps * 32, 2)
    down_a8_kernel(DevMat W, const float *act, const int8_t *aq, const float2 *ad, Routing r, uint32_t T, uint32_t k,
                   const float *ys, uint16_t *out)
{
    extern __shared__ __align__(16) uint8_t smem[];
    const uint32_t I = W.cols, H = W.rows, P = T * k;
    const DownSmem L(P, I);
    int8_t *xq = reinterpret_cast<int8_t *>(smem);
    float2 *xd = reinterpret_cast<float2 *>(smem + L.xd);
    float *pw = reinterpret_cast<float *>(smem + L.pw);
    int *pt = reinterpret_cast<int *>(smem + L.pt);
    const int lane = threadIdx.x % 32;
    const uint32_t h = blockIdx.x * kWarps + threadIdx.x / 32;
    const bool live = h < H;
    const int spans = (int)(I / SP::kSpanElems), items = live ? *r.n_groups * spans : 0;

    // items per lane in flight: four, or two of q5_k's 80-byte spans (four spill at 128 registers)
    constexpr int kBatch = sizeof(typename SP::Raw) > 64 ? 2 : 4;
    typename SP::Raw raw[kBatch];
    auto load = [&](int i0) {
#pragma unroll
        for (int u = 0; u < kBatch; u++) {
            const int i = i0 + 32 * u;
            if (i < items) raw[u] = SP::load(W, (uint32_t)r.g_expert[i / spans], h, i % spans);
        }
    };
    load(lane); // weights and routing only: before the wait on gate/up
    cudaGridDependencySynchronize();
    if (aq) copy_act(aq, ad, P, I, r, k, xq, xd, pw, pt);
    else stage_act(act, P, I, r, k, xq, xd, pw, pt);
    __syncthreads();

    float acc[MAXT] = {};
    for (int i0 = lane; i0 < items; i0 += 32 * kBatch) {
        if (i0 != lane) load(i0);
#pragma unroll
        for (int u = 0; u < kBatch; u++) {
            const int i = i0 + 32 * u;
            if (i >= items) break;
            const int g = i / spans, s = i % spans, start = r.g_start[g], end = start + r.g_count[g];
            for (int p = start; p < end; p++) {
                float d = 0.f;
                SP::template dot<1>(raw[u], s, xq + (size_t)p * a8_stride(I), xd + (size_t)p * (I / 32), I, 1, &d);
                const int t = pt[p];
                const float v = pw[p] * d;
#pragma unroll
                for (int tt = 0; tt < MAXT; tt++)
                    if (tt == t) acc[tt] += v; // a register per token: no dynamic indexing
            }
        }
    }
#pragma unroll
    for (int t = 0; t < MAXT; t++) {
        float v = warp_sum(acc[t]);
        if (lane == 0 && live && t < (int)T) {
            if (ys) v = fmaf(r.shared_g[t], ys[(size_t)t * H + h], v);
            out[(size_t)t * H + h] = f2bf(v);
        }
    }
}

template <class SP, int MAXT>
cudaError_t launch_t(const DevMat &W, const float *act, const int8_t *aq, const float2 *ad, const Routing &r, uint32_t T,
                     uint32_t k, const float *ys, uint16_t *out, bool pdl, cudaStream_t s)
{
    const size_t smem = DownSmem(T * k, W.cols).bytes;
    auto kern = down_a8_kernel<SP, MAXT>;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    return launch_pdl(kern, dim3((W.rows + kWarps - 1) / kWarps), dim3(kWarps * 32), smem, pdl, s, W, act, aq, ad, r,
                      T, k, ys, out);
}

template <class SP>
cudaError_t launch_sp(const DevMat &W, const float *act, const int8_t *aq, const float2 *ad, const Routing &r,
                      uint32_t T, uint32_t k, const float *ys, uint16_t *out, bool pdl, cudaStream_t s)
{
    return with_maxt(T, [&](auto m) {
        return launch_t<SP, decltype(m)::value>(W, act, aq, ad, r, T, k, ys, out, pdl, s);
    });
}

// ---- the down by rows: from two tokens, the intermediate already int8 --------------------------
// down_a8_kernel's warp owns an output row across every active expert: at T = 8 it stages all T k
// positions' intermediate (a quarter of the SM's shared memory), and its lanes read ~630-byte row
// pieces scattered over ~52 experts; ncu (H100, N = 8 decode) put it at 35 % of DRAM throughput
// where the gate/up kernel before it, streaming each expert's rows, reaches 71 %. Here a CTA takes
// one active expert (grid y: group slots) and a block of its rows (grid x), stages only that
// expert's positions (count <= T rows) and streams the rows in order: L lanes a row, a lane's spans
// sub, sub + L, ... (L consecutive spans of a row are one contiguous piece of each field plane), 32 /
// L rows a warp a pass. The dots land in the y plane [T k][H] f32 (a position's row: one expert's
// down output), and the combine sums them in j order with the shared expert's.
//
// Under programmatic dependent launch the group table and the first spans' weights are read before
// the grid-dependency wait (the routing is complete before gate/up releases its successor), the
// intermediate after it.
template <class SP, int MAXT, int L, int NS>
__global__ void __launch_bounds__(kWarps * 32, 2)
    down_rows_kernel(DevMat W, const int8_t *aq, const float2 *ad, Groups g, uint32_t rows_cta, float *y)
{
    extern __shared__ __align__(16) uint8_t smem[];
    const uint32_t I = W.cols, H = W.rows;
    const int spans = (int)(I / SP::kSpanElems), lane = threadIdx.x % 32, sub = lane % L;
    constexpr int R = 32 / L; // rows a warp a pass
    const GroupEntry ge = group_entry(g, (int)blockIdx.y);
    if ((int)blockIdx.y >= ge.live) return;
    const uint32_t row0 = blockIdx.x * rows_cta, row_end = min(row0 + rows_cta, H);
    int8_t *xq = reinterpret_cast<int8_t *>(smem);                                 // count padded rows
    float2 *xd = reinterpret_cast<float2 *>(smem + (size_t)MAXT * a8_stride(I));  // [count][I / 32]

    typename SP::Raw raw[NS];
    auto load = [&](uint32_t row, int s0) {
#pragma unroll
        for (int j = 0; j < NS; j++)
            if (row < row_end && s0 + L * j < spans) raw[j] = SP::load(W, (uint32_t)ge.expert, row, s0 + L * j);
    };
    // the warp's first rows: uniform across the warp (the butterflies below need every lane)
    uint32_t wrow = row0 + (threadIdx.x / 32) * R;
    load(wrow + lane / L, sub);
    cudaGridDependencySynchronize();
    cudaTriggerProgrammaticLaunchCompletion(); // the combine's launch; it waits for this grid's end
    copy_rows(aq, ad, ge.start, ge.count, I, xq, xd);
    cp_async_wait_all();
    __syncthreads();

    for (bool first = true; wrow < row_end; wrow += kWarps * R, first = false) {
        const uint32_t row = wrow + lane / L;
        float acc[MAXT] = {};
        for (int s0 = sub; s0 < spans; s0 += L * NS) {
            if (!first || s0 != sub) load(row, s0);
#pragma unroll
            for (int j = 0; j < NS; j++)
                if (row < row_end && s0 + L * j < spans)
                    SP::template dot<MAXT>(raw[j], s0 + L * j, xq, xd, I, ge.count, acc);
        }
#pragma unroll
        for (int t = 0; t < MAXT; t++) {
#pragma unroll
            for (int o = L / 2; o; o /= 2) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
            if (sub == 0 && row < row_end && t < ge.count) y[(size_t)(ge.start + t) * H + row] = acc[t];
        }
    }
}

template <class SP, int MAXT, int L>
cudaError_t launch_rows_l(const DevMat &W, const int8_t *aq, const float2 *ad, const Groups &g, float *y, bool pdl,
                          cudaStream_t s)
{
    const size_t smem = (size_t)MAXT * (a8_stride(W.cols) + W.cols / 32 * sizeof(float2));
    auto kern = down_rows_kernel<SP, MAXT, L, kDownRowsNS>;
    // one pass a warp: two (twice the rows a CTA, half the CTAs) measured 1.01x its layer time at
    // T = 8 .. 16 for the k-quant profiles, 0.98 - 1.00x for q8_0 (docs/perf/down_rows_h100_2026-12-07.md)
    const uint32_t rows_cta = kWarps * (32 / L);
    return launch_pdl(kern, dim3((W.rows + rows_cta - 1) / rows_cta, g.max_groups), dim3(kWarps * 32), smem, pdl, s, W,
                      aq, ad, g, rows_cta, y);
}

template <class SP>
cudaError_t launch_rows_sp(const DevMat &W, const int8_t *aq, const float2 *ad, const Groups &g, uint32_t T, float *y,
                           bool pdl, cudaStream_t s)
{
    const int L = down_rows_lanes((int)(W.cols / SP::kSpanElems));
    return with_maxt(T, [&](auto m) {
        constexpr int M = decltype(m)::value;
        if constexpr (M == 1) return cudaErrorInvalidValue; // T >= 2 (the caller's check)
        return L == 4 ? launch_rows_l<SP, M, 4>(W, aq, ad, g, y, pdl, s)
               : L == 8 ? launch_rows_l<SP, M, 8>(W, aq, ad, g, y, pdl, s)
                        : launch_rows_l<SP, M, 16>(W, aq, ad, g, y, pdl, s);
    });
}

// The largest shared-memory stage a CTA takes (two CTAs per SM stay resident below ~110 KiB); the
// device's opt-in limit may be lower.
constexpr size_t kSmemMax = 160 * 1024;

} // namespace

bool down_a8_supported(int codec, const DevMat &W, uint32_t T, uint32_t k)
{
    // the span policies take the same codecs and row lengths as gemv_a8's
    const size_t smem = DownSmem(T * k, W.cols).bytes;
    return T >= 1 && T <= 16 && smem <= kSmemMax && smem <= smem_optin_limit() && gemv_a8_supported(codec, W);
}

cudaError_t launch_down_a8(int codec, const DevMat &W, const float *act, const int8_t *aq, const float2 *ad,
                           const Routing &r, uint32_t T, uint32_t k, const float *ys, uint16_t *out, bool pdl,
                           cudaStream_t s)
{
    if (aq && (!ad || W.cols % 64)) return cudaErrorInvalidValue;
    return dispatch_span(codec, [&](auto sp) {
        return launch_sp<decltype(sp)>(W, act, aq, ad, r, T, k, ys, out, pdl, s);
    });
}

cudaError_t launch_down_rows_a8(int codec, const DevMat &W, const int8_t *aq, const float2 *ad, const Groups &g,
                                uint32_t T, float *y, bool pdl, cudaStream_t s)
{
    if (!aq || !ad || W.cols % 64 || T < 2 || T > kSmallRouteMax) return cudaErrorInvalidValue;
    return dispatch_span(codec, [&](auto sp) { return launch_rows_sp<decltype(sp)>(W, aq, ad, g, T, y, pdl, s); });
}

} // namespace nf
