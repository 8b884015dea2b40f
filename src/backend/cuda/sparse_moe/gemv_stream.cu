// The streaming GEMV: one token against a bf16 matrix too large for one wave of gemv_mma.cu's CTAs
// (the LM head of a decode step: 151936 x 2048, 622 MB). Same contract as launch_gemv_mma with one
// group and one token (internal.cuh).
//
// Why: gemv_mma.cu's 4-warp form gives that matrix 9496 CTAs of 16 rows, ~14 waves; each CTA stages
// x, prefetches its tile into L1, reads it through registers, reduces across its warps and leaves,
// and the SM's bytes in flight are what its resident warps have asked for. ncu put it at 3.6 TB/s
// (173 us) against the 4.4 - 4.6 TB/s the device reads. Here a CTA an SM stays resident and walks its
// tiles, and the weights come into shared memory by bulk copies (the tensor memory accelerator): the
// bytes in flight are the ring's, not the warps', and x is staged once a CTA.
//
// A CTA: warp kConsumers is the producer (one lane issues the copies), warps 0 .. kConsumers - 1
// consume. A unit is one K slice of one of the CTA's 16-row tiles (tile i: rows 16 (blockIdx.x + i
// gridDim.x) ..): 16 rows x up to kSliceCols columns, 16 bulk copies (one a row) into a stage of the
// ring, rows kPitch bytes apart. Units go through the ring in order; `full[q]` completes when a unit's
// bytes have landed, `empty[q]` when every consumer warp has read its share of them. Every consumer
// warp takes every unit, in order (a share of its chunks), so a warp waits on a stage's use n only
// after it has seen use n - 1 complete: the parity waits cannot mistake one use for another (with a
// tile a warp, a warp would wait on uses two ahead, which a parity cannot tell apart: measured, it
// hung). At a tile's end the warps' sums meet in warp 0 in a fixed order, so the outputs are
// bit-identical run to run. Under programmatic dependent launch the weights do not depend on the
// predecessor, so when the group tables are ready the producer fills the ring before the
// grid-dependency wait.
//
// The MMA side is gemv_mma.cu's for bf16 rows (mma_rows.cuh, Bf16Rows): chunks of 64 elements, lane
// (g, c) reading 2 x 16 bytes of rows g and g + 8 a chunk, exact bf16 products, f32 sums; x staged as
// the B column. kPitch is 64 bytes past a multiple of 128, so rows g and g + 1 (the two rows of a
// quarter-warp's 16-byte loads) fall on opposite halves of the banks.
#include "internal.cuh"
#include "mma_rows.cuh"
#include "rowdot.cuh"
#include "wgmma.cuh"

