// Router (fp32 logits, softmax, top-k with ties to the lower index, optional renormalisation), the
// shared expert's sigmoid gate, and the expert-sorted work list. Nothing here leaves the device.
//
// Three forms. Prefill: logits (CUDA cores, or from T = 512 tensor cores with top-k in the same
// launch: router_mma.cu), top-k and the work list are separate launches. Decode and small-token (T
// <= 16): one cluster of CTAs computes the logits on tensor cores into its first CTA's shared memory,
// which routes (router_cluster.cu); where a cluster cannot run, one launch whose last CTA to finish
// its logits (a grid-wide counter) does top-k and the work list.
#include "internal.cuh"
#include "ptx.cuh"
#include "router_small.cuh"
#include "topk.cuh"

namespace nf {

namespace {

constexpr int kRouterTokens = 8; // tokens per CTA: each router row is read once for all of them
constexpr int kRouterWarps = 8;  // expert rows per CTA


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
        if (launch_router_cluster(w, sizeof(W) == 4, gw, sizeof(G) == 4, x, T, H, E, k, norm, r, forced, s)) return;
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
