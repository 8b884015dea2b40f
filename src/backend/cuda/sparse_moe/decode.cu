// Down projection and weighted combine fused, for the decode and small-token routes. A warp owns one
// output row h of every token: its lanes take the (group, piece) items of row h across all active
// experts, so a decode step's handful of experts still gives each lane several loads in flight,
// and each token's sum over its experts happens in registers instead of through a [T*k][H] plane.
#include "internal.cuh"
#include "rowdot.cuh"

namespace nf {

namespace {

constexpr int kWarps = 8; // output rows per CTA

constexpr size_t kActSmem = 96 * 1024; // act planes up to this size are staged in shared memory

template <class C, int MAXT>
__global__ void __launch_bounds__(kWarps * 32) down_combine_kernel(DevMat W, const float *act, Routing r, uint32_t T,
                                                                  uint32_t k, const float *ys, uint16_t *out, int staged)
{
    extern __shared__ float acts[]; // [T*k][I] when staged
    const int I = (int)W.cols, pieces = I / C::BLK * C::PIECES, groups = *r.n_groups;
    if (staged) { // every CTA reads all of act: take it once into shared memory, 16-byte loads in flight
        const uint32_t vecs = T * k * (uint32_t)I / 4;
        const uint4 *src = reinterpret_cast<const uint4 *>(act);
        uint4 *dst = reinterpret_cast<uint4 *>(acts);
        for (uint32_t v0 = threadIdx.x; v0 < vecs; v0 += blockDim.x * 4) {
            uint4 buf[4];
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (v0 + u * blockDim.x < vecs) buf[u] = src[v0 + u * blockDim.x];
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (v0 + u * blockDim.x < vecs) dst[v0 + u * blockDim.x] = buf[u];
        }
        __syncthreads();
        act = acts;
    }
    const uint32_t h = blockIdx.x * kWarps + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (h >= W.rows) return;
    const int items = groups * pieces;
    float acc[MAXT] = {};
    for (int i0 = lane; i0 < items; i0 += 32 * kLoadBatch) {
        typename C::Raw raw[kLoadBatch];
        typename C::Row row[kLoadBatch];
#pragma unroll
        for (int u = 0; u < kLoadBatch; u++) {
            const int i = i0 + 32 * u;
            if (i < items) {
                row[u] = C::row(W, (uint32_t)r.g_expert[i / pieces], h);
                raw[u] = C::load(row[u], i % pieces);
            }
        }
#pragma unroll
        for (int u = 0; u < kLoadBatch; u++) {
            const int i = i0 + 32 * u;
            if (i >= items) break;
            const int g = i / pieces, q = i % pieces;
            float w[C::PE];
            C::decode(row[u], raw[u], q, w);
            const int start = r.g_start[g], count = r.g_count[g];
            for (int p = start; p < start + count; p++) {
                const float *a = act + (size_t)p * I;
                float d = 0.f;
#pragma unroll
                for (int run = 0; run < C::RUNS; run++) {
                    const int e0 = C::elem(q, run);
#pragma unroll
                    for (int j = 0; j < C::RUN; j++) d = fmaf(w[run * C::RUN + j], a[e0 + j], d);
                }
                const int entry = r.pos_entry[p];
                const int t = entry / (int)k;
                const float v = r.topk_w[entry] * d;
#pragma unroll
                for (int tt = 0; tt < MAXT; tt++)
                    if (tt == t) acc[tt] += v; // a register per token: no dynamic indexing
            }
        }
    }
#pragma unroll
    for (int t = 0; t < MAXT; t++) {
        if (t >= (int)T) break;
        float v = warp_sum(acc[t]);
        if (ys) v = fmaf(r.shared_g[t], ys[(size_t)t * W.rows + h], v);
        if (lane == 0) out[(size_t)t * W.rows + h] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    }
}

template <class C, int MAXT>
cudaError_t launch_t(const DevMat &W, const float *act, const Routing &r, uint32_t T, uint32_t k, const float *ys,
                     uint16_t *out, cudaStream_t s)
{
    const size_t bytes = (size_t)T * k * W.cols * sizeof(float);
    const int staged = bytes <= kActSmem;
    auto kern = down_combine_kernel<C, MAXT>;
    if (staged) cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kActSmem);
    kern<<<(W.rows + kWarps - 1) / kWarps, kWarps * 32, staged ? bytes : 0, s>>>(W, act, r, T, k, ys, out, staged);
    return cudaGetLastError();
}

} // namespace

cudaError_t launch_down_combine(int codec, const DevMat &W, const float *act, const Routing &r, uint32_t T,
                                uint32_t k, uint32_t /*max_groups*/, const float *ys, uint16_t *out, cudaStream_t s)
{
    return dispatch_codec(codec, [&](auto c) {
        using C = decltype(c);
        if (T <= 1) return launch_t<C, 1>(W, act, r, T, k, ys, out, s);
        if (T <= 2) return launch_t<C, 2>(W, act, r, T, k, ys, out, s);
        if (T <= 4) return launch_t<C, 4>(W, act, r, T, k, ys, out, s);
        if (T <= 8) return launch_t<C, 8>(W, act, r, T, k, ys, out, s);
        if (T <= 16) return launch_t<C, 16>(W, act, r, T, k, ys, out, s);
        return cudaErrorInvalidValue; // the small-token route ends at 16 tokens
    });
}

} // namespace nf
