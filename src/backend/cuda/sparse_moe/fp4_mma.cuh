// nvfp4 weights as bf16 tensor-core operands (gemv_fp4.cu). Host-callable so the decode can be
// checked exhaustively on the CPU (tests/cuda/test_fp4_decode.cu).
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

} // namespace nf
