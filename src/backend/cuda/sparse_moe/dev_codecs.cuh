// Device-side codecs for the sparse-MoE kernels, in the kernels' layout (docs/sparse_moe.md):
//
//   row codecs are stored ROW-PLANAR: within one row, each field of the GGUF block is gathered
//   for all nb blocks of the row, fields largest first, so every field a lane reads is naturally
//   aligned (q6_k's 210-byte blocks are not, in GGUF order); rows are padded to 16 bytes.
//   nvfp4 keeps its plane set (data plane, swizzled 128x4 scale plane, divisor words).
//
// Each codec exposes the same shape to the kernels: a row is a sequence of pieces (PIECES per GGUF
// block), each handled by one lane: load(row, q) fetches its raw bytes (so a lane can put several
// pieces' loads in flight before using any), decode(row, raw, q, w) turns them into PE floats that
// form RUNS contiguous runs of RUN elements; elem(q, r) is the first element of run r of piece q.
// Values follow llama.cpp's dequantization formulas (nvfp4: e2m1 * (e4m3 / divisor)).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include "base/fastdiv.h"

// Functions the host may call too (the span arithmetic is checked on the CPU: test_a8_spans).
#define NF_HD __host__ __device__ __forceinline__

// #pragma unroll in host-callable code (the host compiler does not know it).
#ifdef __CUDA_ARCH__
#define NF_UNROLL _Pragma("unroll")
#else
#define NF_UNROLL
#endif

