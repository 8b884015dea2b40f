// Down projection and weighted combine fused, for the decode and small-token routes. A CTA owns
// kRows output rows h of every token; the kThreads threads of a row spread over the (group, piece)
// items of that row across all active experts, so even one token's 8 experts give every thread a
// few loads in flight and a small-token step's ~50 experts are walked by 128 threads, not 32. Each
// token's sum over its experts happens in registers and a block reduction (a fixed order, so the
// result is deterministic), instead of through a [T*k][H] plane.
//
// Under programmatic dependent launch (pdl = 1) the kernel starts while gate/up is still running:
// the routing it reads was complete before gate/up passed its own grid-dependency wait (gate/up
// triggers this launch only after it), so the first batch of weight loads is issued before the
// wait, and only the act reads come after it.
#include "internal.cuh"
#include "rowdot.cuh"

namespace nf {

namespace {

constexpr int kRows = 2;                  // output rows per CTA
constexpr int kThreads = 128;             // threads per row (4 warps)
constexpr int kBatch = 4;                 // items per thread in flight
constexpr int kWarpsPerRow = kThreads / 32;

// act[p][e0 .. e0 + RUN) . w[run] for one run; act is read through L1 (every row of the CTA and
// every CTA on the SM reads the same small plane), 16 bytes at a time.
template <class C>
__device__ __forceinline__ float dot_run(const float *w, const float *a)
{
    float d = 0.f;
#pragma unroll
    for (int j = 0; j < C::RUN; j += 4) {
        const float4 v = __ldg(reinterpret_cast<const float4 *>(a + j));
        d = fmaf(w[j], v.x, d);
        d = fmaf(w[j + 1], v.y, d);
        d = fmaf(w[j + 2], v.z, d);
        d = fmaf(w[j + 3], v.w, d);
    }
    return d;
}

template <class C, int MAXT>
__global__ void __launch_bounds__(kRows *kThreads) down_combine_kernel(DevMat W, const float *act, Routing r, uint32_t T,
                                                                      uint32_t k, const float *ys, uint16_t *out)
{
    static_assert(C::RUN % 4 == 0, "runs are read as float4");
    __shared__ float red[kRows][kWarpsPerRow][MAXT];
    const int I = (int)W.cols, pieces = I / C::BLK * C::PIECES;
    const int sub = threadIdx.x / kThreads, tid = threadIdx.x % kThreads;
    const uint32_t h = blockIdx.x * kRows + sub;
    const bool live = h < W.rows;
    const int items = live ? *r.n_groups * pieces : 0;

    typename C::Raw raw[kBatch];
    typename C::Row row[kBatch];
    auto load = [&](int i0) {
#pragma unroll
        for (int u = 0; u < kBatch; u++) {
            const int i = i0 + kThreads * u;
            if (i < items) {
                row[u] = C::row(W, (uint32_t)r.g_expert[i / pieces], h);
                raw[u] = C::load(row[u], i % pieces);
            }
        }
    };
    load(tid); // weights and routing only: before the wait on gate/up
    cudaGridDependencySynchronize();

    float acc[MAXT] = {};
    for (int i0 = tid; i0 < items; i0 += kThreads * kBatch) {
        if (i0 != tid) load(i0);
#pragma unroll
        for (int u = 0; u < kBatch; u++) {
            const int i = i0 + kThreads * u;
            if (i >= items) break;
            const int g = i / pieces, q = i % pieces;
            float w[C::PE];
            C::decode(row[u], raw[u], q, w);
            const int start = r.g_start[g], count = r.g_count[g];
            for (int p = start; p < start + count; p++) {
                const float *a = act + (size_t)p * I;
                float d = 0.f;
#pragma unroll
                for (int run = 0; run < C::RUNS; run++) d += dot_run<C>(w + run * C::RUN, a + C::elem(q, run));
                const int entry = r.pos_entry[p];
                const int t = entry / (int)k;
                const float v = r.topk_w[entry] * d;
#pragma unroll
                for (int tt = 0; tt < MAXT; tt++)
                    if (tt == t) acc[tt] += v; // a register per token: no dynamic indexing
            }
        }
    }
    const int warp = tid / 32, lane = tid % 32;
#pragma unroll
    for (int t = 0; t < MAXT; t++) {
        const float v = warp_sum(acc[t]);
        if (lane == 0) red[sub][warp][t] = v;
    }
    __syncthreads();
    if (!live) return;
    for (int t = tid; t < (int)T && t < MAXT; t += kThreads) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < kWarpsPerRow; w++) v += red[sub][w][t];
        if (ys) v = fmaf(r.shared_g[t], ys[(size_t)t * W.rows + h], v);
        out[(size_t)t * W.rows + h] = f2bf(v);
    }
}

template <class C, int MAXT>
cudaError_t launch_t(const DevMat &W, const float *act, const Routing &r, uint32_t T, uint32_t k, const float *ys,
                     uint16_t *out, bool pdl, cudaStream_t s)
{
    return launch_pdl(down_combine_kernel<C, MAXT>, dim3((W.rows + kRows - 1) / kRows), dim3(kRows * kThreads), 0, pdl, s,
                      W, act, r, T, k, ys, out);
}

} // namespace

cudaError_t launch_down_combine(int codec, const DevMat &W, const float *act, const Routing &r, uint32_t T,
                                uint32_t k, uint32_t /*max_groups*/, const float *ys, uint16_t *out, bool pdl,
                                cudaStream_t s)
{
    return dispatch_codec(codec, [&](auto c) {
        using C = decltype(c);
        return with_maxt(T, [&](auto m) { return launch_t<C, decltype(m)::value>(W, act, r, T, k, ys, out, pdl, s); });
    });
}

} // namespace nf
