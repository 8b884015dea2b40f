/* AVX-512 VNNI integer kernels for int8 activations (codec/a8.h): vpdpbusd multiplies 64 unsigned
 * weight levels by 64 signed activations and adds each group of four products to one of 16 int32
 * lanes, exactly (no int16 stage). A 512-bit vector holds two 32-element blocks (lanes 0-7 and
 * 8-15; q6_k: four 16-element sub-blocks, four lanes each), converted to f32 and folded into the
 * row's 16-lane accumulator with a vector of the blocks' combined scales (vpermps from the
 * super-block's scale vector). Signed or offset levels: q8_0 adds 128 to w (w ^ 0x80) and q6_k
 * keeps q in 0..63; the accumulator starts at -128 (resp. -32) times each lane's sum of x, formed
 * by one vpdpbusd per activation vector for the whole row group. Rows four at a time, every token
 * of the segment per row group, as the AVX2 kernels. */
#include <immintrin.h>

#include "codec/a8.h"
#include "codec/a8_simd.h"
#include "codec/ggml_blocks.h"

#define NF_INLINE static inline __attribute__((always_inline))
enum { ROWS = 4 };

NF_INLINE float f16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

NF_INLINE __m512i load2x32(const uint8_t *a, const uint8_t *b)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

/* -k times each lane's sum of four activation bytes (k = 128 or 32). */
NF_INLINE __m512i neg_lane_sum(__m512i x, char k)
{
    return _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(k), x));
}

/* 16-lane index vectors for vpermps: lane L takes element a (L < 8) or b. */
NF_INLINE __m512i idx2(int a, int b)
{
    return _mm512_inserti64x4(_mm512_set1_epi32(a), _mm256_set1_epi32(b), 1);
}

/* The 16 block sums of 8 vpdpbusd results (D[k]: lanes 0-7 block 2k, 8-15 block 2k + 1, eight partial
 * sums each), lane 4 j + m = block Q8_PERM[4 j + m]: two blocks' halves added (shuffle), pairs of
 * results interleaved by 128-bit lane (blend), then two unpack-and-add steps. */
static const int32_t Q8_PERM[16] = {0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, 7, 11, 15};
NF_INLINE __m512i q8_reduce16(const __m512i *D)
{
    __m512i F[4];
    for (int m = 0; m < 4; m++) {
        const __m512i e0 = _mm512_add_epi32(D[2 * m], _mm512_shuffle_i32x4(D[2 * m], D[2 * m], _MM_SHUFFLE(2, 3, 0, 1)));
        const __m512i e1 = _mm512_add_epi32(D[2 * m + 1], _mm512_shuffle_i32x4(D[2 * m + 1], D[2 * m + 1], _MM_SHUFFLE(2, 3, 0, 1)));
        F[m] = _mm512_mask_blend_epi32(0xF0F0, e0, e1);
    }
    const __m512i g01 = _mm512_add_epi32(_mm512_unpacklo_epi32(F[0], F[1]), _mm512_unpackhi_epi32(F[0], F[1]));
    const __m512i g23 = _mm512_add_epi32(_mm512_unpacklo_epi32(F[2], F[3]), _mm512_unpackhi_epi32(F[2], F[3]));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(g01, g23), _mm512_unpackhi_epi64(g01, g23));
}

/* q8_0: 16 blocks (512 elements) per step: 8 vpdpbusd, their 16 block sums in one vector (q8_reduce16),
 * the 16 f16 scales gathered in the same lane order, one conversion and one FMA per 16 blocks (the
 * loads, not the arithmetic, are then the work: perf/cpu_2026-12-06b.md); the blocks past the last
 * 16 two at a time and a last odd one as before. Each step prefetches the same bytes of the call's
 * next row group `nx` (NULL: none). A fixed distance within the row (NF_A8_PF_Q8) lands in this
 * group's own rows when they are short (SmolLM2's 576 columns: 612 bytes), so it fetched nothing
 * early; the next group is one group ahead at any row length and never past the call's rows, which
 * a decode call of several row blocks makes long (docs/perf/cpu_2026-12-06c.md). */
