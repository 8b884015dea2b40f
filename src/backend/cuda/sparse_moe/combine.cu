// The weighted combine: out[t] = bf16( sum_j w[t,j] * y[slot(t,j)] + shared_g[t] * ys[t] ), summed
// in j order so the result does not depend on where the work list put each position. y is the down
// GEMMs' plane: bf16 from the tensor-core prefill (half the bytes of the combine's read, the layer's
// largest), f32 from the CUDA-core fallback.
#include "internal.cuh"

namespace nf {

namespace {

// One CTA a token, one 16-byte load of y a slot per thread (4 columns of f32, 8 of bf16): the token's
// slots and weights staged once, every slot's load issued before the sums, which run in j order into
// fmaf (the same bits whatever the width). (A column a thread with the slot and weight reloaded each step
// read the [T k][H] plane at 3.7 TB/s: 76.6 us at T = 4096, k = 8, H = 2048; H200, ncu. With bf16 y at
// 4 columns a thread, 8-byte loads, the same plane's half took 135 us: too few bytes in flight.)
// H % C == 0 (bind: H % 8), k <= KM: 8 (the qwen geometries' top-8) or 16, the most a bank has. The
// raw vectors are KM x 4 registers whichever k runs, so KM = 16 for k = 8 held a 256-thread CTA to
// two an SM (128 registers, bf16 y); at 8 (64 registers) four fit, and the loads in flight an SM with them.

// C consecutive elements of y at element i: one 16-byte load, kept raw until the sums (KM slots of
// raw vectors, 4 registers each for either width) and widened to f32 element by element.
template <class Y> struct Vec;
template <> struct Vec<float> {
    static constexpr uint32_t C = 4;
    __device__ static float at(const uint4 &u, uint32_t c) { return __uint_as_float((&u.x)[c]); }
};
template <> struct Vec<uint16_t> {
    static constexpr uint32_t C = 8;
    __device__ static float at(const uint4 &u, uint32_t c)
    {
        const uint32_t w = (&u.x)[c / 2];
        return __uint_as_float(c % 2 ? w & 0xFFFF0000u : w << 16);
    }
};

template <class Y, uint32_t KM>
__global__ void __launch_bounds__(256, KM == 8 ? 4 : 2) combine_kernel(const int32_t *slot, const float *w, const Y *y, const float *shared_g,
                               const float *ys, uint32_t H, uint32_t k, uint16_t *out)
{
    constexpr uint32_t C = Vec<Y>::C;
    __shared__ uint32_t sl[KM];
    __shared__ float sw[KM];
    const uint32_t t = blockIdx.x;
    if (threadIdx.x < k) sl[threadIdx.x] = (uint32_t)slot[(size_t)t * k + threadIdx.x], sw[threadIdx.x] = w[(size_t)t * k + threadIdx.x];
    cudaGridDependencySynchronize(); // launched pdl: the routing is older than the predecessor, y is not
    __syncthreads();
    const float g = ys ? shared_g[t] : 0.f;
    for (uint32_t h = C * threadIdx.x; h < H; h += C * blockDim.x) {
        uint4 v[KM];
#pragma unroll
        for (uint32_t j = 0; j < KM; j++)
            if (j < k) v[j] = *reinterpret_cast<const uint4 *>(y + (size_t)sl[j] * H + h);
        float a[C];
#pragma unroll
        for (uint32_t c = 0; c < C; c++) a[c] = 0.f;
#pragma unroll
        for (uint32_t j = 0; j < KM; j++)
            if (j < k) {
#pragma unroll
                for (uint32_t c = 0; c < C; c++) a[c] = fmaf(sw[j], Vec<Y>::at(v[j], c), a[c]);
            }
        if (ys) {
#pragma unroll
            for (uint32_t c = 0; c < C; c += 4) {
                const float4 u = *reinterpret_cast<const float4 *>(ys + (size_t)t * H + h + c);
                a[c] = fmaf(g, u.x, a[c]), a[c + 1] = fmaf(g, u.y, a[c + 1]);
                a[c + 2] = fmaf(g, u.z, a[c + 2]), a[c + 3] = fmaf(g, u.w, a[c + 3]);
            }
        }
        uint32_t o[C / 2];
#pragma unroll
        for (uint32_t c = 0; c < C / 2; c++) o[c] = pack_bf16x2(a[2 * c], a[2 * c + 1]);
        if constexpr (C == 8) *reinterpret_cast<uint4 *>(out + (size_t)t * H + h) = make_uint4(o[0], o[1], o[2], o[3]);
        else *reinterpret_cast<uint2 *>(out + (size_t)t * H + h) = make_uint2(o[0], o[1]);
    }
}

} // namespace

cudaError_t launch_combine(const Routing &r, const void *y, bool y16, const float *ys, uint32_t T, uint32_t H,
                           uint32_t k, uint16_t *out, cudaStream_t s, bool pdl)
{
    auto go = [&](auto kernel, const auto *yp) {
        return launch_pdl(kernel, dim3(T), dim3(256), 0, pdl, s, r.slot, r.topk_w, yp, r.shared_g, ys, H, k, out);
    };
    if (y16) return k <= 8 ? go(combine_kernel<uint16_t, 8>, (const uint16_t *)y) : go(combine_kernel<uint16_t, 16>, (const uint16_t *)y);
    return k <= 8 ? go(combine_kernel<float, 8>, (const float *)y) : go(combine_kernel<float, 16>, (const float *)y);
}

} // namespace nf
