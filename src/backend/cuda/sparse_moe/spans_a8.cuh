// The int8-activation span policies of gemv_a8.cu: what a lane takes of a weight row at a time (a
// span of kSpanElems elements: 64 for the k-quants, 32 for q8_0), its loads, and its dot with MAXT
// tokens' quantised activations (xq: rows of cols int8 in quant_a8.cuh's padded layout, xd[t][cols /
// 32] = (d, d * sum q) per 32-element block). Host-callable, so the arithmetic is checked on the CPU
// against the codecs' own dequantization (tests/cuda/test_a8_spans.cu) as well as on the device.
#pragma once
#include <stdint.h>

#include "dev_codecs.cuh"
#include "quant_a8.cuh"

namespace nf {

// Four signed byte products summed into c: dp4a on the device, the same sum on the host.
NF_HD int dp4a(int a, int b, int c)
{
#ifdef __CUDA_ARCH__
    return __dp4a(a, b, c);
#else
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(uint8_t)(a >> (8 * i)) * (int)(int8_t)(uint8_t)(b >> (8 * i));
    return c;
#endif
}

// The dot of a q4_k / q5_k span (sub-blocks 2j and 2j + 1: values lo[8], hi[8] as bytes, scales d1,
// d2, mins mm1, mm2) with MAXT tokens' activations from element e0.
template <int MAXT>
NF_HD void k4_span_dot(const int lo_w[8], const int hi_w[8], float d1, float mm1, float d2, float mm2, uint32_t e0,
                       const int8_t *xq, const float2 *xd, uint32_t cols, int nt, float *acc)
{
NF_UNROLL
    for (int t = 0; t < MAXT; t++) {
        if (t >= nt) break;
        const int4 *xv = reinterpret_cast<const int4 *>(xq + (size_t)t * a8_stride(cols) + a8_at(e0));
        const int4 x0 = xv[0], x1 = xv[1], x2 = xv[2], x3 = xv[3];
        const int lo[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        const int hi[8] = {x2.x, x2.y, x2.z, x2.w, x3.x, x3.y, x3.z, x3.w};
        int sa = 0, sb = 0;
NF_UNROLL
        for (int k = 0; k < 8; k++) sa = dp4a(lo_w[k], lo[k], sa), sb = dp4a(hi_w[k], hi[k], sb);
        // both sub-blocks' (d, d * sum q) in one 16-byte load (e0 / 32 and cols / 32 are even)
        const float4 dd = *reinterpret_cast<const float4 *>(xd + (size_t)t * (cols / 32) + e0 / 32);
        float a = acc[t];
        a = fmaf(d1 * dd.x, (float)sa, a);
        a = fmaf(-mm1, dd.y, a);
        a = fmaf(d2 * dd.z, (float)sb, a);
        a = fmaf(-mm2, dd.w, a);
        acc[t] = a;
    }
}

// q4_k: 32 bytes of the qs plane (block b = s / 4, j = s % 4) = sub-blocks 2j (low nibbles) and
// 2j+1 (high nibbles), elements b*256 + j*64 + [0, 64), plus the block's 12 scale bytes and d/dmin.
struct SpanQ4K {
    static constexpr uint32_t kSpanElems = 64; // a row has cols / kSpanElems spans
    struct Raw {
        uint4 qa, qb;
        uint32_t sc[3], dm;
    };
    NF_HD static Raw load(const DevMat &W, uint32_t e, uint32_t r, int s)
    {
        const CQ4K::Row R = CQ4K::row(W, e, r);
        const int blk = s >> 2, j = s & 3;
        const uint4 *q = reinterpret_cast<const uint4 *>(R.qs + blk * 128 + j * 32);
        Raw w{q[0], q[1]};
        k4_load_scales(R.sc, R.dm, blk, w.sc, w.dm);
        return w;
    }
    template <int MAXT>
    NF_HD static void dot(const Raw &w, int s, const int8_t *xq, const float2 *xd, uint32_t cols, int nt, float *acc)
    {
        const int j = s & 3;
        float d1, mm1, d2, mm2;
        k4_sub_scales(w.sc, w.dm, j, d1, mm1, d2, mm2);
        const uint32_t q[8] = {w.qa.x, w.qa.y, w.qa.z, w.qa.w, w.qb.x, w.qb.y, w.qb.z, w.qb.w};
        int lo4[8], hi4[8];
NF_UNROLL
        for (int k = 0; k < 8; k++) lo4[k] = (int)(q[k] & 0x0F0F0F0Fu), hi4[k] = (int)((q[k] >> 4) & 0x0F0F0F0Fu);
        k4_span_dot<MAXT>(lo4, hi4, d1, mm1, d2, mm2, (uint32_t)((s >> 2) * 256 + j * 64), xq, xd, cols, nt, acc);
    }
};

// q5_k: q4_k's span plus the block's 32 qh bytes (bit 2j of qh[l] tops element j*64 + l, bit 2j + 1
// tops element j*64 + 32 + l); the four spans of a block read the same qh bytes (one L1 line).
struct SpanQ5K {
    static constexpr uint32_t kSpanElems = 64; // a row has cols / kSpanElems spans
    struct Raw {
        uint4 qa, qb, ha, hb;
        uint32_t sc[3], dm;
    };
    NF_HD static Raw load(const DevMat &W, uint32_t e, uint32_t r, int s)
    {
        const CQ5K::Row R = CQ5K::row(W, e, r);
        const int blk = s >> 2, j = s & 3;
        const uint4 *q = reinterpret_cast<const uint4 *>(R.qs + blk * 128 + j * 32);
        const uint4 *h = reinterpret_cast<const uint4 *>(R.qh + blk * 32);
        Raw w{q[0], q[1], h[0], h[1]};
        k4_load_scales(R.sc, R.dm, blk, w.sc, w.dm);
        return w;
    }
    template <int MAXT>
    NF_HD static void dot(const Raw &w, int s, const int8_t *xq, const float2 *xd, uint32_t cols, int nt, float *acc)
    {
        const int j = s & 3;
        const uint32_t e0 = (uint32_t)((s >> 2) * 256 + j * 64);
        float d1, mm1, d2, mm2;
        k4_sub_scales(w.sc, w.dm, j, d1, mm1, d2, mm2);
        const uint32_t q[8] = {w.qa.x, w.qa.y, w.qa.z, w.qa.w, w.qb.x, w.qb.y, w.qb.z, w.qb.w};
        const uint32_t h[8] = {w.ha.x, w.ha.y, w.ha.z, w.ha.w, w.hb.x, w.hb.y, w.hb.z, w.hb.w};
        int lo5[8], hi5[8];
NF_UNROLL
        for (int k = 0; k < 8; k++) {
            lo5[k] = (int)((q[k] & 0x0F0F0F0Fu) | (((h[k] >> (2 * j)) & 0x01010101u) << 4));
            hi5[k] = (int)(((q[k] >> 4) & 0x0F0F0F0Fu) | (((h[k] >> (2 * j + 1)) & 0x01010101u) << 4));
        }
        k4_span_dot<MAXT>(lo5, hi5, d1, mm1, d2, mm2, e0, xq, xd, cols, nt, acc);
    }
};

// q6_k: span s = (block s / 4, half n = (s / 2) % 2, l-range h = s % 2 of 16): 16 bytes of ql at l,
// 16 at l + 32, 16 of qh, i.e. four runs of 16 elements, b*256 + n*128 + 32m + 16h + [0, 16) for
// m = 0..3, with scales sc[n*8 + h + 2m]. The 6-bit values (0..63) become q - 32 per byte as
// (v + 0x60) ^ 0x80 (no carry leaves a byte: v + 0x60 <= 159), so dp4a takes them signed.
struct SpanQ6K {
    static constexpr uint32_t kSpanElems = 64; // a row has cols / kSpanElems spans
    struct Raw {
        uint4 qa, qb, qh;
        uint2 sc;
        uint16_t d;
    };
    NF_HD static Raw load(const DevMat &W, uint32_t e, uint32_t r, int s)
    {
        const CQ6K::Row R = CQ6K::row(W, e, r);
        const int blk = s >> 2, n = (s >> 1) & 1, h = s & 1;
        const uint8_t *ql = R.ql + blk * 128 + n * 64 + h * 16;
        return Raw{*reinterpret_cast<const uint4 *>(ql), *reinterpret_cast<const uint4 *>(ql + 32),
                   *reinterpret_cast<const uint4 *>(R.qh + blk * 64 + n * 32 + h * 16),
                   *reinterpret_cast<const uint2 *>(R.sc + blk * 16 + n * 8),
                   *reinterpret_cast<const uint16_t *>(R.d + blk * 2)};
    }
    template <int MAXT>
    NF_HD static void dot(const Raw &w, int s, const int8_t *xq, const float2 *xd, uint32_t cols, int nt, float *acc)
    {
        const int h = s & 1;
        const uint32_t e0 = (uint32_t)((s >> 2) * 256 + ((s >> 1) & 1) * 128 + h * 16);
        const float d = h2f(w.d);
        // sc bytes h, h + 2 (word x) and h, h + 2 (word y) are runs m = 0..3
        const float sc[4] = {d * (float)(int8_t)(w.sc.x >> (8 * h)), d * (float)(int8_t)(w.sc.x >> (8 * h + 16)),
                             d * (float)(int8_t)(w.sc.y >> (8 * h)), d * (float)(int8_t)(w.sc.y >> (8 * h + 16))};
        const uint32_t a[4] = {w.qa.x, w.qa.y, w.qa.z, w.qa.w}, b[4] = {w.qb.x, w.qb.y, w.qb.z, w.qb.w},
                       hh[4] = {w.qh.x, w.qh.y, w.qh.z, w.qh.w};
        int v[4][4]; // [run m][word]
NF_UNROLL
        for (int k = 0; k < 4; k++) {
            const uint32_t lo[4] = {a[k] & 0x0F0F0F0Fu, b[k] & 0x0F0F0F0Fu, (a[k] >> 4) & 0x0F0F0F0Fu,
                                    (b[k] >> 4) & 0x0F0F0F0Fu};
NF_UNROLL
            for (int m = 0; m < 4; m++)
                v[m][k] = (int)(((lo[m] | (((hh[k] >> (2 * m)) & 0x03030303u) << 4)) + 0x60606060u) ^ 0x80808080u);
        }
NF_UNROLL
        for (int t = 0; t < MAXT; t++) {
            if (t >= nt) break;
            float acc_t = acc[t];
NF_UNROLL
            for (int m = 0; m < 4; m++) {
                const int4 x = *reinterpret_cast<const int4 *>(xq + (size_t)t * a8_stride(cols) + a8_at(e0 + 32 * m));
                int sum = dp4a(v[m][0], x.x, 0);
                sum = dp4a(v[m][1], x.y, sum);
                sum = dp4a(v[m][2], x.z, sum);
                sum = dp4a(v[m][3], x.w, sum);
                acc_t = fmaf(sc[m] * xd[(size_t)t * (cols / 32) + (e0 + 32 * m) / 32].x, (float)sum, acc_t);
            }
            acc[t] = acc_t;
        }
    }
};

// q8_0: one block, 32 signed bytes and its f16 scale: sum_i dw qw_i d qx_i = dw d (sum qw qx).
struct SpanQ8 {
    static constexpr uint32_t kSpanElems = 32; // a row has cols / kSpanElems spans
    struct Raw {
        uint4 qa, qb;
        uint16_t d;
    };
    NF_HD static Raw load(const DevMat &W, uint32_t e, uint32_t r, int s)
    {
        const CQ8::Row R = CQ8::row(W, e, r);
        const uint4 *q = reinterpret_cast<const uint4 *>(R.qs + s * 32);
        return Raw{q[0], q[1], *reinterpret_cast<const uint16_t *>(R.d + s * 2)};
    }
    template <int MAXT>
    NF_HD static void dot(const Raw &w, int s, const int8_t *xq, const float2 *xd, uint32_t cols, int nt, float *acc)
    {
        const float d = h2f(w.d);
        const int q[8] = {(int)w.qa.x, (int)w.qa.y, (int)w.qa.z, (int)w.qa.w,
                          (int)w.qb.x, (int)w.qb.y, (int)w.qb.z, (int)w.qb.w};
NF_UNROLL
        for (int t = 0; t < MAXT; t++) {
            if (t >= nt) break;
            const int4 *xv = reinterpret_cast<const int4 *>(xq + (size_t)t * a8_stride(cols) + a8_at(s * 32));
            const int4 x0 = xv[0], x1 = xv[1];
            const int xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
            int sum = 0;
NF_UNROLL
            for (int k = 0; k < 8; k++) sum = dp4a(q[k], xw[k], sum);
            acc[t] = fmaf(d * xd[(size_t)t * (cols / 32) + s].x, (float)sum, acc[t]);
        }
    }
};

} // namespace nf
