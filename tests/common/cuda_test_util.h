/* Host helpers the CUDA operator tests share: a xorshift generator (uniform and normal draws from
 * a caller's state, so each test keeps its own sequence), bf16 <-> float with round to nearest
 * even (the device's __float2bfloat16_rn for finite values), and the int8 activation quantisation
 * of the W·A8 kernels. */
#ifndef NF_TESTS_CUDA_TEST_UTIL_H
#define NF_TESTS_CUDA_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline double nf_test_urand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (double)(*s >> 11) / 9007199254740992.0;
}

static inline float nf_test_nrand(uint64_t *s)
{
    const double u1 = nf_test_urand(s), u2 = nf_test_urand(s);
    return (float)(sqrt(-2.0 * log(u1 + 1e-300)) * cos(6.283185307179586 * u2));
}

static inline uint16_t nf_test_f2bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static inline float nf_test_bf2f(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The W·A8 kernels' activation quantiser (src/backend/cuda/sparse_moe/quant_a8.cuh), bit for bit: per 32-element block d = max|x| / 127 in f32 and
 * xq = d * rint(x / d) (IEEE division, ties to even); cols % 32 == 0. */
static inline void nf_test_quantize_a8(const float *x, uint32_t cols, float *xq)
{
    for (uint32_t b0 = 0; b0 < cols; b0 += 32) {
        float am = 0.f;
        for (uint32_t i = b0; i < b0 + 32; i++) am = fmaxf(am, fabsf(x[i]));
        const float d = am / 127.0f;
        for (uint32_t i = b0; i < b0 + 32; i++) xq[i] = am > 0.f ? d * rintf(x[i] / d) : 0.f;
    }
}

#endif
