/* Internal to src/codec: the GGUF block layouts (llama.cpp ggml-common.h), byte-level field access
 * and the pieces the k-quant files share. Blocks are read through byte pointers and memcpy, never
 * through struct pointers, because a mapped payload is only guaranteed byte alignment. All
 * multi-byte fields are little-endian; so is every host ninfer supports (x86-64, aarch64).
 *
 * Layouts (offsets in bytes; QK_K = 256 elements per super-block):
 *   q8_0  (32 el,  34 B): d f16 @0 | int8 qs[32] @2                              y = d*q
 *   q4_0  (32 el,  18 B): d f16 @0 | u8 qs[16] @2                                y = (q-8)*d
 *   q4_1  (32 el,  20 B): d f16 @0 | m f16 @2 | u8 qs[16] @4                     y = q*d + m
 *   q5_0  (32 el,  22 B): d f16 @0 | u32 qh @2 | u8 qs[16] @6                    y = (q-16)*d
 *   q5_1  (32 el,  24 B): d f16 @0 | m f16 @2 | u32 qh @4 | u8 qs[16] @8         y = q*d + m
 *     (legacy: element j < 16 is the low nibble of qs[j], element j+16 the high nibble; the 5th bit
 *      of element j is bit j of qh)
 *   q4_k (256 el, 144 B): d f16 @0 | dmin f16 @2 | u8 scales[12] @4 | u8 qs[128] @16
 *   q5_k (256 el, 176 B): d f16 @0 | dmin f16 @2 | u8 scales[12] @4 | u8 qh[32] @16 | u8 qs[128] @48
 *   q6_k (256 el, 210 B): u8 ql[128] @0 | u8 qh[64] @128 | int8 scales[16] @192 | d f16 @208
 *   q2_k (256 el,  84 B): u8 scales[16] @0 | u8 qs[64] @16 | d f16 @80 | dmin f16 @82
 *   q3_k (256 el, 110 B): u8 hmask[32] @0 | u8 qs[64] @32 | u8 scales[12] @96 | d f16 @108
 *   iq4_nl (32 el, 18 B): d f16 @0 | u8 qs[16] @2                                y = d*kv[q]
 *   iq4_xs (256 el, 136 B): d f16 @0 | u16 scales_h @2 | u8 scales_l[4] @4 | u8 qs[128] @8
 *     (q2_k.c, q3_k.c and iq4.c say how each element and scale is found)
 * docs/codecs.md spells out which bits of which byte hold each element. */
#ifndef NF_CODEC_GGML_BLOCKS_H
#define NF_CODEC_GGML_BLOCKS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "codec/codec.h"

#define NF_QK_K 256
#define NF_QK_LEGACY 32

enum {
    NF_Q8_0_BYTES = 34,
    NF_Q4_0_BYTES = 18,
    NF_Q4_1_BYTES = 20,
    NF_Q5_0_BYTES = 22,
    NF_Q5_1_BYTES = 24,
    NF_Q4_K_BYTES = 144,
    NF_Q5_K_BYTES = 176,
    NF_Q6_K_BYTES = 210,
    NF_Q2_K_BYTES = 84,
    NF_Q3_K_BYTES = 110,
    NF_IQ4_NL_BYTES = 18,
    NF_IQ4_XS_BYTES = 136,
};

static inline uint16_t nf_rd16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline uint32_t nf_rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline void nf_wr16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

static inline float nf_rd_f16(const uint8_t *p) { return nf_f16_to_f32(nf_rd16(p)); }

/* Sub-block j (0..7) of a q4_k/q5_k block: its 6-bit scale and 6-bit min, packed in 12 bytes as
 * llama.cpp's get_scale_min_k4: bytes 0-3 hold scales 0-3 (bits 0-5) and the top 2 bits of
 * scales 4-7; bytes 4-7 the same for the mins; bytes 8-11 the low 4 bits of scale 4-7 (low
 * nibble) and min 4-7 (high nibble). */
static inline void nf_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

/* The inverse: packs 8 six-bit scales and mins into 12 bytes. */
void nf_k4_pack_scales(const uint8_t sc[8], const uint8_t m[8], uint8_t out[12]);

/* Fits x[n] ~ scale * L - offset with L in [0, nmax] and offset >= 0 (the k-quant "scale and min"
 * sub-block model), minimising the squared error by a search over candidate inverse scales with a
 * least-squares refit at each (docs/codecs.md, "Quantizer searches"). Returns scale >= 0 and
 * writes *offset and L[n]. */
