// The prefill router on tensor cores: a CTA takes 16 MT tokens against every expert row with
// mma.m16n8k16 (bf16 operands, fp32 accumulation), keeps the [16 MT][E] fp32 logits in shared
// memory and takes each token's softmax and top-k there (topk.cuh), so the prefill's logits plane and
// its top-k launch are gone. On CUDA cores the logits of a T = 4096 slice took 119 us and the top-k
// 15 us (E 128, H 2048, ncu, H200): 2.1 GFLOP of fp32 FMAs at ~18 TFLOP/s.
//
// Exactness. x is bf16. A bf16 router row is its own operand, so every product x * w is exact in
// fp32 and the logit is an fp32 sum of exact products, as on CUDA cores; only the order of the sum
// differs. An f32 row is split into three bf16 planes with hi + mid + lo == w exactly (bf16x3.cuh:
// each step rounds to nearest and leaves at most 8 significant bits for the next; exact for
// |w| >= 2^-110), three MMAs into the same accumulator: exact products again. The shared expert's
// gate (one row, qwen2_moe) is an fp32 FMA chain on CUDA cores over the staged activations.
//
// Shapes: W [E][H] (bf16 or f32), x [T][H] bf16, H % 8 == 0, E <= 64 NT <= 512, k <= 16.
// A CTA of 8 warps: warp w owns experts 8 NT w .. 8 NT (w + 1) - 1 for all 16 MT tokens; K walks
// slices of 128 bytes a row (64 bf16 or 32 f32) through a ring of 4 (or 2) cp.async stages;
// fragments by ldmatrix (bf16 rows).
#include <type_traits>

#include "bf16x3.cuh"
#include "internal.cuh"
#include "ptx.cuh"
#include "topk.cuh"

