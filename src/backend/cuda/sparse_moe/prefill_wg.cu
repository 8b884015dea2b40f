// The prefill grouped GEMM on Hopper's warpgroup MMA (sm_90a) for bf16 and nvfp4 banks (W4A16):
// prefill.cu's tiles, tile list and epilogues, with the work split between warpgroups instead of
// done by every warp in turn.
//
// A CTA is three warpgroups. Warpgroup 0 produces the K slices of 128: A (BM positions of one
// expert's group, bf16, gathered by position) by cp.async; B (128 weight rows) by cp.async for bf16
// banks, and for nvfp4 banks as raw bytes (each row's 64 data bytes and the tile's scale lines, by
// coalesced cp.async, two slices ahead) that its threads decode from shared memory to bf16, one
// weight row a thread. (Decoding every codec from raw bytes held in registers measured 1.10 - 1.35x
// slower than prefill.cu's mma.sync kernel, the loads' latency exposed: branch wg-decode.)
// Warpgroups 1 and 2 consume: wgmma m64nNk16 from shared memory, fp32 accumulators in registers.
// With BM = 128 each takes 64 positions against all 128 rows (N = 128); with BM = 64 each takes the
// 64 positions against 64 of the rows. Tile lists of height 32 run on the BM = 64 kernel with the
// upper 32 rows zero: for one bank every height then takes the same wgmma chain over K, so the height
// (chosen from T) changes no bit.
//
// Slices live in a ring of stages guarded by mbarriers: `full` (128 producer arrivals, each after the
// thread's copies for the slice landed and its stores were fenced for the async proxy) and `empty`
// (one arrival per consumer warp once the wgmma that read the stage has completed: a consumer holds
// one stage). The producer copies A (and bf16 B) kStages - 1 slices ahead, or one ahead when it
// decodes B (its decode of slice kk fills the stage of kk itself).
//
// Tiles: [rows][64] bf16 K-major in the 128-byte swizzle (wgmma.cuh), two K halves a slice.
// Raster: blockIdx.x is the weight tile, blockIdx.y the position tile, so the CTAs in flight share
// their A rows (read once from DRAM) and walk few experts' weights at a time.
//
// nvfp4 weights are decoded without their divisor as e2m1 * e4m3 * 2^-8 (exact in bf16: fp4_mma.cuh)
// and each output column is scaled by 2^8 / its row's divisor in the epilogue: every product is
// exact and only the fp32 accumulation rounds, as in prefill.cu.

#include <math.h>
#include <string.h>

#include <type_traits>

#include "a4.cuh"
#include "fp4_mma.cuh"
#include "internal.cuh"
#include "rowdot.cuh"
#include "tmap.cuh"
#include "wgmma.cuh"

// Passes for other targets (sm_120a) compile the kernel empty and never launch it (prefill_wg_usable),
// which leaves this file's helpers unreferenced there.
#ifndef NF_WGMMA
#pragma nv_diag_suppress declared_but_not_referenced
#endif

