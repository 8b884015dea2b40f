/* Division by a divisor fixed at set-up time, as one 32 x 32 -> 64-bit multiply and a shift.
 *
 * Why: GPU kernels look up an NVFP4 row's divisor word as stacked_row / rows_per_div, and a 64-bit
 * (or even 32-bit) integer division is a software routine of dozens of instructions there; an
 * epilogue doing one per output column spent ~13 % of a GEMM on it.
 *
 * The rule (round-up reciprocal): for 1 <= d < 2^31 let l = ceil(log2 d), p = 31 + l and
 * m = ceil(2^p / d). Then (n * m) >> p == n / d for every 0 <= n < 2^31. Proof: m = (2^p + e) / d with
 * 0 <= e < d <= 2^l, so n * m / 2^p = n / d + n e / (d 2^p), and the second term is below
 * 2^31 * d / (d 2^p) = 2^-l <= 1 / d, too small to carry n / d past the next integer (its fraction is
 * at most (d - 1) / d). m < 2^32: 2^p / d = 2^31 * 2^l / d lies in [2^31, 2^32). */
#ifndef NF_BASE_FASTDIV_H
#define NF_BASE_FASTDIV_H

#include <stdint.h>

#if defined(__CUDACC__)
#define NF_FASTDIV_FN static inline __host__ __device__
#else
#define NF_FASTDIV_FN static inline
#endif

/* n / d for n < 2^31: (n * mul) >> shift. */
typedef struct nf_fastdiv {
    uint32_t mul;
    uint32_t shift; /* 31 .. 62 */
} nf_fastdiv;

/* d in [1, 2^31). (d = 0 or larger gives {0, 0}, which maps every n to 0: callers check d first.) */
NF_FASTDIV_FN nf_fastdiv nf_fastdiv_make(uint32_t d)
{
    nf_fastdiv f = {0, 0};
    if (d == 0 || d >= 0x80000000u) return f;
    uint32_t l = 0;
    while ((1ull << l) < d) l++;
    const uint64_t p2 = 1ull << (31 + l);
    f.mul = (uint32_t)((p2 + d - 1) / d);
    f.shift = 31 + l;
    return f;
}

/* n / d for 0 <= n < 2^31. */
NF_FASTDIV_FN uint32_t nf_fastdiv_apply(uint32_t n, nf_fastdiv f) { return (uint32_t)(((uint64_t)n * f.mul) >> f.shift); }

#endif
