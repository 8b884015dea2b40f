// The prefill router on tensor cores: a CTA takes 16 MT tokens against every expert row with
// mma.m16n8k16 (bf16 operands, fp32 accumulation), keeps the [16 MT][E] fp32 logits in shared
// memory and takes each token's softmax and top-k there (topk.cuh), so the prefill's logits plane and
// its top-k launch are gone. On CUDA cores the logits of a T = 4096 slice took 119 us and the top-k
// 15 us (E 128, H 2048, ncu, H200): 2.1 GFLOP of fp32 FMAs at ~18 TFLOP/s.
//
// Exactness. x is bf16. A bf16 router row is its own operand, so every product x * w is exact in
// fp32 and the logit is an fp32 sum of exact products, as on CUDA cores; only the order of the sum
// differs. An f32 router is bound as three bf16 planes with hi + mid + lo == w exactly (bf16x3.cuh,
// split once at bind: sparse_moe.cu), three MMAs into the same accumulator: exact products again. The
// shared expert's gate (one row, qwen2_moe) is an fp32 FMA chain on CUDA cores over the staged
// activations.
//
// Copies. One thread brings each K slice by the bulk tensor copy: x's box of 16 MT rows and the
// planes' boxes of every expert row, swizzled (128-byte rows, or 64-byte where two stages of those
// would not fit: the f32 router of E = 512), into a ring of up to 4 stages that an mbarrier a stage
// publishes. Rows past T or E and columns past H arrive as zeros. (The 16-byte cp.async copies these
// replace were ~40 instructions a thread a slice, and their queue was full: at T = 4096 the CTA's
// warps spent 14 % of their stall samples waiting to issue them and 9 % at the barrier after; and
// an f32 router split in every CTA's MMA loop took 91 us where a bf16 one took 44; ncu, H200, base
// clocks, T = 4096.)
//
// Shapes: planes [P][E][H] bf16, x [T][H] bf16, H % 8 == 0, E <= 64 NT <= 512, k <= 16.
// A CTA of 8 warps: warp w owns experts 8 NT w .. 8 NT (w + 1) - 1 for all 16 MT tokens; K walks
// slices of kK columns; fragments by ldmatrix from the swizzled stage.
#include "internal.cuh"
#include "ptx.cuh"
#include "tmap.cuh"
#include "topk.cuh"
#include "wgmma.cuh"

namespace nf {

namespace {

constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kRingBudget = 200 * 1024; // the ring's shared memory at most

// NT: n-tiles of 8 experts a warp (even: one ldmatrix brings two n-tiles' B fragments); MT: 16-token
// tiles a CTA; P: router planes (1: bf16 rows; 3: an f32 router's hi, mid, lo).
template <int NT, int MT, int P>
struct Shape {
    static constexpr int kNE = 8 * NT * kWarps, kM = 16 * MT;
    // a slice's bytes a row: 128 (the 128-byte swizzle) where two stages of them fit, else 64
    static constexpr int kRowBytes = 2 * (kM + P * kNE) * 128 <= kRingBudget ? 128 : 64;
    static constexpr int kK = kRowBytes / 2;
    static constexpr int kXBytes = kM * kRowBytes, kPlaneBytes = kNE * kRowBytes;
    static constexpr int kStageBytes = kXBytes + P * kPlaneBytes;
    // at most 4: up to 8 changed nothing (bf16 qwen3 router, ncu at the H200's clocks: 16.35 -> 16.00 us at
    // T = 1024, 19.81 -> 20.29 at 4096) and halves the CTAs an SM can hold
    static constexpr int kStages = kRingBudget / kStageBytes >= 4 ? 4 : kRingBudget / kStageBytes;
    static constexpr int kBoxRows = kNE < 256 ? kNE : 256; // a tensor map's box has at most 256 rows
    // the logits' row stride in floats: a half warp's float2 stores (8 rows apart by 4) hit 32 banks
    static constexpr int kLE = kNE + 8;
    // + 1024: the ring's start rounded up to the swizzle's 1024-byte atom
    static constexpr int kSmem = kStages * kStageBytes + 1024;
    // the shared gate's columns a slice part: the order its sums always had (64 for bf16 rows, 32 for f32)
    static constexpr int kGateK = P == 1 ? 64 : 32;
    static_assert(NT % 2 == 0 && kStages >= 2 && kK % kGateK == 0, "shape");
    static_assert(kXBytes % 1024 == 0 && (kBoxRows * kRowBytes) % 1024 == 0, "every box starts an atom");
    static_assert(kM * kLE * 4 <= kStages * kStageBytes, "the logits reuse the stages");
};

// The swizzle's XOR for this lane's ldmatrix rows (row lane % 8 of every 8-row group; with 64-byte rows
// a 128-byte line holds two rows): the bits that address bits 7 .. 9 put on bits 4 .. 6.
template <int kRowBytes>
__device__ __forceinline__ uint32_t lane_swizzle(uint32_t row)
{
    return kRowBytes == 128 ? (row & 7) << 4 : ((row >> 1) & 3) << 4;
}

template <int NT, int MT, int P>
__global__ void __launch_bounds__(kThreads)
    router_mma_kernel(const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap, const void *gw,
                      int gw_f32, uint32_t T, uint32_t H, uint32_t E, uint32_t k, int norm, int32_t *ids,
                      float *wts, float *shared_g)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using S = Shape<NT, MT, P>;
    constexpr int kSteps = S::kK / 16, kRB = S::kRowBytes; // k16 steps a slice
    extern __shared__ uint8_t smem_raw[];
    __shared__ float gpart[kThreads];
    __shared__ uint64_t full[S::kStages];
    uint8_t *smem = smem_raw + (-(int)smem_u32(smem_raw) & 1023);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const uint32_t t0 = blockIdx.x * S::kM, slices = (H + S::kK - 1) / S::kK, base = smem_u32(smem);
    // the shared gate: thread i sums token i % kM over part i / kM of each kGateK columns
    constexpr int kGParts = kThreads / S::kM, kGCols = S::kGateK / kGParts;
    const int gt = threadIdx.x % S::kM, gp = threadIdx.x / S::kM;
    float gacc = 0.f;