namespace nf {

namespace {

constexpr int kConsumers = 4;
constexpr int kThreads = (kConsumers + 1) * 32;
constexpr uint32_t kSliceCols = 1024;                         // a unit's columns: 2 KB of a bf16 row
constexpr uint32_t kPitch = 2 * kSliceCols + kMmaColPad;     // bytes between a stage's rows
constexpr uint32_t kStageBytes = 16 * kPitch;                 // 33 KB
constexpr int kMaxStages = 8;
// Token 0's sums of a tile's rows g and g + 8 from consumer warps 1.., two tiles' worth (consume).
using Red = float2[2][kConsumers - 1][8];
constexpr uint32_t kHeadBytes = 2 * kMaxStages * sizeof(uint64_t) + sizeof(Red); // barriers, Red

NF_HD uint32_t round128(uint32_t n) { return (n + 127) & ~127u; }

// Shared memory: the barriers, Red, the staged x, then the ring.
NF_HD uint32_t ring_offset(uint32_t cols) { return round128(kHeadBytes) + round128(mma_col_stride(cols)); }

// What the producer and the consumers of a CTA agree on.
struct Walk {
    DevMat W;
    uint8_t *ring;
    uint64_t *full, *empty;
    int stages;
    uint32_t slices; // units a tile
    uint32_t units;  // the CTA's: its tiles x slices
};

__device__ __forceinline__ uint32_t slice_cols(const DevMat &W, uint32_t s) { return min(kSliceCols, W.cols - s * kSliceCols); }

// Unit u of the CTA into its stage: 16 rows (the tile's last rows clamp into the matrix; their
// outputs are not stored), one bulk copy a row.
__device__ __forceinline__ void issue(const Walk &w, int expert, uint32_t u)
{
    const uint32_t i = u / w.slices, s = u % w.slices, q = u % (uint32_t)w.stages;
    const uint32_t p0 = 16 * (blockIdx.x + i * gridDim.x), bytes = 2 * slice_cols(w.W, s);
    uint8_t *st = w.ring + (size_t)q * kStageBytes;
    mbar_expect_tx(&w.full[q], 16 * bytes);
    for (uint32_t r = 0; r < 16; r++)
        bulk_g2s(st + r * kPitch, row_ptr(w.W, (uint32_t)expert, min(p0 + r, w.W.rows - 1)) + 2 * s * kSliceCols, bytes,
                 &w.full[q]);
}

// The producer lane: units from .. units - 1, each once its stage's previous unit has been read.
__device__ void produce(const Walk &w, int expert, uint32_t from)
{
    for (uint32_t u = from; u < w.units; u++) {
        const uint32_t n = u / (uint32_t)w.stages; // the stage's use
        if (n > 0) mbar_wait(&w.empty[u % (uint32_t)w.stages], (n - 1) & 1);
        issue(w, expert, u);
    }
}

// The warp's chunks of one unit (k = warp, warp + kConsumers, .. < nk) against the staged x (xl: the
// lane's 16 bytes of the unit's first chunk in the column), the next chunk's loads issued before the
// current one's MMAs.
__device__ __forceinline__ void unit_dot(const uint8_t *st, uint32_t nk, const uint8_t *xl, float (&d)[4], float (&d1)[4])
{
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const uint32_t k0 = threadIdx.x / 32;
    if (k0 >= nk) return;
    const Bf16Rows::Lane L{st + g * kPitch + 16 * c, st + (g + 8) * kPitch + 16 * c};
    Bf16Rows::Chunk ch = Bf16Rows::load(L, (int)k0);
    for (uint32_t k = k0; k < nk; k += kConsumers) {
        Bf16Rows::Chunk next = ch;
        if (k + kConsumers < nk) next = Bf16Rows::load(L, (int)(k + kConsumers));
        mma_chunk<Bf16Rows>(ch, xl + (size_t)k * 128, d, d1);
        ch = next;
    }
}

// The consumer warps' barrier (named barrier 1).
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers * 32) : "memory"); }

