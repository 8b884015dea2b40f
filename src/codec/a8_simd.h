/* Internal to src/codec: the integer kernels of codec/a8.h per ISA. The *_avx2.c files are compiled
 * with -mavx2 -mfma -mf16c, the *_avx512.c files with AVX-512 F/BW/VL/VNNI as well; both are reached
 * only through nf_codec_a8_kernel / nf_a8_quantize_row, which check the CPU first; the *_amx.c
 * files add AMX-TILE / AMX-INT8 (reached only through nf_codec_a8_tile at NF_ISA_AMX). */
#ifndef NF_CODEC_A8_SIMD_H
#define NF_CODEC_A8_SIMD_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define NF_A8_GEMM_DECL(name)                                                                              \
    void name(const void *w, size_t row_bytes, size_t rows, const uint8_t *xa, size_t ldxa, size_t ntok, \
              float *y, size_t ldy, size_t n)

NF_A8_GEMM_DECL(nf_q8_0_a8_avx2);
NF_A8_GEMM_DECL(nf_q4_k_a8_avx2);
NF_A8_GEMM_DECL(nf_q5_k_a8_avx2);
NF_A8_GEMM_DECL(nf_q6_k_a8_avx2);
NF_A8_GEMM_DECL(nf_q8_0_a8_avx512);
NF_A8_GEMM_DECL(nf_q4_k_a8_avx512);
NF_A8_GEMM_DECL(nf_q5_k_a8_avx512);
NF_A8_GEMM_DECL(nf_q6_k_a8_avx512);

void nf_a8_quantize_row_avx2(const float *x, uint8_t *dst, size_t n);
void nf_a8_quantize_row_avx512(const float *x, uint8_t *dst, size_t n);

#include "codec/a8.h"
/* The decode kernels' software prefetch distance, in bytes ahead of each row's current block (2 threads,
 * tg64, interleaved; perf/cpu_amx_2026-12-06.md). q8_0: 1024 (on 64 MiB matrices at 1 thread +23 %;
 * 2048 lost 20 % on the 4-layer MoE Q8_0's decode, though it won 25 % on L3-resident SmolLM2). q4_k,
 * q5_k, q6_k (144 - 210-byte blocks): 2048 (q6_k against 1024 +8 %, q4_k / q5_k against none +11 % /
 * +25 % median, AVX-512; the AVX2 kernels, which had none, +17 % Q4_K_M and +14 % Q8_0). */
#define NF_A8_PF_Q8 1024
#define NF_A8_PF_K 2048

/* Prefetches (into L2) the part of [next, next + bytes) that falls to blocks k .. k + step - 1 of nk:
 * a tile spreads the next row block's weights over its first token pass, so that their DRAM
 * latency overlaps this block's products instead of the next panel's unpack (measured: +5 % on
 * pp256, AMX, perf/cpu_amx_2026-12-06.md). Addresses past the matrix are harmless (no fault). */
static inline void nf_a8_prefetch_part(const uint8_t *next, size_t bytes, size_t k, size_t step, size_t nk)
{
    for (size_t l = bytes / 64 * k / nk; l < bytes / 64 * (k + step) / nk; l++) __builtin_prefetch(next + 64 * l, 0, 2);
}

/* A tile file's table: its tile per codec (NULL for the others). */
#define NF_A8_TILE_TABLE(name, q8_0, q4_k, q5_k, q6_k)                                                     \
    nf_a8_tile_fn name(nf_codec_id id)                                                                      \
    {                                                                                                       \
        return id == NF_CODEC_Q8_0 ? q8_0 : id == NF_CODEC_Q4_K ? q4_k : id == NF_CODEC_Q5_K ? q5_k       \
               : id == NF_CODEC_Q6_K ? q6_k : NULL;                                                         \
    }
nf_a8_tile_fn nf_a8_tile_avx2(nf_codec_id id);
nf_a8_tile_fn nf_a8_tile_avx512(nf_codec_id id);
nf_a8_tile_fn nf_a8_tile_amx(nf_codec_id id);

