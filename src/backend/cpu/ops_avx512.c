/* exp, softmax and SwiGLU with AVX-512 (only after the CPU backend knows AVX-512F): vexp.h's
 * definition on 16 lanes, each lane the scalar form's operations in the same order, so the bits
 * are those of ops.c's scalar softmax and SwiGLU (tests/cpu/test_cpu_ops.c checks them). */
#include <immintrin.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/vexp.h"

static inline __m512 exp16(__m512 x)
{
    const __m512 magic = _mm512_set1_ps(NF_EXP_MAGIC);
    x = _mm512_min_ps(_mm512_set1_ps(NF_EXP_HI), x); /* 89 < x ? 89 : x */
    x = _mm512_max_ps(_mm512_set1_ps(NF_EXP_LO), x);
    const __m512 k = _mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(NF_EXP_L2E)), magic);
    const __m512 n = _mm512_sub_ps(k, magic);
    const __m512 r = _mm512_sub_ps(_mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(NF_EXP_C1))),
                                   _mm512_mul_ps(n, _mm512_set1_ps(NF_EXP_C2)));
    __m512 p = _mm512_set1_ps(NF_EXP_P7);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(NF_EXP_P6));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(NF_EXP_P5));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(NF_EXP_P4));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(NF_EXP_P3));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(NF_EXP_P2));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f));
    const __m512i ni = _mm512_sub_epi32(_mm512_castps_si512(k), _mm512_set1_epi32(0x4B400000));
    const __m512i n1 = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_add_epi32(ni, _mm512_set1_epi32(256)), 1),
                                        _mm512_set1_epi32(128));
    const __m512i n2 = _mm512_sub_epi32(ni, n1);
    const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, _mm512_set1_epi32(127)), 23));
    const __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, _mm512_set1_epi32(127)), 23));
    return _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
}

static inline __mmask16 tail_mask(size_t left) { return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1); }

void nf_cpu_exp_avx512(const float *x, float *y, size_t n)
{
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, exp16(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

void nf_cpu_softmax_avx512(float *x, size_t n)
{
    if (!n) return;
    __m512 mv = _mm512_set1_ps(x[0]);
    for (size_t i = 0; i < n; i += 16) mv = _mm512_max_ps(_mm512_mask_loadu_ps(mv, tail_mask(n - i), x + i), mv);
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
    __m512d a = _mm512_setzero_pd(), b = _mm512_setzero_pd(); /* lanes 0-7, 8-15 of the 16 sums */
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        const __m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), mx)));
        _mm512_mask_storeu_ps(x + i, m, e);
        a = _mm512_add_pd(a, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        b = _mm512_add_pd(b, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    double s[8];
    _mm512_storeu_pd(s, _mm512_add_pd(a, b));
    const double sum = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
    const __m512 inv = _mm512_set1_ps((float)(1.0 / sum));
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
    }
}

void nf_cpu_swiglu_avx512(float *out, const float *g, const float *u, size_t n)
{
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        const __m512 gv = _mm512_maskz_loadu_ps(m, g + i), uv = _mm512_maskz_loadu_ps(m, u + i);
        const __m512 e = exp16(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(gv), _mm512_set1_epi32((int)0x80000000u))));
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), uv));
    }
}
