// Router (fp32 logits, softmax, top-k with ties to the lower index, optional renormalisation), the
// shared expert's sigmoid gate, and the expert-sorted work list. Nothing here leaves the device.
//
// Three forms. Prefill: logits (CUDA cores, or from T = 512 tensor cores with top-k in the same
// launch: router_mma.cu), top-k and the work list are separate launches. Decode and small-token (T
// <= 16): one cluster of CTAs computes the logits on tensor cores into its first CTA's shared memory,
// which routes; where a cluster cannot run, one launch whose last CTA to finish its logits (a
// grid-wide counter) does top-k and the work list.
#include <cooperative_groups.h>

#include "bf16x3.cuh"
#include "internal.cuh"
#include "ptx.cuh"
#include "topk.cuh"

namespace nf {

namespace {

constexpr int kRouterTokens = 8; // tokens per CTA: each router row is read once for all of them
constexpr int kRouterWarps = 8;  // expert rows per CTA

template <typename W>
__device__ __forceinline__ float wval(const W *p, uint32_t i);
template <>
__device__ __forceinline__ float wval<float>(const float *p, uint32_t i) { return p[i]; }
template <>
__device__ __forceinline__ float wval<uint16_t>(const uint16_t *p, uint32_t i) { return bf2f(p[i]); }

// 16 bytes of router weights as floats: 8 bf16 or 4 f32 values.
template <typename W>
struct Vec16;
template <>
struct Vec16<uint16_t> {
    static constexpr int N = 8;
    __device__ static void unpack(const uint4 &v, float *f)
    {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) f[2 * i] = __uint_as_float(w[i] << 16), f[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
};
template <>
struct Vec16<float> {
    static constexpr int N = 4;
    __device__ static void unpack(const uint4 &v, float *f)
    {
        f[0] = __uint_as_float(v.x), f[1] = __uint_as_float(v.y), f[2] = __uint_as_float(v.z), f[3] = __uint_as_float(v.w);
    }
};

constexpr int kRouterChunks = 16; // 16-byte chunks per lane in flight (a 4096-wide bf16 row at once)

template <int TT, typename W, typename G>
__device__ __forceinline__ void logits_row(const W *w, const G *gw, uint32_t e, uint32_t t0, uint32_t nt, uint32_t H,
                                           uint32_t E, float *logits, float *shared_g, const float *xs, int lane,
                                           const uint4 (&pre)[kRouterChunks], bool use_pre);

// The first kRouterChunks 16-byte chunks of router row e a lane reads (lane, lane + 32, ...).
template <typename W>
__device__ __forceinline__ void row_chunks(const W *w, uint32_t e, uint32_t H, int lane, uint4 *v)
{
    const uint4 *row = reinterpret_cast<const uint4 *>(w + (uint64_t)e * H);
    const int chunks = (int)(H / Vec16<W>::N);
#pragma unroll
    for (int u = 0; u < kRouterChunks; u++)
        if (lane + 32 * u < chunks) v[u] = row[lane + 32 * u];
}

// xs holds each token's row in quads of 4 elements. A weight chunk (16 bytes) spans P quads (P =
// Vec16<W>::N / 4: 2 for bf16 rows, 1 for f32), and quad q sits at (q % P) * (H / P) + (q / P) * 4, so
// the lanes of a warp, which take consecutive chunks, read a float4 each from consecutive 16-byte
// words: one conflict-free 16-byte shared load per quad. (Element by element, 4-byte loads, the
// T = 8 cluster router issued a shared load per FMA.) H % 8 == 0, so every quad is 16-byte aligned.
template <int P>
__device__ __forceinline__ uint32_t xq_at(uint32_t t, uint32_t q, uint32_t H) { return t * H + (q % P) * (H / P) + (q / P) * 4; }
template <int P>
__device__ __forceinline__ uint32_t xs_at(uint32_t t, uint32_t h, uint32_t H) { return xq_at<P>(t, h >> 2, H) + (h & 3); }
template <int P>
__device__ __forceinline__ float4 xs_quad(const float *xs, uint32_t t, uint32_t q, uint32_t H)
{
    return *reinterpret_cast<const float4 *>(xs + xq_at<P>(t, q, H));
}

// Stages tokens t0 .. t0 + nt - 1 of x (bf16 [T][H]) into xs as f32 [TT][H] (xs_at<P>'s layout): 8 bf16
// per 16-byte load, loads issued before stores, two quads stored a load; rows past nt are zero (they
// feed discarded sums).
template <int TT, int P>
__device__ __forceinline__ void stage_x(const uint16_t *x, uint32_t t0, uint32_t nt, uint32_t H, float *xs)
{
    const uint32_t vecs = TT * H / 8, live = nt * H / 8;
    const uint4 *xv = reinterpret_cast<const uint4 *>(x + (uint64_t)t0 * H);
    for (uint32_t v0 = threadIdx.x; v0 < vecs; v0 += blockDim.x * 4) {
        uint4 buf[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const uint32_t v = v0 + u * blockDim.x;
            buf[u] = v < live ? xv[v] : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const uint32_t v = v0 + u * blockDim.x;
            if (v >= vecs) break;
            const uint4 b = buf[u];
            const uint32_t t = v / (H / 8), c = v % (H / 8); // token, 8-element chunk: quads 2c, 2c + 1
            auto lo = [](uint32_t w) { return __uint_as_float(w << 16); };
            auto hi = [](uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); };
            *reinterpret_cast<float4 *>(xs + xq_at<P>(t, 2 * c, H)) = make_float4(lo(b.x), hi(b.x), lo(b.y), hi(b.y));
            *reinterpret_cast<float4 *>(xs + xq_at<P>(t, 2 * c + 1, H)) = make_float4(lo(b.z), hi(b.z), lo(b.w), hi(b.w));
        }
    }
}

// The shared gate's dot for TT tokens: element h = lane, lane + 32, ... (one row, any codec wval reads).
template <int TT, int P, typename G>
__device__ __forceinline__ void gate_dot(const G *gw, uint32_t H, const float *xs, int lane, float (&acc)[TT])
{
    for (uint32_t h = lane; h < H; h += 32) {
        const float wv = wval(gw, h);
#pragma unroll
        for (int t = 0; t < TT; t++) acc[t] = fmaf(wv, xs[xs_at<P>(t, h, H)], acc[t]);
    }
}

// The warp-sum of each token's partial (one butterfly order for every router form) and its store:
// logits[t][e], or for the shared gate (e == E) sigmoid into shared_g.
template <int TT>
__device__ __forceinline__ void store_row(const float (&acc)[TT], uint32_t e, uint32_t t0, uint32_t nt, uint32_t E,
                                          float *logits, float *shared_g, int lane)
{
#pragma unroll
    for (int t = 0; t < TT; t++) {
        float v = acc[t];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0 && t < (int)nt) {
            if (e < E)
                logits[(uint64_t)(t0 + t) * E + e] = v;
            else
                shared_g[t0 + t] = 1.0f / (1.0f + expf(-v));
        }
    }
}

// logits[t][e] = sum_h x[t][h] * W[e][h] for the CTA's token tile (blockIdx.y) and expert rows
// (blockIdx.x; row E is the shared gate, stored as sigmoid in shared_g). Each warp takes one row and
// issues all its 16-byte loads before the first FMA: at decode sizes the router is a latency
// problem, not a bandwidth one. Rows are 16-byte aligned (bind checks H % 8 == 0).
template <int TT, typename W, typename G>
__device__ void logits_tile(const W *w, const G *gw, const uint16_t *x, uint32_t T, uint32_t H, uint32_t E,
                            float *logits, float *shared_g, float *xs)
{
    const uint32_t t0 = blockIdx.y * TT;
    const uint32_t nt = min((uint32_t)TT, T - t0);
    const int lane = threadIdx.x % 32;
    // the rows spread over the grid's warps: one each while there are warps enough, else every
    // (grid's warps)-th row
    const uint32_t e0 = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, estep = gridDim.x * (blockDim.x / 32);
    // the warp's first row is in flight while the activations are staged (two latencies overlap)
    uint4 pre[kRouterChunks];
    if (e0 < E) row_chunks(w, e0, H, lane, pre);
    // Under programmatic dependent launch (the decode router) the first rows were fetched while the
    // predecessor (the norm writing x) ran: wait for it, then let gate/up launch. Gate/up reads x
    // before its own wait, which is sound because this wait precedes the release. (No-ops in a
    // plain launch.)
    cudaGridDependencySynchronize();
    cudaTriggerProgrammaticLaunchCompletion();
    stage_x<TT, Vec16<W>::N / 4>(x, t0, nt, H, xs);
    __syncthreads();
    for (uint32_t e = e0; e < E + (gw ? 1 : 0); e += estep)
        logits_row<TT>(w, gw, e, t0, nt, H, E, logits, shared_g, xs, lane, pre, e == e0);
}

template <int TT, typename W, typename G>
__device__ __forceinline__ void logits_row(const W *w, const G *gw, uint32_t e, uint32_t t0, uint32_t nt, uint32_t H,
                                           uint32_t E, float *logits, float *shared_g, const float *xs, int lane,
                                           const uint4 (&pre)[kRouterChunks], bool use_pre)
{
    constexpr int N = Vec16<W>::N, P = N / 4;
    float acc[TT] = {};
    if (e < E) {
        const uint4 *row = reinterpret_cast<const uint4 *>(w + (uint64_t)e * H);
        const int chunks = (int)(H / N);
        for (int c0 = lane; c0 < chunks; c0 += 32 * kRouterChunks) {
            uint4 v[kRouterChunks];
#pragma unroll
            for (int u = 0; u < kRouterChunks; u++)
                if (c0 + 32 * u < chunks) v[u] = use_pre && c0 == lane ? pre[u] : row[c0 + 32 * u];
#pragma unroll
            for (int u = 0; u < kRouterChunks; u++) {
                const int c = c0 + 32 * u;
                if (c >= chunks) break;
                float f[N];
                Vec16<W>::unpack(v[u], f);
#pragma unroll
                for (int t = 0; t < TT; t++) {
                    float4 xq[P];
#pragma unroll
                    for (int p = 0; p < P; p++) xq[p] = xs_quad<P>(xs, t, c * P + p, H);
#pragma unroll
                    for (int i = 0; i < N; i++) acc[t] = fmaf(f[i], (&xq[i / 4].x)[i % 4], acc[t]);
                }
            }
        }
    } else {
        gate_dot<TT, P>(gw, H, xs, lane, acc);
    }
    store_row<TT>(acc, e, t0, nt, E, logits, shared_g, lane);
}

// The prefill router's logits: a warp takes kRowsPerWarp expert rows at once, so each activation it
// reads from shared memory feeds that many FMAs. (With the decode form's one row a warp and 16
// chunks in flight a lane, 1 CTA fitted an SM and T = 512 took 68.6 us of ncu time a layer on the
// H200, ~4 TFLOP/s.) Each (row, token) sum runs in logits_row's order (a lane's chunks lane, lane + 32,
// ..., a chunk's elements in order, then store_row's butterfly), so the logits are the same bits as the
// last-CTA small router's (router_small_kernel).
// grid: x = CTAs of kRouterWarps warps over the ceil(E / kRowsPerWarp) row groups (the last group's warp
// also takes the shared gate), y = token tiles of kRouterTokens.
constexpr int kRowsPerWarp = 4;

template <typename W, typename G>
__global__ void __launch_bounds__(kRouterWarps * 32, 3)
    router_logits_kernel(const W *w, const G *gw, const uint16_t *x, uint32_t T, uint32_t H, uint32_t E, float *logits,
                         float *shared_g)
{
    extern __shared__ float xs[]; // [kRouterTokens][H], xs_at<P>'s layout
    constexpr int TT = kRouterTokens, R = kRowsPerWarp, N = Vec16<W>::N, P = N / 4;
    const uint32_t t0 = blockIdx.y * TT, nt = min((uint32_t)TT, T - t0);
    const int lane = threadIdx.x % 32;
    const uint32_t group = blockIdx.x * kRouterWarps + threadIdx.x / 32, groups = (E + R - 1) / R, e0 = group * R;
    stage_x<TT, P>(x, t0, nt, H, xs);
    __syncthreads();
    if (group >= groups) return;
    if (gw && group == groups - 1) { // the last group's warp takes the shared gate too
        float acc[TT] = {};
        gate_dot<TT, P>(gw, H, xs, lane, acc);
        store_row<TT>(acc, E, t0, nt, E, logits, shared_g, lane);
    }
    const int nr = (int)min((uint32_t)R, E - e0), chunks = (int)(H / N);
    float acc[R][TT] = {};
#pragma unroll 2
    for (int c = lane; c < chunks; c += 32) {
        float f[R][N];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint4 v = r < nr ? reinterpret_cast<const uint4 *>(w + (uint64_t)(e0 + r) * H)[c] : make_uint4(0, 0, 0, 0);
            Vec16<W>::unpack(v, f[r]);
        }
#pragma unroll
        for (int t = 0; t < TT; t++) {
            float4 xq[P];
#pragma unroll
            for (int p = 0; p < P; p++) xq[p] = xs_quad<P>(xs, t, c * P + p, H);
#pragma unroll
            for (int i = 0; i < N; i++)
#pragma unroll
                for (int r = 0; r < R; r++) acc[r][t] = fmaf(f[r][i], (&xq[i / 4].x)[i % 4], acc[r][t]);
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
        if (r < nr) store_row<TT>(acc[r], e0 + r, t0, nt, E, logits, shared_g, lane);
}

__global__ void topk_kernel(const float *logits, uint32_t T, uint32_t E, uint32_t k, int norm, int32_t *ids,
                            float *wts)
{
    const uint32_t t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (t < T) topk_warp<16>(logits, t, E, k, norm, ids, wts);
}

// Exclusive prefix sums over warp 0's lanes of two per-lane totals (each lane's run of experts), in
// place; the warp's grand totals are a + (the lane's own total) on lane 31.
__device__ __forceinline__ void warp_exclusive_scan2(int &a, int &b)
{
    const int lane = threadIdx.x & 31;
    int ax = a, bx = b; // inclusive scans
    for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, ax, o), v = __shfl_up_sync(0xffffffffu, bx, o);
        if (lane >= o) ax += u, bx += v;
    }
    a = ax - a;
    b = bx - b;
}

