// bf16x3.cuh on the host (built by nvcc, runs without a GPU): the tensor-core prefill router
// (router_mma.cu) takes an f32 router row as three bf16 planes and claims hi + mid + lo == w exactly
// for 2^-110 <= |w| <= bf16's largest finite value, and an error of at most 2^-134 below. Checked
// over every mantissa of eight exponents (the range ends, 2^-110 and 2^-109 where exactness starts,
// and router-sized weights), both signs, plus 4M random values over every exponent, each plane a
// finite bf16 and the sum compared in double. That the third plane carries real bits is checked too
// (a two-plane split would pass only if it never did).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/sparse_moe/bf16x3.cuh"
#include "nf_test.h"

namespace {

float bits_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
double bf_d(uint16_t h) { return (double)bits_f((uint32_t)h << 16); }

struct Tally {
    uint64_t n = 0, inexact = 0, nonfinite = 0, third = 0, over_bound = 0;
    double worst_tiny = 0; // the largest |sum - w| below 2^-110
};

void check(float w, Tally &t)
{
    uint16_t p[3];
    nf::bf16x3(w, p);
    t.n++;
    for (uint16_t h : p)
        if (!isfinite(bf_d(h))) t.nonfinite++;
    const double sum = bf_d(p[0]) + bf_d(p[1]) + bf_d(p[2]), err = fabs(sum - (double)w);
    if (p[2] & 0x7FFF) t.third++;
    if (fabs((double)w) >= ldexp(1.0, -110)) {
        if (err != 0) t.inexact++;
    } else {
        if (err > ldexp(1.0, -134)) t.over_bound++;
        if (err > t.worst_tiny) t.worst_tiny = err;
    }
}

} // namespace

int main(void)
{
    Tally t;
    // bf16's largest finite value: 0x7F7F0000 (the f32 values above it round to infinity)
    const uint32_t top = 0x7F7F0000u;
    const int exps[] = {-149 /* subnormals */, -126, -110, -109, -20, -7, 0, 126};
    for (int e : exps) {
        const uint32_t ebits = e == -149 ? 0u : (uint32_t)(e + 127) << 23;
        for (uint32_t m = 0; m < (1u << 23); m++)
            for (uint32_t sign = 0; sign < 2; sign++) {
                const uint32_t u = sign << 31 | ebits | m;
                if ((u & 0x7FFFFFFFu) <= top) check(bits_f(u), t);
            }
    }
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < (1 << 22); i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        const uint32_t u = (uint32_t)s;
        if ((u & 0x7FFFFFFFu) <= top) check(bits_f(u), t);
    }
    printf("bf16x3: %llu values, %llu inexact at |w| >= 2^-110, %llu over 2^-134 below (worst %.3g), %llu "
           "non-finite planes, %llu with a nonzero third plane\n",
           (unsigned long long)t.n, (unsigned long long)t.inexact, (unsigned long long)t.over_bound, t.worst_tiny,
           (unsigned long long)t.nonfinite, (unsigned long long)t.third);
    CHECK_MSG(t.inexact == 0, "%llu values are not hi + mid + lo", (unsigned long long)t.inexact);
    CHECK_MSG(t.over_bound == 0, "%llu values below 2^-110 err by more than 2^-134", (unsigned long long)t.over_bound);
    CHECK_MSG(t.nonfinite == 0, "%llu planes are not finite", (unsigned long long)t.nonfinite);
    CHECK_MSG(t.third > t.n / 4, "the third plane is nonzero for only %llu of %llu values", (unsigned long long)t.third,
              (unsigned long long)t.n);
    return nf_test_report();
}