    if (threadIdx.x == 0) {
        for (int i = 0; i < S::kStages; i++) mbar_init(&full[i], 1);
        fence_mbar_init();
    }
    __syncthreads();
    // slice s into stage i: x's box, then each plane's boxes of expert rows
    auto issue = [&](int i, uint32_t s) {
        const uint32_t dst = base + i * S::kStageBytes, k0 = s * S::kK;
        mbar_expect_tx(&full[i], S::kStageBytes); // out-of-bounds rows and columns count as bytes too
        tma_load_2d(dst, &xmap, k0, t0, &full[i]);
#pragma unroll
        for (int p = 0; p < P; p++)
#pragma unroll
            for (int b = 0; b < S::kNE / S::kBoxRows; b++)
                tma_load_3d(dst + S::kXBytes + p * S::kPlaneBytes + b * S::kBoxRows * kRB, &wmap, k0, b * S::kBoxRows,
                            p, &full[i]);
    };
    if (threadIdx.x == 0)
        for (int i = 0; i < S::kStages - 1; i++)
            if ((uint32_t)i < slices) issue(i, i);

    float acc[MT][NT][4] = {};
    const uint32_t sw = lane_swizzle<kRB>(lane);
    // this lane's ldmatrix rows: A rows mt * 16 + lane % 16 (column half lane / 16); B rows of n-tiles
    // nt + lane / 16 at row lane % 8 (column half lane / 8 % 2)
    const uint32_t a_off = (lane % 16) * kRB, a_col = lane / 16 * 16;
    const uint32_t b_off = S::kXBytes + (warp * NT * 8 + lane / 16 * 8 + lane % 8) * kRB, b_col = lane / 8 % 2 * 16;
    int rd = 0; // the stage of slice s; slice s + kStages - 1 goes into the one before it
    uint32_t parity = 0;
    for (uint32_t s = 0; s < slices; s++) {
        if (threadIdx.x == 0 && s + S::kStages - 1 < slices) issue(rd == 0 ? S::kStages - 1 : rd - 1, s + S::kStages - 1);
        mbar_wait(&full[rd], parity);
        const uint32_t stage = base + rd * S::kStageBytes;
#pragma unroll
        for (int kk = 0; kk < kSteps; kk++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                ldsm_x4(stage + mt * 16 * kRB + a_off + ((kk * 32 + a_col) ^ sw), a[mt]);
#pragma unroll
            for (int nt = 0; nt < NT; nt += 2)
#pragma unroll
                for (int p = 0; p < P; p++) { // hi, mid, lo into each accumulator, in that order
                    uint32_t b[4];            // b0, b1 of n-tiles nt and nt + 1
                    ldsm_x4(stage + p * S::kPlaneBytes + nt * 8 * kRB + b_off + ((kk * 32 + b_col) ^ sw), b);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma_bf16_16816(acc[mt][nt], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[0], b[1]);
                        mma_bf16_16816(acc[mt][nt + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[2], b[3]);
                    }
                }
        }
        if (gw) { // the shared gate's partial over this slice's columns (x's row gt, swizzled)
            const uint8_t *xr = smem + rd * S::kStageBytes + gt * kRB;
            const uint32_t gsw = lane_swizzle<kRB>(gt);
            for (int q = 0; q < S::kK / S::kGateK; q++)
                for (int j = q * S::kGateK + gp * kGCols; j < q * S::kGateK + (gp + 1) * kGCols; j++) {
                    const uint32_t h = s * S::kK + j;
                    if (h >= H) break;
                    const float gv = gw_f32 ? ((const float *)gw)[h] : bf2f(((const uint16_t *)gw)[h]);
                    gacc = fmaf(gv, bf2f(*reinterpret_cast<const uint16_t *>(xr + ((j * 2) ^ gsw))), gacc);
                }
        }
        __syncthreads(); // every warp is done with stage rd: thread 0 may refill it
        if (++rd == S::kStages) rd = 0, parity ^= 1;
    }
    // the logits [kM][kLE] over the stages, then each warp's tokens' softmax and top-k together
    float *lg = reinterpret_cast<float *>(smem);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const uint32_t e = warp * NT * 8 + nt * 8 + 2 * c, r = mt * 16 + g;
#pragma unroll
            for (int h = 0; h < 2; h++) { // rows r and r + 8; a pair that straddles an odd E stores one
                float *l = lg + (r + 8 * h) * S::kLE + e;
                if (e + 1 < E) *reinterpret_cast<float2 *>(l) = make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
                else if (e < E) *l = acc[mt][nt][2 * h];
            }
        }
    if (gw) gpart[threadIdx.x] = gacc;
    __syncthreads();
    const uint32_t nt_live = min((uint32_t)S::kM, T - t0);
    constexpr int kTok = S::kM / kWarps; // tokens a warp: warp, warp + 8, ...
    uint32_t tt[kTok];
#pragma unroll
    for (int i = 0; i < kTok; i++) tt[i] = warp + kWarps * i;
    if (tt[0] < nt_live)
        topk_warp_n<2 * NT, kTok, false>(lg, S::kLE, tt, nt_live, E, k, norm, ids + (uint64_t)t0 * k,
                                         wts + (uint64_t)t0 * k);
    if (gw && threadIdx.x < nt_live) {
        float v = 0.f;
        for (int p = 0; p < kGParts; p++) v += gpart[p * S::kM + threadIdx.x];
        shared_g[t0 + threadIdx.x] = 1.0f / (1.0f + expf(-v));
    }
#endif
}

