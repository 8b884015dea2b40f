// nvfp4 weights as bf16 tensor-core operands: the Fp4Rows row format (mma_rows.cuh) of gemv_mma.cu (the
// GEMV) and down_mma.cu (the fused down + combine). The decode is host-callable so it can be checked
// exhaustively on the CPU (tests/cuda/test_fp4_decode.cu); so are the lane's loads and fragments
// (tests/cuda/test_mma_tile.cu), whose layout mma_rows.cuh describes.
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
// word with the one at bit p + 16 lets both halves of the bf16x2 share their instructions: a mask,
// an integer multiply, a mask and the bf16x2 multiply a pair (fp4_pair), plus one shift a word for
// the word's upper two pairs.
#pragma once
#include <stdint.h>
#include <string.h>

#include "mma_rows.cuh"

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
//
// The placement by an integer multiply: m, the pair's two nibbles masked out of the word (bits P..P+3
// and P+16..P+19, P = 4Q), times 2^a + 2^(a+6) with a = 6 - P is two copies of m, one shifted by a
// (magnitude bits 0-2 of each nibble at bits 6-8 and 22-24) and one by a + 6 (sign bit 3 at bits 15
// and 31). The copies occupy bits 6-9, 12-15, 22-25 and 28-31: disjoint, so the sum has no carries,
// and the top one ends at bit 31, so nothing is lost mod 2^32. The mask 0x81C081C0 keeps bits 6-8,
// 15, 22-24 and 31: the magnitudes and the signs. That is a mask, a multiply and a mask (LOP3, IMAD,
// LOP3) a pair against two shifts and two LOP3s placing magnitude and sign apart.
// For Q = 2, 3 (P = 8, 12) a would be negative: their nibbles are taken from w >> 8, where they sit as
// those of Q = 0, 1 (the same shift for both pairs of the word; the compiler shares it, one SHF a
// word). A multiply-high does not save it: one word of a 32 x 32-bit product holds only left-shifted
// (low word) or only right-shifted (high word) copies, and Q = 2 needs both (-2 for the magnitudes, +4
// for the signs). Q = 3 alone could skip the shift ((m >> 6) + m, one LEA.HI), which leaves the same
// count. The nvfp4 GEMV's K loop (T = 1 decode form, sm_90a SASS): 465 -> 433 instructions an
// iteration of two chunks (16 words a lane: 15 -> 13 decode instructions a word, HMUL2 aside).
template <int Q>
NF_HD uint32_t fp4_pair(uint32_t w, uint32_t s2)
{
    static_assert(Q >= 0 && Q < 4, "a word holds four nibble pairs");
    if constexpr (Q >= 2) {
        return fp4_pair<Q - 2>(w >> 8, s2);
    } else {
        constexpr int P = 4 * Q;
        const uint32_t m = w & (0x000F000Fu << P);
        const uint32_t t = (m * ((0x41u << 6) >> P)) & 0x81C081C0u; // 2^(6-P) + 2^(12-P)
        return bf16x2_mul(t, s2);
    }
}

// ---- nvfp4 rows as a 16-row tensor-core tile (the row-format policy of mma_rows.cuh) -------------
// Lane c reads 16 data bytes of row g and of row g + 8 per chunk (byte offset 16 c: elements 32 c ..
// 32 c + 31, words v = 0..3 of 8 nibbles) and the two scale bytes of those elements; words 0-1 are
// scale block 2c, words 2-3 block 2c+1. Word v feeds MMAs 2v and 2v+1: fp4_pair<Q> decodes the
// nibble pair (Q, Q + 4), which is the B pair order of mma_rows.cuh. A = e2m1 * e4m3 * 2^-8 (exact,
// above); the output row's factor 2^8 / divisor undoes the 2^-8 and applies the divisor as the CPU
// codec does (a multiply by 1 / divisor).
struct Fp4Rows {
    static constexpr int kChunk = 128;   // elements of a chunk: 64 data bytes of a row, 8 MMAs
    static constexpr int kChunkBytes = 64;
    static constexpr int kAuxPerChunk = 2; // scale lines of a row's chunk: aux_line 2 k, 2 k + 1
    static constexpr int kBatch = 2;     // chunks in flight (each: 2 x 16 data bytes + scales)
    static constexpr int kMinBlocks = 6; // the GEMV at 80 registers: 8 experts x 96 tiles in one wave
    // Where a lane reads its two rows: data at + 64 k, the scale pair at + 1024 k for chunk k.
    struct Lane {
        const uint8_t *da, *db, *sa, *sb;
    };
    // A lane's share of one chunk: 16 data bytes and the 2 scale bytes of row g (a) and row g + 8 (b).
    struct Chunk {
        uint4 a, b;
        uint32_t sa, sb;
    };
    // The same with the scales as bf16x2 {s, s} (fp4_scale2): blocks 2c and 2c + 1 of each row.
    struct Frag {
        uint4 a, b;
        uint32_t sa0, sa1, sb0, sb1;
    };

