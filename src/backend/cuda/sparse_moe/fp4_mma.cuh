// nvfp4 weights as bf16 tensor-core operands, shared by gemv_fp4.cu (the GEMV) and down_fp4.cu (the
// fused down + combine). The decode is host-callable so it can be checked exhaustively on the CPU
// (tests/cuda/test_fp4_decode.cu); the fragment loads, the MMA and the activation staging below it
// are device code, their layout described in gemv_fp4.cu's header.
//
// Why exact: an nvfp4 weight is e2m1 * e4m3 / divisor. e2m1 has 2 significant bits and e4m3 4, so
// their product has at most 6 and is a bf16 (8 bits) as long as it stays in range. The kernel
// feeds the MMA A = e2m1 * e4m3 * 2^-8 (in [2^-18, 10.5]: normal bf16) and multiplies each
// output row by 2^8 / divisor once, after the K loop.
//
// Decode without a table (a run-time-indexed register array spills to local memory; a shared LUT
// costs a bank-conflicted load per pair): the 3 magnitude bits of a nibble placed at bf16 bits 6-8
// (exponent bits 0-1 and the top mantissa bit) and its sign at bit 15 read as e2m1 * 2^-126,
// exactly, the two subnormal e2m1 values (0, 0.5) landing on the bf16 subnormals 0 and 2^-127.
// One bf16x2 multiply by e4m3 * 2^118 (at most 448 * 2^118 < 2^127: no overflow) then gives
// e2m1 * e4m3 * 2^-8, exact because the product is representable. Pairing the nibble at bit p of a
// word with the one at bit p + 16 lets both halves of the bf16x2 share their shifts: a pair costs
// two shifts, a mask, a LOP3 and the multiply.
#pragma once
#include <stdint.h>
#include <string.h>

#include "dev_codecs.cuh"

