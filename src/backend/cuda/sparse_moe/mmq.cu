// The grouped int8 tensor-core GEMM ("mmq") of the k-quant and q8_0 banks between the small-token
// route and the large-T prefill: gate/up (GLU, SwiGLU in the epilogue) and down, int8 activations
// (the W·A8 numerics of gemv_a8.cu / down_a8.cu, quant_a8.cuh), mma.sync s8 with int32 sums per
// scale group folded into f32 (mmq.cuh).
//
// Why: the small-token route's dp4a GEMV takes every position against every weight (its cost grows
// with T) and the prefill route either decodes every weight slice to bf16 in every warp or first
// copies the active experts to a bf16 bank. Here a CTA owns one active expert's tile of positions
// (the prefill work list's tile table, 32 or 64 positions) and 128 weight rows, and streams the
// rows' encoded bytes once through shared memory with cp.async (STAGES slices in flight: 36 - 54 KB
// an SM at 1 CTA an SM), the tile's int8 activations beside them. Warps turn the staged bytes into
// int8 A fragments (a mask and a shift a word for q4_k), take m16n8k32 (q6_k: m16n8k16) against the
// activations, and fold each group's exact int32 dot into f32 with its scales. Only the n-tiles of 8
// positions that hold live positions issue MMAs, so a tile of 3 positions costs 1 of 8 n-tiles.
//
// Work split: 8 warps; warp w takes m-tiles (16 rows each) of row group w % 4 and the n-tiles of half
// w / 4 of the position tile. GLU: smem rows 0..63 are the gate rows of intermediates i0 .. i0 + 63,
// rows 64..127 their up rows, and warp w's m-tiles are gate rows 16 (w % 4) .. and the matching up
// rows, so a thread's two accumulators of one element are (gate, up) of the same intermediate.
//
// Pipeline per K slice kt: wait for slice kt's copies and a barrier (every warp is past slice kt - 1,
// so its buffer and the scale table are free), issue slice kt + STAGES - 1's copies, decode slice
// kt's scales into a table [128 rows][groups] from the rows' scale fields (staged once per CTA, or read
// from global memory where they do not fit: GMETA, below), a
// barrier, then the MMAs. Positions of a live n-tile past the tile's count load zeros.
//
// Epilogues: gate/up quantises its SwiGLU intermediate per position and 32 elements in the CTA (a
// CTA holds whole 32-element blocks: 64 intermediates) and writes it as the down's int8 input; down
// writes y in f32.
#include "internal.cuh"
#include "mmq.cuh"
#include "ptx.cuh"
#include "quant_a8.cuh"
#include "rowdot.cuh"

