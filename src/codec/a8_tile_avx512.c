/* Multi-token integer products (prefill) with AVX-512 VNNI, rows repacked "lane = row": a block of
 * up to 16 weight rows is unpacked once into unsigned levels and transposed so that one 512-bit
 * vector holds four consecutive levels of each of the 16 rows (lane r = row r). One vpdpbusd against
 * four activation bytes broadcast to every lane then advances all 16 rows' sums, and the f32 combine
 * of a block (G = 32 elements: q8_0, q4_k, q5_k; 16: q6_k) is one vector for 16 rows instead of
 * one per row: per token and block, G/4 vpdpbusd, one conversion and two or three FMAs for 16 rows.
 * Tokens are taken four at a time so each weight vector feeds four dot products.
 *
 * Per block k of G elements, row r and token t (x~ = d_t q_t, the quantised activations):
 *     y[t][r] += (s_kr d_tk) (sum_i u_ri q_ti - o bsum_tk) - m_kr (d_tk bsum_tk)
 * (q6_k: its two sub-blocks per activation block combined first, exactly, see tile() below)
 * u the unsigned level (q4_k / q5_k: q; q6_k: q, o = 32; q8_0: w + 128, o = 128), s the block's
 * decoded scale (d1 = d*sc of q4_k / q5_k / q6_k, d of q8_0), m the decoded min of q4_k / q5_k (0
 * otherwise). The integer part is exact (the accumulator starts at -o bsum), so the result is the
 * same dot as the per-token kernels' up to f32 rounding (tests/codec/test_codec_a8.c holds both to
 * one bound). */
#include <immintrin.h>

#include "codec/a8.h"
#include "codec/a8_simd.h"
#include "codec/ggml_blocks.h"

enum { TT = 4 }; /* tokens per pass */

/* nf_a8_transpose_fn with zmm registers: one 16 x 16 dword transpose. */
void nf_a8_transpose16_avx512(const uint8_t *src, size_t stride, uint8_t *dst)
{
    __m512i r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(src + i * stride);
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int q = 0; q < 4; q++) { /* r[4q + c]: lane L = column 4L + c of rows 4q .. 4q + 3 */
        r[4 * q + 0] = _mm512_unpacklo_epi64(t[4 * q], t[4 * q + 2]);
        r[4 * q + 1] = _mm512_unpackhi_epi64(t[4 * q], t[4 * q + 2]);
        r[4 * q + 2] = _mm512_unpacklo_epi64(t[4 * q + 1], t[4 * q + 3]);
        r[4 * q + 3] = _mm512_unpackhi_epi64(t[4 * q + 1], t[4 * q + 3]);
    }
    for (int c = 0; c < 4; c++) { /* a 4 x 4 transpose of 128-bit lanes */
        const __m512i w0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44), w1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xEE);
        const __m512i w2 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44), w3 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xEE);
        _mm512_storeu_si512(dst + 64 * (0 + c), _mm512_shuffle_i32x4(w0, w2, 0x88));
        _mm512_storeu_si512(dst + 64 * (4 + c), _mm512_shuffle_i32x4(w0, w2, 0xDD));
        _mm512_storeu_si512(dst + 64 * (8 + c), _mm512_shuffle_i32x4(w1, w3, 0x88));
        _mm512_storeu_si512(dst + 64 * (12 + c), _mm512_shuffle_i32x4(w1, w3, 0xDD));
    }
}

/* 4 vpdpbusd: the exact sum of a 16-element sub-block (levels wv[0..3], q at xq) onto i. */
static inline __attribute__((always_inline)) __m512i dot16(__m512i i, const __m512i *wv, const uint8_t *xq)
{
    for (int j = 0; j < 4; j++) {
        int32_t q4;
        memcpy(&q4, xq + 4 * j, 4);
        i = _mm512_dpbusd_epi32(i, wv[j], _mm512_set1_epi32(q4));
    }
    return i;
}

void nf_a8_xt_fill16_avx512(const uint8_t *x, size_t ldxa, size_t n, size_t T, size_t t, uint8_t *xt)
{
    uint8_t tr[1024] __attribute__((aligned(64)));
    for (size_t c = 0; c < n / 64; c++) { /* dwords 16 c .. 16 c + 15 of the 16 tokens */
        nf_a8_transpose16_avx512(x + 64 * c, ldxa, tr);
        for (size_t j = 0; j < 16; j++)
            _mm512_storeu_si512(xt + 4 * ((16 * c + j) * T + t), _mm512_load_si512(tr + 64 * j));
    }
    float *d = (float *)(xt + n * T), *ds = d + n / 32 * T;
    for (size_t m = 0; m < 16; m++)
        for (size_t b = 0; b < n / 32; b++)
            d[b * T + t + m] = NF_A8_D(x + m * ldxa, n)[b], ds[b * T + t + m] = NF_A8_DSUM(x + m * ldxa, n)[b];
}

