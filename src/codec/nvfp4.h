/* NVFP4: e2m1 values, one e4m3 scale per 16 elements, fp32 divisor(s) per separately quantized
 * source matrix. w = e2m1(nibble) * (e4m3(scale) / divisor), the order compressed-tensors' and
 * vLLM's dequantizers use (docs/nvfp4.md).
 *
 * A matrix of rows x cols (cols a multiple of 16; rows = product of the leading dims, so a bank of
 * E experts of N rows each is one matrix of E*N rows) is stored as one payload with three planes:
 *
 *   data     at 0:            u8 [rows][cols/2]; element 2i in the low nibble of byte i, 2i+1 in the
 *                             high nibble; nibble = sign (bit 3) | index (bits 0-2) into
 *                             {0, 0.5, 1, 1.5, 2, 3, 4, 6}
 *   scales   at scale_offset: e4m3 bytes in the swizzled "128x4" layout: rows padded to 128, scale
 *                             columns (cols/16) padded to 4; byte of (row m, scale column k) at
 *                             (m/128)*kt*512 + (k/4)*512 + (m%32)*16 + ((m%128)/32)*4 + (k%4),
 *                             kt = ceil(cols/16/4). Padding bytes are zero.
 *   divisors at divisor_offset: fp32 [D]; row r uses word r / (rows / D). With D > 1 each
 *                             divisor's share of rows is a whole number of 128-row scale tiles, so
 *                             no tile mixes two divisors (D = 1 allows any row count).
 *
 *   scale_offset = align_up(rows * cols / 2, 256); divisor_offset = scale_offset + scale_bytes;
 *   payload bytes = divisor_offset + 4 * D. */
#ifndef NF_CODEC_NVFP4_H
#define NF_CODEC_NVFP4_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef struct nf_nvfp4_layout {
    uint64_t rows, cols;
    uint32_t divisors;       /* D */
    uint64_t data_bytes;     /* rows * cols / 2 */
    uint64_t scale_offset;   /* from the payload start */
    uint64_t scale_bytes;    /* ceil(rows/128) * ceil(cols/64) * 512 */
    uint64_t divisor_offset; /* from the payload start */
    uint64_t payload_bytes;  /* divisor_offset + 4 * D */
} nf_nvfp4_layout;

/* Computes the layout; fails naming the rule (cols % 16, D >= 1, D divides rows, each share a
 * whole number of 128-row tiles when D > 1, overflow). */
nf_status nf_nvfp4_layout_of(uint64_t rows, uint64_t cols, uint32_t divisors, nf_nvfp4_layout *out, nf_error *err);

/* A view of a payload (all three planes). */
typedef struct nf_nvfp4_planes {
    nf_nvfp4_layout layout;
    const uint8_t *data;     /* [rows][cols/2] */
    const uint8_t *scales;   /* swizzled, layout.scale_bytes */
    const float *divisors;   /* [D] (may be unaligned in a mapped file: read with memcpy) */
} nf_nvfp4_planes;

/* Fills *out for a payload of exactly payload_bytes bytes (the layout's payload_bytes; a different
 * size is refused, naming both). Does not look at the contents: see nf_nvfp4_validate. */
nf_status nf_nvfp4_view(const void *payload, uint64_t payload_bytes, uint64_t rows, uint64_t cols,
                        uint32_t divisors, nf_nvfp4_planes *out, nf_error *err);

/* Validates a plane set: the layout rules above (and that p->layout is the layout of its rows,
 * cols and D), every divisor finite and > 0, and no NaN scale byte (0x7f/0xff) in the used region.
 * The error names the failing rule, the row/column or the divisor index. */
nf_status nf_nvfp4_validate(const nf_nvfp4_planes *p, nf_error *err);

/* Swizzled byte offset of (row m, scale column k) in a plane of `cols` columns. */
uint64_t nf_nvfp4_scale_index(uint64_t m, uint64_t k, uint64_t cols);

/* The divisor of row r: word r / (rows / D). */
float nf_nvfp4_row_divisor(const nf_nvfp4_planes *p, uint64_t r);

