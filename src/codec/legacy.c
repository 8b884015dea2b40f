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

NF_GGML_ROW_OPS(q4_0, NF_QK_LEGACY, NF_Q4_0_BYTES, q4_0_block)
NF_GGML_ROW_OPS(q4_1, NF_QK_LEGACY, NF_Q4_1_BYTES, q4_1_block)
NF_GGML_ROW_OPS(q5_0, NF_QK_LEGACY, NF_Q5_0_BYTES, q5_0_block)
NF_GGML_ROW_OPS(q5_1, NF_QK_LEGACY, NF_Q5_1_BYTES, q5_1_block)

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
