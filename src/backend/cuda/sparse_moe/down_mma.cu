// Down projection and weighted combine fused, on tensor cores, for nvfp4 and bf16 down banks in the
// decode and small-token routes (T <= 16): launch_down_combine's contract (internal.cuh) with
// gemv_mma.cu's numerics, one kernel templated over the row format (mma_rows.cuh: Fp4Rows, Bf16Rows).
// decode.cu's f32 form turns every weight into f32 and FMAs it on the CUDA cores with the
// intermediate read through L1 (nvfp4: ~15 of the 40 us of the layer at T = 1); here the weights go
// through mma.m16n8k16 as exact bf16 operands (nvfp4: e2m1 * e4m3 * 2^-8, fp4_mma.cuh; bf16: the
// weight) against the SwiGLU intermediate split into hi = bf16(x) and lo = bf16(x - hi), two B
// columns per position whose outputs are added (W4A16 / W16A16 with an f32-grade intermediate,
// relative error ~2^-17 per product; gemv_mma.cu).
//
// Work split. A CTA owns 16 output rows h (the MMA's M) of every token; the K of its product is
// (active expert, that expert's I), which the CTA's 16 warps split. The work list is the routing's
// groups cut into tasks of at most 4 positions (8 B columns: the MMA's N); a task times the I /
// kChunk chunks of its expert's 16 rows gives the items (nvfp4: chunks of 128, bf16: 64), and warp w
// takes a contiguous 1/16 of them, so one token's 8 experts x 6 nvfp4 chunks (Qwen3-30B-A3B: H 2048,
// I 768) are 3 items a warp and a step's ~30 experts at T = 4 are ~12. Per item a lane loads its
// share of rows g and g + 8 (nvfp4: 16 data bytes and 2 scale bytes a row; bf16: 32 bytes; the
// fragment mapping of mma_rows.cuh) and runs the chunk's MMAs into two accumulators; when its task
// ends the lane scales the D of its position (column pair 2c, 2c + 1: hi and lo of position c) by the
// row's factor (nvfp4: 2^8 / divisor; bf16: 1) and the position's router weight and adds it to a
// per-token register (MAXT of them per row: 1, 2, 4, 8, 16, no run-time indexing). The 4 lanes of a
// row and the 16 warps then sum in a fixed order (shuffles, then shared memory): deterministic. The
// shared expert's ys[t] and the bf16 rounding come last, as in decode.cu.
//
// Why this shape. M = 16 rows per CTA gives H / 16 CTAs (128 at H = 2048: one wave on 132 SMs) and
// lets each CTA stage the intermediate once for all its experts. The price is that every CTA stages
// all T * k positions: T * k * I * 4 bytes of f32 read from L2 per CTA (24 KB at T = 1, 98 KB at
// T = 4 with k = 8), about half an nvfp4 CTA's weight bytes (an eighth of a bf16 one's) when the
// positions go to distinct experts. Shared memory holds 2 T k columns of 2 I + 64 bytes (+ the work
// list): 25 KB at T = 1, 100 KB at T = 4, 200 KB at T = 8 (k = 8, I = 768); T = 16 (400 KB) does not
// fit, and down_mma_supported refuses whatever exceeds the device's per-block limit (decode.cu takes
// it).
//
// Bytes in flight. Each warp prefetches its first window of items (16 rows' data lines, nvfp4's
// scale sectors) into L1 before the grid-dependency wait and keeps that window ahead of its loads as
// it goes; loads take kBatch items at a time and mostly hit L1. The window is 6 nvfp4 items (16 x 64
// data bytes each) or 3 bf16 ones (16 x 128), 6 KB a warp and never more than the CTA's items,
// within what the staging leaves of L1 up to T = 4. At T = 1 with nvfp4 that is the CTA's whole tile
// (8 experts x 16 rows x 384 bytes = 48 KB) requested while gate/up still runs (which also
// prefetches these experts' down bytes into L2).
//
// Why 16 warps: the grid is one CTA an SM (H / 16 = 128 CTAs), so the warps a CTA has are all the
// SM has; after the wait each warp's items are a chain of decodes and MMAs, and 16 warps halve it
// against 8 (111 registers at MAXT 16, no spills; one CTA an SM either way). H200, both arms in one
// call: the operator at T = 1 30.3 -> 28.7 us, T = 8 112.4 -> 104.7; nvfp4 tg128 380.3 -> 388.1
// (docs/data/ab_down_warps_h200.txt).
//
// Under programmatic dependent launch the kernel starts while its predecessor (gate/up, or the shared
// expert's down) runs: the routing it reads was complete before any launch after the router passed
// its own wait (each releases its successor only after that wait), so the
// work list, the positions' weights and tokens, the L1 prefetches and the first loads come before
// cudaGridDependencySynchronize(); the intermediate (act) is read only after it. No early trigger
// (as decode.cu): the next forward's router overwrites the routing this kernel reads.
#include "fp4_mma.cuh"
#include "internal.cuh"
#include "mma_rows.cuh"

