/* GGUF codecs against gguf-py (llama.cpp's Python package), through the committed fixtures of
 * tests/oracle/gguf_codecs.py:
 *   - dequantize_row of every fixture block equals gguf.quants.dequantize bit for bit (q8_0, q4_k,
 *     q5_k, q6_k, q4_0, q4_1, q5_0, q5_1 and the import-only q2_k, q3_k, iq4_xs, iq4_nl on random,
 *     all-zero, extreme, negative-zero and subnormal scales, plus all-minimum and all-maximum
 *     sub-block scale codes for q2_k/q3_k/iq4_xs; f16 on all 65536 patterns; bf16 on a sample);
 *   - quantize_row equals gguf.quants.quantize byte for byte where that quantizer is defined
 *     bit-exactly (q8_0, f16, bf16; NaN only has to stay a NaN of the same sign). */
#include <math.h>

#include "codec/codec.h"
#include "codec_fixture.h"
#include "nf_test.h"

static void check_dequant(const char *file, const char *codec_name)
{
    codec_fixture fx;
    CHECK_MSG(fx_load(file, &fx) == 0, "%s", file);
    if (!fx.blocks) return;
    const nf_codec *c = nf_codec_by_ggml_type((int)fx.ggml_type);
    CHECK_MSG(c && strcmp(c->name, codec_name) == 0, "%s: ggml type %u is not %s", file, fx.ggml_type, codec_name);
    if (!c) return;
    CHECK_EQ_INT(c->block_elems, fx.block_elems);
    CHECK_EQ_INT(c->block_bytes, fx.block_bytes);
    float *y = malloc((size_t)fx.block_elems * fx.n_blocks * sizeof(float));
    /* the whole fixture as one row, and block by block (a row of one block) */
    c->dequantize_row(fx.blocks, y, (size_t)fx.block_elems * fx.n_blocks);
    size_t bad = 0, first = (size_t)-1, total = (size_t)fx.block_elems * fx.n_blocks;
    for (size_t i = 0; i < total; i++) {
        if (fx_bits(y[i]) != fx_bits(fx.values[i])) {
            if (!bad) first = i;
            bad++;
        }
    }
    CHECK_MSG(bad == 0, "%s: %zu of %zu values differ from gguf-py; first at element %zu (block %zu): %a (0x%08x) vs %a (0x%08x)",
              file, bad, total, first, first / fx.block_elems, bad ? y[first] : 0.0, bad ? fx_bits(y[first]) : 0,
              bad ? fx.values[first] : 0.0, bad ? fx_bits(fx.values[first]) : 0);
    uint32_t bad_blocks = 0;
    for (uint32_t b = 0; b < fx.n_blocks && fx.block_elems > 1; b++) {
        c->dequantize_row(fx.blocks + (size_t)b * fx.block_bytes, y, fx.block_elems);
        bad_blocks += memcmp(y, fx.values + (size_t)b * fx.block_elems, fx.block_elems * sizeof(float)) != 0;
    }
    CHECK_MSG(bad_blocks == 0, "%s: %u blocks decoded alone differ", file, bad_blocks);
    printf("%-14s %-5s %6u blocks, %8zu values bit-identical: %s\n", file, c->name, fx.n_blocks, total - bad,
           bad ? "NO" : "yes");
    free(y);
    fx_free(&fx);
}

static int same_half_result(uint16_t got, uint16_t want, int is_bf16)
{
    if (got == want) return 1;
    /* NaN: gguf-py and the hardware disagree on payloads; a NaN of the same sign is required */
    float g = is_bf16 ? nf_bf16_to_f32(got) : nf_f16_to_f32(got);
    float w = is_bf16 ? nf_bf16_to_f32(want) : nf_f16_to_f32(want);
    return isnan(g) && isnan(w) && ((got ^ want) & 0x8000) == 0;
}