namespace nf {

// a * b for two bf16x2 bit patterns, round to nearest even (the device instruction; on the host the
// f32 product of two bf16 is exact and then rounded, as the test needs).
NF_HD uint32_t bf16x2_mul(uint32_t a, uint32_t b)
{
#ifdef __CUDA_ARCH__
    uint32_t d;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
#else
    uint32_t out = 0;
    for (int h = 0; h < 2; h++) {
        const uint32_t ua = ((a >> (16 * h)) & 0xFFFFu) << 16, ub = ((b >> (16 * h)) & 0xFFFFu) << 16;
        float fa, fb;
        memcpy(&fa, &ua, 4);
        memcpy(&fb, &ub, 4);
        const float p = fa * fb;
        uint32_t u;
        memcpy(&u, &p, 4);
        u += 0x7FFFu + ((u >> 16) & 1u);
        out |= (u >> 16) << (16 * h);
    }
    return out;
#endif
}

// Subnormal e4m3 scales pass through f32 subnormals here: a flush-to-zero build would zero them.
#if defined(__CUDACC__) && defined(__USE_FAST_MATH__)
#error "fp4_mma.cuh: the nvfp4 operand decode needs f32 subnormals (do not build with --use_fast_math)"
#endif

// The bf16x2 {s, s} with s = e4m3(byte b) * 2^118 (b is not a NaN byte). The e4m3 bits in an f32's
// sign, exponent and mantissa read as e4m3 * 2^-120 (an f32 subnormal for an e4m3 subnormal, still
// exact); two exact power-of-two multiplies rescale it, and the top half of the f32 is the bf16
// because e4m3 has 3 mantissa bits.
NF_HD uint32_t fp4_scale2(uint32_t b)
{
    const uint32_t u = ((b & 0x80u) << 24) | ((b & 0x7Fu) << 20);
    float f;
    memcpy(&f, &u, 4);
    f = f * 0x1p119f * 0x1p119f;
    uint32_t v;
    memcpy(&v, &f, 4);
    const uint32_t h = v >> 16;
    return h | (h << 16);
}

// The bf16x2 {e2m1(nibble at bit 4Q of w), e2m1(nibble at bit 4Q + 16)} * s, s from fp4_scale2:
// e2m1 * e4m3 * 2^-8 in each half (file comment). Q = 0..3 covers a word's 8 nibbles as the pairs
// (Q, Q + 4) in element order.
template <int Q>
NF_HD uint32_t fp4_pair(uint32_t w, uint32_t s2)
{
    constexpr int P = 4 * Q;
    uint32_t mag; // magnitude bits 0-2 of each nibble to bits 6-8 of its half
    if constexpr (P <= 6)
        mag = w << (6 - P);
    else
        mag = w >> (P - 6);
    const uint32_t t = (mag & 0x01C001C0u) | ((w << (12 - P)) & 0x80008000u); // sign bit 3 to bit 15
    return bf16x2_mul(t, s2);
}

// ---- device side: one lane's share of a 16-row tile and its MMAs (gemv_fp4.cu's header has the
// fragment mapping and the staged-column layout) ----------------------------------------------------

constexpr uint32_t kFp4Chunk = 128;                // elements of a chunk (64 data bytes of a row)
constexpr uint32_t kFp4ChunkStage = 2 * kFp4Chunk; // bytes of a chunk of one staged bf16 column
// A staged column is 2 * cols + kFp4ColPad bytes, so column n + 1 sits 64 bytes off column n's banks:
// the 8 lanes of a quarter-warp (columns g, g + 1; c = 0..3) read 8 distinct 16-byte bank groups.
constexpr uint32_t kFp4ColPad = 64;

NF_HD uint32_t fp4_col_stride(uint32_t cols) { return 2 * cols + kFp4ColPad; }

// A lane's share of one chunk: 16 data bytes and the 2 scale bytes of row g (a) and row g + 8 (b).
struct Chunk {
    uint4 a, b;
    uint32_t sa, sb;
};

// Where a lane reads its two rows: data at + 64 k, the scale pair at + 1024 k for chunk k.
struct LaneRows {
    const uint8_t *da, *db, *sa, *sb;
};

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The scale bytes of (stacked row grow, scale columns 8k + 2c, + 1) are adjacent: the swizzle keeps
// a row's 4 scale columns of a 512-byte tile together and 8k + 2c is even. Chunk k adds 1024.
__device__ __forceinline__ const uint8_t *scale_base(const DevMat &W, uint64_t grow, int c)
{
    return W.scales + nvfp4_scale_index(grow, 2 * c, W.kt);
}

__device__ __forceinline__ LaneRows lane_rows(const DevMat &W, uint64_t ga, uint64_t gb, int c)
{
    return LaneRows{W.data + ga * W.row_stride + 16 * c, W.data + gb * W.row_stride + 16 * c, scale_base(W, ga, c),
                    scale_base(W, gb, c)};
}

__device__ __forceinline__ Chunk load_chunk(const LaneRows &L, int k)
{
    Chunk ch;
    ch.a = *reinterpret_cast<const uint4 *>(L.da + 64 * k);
    ch.b = *reinterpret_cast<const uint4 *>(L.db + 64 * k);
    ch.sa = *reinterpret_cast<const uint16_t *>(L.sa + 1024 * k);
    ch.sb = *reinterpret_cast<const uint16_t *>(L.sb + 1024 * k);
    return ch;
}

// One word of each row against B regs (x.x, x.y) and (x.z, x.w): MMAs 2v (into d0) and 2v+1 (d1).
__device__ __forceinline__ void mma_word(uint32_t wa, uint32_t wb, uint32_t sa, uint32_t sb, const uint4 &x,
                                         float (&d0)[4], float (&d1)[4])
{
    mma_bf16_16816(d0, fp4_pair<0>(wa, sa), fp4_pair<0>(wb, sb), fp4_pair<1>(wa, sa), fp4_pair<1>(wb, sb), x.x, x.y);
    mma_bf16_16816(d1, fp4_pair<2>(wa, sa), fp4_pair<2>(wb, sb), fp4_pair<3>(wa, sa), fp4_pair<3>(wb, sb), x.z, x.w);
}

// A chunk's 8 MMAs; xk: the lane's 16-byte group of word 0 of this chunk in its staged column.
// Two accumulators halve the chain of dependent MMAs.
__device__ __forceinline__ void mma_chunk(const Chunk &ch, const uint8_t *xk, float (&d0)[4], float (&d1)[4])
{
    const uint32_t sa0 = fp4_scale2(ch.sa & 0xFF), sa1 = fp4_scale2((ch.sa >> 8) & 0xFF);
    const uint32_t sb0 = fp4_scale2(ch.sb & 0xFF), sb1 = fp4_scale2((ch.sb >> 8) & 0xFF);
    mma_word(ch.a.x, ch.b.x, sa0, sb0, *reinterpret_cast<const uint4 *>(xk), d0, d1);
    mma_word(ch.a.y, ch.b.y, sa0, sb0, *reinterpret_cast<const uint4 *>(xk + 64), d0, d1);
    mma_word(ch.a.z, ch.b.z, sa1, sb1, *reinterpret_cast<const uint4 *>(xk + 128), d0, d1);
    mma_word(ch.a.w, ch.b.w, sa1, sb1, *reinterpret_cast<const uint4 *>(xk + 192), d0, d1);
}

// Byte offset of 8-element group e8 of a row inside its staged column: chunk e8 / 16, lane
// c = (e8 / 4) % 4 and word v = e8 % 4 at 16 (4 v + c), so a lane's four words are 64 bytes apart
// and the 4 lanes of a row group read 64 contiguous bytes per word.
__device__ __forceinline__ uint32_t stage_offset(uint32_t e8)
{
    return (e8 >> 4) * kFp4ChunkStage + 16 * (4 * (e8 & 3) + ((e8 >> 2) & 3));
}

// 8 bf16 (x0,x1),(x2,x3),(x4,x5),(x6,x7) as (x0,x4),(x1,x5),(x2,x6),(x3,x7): the B pairs.
__device__ __forceinline__ uint4 pair_order(const uint4 &v)
{
    return make_uint4(__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632), __byte_perm(v.y, v.w, 0x5410),
                      __byte_perm(v.y, v.w, 0x7632));
}