// The shared expert's group record (Routing::shared_group): one group, expert 0, positions 0 .. T - 1.
__device__ __forceinline__ void set_shared_group(const Routing &r, uint32_t T)
{
    r.shared_group[0] = 1, r.shared_group[1] = 0, r.shared_group[2] = 0, r.shared_group[3] = (int)T;
}

// The prefill tile tables from the per-expert counts in shared memory: group g (the g-th active
// expert) gets ceil(count / tile_m) tiles, laid out in group order. Warp 0 scans the tile counts
// (each lane over a run of experts, as scan_groups below) and every lane writes its experts'
// tiles; the shared expert's table is T / sh_tile_m tiles of its one group. One serial thread
// reading the group table back from global memory took 66 us at T = 4096 (H200, ncu).
__device__ void build_tiles(const int *cnt, uint32_t E, uint32_t T, const Routing &r)
{
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x, per = (int)((E + 31) / 32), tm = r.tile_m;
        int tiles = 0, grp = 0;
        for (int i = 0; i < per; i++) {
            const int e = lane * per + i;
            if (e < (int)E) tiles += (cnt[e] + tm - 1) / tm, grp += cnt[e] > 0;
        }
        int t = tiles;
        warp_exclusive_scan2(t, grp);
        for (int i = 0; i < per; i++) {
            const int e = lane * per + i;
            if (e >= (int)E) break;
            if (cnt[e] == 0) continue;
            for (int m0 = 0; m0 < cnt[e]; m0 += tm, t++) {
                r.tile_group[t] = grp;
                r.tile_m0[t] = m0;
            }
            grp++;
        }
        if (lane == 31) *r.n_tiles = t; // past its own tiles: every tile
    }
    const uint32_t sh = (T + (uint32_t)r.sh_tile_m - 1) / (uint32_t)r.sh_tile_m;
    for (uint32_t i = threadIdx.x; i < sh; i += blockDim.x) {
        r.sh_tile_group[i] = 0;
        r.sh_tile_m0[i] = (int)(i * (uint32_t)r.sh_tile_m);
    }
    if (threadIdx.x == 0) *r.sh_n_tiles = (int)sh;
}

