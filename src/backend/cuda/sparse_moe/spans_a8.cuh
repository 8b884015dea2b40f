// The int8-activation span policies of gemv_a8.cu: what a lane takes of a weight row at a time (a
// span of kSpanElems elements: 64 for the k-quants, iq4_xs and iq4_nl, 32 for q8_0), its loads, and its dot with MAXT
// tokens' quantised activations (xq: rows of cols int8 in quant_a8.cuh's padded layout, xd[t][cols /
// 32] = (d, d * sum q) per 32-element block). Host-callable, so the arithmetic is checked on the CPU
// against the codecs' own dequantization (tests/cuda/test_a8_spans.cu) as well as on the device.
#pragma once
#include <stdint.h>

#include "dev_codecs.cuh"
#include "dev_codecs_import.cuh"
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

// ---- the import-only codecs (dev_codecs_import.cuh's layouts) ------------------------------------
// Their weights are exact integer multiples of one f32 scale per group (iq4_xs: (d ls) kv, 6 + 7
// bits on d's 11; iq4_nl: d kv; q3_k: (d s) q, 6 + 3 bits), so, as for q6_k, a group's dot is
// fl(scale d_x) times an exact integer sum, and the weights the CPU decoders give are those exact
// products (no rounding: 24 bits at most), which the W·A8 reference takes as they are.

// The iq4 table as signed bytes (kIq4T* - 128 per byte): the lookup's bytes are then the int8
// values dp4a takes.
constexpr uint32_t kIq4S0 = kIq4T0 ^ 0x80808080u, kIq4S1 = kIq4T1 ^ 0x80808080u, kIq4S2 = kIq4T2 ^ 0x80808080u,
                   kIq4S3 = kIq4T3 ^ 0x80808080u;

// iq4_lookup (dev_codecs_import.cuh) over the signed table.

// A word of 4 iq4 quant bytes (byte i: element i low nibble, element i + 16 high nibble) as two
// words of int8 table values: lo = elements 0..3, hi = elements 16..19 (relative). Each 16-bit half
// maps to (lo, hi, lo, hi) bytes by iq4_lookup's three permutes; two more sort them.
NF_HD uint32_t iq4_lookup_s8(uint32_t s)
{
    const uint32_t sel = s & 0x7777u;
    const uint32_t a = perm(kIq4S0, kIq4S1, sel), b = perm(kIq4S2, kIq4S3, sel);
    return perm(a, b, 0x3210u | ((s >> 1) & 0x4444u));
}

NF_HD void iq4_word_s8(uint32_t w, int &lo, int &hi)
{
    const uint32_t a = iq4_lookup_s8(w), b = iq4_lookup_s8(w >> 16);
    lo = (int)perm(a, b, 0x6420u);
    hi = (int)perm(a, b, 0x7531u);
}