NF_INLINE void q8_0_rows(const uint8_t *w, size_t rb, int R, const uint8_t *xa, float *y, size_t n,
                         const uint8_t *nx)
{
    const float *dx = NF_A8_D(xa, n);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const __m512i perm = _mm512_loadu_si512(Q8_PERM);
    const __m512i gidx = _mm512_mullo_epi32(perm, _mm512_set1_epi32(NF_Q8_0_BYTES));
    const size_t nb = n / 32, nb16 = nb / 16 * 16;
    __m512 acc[ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (size_t i0 = 0; i0 < nb16; i0 += 16) {
        __m512i xq[8], base[8];
        for (int k = 0; k < 8; k++) xq[k] = _mm512_loadu_si512(xa + 32 * i0 + 64 * k), base[k] = neg_lane_sum(xq[k], (char)0x80);
        const __m512 dxp = _mm512_permutexvar_ps(perm, _mm512_loadu_ps(dx + i0));
        for (int r = 0; r < R; r++) {
            const uint8_t *b = w + r * rb + i0 * NF_Q8_0_BYTES;
            if (nx)
                for (int l = 0; l < 9; l++) _mm_prefetch((const char *)nx + (b - w) + 64 * l, _MM_HINT_T0);
            __m512i D[8];
            for (int k = 0; k < 8; k++) {
                const uint8_t *bk = b + 2 * k * NF_Q8_0_BYTES;
                D[k] = _mm512_dpbusd_epi32(base[k], _mm512_xor_si512(load2x32(bk + 2, bk + NF_Q8_0_BYTES + 2), flip), xq[k]);
            }
            const __m512i h = q8_reduce16(D);
            const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(gidx, (const void *)b, 1)));
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dxp), _mm512_cvtepi32_ps(h), acc[r]);
        }
    }
    __m512 acc2[ROWS];
    for (int r = 0; r < R; r++) acc2[r] = _mm512_setzero_ps();
    for (size_t ib = nb16 / 2; ib < nb / 2; ib++) {
        const __m512i xq = _mm512_loadu_si512(xa + 64 * ib), base = neg_lane_sum(xq, (char)0x80);
        const __m512 dxv = _mm512_insertf32x8(_mm512_set1_ps(dx[2 * ib]), _mm256_set1_ps(dx[2 * ib + 1]), 1);
        for (int r = 0; r < R; r++) {
            const uint8_t *b = w + r * rb + 2 * ib * NF_Q8_0_BYTES;
            const __m512i wq = _mm512_xor_si512(load2x32(b + 2, b + NF_Q8_0_BYTES + 2), flip);
            const __m512i s = _mm512_dpbusd_epi32(base, wq, xq);
            const __m512 dw = _mm512_insertf32x8(_mm512_set1_ps(f16_at(b)), _mm256_set1_ps(f16_at(b + NF_Q8_0_BYTES)), 1);
            acc2[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dxv), _mm512_cvtepi32_ps(s), acc2[r]);
        }
    }
    float tail[ROWS] = {0};
    if (nb % 2) { /* an odd last block: its 32 elements in the low half */
        const size_t ib = nb - 1;
        const __m512i xq = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(xa + 32 * ib)));
        const __m512i base = neg_lane_sum(xq, (char)0x80);
        for (int r = 0; r < R; r++) {
            const uint8_t *b = w + r * rb + ib * NF_Q8_0_BYTES;
            const __m512i wq = _mm512_xor_si512(_mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(b + 2))), flip);
            tail[r] = f16_at(b) * dx[ib] * (float)_mm512_reduce_add_epi32(_mm512_dpbusd_epi32(base, wq, xq));
        }
    }
    for (int r = 0; r < R; r++) y[r] = _mm512_reduce_add_ps(acc[r]) + _mm512_reduce_add_ps(acc2[r]) + tail[r];
}