namespace nf {

namespace {

constexpr int BN = kPrefillTileN, BK = 128, kThreads = 384;
constexpr int kSubB = 128 * 128; // one K half of B: 128 rows x 128 bytes

// An nvfp4 slice's raw bytes: 128 rows x 64 data bytes (chunk q of row r at chunk q ^ (r / 2 % 4),
// so a warp's 16-byte reads of one chunk hit 8 bank groups), then two scale regions of 1 KiB (the
// two 512-byte scale tiles of the slice's 8 scale columns for one 128-row group: gate/up needs the
// gate rows' group and the up rows' group, down one group).
constexpr int kRawData = 128 * 64, kRawBytes = kRawData + 2048, kRawSlots = 3;

template <int BM>
struct WgShape {
    static_assert(BM == 64 || BM == 128, "wgmma tile heights: 64, 128");
    static constexpr int kABytes = BM * BK * 2, kBBytes = BN * BK * 2, kStage = kABytes + kBBytes;
    static constexpr int kStages = BM == 128 ? 3 : 4;      // 192 KiB either way: one CTA an SM
    static constexpr int kRing = kStages * kStage;
    static constexpr int kSmem = kRing + kRawSlots * kRawBytes + 1024; // + alignment of the ring to 1024
    static constexpr int WN = BM == 128 ? 128 : 64;       // a consumer warpgroup's columns
    static constexpr int NACC = WN / 2;                   // its accumulators a thread
};

// A producer thread's share of a tile's A copies, its sources found once a tile: chunk tid % kPerRow
// (16 bytes) of tile rows (tid + 128 i) / kPerRow, i < kChunks (the kPerRow threads of a row read its
// kPerRow * 16 contiguous bytes of a slice). Per slice and chunk that had been a shared load of the
// position, a 64-bit multiply and the adds before each copy, in the producer warpgroup that bounds
// the nvfp4 tiles; a slice further is now a constant step. Rows past `count` are zero-filled.
// kRows: the tile's rows (positions); kPerRow: 16 for slices of 128 (the 128- and 64-row tiles), 8
// for slices of 64 (the wide tile).
template <int kRows, int kPerRow>
struct ChunkSrc {
    static constexpr int kChunks = kRows * kPerRow / 128;
    const uint8_t *src[kChunks]; // the chunk's bytes in slice 0 (position 0's row for a dead position)
    uint32_t live;               // bit i: chunk i's position is in the tile (else the copy zero-fills)
    __device__ ChunkSrc(const uint16_t *in, uint32_t in_stride, const int32_t *rows, int count, int tid)
    {
        live = 0;
#pragma unroll
        for (int i = 0; i < kChunks; i++) {
            const int r = (int)(((unsigned)tid + i * 128) / kPerRow);
            live |= (uint32_t)(r < count) << i;
            src[i] = (const uint8_t *)(in + (size_t)(r < count ? rows[r] : 0) * in_stride) + (unsigned)tid % kPerRow * 16;
        }
    }
    // slice j's chunks into a [kRows][64]-per-K-half swizzled tile
    __device__ __forceinline__ void copy(uint8_t *tile, int j, int tid) const
    {
        const int c = (int)((unsigned)tid % kPerRow);
#pragma unroll
        for (int i = 0; i < kChunks; i++) {
            const int r = (int)(((unsigned)tid + i * 128) / kPerRow);
            cp_async16(smem_u32(tile + (c >> 3) * kRows * 128 + sw128(r, (c & 7) * 8)), src[i] + j * (kPerRow * 16),
                       (live >> i) & 1 ? 16 : 0);
        }
    }
};

// B of the 128- and 64-row tiles for a bf16 bank: 128 weight rows, 16 chunks a row. Thread tid copies
// chunk tid % 16 of B rows tid / 16 + 8 i, which are weight rows a constant step apart (prefill_b_row:
// 4 for gate/up, 8 for a plain matrix), so one source and the step serve every chunk of every slice.
template <bool GLU>
struct BSrc {
    const uint8_t *src; // chunk 0's bytes in slice 0
    uint64_t step;      // bytes between chunk i and i + 1
    __device__ BSrc(const DevMat &W, int expert, int tid)
        : src(row_ptr(W, (uint32_t)expert, prefill_b_row<GLU>(W, blockIdx.x, tid >> 4)) + (tid & 15) * 16),
          step((uint64_t)(GLU ? 4 : 8) * W.row_stride)
    {
    }
    __device__ __forceinline__ void copy(uint8_t *sb, int kk, int tid) const
    {
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const int c = tid + i * 128;
            cp_async16(smem_u32(sb + ((c & 15) >> 3) * BN * 128 + sw128(c >> 4, (c & 7) * 8)), src + i * step + kk * (BK * 2),
                       16);
        }
    }
};

// An nvfp4 slice's raw bytes into a raw slot: 4 data chunks a producer thread (chunk tid % 4 of B rows
// tid / 4 + 32 i: the 4 threads of a row read its 64 contiguous bytes; the rows are weight rows a
// constant step apart, 16 for gate/up and 32 for a plain matrix, as BSrc's), and one 16-byte chunk of
// the scale regions (64 a region; region g's first stacked row is B row g's: the first gate (or down)
// row, or the first up row). Sources found once a tile; a slice further is 64 data bytes and two
// 512-byte scale tiles.
template <bool GLU>
struct RawSrc {
    const uint8_t *data, *scale; // slice 0's: data chunk 0; the scale chunk (NULL: none for this thread)
    uint64_t step;
    __device__ RawSrc(const DevMat &W, int expert, int tid)
    {
        const uint64_t m = (uint64_t)expert * W.rows;
        data = W.data + (m + prefill_b_row<GLU>(W, blockIdx.x, tid >> 2)) * W.row_stride + (tid & 3) * 16;
        step = (uint64_t)(GLU ? 16 : 32) * W.row_stride;
        const int g = tid >> 6;
        scale = GLU || g == 0 ? W.scales + ((m + prefill_b_row<GLU>(W, blockIdx.x, g)) >> 7) * W.kt * 512 + (tid & 63) * 16
                              : nullptr;
    }
    __device__ __forceinline__ void copy(uint8_t *slot, int kk, int tid) const
    {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int c = tid + i * 128, r = c >> 2, q = c & 3;
            cp_async16(smem_u32(slot + r * 64 + ((q ^ ((r >> 1) & 3)) << 4)), data + i * step + kk * 64, 16);
        }
        if (scale) cp_async16(smem_u32(slot + kRawData + (tid >> 6) * 1024 + (tid & 63) * 16), scale + kk * 1024, 16);
    }
};

// One nvfp4 block of 16 (words w0: elements 0-7, w1: 8-15; scale s2 from fp4_scale2) decoded to bf16
// (e2m1 * e4m3 * 2^-8, fp4_pair's exact form) in element order into row r, elements k0 .. k0 + 15,
// of a [rows][64] swizzled tile.
__device__ __forceinline__ void fp4_block16(uint32_t w0, uint32_t w1, uint32_t s2, uint8_t *tile, int r, int k0)
{
    const uint32_t w[2] = {w0, w1};
    uint32_t p[8];
#pragma unroll
    for (int v = 0; v < 2; v++) {
        // low nibbles (even elements) and high nibbles (odd) of the word's bytes, then bytes
        // regrouped so that fp4_pair's nibble pairs (bit 4Q, 4Q + 16) are elements (2i, 2i + 1)
        const uint32_t lo = w[v] & 0x0F0F0F0Fu, hi = (w[v] >> 4) & 0x0F0F0F0Fu;
        const uint32_t x0 = __byte_perm(lo, hi, 0x5410), x1 = __byte_perm(lo, hi, 0x7632);
        p[4 * v + 0] = fp4_pair<0>(x0, s2);
        p[4 * v + 1] = fp4_pair<2>(x0, s2);
        p[4 * v + 2] = fp4_pair<0>(x1, s2);
        p[4 * v + 3] = fp4_pair<2>(x1, s2);
    }
    *reinterpret_cast<uint4 *>(tile + sw128(r, k0)) = make_uint4(p[0], p[1], p[2], p[3]);
    *reinterpret_cast<uint4 *>(tile + sw128(r, k0 + 8)) = make_uint4(p[4], p[5], p[6], p[7]);
}

// The slot offset of B row r's scale words (its region; byte (m % 32) * 16 + (m % 128 / 32) * 4 for
// stacked row m), the same in every slice of a tile.
template <bool GLU>
__device__ __forceinline__ uint32_t raw_scale_at(const DevMat &W, int expert, int r)
{
    const uint64_t m = (uint64_t)expert * W.rows + prefill_b_row<GLU>(W, blockIdx.x, r);
    return kRawData + (GLU ? (r & 1) * 1024 : 0) + (uint32_t)(m & 31) * 16 + (uint32_t)((m & 127) >> 5) * 4;
}