/* The compressed-tensors global scale (divisor) of a matrix with absolute maximum amax:
 * 448*6/amax in fp32; 1.0 when that is not finite (amax 0, tiny or NaN), as generate_gparam does. */
float nf_nvfp4_global_from_amax(float amax);

/* The e4m3 block scale byte of a block with absolute maximum amax_block under divisor `global`,
 * as compressed-tensors' calculate_qparams computes it for fp32 weights: s = (amax/6) in fp32,
 * s = global * s in fp32, clamp to 448, round to e4m3 (nearest-even), and a scale that rounds to
 * zero becomes 0.125 (their eps for float8_e4m3fn, byte 0x20). */
uint8_t nf_nvfp4_block_scale(float amax_block, float global);

/* Quantizes rows [row0, row0 + nrows) of a matrix whose whole payload is `payload` (layout l):
 * w holds those rows only, [nrows][cols] f32 (finite). Writes their data bytes and scale bytes,
 * byte-identically to compressed-tensors nvfp4-pack-quantized: block scale as
 * nf_nvfp4_block_scale, value q = x / (e4m3 / global) in fp32 clamped to [-6, 6], rounded to e2m1
 * with their thresholds (round-to-nearest-even), sign bit set when q < 0 (so a tiny negative value
 * becomes nibble 0x8, negative zero). `global` is the divisor for these rows; the caller writes
 * it as their divisor word and zeroes the scale padding (nf_nvfp4_quantize does both). */
void nf_nvfp4_quantize_rows(const float *w, uint64_t row0, uint64_t nrows, float global, const nf_nvfp4_layout *l,
                            uint8_t *payload);

/* Quantizes a whole matrix w[rows][cols] (finite) into payload (l->payload_bytes) as D separately
 * quantized sources: share d (rows d*rows/D ..) gets divisor nf_nvfp4_global_from_amax(its amax),
 * written as word d. Padding bytes are zeroed. */
void nf_nvfp4_quantize(const float *w, const nf_nvfp4_layout *l, uint8_t *payload);

/* Decodes row r to y[cols] in f32: e2m1 * (e4m3 / divisor), each step in fp32, bit-identical to
 * compressed-tensors' dequantize in float32. */
void nf_nvfp4_dequantize_row(const nf_nvfp4_planes *p, uint64_t r, float *y);

/* sum over row r of w * x, x[cols] f32. Scalar reference: per block of 16 the sum of e2m1 * x in
 * float, times (e4m3 / divisor) in double, accumulated in double across blocks. */
float nf_nvfp4_dot_row(const nf_nvfp4_planes *p, uint64_t r, const float *x);

/* y[i] = dot(row row0 + i, x) for i < rows. nf_nvfp4_matvec dispatches at run time to the AVX2+FMA
 * kernel (when nf_cpu_has_avx2_fma_f16c() and NF_NO_SIMD is unset) or the scalar one; both are
 * exported so tests can compare them. */
void nf_nvfp4_matvec(const nf_nvfp4_planes *p, uint64_t row0, uint64_t rows, const float *x, float *y);
void nf_nvfp4_matvec_scalar(const nf_nvfp4_planes *p, uint64_t row0, uint64_t rows, const float *x, float *y);
/* Only call when nf_cpu_has_avx2_fma_f16c() (compiled with -mavx2 -mfma -mf16c). */
void nf_nvfp4_matvec_avx2(const nf_nvfp4_planes *p, uint64_t row0, uint64_t rows, const float *x, float *y);

/* Scalar element codecs. */
float nf_e2m1_to_f32(uint8_t nibble);
uint8_t nf_f32_to_e2m1(float x);   /* compressed-tensors' thresholds (nearest-even), clamped to +-6, 0x8 for q < 0 */
float nf_e4m3_to_f32(uint8_t b);    /* float8_e4m3fn: no infinities, 0x7f/0xff NaN, max 448 */
uint8_t nf_f32_to_e4m3(float x);    /* round-to-nearest-even, saturating at 448 (as torch's cast of a clamped value) */

#endif
