// The k best logits on the device (k <= kSampleMaxK), so sampling moves k (id, logit) pairs to the
// host instead of the whole vocabulary; the host applies the sampler's rule to them (the same code
// as on the CPU, so one seed gives the same tokens on either device).
//
// Order: higher logit first, ties to the lower id (the CPU sampler's). Rows (one per sequence) are
// independent: blockIdx.y is the row in both stages. Two stages: kParts CTAs a row each
// select their slice's k best by k rounds of "best element after the previous pick" (a block-wide
// argmax per round, no sort, no extra memory), then one CTA does the same over the kParts * k.
#include <math.h>

#include "ops.cuh"

namespace nf {
namespace dec {

namespace {

constexpr int kParts = 64, kThreads = 256;

// a before b in the order
__device__ __forceinline__ bool better(float va, int32_t ia, float vb, int32_t ib)
{
    return va > vb || (va == vb && ia < ib);
}

// Block-wide: the best (v, i) among n of (vals[j], ids[j]) strictly after (pv, pi) in the order;
// i = -1 when none. Result in every thread.
__device__ void block_best_after(const float *vals, const int32_t *ids, uint32_t n, float pv, int32_t pi, float &bv,
                                 int32_t &bi)
{
    __shared__ float sv[kThreads / 32];
    __shared__ int32_t si[kThreads / 32];
    float v = -INFINITY;
    int32_t id = -1;
    for (uint32_t j = threadIdx.x; j < n; j += blockDim.x) {
        const float x = vals[j];
        const int32_t xi = ids ? ids[j] : (int32_t)j;
        if (xi < 0) continue; // an empty slot
        if (pi >= 0 && !better(pv, pi, x, xi)) continue; // not after the previous pick
        if (id < 0 || better(x, xi, v, id)) v = x, id = xi;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int32_t oi = __shfl_xor_sync(0xffffffffu, id, o);
        if (oi >= 0 && (id < 0 || better(ov, oi, v, id))) v = ov, id = oi;
    }
    __syncthreads();
    if (threadIdx.x % 32 == 0) sv[threadIdx.x / 32] = v, si[threadIdx.x / 32] = id;
    __syncthreads();
    bv = -INFINITY, bi = -1;
    for (int w = 0; w < (int)blockDim.x / 32; w++)
        if (si[w] >= 0 && (bi < 0 || better(sv[w], si[w], bv, bi))) bv = sv[w], bi = si[w];
}

// Stage 1: part p's slice of the logits -> its k best at cand[p * k ..] (id -1 past the slice's end).
__global__ void topk_part_kernel(const float *logits, uint32_t vocab, size_t stride, uint32_t k, float *cv, int32_t *ci)
{
    logits += blockIdx.y * stride;
    cv += (size_t)blockIdx.y * gridDim.x * k;
    ci += (size_t)blockIdx.y * gridDim.x * k;
    const uint32_t per = (vocab + gridDim.x - 1) / gridDim.x, b = blockIdx.x * per;
    const uint32_t n = b < vocab ? min(per, vocab - b) : 0;
    float pv = 0;
    int32_t pi = -1;
    for (uint32_t r = 0; r < k; r++) {
        float bv;
        int32_t bi;
        block_best_after(logits + b, nullptr, n, pv, pi < 0 ? -1 : pi - (int32_t)b, bv, bi);
        if (threadIdx.x == 0) cv[blockIdx.x * k + r] = bv, ci[blockIdx.x * k + r] = bi < 0 ? -1 : bi + (int32_t)b;
        if (bi < 0) {
            for (uint32_t q = r + 1 + threadIdx.x; q < k; q += blockDim.x) ci[blockIdx.x * k + q] = -1;
            return;
        }
        pv = bv, pi = bi + (int32_t)b;
    }
}

// Stage 2: the k best of the parts' candidates (ids -1 are empty slots).
__global__ void topk_merge_kernel(const float *cv, const int32_t *ci, uint32_t n, uint32_t k, float *ov, int32_t *oi)
{
    cv += (size_t)blockIdx.x * n, ci += (size_t)blockIdx.x * n;
    ov += (size_t)blockIdx.x * k, oi += (size_t)blockIdx.x * k;
    float pv = 0;
    int32_t pi = -1;
    for (uint32_t r = 0; r < k; r++) {
        float bv;
        int32_t bi;
        block_best_after(cv, ci, n, pv, pi, bv, bi);
        if (threadIdx.x == 0) ov[r] = bv, oi[r] = bi;
        pv = bv, pi = bi;
    }
}

// One CTA a row; the pairs of a row name distinct ids, so no two threads touch one logit. The rule is
// the CPU sampler's (engine/sampler.c penalised) to the bit: the same f32 divide or multiply, then the
// frequency and presence terms (OpenAI's) subtracted one at a time, frequency * count rounded on its
// own (__fmul_rn: nvcc would otherwise fuse it into the subtraction, which the host does not).
__global__ void penalize_kernel(float *logits, size_t stride, const int32_t *row, const uint32_t *start, const Penalty *pen,
                                const int32_t *ids, const uint32_t *counts, uint32_t vocab)
{
    const uint32_t r = blockIdx.x;
    const Penalty p = pen[r];
    float *l = logits + (size_t)row[r] * stride;
    for (uint32_t j = start[r] + threadIdx.x; j < start[r + 1]; j += blockDim.x) {
        const int32_t id = ids[j];
        if (id < 0 || (uint32_t)id >= vocab || !counts[j]) continue;
        float x = l[id];
        if (p.repetition != 1.0f) x = x > 0 ? x / p.repetition : x * p.repetition;
        if (p.frequency != 0.0f) x -= __fmul_rn(p.frequency, (float)counts[j]);
        if (p.presence != 0.0f) x -= p.presence;
        l[id] = x;
    }
}

} // namespace

cudaError_t penalize(float *logits, size_t row_stride, uint32_t rows, const int32_t *row, const uint32_t *start,
                     const Penalty *pen, const int32_t *ids, const uint32_t *counts, uint32_t vocab, cudaStream_t s)
{
    if (!rows) return cudaSuccess;
    penalize_kernel<<<rows, 256, 0, s>>>(logits, row_stride, row, start, pen, ids, counts, vocab);
    return cudaGetLastError();
}

size_t topk_scratch_floats() { return (size_t)kParts * kSampleMaxK; }

cudaError_t topk(const float *logits, uint32_t vocab, size_t row_stride, uint32_t rows, uint32_t k, const TopK &t,
                 cudaStream_t s)
{
    if (k < 1 || k > kSampleMaxK || k > vocab || !rows) return cudaErrorInvalidValue;
    topk_part_kernel<<<dim3(kParts, rows), kThreads, 0, s>>>(logits, vocab, row_stride, k, t.cand_vals, t.cand_ids);
    topk_merge_kernel<<<rows, kThreads, 0, s>>>(t.cand_vals, t.cand_ids, kParts * k, k, t.vals, t.ids);
    return cudaGetLastError();
}

} // namespace dec
} // namespace nf