// Producer thread r's weight row of the slot: its 8 blocks of 16 decoded to bf16 (e2m1 * e4m3 *
// 2^-8, fp4_pair's exact form, in element order) into row r of the stage's B tile; its scale words
// at slot offset sc_at (raw_scale_at).
__device__ __forceinline__ void decode_nvfp4(const uint8_t *slot, uint8_t *sb, int r, uint32_t sc_at)
{
    const uint8_t *sc = slot + sc_at;
    const uint32_t s4[2] = {*reinterpret_cast<const uint32_t *>(sc), *reinterpret_cast<const uint32_t *>(sc + 512)};
#pragma unroll
    for (int j = 0; j < 4; j++) { // data chunk j: blocks 2j and 2j + 1
        const uint4 d = *reinterpret_cast<const uint4 *>(slot + r * 64 + ((j ^ ((r >> 1) & 3)) << 4));
        const uint32_t w[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
        for (int h = 0; h < 2; h++) { // block 2j + h: words w[2h] (elements 0-7), w[2h + 1] (8-15)
            const int b = 2 * j + h;
            fp4_block16(w[2 * h], w[2 * h + 1], fp4_scale2((s4[b >> 2] >> (8 * (b & 3))) & 0xFF),
                        sb + (b >> 2) * kSubB, r, (b & 3) * 16);
        }
    }
}

// The producer warpgroup's barrier (named barrier 1, its 128 threads).
__device__ __forceinline__ void producer_sync() { asm volatile("bar.sync 1, 128;\n" ::: "memory"); }

// The producer warpgroup (threads 0..127): slices 0 .. nk-1 into the ring. Copy groups are committed
// in a fixed order (empty groups included) so that one wait count covers every slice: with raw
// slices the groups go A(kk + 1), raw(kk + 2) a slice; without, A/B(kk + kStages - 1).
template <class C, bool GLU, int BM>
__device__ __forceinline__ void produce(uint8_t *ring, uint8_t *raw, uint64_t *full, uint64_t *empty, const DevMat &W,
                                        const uint16_t *in, uint32_t in_stride, const int32_t *rows, int count,
                                        int expert, int nk)
{
    using S = WgShape<BM>;
    constexpr bool kRaw = std::is_same<C, CNVFP4Raw>::value;
    constexpr int kAhead = kRaw ? 1 : S::kStages - 1; // how many slices ahead A (and bf16 B) is copied
    const int tid = threadIdx.x;
    const ChunkSrc<BM, 16> a(in, in_stride, rows, count, tid);
    const BSrc<GLU> b(W, expert, tid);
    auto copy = [&](int j) { // A (and bf16 B) of slice j into its stage, once that stage is free
        if (j < nk) {
            const int s = j % S::kStages;
            if (j >= S::kStages) mbar_wait(&empty[s], (j / S::kStages - 1) & 1);
            a.copy(ring + s * S::kStage, j, tid);
            if constexpr (!kRaw) b.copy(ring + s * S::kStage + S::kABytes, j, tid);
        }
        cp_async_commit();
    };
    const RawSrc<GLU> rs(W, expert, tid);
    const uint32_t sc_at = kRaw ? raw_scale_at<GLU>(W, expert, tid) : 0;
    auto copy_raw = [&](int j) {
        if (j < nk) rs.copy(raw + (j % kRawSlots) * kRawBytes, j, tid);
        cp_async_commit();
    };
    for (int j = 0; j < kAhead; j++) copy(j);
    if constexpr (kRaw) copy_raw(0), copy_raw(1);
    for (int kk = 0; kk < nk; kk++) {
        const int s = kk % S::kStages;
        // slice kk's copies (and its raw bytes) have landed: the newer groups may still fly
        if constexpr (kRaw) {
            cp_async_wait<1>();
            producer_sync(); // every thread's raw copies of kk visible; every thread done decoding kk - 1
            copy(kk + 1);
            copy_raw(kk + 2); // into the slot of kk - 1
            decode_nvfp4(raw + (kk % kRawSlots) * kRawBytes, ring + s * S::kStage + S::kABytes, tid, sc_at);
            fence_proxy_async();
            mbar_arrive(&full[s]);
        } else { // publish first: copy() may wait for the consumers to free a stage
            cp_async_wait<kAhead - 1>();
            fence_proxy_async();
            mbar_arrive(&full[s]);
            copy(kk + kAhead);
        }
    }
}

template <class C, bool GLU, int BM>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_wg_kernel(DevMat W, const uint16_t *in, uint32_t in_stride, Groups g, const int32_t *n_tiles,
                      const int32_t *tile_group, const int32_t *tile_m0, int height, void *out, uint32_t out_stride, bool y16)
{
#ifdef NF_WGMMA
    using S = WgShape<BM>;
    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t full[S::kStages], empty[S::kStages];
    __shared__ int32_t rows[BM];
    const int tile = blockIdx.y;
    if (tile >= *n_tiles) return;
    const TileRows t = tile_rows<BM>(g, tile_group, tile_m0, tile, height, rows);
    const int expert = t.expert, start = t.start, count = t.count;
    if (threadIdx.x < S::kStages) {
        mbar_init(&full[threadIdx.x], 128);
        mbar_init(&empty[threadIdx.x], 8);
    }
    __syncthreads();
    uint8_t *ring = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    const int nk = (int)W.cols / BK;
    if (threadIdx.x < 128) {
        produce<C, GLU, BM>(ring, ring + S::kRing, full, empty, W, in, in_stride, rows, count, expert, nk);
        return;
    }

    const int wg = threadIdx.x / 128 - 1, q = (threadIdx.x / 32) & 3, lane = threadIdx.x & 31;
    const int a_row0 = BM == 128 ? 64 * wg : 0, b_row0 = BM == 128 ? 0 : 64 * wg;
    float acc[S::NACC];
#pragma unroll
    for (int i = 0; i < S::NACC; i++) acc[i] = 0.0f;
    const bool busy = BM == 64 || a_row0 < count; // as wide_consume's: no wgmma for a warpgroup without positions
    for (int kk = 0; kk < nk; kk++) {
        const int s = kk % S::kStages;
        const uint32_t a_base = smem_u32(ring + s * S::kStage) + a_row0 * 128;
        const uint32_t b_base = smem_u32(ring + s * S::kStage + S::kABytes) + b_row0 * 128;
        mbar_wait(&full[s], (kk / S::kStages) & 1);
        if (busy) {
            wg_fence();
#pragma unroll
            for (int kh = 0; kh < 2; kh++)
#pragma unroll
                for (int k16 = 0; k16 < 4; k16++) {
                    const uint64_t da = wg_desc(a_base + kh * BM * 128 + k16 * 32),
                                   db = wg_desc(b_base + kh * kSubB + k16 * 32);
                    if constexpr (BM == 128) wg_mma_n128(acc, da, db);
                    else wg_mma_n64(acc, da, db);
                }
            wg_commit();
            // The stage goes back as soon as its wgmma completes (holding it one slice longer, so
            // that the next slice's wgmma is issued first, measured 0.95x on bf16 at T = 4096).
            wg_wait<0>();
        }
        if (lane == 0) mbar_arrive(&empty[s]);
    }
    if (!busy) return;

    // epilogue: thread rows a_row0 + 16 q + lane / 4 (+ 8), columns b_row0 + 8 j + 2 (lane % 4) (+ 1);
    // nvfp4 columns scaled by 2^8 / their row's divisor
    float s0[S::WN / 8], s1[S::WN / 8]; // the scales of the thread's two columns of column block j
    if constexpr (std::is_same<C, CNVFP4Raw>::value) {
        col_scales<GLU, S::WN / 8>(W, expert, blockIdx.x, b_row0, 0x1p-8f, s0, s1); // / 2^-8: exact
    } else {
#pragma unroll
        for (int j = 0; j < S::WN / 8; j++) s0[j] = s1[j] = 1.0f;
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = a_row0 + 16 * q + (lane >> 2) + 8 * h;
        if (r >= count) continue;
        const size_t pos = (size_t)start + r;
#pragma unroll
        for (int j = 0; j < S::WN / 8; j++) {
            const int col = b_row0 + 8 * j + 2 * (lane & 3);
            const float c0 = acc[4 * j + 2 * h] * s0[j], c1 = acc[4 * j + 2 * h + 1] * s1[j];
            if (GLU)
                ((uint16_t *)out)[pos * out_stride + blockIdx.x * (BN / 2) + col / 2] = f2bf(silu(c0) * c1);
            else
                store_plain2(out, pos * out_stride + blockIdx.x * BN + col, y16, c0, c1);
        }
    }
#endif
}

// ---- The wide tile: 128 positions x 256 weight rows (bf16 banks, tile height 128) -----------------
// The 128 x 128 tile moves (128 + 128) rows of a K step for 2 * 128 * 128 FLOPs; at T = 4096 it read
// 64 KiB a slice an SM at ~1.9 us a slice (236 TFLOP/s), bound by the bytes it asks of L2 and shared
// memory, not by the tensor cores. This tile moves (128 + 256) rows for twice the FLOPs (3/4 of the
// bytes a FLOP), each consumer warpgroup taking its 64 positions against all 256 rows (m64n256k16,
// 128 accumulators a thread). Slices are 64 deep (one 128-byte swizzle row a tile row): 48 KiB a stage,
// four stages. B rows 0..127 and 128..255 are each 128 contiguous weight rows (gate/up: the gate rows
// and the up rows of intermediate elements 128 bx ..; plain: rows 256 bx ..), so that each is one box
// of a bulk tensor copy, and a consumer thread's column blocks j and j + 16 hold gate and up of one
// element. Per output element the K chain (k16 steps in order into one fp32 accumulator) is the same
// as the 128 x 128 and 64-row tiles', so the tile changes no bit.
constexpr int kWideN = 256, kWideK = 64, kWideStages = 4;
constexpr int kWideA = 128 * 128, kWideB = kWideN * 128, kWideStage = kWideA + kWideB;
// nvfp4 banks: a slice's raw bytes (256 rows x 32 data bytes, chunk q of row r at q ^ (r / 4 % 2) so
// that 8 threads' 16-byte reads of their rows hit 8 bank groups; then the two 512-byte scale tiles of
// the slice's 4 scale columns, one per run of 128 rows), three slots: 220 KiB in all.
constexpr int kWideRawData = kWideN * 32, kWideRaw = kWideRawData + 1024, kWideSlots = 3;
constexpr int wide_smem(bool raw) { return kWideStages * kWideStage + (raw ? kWideSlots * kWideRaw : 0) + 1024; }

// B row r (0..255) of column block bx: its weight row.
template <bool GLU>
__device__ __forceinline__ uint32_t wide_b_row(const DevMat &W, int bx, int r)
{
    return GLU ? (uint32_t)(bx * 128 + (r & 127) + (r >> 7) * (int)(W.rows / 2)) : (uint32_t)(bx * kWideN + r);
}

#ifdef NF_WGMMA // the device helpers issue wgmma and bulk copies: sm_90a passes only
using WideA = ChunkSrc<128, 8>; // the wide tile's A: 128 positions, slices of 64

// The producer's copies of slice j: A by cp.async (WideA) and, with kTma (bf16), B by two bulk tensor
// copies issued by thread 0, whose arrival carries their bytes. (B by cp.async, 16 chunks a thread,
// measured 1182 against 1072 us for the bf16 layer at T = 4096.) nvfp4's producer decodes B itself.
template <bool GLU, bool kTma>
__device__ __forceinline__ void wide_copy(uint8_t *stage, uint64_t *full, const CUtensorMap *bmap, const DevMat &W,
                                          const WideA &a, int expert, int bx, int j, int tid)
{
    a.copy(stage, j, tid);
    if (kTma && tid == 0) {
        uint8_t *sb = stage + kWideA;
        const int y = expert * (int)W.rows;
        mbar_expect_tx(full, kWideB);
        tma_load_2d(smem_u32(sb), bmap, j * kWideK, y + (int)wide_b_row<GLU>(W, bx, 0), full);
        tma_load_2d(smem_u32(sb + 128 * 128), bmap, j * kWideK, y + (int)wide_b_row<GLU>(W, bx, 128), full);
    }
}

// The producer warpgroup: one tile's slices 0 .. nk-1 into the ring, kWideStages - 1 ahead (one
// cp.async group a slice, empty groups included, so that one wait count covers every slice). The
// ring runs on across a CTA's tiles: slice j of this tile is the CTA's slice base + j.
template <bool GLU>
__device__ __forceinline__ void wide_produce(uint8_t *ring, uint64_t *full, uint64_t *empty, const CUtensorMap *bmap,
                                             const DevMat &W, const uint16_t *in, uint32_t in_stride,
                                             const int32_t *rows, int count, int expert, int bx, int nk, int base)
{
    constexpr int kAhead = kWideStages - 1;
    const int tid = threadIdx.x;
    const WideA a(in, in_stride, rows, count, tid);
    auto copy = [&](int j) {
        if (j < nk) {
            const int jg = base + j, s = jg % kWideStages;
            if (jg >= kWideStages) mbar_wait(&empty[s], (jg / kWideStages - 1) & 1);
            wide_copy<GLU, true>(ring + s * kWideStage, &full[s], bmap, W, a, expert, bx, j, tid);
        }
        cp_async_commit();
    };
    for (int j = 0; j < kAhead; j++) copy(j);
    for (int kk = 0; kk < nk; kk++) { // publish first: copy() may wait for the consumers to free a stage
        cp_async_wait<kAhead - 1>();
        fence_proxy_async();
        mbar_arrive(&full[(base + kk) % kWideStages]);
        copy(kk + kAhead);
    }
}

// An nvfp4 slice's raw bytes into a raw slot: 4 data chunks a producer thread (the 2 threads of a row
// read its 32 contiguous bytes) and, for threads 0..63, one 16-byte chunk of the scale tiles. Each run
// of 128 B rows starts a 128-row scale group (wide_fits: W.rows / 2 and W.rows multiples of 128). The
// sources in slice 0 are found once a tile (as WideA's); slice kk is 32 data bytes and one 512-byte
// scale tile further.
struct WideRaw {
    const uint8_t *src[4], *scale;
    template <bool GLU>
    __device__ static WideRaw of(const DevMat &W, int expert, int bx, int tid)
    {
        WideRaw w;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int c = tid + i * 128, r = c >> 1, q = c & 1;
            w.src[i] = W.data + ((uint64_t)expert * W.rows + wide_b_row<GLU>(W, bx, r)) * W.row_stride + q * 16;
        }
        const int g = (tid >> 5) & 1, off = (tid & 31) * 16;
        const uint64_t m0 = (uint64_t)expert * W.rows + wide_b_row<GLU>(W, bx, 128 * g);
        w.scale = W.scales + (m0 >> 7) * W.kt * 512 + off;
        return w;
    }
};

