// The small routes' routing in one CTA (router.cu's last-CTA form and router_cluster.cu's cluster):
// the shared expert's group record, the work list of up to 256 entries, the T = 1 rank top-k.
#pragma once
#include "internal.cuh"
#include "topk.cuh"

namespace nf {

namespace {

template <typename W>
__device__ __forceinline__ float wval(const W *p, uint32_t i);
template <>
__device__ __forceinline__ float wval<float>(const float *p, uint32_t i) { return p[i]; }
template <>
__device__ __forceinline__ float wval<uint16_t>(const uint16_t *p, uint32_t i) { return bf2f(p[i]); }

// The shared expert's group record (Routing::shared_group): one group, expert 0, positions 0 .. T - 1.
__device__ __forceinline__ void set_shared_group(const Routing &r, uint32_t T)
{
    r.shared_group[0] = 1, r.shared_group[1] = 0, r.shared_group[2] = 0, r.shared_group[3] = (int)T;
}

// Copies n ids into shared memory for small_worklist; returns dst.
__device__ const int32_t *stage_ids(const int32_t *ids, uint32_t n, int32_t *dst)
{
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = ids[i];
    __syncthreads();
    return dst;
}

// The small route's work list (n = T * k <= 256 entries, one CTA): entry i's position is the number
// of entries with a lower expert id or the same id and a lower index (stable, as the reference
// orders them); groups in increasing expert id. O(n) per entry over ids in shared memory: one
// pass and two barriers, where the general builder's counts and scans take several. Each entry's
// scan is split over G threads (the largest of 8, 4, 2, 1 with n G <= the CTA's threads) and summed
// by shuffles in aligned groups of G lanes: at T = 8, k = 8 one thread's 64 dependent steps of a
// shared load became 8. Every thread runs the same number of rounds (the shuffles need whole warps).
__device__ __forceinline__ uint32_t wl_split(uint32_t n)
{
    uint32_t g = 8;
    while (g > 1 && n * g > blockDim.x) g >>= 1;
    return g;
}

__device__ __forceinline__ int group_sum(int v, uint32_t g)
{
    for (uint32_t o = 1; o < g; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// sid: the n ids in shared memory, visible to the whole CTA (stage_ids); sfirst: [n] shared scratch.
__device__ void small_worklist(const int32_t *sid, uint32_t n, uint32_t T, const Routing &r, int *sfirst)
{
    const uint32_t g = wl_split(n);
    for (uint32_t b = 0; b < n * g; b += blockDim.x) {
        const uint32_t i = (b + threadIdx.x) / g, part = (b + threadIdx.x) % g;
        const bool live = i < n;
        const int id = live ? sid[i] : 0;
        int pos = 0, same_before = 0;
        for (uint32_t j = part; live && j < n; j += g) {
            const int o = sid[j];
            pos += o < id;
            same_before += o == id && j < i;
        }
        pos = group_sum(pos, g), same_before = group_sum(same_before, g);
        if (live && part == 0) {
            pos += same_before;
            r.slot[i] = pos;
            r.pos_entry[pos] = (int)i;
            sfirst[i] = same_before == 0 ? pos : -1; // a group starts here
        }
    }
    __syncthreads();
    for (uint32_t b = 0; b < n * g; b += blockDim.x) {
        const uint32_t i = (b + threadIdx.x) / g, part = (b + threadIdx.x) % g;
        const bool live = i < n && sfirst[i] >= 0;
        const int id = live ? sid[i] : 0;
        int grp = 0, count = 0, above = 0;
        for (uint32_t j = part; live && j < n; j += g) {
            grp += sfirst[j] >= 0 && sid[j] < id;
            count += sid[j] == id;
            above += sid[j] > id;
        }
        grp = group_sum(grp, g), count = group_sum(count, g), above = group_sum(above, g);
        if (live && part == 0) {
            r.g_expert[grp] = id;
            r.g_start[grp] = sfirst[i];
            r.g_count[grp] = count;
            if (above == 0) *r.n_groups = grp + 1; // the last group
        }
    }
    if (threadIdx.x == 0) set_shared_group(r, T);
}

// The decode router's top-k and work list (T = 1) from the E logits in this CTA's shared memory, by
// every thread of the CTA. An expert's entry is its rank among the logits (larger first, ties to
// the lower index: the count of experts that beat it), so each expert finds its own entry in one pass
// over the logits instead of k dependent rounds of a warp argmax; with distinct ids the work list is
// direct (an entry's position is the count of chosen ids below its own). Why: with the routing left
// from a previous run, skipping topk_warp + small_worklist took the q4_k+q6_k layer at T = 1 from
// 29.3 to 25.4 us (H200, bench sparse-moe, graph replay). The numbers are topk_warp's: the same
// softmax_stats, p = expf(v - mx) / sum, and the renormalising sum taken in entry order. sel, sp:
// [k] shared; stat: [2] shared.
template <int NS>
__device__ void topk_rank_decode(const float *lg, uint32_t E, uint32_t k, int norm, const Routing &r, int32_t *sel,
                                 float *sp, float *stat)
{
    if (threadIdx.x < 32) {
        float v[NS], mx, sum;
        softmax_stats<NS, false>(lg, E, v, mx, sum);
        if (threadIdx.x == 0) stat[0] = mx, stat[1] = sum;
    }
    const float4 *l4 = reinterpret_cast<const float4 *>(lg); // 16-byte aligned: dynamic shared memory's start
    auto beats = [](float v, uint32_t e, float vi, uint32_t i) { return (uint32_t)(v > vi || (v == vi && e < i)); };
    for (uint32_t i = threadIdx.x; i < E; i += blockDim.x) {
        const float vi = lg[i];
        uint32_t rank = 0;
        for (uint32_t j = 0; j < E / 4; j++) {
            const float4 q = l4[j];
            const uint32_t e = 4 * j;
            rank += beats(q.x, e, vi, i) + beats(q.y, e + 1, vi, i) + beats(q.z, e + 2, vi, i) + beats(q.w, e + 3, vi, i);
        }
        for (uint32_t e = E / 4 * 4; e < E; e++) rank += beats(lg[e], e, vi, i);
        if (rank < k) sel[rank] = (int32_t)i;
    }
    __syncthreads();
    const uint32_t j = threadIdx.x;
    if (j < k) sp[j] = expf(lg[sel[j]] - stat[0]) / stat[1];
    __syncthreads();
    if (j < k) {
        const int32_t id = sel[j];
        float psum = 0.f;
        int pos = 0;
        for (uint32_t q = 0; q < k; q++) psum += sp[q], pos += sel[q] < id;
        r.topk_id[j] = id;
        r.topk_w[j] = norm ? sp[j] / psum : sp[j];
        r.slot[j] = pos;
        r.pos_entry[pos] = (int)j;
        r.g_expert[pos] = id;
        r.g_start[pos] = pos;
        r.g_count[pos] = 1;
    }
    if (j == 0) {
        *r.n_groups = (int)k;
        set_shared_group(r, 1);
    }
}

} // namespace

} // namespace nf
