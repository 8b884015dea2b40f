/* AVX2 integer kernels for int8 activations (codec/a8.h). The weight levels are unsigned bytes
 * (q4_k 0..15, q5_k 0..31, q6_k 0..63) or, for q8_0, |w| with w's sign moved onto the activation
 * (vpsignb; |q| <= 127 keeps that exact), so one vpmaddubsw (u8 x s8, pairs summed to int16: at most
 * 2 * 63 * 127 = 16002, or 2 * 128 * 127 = 32512 for q8_0, never saturating) and one vpmaddwd
 * against ones give eight int32 partial sums of a 32-element block; they are converted to f32 and
 * folded into the row's 8-lane accumulator with the block's combined scale. Rows are taken four at
 * a time (NF_MV_ROWS) and a row group runs every token before the next group, so its weights stay
 * in L1 across the tokens of a prefill segment. */
#include "codec/a8.h"
#include "codec/a8_simd.h"
#include "codec/avx2_util.h"
#include "codec/ggml_blocks.h"

NF_INLINE __m256i dot_us8(__m256i u, __m256i s)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

NF_INLINE __m256 bcast(const float *p) { return _mm256_broadcast_ss(p); }

/* ---- the activation quantiser (bit-identical to the scalar one in a8.c) ------------------------- */

void nf_a8_quantize_row_avx2(const float *x, uint8_t *dst, size_t n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    int8_t *q = (int8_t *)dst;
    for (size_t b = 0; b < n / NF_A8_BLOCK; b++, x += NF_A8_BLOCK, q += NF_A8_BLOCK) {
        __m256 v[4];
        for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(x + 8 * k);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        float d = amax / 127.0f;
        if (d < 0x1p-126f) d = 0;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        /* a NaN or inf input makes the scale NaN (max_ps drops NaNs; x - x does not) */
        __m256 f = _mm256_add_ps(_mm256_add_ps(_mm256_sub_ps(v[0], v[0]), _mm256_sub_ps(v[1], v[1])),
                                 _mm256_add_ps(_mm256_sub_ps(v[2], v[2]), _mm256_sub_ps(v[3], v[3])));
        if (_mm256_movemask_ps(_mm256_cmp_ps(f, f, _CMP_UNORD_Q))) d = id = __builtin_nanf("");
        const __m256 vid = _mm256_set1_ps(id);
        __m256i iq[4];
        for (int k = 0; k < 4; k++) {
            __m256 r = _mm256_round_ps(_mm256_mul_ps(v[k], vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            iq[k] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
        }
        const __m256i s01 = _mm256_add_epi32(iq[0], iq[1]), s23 = _mm256_add_epi32(iq[2], iq[3]);
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(iq[0], iq[1]), _mm256_packs_epi32(iq[2], iq[3]));
        _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(p, perm));
        int32_t t[16];
        _mm256_storeu_si256((__m256i *)t, s01);
        _mm256_storeu_si256((__m256i *)(t + 8), s23);
        int16_t bs[2] = {0, 0};
        for (int k = 0; k < 8; k++) bs[0] = (int16_t)(bs[0] + t[k]), bs[1] = (int16_t)(bs[1] + t[8 + k]);
        memcpy(dst + n + 4 * b, &d, 4);
        memcpy(dst + n + n / 8 + 4 * b, bs, 4);
        const float ds = d * (float)(bs[0] + bs[1]);
        memcpy(dst + n + n / 4 + 4 * b, &ds, 4);
    }
}

/* ---- kernels: R <= 4 rows against one token ----------------------------------------------------- */

