// A 16-row tile of weights as the A operand of mma.m16n8k16 (bf16 in, f32 accumulate) against
// activations staged in shared memory as bf16 B columns: the machinery gemv_mma.cu (the small-T GEMV)
// and down_mma.cu (the fused down + combine) share, and the row-format policies it is templated over.
//
// Fragment mapping (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), lane
// = 4 g + c: A reg a0 = (row g, k 2c..2c+1), a1 = (row g+8, same k), a2 = (row g, k 2c+8..2c+9),
// a3 = (row g+8, same); B reg b0 = (k 2c..2c+1, col g), b1 = (k 2c+8..2c+9, col g); D d0, d1 = (row g,
// cols 2c, 2c+1), d2, d3 = (row g+8, same cols). A permutation of K is free when A and B share it.
//
// A chunk is R::kChunk elements of a row (nvfp4: 128, 8 MMAs; bf16: 64, 4 MMAs), the unit the warps
// split K in. Lane c owns kChunk / 32 8-element groups of it ("words" v); word v feeds MMAs 2v and
// 2v+1 with the element pairs (j, j+4): k 2c, 2c+1 <- (0, 4) and k 2c+8, 2c+9 <- (1, 5) in MMA 2v;
// (2, 6) and (3, 7) in MMA 2v+1. In a staged column (2 kChunk bytes a chunk) word v of lane c sits
// at byte 16 (4 v + c), its 8 bf16 as (x0,x4),(x1,x5),(x2,x6),(x3,x7) (pair_order), so the B regs of
// MMAs 2v, 2v+1 are one 16-byte shared load at 16 c + 64 v. Which group of the chunk a lane's word v
// is belongs to the row format (its stage_offset): nvfp4 has lane c's 16 data bytes hold elements
// 32 c .. 32 c + 31 (group 4 c + v); bf16 has word v of lane c at row bytes 64 v + 16 c of the
// chunk's 128 (group 4 v + c), so each 16-byte load instruction of a warp reads 64 contiguous bytes
// of each of its 8 rows.
//
// A row format R (Fp4Rows in fp4_mma.cuh, Bf16Rows below) provides:
//   kChunk, kChunkBytes        elements of a chunk (64 or 128) and its data bytes in a row
//   Lane, lane(W, ga, gb, c)   where lane c reads stacked rows ga (tile row g) and gb (g + 8)
//   Chunk, load(L, k)          its raw share of chunk k of both rows, all loads issued at once
//   Frag, frag(ch)             what the MMAs need of it (nvfp4: the two scale bytes decoded)
//   a_regs<M>(f, a)            the A regs a0..a3 of MMA M (0 .. kChunk / 16 - 1) of the chunk
//   divisor(W, grow), factor_of(d): the divisor word of an output row (nvfp4: a load; bf16: 1) and
//                              the f32 factor it gives (nvfp4: 2^8 / divisor; bf16: 1)
//   stage_offset(e8)           the byte of 8-element group e8 of a row in its staged column
//   aux_lines(W), aux_line(W, grow, i): further bytes of a row to prefetch (nvfp4: its scales),
//                              kAuxPerChunk of the lines for each chunk (i = kAuxPerChunk k + j)
//   admits(W)                  the descriptor has what the format needs
//   kBatch, kMinBlocks         the GEMV's chunks a lane has loaded at a time and CTAs per SM
// The load, frag and a_regs steps and the staging of a group are host-callable, so
// tests/cuda/test_mma_tile.cu runs them on the CPU under an emulation of the MMA's fragment layout.
#pragma once
#include <stdint.h>

#include "dev_codecs.cuh"
#include "ptx.cuh"

namespace nf {

// A staged column is 2 * cols + kMmaColPad bytes, so column n + 1 sits 64 bytes off column n's banks:
// the 8 lanes of a quarter-warp (columns g, g + 1; c = 0..3) read 8 distinct 16-byte bank groups
// (cols is a multiple of 64: 2 * cols + 64 bytes is 16 banks mod 32).
constexpr uint32_t kMmaColPad = 64;

NF_HD uint32_t mma_col_stride(uint32_t cols) { return 2 * cols + kMmaColPad; }

// Word j (0..3) of a uint4 (j a constant after unrolling).
NF_HD uint32_t word_of(const uint4 &u, int j) { return j == 0 ? u.x : j == 1 ? u.y : j == 2 ? u.z : u.w; }

// __byte_perm(x, y, 0x5410): the low halves (x.lo, y.lo); 0x7632: the high halves (x.hi, y.hi).
NF_HD uint32_t lo_halves(uint32_t x, uint32_t y)
{
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, 0x5410);
#else
    return (x & 0xFFFFu) | (y << 16);
#endif
}
NF_HD uint32_t hi_halves(uint32_t x, uint32_t y)
{
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, 0x7632);
#else
    return (x >> 16) | (y & 0xFFFF0000u);
#endif
}

