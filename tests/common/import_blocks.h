/* Random valid blocks of the import-only GGUF codecs (q2_k, q3_k, iq4_xs, iq4_nl), which have no
 * quantizer (NF_CODEC_IMPORT_ONLY), for tests that need banks in them. Every quant, scale and mask
 * byte is random (any bit pattern is a valid block, so every field's every bit is exercised); only the
 * f16 super-scales are set, to finite positive values that give the decoded weights a standard
 * deviation of about `sd` (times a factor in [0.5, 1.5) per scale field), from each codec's typical
 * magnitudes under uniform random fields:
 *   q2_k:   (d sc) q - (dmin m), sc, m in 0..15, q in 0..3: about 13 d (d = dmin)
 *   q3_k:   d (s - 32) q, s in 0..63, q in -4..3: rms 18.5 x 2.35, about 43 d
 *   iq4_xs: d (ls - 32) kv, kv the table (rms 67.4): about 1247 d
 *   iq4_nl: d kv: about 67 d
 * (iq4_xs's d then lies near the f16 subnormal range at the tests' sd: exact either way.)
 * Tests dequantize the same bytes with the codec table's dequantize_row (the CPU decoders), so their
 * oracle stays independent of the device decoders under test. The bytes come from the codec
 * library's nf_codec_fill_random (every scale field in [d/2, 3d/2)); this picks d per codec.
 * Returns 0 for another codec. */
#ifndef NF_TESTS_COMMON_IMPORT_BLOCKS_H
#define NF_TESTS_COMMON_IMPORT_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

#include "codec/codec.h"

static inline int nf_test_import_blocks(int codec, uint8_t *dst, size_t nblocks, float sd, uint64_t *s)
{
    const nf_codec *c = nf_codec_get((nf_codec_id)codec);
    if (!c || !(c->flags & NF_CODEC_IMPORT_ONLY)) return 0;
    const float d = codec == NF_CODEC_Q2_K ? sd / 13.0f
                    : codec == NF_CODEC_Q3_K ? sd / 43.0f
                    : codec == NF_CODEC_IQ4_XS ? sd / 1247.0f
                                               : sd / 67.4f; /* iq4_nl */
    return nf_codec_fill_random(c, dst, nblocks, s, d) == 0;
}

#endif