__device__ __forceinline__ void wide_load_raw(uint8_t *slot, const WideRaw &w, int kk, int tid)
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int c = tid + i * 128, r = c >> 1, q = c & 1;
        cp_async16(smem_u32(slot + r * 32 + ((q ^ ((r >> 2) & 1)) << 4)), w.src[i] + kk * 32, 16);
    }
    if (tid < 64) cp_async16(smem_u32(slot + kWideRawData + tid * 16), w.scale + kk * 512, 16);
}

// B row r of the slot decoded into the stage's B tile: its 4 blocks of 16, scale bytes from its run's
// tile (row r % 128 of the group: byte (r % 32) * 16 + (r % 128 / 32) * 4 + block).
__device__ __forceinline__ void wide_decode_row(const uint8_t *slot, uint8_t *sb, int r)
{
    const uint32_t s4 = *reinterpret_cast<const uint32_t *>(slot + kWideRawData + (r >> 7) * 512 + (r & 31) * 16 +
                                                            ((r & 127) >> 5) * 4);
#pragma unroll
    for (int j = 0; j < 2; j++) { // data chunk j: blocks 2j and 2j + 1
        const uint4 d = *reinterpret_cast<const uint4 *>(slot + r * 32 + ((j ^ ((r >> 2) & 1)) << 4));
        fp4_block16(d.x, d.y, fp4_scale2((s4 >> (16 * j)) & 0xFF), sb, r, 32 * j);
        fp4_block16(d.z, d.w, fp4_scale2((s4 >> (16 * j + 8)) & 0xFF), sb, r, 32 * j + 16);
    }
}