namespace nf {

namespace {

constexpr int kWarps = 16;      // warps of a CTA, splitting the (task, chunk) items
constexpr int kBatch = 2;       // items a lane has loaded at a time
constexpr int kStageUnroll = 4; // 8-element groups a thread stages with their loads in flight
constexpr int kPass = 4;        // positions per task (hi and lo columns each: the MMA's N = 8)
constexpr int kRows = 16;       // output rows per CTA (the MMA's M)

// Shared memory: the staged columns ([2 P][mma_col_stride(I)] bytes; after the item loop the warps'
// per-token sums [kWarps][MAXT][16] f32 take their place), then the work list (P tasks: expert, first
// position, positions), each position's router weight and token, and the task count.
struct DownSmem {
    size_t tasks, pw, pt, ntask, bytes;
    NF_HD DownSmem(uint32_t P, uint32_t I, uint32_t maxt)
    {
        const size_t xs = 2 * (size_t)P * mma_col_stride(I), red = (size_t)kWarps * maxt * kRows * sizeof(float);
        tasks = ((xs > red ? xs : red) + 15) / 16 * 16;
        pw = tasks + (size_t)P * sizeof(int4);
        pt = pw + (size_t)P * sizeof(float);
        ntask = pt + (size_t)P * sizeof(int);
        bytes = ntask + 16;
    }
};

NF_HD uint32_t maxt_of(uint32_t T) { return T <= 1 ? 1 : T <= 2 ? 2 : T <= 4 ? 4 : T <= 8 ? 8 : 16; }

// Warp 0: the groups cut into tasks of at most kPass positions, in group order (a warp-wide scan of
// the task counts, 32 groups at a time). A well-formed routing has at most P tasks (each holds a
// position); the table is P long and a malformed one is cut there.
__device__ void build_tasks(const Routing &r, uint32_t P, int4 *tasks, int *ntask)
{
    const int lane = threadIdx.x % 32, ng = *r.n_groups;
    int base = 0;
    for (int g0 = 0; g0 < ng; g0 += 32) {
        const int g = g0 + lane;
        int e = 0, s = 0, c = 0;
        if (g < ng) e = r.g_expert[g], s = r.g_start[g], c = r.g_count[g];
        const int n = (c + kPass - 1) / kPass;
        int incl = n;
        for (int o = 1; o < 32; o <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += v;
        }
        for (int j = 0, at = base + incl - n; j < n && at < (int)P; j++, at++)
            tasks[at] = make_int4(e, s + kPass * j, min(kPass, c - kPass * j), 0);
        base += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) *ntask = min(base, (int)P);
}

// Items a warp has prefetched into L1 ahead of its loads: 6 KB of data lines (16 rows' chunks).
template <class R>
constexpr int kWindow = 6 * 1024 / (16 * R::kChunkBytes);

// Item i's 16 rows to L1: lane l < 16 the data line of row l's chunk, lane l >= 16 the format's
// other lines of row l - 16 for the chunk (nvfp4: two 512-byte scale tiles).
template <class R>
__device__ __forceinline__ void prefetch_item(const DevMat &W, const int4 *tasks, int i, int nch, uint32_t h0)
{
    const int lane = threadIdx.x % 32, ti = i / nch, c = i - ti * nch;
    const uint64_t grow = (uint64_t)tasks[ti].x * W.rows + min(h0 + (uint32_t)(lane & 15), W.rows - 1);
    if (lane < 16) {
        prefetch_line(W.data + grow * W.row_stride + R::kChunkBytes * c, true);
    } else {
#pragma unroll
        for (int j = 0; j < R::kAuxPerChunk; j++)
            prefetch_line(R::aux_line(W, grow, R::kAuxPerChunk * c + j), true);
    }
}

// The lane's share of items i0 .. i0 + kBatch - 1 that are below ke (rows ra, rb of each item's expert).
template <class R>
__device__ __forceinline__ void load_items(const DevMat &W, const int4 *tasks, int i0, int ke, int nch, uint32_t ra,
                                           uint32_t rb, int cq, typename R::Chunk (&ch)[kBatch])
{
#pragma unroll
    for (int j = 0; j < kBatch; j++) {
        const int i = i0 + j;
        if (i < ke) {
            const int ti = i / nch, c = i - ti * nch;
            const uint64_t e = (uint64_t)tasks[ti].x;
            ch[j] = R::load(R::lane(W, e * W.rows + ra, e * W.rows + rb, cq), c);
        }
    }
}

// grid: x = tiles of 16 output rows; kWarps warps. MAXT >= T: per-token registers.
template <class R, int MAXT>
__global__ void __launch_bounds__(kWarps * 32, 1)
    down_mma_kernel(DevMat W, const float *act, Routing r, uint32_t T, uint32_t k, const float *ys, uint16_t *out)
{
    extern __shared__ __align__(16) uint8_t smem[];
    const uint32_t H = W.rows, I = W.cols, P = T * k, xstride = mma_col_stride(I);
    const DownSmem L(P, I, MAXT);
    int4 *tasks = reinterpret_cast<int4 *>(smem + L.tasks);
    float *pw = reinterpret_cast<float *>(smem + L.pw);
    int *pt = reinterpret_cast<int *>(smem + L.pt);
    int *ntask = reinterpret_cast<int *>(smem + L.ntask);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, gq = lane / 4, cq = lane % 4;
    const uint32_t h0 = blockIdx.x * kRows;
    // the lane's rows of the tile, clamped into the matrix (rows past H repeat the last; not stored)
    const uint32_t ra = min(h0 + gq, H - 1), rb = min(h0 + gq + 8, H - 1);

    // Routing and weights only: before the wait on gate/up.
    if (warp == 0) build_tasks(r, P, tasks, ntask);
    for (uint32_t p = threadIdx.x; p < P; p += blockDim.x) {
        const int entry = r.pos_entry[p];
        pw[p] = r.topk_w[entry];
        pt[p] = entry / (int)k;
    }
    __syncthreads();
    const int nch = (int)(I / R::kChunk), items = *ntask * nch, per = (items + kWarps - 1) / kWarps;
    const int kb = min(items, warp * per), ke = min(items, kb + per); // the warp's items
    constexpr int window = kWindow<R>;
    for (int i = kb; i < ke && i < kb + window; i++) prefetch_item<R>(W, tasks, i, nch, h0);
    typename R::Chunk ch[kBatch];
    load_items<R>(W, tasks, kb, ke, nch, ra, rb, cq, ch);

    cudaGridDependencySynchronize();
    stage_cols<R, false, kStageUnroll>(act, I, [](int p) { return p; }, 0, (int)P, I, smem, xstride);
    __syncthreads();

    float acc_a[MAXT], acc_b[MAXT]; // per token: rows g and g + 8 of the tile
#pragma unroll
    for (int t = 0; t < MAXT; t++) acc_a[t] = acc_b[t] = 0.f;
    float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
    int cur = -1;                    // the task whose D is accumulating
    int4 tk = make_int4(0, 0, 0, 0); // its expert, first position, positions
    float da = 1.f, db = 1.f;        // the divisor words of its rows ra, rb (R::divisor)
    const uint8_t *xl = smem;        // the lane's B column of it, at its 16-byte group
    // The task's D into the token registers: lane c holds position c's hi (column 2c) and lo (2c + 1).
    auto flush = [&]() {
        if (cq < tk.z) {
            const int p = tk.y + cq, t = pt[p];
            const float w = pw[p];
            const float va = ((d0[0] + d1[0]) + (d0[1] + d1[1])) * R::factor_of(da) * w;
            const float vb = ((d0[2] + d1[2]) + (d0[3] + d1[3])) * R::factor_of(db) * w;
#pragma unroll
            for (int tt = 0; tt < MAXT; tt++)
                if (tt == t) acc_a[tt] += va, acc_b[tt] += vb; // a register per token: no dynamic indexing
        }
#pragma unroll
        for (int q = 0; q < 4; q++) d0[q] = d1[q] = 0.f;
    };
    for (int i0 = kb; i0 < ke; i0 += kBatch) {
        if (i0 != kb) load_items<R>(W, tasks, i0, ke, nch, ra, rb, cq, ch);
#pragma unroll
        for (int j = 0; j < kBatch; j++)
            if (i0 + window + j < ke) prefetch_item<R>(W, tasks, i0 + window + j, nch, h0);
#pragma unroll
        for (int j = 0; j < kBatch; j++) {
            const int i = i0 + j;
            if (i >= ke) break;
            const int ti = i / nch, c = i - ti * nch;
            if (ti != cur) { // warp-uniform
                if (cur >= 0) flush();
                cur = ti;
                tk = tasks[ti];
                // loaded here, turned into factors at the flush: the load is not waited for before
                // the task's MMAs
                da = R::divisor(W, (uint64_t)tk.x * H + ra);
                db = R::divisor(W, (uint64_t)tk.x * H + rb);
                // columns 2 p (hi), 2 p + 1 (lo) of the task's positions; B columns past them read
                // the last one (their D columns are not used)
                xl = smem + (size_t)(2 * tk.y + min(gq, 2 * tk.z - 1)) * xstride + 16 * cq;
            }
            mma_chunk<R>(ch[j], xl + (size_t)c * (2 * R::kChunk), d0, d1);
        }
    }
    if (cur >= 0) flush();

    // Per token: the 4 lanes of a row, then the warps, in a fixed order.
#pragma unroll
    for (int t = 0; t < MAXT; t++) {
        acc_a[t] += __shfl_xor_sync(0xffffffffu, acc_a[t], 1);
        acc_a[t] += __shfl_xor_sync(0xffffffffu, acc_a[t], 2);
        acc_b[t] += __shfl_xor_sync(0xffffffffu, acc_b[t], 1);
        acc_b[t] += __shfl_xor_sync(0xffffffffu, acc_b[t], 2);
    }
    __syncthreads(); // every warp is done with the staged columns: the sums take their place
    float *red = reinterpret_cast<float *>(smem);
    if (cq == 0) {
#pragma unroll
        for (int t = 0; t < MAXT; t++) {
            red[(warp * MAXT + t) * kRows + gq] = acc_a[t];
            red[(warp * MAXT + t) * kRows + gq + 8] = acc_b[t];
        }
    }
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < kRows * T; i += blockDim.x) {
        const uint32_t t = i / kRows, j = i % kRows, h = h0 + j;
        if (h >= H) continue;
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; w++) v += red[(w * MAXT + t) * kRows + j];
        if (ys) v = fmaf(r.shared_g[t], ys[(size_t)t * H + h], v);
        out[(size_t)t * H + h] = f2bf(v);
    }
}

