// The prefill route: grouped GEMMs on tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate).
//
// A CTA computes a BM x 128 tile: BM positions of one expert's group (A, bf16 activations
// gathered by position) against 128 weight rows (B), over K in slices of 128. BM (32, 64 or 128,
// the tile height the work list was cut with) follows the positions an expert gets on average:
// a tile's MMAs run over all BM rows whether or not positions fill them, and at T = 64 (qwen3:
// ~4 positions an expert) 128-row tiles spent 97 % of their tensor work on zero rows. Each slice of B is
// decoded from the expert bank's codec to bf16 in shared memory by the same device codecs the
// CUDA-core routes use (a 128-element slice of a row is always a whole run of pieces), while the
// next slice's raw bytes are already in flight. A is copied with cp.async. Shared tiles keep rows of
// 128 bf16 (16 chunks of 16 bytes) with chunk c of row r stored at c ^ (r & 7), so ldmatrix reads
// hit eight different bank groups.
//
// gate/up: B's row 2i is gate row n0 + i and row 2i + 1 is up row n0 + i, so each thread's
// accumulator pair (c0, c1) is (gate, up) of one intermediate element and the SwiGLU epilogue
// needs no data exchange; it writes act as bf16 for the down GEMM. down: the epilogue writes
// fp32 y[pos][h] for the combine.
//
// The tile list comes from the work list (device): CTAs past the live tile count exit at once, so
// the launch shape depends only on T, never on routing results.
//
// W4A4 (A4 = true, nvfp4 banks): A is nvfp4 (a4.cuh) and is decoded into the same swizzled bf16
// tile as B, both WITHOUT their divisors: e2m1 * e4m3 is exact in bf16 (2 + 4 significant bits
// <= 8), so every MMA product is the exact product of the two encoded values and only the fp32
// accumulation rounds. The epilogue divides by the weight row's divisor (gate and up rows of one
// expert have their own) and the activation's; gate/up then applies SwiGLU and encodes the
// intermediate per 16 elements with the expert's down input divisor (a warp's 32 B rows are 16
// intermediate elements of each of its positions, held by the 4 lanes of a quad: two shuffles
// give the block amax, two more gather the 8 data bytes).
#include <type_traits>

#include "a4.cuh"
#include "internal.cuh"
#include "ptx.cuh"
#include "rowdot.cuh"

namespace nf {

namespace {

constexpr int BN = kPrefillTileN, BK = 128, kThreads = 256;
constexpr int kBTileBytes = BN * BK * 2; // one B slice, bf16

// The CTA tile's shape for BM positions: 8 warps as 2 (M) x 4 (N), a warp tile of BM / 2 x 32
// (the W4A4 epilogue needs a warp's 32 columns: 16 intermediate elements, one nvfp4 block).
template <int BM>
struct Shape {
    static_assert(BM == 32 || BM == 64 || BM == 128, "tile heights: 32, 64, 128");
    static constexpr int WM = BM / 2, MI = WM / 16;                 // warp rows; m16 tiles a warp
    static constexpr int kATileBytes = BM * BK * 2;                 // one A slice, bf16
    static constexpr int kSmem = 2 * (kATileBytes + kBTileBytes);   // A and B, two stages (128 KiB at 128)
};

// byte offset of element (r, k) in a swizzled [128][128] bf16 tile
__device__ __forceinline__ uint32_t swz(int r, int k) { return r * 256 + ((((k >> 3) ^ (r & 7)) << 4) | ((k & 7) << 1)); }

// A slice: BM rows x 128 bf16 of the CTA's positions (rows past `count` are zero-filled).
// Each thread copies BM / 16 chunks of 16 bytes.
template <int BM>
__device__ __forceinline__ void load_a(uint8_t *sa, const uint16_t *in, uint32_t in_stride, const int32_t *rows,
                                       int count, int kk)
{
#pragma unroll
    for (int i = 0; i < BM / 16; i++) {
        const int c = threadIdx.x + i * kThreads, r = c >> 4, ch = c & 15;
        const bool live = r < count;
        const uint16_t *src = in + (size_t)(live ? rows[r] : 0) * in_stride + kk * BK + ch * 8;
        cp_async16(smem_u32(sa + r * 256 + ((ch ^ (r & 7)) << 4)), src, live ? 16 : 0);
    }
}

// B slice: thread t decodes half of weight row t / 2's pieces of the slice.
template <class C>
struct BSlice {
    static constexpr int P = BK / C::PE;     // pieces per row per slice
    static constexpr int PT = P / 2;          // per thread
    typename C::Raw raw[PT];
    typename C::Row row;