// The producer for nvfp4 banks: A and raw bytes of slice j copied together (one cp.async group), two
// slices ahead, and its threads decode slice kk (rows tid and tid + 128) into the stage of kk itself,
// as produce() does for the 128-row tile. Ring and raw slots run on across the CTA's tiles (slice kk
// is the CTA's base + kk). Two ahead is the most the ring allows without the decode waiting for the
// consumers: A(kk + 2) needs the stage of kk - 2 back (four stages), and raw(kk + 2) the slot of kk - 1
// (three slots, 220 KiB with the ring). (A was one slice ahead: the gather of x rows from L2, ~1 us,
// against a slice's ~0.6 us of wgmma.)
template <bool GLU>
__device__ __forceinline__ void wide_produce_raw(uint8_t *ring, uint8_t *raw, uint64_t *full, uint64_t *empty,
                                                 const DevMat &W, const uint16_t *in, uint32_t in_stride,
                                                 const int32_t *rows, int count, int expert, int bx, int nk, int base)
{
    constexpr int kAhead = 2;
    static_assert(kAhead <= kWideStages - 2 && kAhead <= kWideSlots - 1, "the decode must not wait on the consumers");
    const int tid = threadIdx.x;
    const WideA a(in, in_stride, rows, count, tid);
    const WideRaw w = WideRaw::of<GLU>(W, expert, bx, tid);
    auto copy = [&](int j) { // A and raw bytes of slice j, once its stage is free
        if (j < nk) {
            const int jg = base + j, s = jg % kWideStages;
            if (jg >= kWideStages) mbar_wait(&empty[s], (jg / kWideStages - 1) & 1);
            wide_copy<GLU, false>(ring + s * kWideStage, &full[s], nullptr, W, a, expert, bx, j, tid);
            wide_load_raw(raw + (jg % kWideSlots) * kWideRaw, w, j, tid);
        }
        cp_async_commit();
    };
    for (int j = 0; j < kAhead; j++) copy(j);
    for (int kk = 0; kk < nk; kk++) {
        const int s = (base + kk) % kWideStages;
        cp_async_wait<kAhead - 1>(); // slice kk's copies landed; the newer ones may fly
        producer_sync();             // every thread's copies of kk visible; every thread done decoding kk - 1
        copy(kk + kAhead);           // raw into the slot of kk - 1
        const uint8_t *slot = raw + ((base + kk) % kWideSlots) * kWideRaw;
        uint8_t *sb = ring + s * kWideStage + kWideA;
        wide_decode_row(slot, sb, tid);
        wide_decode_row(slot, sb, tid + 128);
        fence_proxy_async();
        mbar_arrive(&full[s]);
    }
}