namespace nf {

namespace {

constexpr int kThreads = 256;
constexpr int kBM = 128; // weight rows a CTA

// d += A B (int8, int32 accumulation), m16n8k32 or (k16) m16n8k16.
__device__ __forceinline__ void mma_s8(int (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma_s8(int (&d)[4], const uint32_t (&a)[2], const uint32_t (&b)[1])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(b[0]));
}

template <class C, int BN>
struct Layout {
    using S = MmqShape<C>;
    // 32-position tiles (T k / E <= 24: the route's small-T end) double-buffer so that two CTAs fit
    // an SM: a CTA streams only K / SLICE slices (3 for a 768-wide down), and a second CTA's loads
    // cover one's ramp and epilogue (in flight an SM: two stages, 36 - 53 KB); 64-position tiles keep
    // three stages at one CTA an SM
    static constexpr int STAGES = BN == 64 ? 3 : 2;
    static constexpr int XB = C::SLICE / 32;                 // activation blocks a slice
    static constexpr int A_BYTES = kBM * S::QS;              // weight rows
    static constexpr int X_BYTES = BN * S::XS;               // int8 activations [BN][SLICE (+16)]
    // Strides padded against shared-memory bank conflicts (ncu at T = 64 counted 55 % excess
    // wavefronts without them): a fragment's lanes read the (d, s) of positions 2 t, 2 t + 1 and the
    // scales of rows g, g + 8, whose unpadded strides (64 B, 8 NG B) put 4 of them on one bank.
    static constexpr int DS = XB * 8 + 16;                   // (d, s) bytes a position: 16-byte aligned for cp.async
    static constexpr int D_BYTES = BN * DS;                  // their (d, s) [BN][XB (+2)]
    static constexpr int STAGE = A_BYTES + X_BYTES + D_BYTES;
    static constexpr int TS = S::NG + 1;                     // scale table row stride (entries)
    static constexpr int TAB = kBM * TS * (C::MINS ? 8 : 4); // the slice's scales [kBM][NG (+1)]
    // bytes of shared memory for rows whose scale fields take a meta_stride of meta bytes
    static size_t smem(uint32_t meta) { return (size_t)STAGES * STAGE + TAB + (size_t)kBM * meta; }
};

__host__ __device__ inline uint32_t round16(uint32_t b) { return (b + 15) & ~15u; }
// A row's staged scale fields: round16 bytes, plus 16 where that stride is a multiple of 32 bytes, so
// the rows the table's build reads together (consecutive rows, one word each) fall on distinct banks.
__host__ __device__ inline uint32_t meta_stride(uint32_t bytes)
{
    const uint32_t b = round16(bytes);
    return b % 32 ? b : b + 16;
}

// GMETA: the rows' scale fields are read from global memory (L1 / L2) when the slice's scale table is
// built, instead of staged whole in shared memory: a row of K = 20 480 (qwen2-57b-a14b's shared down,
// q6_k: 80 blocks of 18 bytes) would stage 128 x 1456 bytes, past what a CTA may take with its
// pipeline. Only the plain (down) form: a gate/up row that long would need a hidden size past 14 000.
template <class C, bool GLU, int BN, bool GMETA = false>
__global__ void __launch_bounds__(kThreads, BN == 64 ? 1 : 2)
    mmq_kernel(DevMat W, const int8_t *xq, const float2 *xd, Groups g, TileList tl, float *out, uint32_t out_stride,
               int8_t *aq, float2 *ad)
{
    using S = MmqShape<C>;
    using L = Layout<C, BN>;
    constexpr int NT = BN / 8, NTW = NT / 2;
    extern __shared__ __align__(16) uint8_t smem[];
    const int tile = blockIdx.y;
    if (tile >= *tl.n) return;
    const int gi = tl.group[tile], m0 = tl.m0[tile];
    const int expert = g.expert[gi], start = g.start[gi] + m0, count = min(BN, g.count[gi] - m0);
    const int nlive = (count + 7) / 8; // n-tiles with a live position
    const uint32_t K = W.cols, KT = K / C::SLICE, meta_b = round16(C::meta_bytes(W)), meta_s = meta_stride(C::meta_bytes(W));
    uint8_t *stages = smem;
    uint8_t *tab = smem + L::STAGES * L::STAGE;
    uint8_t *meta = tab + L::TAB;
    const int tid = threadIdx.x;

    // the CTA's weight rows: smem row r -> global row
    auto grow = [&](int r) -> uint32_t {
        if (GLU) return r < kBM / 2 ? blockIdx.x * (kBM / 2) + r : W.rows / 2 + blockIdx.x * (kBM / 2) + (r - kBM / 2);
        return blockIdx.x * kBM + r;
    };
    // scale fields of every row, once (the first commit group)
    for (uint32_t c = tid; !GMETA && c < kBM * (meta_b / 16); c += kThreads) {
        const uint32_t r = c / (meta_b / 16), o = 16 * (c % (meta_b / 16));
        cp_async16(smem_u32(meta + r * meta_s + o), row_ptr(W, expert, grow((int)r)) + C::meta_off(W) + o, 16);
    }
    // the rows this thread copies: weight chunks tid + kThreads u
    constexpr int AU = kBM * S::QC / kThreads;
    static_assert(kBM * S::QC % kThreads == 0, "weight chunks per thread");
    const uint8_t *arow[AU];
#pragma unroll
    for (int u = 0; u < AU; u++) arow[u] = row_ptr(W, expert, grow((tid + kThreads * u) / S::QC));
    // activation chunks: position rows of the live n-tiles (zeros past count)
    constexpr int XC = C::SLICE / 16, XU = (BN * XC + kThreads - 1) / kThreads;
    const int8_t *xrow[XU];
#pragma unroll
    for (int u = 0; u < XU; u++) {
        const int c = tid + kThreads * u, p = c / XC;
        xrow[u] = c < BN * XC && p < count ? xq + (size_t)input_row(g, start + p) * K : nullptr;
    }
    constexpr int DC = L::XB / 2; // 16-byte chunks of (d, s) a position a slice
    const float2 *drow = nullptr;
    if (tid < BN * DC && tid / DC < count) drow = xd + (size_t)input_row(g, start + tid / DC) * (K / 32);

    auto load_stage = [&](int buf, uint32_t kt) {
        uint8_t *st = stages + buf * L::STAGE;
#pragma unroll
        for (int u = 0; u < AU; u++) {
            const int c = tid + kThreads * u, r = c / S::QC, cc = c % S::QC;
            cp_async16(smem_u32(st + r * S::QS + 16 * cc), arow[u] + C::chunk(W, cc, kt), 16);
        }
        uint8_t *xs = st + L::A_BYTES;
#pragma unroll
        for (int u = 0; u < XU; u++) {
            const int c = tid + kThreads * u, p = c / XC, cc = c % XC;
            if (c < BN * XC && p < 8 * nlive) // rows of dead n-tiles are never read
                cp_async16(smem_u32(xs + p * S::XS + 16 * cc), xrow[u] ? xrow[u] + kt * C::SLICE + 16 * cc : xq,
                           xrow[u] ? 16 : 0);
        }
        if (tid < BN * DC && tid / DC < 8 * nlive) {
            const int p = tid / DC, cc = tid % DC;
            cp_async16(smem_u32(st + L::A_BYTES + L::X_BYTES + p * L::DS + 16 * cc),
                       drow ? drow + kt * L::XB + 2 * cc : xd, drow ? 16 : 0);
        }
    };
#pragma unroll
    for (int s = 0; s < L::STAGES - 1; s++) {
        if ((uint32_t)s < KT) load_stage(s, (uint32_t)s);
        cp_async_commit();
    }

    const int warp = tid / 32, lane = tid % 32, gq = lane / 4, tq = lane % 4;
    const int wm = warp % 4, wn = warp / 4;
    int rb[2]; // first smem row of each m-tile
    rb[0] = GLU ? 16 * wm : 32 * wm;
    rb[1] = GLU ? kBM / 2 + 16 * wm : 32 * wm + 16;
    float acc[2][NTW][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int ni = 0; ni < NTW; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][ni][e] = 0.0f;

    for (uint32_t kt = 0; kt < KT; kt++) {
        cp_async_wait<L::STAGES - 2>();
        __syncthreads();
        const uint32_t next = kt + L::STAGES - 1;
        if (next < KT) load_stage((int)(next % L::STAGES), next);
        cp_async_commit();
        // the slice's scales, every (row, group) once
        for (int i = tid; i < kBM * S::NG; i += kThreads) {
            const int r = i / S::NG, j = i % S::NG;
            float ds, ms;
            C::scale(GMETA ? row_ptr(W, expert, grow(r)) + C::meta_off(W) : meta + r * meta_s, W.nb, kt, j, ds, ms);
            if (C::MINS) reinterpret_cast<float2 *>(tab)[r * L::TS + j] = make_float2(ds, ms);
            else reinterpret_cast<float *>(tab)[r * L::TS + j] = ds;
        }
        __syncthreads();
        const uint8_t *st = stages + (kt % L::STAGES) * L::STAGE;
        const int8_t *xs = reinterpret_cast<const int8_t *>(st + L::A_BYTES);
        const float2 *ds_ = reinterpret_cast<const float2 *>(st + L::A_BYTES + L::X_BYTES);
        if (wn * NTW >= nlive) continue; // this warp's positions are all past the tile's count
#pragma unroll 2
        for (int j = 0; j < S::NG; j++) {
            uint32_t a[2][S::AREGS];
            float sd[2][2], sm[2][2];
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const int r0 = rb[mt] + gq;
                mmq_afrag<C>(st + r0 * S::QS, st + (r0 + 8) * S::QS, j, tq, a[mt]);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int i = (r0 + 8 * h) * L::TS + j;
                    if (C::MINS) {
                        const float2 v = reinterpret_cast<const float2 *>(tab)[i];
                        sd[mt][h] = v.x, sm[mt][h] = v.y;
                    } else {
                        sd[mt][h] = reinterpret_cast<const float *>(tab)[i], sm[mt][h] = 0.0f;
                    }
                }
            }
            const int xb = j * C::GE / 32; // the activation block of group j
#pragma unroll
            for (int ni = 0; ni < NTW; ni++) {
                const int n = wn * NTW + ni;
                if (n >= nlive) break;
                uint32_t b[S::BREGS];
                mmq_bfrag<C>(xs + (8 * n + gq) * S::XS, j, tq, b);
                const float2 x0 = ds_[(8 * n + 2 * tq) * (L::DS / 8) + xb], x1 = ds_[(8 * n + 2 * tq + 1) * (L::DS / 8) + xb];
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    int c[4] = {0, 0, 0, 0};
                    mma_s8(c, a[mt], b);
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        acc[mt][ni][e] = mmq_fold<C>(acc[mt][ni][e], c[e], sd[mt][e >> 1], sm[mt][e >> 1], (e & 1) ? x1 : x0);
                }
            }
        }
    }
    cp_async_wait_all();

    if constexpr (GLU) {
        // epilogue: the intermediate silu(gate) * up in f32, quantised per position and 32 elements
        // here (quant_a8.cuh's arithmetic on the same f32 values: the bits a separate launch would
        // give), so it is written once, as int8 and its (d, d sum q) pairs. The values meet in shared
        // memory (a block of 32 spans two warps' rows): [BN][64] floats over the drained stages.
        constexpr int VS = kBM / 2 + 4; // row stride in floats
        float *sv = reinterpret_cast<float *>(smem);
        __syncthreads(); // every warp is done with the stages
#pragma unroll
        for (int ni = 0; ni < NTW; ni++) {
            const int n = wn * NTW + ni;
            if (n >= nlive) break;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int p = 8 * n + 2 * tq + (e & 1);
                sv[p * VS + 16 * wm + gq + 8 * (e >> 1)] = silu(acc[0][ni][e]) * acc[1][ni][e];
            }
        }
        __syncthreads();
        const uint32_t I = W.rows / 2, i0 = blockIdx.x * (kBM / 2);
        for (int base = 0; base < BN * 8; base += kThreads) { // every lane runs (the quantiser's shuffles)
            const int v = base + tid, p = v / 8, c8 = v % 8;
            const bool ok = v < BN * 8 && p < count;
            float f[8];
#pragma unroll
            for (int i = 0; i < 8; i++) f[i] = ok ? sv[p * VS + 8 * c8 + i] : 0.0f;
            uint32_t packed[2];
            float d;
            int sum;
            quant8_words(f, packed, d, sum);
            if (ok) {
                const size_t pos = (size_t)(start + p);
                *reinterpret_cast<uint2 *>(aq + pos * I + i0 + 8 * c8) = make_uint2(packed[0], packed[1]);
                if (c8 % 4 == 0) ad[pos * (I / 32) + (i0 + 8 * c8) / 32] = make_float2(d, d * (float)sum);
            }
        }
    } else {
        // epilogue: y [pos][row] f32 (the combine reads it)
#pragma unroll
        for (int ni = 0; ni < NTW; ni++) {
            const int n = wn * NTW + ni;
            if (n >= nlive) break;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int p = 8 * n + 2 * tq + (e & 1);
                if (p >= count) continue;
                float *o = out + (size_t)(start + p) * out_stride;
#pragma unroll
                for (int mt = 0; mt < 2; mt++) o[blockIdx.x * kBM + rb[mt] + gq + 8 * (e >> 1)] = acc[mt][ni][e];
            }
        }
    }
}

