/* Multi-token integer products (prefill) on AMX tiles, weights as the "A" operand. The panel
 * (a8_simd.h) unpacks up to 16 weight rows into levels and leaves them row-major: 16 rows x K
 * bytes of it is an A tile as it stands, no transpose. The activations are the "B" operand: the
 * caller regrouped them once per product batch "token = column" (a8.h, nf_a8_xt), so that K / 4
 * rows of 64 bytes at any first token are a B tile of 16 tokens. One TDPB* per 32-element block gives
 * the exact integer sums of 16 rows x 16 tokens (C row r = weight row r over the 16 tokens):
 *     q8_0: TDPBSSD (w signed);  q4_k / q5_k: TDPBUSD (level u unsigned);
 *     q6_k: two TDPBSSD, K = 16 each, on u - 32 (signed), one per sub-block.
 * C is stored and combined in f32, lane = token, the per-row scale broadcast and the per-token
 * scale a vector (nf_a8_xt's d and dsum planes):
 *     q8_0, q4_k, q5_k:  acc_r = fma(sd_r d_t, cvt(C_r), acc_r);  acc_r -= sm_r dsum_t (q4_k / q5_k)
 *     q6_k:  f = fma(cvt(C1_r), sc1_r, cvt(C0_r) sc0_r) (exact: |f| < 2^24);  acc_r = fma(d_r d_t, f, acc_r)
 * which per (row, token) are the AVX-512 VNNI and AVX2 tiles' operations on the same exact integers
 * (their lane = row; products commute), so the three tiles give the same bits (tests/codec/
 * test_codec_a8.c checks it). The 16 x 16 accumulators are transposed once per 16-token group for
 * the store.
 *
 * The activation block (32 elements, one scale per token) bounds K: a TDPB* is 32 deep (q6_k: 16,
 * its weights' scale step, but its two sub-blocks are combined in one f32 step). The blocks run in
 * phases (PHASE below): every product of a phase and the stores of its C tiles, then their combines. */
#include <immintrin.h>

#include "codec/a8.h"
#include "codec/a8_simd.h"

/* The LDTILECFG operand (64 bytes, palette 1). */
typedef struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* K = 32: tmm0, tmm1 C (16 x 16 int32); tmm2, tmm3 A (16 rows x 32 bytes); tmm4, tmm5 B (8 x 64).
 * q6_k: tmm0 - tmm3 C; tmm4, tmm5 A (16 x 16 bytes); tmm6, tmm7 B (4 x 64).
 * Constant objects, not filled on the stack: GCC 12 drops stores to a local configuration before
 * _tile_loadconfig as dead at -O2 (the tiles then stay unconfigured and the first TILEZERO faults). */
static const tile_config config32 __attribute__((aligned(64))) = {
    .palette = 1, .colsb = {64, 64, 32, 32, 64, 64}, .rows = {16, 16, 16, 16, 8, 8}};
static const tile_config config16 __attribute__((aligned(64))) = {
    .palette = 1, .colsb = {64, 64, 64, 64, 16, 16, 64, 64}, .rows = {16, 16, 16, 16, 16, 16, 4, 4}};

/* Block b's C (cb: 16 rows x 16 tokens int32) into the accumulators: q8_0, q4_k, q5_k. */
static inline __attribute__((always_inline)) void combine32(const int MIN, const int32_t *cb, const nf_a8_panel *p,
                                                            size_t b, const float *d, const float *ds, __m512 *acc)
{
    const __m512 dt = _mm512_loadu_ps(d);
    const __m512 st = MIN ? _mm512_loadu_ps(ds) : _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) {
        const __m512 s = _mm512_mul_ps(_mm512_set1_ps(p->sd[16 * b + r]), dt);
        acc[r] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(_mm512_load_si512(cb + 16 * r)), acc[r]);
        if (MIN) acc[r] = _mm512_fnmadd_ps(_mm512_set1_ps(p->sm[16 * b + r]), st, acc[r]);
    }
}

/* q6_k's block b from its two sub-blocks' C (c0, c1). */
static inline __attribute__((always_inline)) void combine16(const int32_t *c0, const int32_t *c1, const nf_a8_panel *p,
                                                            size_t b, const float *d, __m512 *acc)
{
    const __m512 dt = _mm512_loadu_ps(d);
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) {
        const __m512 f0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c0 + 16 * r)), _mm512_set1_ps(p->sd[32 * b + r]));
        const __m512 f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c1 + 16 * r)),
                                         _mm512_set1_ps(p->sd[32 * b + 16 + r]), f0);
        acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(p->sm[16 * b + r]), dt), f, acc[r]);
    }
}