namespace nf {

// The descriptor every kernel gets for one bank matrix (POD, passed by value).
struct DevMat {
    const uint8_t *data;       // expert e, row r starts at data + (e * rows + r) * row_stride (row codecs)
    uint64_t row_stride;       // bytes, multiple of 16 (row codecs); cols / 2 for nvfp4
    uint32_t rows, cols;       // per expert
    uint32_t nb;               // GGUF blocks per row (row codecs)
    uint32_t plane[4];         // byte offset of each field plane inside a row (row-planar codecs)
    const uint8_t *scales;     // nvfp4: swizzled scale plane of the whole stacked matrix
    const float *divisors;     // nvfp4: [D]
    nf_fastdiv rows_per_div;   // nvfp4: stacked rows sharing one divisor, as a multiply-shift (div_word)
    uint32_t kt;               // nvfp4: scale tiles along K = ceil(cols / 64)
};

NF_HD const uint8_t *row_ptr(const DevMat &m, uint32_t e, uint32_t r)
{
    return m.data + ((uint64_t)e * m.rows + r) * m.row_stride;
}

// nvfp4: the divisor word of stacked row grow (= expert * rows + row; bind keeps it below 2^31).
NF_HD uint32_t div_word(const DevMat &m, uint64_t grow) { return nf_fastdiv_apply((uint32_t)grow, m.rows_per_div); }

// The float with bits u, on the host too (host-callable decoders and their CPU tests).
NF_HD float f32_of_bits(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

NF_HD float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }

// 2^23 + byte i of v as a float, exactly, in one byte permute (the byte in the mantissa of 2^23,
// without the conversion unit). The decoders gather a codec's four values of one byte position into
// a word with a mask or shift or two, and subtract 2^23 (plus any offset of the codec: the difference
// is a small integer, exact) in one add: with the scale's multiply, 3 instructions a weight where a
// shift, a mask, an or and one or two adds had each value. (The copy kernel, with its row lookup by
// multiply: 14 % (q4_k), 27 % (q6_k), 29 % (q8_0) fewer instructions executed, ncu; the mma.sync
// prefill, which decodes in its MMA loop: 0.92 - 0.97x the layer's time at T = 64, H200;
// docs/sparse_moe.md, "The decoders' values by byte permute".)
__device__ __forceinline__ float byte_f23(uint32_t v, int i) { return __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7540u | i)); }
__device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
// f as bf16 bits, round to nearest even.
__device__ __forceinline__ uint16_t f2bf(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
// Two floats as one bf16x2 word (lo in the low half), each rounded to nearest even.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) { return (uint32_t)f2bf(lo) | ((uint32_t)f2bf(hi) << 16); }

// ---- q4_k: fields qs[128], scales[12], d/dmin[4] -------------------------------------------------
// The 6-bit scale and min of sub-block s (get_scale_min_k4), from the 12 scale bytes held as three
// words: shifts only, so nothing is indexed at run time (which would put the bytes in local memory).
NF_HD void k4_scale_min(uint32_t w0, uint32_t w1, uint32_t w2, int s, int &sc, int &m)
{
    const int sh = 8 * (s & 3);
    const int lo = (w0 >> sh) & 0xFF, mid = (w1 >> sh) & 0xFF, hi = (w2 >> sh) & 0xFF;
    if (s < 4) {
        sc = lo & 63;
        m = mid & 63;
    } else {
        sc = (hi & 0xF) | ((lo >> 6) << 4);
        m = (hi >> 4) | ((mid >> 6) << 4);
    }
}

// q4_k and q5_k share the scale fields: block b's 12 scale bytes (as three words) and d/dmin.
NF_HD void k4_load_scales(const uint8_t *sc, const uint8_t *dm, int b, uint32_t w[3], uint32_t &dmw)
{
    const uint32_t *p = reinterpret_cast<const uint32_t *>(sc + b * 12);
    w[0] = p[0], w[1] = p[1], w[2] = p[2];
    dmw = *reinterpret_cast<const uint32_t *>(dm + b * 4);
}

// The scales and mins (d * sc, dmin * m) of sub-blocks 2j and 2j + 1.
NF_HD void k4_sub_scales(const uint32_t w[3], uint32_t dmw, int j, float &d1, float &mm1, float &d2,
                                              float &mm2)
{
    const float d = h2f((uint16_t)dmw), dmin = h2f((uint16_t)(dmw >> 16));
    int s1, m1, s2, m2;
    k4_scale_min(w[0], w[1], w[2], 2 * j, s1, m1);
    k4_scale_min(w[0], w[1], w[2], 2 * j + 1, s2, m2);
    d1 = d * s1, mm1 = dmin * m1, d2 = d * s2, mm2 = dmin * m2;
}

// A q4_k / q5_k piece's 16 values from its four words of unsigned quants (xl, yl: sub-block 2j's
// byte positions 0-3 and 4-7; xh, yh: sub-block 2j + 1's), each d * q - dmin * m of its sub-block.
__device__ __forceinline__ void k4_values(uint32_t xl, uint32_t yl, uint32_t xh, uint32_t yh, float d1, float mm1,
                                          float d2, float mm2, float *out)
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        out[i] = d1 * (byte_f23(xl, i) - 8388608.0f) - mm1;
        out[4 + i] = d1 * (byte_f23(yl, i) - 8388608.0f) - mm1;
        out[8 + i] = d2 * (byte_f23(xh, i) - 8388608.0f) - mm2;
        out[12 + i] = d2 * (byte_f23(yh, i) - 8388608.0f) - mm2;
    }
}

struct CQ4K {
    static constexpr int BLK = 256, PIECES = 16, PE = 16, RUNS = 2, RUN = 8;
    struct Row {
        const uint8_t *qs, *sc, *dm;
    };
    struct Raw {
        uint2 qs;
        uint32_t sc[3];
        uint32_t dm;
    };
    NF_HD static Row row(const DevMat &m, uint32_t e, uint32_t r)
    {
        const uint8_t *p = row_ptr(m, e, r);
        return Row{p + m.plane[0], p + m.plane[1], p + m.plane[2]};
    }
    __device__ static int elem(int q, int run) { return (q >> 4) * 256 + ((q & 15) >> 2) * 64 + (q & 3) * 8 + run * 32; }
    __device__ static Raw load(const Row &R, int q)
    {
        const int b = q >> 4, p = q & 15;
        Raw w;
        w.qs = *reinterpret_cast<const uint2 *>(R.qs + b * 128 + (p >> 2) * 32 + (p & 3) * 8);
        k4_load_scales(R.sc, R.dm, b, w.sc, w.dm);
        return w;
    }
    __device__ static void decode(const Row &, const Raw &w, int q, float *out)
    {
        const int j = (q & 15) >> 2;
        float d1, mm1, d2, mm2;
        k4_sub_scales(w.sc, w.dm, j, d1, mm1, d2, mm2);
        const uint32_t xl = w.qs.x & 0x0F0F0F0Fu, yl = w.qs.y & 0x0F0F0F0Fu;
        const uint32_t xh = (w.qs.x >> 4) & 0x0F0F0F0Fu, yh = (w.qs.y >> 4) & 0x0F0F0F0Fu;
        k4_values(xl, yl, xh, yh, d1, mm1, d2, mm2, out);
    }
};

