// The prefill grouped GEMM on Hopper's warpgroup MMA (sm_90a): prefill.cu's tiles, its tile list
// and its epilogues, with the work split between warpgroups instead of done by every warp in turn.
//
// A CTA is three warpgroups. Warpgroup 0 produces: per K slice of 128 it copies A (BM positions of
// one expert's group, bf16, gathered by position) into shared memory with cp.async, and decodes B
// (128 weight rows) from the bank's codec to bf16 (bf16 banks: cp.async too), one weight row a
// thread, the next slice's raw bytes already in its registers. Warpgroups 1 and 2 consume: wgmma
// m64nNk16 from shared memory, fp32 accumulators in registers. With BM = 128 each takes 64 positions
// against all 128 rows (N = 128); with BM = 64 each takes the 64 positions against 64 of the rows.
// Tile lists of height 32 run on the BM = 64 kernel with the upper 32 rows zero: on one device every
// height then takes the same wgmma chain over K, so the height (chosen from T) changes no bit.
// Slices live in a ring of stages guarded by mbarriers: `full` (128 producer arrivals: the thread's
// copies landed and its stores are fenced for the async proxy) and `empty` (one arrival per consumer
// warp once the wgmma that read the stage has completed). The producer publishes slice kk one slice
// late, after its cp.async group has landed, so two slices' copies are in flight.
//
// Tiles: [128 rows][64] bf16 K-major in the 128-byte swizzle (wgmma.cuh), two K halves a slice.
// Raster: blockIdx.x is the weight tile, blockIdx.y the position tile, so the CTAs in flight share
// their A rows (read once from DRAM) and walk few experts' weights at a time.
//
// nvfp4 weights are decoded without their divisor (e2m1 * e4m3 is exact in bf16, a4.cuh) and each
// output column is scaled by its row's 1 / divisor in the epilogue, as prefill.cu does: every
// product is exact and only the fp32 accumulation rounds. W4A4 (A4): the producer decodes A from
// the chunk's nvfp4 plane the same way (without the layer's input divisor, which the epilogue
// divides by), and the gate/up epilogue encodes the SwiGLU intermediate for down (a4.cuh).
#include <type_traits>

#include "a4.cuh"
#include "internal.cuh"
#include "rowdot.cuh"
#include "wgmma.cuh"

// Passes for other targets (sm_120a) compile the kernel empty and never launch it (prefill_wg_usable),
// which leaves this file's helpers unreferenced there.
#ifndef NF_WGMMA
#pragma nv_diag_suppress declared_but_not_referenced
#endif

