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

// An fp32 logit as an unsigned key in the same order (-0 taken as +0, which compares equal to it);
// finite logits give keys above 0x007fffff (-inf's), so 0 can mark "none".
__device__ __forceinline__ uint32_t order_key(float f)
{
    const uint32_t u = __float_as_uint(f + 0.0f);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}
__device__ __forceinline__ float key_value(uint32_t k) { return __uint_as_float(k & 0x80000000u ? k & 0x7fffffffu : ~k); }

// One warp: softmax over E in fp32 and the k largest logits of each of NT tokens t[i] (logits row
// t[i] * stride), ties to the lower index; ids and weights go to row t[i] of ids and wts where
// t[i] < n_live. The tokens' chains are independent and interleave: a token's k rounds are k chains
// of warp reductions, so a warp that takes its tokens one after another waits on latency (the
// tensor-core router's top-k of 4 tokens a warp, with shuffle butterflies: 43 % of its instructions,
// ~30 % of its stall samples at T = 4096; ncu, H200). Each token's arithmetic is the single-token
// order, so every form gives the same weights to the bit.
// NS: logits per lane (E <= 32 * NS), so E = 128 walks 4 registers, not 16.
// L2: the logits were written by other CTAs of this grid (read through L2); else they are in this
// CTA's shared memory.
template <int NS, int NT, bool L2>
__device__ void topk_warp_n(const float *logits, uint32_t stride, const uint32_t (&t)[NT], uint32_t n_live,
                            uint32_t E, uint32_t k, int norm, int32_t *ids, float *wts)
{
    const int lane = threadIdx.x % 32;
    float v[NT][NS], mx[NT], sum[NT]; // v: this lane's logits, experts lane, lane + 32, ...
#pragma unroll
    for (int i = 0; i < NT; i++) softmax_stats<NS, L2>(logits + (uint64_t)t[i] * stride, E, v[i], mx[i], sum[i]);

    // k rounds of a warp argmax over the experts not yet taken, on order-preserving integer keys so
    // that the warp's max and the lowest index holding it are one redux each (the float butterfly
    // was 10 dependent shuffles and ~60 instructions a round). The round's winner is the float
    // argmax with ties to the lower index, as before, and p its softmax weight to the bit.
    uint32_t kv[NT][NS]; // 0: absent (e >= E) or taken; below every logit's key
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int s = 0; s < NS; s++) kv[i][s] = lane + 32 * s < (int)E ? order_key(v[i][s]) : 0u;
    float psum[NT], my_p[NT];
    int my_e[NT];
#pragma unroll
    for (int i = 0; i < NT; i++) psum[i] = 0.f, my_p[i] = 0.f, my_e[i] = -1;
    for (uint32_t j = 0; j < k; j++) {
        uint32_t mk[NT], bi[NT];
#pragma unroll
        for (int i = 0; i < NT; i++) {
            uint32_t lk = kv[i][0];
#pragma unroll
            for (int s = 1; s < NS; s++) lk = max(lk, kv[i][s]);
            mk[i] = __reduce_max_sync(0xffffffffu, lk);
        }
#pragma unroll
        for (int i = 0; i < NT; i++) {
            uint32_t cand = 0xffffffffu; // this lane's lowest expert holding the max
#pragma unroll
            for (int s = NS - 1; s >= 0; s--)
                if (kv[i][s] == mk[i]) cand = lane + 32 * s;
            bi[i] = __reduce_min_sync(0xffffffffu, cand);
        }
#pragma unroll
        for (int i = 0; i < NT; i++) {
#pragma unroll
            for (int s = 0; s < NS; s++)
                if ((uint32_t)(lane + 32 * s) == bi[i]) kv[i][s] = 0; // taken
            const float p = expf(key_value(mk[i]) - mx[i]) / sum[i];
            psum[i] += p;
            if ((uint32_t)lane == j) {
                my_p[i] = p;
                my_e[i] = (int)bi[i];
            }
        }
    }
#pragma unroll
    for (int i = 0; i < NT; i++)
        if ((uint32_t)lane < k && t[i] < n_live) {
            ids[(uint64_t)t[i] * k + lane] = my_e[i];
            wts[(uint64_t)t[i] * k + lane] = norm ? my_p[i] / psum[i] : my_p[i];
        }
}

// The same for one token t, logits rows E apart.
template <int NS, bool L2 = true>
__device__ void topk_warp(const float *logits, uint32_t t, uint32_t E, uint32_t k, int norm, int32_t *ids, float *wts)
{
    const uint32_t tt[1] = {t};
    topk_warp_n<NS, 1, L2>(logits, E, tt, t + 1, E, k, norm, ids, wts);
}

} // namespace nf
