/* The multi-token tiles' panel (a8_simd.h, nf_a8_panel), shared by the AVX2, AVX-512 VNNI and AMX
 * tiles: up to 16 weight rows unpacked once into levels (AVX2) and transposed "lane = row" by the
 * caller's 16 x 16 dword transpose (zmm or ymm). */
#include <immintrin.h>

#include "codec/a8.h"
#include "codec/a8_simd.h"
#include "codec/avx2_util.h"
#include "codec/ggml_blocks.h"

/* nf_a8_transpose_fn with ymm registers: four 8 x 8 dword transposes (rows 0-7 into bytes 0-31 of each
 * 64-byte output vector, rows 8-15 into bytes 32-63). */
void nf_a8_transpose16_avx2(const uint8_t *src, size_t stride, uint8_t *dst)
{
    for (int h = 0; h < 2; h++)     /* rows 8 h .. 8 h + 7 */
        for (int q = 0; q < 2; q++) { /* dwords 8 q .. 8 q + 7 */
            __m256i r[8], t[8];
            for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_si256((const __m256i *)(src + (8 * h + i) * stride + 32 * q));
            for (int i = 0; i < 4; i++) {
                t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
            }
            for (int i = 0; i < 2; i++) { /* r[4i + c]: 128-bit lane L = dword 4L + c of rows 4i .. 4i + 3 */
                r[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
                r[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
                r[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
                r[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
            }
            for (int c = 0; c < 4; c++) {
                _mm256_storeu_si256((__m256i *)(dst + 64 * (8 * q + c) + 32 * h), _mm256_permute2x128_si256(r[c], r[4 + c], 0x20));
                _mm256_storeu_si256((__m256i *)(dst + 64 * (8 * q + 4 + c) + 32 * h), _mm256_permute2x128_si256(r[c], r[4 + c], 0x31));
            }
        }
}

/* ---- per-codec unpack of one row: levels lv[n] (u8) and the row's scales, row-major in rs ----
 * The panel wants the scales "lane = row" (sd[16 k + r]); written from one row they are 16 floats
 * apart, one scalar store each, which was half of a q6_k panel fill (perf annotate of the fill alone,
 * docs/perf/cpu_2026-12-07b.md). So each row writes its scales contiguously (vector stores) and the
 * panel turns every 16 of them over the 16 rows with one 16 x 16 dword transpose (scales_lane_row). */

/* q8_0's level: w + o (o = 128: unsigned, for vpdpbusd / TDPBSUD; o = 0: w itself, for vpsignb).
 * rs[k]: the block's d. */
static void unpack_q8_0(int o, const uint8_t *b, size_t n, uint8_t *lv, float *rs)
{
    const __m256i flip = _mm256_set1_epi8((char)o);
    for (size_t k = 0; k < n / 32; k++, b += NF_Q8_0_BYTES) {
        _mm256_storeu_si256((__m256i *)(lv + 32 * k), _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + 2)), flip));
        rs[k] = nf_f16_at(b);
    }
}

/* 8 bytes of u -> 8 floats f * u (u exact in f32; one rounding, as f * u in scalar code). */
static inline __m256 scaled8(const uint8_t *u, float f)
{
    return _mm256_mul_ps(_mm256_set1_ps(f), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)u))));
}

/* rs[16 ib + j]: sub-block j's d * sc_j (j < 8), rs[16 ib + 8 + j]: its dmin * m_j. */
static void unpack_k45(int q5, const uint8_t *b, size_t n, uint8_t *lv, float *rs)
{
    const size_t bb = q5 ? NF_Q5_K_BYTES : NF_Q4_K_BYTES;
    for (size_t ib = 0; ib < n / NF_QK_K; ib++, b += bb) {
        uint8_t s[16];
        nf_k4_unpack_scales(b + 4, s);
        _mm256_storeu_ps(rs + 16 * ib, scaled8(s, nf_f16_at(b)));
        _mm256_storeu_ps(rs + 16 * ib + 8, scaled8(s + 8, nf_f16_at(b + 2)));
        const uint8_t *qs = b + (q5 ? 48 : 16);
        __m256i hb = q5 ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {
            __m256i lo, hi;
            nf_k45_levels(q5, qs, p, &hb, &lo, &hi);
            _mm256_storeu_si256((__m256i *)(lv + 256 * ib + 64 * p), lo);
            _mm256_storeu_si256((__m256i *)(lv + 256 * ib + 64 * p + 32), hi);
        }
    }
}

/* q6_k: the level u (o = 0) or u - 32 (o = 32, signed); rs[16 ib + k]: sub-block k's scale sc (an
 * integer), rd[ib]: the super-block's d. */
static void unpack_q6_k(int o, const uint8_t *b, size_t n, uint8_t *lv, float *rs, float *rd)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30), off = _mm256_set1_epi8((char)o);
    for (size_t ib = 0; ib < n / NF_QK_K; ib++, b += NF_Q6_K_BYTES) {
        rd[ib] = nf_f16_at(b + 208);
        for (int h = 0; h < 2; h++) /* 16 int8 scales, 8 at a time */
            _mm256_storeu_ps(rs + 16 * ib + 8 * h,
                             _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 192 + 8 * h)))));
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
            const __m256i a = _mm256_loadu_si256((const __m256i *)ql), c = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
            uint8_t *l = lv + 256 * ib + 128 * h;
            _mm256_storeu_si256((__m256i *)l, _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(a, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30)), off));
            _mm256_storeu_si256((__m256i *)(l + 32), _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(c, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30)), off));
            _mm256_storeu_si256((__m256i *)(l + 64), _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4), _mm256_and_si256(hb, m30)), off));
            _mm256_storeu_si256((__m256i *)(l + 96), _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), m4), _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30)), off));
        }
    }
}

