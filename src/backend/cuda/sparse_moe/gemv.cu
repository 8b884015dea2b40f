// The CUDA-core grouped GEMV (gate/up of the decode and small-token routes, and for now every matrix
// of the prefill route): a warp owns one output row (a gate/up pair for GLU), lanes stream the row's
// pieces (rowdot.cuh) and dot them with every position of the group, staged in shared memory as f32.
#include "internal.cuh"
#include "rowdot.cuh"

namespace nf {

namespace {

constexpr int kWarps = 8; // output rows (row pairs) per CTA
constexpr size_t kSmemBudget = 200 * 1024;

// Stages nt input rows (positions pos0..) as f32 into xs[nt][cols] with 16-byte loads, all of a
// thread's loads issued before its stores (a load-use chain per element costs a DRAM latency each).
// cols is a multiple of 8 (every codec's block is).
template <bool IN_BF16>
__device__ __forceinline__ void stage_rows(const void *in, uint32_t in_stride, const Groups &g, int pos0, int nt,
                                           uint32_t cols, float *xs)
{
    constexpr int PER = IN_BF16 ? 8 : 4; // elements per 16-byte load
    const uint32_t vecs = cols / PER, total = (uint32_t)nt * vecs;
    for (uint32_t v0 = threadIdx.x; v0 < total; v0 += blockDim.x * 4) {
        uint4 buf[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const uint32_t v = v0 + u * blockDim.x;
            if (v < total) {
                const int t = (int)(v / vecs), pos = pos0 + t;
                const int row = input_row(g, pos);
                const uint8_t *src = (const uint8_t *)in + ((size_t)row * in_stride + (v % vecs) * PER) * (IN_BF16 ? 2 : 4);
                buf[u] = *reinterpret_cast<const uint4 *>(src);
            }
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const uint32_t v = v0 + u * blockDim.x;
            if (v >= total) break;
            float *dst = xs + (size_t)(v / vecs) * cols + (v % vecs) * PER;
            if (IN_BF16) {
                const uint32_t w[4] = {buf[u].x, buf[u].y, buf[u].z, buf[u].w};
#pragma unroll
                for (int i = 0; i < 4; i++) dst[2 * i] = __uint_as_float(w[i] << 16), dst[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
            } else {
                *reinterpret_cast<uint4 *>(dst) = buf[u];
            }
        }
    }
}

// grid: x = row blocks of kWarps output rows, y = group slots. Block: kWarps warps.
// EARLY (one token whose row is x[0], the decode route): the activations are staged before the
// grid-dependency wait, i.e. while the router still runs under programmatic dependent launch.
template <class C, int MAXT, bool GLU, bool IN_BF16, bool EARLY>
__global__ void __launch_bounds__(kWarps * 32, MAXT == 1 ? 2 : 1) gemv_kernel(DevMat W, const void *in, uint32_t in_stride, Groups g,
                                                          float *out, uint32_t out_stride, int tchunk, NextMat nx)
{
    extern __shared__ float xs[]; // [tchunk][W.cols]
    const uint32_t cols = W.cols;
    if (EARLY) {
        const Groups g0{nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1};
        stage_rows<IN_BF16>(in, in_stride, g0, 0, 1, cols, xs);
    }
    // Under programmatic dependent launch: wait for the router, then let the next launch start
    // (it reads routing only before its own wait); both are no-ops in a plain launch.
    cudaGridDependencySynchronize();
    cudaTriggerProgrammaticLaunchCompletion();
    const int gi = blockIdx.y;
    const GroupEntry ge = group_entry(g, gi); // one round trip
    if (gi >= ge.live) return;
    const int expert = ge.expert, start = ge.start, count = ge.count;
    const uint32_t out_rows = GLU ? W.rows / 2 : W.rows;
    const uint32_t r = blockIdx.x * kWarps + threadIdx.x / 32;
    const int pieces = (int)(cols / C::BLK) * C::PIECES;
    const typename C::Row Ra = C::row(W, expert, r < out_rows ? r : 0);
    const typename C::Row Rb = C::row(W, expert, GLU ? (r < out_rows ? r : 0) + out_rows : r < out_rows ? r : 0);
    // The warp's rows travel to L1 while the activations are staged (the two latencies overlap);
    // an L1 prefetch costs no registers, where holding a batch of raw pieces across the staging
    // costs the gate/up kernels their occupancy. Whole rows: the row-planar layout keeps every
    // field of a row inside [row, row + row_stride) (nvfp4: its data plane).
    if (r < out_rows) {
        const uint8_t *pa = row_ptr(W, expert, r), *pb = row_ptr(W, expert, GLU ? r + out_rows : r);
        for (uint32_t off = (threadIdx.x % 32) * 128; off < W.row_stride; off += 32 * 128) {
            prefetch_line(pa + off, true);
            if (GLU) prefetch_line(pb + off, true);
        }
    }
    prefetch_expert(nx, (uint32_t)expert);

    for (int c0 = 0; c0 < count; c0 += tchunk) {
        const int nt = min(tchunk, count - c0);
        if (!EARLY) {
            __syncthreads(); // the previous chunk's readers are done with xs
            stage_rows<IN_BF16>(in, in_stride, g, start + c0, nt, cols, xs);
        }
        __syncthreads();
        if (r >= out_rows) continue;
        for (int t0 = 0; t0 < nt; t0 += MAXT) {
            const int n = min(MAXT, nt - t0);
            float a[MAXT] = {}, b[MAXT] = {};
            dot_rows<C, MAXT, GLU ? 2 : 1>(Ra, Rb, pieces, xs + (size_t)t0 * cols, (int)cols, n, a, b);
#pragma unroll
            for (int t = 0; t < MAXT; t++) {
                if (t >= n) break;
                const float va = warp_sum(a[t]);
                const float v = GLU ? silu(va) * warp_sum(b[t]) : va;
                if (threadIdx.x % 32 == 0) out[(size_t)(start + c0 + t0 + t) * out_stride + r] = v;
            }
        }
    }
}

template <class C, int MAXT, bool GLU, bool IN_BF16>
using GemvKernel = void (*)(DevMat, const void *, uint32_t, Groups, float *, uint32_t, int, NextMat);

template <class C, int MAXT, bool GLU, bool IN_BF16>
GemvKernel<C, MAXT, GLU, IN_BF16> pick(bool early)
{
    if constexpr (MAXT == 1) {
        if (early) return gemv_kernel<C, MAXT, GLU, IN_BF16, true>;
    }
    return gemv_kernel<C, MAXT, GLU, IN_BF16, false>;
}

template <class C, int MAXT>
cudaError_t launch_t(bool glu, const DevMat &W, const void *in, bool in_bf16, uint32_t in_stride, const Groups &g,
                     float *out, uint32_t out_stride, uint32_t max_tokens, const GemvLaunch &opt, cudaStream_t s)
{
    const uint32_t out_rows = glu ? W.rows / 2 : W.rows;
    // Tokens staged per pass: no more than a group can hold (the slice's T), the shared-memory
    // budget allows, or 64; small stages keep several CTAs resident per SM at decode sizes.
    int tchunk = (int)(kSmemBudget / ((size_t)W.cols * sizeof(float)));
    if (tchunk < 1) return cudaErrorInvalidValue;
    if (tchunk > 64) tchunk = 64;
    if (tchunk > (int)max_tokens) tchunk = (int)max_tokens;
    size_t smem = (size_t)tchunk * W.cols * sizeof(float);
    // EARLY staging needs every position's input row to be row 0 (the caller says so)
    const bool early = opt.rows_are_x0 && max_tokens == 1;
    void (*k)(DevMat, const void *, uint32_t, Groups, float *, uint32_t, int, NextMat);
    if (glu)
        k = in_bf16 ? pick<C, MAXT, true, true>(early) : pick<C, MAXT, true, false>(early);
    else
        k = in_bf16 ? pick<C, MAXT, false, true>(early) : pick<C, MAXT, false, false>(early);
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    return launch_pdl(k, dim3((out_rows + kWarps - 1) / kWarps, g.max_groups), dim3(kWarps * 32), smem, opt.pdl, s, W,
                      in, in_stride, g, out, out_stride, tchunk, opt.next);
}

template <class C>
cudaError_t launch_c(bool glu, const DevMat &W, const void *in, bool in_bf16, uint32_t in_stride, const Groups &g,
                     float *out, uint32_t out_stride, uint32_t max_tokens, const GemvLaunch &opt, cudaStream_t s)
{
    // Registers hold MAXT accumulators per row; pick the smallest instantiation that covers the
    // tokens one group can have (a group never has more positions than the slice has tokens).
    if (max_tokens <= 1) return launch_t<C, 1>(glu, W, in, in_bf16, in_stride, g, out, out_stride, max_tokens, opt, s);
    if (max_tokens <= 4) return launch_t<C, 4>(glu, W, in, in_bf16, in_stride, g, out, out_stride, max_tokens, opt, s);
    return launch_t<C, 8>(glu, W, in, in_bf16, in_stride, g, out, out_stride, max_tokens, opt, s);
}

} // namespace

cudaError_t launch_gemv_ex(int codec, bool glu, const DevMat &W, const void *in, bool in_bf16, uint32_t in_stride,
                           const Groups &g, float *out, uint32_t out_stride, uint32_t max_tokens,
                           const GemvLaunch &opt, cudaStream_t s)
{
    if (opt.a8 && in_bf16 && gemv_a8_supported(codec, W))
        return launch_gemv_a8(codec, glu, W, (const uint16_t *)in, in_stride, g, out, out_stride, max_tokens, opt, s);
    if (gemv_mma_supported(codec, W)) // nvfp4 and bf16 on tensor cores
        return launch_gemv_mma(codec, glu, W, in, in_bf16, in_stride, g, out, out_stride, max_tokens, opt, s);
    return dispatch_codec(codec, [&](auto c) {
        return launch_c<decltype(c)>(glu, W, in, in_bf16, in_stride, g, out, out_stride, max_tokens, opt, s);
    });
}

cudaError_t launch_gemv(int codec, bool glu, const DevMat &W, const void *in, bool in_bf16, uint32_t in_stride,
                        const Groups &g, float *out, uint32_t out_stride, uint32_t max_tokens, cudaStream_t s)
{
    return launch_gemv_ex(codec, glu, W, in, in_bf16, in_stride, g, out, out_stride, max_tokens, GemvLaunch{}, s);
}

} // namespace nf
