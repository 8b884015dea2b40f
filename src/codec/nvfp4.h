/* NVFP4: e2m1 values, one e4m3 scale per 16 elements, fp32 divisor(s) per separately quantized
 * source matrix. w = e2m1(nibble) * e4m3(scale) / divisor.
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
 *   divisors at divisor_offset: fp32 [D]; row r uses word r / (rows / D). Each divisor's share of
 *                             rows is a whole number of 128-row scale tiles.
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
 * whole number of 128-row tiles, overflow). */
nf_status nf_nvfp4_layout_of(uint64_t rows, uint64_t cols, uint32_t divisors, nf_nvfp4_layout *out, nf_error *err);

/* A view of a payload (all three planes). */
typedef struct nf_nvfp4_planes {
    nf_nvfp4_layout layout;
    const uint8_t *data;     /* [rows][cols/2] */
    const uint8_t *scales;   /* swizzled, layout.scale_bytes */
    const float *divisors;   /* [D] (may be unaligned in a mapped file: read with memcpy) */
} nf_nvfp4_planes;

nf_status nf_nvfp4_view(const void *payload, uint64_t payload_bytes, uint64_t rows, uint64_t cols,
                        uint32_t divisors, nf_nvfp4_planes *out, nf_error *err);

/* Validates a plane set: the layout rules above, every divisor finite and > 0, and no NaN scale
 * byte (0x7f/0xff) in the used region. The error names the failing rule, the row/column or the
 * divisor index. */
nf_status nf_nvfp4_validate(const nf_nvfp4_planes *p, nf_error *err);

/* Swizzled byte offset of (row m, scale column k) in a plane of `cols` columns. */
uint64_t nf_nvfp4_scale_index(uint64_t m, uint64_t k, uint64_t cols);

/* The divisor of row r. */
float nf_nvfp4_row_divisor(const nf_nvfp4_planes *p, uint64_t r);

/* Quantizes rows [row0, row0 + nrows) of a matrix whose whole payload is `payload` (layout given),
 * byte-identically to compressed-tensors: global = 448*6/amax (written as divisor word `div_index`
 * by the caller's choice), block scale = e4m3(amax_block * global / 6), values e2m1
 * round-to-nearest-even. `global` is the divisor to use for these rows. */
void nf_nvfp4_quantize_rows(const float *w, uint64_t row0, uint64_t nrows, float global, const nf_nvfp4_layout *l,
                            uint8_t *payload);

/* The compressed-tensors global scale (divisor) of a matrix with absolute maximum amax:
 * 448*6/amax in fp32 (1.0 when amax is 0). */
float nf_nvfp4_global_from_amax(float amax);

/* Decodes row r to y[cols] in f32 (exact: e2m1 * e4m3 / divisor in fp32). */
void nf_nvfp4_dequantize_row(const nf_nvfp4_planes *p, uint64_t r, float *y);

/* sum over the row of w * x, x in f32; scalar reference and the dispatching fast version. */
float nf_nvfp4_dot_row(const nf_nvfp4_planes *p, uint64_t r, const float *x);
void nf_nvfp4_matvec(const nf_nvfp4_planes *p, uint64_t row0, uint64_t rows, const float *x, float *y);

/* Scalar element codecs. */
float nf_e2m1_to_f32(uint8_t nibble);
uint8_t nf_f32_to_e2m1(float x);   /* round-to-nearest-even on the e2m1 grid, saturating at 6 */
float nf_e4m3_to_f32(uint8_t b);    /* float8_e4m3fn: no infinities, 0x7f/0xff NaN, max 448 */
uint8_t nf_f32_to_e4m3(float x);    /* round-to-nearest-even, saturating at 448 (as torch's cast of a clamped value) */

#endif
