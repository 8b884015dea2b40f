// Device-side codecs for the sparse-MoE kernels, in the kernels' layout (docs/sparse_moe.md):
//
//   row codecs are stored ROW-PLANAR: within one row, each field of the GGUF block is gathered
//   for all nb blocks of the row, fields largest first, so every field a lane reads is naturally
//   aligned (q6_k's 210-byte blocks are not, in GGUF order); rows are padded to 16 bytes.
//   nvfp4 keeps its plane set (data plane, swizzled 128x4 scale plane, divisor words).
//
// Each codec exposes the same shape to the kernels: a row is a sequence of PIECES, each decoded by
// one lane into PE floats that form RUNS contiguous runs of RUN elements; elem(q, r) is the first
// element of run r of piece q. Dequantized values follow llama.cpp's formulas (for nvfp4:
// e2m1 * e4m3 / divisor).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

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
    uint32_t rows_per_div;     // nvfp4: stacked rows sharing one divisor
    uint32_t kt;               // nvfp4: scale tiles along K = ceil(cols / 64)
};

__device__ __forceinline__ const uint8_t *row_ptr(const DevMat &m, uint32_t e, uint32_t r)
{
    return m.data + ((uint64_t)e * m.rows + r) * m.row_stride;
}

__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

// ---- q4_k: fields qs[128], scales[12], d/dmin[4] -------------------------------------------------
__device__ __forceinline__ void k4_scale_min(const uint8_t *q, int j, int &sc, int &m)
{
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

struct CQ4K {
    static constexpr int BLK = 256, PIECES = 16, PE = 16, RUNS = 2, RUN = 8;
    struct Row {
        const uint8_t *qs, *sc, *dm;
    };
    __device__ static Row row(const DevMat &m, uint32_t e, uint32_t r, uint64_t /*global_row*/)
    {
        const uint8_t *p = row_ptr(m, e, r);
        return Row{p + m.plane[0], p + m.plane[1], p + m.plane[2]};
    }
    __device__ static int elem(int q, int run) { return (q >> 4) * 256 + ((q & 15) >> 2) * 64 + (q & 3) * 8 + run * 32; }
    __device__ static void piece(const Row &R, int q, float *w)
    {
        int b = q >> 4, p = q & 15, j = p >> 2;
        uint2 v = *reinterpret_cast<const uint2 *>(R.qs + b * 128 + j * 32 + (p & 3) * 8);
        const uint8_t *sc = R.sc + b * 12;
        uint32_t dm = *reinterpret_cast<const uint32_t *>(R.dm + b * 4);
        float d = h2f((uint16_t)dm), dmin = h2f((uint16_t)(dm >> 16));
        int s1, m1, s2, m2;
        k4_scale_min(sc, 2 * j, s1, m1);
        k4_scale_min(sc, 2 * j + 1, s2, m2);
        float d1 = d * s1, mm1 = dmin * m1, d2 = d * s2, mm2 = dmin * m2;
        uint32_t lo = v.x, hi = v.y;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            w[i] = d1 * (float)((lo >> (8 * i)) & 0xF) - mm1;
            w[4 + i] = d1 * (float)((hi >> (8 * i)) & 0xF) - mm1;
            w[8 + i] = d2 * (float)((lo >> (8 * i + 4)) & 0xF) - mm2;
            w[12 + i] = d2 * (float)((hi >> (8 * i + 4)) & 0xF) - mm2;
        }
    }
};

