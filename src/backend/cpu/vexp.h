/* The CPU backend's exp (softmax and SwiGLU): one definition, evaluated identically by the scalar
 * code and the AVX-512 code (ops_avx512.c), so every path rounds alike on every machine.
 *
 *   x clamped to [-104, 89] (NaN kept: min(89, x) = 89 < x ? 89 : x, the order of MINPS);
 *   k = x * log2(e) + 1.5 * 2^23;  n = k - 1.5 * 2^23 (round to nearest even of x log2 e, |n| <= 151);
 *   r = (x - n C1) - n C2   (C1 = 0x1.62e4p-1 has 16 significant bits: n C1 and x - n C1 are exact;
 *                            C1 + C2 = ln 2 within 6e-14);  |r| <= ln2 / 2 + 2^-24
 *   p = 1 + r (1 + r (1/2 + r (1/6 + ... + r (1/5040))))   (Taylor to degree 7, Horner, f32)
 *   y = (p 2^n1) 2^n2,  n1 = floor(n / 2), n2 = n - n1   (both scale factors normal; the first
 *                            product is exact, the second rounds once: subnormal results and overflow)
 * Every step is a separate f32 multiply or add (no FMA; the build's -std=c11 does not contract), and the
 * integer n is read from k's bits, so the scalar and vector forms give the same bits.
 *
 * Error (normal results): truncation r^8 / 8! <= 5.0e-9 relative to e^r >= 0.707; Horner's roundings
 * <= 0.5 ulp(p) + |r| (1 + 0.5) 2^-24 (1 + |r| + ...) <= 1.1e-7 absolute on p in [0.707, 1.415], so
 * <= 1.6e-7 relative; r's rounding (<= 2^-25 absolute) moves e^r by <= 3.0e-8 relative: in all
 * |y - e^x| <= 2.0e-7 e^x (3.4 ulp at worst, near p = 0.707; libm's expf is within 1 ulp). Results
 * below 2^-126 (x < -87.34) add at most 2^-150 absolute (the one rounding of the second product);
 * x > 88.7228 gives +inf, x < -103.98 gives 0, as expf does. tests/cpu/test_cpu_ops.c checks
 * the bound against exp in double and the vector form's bits against the scalar form. */
#ifndef NF_CPU_VEXP_H
#define NF_CPU_VEXP_H

#include <stdint.h>
#include <string.h>

#define NF_EXP_HI 89.0f
#define NF_EXP_LO (-104.0f)
#define NF_EXP_L2E 0x1.715476p+0f
#define NF_EXP_MAGIC 0x1.8p23f
#define NF_EXP_C1 0x1.62e400p-1f
#define NF_EXP_C2 0x1.7f7d1cp-20f
#define NF_EXP_P7 (1.0f / 5040)
#define NF_EXP_P6 (1.0f / 720)
#define NF_EXP_P5 (1.0f / 120)
#define NF_EXP_P4 (1.0f / 24)
#define NF_EXP_P3 (1.0f / 6)
#define NF_EXP_P2 0.5f

static inline float nf_cpu_expf_def(float x)
{
    x = NF_EXP_HI < x ? NF_EXP_HI : x; /* MINPS(89, x): NaN stays */
    x = NF_EXP_LO > x ? NF_EXP_LO : x; /* MAXPS(-104, x) */
    const float k = x * NF_EXP_L2E + NF_EXP_MAGIC;
    const float n = k - NF_EXP_MAGIC;
    const float r = (x - n * NF_EXP_C1) - n * NF_EXP_C2;
    float p = NF_EXP_P7;
    p = p * r + NF_EXP_P6;
    p = p * r + NF_EXP_P5;
    p = p * r + NF_EXP_P4;
    p = p * r + NF_EXP_P3;
    p = p * r + NF_EXP_P2;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t kb;
    memcpy(&kb, &k, 4);
    const uint32_t ni = kb - 0x4B400000u, n1 = ((ni + 256u) >> 1) - 128u, n2 = ni - n1; /* two's complement */
    const uint32_t b1 = (n1 + 127u) << 23, b2 = (n2 + 127u) << 23;
    float s1, s2;
    memcpy(&s1, &b1, 4);
    memcpy(&s2, &b2, 4);
    return p * s1 * s2;
}

#endif
