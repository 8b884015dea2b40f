/* Multi-token integer products (prefill) on AMX tiles. The weights are the AVX-512 tile's panel
 * (a8_simd.h: 16 rows unpacked to unsigned levels and transposed, which is AMX's "B" layout); the
 * activations of 16 tokens are an "A" tile read straight from their quantised rows (G bytes a row,
 * rows ldxa apart). One TDPBSUD (signed activations x unsigned levels) gives the exact integer sums
 * of one block for 16 tokens x 16 rows; C row m is token m's 16 rows, the vector the AVX-512 tile
 * forms with G / 4 vpdpbusd. Its f32 combine is the AVX-512 tile's, operation for operation:
 *     i = C[m] - O bsum_mk;  acc_m = fma(sd_k * d_mk, cvt(i), acc_m);  acc_m -= sm_k * dsum_mk (q4_k / q5_k)
 * so the two tiles' results are bit-identical (tests/codec/test_codec_a8.c checks it), and decode,
 * prefill and batched runs round the same way on AMX and AVX-512 machines.
 *
 * Blocks are G = 32 (q8_0, q4_k, q5_k) or 16 (q6_k) elements, because the activations have one scale
 * per 32 and q6_k's weights one per 16: a TDPBSUD is K = G deep, not the 64 it could be, and the
 * combine (16 rows of vector work per block) costs more than the tile product. Two C tiles alternate
 * so one block's product runs while the other's is combined. */
#include <immintrin.h>

#include "codec/a8.h"
#include "codec/a8_simd.h"

/* The LDTILECFG operand (64 bytes, palette 1). */
typedef struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* tmm0, tmm1: C (16 x 16 int32); tmm2, tmm3: A (16 tokens x G bytes); tmm4, tmm5: B (G / 4 x 64).
 * Constant objects, not filled on the stack: GCC 12 drops stores to a local configuration before
 * _tile_loadconfig as dead at -O2 (the tiles then stay unconfigured and the first TILEZERO faults). */
#define TILE_CONFIG(G) {.palette = 1, .colsb = {64, 64, G, G, 64, 64}, .rows = {16, 16, 16, 16, G / 4, G / 4}}
static const tile_config config32 __attribute__((aligned(64))) = TILE_CONFIG(32);
static const tile_config config16 __attribute__((aligned(64))) = TILE_CONFIG(16);

/* Block k's C (cb: 16 x 16 int32) into the 16 tokens' accumulators (x[m]: token m's quantised row). */
static inline __attribute__((always_inline)) void combine(const int G, const int O, const int MIN, const int32_t *cb,
                                                          const nf_a8_panel *p, size_t k, const uint8_t *const *x,
                                                          size_t n, __m512 *acc)
{
    const __m512 dv = _mm512_loadu_ps(p->sd + 16 * k);
    const __m512 mv = MIN ? _mm512_loadu_ps(p->sm + 16 * k) : _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int m = 0; m < 16; m++) {
        __m512i i = _mm512_load_si512(cb + 16 * m);
        if (O) {
            const int16_t *bs = NF_A8_BSUM(x[m], n);
            i = _mm512_add_epi32(_mm512_set1_epi32(-O * (G == 32 ? bs[2 * k] + bs[2 * k + 1] : bs[k])), i);
        }
        const __m512 s = _mm512_mul_ps(dv, _mm512_set1_ps(NF_A8_D(x[m], n)[G == 32 ? k : k / 2]));
        acc[m] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(i), acc[m]);
        if (MIN) acc[m] = _mm512_fnmadd_ps(mv, _mm512_set1_ps(NF_A8_DSUM(x[m], n)[k]), acc[m]);
    }
}

/* Block k's product into C tile c from A tile ta and B tile tb (literal tile numbers: the intrinsics
 * paste them into the instruction text). */
#define AMX_PRODUCT(c, ta, tb, k)                                                                           \
    do {                                                                                                    \
        _tile_zero(c);                                                                                      \
        _tile_loadd(ta, a + (k) * G, lda);                                                                  \
        _tile_loadd(tb, p->lv + 16 * G * (k), 64);                                                          \
        _tile_dpbsud(c, ta, tb);                                                                            \
    } while (0)

