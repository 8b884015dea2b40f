/* Internal to src/backend/cpu: the context behind nf_cpu and the SIMD tile kernel. */
#ifndef NF_CPU_INTERNAL_H
#define NF_CPU_INTERNAL_H

#include "backend/cpu/cpu.h"
#include <string.h>

#include "codec/a8.h"

struct nf_cpu {
    nf_pool *pool;
    int n_threads;
    uint32_t max_cols, max_ctx;
    float *block;    /* [n_threads][NF_CPU_RB][max_cols]: dequantized row blocks */
    float *scores;   /* [n_threads][NF_CPU_ATTN_SC * max_ctx]: attention scores */
    int matvec_simd; /* the AVX2 tile kernel may run */
    int reference;   /* dequantize + double dot everywhere */
    int a8;          /* int8 activations into q8_0 / k-quant products (codec/a8.h) */
    nf_isa isa;      /* the integer kernels' ISA */
    int no_tile;     /* prefill segments by the per-token integer kernel, not the repacked tile */
    uint8_t *xa;     /* quantised activation rows of the current batch (grown, never shrunk) */
    size_t xa_cap;
};

/* y[t*ldy + r] = sum_i blk[r*cols + i] * x[t*ldx + i] for r < nb, t < n. */
void nf_cpu_tile_scalar(const float *blk, size_t nb, size_t cols, const float *x, size_t ldx, size_t n, float *y,
                        size_t ldy);
/* Only after nf_cpu_has_avx2_fma_f16c() (compiled with -mavx2 -mfma -mf16c). */
void nf_cpu_tile_avx2(const float *blk, size_t nb, size_t cols, const float *x, size_t ldx, size_t n, float *y,
                      size_t ldy);

/* Attention scratch per thread in units of max_ctx: four queries' weights + 16 queries' scores. */
#define NF_CPU_ATTN_SC 20
/* The AVX2 attention takes head_dim % 8 == 0 and head_dim <= this (its transposed q is on the stack). */
#define NF_CPU_ATTN_MAX_HD 512
/* Causal attention of nq <= lanes (8, or 16 with AVX-512) consecutive query tokens of one sequence
 * (page table pages), one head, over kv head kh: token j's q at q + j*q_row, it sees positions
 * 0 .. n0 + j - 1, its output at out + j*q_row. sc: the thread's NF_CPU_ATTN_SC * max_ctx scratch.
 * Bit-identical to ops.c's scalar attention. */
void nf_cpu_attn_block_avx2(const nf_cpu_kv *kv, const uint32_t *pages, const float *q, size_t q_row, uint32_t kh,
                            uint32_t n0, uint32_t nq, float scale, float *sc, float *out, int lanes);
/* The 16-query scores of nf_cpu_attn_block_avx2 (lanes 16; only after AVX-512F is known):
 * sct[p][j] = scale * sum_i qt[i][j] k[p][i] for p < np, each lane the scalar's FMA sequence. */
void nf_cpu_attn_scores16_avx512(const nf_cpu_kv *kv, const uint32_t *pages, const float *qt, uint32_t hd,
                                 size_t kv_row, size_t koff, uint32_t np, float scale, float *sct);

/* softmax and SwiGLU: the scalar forms and the AVX-512 forms (ops_avx512.c; only after AVX-512F is
 * known), which give the same bits; nf_cpu_softmax / nf_cpu_swiglu pick one. nf_cpu_exp_avx512:
 * y[i] = nf_cpu_expf(x[i]). */
void nf_cpu_softmax_scalar(float *x, size_t n);
void nf_cpu_swiglu_scalar(float *out, const float *g, const float *u, size_t n);
void nf_cpu_softmax_avx512(float *x, size_t n);
void nf_cpu_swiglu_avx512(float *out, const float *g, const float *u, size_t n);
void nf_cpu_exp_avx512(const float *x, float *y, size_t n);

/* The weighted V sums of nq queries, 1 <= nq <= 4 (only after AVX-512F is known; head_dim % 16 == 0):
 * o[q][i] = sum_{p < n[q]} w[q][p] v[p][i] (n ascending), each a chain o = fma(w, v, o) over the
 * positions in order, the scalar's sequence (ops.c attn_one), 16 elements of the head per vector and
 * each v row loaded once for the queries that see it. */
void nf_cpu_weighted_v_avx512(const nf_cpu_kv *kv, const uint32_t *pages, const float *const *w, const uint32_t *n,
                              int nq, size_t kv_row, size_t koff, float *const *o);

/* k or v element idx of the cache as f32 (bf16 widens exactly). */
static inline float nf_cpu_kv_at(const nf_cpu_kv *kv, const void *base, size_t idx)
{
    if (!kv->bf16) return ((const float *)base)[idx];
    uint32_t u = (uint32_t)((const uint16_t *)base)[idx] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif
