/* Internal to src/backend/cpu: the context behind nf_cpu and the SIMD tile kernel. */
#ifndef NF_CPU_INTERNAL_H
#define NF_CPU_INTERNAL_H

#include "backend/cpu/cpu.h"

struct nf_cpu {
    nf_pool *pool;
    int n_threads;
    uint32_t max_cols, max_ctx;
    float *block;    /* [n_threads][NF_CPU_RB][max_cols]: dequantized row blocks */
    float *scores;   /* [n_threads][max_ctx]: attention scores */
    int matvec_simd; /* the AVX2 tile kernel may run */
    int reference;   /* dequantize + double dot everywhere */
};

/* y[t*ldy + r] = sum_i blk[r*cols + i] * x[t*ldx + i] for r < nb, t < n. */
void nf_cpu_tile_scalar(const float *blk, size_t nb, size_t cols, const float *x, size_t ldx, size_t n, float *y,
                        size_t ldy);
/* Only after nf_cpu_has_avx2_fma_f16c() (compiled with -mavx2 -mfma -mf16c). */
void nf_cpu_tile_avx2(const float *blk, size_t nb, size_t cols, const float *x, size_t ldx, size_t n, float *y,
                      size_t ldy);

#endif