float nf_kq_fit_min(const float *x, int n, int nmax, int nstep, float step, uint8_t *L, float *offset);

/* Shared by q4_k and q5_k: fits the 8 sub-blocks of x[256] with nf_kq_fit_min, quantizes their
 * scales and offsets to 6 bits against the super-block maxima (d = max_scale/63,
 * dmin = max_offset/63, both f16, written at b[0..4) with the packed scales at b[4..16)) and then
 * picks every level L[256] again against the scales as they will be decoded. */
void nf_kq_encode_superblock(const float *x, int nmax, int nstep, float step, uint8_t *b, uint8_t L[NF_QK_K]);

/* Fits x[n] ~ scale * l with l in [-nmax, nmax - 1] (the q6_k model); the search and refit are
 * as above. Returns the (signed) scale and writes l + nmax to L[n]. */
float nf_kq_fit_sym(const float *x, int n, int nmax, int nstep, float step, uint8_t *L);

/* Block decoders of the decode-only codecs (q2_k.c, q3_k.c, iq4.c, legacy.c): bytes -> floats of
 * one block, bit-identical to gguf-py. The scale helpers return a sub-block's signed 6-bit scale. */
void nf_q2_k_block_dequantize(const uint8_t *b, float *y);
void nf_q3_k_block_dequantize(const uint8_t *b, float *y);
void nf_iq4_nl_block_dequantize(const uint8_t *b, float *y);
void nf_iq4_xs_block_dequantize(const uint8_t *b, float *y);
extern const int8_t nf_iq4_values[16]; /* kvalues_iq4nl */

/* q3_k sub-block i's 6-bit scale minus 32: low nibble of scales[i] (i < 8) or high nibble of
 * scales[i - 8], bits 2 * (i / 4) of scales[8 + i % 4] as bits 4-5. Inline: the AVX2 kernels call
 * it per sub-block. */
static inline int nf_q3_k_scale(const uint8_t *sc, int i)
{
    const int lo = i < 8 ? sc[i] & 0xF : sc[i - 8] >> 4;
    const int hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (lo | hi << 4) - 32;
}

/* iq4_xs sub-block ib's 6-bit scale minus 32: nibble ib % 2 of scales_l[ib / 2] (@4) with bits
 * 2ib..2ib+1 of scales_h (@2) on top. */
static inline int nf_iq4_xs_scale(const uint8_t *b, int ib)
{
    const int lo = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF, hi = (nf_rd16(b + 2) >> (2 * ib)) & 3;
    return (lo | hi << 4) - 32;
}

/* Row operations of a codec defined by its block decoder: dequantize_row, the reference dot_row
 * (float per block, double across blocks, as every codec's) and the scalar matvec built on it. */
#define NF_GGML_ROW_OPS(name, ELEMS, BYTES, block_fn)                                                \
    static void name##_dequantize(const void *src, float *y, size_t n)                               \
    {                                                                                                \
        const uint8_t *b = src;                                                                      \
        for (size_t i = 0; i < n / (ELEMS); i++) block_fn(b + i * (BYTES), y + i * (ELEMS));         \
    }                                                                                                \
    static float name##_dot(const void *w, const float *x, size_t n)                                 \
    {                                                                                                \
        const uint8_t *b = w;                                                                        \
        double s = 0;                                                                                \
        float v[ELEMS];                                                                              \
        for (size_t i = 0; i < n / (ELEMS); i++, b += (BYTES), x += (ELEMS)) {                       \
            block_fn(b, v);                                                                          \
            float bs = 0;                                                                            \
            for (int j = 0; j < (ELEMS); j++) bs += v[j] * x[j];                                     \
            s += bs;                                                                                 \
        }                                                                                            \
        return (float)s;                                                                             \
    }                                                                                                \
    static void name##_matvec(const void *w, size_t row_bytes, size_t rows, const float *x, float *y, size_t n) \
    {                                                                                                \
        for (size_t r = 0; r < rows; r++) y[r] = name##_dot((const uint8_t *)w + r * row_bytes, x, n); \
    }

/* Round to nearest, ties to even (the current rounding mode), as an int. */
static inline int nf_round_int(float x) { return (int)__builtin_lrintf(x); }

#endif