/* Block b's product into C tile c (literal tile numbers: the intrinsics paste them into the text). */
#define PRODUCT32(c, ta, tb, b)                                                                             \
    do {                                                                                                    \
        _tile_zero(c);                                                                                      \
        _tile_loadd(ta, p->lv + 32 * (b), p->ld);                                                               \
        _tile_loadd(tb, xq + 8 * (b) * ldb, ldb);                                                           \
        if (Q8) _tile_dpbssd(c, ta, tb);                                                                    \
        else _tile_dpbusd(c, ta, tb);                                                                       \
    } while (0)
#define PRODUCT16(c0, c1, b)                                                                                \
    do {                                                                                                    \
        _tile_zero(c0);                                                                                     \
        _tile_zero(c1);                                                                                     \
        _tile_loadd(4, p->lv + 32 * (b), p->ld);                                                                \
        _tile_loadd(6, xq + 8 * (b) * ldb, ldb);                                                            \
        _tile_dpbssd(c0, 4, 6);                                                                             \
        _tile_loadd(5, p->lv + 32 * (b) + 16, p->ld);                                                           \
        _tile_loadd(7, xq + (8 * (b) + 4) * ldb, ldb);                                                      \
        _tile_dpbssd(c1, 5, 7);                                                                             \
    } while (0)

/* q6_k's activation blocks per phase: a phase issues all its blocks' products (two K = 16 each) and
 * stores their C tiles (16 KB, in L1), then combines them. Interleaving each block's combine with the
 * next blocks' tile instructions cost more than running the two apart: the tile stores and the
 * combine's loads of them slowed each other (per 16 rows x 2048 x 12 - 32 tokens, 1 thread: token
 * groups 3 - 15 % faster at 8; 16 lost, its C then leaving L1; docs/perf/cpu_2026-12-07b.md). The
 * codecs of one product per block keep the interleaved loop: phases cost SmolLM2's q8_0 prefill ~10 %. */
enum { PHASE = 8 };

/* q6_k's blocks b0 .. b0 + PHASE - 1 of a 16-token group: their products into cb (block b0 + j's
 * sub-blocks at cb[2 j], cb[2 j + 1]; the two C pairs alternate, one block's products issued before
 * the other's stores), then their combines. pf: the next row block's bytes to prefetch, two blocks'
 * share at a time (in bursts of a phase's share pp256 lost ~5 %), or NULL. */
static inline __attribute__((always_inline)) void phase16(const nf_a8_panel *p, const uint8_t *xq, size_t ldb,
                                                          size_t b0, const float *d, size_t T,
                                                          int32_t (*cb)[256], __m512 *acc, const uint8_t *pf,
                                                          size_t pf_bytes, size_t nb)
{
    PRODUCT16(0, 1, b0);
    for (size_t j = 0; j < PHASE; j += 2) {
        if (pf) nf_a8_prefetch_part(pf, pf_bytes, b0 + j, 2, nb);
        PRODUCT16(2, 3, b0 + j + 1);
        _tile_stored(0, cb[2 * j], 64);
        _tile_stored(1, cb[2 * j + 1], 64);
        if (j + 2 < PHASE) PRODUCT16(0, 1, b0 + j + 2);
        _tile_stored(2, cb[2 * j + 2], 64);
        _tile_stored(3, cb[2 * j + 3], 64);
    }
    for (size_t j = 0; j < PHASE; j++) combine16(cb[2 * j], cb[2 * j + 1], p, b0 + j, d + (b0 + j) * T, acc);
}

/* q8_0, q4_k, q5_k: all nb blocks, products two blocks ahead in two C tiles; each block's C stored one
 * step before it is combined, so that the vector loads of a stored tile do not wait on its store. */
static inline __attribute__((always_inline)) void blocks32(const int Q8, const int MIN, const nf_a8_panel *p,
                                                           const uint8_t *xq, size_t ldb, size_t nb, const float *d,
                                                           const float *ds, size_t T, int32_t (*cb)[256], __m512 *acc,
                                                           const uint8_t *pf, size_t pf_bytes)
{
    PRODUCT32(0, 2, 4, 0);
    PRODUCT32(1, 3, 5, 1);
    for (size_t b = 0; b < nb; b += 2) {
        if (pf) nf_a8_prefetch_part(pf, pf_bytes, b, 2, nb);
        _tile_stored(0, cb[0], 64);
        if (b + 2 < nb) PRODUCT32(0, 2, 4, b + 2);
        if (b) combine32(MIN, cb[1], p, b - 1, d + (b - 1) * T, ds + (b - 1) * T, acc);
        _tile_stored(1, cb[1], 64);
        if (b + 3 < nb) PRODUCT32(1, 3, 5, b + 3);
        combine32(MIN, cb[0], p, b, d + b * T, ds + b * T, acc);
    }
    combine32(MIN, cb[1], p, nb - 1, d + (nb - 1) * T, ds + (nb - 1) * T, acc);
}