// rows of cols elements (bf16 or f32, stride cols) quantised per 32 elements into xq [rows][cols]
// (unpadded; padded: quant_a8.cuh's staged rows, a8_stride(cols) apart) and xd [rows][cols / 32]
// (quant_a8.cuh's arithmetic, the same bits as the small routes')
template <bool BF16>
__global__ void mmq_quant_kernel(const void *in, uint32_t rows, uint32_t cols, int8_t *xq, float2 *xd, bool padded)
{
    const uint32_t vecs = cols / 8;
    const uint64_t total = (uint64_t)rows * vecs, v = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    // every lane of a warp runs (the shuffles); cols % 32 == 0 keeps a block's four lanes together
    const bool ok = v < total;
    cudaGridDependencySynchronize();
    cudaTriggerProgrammaticLaunchCompletion();
    float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (ok) {
        if (BF16) {
            const uint4 raw = reinterpret_cast<const uint4 *>(in)[v];
            const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
                f[2 * i] = __uint_as_float(w[i] << 16), f[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
        } else {
            const float4 a = reinterpret_cast<const float4 *>(in)[2 * v], b = reinterpret_cast<const float4 *>(in)[2 * v + 1];
            f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
        }
    }
    if (padded) return quant8_store(f, ok, (uint32_t)v, cols, xq, xd);
    uint32_t packed[2];
    float d;
    int sum;
    quant8_words(f, packed, d, sum);
    if (ok) {
        reinterpret_cast<uint2 *>(xq)[v] = make_uint2(packed[0], packed[1]);
        if (v % 4 == 0) xd[v / 4] = make_float2(d, d * (float)sum);
    }
}

template <class F>
cudaError_t with_mmq_codec(int codec, F &&f)
{
    switch (codec) {
    case 3: return f(MmqQ8{});
    case 4: return f(MmqQ4K{});
    case 5: return f(MmqQ5K{});
    case 6: return f(MmqQ6K{});
    default: return cudaErrorInvalidValue;
    }
}

} // namespace