NF_INLINE void q8_0_rows(const uint8_t *w, size_t rb, int R, const uint8_t *xa, float *y, size_t n)
{
    const float *dx = NF_A8_D(xa, n);
    __m256 acc[NF_MV_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (size_t ib = 0; ib < n / 32; ib++) {
        const __m256i xq = _mm256_loadu_si256((const __m256i *)(xa + 32 * ib));
        for (int r = 0; r < R; r++) {
            const uint8_t *b = w + r * rb + ib * NF_Q8_0_BYTES;
            _mm_prefetch((const char *)b + NF_A8_PF_Q8, _MM_HINT_T0);
            const __m256i wq = _mm256_loadu_si256((const __m256i *)(b + 2));
            const __m256i s = dot_us8(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(nf_f16_at(b) * dx[ib]), _mm256_cvtepi32_ps(s), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) y[r] = nf_hsum8(acc[r]);
}

/* q4_k (Q5 = 0) and q5_k: per super-block the eight combined scales d1_j d_b (as a vector, stored for
 * broadcasts) and the min term (m1_j d_b) qsum_j as one 8-lane FMA; per sub-block pair p one 32-byte
 * load of qs gives both sub-blocks' levels. q5_k's fifth bits: qh shifted right by 2p, bit 0 for
 * sub-block 2p, bit 1 for 2p + 1. */
/* A q4_k / q5_k super-block b (its next bytes prefetched): d1 = d sc and m1 = dmin m of its 8
 * sub-blocks. */
NF_INLINE void k45_scales(const uint8_t *b, __m256 *d1, __m256 *m1)
{
    for (int k = 0; k < 3; k++) _mm_prefetch((const char *)b + NF_A8_PF_K + 64 * k, _MM_HINT_T0);
    uint8_t sm[16];
    nf_k4_unpack_scales(b + 4, sm);
    const __m256 sc = _mm256_cvtepi32_ps(nf_load8_u8(sm)), mn = _mm256_cvtepi32_ps(nf_load8_u8(sm + 8));
    *d1 = _mm256_mul_ps(_mm256_set1_ps(nf_f16_at(b)), sc);
    *m1 = _mm256_mul_ps(_mm256_set1_ps(nf_f16_at(b + 2)), mn);
}

NF_INLINE void k45_rows(int Q5, const uint8_t *w, size_t rb, int R, const uint8_t *xa, float *y, size_t n)
{
    const size_t bb = Q5 ? NF_Q5_K_BYTES : NF_Q4_K_BYTES;
    const float *dx = NF_A8_D(xa, n);
    const int16_t *bsum = NF_A8_BSUM(xa, n);
    __m256 acc[NF_MV_ROWS], macc[NF_MV_ROWS];
    for (int r = 0; r < R; r++) acc[r] = macc[r] = _mm256_setzero_ps();
    for (size_t ib = 0; ib < n / NF_QK_K; ib++) {
        const uint8_t *qx = xa + NF_QK_K * ib;
        const __m256 dxv = _mm256_loadu_ps(dx + 8 * ib);
        const __m256 qsum = _mm256_cvtepi32_ps(
            _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(bsum + 16 * ib)), _mm256_set1_epi16(1)));
        for (int r = 0; r < R; r++) {
            const uint8_t *b = w + r * rb + ib * bb, *qs = b + (Q5 ? 48 : 16);
            __m256 d1, m1;
            k45_scales(b, &d1, &m1);
            float sd[8];
            _mm256_storeu_ps(sd, _mm256_mul_ps(d1, dxv));
            macc[r] = _mm256_fmadd_ps(_mm256_mul_ps(m1, dxv), qsum, macc[r]);
            __m256i hb = Q5 ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
            for (int p = 0; p < 4; p++) {
                __m256i lo, hi;
                nf_k45_levels(Q5, qs, p, &hb, &lo, &hi);
                const __m256i il = dot_us8(lo, _mm256_loadu_si256((const __m256i *)(qx + 64 * p)));
                const __m256i ih = dot_us8(hi, _mm256_loadu_si256((const __m256i *)(qx + 64 * p + 32)));
                acc[r] = _mm256_fmadd_ps(bcast(sd + 2 * p), _mm256_cvtepi32_ps(il), acc[r]);
                acc[r] = _mm256_fmadd_ps(bcast(sd + 2 * p + 1), _mm256_cvtepi32_ps(ih), acc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) y[r] = nf_hsum8(_mm256_sub_ps(acc[r], macc[r]));
}

NF_INLINE void q4_k_rows(const uint8_t *w, size_t rb, int R, const uint8_t *xa, float *y, size_t n)
{
    k45_rows(0, w, rb, R, xa, y, n);
}

NF_INLINE void q5_k_rows(const uint8_t *w, size_t rb, int R, const uint8_t *xa, float *y, size_t n)
{
    k45_rows(1, w, rb, R, xa, y, n);
}

/* q6_k: per x block j the integer (q - 32) . x of its two 16-element sub-blocks as
 * maddubs(q, x) - maddubs(32, x) in int16 (exact: |.| <= 16002 + 8128), the second term formed once
 * per super-block for the row group; lanes 0-3 of the vpmaddwd result belong to sub-block 2j, 4-7 to
 * 2j + 1, scaled by (d sc_k) d_b. */
NF_INLINE void q6_k_rows(const uint8_t *w, size_t rb, int R, const uint8_t *xa, float *y, size_t n)
{
    const float *dx = NF_A8_D(xa, n);
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30), c32 = _mm256_set1_epi8(32);
    const __m256i e0 = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), e1 = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
    __m256 acc[NF_MV_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (size_t ib = 0; ib < n / NF_QK_K; ib++) {
        const uint8_t *qx = xa + NF_QK_K * ib;
        const __m256 dxv = _mm256_loadu_ps(dx + 8 * ib);
        const __m256 dxa = _mm256_permutevar8x32_ps(dxv, e0), dxb = _mm256_permutevar8x32_ps(dxv, e1);
        __m256i x32[8];
        for (int j = 0; j < 8; j++) x32[j] = _mm256_maddubs_epi16(c32, _mm256_loadu_si256((const __m256i *)(qx + 32 * j)));
        for (int r = 0; r < R; r++) {
            const uint8_t *b = w + r * rb + ib * NF_Q6_K_BYTES;
            for (int k = 0; k < 4; k++) _mm_prefetch((const char *)b + NF_A8_PF_K + 64 * k, _MM_HINT_T0);
            const __m128i sc8 = _mm_loadu_si128((const __m128i *)(b + 192));
            const __m256 d = _mm256_set1_ps(nf_f16_at(b + 208));
            float s[16];
            _mm256_storeu_ps(s, _mm256_mul_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc8))), dxa));
            _mm256_storeu_ps(s + 8, _mm256_mul_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc8, 8)))), dxb));
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
                const __m256i a = _mm256_loadu_si256((const __m256i *)ql), c = _mm256_loadu_si256((const __m256i *)(ql + 32));
                const __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
                __m256i q[4];
                q[0] = _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
                q[1] = _mm256_or_si256(_mm256_and_si256(c, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
                q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4), _mm256_and_si256(hb, m30));
                q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), m4), _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
                for (int k = 0; k < 4; k++) {
                    const int j = 4 * h + k; /* x block, sub-blocks 2j and 2j + 1 */
                    const __m256i p = _mm256_sub_epi16(
                        _mm256_maddubs_epi16(q[k], _mm256_loadu_si256((const __m256i *)(qx + 32 * j))), x32[j]);
                    const __m256i i = _mm256_madd_epi16(p, _mm256_set1_epi16(1));
                    const __m256 sv = _mm256_set_m128(_mm_broadcast_ss(s + 2 * j + 1), _mm_broadcast_ss(s + 2 * j));
                    acc[r] = _mm256_fmadd_ps(sv, _mm256_cvtepi32_ps(i), acc[r]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++) y[r] = nf_hsum8(acc[r]);
}