// 8 bf16 (x0,x1),(x2,x3),(x4,x5),(x6,x7) as (x0,x4),(x1,x5),(x2,x6),(x3,x7): the B pairs.
NF_HD uint4 pair_order(const uint4 &v)
{
    return make_uint4(lo_halves(v.x, v.z), hi_halves(v.x, v.z), lo_halves(v.y, v.w), hi_halves(v.y, v.w));
}

NF_HD uint32_t bf16x2_bits(__nv_bfloat162 v)
{
    const __nv_bfloat162_raw r = v;
    return (uint32_t)r.x | ((uint32_t)r.y << 16);
}

// 8 f32 as hi = bf16(x) and lo = bf16(x - hi) in the B pair order (x - hi is exact in f32).
NF_HD void split_hi_lo(const uint4 &p, const uint4 &q, uint4 &hi, uint4 &lo)
{
    const float x[8] = {f32_of_bits(p.x), f32_of_bits(p.y), f32_of_bits(p.z), f32_of_bits(p.w),
                        f32_of_bits(q.x), f32_of_bits(q.y), f32_of_bits(q.z), f32_of_bits(q.w)};
    uint32_t h[4], l[4];
    NF_UNROLL
    for (int j = 0; j < 4; j++) {
        const __nv_bfloat162 hv = __floats2bfloat162_rn(x[j], x[j + 4]);
        const float2 hf = __bfloat1622float2(hv);
        h[j] = bf16x2_bits(hv);
        l[j] = bf16x2_bits(__floats2bfloat162_rn(x[j] - hf.x, x[j + 4] - hf.y));
    }
    hi = make_uint4(h[0], h[1], h[2], h[3]);
    lo = make_uint4(l[0], l[1], l[2], l[3]);
}

// One 8-element group of an input row (v[0]: its 16 bf16 bytes; f32: v[0], v[1]) into the staged
// column(s) of its position at col (bf16: one column; f32: hi at col, lo at col + xstride), at byte
// off (the format's stage_offset).
template <bool IN_BF16>
NF_HD void stage_group(const uint4 *v, uint8_t *col, uint32_t xstride, uint32_t off)
{
    if constexpr (IN_BF16) {
        *reinterpret_cast<uint4 *>(col + off) = pair_order(v[0]);
    } else {
        uint4 hi, lo;
        split_hi_lo(v[0], v[1], hi, lo);
        *reinterpret_cast<uint4 *>(col + off) = hi;
        *reinterpret_cast<uint4 *>(col + xstride + off) = lo;
    }
}

// Stages the input rows of nt positions (pos0..) as B columns in xs (column stride xstride), groups
// where format R wants them: bf16, column t = position pos0 + t; f32, columns 2t (hi) and 2t + 1
// (lo). row_of(pos) is the input row of a position (in_stride elements apart). A thread takes
// 8-element groups, UNROLL of them with their loads in flight before its stores.
template <class R, bool IN_BF16, int UNROLL, class RowOf>
__device__ void stage_cols(const void *in, uint32_t in_stride, RowOf row_of, int pos0, int nt, uint32_t cols,
                           uint8_t *xs, uint32_t xstride)
{
    constexpr int V = IN_BF16 ? 1 : 2; // 16-byte loads per group
    const uint32_t groups = cols / 8, total = (uint32_t)nt * groups;
    for (uint32_t i0 = threadIdx.x; i0 < total; i0 += blockDim.x * UNROLL) {
        uint4 buf[UNROLL][V];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const uint32_t i = i0 + u * blockDim.x;
            if (i < total) {
                const int row = row_of(pos0 + (int)(i / groups));
                const uint8_t *src =
                    (const uint8_t *)in + ((size_t)row * in_stride + (i % groups) * 8) * (IN_BF16 ? 2 : 4);
#pragma unroll
                for (int h = 0; h < V; h++) buf[u][h] = *reinterpret_cast<const uint4 *>(src + 16 * h);
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const uint32_t i = i0 + u * blockDim.x;
            if (i >= total) break;
            const uint32_t t = i / groups;
            stage_group<IN_BF16>(buf[u], xs + (size_t)(IN_BF16 ? t : 2 * t) * xstride, xstride,
                                 R::stage_offset(i % groups));
        }
    }
}

// A chunk's MMAs as mma(m, a, b0, b1) calls, m = 0 .. kChunk / 16 - 1 in order; xk: the lane's
// 16-byte group of word 0 of this chunk in its staged column (word v at + 64 v).
template <class R, class Mma>
NF_HD void chunk_mmas(const typename R::Chunk &ch, const uint8_t *xk, Mma &&mma)
{
    static_assert(R::kChunk == 64 || R::kChunk == 128, "a chunk is 2 or 4 words a lane");
    const typename R::Frag f = R::frag(ch);
    uint32_t a[4];
    uint4 x = *reinterpret_cast<const uint4 *>(xk);
    R::template a_regs<0>(f, a), mma(0, a, x.x, x.y);
    R::template a_regs<1>(f, a), mma(1, a, x.z, x.w);
    x = *reinterpret_cast<const uint4 *>(xk + 64);
    R::template a_regs<2>(f, a), mma(2, a, x.x, x.y);
    R::template a_regs<3>(f, a), mma(3, a, x.z, x.w);
    if constexpr (R::kChunk == 128) {
        x = *reinterpret_cast<const uint4 *>(xk + 128);
        R::template a_regs<4>(f, a), mma(4, a, x.x, x.y);
        R::template a_regs<5>(f, a), mma(5, a, x.z, x.w);
        x = *reinterpret_cast<const uint4 *>(xk + 192);
        R::template a_regs<6>(f, a), mma(6, a, x.x, x.y);
        R::template a_regs<7>(f, a), mma(7, a, x.z, x.w);
    }
}