    __device__ void load(const DevMat &W, uint32_t expert, uint32_t wrow, int kk)
    {
        row = C::row(W, expert, wrow);
        const int q0 = kk * P + (threadIdx.x & 1) * PT;
#pragma unroll
        for (int i = 0; i < PT; i++) raw[i] = C::load(row, q0 + i);
    }
    __device__ void store(uint8_t *sb, int kk) const
    {
        const int r = threadIdx.x >> 1, q0 = kk * P + (threadIdx.x & 1) * PT;
#pragma unroll
        for (int i = 0; i < PT; i++) {
            float w[C::PE];
            C::decode(row, raw[i], q0 + i, w);
#pragma unroll
            for (int run = 0; run < C::RUNS; run++) {
                const int k0 = C::elem(q0 + i, run) - kk * BK; // within the slice; runs are 4, 8 or 16 long
#pragma unroll
                for (int j = 0; j < C::RUN; j += 4) {
                    uint2 v = make_uint2(pack_bf16x2(w[run * C::RUN + j], w[run * C::RUN + j + 1]),
                                         pack_bf16x2(w[run * C::RUN + j + 2], w[run * C::RUN + j + 3]));
                    *reinterpret_cast<uint2 *>(sb + swz(r, k0 + j)) = v;
                }
            }
        }
    }
};

// W4A4 A slice: BM rows x 8 blocks of 16 from an nvfp4 plane; thread t holds BM / 32 (row, block)
// pairs, raw bytes in registers while the current slice multiplies. Rows past `count` decode as 0.
template <int BM>
struct A4Slice {
    static constexpr int N = BM * 8 / kThreads;
    uint2 v[N];
    uint32_t s[N];
    __device__ void load(const A4Plane &P, const int32_t *rows, int count, int kk)
    {
#pragma unroll
        for (int i = 0; i < N; i++) {
            const int c = threadIdx.x + i * kThreads, r = c >> 3, b = c & 7;
            v[i] = make_uint2(0, 0);
            s[i] = 0;
            if (r < count) {
                const size_t row = (size_t)rows[r];
                v[i] = *reinterpret_cast<const uint2 *>(P.q + row * (P.cols / 2) + kk * (BK / 2) + b * 8);
                s[i] = P.s[row * (P.cols / 16) + kk * (BK / 16) + b];
            }
        }
    }
    __device__ void store(uint8_t *sa) const
    {
#pragma unroll
        for (int i = 0; i < N; i++) {
            const int c = threadIdx.x + i * kThreads, r = c >> 3, b = c & 7;
            uint32_t p[8];
            a4_decode16(v[i], s[i], p);
            *reinterpret_cast<uint4 *>(sa + r * 256 + (((2 * b) ^ (r & 7)) << 4)) = make_uint4(p[0], p[1], p[2], p[3]);
            *reinterpret_cast<uint4 *>(sa + r * 256 + (((2 * b + 1) ^ (r & 7)) << 4)) = make_uint4(p[4], p[5], p[6], p[7]);
        }
    }
};

// The W4A4 epilogue. Column col of the warp tile (0..31) is B row wn + col of the CTA tile; the
// thread's columns are wn + ni * 8 + (lane % 4) * 2 and + 1.
template <bool GLU, int MI>
__device__ __forceinline__ void a4_epilogue(const float (&acc)[MI][4][4], const DevMat &W, int expert, int n0, int wm,
                                            int wn, int start, int count, const A4Args &a4, void *y,
                                            uint32_t y_stride, bool y16)
{
    const int lane = threadIdx.x & 31;
    const float ga = a4.in_div[(uint32_t)expert * a4.in_div_stride];
    float s0[4], s1[4]; // per ni: the scale of the thread's two accumulator columns
    col_scales<GLU, 4>(W, expert, blockIdx.y, wn, ga, s0, s1);
    const float gd = GLU ? a4.out_div[expert] : 0.0f;
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int hrow = 0; hrow < 2; hrow++) {
            const int r = wm + mi * 16 + (lane >> 2) + hrow * 8;
            const size_t pos = (size_t)start + r;
            if (GLU) {
                float v[4];
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
                    v[ni] = silu(acc[mi][ni][2 * hrow] * s0[ni]) * (acc[mi][ni][2 * hrow + 1] * s1[ni]);
                a4_store_block(v, gd, r < count, pos, (n0 + wn / 2) / 16, a4.out);
            } else if (r < count) {
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    const int col = wn + ni * 8 + (lane & 3) * 2;
                    store_plain2(y, pos * y_stride + n0 + col, y16, acc[mi][ni][2 * hrow] * s0[ni],
                                 acc[mi][ni][2 * hrow + 1] * s1[ni]);
                }
            }
        }
}