/* One q4_k / q5_k super-block b of a row (its next bytes prefetched): d1 = d sc and m1 = dmin m of its
 * 8 sub-blocks, and lv[2P], lv[2P + 1] the levels of sub-block pairs 2P, 2P + 1 (the low and high
 * nibbles of qs bytes 64P .., with q5_k's fifth bits: bits 2p, 2p + 1 of qh for pair p, which HP lines
 * up at bits 0 (low nibbles) and 1 (high) for pairs 2P (bytes 0-31) and 2P + 1 (bytes 32-63)). */
NF_INLINE void k45_block(int Q5, const uint8_t *b, __m256 *d1, __m256 *m1, __m512i lv[4])
{
    const __m512i one = _mm512_set1_epi8(1), two = _mm512_set1_epi8(2), m4 = _mm512_set1_epi8(0x0F);
    const __mmask64 up = 0xFFFFFFFF00000000ull;
    const uint8_t *qs = b + (Q5 ? 48 : 16);
    for (int k = 0; k < 3; k++) _mm_prefetch((const char *)b + NF_A8_PF_K + 64 * k, _MM_HINT_T0);
    uint8_t sm[16];
    nf_k4_unpack_scales(b + 4, sm);
    const __m128i sm16 = _mm_loadu_si128((const __m128i *)sm);
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm16));
    const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm16, 8)));
    *d1 = _mm256_mul_ps(_mm256_set1_ps(f16_at(b)), sc);
    *m1 = _mm256_mul_ps(_mm256_set1_ps(f16_at(b + 2)), mn);
    __m512i HP = _mm512_setzero_si512();
    if (Q5) {
        const __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 16)));
        HP = _mm512_mask_blend_epi8(up, H, _mm512_srli_epi16(H, 2));
    }
    for (int P = 0; P < 2; P++) {
        const __m512i v = _mm512_loadu_si512(qs + 64 * P);
        __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        if (Q5) {
            lo = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(HP, one), 4));
            hi = _mm512_or_si512(hi, _mm512_slli_epi16(_mm512_and_si512(HP, two), 3));
            HP = _mm512_srli_epi16(HP, 4);
        }
        lv[2 * P] = lo, lv[2 * P + 1] = hi;
    }
}

/* One token's share of a block: acc += d sc dx (levels . X) per sub-block, macc += dmin m dx qsum (the
 * min term, subtracted at the end: k45_sum). ix: the sub-block order of X's lanes (k45_rows). */
NF_INLINE void k45_token(__m256 d1, __m256 m1, const __m512i lv[4], const __m512i X[4], const __m512i ix[4], __m256 dxv,
                         __m256 qsum, __m512 *acc, __m256 *macc)
{
    const __m512 sd = _mm512_castps256_ps512(_mm256_mul_ps(d1, dxv));
    *macc = _mm256_fmadd_ps(_mm256_mul_ps(m1, dxv), qsum, *macc);
    for (int P = 0; P < 2; P++) {
        const __m512i il = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lv[2 * P], X[2 * P]);
        const __m512i ih = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lv[2 * P + 1], X[2 * P + 1]);
        *acc = _mm512_fmadd_ps(_mm512_permutexvar_ps(ix[2 * P], sd), _mm512_cvtepi32_ps(il), *acc);
        *acc = _mm512_fmadd_ps(_mm512_permutexvar_ps(ix[2 * P + 1], sd), _mm512_cvtepi32_ps(ih), *acc);
    }
}