/* ---- several tokens (a short segment), as the AVX-512 file does: one row's super-block unpacked once
 * into a 256-byte buffer (and its scale vectors) for up to TM tokens, each token's operations those of
 * the one-token kernels above in the same order, so every token keeps its one-token bits (tested). */
enum { TM = 4 };

NF_INLINE void k45_multi_rows(const int Q5, const int T, const uint8_t *w, size_t rb, size_t rows, const uint8_t *xa,
                              size_t ldxa, float *y, size_t ldy, size_t n)
{
    const size_t bb = Q5 ? NF_Q5_K_BYTES : NF_Q4_K_BYTES;
    for (size_t r = 0; r < rows; r++) {
        __m256 acc[TM], macc[TM];
        for (int t = 0; t < T; t++) acc[t] = macc[t] = _mm256_setzero_ps();
        for (size_t ib = 0; ib < n / NF_QK_K; ib++) {
            const uint8_t *b = w + r * rb + ib * bb, *qs = b + (Q5 ? 48 : 16);
            __m256 d1, m1;
            k45_scales(b, &d1, &m1);
            __m256i lv[8];
            __m256i hb = Q5 ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
            for (int p = 0; p < 4; p++) nf_k45_levels(Q5, qs, p, &hb, &lv[2 * p], &lv[2 * p + 1]);
            for (int t = 0; t < T; t++) {
                const uint8_t *x = xa + t * ldxa, *qx = x + NF_QK_K * ib;
                const __m256 dxv = _mm256_loadu_ps(NF_A8_D(x, n) + 8 * ib);
                const __m256 qsum = _mm256_cvtepi32_ps(
                    _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(NF_A8_BSUM(x, n) + 16 * ib)), _mm256_set1_epi16(1)));
                float sd[8];
                _mm256_storeu_ps(sd, _mm256_mul_ps(d1, dxv));
                macc[t] = _mm256_fmadd_ps(_mm256_mul_ps(m1, dxv), qsum, macc[t]);
                for (int p = 0; p < 4; p++) {
                    const __m256i il = dot_us8(lv[2 * p], _mm256_loadu_si256((const __m256i *)(qx + 64 * p)));
                    const __m256i ih = dot_us8(lv[2 * p + 1], _mm256_loadu_si256((const __m256i *)(qx + 64 * p + 32)));
                    acc[t] = _mm256_fmadd_ps(bcast(sd + 2 * p), _mm256_cvtepi32_ps(il), acc[t]);
                    acc[t] = _mm256_fmadd_ps(bcast(sd + 2 * p + 1), _mm256_cvtepi32_ps(ih), acc[t]);
                }
            }
        }
        for (int t = 0; t < T; t++) y[t * ldy + r] = nf_hsum8(_mm256_sub_ps(acc[t], macc[t]));
    }
}

