/* Multi-token integer products (prefill) with AVX2: the AVX-512 tile's scheme on 256-bit vectors.
 * The panel (a8_simd.h) is the same 16 rows transposed "lane = row"; each 64-byte vector is read as
 * two halves, rows 0-7 and 8-15, one int32 lane per row. AVX2 has no vpdpbusd: four levels of 8 rows
 * times four broadcast activation bytes is vpmaddubsw (u8 x s8 pairs into int16), and D of those are
 * added in int16 before one vpmaddwd with ones widens them to int32, D as large as the levels allow
 * without overflow (|pair| <= 2 u_max 127): q4_k 8 (D x 3810), q5_k 4 (x 7874), q6_k 2 (x 16002),
 * q8_0 1 (|w| <= 128 with w's sign moved onto q by vpsignb: x 32512; its panel keeps w signed).
 *
 * The integer block sums are exact, and the f32 combine per lane is the AVX-512 tile's, operation for
 * operation (acc = fma(sd d, cvt(i - O bsum), acc), then - sm dsum; q6_k: its two sub-blocks' sums S0, S1
 * into f = fma(cvt(S1), sc1, cvt(S0) sc0), exact, then acc = fma(d d_t, f, acc)), so the AVX2, AVX-512 VNNI and AMX
 * tiles give the same bits (tests/codec/test_codec_a8.c checks it): prefill rounds alike on every ISA
 * with a tile. Tokens are taken four at a time; the weights are re-read from L1 for each. */
#include <immintrin.h>

#include "codec/a8.h"
#include "codec/a8_simd.h"

enum { TT = 4 }; /* tokens per pass */

/* Token x's block k (G elements, q bytes at xq) against both halves of the panel's block: exact sums. */
static inline __attribute__((always_inline)) void block_sums(const int G, const int D, const int Q8, const uint8_t *lv,
                                                             const uint8_t *xq, __m256i *i0, __m256i *i1)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i p0 = _mm256_setzero_si256(), p1 = _mm256_setzero_si256();
    for (int j = 0; j < G / 4; j++) {
        int32_t q4;
        memcpy(&q4, xq + 4 * j, 4);
        const __m256i qb = _mm256_set1_epi32(q4);
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)(lv + 64 * j));
        const __m256i w1 = _mm256_loadu_si256((const __m256i *)(lv + 64 * j + 32));
        if (Q8) {
            p0 = _mm256_maddubs_epi16(_mm256_abs_epi8(w0), _mm256_sign_epi8(qb, w0));
            p1 = _mm256_maddubs_epi16(_mm256_abs_epi8(w1), _mm256_sign_epi8(qb, w1));
        } else {
            p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(w0, qb));
            p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(w1, qb));
        }
        if ((j + 1) % D == 0) {
            *i0 = _mm256_add_epi32(*i0, _mm256_madd_epi16(p0, ones));
            *i1 = _mm256_add_epi32(*i1, _mm256_madd_epi16(p1, ones));
            p0 = p1 = _mm256_setzero_si256();
        }
    }
}

/* G: block size (32 or 16); D: maddubs results summed in int16; O: the level offset (0, 32); MIN: the
 * codec has a min term; Q8: q8_0's signed levels. */