static void unpack(nf_codec_id id, int q8_offset, int q6_signed, const uint8_t *b, size_t n, uint8_t *lv, float *rs,
                   float *rd)
{
    if (id == NF_CODEC_Q8_0) unpack_q8_0(q8_offset, b, n, lv, rs);
    else if (id == NF_CODEC_Q6_K) unpack_q6_k(q6_signed ? 32 : 0, b, n, lv, rs, rd);
    else unpack_k45(id == NF_CODEC_Q5_K, b, n, lv, rs);
}

/* Columns 0 .. m - 1 of the 16 rows of rs (ls floats apart) "lane = row": dst[16 c + r] = rs[r ls + c],
 * 16 columns per transpose, the last m % 16 one by one. */
static void scales_lane_row(const float *rs, size_t ls, size_t m, float *dst)
{
    size_t c = 0;
    for (; c + 16 <= m; c += 16) nf_a8_transpose16_avx2((const uint8_t *)(rs + c), 4 * ls, (uint8_t *)(dst + 16 * c));
    for (; c < m; c++)
        for (size_t r = 0; r < 16; r++) dst[16 * c + r] = rs[r * ls + c];
}

/* The row-major scales (16 rows of rs, ls floats apart; q6_k's d in rd, nsb apart) into the panel's
 * sd / sm (a8_simd.h). */
static void panel_scales(nf_codec_id id, const float *rs, size_t ls, const float *rd, size_t n, float *sd, float *sm)
{
    const size_t nsb = n / NF_QK_K;
    if (id == NF_CODEC_Q8_0) {
        scales_lane_row(rs, ls, n / 32, sd);
        memset(sm, 0, 16 * (n / 32) * sizeof(float));
    } else if (id == NF_CODEC_Q6_K) {
        scales_lane_row(rs, ls, n / 16, sd);
        for (size_t ib = 0; ib < nsb; ib++) { /* d of each row, the same for the super-block's 8 blocks */
            float dr[16];
            for (size_t r = 0; r < 16; r++) dr[r] = rd[r * nsb + ib];
            const __m256 d0 = _mm256_loadu_ps(dr), d1 = _mm256_loadu_ps(dr + 8);
            for (size_t k = 8 * ib; k < 8 * ib + 8; k++) _mm256_storeu_ps(sm + 16 * k, d0), _mm256_storeu_ps(sm + 16 * k + 8, d1);
        }
    } else { /* per super-block: 8 scales then 8 mins per row -> sd's and sm's 8 blocks */
        float t[256];
        for (size_t ib = 0; ib < nsb; ib++) {
            nf_a8_transpose16_avx2((const uint8_t *)(rs + 16 * ib), 4 * ls, (uint8_t *)t);
            memcpy(sd + 128 * ib, t, 128 * sizeof(float));
            memcpy(sm + 128 * ib, t + 128, 128 * sizeof(float));
        }
    }
}

/* ---- the panel ---------------------------------------------------------------------------------------- */

/* 40 n for the panel, then the row-major scales (at most 16 x (n / 16 + n / 256) floats) */
size_t nf_a8_tile_scratch(size_t n) { return 48 * n + 256; }

int nf_a8_panel_fill(nf_codec_id id, int q8_offset, nf_a8_transpose_fn transpose, const uint8_t *w, size_t rb,
                     size_t rows, size_t n, void *scratch, nf_a8_panel *p)
{
    const int G = id == NF_CODEC_Q6_K ? 16 : 32;
    if (id != NF_CODEC_Q8_0 && id != NF_CODEC_Q4_K && id != NF_CODEC_Q5_K && id != NF_CODEC_Q6_K) return -1;
    const size_t nk = n / G; /* blocks per row */
    uint8_t *rowbuf = scratch, *lv = rowbuf + 16 * n;
    /* row-major (no transpose): rows n + 64 bytes apart, so that an A tile's 16 rows do not share two
     * L1 sets (n is a multiple of 64; the rows then run into lv's space, unused) */
    const size_t ld = transpose ? n : n + 64;
    float *sd = (float *)(lv + 16 * n), *sm = sd + 16 * nk;
    /* the rows' scales, row-major: ls per row (q4_k / q5_k: 8 scales and 8 mins per super-block) */
    const size_t ls = id == NF_CODEC_Q8_0 ? n / 32 : n / 16, nsb = n / NF_QK_K;
    float *rs = sm + 16 * nk, *rd = rs + 16 * ls;
    for (size_t r = 0; r < 16; r++) {
        if (r < rows) unpack(id, q8_offset, !transpose, w + r * rb, n, rowbuf + r * ld, rs + r * ls, rd + r * nsb);
        else {
            memset(rowbuf + r * ld, 0, n);
            memset(rs + r * ls, 0, ls * sizeof(float));
            if (id == NF_CODEC_Q6_K) memset(rd + r * nsb, 0, nsb * sizeof(float));
        }
    }
    panel_scales(id, rs, ls, rd, n, sd, sm);
    if (transpose) {
        for (size_t c = 0; c < n / 64; c++) transpose(rowbuf + 64 * c, n, lv + 1024 * c);
        p->lv = lv, p->spare = rowbuf;
    } else
        p->lv = rowbuf, p->spare = NULL;
    p->ld = ld;
    p->sd = sd, p->sm = sm;
    p->G = G, p->O = id == NF_CODEC_Q8_0 ? q8_offset : id == NF_CODEC_Q6_K && transpose ? 32 : 0;
    p->min = G == 32 && id != NF_CODEC_Q8_0;
    return 0;
}
