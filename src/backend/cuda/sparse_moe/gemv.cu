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
                const int row = g.pos_entry ? g.pos_entry[pos] / (int)g.entry_div : pos;
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
template <class C, int MAXT, bool GLU, bool IN_BF16>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(DevMat W, const void *in, uint32_t in_stride, Groups g,
                                                          float *out, uint32_t out_stride, int tchunk)
{
    extern __shared__ float xs[]; // [tchunk][W.cols]
    const int gi = blockIdx.y;
    if (gi >= *g.n) return;
    const int expert = g.expert[gi], start = g.start[gi], count = g.count[gi];
    const uint32_t out_rows = GLU ? W.rows / 2 : W.rows;
    const uint32_t r = blockIdx.x * kWarps + threadIdx.x / 32;
    const uint32_t cols = W.cols;
    const int pieces = (int)(cols / C::BLK) * C::PIECES;

    for (int c0 = 0; c0 < count; c0 += tchunk) {
        const int nt = min(tchunk, count - c0);
        __syncthreads(); // the previous chunk's readers are done with xs
        stage_rows<IN_BF16>(in, in_stride, g, start + c0, nt, cols, xs);
        __syncthreads();
        if (r >= out_rows) continue;
        const typename C::Row Ra = C::row(W, expert, r);
        const typename C::Row Rb = C::row(W, expert, GLU ? r + out_rows : r);
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

template <class C, int MAXT>
cudaError_t launch_t(bool glu, const DevMat &W, const void *in, bool in_bf16, uint32_t in_stride, const Groups &g,
                     float *out, uint32_t out_stride, uint32_t max_tokens, cudaStream_t s)
{
    const uint32_t out_rows = glu ? W.rows / 2 : W.rows;
    // Tokens staged per pass: no more than a group can hold (the slice's T), the shared-memory
    // budget allows, or 64; small stages keep several CTAs resident per SM at decode sizes.
    int tchunk = (int)(kSmemBudget / ((size_t)W.cols * sizeof(float)));
    if (tchunk < 1) return cudaErrorInvalidValue;
    if (tchunk > 64) tchunk = 64;
    if (tchunk > (int)max_tokens) tchunk = (int)max_tokens;
    size_t smem = (size_t)tchunk * W.cols * sizeof(float);
    dim3 grid((out_rows + kWarps - 1) / kWarps, g.max_groups);
    void (*k)(DevMat, const void *, uint32_t, Groups, float *, uint32_t, int);
    if (glu)
        k = in_bf16 ? gemv_kernel<C, MAXT, true, true> : gemv_kernel<C, MAXT, true, false>;
    else
        k = in_bf16 ? gemv_kernel<C, MAXT, false, true> : gemv_kernel<C, MAXT, false, false>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    k<<<grid, kWarps * 32, smem, s>>>(W, in, in_stride, g, out, out_stride, tchunk);
    return cudaGetLastError();
}

template <class C>
cudaError_t launch_c(bool glu, const DevMat &W, const void *in, bool in_bf16, uint32_t in_stride, const Groups &g,
                     float *out, uint32_t out_stride, uint32_t max_tokens, cudaStream_t s)
{
    // Registers hold MAXT accumulators per row; pick the smallest instantiation that covers the
    // tokens one group can have (a group never has more positions than the slice has tokens).
    if (max_tokens <= 1) return launch_t<C, 1>(glu, W, in, in_bf16, in_stride, g, out, out_stride, max_tokens, s);
    if (max_tokens <= 4) return launch_t<C, 4>(glu, W, in, in_bf16, in_stride, g, out, out_stride, max_tokens, s);
    return launch_t<C, 8>(glu, W, in, in_bf16, in_stride, g, out, out_stride, max_tokens, s);
}

} // namespace

cudaError_t launch_gemv(int codec, bool glu, const DevMat &W, const void *in, bool in_bf16, uint32_t in_stride,
                        const Groups &g, float *out, uint32_t out_stride, uint32_t max_tokens, cudaStream_t s)
{
    return dispatch_codec(codec, [&](auto c) {
        return launch_c<decltype(c)>(glu, W, in, in_bf16, in_stride, g, out, out_stride, max_tokens, s);
    });
}

} // namespace nf