static inline __attribute__((always_inline)) void tile(const int G, const int D, const int O, const int MIN, const int Q8,
                                                        nf_codec_id id, const uint8_t *w, size_t rb, size_t rows,
                                                        const uint8_t *xa, size_t ldxa, size_t ntok, float *y,
                                                        size_t ldy, size_t n, void *scratch)
{
    nf_a8_panel p;
    nf_a8_panel_fill(id, 0, nf_a8_transpose16_avx2, w, rb, rows, n, scratch, &p);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i keep0 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)rows), lane);
    const __m256i keep1 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)rows - 8), lane);
    for (size_t t0 = 0; t0 < ntok; t0 += TT) {
        const int nt = ntok - t0 < TT ? (int)(ntok - t0) : TT;
        __m256 acc[TT][2];
        for (int t = 0; t < TT; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
        for (size_t k = 0; k < n / 32; k++) { /* activation blocks */
            if (t0 == 0) nf_a8_prefetch_part(w + rows * rb, 16 * rb, k, 1, n / 32);
            if (G == 32) {
                const __m256 dv0 = _mm256_loadu_ps(p.sd + 16 * k), dv1 = _mm256_loadu_ps(p.sd + 16 * k + 8);
                for (int t = 0; t < nt; t++) {
                    const uint8_t *x = xa + (t0 + t) * ldxa;
                    __m256i i0 = _mm256_setzero_si256(), i1 = i0;
                    block_sums(G, D, Q8, p.lv + 16 * G * k, x + k * G, &i0, &i1);
                    const __m256 dx = _mm256_set1_ps(NF_A8_D(x, n)[k]);
                    acc[t][0] = _mm256_fmadd_ps(_mm256_mul_ps(dv0, dx), _mm256_cvtepi32_ps(i0), acc[t][0]);
                    acc[t][1] = _mm256_fmadd_ps(_mm256_mul_ps(dv1, dx), _mm256_cvtepi32_ps(i1), acc[t][1]);
                    if (MIN) {
                        const __m256 ds = _mm256_set1_ps(NF_A8_DSUM(x, n)[k]);
                        acc[t][0] = _mm256_fnmadd_ps(_mm256_loadu_ps(p.sm + 16 * k), ds, acc[t][0]);
                        acc[t][1] = _mm256_fnmadd_ps(_mm256_loadu_ps(p.sm + 16 * k + 8), ds, acc[t][1]);
                    }
                }
            } else { /* q6_k: sub-blocks 2k, 2k + 1 combined exactly, as the AVX-512 tile does */
                __m256 sc0[2], sc1[2], dv[2];
                for (int h = 0; h < 2; h++)
                    sc0[h] = _mm256_loadu_ps(p.sd + 32 * k + 8 * h), sc1[h] = _mm256_loadu_ps(p.sd + 32 * k + 16 + 8 * h),
                    dv[h] = _mm256_loadu_ps(p.sm + 16 * k + 8 * h);
                for (int t = 0; t < nt; t++) {
                    const uint8_t *x = xa + (t0 + t) * ldxa;
                    const int16_t *bs = NF_A8_BSUM(x, n);
                    __m256i s00 = _mm256_set1_epi32(-O * bs[2 * k]), s01 = s00;
                    __m256i s10 = _mm256_set1_epi32(-O * bs[2 * k + 1]), s11 = s10;
                    block_sums(G, D, Q8, p.lv + 32 * G * k, x + 32 * k, &s00, &s01);
                    block_sums(G, D, Q8, p.lv + 32 * G * k + 16 * G, x + 32 * k + 16, &s10, &s11);
                    const __m256 dx = _mm256_set1_ps(NF_A8_D(x, n)[k]);
                    for (int h = 0; h < 2; h++) {
                        const __m256 f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h ? s11 : s10), sc1[h],
                                                         _mm256_mul_ps(_mm256_cvtepi32_ps(h ? s01 : s00), sc0[h]));
                        acc[t][h] = _mm256_fmadd_ps(_mm256_mul_ps(dv[h], dx), f, acc[t][h]);
                    }
                }
            }
        }
        for (int t = 0; t < nt; t++) {
            _mm256_maskstore_ps(y + (t0 + t) * ldy, keep0, acc[t][0]);
            _mm256_maskstore_ps(y + (t0 + t) * ldy + 8, keep1, acc[t][1]);
        }
    }
}

#define TILE(name, G, D, O, MIN, Q8, id)                                                                    \
    static void name(const void *w, size_t rb, size_t rows, const uint8_t *xa, size_t ldxa, size_t ntok,   \
                     float *y, size_t ldy, size_t n, void *scratch, const nf_a8_xt *xt)                     \
    {                                                                                                       \
        (void)xt;                                                                                           \
        for (size_t r = 0; r < rows; r += 16)                                                               \
            tile(G, D, O, MIN, Q8, id, (const uint8_t *)w + r * rb, rb, rows - r < 16 ? rows - r : 16, xa,  \
                 ldxa, ntok, y + r, ldy, n, scratch);                                                       \
    }

TILE(tile_q8_0, 32, 1, 0, 0, 1, NF_CODEC_Q8_0)
TILE(tile_q4_k, 32, 8, 0, 1, 0, NF_CODEC_Q4_K)
TILE(tile_q5_k, 32, 4, 0, 1, 0, NF_CODEC_Q5_K)
TILE(tile_q6_k, 16, 2, 32, 0, 0, NF_CODEC_Q6_K)

NF_A8_TILE_TABLE(nf_a8_tile_avx2, tile_q8_0, tile_q4_k, tile_q5_k, tile_q6_k)
