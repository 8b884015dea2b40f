// Device codecs of the four import-only GGUF codecs (q2_k, q3_k, iq4_xs, iq4_nl: GGUF files carry
// them, nothing encodes to them), in dev_codecs.cuh's interface and its row-planar layout (fields
// largest first: devmat.cu's planar_layout). Piece shapes:
//   q2_k, q3_k: as q6_k, a piece is 4 bytes of one 128-element half of the 2-bit plane: 4 runs of 4
//     elements, 32 apart (the four 2-bit fields of each byte); q3_k adds the same 4 bytes of its
//     high-bit mask.
//   iq4_xs: as q4_k, a piece is 8 quant bytes of one 32-element sub-block: the low nibbles are 8
//     elements, the high nibbles the 8 elements 16 later (2 runs of 8).
//   iq4_nl: a 32-element block is 2 such pieces (8 quant bytes each).
// Values are bit-identical to the CPU decoders (src/codec/q2_k.c, q3_k.c, iq4.c): the same float
// operations in the same order, every product through mul_rn so that nvcc cannot contract q2_k's
// (d sc) q - (dmin m) into an FMA (one rounding fewer than the CPU's). The functions are
// host-callable, so test_import_decode checks them bit for bit against the CPU decoders on the host.
#pragma once
#include "dev_codecs.cuh"

namespace nf {

// __byte_perm for selectors whose nibbles have bit 3 clear (the callers mask it), on the host too.
NF_HD uint32_t perm(uint32_t x, uint32_t y, uint32_t s)
{
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, s);
#else
    const uint64_t v = (uint64_t)y << 32 | x;
    uint32_t r = 0;
    for (int n = 0; n < 4; n++) r |= (uint32_t)((v >> (8 * ((s >> (4 * n)) & 7))) & 0xFF) << (8 * n);
    return r;
#endif
}

