/* q3_k: super-blocks of 256 elements in 16 sub-blocks of 16 (ggml type 11, 110 bytes).
 * Block: u8 hmask[32] @0 | u8 qs[64] @32 | u8 scales[12] @96 | f16 d @108.
 * Element e: low bits (qs[32 * (e / 128) + e % 32] >> 2j) & 3 with j = (e % 128) / 32; high bit
 * (hmask[e % 32] >> (e / 32)) & 1; q = low - 4 when the high bit is CLEAR (q in [-4, 3]).
 * Sub-block i's 6-bit scale: low nibble of scales[i] (i < 8) or high nibble of scales[i - 8]
 * (i >= 8), and bits 2 * (i / 4) of scales[8 + i % 4] as bits 4-5; minus 32.
 * y = (d * sc) * q as llama.cpp's dequantize_row_q3_K and gguf-py compute it. Decode only. */
#include "codec/codec_simd.h"
#include "codec/ggml_blocks.h"

void nf_q3_k_block_dequantize(const uint8_t *b, float *y)
{
    const float d = nf_rd_f16(b + 108);
    const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
    for (int e = 0; e < NF_QK_K; e += 16) {
        const float dl = d * (float)nf_q3_k_scale(sc, e / 16);
        const uint8_t *q = qs + 32 * (e / 128) + e % 32, *h = hm + e % 32;
        const int shift = 2 * ((e % 128) / 32), hbit = e / 32;
        for (int l = 0; l < 16; l++) {
            const int v = ((q[l] >> shift) & 3) - (((h[l] >> hbit) & 1) ? 0 : 4);
            y[e + l] = dl * (float)v;
        }
    }
}

NF_GGML_ROW_OPS(q3_k, NF_QK_K, NF_Q3_K_BYTES, nf_q3_k_block_dequantize)

const nf_codec nf_codec_q3_k = {
    .id = NF_CODEC_Q3_K, .name = "q3_k", .ggml_type = 11, .block_elems = NF_QK_K, .block_bytes = NF_Q3_K_BYTES,
    .flags = NF_CODEC_IMPORT_ONLY, .quantize_row = NULL, .dequantize_row = q3_k_dequantize, .dot_row = q3_k_dot,
    .matvec_scalar = q3_k_matvec, .matvec_simd = nf_q3_k_matvec_avx2,
};
