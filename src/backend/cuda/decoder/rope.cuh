// One head's bias + qk norm + rope for a warp: the math of the decoder's qk-norm + rope kernel
// (ops.cu, qkv_rope_store) and of the decode attention that does the same work itself at T = 1
// (attention.cu), so both give the same bits. A lane owns the rope pairs (i, i + hd / 2) for
// i = lane, lane + 32, ... (at most kRopePairs: create refuses head_dim > 256).
#pragma once
#include "ops.cuh"

namespace nf {
namespace dec {

constexpr int kRopePairs = 4;

// What rotating head h (q heads first, then kv heads) at position pos takes besides the projections:
// the rotations, the norm weights and biases of the lane's pairs. None of it depends on the
// predecessor: it is loaded before the grid-dependency wait.
struct HeadIn {
    float2 rot[kRopePairs];
    float n0[kRopePairs], n1[kRopePairs], b0[kRopePairs], b1[kRopePairs];
};

__device__ __forceinline__ void head_in(const QkvArgs &a, uint32_t h, int pos, HeadIn &p)
{
    const uint32_t lane = threadIdx.x % 32, hd = a.hd, half = hd / 2;
    const bool is_q = h < a.heads;
    const uint32_t kvh = is_q ? 0 : h - a.heads;
    const float *bias = is_q ? (a.q_bias ? a.q_bias + h * hd : nullptr) : (a.k_bias ? a.k_bias + kvh * hd : nullptr);
    const float *norm = is_q ? a.q_norm : a.k_norm;
#pragma unroll
    for (int j = 0; j < kRopePairs; j++) {
        const uint32_t i = lane + 32 * j;
        if (i >= half) continue;
        p.rot[j] = a.rope[(size_t)pos * half + i];
        p.n0[j] = norm ? norm[i] : 1.0f, p.n1[j] = norm ? norm[i + half] : 1.0f;
        p.b0[j] = bias ? bias[i] : 0.0f, p.b1[j] = bias ? bias[i + half] : 0.0f;
    }
}

// The lane's rotated pairs of head h from its token's projections row (f32: q | k | v): r0[j] is
// element i = lane + 32 j, r1[j] element i + hd / 2 (for i < hd / 2). The loads of the row are
// issued together; the sum of squares runs over the lane's first halves, then its second halves.
__device__ __forceinline__ void head_rotate(const QkvArgs &a, const float *row, uint32_t h, const HeadIn &p,
                                            float (&r0)[kRopePairs], float (&r1)[kRopePairs])
{
    const uint32_t lane = threadIdx.x % 32, hd = a.hd, half = hd / 2;
    const bool is_q = h < a.heads;
    const float *src = is_q ? row + h * hd : row + a.heads * hd + (h - a.heads) * hd;
    const bool norm = is_q ? a.q_norm != nullptr : a.k_norm != nullptr;
    float x0[kRopePairs], x1[kRopePairs], ss = 0;
#pragma unroll
    for (int j = 0; j < kRopePairs; j++)
        if (lane + 32 * j < half) x0[j] = src[lane + 32 * j] + p.b0[j], x1[j] = src[lane + 32 * j + half] + p.b1[j];
#pragma unroll
    for (int j = 0; j < kRopePairs; j++)
        if (lane + 32 * j < half) ss += x0[j] * x0[j];
#pragma unroll
    for (int j = 0; j < kRopePairs; j++)
        if (lane + 32 * j < half) ss += x1[j] * x1[j];
    const float inv = norm ? 1.0f / sqrtf(warp_sum(ss) / (float)hd + a.eps) : 1.0f;
#pragma unroll
    for (int j = 0; j < kRopePairs; j++) {
        if (lane + 32 * j >= half) continue;
        float y0 = x0[j], y1 = x1[j];
        if (norm) y0 = y0 * inv * p.n0[j], y1 = y1 * inv * p.n1[j];
        const float c = p.rot[j].x, sn = p.rot[j].y;
        r0[j] = y0 * c - y1 * sn, r1[j] = y1 * c + y0 * sn;
    }
}

// kv head kvh's rotated k (r0, r1 from head_rotate) and its v (+ bias) as bf16 into the pool row
// `slot` (kv_slot of the token's sequence and position).
__device__ __forceinline__ void store_kv(const QkvArgs &a, const float *row, uint32_t kvh, uint32_t slot,
                                         const float (&r0)[kRopePairs], const float (&r1)[kRopePairs])
{
    const uint32_t lane = threadIdx.x % 32, hd = a.hd, half = hd / 2, kvd = a.kv_heads * hd;
    uint16_t *k = a.kc + (size_t)slot * kvd + kvh * hd;
#pragma unroll
    for (int j = 0; j < kRopePairs; j++)
        if (lane + 32 * j < half) k[lane + 32 * j] = f2bf(r0[j]), k[lane + 32 * j + half] = f2bf(r1[j]);
    const float *vs = row + a.heads * hd + kvd + kvh * hd;
    const float *vb = a.v_bias ? a.v_bias + kvh * hd : nullptr;
    uint16_t *vd = a.vc + (size_t)slot * kvd + kvh * hd;
    for (uint32_t i = lane; i < hd; i += 32) vd[i] = f2bf(vs[i] + (vb ? vb[i] : 0.0f));
}

} // namespace dec
} // namespace nf
