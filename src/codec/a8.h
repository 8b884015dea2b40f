/* int8 activations and integer dot products for q8_0, q4_k, q5_k and q6_k weights (docs/cpu.md).
 *
 * An activation row x[n] (n a multiple of 32) is quantised once per product batch, per 32-element
 * block b (the q8_0 block and the q4_k / q5_k sub-block; two q6_k sub-blocks):
 *     amax = max |x_i|,  d_b = amax / 127 (f32),  q_i = rint(x_i * (1 / d_b)) in [-127, 127]
 * (d_b = 0 and q_i = 0 when amax < 127 * 2^-126, where d_b would be subnormal), so |x_i - d_b q_i| <= d_b (1/2 + 2^-16): the f32 product x_i * (1/d_b)
 * (two roundings) is within 127 * 2^-23 of x_i / d_b; with d_b <= amax / 127 (1 + 2^-24) that is
 * |x_i - d_b q_i| <= amax (1/254 + 2^-22) (or |x_i| < 2^-119 in a zeroed block). The row also keeps the sums of q
 * over each 16 elements (bsum, int16: q4_k / q5_k subtract their min term with them, q6_k its
 * offset of 32).
 *
 * Stored row (nf_a8_row_bytes(n) bytes, a multiple of 64):
 *     int8 q[n] @0 | f32 d[n / 32] @n | int16 bsum[n / 16] @n + n/8 | f32 dsum[n / 32] @n + n/4 | padding
 * (dsum_b = d_b * (bsum_2b + bsum_2b+1), the block's sum of x~, for the tile's min term)
 *
 * A kernel computes, per weight row, the exact integer sum over each block of (weight level) x q
 * and combines the blocks in f32 with the decoded scales exactly as dequantize forms them:
 *     q8_0: (dw d_b) isum_b;  q4_k / q5_k: (d1_j d_b) isum_j - (m1_j d_b) qsum_j;
 *     q6_k: (d1_k d_b) (isum_k - 32 bsum_k) per 16-element sub-block k (ISAs may group two).
 * So its result equals sum_i w_i x~_i (x~ = d q, the quantised activations, w the decoded weights)
 * up to f32 rounding of the combine: tests/codec/test_codec_a8.c states and checks that bound for
 * every kernel and ISA, and the quantisation's own bound. */
#ifndef NF_CODEC_A8_H
#define NF_CODEC_A8_H

#include <stddef.h>
#include <stdint.h>

#include "codec/codec.h"

/* Instruction sets of the integer kernels, in increasing order. */
typedef enum nf_isa {
    NF_ISA_SCALAR = 0,   /* portable C */
    NF_ISA_AVX2,         /* AVX2 + FMA + F16C: vpmaddubsw / vpmaddwd */
    NF_ISA_AVX512VNNI,   /* AVX-512 F/BW/VL + VNNI: vpdpbusd on 512-bit vectors */
    NF_ISA_AMX,          /* AVX-512 VNNI + AMX-TILE / AMX-INT8 (granted by the OS): the prefill tile on TDPBSUD */
    NF_ISA_COUNT
} nf_isa;

/* The best ISA this CPU (and OS) supports. */
nf_isa nf_isa_detect(void);
/* The ISA the CPU backend uses: nf_isa_detect(), lowered by the environment: NF_CPU_ISA=scalar|avx2|
 * avx512vnni|amx (a name above the CPU's is capped to it), NF_NO_SIMD=1 (scalar). Decided once per process. */
nf_isa nf_isa_selected(void);
const char *nf_isa_name(nf_isa isa);
/* "scalar", "avx2", "avx512vnni", "amx" -> 0 and *out; else -1. */
int nf_isa_parse(const char *name, nf_isa *out);

#define NF_A8_BLOCK 32

/* Bytes of one quantised row of n elements (n % 32 == 0), a multiple of 64. */
static inline size_t nf_a8_row_bytes(size_t n) { return (n + n / 4 + n / 8 + 63) / 64 * 64; }