/* A row's dot from its accumulators: the sum of acc less the sum of macc. */
NF_INLINE float k45_sum(__m512 acc, __m256 macc)
{
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(macc), _mm256_extractf128_ps(macc, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return _mm512_reduce_add_ps(acc) - _mm_cvtss_f32(m);
}

/* q4_k (and q5_k): 64 bytes of qs hold sub-block pairs 2P and 2P + 1 (P = 0, 1); their low nibbles are
 * sub-blocks 4P and 4P + 2, the high ones 4P + 1 and 4P + 3, so the activations are paired the same
 * way once per super-block: X[0] = [x0 | x2], X[1] = [x1 | x3], X[2] = [x4 | x6], X[3] = [x5 | x7]. */
NF_INLINE void k45_rows(int Q5, const uint8_t *w, size_t rb, int R, const uint8_t *xa, float *y, size_t n)
{
    const size_t bb = Q5 ? NF_Q5_K_BYTES : NF_Q4_K_BYTES;
    const float *dx = NF_A8_D(xa, n);
    const int16_t *bsum = NF_A8_BSUM(xa, n);
    const __m512i ix[4] = {idx2(0, 2), idx2(1, 3), idx2(4, 6), idx2(5, 7)};
    __m512 acc[ROWS];
    __m256 macc[ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps(), macc[r] = _mm256_setzero_ps();
    for (size_t ib = 0; ib < n / NF_QK_K; ib++) {
        const uint8_t *qx = xa + NF_QK_K * ib;
        __m512i X[4];
        for (int k = 0; k < 4; k++) X[k] = load2x32(qx + 64 * (k / 2) * 2 + 32 * (k % 2), qx + 64 * (k / 2) * 2 + 32 * (k % 2) + 64);
        const __m256 dxv = _mm256_loadu_ps(dx + 8 * ib);
        const __m256 qsum = _mm256_cvtepi32_ps(
            _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(bsum + 16 * ib)), _mm256_set1_epi16(1)));
        for (int r = 0; r < R; r++) {
            __m256 d1, m1;
            __m512i lv[4];
            k45_block(Q5, w + r * rb + ib * bb, &d1, &m1, lv);
            k45_token(d1, m1, lv, X, ix, dxv, qsum, &acc[r], &macc[r]);
        }
    }
    for (int r = 0; r < R; r++) y[r] = k45_sum(acc[r], macc[r]);
}

/* q6_k: in a half super-block, the low nibbles of ql[0..63] are elements 0..63 in order and the high
 * nibbles elements 64..127; the two high bits come from qh[0..31] (both 256-bit halves): bits 0-1
 * for elements 0..31, 2-3 for 32..63, 4-5 for 64..95, 6-7 for 96..127. Lane L of a vpdpbusd
 * result covers elements 4L..4L+3, i.e. sub-block L / 4 of the four it spans. */
NF_INLINE void q6_k_rows(const uint8_t *w, size_t rb, int R, const uint8_t *xa, float *y, size_t n)
{
    const float *dx = NF_A8_D(xa, n);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __mmask64 up = 0xFFFFFFFF00000000ull;
    __m512i ix[4];
    for (int k = 0; k < 4; k++)
        ix[k] = _mm512_add_epi32(_mm512_set1_epi32(4 * k),
                                 _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    __m512 acc[ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (size_t ib = 0; ib < n / NF_QK_K; ib++) {
        const uint8_t *qx = xa + NF_QK_K * ib;
        __m512i X[4], base[4];
        for (int k = 0; k < 4; k++) X[k] = _mm512_loadu_si512(qx + 64 * k), base[k] = neg_lane_sum(X[k], 32);
        const __m512 dxe = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(dx + 8 * ib)));
        for (int r = 0; r < R; r++) {
            const uint8_t *b = w + r * rb + ib * NF_Q6_K_BYTES;
            for (int k = 0; k < 4; k++) _mm_prefetch((const char *)b + NF_A8_PF_K + 64 * k, _MM_HINT_T0);
            const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 192))));
            const __m512 s = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(f16_at(b + 208)), sc), dxe);
            for (int h = 0; h < 2; h++) {
                const __m512i a = _mm512_loadu_si512(b + 64 * h);
                const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h)));
                const __m512i hl = _mm512_and_si512(_mm512_mask_blend_epi8(up, _mm512_slli_epi16(hb, 4), _mm512_slli_epi16(hb, 2)), m30);
                const __m512i hh = _mm512_and_si512(_mm512_mask_blend_epi8(up, hb, _mm512_srli_epi16(hb, 2)), m30);
                const __m512i lo = _mm512_or_si512(_mm512_and_si512(a, m4), hl);
                const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(a, 4), m4), hh);
                const __m512i il = _mm512_dpbusd_epi32(base[2 * h], lo, X[2 * h]);
                const __m512i ih = _mm512_dpbusd_epi32(base[2 * h + 1], hi, X[2 * h + 1]);
                acc[r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(ix[2 * h], s), _mm512_cvtepi32_ps(il), acc[r]);
                acc[r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(ix[2 * h + 1], s), _mm512_cvtepi32_ps(ih), acc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) y[r] = _mm512_reduce_add_ps(acc[r]);
}