namespace nf {

namespace {

constexpr int BN = 128, BK = 128, kThreads = 384;
constexpr int kSubB = 128 * 128; // one K half of B: 128 rows x 128 bytes

template <int BM>
struct WgShape {
    static_assert(BM == 64 || BM == 128, "wgmma tile heights: 64, 128");
    static constexpr int kABytes = BM * BK * 2, kBBytes = BN * BK * 2, kStage = kABytes + kBBytes;
    static constexpr int kStages = BM == 128 ? 3 : 4;      // 192 KiB either way: one CTA an SM
    static constexpr int kSmem = kStages * kStage + 1024; // + alignment of the ring to 1024
    static constexpr int WN = BM == 128 ? 128 : 64;       // a consumer warpgroup's columns
    static constexpr int NACC = WN / 2;                   // its accumulators a thread
};

// The weight row that B row r (0..127) of tile column block bx holds: for gate/up, rows 2i and
// 2i + 1 are gate and up of intermediate element 64 bx + i, so a thread's accumulator pair is
// (gate, up) of one element (prefill.cu's convention).
template <bool GLU>
__device__ __forceinline__ uint32_t b_row(const DevMat &W, int bx, int r)
{
    return GLU ? (uint32_t)(bx * (BN / 2) + (r >> 1) + ((r & 1) ? (int)W.rows / 2 : 0)) : (uint32_t)(bx * BN + r);
}

// 16-byte chunk c (0..15) of the slice kk of a bf16 row to its place in a [rows][128] stage tile of
// `rows` rows (two K halves of rows x 128 bytes).
__device__ __forceinline__ void cp_chunk(uint8_t *tile, int rows, int r, int c, const uint8_t *row, int kk, bool live)
{
    cp_async16(smem_u32(tile + (c >> 3) * rows * 128 + sw128(r, (c & 7) * 8)), row + kk * (BK * 2) + c * 16,
               live ? 16 : 0);
}

// A slice: BM rows of bf16 activations, 16 chunks a row, BM / 8 chunks a producer thread (the 16
// threads of a row read its 256 contiguous bytes). Rows past `count` are zero-filled.
template <int BM>
__device__ __forceinline__ void load_a(uint8_t *sa, const uint16_t *in, uint32_t in_stride, const int32_t *rows,
                                       int count, int kk, int tid)
{
#pragma unroll
    for (int i = 0; i < BM / 8; i++) {
        const int c = tid + i * 128, r = c >> 4;
        const bool live = r < count;
        cp_chunk(sa, BM, r, c & 15, (const uint8_t *)(in + (size_t)(live ? rows[r] : 0) * in_stride), kk, live);
    }
}

// B slice of a bf16 bank: 128 weight rows, copied as A is.
template <bool GLU>
__device__ __forceinline__ void load_b_bf16(uint8_t *sb, const DevMat &W, int expert, int bx, int kk, int tid)
{
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const int c = tid + i * 128, r = c >> 4;
        cp_chunk(sb, BN, r, c & 15, row_ptr(W, (uint32_t)expert, b_row<GLU>(W, bx, r)), kk, true);
    }
}

// W4A4 A slice: BM rows x 8 blocks of 16 from an nvfp4 plane, BM / 16 (row, block) pairs a producer
// thread; rows past `count` decode as 0.
template <int BM>
struct A4Rows {
    static constexpr int N = BM / 16;
    uint2 v[N];
    uint32_t s[N];
    __device__ __forceinline__ void load(const A4Plane &P, const int32_t *rows, int count, int kk, int tid)
    {
#pragma unroll
        for (int i = 0; i < N; i++) {
            const int c = tid + i * 128, r = c >> 3, b = c & 7;
            v[i] = make_uint2(0, 0);
            s[i] = 0;
            if (r < count) {
                const size_t row = (size_t)rows[r];
                v[i] = *reinterpret_cast<const uint2 *>(P.q + row * (P.cols / 2) + kk * (BK / 2) + b * 8);
                s[i] = P.s[row * (P.cols / 16) + kk * (BK / 16) + b];
            }
        }
    }
    __device__ __forceinline__ void store(uint8_t *sa, int tid) const
    {
#pragma unroll
        for (int i = 0; i < N; i++) {
            const int c = tid + i * 128, r = c >> 3, b = c & 7; // elements 16 b .. 16 b + 15
            uint32_t p[8];
            a4_decode16(v[i], s[i], p);
            uint8_t *d = sa + (b >> 2) * BM * 128;
            *reinterpret_cast<uint4 *>(d + sw128(r, (b & 3) * 16)) = make_uint4(p[0], p[1], p[2], p[3]);
            *reinterpret_cast<uint4 *>(d + sw128(r, (b & 3) * 16 + 8)) = make_uint4(p[4], p[5], p[6], p[7]);
        }
    }
};

// B slice of a decoded codec: the producer thread's one weight row, P pieces of the slice (a slice
// of 128 elements is always whole pieces).
template <class C>
struct RowSlice {
    static constexpr int P = BK / C::PE;
    typename C::Raw raw[P];