template <int NT, int MT, int P>
bool launch_shape(const uint16_t *planes, const void *gw, int gw_f32, const uint16_t *x, uint32_t T, uint32_t H,
                  uint32_t E, uint32_t k, int norm, const Routing &r, cudaStream_t s)
{
    using S = Shape<NT, MT, P>;
    // + the gate's partials and the stages' barriers
    if ((size_t)S::kSmem + sizeof(float) * kThreads + 8 * S::kStages > smem_optin_limit()) return false;
    const CUtensorMapSwizzle sw = S::kRowBytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
    const cuuint64_t xdim[2] = {H, T}, xstride[1] = {(cuuint64_t)H * 2};
    const cuuint64_t wdim[3] = {H, E, P}, wstride[2] = {(cuuint64_t)H * 2, (cuuint64_t)H * 2 * E};
    const cuuint32_t xbox[2] = {S::kK, S::kM}, wbox[3] = {S::kK, S::kBoxRows, 1};
    CUtensorMap xmap, wmap;
    if (!tmap_bf16(&xmap, x, 2, xdim, xstride, xbox, sw) || !tmap_bf16(&wmap, planes, 3, wdim, wstride, wbox, sw))
        return false;
    auto kern = router_mma_kernel<NT, MT, P>;
    if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmem) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    kern<<<(T + S::kM - 1) / S::kM, kThreads, S::kSmem, s>>>(xmap, wmap, gw, gw_f32, T, H, E, k, norm, r.topk_id,
                                                             r.topk_w, r.shared_g);
    return cudaGetLastError() == cudaSuccess;
}

template <int NT, int P>
bool launch_nt(const uint16_t *planes, const void *gw, int gw_f32, const uint16_t *x, uint32_t T, uint32_t H,
               uint32_t E, uint32_t k, int norm, const Routing &r, cudaStream_t s)
{
    // 32 tokens a CTA halve the router rows each CTA reads from L2 once the grid has a wave of them
    if constexpr (NT <= 4)
        if (T >= 2048) return launch_shape<NT, 2, P>(planes, gw, gw_f32, x, T, H, E, k, norm, r, s);
    return launch_shape<NT, 1, P>(planes, gw, gw_f32, x, T, H, E, k, norm, r, s);
}

template <int P>
bool launch_p(const uint16_t *planes, const void *gw, int gw_f32, const uint16_t *x, uint32_t T, uint32_t H, uint32_t E,
              uint32_t k, int norm, const Routing &r, cudaStream_t s)
{
    if (E <= 128) return launch_nt<2, P>(planes, gw, gw_f32, x, T, H, E, k, norm, r, s);
    if (E <= 256) return launch_nt<4, P>(planes, gw, gw_f32, x, T, H, E, k, norm, r, s);
    return launch_nt<8, P>(planes, gw, gw_f32, x, T, H, E, k, norm, r, s);
}

} // namespace

bool launch_router_mma(const RouterPlanes &rp, const void *gw, int gw_f32, const uint16_t *x, uint32_t T, uint32_t H,
                       uint32_t E, uint32_t k, int norm, const Routing &r, cudaStream_t s)
{
    if (!rp.p || k > 16 || T == 0 || E > 512 || device_attr<cudaDevAttrComputeCapabilityMajor>() < 9) return false;
    return rp.n == 3 ? launch_p<3>(rp.p, gw, gw_f32, x, T, H, E, k, norm, r, s)
                     : launch_p<1>(rp.p, gw, gw_f32, x, T, H, E, k, norm, r, s);
}

} // namespace nf