// ---- q5_k: fields qs[128], qh[32], scales[12], d/dmin[4] -----------------------------------------
struct CQ5K {
    static constexpr int BLK = 256, PIECES = 16, PE = 16, RUNS = 2, RUN = 8;
    struct Row {
        const uint8_t *qs, *qh, *sc, *dm;
    };
    struct Raw {
        uint2 qs, qh;
        uint32_t sc[3];
        uint32_t dm;
    };
    NF_HD static Row row(const DevMat &m, uint32_t e, uint32_t r)
    {
        const uint8_t *p = row_ptr(m, e, r);
        return Row{p + m.plane[0], p + m.plane[1], p + m.plane[2], p + m.plane[3]};
    }
    __device__ static int elem(int q, int run) { return CQ4K::elem(q, run); }
    __device__ static Raw load(const Row &R, int q)
    {
        const int b = q >> 4, p = q & 15, l0 = (p & 3) * 8;
        Raw w;
        w.qs = *reinterpret_cast<const uint2 *>(R.qs + b * 128 + (p >> 2) * 32 + l0);
        w.qh = *reinterpret_cast<const uint2 *>(R.qh + b * 32 + l0);
        k4_load_scales(R.sc, R.dm, b, w.sc, w.dm);
        return w;
    }
    __device__ static void decode(const Row &, const Raw &w, int q, float *out)
    {
        const int j = (q & 15) >> 2;
        float d1, mm1, d2, mm2;
        k4_sub_scales(w.sc, w.dm, j, d1, mm1, d2, mm2);
        const int b1 = 2 * j, b2 = 2 * j + 1;
        // the four 5-bit values of each byte position: a nibble of qs, bit b1 (low) or b2 (high) of qh
        constexpr uint32_t kN = 0x0F0F0F0Fu, kB = 0x01010101u;
        const uint32_t xl = (w.qs.x & kN) | (((w.qh.x >> b1) & kB) << 4), yl = (w.qs.y & kN) | (((w.qh.y >> b1) & kB) << 4);
        const uint32_t xh = ((w.qs.x >> 4) & kN) | (((w.qh.x >> b2) & kB) << 4);
        const uint32_t yh = ((w.qs.y >> 4) & kN) | (((w.qh.y >> b2) & kB) << 4);
        k4_values(xl, yl, xh, yh, d1, mm1, d2, mm2, out);
    }
};