// The prefill work list over the grid, in two launches. One CTA for all T * k entries took 43 us at
// T = 4096, k = 8 (35 with its loads batched; H200, ncu): one SM's shared atomics and scattered stores.
// Positions within an expert come from atomics and may differ between runs, which no output depends
// on: every kernel computes a position's row independently of its neighbours.
constexpr int kWlThreads = 256, kWlPer = 4; // entries a thread of wl_count_kernel

// The groups (active experts in increasing id), each expert's first position (wl_base) and the
// shared expert's group from the per-expert counts cnt [E] in shared memory; warp 0 scans.
// (build_tiles makes the tile tables from the same counts.)
__device__ void scan_groups(const int *cnt, uint32_t E, uint32_t T, const Routing &r)
{
    if (threadIdx.x < 32) { // each lane over a run of experts
        const int lane = threadIdx.x, per = (int)((E + 31) / 32);
        int off = 0, grp = 0;
        for (int i = 0; i < per; i++) {
            const int e = lane * per + i;
            if (e < (int)E) off += cnt[e], grp += cnt[e] > 0;
        }
        warp_exclusive_scan2(off, grp);
        for (int i = 0; i < per; i++) {
            const int e = lane * per + i;
            if (e >= (int)E) break;
            r.wl_base[e] = off;
            if (cnt[e]) {
                r.g_expert[grp] = e;
                r.g_start[grp] = off;
                r.g_count[grp] = cnt[e];
                grp++;
            }
            off += cnt[e];
        }
        if (lane == 31) *r.n_groups = grp;
        if (lane == 0) set_shared_group(r, T);
    }
}