size_t mmq_smem(int codec, const DevMat &W, int height, bool staged)
{
    size_t bytes = 0;
    with_mmq_codec(codec, [&](auto c) {
        using C = decltype(c);
        const uint32_t meta = staged ? meta_stride(C::meta_bytes(W)) : 0;
        bytes = height == 64 ? Layout<C, 64>::smem(meta) : Layout<C, 32>::smem(meta);
        return cudaSuccess;
    });
    return bytes;
}

// Whether the kernel stages the rows' scale fields in shared memory at this tile height: always for
// gate/up (GLU rows are short), else where they fit the limit (the GMETA form reads them from global).
static bool meta_staged(int codec, const DevMat &W, bool glu, int height, size_t smem_limit)
{
    return glu || mmq_smem(codec, W, height, true) <= smem_limit;
}

bool mmq_meta_staged(int codec, const DevMat &W, int height) { return meta_staged(codec, W, false, height, smem_optin_limit()); }

bool mmq_supported_within(int codec, const DevMat &W, bool glu, size_t smem_limit)
{
    if (!mmq_codec(codec)) return false;
    const uint32_t slice = codec == 3 ? 128 : 256;
    if (W.cols == 0 || W.cols % slice || W.rows == 0) return false;
    if (glu ? (W.rows / 2) % (kBM / 2) || W.rows % 2 : W.rows % kBM) return false;
    return mmq_smem(codec, W, 64, meta_staged(codec, W, glu, 64, smem_limit)) <= smem_limit;
}