// a * b rounded once, never fused with a neighbouring add (the CPU's two roundings).
NF_HD float mul_rn(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

// 2^23 + byte i of v, exactly (dev_codecs.cuh's byte_f23, host-callable).
NF_HD float byte_f23x(uint32_t v, int i) { return f32_of_bits(perm(v, 0x4B000000u, 0x7540u | (uint32_t)i)); }

// ---- q2_k: fields qs[64], scales[16] (scale | min << 4), d/dmin[4] --------------------------------
struct CQ2K {
    static constexpr int BLK = 256, PIECES = 16, PE = 16, RUNS = 4, RUN = 4;
    struct Row {
        const uint8_t *qs, *sc, *dm;
    };
    struct Raw {
        uint32_t qs;
        uint2 sc; // the 8 scale bytes of this half-block
        uint32_t dm;
    };
    NF_HD static Row row(const DevMat &m, uint32_t e, uint32_t r)
    {
        const uint8_t *p = row_ptr(m, e, r);
        return Row{p + m.plane[0], p + m.plane[1], p + m.plane[2]};
    }
    // piece p of a block: half p / 8, bytes l0 = 4 (p % 8) ..; run r is elements half 128 + l0 + 32 r ..
    NF_HD static int elem(int q, int run) { return (q >> 4) * 256 + ((q & 15) >> 3) * 128 + (q & 7) * 4 + run * 32; }
    NF_HD static Raw load(const Row &R, int q)
    {
        const int b = q >> 4, half = (q & 15) >> 3, l0 = (q & 7) * 4;
        Raw w;
        w.qs = *reinterpret_cast<const uint32_t *>(R.qs + b * 64 + half * 32 + l0);
        w.sc = *reinterpret_cast<const uint2 *>(R.sc + b * 16 + half * 8);
        w.dm = *reinterpret_cast<const uint32_t *>(R.dm + b * 4);
        return w;
    }
    NF_HD static void decode(const Row &, const Raw &w, int q, float *out)
    {
        // run r's sub-block is 2r + is of the half (is = l0 / 16): scale byte is, is + 2 of word x
        // (runs 0, 1) and of word y (runs 2, 3)
        const int is = (q & 7) >> 2;
        const float d = h2f((uint16_t)w.dm), dmin = h2f((uint16_t)(w.dm >> 16));
        NF_UNROLL
        for (int r = 0; r < 4; r++) {
            const uint32_t sb = ((r < 2 ? w.sc.x : w.sc.y) >> (8 * is + 16 * (r & 1))) & 0xFF;
            const float dl = mul_rn(d, (float)(sb & 0xF)), ml = mul_rn(dmin, (float)(sb >> 4));
            const uint32_t v = (w.qs >> (2 * r)) & 0x03030303u; // the four 2-bit values of run r
            NF_UNROLL
            for (int i = 0; i < 4; i++) out[4 * r + i] = mul_rn(dl, byte_f23x(v, i) - 8388608.0f) - ml;
        }
    }
};

// ---- q3_k: fields qs[64], hmask[32], scales[12], d[2] ---------------------------------------------
// Sub-block s's 6-bit scale from the 12 scale bytes held as three words (shifts only: a run-time
// index into a local array would put the bytes in local memory): s = 8 half + j, j < 8; its low
// nibble is nibble `half` of byte j, its high two bits are bits 2 (s / 4) of byte 8 + s % 4.
NF_HD int k3_scale(uint32_t w0, uint32_t w1, uint32_t w2, int half, int j)
{
    const int lo = (int)(((j < 4 ? w0 : w1) >> (8 * (j & 3) + 4 * half)) & 0xF);
    const int hi = (int)((w2 >> (8 * (j & 3) + 2 * (2 * half + (j >> 2)))) & 3);
    return (lo | hi << 4) - 32;
}

struct CQ3K {
    static constexpr int BLK = 256, PIECES = 16, PE = 16, RUNS = 4, RUN = 4;
    struct Row {
        const uint8_t *qs, *hm, *sc, *d;
    };
    struct Raw {
        uint32_t qs, hm;
        uint32_t sc[3];
        uint16_t d;
    };
    NF_HD static Row row(const DevMat &m, uint32_t e, uint32_t r)
    {
        const uint8_t *p = row_ptr(m, e, r);
        return Row{p + m.plane[0], p + m.plane[1], p + m.plane[2], p + m.plane[3]};
    }
    NF_HD static int elem(int q, int run) { return CQ2K::elem(q, run); }
    NF_HD static Raw load(const Row &R, int q)
    {
        const int b = q >> 4, half = (q & 15) >> 3, l0 = (q & 7) * 4;
        Raw w;
        w.qs = *reinterpret_cast<const uint32_t *>(R.qs + b * 64 + half * 32 + l0);
        w.hm = *reinterpret_cast<const uint32_t *>(R.hm + b * 32 + l0);
        const uint32_t *s = reinterpret_cast<const uint32_t *>(R.sc + b * 12);
        w.sc[0] = s[0], w.sc[1] = s[1], w.sc[2] = s[2];
        w.d = *reinterpret_cast<const uint16_t *>(R.d + b * 2);
        return w;
    }
    NF_HD static void decode(const Row &, const Raw &w, int q, float *out)
    {
        const int half = (q & 15) >> 3, is = (q & 7) >> 2;
        const float d = h2f(w.d);
        NF_UNROLL
        for (int r = 0; r < 4; r++) {
            const float dl = mul_rn(d, (float)k3_scale(w.sc[0], w.sc[1], w.sc[2], half, 2 * r + is));
            // low 2 bits | the mask's bit (4 half + r) << 2: q + 4, q in [-4, 3] (-4 where the bit is clear)
            const uint32_t v = ((w.qs >> (2 * r)) & 0x03030303u) | (((w.hm >> (4 * half + r)) & 0x01010101u) << 2);
            NF_UNROLL
            for (int i = 0; i < 4; i++) out[4 * r + i] = mul_rn(dl, byte_f23x(v, i) - 8388612.0f); // 2^23 + 4
        }
    }
};

// ---- iq4_xs / iq4_nl: the 16-entry non-linear table by byte permute ------------------------------
// kvalues_iq4nl + 128 (so each is a byte: 1, 24, 45, 63, ..., 241) as four little-endian words. The
// table lives in the instruction stream: a run-time index into a local array would spill it to
// local memory, and a __constant__ table serialises a warp's distinct indices, shared memory needs
// every kernel to fill it first. One lookup maps 4 nibbles in 3 permutes: entries 0-7 and 8-15 by
// the low 3 bits of each nibble, then the byte of either by its bit 3.
constexpr uint32_t kIq4T0 = 0x3F2D1801u, kIq4T1 = 0x766A5D4Fu, kIq4T2 = 0xA6998D81u, kIq4T3 = 0xF1D9C5B5u;

// The 4 nibbles of s's low 16 bits (nibble n in bits 4n .. 4n + 3) as table bytes (entry + 128), byte n.
NF_HD uint32_t iq4_lookup(uint32_t s)
{
    const uint32_t sel = s & 0x7777u;
    const uint32_t lo = perm(kIq4T0, kIq4T1, sel), hi = perm(kIq4T2, kIq4T3, sel);
    return perm(lo, hi, 0x3210u | ((s >> 1) & 0x4444u));
}

// A piece's 16 values from its 8 quant bytes: element k (< 8) the low nibble of byte k, element 8 + k
// its high nibble (16 elements later in the block), each dl * kv. A 16-bit half of a word selects
// (lo, hi) nibbles of two bytes in turn, so lookup bytes 0, 2 are low nibbles, 1, 3 high ones.
NF_HD void iq4_values(uint2 qs, float dl, float *out)
{
    const uint32_t words[2] = {qs.x, qs.y};
    NF_UNROLL
    for (int h = 0; h < 2; h++) {
        NF_UNROLL
        for (int p = 0; p < 2; p++) { // bytes 2p, 2p + 1 of the word
            const uint32_t t = iq4_lookup(words[h] >> (16 * p));
            const int k = 4 * h + 2 * p;
            // 2^23 + kv + 128 - (2^23 + 128): kv, exact
            out[k] = mul_rn(dl, byte_f23x(t, 0) - 8388736.0f);
            out[k + 1] = mul_rn(dl, byte_f23x(t, 2) - 8388736.0f);
            out[8 + k] = mul_rn(dl, byte_f23x(t, 1) - 8388736.0f);
            out[8 + k + 1] = mul_rn(dl, byte_f23x(t, 3) - 8388736.0f);
        }
    }
}

// ---- iq4_xs: fields qs[128], head[8] (d f16 | scales_h u16 | scales_l[4]) -------------------------
struct CIQ4XS {
    static constexpr int BLK = 256, PIECES = 16, PE = 16, RUNS = 2, RUN = 8;
    struct Row {
        const uint8_t *qs, *hd;
    };
    struct Raw {
        uint2 qs, hd;
    };
    NF_HD static Row row(const DevMat &m, uint32_t e, uint32_t r)
    {
        const uint8_t *p = row_ptr(m, e, r);
        return Row{p + m.plane[0], p + m.plane[1]};
    }
    // piece p of a block: sub-block p / 2, bytes 8 (p % 2) ..; run 1 is 16 elements after run 0
    NF_HD static int elem(int q, int run) { return (q >> 4) * 256 + ((q & 15) >> 1) * 32 + (q & 1) * 8 + run * 16; }
    NF_HD static Raw load(const Row &R, int q)
    {
        const int b = q >> 4;
        Raw w;
        w.qs = *reinterpret_cast<const uint2 *>(R.qs + b * 128 + (q & 15) * 8);
        w.hd = *reinterpret_cast<const uint2 *>(R.hd + b * 8);
        return w;
    }
    NF_HD static void decode(const Row &, const Raw &w, int q, float *out)
    {
        // sub-block ib's 6-bit scale: nibble ib of scales_l (word y), bits 2 ib of scales_h (x >> 16)
        const int ib = (q & 15) >> 1;
        const int ls = (int)(((w.hd.y >> (4 * ib)) & 0xF) | (((w.hd.x >> (16 + 2 * ib)) & 3) << 4)) - 32;
        iq4_values(w.qs, mul_rn(h2f((uint16_t)w.hd.x), (float)ls), out);
    }
};

// ---- iq4_nl: fields qs[16], d[2]; a piece is half a block's quant bytes ---------------------------
struct CIQ4NL {
    static constexpr int BLK = 32, PIECES = 2, PE = 16, RUNS = 2, RUN = 8;
    struct Row {
        const uint8_t *qs, *d;
    };
    struct Raw {
        uint2 qs;
        uint16_t d;
    };
    NF_HD static Row row(const DevMat &m, uint32_t e, uint32_t r)
    {
        const uint8_t *p = row_ptr(m, e, r);
        return Row{p + m.plane[0], p + m.plane[1]};
    }
    NF_HD static int elem(int q, int run) { return (q >> 1) * 32 + (q & 1) * 8 + run * 16; }
    NF_HD static Raw load(const Row &R, int q)
    {
        Raw w;
        w.qs = *reinterpret_cast<const uint2 *>(R.qs + q * 8);
        w.d = *reinterpret_cast<const uint16_t *>(R.d + (q >> 1) * 2);
        return w;
    }
    NF_HD static void decode(const Row &, const Raw &w, int, float *out) { iq4_values(w.qs, h2f(w.d), out); }
};

} // namespace nf