namespace nf {

namespace {

constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kSliceBytes = 128; // of each row a K slice holds
constexpr int kXStrideW = 36;    // x row stride in 32-bit words (32 + 4: a fragment load is conflict-free)

template <typename W>
struct Plane;
template <>
struct Plane<uint16_t> { // bf16 rows: the operand itself
    static constexpr int kK = 64, kStrideW = 36;
    // B fragment words (k 2c, 2c + 1 and 2c + 8, 2c + 9 of row n) at word offset o of the row
    __device__ static void frag(const uint32_t *row, int o, uint32_t (&b)[3][2])
    {
        b[0][0] = row[o];
        b[0][1] = row[o + 4];
    }
    static constexpr int kParts = 1;
};
template <>
struct Plane<float> { // f32 rows: three bf16 planes, hi + mid + lo == w
    static constexpr int kK = 32, kStrideW = 40;
    __device__ static void split(float2 f, uint32_t (&p)[3])
    {
        uint16_t a[3], b[3];
        bf16x3(f.x, a);
        bf16x3(f.y, b);
#pragma unroll
        for (int i = 0; i < 3; i++) p[i] = (uint32_t)a[i] | (uint32_t)b[i] << 16;
    }
    // word offset o counts bf16 pairs of the logical k axis; the f32 row has them at 2 o
    __device__ static void frag(const uint32_t *row, int o, uint32_t (&b)[3][2])
    {
        const float *f = reinterpret_cast<const float *>(row);
        uint32_t k0[3], k8[3]; // the planes of k 2c, 2c + 1 and of k 2c + 8, 2c + 9
        split(*reinterpret_cast<const float2 *>(f + 2 * o), k0);
        split(*reinterpret_cast<const float2 *>(f + 2 * o + 8), k8);
#pragma unroll
        for (int i = 0; i < 3; i++) b[i][0] = k0[i], b[i][1] = k8[i];
    }
    static constexpr int kParts = 3;
};

template <typename W, int NT, int MT>
struct Shape {
    static constexpr int kNE = 8 * NT * kWarps, kM = 16 * MT;
    static constexpr int kXBytes = kM * kXStrideW * 4, kWBytes = kNE * Plane<W>::kStrideW * 4;
    static constexpr int kStageBytes = kXBytes + kWBytes;
    // the ring's depth, fixed at compile time (a run-time depth cost a modulo and a wait switch a
    // slice): 4 stages where they fit 96 KiB (E <= 128), else 2
    static constexpr int kStages = 4 * kStageBytes <= 96 * 1024 ? 4 : 2;
    static constexpr int kSmem = kStages * kStageBytes;
    static_assert(kM * kNE * 4 <= kSmem, "the logits reuse the stages");
};

// A thread's share of every K slice's copies, resolved once: thread i copies 16-byte chunk i % 8 of
// the W rows i / 8 + 32 u and chunk i % kXC of the x rows i / kXC + (256 / kXC) v; a slice then costs
// an add or two a chunk. (Resolving each chunk's row, column and bounds a slice took ~400
// instructions a warp at ~4 cycles each with one warp a scheduler: 1.1 us a slice, 39 us for one CTA
// at T = 8; H200, ncu.) Rows past T or E, and chunks past H, are zero-filled.
template <typename W, int NT, int MT>
struct SliceCopy {
    using S = Shape<W, NT, MT>;
    static constexpr int kXC = Plane<W>::kK / 8, kXRows = kThreads / kXC, kXU = (S::kM + kXRows - 1) / kXRows;
    static constexpr int kWRows = kThreads / 8, kWU = S::kNE / kWRows;
    const char *xsrc, *wsrc, *safe;
    uint32_t xdst, wdst, xcol, wcol, xrow, wrow; // stage offsets; chunk's byte in its row; row bytes
    uint32_t xown = 0, xlive = 0, wlive = 0;      // per pass: a row of the tile; a row of x or W
    __device__ SliceCopy(const W *w, const uint16_t *x, uint32_t T, uint32_t H, uint32_t E, uint32_t t0)
    {
        const uint32_t i = threadIdx.x, xr = i / kXC, wr = i / 8;
        xrow = H * 2, wrow = H * (uint32_t)sizeof(W);
        xcol = i % kXC * 16, wcol = i % 8 * 16;
        safe = reinterpret_cast<const char *>(x);
        xsrc = safe + (uint64_t)(t0 + xr) * xrow + xcol;
        wsrc = reinterpret_cast<const char *>(w) + (uint64_t)wr * wrow + wcol;
        xdst = xr * kXStrideW * 4 + xcol;
        wdst = S::kXBytes + wr * Plane<W>::kStrideW * 4 + wcol;
#pragma unroll
        for (int v = 0; v < kXU; v++) {
            const uint32_t r = xr + kXRows * v;
            xown |= (uint32_t)(r < (uint32_t)S::kM) << v;
            xlive |= (uint32_t)(t0 + r < T) << v;
        }
#pragma unroll
        for (int u = 0; u < kWU; u++) wlive |= (uint32_t)(wr + kWRows * u < E) << u;
    }
    __device__ __forceinline__ void issue(uint32_t stage, uint32_t s) const
    {
        const uint32_t xo = s * Plane<W>::kK * 2, wo = s * kSliceBytes;
        const bool xin = xo + xcol < xrow, win = wo + wcol < wrow;
#pragma unroll
        for (int v = 0; v < kXU; v++) {
            if (!(xown >> v & 1)) continue;
            const bool live = (xlive >> v & 1) && xin;
            const char *src = xsrc + (uint64_t)v * kXRows * xrow + xo;
            cp_async16(stage + xdst + v * kXRows * kXStrideW * 4, live ? src : safe, live ? 16 : 0);
        }
#pragma unroll
        for (int u = 0; u < kWU; u++) {
            const bool live = (wlive >> u & 1) && win;
            const char *src = wsrc + (uint64_t)u * kWRows * wrow + wo;
            cp_async16(stage + wdst + u * kWRows * Plane<W>::kStrideW * 4, live ? src : safe, live ? 16 : 0);
        }
    }
};

template <typename W, int NT, int MT>
__global__ void __launch_bounds__(kThreads)
    router_mma_kernel(const W *w, const void *gw, int gw_f32, const uint16_t *x, uint32_t T, uint32_t H, uint32_t E,
                      uint32_t k, int norm, int32_t *ids, float *wts, float *shared_g)
{
    using S = Shape<W, NT, MT>;
    using P = Plane<W>;
    constexpr int kSteps = P::kK / 16; // k16 steps a slice
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ float gpart[kThreads];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const uint32_t t0 = blockIdx.x * S::kM, slices = (H + P::kK - 1) / P::kK;
    // the shared gate: thread i sums token i % kM over part i / kM of each slice's columns
    constexpr int kGParts = kThreads / S::kM, kGCols = P::kK / kGParts;
    const int gt = threadIdx.x % S::kM, gp = threadIdx.x / S::kM;
    float gacc = 0.f;

    float acc[MT][NT][4] = {};
    const SliceCopy<W, NT, MT> copy(w, x, T, H, E, t0);
    const uint32_t base = smem_u32(smem);
#pragma unroll
    for (int s = 0; s < S::kStages - 1; s++) {
        if ((uint32_t)s < slices) copy.issue(base + s * S::kStageBytes, s);
        cp_async_commit();
    }
    int rd = 0, wr = S::kStages - 1; // the stages of slice s and of slice s + kStages - 1
    for (uint32_t s = 0; s < slices; s++) {
        const uint32_t nx = s + S::kStages - 1;
        if (nx < slices) copy.issue(base + wr * S::kStageBytes, nx);
        cp_async_commit();
        cp_async_wait<S::kStages - 1>();
        __syncthreads();
        const uint8_t *stage = smem + rd * S::kStageBytes;
        rd = rd + 1 == S::kStages ? 0 : rd + 1;
        wr = wr + 1 == S::kStages ? 0 : wr + 1;
        const uint32_t *xs = reinterpret_cast<const uint32_t *>(stage);
        const uint32_t *ws = reinterpret_cast<const uint32_t *>(stage + S::kXBytes);
#pragma unroll
        for (int kk = 0; kk < kSteps; kk++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) // rows lane % 16, columns 8 (lane / 16) of the k16 step
                ldsm_x4(smem_u32(xs + (mt * 16 + lane % 16) * kXStrideW + kk * 8 + lane / 16 * 4), a[mt]);
            if constexpr (std::is_same<W, uint16_t>::value && NT % 2 == 0) {
#pragma unroll
                for (int nt = 0; nt < NT; nt += 2) { // b0, b1 of n-tiles nt and nt + 1 in one ldmatrix
                    uint32_t b[4];
                    const int n = warp * NT * 8 + nt * 8 + (lane / 16) * 8 + lane % 8;
                    ldsm_x4(smem_u32(ws + n * P::kStrideW + kk * 8 + (lane / 8) % 2 * 4), b);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma_bf16_16816(acc[mt][nt], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[0], b[1]);
                        mma_bf16_16816(acc[mt][nt + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[2], b[3]);
                    }
                }
            } else {
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    uint32_t b[3][2];
                    P::frag(ws + (warp * NT * 8 + nt * 8 + g) * P::kStrideW, kk * 8 + c, b);
#pragma unroll
                    for (int p = 0; p < P::kParts; p++)
#pragma unroll
                        for (int mt = 0; mt < MT; mt++)
                            mma_bf16_16816(acc[mt][nt], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[p][0], b[p][1]);
                }
            }
        }
        if (gw) { // the shared gate's partial over this slice's columns (x staged as bf16 pairs)
            const uint32_t k0 = s * P::kK;
            const uint16_t *xr = reinterpret_cast<const uint16_t *>(xs + gt * kXStrideW);
            for (int j = gp * kGCols; j < (gp + 1) * kGCols; j++) {
                const uint32_t h = k0 + j;
                if (h >= H) break;
                const float gv = gw_f32 ? ((const float *)gw)[h] : bf2f(((const uint16_t *)gw)[h]);
                gacc = fmaf(gv, bf2f(xr[j]), gacc);
            }
        }
        __syncthreads();
    }
    cp_async_wait<0>();
    __syncthreads();
    // the logits [kM][E] over the stages, then each token's softmax and top-k by one warp
    float *lg = reinterpret_cast<float *>(smem);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const uint32_t e = warp * NT * 8 + nt * 8 + 2 * c, r = mt * 16 + g;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const uint32_t ei = e + (i & 1), ri = r + (i >> 1) * 8;
                if (ei < E) lg[ri * E + ei] = acc[mt][nt][i];
            }
        }
    if (gw) gpart[threadIdx.x] = gacc;
    __syncthreads();
    const uint32_t nt_live = min((uint32_t)S::kM, T - t0);
    for (uint32_t t = warp; t < nt_live; t += kWarps)
        topk_warp<2 * NT, false>(lg, t, E, k, norm, ids + (uint64_t)t0 * k, wts + (uint64_t)t0 * k);
    if (gw && threadIdx.x < nt_live) {
        float v = 0.f;
        for (int p = 0; p < kGParts; p++) v += gpart[p * S::kM + threadIdx.x];
        shared_g[t0 + threadIdx.x] = 1.0f / (1.0f + expf(-v));
    }
}