/* G: block size (32 or 16); O: the level offset (0, 32, 128); MIN: the codec has a min term. q6_k
 * (G = 16) takes its two sub-blocks of an activation block together: S0, S1 their exact sums of
 * (u - 32) q, f = fma(cvt(S1), sc1, cvt(S0) sc0) (exact: |f| < 2^24), acc = fma(d d_t, f, acc). */
static inline __attribute__((always_inline)) void tile(const int G, const int O, const int MIN, nf_codec_id id,
                                                        const uint8_t *w, size_t rb, size_t rows, const uint8_t *xa,
                                                        size_t ldxa, size_t ntok, float *y, size_t ldy, size_t n,
                                                        void *scratch)
{
    const size_t nb = n / 32; /* activation blocks */
    nf_a8_panel p;
    nf_a8_panel_fill(id, 128, nf_a8_transpose16_avx512, w, rb, rows, n, scratch, &p);
    const uint8_t *lv = p.lv;
    const float *sd = p.sd, *sm = p.sm;
    const __mmask16 keep = (__mmask16)((1u << rows) - 1);
    for (size_t t0 = 0; t0 < ntok; t0 += TT) {
        const int nt = ntok - t0 < TT ? (int)(ntok - t0) : TT;
        __m512 acc[TT];
        for (int t = 0; t < TT; t++) acc[t] = _mm512_setzero_ps();
        for (size_t k = 0; k < nb; k++) {
            if (t0 == 0) nf_a8_prefetch_part(w + rows * rb, 16 * rb, k, 1, nb);
            __m512i wv[8];
            for (int j = 0; j < 8; j++) wv[j] = _mm512_loadu_si512(lv + 512 * k + 64 * j);
            if (G == 32) {
                const __m512 dv = _mm512_loadu_ps(sd + 16 * k);
                const __m512 mv = MIN ? _mm512_loadu_ps(sm + 16 * k) : _mm512_setzero_ps();
                for (int t = 0; t < nt; t++) {
                    const uint8_t *x = xa + (t0 + t) * ldxa, *xq = x + k * 32;
                    const int16_t *bs = NF_A8_BSUM(x, n);
                    __m512i i = O ? _mm512_set1_epi32(-O * (bs[2 * k] + bs[2 * k + 1])) : _mm512_setzero_si512();
                    i = dot16(dot16(i, wv, xq), wv + 4, xq + 16);
                    const __m512 s = _mm512_mul_ps(dv, _mm512_set1_ps(NF_A8_D(x, n)[k]));
                    acc[t] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(i), acc[t]);
                    if (MIN) acc[t] = _mm512_fnmadd_ps(mv, _mm512_set1_ps(NF_A8_DSUM(x, n)[k]), acc[t]);
                }
            } else {
                const __m512 sc0 = _mm512_loadu_ps(sd + 32 * k), sc1 = _mm512_loadu_ps(sd + 32 * k + 16);
                const __m512 dv = _mm512_loadu_ps(sm + 16 * k);
                for (int t = 0; t < nt; t++) {
                    const uint8_t *x = xa + (t0 + t) * ldxa, *xq = x + k * 32;
                    const int16_t *bs = NF_A8_BSUM(x, n);
                    const __m512i s0 = dot16(_mm512_set1_epi32(-O * bs[2 * k]), wv, xq);
                    const __m512i s1 = dot16(_mm512_set1_epi32(-O * bs[2 * k + 1]), wv + 4, xq + 16);
                    const __m512 f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), sc1, _mm512_mul_ps(_mm512_cvtepi32_ps(s0), sc0));
                    acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dv, _mm512_set1_ps(NF_A8_D(x, n)[k])), f, acc[t]);
                }
            }
        }
        for (int t = 0; t < nt; t++) _mm512_mask_storeu_ps(y + (t0 + t) * ldy, keep, acc[t]);
    }
}

#define TILE(name, G, O, MIN, id)                                                                       \
    static void name(const void *w, size_t rb, size_t rows, const uint8_t *xa, size_t ldxa, size_t ntok,   \
                     float *y, size_t ldy, size_t n, void *scratch, const nf_a8_xt *xt)                     \
    {                                                                                                       \
        (void)xt;                                                                                           \
        for (size_t r = 0; r < rows; r += 16)                                                               \
            tile(G, O, MIN, id, (const uint8_t *)w + r * rb, rb, rows - r < 16 ? rows - r : 16, xa, ldxa, \
                 ntok, y + r, ldy, n, scratch);                                                             \
    }

TILE(tile_q8_0, 32, 128, 0, NF_CODEC_Q8_0)
TILE(tile_q4_k, 32, 0, 1, NF_CODEC_Q4_K)
TILE(tile_q5_k, 32, 0, 1, NF_CODEC_Q5_K)
TILE(tile_q6_k, 16, 32, 0, NF_CODEC_Q6_K)

NF_A8_TILE_TABLE(nf_a8_tile_avx512, tile_q8_0, tile_q4_k, tile_q5_k, tile_q6_k)
