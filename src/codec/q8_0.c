/* q8_0: blocks of 32 int8 values with one f16 scale (ggml type 8, 34 bytes). y = d * q.
 * The quantizer is llama.cpp's quantize_row_q8_0_ref (d = amax/127, q = roundf(x/d) with ties
 * away from zero), so its bytes equal gguf-py's `quantize` for the same input. */
#include <math.h>

#include "codec/codec_simd.h"
#include "codec/ggml_blocks.h"

static void q8_0_quantize(const float *x, void *dst, size_t n)
{
    uint8_t *b = dst;
    for (size_t i = 0; i < n / NF_QK_LEGACY; i++, x += NF_QK_LEGACY, b += NF_Q8_0_BYTES) {
        float amax = 0;
        for (int j = 0; j < NF_QK_LEGACY; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        nf_wr16(b, nf_f32_to_f16(d));
        for (int j = 0; j < NF_QK_LEGACY; j++) b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
    }
}

static void block_dequantize(const uint8_t *b, float *y)
{
    const float d = nf_rd_f16(b);
    for (int j = 0; j < NF_QK_LEGACY; j++) y[j] = (float)(int8_t)b[2 + j] * d;
}

static void q8_0_dequantize(const void *src, float *y, size_t n)
{
    const uint8_t *b = src;
    for (size_t i = 0; i < n / NF_QK_LEGACY; i++) block_dequantize(b + i * NF_Q8_0_BYTES, y + i * NF_QK_LEGACY);
}

/* The reference: each block decoded exactly as dequantize_row, its 32 products summed in float,
 * the block sums in double. */
static float q8_0_dot(const void *w, const float *x, size_t n)
{
    const uint8_t *b = w;
    double s = 0;
    float v[NF_QK_LEGACY];
    for (size_t i = 0; i < n / NF_QK_LEGACY; i++, b += NF_Q8_0_BYTES, x += NF_QK_LEGACY) {
        block_dequantize(b, v);
        float bs = 0;
        for (int j = 0; j < NF_QK_LEGACY; j++) bs += v[j] * x[j];
        s += bs;
    }
    return (float)s;
}

static void q8_0_matvec(const void *w, size_t row_bytes, size_t rows, const float *x, float *y, size_t n)
{
    for (size_t r = 0; r < rows; r++) y[r] = q8_0_dot((const uint8_t *)w + r * row_bytes, x, n);
}

const nf_codec nf_codec_q8_0 = {
    .id = NF_CODEC_Q8_0, .name = "q8_0", .ggml_type = 8, .block_elems = NF_QK_LEGACY,
    .block_bytes = NF_Q8_0_BYTES, .quantize_row = q8_0_quantize, .dequantize_row = q8_0_dequantize,
    .dot_row = q8_0_dot, .matvec_scalar = q8_0_matvec, .matvec_simd = nf_q8_0_matvec_avx2,
};