// Each CTA ranks its kWlThreads * kWlPer entries per expert in shared memory and reserves its run of
// each expert with one global atomic; slot[i] holds the entry's offset within its expert until
// wl_place_kernel adds the expert's base. The last CTA to finish (r.wl_state[0], a ticket) scans the
// totals (r.wl_state[1 ..]) into the groups, the bases and the tile tables, and clears the state for
// the next forward.
__global__ void __launch_bounds__(kWlThreads) wl_count_kernel(const int32_t *ids, uint32_t n, uint32_t T, uint32_t E,
                                                              Routing r)
{
    __shared__ int cnt[512];
    __shared__ bool last;
    for (uint32_t e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    const uint32_t i0 = blockIdx.x * kWlThreads * kWlPer + threadIdx.x;
    int32_t id[kWlPer], rank[kWlPer] = {};
#pragma unroll
    for (int u = 0; u < kWlPer; u++) {
        const uint32_t i = i0 + u * kWlThreads;
        id[u] = i < n ? ids[i] : -1;
    }
#pragma unroll
    for (int u = 0; u < kWlPer; u++)
        if (id[u] >= 0) rank[u] = atomicAdd(&cnt[id[u]], 1);
    __syncthreads();
    int *total = r.wl_state + 1;
    for (uint32_t e = threadIdx.x; e < E; e += blockDim.x)
        if (cnt[e]) cnt[e] = atomicAdd(&total[e], cnt[e]); // now this CTA's offset within expert e
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kWlPer; u++)
        if (id[u] >= 0) r.slot[i0 + u * kWlThreads] = cnt[id[u]] + rank[u];
    __threadfence(); // this CTA's reservations are visible before it is counted
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&r.wl_state[0], 1) == (int)gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (uint32_t e = threadIdx.x; e < E; e += blockDim.x) {
        cnt[e] = __ldcg(&total[e]);
        total[e] = 0;
    }
    if (threadIdx.x == 0) r.wl_state[0] = 0;
    __syncthreads();
    scan_groups(cnt, E, T, r);
    build_tiles(cnt, E, T, r);
}

// slot[i] = base[expert] + its offset within the expert, and the position's entry.
__global__ void wl_place_kernel(const int32_t *ids, uint32_t n, Routing r)
{
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int p = r.wl_base[ids[i]] + r.slot[i];
    r.slot[i] = p;
    r.pos_entry[p] = (int)i;
}

