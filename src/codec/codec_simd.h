/* Internal to src/codec: the AVX2+FMA+F16C matvec kernels (the *_avx2.c files, compiled with
 * -mavx2 -mfma -mf16c). They are only reached through nf_codec.matvec_simd, which
 * nf_codec_matvec hands out after checking the CPU at run time.
 *
 * Every kernel has the nf_matvec_fn contract: y[r] = sum_i w_r[i] * x[i] for r < rows, rows
 * row_bytes apart, accumulating in f32 (docs/codecs.md, "SIMD design", gives the order). */
#ifndef NF_CODEC_SIMD_H
#define NF_CODEC_SIMD_H

#include <stddef.h>

#define NF_MATVEC_DECL(name) void name(const void *w, size_t row_bytes, size_t rows, const float *x, float *y, size_t n)
NF_MATVEC_DECL(nf_f32_matvec_avx2);
NF_MATVEC_DECL(nf_f16_matvec_avx2);
NF_MATVEC_DECL(nf_bf16_matvec_avx2);
NF_MATVEC_DECL(nf_q8_0_matvec_avx2);
NF_MATVEC_DECL(nf_q4_k_matvec_avx2);
NF_MATVEC_DECL(nf_q5_k_matvec_avx2);
NF_MATVEC_DECL(nf_q6_k_matvec_avx2);
NF_MATVEC_DECL(nf_q2_k_matvec_avx2);
NF_MATVEC_DECL(nf_q3_k_matvec_avx2);
NF_MATVEC_DECL(nf_iq4_xs_matvec_avx2);
NF_MATVEC_DECL(nf_iq4_nl_matvec_avx2);

#endif