/* The multi-token tiles' panel (a8_panel_avx2.c): up to 16 weight rows of a codec with blocks of G
 * elements (32: q8_0, q4_k, q5_k; 16: q6_k), unpacked once into levels u and transposed "lane = row".
 * Block k's levels are G / 4 vectors of 64 bytes at lv + 16 G k, byte 4 r + i of vector j = level
 * 4 j + i of row r in the block (the VNNI "B" layout: 16 rows as columns; its 32-byte halves
 * are rows 0-7 and 8-15 for AVX2). sd[16 k + r]: the block's decoded scale, sm[16 k + r] its decoded
 * min (0 without one); rows past `rows` are zero. A block's weight is sd (u - O) - sm, with u unsigned
 * except q8_0's at q8_offset 0 (u = w, signed; at 128, u = w + 128). q6_k differs: sd[16 k + r] is
 * the 16-element sub-block's integer scale sc_k, sm[16 b + r] the super-block's d for the 32-element
 * block b (the weight is sm_b sd_k (u - 32)). transpose NULL (the AMX tile): the levels stay row-major
 * (row r at lv + r ld, ld = n + 64; its 16 rows an AMX "A" tile) and q6_k's are u - 32, signed (O = 0).
 * spare: 16 n scratch bytes the panel does not use (NULL when row-major). Filled from scratch (nf_a8_tile_scratch(n) bytes; n a
 * multiple of 64); -1 for a codec without a panel. */
typedef struct nf_a8_panel {
    const uint8_t *lv;
    const float *sd, *sm;
    uint8_t *spare;
    size_t ld; /* the row stride of a row-major panel (transpose NULL); n otherwise */
    int G, O, min;
} nf_a8_panel;
/* 16 rows x 16 dwords (rows `stride` bytes apart) -> 16 vectors of 64 bytes: dst[c] dword r = dword c of row r. */
typedef void (*nf_a8_transpose_fn)(const uint8_t *src, size_t stride, uint8_t *dst);
void nf_a8_transpose16_avx2(const uint8_t *src, size_t stride, uint8_t *dst);
void nf_a8_transpose16_avx512(const uint8_t *src, size_t stride, uint8_t *dst);
/* nf_a8_xt_fill of the 16 tokens t .. t + 15 (rows at x, ldxa apart; n a multiple of 64). */
void nf_a8_xt_fill16_avx512(const uint8_t *x, size_t ldxa, size_t n, size_t T, size_t t, uint8_t *xt);
int nf_a8_panel_fill(nf_codec_id id, int q8_offset, nf_a8_transpose_fn transpose, const uint8_t *w, size_t rb,
                     size_t rows, size_t n, void *scratch, nf_a8_panel *p);

/* The unpacked q4_k / q5_k scales: sc[8] then m[8] (six-bit each), from the 12 packed bytes (the
 * same values nf_k4_scale_min gives, four sub-blocks per 32-bit word). */
static inline void nf_k4_unpack_scales(const uint8_t *s12, uint8_t out[16])
{
    uint32_t u0, u1, u2, v[4];
    memcpy(&u0, s12, 4), memcpy(&u1, s12 + 4, 4), memcpy(&u2, s12 + 8, 4);
    v[0] = u0 & 0x3f3f3f3fu;                                          /* sc 0..3 */
    v[1] = (u2 & 0x0f0f0f0fu) | ((u0 >> 6) & 0x03030303u) << 4;       /* sc 4..7 */
    v[2] = u1 & 0x3f3f3f3fu;                                          /* m 0..3 */
    v[3] = ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 6) & 0x03030303u) << 4; /* m 4..7 */
    memcpy(out, v, 16);
}

/* The pointers of a quantised row of n elements (codec/a8.h's layout). */
#define NF_A8_D(xa, n) ((const float *)((const uint8_t *)(xa) + (n)))
#define NF_A8_BSUM(xa, n) ((const int16_t *)((const uint8_t *)(xa) + (n) + (n) / 8))
#define NF_A8_DSUM(xa, n) ((const float *)((const uint8_t *)(xa) + (n) + (n) / 4))

/* An ISA's segment product from its row kernel rows_fn(w, rb, R, xa, y, n) (R = 1 or group rows):
 * row groups of `group`, every token of the segment per group, then the remaining rows one at a
 * time (the entry points a8.h declares per ISA). */
#define NF_A8_GEMM(name, rows_fn, group)                                                                    \
    void name(const void *w, size_t rb, size_t rows, const uint8_t *xa, size_t ldxa, size_t ntok, float *y, \
              size_t ldy, size_t n)                                                                         \
    {                                                                                                       \
        const uint8_t *p = w;                                                                               \
        size_t r = 0;                                                                                       \
        for (; r + (group) <= rows; r += (group))                                                           \
            for (size_t t = 0; t < ntok; t++) rows_fn(p + r * rb, rb, (group), xa + t * ldxa, y + t * ldy + r, n); \
        for (; r < rows; r++)                                                                               \
            for (size_t t = 0; t < ntok; t++) rows_fn(p + r * rb, rb, 1, xa + t * ldxa, y + t * ldy + r, n);   \
    }

#endif
