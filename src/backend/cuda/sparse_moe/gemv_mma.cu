// The tensor-core GEMV for nvfp4 and bf16 weights and bf16 (or f32) activations at small T: the
// decode and small-token routes' gate/up (routed and shared), the shared expert's down and the
// decoder's dense nvfp4 and bf16 layers. Same contract as launch_gemv_ex (internal.cuh).
//
// Why: the CUDA-core GEMV turns every weight into f32 and FMAs it with an f32 activation read from
// shared memory, which keeps it MIO-bound (a shared load per FMA; nvfp4 adds ~5 decode instructions a
// weight): a few percent of the DRAM rate for nvfp4, ~30 % for bf16 (ncu: a Qwen3-30B-A3B layer's bf16
// routed gate/up 49 us). Here the weights go through mma.m16n8k16 (bf16 in, f32 accumulate) as exact
// bf16 operands -- bf16 weights as they are, nvfp4 as e2m1 * e4m3 * 2^-8 (fp4_mma.cuh) --, the
// activations sit in shared memory as bf16 in the order the B fragments want them, and the format's
// factor (nvfp4: 2^8 / divisor; bf16: none) is applied once per output row. f32 inputs are split into
// hi = bf16(x) and lo = bf16(x - hi), two B columns whose outputs are added (relative error <= 2^-16
// a product). Every product of two bf16 is exact in f32, so the numerics are the CUDA-core GEMV's:
// exact products, f32 sums.
//
// One kernel, templated over the row format R (mma_rows.cuh: how a lane loads its share of a chunk
// and turns it into A registers, the per-row factor, where the staged activations go, which other
// bytes of a row to prefetch): Fp4Rows (fp4_mma.cuh) and Bf16Rows (mma_rows.cuh).
//
// Work split: a CTA owns 16 weight rows (GLU: gate rows p0..p0+7 and their up rows; plain: rows
// p0..p0+15) as the M = 16 of the MMA; its NW warps (4, 8 or 16, below) split K (the row's chunks: 128
// elements for nvfp4, 64 for bf16) into contiguous shares and reduce their accumulators through shared
// memory, warp 0 adding warps 1 .. NW - 1 in that order: a fixed order, so the outputs are bit-identical
// run to run; N = 8 is up to 8 tokens (4 for f32 inputs). A lane (g = lane / 4, c = lane % 4) loads
// its share of each chunk of rows g and g + 8 (nvfp4: 16 data bytes and 2 scale bytes a row; bf16: 32
// bytes a row), R::kBatch chunks in flight before any is used. The CTA's whole tile is prefetched into
// L1 first, so later chunks find their lines there or in flight; small batches keep the 4-warp kernel
// at 76 - 80 registers for nvfp4 (6 CTAs an SM: the routed gate/up of a Qwen3-30B-A3B decode step, 8
// experts x 96 tiles, is one wave on 132 SMs), 72 - 74 for bf16 with early staging (6) and 84 - 90 for
// the other bf16 forms (5). A bf16 tile is 3.6x an nvfp4 one (64 KB at cols 2048), so six CTAs' tiles
// exceed L1: lines evicted before use come again from L2, where the prefetch left them. The fragment
// mapping and the staged columns' layout: mma_rows.cuh.
//
// Warps a CTA: a warp has only its next chunks' loads in flight, so an SM's bytes in flight are its
// resident warps' (the tile's L1 prefetch does not make up for it: the measurements below). The LM
// head's 9496 tiles fill every SM with 4-warp CTAs, yet read at 3.6 TB/s of the ~4.4 the device
// reads (ncu, H200), so bf16 matrices of more than a wave at one token stream instead (streams(),
// gemv_stream.cu: 4.05 TB/s); a decode step's dense bf16 layers have a few hundred tiles: the
// attention output projection (2048 x 4096, 128 CTAs: one of 4 warps an SM) read at 1.14 TB/s, q/k/v
// (5120 x 2048, 320 CTAs: two or three an SM) at 1.75 TB/s, latency-bound. So the host (pick_warps) widens the CTA to 16 or to 8 warps, the
// widest that (a) still has the whole grid resident at once (one wave, by the occupancy calculator: a
// second, partial wave would cost back what the wider split saves) and (b) leaves each warp
// kMinWarpChunks chunks; else 4. On an H200 (132 SMs), T = 1: 2048 x 4096 takes 16 warps (one CTA an
// SM, 16 warps instead of 4), 5120 x 2048 takes 8 (three CTAs an SM at 80 registers, ~19 warps instead
// of ~10), nvfp4 rows the same (5120 x 2048: 8, 16 chunks); the routed gate/up (768 CTAs, already a full
// wave of 4-warp CTAs) keeps 4, whose code is unchanged. The 8-warp forms are bound
// to 80 registers (3 CTAs an SM), 70 - 80 with their threads staging one group at a time (kStageUnroll:
// the CTA keeps as many staging loads in flight as 4 warps at two); the 16-warp ones take 86 - 104 (one
// CTA an SM whatever the count). No form spills. The wider forms' outputs differ from the 4-warp form's
// in the last bits, only through the f32 summation order (shorter per-warp chains, more cross-warp
// sums). Measured (H200, ncu, nvfp4 recipe's decode step): the attention output 14.7 -> 9.7 us at
// 16 warps, q / k / v 12.0 -> 10.8 us at 8; `bench e2e` nvfp4 tg128 306.0 -> 337.9 t/s.
#include <type_traits>

