// The small routes' router (T <= 16): one cluster of 16 CTAs computes the logits of all T tokens on
// tensor cores into its first CTA's shared memory, which takes top-k and the work list (router.cu
// has the other forms and the entry point, launch_routing).
#include <cooperative_groups.h>

#include "bf16x3.cuh"
#include "internal.cuh"
#include "mma_rows.cuh"
#include "ptx.cuh"
#include "router_small.cuh"
#include "topk.cuh"

namespace nf {

namespace {

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
    __device__ uint32_t pair(int, int i) const { return word_of(v, i); }
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
    __device__ uint32_t pair(int p, int i) const { return word_of(v[p], i); }
};

// Stages rows row0 .. row0 + rows - 1 of the router into shared memory as P bf16 planes [rows][pitch]
// (an f32 row split by bf16x3: hi, mid, lo; pitch = mma_col_stride(H), 64 bytes past the row, so the
// two rows a quarter warp's 16-byte loads take fall on different banks), 16 bytes of the source a
// load, all of a thread's loads issued before its stores. Runs before the grid-dependency wait: the router does not depend on
// the predecessor, so its bytes arrive while the norm that writes x drains.
template <typename W>
__device__ __forceinline__ void cluster_stage(const W *w, uint32_t row0, uint32_t rows, uint32_t H, uint8_t *planes,
                                              uint32_t plane_bytes)
{
    constexpr int N = 16 / sizeof(W); // elements a load
    const uint32_t per_row = H / N, total = rows * per_row, pitch = mma_col_stride(H);
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
        const uint32_t pitch = mma_col_stride(H);
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
    cluster_logits_mma<MT, NT>(w, x, T, H, E, R, planes, R * mma_col_stride(H), red);
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
    const size_t planes = (sizeof(W) == 4 ? 3 : 1) * (size_t)((E + kDecodeCluster - 1) / kDecodeCluster) * mma_col_stride(H);
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

template <typename W, typename G>
bool launch_tt(const W *w, const G *gw, const uint16_t *x, uint32_t T, uint32_t H, uint32_t E, uint32_t k, int norm,
               const Routing &r, const int32_t *forced, cudaStream_t s)
{
    return T == 1   ? launch_cluster<1>(w, gw, x, T, H, E, k, norm, r, forced, s)
           : T <= 8 ? launch_cluster<8>(w, gw, x, T, H, E, k, norm, r, forced, s)
                    : launch_cluster<16>(w, gw, x, T, H, E, k, norm, r, forced, s);
}

template <typename W>
bool launch_w(const W *w, const void *gw, bool gw_f32, const uint16_t *x, uint32_t T, uint32_t H, uint32_t E,
              uint32_t k, int norm, const Routing &r, const int32_t *forced, cudaStream_t s)
{
    if (gw_f32) return launch_tt(w, (const float *)gw, x, T, H, E, k, norm, r, forced, s);
    return launch_tt(w, (const uint16_t *)gw, x, T, H, E, k, norm, r, forced, s);
}

} // namespace

bool launch_router_cluster(const void *w, bool w_f32, const void *gw, bool gw_f32, const uint16_t *x, uint32_t T,
                           uint32_t H, uint32_t E, uint32_t k, int norm, const Routing &r, const int32_t *forced,
                           cudaStream_t s)
{
    if (w_f32) return launch_w((const float *)w, gw, gw_f32, x, T, H, E, k, norm, r, forced, s);
    return launch_w((const uint16_t *)w, gw, gw_f32, x, T, H, E, k, norm, r, forced, s);
}

} // namespace nf