    __device__ __forceinline__ void load(const typename C::Row &row, int kk)
    {
#pragma unroll
        for (int i = 0; i < P; i++) raw[i] = C::load(row, kk * P + i);
    }
    // bf16 values to row r of the stage's B tile, 8 (or, for runs of 4, 4) at a time
    __device__ __forceinline__ void store(const typename C::Row &row, uint8_t *sb, int r, int kk) const
    {
#pragma unroll
        for (int i = 0; i < P; i++) {
            float w[C::PE];
            C::decode(row, raw[i], kk * P + i, w);
#pragma unroll
            for (int run = 0; run < C::RUNS; run++) {
                const int k0 = C::elem(kk * P + i, run) - kk * BK;
#pragma unroll
                for (int j = 0; j < C::RUN; j += 8 < C::RUN ? 8 : C::RUN) {
                    const float *v = w + run * C::RUN + j;
                    uint8_t *dst = sb + ((k0 + j) >> 6) * kSubB + sw128(r, (k0 + j) & 63);
                    const uint32_t p0 = pack_bf16x2(v[0], v[1]), p1 = pack_bf16x2(v[2], v[3]);
                    if constexpr (C::RUN >= 8)
                        *reinterpret_cast<uint4 *>(dst) = make_uint4(p0, p1, pack_bf16x2(v[4], v[5]), pack_bf16x2(v[6], v[7]));
                    else
                        *reinterpret_cast<uint2 *>(dst) = make_uint2(p0, p1);
                }
            }
        }
    }
};

// The producer warpgroup (threads 0..127): slices 0 .. nk-1 into the ring.
template <class C, bool GLU, bool A4, int BM>
__device__ __forceinline__ void produce(uint8_t *ring, uint64_t *full, uint64_t *empty, const DevMat &W,
                                        const uint16_t *in, uint32_t in_stride, const A4Args &a4, const int32_t *rows,
                                        int count, int expert, int nk)
{
    using S = WgShape<BM>;
    constexpr bool kCopyB = std::is_same<C, CBF16>::value;
    const int tid = threadIdx.x;
    [[maybe_unused]] const typename C::Row row = C::row(W, (uint32_t)expert, b_row<GLU>(W, blockIdx.x, tid));
    [[maybe_unused]] RowSlice<C> cur, nxt;
    [[maybe_unused]] A4Rows<BM> acur, anxt;
    if constexpr (!kCopyB) cur.load(row, 0);
    if constexpr (A4) acur.load(a4.in, rows, count, 0, tid);
    for (int kk = 0; kk < nk; kk++) {
        const int s = kk % S::kStages;
        uint8_t *sa = ring + s * S::kStage, *sb = sa + S::kABytes;
        if (kk >= S::kStages) mbar_wait(&empty[s], (kk / S::kStages - 1) & 1);
        if constexpr (!A4) load_a<BM>(sa, in, in_stride, rows, count, kk, tid);
        if constexpr (kCopyB) load_b_bf16<GLU>(sb, W, expert, blockIdx.x, kk, tid);
        cp_async_commit();
        if constexpr (A4) {
            if (kk + 1 < nk) anxt.load(a4.in, rows, count, kk + 1, tid);
            acur.store(sa, tid);
            acur = anxt;
        }
        if constexpr (!kCopyB) {
            if (kk + 1 < nk) nxt.load(row, kk + 1); // in flight while this slice decodes
            cur.store(row, sb, tid, kk);
            cur = nxt;
        }
        if (kk > 0) { // slice kk - 1: its copies have landed, its stores were issued a slice ago
            cp_async_wait<1>();
            fence_proxy_async();
            mbar_arrive(&full[(kk - 1) % S::kStages]);
        }
    }
    cp_async_wait<0>();
    fence_proxy_async();
    mbar_arrive(&full[(nk - 1) % S::kStages]);
}

// Tile list and epilogues as prefill.cu's kernel. A4: C is CNVFP4Raw, `in` is unused (A comes from
// a4.in) and GLU writes a4.out.
template <class C, bool GLU, bool A4, int BM>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_wg_kernel(DevMat W, const uint16_t *in, uint32_t in_stride, Groups g, const int32_t *n_tiles,
                      const int32_t *tile_group, const int32_t *tile_m0, int height, void *out, uint32_t out_stride,
                      A4Args a4)
{
#ifdef NF_WGMMA
    using S = WgShape<BM>;
    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t full[S::kStages], empty[S::kStages];
    __shared__ int32_t rows[BM];
    const int tile = blockIdx.y;
    if (tile >= *n_tiles) return;
    const int gi = tile_group[tile], m0 = tile_m0[tile];
    const int expert = g.expert[gi], start = g.start[gi] + m0, count = min(height, g.count[gi] - m0);
    if (threadIdx.x < BM) {
        const int p = start + (int)threadIdx.x;
        rows[threadIdx.x] = threadIdx.x < (unsigned)count ? (g.pos_entry ? g.pos_entry[p] / (int)g.entry_div : p) : 0;
    }
    if (threadIdx.x < S::kStages) {
        mbar_init(&full[threadIdx.x], 128);
        mbar_init(&empty[threadIdx.x], 8);
    }
    __syncthreads();
    uint8_t *ring = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    const int nk = (int)W.cols / BK;
    if (threadIdx.x < 128) {
        produce<C, GLU, A4, BM>(ring, full, empty, W, in, in_stride, a4, rows, count, expert, nk);
        return;
    }

    const int wg = threadIdx.x / 128 - 1, q = (threadIdx.x / 32) & 3, lane = threadIdx.x & 31;
    const int a_row0 = BM == 128 ? 64 * wg : 0, b_row0 = BM == 128 ? 0 : 64 * wg;
    float acc[S::NACC];
#pragma unroll
    for (int i = 0; i < S::NACC; i++) acc[i] = 0.0f;
    for (int kk = 0; kk < nk; kk++) {
        const int s = kk % S::kStages;
        const uint32_t a_base = smem_u32(ring + s * S::kStage) + a_row0 * 128;
        const uint32_t b_base = smem_u32(ring + s * S::kStage + S::kABytes) + b_row0 * 128;
        mbar_wait(&full[s], (kk / S::kStages) & 1);
        wg_fence();
#pragma unroll
        for (int kh = 0; kh < 2; kh++)
#pragma unroll
            for (int k16 = 0; k16 < 4; k16++) {
                const uint64_t da = wg_desc(a_base + kh * BM * 128 + k16 * 32), db = wg_desc(b_base + kh * kSubB + k16 * 32);
                if constexpr (BM == 128) wg_mma_n128(acc, da, db);
                else wg_mma_n64(acc, da, db);
            }
        wg_commit();
        if (kk > 0) { // the previous slice's wgmma has completed: its stage goes back to the producer
            wg_wait<1>();
            if (lane == 0) mbar_arrive(&empty[(kk - 1) % S::kStages]);
        }
    }
    wg_wait<0>();

    // epilogue: thread rows a_row0 + 16 q + lane / 4 (+ 8), columns b_row0 + 8 j + 2 (lane % 4) (+ 1);
    // nvfp4 columns scaled by 1 / (row divisor * A's divisor)
    constexpr bool kDiv = std::is_same<C, CNVFP4Raw>::value;
    const float ga = A4 ? a4.in_div[(uint32_t)expert * a4.in_div_stride] : 1.0f;
    float s[S::WN / 4]; // the scale of the thread's column c (0, 1) of column block j: s[2 j + c]
#pragma unroll
    for (int j = 0; j < S::WN / 8; j++)
#pragma unroll
        for (int c = 0; c < 2; c++)
            s[2 * j + c] = kDiv ? inv_row_div(W, expert, b_row<GLU>(W, blockIdx.x, b_row0 + 8 * j + 2 * (lane & 3) + c)) / ga
                                : 1.0f;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = a_row0 + 16 * q + (lane >> 2) + 8 * h;
        const size_t pos = (size_t)start + r;
        if constexpr (A4 && GLU) { // 16 intermediate elements (4 column blocks) an nvfp4 block
#pragma unroll
            for (int b = 0; b < S::WN / 32; b++) {
                float v[4];
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    const int j = 4 * b + ni;
                    v[ni] = silu(acc[4 * j + 2 * h] * s[2 * j]) * (acc[4 * j + 2 * h + 1] * s[2 * j + 1]);
                }
                a4_store_block(v, a4.out_div[expert], r < count, pos, (blockIdx.x * BN + b_row0) / 32 + b, a4.out);
            }
            continue;
        }
        if (r >= count) continue;
#pragma unroll
        for (int j = 0; j < S::WN / 8; j++) {
            const int col = b_row0 + 8 * j + 2 * (lane & 3);
            const float c0 = acc[4 * j + 2 * h] * s[2 * j], c1 = acc[4 * j + 2 * h + 1] * s[2 * j + 1];
            if (GLU)
                ((uint16_t *)out)[pos * out_stride + blockIdx.x * (BN / 2) + col / 2] = f2bf(silu(c0) * c1);
            else
                *reinterpret_cast<float2 *>((float *)out + pos * out_stride + blockIdx.x * BN + col) = make_float2(c0, c1);
        }
    }
