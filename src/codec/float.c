/* f32, f16 and bf16 as codecs (block of 1 element) and the scalar conversions every codec uses.
 * Conversions to the narrow types round to nearest, ties to even, keep the sign of zero, map
 * overflow to infinity, keep NaN a (quiet) NaN with its sign, and produce f16 subnormals exactly. */
#include <string.h>

#include "codec/codec.h"
#include "codec/codec_simd.h"

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float nf_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 31) return float_of(sign | 0x7f800000u | (m << 13)); /* inf, NaN (payload kept) */
    if (e == 0) {
        /* zero or subnormal: m * 2^-24, exact in f32 (m < 2^10, the factor a power of two) */
        float v = (float)m * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return float_of(sign | ((e + 112) << 23) | (m << 13));
}

/* Shifts a 24-bit significand right by s (1..31), rounding to nearest even. */
static uint32_t shift_rne(uint32_t m, unsigned s)
{
    uint32_t r = m >> s, rem = m & ((1u << s) - 1), half = 1u << (s - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    return r;
}

uint16_t nf_f32_to_f16(float f)
{
    uint32_t x = bits_of(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00 | ((ax >> 13) & 0x3ff)); /* quiet NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* >= 65520 rounds to infinity */
    if (ax <= 0x33000000u) return sign;                      /* <= 2^-25 rounds to zero (tie to even) */
    uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000;
    if (e < 113) /* below 2^-14: an f16 subnormal, m * 2^(e-150) in units of 2^-24 */
        return (uint16_t)(sign | shift_rne(m, 126 - e));
    /* normal: rebias the exponent, round the 23-bit mantissa to 10 bits (a carry may bump the
     * exponent, which is the correct result) */
    uint32_t r = ((e - 112) << 10) | ((m & 0x7fffff) >> 13);
    uint32_t rem = m & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

float nf_bf16_to_f32(uint16_t h) { return float_of((uint32_t)h << 16); }

uint16_t nf_f32_to_bf16(float f)
{
    uint32_t x = bits_of(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN, sign kept */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

/* ---- f32 ------------------------------------------------------------------------------------ */

static void f32_quantize(const float *x, void *dst, size_t n) { memcpy(dst, x, n * sizeof(float)); }
static void f32_dequantize(const void *src, float *y, size_t n) { memcpy(y, src, n * sizeof(float)); }

/* Float codecs have blocks of one element: the scalar reference accumulates every product in
 * double (each product w*x of two floats is exact in double). */
static float f32_dot(const void *w, const float *x, size_t n)
{
    const uint8_t *p = w;
    double s = 0;
    for (size_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, p + 4 * i, 4);
        s += (double)v * x[i];
    }
    return (float)s;
}

static void f32_matvec(const void *w, size_t row_bytes, size_t rows, const float *x, float *y, size_t n)
{
    for (size_t r = 0; r < rows; r++) y[r] = f32_dot((const uint8_t *)w + r * row_bytes, x, n);
}

/* ---- f16 and bf16: 2-byte values that differ only in their scalar conversion ------------------ */

static void half_quantize(const float *x, void *dst, size_t n, uint16_t (*to)(float))
{
    uint8_t *d = dst;
    for (size_t i = 0; i < n; i++) {
        uint16_t h = to(x[i]);
        memcpy(d + 2 * i, &h, 2);
    }
}

static void half_dequantize(const void *src, float *y, size_t n, float (*from)(uint16_t))
{
    const uint8_t *s = src;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        y[i] = from(h);
    }
}

static float half_dot(const void *w, const float *x, size_t n, float (*from)(uint16_t))
{
    const uint8_t *p = w;
    double s = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        s += (double)from(h) * x[i];
    }
    return (float)s;
}

static void f16_quantize(const float *x, void *dst, size_t n) { half_quantize(x, dst, n, nf_f32_to_f16); }
static void f16_dequantize(const void *src, float *y, size_t n) { half_dequantize(src, y, n, nf_f16_to_f32); }
static float f16_dot(const void *w, const float *x, size_t n) { return half_dot(w, x, n, nf_f16_to_f32); }
static void f16_matvec(const void *w, size_t row_bytes, size_t rows, const float *x, float *y, size_t n)
{
    for (size_t r = 0; r < rows; r++) y[r] = f16_dot((const uint8_t *)w + r * row_bytes, x, n);
}

static void bf16_quantize(const float *x, void *dst, size_t n) { half_quantize(x, dst, n, nf_f32_to_bf16); }
static void bf16_dequantize(const void *src, float *y, size_t n) { half_dequantize(src, y, n, nf_bf16_to_f32); }
static float bf16_dot(const void *w, const float *x, size_t n) { return half_dot(w, x, n, nf_bf16_to_f32); }
static void bf16_matvec(const void *w, size_t row_bytes, size_t rows, const float *x, float *y, size_t n)
{
    for (size_t r = 0; r < rows; r++) y[r] = bf16_dot((const uint8_t *)w + r * row_bytes, x, n);
}

const nf_codec nf_codec_f32 = {
    .id = NF_CODEC_F32, .name = "f32", .ggml_type = 0, .block_elems = 1, .block_bytes = 4,
    .quantize_row = f32_quantize, .dequantize_row = f32_dequantize, .dot_row = f32_dot,
    .matvec_scalar = f32_matvec, .matvec_simd = nf_f32_matvec_avx2,
};

const nf_codec nf_codec_f16 = {
    .id = NF_CODEC_F16, .name = "f16", .ggml_type = 1, .block_elems = 1, .block_bytes = 2,
    .quantize_row = f16_quantize, .dequantize_row = f16_dequantize, .dot_row = f16_dot,
    .matvec_scalar = f16_matvec, .matvec_simd = nf_f16_matvec_avx2,
};

const nf_codec nf_codec_bf16 = {
    .id = NF_CODEC_BF16, .name = "bf16", .ggml_type = 30, .block_elems = 1, .block_bytes = 2,
    .quantize_row = bf16_quantize, .dequantize_row = bf16_dequantize, .dot_row = bf16_dot,
    .matvec_scalar = bf16_matvec, .matvec_simd = nf_bf16_matvec_avx2,
};