// Two 32-element groups from e0 (integer values v1[8] then v2[8] as bytes, scales d1, d2, no
// offset) with MAXT tokens' activations: acc += fl(d1 d_x) sum v1 q + fl(d2 d_x') sum v2 q'.
template <int MAXT>
NF_HD void s32x2_span_dot(const int v1[8], const int v2[8], float d1, float d2, uint32_t e0, const int8_t *xq,
                          const float2 *xd, uint32_t cols, int nt, float *acc)
{
NF_UNROLL
    for (int t = 0; t < MAXT; t++) {
        if (t >= nt) break;
        const int4 *xv = reinterpret_cast<const int4 *>(xq + (size_t)t * a8_stride(cols) + a8_at(e0));
        const int4 x0 = xv[0], x1 = xv[1], x2 = xv[2], x3 = xv[3];
        const int a[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        const int b[8] = {x2.x, x2.y, x2.z, x2.w, x3.x, x3.y, x3.z, x3.w};
        int sa = 0, sb = 0;
NF_UNROLL
        for (int k = 0; k < 8; k++) sa = dp4a(v1[k], a[k], sa), sb = dp4a(v2[k], b[k], sb);
        const float4 dd = *reinterpret_cast<const float4 *>(xd + (size_t)t * (cols / 32) + e0 / 32);
        float r = acc[t];
        r = fmaf(d1 * dd.x, (float)sa, r);
        r = fmaf(d2 * dd.z, (float)sb, r);
        acc[t] = r;
    }
}

// 16 quant bytes of one iq4 32-element group as 8 words of int8 values in element order.
NF_HD void iq4_group_s8(uint4 q, int v[8])
{
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
NF_UNROLL
    for (int k = 0; k < 4; k++) iq4_word_s8(w[k], v[k], v[4 + k]);
}

// iq4_xs: span s = sub-blocks 2j, 2j + 1 (j = s % 4) of block s / 4: 32 quant bytes and the
// block's 8-byte head (d, scales_h, scales_l).
struct SpanIQ4XS {
    static constexpr uint32_t kSpanElems = 64; // a row has cols / kSpanElems spans
    struct Raw {
        uint4 qa, qb;
        uint2 hd;
    };
    NF_HD static Raw load(const DevMat &W, uint32_t e, uint32_t r, int s)
    {
        const CIQ4XS::Row R = CIQ4XS::row(W, e, r);
        const int blk = s >> 2, j = s & 3;
        const uint4 *q = reinterpret_cast<const uint4 *>(R.qs + blk * 128 + j * 32);
        return Raw{q[0], q[1], *reinterpret_cast<const uint2 *>(R.hd + blk * 8)};
    }
    template <int MAXT>
    NF_HD static void dot(const Raw &w, int s, const int8_t *xq, const float2 *xd, uint32_t cols, int nt, float *acc)
    {
        const int j = s & 3;
        const float d = h2f((uint16_t)w.hd.x);
        // sub-block ib's 6-bit scale: nibble ib of scales_l (word y), bits 2 ib of scales_h (x >> 16)
        auto ls = [&](int ib) {
            return (float)((int)(((w.hd.y >> (4 * ib)) & 0xF) | (((w.hd.x >> (16 + 2 * ib)) & 3) << 4)) - 32);
        };
        int v1[8], v2[8];
        iq4_group_s8(w.qa, v1);
        iq4_group_s8(w.qb, v2);
        s32x2_span_dot<MAXT>(v1, v2, d * ls(2 * j), d * ls(2 * j + 1), (uint32_t)((s >> 2) * 256 + j * 64), xq, xd,
                             cols, nt, acc);
    }
};

// iq4_nl: span s = blocks 2s, 2s + 1: their 32 quant bytes and two f16 scales.
struct SpanIQ4NL {
    static constexpr uint32_t kSpanElems = 64; // a row has cols / kSpanElems spans
    struct Raw {
        uint4 qa, qb;
        uint32_t d;
    };
    NF_HD static Raw load(const DevMat &W, uint32_t e, uint32_t r, int s)
    {
        const CIQ4NL::Row R = CIQ4NL::row(W, e, r);
        const uint4 *q = reinterpret_cast<const uint4 *>(R.qs + s * 32);
        return Raw{q[0], q[1], *reinterpret_cast<const uint32_t *>(R.d + s * 4)};
    }
    template <int MAXT>
    NF_HD static void dot(const Raw &w, int s, const int8_t *xq, const float2 *xd, uint32_t cols, int nt, float *acc)
    {
        int v1[8], v2[8];
        iq4_group_s8(w.qa, v1);
        iq4_group_s8(w.qb, v2);
        s32x2_span_dot<MAXT>(v1, v2, h2f((uint16_t)w.d), h2f((uint16_t)(w.d >> 16)), (uint32_t)s * 64, xq, xd, cols,
                             nt, acc);
    }
};

// q3_k: q6_k's span shape. Span s = (block s / 4, half n = (s / 2) % 2, l-range h = s % 2 of 16):
// 16 bytes of the half's 2-bit plane at l and the same 16 bytes of the high-bit mask, i.e. four runs
// of 16 elements b*256 + n*128 + 32m + 16h + [0, 16) (bits 2m of qs, bit 4n + m of the mask), with
// scales s[8n + 2m + h]; plus the 12 scale bytes and d. The value (low | high << 2) in 0..7 becomes
// q = value - 4 per byte as (v + 0x7C) ^ 0x80 (v + 0x7C <= 131: no carry leaves a byte).
struct SpanQ3K {
    static constexpr uint32_t kSpanElems = 64; // a row has cols / kSpanElems spans
    struct Raw {
        uint4 qs, hm;
        uint32_t sc[3];
        uint16_t d;
    };
    NF_HD static Raw load(const DevMat &W, uint32_t e, uint32_t r, int s)
    {
        const CQ3K::Row R = CQ3K::row(W, e, r);
        const int blk = s >> 2, n = (s >> 1) & 1, h = s & 1;
        const uint32_t *sc = reinterpret_cast<const uint32_t *>(R.sc + blk * 12);
        return Raw{*reinterpret_cast<const uint4 *>(R.qs + blk * 64 + n * 32 + h * 16),
                   *reinterpret_cast<const uint4 *>(R.hm + blk * 32 + h * 16),
                   {sc[0], sc[1], sc[2]},
                   *reinterpret_cast<const uint16_t *>(R.d + blk * 2)};
    }
    template <int MAXT>
    NF_HD static void dot(const Raw &w, int s, const int8_t *xq, const float2 *xd, uint32_t cols, int nt, float *acc)
    {
        const int n = (s >> 1) & 1, h = s & 1;
        const uint32_t e0 = (uint32_t)((s >> 2) * 256 + n * 128 + h * 16);
        const float d = h2f(w.d);
        float sc[4];
NF_UNROLL
        for (int m = 0; m < 4; m++) sc[m] = d * (float)k3_scale(w.sc[0], w.sc[1], w.sc[2], n, 2 * m + h);
        const uint32_t q[4] = {w.qs.x, w.qs.y, w.qs.z, w.qs.w}, hb[4] = {w.hm.x, w.hm.y, w.hm.z, w.hm.w};
        int v[4][4]; // [run m][word]
NF_UNROLL
        for (int k = 0; k < 4; k++)
NF_UNROLL
            for (int m = 0; m < 4; m++)
                v[m][k] = (int)(((((q[k] >> (2 * m)) & 0x03030303u) | (((hb[k] >> (4 * n + m)) & 0x01010101u) << 2)) +
                                 0x7C7C7C7Cu) ^
                                0x80808080u);
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

// Calls f(Span{}) with the span policy of an nf_codec_id (q8_0 3, q4_k 4, q5_k 5, q6_k 6, q3_k 13,
// iq4_xs 14, iq4_nl 15); cudaErrorInvalidValue for codecs without one (dispatch_codec's form).
template <class F>
cudaError_t dispatch_span(int codec, F &&f)
{
    switch (codec) {
    case 3: return f(SpanQ8{});
    case 4: return f(SpanQ4K{});
    case 5: return f(SpanQ5K{});
    case 6: return f(SpanQ6K{});
    case 13: return f(SpanQ3K{});
    case 14: return f(SpanIQ4XS{});
    case 15: return f(SpanIQ4NL{});
    default: return cudaErrorInvalidValue;
    }
}

} // namespace nf