template <typename W, int NT, int MT>
bool launch_nt_mt(const W *w, const void *gw, int gw_f32, const uint16_t *x, uint32_t T, uint32_t H, uint32_t E,
                  uint32_t k, int norm, const Routing &r, cudaStream_t s)
{
    using S = Shape<W, NT, MT>;
    const int smem = S::kSmem;
    if ((size_t)smem + sizeof(float) * kThreads > smem_optin_limit()) return false; // + the gate's partials
    auto kern = router_mma_kernel<W, NT, MT>;
    if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    kern<<<(T + S::kM - 1) / S::kM, kThreads, smem, s>>>(w, gw, gw_f32, x, T, H, E, k, norm, r.topk_id,
                                                             r.topk_w, r.shared_g);
    return true;
}

template <typename W, int NT>
bool launch_nt(const W *w, const void *gw, int gw_f32, const uint16_t *x, uint32_t T, uint32_t H, uint32_t E,
               uint32_t k, int norm, const Routing &r, cudaStream_t s)
{
    // 32 tokens a CTA halve the router rows each CTA reads from L2 once the grid has a wave of them
    if constexpr (NT <= 4)
        if (T >= 2048) return launch_nt_mt<W, NT, 2>(w, gw, gw_f32, x, T, H, E, k, norm, r, s);
    return launch_nt_mt<W, NT, 1>(w, gw, gw_f32, x, T, H, E, k, norm, r, s);
}

