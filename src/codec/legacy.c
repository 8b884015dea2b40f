/* The legacy GGUF codecs q4_0, q4_1, q5_0, q5_1 (blocks of 32): dequantize only, so GGUF files
 * that use them can be imported and re-encoded by a recipe. Element j < 16 is the low nibble of
 * qs[j], element j + 16 the high nibble; q5's fifth bit of element j is bit j of the u32 qh.
 * Decoding follows llama.cpp's dequantize_row_q4_0/q4_1/q5_0/q5_1 operation by operation. */
#include "codec/ggml_blocks.h"

static void q4_0_block(const uint8_t *b, float *y)
{
    const float d = nf_rd_f16(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        const int x0 = (qs[j] & 0x0F) - 8, x1 = (qs[j] >> 4) - 8;
        y[j] = x0 * d;
        y[j + 16] = x1 * d;
    }
}

static void q4_1_block(const uint8_t *b, float *y)
{
    const float d = nf_rd_f16(b), m = nf_rd_f16(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        const int x0 = qs[j] & 0x0F, x1 = qs[j] >> 4;
        y[j] = x0 * d + m;
        y[j + 16] = x1 * d + m;
    }
}

static void q5_0_block(const uint8_t *b, float *y)
{
    const float d = nf_rd_f16(b);
    const uint32_t qh = nf_rd32(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        const uint8_t xh0 = (uint8_t)(((qh >> j) << 4) & 0x10), xh1 = (uint8_t)((qh >> (j + 12)) & 0x10);
        const int x0 = ((qs[j] & 0x0F) | xh0) - 16, x1 = ((qs[j] >> 4) | xh1) - 16;
        y[j] = x0 * d;
        y[j + 16] = x1 * d;
    }
}

static void q5_1_block(const uint8_t *b, float *y)
{
    const float d = nf_rd_f16(b), m = nf_rd_f16(b + 2);
    const uint32_t qh = nf_rd32(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        const uint8_t xh0 = (uint8_t)(((qh >> j) << 4) & 0x10), xh1 = (uint8_t)((qh >> (j + 12)) & 0x10);
        const int x0 = (qs[j] & 0x0F) | xh0, x1 = (qs[j] >> 4) | xh1;
        y[j] = x0 * d + m;
        y[j + 16] = x1 * d + m;
    }
}

/* Row operations for a block decoder: dequantize, and the reference dot (float per block of 32,
 * double across blocks) as every codec defines it. */
#define NF_LEGACY_ROW_OPS(name, BYTES)                                                               \
    static void name##_dequantize(const void *src, float *y, size_t n)                               \
    {                                                                                                \
        const uint8_t *b = src;                                                                      \
        for (size_t i = 0; i < n / NF_QK_LEGACY; i++) name##_block(b + i * (BYTES), y + i * NF_QK_LEGACY); \
    }                                                                                                \
    static float name##_dot(const void *w, const float *x, size_t n)                                 \
    {                                                                                                \
        const uint8_t *b = w;                                                                        \
        double s = 0;                                                                                \
        float v[NF_QK_LEGACY];                                                                       \
        for (size_t i = 0; i < n / NF_QK_LEGACY; i++, b += (BYTES), x += NF_QK_LEGACY) {             \
            name##_block(b, v);                                                                      \
            float bs = 0;                                                                            \
            for (int j = 0; j < NF_QK_LEGACY; j++) bs += v[j] * x[j];                                \
            s += bs;                                                                                 \
        }                                                                                            \
        return (float)s;                                                                             \
    }                                                                                                \
    static void name##_matvec(const void *w, size_t row_bytes, size_t rows, const float *x, float *y, size_t n) \
    {                                                                                                \
        for (size_t r = 0; r < rows; r++) y[r] = name##_dot((const uint8_t *)w + r * row_bytes, x, n); \
    }

NF_LEGACY_ROW_OPS(q4_0, NF_Q4_0_BYTES)
NF_LEGACY_ROW_OPS(q4_1, NF_Q4_1_BYTES)
NF_LEGACY_ROW_OPS(q5_0, NF_Q5_0_BYTES)
NF_LEGACY_ROW_OPS(q5_1, NF_Q5_1_BYTES)

#define NF_LEGACY_CODEC(cn, ID, TYPE, BYTES)                                                       \
    const nf_codec nf_codec_##cn = {                                                               \
        .id = ID, .name = #cn, .ggml_type = TYPE, .block_elems = NF_QK_LEGACY, .block_bytes = BYTES, \
        .flags = NF_CODEC_DEQUANT_ONLY, .quantize_row = NULL, .dequantize_row = cn##_dequantize,   \
        .dot_row = cn##_dot, .matvec_scalar = cn##_matvec, .matvec_simd = NULL,                  \
    }

NF_LEGACY_CODEC(q4_0, NF_CODEC_Q4_0, 2, NF_Q4_0_BYTES);
NF_LEGACY_CODEC(q4_1, NF_CODEC_Q4_1, 3, NF_Q4_1_BYTES);
NF_LEGACY_CODEC(q5_0, NF_CODEC_Q5_0, 6, NF_Q5_0_BYTES);
NF_LEGACY_CODEC(q5_1, NF_CODEC_Q5_1, 7, NF_Q5_1_BYTES);