static void check_encode_half(const char *file, const char *codec_name)
{
    codec_fixture fx;
    CHECK_MSG(fx_load(file, &fx) == 0, "%s", file);
    if (!fx.blocks) return;
    const nf_codec *c = nf_codec_by_name(codec_name);
    CHECK(c && (int)fx.ggml_type == c->ggml_type);
    if (!c) return;
    const int bf = c->id == NF_CODEC_BF16;
    uint16_t *out = malloc((size_t)fx.n_blocks * 2);
    c->quantize_row(fx.values, out, fx.n_blocks);
    size_t bad = 0;
    for (uint32_t i = 0; i < fx.n_blocks; i++) {
        uint16_t want;
        memcpy(&want, fx.blocks + 2 * (size_t)i, 2);
        uint16_t one = bf ? nf_f32_to_bf16(fx.values[i]) : nf_f32_to_f16(fx.values[i]);
        if (!same_half_result(out[i], want, bf) || one != out[i]) {
            if (bad++ < 5)
                fprintf(stderr, "%s: input %a (0x%08x): got 0x%04x, gguf-py 0x%04x\n", file, fx.values[i],
                        fx_bits(fx.values[i]), out[i], want);
        }
    }
    CHECK_MSG(bad == 0, "%s: %zu of %u encodings differ from gguf-py", file, bad, fx.n_blocks);
    printf("%-14s %-5s %6u inputs, encodings byte-identical: %s\n", file, c->name, fx.n_blocks, bad ? "NO" : "yes");
    free(out);
    fx_free(&fx);
}

static void check_encode_q8_0(void)
{
    codec_fixture fx;
    CHECK(fx_load("enc_q8_0.bin", &fx) == 0);
    if (!fx.blocks) return;
    const nf_codec *c = nf_codec_get(NF_CODEC_Q8_0);
    CHECK_EQ_INT(fx.ggml_type, c->ggml_type);
    uint8_t *out = malloc((size_t)fx.n_blocks * fx.block_bytes);
    c->quantize_row(fx.values, out, (size_t)fx.n_blocks * fx.block_elems);
    size_t bad = 0;
    for (uint32_t b = 0; b < fx.n_blocks; b++)
        if (memcmp(out + (size_t)b * fx.block_bytes, fx.blocks + (size_t)b * fx.block_bytes, fx.block_bytes)) {
            if (bad++ < 3) fprintf(stderr, "enc_q8_0.bin: block %u differs from gguf-py's quantize\n", b);
        }
    CHECK_MSG(bad == 0, "q8_0: %zu of %u blocks differ from gguf.quants.quantize", bad, fx.n_blocks);
    printf("%-14s %-5s %6u blocks, quantize byte-identical: %s\n", "enc_q8_0.bin", "q8_0", fx.n_blocks, bad ? "NO" : "yes");
    free(out);
    fx_free(&fx);
}

int main(void)
{
    check_dequant("deq_q8_0.bin", "q8_0");
    check_dequant("deq_q4_k.bin", "q4_k");
    check_dequant("deq_q5_k.bin", "q5_k");
    check_dequant("deq_q6_k.bin", "q6_k");
    check_dequant("deq_q4_0.bin", "q4_0");
    check_dequant("deq_q4_1.bin", "q4_1");
    check_dequant("deq_q5_0.bin", "q5_0");
    check_dequant("deq_q5_1.bin", "q5_1");
    check_dequant("deq_q2_k.bin", "q2_k");
    check_dequant("deq_q3_k.bin", "q3_k");
    check_dequant("deq_iq4_xs.bin", "iq4_xs");
    check_dequant("deq_iq4_nl.bin", "iq4_nl");
    check_dequant("deq_f16.bin", "f16");
    check_dequant("deq_bf16.bin", "bf16");
    check_encode_half("enc_f16.bin", "f16");
    check_encode_half("enc_bf16.bin", "bf16");
    check_encode_q8_0();
    return nf_test_report();
}
