// The weighted combine: out[t] = bf16( sum_j w[t,j] * y[slot(t,j)] + shared_g[t] * ys[t] ), summed
// in j order so the result does not depend on where the work list put each position. y is the down
// GEMMs' plane: bf16 from the tensor-core prefill (half the bytes of the combine's read, the layer's
// largest), f32 from the CUDA-core fallback.
#include "internal.cuh"

namespace nf {

namespace {

// One CTA a token, 4 columns a thread: the token's slots and weights staged once, every slot's
// load of y (16 bytes f32, 8 bf16) issued before the sums, which run in j order into fmaf as before (the same bits).
// (A column a thread with the slot and weight reloaded each step read the [T k][H] plane at 3.7 TB/s:
// 76.6 us at T = 4096, k = 8, H = 2048; H200, ncu.) H % 4 == 0 (bind: H % 8), k <= kMaxK.
constexpr uint32_t kMaxK = 16;

// Four consecutive elements of y at element i: one 16-byte load (f32) or 8-byte load (bf16).
__device__ __forceinline__ float4 load4(const float *y, size_t i) { return *reinterpret_cast<const float4 *>(y + i); }
__device__ __forceinline__ float4 load4(const uint16_t *y, size_t i)
{
    const uint2 v = *reinterpret_cast<const uint2 *>(y + i);
    return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xFFFF0000u), __uint_as_float(v.y << 16),
                       __uint_as_float(v.y & 0xFFFF0000u));
}

template <class Y>
__global__ void combine_kernel(const int32_t *slot, const float *w, const Y *y, const float *shared_g,
                               const float *ys, uint32_t H, uint32_t k, uint16_t *out)
{
    __shared__ uint32_t sl[kMaxK];
    __shared__ float sw[kMaxK];
    const uint32_t t = blockIdx.x;
    if (threadIdx.x < k) sl[threadIdx.x] = (uint32_t)slot[(size_t)t * k + threadIdx.x], sw[threadIdx.x] = w[(size_t)t * k + threadIdx.x];
    __syncthreads();
    const float g = ys ? shared_g[t] : 0.f;
    for (uint32_t h = 4 * threadIdx.x; h < H; h += 4 * blockDim.x) {
        float4 v[kMaxK];
#pragma unroll
        for (uint32_t j = 0; j < kMaxK; j++)
            if (j < k) v[j] = load4(y, (size_t)sl[j] * H + h);
        float a[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (uint32_t j = 0; j < kMaxK; j++)
            if (j < k) {
                a[0] = fmaf(sw[j], v[j].x, a[0]), a[1] = fmaf(sw[j], v[j].y, a[1]);
                a[2] = fmaf(sw[j], v[j].z, a[2]), a[3] = fmaf(sw[j], v[j].w, a[3]);
            }
        if (ys) {
            const float4 u = *reinterpret_cast<const float4 *>(ys + (size_t)t * H + h);
            a[0] = fmaf(g, u.x, a[0]), a[1] = fmaf(g, u.y, a[1]), a[2] = fmaf(g, u.z, a[2]), a[3] = fmaf(g, u.w, a[3]);
        }
        *reinterpret_cast<uint2 *>(out + (size_t)t * H + h) = make_uint2(pack_bf16x2(a[0], a[1]), pack_bf16x2(a[2], a[3]));
    }
}

} // namespace

void launch_combine(const Routing &r, const void *y, bool y16, const float *ys, uint32_t T, uint32_t H, uint32_t k,
                    uint16_t *out, cudaStream_t s)
{
    if (y16) combine_kernel<<<T, 256, 0, s>>>(r.slot, r.topk_w, (const uint16_t *)y, r.shared_g, ys, H, k, out);
    else combine_kernel<<<T, 256, 0, s>>>(r.slot, r.topk_w, (const float *)y, r.shared_g, ys, H, k, out);
}

} // namespace nf