void launch_worklist(const int32_t *ids, uint32_t T, uint32_t k, uint32_t E, const Routing &r, cudaStream_t s)
{
    const uint32_t n = T * k;
    wl_count_kernel<<<(n + kWlThreads * kWlPer - 1) / (kWlThreads * kWlPer), kWlThreads, 0, s>>>(ids, n, T, E, r);
    wl_place_kernel<<<(n + 255) / 256, 256, 0, s>>>(ids, n, r);
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

// The decode/small-token router: logits over the grid, then the last CTA routes and sorts. It lets
// the next launch (gate/up, under programmatic dependent launch) start once x is ready
// (logits_tile): that kernel waits on the device for this one to finish before it reads anything
// routed.
template <int TT, int NS, typename W, typename G>
__global__ void router_small_kernel(const W *w, const G *gw, const uint16_t *x, uint32_t T, uint32_t H, uint32_t E,
                                    uint32_t k, int norm, Routing r, const int32_t *forced, int *counter)
{
    extern __shared__ float xs[]; // [TT][H]
    __shared__ int sid[256], sfirst[256];
    __shared__ int last;
    logits_tile<TT>(w, gw, x, T, H, E, r.logits, r.shared_g, xs);
    __threadfence(); // this CTA's logits are visible device-wide before it is counted
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counter, 1) == (int)(gridDim.x * gridDim.y) - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (uint32_t t = threadIdx.x / 32; t < T; t += blockDim.x / 32)
        topk_warp<NS>(r.logits, t, E, k, norm, r.topk_id, r.topk_w);
    __syncthreads();
    small_worklist(stage_ids(forced ? forced : r.topk_id, T * k, sid), T * k, T, r, sfirst);
    if (threadIdx.x == 0) *counter = 0; // ready for the next forward (or graph replay)
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

// The cluster router (T <= 16): a cluster of kDecodeCluster CTAs writes the logits of all T tokens
// straight into its first CTA's shared memory (distributed shared memory), one cluster barrier
// publishes them, and that CTA takes top-k and the work list from shared memory. The last-CTA form
// (router_small_kernel) instead pays several global round trips in a row (logits stored and fenced,
// a grid-wide atomic, the logits and then the ids read back through L2): 20.7 us at T = 8 against
// 9.1 at T = 1 in this form (ncu, H200, q4_k+q4_k qwen3 layer, cbc3edd). TT: the tokens a launch
// takes (1, 8 or 16 >= T).
constexpr int kDecodeCluster = 16; // CTAs (a non-portable cluster size: Hopper allows 16)
constexpr int kClusterWarps = 8;

// The cluster's logits on tensor cores (mma.m16n8k16: bf16 operands, fp32 accumulation). CTA c owns
// router rows c R .. c R + R - 1, R = ceil(E / 16) <= 16 MT (MT m-tiles); the tokens are the MMA's n
// (NT n-tiles of 8). The warps split K into 32-column blocks (warp w: blocks w, w + 8, ...); lane
// 4 g + c takes word c of a block (columns 32 b + 8 c .. + 7) of rows g and g + 8 of each m-tile and
// of token g of each n-tile, and feeds its element pairs (0,1), (2,3) to one MMA's k slots (2c, 2c+1),
// (2c+8, 2c+9) and (4,5), (6,7) to the next: a permutation of K that A and B share (mma_rows.cuh).
// An f32 row enters as its three bf16 planes hi + mid + lo (bf16x3.cuh), three MMAs into one
// accumulator. The CTA's rows are staged in shared memory as those planes before the grid-dependency
// wait where they fit (cluster_stage), else each word is loaded and split in registers: the same
// values, the same order. Every product is exact in fp32, as on CUDA cores; the tensor core's
// additions are not IEEE (tests/common/moe_ref.c, logit_err_cluster, bounds them). The warps' tiles
// are summed in warp order. Each (row, token) sum depends on that row and token only, so a token's
// logits are the same bits at T = 1, 8 and 16. (On CUDA cores, with x staged in f32 in every CTA
// and a warp a row, T = 16 took 33 us (E 128) and 55 us (E 256) of ncu time on an H100, 2026-12-07;
// here 19 and 21. At T = 1 an f32 router's split costs more than the CUDA-core form's FMAs: 13.9
// against 9.9 us, docs/perf/router_shared_a8_h100_2026-12-07.md.)
template <typename W>
struct RouterWord; // one lane's 8 elements of a row as bf16 pairs, plane by plane: pair(p, 0 .. 3)
template <>
struct RouterWord<uint16_t> {
    static constexpr int P = 1;
    uint4 v;
    __device__ void load(const uint16_t *row, uint32_t col) { v = *reinterpret_cast<const uint4 *>(row + col); }
    __device__ void zero() { v = make_uint4(0, 0, 0, 0); }
    __device__ uint32_t pair(int, int i) const { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
};
template <>
struct RouterWord<float> {
    static constexpr int P = 3;
    uint4 v[2];
    __device__ void load(const float *row, uint32_t col)
    {
        v[0] = *reinterpret_cast<const uint4 *>(row + col);
        v[1] = *reinterpret_cast<const uint4 *>(row + col + 4);
    }
    __device__ void zero() { v[0] = v[1] = make_uint4(0, 0, 0, 0); }
    __device__ uint32_t pair(int p, int i) const
    {
        const uint4 &q = v[i / 2];
        uint16_t pa[3], pb[3];
        bf16x3(__uint_as_float(i % 2 ? q.z : q.x), pa);
        bf16x3(__uint_as_float(i % 2 ? q.w : q.y), pb);
        return (uint32_t)pa[p] | (uint32_t)pb[p] << 16;
    }
};
// The same from the CTA's rows staged in shared memory as P bf16 planes (cluster_stage).
template <int P>
struct StagedWord {
    uint4 v[P];
    __device__ void load(const uint8_t *planes, uint32_t plane_bytes, uint32_t pitch, uint32_t r, uint32_t col)
    {
#pragma unroll
        for (int p = 0; p < P; p++) v[p] = *reinterpret_cast<const uint4 *>(planes + p * plane_bytes + r * pitch + 2 * col);
    }
    __device__ void zero()
    {
#pragma unroll
        for (int p = 0; p < P; p++) v[p] = make_uint4(0, 0, 0, 0);
    }
    __device__ uint32_t pair(int p, int i) const { return i == 0 ? v[p].x : i == 1 ? v[p].y : i == 2 ? v[p].z : v[p].w; }
};

// A staged row's pitch in bytes: its bf16 plane row plus 64 bytes, so that the two rows a quarter
// warp's 16-byte loads take (lanes 4 g + c, g = 2 i, 2 i + 1) fall on different banks.
__host__ __device__ inline uint32_t cluster_pitch(uint32_t H) { return 2 * H + 64; }

// Stages rows row0 .. row0 + rows - 1 of the router into shared memory as P bf16 planes [rows][pitch]
// (an f32 row split by bf16x3: hi, mid, lo), 16 bytes of the source a load, all of a thread's loads
// issued before its stores. Runs before the grid-dependency wait: the router does not depend on
// the predecessor, so its bytes arrive while the norm that writes x drains.
template <typename W>
__device__ __forceinline__ void cluster_stage(const W *w, uint32_t row0, uint32_t rows, uint32_t H, uint8_t *planes,
                                              uint32_t plane_bytes)
{
    constexpr int N = 16 / sizeof(W); // elements a load
    const uint32_t per_row = H / N, total = rows * per_row, pitch = cluster_pitch(H);
    for (uint32_t v0 = threadIdx.x; v0 < total; v0 += blockDim.x * 4) {
        uint4 buf[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const uint32_t v = v0 + u * blockDim.x;
            if (v < total) buf[u] = reinterpret_cast<const uint4 *>(w + (uint64_t)(row0 + v / per_row) * H)[v % per_row];
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const uint32_t v = v0 + u * blockDim.x;
            if (v >= total) break;
            uint8_t *dst = planes + (v / per_row) * pitch + 2 * N * (v % per_row);
            if constexpr (sizeof(W) == 2) {
                *reinterpret_cast<uint4 *>(dst) = buf[u];
            } else {
                const uint32_t f[4] = {buf[u].x, buf[u].y, buf[u].z, buf[u].w};
                uint16_t q[4][3];
#pragma unroll
                for (int i = 0; i < 4; i++) bf16x3(__uint_as_float(f[i]), q[i]);
#pragma unroll
                for (int p = 0; p < 3; p++)
                    *reinterpret_cast<uint2 *>(dst + p * plane_bytes) =
                        make_uint2((uint32_t)q[0][p] | (uint32_t)q[1][p] << 16, (uint32_t)q[2][p] | (uint32_t)q[3][p] << 16);
            }
        }
    }
}

// The warp's MMAs over its K blocks, words from WordAt (global rows or the staged planes).
template <int MT, int NT, int P, int KB, class Word, class WordAt>
__device__ __forceinline__ void cluster_mma_loop(const uint16_t *x, uint32_t T, uint32_t H, uint32_t rows,
                                                 const WordAt &word_at, float (&d)[MT][NT][4])
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const uint32_t blocks = (H + 31) / 32;
    for (uint32_t b0 = warp; b0 < blocks; b0 += KB * kClusterWarps) {
        Word a[KB][MT][2];
        uint4 xw[KB][NT];
#pragma unroll
        for (int u = 0; u < KB; u++) {
            const uint32_t col = 32 * (b0 + u * kClusterWarps) + 8 * c;
            const bool live = col < H;
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint32_t r = mt * 16 + h * 8 + g;
                    if (live && r < rows) word_at(a[u][mt][h], r, col);
                    else a[u][mt][h].zero();
                }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const uint32_t t = nt * 8 + g;
                xw[u][nt] = live && t < T ? *reinterpret_cast<const uint4 *>(x + (uint64_t)t * H + col) : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < KB; u++)
#pragma unroll
            for (int s = 0; s < 2; s++) // the k16 steps: pairs (0,1),(2,3), then (4,5),(6,7)
#pragma unroll
                for (int p = 0; p < P; p++)
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int nt = 0; nt < NT; nt++) {
                            const uint32_t b0r = s ? xw[u][nt].z : xw[u][nt].x, b1r = s ? xw[u][nt].w : xw[u][nt].y;
                            mma_bf16_16816(d[mt][nt], a[u][mt][0].pair(p, 2 * s), a[u][mt][1].pair(p, 2 * s),
                                           a[u][mt][0].pair(p, 2 * s + 1), a[u][mt][1].pair(p, 2 * s + 1), b0r, b1r);
                        }
    }
}