static NF_A8_GEMM(one_token_q4_k, q4_k_rows, NF_MV_ROWS)
static NF_A8_GEMM(one_token_q5_k, q5_k_rows, NF_MV_ROWS)

static void k45_gemm(const int Q5, const void *w, size_t rb, size_t rows, const uint8_t *xa, size_t ldxa, size_t ntok,
                     float *y, size_t ldy, size_t n)
{
    if (ntok == 1) {
        (Q5 ? one_token_q5_k : one_token_q4_k)(w, rb, rows, xa, ldxa, 1, y, ldy, n);
        return;
    }
    for (size_t t0 = 0; t0 < ntok; t0 += TM) {
        const int T = (int)(ntok - t0 < TM ? ntok - t0 : TM);
        const uint8_t *x = xa + t0 * ldxa;
        float *yt = y + t0 * ldy;
#define K45_T(TT) (Q5 ? k45_multi_rows(1, TT, w, rb, rows, x, ldxa, yt, ldy, n) : k45_multi_rows(0, TT, w, rb, rows, x, ldxa, yt, ldy, n))
        switch (T) {
        case 1: (Q5 ? one_token_q5_k : one_token_q4_k)(w, rb, rows, x, ldxa, 1, yt, ldy, n); break;
        case 2: K45_T(2); break;
        case 3: K45_T(3); break;
        default: K45_T(4); break;
        }
#undef K45_T
    }
}

NF_A8_GEMM(nf_q8_0_a8_avx2, q8_0_rows, NF_MV_ROWS)
NF_A8_GEMM_DECL(nf_q4_k_a8_avx2) { k45_gemm(0, w, row_bytes, rows, xa, ldxa, ntok, y, ldy, n); }
NF_A8_GEMM_DECL(nf_q5_k_a8_avx2) { k45_gemm(1, w, row_bytes, rows, xa, ldxa, ntok, y, ldy, n); }
NF_A8_GEMM(nf_q6_k_a8_avx2, q6_k_rows, NF_MV_ROWS)

