/* Host helpers the CUDA operator tests share: a xorshift generator (uniform and normal draws from
 * a caller's state, so each test keeps its own sequence) and bf16 <-> float with round to nearest
 * even (the device's __float2bfloat16_rn for finite values). */
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

#endif