// ---- q6_k: fields ql[128], qh[64], scales[16] (int8), d[2] ----------------------------------------
struct CQ6K {
    static constexpr int BLK = 256, PIECES = 16, PE = 16, RUNS = 4, RUN = 4;
    struct Row {
        const uint8_t *ql, *qh, *sc, *d;
    };
    struct Raw {
        uint32_t qa, qb, qh;
        uint2 sc; // the 8 scale bytes of this half-block
        uint16_t d;
    };
    NF_HD static Row row(const DevMat &m, uint32_t e, uint32_t r)
    {
        const uint8_t *p = row_ptr(m, e, r);
        return Row{p + m.plane[0], p + m.plane[1], p + m.plane[2], p + m.plane[3]};
    }
    // piece p of a block: half = p / 8 (128 elements each), l0 = 4 * (p % 8); run r covers
    // elements half*128 + l0 + 32*r .. +4
    __device__ static int elem(int q, int run) { return (q >> 4) * 256 + ((q & 15) >> 3) * 128 + (q & 7) * 4 + run * 32; }
    __device__ static Raw load(const Row &R, int q)
    {
        const int b = q >> 4, p = q & 15, half = p >> 3, l0 = (p & 7) * 4;
        Raw w;
        w.qa = *reinterpret_cast<const uint32_t *>(R.ql + b * 128 + half * 64 + l0);
        w.qb = *reinterpret_cast<const uint32_t *>(R.ql + b * 128 + half * 64 + l0 + 32);
        w.qh = *reinterpret_cast<const uint32_t *>(R.qh + b * 64 + half * 32 + l0);
        w.sc = *reinterpret_cast<const uint2 *>(R.sc + b * 16 + half * 8);
        w.d = *reinterpret_cast<const uint16_t *>(R.d + b * 2);
        return w;
    }
    __device__ static void decode(const Row &, const Raw &w, int q, float *out)
    {
        const int is = ((q & 7) * 4) >> 4; // l0 / 16: scales is, is+2 (word x) and is+4, is+6 (word y)
        const float d = h2f(w.d);
        const float s0 = d * (int8_t)(w.sc.x >> (8 * is)), s1 = d * (int8_t)(w.sc.x >> (8 * is + 16));
        const float s2 = d * (int8_t)(w.sc.y >> (8 * is)), s3 = d * (int8_t)(w.sc.y >> (8 * is + 16));
        // the four 6-bit values of each byte position: low or high nibble of qa / qb, two bits of qh
        constexpr uint32_t kN = 0x0F0F0F0Fu, kH = 0x30303030u;
        const uint32_t v0 = (w.qa & kN) | ((w.qh << 4) & kH), v1 = (w.qb & kN) | ((w.qh << 2) & kH);
        const uint32_t v2 = ((w.qa >> 4) & kN) | (w.qh & kH), v3 = ((w.qb >> 4) & kN) | ((w.qh >> 2) & kH);
#pragma unroll
        for (int i = 0; i < 4; i++) { // 2^23 + q - (2^23 + 32): q - 32, exact
            out[i] = s0 * (byte_f23(v0, i) - 8388640.0f);
            out[4 + i] = s1 * (byte_f23(v1, i) - 8388640.0f);
            out[8 + i] = s2 * (byte_f23(v2, i) - 8388640.0f);
            out[12 + i] = s3 * (byte_f23(v3, i) - 8388640.0f);
        }
    }
};

// ---- q8_0: fields qs[32] (int8), d[2]; a piece is half a block ------------------------------------
struct CQ8 {
    static constexpr int BLK = 32, PIECES = 2, PE = 16, RUNS = 1, RUN = 16;
    struct Row {
        const uint8_t *qs, *d;
    };
    struct Raw {
        int4 qs;
        uint16_t d;
    };
    NF_HD static Row row(const DevMat &m, uint32_t e, uint32_t r)
    {
        const uint8_t *p = row_ptr(m, e, r);
        return Row{p + m.plane[0], p + m.plane[1]};
    }
    __device__ static int elem(int q, int) { return q * 16; }
    __device__ static Raw load(const Row &R, int q)
    {
        Raw w;
        w.qs = *reinterpret_cast<const int4 *>(R.qs + q * 16);
        w.d = *reinterpret_cast<const uint16_t *>(R.d + (q >> 1) * 2);
        return w;
    }
    __device__ static void decode(const Row &, const Raw &w, int, float *out)
    {
        const float d = h2f(w.d);
        // int8 q as the byte q + 128 (sign bit flipped); 2^23 + q + 128 - (2^23 + 128): q, exact
        const uint32_t words[4] = {(uint32_t)w.qs.x ^ 0x80808080u, (uint32_t)w.qs.y ^ 0x80808080u,
                                   (uint32_t)w.qs.z ^ 0x80808080u, (uint32_t)w.qs.w ^ 0x80808080u};
#pragma unroll
        for (int i = 0; i < 16; i++) out[i] = d * (byte_f23(words[i >> 2], i & 3) - 8388736.0f);
    }
};

