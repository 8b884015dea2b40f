// The weighted combine: out[t] = bf16( sum_j w[t,j] * y[slot(t,j)] + shared_g[t] * ys[t] ), summed
// in j order so the result does not depend on where the work list put each position.
#include "internal.cuh"

namespace nf {

namespace {

__global__ void combine_kernel(const int32_t *slot, const float *w, const float *y, const float *shared_g,
                               const float *ys, uint32_t H, uint32_t k, uint16_t *out)
{
    const uint32_t t = blockIdx.x;
    for (uint32_t h = threadIdx.x; h < H; h += blockDim.x) {
        float acc = 0.f;
        for (uint32_t j = 0; j < k; j++)
            acc = fmaf(w[(size_t)t * k + j], y[(size_t)slot[(size_t)t * k + j] * H + h], acc);
        if (ys) acc = fmaf(shared_g[t], ys[(size_t)t * H + h], acc);
        out[(size_t)t * H + h] = f2bf(acc);
    }
}

} // namespace

void launch_combine(const Routing &r, const float *y, const float *ys, uint32_t T, uint32_t H, uint32_t k,
                    uint16_t *out, cudaStream_t s)
{
    combine_kernel<<<T, 256, 0, s>>>(r.slot, r.topk_w, y, r.shared_g, ys, H, k, out);
}

} // namespace nf