// Tile table entries (built by the work list with tile height BM): tile i covers positions m0 ..
// m0 + BM - 1 of group g. A4: C is CNVFP4Raw, `in` is unused (A comes from a4.in) and GLU writes
// a4.out. Below 128 rows two CTAs fit an SM (80 or 96 KiB of shared memory).
template <class C, bool GLU, bool A4, int BM>
__global__ void __launch_bounds__(kThreads, BM < 128 ? 2 : 1)
    prefill_gemm_kernel(DevMat W, const uint16_t *in, uint32_t in_stride, Groups g, const int32_t *n_tiles,
                        const int32_t *tile_group, const int32_t *tile_m0, void *out, uint32_t out_stride, bool y16, A4Args a4)
{
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ int32_t rows[BM];
    const int tile = blockIdx.x;
    if (tile >= *n_tiles) return;
    const TileRows t = tile_rows<BM>(g, tile_group, tile_m0, tile, BM, rows);
    const int expert = t.expert, start = t.start, count = t.count;
    __syncthreads();

    const int n0 = blockIdx.y * (GLU ? BN / 2 : BN); // first output column of the tile
    const uint32_t wrow = prefill_b_row<GLU>(W, blockIdx.y, threadIdx.x >> 1); // the B row this thread decodes
    const int nk = (int)W.cols / BK;

    using S = Shape<BM>;
    uint8_t *sA[2] = {smem, smem + S::kATileBytes + kBTileBytes};
    uint8_t *sB[2] = {smem + S::kATileBytes, smem + 2 * S::kATileBytes + kBTileBytes};
    BSlice<C> b;
    A4Slice<BM> a;
    if (A4) {
        a.load(a4.in, rows, count, 0);
        a.store(sA[0]);
    } else {
        load_a<BM>(sA[0], in, in_stride, rows, count, 0);
        cp_async_commit();
    }
    b.load(W, expert, wrow, 0);
    b.store(sB[0], 0);
    if (!A4) cp_async_wait_all();
    __syncthreads();

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = (warp & 1) * S::WM, wn = (warp >> 1) * 32; // warp tile: BM / 2 x 32
    float acc[S::MI][4][4] = {};                              // [m16 tile][n8 tile][fragment]

    for (int kk = 0; kk < nk; kk++) {
        const int s = kk & 1;
        if (kk + 1 < nk) { // next slice in flight while this one multiplies
            if (A4) {
                a.load(a4.in, rows, count, kk + 1);
            } else {
                load_a<BM>(sA[s ^ 1], in, in_stride, rows, count, kk + 1);
                cp_async_commit();
            }
            b.load(W, expert, wrow, kk + 1);
        }
        const uint32_t a_base = smem_u32(sA[s]), b_base = smem_u32(sB[s]);
#pragma unroll
        for (int k16 = 0; k16 < BK / 16; k16++) {
            uint32_t af[S::MI][4], bfr[4][2];
#pragma unroll
            for (int mi = 0; mi < S::MI; mi++) {
                const int r = wm + mi * 16 + (lane & 15), k = k16 * 16 + (lane >> 4) * 8;
                ldsm_x4(a_base + swz(r, k), af[mi]);
            }
#pragma unroll
            for (int nj = 0; nj < 2; nj++) {
                const int r = wn + nj * 16 + (lane & 7) + ((lane >> 4) << 3), k = k16 * 16 + ((lane >> 3) & 1) * 8;
                ldsm_x4(b_base + swz(r, k), bfr[2 * nj][0], bfr[2 * nj][1], bfr[2 * nj + 1][0], bfr[2 * nj + 1][1]);
            }
#pragma unroll
            for (int mi = 0; mi < S::MI; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
                    mma_bf16_16816(acc[mi][ni], af[mi][0], af[mi][1], af[mi][2], af[mi][3], bfr[ni][0], bfr[ni][1]);
        }
        if (kk + 1 < nk) {
            b.store(sB[s ^ 1], kk + 1);
            if (A4) a.store(sA[s ^ 1]);
            else cp_async_wait_all();
        }
        __syncthreads();
    }

    if constexpr (A4) {
        a4_epilogue<GLU, S::MI>(acc, W, expert, n0, wm, wn, start, count, a4, out, out_stride, y16);
    } else { // bf16 act (GLU) or fp32 y; nvfp4 (decoded without divisors) scaled per column
        float s0[4] = {1.0f, 1.0f, 1.0f, 1.0f}, s1[4] = {1.0f, 1.0f, 1.0f, 1.0f};
        if constexpr (std::is_same<C, CNVFP4Raw>::value) col_scales<GLU, 4>(W, expert, blockIdx.y, wn, 1.0f, s0, s1);
#pragma unroll
        for (int mi = 0; mi < S::MI; mi++)
#pragma unroll
            for (int hrow = 0; hrow < 2; hrow++) {
                const int r = wm + mi * 16 + (lane >> 2) + hrow * 8;
                if (r >= count) continue;
                const size_t pos = (size_t)start + r;
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    const float c0 = acc[mi][ni][2 * hrow] * s0[ni], c1 = acc[mi][ni][2 * hrow + 1] * s1[ni];
                    const int col = wn + ni * 8 + (lane & 3) * 2; // tile column of c0
                    if (GLU) {
                        const float v = silu(c0) * c1;
                        ((uint16_t *)out)[pos * out_stride + n0 + col / 2] = f2bf(v);
                    } else {
                        store_plain2(out, pos * out_stride + n0 + col, y16, c0, c1);
                    }
                }
            }
    }
}