__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat162 v)
{
    const __nv_bfloat162_raw r = v;
    return (uint32_t)r.x | ((uint32_t)r.y << 16);
}

// 8 f32 as hi = bf16(x) and lo = bf16(x - hi) in the B pair order (x - hi is exact in f32).
__device__ __forceinline__ void split_hi_lo(const uint4 &p, const uint4 &q, uint4 &hi, uint4 &lo)
{
    const float x[8] = {__uint_as_float(p.x), __uint_as_float(p.y), __uint_as_float(p.z), __uint_as_float(p.w),
                        __uint_as_float(q.x), __uint_as_float(q.y), __uint_as_float(q.z), __uint_as_float(q.w)};
    uint32_t h[4], l[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const __nv_bfloat162 hv = __floats2bfloat162_rn(x[j], x[j + 4]);
        const float2 hf = __bfloat1622float2(hv);
        h[j] = bf16x2_bits(hv);
        l[j] = bf16x2_bits(__floats2bfloat162_rn(x[j] - hf.x, x[j + 4] - hf.y));
    }
    hi = make_uint4(h[0], h[1], h[2], h[3]);
    lo = make_uint4(l[0], l[1], l[2], l[3]);
}

// Stages the input rows of nt positions (pos0..) as B columns in xs (column stride xstride): bf16,
// column t = position pos0 + t; f32, columns 2t (hi) and 2t + 1 (lo). row_of(pos) is the input row
// of a position (in_stride elements apart). A thread takes 8-element groups, UNROLL of them with
// their loads in flight before its stores.
template <bool IN_BF16, int UNROLL, class RowOf>
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
            const uint32_t t = i / groups, off = stage_offset(i % groups);
            if constexpr (IN_BF16) {
                *reinterpret_cast<uint4 *>(xs + (size_t)t * xstride + off) = pair_order(buf[u][0]);
            } else {
                uint4 hi, lo;
                split_hi_lo(buf[u][0], buf[u][1], hi, lo);
                *reinterpret_cast<uint4 *>(xs + (size_t)(2 * t) * xstride + off) = hi;
                *reinterpret_cast<uint4 *>(xs + (size_t)(2 * t + 1) * xstride + off) = lo;
            }
        }
    }
}

// 2^8 / divisor of a stacked row: undoes the operand's 2^-8 and applies the divisor as the CPU
// codec does (a multiply by 1 / divisor).
__device__ __forceinline__ float row_factor(const DevMat &W, uint64_t grow)
{
    return (1.0f / W.divisors[grow / W.rows_per_div]) * 256.0f;
}

} // namespace nf
