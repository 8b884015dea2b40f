// One head's bias + qk norm + rope for a warp: the math of the decoder's qk-norm + rope kernel
// (ops.cu, qkv_rope_store) and of the decode attention that does the same work itself at T = 1
// (attention.cu), so both give the same bits. Rope rotates the first rd dims of a head (rd = hd, or
// less with partial rotary: Qwen3-Next / Qwen3.5 rotate 64 of 256) as rotate-half pairs (i, i + rd / 2);
// dims rd .. hd - 1 pass unrotated (normed only). A lane owns the pairs i = lane, lane + 32, ... (at
// most kRopePairs: rd <= 256) and the unrotated dims rd + lane, rd + lane + 32, ... (at most
// kRopeTail: create refuses hd - rd > 32 kRopeTail).
#pragma once
#include "ops.cuh"

namespace nf {
namespace dec {

constexpr int kRopePairs = 4, kRopeTail = 6;

// What rotating head h (q heads first, then kv heads) at position pos takes besides the projections:
// the rotations, the norm weights and biases of the lane's pairs. None of it depends on the
// predecessor: it is loaded before the grid-dependency wait.
struct HeadIn {
    float2 rot[kRopePairs];
    float n0[kRopePairs], n1[kRopePairs], b0[kRopePairs], b1[kRopePairs];
};

// The lane's share of a rotated head: r0[j] is element i = lane + 32 j, r1[j] element i + rd / 2 (for
// i < rd / 2), tail[j] element rd + lane + 32 j (for that < hd).
struct HeadOut {
    float r0[kRopePairs], r1[kRopePairs], tail[kRopeTail];
};

__device__ __forceinline__ const float *head_bias(const QkvArgs &a, uint32_t h)
{
    return h < a.heads ? (a.q_bias ? a.q_bias + h * a.hd : nullptr) : (a.k_bias ? a.k_bias + (h - a.heads) * a.hd : nullptr);
}

__device__ __forceinline__ void head_in(const QkvArgs &a, uint32_t h, int pos, HeadIn &p)
{
    const uint32_t lane = threadIdx.x % 32, half = a.rd / 2;
    const float *bias = head_bias(a, h);
    const float *norm = h < a.heads ? a.q_norm : a.k_norm;
#pragma unroll
    for (int j = 0; j < kRopePairs; j++) {
        const uint32_t i = lane + 32 * j;
        if (i >= half) continue;
        p.rot[j] = a.rope[(size_t)pos * half + i];
        p.n0[j] = norm ? norm[i] : 1.0f, p.n1[j] = norm ? norm[i + half] : 1.0f;
        p.b0[j] = bias ? bias[i] : 0.0f, p.b1[j] = bias ? bias[i + half] : 0.0f;
    }
}

// Head h of its token's projections row (f32: q | k | v) rotated into the lane's share o. The loads of
// the row are issued together; the sum of squares runs over the lane's first halves, then its second
// halves, then its unrotated dims (none with full rotary: the bits of the full-rotary form).
__device__ __forceinline__ void head_rotate(const QkvArgs &a, const float *row, uint32_t h, const HeadIn &p, HeadOut &o)
{
    const uint32_t lane = threadIdx.x % 32, hd = a.hd, half = a.rd / 2, rest = hd - a.rd;
    const bool is_q = h < a.heads;
    const float *src = is_q ? row + h * hd : row + a.heads * hd + (h - a.heads) * hd;
    const float *nw = is_q ? a.q_norm : a.k_norm, *bias = head_bias(a, h);
    float x0[kRopePairs], x1[kRopePairs], ss = 0;
#pragma unroll
    for (int j = 0; j < kRopePairs; j++)
        if (lane + 32 * j < half) x0[j] = src[lane + 32 * j] + p.b0[j], x1[j] = src[lane + 32 * j + half] + p.b1[j];
#pragma unroll
    for (int j = 0; j < kRopeTail; j++) {
        const uint32_t e = a.rd + lane + 32 * j;
        if (lane + 32 * j < rest) o.tail[j] = src[e] + (bias ? bias[e] : 0.0f);
    }
#pragma unroll
    for (int j = 0; j < kRopePairs; j++)
        if (lane + 32 * j < half) ss += x0[j] * x0[j];
#pragma unroll
    for (int j = 0; j < kRopePairs; j++)
        if (lane + 32 * j < half) ss += x1[j] * x1[j];
#pragma unroll
    for (int j = 0; j < kRopeTail; j++)
        if (lane + 32 * j < rest) ss += o.tail[j] * o.tail[j];
    const float inv = nw ? 1.0f / sqrtf(warp_sum(ss) / (float)hd + a.eps) : 1.0f;
#pragma unroll
    for (int j = 0; j < kRopePairs; j++) {
        if (lane + 32 * j >= half) continue;
        float y0 = x0[j], y1 = x1[j];
        if (nw) y0 = y0 * inv * p.n0[j], y1 = y1 * inv * p.n1[j];
        const float c = p.rot[j].x, sn = p.rot[j].y;
        o.r0[j] = y0 * c - y1 * sn, o.r1[j] = y1 * c + y0 * sn;
    }
#pragma unroll
    for (int j = 0; j < kRopeTail; j++)
        if (nw && lane + 32 * j < rest) o.tail[j] = o.tail[j] * inv * nw[a.rd + lane + 32 * j];
}

// The lane's share of a rotated head into dst[hd] (f32, or bf16 as uint16_t).
__device__ __forceinline__ float head_cvt(float x, float *) { return x; }
__device__ __forceinline__ uint16_t head_cvt(float x, uint16_t *) { return f2bf(x); }
template <class E>
__device__ __forceinline__ void head_write(const QkvArgs &a, const HeadOut &o, E *dst)
{
    const uint32_t lane = threadIdx.x % 32, half = a.rd / 2, rest = a.hd - a.rd;
#pragma unroll
    for (int j = 0; j < kRopePairs; j++)
        if (lane + 32 * j < half) dst[lane + 32 * j] = head_cvt(o.r0[j], dst), dst[lane + 32 * j + half] = head_cvt(o.r1[j], dst);
#pragma unroll
    for (int j = 0; j < kRopeTail; j++)
        if (lane + 32 * j < rest) dst[a.rd + lane + 32 * j] = head_cvt(o.tail[j], dst);
}

// kv head kvh's rotated k (o, from head_rotate) and its v (+ bias) as bf16 into the pool row `slot`
// (kv_slot of the token's sequence and position).
__device__ __forceinline__ void store_kv(const QkvArgs &a, const float *row, uint32_t kvh, uint32_t slot, const HeadOut &o)
{
    const uint32_t lane = threadIdx.x % 32, hd = a.hd, kvd = a.kv_heads * hd;
    head_write(a, o, a.kc + (size_t)slot * kvd + kvh * hd);
    const float *vs = row + a.heads * hd + kvd + kvh * hd;
    const float *vb = a.v_bias ? a.v_bias + kvh * hd : nullptr;
    uint16_t *vd = a.vc + (size_t)slot * kvd + kvh * hd;
    for (uint32_t i = lane; i < hd; i += 32) vd[i] = f2bf(vs[i] + (vb ? vb[i] : 0.0f));
}

} // namespace dec
} // namespace nf
