// The tensor-core GEMV for nvfp4 weights and bf16 (or f32) activations at small T: the decode and
// small-token routes' gate/up and down and the decoder's dense nvfp4 layers. Same contract as
// launch_gemv_ex (internal.cuh).
//
// Why: the CUDA-core GEMV decodes every e2m1 nibble to f32 and FMAs it with an f32 activation read
// from shared memory, which keeps it MIO-bound at a few percent of the DRAM rate. Here the weights
// go through mma.m16n8k16 (bf16 in, f32 accumulate) as exact bf16 values e2m1 * e4m3 * 2^-8
// (fp4_mma.cuh says why that is exact and how a nibble pair decodes in five instructions), the
// activations sit in shared memory as bf16 in the order the B fragments want them, and 2^8 / divisor
// is applied once per output row. f32 inputs are split into hi = bf16(x) and lo = bf16(x - hi),
// two B columns whose outputs are added (relative error ~2^-17).
//
// Work split: a CTA owns 16 weight rows (GLU: gate rows p0..p0+7 and their up rows; plain: rows
// p0..p0+15) as the M = 16 of the MMA; its 4 warps split K (the row's 128-element chunks) and
// reduce their accumulators through shared memory; N = 8 is up to 8 tokens (4 for f32 inputs).
// A lane (g = lane / 4, c = lane % 4) loads 16 data bytes of row g and of row g + 8 per chunk (byte
// offset 16 c: elements 32 c .. 32 c + 31) and the two scale bytes of those elements, a batch of
// kBatch chunks in flight before any is used. The CTA's whole tile is prefetched into L1 first, so
// batches after the first find their lines there or in flight; small batches keep the kernel at 80
// registers, 6 CTAs an SM: the routed gate/up of a Qwen3-30B-A3B decode step (8 experts x 96 tiles)
// is one wave on 132 SMs.
//
// Fragment mapping (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"): A reg
// a0 = (row g, k 2c..2c+1), a1 = (row g+8, same k), a2 = (row g, k 2c+8..2c+9), a3 = (row g+8, same);
// B reg b0 = (k 2c..2c+1, col g), b1 = (k 2c+8..2c+9, col g); D d0, d1 = (row g, cols 2c, 2c+1),
// d2, d3 = (row g+8, same cols). A permutation of K is free when A and B share it, so a lane's
// word v (elements 8v .. 8v+7 of its 32) feeds MMAs 2v and 2v+1 with the element pairs (j, j+4):
// k 2c, 2c+1 <- (0, 4) and k 2c+8, 2c+9 <- (1, 5) in MMA 2v; (2, 6) and (3, 7) in MMA 2v+1. The
// staged activations hold each 8-element group as (x0,x4),(x1,x5),(x2,x6),(x3,x7), so the B regs of
// MMAs 2v, 2v+1 are one 16-byte shared load. Words 0-1 are scale block 2c, words 2-3 block 2c+1.
#include "fp4_mma.cuh"
#include "internal.cuh"
#include "rowdot.cuh"