// planes: where the CTA's rows are staged (null: read from global memory, where they would not fit
// the shared memory: an f32 router of E = 512), plane_bytes apart.
template <int MT, int NT, typename W>
__device__ __forceinline__ void cluster_logits_mma(const W *w, const uint16_t *x, uint32_t T, uint32_t H, uint32_t E,
                                                   uint32_t R, uint8_t *planes, uint32_t plane_bytes,
                                                   float (*red)[MT * 16][NT * 8])
{
    constexpr int P = RouterWord<W>::P;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const uint32_t row0 = blockIdx.x * R, rows = min(R, E > row0 ? E - row0 : 0);
    if (planes) cluster_stage(w, row0, rows, H, planes, plane_bytes);
    // Under programmatic dependent launch: wait for x, then let gate/up launch (it reads nothing of
    // ours before its own wait). No-ops in a plain launch.
    cudaGridDependencySynchronize();
    cudaTriggerProgrammaticLaunchCompletion();
    float d[MT][NT][4] = {};
    if (planes) {
        __syncthreads(); // the staged planes
        const uint32_t pitch = cluster_pitch(H);
        auto at = [&](StagedWord<P> &wd, uint32_t r, uint32_t col) { wd.load(planes, plane_bytes, pitch, r, col); };
        cluster_mma_loop<MT, NT, P, 4 / MT, StagedWord<P>>(x, T, H, rows, at, d);
    } else {
        auto at = [&](RouterWord<W> &wd, uint32_t r, uint32_t col) { wd.load(w + (uint64_t)(row0 + r) * H, col); };
        cluster_mma_loop<MT, NT, P, (sizeof(W) == 2 ? 4 : 2) / MT, RouterWord<W>>(x, T, H, rows, at, d);
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            *reinterpret_cast<float2 *>(&red[warp][mt * 16 + g][nt * 8 + 2 * c]) = make_float2(d[mt][nt][0], d[mt][nt][1]);
            *reinterpret_cast<float2 *>(&red[warp][mt * 16 + g + 8][nt * 8 + 2 * c]) = make_float2(d[mt][nt][2], d[mt][nt][3]);
        }
}

