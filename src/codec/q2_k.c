/* q2_k: super-blocks of 256 elements in 16 sub-blocks of 16 (ggml type 10, 84 bytes).
 * Block: u8 scales[16] @0 (low nibble: scale, high nibble: min of sub-block i) | u8 qs[64] @16 |
 * f16 d @80 | f16 dmin @82. Element e (0..255) is bits 2j..2j+1 of qs[32 * (e / 128) + e % 32],
 * j = (e % 128) / 32; y = (d * sc) * q - (dmin * m) with q in [0, 3], two roundings as llama.cpp's
 * dequantize_row_q2_K and gguf-py compute them. Decode only: GGUF files carry it, the converter
 * copies it, and no recipe encodes to it. */
#include "codec/codec_simd.h"
#include "codec/ggml_blocks.h"

void nf_q2_k_block_dequantize(const uint8_t *b, float *y)
{
    const float d = nf_rd_f16(b + 80), dmin = nf_rd_f16(b + 82);
    const uint8_t *sc = b, *qs = b + 16;
    for (int e = 0; e < NF_QK_K; e += 16) {
        const float dl = d * (float)(sc[e / 16] & 0xF), ml = dmin * (float)(sc[e / 16] >> 4);
        const uint8_t *q = qs + 32 * (e / 128) + e % 32;
        const int shift = 2 * ((e % 128) / 32);
        for (int l = 0; l < 16; l++) y[e + l] = dl * (float)((q[l] >> shift) & 3) - ml;
    }
}

NF_GGML_ROW_OPS(q2_k, NF_QK_K, NF_Q2_K_BYTES, nf_q2_k_block_dequantize)

const nf_codec nf_codec_q2_k = {
    .id = NF_CODEC_Q2_K, .name = "q2_k", .ggml_type = 10, .block_elems = NF_QK_K, .block_bytes = NF_Q2_K_BYTES,
    .flags = NF_CODEC_IMPORT_ONLY, .quantize_row = NULL, .dequantize_row = q2_k_dequantize, .dot_row = q2_k_dot,
    .matvec_scalar = q2_k_matvec, .matvec_simd = nf_q2_k_matvec_avx2,
};