// A consumer warpgroup's K loop: acc += its 64 positions x the 256 rows over every slice, each
// slice's wgmma group completed before the next is issued and its stage then freed. (Keeping one group
// in flight, the stage freed a slice later, measured 1100 against 1072 us for the bf16 layer at
// T = 4096: the producer then runs one slice less ahead.)
// A warpgroup none of whose positions is in the tile (`busy` false: an expert's last tile of at most
// 64 positions) issues no wgmma and leaves the tensor cores to the other; it still waits for each
// stage before freeing it, so that its arrivals never count toward a later use of the stage. (Its
// accumulators stay zero and are never stored; the live rows' values are the same.)
__device__ __forceinline__ void wide_consume(float (&acc)[128], uint8_t *ring, uint64_t *full, uint64_t *empty, int wg,
                                             bool busy, int nk, int base)
{
    const int lane = threadIdx.x & 31;
    for (int kk = 0; kk < nk; kk++) {
        const int jg = base + kk, s = jg % kWideStages;
        const uint32_t a_base = smem_u32(ring + s * kWideStage) + 64 * wg * 128;
        const uint32_t b_base = smem_u32(ring + s * kWideStage + kWideA);
        mbar_wait(&full[s], (jg / kWideStages) & 1);
        if (busy) {
            wg_fence();
#pragma unroll
            for (int k16 = 0; k16 < 4; k16++) wg_mma_n256(acc, wg_desc(a_base + k16 * 32), wg_desc(b_base + k16 * 32));
            wg_commit();
            wg_wait<0>();
        }
        if (lane == 0) mbar_arrive(&empty[s]);
    }
}

// The scale of B column c's weight row: 2^8 / its divisor for nvfp4 (decoded without it, times
// 2^-8), 1 for bf16.
template <class C, bool GLU>
__device__ __forceinline__ float wide_col_scale(const DevMat &W, int expert, int bx, int c)
{
    if constexpr (std::is_same<C, CNVFP4Raw>::value) return inv_row_div(W, expert, wide_b_row<GLU>(W, bx, c)) / 0x1p-8f;
    else return 1.0f;
}

// A tile's column scales (wide_col_scale), looked up once a run of 128 B rows where the run lies in
// one divisor's rows (B rows 0..127 and 128..255 are each contiguous weight rows, so the divisor
// index is monotonic along a run: equal at both ends means equal throughout), else once a column.
// Same values either way. Why: the epilogue took 64 lookups a thread a tile, each a load and a
// reciprocal (and, before div_word, a 64-bit division); for the qwen geometries every run is uniform
// (I and H are multiples of 128).
template <class C, bool GLU>
struct WideScales {
    float run[2] = {1.0f, 1.0f};
    bool uniform = true;
    __device__ WideScales(const DevMat &W, int expert, int bx)
    {
        if constexpr (std::is_same<C, CNVFP4Raw>::value) {
            auto idx = [&](int c) { return div_word(W, (uint64_t)expert * W.rows + wide_b_row<GLU>(W, bx, c)); };
            uniform = idx(0) == idx(127) && idx(128) == idx(255);
            run[0] = wide_col_scale<C, GLU>(W, expert, bx, 0);
            run[1] = wide_col_scale<C, GLU>(W, expert, bx, 128);
        }
    }
    __device__ float operator()(const DevMat &W, int expert, int bx, int c) const
    {
        return uniform ? run[c >= 128] : wide_col_scale<C, GLU>(W, expert, bx, c);
    }
};

// Four column blocks' bf16 pairs of one row, held across a quad (lane q: p[i] = columns 8 i + 2 q,
// + 1 of the four blocks), transposed so that lane q holds block q's 8 columns: one 16-byte store a
// lane, 64 contiguous bytes a quad. (A 4-byte store a lane wrote each 32-byte sector in two halves:
// the bf16 y plane's down at T = 4096 took 312 us, against 288 for the f32 plane's 8-byte stores and
// 268 with this; bf16 qwen3 layer, H200, ncu.) Every lane of the warp takes part (the shuffles); the stores may then be predicated.
__device__ __forceinline__ uint4 quad_transpose(const uint32_t (&p)[4])
{
    const int q = threadIdx.x & 3;
    uint32_t o[4];
#pragma unroll
    for (int r = 0; r < 4; r++) {
        // lane q sends its pair of block q ^ r to lane q ^ r and receives that lane's pair of block q
        const int i = q ^ r;
        const uint32_t send = i == 0 ? p[0] : i == 1 ? p[1] : i == 2 ? p[2] : p[3];
        const uint32_t v = r ? __shfl_xor_sync(0xFFFFFFFFu, send, r) : send;
#pragma unroll
        for (int m = 0; m < 4; m++)
            if (m == i) o[m] = v;
    }
    return make_uint4(o[0], o[1], o[2], o[3]);
}