// The shared gate's partial over this CTA's share of the columns (c H16 .. c H16 + H16 - 1, H16 =
// ceil(H / 16)) for token threadIdx.x (< TT; the other threads' value is meaningless): a thread's
// columns tid, tid + 256, ... in order, the butterfly, the warps' sums in warp order. The first CTA
// sums the 16 partials in rank order.
template <int TT, typename G>
__device__ __forceinline__ float cluster_gate_part(const G *gw, const uint16_t *x, uint32_t T, uint32_t H,
                                                   float (*wsum)[TT])
{
    const uint32_t h16 = (H + kDecodeCluster - 1) / kDecodeCluster, h0 = blockIdx.x * h16, h1 = min(H, h0 + h16);
    float acc[TT] = {};
    for (uint32_t h = h0 + threadIdx.x; h < h1; h += blockDim.x) {
        const float wv = wval(gw, h);
#pragma unroll
        for (int t = 0; t < TT; t++)
            if (t < (int)T) acc[t] = fmaf(wv, bf2f(x[(uint64_t)t * H + h]), acc[t]);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int t = 0; t < TT; t++) {
        float v = acc[t];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) wsum[warp][t] = v;
    }
    __syncthreads();
    float v = 0.f;
    if (threadIdx.x < (uint32_t)TT)
        for (int i = 0; i < kClusterWarps; i++) v += wsum[i][threadIdx.x];
    return v;
}

template <int TT, int NS, typename W, typename G>
__global__ void __launch_bounds__(kClusterWarps * 32, 1)
    router_cluster_kernel(const W *w, const G *gw, const uint16_t *x, uint32_t T, uint32_t H, uint32_t E, uint32_t k,
                          int norm, Routing r, const int32_t *forced, bool staged)
{
    constexpr int MT = NS <= 8 ? 1 : 2, NT = (TT + 7) / 8; // E <= 256: 16 rows a CTA; 512: 32
    extern __shared__ float lg[]; // [TT][E] the cluster's logits (the first CTA's)
    __shared__ float red[kClusterWarps][MT * 16][NT * 8];
    __shared__ float wsum[kClusterWarps][TT], gpart[kDecodeCluster * TT];
    __shared__ int32_t ids[16 * TT]; // [T][k] the chosen experts and their weights
    __shared__ float wts[16 * TT];
    __shared__ int sid[16 * TT], sfirst[16 * TT];
    __shared__ float stat[2];
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    // Distributed shared memory may be written only once its CTA runs: this CTA says it runs now
    // and waits for the others just before its first remote store.
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
    const uint32_t R = (E + kDecodeCluster - 1) / kDecodeCluster;
    // the staged planes after the logits (16-byte aligned: TT E floats, E % 4 == 0 where staged)
    uint8_t *planes = staged ? reinterpret_cast<uint8_t *>(lg + TT * E) : nullptr;
    cluster_logits_mma<MT, NT>(w, x, T, H, E, R, planes, R * cluster_pitch(H), red);
    const float gate = gw ? cluster_gate_part<TT>(gw, x, T, H, wsum) : 0.f;
    __syncthreads(); // red complete
    asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
    float *lg0 = cluster.map_shared_rank(lg, 0);
    if (gw && threadIdx.x < (uint32_t)TT) cluster.map_shared_rank(gpart, 0)[blockIdx.x * TT + threadIdx.x] = gate;
    const uint32_t row0 = blockIdx.x * R;
    for (uint32_t i = threadIdx.x; i < MT * 16 * NT * 8; i += blockDim.x) {
        const uint32_t rr = i / (NT * 8), t = i % (NT * 8), e = row0 + rr;
        if (rr >= R || e >= E || t >= T) continue;
        float v = 0.f;
        for (int u = 0; u < kClusterWarps; u++) v += red[u][rr][t];
        lg0[t * E + e] = v;
    }
    cluster.sync(); // release / acquire: every CTA's logits and gate part are in the first CTA's shared memory
    if (cluster.block_rank() != 0) return;
    if (gw && threadIdx.x < T) {
        float v = 0.f;
        for (int i = 0; i < kDecodeCluster; i++) v += gpart[i * TT + threadIdx.x];
        r.shared_g[threadIdx.x] = 1.0f / (1.0f + expf(-v));
    }
    // one token without forced ids (tests' forced ids may repeat an expert): the rank form
    if (TT == 1 && !forced) return topk_rank_decode<NS>(lg, E, k, norm, r, ids, wts, stat);
    // top-k into shared memory, then global: the work list reads the ids from here, not back
    // through L2 after a barrier
    for (uint32_t t = threadIdx.x / 32; t < T; t += blockDim.x / 32) topk_warp<NS, false>(lg, t, E, k, norm, ids, wts);
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < T * k; i += blockDim.x) r.topk_id[i] = ids[i], r.topk_w[i] = wts[i];
    small_worklist(forced ? stage_ids(forced, T * k, sid) : ids, T * k, T, r, sfirst); // ids: shared, synced
}