// ---- q5_k: fields qs[128], qh[32], scales[12], d/dmin[4] -----------------------------------------
struct CQ5K {
    static constexpr int BLK = 256, PIECES = 16, PE = 16, RUNS = 2, RUN = 8;
    struct Row {
        const uint8_t *qs, *qh, *sc, *dm;
    };
    __device__ static Row row(const DevMat &m, uint32_t e, uint32_t r, uint64_t)
    {
        const uint8_t *p = row_ptr(m, e, r);
        return Row{p + m.plane[0], p + m.plane[1], p + m.plane[2], p + m.plane[3]};
    }
    __device__ static int elem(int q, int run) { return CQ4K::elem(q, run); }
    __device__ static void piece(const Row &R, int q, float *w)
    {
        int b = q >> 4, p = q & 15, j = p >> 2, l0 = (p & 3) * 8;
        uint2 v = *reinterpret_cast<const uint2 *>(R.qs + b * 128 + j * 32 + l0);
        uint2 h = *reinterpret_cast<const uint2 *>(R.qh + b * 32 + l0);
        const uint8_t *sc = R.sc + b * 12;
        uint32_t dm = *reinterpret_cast<const uint32_t *>(R.dm + b * 4);
        float d = h2f((uint16_t)dm), dmin = h2f((uint16_t)(dm >> 16));
        int s1, m1, s2, m2;
        k4_scale_min(sc, 2 * j, s1, m1);
        k4_scale_min(sc, 2 * j + 1, s2, m2);
        float d1 = d * s1, mm1 = dmin * m1, d2 = d * s2, mm2 = dmin * m2;
        const int b1 = 2 * j, b2 = 2 * j + 1;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            uint32_t qv = i < 4 ? v.x : v.y, hv = i < 4 ? h.x : h.y;
            int sh = 8 * (i & 3);
            int ql = (qv >> sh) & 0xFF, qh = (hv >> sh) & 0xFF;
            w[i] = d1 * (float)((ql & 0xF) + (((qh >> b1) & 1) << 4)) - mm1;
            w[8 + i] = d2 * (float)((ql >> 4) + (((qh >> b2) & 1) << 4)) - mm2;
        }
    }
};

// ---- q6_k: fields ql[128], qh[64], scales[16] (int8), d[2] ----------------------------------------
struct CQ6K {
    static constexpr int BLK = 256, PIECES = 16, PE = 16, RUNS = 4, RUN = 4;
    struct Row {
        const uint8_t *ql, *qh, *sc, *d;
    };
    __device__ static Row row(const DevMat &m, uint32_t e, uint32_t r, uint64_t)
    {
        const uint8_t *p = row_ptr(m, e, r);
        return Row{p + m.plane[0], p + m.plane[1], p + m.plane[2], p + m.plane[3]};
    }
    // piece p of a block: half = p / 8 (128 elements each), l0 = 4 * (p % 8); run r covers
    // elements half*128 + l0 + 32*r .. +4
    __device__ static int elem(int q, int run) { return (q >> 4) * 256 + ((q & 15) >> 3) * 128 + (q & 7) * 4 + run * 32; }
    __device__ static void piece(const Row &R, int q, float *w)
    {
        int b = q >> 4, p = q & 15, half = p >> 3, l0 = (p & 7) * 4;
        uint32_t qa = *reinterpret_cast<const uint32_t *>(R.ql + b * 128 + half * 64 + l0);
        uint32_t qb = *reinterpret_cast<const uint32_t *>(R.ql + b * 128 + half * 64 + l0 + 32);
        uint32_t qh = *reinterpret_cast<const uint32_t *>(R.qh + b * 64 + half * 32 + l0);
        const int8_t *sc = reinterpret_cast<const int8_t *>(R.sc + b * 16 + half * 8 + (l0 >> 4));
        float d = h2f(*reinterpret_cast<const uint16_t *>(R.d + b * 2));
        float s0 = d * sc[0], s1 = d * sc[2], s2 = d * sc[4], s3 = d * sc[6];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int a = (qa >> (8 * i)) & 0xFF, c = (qb >> (8 * i)) & 0xFF, h = (qh >> (8 * i)) & 0xFF;
            w[i] = s0 * (float)(((a & 0xF) | ((h & 3) << 4)) - 32);
            w[4 + i] = s1 * (float)(((c & 0xF) | (((h >> 2) & 3) << 4)) - 32);
            w[8 + i] = s2 * (float)(((a >> 4) | (((h >> 4) & 3) << 4)) - 32);
            w[12 + i] = s3 * (float)(((c >> 4) | (((h >> 6) & 3) << 4)) - 32);
        }
    }
};