// The epilogue of one consumer thread: rows 64 wg + 16 q + lane / 4 (+ 8), column blocks j (8 j +
// 2 (lane % 4), + 1), each column times its scale. gate/up: act[pos][128 bx + c] = bf16(silu(gate_c) *
// up_c), gate in blocks 0..15 and up in 16..31 of the same thread; plain: y[pos][256 bx + c] in fp32,
// or bf16 when y16, four blocks at a time through quad_transpose. (The same transpose for gate/up's
// act took its kernel from 522 to 565 us at T = 4096, bf16 qwen3 layer; H200, ncu: it stays.)
template <class C, bool GLU>
__device__ __forceinline__ void wide_store(const float (&acc)[128], const DevMat &W, int expert, int bx, int wg,
                                           int start, int count, void *out, uint32_t out_stride, bool y16)
{
    const int q = (threadIdx.x / 32) & 3, lane = threadIdx.x & 31;
    const WideScales<C, GLU> scale(W, expert, bx);
    if (!GLU && y16) {
#pragma unroll
        for (int g = 0; g < 8; g++) {
            uint32_t p[2][4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int j = 4 * g + i, c = 8 * j + 2 * (lane & 3);
                const float s0 = scale(W, expert, bx, c), s1 = scale(W, expert, bx, c + 1);
#pragma unroll
                for (int h = 0; h < 2; h++) p[h][i] = pack_bf16x2(acc[4 * j + 2 * h] * s0, acc[4 * j + 2 * h + 1] * s1);
            }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint4 v = quad_transpose(p[h]);
                const int r = 64 * wg + 16 * q + (lane >> 2) + 8 * h;
                if (r < count)
                    *reinterpret_cast<uint4 *>((uint16_t *)out + ((size_t)start + r) * out_stride + bx * kWideN +
                                               8 * (4 * g + (lane & 3))) = v;
            }
        }
        return;
    }
#pragma unroll
    for (int j = 0; j < (GLU ? 16 : 32); j++) {
        const int c = 8 * j + 2 * (lane & 3);
        const float s0 = scale(W, expert, bx, c), s1 = scale(W, expert, bx, c + 1);
        const float t0 = GLU ? scale(W, expert, bx, c + 128) : 0.0f;
        const float t1 = GLU ? scale(W, expert, bx, c + 129) : 0.0f;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = 64 * wg + 16 * q + (lane >> 2) + 8 * h;
            if (r >= count) continue;
            const size_t pos = (size_t)start + r;
            const float c0 = acc[4 * j + 2 * h] * s0, c1 = acc[4 * j + 2 * h + 1] * s1;
            if constexpr (GLU) {
                const float u0 = acc[4 * (j + 16) + 2 * h] * t0, u1 = acc[4 * (j + 16) + 2 * h + 1] * t1;
                *reinterpret_cast<uint32_t *>((uint16_t *)out + pos * out_stride + bx * 128 + c) =
                    pack_bf16x2(silu(c0) * u0, silu(c1) * u1);
            } else {
                store_plain2(out, pos * out_stride + bx * kWideN + c, false, c0, c1); // f32 (bf16 above)
            }
        }
    }
}

#endif // NF_WGMMA

// The wide-tile kernel: bf16 (B by bulk tensor copy through bmap) or nvfp4 (B decoded by the
// producer; bmap unused). Shapes: wide_fits. Persistent: one CTA an SM walks the tiles L = blockIdx.x,
// + gridDim.x, ... (weight tile L % nN, position tile L / nN: the CTAs in flight share their A rows),
// and the ring runs on from tile to tile, so the producer fills the next tile's first stages while the
// consumers are in the last one's epilogue (a CTA a tile waited for its first slices each time).
template <class C, bool GLU>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_wg_wide(const __grid_constant__ CUtensorMap bmap, DevMat W, const uint16_t *in, uint32_t in_stride, Groups g,
                    const int32_t *n_tiles, const int32_t *tile_group, const int32_t *tile_m0, int height, void *out,
                    uint32_t out_stride, bool y16)
{
#ifdef NF_WGMMA
    constexpr bool kRaw = std::is_same<C, CNVFP4Raw>::value;
    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t full[kWideStages], empty[kWideStages];
    __shared__ int32_t rows[128];
    const int nN = (int)(W.rows / kWideN), live = *n_tiles, nk = (int)W.cols / kWideK;
    if (threadIdx.x < kWideStages) {
        mbar_init(&full[threadIdx.x], 128 + (kRaw ? 0 : 1)); // + thread 0's arrival with the B bytes
        mbar_init(&empty[threadIdx.x], 8);
        fence_mbar_init();
    }
    __syncthreads();
    uint8_t *ring = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    const bool producer = threadIdx.x < 128;
    const int wg = threadIdx.x / 128 - 1;
    int base = 0; // the CTA's slices so far
    for (int L = blockIdx.x; L / nN < live; L += gridDim.x, base += nk) {
        const int bx = L % nN, tile = L / nN;
        if (producer) {
            producer_sync(); // every producer thread has issued the last tile's copies (they read rows)
            const TileRows t = tile_rows<128>(g, tile_group, tile_m0, tile, height, rows);
            producer_sync(); // the tile's rows are in shared memory
            if constexpr (kRaw)
                wide_produce_raw<GLU>(ring, ring + kWideStages * kWideStage, full, empty, W, in, in_stride, rows,
                                      t.count, t.expert, bx, nk, base);
            else
                wide_produce<GLU>(ring, full, empty, &bmap, W, in, in_stride, rows, t.count, t.expert, bx, nk, base);
            continue;
        }
        const TileRows t = tile_rows<128>(g, tile_group, tile_m0, tile, height, rows); // (writes no rows)
        float acc[128];
#pragma unroll
        for (int i = 0; i < 128; i++) acc[i] = 0.0f;
        const bool busy = 64 * wg < t.count; // (live: the tile list's length)
        wide_consume(acc, ring, full, empty, wg, busy, nk, base);
        if (busy) wide_store<C, GLU>(acc, W, t.expert, bx, wg, t.start, t.count, out, out_stride, y16);
    }
#endif
}

template <class C, bool GLU, int BM>
cudaError_t launch_bm(const DevMat &W, const uint16_t *in, uint32_t in_stride, const Groups &g, const TileList &tl,
                      void *out, uint32_t out_stride, bool y16, cudaStream_t s)
{
    auto k = prefill_wg_kernel<C, GLU, BM>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, WgShape<BM>::kSmem);
    if (e != cudaSuccess) return e;
    k<<<dim3(W.rows / BN, tl.max), kThreads, WgShape<BM>::kSmem, s>>>(W, in, in_stride, g, tl.n, tl.group, tl.m0,
                                                                     tl.height, out, out_stride, y16);
    return cudaGetLastError();
}