// The chunk's MMAs on the tensor cores: even ones into d0, odd ones into d1 (two accumulators halve
// the chain of dependent MMAs).
template <class R>
__device__ __forceinline__ void mma_chunk(const typename R::Chunk &ch, const uint8_t *xk, float (&d0)[4],
                                          float (&d1)[4])
{
    chunk_mmas<R>(ch, xk, [&](int m, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        mma_bf16_16816(m & 1 ? d1 : d0, a[0], a[1], a[2], a[3], b0, b1);
    });
}

// ---- bf16 weights: the operand is the weight itself ------------------------------------------------
// A row is 2 * cols bytes of bf16 (row codec layout, devmat.cu). Chunks of 64 elements: lane c's word
// v (0, 1) of chunk k is the 16 bytes at 128 k + 64 v + 16 c (elements 64 k + 32 v + 8 c ..), the 4
// lanes of a row reading 64 contiguous bytes per load; the A regs are those words in the B pair
// order (pair_order's byte permutes). A bf16 x bf16 product has at most 16 significant bits, so it is
// exact in the MMA's f32 (unless it leaves f32's normal range), and no factor follows.
// Why 64 and not 128: a 128-element chunk is 32 registers a lane, and ptxas loads the next one while
// the current one's MMAs run: 106 - 130 registers, spills at the 80 that 6 CTAs an SM allow. At 64
// the GEMV takes 72 - 74 registers with early staging (the decode route: 6 CTAs an SM) and 84 - 90
// otherwise (5), no spills, under a bound of 5.
struct Bf16Rows {
    static constexpr int kChunk = 64;    // elements of a chunk: 128 bytes of a row, 4 MMAs
    static constexpr int kChunkBytes = 128;
    static constexpr int kAuxPerChunk = 0;
    static constexpr int kBatch = 1;     // 64 bytes a lane (4 x 16-byte loads); ptxas pipelines the next
    static constexpr int kMinBlocks = 5; // see above
    struct Lane {
        const uint8_t *a, *b;
    };
    struct Chunk {
        uint4 a[2], b[2]; // words 0..1 of rows g and g + 8
    };
    using Frag = Chunk;

    static bool admits(const DevMat &W) { return W.row_stride % 16 == 0 && W.row_stride >= 2ull * W.cols; }
    // group j = 4 v + c of chunk k (e8 = 8 k + j) at 128 k + 16 (4 v + c): the natural order
    NF_HD static uint32_t stage_offset(uint32_t e8) { return 16 * e8; }
    NF_HD static Lane lane(const DevMat &W, uint64_t ga, uint64_t gb, int c)
    {
        return Lane{W.data + ga * W.row_stride + 16 * c, W.data + gb * W.row_stride + 16 * c};
    }
    NF_HD static Chunk load(const Lane &L, int k)
    {
        Chunk ch;
        NF_UNROLL
        for (int v = 0; v < 2; v++) {
            ch.a[v] = *reinterpret_cast<const uint4 *>(L.a + 128 * k + 64 * v);
            ch.b[v] = *reinterpret_cast<const uint4 *>(L.b + 128 * k + 64 * v);
        }
        return ch;
    }
    NF_HD static Frag frag(const Chunk &ch) { return ch; }
    // MMA M (0..3): word v = M / 2 of each row in pair order; pairs (0,4), (1,5) for even M, (2,6),
    // (3,7) for odd M.
    template <int M>
    NF_HD static void a_regs(const Frag &f, uint32_t (&a)[4])
    {
        const uint4 &wa = f.a[M / 2], &wb = f.b[M / 2];
        const int j = M % 2 ? 1 : 0; // words x, z (even) or y, w (odd) of the pair-ordered group
        const uint32_t xa = word_of(wa, j), za = word_of(wa, j + 2), xb = word_of(wb, j), zb = word_of(wb, j + 2);
        a[0] = lo_halves(xa, za);
        a[1] = lo_halves(xb, zb);
        a[2] = hi_halves(xa, za);
        a[3] = hi_halves(xb, zb);
    }
    NF_HD static float divisor(const DevMat &, uint64_t) { return 1.0f; }
    NF_HD static float factor_of(float) { return 1.0f; }
    NF_HD static uint32_t aux_lines(const DevMat &) { return 0; }
    NF_HD static const uint8_t *aux_line(const DevMat &, uint64_t, uint32_t) { return nullptr; }
};

} // namespace nf