    static bool admits(const DevMat &W) { return W.scales && W.divisors; }
    // Group e8 of a row: chunk e8 / 16, lane c = (e8 / 4) % 4 and word v = e8 % 4 at 16 (4 v + c), so a
    // lane's four words are 64 bytes apart and the 4 lanes of a row group read 64 contiguous bytes per
    // word.
    NF_HD static uint32_t stage_offset(uint32_t e8)
    {
        return (e8 >> 4) * (2 * kChunk) + 16 * (4 * (e8 & 3) + ((e8 >> 2) & 3));
    }
    // The scale bytes of (stacked row grow, scale columns 8k + 2c, + 1) are adjacent: the swizzle keeps
    // a row's 4 scale columns of a 512-byte tile together and 8k + 2c is even. Chunk k adds 1024.
    NF_HD static const uint8_t *scale_base(const DevMat &W, uint64_t grow, int c)
    {
        return W.scales + nvfp4_scale_index(grow, 2 * c, W.kt);
    }
    NF_HD static Lane lane(const DevMat &W, uint64_t ga, uint64_t gb, int c)
    {
        return Lane{W.data + ga * W.row_stride + 16 * c, W.data + gb * W.row_stride + 16 * c, scale_base(W, ga, c),
                    scale_base(W, gb, c)};
    }
    NF_HD static Chunk load(const Lane &L, int k)
    {
        Chunk ch;
        ch.a = *reinterpret_cast<const uint4 *>(L.da + 64 * k);
        ch.b = *reinterpret_cast<const uint4 *>(L.db + 64 * k);
        ch.sa = *reinterpret_cast<const uint16_t *>(L.sa + 1024 * k);
        ch.sb = *reinterpret_cast<const uint16_t *>(L.sb + 1024 * k);
        return ch;
    }
    NF_HD static Frag frag(const Chunk &ch)
    {
        return Frag{ch.a, ch.b, fp4_scale2(ch.sa & 0xFF), fp4_scale2((ch.sa >> 8) & 0xFF), fp4_scale2(ch.sb & 0xFF),
                    fp4_scale2((ch.sb >> 8) & 0xFF)};
    }
    // MMA M: word v = M / 2 of each row, nibble pairs (0,4), (1,5) for even M, (2,6), (3,7) odd.
    template <int M>
    NF_HD static void a_regs(const Frag &f, uint32_t (&a)[4])
    {
        constexpr int Q = 2 * (M % 2);
        const uint32_t wa = word_of(f.a, M / 2), wb = word_of(f.b, M / 2);
        const uint32_t sa = M < 4 ? f.sa0 : f.sa1, sb = M < 4 ? f.sb0 : f.sb1;
        a[0] = fp4_pair<Q>(wa, sa);
        a[1] = fp4_pair<Q>(wb, sb);
        a[2] = fp4_pair<Q + 1>(wa, sa);
        a[3] = fp4_pair<Q + 1>(wb, sb);
    }
    // The divisor word of a stacked row, and the output factor 2^8 / divisor it gives (apart, so a
    // kernel can issue the load with its first weight loads and use it after its K loop).
    NF_HD static float divisor(const DevMat &W, uint64_t grow) { return W.divisors[div_word(W, grow)]; }
    NF_HD static float factor_of(float divisor) { return (1.0f / divisor) * 256.0f; }
    // A row's scales: 4 bytes in each 512-byte tile (4 scale columns), one line per tile.
    NF_HD static uint32_t aux_lines(const DevMat &W) { return W.kt; }
    NF_HD static const uint8_t *aux_line(const DevMat &W, uint64_t grow, uint32_t i)
    {
        return W.scales + nvfp4_scale_index(grow, 4 * i, W.kt);
    }
};

} // namespace nf
