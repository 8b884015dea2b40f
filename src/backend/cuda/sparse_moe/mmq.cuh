// The grouped int8 tensor-core GEMM ("mmq", mmq.cu) per codec: what a CTA stages of a weight row for
// one K slice, how a warp turns the staged bytes into int8 A fragments of mma.m16n8k32 (mma.m16n8k16
// for q6_k's 16-element scale groups), and how each group's exact int32 dot enters the f32
// accumulator with the weight and activation scales. Host-callable, so tests/cuda/test_mmq_tile.cu
// checks the fragments, under an emulated MMA, against the CPU decoders on the host.
//
// Fragment layout (PTX ISA, mma.m16n8k32 .s8, and m16n8k16 .s8), lane = 4 g + t:
//   A (16 x K, row): register i holds 4 consecutive K bytes of row g + 8 (i & 1), starting at
//                    K byte 16 (i >> 1) + 4 t (k16: registers 0, 1 only)
//   B (K x 8, col):  register i holds 4 consecutive K bytes of column (position) g at 16 i + 4 t
//   C (16 x 8, s32): element i is row g + 8 (i >> 1), column 2 t + (i & 1)
// So every fragment register is one word of 4 consecutive elements of one row: a codec only has to
// give word(row, group, c) = its int8 values of elements c .. c + 3 of a scale group.
//
// Numerics (the W·A8 routes': quant_a8.cuh, spans_a8.cuh): x quantised per 32 elements to (d_x, q),
// stored with s_x = fl(d_x sum q). A group's integer dot sum q_w q is exact in the MMA's int32
// (|sum| <= 32 * 128 * 128 < 2^19), and enters the f32 accumulator as
//     acc = fma(fl(d_s d_x), (float)sum, acc);  acc = fma(-m_s, s_x, acc)   (the min term: q4_k, q5_k)
// with d_s = fl(d * sc) and m_s = fl(dmin * m), the same operand values gemv_a8.cu's span policies
// form; the groups are folded one after another in element order (the chain moe_ref.c's W·A8
// reference models for this route).
#pragma once
#include <stdint.h>

#include "dev_codecs.cuh"