#include "fp4_mma.cuh"
#include "internal.cuh"
#include "mma_rows.cuh"
#include "rowdot.cuh"

namespace nf {

namespace {

constexpr int kCols = 8;                     // B columns per pass (the MMA's N)
constexpr uint32_t kMaxCols = 12288;         // 8 staged columns stay under 200 KB of shared memory
// A wider form leaves each warp at least this many chunks: the depth a warp keeps in flight (nvfp4's
// kBatch; bf16 loads the next chunk while the current one's MMAs run), below which more warps add CTA
// overhead (staging, reduction) rather than bytes in flight.
constexpr int kMinWarpChunks = 2;

// 8-element groups a thread of an NW-warp CTA stages with their loads in flight: two at 4 warps, one
// at 8 and 16 (as many loads a CTA as 4 warps at two, or twice that), which keeps the 8-warp forms'
// staging within their 80 registers.
template <int NW>
constexpr int kStageUnroll = NW == 4 ? 2 : 1;

// Shared memory through which warps 1 .. nw - 1 hand their D to warp 0.
__host__ __device__ constexpr size_t red_bytes(int nw) { return (size_t)(nw - 1) * 32 * sizeof(float4); }

// CTAs an SM the register bound of the NW-warp form is set for: the 4-warp form's R::kMinBlocks; 3 for
// 8 warps (80 registers, so 3 x 132 CTAs cover the 320 tiles of a 5120-row matrix in one wave); 1
// for 16 (what 512 threads at more than 64 registers get anyway).
template <class R, int NW>
constexpr int min_blocks()
{
    return NW == 4 ? R::kMinBlocks : NW == 8 ? 3 : 1;
}

// Chunks k0 .. k0 + R::kBatch - 1 that are below ke, all loads issued before any use.
template <class R>
__device__ __forceinline__ void load_batch(const typename R::Lane &L, int k0, int ke,
                                           typename R::Chunk (&ch)[R::kBatch])
{
#pragma unroll
    for (int j = 0; j < R::kBatch; j++)
        if (k0 + j < ke) ch[j] = R::load(L, k0 + j);
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

// The CTA's 16 rows (data and the format's other bytes: nvfp4's scales) to L1, one 128-byte line a
// thread at a time: they travel while the activations are staged, or, with the group tables ready,
// while the predecessor runs. The format's other lines are shared by 8 aligned rows (nvfp4: a row's
// scales of a 512-byte tile sit 16 bytes apart, rows m .. m + 7 of an aligned group in one line),
// and the tile is two runs of 8 consecutive rows (GLU: gate and up; plain: one run of 16): the
// first and last row of each run name every line, 4 prefetches a tile line instead of 16.
template <class R, bool GLU>
__device__ void prefetch_tile(const DevMat &W, int expert, uint32_t p0)
{
    const uint32_t lines = (uint32_t)((W.row_stride + 127) / 128);
    for (uint32_t i = threadIdx.x; i < 16 * lines; i += blockDim.x) {
        const uint8_t *p = row_ptr(W, (uint32_t)expert, tile_row<GLU>(W, p0, (int)(i / lines))) + (i % lines) * 128;
        prefetch_line(p, true);
    }
    const uint32_t aux = R::aux_lines(W);
    for (uint32_t i = threadIdx.x; i < 4 * aux; i += blockDim.x) {
        const int j = (int)(i & 1) * 7 + (int)(i & 2) * 4; // rows 0, 7, 8, 15
        const uint64_t grow = (uint64_t)expert * W.rows + tile_row<GLU>(W, p0, j);
        prefetch_line(R::aux_line(W, grow, i >> 2), true);
    }
}

// The lane's partial D of its warp's chunks kb .. ke - 1 against the staged columns (xl: the lane's
// column, offset 16 c). The first batch is already loaded (ch).
template <class R>
__device__ __forceinline__ void warp_dot(const typename R::Lane &L, int kb, int ke, typename R::Chunk (&ch)[R::kBatch],
                                         const uint8_t *xl, float (&d)[4])
{
    float d1[4] = {0.f, 0.f, 0.f, 0.f};
    for (int k0 = kb; k0 < ke; k0 += R::kBatch) {
        if (k0 != kb) load_batch<R>(L, k0, ke, ch);
#pragma unroll
        for (int j = 0; j < R::kBatch; j++)
            if (k0 + j < ke) mma_chunk<R>(ch[j], xl + (size_t)(k0 + j) * (2 * R::kChunk), d, d1);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) d[i] += d1[i];
}

// Warps 1.. hand their D to warp 0 through red, which sums them in warp order, a fixed order whatever
// the timing (warp 0 returns true).
template <int NW>
__device__ __forceinline__ bool reduce_warps(float4 *red, float (&d)[4])
{
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (warp > 0) red[(warp - 1) * 32 + lane] = make_float4(d[0], d[1], d[2], d[3]);
    __syncthreads();
    if (warp > 0) return false;
#pragma unroll
    for (int w = 0; w < NW - 1; w++) {
        const float4 v = red[w * 32 + lane];
        d[0] += v.x, d[1] += v.y, d[2] += v.z, d[3] += v.w;
    }
    return true;
}

// What one output row of the tile needs for the epilogue.
struct OutRows {
    uint32_t ra, rb;     // output rows of D rows g and g + 8 (GLU: ra only)
    bool sa, sb;         // whether they exist
};

// Warp 0's stores of the tile's D for the pass's tokens t0.. (nt of them) of a group at `start`;
// fa, fb: the format's factors of the weight rows g and g + 8 (R::factor_of).
template <bool GLU, bool IN_BF16>
__device__ __forceinline__ void store_tile(const float (&d)[4], const OutRows &o, float fa, float fb, float *out,
                                           uint32_t out_stride, int start, int t0, int nt)
{
    const int c = threadIdx.x % 4;
    auto put = [&](int t, float va, float vb) { // token t: va of D row g, vb of D row g + 8
        if (t >= nt) return;
        float *po = out + (size_t)(start + t0 + t) * out_stride;
        if (GLU) {
            if (o.sa) po[o.ra] = silu(va * fa) * (vb * fb);
        } else {
            if (o.sa) po[o.ra] = va * fa;
            if (o.sb) po[o.rb] = vb * fb;
        }
    };
    if (IN_BF16) {
        put(2 * c, d[0], d[2]);
        put(2 * c + 1, d[1], d[3]);
    } else {
        put(c, d[0] + d[1], d[2] + d[3]); // columns 2c (hi) and 2c + 1 (lo) of token c
    }
}

// grid: x = tiles of 16 weight rows (GLU: 8 outputs, plain: 16), y = group slots; NW warps.
// tpp: tokens per pass (the staged columns hold that many). EARLY (one token whose input row is
// x[0], the decode route): the activations are staged before the grid-dependency wait (gemv.cu).
template <class R, int NW, bool GLU, bool IN_BF16, bool EARLY>
__global__ void __launch_bounds__(NW * 32, min_blocks<R, NW>())
    gemv_mma_kernel(DevMat W, const void *in, uint32_t in_stride, Groups g, float *out, uint32_t out_stride, int tpp,
                    NextMat nx, bool ready)
{
    extern __shared__ __align__(16) uint8_t smem[];
    float4 *red = reinterpret_cast<float4 *>(smem);
    uint8_t *xs = smem + red_bytes(NW);
    const uint32_t xstride = mma_col_stride(W.cols);
    if (EARLY) {
        stage_cols<R, IN_BF16, kStageUnroll<NW>>(in, in_stride, [](int) { return 0; }, 0, 1, W.cols, xs, xstride);
    }
    const int gi = blockIdx.y;
    const uint32_t p0 = blockIdx.x * (GLU ? 8 : 16);
    if (ready && gi < *g.n) prefetch_tile<R, GLU>(W, g.expert[gi], p0);
    // Under programmatic dependent launch: wait for the predecessor, then let the next launch start
    // (it reads what this one writes only after its own wait); both are no-ops in a plain launch.
    cudaGridDependencySynchronize();
    cudaTriggerProgrammaticLaunchCompletion();
    // What follows the wait is the CTA's critical path: one round trip for the group's table entries,
    // then the first weight loads, the divisor words and the prefetches issued back to back before any
    // result is used.
    const GroupEntry ge = group_entry(g, gi);
    if (gi >= ge.live) return;
    const int expert = ge.expert, start = ge.start, count = ge.count;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, gq = lane / 4, cq = lane % 4;
    const uint64_t ga = (uint64_t)expert * W.rows + tile_row<GLU>(W, p0, gq);
    const uint64_t gb = (uint64_t)expert * W.rows + tile_row<GLU>(W, p0, gq + 8);
    const typename R::Lane L = R::lane(W, ga, gb, cq);
    // the warp's contiguous share of the row's chunks
    const int nch = (int)(W.cols / R::kChunk), per = (nch + NW - 1) / NW;
    const int kb = warp * per, ke = min(nch, kb + per);
    typename R::Chunk ch[R::kBatch];
    load_batch<R>(L, kb, ke, ch); // in flight while the activations are staged
    const float div_a = R::divisor(W, ga), div_b = R::divisor(W, gb);
    if (!ready) prefetch_tile<R, GLU>(W, expert, p0);
    prefetch_expert(nx, (uint32_t)expert);
    const uint32_t out_rows = GLU ? W.rows / 2 : W.rows;
    const OutRows o{p0 + gq, p0 + gq + 8, p0 + gq < out_rows, !GLU && p0 + gq + 8 < out_rows};

    for (int t0 = 0; t0 < count; t0 += tpp) {
        const int nt = min(tpp, count - t0), ncol = IN_BF16 ? nt : 2 * nt;
        if (t0 > 0) load_batch<R>(L, kb, ke, ch);
        if (!EARLY) {
            __syncthreads(); // the previous pass's readers are done with xs and red
            stage_cols<R, IN_BF16, kStageUnroll<NW>>(in, in_stride, [&](int pos) { return input_row(g, pos); },
                                                 start + t0, nt, W.cols, xs, xstride);
        }
        __syncthreads();
        // columns past the pass's tokens read the last staged one: their D columns are not stored
        const uint8_t *xl = xs + (size_t)min(gq, ncol - 1) * xstride + 16 * cq;
        float d[4] = {0.f, 0.f, 0.f, 0.f};
        warp_dot<R>(L, kb, ke, ch, xl, d);
        if (reduce_warps<NW>(red, d))
            store_tile<GLU, IN_BF16>(d, o, R::factor_of(div_a), R::factor_of(div_b), out, out_stride, start, t0, nt);
    }
}

using MmaKernel = void (*)(DevMat, const void *, uint32_t, Groups, float *, uint32_t, int, NextMat, bool);

// What a launch's kernel is specialised for besides the row format and the warps.
struct Form {
    bool glu, in_bf16, early;
};

template <class R, int NW, bool GLU, bool IN_BF16>
MmaKernel pick_early(bool early)
{
    return early ? gemv_mma_kernel<R, NW, GLU, IN_BF16, true> : gemv_mma_kernel<R, NW, GLU, IN_BF16, false>;
}

template <class R, int NW>
MmaKernel pick_form(const Form &f)
{
    return f.glu ? (f.in_bf16 ? pick_early<R, NW, true, true>(f.early) : pick_early<R, NW, true, false>(f.early))
                 : (f.in_bf16 ? pick_early<R, NW, false, true>(f.early) : pick_early<R, NW, false, false>(f.early));
}

template <class R>
MmaKernel pick(int nw, const Form &f)
{
    return nw == 16 ? pick_form<R, 16>(f) : nw == 8 ? pick_form<R, 8>(f) : pick_form<R, 4>(f);
}

// Shared memory of an nw-warp CTA with a pass of ncol staged columns.
size_t stage_bytes(int nw, uint32_t cols, uint32_t ncol)
{
    return red_bytes(nw) + (size_t)ncol * mma_col_stride(cols);
}

template <class R>
bool supported(const DevMat &W)
{
    return W.cols % R::kChunk == 0 && W.cols <= kMaxCols && W.rows >= 1 && R::admits(W) &&
           stage_bytes(4, W.cols, 2) <= smem_optin_limit(); // one f32 token (hi and lo) must fit
}

// CTAs of kernel k (nw warps, smem bytes of shared memory) an SM holds at once; 0 when unknown.
int resident_ctas(MmaKernel k, int nw, size_t smem)
{
    int n = 0;
    if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, nw * 32, smem) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

// The warps a CTA splits K over (file comment, "Work split"): the widest of 16 and 8 that leaves every
// warp kMinWarpChunks chunks and whose grid of `ctas` CTAs the device holds all at once (one wave);
// else 4. ncol: the staged columns of a pass.
template <class R>
int pick_warps(const Form &f, uint64_t ctas, uint32_t cols, uint32_t ncol)
{
    const uint64_t sms = (uint64_t)sm_count();
    for (int nw = 16; nw > 4; nw /= 2) {
        const size_t smem = stage_bytes(nw, cols, ncol);
        // no SM of the targets holds more than 64 warps: larger grids skip the occupancy query
        if (cols / R::kChunk < (uint32_t)(nw * kMinWarpChunks) || ctas > sms * (64 / nw) || smem > smem_optin_limit())
            continue;
        if (ctas <= sms * (uint64_t)resident_ctas(pick<R>(nw, f), nw, smem)) return nw;
    }
    return 4;
}

// Tokens per pass: what the 8 B columns hold, no more than a group can have, nor the device's shared
// memory at 4 warps (supported() guarantees one). cpt: staged columns a token.
int tokens_per_pass(uint32_t cols, bool in_bf16, uint32_t max_tokens)
{
    const uint32_t per_pass = in_bf16 ? kCols : kCols / 2, cpt = in_bf16 ? 1 : 2;
    int tpp = (int)(max_tokens < 1 ? 1 : max_tokens < per_pass ? max_tokens : per_pass);
    while (tpp > 1 && stage_bytes(4, cols, cpt * tpp) > smem_optin_limit()) tpp--;
    return tpp;
}

// A launch's shape: its kernel (form, warps), grid, tokens per pass and shared memory.
struct Plan {
    Form f;
    int nw, tpp;
    uint32_t tiles;
    size_t smem;
};

// max_groups: the grid's group slots; early: the caller's rows_are_x0.
template <class R>
Plan plan(bool glu, const DevMat &W, bool in_bf16, uint32_t max_groups, uint32_t max_tokens, bool early)
{
    Plan p;
    const uint32_t out_rows = glu ? W.rows / 2 : W.rows, tile = glu ? 8 : 16;
    p.tiles = (out_rows + tile - 1) / tile;
    p.tpp = tokens_per_pass(W.cols, in_bf16, max_tokens);
    const uint32_t ncol = (in_bf16 ? 1 : 2) * (uint32_t)p.tpp;
    // EARLY staging needs every position's input row to be row 0 (the caller says so)
    p.f = Form{glu, in_bf16, early && max_tokens == 1};
    p.nw = pick_warps<R>(p.f, (uint64_t)p.tiles * max_groups, W.cols, ncol);
    p.smem = stage_bytes(p.nw, W.cols, ncol);
    return p;
}

// Whether a launch of plan p streams instead (gemv_stream.cu): one token of one group against bf16 rows
// whose 4-warp grid is more than one wave (the LM head).
template <class R>
bool streams(bool glu, const DevMat &W, bool in_bf16, uint32_t max_groups, uint32_t max_tokens, const Plan &p)
{
    if (!std::is_same<R, Bf16Rows>::value || glu || !in_bf16 || max_groups != 1 || max_tokens != 1 || p.nw != 4 ||
        !gemv_stream_supported(2, W))
        return false;
    return p.tiles > (uint64_t)sm_count() * (uint64_t)resident_ctas(pick<R>(4, p.f), 4, p.smem);
}

template <class R>
cudaError_t launch(bool glu, const DevMat &W, const void *in, bool in_bf16, uint32_t in_stride, const Groups &g,
                   float *out, uint32_t out_stride, uint32_t max_tokens, const GemvLaunch &opt, cudaStream_t s)
{
    if (!supported<R>(W)) return cudaErrorInvalidValue;
    const Plan p = plan<R>(glu, W, in_bf16, g.max_groups, max_tokens, opt.rows_are_x0);
    if (streams<R>(glu, W, in_bf16, g.max_groups, max_tokens, p))
        return launch_gemv_stream(W, (const uint16_t *)in, in_stride, g, out, out_stride, opt, s);
    const MmaKernel k = pick<R>(p.nw, p.f);
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)p.smem);
    if (e != cudaSuccess) return e;
    return launch_pdl(k, dim3(p.tiles, g.max_groups), dim3(p.nw * 32), p.smem, opt.pdl, s, W, in, in_stride, g, out,
                      out_stride, p.tpp, opt.next, opt.groups_ready);
}

template <class R>
int warps_of(bool glu, const DevMat &W, bool in_bf16, uint32_t max_groups, uint32_t max_tokens, bool rows_are_x0)
{
    if (!supported<R>(W)) return 0;
    const Plan p = plan<R>(glu, W, in_bf16, max_groups, max_tokens, rows_are_x0);
    return streams<R>(glu, W, in_bf16, max_groups, max_tokens, p) ? -1 : p.nw;
}

} // namespace