/* One panel x every token, 16 tokens at a time. A group of fewer than 16 runs as 16, its missing
 * tokens' q whatever the spare rows hold and their scales borrowed from its last token, and stores
 * only its own rows. The
 * product of block k + 1 is issued before block k is combined, so the tile unit and the vector
 * units overlap. */
static inline __attribute__((always_inline)) void panel_tokens(const int G, const int O, const int MIN,
                                                               const nf_a8_panel *p, size_t rows, const uint8_t *xa,
                                                               size_t ldxa, size_t ntok, float *y, size_t ldy, size_t n,
                                                               const uint8_t *next, size_t next_bytes)
{
    const size_t nk = n / G; /* even: n is a multiple of 64 */
    const __mmask16 keep = (__mmask16)((1u << rows) - 1);
    int32_t cb[2][256] __attribute__((aligned(64)));
    for (size_t t0 = 0; t0 < ntok; t0 += 16) {
        const size_t nt = ntok - t0 < 16 ? ntok - t0 : 16;
        const uint8_t *x[16], *a = xa + t0 * ldxa;
        size_t lda = ldxa;
        for (size_t m = 0; m < 16; m++) x[m] = a + (m < nt ? m : nt - 1) * ldxa;
        if (nt < 16) { /* the last group: its q bytes into the spare rows (rows past nt keep the
                          * panel's bytes: their C rows are combined but never stored) */
            for (size_t m = 0; m < nt; m++) memcpy(p->spare + m * n, x[m], n);
            a = p->spare, lda = n;
        }
        __m512 acc[16];
        for (int m = 0; m < 16; m++) acc[m] = _mm512_setzero_ps();
        AMX_PRODUCT(0, 2, 4, 0);
        for (size_t k = 0; k < nk; k += 2) {
            if (t0 == 0) nf_a8_prefetch_part(next, next_bytes, k, 2, nk);
            AMX_PRODUCT(1, 3, 5, k + 1);
            _tile_stored(0, cb[0], 64);
            if (k + 2 < nk) AMX_PRODUCT(0, 2, 4, k + 2);
            combine(G, O, MIN, cb[0], p, k, x, n, acc);
            _tile_stored(1, cb[1], 64);
            combine(G, O, MIN, cb[1], p, k + 1, x, n, acc);
        }
        for (size_t m = 0; m < nt; m++) _mm512_mask_storeu_ps(y + (t0 + m) * ldy, keep, acc[m]);
    }
}

#define AMX_TILE(name, id, G, O, MIN)                                                                      \
    static void name(const void *w, size_t rb, size_t rows, const uint8_t *xa, size_t ldxa, size_t ntok,   \
                     float *y, size_t ldy, size_t n, void *scratch)                                         \
    {                                                                                                       \
        _tile_loadconfig(G == 32 ? &config32 : &config16);                                                   \
        for (size_t r = 0; r < rows; r += 16) {                                                             \
            const size_t nr = rows - r < 16 ? rows - r : 16;                                                \
            nf_a8_panel p;                                                                                  \
            nf_a8_panel_fill(id, 128, nf_a8_transpose16_avx512, (const uint8_t *)w + r * rb, rb, nr, n, scratch, &p);                      \
            panel_tokens(G, O, MIN, &p, nr, xa, ldxa, ntok, y + r, ldy, n, (const uint8_t *)w + (r + nr) * rb,   \
                         16 * rb);                                                                          \
        }                                                                                                   \
        _tile_release();                                                                                    \
    }

AMX_TILE(amx_q8_0, NF_CODEC_Q8_0, 32, 128, 0)
AMX_TILE(amx_q4_k, NF_CODEC_Q4_K, 32, 0, 1)
AMX_TILE(amx_q5_k, NF_CODEC_Q5_K, 32, 0, 1)
AMX_TILE(amx_q6_k, NF_CODEC_Q6_K, 16, 32, 0)

NF_A8_TILE_TABLE(nf_a8_tile_amx, amx_q8_0, amx_q4_k, amx_q5_k, amx_q6_k)