/* x[n] -> dst (nf_a8_row_bytes(n) bytes). Every ISA writes the same bytes. */
void nf_a8_quantize_row(const float *x, uint8_t *dst, size_t n, nf_isa isa);

/* y[t * ldy + r] = sum_i W[r][i] x~_t[i] for r < rows, t < ntok: W's rows row_bytes apart, token t's
 * quantised row at xa + t * ldxa, n the row length (a multiple of the codec's block). */
typedef void (*nf_a8_gemm_fn)(const void *w, size_t row_bytes, size_t rows, const uint8_t *xa, size_t ldxa,
                              size_t ntok, float *y, size_t ldy, size_t n);

/* The kernel of codec c at ISA isa (a codec without a kernel of its own at isa gets its best one
 * below it); NULL when c has no integer kernel or isa is above nf_isa_detect(). */
nf_a8_gemm_fn nf_codec_a8_kernel(const nf_codec *c, nf_isa isa);

/* The AMX tile's activations (nf_a8_tile_wants_xt): the quantised rows of a source of T tokens regrouped
 * "token = column", so that 16 consecutive tokens' bytes are an AMX "B" tile at any first token:
 *     int8 q: dword j (bytes 4j .. 4j+3) of token t at 4 (j T + t)   (n T bytes)
 *     f32 d[b][t] at n T + 4 (b T + t), f32 dsum[b][t] after it (b < n / 32)   then 64 zero bytes
 * (nf_a8_xt_bytes(n, T) in all). A tile call on tokens t0 .. t0 + ntok - 1 of the source reads
 * base with the source's T and t0; reads of a partial 16-token group run past the group, at most 64 bytes
 * past the end (the zero bytes), and their lanes are discarded. */
typedef struct nf_a8_xt {
    const uint8_t *base;
    size_t T, t0;
} nf_a8_xt;
size_t nf_a8_xt_bytes(size_t n, size_t T);
/* Token t's quantised row xa_t (nf_a8_row_bytes(n) bytes) into xt; rows may be put in any order and in
 * parallel; nf_a8_xt_pad writes the zero bytes. */
void nf_a8_xt_put(const uint8_t *xa_t, size_t n, size_t t, size_t T, uint8_t *xt);
void nf_a8_xt_pad(uint8_t *xt, size_t n, size_t T);
/* Tokens t0 .. t0 + nt - 1 (rows at xa + t ldxa) into xt, as nf_a8_xt_put does (the same bytes; 16 at a
 * time with 16 x 16 dword transposes where isa has AVX-512). Disjoint token ranges may run in parallel. */
void nf_a8_xt_fill(const uint8_t *xa, size_t ldxa, size_t n, size_t T, size_t t0, size_t nt, uint8_t *xt, nf_isa isa);

/* Multi-token products (prefill segments) with the weight rows repacked 16 at a time, "lane = row"
 * (a8_tile_avx512.c says how): the same y as nf_a8_gemm_fn up to f32 rounding, faster when several
 * tokens share the rows. scratch: nf_a8_tile_scratch(n) bytes (any alignment). n must be a multiple
 * of 64. NULL when c or isa has none (scalar): use nf_codec_a8_kernel per token. The AVX2, AVX-512
 * VNNI and AMX tiles (a8_tile_avx2.c, a8_tile_avx512.c, a8_tile_amx.c) give the same bits. xt: the
 * same tokens regrouped (nf_a8_xt), read by the tile where nf_a8_tile_wants_xt(isa) (AMX; without it
 * the AMX tile runs as the AVX-512 VNNI tile), ignored elsewhere (may be NULL). */
typedef void (*nf_a8_tile_fn)(const void *w, size_t row_bytes, size_t rows, const uint8_t *xa, size_t ldxa,
                              size_t ntok, float *y, size_t ldy, size_t n, void *scratch, const nf_a8_xt *xt);
size_t nf_a8_tile_scratch(size_t n);
nf_a8_tile_fn nf_codec_a8_tile(const nf_codec *c, nf_isa isa);
int nf_a8_tile_wants_xt(nf_isa isa);

#endif