// ---- bf16: a piece is 8 consecutive values ---------------------------------------------------------
struct CBF16 {
    static constexpr int BLK = 8, PIECES = 1, PE = 8, RUNS = 1, RUN = 8;
    struct Row {
        const uint8_t *p;
    };
    struct Raw {
        uint4 v;
    };
    __device__ static Row row(const DevMat &m, uint32_t e, uint32_t r) { return Row{row_ptr(m, e, r)}; }
    __device__ static int elem(int q, int) { return q * 8; }
    __device__ static Raw load(const Row &R, int q) { return Raw{*reinterpret_cast<const uint4 *>(R.p + q * 16)}; }
    __device__ static void decode(const Row &, const Raw &w, int, float *out)
    {
        const uint32_t words[4] = {w.v.x, w.v.y, w.v.z, w.v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            out[2 * i] = __uint_as_float(words[i] << 16);
            out[2 * i + 1] = __uint_as_float(words[i] & 0xFFFF0000u);
        }
    }
};

// ---- nvfp4: a piece is one 16-element scale block ------------------------------------------------
// e2m1 (sign bit 3, exponent bits 1-2 with bias 1, mantissa bit 0) placed into an f16's sign,
// low exponent and top mantissa bits is exactly e2m1 * 2^-14 (subnormals included): a few integer
// ops instead of a table, whose run-time index would spill to local memory.
__device__ __forceinline__ float e2m1_f(uint32_t nib)
{
    __half_raw hr;
    hr.x = (uint16_t)(((nib & 8) << 12) | ((nib & 7) << 9));
    return __half2float(__half(hr)) * 16384.0f;
}
__device__ __forceinline__ float e4m3_f(uint32_t b)
{
    // float8_e4m3fn -> float: exact (no NaN reaches here: bind validates the planes)
    __half_raw hr;
    uint32_t s = (b & 0x80) << 8, em = b & 0x7F;
    // e4m3 (bias 7) -> f16 (bias 15): shift exponent+mantissa into place and rebias by 8;
    // subnormals (exp 0) are handled by the multiply below.
    hr.x = (uint16_t)(s | (em << 7));
    return __half2float(__half(hr)) * 256.0f;
}
NF_HD uint32_t nvfp4_scale_index(uint64_t m, uint32_t k, uint32_t kt)
{
    return (uint32_t)((m >> 7) * kt * 512 + (k >> 2) * 512 + (m & 31) * 16 + ((m & 127) >> 5) * 4 + (k & 3));
}

struct CNVFP4 {
    static constexpr int BLK = 16, PIECES = 1, PE = 16, RUNS = 1, RUN = 16;
    struct Row {
        const uint8_t *data;
        const uint8_t *scales;
        uint64_t grow;
        uint32_t kt;
        float inv_div;
    };
    struct Raw {
        uint2 v;
        uint8_t s;
    };
    __device__ static Row row(const DevMat &m, uint32_t e, uint32_t r)
    {
        uint64_t g = (uint64_t)e * m.rows + r;
        return Row{m.data + g * m.row_stride, m.scales, g, m.kt, 1.0f / m.divisors[div_word(m, g)]};
    }
    __device__ static int elem(int q, int) { return q * 16; }
    __device__ static Raw load(const Row &R, int q)
    {
        Raw w;
        w.v = *reinterpret_cast<const uint2 *>(R.data + q * 8);
        w.s = R.scales[nvfp4_scale_index(R.grow, q, R.kt)];
        return w;
    }
    __device__ static void decode(const Row &R, const Raw &w, int, float *out)
    {
        // e2m1 * (e4m3 / divisor), the order compressed-tensors dequantizes in
        const float s = e4m3_f(w.s) * R.inv_div;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t byte = ((i < 4 ? w.v.x : w.v.y) >> (8 * (i & 3))) & 0xFF;
            out[2 * i] = e2m1_f(byte & 0xF) * s;
            out[2 * i + 1] = e2m1_f(byte >> 4) * s;
        }
    }
};

} // namespace nf