#endif
}

template <class C, bool GLU, bool A4, int BM>
cudaError_t launch_bm(const DevMat &W, const uint16_t *in, uint32_t in_stride, const Groups &g, const TileList &tl,
                      void *out, uint32_t out_stride, const A4Args &a4, cudaStream_t s)
{
    auto k = prefill_wg_kernel<C, GLU, A4, BM>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, WgShape<BM>::kSmem);
    if (e != cudaSuccess) return e;
    k<<<dim3(W.rows / BN, tl.max), kThreads, WgShape<BM>::kSmem, s>>>(W, in, in_stride, g, tl.n, tl.group, tl.m0,
                                                                     tl.height, out, out_stride, a4);
    return cudaGetLastError();
}

template <class C, bool GLU, bool A4>
cudaError_t launch_h(const DevMat &W, const uint16_t *in, uint32_t in_stride, const Groups &g, const TileList &tl,
                     void *out, uint32_t out_stride, const A4Args &a4, cudaStream_t s)
{
    return tl.height == 128 ? launch_bm<C, GLU, A4, 128>(W, in, in_stride, g, tl, out, out_stride, a4, s)
                            : launch_bm<C, GLU, A4, 64>(W, in, in_stride, g, tl, out, out_stride, a4, s);
}

} // namespace

