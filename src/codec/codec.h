/* The codec table: every encoding a tensor can have, and the row-level operations on it.
 *
 * Row model (every codec but nvfp4): a row of n elements (n a multiple of block_elems) is
 * n / block_elems consecutive blocks of block_bytes each; rows of a matrix are consecutive.
 * nvfp4 is planar (a data plane, a swizzled scale plane shared by the whole matrix, and fp32
 * divisor words): its matrix-level API is in codec/nvfp4.h, and its row ops here are NULL.
 *
 * Value identity: q8_0, q4_k, q5_k, q6_k, q2_k, q3_k, iq4_xs, iq4_nl and the legacy q4_0/q4_1/q5_0/q5_1 decode to exactly the
 * floats llama.cpp's dequantize_row_* produces for the same bytes (docs/codecs.md). */
#ifndef NF_CODEC_CODEC_H
#define NF_CODEC_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef enum nf_codec_id {
    NF_CODEC_F32 = 0,
    NF_CODEC_F16,
    NF_CODEC_BF16,
    NF_CODEC_Q8_0,
    NF_CODEC_Q4_K,
    NF_CODEC_Q5_K,
    NF_CODEC_Q6_K,
    NF_CODEC_Q4_0, /* legacy: dequantize only */
    NF_CODEC_Q4_1,
    NF_CODEC_Q5_0,
    NF_CODEC_Q5_1,
    NF_CODEC_NVFP4,
    NF_CODEC_Q2_K, /* imported from GGUF, decoded, never encoded */
    NF_CODEC_Q3_K,
    NF_CODEC_IQ4_XS,
    NF_CODEC_IQ4_NL,
    NF_CODEC_COUNT
} nf_codec_id;

enum {
    NF_CODEC_DEQUANT_ONLY = 1u << 0, /* no quantizer: imported, then re-encoded by a recipe */
    NF_CODEC_PLANAR = 1u << 1,       /* not a sequence of self-contained blocks (nvfp4) */
    NF_CODEC_IMPORT_ONLY = 1u << 2,  /* no quantizer: carried over from GGUF as it is, never a recipe's choice */
};

/* Row operations. n is the row length in elements, a multiple of block_elems.
 *   quantize_row:   x[n] f32 -> dst (n / block_elems blocks)
 *   dequantize_row: src -> y[n] f32, bit-identical to llama.cpp for GGUF codecs
 *   dot_row:        sum_i w[i] * x[i], scalar reference with float accumulation per block and
 *                   double accumulation across blocks (the oracle the SIMD paths are tested against)
 *   matvec:         y[r] = dot(row r of w, x) for r < rows; rows are row_bytes apart. The fastest
 *                   kernel this CPU supports (AVX2+FMA+F16C, else scalar), chosen at run time. */
typedef void (*nf_quantize_row_fn)(const float *x, void *dst, size_t n);
typedef void (*nf_dequantize_row_fn)(const void *src, float *y, size_t n);
typedef float (*nf_dot_row_fn)(const void *w, const float *x, size_t n);
typedef void (*nf_matvec_fn)(const void *w, size_t row_bytes, size_t rows, const float *x, float *y, size_t n);

typedef struct nf_codec {
    nf_codec_id id;
    const char *name;     /* "q4_k": the name used on the command line, in the artifact and in docs */
    int ggml_type;        /* GGML type id (Q4_K = 12, ...), -1 when GGUF has none */
    uint32_t block_elems; /* elements per block (1 for f32/f16/bf16, 16 for nvfp4) */
    uint32_t block_bytes; /* bytes per block; for nvfp4 the data plane only (8 per 16 elements) */
    unsigned flags;       /* NF_CODEC_DEQUANT_ONLY, NF_CODEC_PLANAR, NF_CODEC_IMPORT_ONLY */
    nf_quantize_row_fn quantize_row;     /* NULL for dequant-only, import-only and planar codecs */
    nf_dequantize_row_fn dequantize_row; /* NULL for planar codecs */
    nf_dot_row_fn dot_row;               /* NULL for planar codecs */
    nf_matvec_fn matvec_scalar;          /* portable multi-row kernel (NULL for planar) */
    nf_matvec_fn matvec_simd;            /* AVX2+FMA+F16C kernel, or NULL if none */
} nf_codec;

const nf_codec *nf_codec_get(nf_codec_id id);       /* NULL for an invalid id */
const nf_codec *nf_codec_by_name(const char *name); /* NULL if unknown */
const nf_codec *nf_codec_by_ggml_type(int type);    /* NULL if unknown */

/* The matvec kernel to use on this machine: matvec_simd when the CPU has AVX2, FMA and F16C and
 * NF_NO_SIMD is not set in the environment, else matvec_scalar. */
nf_matvec_fn nf_codec_matvec(const nf_codec *c);
int nf_cpu_has_avx2_fma_f16c(void);

/* Bytes of one encoded row of n elements; 0 when n is not a multiple of block_elems. */
size_t nf_codec_row_bytes(const nf_codec *c, size_t n);

/* Bytes of the whole payload of a rows x cols matrix (rows = product of the leading dims, cols =
 * innermost dim) with `divisors` fp32 divisor words (nvfp4 only; 1 otherwise). For nvfp4 this is
 * the plane layout of codec/nvfp4.h. Fails (naming the rule) when cols is not a multiple of the
 * block, divisors != 1 for a non-nvfp4 codec, or the size overflows. */
nf_status nf_codec_payload_bytes(const nf_codec *c, uint64_t rows, uint64_t cols, uint32_t divisors,
                                 uint64_t *bytes, nf_error *err);

/* Offsets of the f16 scale fields inside one block of c: off[0] the scale (d), off[1] the offset
 * or min field (dmin, m) or -1. Returns how many there are (0 for f32/f16/bf16 and nvfp4). */
int nf_codec_scale_fields(const nf_codec *c, int off[2]);

/* Fills n_blocks blocks of a block codec with random bytes, then sets every f16 scale field to a
 * random value in [d/2, 3d/2) (sign kept positive): valid blocks with sane values for codecs that
 * have no quantizer (import-only, dequant-only), for benchmarks and tests. *state is a nonzero
 * xorshift64 state, advanced. Fails (returns -1) for codecs without scale fields. */
int nf_codec_fill_random(const nf_codec *c, void *dst, size_t n_blocks, uint64_t *state, float d);

/* Scalar conversions shared by every codec (round-to-nearest-even, NaN preserved). */
float nf_f16_to_f32(uint16_t h);
uint16_t nf_f32_to_f16(float f);
float nf_bf16_to_f32(uint16_t h);
uint16_t nf_f32_to_bf16(float f);

#endif
