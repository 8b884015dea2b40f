#include "base/fastdiv.h"
#include "nf_test.h"

/* n / d is monotonic in n and steps only at multiples of d, so the multiply-shift form equals it for
 * every n in [k d - 1, (k + 1) d - 1] when it does at both ends of each step: check k d - 1 and k d for
 * the first and last multiples below 2^31 (where the error term n e / (d 2^p) is largest), and a
 * stride of them between. */
static int check_divisor(uint32_t d)
{
    const nf_fastdiv f = nf_fastdiv_make(d);
    const uint64_t top = 0x7FFFFFFFull / d; /* the last k with k d < 2^31 */
    const uint64_t stride = top / 4096 + 1;
    for (uint64_t k = 0; k <= top; k += (k < 2048 || top - k < 2048) ? 1 : stride) {
        const uint32_t n = (uint32_t)(k * d);
        if (nf_fastdiv_apply(n, f) != k) return 0;
        if (n > 0 && nf_fastdiv_apply(n - 1, f) != k - 1) return 0;
    }
    return nf_fastdiv_apply(0x7FFFFFFFu, f) == 0x7FFFFFFFu / d;
}

int main(void)
{
    int bad = 0;
    for (uint32_t d = 1; d <= 5000; d++) bad += !check_divisor(d);
    CHECK_EQ_INT(bad, 0);
    /* powers of two and their neighbours, the largest divisors, and a spread of others */
    bad = 0;
    for (uint32_t l = 1; l < 31; l++) {
        bad += !check_divisor(1u << l);
        bad += !check_divisor((1u << l) - 1);
        bad += !check_divisor((1u << l) + 1);
    }
    bad += !check_divisor(0x7FFFFFFFu);
    uint64_t x = 88172645463325252ull; /* xorshift64 */
    for (int i = 0; i < 2000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        bad += !check_divisor((uint32_t)(x % 0x7FFFFFFFull) + 1);
    }
    CHECK_EQ_INT(bad, 0);
    /* the divisors of the NVFP4 stacks ninfer binds: an expert's rows, half of them, a whole bank */
    const uint32_t rows[] = {768, 1536, 2048, 4096, 512 * 1536};
    for (unsigned i = 0; i < sizeof rows / sizeof rows[0]; i++) CHECK(check_divisor(rows[i]));
    /* out of range: refused as {0, 0} */
    CHECK_EQ_INT((int)nf_fastdiv_make(0).mul, 0);
    CHECK_EQ_INT((int)nf_fastdiv_make(0x80000000u).shift, 0);
    return nf_test_report();
}