// Launches the cluster router for T <= TT tokens; false (nothing launched) when the device cannot run
// the cluster or its shared memory.
template <int TT, typename W, typename G>
bool launch_cluster(const W *w, const G *gw, const uint16_t *x, uint32_t T, uint32_t H, uint32_t E, uint32_t k,
                    int norm, const Routing &r, const int32_t *forced, cudaStream_t s)
{
    auto kern = E <= 128 ? router_cluster_kernel<TT, 4, W, G>
                : E <= 256 ? router_cluster_kernel<TT, 8, W, G> : router_cluster_kernel<TT, 16, W, G>;
    // the CTA's rows staged as bf16 planes where they fit beside the logits (not an f32 router of
    // E = 512, nor of E = 256 at 16 tokens: those read the rows from global memory, the same bits)
    const size_t lg_bytes = (size_t)TT * E * sizeof(float);
    const size_t planes = (sizeof(W) == 4 ? 3 : 1) * (size_t)((E + kDecodeCluster - 1) / kDecodeCluster) * cluster_pitch(H);
    cudaFuncAttributes fa;
    if (T > (uint32_t)TT || cudaFuncGetAttributes(&fa, kern) != cudaSuccess ||
        lg_bytes + fa.sharedSizeBytes > smem_optin_limit()) {
        cudaGetLastError();
        return false;
    }
    const bool staged = E % 4 == 0 && lg_bytes + planes + fa.sharedSizeBytes <= smem_optin_limit();
    const size_t smem = lg_bytes + (staged ? planes : 0);
    if (cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess ||
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(kDecodeCluster);
    cfg.blockDim = dim3(kClusterWarps * 32);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[2];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = kDecodeCluster, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
    at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 2;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kern, &cfg) != cudaSuccess || clusters < 1) {
        cudaGetLastError();
        return false;
    }
    if (cudaLaunchKernelEx(&cfg, kern, w, gw, x, T, H, E, k, norm, r, forced, staged) == cudaSuccess) return true;
    cudaGetLastError(); // the caller launches the last-CTA form instead
    return false;
}

constexpr int kSmallRouterWarps = 4; // expert rows per CTA of the small router: 33 CTAs for E = 128

template <int TT, typename W, typename G>
void launch_small(const W *w, const G *gw, const uint16_t *x, uint32_t T, uint32_t H, uint32_t E, uint32_t k, int norm,
                  const Routing &r, const int32_t *forced, int *counter, cudaStream_t s)
{
    auto kern = E <= 128 ? router_small_kernel<TT, 4, W, G>
                : E <= 256 ? router_small_kernel<TT, 8, W, G> : router_small_kernel<TT, 16, W, G>;
    const size_t smem = (size_t)TT * H * sizeof(float);
    const dim3 grid((E + 1 + kSmallRouterWarps - 1) / kSmallRouterWarps, (T + TT - 1) / TT);
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    launch_pdl(kern, grid, dim3(kSmallRouterWarps * 32), smem, true, s, w, gw, x, T, H, E, k, norm, r, forced, counter);
}

template <typename W, typename G>
void launch_logits(const W *w, const RouterPlanes &rp, const G *gw, const uint16_t *x, uint32_t T, uint32_t H, uint32_t E,
                   uint32_t k, int norm, const Routing &r, const int32_t *forced, int *counter, bool small, cudaStream_t s)
{
    if (small) { // the cluster router, or where it cannot run the last-CTA form
        if (T == 1 ? launch_cluster<1>(w, gw, x, T, H, E, k, norm, r, forced, s)
            : T <= 8 ? launch_cluster<8>(w, gw, x, T, H, E, k, norm, r, forced, s)
                     : launch_cluster<16>(w, gw, x, T, H, E, k, norm, r, forced, s))
            return;
        if (T == 1) launch_small<1>(w, gw, x, T, H, E, k, norm, r, forced, counter, s);
        else launch_small<kRouterTokens>(w, gw, x, T, H, E, k, norm, r, forced, counter, s);
        return;
    }
    const int32_t *wl_ids = forced ? forced : r.topk_id;
    if (T >= kRouterMmaFrom && launch_router_mma(rp, gw, sizeof(G) == 4, x, T, H, E, k, norm, r, s)) {
        launch_worklist(wl_ids, T, k, E, r, s);
        return;
    }
    const size_t smem = (size_t)kRouterTokens * H * sizeof(float);
    const uint32_t tiles = (T + kRouterTokens - 1) / kRouterTokens, groups = (E + kRowsPerWarp - 1) / kRowsPerWarp;
    const dim3 grid((groups + kRouterWarps - 1) / kRouterWarps, tiles);
    auto kern = router_logits_kernel<W, G>;
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    kern<<<grid, kRouterWarps * 32, smem, s>>>(w, gw, x, T, H, E, r.logits, r.shared_g);
    topk_kernel<<<(T + 7) / 8, 256, 0, s>>>(r.logits, T, E, k, norm, r.topk_id, r.topk_w);
    launch_worklist(wl_ids, T, k, E, r, s);
}

template <typename W>
void launch_w(const W *w, const RouterPlanes &rp, const DevMat *sg, int sg_codec, const uint16_t *x, uint32_t T,
              uint32_t H, uint32_t E, uint32_t k, int norm, const Routing &r, const int32_t *forced, int *counter,
              bool small, cudaStream_t s)
{
    if (sg && sg_codec == 0 /* NF_CODEC_F32 */)
        launch_logits(w, rp, (const float *)sg->data, x, T, H, E, k, norm, r, forced, counter, small, s);
    else
        launch_logits(w, rp, sg ? (const uint16_t *)sg->data : (const uint16_t *)nullptr, x, T, H, E, k, norm, r, forced,
                      counter, small, s);
}

} // namespace

void launch_routing(const DevMat &router, int router_codec, const RouterPlanes &rp, const DevMat *shared_gate,
                    int shared_gate_codec, const uint16_t *x, uint32_t T, uint32_t H, uint32_t E, uint32_t k,
                    int norm_topk, const Routing &r, const int32_t *forced, int *counter, bool small, cudaStream_t s)
{
    if (router_codec == 0 /* NF_CODEC_F32 */)
        launch_w((const float *)router.data, rp, shared_gate, shared_gate_codec, x, T, H, E, k, norm_topk, r, forced,
                 counter, small, s);
    else
        launch_w((const uint16_t *)router.data, rp, shared_gate, shared_gate_codec, x, T, H, E, k, norm_topk, r, forced,
                 counter, small, s);
}

} // namespace nf
