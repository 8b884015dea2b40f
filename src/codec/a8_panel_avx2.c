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

/* ---- per-codec unpack of one row: levels lv[n] (u8), block scales sd[k * 16] and mins sm[k * 16] ---- */

/* q8_0's level: w + o (o = 128: unsigned, for vpdpbusd / TDPBSUD; o = 0: w itself, for vpsignb). */
static void unpack_q8_0(int o, const uint8_t *b, size_t n, uint8_t *lv, float *sd, float *sm)
{
    const __m256i flip = _mm256_set1_epi8((char)o);
    for (size_t k = 0; k < n / 32; k++, b += NF_Q8_0_BYTES) {
        _mm256_storeu_si256((__m256i *)(lv + 32 * k), _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + 2)), flip));
        sd[16 * k] = nf_f16_at(b), sm[16 * k] = 0;
    }
}

static void unpack_k45(int q5, const uint8_t *b, size_t n, uint8_t *lv, float *sd, float *sm)
{
    const size_t bb = q5 ? NF_Q5_K_BYTES : NF_Q4_K_BYTES;
    for (size_t ib = 0; ib < n / NF_QK_K; ib++, b += bb) {
        uint8_t s[16];
        nf_k4_unpack_scales(b + 4, s);
        const float d = nf_f16_at(b), dmin = nf_f16_at(b + 2);
        for (int j = 0; j < 8; j++) sd[16 * (8 * ib + j)] = d * s[j], sm[16 * (8 * ib + j)] = dmin * s[8 + j];
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

/* q6_k: the level u (o = 0) or u - 32 (o = 32, signed); sd: the sub-block's scale sc (an integer, per
 * 16), sm: the super-block's d (per 32-element block). */
static void unpack_q6_k(int o, const uint8_t *b, size_t n, uint8_t *lv, float *sd, float *sm)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30), off = _mm256_set1_epi8((char)o);
    for (size_t ib = 0; ib < n / NF_QK_K; ib++, b += NF_Q6_K_BYTES) {
        const float d = nf_f16_at(b + 208);
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int k = 0; k < 16; k++) sd[16 * (16 * ib + k)] = sc[k];
        for (int k = 0; k < 8; k++) sm[16 * (8 * ib + k)] = d;
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

static void unpack(nf_codec_id id, int q8_offset, int q6_signed, const uint8_t *b, size_t n, uint8_t *lv, float *sd,
                   float *sm)
{
    if (id == NF_CODEC_Q8_0) unpack_q8_0(q8_offset, b, n, lv, sd, sm);
    else if (id == NF_CODEC_Q6_K) unpack_q6_k(q6_signed ? 32 : 0, b, n, lv, sd, sm);
    else unpack_k45(id == NF_CODEC_Q5_K, b, n, lv, sd, sm);
}

/* ---- the panel ---------------------------------------------------------------------------------------- */

size_t nf_a8_tile_scratch(size_t n) { return 40 * n + 256; }

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
    for (size_t r = 0; r < 16; r++) {
        if (r < rows) unpack(id, q8_offset, !transpose, w + r * rb, n, rowbuf + r * ld, sd + r, sm + r);
        else {
            memset(rowbuf + r * ld, 0, n);
            for (size_t k = 0; k < nk; k++) sd[16 * k + r] = sm[16 * k + r] = 0;
        }
    }
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

