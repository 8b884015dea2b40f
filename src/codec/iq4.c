/* The two 4-bit non-linear codecs of llama.cpp: each nibble indexes a fixed table of 16 int8
 * values (kvalues_iq4nl), scaled per block.
 *   iq4_nl (ggml type 20, 32 elements, 18 bytes): f16 d @0 | u8 qs[16] @2; element j < 16 is the
 *     low nibble of qs[j], element j + 16 its high nibble; y = d * kv[nibble].
 *   iq4_xs (ggml type 23, 256 elements in 8 sub-blocks of 32, 136 bytes): f16 d @0 | u16 scales_h
 *     @2 | u8 scales_l[4] @4 | u8 qs[128] @8. Sub-block ib's 6-bit scale: nibble ib % 2 of
 *     scales_l[ib / 2] with bits 2ib..2ib+1 of scales_h on top, minus 32; its 32 elements are the
 *     nibbles of qs[16 ib .. 16 ib + 15] as in iq4_nl; y = (d * ls) * kv[nibble].
 * Values as llama.cpp's dequantize_row_iq4_{nl,xs} and gguf-py compute them. Decode only. */
#include "codec/codec_simd.h"
#include "codec/ggml_blocks.h"

const int8_t nf_iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static void nibbles32(const uint8_t *qs, float dl, float *y)
{
    for (int j = 0; j < 16; j++) {
        y[j] = dl * (float)nf_iq4_values[qs[j] & 0xF];
        y[j + 16] = dl * (float)nf_iq4_values[qs[j] >> 4];
    }
}

void nf_iq4_nl_block_dequantize(const uint8_t *b, float *y) { nibbles32(b + 2, nf_rd_f16(b), y); }

void nf_iq4_xs_block_dequantize(const uint8_t *b, float *y)
{
    const float d = nf_rd_f16(b);
    for (int ib = 0; ib < 8; ib++) nibbles32(b + 8 + 16 * ib, d * (float)nf_iq4_xs_scale(b, ib), y + 32 * ib);
}

NF_GGML_ROW_OPS(iq4_nl, NF_QK_LEGACY, NF_IQ4_NL_BYTES, nf_iq4_nl_block_dequantize)
NF_GGML_ROW_OPS(iq4_xs, NF_QK_K, NF_IQ4_XS_BYTES, nf_iq4_xs_block_dequantize)

const nf_codec nf_codec_iq4_nl = {
    .id = NF_CODEC_IQ4_NL, .name = "iq4_nl", .ggml_type = 20, .block_elems = NF_QK_LEGACY,
    .block_bytes = NF_IQ4_NL_BYTES, .flags = NF_CODEC_IMPORT_ONLY, .quantize_row = NULL,
    .dequantize_row = iq4_nl_dequantize, .dot_row = iq4_nl_dot, .matvec_scalar = iq4_nl_matvec, .matvec_simd = nf_iq4_nl_matvec_avx2,
};

const nf_codec nf_codec_iq4_xs = {
    .id = NF_CODEC_IQ4_XS, .name = "iq4_xs", .ggml_type = 23, .block_elems = NF_QK_K,
    .block_bytes = NF_IQ4_XS_BYTES, .flags = NF_CODEC_IMPORT_ONLY, .quantize_row = NULL,
    .dequantize_row = iq4_xs_dequantize, .dot_row = iq4_xs_dot, .matvec_scalar = iq4_xs_matvec, .matvec_simd = nf_iq4_xs_matvec_avx2,
};