namespace nf {

namespace {

constexpr int kWarps = 4;                    // warps of a CTA, splitting K
constexpr int kBatch = 2;                    // chunks a lane has in flight (each: 2 x 16 data bytes + scales)
constexpr int kStageUnroll = 2;              // 8-element groups a thread stages with their loads in flight
constexpr int kCols = 8;                     // B columns per pass (the MMA's N)
constexpr uint32_t kMaxCols = 12288;         // 8 staged columns stay under 200 KB of shared memory
constexpr size_t kRedBytes = (kWarps - 1) * 32 * sizeof(float4); // warps 1.. hand their D to warp 0

// Chunks k0 .. k0 + kBatch - 1 that are below ke, all loads issued before any use.
__device__ __forceinline__ void load_batch(const LaneRows &L, int k0, int ke, Chunk (&ch)[kBatch])
{
#pragma unroll
    for (int j = 0; j < kBatch; j++)
        if (k0 + j < ke) ch[j] = load_chunk(L, k0 + j);
}

// The input row of a position: x through pos_entry (the routes' gate/up) or the position itself.
__device__ __forceinline__ int input_row(const Groups &g, int pos)
{
    return g.pos_entry ? g.pos_entry[pos] / (int)g.entry_div : pos;
}

// Row j (0..15) of the CTA's M tile, clamped into the expert (reads past the end repeat the last
// row; their outputs are not stored). GLU: j < 8 gate row p0 + j, j >= 8 its up row.
template <bool GLU>
__device__ __forceinline__ uint32_t tile_row(const DevMat &W, uint32_t p0, int j)
{
    if (GLU) {
        const uint32_t half = W.rows / 2, p = min(p0 + (uint32_t)(j & 7), half - 1);
        return j < 8 ? p : p + half;
    }
    return min(p0 + (uint32_t)j, W.rows - 1);
}

// The CTA's 16 rows (data and scales) to L1, one 128-byte line a thread at a time: they travel
// while the activations are staged, or, with the group tables ready, while the predecessor runs.
template <bool GLU>
__device__ void prefetch_tile(const DevMat &W, int expert, uint32_t p0)
{
    const uint32_t lines = (uint32_t)((W.row_stride + 127) / 128);
    for (uint32_t i = threadIdx.x; i < 16 * lines; i += blockDim.x) {
        const uint8_t *p = row_ptr(W, (uint32_t)expert, tile_row<GLU>(W, p0, (int)(i / lines))) + (i % lines) * 128;
        asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
    }
    // a row's scales: 4 bytes in each 512-byte tile (4 scale columns), 16 rows' bytes 16 apart
    for (uint32_t i = threadIdx.x; i < 16 * W.kt; i += blockDim.x) {
        const uint64_t grow = (uint64_t)expert * W.rows + tile_row<GLU>(W, p0, (int)(i / W.kt));
        asm volatile("prefetch.global.L1 [%0];" ::"l"(W.scales + nvfp4_scale_index(grow, 4 * (i % W.kt), W.kt)));
    }
}

// The lane's partial D of its warp's chunks kb .. ke - 1 against the staged columns (xl: the lane's
// column, offset 16 c). The first batch is already loaded (ch).
__device__ __forceinline__ void warp_dot(const LaneRows &L, int kb, int ke, Chunk (&ch)[kBatch], const uint8_t *xl,
                                         float (&d)[4])
{
    float d1[4] = {0.f, 0.f, 0.f, 0.f};
    for (int k0 = kb; k0 < ke; k0 += kBatch) {
        if (k0 != kb) load_batch(L, k0, ke, ch);
#pragma unroll
        for (int j = 0; j < kBatch; j++)
            if (k0 + j < ke) mma_chunk(ch[j], xl + (size_t)(k0 + j) * kFp4ChunkStage, d, d1);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) d[i] += d1[i];
}

// Warps 1.. hand their D to warp 0 through red, which sums them (warp 0 returns true).
__device__ __forceinline__ bool reduce_warps(float4 *red, float (&d)[4])
{
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (warp > 0) red[(warp - 1) * 32 + lane] = make_float4(d[0], d[1], d[2], d[3]);
    __syncthreads();
    if (warp > 0) return false;
#pragma unroll
    for (int w = 0; w < kWarps - 1; w++) {
        const float4 v = red[w * 32 + lane];
        d[0] += v.x, d[1] += v.y, d[2] += v.z, d[3] += v.w;
    }
    return true;
}

// What one output row of the tile needs for the epilogue.
struct OutRows {
    uint32_t ra, rb;     // output rows of D rows g and g + 8 (GLU: ra only)
    bool sa, sb;         // whether they exist
    float fa, fb;        // 2^8 / divisor of the weight rows g and g + 8
};

// Warp 0's stores of the tile's D for the pass's tokens t0.. (nt of them) of a group at `start`.
template <bool GLU, bool IN_BF16>
__device__ __forceinline__ void store_tile(const float (&d)[4], const OutRows &o, float *out, uint32_t out_stride,
                                           int start, int t0, int nt)
{
    const int c = threadIdx.x % 4;
    auto put = [&](int t, float va, float vb) { // token t: va of D row g, vb of D row g + 8
        if (t >= nt) return;
        float *po = out + (size_t)(start + t0 + t) * out_stride;
        if (GLU) {
            if (o.sa) po[o.ra] = silu(va * o.fa) * (vb * o.fb);
        } else {
            if (o.sa) po[o.ra] = va * o.fa;
            if (o.sb) po[o.rb] = vb * o.fb;
        }
    };
    if (IN_BF16) {
        put(2 * c, d[0], d[2]);
        put(2 * c + 1, d[1], d[3]);
    } else {
        put(c, d[0] + d[1], d[2] + d[3]); // columns 2c (hi) and 2c + 1 (lo) of token c
    }
}

// grid: x = tiles of 16 weight rows (GLU: 8 outputs, plain: 16), y = group slots; kWarps warps.
// tpp: tokens per pass (the staged columns hold that many). EARLY (one token whose input row is
// x[0], the decode route): the activations are staged before the grid-dependency wait (gemv.cu).
template <bool GLU, bool IN_BF16, bool EARLY>
__global__ void __launch_bounds__(kWarps * 32, 6)
    gemv_fp4_kernel(DevMat W, const void *in, uint32_t in_stride, Groups g, float *out, uint32_t out_stride, int tpp,
                    NextMat nx, bool ready)
{
    extern __shared__ __align__(16) uint8_t smem[];
    float4 *red = reinterpret_cast<float4 *>(smem);
    uint8_t *xs = smem + kRedBytes;
    const uint32_t xstride = fp4_col_stride(W.cols);
    if (EARLY) {
        stage_cols<IN_BF16, kStageUnroll>(in, in_stride, [](int) { return 0; }, 0, 1, W.cols, xs, xstride);
    }
    const int gi = blockIdx.y;
    const uint32_t p0 = blockIdx.x * (GLU ? 8 : 16);
    if (ready && gi < *g.n) prefetch_tile<GLU>(W, g.expert[gi], p0);
    // Under programmatic dependent launch: wait for the predecessor, then let the next launch start
    // (it reads what this one writes only after its own wait); both are no-ops in a plain launch.
    cudaGridDependencySynchronize();
    cudaTriggerProgrammaticLaunchCompletion();
    if (gi >= *g.n) return;
    const int expert = g.expert[gi], start = g.start[gi], count = g.count[gi];
    if (!ready) prefetch_tile<GLU>(W, expert, p0);
    prefetch_expert(nx, (uint32_t)expert);

    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, gq = lane / 4, cq = lane % 4;
    const uint64_t ga = (uint64_t)expert * W.rows + tile_row<GLU>(W, p0, gq);
    const uint64_t gb = (uint64_t)expert * W.rows + tile_row<GLU>(W, p0, gq + 8);
    const LaneRows L = lane_rows(W, ga, gb, cq);
    const uint32_t out_rows = GLU ? W.rows / 2 : W.rows;
    const OutRows o{p0 + gq, p0 + gq + 8, p0 + gq < out_rows, !GLU && p0 + gq + 8 < out_rows, row_factor(W, ga),
                    row_factor(W, gb)};
    // the warp's contiguous share of the row's chunks
    const int nch = (int)(W.cols / kFp4Chunk), per = (nch + kWarps - 1) / kWarps;
    const int kb = warp * per, ke = min(nch, kb + per);

    for (int t0 = 0; t0 < count; t0 += tpp) {
        const int nt = min(tpp, count - t0), ncol = IN_BF16 ? nt : 2 * nt;
        Chunk ch[kBatch];
        load_batch(L, kb, ke, ch); // in flight while the activations are staged
        if (!EARLY) {
            __syncthreads(); // the previous pass's readers are done with xs and red
            stage_cols<IN_BF16, kStageUnroll>(in, in_stride, [&](int pos) { return input_row(g, pos); }, start + t0,
                                              nt, W.cols, xs, xstride);
        }
        __syncthreads();
        // columns past the pass's tokens read the last staged one: their D columns are not stored
        const uint8_t *xl = xs + (size_t)min(gq, ncol - 1) * xstride + 16 * cq;
        float d[4] = {0.f, 0.f, 0.f, 0.f};
        warp_dot(L, kb, ke, ch, xl, d);
        if (reduce_warps(red, d)) store_tile<GLU, IN_BF16>(d, o, out, out_stride, start, t0, nt);
    }
}

using Fp4Kernel = void (*)(DevMat, const void *, uint32_t, Groups, float *, uint32_t, int, NextMat, bool);

template <bool GLU, bool IN_BF16>
Fp4Kernel pick(bool early)
{
    return early ? gemv_fp4_kernel<GLU, IN_BF16, true> : gemv_fp4_kernel<GLU, IN_BF16, false>;
}

} // namespace

// Shared memory of a pass of ncol staged columns.
static size_t stage_bytes(uint32_t cols, uint32_t ncol) { return kRedBytes + (size_t)ncol * fp4_col_stride(cols); }

bool gemv_fp4_supported(const DevMat &W)
{
    return W.cols % kFp4Chunk == 0 && W.cols <= kMaxCols && W.rows >= 1 && W.scales && W.divisors &&
           stage_bytes(W.cols, 2) <= smem_optin_limit(); // one f32 token (hi and lo) must fit
}

cudaError_t launch_gemv_fp4(bool glu, const DevMat &W, const void *in, bool in_bf16, uint32_t in_stride,
                            const Groups &g, float *out, uint32_t out_stride, uint32_t max_tokens,
                            const GemvLaunch &opt, cudaStream_t s)
{
    if (!gemv_fp4_supported(W)) return cudaErrorInvalidValue;
    const uint32_t out_rows = glu ? W.rows / 2 : W.rows, tile = glu ? 8 : 16;
    // tokens per pass: what the 8 B columns hold, no more than a group can have, nor the device's
    // shared memory (supported() guarantees one)
    const uint32_t per_pass = in_bf16 ? kCols : kCols / 2, cpt = in_bf16 ? 1 : 2, limit = (uint32_t)smem_optin_limit();
    int tpp = (int)(max_tokens < 1 ? 1 : max_tokens < per_pass ? max_tokens : per_pass);
    while (tpp > 1 && stage_bytes(W.cols, cpt * tpp) > limit) tpp--;
    const size_t smem = stage_bytes(W.cols, cpt * tpp);
    // EARLY staging needs every position's input row to be row 0 (the caller says so)
    const bool early = opt.rows_are_x0 && max_tokens == 1;
    const Fp4Kernel k = glu ? (in_bf16 ? pick<true, true>(early) : pick<true, false>(early))
                            : (in_bf16 ? pick<false, true>(early) : pick<false, false>(early));
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    return launch_pdl(k, dim3((out_rows + tile - 1) / tile, g.max_groups), dim3(kWarps * 32), smem, opt.pdl, s, W, in,
                      in_stride, g, out, out_stride, tpp, opt.next, opt.groups_ready);
}

} // namespace nf