bool gemv_mma_supported(int codec, const DevMat &W)
{
    switch (codec) {
    case 2 /* NF_CODEC_BF16 */: return supported<Bf16Rows>(W);
    case 11 /* NF_CODEC_NVFP4 */: return supported<Fp4Rows>(W);
    default: return false;
    }
}

cudaError_t launch_gemv_mma(int codec, bool glu, const DevMat &W, const void *in, bool in_bf16, uint32_t in_stride,
                            const Groups &g, float *out, uint32_t out_stride, uint32_t max_tokens,
                            const GemvLaunch &opt, cudaStream_t s)
{
    switch (codec) {
    case 2: return launch<Bf16Rows>(glu, W, in, in_bf16, in_stride, g, out, out_stride, max_tokens, opt, s);
    case 11: return launch<Fp4Rows>(glu, W, in, in_bf16, in_stride, g, out, out_stride, max_tokens, opt, s);
    default: return cudaErrorInvalidValue;
    }
}

int gemv_mma_warps(int codec, bool glu, const DevMat &W, bool in_bf16, uint32_t max_groups, uint32_t max_tokens,
                   bool rows_are_x0)
{
    switch (codec) {
    case 2: return warps_of<Bf16Rows>(glu, W, in_bf16, max_groups, max_tokens, rows_are_x0);
    case 11: return warps_of<Fp4Rows>(glu, W, in_bf16, max_groups, max_tokens, rows_are_x0);
    default: return 0;
    }
}

} // namespace nf