// ---- q8_0: fields qs[32] (int8), d[2]; a piece is half a block ------------------------------------
struct CQ8 {
    static constexpr int BLK = 32, PIECES = 2, PE = 16, RUNS = 1, RUN = 16;
    struct Row {
        const uint8_t *qs, *d;
    };
    __device__ static Row row(const DevMat &m, uint32_t e, uint32_t r, uint64_t)
    {
        const uint8_t *p = row_ptr(m, e, r);
        return Row{p + m.plane[0], p + m.plane[1]};
    }
    __device__ static int elem(int q, int) { return q * 16; }
    __device__ static void piece(const Row &R, int q, float *w)
    {
        int b = q >> 1;
        int4 v = *reinterpret_cast<const int4 *>(R.qs + q * 16);
        float d = h2f(*reinterpret_cast<const uint16_t *>(R.d + b * 2));
        const int32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 16; i++) w[i] = d * (float)(int8_t)(words[i >> 2] >> (8 * (i & 3)));
    }
};

// ---- bf16: a piece is 8 consecutive values ---------------------------------------------------------
struct CBF16 {
    static constexpr int BLK = 8, PIECES = 1, PE = 8, RUNS = 1, RUN = 8;
    struct Row {
        const uint8_t *p;
    };
    __device__ static Row row(const DevMat &m, uint32_t e, uint32_t r, uint64_t) { return Row{row_ptr(m, e, r)}; }
    __device__ static int elem(int q, int) { return q * 8; }
    __device__ static void piece(const Row &R, int q, float *w)
    {
        uint4 v = *reinterpret_cast<const uint4 *>(R.p + q * 16);
        const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            w[2 * i] = __uint_as_float(words[i] << 16);
            w[2 * i + 1] = __uint_as_float(words[i] & 0xFFFF0000u);
        }
    }
};

// ---- nvfp4: a piece is one 16-element scale block ------------------------------------------------
__device__ __forceinline__ float e2m1_f(uint32_t nib)
{
    // {0, 0.5, 1, 1.5, 2, 3, 4, 6}, sign in bit 3
    const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
    float v = mag[nib & 7];
    return (nib & 8) ? -v : v;
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
__device__ __forceinline__ uint32_t nvfp4_scale_index(uint64_t m, uint32_t k, uint32_t kt)
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
    __device__ static Row row(const DevMat &m, uint32_t e, uint32_t r, uint64_t)
    {
        uint64_t g = (uint64_t)e * m.rows + r;
        return Row{m.data + g * m.row_stride, m.scales, g, m.kt, 1.0f / m.divisors[g / m.rows_per_div]};
    }
    __device__ static int elem(int q, int) { return q * 16; }
    __device__ static void piece(const Row &R, int q, float *w)
    {
        uint2 v = *reinterpret_cast<const uint2 *>(R.data + q * 8);
        float s = e4m3_f(R.scales[nvfp4_scale_index(R.grow, q, R.kt)]);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            uint32_t word = i < 4 ? v.x : v.y;
            uint32_t byte = (word >> (8 * (i & 3))) & 0xFF;
            w[2 * i] = e2m1_f(byte & 0xF) * s;
            w[2 * i + 1] = e2m1_f(byte >> 4) * s;
        }
        // The divisor is applied per element so the value equals the CPU's e2m1*e4m3/divisor
        // up to one rounding; hoisting it out of the dot product is an optimisation for later.
#pragma unroll
        for (int i = 0; i < 16; i++) w[i] *= R.inv_div;
    }
};

} // namespace nf