template <class C, bool GLU, bool A4, int BM>
cudaError_t launch_bm(const DevMat &W, const uint16_t *in, uint32_t in_stride, const Groups &g, const TileList &tl,
                      void *out, uint32_t out_stride, bool y16, cudaStream_t s, const A4Args &a4)
{
    auto k = prefill_gemm_kernel<C, GLU, A4, BM>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, Shape<BM>::kSmem);
    if (e != cudaSuccess) return e;
    const uint32_t ntiles_n = W.rows / BN; // GLU: 2I rows -> I/64 tiles of 128 B rows
    k<<<dim3(tl.max, ntiles_n), kThreads, Shape<BM>::kSmem, s>>>(W, in, in_stride, g, tl.n, tl.group, tl.m0, out,
                                                                 out_stride, y16, a4);
    return cudaGetLastError();
}

template <class C, bool GLU, bool A4 = false>
cudaError_t launch_t(const DevMat &W, const uint16_t *in, uint32_t in_stride, const Groups &g, const TileList &tl,
                     void *out, uint32_t out_stride, bool y16, cudaStream_t s, const A4Args &a4 = A4Args{})
{
    switch (tl.height) {
    case 32: return launch_bm<C, GLU, A4, 32>(W, in, in_stride, g, tl, out, out_stride, y16, s, a4);
    case 64: return launch_bm<C, GLU, A4, 64>(W, in, in_stride, g, tl, out, out_stride, y16, s, a4);
    case 128: return launch_bm<C, GLU, A4, 128>(W, in, in_stride, g, tl, out, out_stride, y16, s, a4);
    default: return cudaErrorInvalidValue;
    }
}

} // namespace

// From the recorded sweep (docs/sparse_moe.md, "Tile height"; qwen3 geometry, four profiles, every
// height at T = 17 .. 4096): 32 wins while groups average under 32 positions (T < 512 at top-8 of
// 128), 64 up to 128 (T <= 2048; bf16 at 2048 is the one exception, 5 % slower), 128 beyond. On
// Hopper the bf16 and nvfp4 W4A16 banks' height-128 tiles are prefill_wg.cu's wide tile, which wins
// from fewer positions (prefill_wg_tall_from).
int prefill_tile_height(double avg, int wg_codec)
{
    if (wg_codec >= 0 && avg >= prefill_wg_tall_from(wg_codec)) return 128;
    return avg < 32 ? 32 : avg <= 128 ? 64 : 128;
}

bool prefill_supported(const DevMat &gate_up, const DevMat &down)
{
    // tiles: K slices of 128 and B tiles of 128 rows (for GLU 64 gate + 64 up rows)
    return gate_up.cols % BK == 0 && down.cols % BK == 0 && (gate_up.rows / 2) % (BN / 2) == 0 && down.rows % BN == 0;
}

cudaError_t launch_prefill_gemm(int codec, bool glu, const DevMat &W, const uint16_t *in, uint32_t in_stride,
                                const Groups &g, const TileList &tl, void *out, uint32_t out_stride, bool y16, cudaStream_t s)
{
    if (prefill_wg_usable(codec, tl.height, tl.max)) return launch_prefill_wg(codec, glu, W, in, in_stride, g, tl, out, out_stride, y16, s);
    return dispatch_codec(codec, [&](auto c) {
        using C = raw_nvfp4_t<decltype(c)>;
        return glu ? launch_t<C, true>(W, in, in_stride, g, tl, out, out_stride, y16, s)
                   : launch_t<C, false>(W, in, in_stride, g, tl, out, out_stride, y16, s);
    });
}

cudaError_t launch_prefill_gemm_a4(bool glu, const DevMat &W, const A4Args &a, const Groups &g, const TileList &tl,
                                   void *y, uint32_t y_stride, bool y16, cudaStream_t s)
{
    return glu ? launch_t<CNVFP4Raw, true, true>(W, nullptr, 0, g, tl, nullptr, 0, false, s, a)
               : launch_t<CNVFP4Raw, false, true>(W, nullptr, 0, g, tl, y, y_stride, y16, s, a);
}

} // namespace nf
