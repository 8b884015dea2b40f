// One warp's softmax and top-k of a token's E router logits (router.cu's three forms and
// router_mma.cu's prefill form): one fixed order, so every form gives the same weights to the bit
// for the same logits.
#pragma once
#include <math.h>
#include <stdint.h>

namespace nf {

// One warp's softmax statistics over E logits l: lane's v[s] = l[lane + 32 s] (-inf past E), their
// max, and the sum of exp(v - max) in one fixed order (lane partials, then the butterfly) that both
// top-k forms share, so they give the same weights to the bit. L2: l was written by other CTAs.
template <int NS, bool L2>
__device__ __forceinline__ void softmax_stats(const float *l, uint32_t E, float (&v)[NS], float &mx, float &sum)
{
    const int lane = threadIdx.x % 32;
    mx = -INFINITY;
#pragma unroll
    for (int s = 0; s < NS; s++) {
        const uint32_t e = lane + 32 * s;
        v[s] = e < E ? (L2 ? __ldcg(l + e) : l[e]) : -INFINITY;
        mx = fmaxf(mx, v[s]);
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    sum = 0.f;
#pragma unroll
    for (int s = 0; s < NS; s++)
        if (lane + 32 * s < E) sum += expf(v[s] - mx);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
}

// One warp: softmax over E in fp32 and the k largest logits of token t, ties to the lower index.
// NS: logits per lane (E <= 32 * NS), so E = 128 walks 4 registers, not 16.
// L2: the logits were written by other CTAs of this grid (read through L2); else they are in this
// CTA's shared memory.
template <int NS, bool L2 = true>
__device__ void topk_warp(const float *logits, uint32_t t, uint32_t E, uint32_t k, int norm, int32_t *ids,
                          float *wts)
{
    const int lane = threadIdx.x % 32;
    float v[NS], mx, sum; // v: this lane's logits, experts lane, lane + 32, ...
    softmax_stats<NS, L2>(logits + (uint64_t)t * E, E, v, mx, sum);

    // k rounds of a warp argmax over the experts not yet taken
    float psum = 0.f, my_p = 0.f;
    int my_e = -1;
    for (uint32_t j = 0; j < k; j++) {
        float best = -INFINITY;
        int bi = 0x7fffffff;
#pragma unroll
        for (int s = 0; s < NS; s++) {
            const int e = lane + 32 * s;
            if (e < (int)E && (v[s] > best || (v[s] == best && e < bi))) {
                best = v[s];
                bi = e;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > best || (ov == best && oi < bi)) {
                best = ov;
                bi = oi;
            }
        }
#pragma unroll
        for (int s = 0; s < NS; s++)
            if (lane + 32 * s == bi) v[s] = -INFINITY; // taken (logits are finite, so never chosen again)
        const float p = expf(best - mx) / sum;
        psum += p;
        if ((uint32_t)lane == j) {
            my_p = p;
            my_e = bi;
        }
    }
    if ((uint32_t)lane < k) {
        ids[(uint64_t)t * k + lane] = my_e;
        wts[(uint64_t)t * k + lane] = norm ? my_p / psum : my_p;
    }
}

} // namespace nf