NF_INLINE void q4_k_rows(const uint8_t *w, size_t rb, int R, const uint8_t *xa, float *y, size_t n)
{
    k45_rows(0, w, rb, R, xa, y, n);
}

NF_INLINE void q5_k_rows(const uint8_t *w, size_t rb, int R, const uint8_t *xa, float *y, size_t n)
{
    k45_rows(1, w, rb, R, xa, y, n);
}

/* ---- several tokens (a short segment: speculation's verification, a sparse-MoE expert's few tokens of
 * a prompt): one row's super-block unpacked once for up to TM tokens, each token's operations those of
 * the one-token kernels above in the same order, so every token's result is bit-identical to its
 * one-token call (tests/codec/test_codec_a8.c checks it). The tokens' activation vectors (k45: the
 * pairs X and the q sums; q6_k: the -32 lane sums) are formed once per call into a stack buffer of
 * at most XB bytes. */
enum { TM = 8, XB = 32768 };

/* k45: X[ib][t][4] (the pairs of k45_rows), qs[ib][t] (its qsum), for T tokens of one call. */
NF_INLINE void k45_multi_rows(const int Q5, const int T, const uint8_t *w, size_t rb, size_t rows, const uint8_t *xa,
                              size_t ldxa, float *y, size_t ldy, size_t n, __m512i *X, __m256 *qs)
{
    const size_t bb = Q5 ? NF_Q5_K_BYTES : NF_Q4_K_BYTES, nb = n / NF_QK_K;
    const __m512i ix[4] = {idx2(0, 2), idx2(1, 3), idx2(4, 6), idx2(5, 7)};
    for (size_t ib = 0; ib < nb; ib++)
        for (int t = 0; t < T; t++) {
            const uint8_t *x = xa + t * ldxa, *qx = x + NF_QK_K * ib;
            for (int k = 0; k < 4; k++)
                X[4 * (T * ib + t) + k] = load2x32(qx + 64 * (k / 2) * 2 + 32 * (k % 2), qx + 64 * (k / 2) * 2 + 32 * (k % 2) + 64);
            qs[T * ib + t] = _mm256_cvtepi32_ps(
                _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(NF_A8_BSUM(x, n) + 16 * ib)), _mm256_set1_epi16(1)));
        }
    for (size_t r = 0; r < rows; r++) {
        __m512 acc[TM];
        __m256 macc[TM];
        for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps(), macc[t] = _mm256_setzero_ps();
        for (size_t ib = 0; ib < nb; ib++) {
            __m256 d1, m1;
            __m512i lv[4];
            k45_block(Q5, w + r * rb + ib * bb, &d1, &m1, lv);
            for (int t = 0; t < T; t++)
                k45_token(d1, m1, lv, X + 4 * (T * ib + t), ix, _mm256_loadu_ps(NF_A8_D(xa + t * ldxa, n) + 8 * ib),
                          qs[T * ib + t], &acc[t], &macc[t]);
        }
        for (int t = 0; t < T; t++) y[t * ldy + r] = k45_sum(acc[t], macc[t]);
    }
}