template <class R, int MAXT>
cudaError_t launch_t(const DevMat &W, const float *act, const Routing &r, uint32_t T, uint32_t k, const float *ys,
                     uint16_t *out, bool pdl, cudaStream_t s)
{
    const size_t smem = DownSmem(T * k, W.cols, MAXT).bytes;
    auto kern = down_mma_kernel<R, MAXT>;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    return launch_pdl(kern, dim3((W.rows + kRows - 1) / kRows), dim3(kWarps * 32), smem, pdl, s, W, act, r, T, k, ys,
                      out);
}

template <class R>
bool shape_ok(const DevMat &W, uint32_t T, uint32_t k)
{
    return T >= 1 && T <= 16 && k >= 1 && k <= 16 && W.cols >= (uint32_t)R::kChunk && W.cols % R::kChunk == 0 &&
           W.rows >= 1 && R::admits(W);
}

bool shape_ok(int codec, const DevMat &W, uint32_t T, uint32_t k)
{
    switch (codec) {
    case 2 /* NF_CODEC_BF16 */: return shape_ok<Bf16Rows>(W, T, k);
    case 11 /* NF_CODEC_NVFP4 */: return shape_ok<Fp4Rows>(W, T, k);
    default: return false;
    }
}

} // namespace

size_t down_mma_smem(uint32_t T, uint32_t k, uint32_t I)
{
    if (T < 1 || T > 16) return 0;
    return DownSmem(T * k, I, maxt_of(T)).bytes;
}

bool down_mma_supported_within(int codec, const DevMat &W, uint32_t T, uint32_t k, size_t smem_limit)
{
    return shape_ok(codec, W, T, k) && down_mma_smem(T, k, W.cols) <= smem_limit;
}

bool down_mma_supported(int codec, const DevMat &W, uint32_t T, uint32_t k)
{
    return down_mma_supported_within(codec, W, T, k, smem_optin_limit());
}

cudaError_t launch_down_mma(int codec, const DevMat &W, const float *act, const Routing &r, uint32_t T, uint32_t k,
                            const float *ys, uint16_t *out, bool pdl, cudaStream_t s)
{
    if (!shape_ok(codec, W, T, k)) return cudaErrorInvalidValue;
    return with_maxt(T, [&](auto m) {
        constexpr int MAXT = decltype(m)::value;
        return codec == 2 ? launch_t<Bf16Rows, MAXT>(W, act, r, T, k, ys, out, pdl, s)
                          : launch_t<Fp4Rows, MAXT>(W, act, r, T, k, ys, out, pdl, s);
    });
}

} // namespace nf
