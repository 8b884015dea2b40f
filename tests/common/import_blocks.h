/* Random valid blocks of the import-only GGUF codecs (q2_k, q3_k, iq4_xs, iq4_nl), which have no
 * quantizer (NF_CODEC_IMPORT_ONLY), for tests that need banks in them. Every quant, scale and mask
 * byte is random (any bit pattern is a valid block, so every field's every bit is exercised); only the
 * f16 super-scales are set, to finite positive values that give the decoded weights a standard
 * deviation of about `sd` (times a factor in [0.75, 1.25] per block), from each codec's typical
 * magnitudes under uniform random fields:
 *   q2_k:   (d sc) q - (dmin m), sc, m in 0..15, q in 0..3: about 13 d (d = dmin)
 *   q3_k:   d (s - 32) q, s in 0..63, q in -4..3: rms 18.5 x 2.35, about 43 d
 *   iq4_xs: d (ls - 32) kv, kv the table (rms 67.4): about 1247 d
 *   iq4_nl: d kv: about 67 d
 * (iq4_xs's d then lies near the f16 subnormal range at the tests' sd: exact either way.)
 * Tests dequantize the same bytes with the codec table's dequantize_row (the CPU decoders), so their
 * oracle stays independent of the device decoders under test. Returns 0 for another codec. */
#ifndef NF_TESTS_COMMON_IMPORT_BLOCKS_H
#define NF_TESTS_COMMON_IMPORT_BLOCKS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "codec/codec.h"

static inline uint64_t nf_test_xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* An f16 of v * [0.75, 1.25) at p (little-endian). */
static inline void nf_test_put_f16(uint8_t *p, float v, uint64_t *s)
{
    const float f = v * (0.75f + 0.5f * (float)(nf_test_xorshift(s) >> 40) / 16777216.0f);
    const uint16_t h = nf_f32_to_f16(f);
    memcpy(p, &h, 2);
}

static inline int nf_test_import_blocks(int codec, uint8_t *dst, size_t nblocks, float sd, uint64_t *s)
{
    const nf_codec *c = nf_codec_get((nf_codec_id)codec);
    if (!c || !(c->flags & NF_CODEC_IMPORT_ONLY)) return 0;
    for (size_t i = 0; i < nblocks * c->block_bytes; i += 8) {
        const uint64_t v = nf_test_xorshift(s);
        const size_t n = nblocks * c->block_bytes - i < 8 ? nblocks * c->block_bytes - i : 8;
        memcpy(dst + i, &v, n);
    }
    for (size_t b = 0; b < nblocks; b++) {
        uint8_t *blk = dst + b * c->block_bytes;
        switch (codec) {
        case NF_CODEC_Q2_K: nf_test_put_f16(blk + 80, sd / 13.0f, s), nf_test_put_f16(blk + 82, sd / 13.0f, s); break;
        case NF_CODEC_Q3_K: nf_test_put_f16(blk + 108, sd / 43.0f, s); break;
        case NF_CODEC_IQ4_XS: nf_test_put_f16(blk, sd / 1247.0f, s); break;
        default: nf_test_put_f16(blk, sd / 67.4f, s); break; /* iq4_nl */
        }
    }
    return 1;
}

#endif