/* q6_k: base[ib][t][4] (-32 times each lane's sum of four activation bytes), the activations read in place. */
NF_INLINE void q6_k_multi_rows(const int T, const uint8_t *w, size_t rb, size_t rows, const uint8_t *xa, size_t ldxa,
                               float *y, size_t ldy, size_t n, __m512i *base)
{
    const size_t nb = n / NF_QK_K;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __mmask64 up = 0xFFFFFFFF00000000ull;
    __m512i ix[4];
    for (int k = 0; k < 4; k++)
        ix[k] = _mm512_add_epi32(_mm512_set1_epi32(4 * k),
                                 _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    for (size_t ib = 0; ib < nb; ib++)
        for (int t = 0; t < T; t++)
            for (int k = 0; k < 4; k++)
                base[4 * (T * ib + t) + k] = neg_lane_sum(_mm512_loadu_si512(xa + t * ldxa + NF_QK_K * ib + 64 * k), 32);
    for (size_t r = 0; r < rows; r++) {
        __m512 acc[TM];
        for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
        for (size_t ib = 0; ib < nb; ib++) {
            const uint8_t *b = w + r * rb + ib * NF_Q6_K_BYTES;
            for (int k = 0; k < 4; k++) _mm_prefetch((const char *)b + NF_A8_PF_K + 64 * k, _MM_HINT_T0);
            const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 192))));
            const __m512 ds = _mm512_mul_ps(_mm512_set1_ps(f16_at(b + 208)), sc);
            __m512i lv[4];
            for (int h = 0; h < 2; h++) {
                const __m512i a = _mm512_loadu_si512(b + 64 * h);
                const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h)));
                const __m512i hl = _mm512_and_si512(_mm512_mask_blend_epi8(up, _mm512_slli_epi16(hb, 4), _mm512_slli_epi16(hb, 2)), m30);
                const __m512i hh = _mm512_and_si512(_mm512_mask_blend_epi8(up, hb, _mm512_srli_epi16(hb, 2)), m30);
                lv[2 * h] = _mm512_or_si512(_mm512_and_si512(a, m4), hl);
                lv[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(a, 4), m4), hh);
            }
            for (int t = 0; t < T; t++) {
                const uint8_t *qx = xa + t * ldxa + NF_QK_K * ib;
                const __m512 dxe = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(NF_A8_D(xa + t * ldxa, n) + 8 * ib)));
                const __m512 s = _mm512_mul_ps(ds, dxe);
                const __m512i *bt = base + 4 * (T * ib + t);
                for (int h = 0; h < 2; h++) {
                    const __m512i il = _mm512_dpbusd_epi32(bt[2 * h], lv[2 * h], _mm512_loadu_si512(qx + 128 * h));
                    const __m512i ih = _mm512_dpbusd_epi32(bt[2 * h + 1], lv[2 * h + 1], _mm512_loadu_si512(qx + 128 * h + 64));
                    acc[t] = _mm512_fmadd_ps(_mm512_permutexvar_ps(ix[2 * h], s), _mm512_cvtepi32_ps(il), acc[t]);
                    acc[t] = _mm512_fmadd_ps(_mm512_permutexvar_ps(ix[2 * h + 1], s), _mm512_cvtepi32_ps(ih), acc[t]);
                }
            }
        }
        for (int t = 0; t < T; t++) y[t * ldy + r] = _mm512_reduce_add_ps(acc[t]);
    }
}

static NF_A8_GEMM(one_token_q4_k, q4_k_rows, ROWS)
static NF_A8_GEMM(one_token_q5_k, q5_k_rows, ROWS)
static NF_A8_GEMM(one_token_q6_k, q6_k_rows, ROWS)