template <typename W>
bool launch_w(const W *w, const void *gw, int gw_f32, const uint16_t *x, uint32_t T, uint32_t H, uint32_t E,
              uint32_t k, int norm, const Routing &r, cudaStream_t s)
{
    if (E <= 64) return launch_nt<W, 1>(w, gw, gw_f32, x, T, H, E, k, norm, r, s);
    if (E <= 128) return launch_nt<W, 2>(w, gw, gw_f32, x, T, H, E, k, norm, r, s);
    if (E <= 256) return launch_nt<W, 4>(w, gw, gw_f32, x, T, H, E, k, norm, r, s);
    if (E <= 512) return launch_nt<W, 8>(w, gw, gw_f32, x, T, H, E, k, norm, r, s);
    return false;
}

} // namespace

bool launch_router_mma(const void *w, int w_f32, const void *gw, int gw_f32, const uint16_t *x, uint32_t T, uint32_t H,
                       uint32_t E, uint32_t k, int norm, const Routing &r, cudaStream_t s)
{
    if (k > 16 || T == 0) return false;
    return w_f32 ? launch_w((const float *)w, gw, gw_f32, x, T, H, E, k, norm, r, s)
                 : launch_w((const uint16_t *)w, gw, gw_f32, x, T, H, E, k, norm, r, s);
}

} // namespace nf