namespace nf {
// The codecs the mmq kernels take (nf_codec_id): q8_0 (3), q4_k (4), q5_k (5), q6_k (6).
NF_HD constexpr bool mmq_codec(int codec) { return codec >= 3 && codec <= 6; }

// A little-endian word of the 4 bytes at p (4-byte aligned).
NF_HD uint32_t mmq_ld32(const uint8_t *p) { return *reinterpret_cast<const uint32_t *>(p); }

// Each codec policy:
//   SLICE   elements of K per pipeline stage (a whole number of its blocks)
//   QB      quant bytes a row stages per slice (QB / 16 chunks of 16 bytes)
//   GE      elements per scale group = the MMA's K (32: m16n8k32, 16: m16n8k16)
//   MINS    the group has a min term (-m_s s_x)
//   chunk(W, c, kt): byte offset inside the row of staged chunk c of slice kt
//   meta_off(W), meta_bytes(W): the row's scale fields (one contiguous run at the row's end, staged
//            once per CTA, rounded up to 16 bytes: still inside the row's 16-byte padding)
//   scale(meta, nb, kt, j, ds, ms): group j of slice kt's d_s and m_s (0 without mins)
//   word(q, j, c): the int8 values of elements c .. c + 3 of group j from the row's staged bytes q
struct MmqQ4K {
    static constexpr int SLICE = 256, QB = 128, GE = 32;
    static constexpr bool MINS = true;
    NF_HD static uint32_t chunk(const DevMat &W, int c, uint32_t kt) { return W.plane[0] + kt * 128 + 16 * c; }
    NF_HD static uint32_t meta_off(const DevMat &W) { return W.plane[1]; }
    NF_HD static uint32_t meta_bytes(const DevMat &W) { return W.nb * 16; } // scales[12] then d/dmin[4] per block
    NF_HD static void scale(const uint8_t *meta, uint32_t nb, uint32_t kt, int j, float &ds, float &ms)
    {
        const uint8_t *sc = meta + kt * 12;
        const uint32_t dm = mmq_ld32(meta + nb * 12 + kt * 4);
        int s, m;
        k4_scale_min(mmq_ld32(sc), mmq_ld32(sc + 4), mmq_ld32(sc + 8), j, s, m);
        ds = h2f((uint16_t)dm) * s;
        ms = h2f((uint16_t)(dm >> 16)) * m;
    }
    // sub-block j: the low (j even) or high nibbles of qs bytes 32 (j / 2) + c ..
    NF_HD static uint32_t word(const uint8_t *q, int j, int c)
    {
        return (mmq_ld32(q + (j >> 1) * 32 + c) >> (4 * (j & 1))) & 0x0F0F0F0Fu;
    }
};

struct MmqQ5K {
    static constexpr int SLICE = 256, QB = 160, GE = 32;
    static constexpr bool MINS = true;
    // chunks 0..7: the block's qs, 8..9: its qh
    NF_HD static uint32_t chunk(const DevMat &W, int c, uint32_t kt)
    {
        return c < 8 ? W.plane[0] + kt * 128 + 16 * c : W.plane[1] + kt * 32 + 16 * (c - 8);
    }
    NF_HD static uint32_t meta_off(const DevMat &W) { return W.plane[2]; }
    NF_HD static uint32_t meta_bytes(const DevMat &W) { return W.nb * 16; }
    NF_HD static void scale(const uint8_t *meta, uint32_t nb, uint32_t kt, int j, float &ds, float &ms)
    {
        MmqQ4K::scale(meta, nb, kt, j, ds, ms);
    }
    // q4_k's nibble plus bit j of qh byte c (the fifth bit of sub-block j's element c)
    NF_HD static uint32_t word(const uint8_t *q, int j, int c)
    {
        return MmqQ4K::word(q, j, c) | (((mmq_ld32(q + 128 + c) >> j) & 0x01010101u) << 4);
    }
};

struct MmqQ6K {
    static constexpr int SLICE = 256, QB = 192, GE = 16;
    static constexpr bool MINS = false;
    // chunks 0..7: the block's ql, 8..11: its qh
    NF_HD static uint32_t chunk(const DevMat &W, int c, uint32_t kt)
    {
        return c < 8 ? W.plane[0] + kt * 128 + 16 * c : W.plane[1] + kt * 64 + 16 * (c - 8);
    }
    NF_HD static uint32_t meta_off(const DevMat &W) { return W.plane[2]; }
    NF_HD static uint32_t meta_bytes(const DevMat &W) { return W.nb * 18; } // scales[16] per block, then d[2] per block
    NF_HD static void scale(const uint8_t *meta, uint32_t nb, uint32_t kt, int j, float &ds, float &ms)
    {
        const float d = h2f(*reinterpret_cast<const uint16_t *>(meta + nb * 16 + kt * 2));
        ds = d * (float)(int8_t)meta[kt * 16 + j];
        ms = 0.0f;
    }
    // group j = 8 n + 2 m + h (the scale index): elements 128 n + 32 m + 16 h + [0, 16); element
    // 16 h + c of run m is the (m >> 1) nibble of ql byte 64 n + 32 (m & 1) + 16 h + c with bits
    // 2m, 2m + 1 of qh byte 32 n + 16 h + c on top; (v + 0x60) ^ 0x80 per byte is v - 32 as a signed
    // byte (v + 0x60 <= 159: no carry leaves a byte)
    NF_HD static uint32_t word(const uint8_t *q, int j, int c)
    {
        const int n = j >> 3, m = (j >> 1) & 3, l = 16 * (j & 1) + c;
        const uint32_t lo = (mmq_ld32(q + 64 * n + 32 * (m & 1) + l) >> (4 * (m >> 1))) & 0x0F0F0F0Fu;
        const uint32_t hi = ((mmq_ld32(q + 128 + 32 * n + l) >> (2 * m)) & 0x03030303u) << 4;
        return ((lo | hi) + 0x60606060u) ^ 0x80808080u;
    }
};

struct MmqQ8 {
    static constexpr int SLICE = 128, QB = 128, GE = 32;
    static constexpr bool MINS = false;
    NF_HD static uint32_t chunk(const DevMat &W, int c, uint32_t kt) { return W.plane[0] + kt * 128 + 16 * c; }
    NF_HD static uint32_t meta_off(const DevMat &W) { return W.plane[1]; }
    NF_HD static uint32_t meta_bytes(const DevMat &W) { return W.nb * 2; } // d[2] per block
    NF_HD static void scale(const uint8_t *meta, uint32_t, uint32_t kt, int j, float &ds, float &ms)
    {
        ds = h2f(*reinterpret_cast<const uint16_t *>(meta + (kt * 4 + j) * 2));
        ms = 0.0f;
    }
    NF_HD static uint32_t word(const uint8_t *q, int j, int c) { return mmq_ld32(q + 32 * j + c); }
};

// The shared shape of every policy.
template <class C>
struct MmqShape {
    static constexpr int NG = C::SLICE / C::GE;  // scale groups per slice
    static constexpr int AREGS = C::GE / 8;      // A fragment registers (4: k32, 2: k16)
    static constexpr int BREGS = C::GE / 16;     // B fragment registers
    static constexpr int QC = C::QB / 16;        // staged 16-byte chunks a row a slice
    static constexpr int QS = C::QB + 16;        // staged row stride (bytes): the pad puts rows g and
                                                 // g + 1 on distinct banks for a fragment's loads
    static constexpr int XS = C::SLICE + 16;     // staged activation row stride (bytes), likewise
};

// Row g's and row g + 8's staged bytes q0, q1: the A fragment of group j for lane (g, t).
template <class C>
NF_HD void mmq_afrag(const uint8_t *q0, const uint8_t *q1, int j, int t, uint32_t (&a)[MmqShape<C>::AREGS])
{
NF_UNROLL
    for (int i = 0; i < MmqShape<C>::AREGS; i++) a[i] = C::word((i & 1) ? q1 : q0, j, 16 * (i >> 1) + 4 * t);
}

// Position g's staged int8 activations x (the slice's SLICE bytes): the B fragment of group j.
template <class C>
NF_HD void mmq_bfrag(const int8_t *x, int j, int t, uint32_t (&b)[MmqShape<C>::BREGS])
{
NF_UNROLL
    for (int i = 0; i < MmqShape<C>::BREGS; i++)
        b[i] = mmq_ld32(reinterpret_cast<const uint8_t *>(x) + j * C::GE + 16 * i + 4 * t);
}

// One group's exact dot into the f32 accumulator: xd = (d_x, s_x) of the 32-element activation
// block that holds the group.
template <class C>
NF_HD float mmq_fold(float acc, int isum, float ds, float ms, float2 xd)
{
    acc = fmaf(ds * xd.x, (float)isum, acc);
    if (C::MINS) acc = fmaf(-ms, xd.y, acc);
    return acc;
}

} // namespace nf