/* The entry points: one token (decode) by the row-group kernels; several, up to TM at a time (fewer
 * where the row is long: the buffer holds XB bytes), by the multi-token ones. */
#define MULTI_CASES(call)                                                                                   \
    switch (T) {                                                                                            \
    case 2: call(2); break;                                                                                 \
    case 3: call(3); break;                                                                                 \
    case 4: call(4); break;                                                                                 \
    case 5: call(5); break;                                                                                 \
    case 6: call(6); break;                                                                                 \
    case 7: call(7); break;                                                                                 \
    default: call(8); break;                                                                                \
    }

static void k45_gemm(const int Q5, const void *w, size_t rb, size_t rows, const uint8_t *xa, size_t ldxa, size_t ntok,
                     float *y, size_t ldy, size_t n)
{
    const size_t tmax = XB / n < TM ? XB / n : TM;
    const nf_a8_gemm_fn one = Q5 ? one_token_q5_k : one_token_q4_k;
    if (ntok == 1 || tmax < 2) {
        one(w, rb, rows, xa, ldxa, ntok, y, ldy, n);
        return;
    }
    __m512i X[XB / 64];
    __m256 qs[XB / 256];
    for (size_t t0 = 0; t0 < ntok; t0 += tmax) {
        const int T = (int)(ntok - t0 < tmax ? ntok - t0 : tmax);
        const uint8_t *x = xa + t0 * ldxa;
        float *yt = y + t0 * ldy;
        if (T == 1) {
            one(w, rb, rows, x, ldxa, 1, yt, ldy, n);
            continue;
        }
#define K45_CALL(TT)                                                                                        \
    do {                                                                                                    \
        if (Q5) k45_multi_rows(1, TT, w, rb, rows, x, ldxa, yt, ldy, n, X, qs);                            \
        else k45_multi_rows(0, TT, w, rb, rows, x, ldxa, yt, ldy, n, X, qs);                               \
    } while (0)
        MULTI_CASES(K45_CALL)
    }
}

static void q6_k_gemm(const void *w, size_t rb, size_t rows, const uint8_t *xa, size_t ldxa, size_t ntok, float *y,
                      size_t ldy, size_t n)
{
    const size_t tmax = XB / n < TM ? XB / n : TM;
    if (ntok == 1 || tmax < 2) {
        one_token_q6_k(w, rb, rows, xa, ldxa, ntok, y, ldy, n);
        return;
    }
    __m512i base[XB / 64];
    for (size_t t0 = 0; t0 < ntok; t0 += tmax) {
        const int T = (int)(ntok - t0 < tmax ? ntok - t0 : tmax);
        const uint8_t *x = xa + t0 * ldxa;
        float *yt = y + t0 * ldy;
        if (T == 1) {
            one_token_q6_k(w, rb, rows, x, ldxa, 1, yt, ldy, n);
            continue;
        }
#define Q6_CALL(TT) q6_k_multi_rows(TT, w, rb, rows, x, ldxa, yt, ldy, n, base)
        MULTI_CASES(Q6_CALL)
    }
}

/* Rows ROWS at a time, each group's first token prefetching the next group (q8_0_rows). */
NF_A8_GEMM_DECL(nf_q8_0_a8_avx512)
{
    const uint8_t *p = w;
    size_t r = 0;
    for (; r + ROWS <= rows; r += ROWS) {
        const uint8_t *nx = r + 2 * ROWS <= rows ? p + (r + ROWS) * row_bytes : NULL;
        for (size_t t = 0; t < ntok; t++)
            q8_0_rows(p + r * row_bytes, row_bytes, ROWS, xa + t * ldxa, y + t * ldy + r, n, t ? NULL : nx);
    }
    for (; r < rows; r++)
        for (size_t t = 0; t < ntok; t++) q8_0_rows(p + r * row_bytes, row_bytes, 1, xa + t * ldxa, y + t * ldy + r, n, NULL);
}
NF_A8_GEMM_DECL(nf_q4_k_a8_avx512) { k45_gemm(0, w, row_bytes, rows, xa, ldxa, ntok, y, ldy, n); }
NF_A8_GEMM_DECL(nf_q5_k_a8_avx512) { k45_gemm(1, w, row_bytes, rows, xa, ldxa, ntok, y, ldy, n); }
NF_A8_GEMM_DECL(nf_q6_k_a8_avx512) { q6_k_gemm(w, row_bytes, rows, xa, ldxa, ntok, y, ldy, n); }