bool prefill_wg_usable(int height, uint32_t max_tiles)
{
    return (height == 32 || height == 64 || height == 128) && max_tiles <= 65535 &&
           device_attr<cudaDevAttrComputeCapabilityMajor>() == 9 &&
           device_attr<cudaDevAttrComputeCapabilityMinor>() == 0 &&
           smem_optin_limit() >= (size_t)WgShape<128>::kSmem;
}

cudaError_t launch_prefill_wg(int codec, bool glu, const DevMat &W, const uint16_t *in, uint32_t in_stride,
                              const Groups &g, const TileList &tl, void *out, uint32_t out_stride, cudaStream_t s)
{
    return dispatch_codec(codec, [&](auto c) {
        using C = raw_nvfp4_t<decltype(c)>;
        return glu ? launch_h<C, true, false>(W, in, in_stride, g, tl, out, out_stride, A4Args{}, s)
                   : launch_h<C, false, false>(W, in, in_stride, g, tl, out, out_stride, A4Args{}, s);
    });
}

cudaError_t launch_prefill_wg_a4(bool glu, const DevMat &W, const A4Args &a, const Groups &g, const TileList &tl,
                                 float *y, uint32_t y_stride, cudaStream_t s)
{
    return glu ? launch_h<CNVFP4Raw, true, true>(W, nullptr, 0, g, tl, nullptr, 0, a, s)
               : launch_h<CNVFP4Raw, false, true>(W, nullptr, 0, g, tl, y, y_stride, a, s);
}

} // namespace nf