// The consumer warps: every unit of the CTA in order, each warp a share of its chunks; at a tile's
// end warps 1.. hand their sums of token 0's column (D rows g and g + 8 of the lanes c = 0) to warp
// 0 through red (two buffers, by tile parity, so one barrier a tile suffices), which adds them in
// warp order and stores.
__device__ void consume(const Walk &w, const uint8_t *xs, Red &red, float *out)
{
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4;
    const uint32_t tiles = w.units / w.slices;
    for (uint32_t i = 0; i < tiles; i++) {
        float d[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
        for (uint32_t s = 0; s < w.slices; s++) {
            const uint32_t u = i * w.slices + s, q = u % (uint32_t)w.stages;
            mbar_wait(&w.full[q], (u / (uint32_t)w.stages) & 1);
            unit_dot(w.ring + (size_t)q * kStageBytes, slice_cols(w.W, s) / 64,
                     xs + 16 * (lane % 4) + (size_t)s * kSliceCols * 2, d, d1);
            __syncwarp(); // every lane's reads of the stage are done
            if (lane == 0) mbar_arrive(&w.empty[q]);
        }
        float2 v = make_float2(d[0] + d1[0], d[2] + d1[2]);
        if (warp > 0 && lane % 4 == 0) red[i & 1][warp - 1][g] = v;
        consumers_sync();
        if (warp > 0 || lane % 4) continue;
#pragma unroll
        for (int j = 0; j < kConsumers - 1; j++) v.x += red[i & 1][j][g].x, v.y += red[i & 1][j][g].y;
        const uint32_t r = 16 * (blockIdx.x + i * gridDim.x) + g;
        if (r < w.W.rows) out[r] = v.x;
        if (r + 8 < w.W.rows) out[r + 8] = v.y;
    }
}

// grid: a CTA an SM at most (the ring takes the shared memory), each walking tiles blockIdx.x,
// blockIdx.x + gridDim.x, ..; kThreads threads. One group (g's slot 0) of at most one token.
__global__ void __launch_bounds__(kThreads, 1)
    gemv_stream_kernel(DevMat W, const uint16_t *in, uint32_t in_stride, Groups g, float *out, uint32_t out_stride,
                       int stages, NextMat nx, bool ready)
{
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t tiles = (W.rows + 15) / 16, slices = (W.cols + kSliceCols - 1) / kSliceCols;
    const uint32_t mine = blockIdx.x < tiles ? (tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    uint64_t *bars = reinterpret_cast<uint64_t *>(smem);
    const Walk w{W, smem + ring_offset(W.cols), bars, bars + kMaxStages, stages, slices, mine * slices};
    Red &red = *reinterpret_cast<Red *>(bars + 2 * kMaxStages);
    uint8_t *xs = smem + round128(kHeadBytes);
    const bool producer = threadIdx.x / 32 == kConsumers && threadIdx.x % 32 == 0;
    if (threadIdx.x == 0) {
        for (int q = 0; q < stages; q++) mbar_init(&w.full[q], 1), mbar_init(&w.empty[q], kConsumers);
        fence_mbar_init();
    }
    __syncthreads();
    const uint32_t first = min(w.units, (uint32_t)stages); // units issued before any stage is reused
    GroupEntry ge{0, 0, 0, 0};
    auto start = [&] { // the group entry, and the producer's first units of the ring
        ge = group_entry(g, 0);
        if (producer && ge.live > 0 && ge.count > 0)
            for (uint32_t u = 0; u < first; u++) issue(w, ge.expert, u);
    };
    if (ready) start(); // the tables predate this launch: fill the ring before the wait
    cudaGridDependencySynchronize();
    cudaTriggerProgrammaticLaunchCompletion();
    if (!ready) start();
    if (ge.live <= 0 || ge.count <= 0) return; // nothing was issued
    stage_cols<Bf16Rows, true, 2>(in, in_stride, [&](int pos) { return input_row(g, pos); }, ge.start, 1, W.cols, xs,
                                  mma_col_stride(W.cols));
    prefetch_expert(nx, (uint32_t)ge.expert);
    __syncthreads();
    if (threadIdx.x / 32 == kConsumers) {
        if (producer) produce(w, ge.expert, first);
        return;
    }
    consume(w, xs, red, out + (size_t)ge.start * out_stride);
}

// Stages of the ring that fit beside x in the device's shared memory (0: fewer than 2).
int stages_of(uint32_t cols)
{
    const size_t room = smem_optin_limit(), fixed = ring_offset(cols);
    const int n = room > fixed ? (int)((room - fixed) / kStageBytes) : 0;
    return n < 2 ? 0 : n > kMaxStages ? kMaxStages : n;
}

} // namespace

bool gemv_stream_supported(int codec, const DevMat &W)
{
    return codec == 2 /* NF_CODEC_BF16 */ && W.cols % 64 == 0 && W.cols >= 64 && W.rows >= 1 && W.row_stride % 16 == 0 &&
           ((uintptr_t)W.data & 15) == 0 && W.row_stride >= 2ull * W.cols && stages_of(W.cols) > 0;
}

cudaError_t launch_gemv_stream(const DevMat &W, const uint16_t *in, uint32_t in_stride, const Groups &g, float *out,
                               uint32_t out_stride, const GemvLaunch &opt, cudaStream_t s)
{
    if (!gemv_stream_supported(2, W)) return cudaErrorInvalidValue;
    const int stages = stages_of(W.cols);
    const size_t smem = ring_offset(W.cols) + (size_t)stages * kStageBytes;
    cudaError_t e = cudaFuncSetAttribute(gemv_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    int per_sm = 0;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_stream_kernel, kThreads, smem);
    if (e != cudaSuccess) return e;
    const uint32_t tiles = (W.rows + 15) / 16, slots = (uint32_t)sm_count() * (uint32_t)(per_sm < 1 ? 1 : per_sm);
    return launch_pdl(gemv_stream_kernel, dim3(tiles < slots ? tiles : slots), dim3(kThreads), smem, opt.pdl, s, W, in,
                      in_stride, g, out, out_stride, stages, opt.next, opt.groups_ready);
}

} // namespace nf