/* One panel x every token, 16 tokens at a time (a last group of fewer runs as 16: its extra lanes
 * read the next tokens' bytes or xt's zero tail and are never stored). */
static inline __attribute__((always_inline)) void panel_tokens(const int Q6, const int Q8, const int MIN,
                                                               const nf_a8_panel *p, size_t rows, const nf_a8_xt *xt,
                                                               size_t ntok, float *y, size_t ldy, size_t n,
                                                               const uint8_t *next, size_t next_bytes)
{
    const size_t nb = n / 32, T = xt->T, ldb = 4 * T; /* nb even: n is a multiple of 64 */
    const float *dplane = (const float *)(xt->base + n * T), *dsplane = dplane + nb * T;
    const __mmask16 keep = (__mmask16)((1u << rows) - 1);
    int32_t cb[2 * PHASE][256] __attribute__((aligned(64)));
    for (size_t g = 0; g < ntok; g += 16) {
        const size_t nt = ntok - g < 16 ? ntok - g : 16, t = xt->t0 + g;
        const uint8_t *xq = xt->base + 4 * t;
        const float *d = dplane + t, *ds = dsplane + t;
        const uint8_t *pf = g == 0 ? next : NULL; /* the first group prefetches the next row block */
        __m512 acc[16];
        for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
        if (Q6) /* n a multiple of 256 (the super-block): whole phases */
            for (size_t b0 = 0; b0 < nb; b0 += PHASE) phase16(p, xq, ldb, b0, d, T, cb, acc, pf, next_bytes, nb);
        else
            blocks32(Q8, MIN, p, xq, ldb, nb, d, ds, T, cb, acc, pf, next_bytes);
        /* (acc copied out first: its address taken, GCC would keep the accumulators in memory) */
        float ac[256] __attribute__((aligned(64))), tr[256] __attribute__((aligned(64)));
        for (int r = 0; r < 16; r++) _mm512_store_ps(ac + 16 * r, acc[r]);
        nf_a8_transpose16_avx512((const uint8_t *)ac, 64, (uint8_t *)tr); /* tr[16 t + r] */
        for (size_t m = 0; m < nt; m++) _mm512_mask_storeu_ps(y + (g + m) * ldy, keep, _mm512_load_ps(tr + 16 * m));
    }
}

/* Below these token counts a segment runs the AVX-512 VNNI tile (the same bits): it works per token where
 * AMX computes and combines 16 token lanes, and its panel is transposed once. Measured per 16 rows x
 * 2048 columns, L2-resident, 1 thread (docs/perf/cpu_2026-12-06d.md): q4_k / q5_k / q8_0 AMX ahead from
 * 5 tokens (at 8: 6.4 - 7.7 us against 8.4 - 10.0), q6_k (two K = 16 products per block) only from 10. */
#define AMX_MIN_TOK(Q6) ((Q6) ? 10 : 5)

#define AMX_TILE(name, id, Q6, Q8, MIN)                                                                    \
    static void name(const void *w, size_t rb, size_t rows, const uint8_t *xa, size_t ldxa, size_t ntok,   \
                     float *y, size_t ldy, size_t n, void *scratch, const nf_a8_xt *xt)                     \
    {                                                                                                       \
        if (!xt || ntok < AMX_MIN_TOK(Q6)) { /* the AVX-512 VNNI tile (the same bits) */                  \
            nf_a8_tile_avx512(id)(w, rb, rows, xa, ldxa, ntok, y, ldy, n, scratch, NULL);                   \
            return;                                                                                         \
        }                                                                                                   \
        _tile_loadconfig(Q6 ? &config16 : &config32);                                                       \
        for (size_t r = 0; r < rows; r += 16) {                                                             \
            const size_t nr = rows - r < 16 ? rows - r : 16;                                                \
            nf_a8_panel p;                                                                                  \
            nf_a8_panel_fill(id, 0, NULL, (const uint8_t *)w + r * rb, rb, nr, n, scratch, &p);             \
            panel_tokens(Q6, Q8, MIN, &p, nr, xt, ntok, y + r, ldy, n, (const uint8_t *)w + (r + nr) * rb,  \
                         16 * rb);                                                                          \
        }                                                                                                   \
        _tile_release();                                                                                    \
    }

AMX_TILE(amx_q8_0, NF_CODEC_Q8_0, 0, 1, 0)
AMX_TILE(amx_q4_k, NF_CODEC_Q4_K, 0, 0, 1)
AMX_TILE(amx_q5_k, NF_CODEC_Q5_K, 0, 0, 1)
AMX_TILE(amx_q6_k, NF_CODEC_Q6_K, 1, 0, 0)

NF_A8_TILE_TABLE(nf_a8_tile_amx, amx_q8_0, amx_q4_k, amx_q5_k, amx_q6_k)