bool mmq_supported(int codec, const DevMat &W, bool glu)
{
    return mmq_supported_within(codec, W, glu, smem_optin_limit());
}

cudaError_t launch_mmq(int codec, bool glu, const DevMat &W, const int8_t *xq, const float2 *xd, const Groups &g,
                       const TileList &tl, float *out, uint32_t out_stride, int8_t *aq, float2 *ad, cudaStream_t s)
{
    if (!mmq_supported(codec, W, glu) || (tl.height != 32 && tl.height != 64)) return cudaErrorInvalidValue;
    if (tl.max == 0) return cudaSuccess;
    return with_mmq_codec(codec, [&](auto c) -> cudaError_t {
        using C = decltype(c);
        auto go = [&](auto k, size_t smem) -> cudaError_t {
            cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
            if (e != cudaSuccess) return e;
            const dim3 grid(W.rows / kBM, tl.max); // glu: 64 row pairs a CTA
            k<<<grid, kThreads, smem, s>>>(W, xq, xd, g, tl, out, out_stride, aq, ad);
            return cudaGetLastError();
        };
        const bool staged = meta_staged(codec, W, glu, tl.height, smem_optin_limit());
        const size_t smem = mmq_smem(codec, W, tl.height, staged);
        if (!staged) return tl.height == 64 ? go(mmq_kernel<C, false, 64, true>, smem) : go(mmq_kernel<C, false, 32, true>, smem);
        if (tl.height == 64) return glu ? go(mmq_kernel<C, true, 64>, smem) : go(mmq_kernel<C, false, 64>, smem);
        return glu ? go(mmq_kernel<C, true, 32>, smem) : go(mmq_kernel<C, false, 32>, smem);
    });
}

cudaError_t launch_mmq_quant(const void *in, bool in_bf16, uint32_t rows, uint32_t cols, int8_t *xq, float2 *xd,
                             cudaStream_t s, bool padded, bool pdl)
{
    if (cols % 32) return cudaErrorInvalidValue;
    const uint64_t total = (uint64_t)rows * (cols / 8);
    if (total == 0) return cudaSuccess;
    const unsigned blocks = (unsigned)((total + 255) / 256);
    return launch_pdl(in_bf16 ? mmq_quant_kernel<true> : mmq_quant_kernel<false>, dim3(blocks), dim3(256), 0, pdl, s,
                      in, rows, cols, xq, xd, padded);
}

} // namespace nf