/* ---- the activation quantiser (bit-identical to the scalar one in a8.c) -------------------------- */

/* Blocks b0 .. b0 + nb - 1 (nb <= 16) of a row of n. The blocks' maxima are gathered first so that
 * the two divisions of every block (d = amax / 127, id = 1 / d) are two vector divisions for all 16:
 * the AVX2 quantiser's two scalar divisions per block, in one dependent chain with its horizontal
 * max, were most of its 6 % of SmolLM2's prefill (perf/cpu_2026-12-06d.md). vdivps rounds as divss,
 * and every other step is the AVX2 form's (max_ps(r, -127) turns a NaN into -127 as fmaxf does). */
static void quantize16(const float *x, uint8_t *dst, size_t n, size_t b0, unsigned nb)
{
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f), nan = _mm512_set1_ps(__builtin_nanf(""));
    float amax[16] = {0}; /* lanes past nb stay 0: d = id = 0, never stored */
    __mmask16 bad = 0;
    x += NF_A8_BLOCK * b0;
    for (unsigned b = 0; b < nb; b++) {
        const __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
        amax[b] = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        /* a NaN or inf input makes the scale NaN (max_ps drops NaNs; x - x does not) */
        const __m512 f = _mm512_add_ps(_mm512_sub_ps(v0, v0), _mm512_sub_ps(v1, v1));
        if (_mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q)) bad |= (__mmask16)(1u << b);
    }
    __m512 d = _mm512_div_ps(_mm512_loadu_ps(amax), _mm512_set1_ps(127.0f));
    d = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(d, _mm512_set1_ps(0x1p-126f), _CMP_GE_OQ), d); /* subnormal: 0 */
    __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_OQ), _mm512_set1_ps(1.0f), d);
    d = _mm512_mask_mov_ps(d, bad, nan), id = _mm512_mask_mov_ps(id, bad, nan);
    float idv[16];
    int32_t sum[16] = {0};
    int16_t bs[32];
    _mm512_storeu_ps(idv, id);
    int8_t *q = (int8_t *)dst + NF_A8_BLOCK * b0;
    for (unsigned b = 0; b < nb; b++) {
        const __m512 vid = _mm512_set1_ps(idv[b]);
        for (int h = 0; h < 2; h++) {
            const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * b + 16 * h), vid),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __m512i iq = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(r, lo), hi));
            _mm_storeu_si128((__m128i *)(q + 32 * b + 16 * h), _mm512_cvtepi32_epi8(iq));
            bs[2 * b + h] = (int16_t)_mm512_reduce_add_epi32(iq);
        }
        sum[b] = bs[2 * b] + bs[2 * b + 1];
    }
    const __mmask16 m = (__mmask16)((1u << nb) - 1);
    _mm512_mask_storeu_ps(dst + n + 4 * b0, m, d);
    memcpy(dst + n + n / 8 + 4 * b0, bs, 4 * (size_t)nb);
    _mm512_mask_storeu_ps(dst + n + n / 4 + 4 * b0, m, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_loadu_si512(sum))));
}

void nf_a8_quantize_row_avx512(const float *x, uint8_t *dst, size_t n)
{
    const size_t nb = n / NF_A8_BLOCK;
    for (size_t b0 = 0; b0 < nb; b0 += 16) quantize16(x, dst, n, b0, nb - b0 < 16 ? (unsigned)(nb - b0) : 16);
}