template <class C, bool GLU>
cudaError_t launch_h(const DevMat &W, const uint16_t *in, uint32_t in_stride, const Groups &g, const TileList &tl,
                     void *out, uint32_t out_stride, bool y16, cudaStream_t s)
{
    return tl.height == 128 ? launch_bm<C, GLU, 128>(W, in, in_stride, g, tl, out, out_stride, y16, s)
                            : launch_bm<C, GLU, 64>(W, in, in_stride, g, tl, out, out_stride, y16, s);
}

// ---- the wide tile's launch -----------------------------------------------------------------------
// B's map: the bank as one [rows of every expert][cols] bf16 matrix in boxes of 128 rows x 64 columns,
// 128-byte swizzled (the consumers' layout). DevMat does not carry the expert count, so the row
// extent is the largest a coordinate names; the tile list keeps every box inside the bank (expert <
// E, row < W.rows), as it keeps the cp.async paths' addresses.
bool wide_b_map(const DevMat &W, CUtensorMap *m)
{
    const cuuint64_t dim[2] = {W.cols, 0x7FFFFFFFu}, stride[1] = {W.row_stride};
    const cuuint32_t box[2] = {kWideK, 128};
    return tmap_bf16(m, W.data, 2, dim, stride, box, CU_TENSOR_MAP_SWIZZLE_128B);
}

// Whether a launch can take the wide tile: a codec and device it serves (wide_serves), tile height
// 128, whole slices of 64 and B tiles of 256 rows (gate/up: 128 gate and 128 up rows, each run a whole
// nvfp4 scale group), even output strides (pairs of columns stored together).
bool wide_serves(int codec)
{
    return (codec == 2 && tensor_map_encoder()) || (codec == 11 && smem_optin_limit() >= (size_t)wide_smem(true));
}
bool wide_fits(int codec, bool glu, const DevMat &W, const TileList &tl, uint32_t out_stride)
{
    return wide_serves(codec) && tl.height == 128 && W.cols % kWideK == 0 && out_stride % 2 == 0 &&
           W.row_stride % 16 == 0 && (glu ? (W.rows / 2) % 128 == 0 : W.rows % kWideN == 0);
}

// bf16: the map encodes or the caller falls back to the 128 x 128 tile (cudaErrorNotSupported).
template <class C, bool GLU>
cudaError_t launch_wide(const DevMat &W, const uint16_t *in, uint32_t in_stride, const Groups &g, const TileList &tl,
                        void *out, uint32_t out_stride, bool y16, cudaStream_t s)
{
    constexpr bool kRaw = std::is_same<C, CNVFP4Raw>::value;
    constexpr int smem = wide_smem(kRaw);
    CUtensorMap map;
    memset(&map, 0, sizeof map);
    if (!kRaw && !wide_b_map(W, &map)) return cudaErrorNotSupported;
    auto k = prefill_wg_wide<C, GLU>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    // one CTA an SM (its shared memory), never more than the largest tile list has tiles
    const uint32_t tiles = W.rows / kWideN * tl.max, grid = min(tiles, (uint32_t)sm_count());
    k<<<grid, kThreads, smem, s>>>(map, W, in, in_stride, g, tl.n, tl.group, tl.m0, tl.height, out, out_stride, y16);
    return cudaGetLastError();
}

} // namespace

bool prefill_wg_usable(int codec, int height, uint32_t max_tiles)
{
    return (codec == 2 /* bf16 */ || codec == 11 /* nvfp4 */) && (height == 32 || height == 64 || height == 128) &&
           max_tiles <= 65535 &&
           device_attr<cudaDevAttrComputeCapabilityMajor>() == 9 &&
           device_attr<cudaDevAttrComputeCapabilityMinor>() == 0 &&
           smem_optin_limit() >= (size_t)WgShape<128>::kSmem;
}

// From the tile-height sweep of the wide tile (docs/sparse_moe.md, "Tile height"; qwen3 geometry,
// H200, T = 512 .. 4096: height 128 against 64): bf16 gains from 32 positions an expert on average
// (T = 512: 0.908x, 1024: 0.833x, 2048: 0.716x); nvfp4, whose producer decodes B once per tile, loses
// at 32 (1.135x) and 64 (1.013x) and gains at 128 (0.853x), so its threshold sits between the two.
double prefill_wg_tall_from(int codec)
{
    if (!prefill_wg_usable(codec, 128, 0) || !wide_serves(codec)) return INFINITY;
    return codec == 2 ? 32.0 : 96.0;
}

cudaError_t launch_prefill_wg(int codec, bool glu, const DevMat &W, const uint16_t *in, uint32_t in_stride,
                              const Groups &g, const TileList &tl, void *out, uint32_t out_stride, bool y16, cudaStream_t s)
{
    if (wide_fits(codec, glu, W, tl, out_stride)) {
        cudaError_t e = cudaErrorNotSupported;
        if (codec == 2)
            e = glu ? launch_wide<CBF16, true>(W, in, in_stride, g, tl, out, out_stride, y16, s)
                    : launch_wide<CBF16, false>(W, in, in_stride, g, tl, out, out_stride, y16, s);
        else if (codec == 11)
            e = glu ? launch_wide<CNVFP4Raw, true>(W, in, in_stride, g, tl, out, out_stride, y16, s)
                    : launch_wide<CNVFP4Raw, false>(W, in, in_stride, g, tl, out, out_stride, y16, s);
        if (e != cudaErrorNotSupported) return e;
    }
    if (codec == 2)
        return glu ? launch_h<CBF16, true>(W, in, in_stride, g, tl, out, out_stride, y16, s)
                   : launch_h<CBF16, false>(W, in, in_stride, g, tl, out, out_stride, y16, s);
    if (codec == 11)
        return glu ? launch_h<CNVFP4Raw, true>(W, in, in_stride, g, tl, out, out_stride, y16, s)
                   : launch_h<CNVFP4Raw, false>(W, in, in_stride, g, tl, out, out_stride, y16, s);
    return cudaErrorInvalidValue;
}

} // namespace nf
